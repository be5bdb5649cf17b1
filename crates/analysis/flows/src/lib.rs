//! Black-box diagnosis of distributed training from network flow records,
//! after LLMPrism (Jiang et al., "LLMPrism: Black-box Performance Diagnosis for
//! Production LLM Training Platforms", §IV).
//!
//! The pipeline is pure (no I/O) and runs in four phases, as in the paper's Fig. 2:
//!
//! 1. **Job recognition** (§IV-A, Algorithm 1, [`jobs`]): a disjoint-set over flow
//!    endpoints gives *cross-machine clusters*; clusters whose machine sets (from the
//!    [`Topology`]) have Jaccard similarity 1 are merged into jobs.
//! 2. **Parallelism identification** (§IV-B, Algorithm 2, [`classify`]): per endpoint
//!    pair, the inter-flow intervals are split into training steps by Bayesian Online
//!    Change-point Detection ([`bocd`], Adams & MacKay 2007); a pair whose mode of
//!    distinct flow sizes per step is 1 is pipeline-parallel (PP), otherwise
//!    data-parallel (DP); a depth-first search over the DP graph then refines every pair
//!    inside a DP connected component to DP (transitivity of DP groups).
//! 3. **Timeline reconstruction** (§IV-C, [`timeline`]): per rank (address), BOCD on the
//!    intervals between its DP flows splits them into bursts; the end of each DP burst is
//!    the end of a training step.
//! 4. **Diagnosis** (§IV-D, [`diagnose`]): k-σ rules (k = 3) across steps, across DP
//!    groups and across switches (mean DP bandwidth per switch per step, concurrent DP
//!    flows per switch).
//!
//! The entry point is [`analyze`]; its [`FlowReport`] serializes to the JSON contract of
//! `whyslow flows analyze --format json` (`jobs`, `pairs`, `ranks`, `findings`, plus
//! `switches` and summary fields). [`to_perfetto_trace`] renders the per-rank timelines
//! as Chrome/Perfetto trace JSON (LLMPrism Fig. 4), [`render_table`] renders text and
//! [`switch_bandwidth_series`] gives the data of the per-switch bandwidth plot (Fig. 5).
#![deny(missing_docs)]

pub mod bocd;
pub mod classify;
pub mod diagnose;
pub mod jobs;
pub mod merge;
mod output;
pub mod synth;
pub mod timeline;
pub mod topology;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub use bocd::{Bocd, BocdConfig, CpModel, NormalGammaPrior};
pub use output::{render_table, switch_bandwidth_series, to_perfetto_trace, SwitchSeries};
pub use topology::{Topology, TopologyError};

/// One network flow as seen by the switches (LLMPrism §II-B: start time, source,
/// destination, involved switches, size, duration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowRecord {
    /// Flow start, microseconds since an arbitrary epoch shared by all records
    /// (Unix epoch for IPFIX/NetFlow input).
    pub start_us: u64,
    /// Flow duration in microseconds (0 when the exporter saw a single packet).
    pub dur_us: u64,
    /// Source address (a GPU's NIC).
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// Bytes carried by the flow.
    pub bytes: u64,
    /// Transport source port, when known.
    pub src_port: Option<u16>,
    /// Transport destination port, when known.
    pub dst_port: Option<u16>,
    /// IP protocol number, when known.
    pub proto: Option<u8>,
    /// Switches on the flow's path, in path order when known (one entry per exporter
    /// that reported it; empty when unknown).
    pub switches: Vec<String>,
}

impl FlowRecord {
    /// A record with only the mandatory fields.
    pub fn new(start_us: u64, src: IpAddr, dst: IpAddr, bytes: u64, dur_us: u64) -> Self {
        FlowRecord {
            start_us,
            dur_us,
            src,
            dst,
            bytes,
            src_port: None,
            dst_port: None,
            proto: None,
            switches: Vec::new(),
        }
    }

    /// End of the flow, microseconds.
    pub fn end_us(&self) -> u64 {
        self.start_us.saturating_add(self.dur_us)
    }
}

/// Tuning of [`analyze`]. `Default` gives the paper's values where it states them
/// (BOCD threshold 0.95, k = 3) and documented choices elsewhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlowConfig {
    /// BOCD settings for step division (§IV-B) and timeline reconstruction (§IV-C).
    pub bocd: BocdConfig,
    /// k of the k-σ rule (§IV-D). Paper: 3.
    pub k_sigma: f64,
    /// Floor on σ as a fraction of the mean of the compared values, so that perfectly
    /// regular synthetic or lab data (σ ≈ 0) does not flag every tiny deviation.
    /// Not in the paper; 0.05 means "at least 5% + 3σ away".
    pub min_rel_sigma: f64,
    /// Merge the same flow reported by several switches (5-tuple + time overlap)
    /// before analysis, see [`merge::merge_switch_reports`].
    pub merge_duplicates: bool,
    /// Concurrent DP flows through one switch above which a switch-level finding is
    /// raised (§IV-D "exceeding concurrent DP communication limits"). `None`: only
    /// report the count.
    pub max_concurrent_dp_flows: Option<usize>,
    /// Minimum number of values (steps, groups, switches) for a k-σ comparison.
    pub min_samples: usize,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            bocd: BocdConfig::default(),
            k_sigma: 3.0,
            min_rel_sigma: 0.05,
            merge_duplicates: true,
            max_concurrent_dp_flows: None,
            min_samples: 3,
        }
    }
}

/// Communication type of an endpoint pair (§IV-B).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PairType {
    /// Data parallel: collective traffic at the end of each step, several flow sizes.
    Dp,
    /// Pipeline parallel: point-to-point send/recv, one flow size.
    Pp,
}

/// A recognized training job (§IV-A).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Index of the job in the report.
    pub id: usize,
    /// Addresses (ranks) of the job, sorted.
    pub members: Vec<String>,
    /// Machines of the job (from the topology; an address without a machine counts as
    /// its own machine).
    pub machines: Vec<String>,
    /// Cross-machine clusters merged into this job (Algorithm 1 step 1 output).
    pub clusters: usize,
    /// DP groups: connected components of the refined DP graph (§IV-B), sorted.
    pub dp_groups: Vec<Vec<String>>,
}

/// An endpoint pair and its communication type (§IV-B).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// The lower address of the (unordered) pair.
    pub src: String,
    /// The higher address.
    pub dst: String,
    /// `dp` or `pp`.
    #[serde(rename = "type")]
    pub kind: PairType,
    /// Job index.
    pub job: usize,
    /// Flows between the two addresses (both directions).
    pub flows: usize,
    /// Steps found by BOCD step division.
    pub steps: usize,
    /// Mode of the number of distinct flow sizes per step (N_k in Algorithm 2).
    pub mode_distinct_sizes: usize,
    /// True when the DFS refinement turned this pair from PP into DP.
    pub refined: bool,
}

/// One reconstructed training step of a rank (§IV-C).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Start: end of the previous step's DP traffic, microseconds.
    pub start_us: u64,
    /// End: end of this step's DP traffic, microseconds.
    pub end_us: u64,
}

impl Step {
    /// Duration in microseconds.
    pub fn dur_us(&self) -> u64 {
        self.end_us.saturating_sub(self.start_us)
    }
}

/// A rank (address) and its reconstructed steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rank {
    /// Address of the rank.
    pub address: String,
    /// Job index.
    pub job: usize,
    /// DP group index within the job (`Job::dp_groups`), if the rank has DP traffic.
    pub dp_group: Option<usize>,
    /// Complete steps: between consecutive ends of DP traffic.
    pub steps: Vec<Step>,
    /// Mean step duration, microseconds (0 without complete steps).
    pub mean_step_us: f64,
}

/// Level of a finding (§IV-D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FindingLevel {
    /// Cross-step diagnosis: a slow training step.
    Step,
    /// Cross-group diagnosis: a slow DP group.
    Group,
    /// Switch-level diagnosis: a switch (or inter-switch link) with low DP bandwidth
    /// or too many concurrent DP flows.
    Switch,
}

/// A diagnosed performance problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowFinding {
    /// `step`, `group` or `switch`.
    pub level: FindingLevel,
    /// What is slow: e.g. `job 0 step 7`, `job 0 dp group 1`, `switch leaf2`.
    pub subject: String,
    /// One sentence with the numbers behind the finding.
    pub reason: String,
    /// Job index, when the finding belongs to one job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<usize>,
    /// The anomalous value (µs for step/group durations, Gb/s for bandwidth, count
    /// for concurrent flows).
    pub value: f64,
    /// The threshold it crossed, same unit.
    pub threshold: f64,
}

/// DP statistics of one switch (§IV-D switch-level diagnosis; Fig. 5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchStats {
    /// Switch name, or `a<->b` for the link between switches a and b.
    pub name: String,
    /// True for an inter-switch link.
    pub link: bool,
    /// DP flows through the switch.
    pub dp_flows: usize,
    /// Maximum number of DP flows through the switch at the same time.
    pub max_concurrent_dp_flows: usize,
    /// Mean (byte-weighted) bandwidth of the DP flows through the switch, Gb/s.
    pub mean_dp_gbps: f64,
    /// 90th percentile of the per-flow bandwidth of its DP flows, Gb/s.
    pub p90_dp_gbps: f64,
    /// Mean DP bandwidth per step window: (window start µs, window end µs, Gb/s).
    pub per_step: Vec<(u64, u64, f64)>,
}

/// One communication event of a rank's reconstructed timeline (§IV-C, Fig. 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEvent {
    /// Start, microseconds.
    pub start_us: u64,
    /// Duration, microseconds.
    pub dur_us: u64,
    /// DP or PP traffic.
    pub kind: PairType,
    /// True when this rank sent the flow, false when it received it.
    pub send: bool,
    /// The other end.
    pub peer: String,
    /// Bytes.
    pub bytes: u64,
}

/// Per-rank communication events, kept for [`to_perfetto_trace`] (not serialized).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timelines {
    /// Events of each rank, parallel to [`FlowReport::ranks`], sorted by start.
    pub events: Vec<Vec<TimelineEvent>>,
}

/// Result of [`analyze`]; its JSON form is the `whyslow flows analyze` contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// Report format version.
    pub version: u32,
    /// Flow records analysed (after merging duplicates).
    pub flows: usize,
    /// Records merged away as duplicates reported by several switches.
    pub merged_duplicates: usize,
    /// First flow start, microseconds.
    pub window_start_us: u64,
    /// Last flow end, microseconds.
    pub window_end_us: u64,
    /// Recognized jobs.
    pub jobs: Vec<Job>,
    /// Endpoint pairs with their type.
    pub pairs: Vec<Pair>,
    /// Ranks with their reconstructed steps.
    pub ranks: Vec<Rank>,
    /// Findings of the diagnosis.
    pub findings: Vec<FlowFinding>,
    /// Per-switch DP statistics.
    pub switches: Vec<SwitchStats>,
    /// Per-rank events (not part of the JSON).
    #[serde(skip)]
    pub timelines: Timelines,
}

/// Version written in [`FlowReport::version`].
pub const FLOW_REPORT_VERSION: u32 = 1;

/// Run the whole LLMPrism pipeline (§IV-A to §IV-D) over flow records.
///
/// `topology` maps addresses to machines (needed to merge the cross-machine clusters
/// of one job, §IV-A) and exporter names to switch names; without it every address is
/// its own machine. Never panics on any input; empty input gives an empty report.
pub fn analyze(
    records: &[FlowRecord],
    topology: Option<&Topology>,
    cfg: &FlowConfig,
) -> FlowReport {
    let renamed;
    let mut records = records;
    if let Some(topo) = topology {
        if !topo.exporters.is_empty() && records.iter().any(|r| !r.switches.is_empty()) {
            renamed = records
                .iter()
                .map(|r| {
                    let mut r = r.clone();
                    for s in &mut r.switches {
                        if let Some(n) = topo.exporters.get(s.as_str()) {
                            *s = n.clone();
                        }
                    }
                    r
                })
                .collect::<Vec<_>>();
            records = &renamed;
        }
    }
    let merged;
    let mut merged_duplicates = 0;
    if cfg.merge_duplicates && records.iter().any(|r| !r.switches.is_empty()) {
        merged = merge::merge_switch_reports(records);
        merged_duplicates = records.len() - merged.len();
        records = &merged;
    }
    let mut report = analyze_merged(records, topology, cfg);
    report.merged_duplicates = merged_duplicates;
    report
}

fn analyze_merged(
    records: &[FlowRecord],
    topology: Option<&Topology>,
    cfg: &FlowConfig,
) -> FlowReport {
    let index = FlowIndex::build(records);
    let jobs = jobs::recognize(&index, topology);
    let classified = classify::classify(&index, &jobs, &cfg.bocd);
    let timelines = timeline::reconstruct(&index, &jobs, &classified, &cfg.bocd);
    let switches = diagnose::switch_stats(&index, &classified, &timelines);
    let findings = diagnose::diagnose(&index, &jobs, &classified, &timelines, &switches, cfg);
    output::assemble(&index, &jobs, &classified, timelines, switches, findings)
}

/// Fast hasher for integer keys (rustc's FxHash), to keep the pipeline above 1 M flows/s.
pub use rustc_hash::{FxHashMap, FxHasher};

/// Addresses interned to dense ids and flows grouped by unordered pair; shared by all
/// phases.
#[derive(Debug, Clone, Default)]
pub struct FlowIndex<'a> {
    /// The records.
    pub records: &'a [FlowRecord],
    /// Address of each id.
    pub addrs: Vec<IpAddr>,
    /// Id of each address.
    pub ids: FxHashMap<IpAddr, u32>,
    /// Unordered pairs (lower id, higher id), sorted.
    pub pairs: Vec<(u32, u32)>,
    /// Record indices of each pair, sorted by start time.
    pub pair_flows: Vec<Vec<u32>>,
}

impl<'a> FlowIndex<'a> {
    /// Intern addresses and group flows by unordered pair. Self-flows are ignored.
    pub fn build(records: &'a [FlowRecord]) -> Self {
        let mut ids: FxHashMap<IpAddr, u32> = FxHashMap::default();
        let mut addrs = Vec::new();
        let mut pair_ix: FxHashMap<u64, u32> = FxHashMap::default();
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        let mut pair_flows: Vec<Vec<u32>> = Vec::new();
        let mut intern = |a: IpAddr, ids: &mut FxHashMap<IpAddr, u32>| -> u32 {
            *ids.entry(a).or_insert_with(|| {
                addrs.push(a);
                (addrs.len() - 1) as u32
            })
        };
        for (i, r) in records.iter().enumerate() {
            if r.src == r.dst {
                continue;
            }
            let a = intern(r.src, &mut ids);
            let b = intern(r.dst, &mut ids);
            let (lo, hi) = if a < b { (a, b) } else { (b, a) };
            let key = ((lo as u64) << 32) | hi as u64;
            let p = *pair_ix.entry(key).or_insert_with(|| {
                pairs.push((lo, hi));
                pair_flows.push(Vec::new());
                (pairs.len() - 1) as u32
            });
            pair_flows[p as usize].push(i as u32);
        }
        for f in &mut pair_flows {
            if !f
                .windows(2)
                .all(|w| records[w[0] as usize].start_us <= records[w[1] as usize].start_us)
            {
                f.sort_by_key(|&i| records[i as usize].start_us);
            }
        }
        // Deterministic order: by addresses.
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by(|&x, &y| {
            let (a, b) = pairs[x];
            let (c, d) = pairs[y];
            (addrs[a as usize], addrs[b as usize]).cmp(&(addrs[c as usize], addrs[d as usize]))
        });
        let pairs2 = order.iter().map(|&i| pairs[i]).collect();
        let mut pf = std::mem::take(&mut pair_flows);
        let flows2 = order.iter().map(|&i| std::mem::take(&mut pf[i])).collect();
        FlowIndex {
            records,
            addrs,
            ids,
            pairs: pairs2,
            pair_flows: flows2,
        }
    }

    /// The record of index `i`.
    #[inline]
    pub fn rec(&self, i: u32) -> &FlowRecord {
        &self.records[i as usize]
    }
}
