//! The cross-layer diagnosis report (SysOM-AI §3.1): what `whyslow
//! diagnose --format json`, the server's `GET /api/v1/jobs/{job}/diagnosis`
//! and the Python package's `whyslow.diagnose` return, one type for all.
//! Ranks are world ranks, as integers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The whole verdict of one diagnosis (SysOM-AI §3.1–§3.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiagnoseReport {
    /// Ranks late into their collectives (needs collective records).
    pub stragglers: Vec<StragglerRow>,
    /// The layer that explains the slowdown: `gpu`, `cpu`, `os`, `network`
    /// or `none`.
    pub layer: String,
    /// CPU paths above their group's waterline (a rank's own profile, or
    /// another process on a late rank's host).
    pub cpu_diff: Vec<CpuDiff>,
    /// A late rank's blocked time (off the CPU: reads, locks, sleeps) by
    /// path, above its group's waterline of blocked-time shares; needs the
    /// agent's --profile-offcpu.
    pub offcpu_diff: Vec<CpuDiff>,
    /// A late rank's OS signals above its peers'.
    pub os_diff: Vec<OsDiffRow>,
    /// Hosts (network namespaces) that resend TCP segments or receive them
    /// out of order over the floors, the largest share first (the network
    /// layer).
    pub network_diff: Vec<LossyHost>,
    /// A late rank's GPU kernels against its peers'.
    pub gpu_diff: Vec<GpuDiff>,
    /// Functions whose share rose since the baseline (temporal baseline).
    pub regressions: Vec<Regression>,
    /// Time 0 of `baseline` and `window`: the earliest profile or OS
    /// reading, Unix ns.
    pub origin_unix_ns: u64,
    /// The healthy period, seconds since the origin.
    pub baseline: (f64, f64),
    /// The judged period, seconds since the origin.
    pub window: (f64, f64),
    /// Rank profiles read.
    pub profiles: usize,
    /// OS signal readings read.
    pub os_samples: usize,
    /// Per communication group with collective records: each rank's mean
    /// lateness into the window's collectives.
    pub collective_groups: Vec<CollectiveGroup>,
    /// Per profile group: ranks and samples.
    pub groups: Vec<GroupSummary>,
    /// What was not judged and why, and what the data did not support.
    pub notes: Vec<String>,
    /// A hang seen in the collective records (calls in flight far longer
    /// than any step while a member never entered): the ranks the others
    /// wait for, as `whyslow hang` names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang: Option<crate::hang::HangReport>,
}

impl DiagnoseReport {
    /// Whether anything is named: a late rank, a layer, a diff or a
    /// regression. A healthy job's report names nothing.
    pub fn names_anything(&self) -> bool {
        !(self.stragglers.is_empty()
            && self.layer == "none"
            && self.cpu_diff.is_empty()
            && self.offcpu_diff.is_empty()
            && self.os_diff.is_empty()
            && self.network_diff.is_empty()
            && self.gpu_diff.is_empty()
            && self.regressions.is_empty()
            && self.hang.is_none())
    }
}

/// A rank late into its collectives (SysOM-AI §3.2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StragglerRow {
    /// World rank.
    pub rank: u32,
    /// Communication group.
    pub group: String,
    /// Mean lateness behind its peers, µs.
    pub late_us: f64,
    /// The paired t statistic of its lateness over its peers'.
    pub t: f64,
}

/// A CPU (or blocked-time) path above its group's waterline: the rank's own
/// (`scope` `rank`), or another process's on a late rank's host against
/// its peers' hosts (`scope` `host`, shares of the host's samples).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuDiff {
    /// Group.
    pub group: String,
    /// World rank.
    pub rank: u32,
    /// `rank` (the rank's profile) or `host` (its host's profile).
    pub scope: String,
    /// The rank's host, for `scope` `host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The function.
    pub function: String,
    /// Its heaviest path, root first, `;`-joined.
    pub stack: String,
    /// The rank's (or host's) share.
    pub straggler_share: f64,
    /// The peers' mean share.
    pub peer_share: f64,
    /// The waterline, μ + kσ over the peers.
    pub threshold: f64,
}

/// A late rank's OS signal above its peers' (`os_diff`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsDiffRow {
    /// Group.
    pub group: String,
    /// World rank.
    pub rank: u32,
    /// The signal against the peers.
    #[serde(flatten)]
    pub diff: OsDiff,
    /// For an interrupt or softirq signal, the heaviest CPU path through
    /// its kernel handler (`net_rx_action` for NET_RX …): on the rank's
    /// host (all its processes) where the agent profiled it, else in the
    /// rank's own profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_stack: Option<String>,
    /// That path's share of the samples it was found in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_share: Option<f64>,
    /// `host` or `rank`: which profile the path is from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler_scope: Option<String>,
}

/// A late rank's GPU kernels slower than its peers' (`gpu_diff`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDiff {
    /// Group.
    pub group: String,
    /// World rank.
    pub rank: u32,
    /// Peers compared with (those with kernel times).
    pub peers: usize,
    /// What is slower, and how.
    #[serde(flatten)]
    pub finding: GpuFinding,
}

/// One communication group's lateness (`collective_groups`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CollectiveGroup {
    /// Group.
    pub group: String,
    /// Complete instances judged (the last W).
    pub instances: usize,
    /// Mean time between two instances, µs.
    pub period_us: f64,
    /// World rank → mean lateness behind the group's first rank, µs.
    pub mean_late_us: BTreeMap<u32, f64>,
}

/// One profile group's samples (`groups`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupSummary {
    /// Group.
    pub group: String,
    /// Ranks with samples in the window.
    pub ranks: usize,
    /// Samples in the baseline.
    pub baseline_samples: u64,
    /// Samples in the window.
    pub window_samples: u64,
    /// Each rank's samples in the window (the waterline judges ranks with
    /// at least its minimum).
    pub window_samples_by_rank: BTreeMap<u32, u64>,
}

/// How a rank's kernels are slower than its peers'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuPattern {
    /// Most of the GPU time is slower by a similar factor: the hardware
    /// (clocks, power or thermal limits, a degraded part).
    Uniform,
    /// A few kernels are slower, the rest keep their pace: software
    /// (shapes, algorithm choice, data-dependent work).
    Specific,
    /// Most of the GPU time is slower, by more than clocks can explain
    /// (an H100's SM clock spans 345-1980 MHz; throttled GPUs run 1.3-2×
    /// slower): each kernel does more work per call — larger shapes, a
    /// bigger batch — software, not hardware.
    Workload,
}

/// A kernel slower on the rank than on its peers (`gpu_diff` rows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelDiff {
    /// Kernel name.
    pub kernel: String,
    /// The rank's time per call, µs.
    pub straggler_us: f64,
    /// The peers' median time per call, µs.
    pub peers_us: f64,
    /// `straggler_us / peers_us`.
    pub ratio: f64,
    /// The rank's excess in this kernel over the window as a share of its
    /// GPU time.
    pub excess_share: f64,
}

/// The GPU layer's finding on one rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuFinding {
    /// Uniform (hardware) or specific (software).
    pub pattern: GpuPattern,
    /// The rank's GPU time over what its kernels would take at the peers'
    /// pace (1.0: the same).
    pub overall_ratio: f64,
    /// Share of the peers' GPU time (at the rank's calls) held by the
    /// kernels that are slower.
    pub slower_share: f64,
    /// The slower kernels whose excess matters, largest excess first.
    pub kernels: Vec<KernelDiff>,
}

/// One OS signal on which the straggler stands out (`os_diff` of the JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsDiff {
    /// Signal name (`whyslow_model::os`).
    pub signal: String,
    /// The straggler's value (its mean over the window).
    pub straggler: f64,
    /// The peers' mean value.
    pub peers: f64,
    /// μ + kσ over the peers.
    pub threshold: f64,
}

/// One side of a host's loss: its share against the other hosts'.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossSide {
    /// The host's share, percent.
    pub pct: f64,
    /// The median share of the other hosts judged on this side (`None`
    /// without another).
    pub peers_pct: Option<f64>,
    /// Whether the share is over the floor.
    pub over_floor: bool,
}

/// A host that loses TCP segments (`network_diff` of the JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossyHost {
    /// The host, as in `HostTcp::host` (`whyslow_diagnose::network`).
    pub host: String,
    /// Its world ranks.
    pub ranks: Vec<u32>,
    /// Its sending side: segments it sent again per 100 sent.
    pub resent: Option<LossSide>,
    /// Its receiving side: segments that reached it out of order per 100
    /// received.
    pub out_of_order: Option<LossSide>,
    /// `sends`, `receives` or `both`: the sides over their floors.
    pub side: String,
    /// Segments it sent per second.
    pub out_segs_per_s: f64,
    /// Segments it received per second.
    pub in_segs_per_s: f64,
    /// Whether a side over its floor is at least
    /// `NetworkConfig::min_ratio` times its peers' median (or it has no
    /// peer): `false` when the loss is everywhere.
    pub stands_out: bool,
    /// `loss` (its TCP counters: resent or out-of-order segments) or `slow`
    /// (its connections deliver far below the others': a shaper, a
    /// congested or mis-negotiated link; with `resent` set when its queue
    /// also overflows).
    #[serde(default = "loss_cause")]
    pub cause: String,
    /// The connections' measures that stand out, each against the other
    /// connections' (a `slow` row's, or a lossy host's whose connections
    /// are slow too).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub measures: Vec<LinkMeasure>,
}

fn loss_cause() -> String {
    "loss".to_string()
}

/// One measure of a host's connections against the others' (network
/// layer, `cause: slow`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkMeasure {
    /// `sending_rate_mbit_s` (bytes delivered per second of busy time,
    /// median over the host's slow connections), `rtt_over_min` (smoothed
    /// RTT over the connection's lowest: queueing in front of a slow link)
    /// or `slow_connections` (how many of the host's connections are slow,
    /// and of how many judged).
    pub name: String,
    /// The host's value.
    pub value: f64,
    /// The same measure over the other connections (median), or the
    /// count judged for `slow_connections`.
    pub peers: f64,
}

impl LossyHost {
    /// The larger share over its floor, for ordering.
    pub fn worst_pct(&self) -> f64 {
        [&self.resent, &self.out_of_order]
            .into_iter()
            .flatten()
            .filter(|s| s.over_floor)
            .map(|s| s.pct)
            .fold(0.0, f64::max)
    }
}

/// A function whose CPU share rose against the baseline (temporal baseline).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Regression {
    /// Communication group (or job).
    pub group: String,
    /// The function.
    pub function: String,
    /// Its heaviest path now, root first, `;`-joined.
    pub stack: String,
    /// Share before (baseline).
    pub before_share: f64,
    /// Share now.
    pub after_share: f64,
}

/// What a diagnosis reads, as plain data: an agent spool's contents
/// (`whyslow_spool::read_spool`), or what the server holds of a job.
#[derive(Debug, Clone, Default)]
pub struct DiagnoseEvidence {
    /// Stack profiles: the ranks' CPU profiles (`rank` label), their
    /// off-CPU profiles (`kind` `offcpu`) and node-wide ones (`scope`
    /// label); any other is ignored.
    pub profiles: Vec<crate::stack::StackProfile>,
    /// Collective records (SysOM-AI §3.2).
    pub collectives: Vec<crate::collective::CollectiveRecord>,
    /// OS signal readings, TCP counters among them.
    pub os_samples: Vec<crate::os::OsSample>,
    /// Per-rank fingerprints for the GPU layer (their kernel times); `None`
    /// when none were given.
    pub fingerprints: Option<Vec<crate::Fingerprint>>,
    /// What reading the evidence noted (files or lines skipped); kept in
    /// the report's notes.
    pub notes: Vec<String>,
}
