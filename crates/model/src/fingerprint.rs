//! The per-worker fingerprint: PerfTracker §4.2's behavior patterns, EROICA's
//! "behavior fingerprint". This is the unit that travels from every worker to
//! the central localizer, so its serialized form is a versioned contract
//! (documented in `docs/fingerprint.md`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{FunctionKind, Resource};

/// Value of the `format` field of every fingerprint file.
pub const FINGERPRINT_FORMAT: &str = "whyslow-fingerprint";
/// Current fingerprint schema version. Readers accept versions ≤ this.
///
/// Version 2 added [`Fingerprint::job`] (the job identity); version 1 files
/// still load, with `job: None`.
pub const FINGERPRINT_VERSION: u32 = 2;

/// Where the utilization behind μ and σ came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UtilizationSource {
    /// Hardware sample series (the samples file, or the sampler).
    Samples,
    /// What the trace itself carries (occupancy, bandwidth vs. peak).
    Trace,
    /// Nothing: μ = σ = 0.
    None,
}

/// A stable 32-bit hash (FNV-1a) of a function's kind and name, for
/// [`Fingerprint::omitted`].
pub fn function_hash(kind: FunctionKind, name: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in kind.as_str().bytes().chain([0xff]).chain(name.bytes()) {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// P_{f,w} = (β, μ, σ) of one function on one worker (PerfTracker §4.2, Eq. 1–5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionPattern {
    /// Function identity (for Python the whole stack, outermost first, `;`-joined).
    pub name: String,
    /// Its class.
    pub kind: FunctionKind,
    /// The resource that governs it.
    pub resource: Resource,
    /// β: fraction of the window this function is on the critical path (Eq. 2).
    pub beta: f64,
    /// μ: duration-weighted mean utilization over critical execution durations (Eq. 4).
    pub mu: f64,
    /// σ: duration-weighted std of utilization over critical execution durations (Eq. 5).
    pub sigma: f64,
    /// Where μ and σ came from for this function.
    pub util_source: UtilizationSource,
    /// Executions in the window.
    pub calls: u64,
    /// Time on the critical path, µs (β × window).
    pub critical_us: f64,
    /// Total execution time in the window, µs (on the critical path or not).
    pub total_us: f64,
}

/// Who a fingerprint's worker belongs to: the job's identity, each part
/// when known. Two fingerprints whose known parts differ (or whose
/// [`Fingerprint::device`] differs) come from different jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobIdentity {
    /// The job's id where the launcher names it (torchrun's run id, a Slurm
    /// job id, the server's job name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The profiling session (one online window of the job), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Number of ranks in the job (Kineto `distributedInfo.world_size`,
    /// torchrun's `WORLD_SIZE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// The collective backend (`nccl`, `gloo`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// What people call the job where the scheduler names it (Slurm's job
    /// name, the Kubernetes Job's name); shown before the run id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What the scheduler knows of the job, as the ranks saw it:
    /// `slurm.job_id`, `slurm.job_name`, `slurm.step_id`, `slurm.nodelist`,
    /// `k8s.namespace`, `k8s.pod`, `k8s.job`, `torch.run_id`. Not part of
    /// the job's identity for pooling (ranks of one job may differ in pod
    /// or step).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl JobIdentity {
    /// `None` when nothing is known, so that the field stays out of files.
    pub fn known(self) -> Option<Self> {
        (self != Self::default()).then_some(self)
    }
}

/// One worker's fingerprint: its functions' patterns over one profiling window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// Always [`FINGERPRINT_FORMAT`].
    pub format: String,
    /// Schema version, [`FINGERPRINT_VERSION`] when written by this build.
    pub version: u32,
    /// Global rank of the worker.
    pub worker: u32,
    /// Host, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Group of workers expected to behave alike, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Window start on the worker's clock, µs.
    pub window_start_us: f64,
    /// Window length |T|, µs.
    pub window_us: f64,
    /// Device name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The job this window was taken from, as far as it is known (version
    /// 2): what lets every door refuse to pool two jobs and name the ranks
    /// that sent nothing (PerfTracker §4.3 compares the workers of one job).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobIdentity>,
    /// Where utilization came from overall (samples if any function used samples).
    pub utilization_source: UtilizationSource,
    /// The trace or events file summarized.
    pub source: String,
    /// Patterns: those on the critical path (β at or above the summarizer's
    /// floor) β descending, then those that ran a notable share of the
    /// window off it, by total time. Functions left out read as β = μ = σ = 0
    /// in localization.
    pub functions: Vec<FunctionPattern>,
    /// Every function left out of `functions` ran for less than this share
    /// of the window (total time / |T|). 0 when unknown (fingerprints written
    /// before the field existed): the localizer then reads a missing function
    /// as not run at all.
    #[serde(default)]
    pub total_floor: f64,
    /// [`function_hash`] of every function left out that ran at least the
    /// summarizer's floor share of the window, ascending: a function missing
    /// from `functions` and from this list did not run for a notable time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub omitted: Vec<u32>,
    /// Warnings from ingestion and summarization.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The worker's network over the window, read in-process where no
    /// node agent is (issue 29): its namespace's TCP counters and its own
    /// connections (`tcp_info`), as the agent's OS sample has them. The
    /// network layer judges these as `whyslow diagnose` judges the agent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::os::OsSample>,
    /// Every GPU kernel that ran in the window, the longest first (at most
    /// [`MAX_KERNELS`]), also those under the floor of `functions`: SysOM-AI
    /// §3.1's GPU diff compares a late rank's kernels per call with its
    /// peers', and a peer whose GPU mostly idles keeps each kernel far under
    /// that floor (H100, 4 ranks of a small model on one GPU: 1530 kernels,
    /// 0.5 % of the window). Empty in fingerprints written before it existed
    /// (`functions` of kind `gpu_kernel` then stand in).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kernels: Vec<KernelTotal>,
    /// The window's training steps as the trace marked them (`ProfilerStep#N`
    /// spans): `(step, ms)`, in order. They travel with the fingerprint so
    /// that a door holding fingerprints only (the server, `localize`) plots
    /// the iteration time and finds its onset as `analyze` does on the traces
    /// (PerfTracker §4.1). Empty without step marks, and in fingerprints
    /// written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<(u64, f64)>,
}

/// The most kernels a fingerprint lists in [`Fingerprint::kernels`].
pub const MAX_KERNELS: usize = 512;

/// One GPU kernel's launches and device time over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelTotal {
    /// The kernel's name, as the profiler gives it.
    pub name: String,
    /// Launches in the window.
    pub calls: u64,
    /// Device time summed over those launches, µs.
    pub total_us: f64,
}
