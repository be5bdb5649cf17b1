//! Hashing, peer sampling and statistics of the localizer (PerfTracker
//! §4.3): the stable seed hash and W_N's sampling (Eq. 9), medians and the
//! median and MAD of Δ (Eq. 11), and how values are read.

use whyslow_model::rng::SplitMix64;

/// FxHash (rustc's): fast, non-cryptographic, for interning names.
pub(crate) type FxBuild = rustc_hash::FxBuildHasher;

/// FNV-1a: a stable hash (same on every platform and version) for seeds.
pub(crate) fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// N distinct indices of 0..n, ascending (Floyd's algorithm).
pub(crate) fn sample_indices(n: usize, count: usize, rng: &mut SplitMix64, out: &mut Vec<u32>) {
    out.clear();
    if count >= n {
        out.extend(0..n as u32);
        return;
    }
    for j in (n - count)..n {
        let t = rng.below_incl(j) as u32;
        match out.binary_search(&t) {
            Ok(_) => {
                // t already chosen: take j (never chosen before, as j grows).
                let pos = out.binary_search(&(j as u32)).unwrap_or_else(|p| p);
                out.insert(pos, j as u32);
            }
            Err(pos) => out.insert(pos, t),
        }
    }
}

/// Median (mean of the two middle values for even counts); 0 when empty.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    whyslow_model::stats::median(v).unwrap_or(0.0)
}

/// The k-th smallest (0-based) value of a histogram of small integers.
fn hist_kth(hist: &[u64], k: u64) -> usize {
    let mut acc = 0u64;
    for (v, &c) in hist.iter().enumerate() {
        acc += c;
        if acc > k {
            return v;
        }
    }
    hist.len().saturating_sub(1)
}

/// Median and MAD of Δ (Eq. 11) from the histogram of peer-difference counts
/// (Δ = count / N), in units of Δ.
pub(crate) fn median_mad(
    hist: &[u64],
    total: u64,
    n_peers: usize,
    dev_hist: &mut Vec<u64>,
) -> (f64, f64) {
    if total == 0 || n_peers == 0 {
        return (0.0, 0.0);
    }
    // Median in half-count units (an integer): c_lo + c_hi.
    let lo = hist_kth(hist, (total - 1) / 2);
    let hi = hist_kth(hist, total / 2);
    let med2 = (lo + hi) as i64;
    dev_hist.clear();
    dev_hist.resize(2 * n_peers + 1, 0);
    for (c, &cnt) in hist.iter().enumerate() {
        if cnt > 0 {
            let d = (2 * c as i64 - med2).unsigned_abs() as usize;
            if let Some(slot) = dev_hist.get_mut(d) {
                *slot += cnt;
            }
        }
    }
    let dlo = hist_kth(dev_hist, (total - 1) / 2);
    let dhi = hist_kth(dev_hist, total / 2);
    let scale = 2.0 * n_peers as f64;
    (med2 as f64 / scale, (dlo + dhi) as f64 / 2.0 / scale)
}

/// A value as localization reads it: non-finite or negative → 0.
pub(crate) fn clean(x: f64) -> f64 {
    if x.is_finite() && x >= 0.0 {
        x
    } else {
        0.0
    }
}

/// Bresenham selection: is item `t` of `total` among the `keep` evenly spaced ones?
pub(crate) fn keep_evenly(t: usize, keep: usize, total: usize) -> bool {
    if keep >= total {
        return true;
    }
    let (t, keep, total) = (t as u128, keep as u128, total as u128);
    ((t + 1) * keep) / total > (t * keep) / total
}
