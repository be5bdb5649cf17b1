//! The flow vocabulary of LLMPrism (Jiang et al., §II-B, §IV): flow records
//! as switches export them, and the report of the flow analysis (jobs,
//! endpoint pairs, per-rank steps, findings). Readers (`whyslow-flows-ingest`)
//! produce [`FlowRecord`]s, the analysis (`whyslow-flows`) produces a
//! [`FlowReport`], the report crate renders it.

use std::fmt;
use std::net::IpAddr;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The switches on a flow's path, shared by every record that took it: cloning
/// a record copies a pointer, and a reader gives all the records of one
/// exporter the same path instead of a list of its own (LLMPrism §II-B's
/// "involved switches"). Reads as a slice of names; the empty path allocates
/// nothing.
#[derive(Clone, Default, Eq)]
pub struct SwitchPath(Option<Arc<[String]>>);

impl SwitchPath {
    /// The path of these switches, in order.
    pub fn new<S: Into<String>>(names: impl IntoIterator<Item = S>) -> Self {
        names
            .into_iter()
            .map(Into::into)
            .collect::<Vec<String>>()
            .into()
    }

    /// The path of one switch.
    pub fn one(name: impl Into<String>) -> Self {
        SwitchPath(Some(Arc::from(vec![name.into()])))
    }
}

impl Deref for SwitchPath {
    type Target = [String];

    fn deref(&self) -> &[String] {
        self.0.as_deref().unwrap_or(&[])
    }
}

impl From<Vec<String>> for SwitchPath {
    fn from(v: Vec<String>) -> Self {
        if v.is_empty() {
            SwitchPath(None)
        } else {
            SwitchPath(Some(Arc::from(v)))
        }
    }
}

impl<S: Into<String>> FromIterator<S> for SwitchPath {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        SwitchPath::new(iter)
    }
}

impl<'a> IntoIterator for &'a SwitchPath {
    type Item = &'a String;
    type IntoIter = std::slice::Iter<'a, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl PartialEq for SwitchPath {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            (a, b) => a.is_none() && b.is_none(),
        }
    }
}

impl std::hash::Hash for SwitchPath {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for SwitchPath {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for SwitchPath {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for SwitchPath {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl fmt::Debug for SwitchPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for SwitchPath {
    fn serialize<Ser: Serializer>(&self, s: Ser) -> Result<Ser::Ok, Ser::Error> {
        (**self).serialize(s)
    }
}

impl<'de> Deserialize<'de> for SwitchPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::<String>::deserialize(d).map(Into::into)
    }
}

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
    pub switches: SwitchPath,
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
            switches: SwitchPath::default(),
        }
    }

    /// End of the flow, microseconds.
    pub fn end_us(&self) -> u64 {
        self.start_us.saturating_add(self.dur_us)
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
    /// The job's step period: the median step duration over its ranks, µs (absent
    /// when no rank has a complete step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_us: Option<f64>,
    /// Stalls that recur every few steps (checkpoints, evaluation, logging): not
    /// slow steps, so not findings, but worth knowing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recurring_stalls: Vec<RecurringStall>,
}

/// Steps that are slow every `every` steps by about the same time (§IV-C's
/// cross-step diagnosis skips them: a periodic checkpoint is not an anomaly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecurringStall {
    /// Period, in steps.
    pub every: usize,
    /// Index of the first such step (in the ranks' step lists).
    pub first_step: usize,
    /// Median extra time of those steps over the others' median, µs.
    pub extra_us: f64,
    /// Ranks on which the pattern was seen.
    pub ranks: usize,
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
    /// When it happened (Unix µs), for a step or a link's worst stretch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_us: Option<u64>,
    /// Until when (Unix µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_us: Option<u64>,
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

/// How one switch-to-switch hop changes the flows that cross it: the same
/// connections' active time (sum of flowlet durations) at the upstream switch and
/// at the downstream one. A store-and-forward hop does not stretch a flow
/// (`stretch` ≈ 1); a throttled, congested or faulty link between the two
/// switches does. Computed from per-switch reports of the same flows, before
/// they are merged (not in LLMPrism, which compares switches' mean bandwidth).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HopStats {
    /// Upstream switch: the flows reach it first.
    pub from: String,
    /// Downstream switch.
    pub to: String,
    /// Directed connections (5-tuples) whose bytes both switches reported in full.
    pub connections: usize,
    /// Flowlets reported by the upstream switch for them.
    pub upstream_flowlets: usize,
    /// Flowlets reported by the downstream switch for them.
    pub downstream_flowlets: usize,
    /// Bytes the connections carried (the larger of the two switches' counts).
    pub bytes: u64,
    /// Active time at the upstream switch, microseconds.
    pub upstream_active_us: u64,
    /// Active time at the downstream switch, microseconds.
    pub downstream_active_us: u64,
    /// Downstream active time / upstream active time.
    pub stretch: f64,
    /// The largest stretch over a few consecutive seconds with enough traffic
    /// (a slowdown that began late in the window); 0 when none had enough.
    #[serde(default)]
    pub peak_stretch: f64,
    /// Start of the peak's interval, µs.
    #[serde(default)]
    pub peak_start_us: u64,
    /// End of the peak's interval, µs.
    #[serde(default)]
    pub peak_end_us: u64,
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
    /// The other end: its index in [`FlowReport::ranks`].
    pub peer: u32,
    /// Bytes.
    pub bytes: u64,
}

/// Per-rank communication events, kept for `whyslow_report::flows::to_perfetto_trace` (not serialized).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timelines {
    /// Events of each rank, parallel to [`FlowReport::ranks`], sorted by start.
    pub events: Vec<Vec<TimelineEvent>>,
}

/// Result of the flow analysis (`whyslow_flows::analyze`); its JSON form is the `whyslow flows analyze` contract.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// Report format version.
    pub version: u32,
    /// Flow records analysed (after merging duplicates).
    pub flows: usize,
    /// Records merged away as duplicates reported by several switches.
    pub merged_duplicates: usize,
    /// Flows below the configured minimum size (transport control messages) or
    /// on pairs with too few flows to be training traffic (a rendezvous store's),
    /// left out of the analysis.
    #[serde(default)]
    pub control_flows: usize,
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
    /// Per directed switch-to-switch hop: how much longer flows take after it.
    #[serde(default)]
    pub hops: Vec<HopStats>,
    /// Set when the flows cannot support a verdict (no flow records, or no
    /// training job among them): why, in one line. Never "no findings" for
    /// data that could not show one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub could_not_judge: Option<String>,
    /// Per-rank events (not part of the JSON).
    #[serde(skip)]
    pub timelines: Timelines,
}

/// Version written in [`FlowReport::version`].
pub const FLOW_REPORT_VERSION: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switch_paths_read_as_lists_and_share_on_clone() {
        let p = SwitchPath::new(["leaf1", "spine", "leaf2"]);
        assert_eq!(p, vec!["leaf1", "spine", "leaf2"]);
        assert_eq!(p, ["leaf1", "spine", "leaf2"]);
        assert_ne!(p, vec!["leaf1"]);
        assert_eq!(p.len(), 3);
        assert_eq!(p.join(","), "leaf1,spine,leaf2");
        let q = p.clone();
        assert!(
            std::ptr::eq(p.as_ptr(), q.as_ptr()),
            "a clone shares the names"
        );
        // Equal by content, not only by pointer.
        assert_eq!(q, SwitchPath::new(["leaf1", "spine", "leaf2"]));
        let empty = SwitchPath::default();
        assert!(empty.is_empty());
        assert_eq!(empty, SwitchPath::from(Vec::new()));
        assert_eq!(format!("{p:?}"), r#"["leaf1", "spine", "leaf2"]"#);
        // The wire form is a list of names, both ways.
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"["leaf1","spine","leaf2"]"#
        );
        let back: SwitchPath = serde_json::from_str(r#"["a","b"]"#).unwrap();
        assert_eq!(back, ["a", "b"]);
        let none: SwitchPath = serde_json::from_str("[]").unwrap();
        assert_eq!(none, empty);
        let mut set = std::collections::HashSet::new();
        set.insert(p.clone());
        assert!(set.contains(&SwitchPath::new(["leaf1", "spine", "leaf2"])));
    }
}
