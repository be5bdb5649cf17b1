//! Parallelism strategy identification (LLMPrism §IV-B, Algorithm 2).
//!
//! For every endpoint pair (both directions together):
//!
//! 1. intervals Δtᵢ between consecutive flow starts (lines 3–5);
//! 2. step division by BOCD on the normalized intervals (line 7, [`step_division`]);
//! 3. Nₖ = number of distinct flow sizes in step k (sizes within [`SIZE_TOLERANCE`]
//!    of each other count as one: a transport's framing adds a few bytes to some
//!    messages, e.g. gloo's 48-byte headers sent with or apart from the tensor);
//!    the pair is PP when Mode(Nₖ) = 1,
//!    DP otherwise (lines 9–12; ties go to the smaller Nₖ, i.e. PP, which refinement
//!    can still correct);
//!    Pairs where BOCD finds fewer than [`MIN_STEPS`] steps are re-divided at the DP
//!    burst ends of their job (extension: PP traffic often has no longer gap at the end
//!    of a step);
//! 4. noise refinement: DFS finds the connected components of the graph of DP pairs;
//!    every pair inside a component is DP by transitivity (lines 14–16).

use crate::bocd::{change_points, normalize_intervals, BocdConfig};
use crate::jobs::Jobs;
use crate::steps::{bursts_per_step, divide, step_ending_bursts};
use crate::{FlowIndex, FxHashMap, PairType};

/// Classification of every pair of a [`FlowIndex`] (vectors parallel to
/// `FlowIndex::pairs`) and the DP groups.
#[derive(Debug, Clone, Default)]
pub struct Classified {
    /// Final type of each pair.
    pub kind: Vec<PairType>,
    /// Steps found by step division.
    pub steps: Vec<usize>,
    /// Mode of Nₖ.
    pub mode: Vec<usize>,
    /// Turned from PP into DP by the DFS refinement.
    pub refined: Vec<bool>,
    /// DP groups of each job: connected components (≥ 2 addresses) of the DP graph,
    /// as address ids sorted by address.
    pub dp_groups: Vec<Vec<Vec<u32>>>,
    /// DP group (index into `dp_groups[job]`) of each address id.
    pub group_of: Vec<Option<usize>>,
}

/// Split flows (sorted by start time; `(start, end)` in µs) into steps: returns the
/// indices of the first flow of every step after the first.
///
/// The interval before flow i+1 is its idle gap: start_{i+1} − max(end_0..=i), at least
/// 0 — concurrent or back-to-back flows of one collective give ≈ 0 instead of a mix of
/// 0 and chunk durations (a refinement of the paper's start-to-start Δt). BOCD runs on
/// the normalized gaps; a new segment starting at interval j makes flow j the first
/// flow of a step (the gap before it closes the previous step).
pub fn step_division(flows: &[(u64, u64)], cfg: &BocdConfig) -> Vec<usize> {
    if flows.len() < 3 {
        return Vec::new();
    }
    let dts: Vec<f64> = crate::steps::idle_gaps(flows)
        .into_iter()
        .map(|g| g as f64)
        .collect();
    let xs = normalize_intervals(&dts, cfg.interval_unit_us);
    change_points(&xs, cfg)
        .into_iter()
        .filter(|&c| c < flows.len())
        .collect()
}

/// Pairs with fewer steps than this are re-divided at their job's DP burst ends.
pub const MIN_STEPS: usize = 3;

/// Steps of one pair and the mode of their distinct flow sizes (Algorithm 2,
/// lines 7–12). Where the pair's segments come k to a step (ZeRO: the
/// reduce-scatter's rounds, a gap for the optimizer, the all-gather's: each
/// phase one size when a bucket makes a round's only flow), the segments are
/// joined into steps as the timelines join bursts
/// ([`crate::steps::bursts_per_step`], [`crate::steps::step_ending_bursts`])
/// before their sizes are counted: else a DP pair whose every phase carries
/// one size reads as PP (Nₖ = 1 per phase).
fn divide_and_count(spans: &[(u64, u64)], sizes: &[u64], cfg: &BocdConfig) -> (usize, usize) {
    let cps = divide(spans, cfg);
    let mut prev = 0;
    let mut segments: Vec<std::ops::Range<usize>> = Vec::with_capacity(cps.len() + 1);
    for &cp in cps.iter().chain(std::iter::once(&sizes.len())) {
        if cp > prev {
            segments.push(prev..cp);
        }
        prev = cp;
    }
    let bursts: Vec<(u64, u64)> = segments
        .iter()
        .map(|r| {
            let s = spans[r.clone()].iter().map(|t| t.0).min().unwrap_or(0);
            let e = spans[r.clone()].iter().map(|t| t.1).max().unwrap_or(0);
            (s, e)
        })
        .collect();
    let (k, phase) = bursts_per_step(&bursts);
    let ends = if k > 1 {
        step_ending_bursts(&bursts, k, phase)
    } else {
        vec![true; segments.len()]
    };
    let mut steps: Vec<Vec<u64>> = Vec::with_capacity(segments.len());
    let mut cur: Vec<u64> = Vec::new();
    for (r, &end) in segments.iter().zip(&ends) {
        cur.extend_from_slice(&sizes[r.clone()]);
        if end {
            steps.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        steps.push(cur);
    }
    let refs: Vec<&[u64]> = steps.iter().map(Vec::as_slice).collect();
    (refs.len(), mode_of_distinct_sizes(&refs))
}

/// Relative difference below which two flow sizes count as the same in Nₖ.
pub const SIZE_TOLERANCE: f64 = 0.02;

/// Number of distinct sizes in `sizes` (sorted in place): a new size starts more
/// than [`SIZE_TOLERANCE`] above the first of the current one.
pub fn distinct_sizes(sizes: &mut [u64]) -> usize {
    sizes.sort_unstable();
    let mut n = 0;
    let mut first = 0f64;
    for &s in sizes.iter() {
        if n == 0 || s as f64 > first * (1.0 + SIZE_TOLERANCE) {
            n += 1;
            first = s as f64;
        }
    }
    n
}

/// Mode of the per-step counts of distinct sizes ([`distinct_sizes`]), smallest on
/// ties; 0 for no steps.
pub fn mode_of_distinct_sizes(steps: &[&[u64]]) -> usize {
    let mut counts: FxHashMap<usize, usize> = FxHashMap::default();
    let mut buf: Vec<u64> = Vec::new();
    for s in steps {
        buf.clear();
        buf.extend_from_slice(s);
        *counts.entry(distinct_sizes(&mut buf)).or_insert(0) += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(n, _)| n)
        .unwrap_or(0)
}

/// Mode of the per-step counts of distinct values, smallest on ties; 0 for no steps.
pub fn mode_of_distinct<T: Ord + Copy>(steps: &[&[T]]) -> usize {
    let mut counts: FxHashMap<usize, usize> = FxHashMap::default();
    let mut buf: Vec<T> = Vec::new();
    for s in steps {
        buf.clear();
        buf.extend_from_slice(s);
        buf.sort_unstable();
        buf.dedup();
        *counts.entry(buf.len()).or_insert(0) += 1;
    }
    counts
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
        .map(|(n, _)| n)
        .unwrap_or(0)
}

/// Algorithm 2 over all pairs of all jobs.
pub fn classify(index: &FlowIndex<'_>, jobs: &Jobs, cfg: &BocdConfig) -> Classified {
    let np = index.pairs.len();
    let mut c = Classified {
        kind: Vec::with_capacity(np),
        steps: Vec::with_capacity(np),
        mode: Vec::with_capacity(np),
        refined: vec![false; np],
        dp_groups: vec![Vec::new(); jobs.members.len()],
        group_of: vec![None; index.addrs.len()],
    };
    for (spans, bytes) in index.pair_spans.iter().zip(&index.pair_bytes) {
        let (n, mode) = divide_and_count(spans, bytes, cfg);
        c.steps.push(n);
        c.mode.push(mode);
        c.kind.push(if mode == 1 {
            PairType::Pp
        } else {
            PairType::Dp
        });
    }
    // Fallback for pairs without visible step structure (PP traffic often runs through
    // the whole step with no longer gap at its end): split their flows at the job's DP
    // burst ends instead (an extension of the paper; pure-PP jobs keep one step).
    // Only jobs with such a pair need their burst ends (a BOCD pass over all
    // their DP flows).
    let mut wanted = vec![false; jobs.members.len()];
    for (p, &(a, _)) in index.pairs.iter().enumerate() {
        if c.steps[p] < MIN_STEPS {
            wanted[jobs.job_of[a as usize]] = true;
        }
    }
    let mut job_dp: Vec<Vec<(u64, u64)>> = vec![Vec::new(); jobs.members.len()];
    for (p, &(a, _)) in index.pairs.iter().enumerate() {
        let j = jobs.job_of[a as usize];
        if wanted[j] && c.kind[p] == PairType::Dp && c.steps[p] >= MIN_STEPS {
            job_dp[j].extend_from_slice(&index.pair_spans[p]);
        }
    }
    let job_ends: Vec<Vec<u64>> = job_dp
        .into_iter()
        .map(|mut f| {
            if f.is_empty() {
                return Vec::new();
            }
            // Runs of sorted flows (one per pair): a stable merge sort
            // finds them (the order is total, so stable or not is alike).
            f.sort();
            let cps = divide(&f, cfg);
            let mut ends = Vec::new();
            let mut prev = 0;
            for &cp in cps.iter().chain(std::iter::once(&f.len())) {
                if cp > prev {
                    ends.push(f[prev..cp].iter().map(|x| x.1).max().unwrap_or(0));
                }
                prev = cp;
            }
            ends
        })
        .collect();
    for (p, &(a, _)) in index.pairs.iter().enumerate() {
        let ends = &job_ends[jobs.job_of[a as usize]];
        if c.steps[p] >= MIN_STEPS || ends.len() < MIN_STEPS {
            continue;
        }
        let flows = &index.pair_flows[p];
        let mut steps: Vec<Vec<u64>> = vec![Vec::new(); ends.len() + 1];
        for &i in flows {
            let r = index.rec(i);
            let k = ends.partition_point(|&e| e < r.start_us);
            steps[k].push(r.bytes);
        }
        let steps: Vec<&[u64]> = steps
            .iter()
            .filter(|s| !s.is_empty())
            .map(|s| s.as_slice())
            .collect();
        let mode = mode_of_distinct_sizes(&steps);
        c.steps[p] = steps.len();
        c.mode[p] = mode;
        c.kind[p] = if mode == 1 {
            PairType::Pp
        } else {
            PairType::Dp
        };
    }
    // (4) Noise refinement: DFS over the DP graph of each job.
    let n = index.addrs.len();
    let mut adj: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (p, &(a, b)) in index.pairs.iter().enumerate() {
        if c.kind[p] == PairType::Dp {
            adj[a as usize].push(b);
            adj[b as usize].push(a);
        }
    }
    let mut comp: Vec<usize> = vec![usize::MAX; n];
    let mut comps: Vec<Vec<u32>> = Vec::new();
    let mut stack = Vec::new();
    for s in 0..n {
        if comp[s] != usize::MAX || adj[s].is_empty() {
            continue;
        }
        let id = comps.len();
        comps.push(Vec::new());
        comp[s] = id;
        stack.push(s as u32);
        while let Some(u) = stack.pop() {
            comps[id].push(u);
            for &v in &adj[u as usize] {
                if comp[v as usize] == usize::MAX {
                    comp[v as usize] = id;
                    stack.push(v);
                }
            }
        }
    }
    for (p, &(a, b)) in index.pairs.iter().enumerate() {
        let (ca, cb) = (comp[a as usize], comp[b as usize]);
        if c.kind[p] == PairType::Pp && ca != usize::MAX && ca == cb {
            c.kind[p] = PairType::Dp;
            c.refined[p] = true;
        }
    }
    // DP groups per job.
    for mut g in comps {
        g.sort_by_key(|&id| index.addrs[id as usize]);
        let job = jobs.job_of[g[0] as usize];
        c.dp_groups[job].push(g);
    }
    for (job, groups) in c.dp_groups.iter_mut().enumerate() {
        groups.sort_by_key(|g| index.addrs[g[0] as usize]);
        let _ = job;
        for (gi, g) in groups.iter().enumerate() {
            for &id in g {
                c.group_of[id as usize] = Some(gi);
            }
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_prefers_majority_then_smaller() {
        let a: [u64; 3] = [1, 1, 1];
        let b: [u64; 3] = [1, 2, 3];
        assert_eq!(mode_of_distinct(&[&a, &a, &b]), 1);
        assert_eq!(mode_of_distinct(&[&a, &b, &b]), 3);
        assert_eq!(mode_of_distinct(&[&a, &b]), 1);
        assert_eq!(mode_of_distinct::<u64>(&[]), 0);
    }

    #[test]
    fn divides_bursts_into_steps() {
        // 10 steps of 1 s; each step ends with a burst of 6 flows 2 ms apart, with jitter.
        let mut starts = Vec::new();
        let mut s = 3u64;
        for k in 0..10u64 {
            for j in 0..6u64 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let t = k * 1_000_000 + 900_000 + j * 2_000 + (s >> 54);
                starts.push((t, t + 1_500));
            }
        }
        let cps = step_division(&starts, &BocdConfig::default());
        assert_eq!(cps, (1..10).map(|k| k * 6).collect::<Vec<_>>());
    }
}
