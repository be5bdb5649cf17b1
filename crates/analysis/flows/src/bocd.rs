//! Bayesian Online Change-point Detection (Adams & MacKay 2007), as used by
//! LLMPrism §IV-B (step division) and §IV-C (timeline reconstruction).
//!
//! Model: Gaussian observations with unknown mean and precision under a Normal-Gamma
//! prior NG(μ₀, κ₀, α₀, β₀); the posterior predictive of a run is a Student-t with
//! 2α degrees of freedom, location μ and squared scale β(κ+1)/(ακ). Constant hazard
//! H = 1/λ. Recursion (same convention as the `changepoint` crate, which the tests
//! check against):
//!
//! * growth: P(r_t = r+1) ∝ P(r_{t−1} = r) · π_r(x_t) · (1 − H)
//! * change: P(r_t = 0) ∝ Σ_r P(r_{t−1} = r) · π_r(x_t) · H
//!
//! and after the update every grown run absorbs x_t while the new run of length 0 starts
//! empty, so a run of length r at time t covers x_{t−r+1} ..= x_t.
//!
//! **Change points from the posterior.** With a constant hazard, the normalized
//! P(r_t = 0 | x_{1:t}) is exactly H at every t and carries no information; evidence
//! for a change shows up as posterior mass moving to *short* run lengths. We therefore
//! store, for every t, the MAP run length m_t and the confidence
//! c_t = P(r_t ≤ m_t | x_{1:t}), and segment backwards as in a MAP walk: from the last
//! point t, the current segment starts at s = t − m_t + 1; s is reported as a change
//! point when c_t ≥ threshold (LLMPrism uses 0.95); the walk continues at s − 1.
//! That is [`CpModel::AdamsMacKay`]. For step division we use [`CpModel::GapOutlier`]
//! (see there), whose P(r_t = 0) is informative and is thresholded directly.
//!
//! **Linear time.** Run lengths whose posterior mass falls below `prune_eps` (and all
//! but the `max_run_lengths` most likely ones) are dropped, so each step costs
//! O(alive run lengths), bounded by a constant.
//!
//! **Normalized input.** [`normalize_intervals`] maps intervals to ln(1 + Δt) and
//! standardizes them (zero mean, unit variance) so that one prior fits every pair.

use serde::{Deserialize, Serialize};

/// Normal-Gamma prior NG(μ₀, κ₀, α₀, β₀) over the mean and precision of a Gaussian.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NormalGammaPrior {
    /// Prior mean μ₀.
    pub mu: f64,
    /// Pseudo-observations of the mean κ₀ (> 0).
    pub kappa: f64,
    /// Shape α₀ (> 0).
    pub alpha: f64,
    /// Rate β₀ (> 0).
    pub beta: f64,
}

impl Default for NormalGammaPrior {
    fn default() -> Self {
        NormalGammaPrior {
            mu: 0.0,
            kappa: 1.0,
            alpha: 2.0,
            beta: 2.0,
        }
    }
}

/// BOCD settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BocdConfig {
    /// λ of the constant hazard H = 1/λ (expected run length).
    pub hazard_lambda: f64,
    /// Confidence needed to report a change point (LLMPrism: 0.95).
    pub threshold: f64,
    /// Run lengths with less posterior mass are pruned (0 disables pruning).
    pub prune_eps: f64,
    /// At most this many run lengths are kept (0 = unbounded).
    pub max_run_lengths: usize,
    /// Prior of every run.
    pub prior: NormalGammaPrior,
    /// Change model and read-out.
    pub model: CpModel,
    /// Scale of the Cauchy density of a gap interval in [`CpModel::GapOutlier`]
    /// (normalized units, see [`normalize_intervals`]).
    pub gap_scale: f64,
    /// Time unit of the interval transform ln(1 + Δt / unit), microseconds: intervals
    /// much shorter than the unit (back-to-back flows of one burst) all map to ≈ 0.
    pub interval_unit_us: f64,
}

/// How a change point is modelled and read out of the run-length posterior.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpModel {
    /// Adams & MacKay's recursion as the `changepoint` crate implements it: the change
    /// branch weighs x_t with the old runs' predictives
    /// (P(r_t = 0) ∝ H Σ_r P(r_{t−1} = r) π_r(x_t), hence always exactly H after
    /// normalization). Change points come from the backward MAP walk with confidence
    /// P(r_t ≤ MAP) ≥ threshold.
    AdamsMacKay,
    /// Gap-outlier reading, used for step division: a step boundary is an interval drawn
    /// from a broad gap density g (Cauchy(0, `gap_scale`)) rather than from the current
    /// run, after which a fresh run starts from the prior. The change branch weighs x_t
    /// with g (P(r_t = 0) ∝ H g(x_t)) and the new run does not absorb x_t, so
    /// P(r_t = 0 | x_{1:t}) is informative; t is a change point when it is
    /// ≥ threshold (LLMPrism's "likelihood that r_t = 0 exceeds 0.95") and x_t lies above
    /// the predictive mean of the most likely previous run (a longer gap, not a burst).
    GapOutlier,
}

impl Default for BocdConfig {
    fn default() -> Self {
        BocdConfig {
            hazard_lambda: 50.0,
            threshold: 0.95,
            prune_eps: 1e-3,
            max_run_lengths: 16,
            prior: NormalGammaPrior::default(),
            model: CpModel::GapOutlier,
            gap_scale: 10.0,
            interval_unit_us: 1000.0,
        }
    }
}

/// One run length's hypothesis: its posterior mass and its Normal-Gamma posterior.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// Run length (number of points after the first one); also the number of
    /// observations absorbed (κ = κ₀ + len, α = α₀ + len/2).
    len: usize,
    /// P(r_t = len | x_{1:t}).
    prob: f64,
    mu: f64,
    beta: f64,
}

/// What a step needs of a run that has absorbed n points (κ = κ₀ + n,
/// α = α₀ + n/2), worked out once per n.
#[derive(Debug, Clone, Copy)]
struct PerN {
    /// ln Γ(α+½) − ln Γ(α) − ½ ln(2απ) − ½ ln((κ+1)/(ακ)): the predictive's
    /// log constant once ½ ln β is taken out.
    lnc: f64,
    /// e^`lnc`.
    c: f64,
    /// α + ½, the predictive's exponent.
    exponent: f64,
    /// 2α + 1 when it is a whole number (α₀ a multiple of ½): the predictive's
    /// (1 + q)^−(α+½) is then a whole power of √(1 + q).
    twice_exponent: Option<i32>,
    /// κ / (2(κ + 1)): β grows by this times (x − μ)².
    beta_gain: f64,
    /// 1 / (κ + 1): μ moves this share of the way to x.
    mu_gain: f64,
}

/// Online BOCD state. Feed points with [`Bocd::step`].
///
/// The step works in the linear domain: a run's weight is
/// P(r) · c_n · β^−½ · (1 + q)^−(α+½), with q = κ(x − μ)² / (2(κ + 1)β) and c_n
/// tabled per run length, and with the default prior (α₀ a multiple of ½) the
/// power is a whole power of √(1 + q): no exp or log per run length, only a
/// square root and a few products. Where those weights would underflow (a
/// point far from every run) or α₀ is not a multiple of ½, the step is done
/// in the log domain, shifted by the largest log weight, as the textbook step
/// does. The textbook step is kept in the tests as the reference this one is
/// checked against.
#[derive(Debug, Clone)]
pub struct Bocd {
    cfg: BocdConfig,
    hazard: f64,
    /// ln of the gap density's normalization, −ln(π · gap_scale).
    gap_ln_norm: f64,
    gap_scale: f64,
    /// Ascending by run length: the fresh run first, the oldest last.
    runs: Vec<Run>,
    /// Each run's weight in the current step, parallel to `runs`.
    weights: Vec<f64>,
    /// Reused buffer of run probabilities for pruning.
    probs: Vec<f64>,
    /// Constants of the runs that have absorbed n points, indexed by n.
    per_n: Vec<PerN>,
    t: usize,
    last_cp: f64,
    last_up: bool,
}

/// Linear weights below this total are redone in the log domain: any run they
/// lost to underflow (< 1e-308) weighs less than 1e-18 of the total.
const MIN_LINEAR_TOTAL: f64 = 1e-290;

impl Bocd {
    /// A detector with no data.
    pub fn new(cfg: BocdConfig) -> Self {
        let lambda = if cfg.hazard_lambda.is_finite() && cfg.hazard_lambda > 1.0 {
            cfg.hazard_lambda
        } else {
            2.0
        };
        let gap_scale = if cfg.gap_scale.is_finite() && cfg.gap_scale > 0.0 {
            cfg.gap_scale
        } else {
            10.0
        };
        Bocd {
            cfg,
            hazard: 1.0 / lambda,
            gap_ln_norm: -(std::f64::consts::PI * gap_scale).ln(),
            gap_scale,
            runs: Vec::new(),
            weights: Vec::new(),
            probs: Vec::new(),
            per_n: Vec::new(),
            t: 0,
            last_cp: 0.0,
            last_up: false,
        }
    }

    /// Extend the per-n constants up to `n`.
    #[cold]
    fn grow_per_n(&mut self, n: usize) {
        let p = self.cfg.prior;
        while self.per_n.len() <= n {
            let k = self.per_n.len() as f64;
            let a = p.alpha + k / 2.0;
            let kappa = p.kappa + k;
            let lnc = ln_gamma(a + 0.5)
                - ln_gamma(a)
                - 0.5 * (2.0 * a * std::f64::consts::PI).ln()
                - 0.5 * ((kappa + 1.0) / (a * kappa)).ln();
            let twice = 2.0 * a + 1.0;
            self.per_n.push(PerN {
                lnc,
                c: lnc.exp(),
                exponent: a + 0.5,
                twice_exponent: (twice.fract() == 0.0 && twice > 0.0 && twice < 1e9)
                    .then_some(twice as i32),
                beta_gain: kappa / (2.0 * (kappa + 1.0)),
                mu_gain: 1.0 / (kappa + 1.0),
            });
        }
    }

    fn empty_run(&self) -> Run {
        let p = self.cfg.prior;
        Run {
            len: 0,
            prob: 0.0,
            mu: p.mu,
            beta: p.beta,
        }
    }

    /// Each run's P(r) · π_r(x), and the gap density g(x) (gap model), on a
    /// common scale; `None` where that takes logs (see [`Bocd`]).
    fn linear_weights(&mut self, x: f64, gap: bool) -> Option<f64> {
        self.weights.clear();
        let mut total = 0.0;
        for r in &self.runs {
            let c = &self.per_n[r.len];
            let k = c.twice_exponent?;
            let d = x - r.mu;
            let inv = 1.0 / (1.0 + c.beta_gain * d * d / r.beta);
            // (1 + q)^−(α+½) = inv^(k/2).
            let mut power = inv.powi(k / 2);
            if k % 2 == 1 {
                power *= inv.sqrt();
            }
            let w = r.prob * c.c * power / r.beta.sqrt();
            self.weights.push(w);
            total += w;
        }
        let g = if gap {
            let z = x / self.gap_scale;
            1.0 / (std::f64::consts::PI * self.gap_scale * (1.0 + z * z))
        } else {
            0.0
        };
        (total + g >= MIN_LINEAR_TOTAL && total.is_finite() && g.is_finite()).then_some(g)
    }

    /// [`Self::linear_weights`] in the log domain: weights relative to the
    /// largest (the textbook step's arithmetic).
    fn log_weights(&mut self, x: f64, gap: bool) -> f64 {
        self.weights.clear();
        let mut max = f64::NEG_INFINITY;
        for r in &self.runs {
            let c = &self.per_n[r.len];
            let d = x - r.mu;
            let q = c.beta_gain * d * d / r.beta;
            let lp = c.lnc - 0.5 * r.beta.ln() - c.exponent * q.ln_1p() + r.prob.ln();
            max = max.max(lp);
            self.weights.push(lp);
        }
        let lg = if gap {
            let z = x / self.gap_scale;
            let lg = self.gap_ln_norm - (z * z).ln_1p();
            max = max.max(lg);
            lg
        } else {
            0.0
        };
        for w in &mut self.weights {
            *w = (*w - max).exp();
        }
        if gap {
            (lg - max).exp()
        } else {
            0.0
        }
    }

    /// Absorb `x`; afterwards [`Bocd::run_lengths`] is the posterior P(r_t | x_{1:t}).
    pub fn step(&mut self, x: f64) {
        let x = if x.is_finite() { x } else { 0.0 };
        let gap = self.cfg.model == CpModel::GapOutlier;
        self.last_cp = 0.0;
        self.last_up = false;
        if self.runs.is_empty() {
            let mut r = self.empty_run();
            r.prob = 1.0;
            self.runs.push(r);
            if !gap {
                // As in the `changepoint` crate, the first point only opens the first run
                // and is never part of a predictive.
                self.t += 1;
                return;
            }
        }
        // The oldest run is the last and has absorbed the most points.
        let longest = self.runs.last().map_or(0, |r| r.len);
        if longest >= self.per_n.len() {
            self.grow_per_n(longest);
        }
        // The upward test against the most likely previous run (the last of
        // equals, as `max_by` picks).
        let mut best = f64::NEG_INFINITY;
        for r in &self.runs {
            if r.prob >= best {
                best = r.prob;
                self.last_up = x > r.mu;
            }
        }
        let g = match self.linear_weights(x, gap) {
            Some(g) => g,
            None => self.log_weights(x, gap),
        };
        let mut cp = 0.0;
        let mut total = 0.0;
        for (r, &w) in self.runs.iter_mut().zip(&self.weights) {
            if !gap {
                cp += w * self.hazard;
            }
            r.prob = w * (1.0 - self.hazard);
            total += r.prob;
            // Grown runs absorb x (Normal-Gamma update); only they survive.
            let c = &self.per_n[r.len];
            let d = x - r.mu;
            r.beta += c.beta_gain * d * d;
            r.mu += d * c.mu_gain;
            r.len += 1;
        }
        if gap {
            // H · g(x) · Σ P(r), with Σ P(r) = 1.
            cp = g * self.hazard;
        }
        total += cp;
        let mut fresh = self.empty_run();
        fresh.prob = cp;
        self.runs.insert(0, fresh);
        if !(total > 0.0 && total.is_finite()) {
            // Degenerate: restart from the prior.
            for r in self.runs.iter_mut() {
                r.prob = 0.0;
            }
            self.runs[0].prob = 1.0;
            total = 1.0;
        }
        self.last_cp = self.runs[0].prob / total;
        self.prune(total);
        self.t += 1;
    }

    /// P(r_t = 0 | x_{1:t}) after the last step (always H in the Adams-MacKay model).
    pub fn cp_probability(&self) -> f64 {
        self.last_cp
    }

    /// Whether the last point lay above the mean of the most likely previous run.
    pub fn last_was_upward(&self) -> bool {
        self.last_up
    }

    /// Normalize the run masses by `total`, drop unlikely run lengths and
    /// renormalize what is left.
    fn prune(&mut self, total: f64) {
        let eps = self.cfg.prune_eps;
        let max = self.cfg.max_run_lengths;
        // Normalize and drop the runs under eps in one pass; run length 0 is
        // always kept (it carries exactly H in the Adams-MacKay model).
        let mut kept = 0;
        let mut sum = 0.0;
        let mut dropped = false;
        let inv = 1.0 / total;
        let pruning = eps > 0.0;
        for i in 0..self.runs.len() {
            let mut r = self.runs[i];
            r.prob *= inv;
            if i == 0 || !pruning || r.prob >= eps {
                sum += r.prob;
                self.runs[kept] = r;
                kept += 1;
            } else {
                dropped = true;
            }
        }
        self.runs.truncate(kept);
        if max > 0 && self.runs.len() > max {
            dropped = true;
            let probs = &mut self.probs;
            probs.clear();
            probs.extend(self.runs.iter().skip(1).map(|r| r.prob));
            let k = max - 1;
            if k == 0 {
                self.runs.truncate(1);
                self.runs[0].prob = 1.0;
                return;
            }
            let at = probs.len() - k;
            probs.select_nth_unstable_by(at, |a, b| a.total_cmp(b));
            let cut = probs[at];
            let mut taken = 0;
            let mut first = true;
            self.runs.retain(|r| {
                if first {
                    first = false;
                    return true;
                }
                if r.prob >= cut && taken < k {
                    taken += 1;
                    true
                } else {
                    false
                }
            });
            sum = self.runs.iter().map(|r| r.prob).sum();
        }
        // Nothing dropped: the masses already sum to 1 (up to rounding).
        if dropped && sum > 0.0 {
            for r in &mut self.runs {
                r.prob /= sum;
            }
        }
    }

    /// Posterior over run lengths after the last step: (run length, probability),
    /// ascending by run length; pruned run lengths are absent.
    pub fn run_lengths(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.runs.iter().map(|r| (r.len, r.prob))
    }

    /// MAP run length and the confidence P(r_t ≤ MAP | x_{1:t}).
    pub fn map_run_length(&self) -> (usize, f64) {
        let mut best = (0usize, f64::NEG_INFINITY);
        for r in &self.runs {
            if r.prob > best.1 {
                best = (r.len, r.prob);
            }
        }
        let conf: f64 = self
            .runs
            .iter()
            .filter(|r| r.len <= best.0)
            .map(|r| r.prob)
            .sum();
        (best.0, conf.min(1.0))
    }

    /// Points seen.
    pub fn len(&self) -> usize {
        self.t
    }

    /// True before the first point.
    pub fn is_empty(&self) -> bool {
        self.t == 0
    }
}

/// Change points of `xs`: indices `s` (0 < s ≤ len) where a new segment starts,
/// ascending. With [`CpModel::GapOutlier`], s = t + 1 for every gap t (the new segment
/// starts after the gap interval); with [`CpModel::AdamsMacKay`], the backward MAP walk
/// (see the module docs).
pub fn change_points(xs: &[f64], cfg: &BocdConfig) -> Vec<usize> {
    let mut b = Bocd::new(*cfg);
    if cfg.model == CpModel::GapOutlier {
        let mut cps = Vec::new();
        for (t, &x) in xs.iter().enumerate() {
            b.step(x);
            if b.cp_probability() >= cfg.threshold && b.last_was_upward() {
                cps.push(t + 1);
            }
        }
        return cps;
    }
    let mut maps = Vec::with_capacity(xs.len());
    for &x in xs {
        b.step(x);
        maps.push(b.map_run_length());
    }
    let mut cps = Vec::new();
    let mut t = xs.len();
    while t > 0 {
        let (m, conf) = maps[t - 1];
        // A run of length m ending at point t − 1 covers points t − m ..= t − 1.
        let s = t - m.clamp(1, t);
        // Point 0 only opens the first run (see `Bocd::step`), so s = 1 is the start.
        if s > 1 && conf >= cfg.threshold {
            cps.push(s);
        }
        // Continue before the segment (or one step back when unconfident).
        t = if conf >= cfg.threshold { s } else { t - 1 };
    }
    cps.reverse();
    cps.dedup();
    cps
}

/// Minimum robust scale of the log-intervals in [`normalize_intervals`]: interval
/// jitter up to a factor e^0.5 ≈ 1.65 is treated as noise.
pub const MIN_LOG_SCALE: f64 = 0.5;

/// The "inputs normalized" step of the BOCD: map intervals to ln(1 + Δt / unit) and scale
/// them robustly, (y − median) / max(1.4826 · MAD, [`MIN_LOG_SCALE`]), so that the
/// within-step intervals are ≈ N(0, 1) whatever the pair's time scale and the gaps
/// between steps stand far out; one prior then fits every pair.
pub fn normalize_intervals(dts: &[f64], unit_us: f64) -> Vec<f64> {
    let unit = if unit_us.is_finite() && unit_us > 0.0 {
        unit_us
    } else {
        1.0
    };
    let mut v: Vec<f64> = dts
        .iter()
        .map(|&d| {
            if d > 0.0 && d.is_finite() {
                (d / unit).ln_1p()
            } else {
                0.0
            }
        })
        .collect();
    if v.is_empty() {
        return v;
    }
    let med = median(&mut v.clone());
    let mut dev: Vec<f64> = v.iter().map(|x| (x - med).abs()).collect();
    let mad = median(&mut dev);
    let scale = (1.4826 * mad).max(MIN_LOG_SCALE);
    for x in &mut v {
        *x = (*x - med) / scale;
    }
    v
}

/// The median (`whyslow_model::stats::median`); 0 for no values.
fn median(v: &mut [f64]) -> f64 {
    whyslow_model::stats::median(v).unwrap_or(0.0)
}

/// ln Γ(x) for x > 0 (Lanczos approximation, g = 7, n = 9; |error| < 1e-13).
pub fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const C: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = C[0];
    let t = x + G + 0.5;
    for (i, c) in C.iter().enumerate().skip(1) {
        a += c / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

#[cfg(test)]
#[path = "bocd_reference.rs"]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;

    /// A seeded generator of test series.
    struct Lcg(u64);

    impl Lcg {
        fn unit(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Roughly normal (sum of uniforms).
        fn normal(&mut self) -> f64 {
            (0..4).map(|_| self.unit()).sum::<f64>() - 2.0
        }
    }

    /// Series of the kinds BOCD meets: flow gaps with bursts and step gaps, mean
    /// shifts, heavy tails, constant runs, and garbage.
    fn series(kind: usize, seed: u64) -> Vec<f64> {
        let mut g = Lcg(seed);
        let n = 400 + (seed % 7) as usize * 150;
        match kind {
            0 => {
                // Idle gaps of bursty traffic: short within a burst, long between.
                let per = 3 + (seed % 11) as usize;
                let dts: Vec<f64> = (0..n)
                    .map(|i| {
                        if i % per == per - 1 {
                            2e5 * (1.0 + 0.3 * g.normal())
                        } else {
                            (30.0 * g.unit()).max(0.0)
                        }
                    })
                    .collect();
                normalize_intervals(&dts, 1000.0)
            }
            1 => (0..n)
                .map(|i| (i / 60 % 3) as f64 * 2.5 + 0.4 * g.normal())
                .collect(),
            2 => (0..n)
                .map(|_| {
                    let u = g.unit().max(1e-12);
                    (std::f64::consts::PI * (u - 0.5)).tan()
                })
                .collect(),
            3 => (0..n)
                .map(|i| if i % 97 < 50 { 0.0 } else { 1.0 })
                .collect(),
            _ => (0..n)
                .map(|i| match i % 13 {
                    0 => f64::NAN,
                    5 => 1e300,
                    9 => -1e300,
                    11 => f64::INFINITY,
                    _ => g.normal(),
                })
                .collect(),
        }
    }

    fn configs() -> Vec<BocdConfig> {
        let d = BocdConfig::default();
        let exact = BocdConfig {
            prune_eps: 0.0,
            max_run_lengths: 0,
            ..d
        };
        vec![
            d,
            BocdConfig {
                model: CpModel::AdamsMacKay,
                ..d
            },
            exact,
            BocdConfig {
                model: CpModel::AdamsMacKay,
                ..exact
            },
            BocdConfig {
                hazard_lambda: 7.0,
                max_run_lengths: 3,
                prune_eps: 1e-6,
                gap_scale: 2.0,
                prior: NormalGammaPrior {
                    mu: 1.0,
                    kappa: 0.3,
                    alpha: 1.0,
                    beta: 0.5,
                },
                ..d
            },
            // α₀ not a multiple of ½: every step in the log domain.
            BocdConfig {
                prior: NormalGammaPrior {
                    alpha: 1.3,
                    ..d.prior
                },
                ..d
            },
            BocdConfig {
                model: CpModel::AdamsMacKay,
                prior: NormalGammaPrior {
                    alpha: 2.7,
                    beta: 0.1,
                    ..d.prior
                },
                ..exact
            },
            BocdConfig {
                max_run_lengths: 1,
                hazard_lambda: f64::NAN,
                gap_scale: -1.0,
                ..d
            },
        ]
    }

    #[test]
    fn fast_step_matches_the_textbook_step() {
        let mut worst: f64 = 0.0;
        let mut steps = 0;
        for cfg in configs() {
            for kind in 0..5 {
                for seed in 1..6u64 {
                    let xs = series(kind, seed * 7919 + kind as u64);
                    let mut fast = Bocd::new(cfg);
                    let mut slow = reference::ReferenceBocd::new(cfg);
                    for (t, &x) in xs.iter().enumerate() {
                        fast.step(x);
                        slow.step(x);
                        steps += 1;
                        let at = format!("{cfg:?} kind {kind} seed {seed} t {t}");
                        let (a, b): (Vec<_>, Vec<_>) =
                            (fast.run_lengths().collect(), slow.run_lengths().collect());
                        assert_eq!(
                            a.iter().map(|r| r.0).collect::<Vec<_>>(),
                            b.iter().map(|r| r.0).collect::<Vec<_>>(),
                            "run lengths at {at}: {a:?} vs {b:?}"
                        );
                        for (p, q) in a.iter().zip(&b) {
                            worst = worst.max((p.1 - q.1).abs());
                        }
                        worst = worst.max((fast.cp_probability() - slow.cp_probability()).abs());
                        assert_eq!(fast.last_was_upward(), slow.last_was_upward(), "{at}");
                        assert_eq!(fast.map_run_length().0, slow.map_run_length().0, "{at}");
                    }
                    assert_eq!(
                        change_points(&xs, &cfg),
                        reference_change_points(&xs, &cfg),
                        "{cfg:?} kind {kind} seed {seed}"
                    );
                }
            }
        }
        eprintln!("{steps} steps, largest probability difference {worst:e}");
        assert!(worst < 1e-9, "largest probability difference {worst:e}");
    }

    /// [`change_points`] over the reference step.
    fn reference_change_points(xs: &[f64], cfg: &BocdConfig) -> Vec<usize> {
        let mut b = reference::ReferenceBocd::new(*cfg);
        let mut out = Vec::new();
        if cfg.model == CpModel::GapOutlier {
            for (t, &x) in xs.iter().enumerate() {
                b.step(x);
                if b.cp_probability() >= cfg.threshold && b.last_was_upward() {
                    out.push(t + 1);
                }
            }
            return out;
        }
        let maps: Vec<(usize, f64)> = xs
            .iter()
            .map(|&x| {
                b.step(x);
                b.map_run_length()
            })
            .collect();
        let mut t = xs.len();
        while t > 0 {
            let (m, conf) = maps[t - 1];
            let s = t - m.clamp(1, t);
            if s > 1 && conf >= cfg.threshold {
                out.push(s);
            }
            t = if conf >= cfg.threshold { s } else { t - 1 };
        }
        out.reverse();
        out.dedup();
        out
    }

    #[test]
    fn ln_gamma_matches_known_values() {
        assert!((ln_gamma(1.0)).abs() < 1e-12);
        assert!((ln_gamma(2.0)).abs() < 1e-12);
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-10);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-10);
        assert!((ln_gamma(100.5) - 361.435_540_467_777_6).abs() < 1e-8);
    }

    #[test]
    fn cp_mass_stays_at_hazard() {
        let cfg = BocdConfig {
            prune_eps: 0.0,
            max_run_lengths: 0,
            model: CpModel::AdamsMacKay,
            ..Default::default()
        };
        let mut b = Bocd::new(cfg);
        for i in 0..50 {
            b.step(if i < 25 { 0.0 } else { 5.0 });
            if i > 0 {
                let p0 = b.run_lengths().next().unwrap();
                assert_eq!(p0.0, 0);
                assert!(
                    (p0.1 - 1.0 / cfg.hazard_lambda).abs() < 1e-12,
                    "P(r=0) = {}",
                    p0.1
                );
            }
        }
    }

    #[test]
    fn finds_mean_shifts() {
        let mut xs = Vec::new();
        let mut s = 1u64;
        for seg in 0..4 {
            for _ in 0..40 {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5;
                xs.push(if seg % 2 == 0 { 0.0 } else { 3.0 } + 0.2 * u);
            }
        }
        let cfg = BocdConfig {
            model: CpModel::AdamsMacKay,
            ..Default::default()
        };
        assert_eq!(change_points(&xs, &cfg), vec![40, 80, 120]);
    }

    #[test]
    fn no_change_in_noise() {
        let mut s = 7u64;
        let xs: Vec<f64> = (0..300)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5
            })
            .collect();
        let dts: Vec<f64> = xs.iter().map(|x| 1000.0 * (1.0 + 0.5 * x)).collect();
        assert!(change_points(&normalize_intervals(&dts, 1.0), &BocdConfig::default()).is_empty());
    }

    #[test]
    fn garbage_never_panics() {
        let xs = [
            f64::NAN,
            f64::INFINITY,
            -1e308,
            1e308,
            0.0,
            f64::NEG_INFINITY,
        ];
        let _ = change_points(&xs, &BocdConfig::default());
        let _ = change_points(&[], &BocdConfig::default());
        let _ = normalize_intervals(&[f64::NAN, -3.0], f64::NAN);
        let mut bad = BocdConfig {
            hazard_lambda: f64::NAN,
            threshold: 2.0,
            prune_eps: -1.0,
            max_run_lengths: 1,
            prior: NormalGammaPrior {
                mu: 0.0,
                kappa: 1.0,
                alpha: 1.0,
                beta: 1.0,
            },
            model: CpModel::AdamsMacKay,
            gap_scale: -1.0,
            interval_unit_us: 0.0,
        };
        let _ = change_points(&[1.0, 2.0, 3.0, 100.0, 1.0], &bad);
        bad.model = CpModel::GapOutlier;
        let _ = change_points(&[1.0, 2.0, 3.0, 100.0, 1.0], &bad);
    }
}
