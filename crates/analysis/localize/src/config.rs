//! Configuration of the localizer: expected ranges R_f (PerfTracker §4.3, Eq. 6)
//! and the thresholds of Eq. 9–11.

use serde::Deserialize;
use whyslow_model::FunctionKind;

use crate::LocalizeError;

/// The expected range R_f = [β_l, β_r] × [μ_l, μ_r] × [σ_l, σ_r] of a function
/// (PerfTracker §4.3, Eq. 6). A pattern outside it has D_{f,w} > 0 (Eq. 7).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpectedRange {
    /// [β_l, β_r].
    pub beta: (f64, f64),
    /// [μ_l, μ_r].
    pub mu: (f64, f64),
    /// [σ_l, σ_r].
    pub sigma: (f64, f64),
}

impl ExpectedRange {
    /// [0, 1]³: never unexpected (PerfTracker's R_f for GPU computation kernels).
    pub const UNIT: ExpectedRange = ExpectedRange {
        beta: (0.0, 1.0),
        mu: (0.0, 1.0),
        sigma: (0.0, 1.0),
    };

    /// [0, β_r] × [0, 1] × [0, 1]: only the critical-path share is bounded.
    pub const fn beta_at_most(beta_r: f64) -> ExpectedRange {
        ExpectedRange {
            beta: (0.0, beta_r),
            mu: (0.0, 1.0),
            sigma: (0.0, 1.0),
        }
    }

    /// D_{f,w}: the minimal Manhattan distance from (β, μ, σ) to this box (Eq. 7).
    pub fn distance(&self, beta: f64, mu: f64, sigma: f64) -> f64 {
        fn dim(x: f64, (l, r): (f64, f64)) -> f64 {
            if x < l {
                l - x
            } else if x > r {
                x - r
            } else {
                0.0
            }
        }
        dim(beta, self.beta) + dim(mu, self.mu) + dim(sigma, self.sigma)
    }
}

/// R_f for each [`FunctionKind`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpectedRanges {
    /// GPU computation kernels. Default [0,1]³ (PerfTracker §4.3: never unexpected).
    pub gpu_kernel: ExpectedRange,
    /// Memory operations. Default [0,0.3]×[0,1]×[0,1] (whyslow's choice, see crate docs).
    pub memory: ExpectedRange,
    /// Collective / point-to-point communication. Default [0,0.3]×[0,1]×[0,1] (PerfTracker §4.3).
    pub comm: ExpectedRange,
    /// Python functions. Default [0,0.01]×[0,1]×[0,1] (PerfTracker §4.3).
    pub python: ExpectedRange,
    /// Other CPU operators. Default [0,0.05]×[0,1]×[0,1] (whyslow's choice, see crate docs).
    pub cpu_op: ExpectedRange,
}

impl Default for ExpectedRanges {
    fn default() -> Self {
        ExpectedRanges {
            gpu_kernel: ExpectedRange::UNIT,
            memory: ExpectedRange::beta_at_most(0.3),
            comm: ExpectedRange::beta_at_most(0.3),
            python: ExpectedRange::beta_at_most(0.01),
            cpu_op: ExpectedRange::beta_at_most(0.05),
        }
    }
}

impl ExpectedRanges {
    /// R_f of a kind.
    pub fn get(&self, kind: FunctionKind) -> ExpectedRange {
        match kind {
            FunctionKind::GpuKernel => self.gpu_kernel,
            FunctionKind::Memory => self.memory,
            FunctionKind::Comm => self.comm,
            FunctionKind::Python => self.python,
            FunctionKind::CpuOp => self.cpu_op,
        }
    }

    /// Mutable R_f of a kind.
    pub fn get_mut(&mut self, kind: FunctionKind) -> &mut ExpectedRange {
        match kind {
            FunctionKind::GpuKernel => &mut self.gpu_kernel,
            FunctionKind::Memory => &mut self.memory,
            FunctionKind::Comm => &mut self.comm,
            FunctionKind::Python => &mut self.python,
            FunctionKind::CpuOp => &mut self.cpu_op,
        }
    }
}

/// A per-function override of R_f: applies to every function whose name
/// contains `contains` (and whose kind is `kind`, when given). Dimensions left
/// `None` keep the kind's range. The first matching override wins.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeOverride {
    /// Substring of the function name (for Python, of the whole stack).
    pub contains: String,
    /// Restrict to this kind.
    pub kind: Option<FunctionKind>,
    /// [β_l, β_r], or the kind's.
    pub beta: Option<(f64, f64)>,
    /// [μ_l, μ_r], or the kind's.
    pub mu: Option<(f64, f64)>,
    /// [σ_l, σ_r], or the kind's.
    pub sigma: Option<(f64, f64)>,
}

/// Parameters of the localization (PerfTracker §4.3). `Default` gives the
/// paper's values; see the crate docs for the TOML form.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalizeConfig {
    /// R_f per kind (Eq. 6).
    pub expected: ExpectedRanges,
    /// Per-function overrides of R_f, first match wins.
    pub overrides: Vec<RangeOverride>,
    /// δ of Eq. 10: two normalized patterns differ when their Manhattan distance ≥ δ. Paper: 0.4.
    pub delta: f64,
    /// k of Eq. 11. Paper: 5.
    pub k: f64,
    /// N = min(max_peers, |W|) sampled peers (Eq. 9). Paper: 100.
    pub max_peers: usize,
    /// Only functions with β above this can be abnormal (Eq. 11). Paper: 0.01.
    pub beta_min: f64,
    /// Seed of the peer sampling (reproducible reports).
    pub seed: u64,
    /// whyslow's guard (not in the paper): a peer outlier needs
    /// Δ > M + max(k·MAD, `min_margin`). Without it, when M = MAD = 0 a worker
    /// that differs from a single sampled peer would be flagged. Default 0.3;
    /// 0 gives the paper's rule exactly.
    pub min_margin: f64,
    /// whyslow's rule for small groups (not in the paper): when a group is
    /// compared in full (|W| ≤ `max_peers`), a worker at distance ≥ δ from
    /// every other worker is a peer outlier, provided fewer than half of the
    /// workers are. With a handful of workers the MAD of Δ is too coarse: in
    /// a 4-host ring with one slow link, the link's upstream neighbour is
    /// half-affected, Δ counts become e.g. [2, 3, 1, 2], and M + k·MAD exceeds
    /// every count. In groups that small (k/(2|W|) > `min_margin`), a worker
    /// at distance ≥ δ from the group's per-dimension median pattern is one
    /// too, under the same minority condition (crate docs, "Isolated
    /// workers"). Default true; false gives the paper's rule.
    pub flag_isolated: bool,
    /// The Δ rule applies only in groups with at least this many workers
    /// (with 1 or 2 workers "unlike its peers" is meaningless). Default 3.
    pub min_peer_workers: usize,
    /// At most this many [`whyslow_model::WorkerPoint`]s per finding (all
    /// flagged workers first, then an evenly spaced sample of the others). Default 5000.
    pub max_points: usize,
    /// Values below this are treated as 0 in the Δ computation, so that a
    /// dimension that is ~0 everywhere is not blown up by max-normalization. Default 1e-9.
    pub zero_floor: f64,
    /// Eq. 8 divides each dimension by max(max over workers, this), so that a
    /// dimension that is small everywhere is not blown up by noise. Default 0.01.
    pub norm_floor: f64,
    /// whyslow's noise guard (not in the paper; crate docs, "Noise"): a
    /// finding on part of a group must put at least [`Self::min_effect`]
    /// more of the window on the critical path than the peers do, and be
    /// borne out off the critical path, by the function running longer
    /// ([`Self::min_effect`], [`Self::min_ratio`]) or starved of its
    /// resource ([`Self::min_util_diff`]) compared with its peers; and a range violation
    /// (D > 0) on a minority of the workers is not a finding by itself.
    /// Default true; false (with `min_margin = 0`, `flag_isolated = false`)
    /// gives the paper's rule.
    pub corroborate: bool,
    /// A worker's excess critical-path time (β) in the function over its
    /// peers' median must reach this, and so must its excess run time when
    /// run time is the evidence; shares of the window. Default 0.01 (1 % of
    /// the iteration).
    pub min_effect: f64,
    /// … and its run time must be at least this multiple of the peers' median. Default 1.25.
    pub min_ratio: f64,
    /// Or its μ must be at least this far below the peers' median, or its σ
    /// this far from theirs at no higher μ (absolute, utilization in
    /// [0, 1]). Default 0.1.
    pub min_util_diff: f64,
}

impl Default for LocalizeConfig {
    fn default() -> Self {
        LocalizeConfig {
            expected: ExpectedRanges::default(),
            overrides: Vec::new(),
            delta: 0.4,
            k: 5.0,
            max_peers: 100,
            beta_min: 0.01,
            seed: 0x5eed_2025,
            min_margin: 0.3,
            min_peer_workers: 3,
            flag_isolated: true,
            max_points: 5000,
            zero_floor: 1e-9,
            norm_floor: 0.01,
            corroborate: true,
            min_effect: 0.01,
            min_ratio: 1.25,
            min_util_diff: 0.1,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRange {
    beta: Option<[f64; 2]>,
    mu: Option<[f64; 2]>,
    sigma: Option<[f64; 2]>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExpected {
    gpu_kernel: Option<RawRange>,
    memory: Option<RawRange>,
    comm: Option<RawRange>,
    python: Option<RawRange>,
    cpu_op: Option<RawRange>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverride {
    contains: String,
    kind: Option<String>,
    beta: Option<[f64; 2]>,
    mu: Option<[f64; 2]>,
    sigma: Option<[f64; 2]>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    delta: Option<f64>,
    k: Option<f64>,
    max_peers: Option<u64>,
    beta_min: Option<f64>,
    seed: Option<u64>,
    min_margin: Option<f64>,
    min_peer_workers: Option<u64>,
    flag_isolated: Option<bool>,
    max_points: Option<u64>,
    zero_floor: Option<f64>,
    norm_floor: Option<f64>,
    corroborate: Option<bool>,
    min_effect: Option<f64>,
    min_ratio: Option<f64>,
    min_util_diff: Option<f64>,
    expected: Option<RawExpected>,
    #[serde(default, rename = "override")]
    overrides: Vec<RawOverride>,
}

fn check_pair(what: &str, p: Option<[f64; 2]>) -> Result<Option<(f64, f64)>, LocalizeError> {
    match p {
        None => Ok(None),
        Some([l, r]) if l.is_finite() && r.is_finite() && l <= r => Ok(Some((l, r))),
        Some([l, r]) => Err(LocalizeError::Invalid(format!(
            "{what} = [{l}, {r}]: expected two finite numbers [low, high] with low <= high"
        ))),
    }
}

fn check_num(what: &str, v: f64, min: f64, strict: bool) -> Result<f64, LocalizeError> {
    let ok = v.is_finite() && if strict { v > min } else { v >= min };
    if ok {
        Ok(v)
    } else {
        Err(LocalizeError::Invalid(format!(
            "{what} = {v}: expected a finite number {} {min}",
            if strict { ">" } else { ">=" }
        )))
    }
}

impl LocalizeConfig {
    /// Parses a (partial) TOML configuration; keys left out keep their
    /// defaults. Unknown keys are errors (to catch typos). See the crate docs
    /// for the format.
    pub fn from_toml_str(s: &str) -> Result<Self, LocalizeError> {
        let raw: RawConfig = toml::from_str(s).map_err(|e| LocalizeError::Toml(e.to_string()))?;
        let mut cfg = LocalizeConfig::default();
        if let Some(v) = raw.delta {
            cfg.delta = check_num("delta", v, 0.0, true)?;
        }
        if let Some(v) = raw.k {
            cfg.k = check_num("k", v, 0.0, false)?;
        }
        if let Some(v) = raw.max_peers {
            if v == 0 {
                return Err(LocalizeError::Invalid(
                    "max_peers = 0: expected at least 1".into(),
                ));
            }
            cfg.max_peers = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = raw.beta_min {
            cfg.beta_min = check_num("beta_min", v, 0.0, false)?;
        }
        if let Some(v) = raw.seed {
            cfg.seed = v;
        }
        if let Some(v) = raw.min_margin {
            cfg.min_margin = check_num("min_margin", v, 0.0, false)?;
        }
        if let Some(v) = raw.flag_isolated {
            cfg.flag_isolated = v;
        }
        if let Some(v) = raw.min_peer_workers {
            cfg.min_peer_workers = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = raw.max_points {
            cfg.max_points = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = raw.norm_floor {
            cfg.norm_floor = check_num("norm_floor", v, 0.0, false)?;
        }
        if let Some(v) = raw.zero_floor {
            cfg.zero_floor = check_num("zero_floor", v, 0.0, false)?;
        }
        if let Some(v) = raw.corroborate {
            cfg.corroborate = v;
        }
        if let Some(v) = raw.min_effect {
            cfg.min_effect = check_num("min_effect", v, 0.0, false)?;
        }
        if let Some(v) = raw.min_ratio {
            cfg.min_ratio = check_num("min_ratio", v, 0.0, false)?;
        }
        if let Some(v) = raw.min_util_diff {
            cfg.min_util_diff = check_num("min_util_diff", v, 0.0, false)?;
        }
        if let Some(e) = raw.expected {
            let kinds = [
                (FunctionKind::GpuKernel, e.gpu_kernel),
                (FunctionKind::Memory, e.memory),
                (FunctionKind::Comm, e.comm),
                (FunctionKind::Python, e.python),
                (FunctionKind::CpuOp, e.cpu_op),
            ];
            for (kind, r) in kinds {
                let Some(r) = r else { continue };
                let dst = cfg.expected.get_mut(kind);
                if let Some(p) = check_pair(&format!("expected.{kind}.beta"), r.beta)? {
                    dst.beta = p;
                }
                if let Some(p) = check_pair(&format!("expected.{kind}.mu"), r.mu)? {
                    dst.mu = p;
                }
                if let Some(p) = check_pair(&format!("expected.{kind}.sigma"), r.sigma)? {
                    dst.sigma = p;
                }
            }
        }
        for (i, o) in raw.overrides.into_iter().enumerate() {
            let kind = match o.kind {
                None => None,
                Some(k) => Some(
                    k.parse::<FunctionKind>()
                        .map_err(|e| LocalizeError::Invalid(format!("override[{i}].kind: {e}")))?,
                ),
            };
            if o.contains.is_empty() {
                return Err(LocalizeError::Invalid(format!(
                    "override[{i}].contains is empty: expected a substring of function names"
                )));
            }
            cfg.overrides.push(RangeOverride {
                contains: o.contains,
                kind,
                beta: check_pair(&format!("override[{i}].beta"), o.beta)?,
                mu: check_pair(&format!("override[{i}].mu"), o.mu)?,
                sigma: check_pair(&format!("override[{i}].sigma"), o.sigma)?,
            });
        }
        Ok(cfg)
    }

    /// Whether the parameters can be used, whichever door built them (a TOML
    /// file is checked as it is read, [`Self::from_toml_str`]; a config built
    /// in code, by the Python package or a test, is checked here): the same
    /// rules — δ > 0; k, β_min, margins, floors and effects finite and ≥ 0;
    /// at least one peer; every expected range and override [low, high]
    /// finite with low ≤ high; an override names a substring.
    pub fn validate(&self) -> Result<(), LocalizeError> {
        check_num("delta", self.delta, 0.0, true)?;
        for (what, v) in [
            ("k", self.k),
            ("beta_min", self.beta_min),
            ("min_margin", self.min_margin),
            ("norm_floor", self.norm_floor),
            ("zero_floor", self.zero_floor),
            ("min_effect", self.min_effect),
            ("min_ratio", self.min_ratio),
            ("min_util_diff", self.min_util_diff),
        ] {
            check_num(what, v, 0.0, false)?;
        }
        if self.max_peers == 0 {
            return Err(LocalizeError::Invalid(
                "max_peers = 0: expected at least 1".into(),
            ));
        }
        let pair = |what: String, (l, r): (f64, f64)| check_pair(&what, Some([l, r])).map(|_| ());
        for kind in FunctionKind::ALL {
            let e = self.expected.get(kind);
            pair(format!("expected.{kind}.beta"), e.beta)?;
            pair(format!("expected.{kind}.mu"), e.mu)?;
            pair(format!("expected.{kind}.sigma"), e.sigma)?;
        }
        for (i, o) in self.overrides.iter().enumerate() {
            if o.contains.is_empty() {
                return Err(LocalizeError::Invalid(format!(
                    "override[{i}].contains is empty: expected a substring of function names"
                )));
            }
            for (what, p) in [("beta", o.beta), ("mu", o.mu), ("sigma", o.sigma)] {
                if let Some(p) = p {
                    pair(format!("override[{i}].{what}"), p)?;
                }
            }
        }
        Ok(())
    }

    /// R_f of one function: the first matching override applied to its kind's range.
    pub fn range_for(&self, kind: FunctionKind, name: &str) -> ExpectedRange {
        let mut r = self.expected.get(kind);
        if let Some(o) = self.overrides.iter().find(|o| {
            (o.kind.is_none() || o.kind == Some(kind)) && name.contains(o.contains.as_str())
        }) {
            if let Some(p) = o.beta {
                r.beta = p;
            }
            if let Some(p) = o.mu {
                r.mu = p;
            }
            if let Some(p) = o.sigma {
                r.sigma = p;
            }
        }
        r
    }
}
