//! Localization results: abnormal (function, workers) findings (PerfTracker
//! §4.3, Figure 7; EROICA's output table). The JSON form of [`Report`] is the
//! contract scripts rely on: `workers`, `missing_workers`, `findings` with
//! `function`, `kind`, `workers`, `reason`, `beta`/`mu`/`sigma` {`value`, `peers`}.

use serde::{Deserialize, Serialize};

use crate::{FunctionKind, Resource, UtilizationSource};

/// Current report schema version.
pub const REPORT_VERSION: u32 = 1;

/// Why a function was flagged on its workers (Eq. 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// D_{f,w} > 0: outside the expected range R_f (a problem common to workers).
    Unexpected,
    /// Δ_{f,w} > M_f + k·MAD_f: behaves unlike its peers.
    PeerOutlier,
    /// Both.
    Both,
    /// Its host's network: the collective waits on a host that loses TCP
    /// segments or sits behind a slow link, read from the ranks' own TCP
    /// counters and connections (issue 29; [`Report::network`]).
    Network,
}

/// A median over the flagged workers and over the others.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stat {
    /// Median over the flagged workers.
    pub value: f64,
    /// Median over the other workers of the comparison group (NaN-free: 0 when none).
    /// For β and critical time every other worker counts (0 without the
    /// function); μ and σ are defined only where the function has critical
    /// time, so their median is over the peers that have some.
    pub peers: f64,
    /// How many peers `peers` is the median of; `Some(0)`: no peer has a
    /// value (`peers` is then a placeholder 0). `None` in reports written
    /// before this field existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_count: Option<u32>,
}

impl Stat {
    /// Whether `peers` is a real median (some peer had a value, or the
    /// report predates `peer_count`).
    pub fn has_peers(&self) -> bool {
        self.peer_count != Some(0)
    }
}

/// One worker's pattern of a flagged function, for plots (Fig. 13, Fig. 15).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct WorkerPoint {
    /// Rank.
    pub worker: u32,
    /// β.
    pub beta: f64,
    /// μ.
    pub mu: f64,
    /// σ.
    pub sigma: f64,
    /// Whether this worker is flagged for the function.
    pub flagged: bool,
}

/// One abnormal function and the workers it is abnormal on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// Function identity (for Python the whole stack).
    pub function: String,
    /// Its class.
    pub kind: FunctionKind,
    /// Flagged ranks, ascending.
    pub workers: Vec<u32>,
    /// Why.
    pub reason: Reason,
    /// β, flagged vs. peers.
    pub beta: Stat,
    /// μ, flagged vs. peers.
    pub mu: Stat,
    /// σ, flagged vs. peers.
    pub sigma: Stat,
    /// The resource behind μ and σ.
    pub resource: Resource,
    /// Where μ and σ came from.
    pub util_source: UtilizationSource,
    /// Comparison group, when groups are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Number of workers in the comparison group (flagged or not), so that
    /// outputs can say "all" when every worker of the group is flagged.
    /// 0 when unknown (reports written before this field existed).
    #[serde(default)]
    pub group_workers: usize,
    /// Hosts of the flagged workers, when known (sorted, distinct).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Critical-path time per window, flagged vs. peers, µs (medians).
    pub critical_us: Stat,
    /// Utilization of `resource` over *all* of a worker's critical-path work
    /// governed by it (critical-time-weighted μ of those functions), flagged
    /// vs. peers. It tells "this host's CPU (link, GPU) is slow for
    /// everything" apart from "this function is slow", and still compares
    /// when the peers never have this function on their critical path.
    /// `None` without utilization or without any peer to compare with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_mu: Option<Stat>,
    /// A remediation hint for a known pattern, when one matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
    /// For Python functions: the innermost frame's source lines, when readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_excerpt: Option<String>,
    /// Every worker's pattern of this function in the comparison group, for plots.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<WorkerPoint>,
    /// The share of the iteration this finding accounts for: on part of a
    /// group, the flagged workers' extra critical-path share over their
    /// peers'; on a whole group, the critical-path share above the
    /// function's expected range. Findings are ordered by it.
    #[serde(default)]
    pub explains: f64,
    /// What follows from this cause: peers waiting for the flagged workers
    /// in a collective, and other functions slower on the same workers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consequences: Vec<Consequence>,
}

/// How a [`Consequence`] relates to its cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    /// `workers` wait in this collective for the cause's workers.
    WaitsFor,
    /// This function is also slower on the cause's workers.
    AlsoSlower,
}

/// A finding folded under the finding that causes it (the cause first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Consequence {
    /// The function.
    pub function: String,
    /// Its class.
    pub kind: FunctionKind,
    /// How it follows from the cause.
    pub relation: Relation,
    /// The workers it shows on (the waiting ones, or the cause's).
    pub workers: Vec<u32>,
    /// β there (median) vs. on the other workers.
    pub beta: Stat,
}

/// The localizer's answer for one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Schema version.
    pub version: u32,
    /// Workers analyzed.
    pub workers: usize,
    /// Ranks expected (0..max rank, or the declared world size) but absent.
    pub missing_workers: Vec<u32>,
    /// Abnormal functions, most critical-path time first. Empty means "no anomaly".
    pub findings: Vec<Finding>,
    /// Where utilization came from (samples, trace, none, or mixed).
    pub utilization_source: String,
    /// Number of distinct hosts, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<usize>,
    /// Non-fatal problems (skipped files, guessed ranks).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the report concludes. (Reports written before this field was
    /// added read as `no_anomaly`: use `findings` there.)
    #[serde(default)]
    pub verdict: Verdict,
    /// Why the data could not support a verdict, when
    /// `verdict` is `could_not_judge`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_judged: Vec<String>,
    /// Iteration time over the recorded steps and where it rose, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<IterationTimes>,
    /// The node agents' cross-layer diagnosis of the same job (SysOM-AI
    /// §3.1), when the door had their evidence (the online package beside
    /// an agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cross_layer: Option<crate::diagnosis::DiagnoseReport>,
    /// The network layer judged from the workers' own network samples
    /// (fingerprints' `network`): hosts that lose TCP segments or sit
    /// behind a slow link, as `whyslow diagnose`'s `network_diff`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<crate::diagnosis::LossyHost>,
    /// A model's proposed fix from the findings and the relevant code
    /// (EROICA's first step), when one was asked for (`--suggest-fix`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<crate::fix::Fix>,
    /// Why no proposal came back, in one line, when one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix_error: Option<String>,
}

/// Iteration time over the steps a report covers, and where a slowdown
/// began (PerfTracker §4.1's indicator of iteration time, shown so that a
/// reader sees *when* the job slowed down, not only where).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationTimes {
    /// Where the times come from.
    pub source: IterationSource,
    /// One series per worker (traces), or one for the job (the detector).
    pub series: Vec<IterationSeries>,
    /// The step at which iteration time rose, when it rose within the series.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onset: Option<Onset>,
}

/// Origin of [`IterationTimes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IterationSource {
    /// `ProfilerStep#N` spans of the traces (only the profiled window).
    ProfilerSteps,
    /// The online detector's history of iteration durations (§4.1), from
    /// before the slowdown to the profiling window.
    Detector,
}

/// Iteration durations of one worker (or of the job).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IterationSeries {
    /// The worker's rank; `None` for the job as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    /// Step numbers, ascending.
    pub steps: Vec<u64>,
    /// Duration of each step, milliseconds.
    pub ms: Vec<f64>,
}

/// Where iteration time rose: the first slow step and the typical
/// (median) durations before and after it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Onset {
    /// First step of the slower stretch.
    pub step: u64,
    /// Median iteration time before it, ms.
    pub before_ms: f64,
    /// Median iteration time from it on, ms.
    pub after_ms: f64,
}

/// The one-line answer of a [`Report`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// At least one finding.
    Anomalies,
    /// The data was enough to judge, and nothing is abnormal.
    #[default]
    NoAnomaly,
    /// The data cannot support a verdict (no events, no usable worker):
    /// "no anomaly" would be a claim nobody checked.
    CouldNotJudge,
}

impl Report {
    /// Marks the report as unjudgeable for `why` (findings, if any, are kept).
    pub fn could_not_judge(&mut self, why: String) {
        self.verdict = Verdict::CouldNotJudge;
        self.not_judged.push(why);
    }
}
