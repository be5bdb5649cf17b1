//! Slowdowns spread over every GPU kernel of a worker (PerfTracker Table 4,
//! "GPU throttling"): whyslow's check beside the per-function rule.
//!
//! A GPU that runs at lower clocks (thermal or power throttling), a degraded
//! GPU or a different model makes *every* kernel on its worker slower by
//! about the same factor. Per function the difference is small — each kernel
//! a fraction of a percent of the window more, 1.5× is a normalized distance
//! of 0.33 < δ (Eq. 10) — so neither Eq. 7 nor Eq. 11 names any kernel,
//! while the worker's GPU time as a whole is far off its peers'. This check
//! sums, per worker, the run time and critical-path share (β) of all its GPU
//! compute kernels (not communication or copies) and names a minority of
//! workers whose sum is `min_ratio` times the peers' median and `min_effect`
//! of the window more, in run time and in β, provided the slowdown is
//! *broad*: kernels holding most of the peers' GPU time (a weighted median)
//! are each at least `min_ratio` times slower on the worker. One slow kernel
//! (EROICA's "GEMM slow on 4 workers") is the per-function rule's finding,
//! not this one.

use std::collections::HashMap;

use whyslow_model::{
    Finding, FunctionKind, Reason, Resource, Stat, UtilizationSource, WorkerPoint,
};

use crate::source::Source;
use crate::stats::{clean, median};
use crate::LocalizeConfig;

/// The function name of a finding of this check.
pub const ALL_GPU_KERNELS: &str = "all GPU compute kernels";

/// Per worker: Σ run-time share, Σ β and Σ critical µs of its GPU compute
/// kernels.
pub(crate) struct GpuTime {
    share: f64,
    beta: f64,
    critical_us: f64,
}

/// Per fingerprint of `src`: its [`GpuTime`] (sums in the order of its
/// patterns).
pub(crate) fn gpu_times<S: Source + ?Sized>(src: &S) -> Vec<GpuTime> {
    let mut acc = vec![(0f64, 0f64, 0f64); src.count()];
    src.for_each_pattern(Some(FunctionKind::GpuKernel), None, |i, p| {
        let a = &mut acc[i];
        a.0 += clean(p.beta);
        a.1 += clean(p.critical_us);
        a.2 += clean(p.total_us);
    });
    acc.into_iter()
        .enumerate()
        .map(|(i, (beta, critical_us, total))| {
            let window = clean(src.window_us(i));
            GpuTime {
                share: if window > 0.0 { total / window } else { 0.0 },
                beta,
                critical_us,
            }
        })
        .collect()
}

/// Each kernel's run time on one worker, by name.
fn per_kernel<S: Source + ?Sized>(src: &S, i: usize) -> HashMap<&str, f64> {
    let mut m: HashMap<&str, f64> = HashMap::new();
    src.patterns_of(i, |p| {
        if p.kind == FunctionKind::GpuKernel {
            *m.entry(p.name).or_default() += clean(p.total_us);
        }
    });
    m
}

/// Peers whose per-kernel times are compared, at most (evenly spaced): the
/// per-kernel medians need no more, and a million workers stay cheap.
const MAX_KERNEL_PEERS: usize = 1000;

/// The finding of this check for one comparison group (`members`: indices
/// into `fps`, in rank order; `all_times`: [`gpu_times`] of `fps`), if any.
pub(crate) fn broad_gpu_slowdowns<S: Source + ?Sized>(
    fps: &S,
    all_times: &[GpuTime],
    members: &[u32],
    group: Option<&str>,
    cfg: &LocalizeConfig,
) -> Option<Finding> {
    let g = members.len();
    if g < cfg.min_peer_workers.max(3) {
        return None;
    }
    let times: Vec<&GpuTime> = members.iter().map(|&i| &all_times[i as usize]).collect();
    let med_share = median(&mut times.iter().map(|t| t.share).collect::<Vec<_>>());
    if med_share <= 0.0 {
        return None;
    }
    let slower = |t: &GpuTime, share: f64| {
        t.share >= cfg.min_ratio * share && t.share - share >= cfg.min_effect
    };
    let mut flagged: Vec<usize> = (0..g).filter(|&i| slower(times[i], med_share)).collect();
    if flagged.is_empty() || 2 * flagged.len() >= g {
        return None;
    }
    // Against the peers alone, each flagged worker must still stand out,
    // with more of its window on the critical path, across most GPU time.
    let is_flagged = |i: usize| flagged.binary_search(&i).is_ok();
    let peers: Vec<usize> = (0..g).filter(|&i| !is_flagged(i)).collect();
    let peer_share = median(&mut peers.iter().map(|&i| times[i].share).collect::<Vec<_>>());
    let peer_beta = median(&mut peers.iter().map(|&i| times[i].beta).collect::<Vec<_>>());
    let step = peers.len().div_ceil(MAX_KERNEL_PEERS).max(1);
    let sampled: Vec<usize> = peers.iter().copied().step_by(step).collect();
    let mut kernel_time: HashMap<&str, Vec<f64>> = HashMap::new();
    for &i in &sampled {
        for (k, v) in per_kernel(fps, members[i] as usize) {
            kernel_time.entry(k).or_default().push(v);
        }
    }
    // Kernels absent on a peer count as 0 there.
    let peer_kernel: Vec<(&str, f64)> = kernel_time
        .into_iter()
        .map(|(k, mut v)| {
            v.resize(sampled.len(), 0.0);
            (k, median(&mut v))
        })
        .filter(|&(_, v)| v > 0.0)
        .collect();
    let broad = |i: usize| {
        let own = per_kernel(fps, members[i] as usize);
        let mut ratios: Vec<(f64, f64)> = peer_kernel
            .iter()
            .map(|&(k, v)| (own.get(k).copied().unwrap_or(0.0) / v, v))
            .collect();
        ratios.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = ratios.iter().map(|r| r.1).sum();
        let mut acc = 0.0;
        for (ratio, w) in ratios {
            acc += w;
            if acc >= total / 2.0 {
                return ratio >= cfg.min_ratio;
            }
        }
        false
    };
    flagged.retain(|&i| {
        let t = &times[i];
        slower(t, peer_share) && t.beta - peer_beta >= cfg.min_effect && broad(i)
    });
    if flagged.is_empty() {
        return None;
    }
    let is_flagged = |i: usize| flagged.binary_search(&i).is_ok();
    let med = |f: &dyn Fn(&GpuTime) -> f64, want: bool| {
        median(
            &mut (0..g)
                .filter(|&i| is_flagged(i) == want)
                .map(|i| f(times[i]))
                .collect::<Vec<_>>(),
        )
    };
    let peer_count = Some(peers.len() as u32);
    let stat = |f: &dyn Fn(&GpuTime) -> f64| Stat {
        value: med(f, true),
        peers: med(f, false),
        peer_count,
    };
    let zero = Stat {
        value: 0.0,
        peers: 0.0,
        peer_count: Some(0),
    };
    let ratio = med(&|t| t.share, true) / peer_share;
    let workers: Vec<u32> = flagged
        .iter()
        .map(|&i| fps.rank(members[i] as usize))
        .collect();
    let mut hosts: Vec<String> = flagged
        .iter()
        .filter_map(|&i| fps.host(members[i] as usize).map(str::to_string))
        .collect();
    hosts.sort();
    hosts.dedup();
    Some(Finding {
        function: ALL_GPU_KERNELS.into(),
        kind: FunctionKind::GpuKernel,
        workers,
        reason: Reason::PeerOutlier,
        beta: stat(&|t| t.beta),
        mu: zero,
        sigma: zero,
        resource: Resource::Sm,
        util_source: UtilizationSource::None,
        group: group.map(str::to_string),
        group_workers: g,
        hosts,
        critical_us: stat(&|t| t.critical_us),
        resource_mu: None,
        hint: Some(format!(
            "Every GPU kernel on these workers runs about {ratio:.2}× as long as on their \
             peers (not one kernel: most of the GPU time), so the GPU itself is slower: \
             clocks lowered by thermal or power throttling, a degraded GPU, or a different \
             GPU model, driver or settings. Compare `nvidia-smi -q -d PERFORMANCE,CLOCK,\
             TEMPERATURE,POWER` (clocks_event_reasons) on these hosts with a healthy one."
        )),
        source_excerpt: None,
        points: (0..g)
            .filter(|&i| is_flagged(i) || i < cfg.max_points)
            .map(|i| WorkerPoint {
                worker: fps.rank(members[i] as usize),
                beta: times[i].beta,
                mu: 0.0,
                sigma: 0.0,
                flagged: is_flagged(i),
            })
            .collect(),
        explains: 0.0,
        consequences: Vec::new(),
    })
}
