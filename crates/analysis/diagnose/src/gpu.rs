//! The GPU layer of the differential diagnosis (SysOM-AI §3.1, "GPU diff"):
//! a late rank's GPU kernel times against its peers'. Kernels *uniformly*
//! slower — most of the GPU time, each by a similar factor — point to the
//! hardware (clocks held down by power or thermal limits, a degraded
//! part); *specific* kernels slower while the rest keep their pace point to
//! software (shapes, an algorithm choice, data-dependent work).
//!
//! Kernel times are device times (CUPTI, as the PyTorch profiler records
//! them), so a busy host does not stretch them: host contention shows in
//! the CPU and OS layers, not here. Per kernel the time *per call* is
//! compared, so ranks whose windows held different numbers of iterations
//! compare alike.

use std::collections::BTreeMap;

pub use whyslow_model::diagnosis::{GpuFinding, GpuPattern, KernelDiff};

/// One kernel's time on one rank over the judged window.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    /// Kernel name (as the profiler names it).
    pub name: String,
    /// Launches in the window.
    pub calls: u64,
    /// Device time summed over those launches, µs.
    pub total_us: f64,
}

/// Thresholds of the GPU diff.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuConfig {
    /// Least ratio of a kernel's time per call over the peers' median for
    /// it to count as slower (1.25: run-to-run kernel time varies by a few
    /// per cent; PerfTracker's throttled GPUs run 1.3–2× slower).
    pub min_ratio: f64,
    /// Least share of the rank's GPU time that a slower kernel's excess
    /// must reach to be named (0.01: a 2× slower kernel of a microsecond
    /// is no cause).
    pub min_excess: f64,
    /// Least share of the peers' GPU time held by slower kernels for the
    /// slowdown to be *uniform* (hardware).
    pub uniform_share: f64,
    /// The most a uniform slowdown can be for the hardware to explain it
    /// (4: an H100's SM clock spans 345-1980 MHz, and throttled GPUs run
    /// 1.3-2× slower); beyond it the kernels do more work per call:
    /// [`GpuPattern::Workload`] (H100, one rank on a 32× batch: 20× slower,
    /// its GEMMs 20-31×).
    pub max_clock_ratio: f64,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            min_ratio: 1.25,
            min_excess: 0.01,
            uniform_share: 0.6,
            max_clock_ratio: 4.0,
        }
    }
}

fn per_call(kernels: &[KernelTime]) -> BTreeMap<&str, (u64, f64)> {
    let mut m: BTreeMap<&str, (u64, f64)> = BTreeMap::new();
    for k in kernels {
        if k.calls > 0 && k.total_us.is_finite() && k.total_us >= 0.0 {
            let e = m.entry(k.name.as_str()).or_insert((0, 0.0));
            e.0 += k.calls;
            e.1 += k.total_us;
        }
    }
    m
}

/// The median of a non-empty list (the caller skips empty ones); 0 for none.
fn median(mut v: Vec<f64>) -> f64 {
    whyslow_model::stats::median(&mut v).unwrap_or(0.0)
}

/// The GPU diff of `rank` (its kernels over the window) against `peers`
/// (theirs, one list per peer): `None` when its kernels keep their peers'
/// pace, or when there is nothing to compare (no peer, no kernel in
/// common). Kernels run by fewer than half the peers are left out: a
/// kernel only some ranks run is their work, not their pace.
pub fn gpu_diff(
    rank: &[KernelTime],
    peers: &[Vec<KernelTime>],
    cfg: &GpuConfig,
) -> Option<GpuFinding> {
    if peers.is_empty() {
        return None;
    }
    let mine = per_call(rank);
    let theirs: Vec<_> = peers.iter().map(|p| per_call(p)).collect();
    // Per kernel: (calls, my µs per call, peers' median µs per call).
    let mut rows = Vec::new();
    for (&name, &(calls, total)) in &mine {
        let paces: Vec<f64> = theirs
            .iter()
            .filter_map(|p| p.get(name).map(|&(c, t)| t / c as f64))
            .collect();
        if paces.len() * 2 < peers.len() || paces.is_empty() {
            continue;
        }
        rows.push((name, calls, total / calls as f64, median(paces)));
    }
    let my_time: f64 = rows.iter().map(|r| r.1 as f64 * r.2).sum();
    let at_peer_pace: f64 = rows.iter().map(|r| r.1 as f64 * r.3).sum();
    if my_time <= 0.0 || at_peer_pace <= 0.0 {
        return None;
    }
    let mut kernels = Vec::new();
    let mut slower_time = 0.0;
    for &(name, calls, me, peer) in &rows {
        if peer <= 0.0 || me < peer * cfg.min_ratio {
            continue;
        }
        slower_time += calls as f64 * peer;
        let excess_share = calls as f64 * (me - peer) / my_time;
        if excess_share >= cfg.min_excess {
            kernels.push(KernelDiff {
                kernel: name.to_string(),
                straggler_us: me,
                peers_us: peer,
                ratio: me / peer,
                excess_share,
            });
        }
    }
    if kernels.is_empty() {
        return None;
    }
    kernels.sort_by(|a, b| {
        b.excess_share
            .total_cmp(&a.excess_share)
            .then(a.kernel.cmp(&b.kernel))
    });
    let slower_share = slower_time / at_peer_pace;
    let overall_ratio = my_time / at_peer_pace;
    let pattern = if slower_share >= cfg.uniform_share && overall_ratio >= cfg.min_ratio {
        if overall_ratio > cfg.max_clock_ratio {
            GpuPattern::Workload
        } else {
            GpuPattern::Uniform
        }
    } else {
        GpuPattern::Specific
    };
    Some(GpuFinding {
        pattern,
        overall_ratio,
        slower_share,
        kernels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use whyslow_model::rng::SplitMix64;

    /// A rank's kernels: a GEMM-heavy mix of `n` kernels with a long tail,
    /// each per-call time jittered by ±`jitter`.
    fn ranks_kernels(
        n: usize,
        jitter: f64,
        rng: &mut SplitMix64,
        scale: impl Fn(usize) -> f64,
    ) -> Vec<KernelTime> {
        (0..n)
            .map(|i| {
                let calls = 50 + (i as u64 * 37) % 400;
                let pace = 2_000.0 / (1.0 + i as f64).powf(1.3);
                let j = 1.0 + jitter * (rng.symmetric());
                KernelTime {
                    name: format!("kernel_{i}"),
                    calls,
                    total_us: calls as f64 * pace * j * scale(i),
                }
            })
            .collect()
    }

    #[test]
    fn a_bigger_batch_is_workload_not_hardware() {
        // H100 (scripts/gpu-check, 2026-11-27): rank 2 of 4 on a 32× batch
        // of a 1024-wide MLP; µs per call, the rank's calls, peers' µs.
        let kernels = [
            ("cutlass_80_simt_sgemm_128x256_8x4_nt_align1", 1743.2, 88.75),
            (
                "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8",
                3201.6,
                102.7,
            ),
            (
                "vectorized_elementwise_kernel<threshold_kernel_impl>",
                259.6,
                7.62,
            ),
            (
                "vectorized_elementwise_kernel<launch_clamp_scalar>",
                175.6,
                4.09,
            ),
            ("reduce_kernel<sum_functor>", 40.0, 3.0),
        ];
        let rank = |slow: bool| -> Vec<KernelTime> {
            kernels
                .iter()
                .map(|&(n, me, peer)| KernelTime {
                    name: n.into(),
                    calls: 22,
                    total_us: 22.0 * if slow { me } else { peer },
                })
                .collect()
        };
        let peers = vec![rank(false), rank(false), rank(false)];
        let f = gpu_diff(&rank(true), &peers, &GpuConfig::default()).expect("found");
        assert_eq!(f.pattern, GpuPattern::Workload, "{f:?}");
        assert!(f.overall_ratio > 20.0, "{f:?}");
        assert_eq!(f.kernels[0].kernel, kernels[1].0);
    }

    #[test]
    fn throttled_clocks_are_uniform_one_slow_kernel_is_specific_healthy_is_nothing() {
        let cfg = GpuConfig::default();
        for seed in 0..20u64 {
            let mut rng = SplitMix64::new(seed);
            for peers_n in [1usize, 3, 7, 15] {
                for jitter in [0.0, 0.03, 0.08] {
                    let peers: Vec<_> = (0..peers_n)
                        .map(|_| ranks_kernels(30, jitter, &mut rng, |_| 1.0))
                        .collect();
                    let healthy = ranks_kernels(30, jitter, &mut rng, |_| 1.0);
                    assert_eq!(
                        gpu_diff(&healthy, &peers, &cfg),
                        None,
                        "seed {seed} peers {peers_n} jitter {jitter}"
                    );
                    for x in [1.35, 1.5, 2.0] {
                        let hot = ranks_kernels(30, jitter, &mut rng, |_| x);
                        let f = gpu_diff(&hot, &peers, &cfg).expect("throttled rank found");
                        assert_eq!(f.pattern, GpuPattern::Uniform, "{f:?}");
                        assert!((f.overall_ratio - x).abs() < 0.1 * x, "{f:?}");
                        // Kernels that carry the slowdown are named
                        // (which, near the 1.25 line, is the jitter's).
                        assert!(f.kernels.len() >= 3, "{f:?}");
                        assert!(f.kernels.iter().all(|k| k.ratio >= cfg.min_ratio), "{f:?}");
                    }
                    // The third-heaviest kernel 2.5x slower, the rest alike.
                    let one =
                        ranks_kernels(30, jitter, &mut rng, |i| if i == 2 { 2.5 } else { 1.0 });
                    let f = gpu_diff(&one, &peers, &cfg).expect("slow kernel found");
                    assert_eq!(f.pattern, GpuPattern::Specific, "{f:?}");
                    assert_eq!(f.kernels.len(), 1, "{f:?}");
                    assert_eq!(f.kernels[0].kernel, "kernel_2");
                    assert!((f.kernels[0].ratio - 2.5).abs() < 0.4, "{f:?}");
                }
            }
        }
    }

    #[test]
    fn kernels_only_some_ranks_run_and_bad_numbers_are_left_out() {
        let cfg = GpuConfig::default();
        let k = |name: &str, calls: u64, total_us: f64| KernelTime {
            name: name.into(),
            calls,
            total_us,
        };
        let peers = vec![
            vec![k("gemm", 100, 10_000.0)],
            vec![k("gemm", 100, 10_200.0)],
            vec![k("gemm", 100, 9_900.0)],
        ];
        // A kernel no peer runs (rank-dependent work) is not a slower one.
        let me = vec![k("gemm", 100, 10_100.0), k("only_mine", 10, 50_000.0)];
        assert_eq!(gpu_diff(&me, &peers, &cfg), None);
        // NaN, negative and zero-call entries are skipped, not propagated.
        let me = vec![
            k("gemm", 100, f64::NAN),
            k("gemm", 0, 5.0),
            k("gemm", 100, -3.0),
        ];
        assert_eq!(gpu_diff(&me, &peers, &cfg), None);
        assert_eq!(gpu_diff(&[k("gemm", 100, 30_000.0)], &[], &cfg), None);
        // Per call, not per window: twice the iterations at the same pace
        // is no slowdown.
        assert_eq!(gpu_diff(&[k("gemm", 200, 20_000.0)], &peers, &cfg), None);
        let f = gpu_diff(&[k("gemm", 50, 10_000.0)], &peers, &cfg).unwrap();
        assert_eq!(f.pattern, GpuPattern::Uniform);
        assert!((f.kernels[0].ratio - 2.0).abs() < 0.05);
    }
}
