//! Where iteration time rose: one change point in a series of iteration
//! durations, for the report's iteration-time plot.
//!
//! PerfTracker §4.1 *detects* that the mean of the recent iterations rose;
//! the report also shows *when*: the split of the series into a before and an
//! after whose means explain it best (least squares, one change point), kept
//! only when the after is clearly and persistently slower. Values are
//! winsorized first so that one long iteration (a checkpoint, a GC pause)
//! cannot pull the split onto itself.

use whyslow_model::{IterationSeries, IterationSource, IterationTimes, Onset};

/// When a rise counts as an onset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OnsetConfig {
    /// The median after must exceed the median before by this fraction (0.1 = 10 %).
    pub min_rise: f64,
    /// At least this many iterations on each side of the split.
    pub min_side: usize,
    /// At least this fraction of the iterations after the split must be
    /// closer to the after-median than to the before-median.
    pub persistence: f64,
}

impl Default for OnsetConfig {
    fn default() -> Self {
        OnsetConfig {
            min_rise: 0.1,
            min_side: 5,
            persistence: 0.7,
        }
    }
}

/// A change point found by [`find_onset`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    /// Index of the first slower iteration.
    pub index: usize,
    /// Median before it.
    pub before: f64,
    /// Median from it on.
    pub after: f64,
}

/// The median of the finite values; NaN when there are none.
fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
    whyslow_model::stats::median(&mut v).unwrap_or(f64::NAN)
}

/// The step at which `durations` rose, if they rose (see the module docs).
/// Non-finite values make the series unusable and give `None`.
pub fn find_onset(durations: &[f64], cfg: &OnsetConfig) -> Option<Split> {
    let n = durations.len();
    let side = cfg.min_side.max(1);
    if n < 2 * side || durations.iter().any(|x| !x.is_finite()) {
        return None;
    }
    // Winsorize far outliers (6 robust standard deviations) before the fit.
    let med = median(durations);
    let dev: Vec<f64> = durations.iter().map(|x| (x - med).abs()).collect();
    let mad = median(&dev) * 1.4826;
    let cap = if mad > 0.0 {
        med + 6.0 * mad
    } else {
        f64::INFINITY
    };
    let x: Vec<f64> = durations.iter().map(|&v| v.min(cap)).collect();

    let mut s1 = vec![0.0; n + 1];
    let mut s2 = vec![0.0; n + 1];
    for (i, v) in x.iter().enumerate() {
        s1[i + 1] = s1[i] + v;
        s2[i + 1] = s2[i] + v * v;
    }
    let sse = |a: usize, b: usize| {
        let len = (b - a) as f64;
        let sum = s1[b] - s1[a];
        (s2[b] - s2[a]) - sum * sum / len
    };
    let index = (side..=n - side)
        .min_by(|&a, &b| (sse(0, a) + sse(a, n)).total_cmp(&(sse(0, b) + sse(b, n))))?;

    let before = median(&durations[..index]);
    let after = median(&durations[index..]);
    // (all values are finite here, so the comparison is total)
    if after < before * (1.0 + cfg.min_rise) {
        return None;
    }
    let mid = (before + after) / 2.0;
    let slow = durations[index..].iter().filter(|&&v| v >= mid).count();
    if (slow as f64) < cfg.persistence * (n - index) as f64 {
        return None;
    }
    Some(Split {
        index,
        before,
        after,
    })
}

/// Per-worker series kept in a report, at most: beyond, the report keeps the
/// job's median series only (a 1,024-rank job would otherwise write a
/// megabyte of iteration times that no plot can show).
pub const MAX_SERIES: usize = 64;

/// Assembles the report's [`IterationTimes`]: the onset is found on the job's
/// iteration time, the median over the series at each step (in synchronous
/// training every worker waits for the slowest, so one slow worker shows on
/// all). Steps present in fewer than half of the series are left out of
/// that median. More than [`MAX_SERIES`] series are replaced by that median.
pub fn iteration_times(
    source: IterationSource,
    series: Vec<IterationSeries>,
    cfg: &OnsetConfig,
) -> Option<IterationTimes> {
    let series: Vec<IterationSeries> = series
        .into_iter()
        .filter(|s| !s.steps.is_empty() && s.steps.len() == s.ms.len())
        .collect();
    if series.is_empty() {
        return None;
    }
    let mut by_step: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for s in &series {
        for (&step, &ms) in s.steps.iter().zip(&s.ms) {
            by_step.entry(step).or_default().push(ms);
        }
    }
    let quorum = series.len().div_ceil(2);
    let (steps, job): (Vec<u64>, Vec<f64>) = by_step
        .into_iter()
        .filter(|(_, v)| v.len() >= quorum)
        .map(|(step, v)| (step, median(&v)))
        .unzip();
    let onset = find_onset(&job, cfg).map(|s| Onset {
        step: steps[s.index],
        before_ms: s.before,
        after_ms: s.after,
    });
    let series = if series.len() > MAX_SERIES {
        vec![IterationSeries {
            worker: None,
            steps,
            ms: job,
        }]
    } else {
        series
    };
    Some(IterationTimes {
        source,
        series,
        onset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (xorshift), so the tests vary the noise.
    fn noise(seed: u64) -> impl FnMut() -> f64 {
        let mut s = seed.max(1);
        move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        }
    }

    fn series(n: usize, at: usize, base: f64, slow: f64, jitter: f64, seed: u64) -> Vec<f64> {
        let mut r = noise(seed);
        (0..n)
            .map(|i| (if i < at { base } else { slow }) * (1.0 + jitter * r()))
            .collect()
    }

    #[test]
    fn finds_the_step_where_iterations_slowed() {
        for (seed, (n, at, rise, jitter)) in [
            (200, 150, 1.5, 0.05),
            (400, 37, 1.2, 0.03),
            (120, 100, 2.0, 0.1),
            (60, 10, 1.3, 0.05),
        ]
        .into_iter()
        .enumerate()
        {
            let xs = series(n, at, 24.0, 24.0 * rise, jitter, seed as u64 + 1);
            let s = find_onset(&xs, &OnsetConfig::default()).expect("onset");
            assert!(
                s.index.abs_diff(at) <= 2,
                "n {n}: onset at {} not {at}",
                s.index
            );
            assert!((s.after / s.before - rise).abs() < 0.1);
        }
    }

    #[test]
    fn healthy_or_spiky_series_have_no_onset() {
        let cfg = OnsetConfig::default();
        for seed in 1..20 {
            let xs = series(300, 300, 24.0, 24.0, 0.08, seed);
            assert_eq!(find_onset(&xs, &cfg), None, "seed {seed}");
            // One long iteration (a checkpoint) and a short burst are not an onset.
            let mut spiky = xs.clone();
            spiky[120] = 2400.0;
            for v in &mut spiky[200..203] {
                *v *= 3.0;
            }
            assert_eq!(find_onset(&spiky, &cfg), None, "seed {seed}");
        }
        // A speed-up is not a slowdown.
        let faster = series(200, 100, 30.0, 20.0, 0.02, 7);
        assert_eq!(find_onset(&faster, &cfg), None);
        // Too short, or unusable.
        assert_eq!(find_onset(&[1.0, 1.0, 5.0, 5.0], &cfg), None);
        assert_eq!(find_onset(&[f64::NAN; 40], &cfg), None);
        assert_eq!(find_onset(&[], &cfg), None);
    }

    #[test]
    fn job_series_is_the_median_over_workers() {
        let mk = |w: u32, at: usize| IterationSeries {
            worker: Some(w),
            steps: (100..200).collect(),
            ms: series(100, at, 20.0, 30.0, 0.02, u64::from(w) + 3),
        };
        // Three workers slow from step 150, one never: the job slowed at 150.
        let times = iteration_times(
            IterationSource::ProfilerSteps,
            vec![mk(0, 50), mk(1, 50), mk(2, 50), mk(3, 100)],
            &OnsetConfig::default(),
        )
        .unwrap();
        let onset = times.onset.unwrap();
        assert!(onset.step.abs_diff(150) <= 2, "{onset:?}");
        assert_eq!(times.series.len(), 4);
        assert!(
            iteration_times(IterationSource::Detector, vec![], &OnsetConfig::default()).is_none()
        );
    }
}
