//! Step division that holds on real schedules (LLMPrism §IV-B line 7, §IV-C).
//!
//! The paper divides a pair's (or a rank's) flows into training steps by BOCD on
//! the intervals between them ([`crate::classify::step_division`]): a step
//! boundary is an interval that stands out from those before it. That holds when
//! a step holds many flows and one long compute gap. Real traffic is not always
//! like that: a DDP job's buckets leave gaps of their own through the backward
//! (on the testbed: six flowlets in 40 ms, then 320 ms of compute, so the step
//! gap is one interval in six and no outlier); a DP group of two with one
//! bucket sends one flow per phase. [`divide`] therefore checks BOCD's division
//! against what a step division must be, *regular* (every step does the same
//! work), and where it is not, looks for the level of idle gaps that is
//! ([`regular_level`]).
//!
//! Also here: the other extensions of the paper's division used by the
//! timelines ([`bursts_per_step`], [`gap_breaks`], [`complete_breaks`]).

use crate::bocd::BocdConfig;
use crate::classify::step_division;

/// Idle gap before each flow after the first: its start minus the latest end of
/// the flows before it, at least 0 (µs). `flows` are sorted by start.
pub fn idle_gaps(flows: &[(u64, u64)]) -> Vec<u64> {
    let mut gaps = Vec::with_capacity(flows.len().saturating_sub(1));
    let Some(&(_, first_end)) = flows.first() else {
        return gaps;
    };
    let mut end = first_end;
    for &(s, e) in &flows[1..] {
        gaps.push(s.saturating_sub(end));
        end = end.max(e);
    }
    gaps
}

/// Step boundaries of `flows` (sorted by start; `(start, end)` in µs) as the
/// indices of the first flow of every step after the first.
///
/// BOCD first (the paper's method, completed by [`complete_breaks`]); kept when
/// its steps are regular ([`is_regular`]). Otherwise the most regular level of
/// idle gaps ([`regular_level`]); failing both, the older fallbacks (Otsu's
/// natural break when BOCD found no step, BOCD's own breaks otherwise).
pub fn divide(flows: &[(u64, u64)], cfg: &BocdConfig) -> Vec<usize> {
    let bocd = step_division(flows, cfg);
    let bocd = complete_breaks(flows, bocd);
    if is_regular(flows, &bocd) {
        return bocd;
    }
    if let Some(level) = regular_level(flows) {
        return level;
    }
    if bocd.len() < 2 && flows.len() >= 8 {
        gap_breaks(flows).unwrap_or(bocd)
    } else {
        bocd
    }
}

/// Largest relative spread ([`robust_cv`]) of the intervals between step ends
/// that still counts as regular.
pub const MAX_STEP_SPREAD: f64 = 0.25;

/// Whether the bursts that `cps` cut `flows` into end at regular intervals,
/// directly or every k-th burst (k ≤ 4: a step of several DP phases), with at
/// least 3 intervals to judge from.
pub fn is_regular(flows: &[(u64, u64)], cps: &[usize]) -> bool {
    let ends = burst_ends(flows, cps);
    (1..=4usize).any(|k| {
        let mut d: Vec<f64> = ends.windows(k + 1).map(|w| (w[k] - w[0]) as f64).collect();
        d.len() >= 3 * k && robust_cv(&mut d) <= MAX_STEP_SPREAD
    })
}

/// Latest end of each burst that the starts `cps` cut `flows` into.
fn burst_ends(flows: &[(u64, u64)], cps: &[usize]) -> Vec<u64> {
    let mut ends = Vec::with_capacity(cps.len() + 1);
    let mut prev = 0;
    for &cp in cps.iter().chain(std::iter::once(&flows.len())) {
        let cp = cp.min(flows.len());
        if cp > prev {
            ends.push(flows[prev..cp].iter().map(|f| f.1).max().unwrap_or(0));
        }
        prev = cp;
    }
    ends
}

/// Least share of all idle time that the gaps at step boundaries must hold: a
/// level cut only at rarer, longer stalls (a checkpoint every few steps) is
/// regular too but leaves most of the compute gaps inside its "steps".
pub const MIN_STEP_IDLE_SHARE: f64 = 1.0 / 3.0;

/// Most spread, in ln(gap), of the gaps cut at one level: cut gaps are one class
/// (the compute between steps, with jitter and the odd slow step), not a mix of
/// the gaps between buckets and those between steps.
pub const MAX_CUT_GAP_LN_SPREAD: f64 = 0.5;

/// The coarsest level of idle gaps at which `flows` fall into regular steps, as
/// burst starts, or `None`.
///
/// Levels are the natural breaks of the idle gaps ([`idle_gaps`]): cuts between
/// consecutive distinct gaps at least 2× apart. From the longest gaps down, the
/// first level is taken that (a) makes ≥ 4 bursts, (b) whose gaps hold at least
/// [`MIN_STEP_IDLE_SHARE`] of the idle time, (c) are one class
/// ([`MAX_CUT_GAP_LN_SPREAD`]), and (d) whose bursts end at regular intervals
/// ([`is_regular`]). Coarsest first because a finer level (the buckets of one
/// backward) can look regular too when most of its intervals are alike.
pub fn regular_level(flows: &[(u64, u64)]) -> Option<Vec<usize>> {
    let gaps = idle_gaps(flows);
    if gaps.len() < 3 {
        return None;
    }
    let total: f64 = gaps.iter().map(|&g| g as f64).sum();
    if total <= 0.0 {
        return None;
    }
    let mut sorted = gaps.clone();
    sorted.sort_unstable();
    sorted.dedup();
    // Cut values between classes, longest first; at most 64 of the widest breaks.
    let mut cuts: Vec<(f64, u64)> = sorted
        .windows(2)
        .filter(|w| w[1] + 1 >= 2 * (w[0] + 1))
        .map(|w| (((w[1] + 1) as f64 / (w[0] + 1) as f64), w[0]))
        .collect();
    if cuts.len() > 64 {
        cuts.sort_by(|a, b| b.0.total_cmp(&a.0));
        cuts.truncate(64);
    }
    cuts.sort_by_key(|c| std::cmp::Reverse(c.1));
    for &(_, below) in &cuts {
        let cps: Vec<usize> = gaps
            .iter()
            .enumerate()
            .filter(|(_, &g)| g > below)
            .map(|(i, _)| i + 1)
            .collect();
        if cps.len() < 3 {
            continue;
        }
        let cut_idle: f64 = cps.iter().map(|&c| gaps[c - 1] as f64).sum();
        if cut_idle < MIN_STEP_IDLE_SHARE * total {
            continue;
        }
        let ln: Vec<f64> = cps.iter().map(|&c| (gaps[c - 1] as f64).ln()).collect();
        let mean = ln.iter().sum::<f64>() / ln.len() as f64;
        let var = ln.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / ln.len() as f64;
        if var.sqrt() > MAX_CUT_GAP_LN_SPREAD {
            continue;
        }
        if is_regular(flows, &cps) {
            return Some(cps);
        }
    }
    None
}

/// Every level of idle gaps at which `flows` fall into regular bursts
/// ([`is_regular`], ≥ 3 breaks), as burst starts, coarsest first: the natural
/// breaks of [`regular_level`] without its preference for the coarsest level.
/// The candidates when a rank's own division disagrees with its job's period
/// (see `timeline`): a division at every other step is regular too.
pub fn regular_levels(flows: &[(u64, u64)]) -> Vec<Vec<usize>> {
    let gaps = idle_gaps(flows);
    let mut sorted = gaps.clone();
    sorted.sort_unstable();
    sorted.dedup();
    let mut below: Vec<u64> = sorted
        .windows(2)
        .filter(|w| w[1] + 1 >= 2 * (w[0] + 1))
        .map(|w| w[0])
        .collect();
    below.reverse();
    below.truncate(64);
    below
        .into_iter()
        .map(|b| {
            gaps.iter()
                .enumerate()
                .filter(|(_, &g)| g > b)
                .map(|(i, _)| i + 1)
                .collect::<Vec<usize>>()
        })
        .filter(|cps| cps.len() >= 3 && is_regular(flows, cps))
        .collect()
}

/// Robust relative spread of `v`: interquartile range / (1.349 · median), the
/// standard deviation over the mean for normal data, unmoved by a few outliers
/// (a slow step, a checkpoint) yet large for two alternating values (which a
/// median absolute deviation would call 0). Infinite for fewer than 3 values.
fn robust_cv(v: &mut [f64]) -> f64 {
    if v.len() < 3 {
        return f64::INFINITY;
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    let med = q(0.5);
    if med <= 0.0 {
        return f64::INFINITY;
    }
    (q(0.75) - q(0.25)) / (1.349 * med)
}

/// How many DP bursts make one training step, and which burst (index mod k) ends
/// one: `(1, 0)` unless the ends of consecutive bursts are irregular (relative
/// spread > 0.25) while those of every k-th burst (the smallest such k ≤ 4, with
/// ≥ 3 steps) are regular (≤ 0.25) and at least 3× more regular. The step-ending phase is the one followed by the longest median
/// idle time (the next step's compute).
pub fn bursts_per_step(bursts: &[(u64, u64)]) -> (usize, usize) {
    let spread = |k: usize| -> f64 {
        let mut d: Vec<f64> = bursts
            .windows(k + 1)
            .map(|w| (w[k].1 - w[0].1) as f64)
            .collect();
        robust_cv(&mut d)
    };
    let one = spread(1);
    if one.is_finite() && one <= 0.25 {
        return (1, 0);
    }
    // The smallest such k: every multiple of it is regular too.
    let Some(k) = (2..=4usize).filter(|&k| bursts.len() > 3 * k).find(|&k| {
        let cv = spread(k);
        cv <= 0.25 && cv * 3.0 <= one
    }) else {
        return (1, 0);
    };
    let idle_after = |phase: usize| -> f64 {
        let mut g: Vec<f64> = (phase..bursts.len() - 1)
            .step_by(k)
            .map(|j| bursts[j + 1].0.saturating_sub(bursts[j].1) as f64)
            .collect();
        g.sort_by(f64::total_cmp);
        g.get(g.len() / 2).copied().unwrap_or(0.0)
    };
    let phase = (0..k)
        .max_by(|&a, &b| idle_after(a).total_cmp(&idle_after(b)))
        .unwrap_or(0);
    (k, phase)
}

/// Burst starts (as [`step_division`] returns them) at the gaps of the larger of
/// two classes of idle gaps between `flows` (sorted by start; `(start, end)`, µs):
/// the split of ln(1 + gap/µs) that maximizes the between-class variance (Otsu),
/// accepted only when it is clear: it explains ≥ 80 % of the variance and the
/// smallest gap of the upper class is ≥ 10× the largest of the lower (+ 1 µs).
pub fn gap_breaks(flows: &[(u64, u64)]) -> Option<Vec<usize>> {
    if flows.len() < 3 {
        return None;
    }
    let gaps: Vec<f64> = idle_gaps(flows).into_iter().map(|g| g as f64).collect();
    let mut x: Vec<f64> = gaps.iter().map(|g| g.ln_1p()).collect();
    x.sort_by(f64::total_cmp);
    let n = x.len() as f64;
    let total: f64 = x.iter().sum();
    let mean = total / n;
    let var_t: f64 = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
    if var_t <= 0.0 {
        return None;
    }
    let (mut best, mut best_i, mut left) = (0.0, 0, 0.0);
    for i in 1..x.len() {
        left += x[i - 1];
        let (w0, w1) = (i as f64 / n, (n - i as f64) / n);
        let (m0, m1) = (left / i as f64, (total - left) / (n - i as f64));
        let between = w0 * w1 * (m0 - m1) * (m0 - m1);
        if between > best {
            (best, best_i) = (between, i);
        }
    }
    let (lo, hi) = (x[best_i - 1].exp_m1(), x[best_i].exp_m1());
    if best / var_t < 0.8 || hi < 10.0 * (lo + 1.0) {
        return None;
    }
    // The cut halfway between the classes in log scale (comparing with `hi`
    // itself would lose the smallest upper gap to rounding in ln/exp).
    let cut = (0.5 * (x[best_i - 1] + x[best_i])).exp_m1();
    Some(
        gaps.iter()
            .enumerate()
            .filter(|(_, &g)| g > cut)
            .map(|(i, _)| i + 1)
            .collect(),
    )
}

/// BOCD's burst starts `cps` completed to whole classes of gaps (§IV-B line 7
/// extended): every gap at least as long as the 10th percentile of the gaps
/// BOCD broke at (with ≥ 3 of them; the percentile keeps one odd short break
/// from pulling in every gap), and every gap of a class of gaps BOCD broke at
/// often ([`gap_classes`], [`MIN_CLASS_BREAK_SHARE`]). Returned sorted.
///
/// The classes matter where a step holds two kinds of break: ZeRO's
/// reduce-scatter, optimizer, all-gather leaves an optimizer gap inside the
/// step beside the compute gap between steps. BOCD, restarting its run after
/// each change point, misses some of the shorter kind; the percentile alone
/// lands inside that class and leaves out its lower tail (the jitter of the
/// optimizer), and a step left unsplit among split ones throws off how the
/// bursts are grouped into steps (two steps read as one).
pub fn complete_breaks(flows: &[(u64, u64)], mut cps: Vec<usize>) -> Vec<usize> {
    if cps.len() < 3 || flows.len() < 2 {
        return cps;
    }
    let gaps = idle_gaps(flows);
    let mut at: Vec<u64> = cps
        .iter()
        .filter_map(|&c| c.checked_sub(1).and_then(|i| gaps.get(i)).copied())
        .collect();
    if at.len() < 3 {
        return cps;
    }
    at.sort_unstable();
    let theta = at[at.len() / 10];
    if theta == 0 {
        return cps;
    }
    let class = gap_classes(&gaps);
    let n_class = class.iter().copied().max().map_or(0, |c| c + 1);
    let (mut members, mut broken) = (vec![0usize; n_class], vec![0usize; n_class]);
    for &c in &class {
        members[c] += 1;
    }
    for &cp in &cps {
        if let Some(&c) = cp.checked_sub(1).and_then(|i| class.get(i)) {
            broken[c] += 1;
        }
    }
    let complete: Vec<bool> = (0..n_class)
        .map(|c| {
            gaps_floor(&gaps, &class, c) > 0
                && broken[c] >= 3
                && broken[c] as f64 >= MIN_CLASS_BREAK_SHARE * members[c] as f64
        })
        .collect();
    cps.extend(
        gaps.iter()
            .enumerate()
            .filter(|&(i, &g)| g >= theta || complete[class[i]])
            .map(|(i, _)| i + 1),
    );
    cps.sort_unstable();
    cps.dedup();
    cps
}

/// Least share of a class's gaps that BOCD must have broken at for
/// [`complete_breaks`] to break at all of them.
pub const MIN_CLASS_BREAK_SHARE: f64 = 0.1;

/// Class of each gap: sorted, the gaps fall into classes at every jump of 2×
/// or more between consecutive values (the natural breaks of
/// [`regular_level`]); classes are numbered from the shortest gaps up.
pub fn gap_classes(gaps: &[u64]) -> Vec<usize> {
    let mut sorted = gaps.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    // Lower bound of each class.
    let mut bounds = vec![0u64];
    for w in sorted.windows(2) {
        if w[1] + 1 >= 2 * (w[0] + 1) {
            bounds.push(w[1]);
        }
    }
    gaps.iter()
        .map(|&g| bounds.partition_point(|&b| b <= g) - 1)
        .collect()
}

/// Smallest gap of class `c`.
fn gaps_floor(gaps: &[u64], class: &[usize], c: usize) -> u64 {
    gaps.iter()
        .zip(class)
        .filter(|(_, &k)| k == c)
        .map(|(&g, _)| g)
        .min()
        .unwrap_or(0)
}

/// Which of `bursts` (sorted, `(start, end)` µs) end a training step when `k`
/// bursts make one and phase `phase` (mod k) ends it ([`bursts_per_step`]): a
/// burst ends a step when the idle time after it is of the step-ending kind
/// (the next step's compute), i.e. at least the geometric mean of the median
/// idle time after the step-ending phase and that after the others; the last
/// burst always does. The phase alone (every k-th burst) is not enough: a step
/// whose phases came as one burst, or one burst split in two, would shift the
/// count and pair the rest of the run's bursts across step boundaries
/// (LLMPrism §IV-C: a step ends with the end of its DP traffic, which is
/// followed by the next step's computation).
pub fn step_ending_bursts(bursts: &[(u64, u64)], k: usize, phase: usize) -> Vec<bool> {
    let n = bursts.len();
    let by_phase = || {
        (0..n)
            .map(|j| k <= 1 || j % k == phase % k)
            .collect::<Vec<bool>>()
    };
    if k <= 1 || n < 2 {
        return by_phase();
    }
    let idle: Vec<f64> = bursts
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].1) as f64)
        .collect();
    let median = |mut v: Vec<f64>| -> Option<f64> {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let ending = median(
        (0..n - 1)
            .filter(|j| j % k == phase % k)
            .map(|j| idle[j])
            .collect(),
    );
    let inner = median(
        (0..n - 1)
            .filter(|j| j % k != phase % k)
            .map(|j| idle[j])
            .collect(),
    );
    match (ending, inner) {
        (Some(e), Some(i)) if e > 2.0 * i.max(1.0) => {
            let cut = (e * i.max(1.0)).sqrt();
            (0..n).map(|j| j + 1 == n || idle[j] >= cut).collect()
        }
        _ => by_phase(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use whyslow_model::rng::SplitMix64;

    /// A DDP-like rank: per step `buckets` all-reduce flows (both directions at
    /// once, 10–25 ms of backward compute between buckets), then `gap_ms` of
    /// compute ±5 %, and every `ckpt` steps a checkpoint of `ckpt_ms` more.
    /// Returns the flows and the index of each step's first flow.
    fn ddp_rank(
        seed: u64,
        steps: usize,
        buckets: usize,
        gap_ms: f64,
        ckpt: usize,
        ckpt_ms: f64,
    ) -> (Vec<(u64, u64)>, Vec<usize>) {
        let mut rng = SplitMix64::new(seed);
        let mut flows = Vec::new();
        let mut firsts = Vec::new();
        let mut t = 1_000_000u64;
        for k in 0..steps {
            if k > 0 {
                firsts.push(flows.len());
            }
            for b in 0..buckets {
                if b > 0 {
                    t += (rng.range(10.0, 25.0) * 1000.0) as u64;
                }
                let d = (rng.range(0.5, 3.0) * 1000.0) as u64;
                flows.push((t, t + d));
                flows.push((t + rng.below(300), t + d));
                t += d;
            }
            let mut idle = gap_ms * (1.0 + 0.05 * rng.symmetric());
            if ckpt > 0 && (k + 1) % ckpt == 0 {
                idle += ckpt_ms;
            }
            t += (idle * 1000.0) as u64;
        }
        flows.sort_unstable();
        (flows, firsts)
    }

    #[test]
    fn buckets_through_the_backward_divide_at_the_step_gaps() {
        // The testbed's DDP job: the step gap is one interval in `buckets`.
        for seed in 0..6 {
            for buckets in [2, 3, 6, 10] {
                let (flows, truth) = ddp_rank(seed, 50, buckets, 320.0, 0, 0.0);
                let cps = divide(&flows, &BocdConfig::default());
                assert_eq!(cps, truth, "seed {seed}, {buckets} buckets");
            }
        }
    }

    #[test]
    fn a_checkpoint_every_few_steps_is_not_the_step() {
        // Checkpoints (or evaluations) every 8-20 steps costing 1.5-5 steps'
        // compute gap. (One every ≤ 5 steps costing more than the steps between
        // holds a third of the idle time and would read as the step.)
        for (seed, ckpt, cost) in [(1, 10, 400.0), (2, 8, 300.0), (3, 20, 1000.0)] {
            let (flows, truth) = ddp_rank(seed, 60, 4, 200.0, ckpt, cost);
            let level = regular_level(&flows).expect("steps");
            assert_eq!(level, truth, "seed {seed}, checkpoint every {ckpt}");
        }
    }

    #[test]
    fn a_class_of_breaks_bocd_found_in_part_is_completed() {
        // ZeRO per step: reduce-scatter, an optimizer gap of 16-18 ms,
        // all-gather, 200 ms of compute. BOCD found every step gap but only
        // only the longer half of the optimizer gaps (≥ 17 ms).
        let mut flows = Vec::new();
        let mut t = 0u64;
        for k in 0..40u64 {
            flows.push((t, t + 3_000));
            t += 3_000 + 16_000 + (k * 53) % 2_000;
            flows.push((t, t + 3_000));
            t += 203_000;
        }
        let gaps = idle_gaps(&flows);
        let found: Vec<usize> = (1..flows.len())
            .filter(|&i| gaps[i - 1] >= 17_000)
            .collect();
        let all: Vec<usize> = (1..flows.len()).collect();
        assert_eq!(complete_breaks(&flows, found), all);
        // One step whose two phases came as one burst still ends a step, and
        // the steps after it keep their phases.
        let mut bursts: Vec<(u64, u64)> = flows.clone();
        bursts[50] = (bursts[50].0, bursts[51].1);
        bursts.remove(51);
        let (k, phase) = bursts_per_step(&bursts);
        assert_eq!(k, 2);
        let ends = step_ending_bursts(&bursts, k, phase);
        let want: Vec<bool> = (0..bursts.len())
            .map(|j| j == 50 || (j < 50 && j % 2 == 1) || (j > 50 && j % 2 == 0))
            .collect();
        assert_eq!(ends, want);
    }

    #[test]
    fn irregular_gaps_have_no_regular_level() {
        let mut rng = SplitMix64::new(9);
        let mut t = 0u64;
        let flows: Vec<(u64, u64)> = (0..300)
            .map(|_| {
                t += 10f64.powf(1.0 + 5.0 * rng.unit()) as u64;
                (t, t + 10)
            })
            .collect();
        assert_eq!(regular_level(&flows), None);
        assert_eq!(regular_level(&[]), None);
        assert!(!is_regular(&flows[..2], &[1]));
    }
}
