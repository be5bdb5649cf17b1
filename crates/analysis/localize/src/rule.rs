//! The rule per (group, function) bucket (PerfTracker §4.3, Eq. 6–11):
//! distance from expectation, the Δ rule over sampled peers, whyslow's
//! isolated-worker rules for small groups, and the noise guard's split into
//! findings on the whole group and on part of it.

use whyslow_model::rng::SplitMix64;
use whyslow_model::{Finding, FunctionKind, Reason};

use crate::columns::{BucketValues, Ctx, GroupColumns, Scratch, CANDIDATE, OUTSIDE};
use crate::evidence::Evidence;
use crate::finding::{build_finding, Bucket};
use crate::source::Source;
use crate::stats::{fnv1a, median, median_mad, sample_indices};
use crate::LocalizeConfig;

/// whyslow's rule for small groups compared in full (crate docs, "Isolated
/// workers"): a worker at normalized distance ≥ `delta` from the group's
/// typical pattern, the per-dimension median over all its workers (absent
/// workers count as 0), is far from its peers, if fewer than half of the
/// group are. Unlike Δ, one half-affected neighbour cannot hide it: a
/// minority does not move the median. Sets `far[i]` for the flagged present
/// workers; O(g log g).
fn far_from_typical(
    dims: [&[f32]; 3],
    g: usize,
    delta: f64,
    column: &mut Vec<f64>,
    far: &mut Vec<bool>,
) {
    let n = dims[0].len();
    far.clear();
    if g < 3 || n == 0 {
        return;
    }
    let mut typical = [0f64; 3];
    for (col, t) in dims.iter().zip(typical.iter_mut()) {
        column.clear();
        column.extend(col.iter().map(|&x| x as f64));
        column.resize(g, 0.0); // absent workers
        *t = median(column);
    }
    let distance = |p: [f32; 3]| -> f64 { (0..3).map(|d| (p[d] as f64 - typical[d]).abs()).sum() };
    let away = |p: [f32; 3]| distance(p) >= delta - 1e-9;
    far.extend((0..n).map(|i| away([dims[0][i], dims[1][i], dims[2][i]])));
    let absent = if n < g && away([0.0; 3]) { g - n } else { 0 };
    // When half the workers or more are δ away from it, nothing is typical.
    if 2 * (far.iter().filter(|&&f| f).count() + absent) >= g {
        far.iter_mut().for_each(|f| *f = false);
    }
}

/// Analyzes one (group, function) bucket; returns its findings (none; one;
/// or, with the noise guard, one on the whole group and one on part of it).
pub(crate) fn analyze_bucket<S: Source + ?Sized>(
    ctx: &Ctx<'_, '_, S>,
    members: &[u32],
    group: Option<&str>,
    cols: &GroupColumns,
    bucket: usize,
    scratch: &mut Scratch,
) -> Vec<Finding> {
    let (lo, hi) = (cols.offsets[bucket], cols.offsets[bucket + 1]);
    let fid = cols.fids[bucket] as usize;
    let mut values = std::mem::take(&mut scratch.values);
    ctx.read_bucket(
        members,
        cols,
        (lo, hi),
        fid,
        &mut values,
        &mut scratch.invalid_values,
    );
    let findings = analyze_values(
        ctx,
        members,
        group,
        cols,
        (lo, hi, fid),
        &mut values,
        scratch,
    );
    scratch.values = values;
    findings
}

/// [`analyze_bucket`] once the bucket's values are read.
fn analyze_values<S: Source + ?Sized>(
    ctx: &Ctx<'_, '_, S>,
    members: &[u32],
    group: Option<&str>,
    cols: &GroupColumns,
    (lo, hi, fid): (usize, usize, usize),
    values: &mut BucketValues,
    scratch: &mut Scratch,
) -> Vec<Finding> {
    let cfg = ctx.cfg;
    if !values.flags.iter().any(|&f| f & CANDIDATE != 0) {
        return Vec::new(); // Eq. 11 needs β > beta_min somewhere.
    }
    let kind = ctx.interner.kinds[fid];
    let name = ctx.interner.names[fid];
    let g = members.len();
    let n = hi - lo;
    let mem = &cols.member[lo..hi];

    // Δ rule (Eq. 8–11), only for groups large enough.
    let peer_ok = g >= cfg.min_peer_workers.max(1);
    let n_peers = cfg.max_peers.min(g).max(1);
    scratch.counts.clear();
    scratch.far.clear();
    // A count of far peers at or above `isolated_from` flags a worker as
    // isolated.
    let (threshold, isolated_from) = if peer_ok {
        peer_rule(
            cfg,
            group,
            (kind, name),
            mem,
            (g, n, n_peers),
            values,
            scratch,
        )
    } else {
        (f64::INFINITY, usize::MAX)
    };
    let flags = &values.flags[..];

    let bucket = Bucket {
        ctx,
        members,
        group,
        cols,
        values: &values.vals,
        lo,
        hi,
        kind,
        name,
    };
    // Eq. 11.
    let is_peer_outlier = |i: usize| {
        peer_ok
            && ((scratch.counts[i] as f64 / n_peers as f64) > threshold + 1e-12
                || scratch.counts[i] as usize >= isolated_from
                || scratch.far.get(i).copied().unwrap_or(false))
    };
    if !cfg.corroborate {
        let mut flagged: Vec<usize> = Vec::new();
        let (mut any_outside, mut any_peer) = (false, false);
        for (i, &f) in flags.iter().enumerate() {
            if f & CANDIDATE == 0 {
                continue;
            }
            let outside = f & OUTSIDE != 0;
            let peer = is_peer_outlier(i);
            if outside || peer {
                flagged.push(i);
                any_outside |= outside;
                any_peer |= peer;
            }
        }
        if flagged.is_empty() {
            return Vec::new();
        }
        let reason = reason_of(any_outside, any_peer);
        return vec![build_finding(&bucket, &flagged, reason)];
    }

    // With the noise guard (crate docs, "Noise"): a range violation on most
    // of the group's workers is a problem of the whole group …
    let outside = flags
        .iter()
        .filter(|&&f| f & CANDIDATE != 0 && f & OUTSIDE != 0)
        .count();
    let common = 2 * outside > g;
    let evidence = Evidence::new(
        ctx,
        members,
        cols,
        (lo, hi),
        fid,
        values,
        (&mut scratch.share, &mut scratch.entry_of),
    );
    let mut findings = Vec::new();
    if common {
        let all: Vec<usize> = (0..n).collect();
        findings.push(build_finding(&bucket, &all, Reason::Unexpected));
    }
    // … and a finding on part of it must be borne out off the critical path.
    let candidates: Vec<usize> = (0..n)
        .filter(|&i| {
            flags[i] & CANDIDATE != 0
                && ((!common && flags[i] & OUTSIDE != 0) || is_peer_outlier(i))
        })
        .collect();
    if candidates.is_empty() || (common && candidates.len() == n && n == g) {
        return findings;
    }
    let peers = evidence.peers(&candidates, g);
    let flagged: Vec<usize> = candidates
        .into_iter()
        .filter(|&i| evidence.corroborated(i, &peers, cfg))
        .collect();
    if flagged.is_empty() {
        return findings;
    }
    let any_outside = !common && flagged.iter().any(|&i| flags[i] & OUTSIDE != 0);
    let any_peer = flagged.iter().any(|&i| is_peer_outlier(i));
    let reason = reason_of(any_outside, any_peer);
    findings.push(build_finding(&bucket, &flagged, reason));
    findings
}

/// The Δ rule's threshold and the isolation count for one bucket
/// (PerfTracker §4.3, Eq. 8–10): β, μ, σ max-normalized across the group
/// (Eq. 8, in place), a sample W_N of peers drawn once per (group,
/// function), each worker's count of peers at L1 distance ≥ δ into
/// `scratch.counts` (Eq. 9–10; workers without the function once, as
/// (0, 0, 0)), and the threshold M + k·MAD of those counts (Eq. 11's right
/// side). Also marks workers far from the group's typical pattern in small
/// groups (`scratch.far`). Returns (threshold, isolated_from): a count of
/// far peers at or above `isolated_from` flags a worker as isolated.
fn peer_rule(
    cfg: &LocalizeConfig,
    group: Option<&str>,
    (kind, name): (FunctionKind, &str),
    mem: &[u32],
    (g, n, n_peers): (usize, usize, usize),
    values: &mut BucketValues,
    scratch: &mut Scratch,
) -> (f64, usize) {
    // Eq. 8: max normalization (absent workers contribute 0).
    let b = &mut values.beta[..];
    let m = &mut values.mu[..];
    let s = &mut values.sigma[..];
    for dim in [&mut *b, &mut *m, &mut *s] {
        let mx = dim.iter().copied().fold(0f32, f32::max);
        if mx > 0.0 && (mx as f64) >= cfg.zero_floor {
            // Dividing by at least `norm_floor` keeps differences that are
            // tiny in absolute terms (σ of 1e-4 vs 0) from becoming 1.0.
            let inv = 1.0 / mx.max(cfg.norm_floor as f32);
            dim.iter_mut().for_each(|x| *x *= inv);
        } else {
            dim.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    // W_N, sampled once per (group, function).
    let mut seed = fnv1a(
        0xcbf2_9ce4_8422_2325 ^ cfg.seed,
        group.unwrap_or("").as_bytes(),
    );
    seed = fnv1a(seed, &[0xff, kind.priority()]);
    seed = fnv1a(seed, name.as_bytes());
    let mut rng = SplitMix64(seed);
    sample_indices(g, n_peers, &mut rng, &mut scratch.sample);
    scratch.sb.clear();
    scratch.sm.clear();
    scratch.ss.clear();
    for &wi in &scratch.sample {
        match mem.binary_search(&wi) {
            Ok(i) => {
                scratch.sb.push(b[i]);
                scratch.sm.push(m[i]);
                scratch.ss.push(s[i]);
            }
            Err(_) => {
                scratch.sb.push(0.0);
                scratch.sm.push(0.0);
                scratch.ss.push(0.0);
            }
        }
    }
    let delta = cfg.delta as f32;
    let (sb, sm, ss) = (&scratch.sb[..], &scratch.sm[..], &scratch.ss[..]);
    // Exact shortcut (whyslow, not in the paper): the peers lie within
    // `radius` of their centroid c (L1, in f64), so a worker at
    // distance d from c is within d + radius of every peer and at least
    // d − radius from each. Clear of δ either way by a margin far above
    // f32 rounding (a few 1e-7 relative), every comparison below would
    // come out the same: count none or all without comparing. In a
    // healthy job the workers cluster well inside δ, so most workers
    // cost O(1) instead of O(N).
    let np = sb.len().max(1) as f64;
    let centre = [sb, sm, ss].map(|d| d.iter().map(|&v| f64::from(v)).sum::<f64>() / np);
    let to_centre = |x: f32, y: f32, z: f32| -> f64 {
        (f64::from(x) - centre[0]).abs()
            + (f64::from(y) - centre[1]).abs()
            + (f64::from(z) - centre[2]).abs()
    };
    let radius = (0..sb.len())
        .map(|j| to_centre(sb[j], sm[j], ss[j]))
        .fold(0f64, f64::max);
    let delta64 = f64::from(delta);
    let count_far = |x: f32, y: f32, z: f32| -> u32 {
        let d = to_centre(x, y, z);
        if (d + radius) * (1.0 + 1e-6) + 1e-9 < delta64 {
            return 0;
        }
        if (d - radius) * (1.0 - 1e-6) - 1e-9 >= delta64 {
            return sb.len() as u32;
        }
        let mut c = 0u32;
        for ((&pb, &pm), &ps) in sb.iter().zip(sm).zip(ss) {
            let d = (x - pb).abs() + (y - pm).abs() + (z - ps).abs();
            c += u32::from(d >= delta);
        }
        c
    };
    // Eq. 9–10 for every worker having the function …
    for i in 0..n {
        scratch.counts.push(count_far(b[i], m[i], s[i]));
    }
    // … and once for all workers without it (pattern (0,0,0)).
    scratch.hist.clear();
    scratch.hist.resize(n_peers + 1, 0);
    for &c in &scratch.counts {
        scratch.hist[(c as usize).min(n_peers)] += 1;
    }
    let c0 = if n < g {
        let c0 = count_far(0.0, 0.0, 0.0) as usize;
        scratch.hist[c0.min(n_peers)] += (g - n) as u64;
        Some(c0)
    } else {
        None
    };
    let (med, mad) = median_mad(&scratch.hist, g as u64, n_peers, &mut scratch.dev_hist);
    let threshold = med + (cfg.k * mad).max(cfg.min_margin);
    let mut isolated_from = usize::MAX;
    // Isolated workers: with every worker compared with every other, one
    // at distance ≥ δ from all of them (self excluded) is unlike its
    // peers whatever M and MAD say, as long as such workers are few.
    // Δ moves in steps of 1/|W|: in a small group a single half-affected
    // worker lifts M + k·MAD by ≥ k/(2|W|), past the margin, and Eq. 11
    // can no longer be met (4 workers: 0.625 vs 0.3).
    let coarse = cfg.k / (2.0 * g as f64) > cfg.min_margin;
    if cfg.flag_isolated && n_peers >= g {
        let is_isolated = |c: usize| c + 1 >= g;
        let absent = c0.map_or(0, |c| if is_isolated(c) { g - n } else { 0 });
        let present = scratch
            .counts
            .iter()
            .filter(|&&c| is_isolated(c as usize))
            .count();
        if 2 * (present + absent) < g {
            isolated_from = g - 1;
        }
        if coarse {
            far_from_typical(
                [&*b, &*m, &*s],
                g,
                cfg.delta,
                &mut scratch.column,
                &mut scratch.far,
            );
        }
    }
    (threshold, isolated_from)
}

/// The reason of a finding whose workers are outside the expected range
/// (D > 0), peer outliers (Δ), or both.
fn reason_of(outside: bool, peer: bool) -> Reason {
    match (outside, peer) {
        (true, true) => Reason::Both,
        (true, false) => Reason::Unexpected,
        _ => Reason::PeerOutlier,
    }
}
