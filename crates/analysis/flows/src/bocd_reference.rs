//! The textbook BOCD step (as whyslow ran it until 2026-11), kept as the reference
//! the fast [`super::Bocd`] is checked against: same posterior to rounding.

use super::{ln_gamma, BocdConfig, CpModel};

#[derive(Debug, Clone, Copy)]
struct Run {
    /// Run length (number of points after the first one).
    len: usize,
    prob: f64,
    /// Number of observations absorbed.
    n: usize,
    mu: f64,
    kappa: f64,
    beta: f64,
}

/// Online BOCD state. Feed points with [`ReferenceBocd::step`].
#[derive(Debug, Clone)]
pub(super) struct ReferenceBocd {
    cfg: BocdConfig,
    hazard: f64,
    runs: Vec<Run>,
    scratch: Vec<Run>,
    /// Reused buffer of run probabilities for pruning.
    probs: Vec<f64>,
    /// ln Γ(α+½) − ln Γ(α) − ½ ln(2απ) for α = α₀ + n/2, indexed by n.
    lnc: Vec<f64>,
    t: usize,
    last_cp: f64,
    last_up: bool,
}

impl ReferenceBocd {
    /// A detector with no data.
    pub(super) fn new(cfg: BocdConfig) -> Self {
        let lambda = if cfg.hazard_lambda.is_finite() && cfg.hazard_lambda > 1.0 {
            cfg.hazard_lambda
        } else {
            2.0
        };
        ReferenceBocd {
            cfg,
            hazard: 1.0 / lambda,
            runs: Vec::new(),
            scratch: Vec::new(),
            probs: Vec::new(),
            lnc: Vec::new(),
            t: 0,
            last_cp: 0.0,
            last_up: false,
        }
    }

    fn lnc(&mut self, n: usize) -> f64 {
        while self.lnc.len() <= n {
            let a = self.cfg.prior.alpha + self.lnc.len() as f64 / 2.0;
            self.lnc.push(
                ln_gamma(a + 0.5) - ln_gamma(a) - 0.5 * (2.0 * a * std::f64::consts::PI).ln(),
            );
        }
        self.lnc[n]
    }

    fn empty_run(&self) -> Run {
        let p = self.cfg.prior;
        Run {
            len: 0,
            prob: 0.0,
            n: 0,
            mu: p.mu,
            kappa: p.kappa,
            beta: p.beta,
        }
    }

    /// ln of the Student-t posterior predictive of `x` under `run`.
    fn ln_pred(&mut self, run: &Run, x: f64) -> f64 {
        let alpha = self.cfg.prior.alpha + run.n as f64 / 2.0;
        let scale2 = run.beta * (run.kappa + 1.0) / (alpha * run.kappa);
        let d = x - run.mu;
        self.lnc(run.n)
            - 0.5 * scale2.ln()
            - (alpha + 0.5) * (d * d / (2.0 * alpha * scale2)).ln_1p()
    }

    /// Absorb `x`; afterwards [`ReferenceBocd::run_lengths`] is the posterior P(r_t | x_{1:t}).
    pub(super) fn step(&mut self, x: f64) {
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
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.push(self.empty_run());
        let runs = std::mem::take(&mut self.runs);
        // Upward test against the most likely previous run.
        if let Some(best) = runs.iter().max_by(|a, b| a.prob.total_cmp(&b.prob)) {
            self.last_up = x > best.mu;
        }
        // Log-domain weights, shifted by the max for stability.
        let mut max_lp = f64::NEG_INFINITY;
        for r in &runs {
            let lp = self.ln_pred(r, x) + r.prob.ln();
            max_lp = max_lp.max(lp);
            let mut g = *r;
            g.len += 1;
            g.prob = lp; // temporarily the log weight
            scratch.push(g);
        }
        let prior_lp = if gap {
            let sc = if self.cfg.gap_scale.is_finite() && self.cfg.gap_scale > 0.0 {
                self.cfg.gap_scale
            } else {
                10.0
            };
            let z = x / sc;
            let lp = -(std::f64::consts::PI * sc).ln() - z.mul_add(z, 1.0).ln();
            max_lp = max_lp.max(lp);
            lp
        } else {
            0.0
        };
        let mut cp = 0.0;
        let mut total = 0.0;
        for g in scratch.iter_mut().skip(1) {
            let w = (g.prob - max_lp).exp();
            if !gap {
                cp += w * self.hazard;
            }
            g.prob = w * (1.0 - self.hazard);
            total += g.prob;
        }
        if gap {
            cp = (prior_lp - max_lp).exp() * self.hazard;
        }
        total += cp;
        scratch[0].prob = cp;
        if !(total > 0.0 && total.is_finite()) {
            // Degenerate: restart from the prior.
            for g in scratch.iter_mut() {
                g.prob = 0.0;
            }
            scratch[0].prob = 1.0;
            total = 1.0;
        }
        for g in scratch.iter_mut() {
            g.prob /= total;
        }
        self.last_cp = scratch[0].prob;
        self.runs = runs;
        std::mem::swap(&mut self.runs, &mut scratch);
        self.scratch = scratch;
        self.prune();
        // Grown runs absorb x (Normal-Gamma update); the new run (length 0) starts empty.
        self.absorb(x, 1);
        self.t += 1;
    }

    fn absorb(&mut self, x: f64, skip: usize) {
        for r in self.runs.iter_mut().skip(skip) {
            let k1 = r.kappa + 1.0;
            let d = x - r.mu;
            r.beta += r.kappa * d * d / (2.0 * k1);
            r.mu = (r.kappa * r.mu + x) / k1;
            r.kappa = k1;
            r.n += 1;
        }
    }

    /// P(r_t = 0 | x_{1:t}) after the last step (always H in the Adams-MacKay model).
    pub(super) fn cp_probability(&self) -> f64 {
        self.last_cp
    }

    /// Whether the last point lay above the mean of the most likely previous run.
    pub(super) fn last_was_upward(&self) -> bool {
        self.last_up
    }

    fn prune(&mut self) {
        let eps = self.cfg.prune_eps;
        let max = self.cfg.max_run_lengths;
        if eps > 0.0 {
            // Keep run length 0 always (it carries exactly H).
            let mut first = true;
            self.runs.retain(|r| {
                let keep = first || r.prob >= eps;
                first = false;
                keep
            });
        }
        if max > 0 && self.runs.len() > max {
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
            let mut kept = 0;
            let mut first = true;
            self.runs.retain(|r| {
                if first {
                    first = false;
                    return true;
                }
                if r.prob >= cut && kept < k {
                    kept += 1;
                    true
                } else {
                    false
                }
            });
        }
        let s: f64 = self.runs.iter().map(|r| r.prob).sum();
        if s > 0.0 {
            for r in &mut self.runs {
                r.prob /= s;
            }
        }
    }

    /// Posterior over run lengths after the last step: (run length, probability),
    /// ascending by run length; pruned run lengths are absent.
    pub(super) fn run_lengths(&self) -> impl Iterator<Item = (usize, f64)> + '_ {
        self.runs.iter().map(|r| (r.len, r.prob))
    }

    /// MAP run length and the confidence P(r_t ≤ MAP | x_{1:t}).
    pub(super) fn map_run_length(&self) -> (usize, f64) {
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
}
