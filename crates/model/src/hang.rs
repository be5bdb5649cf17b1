//! Hangs: what the ranks of a stalled job left behind (Flight Recorder
//! dumps, thread stacks, open collective records) and the verdict of
//! `whyslow hang`, the online package's hang report and the server's job
//! page, one type for all. Ranks are world ranks, as integers.
//!
//! PerfTracker §4.1 detects a blocked job (no event for 5× the mean
//! iteration); this vocabulary names *who* the blocked ranks wait for.

pub mod records;

use serde::{Deserialize, Serialize};

/// Version of [`HangReport`]'s JSON.
pub const HANG_REPORT_VERSION: u32 = 1;

/// The largest world rank taken from evidence (4 M ranks): a larger one in
/// a file is damage, not a job.
pub const MAX_RANK: u32 = (1 << 22) - 1;

/// The largest world size `whyslow hang` accepts (every rank up to
/// [`MAX_RANK`]).
pub const MAX_WORLD_SIZE: u32 = MAX_RANK + 1;

/// Runs of silent ranks up to this long are listed rank by rank in a
/// report; longer runs are one range (bounded output for any world size).
pub const LISTED_RUN: u32 = 16;

/// One frame of a stack, innermost first in a [`ThreadStack`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackFrame {
    /// Function.
    pub function: String,
    /// Source file, empty when unknown.
    #[serde(default)]
    pub file: String,
    /// Line, 0 when unknown.
    #[serde(default)]
    pub line: u32,
}

impl StackFrame {
    /// `function (file:line)`, or the function alone.
    pub fn label(&self) -> String {
        if self.file.is_empty() {
            self.function.clone()
        } else {
            format!("{} ({}:{})", self.function, self.file, self.line)
        }
    }
}

/// One thread's stack as a rank, an agent or a sampler saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadStack {
    /// Thread name (`main` for the Python main thread).
    pub thread: String,
    /// Frames, innermost first.
    pub frames: Vec<StackFrame>,
    /// Who read it: `python` (the rank itself), `agent` (the node agent,
    /// from outside the process), `flight-recorder` (the frames that issued
    /// a collective).
    pub source: String,
    /// When, Unix ns, when known.
    #[serde(default)]
    pub taken_at_ns: Option<u64>,
}

/// A process group as a rank knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    /// The group's name (PyTorch numbers them: `0` is the default group).
    pub name: String,
    /// Its description (`default_pg`, `tp`, `dp`, …), empty when unknown.
    #[serde(default)]
    pub desc: String,
    /// Member world ranks, when known.
    #[serde(default)]
    pub ranks: Option<Vec<u32>>,
}

/// Where a collective got to on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveState {
    /// Issued by the host; the device or transport has not started it.
    Scheduled,
    /// Started (NCCL: its kernel runs).
    Started,
    /// Finished.
    Completed,
}

/// One collective in a rank's Flight Recorder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedCollective {
    /// Process group name.
    pub group: String,
    /// Sequence number in the group (collective or point-to-point
    /// numbering, see `p2p`).
    pub seq: u64,
    /// Point-to-point (send/recv), numbered apart from collectives.
    #[serde(default)]
    pub p2p: bool,
    /// Operation, without the backend prefix (`all_reduce`, `all_gather`).
    pub op: String,
    /// Input tensor sizes.
    #[serde(default)]
    pub input_sizes: Vec<Vec<i64>>,
    /// Output tensor sizes.
    #[serde(default)]
    pub output_sizes: Vec<Vec<i64>>,
    /// Input dtypes.
    #[serde(default)]
    pub dtypes: Vec<String>,
    /// How far it got.
    pub state: CollectiveState,
    /// Issued, Unix ns.
    #[serde(default)]
    pub created_ns: Option<u64>,
    /// Python frames that issued it, innermost first.
    #[serde(default)]
    pub frames: Vec<StackFrame>,
    /// For point-to-point: the world rank it sends to or receives from
    /// (`nccl:send 0->3` names group ranks; the reader maps them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<u32>,
}

impl RecordedCollective {
    /// The first frame outside PyTorch: where the user's code issued it.
    pub fn call_site(&self) -> Option<&StackFrame> {
        self.frames
            .iter()
            .find(|f| !f.file.contains("/torch/") && !f.file.is_empty())
    }
}

/// A group's counters in a dump: the last collective the rank issued,
/// started and finished (`-1`/absent: none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupProgress {
    /// Process group name.
    pub group: String,
    /// Last issued collective's sequence number.
    pub last_enqueued: Option<u64>,
    /// Last started.
    pub last_started: Option<u64>,
    /// Last finished.
    pub last_completed: Option<u64>,
}

/// What one rank left: its Flight Recorder dump, its stacks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankEvidence {
    /// World rank.
    pub rank: u32,
    /// Files read for this rank.
    pub files: Vec<String>,
    /// The Flight Recorder format version, when a dump was read.
    pub fr_version: Option<String>,
    /// Groups the rank is a member of.
    pub groups: Vec<GroupInfo>,
    /// Per-group progress counters.
    pub progress: Vec<GroupProgress>,
    /// Its recorded collectives, oldest first.
    pub collectives: Vec<RecordedCollective>,
    /// Its threads' stacks.
    pub stacks: Vec<ThreadStack>,
    /// When its dump or stacks were taken, Unix ns.
    pub dumped_at_ns: Option<u64>,
    /// The process had exited when its evidence was gathered.
    #[serde(default)]
    pub exited: bool,
}

/// Everything `whyslow hang` reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HangEvidence {
    /// Per rank, ascending.
    pub ranks: Vec<RankEvidence>,
    /// The job's world size, when known.
    pub world_size: Option<u32>,
    /// Files skipped and why.
    pub notes: Vec<String>,
}

/// Why a culprit holds the others up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HangReason {
    /// It never issued the collective its peers wait in, and is in no
    /// other collective: it is still computing, sleeping or blocked outside
    /// communication.
    NeverReached,
    /// It issued a different collective than its peers at the same
    /// sequence number (another op, other sizes, another call site): its
    /// collectives no longer pair with theirs.
    Mismatch,
    /// Its process is gone.
    Exited,
    /// It left no dump and no stack: it could not answer (holding the GIL
    /// in native code, stopped, or gone without a trace).
    Unresponsive,
    /// It issued the collective but its device never started it (work
    /// queued before it does not finish).
    NotStarted,
    /// It waits in a cycle of groups that wait for each other.
    Deadlock,
    /// It left nothing at all (no dump, no stack, no record) while members
    /// of its groups wait for it: it could not answer (holding the GIL in
    /// native code, stopped) or its process is gone.
    NoDump,
}

impl HangReason {
    /// The JSON name.
    pub fn as_str(self) -> &'static str {
        match self {
            HangReason::NeverReached => "never_reached",
            HangReason::Mismatch => "mismatch",
            HangReason::Exited => "exited",
            HangReason::Unresponsive => "unresponsive",
            HangReason::NotStarted => "not_started",
            HangReason::Deadlock => "deadlock",
            HangReason::NoDump => "no_dump",
        }
    }
}

/// A rank the others wait for, at the root of the waiting chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Culprit {
    /// World rank.
    pub rank: u32,
    /// The group whose members wait for it.
    pub group: String,
    /// The group's description.
    pub group_desc: String,
    /// The group's members.
    pub group_ranks: Vec<u32>,
    /// The collective it did not enter or finish.
    pub op: String,
    /// Its sequence number in the group.
    pub seq: u64,
    /// Its input sizes (as the waiters issued it).
    pub sizes: Vec<Vec<i64>>,
    /// Why.
    pub reason: HangReason,
    /// What it did instead, in words.
    pub detail: String,
    /// Its main thread's stack, when one was read.
    pub stack: Option<ThreadStack>,
    /// Ranks that wait for it, directly or through others.
    pub waited_by: Vec<u32>,
    /// When this culprit stands for a run of ranks that left nothing
    /// (`rank..=last_rank`, a large job's silent ranks in one entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rank: Option<u32>,
}

/// A rank blocked in a collective, and whom it waits for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Waiting {
    /// World rank.
    pub rank: u32,
    /// The group it waits in.
    pub group: String,
    /// The group's description.
    #[serde(default)]
    pub group_desc: String,
    /// The collective.
    pub op: String,
    /// Its sequence number.
    pub seq: u64,
    /// The members it waits for directly (empty: the collective itself
    /// does not finish), runs of more than [`LISTED_RUN`] silent ranks
    /// apart in `waits_for_ranges`.
    pub waits_for: Vec<u32>,
    /// Runs of ranks that left nothing, `[first, last]`, that it waits for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits_for_ranges: Vec<[u32; 2]>,
    /// How long it had waited when its evidence was taken, seconds.
    pub waited_s: Option<f64>,
}

/// The verdict of `whyslow hang`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HangReport {
    /// [`HANG_REPORT_VERSION`].
    pub version: u32,
    /// Whether the job hangs.
    pub hang: bool,
    /// One line: who holds the job up, or why nothing is named.
    pub verdict: String,
    /// The roots of the waiting chains.
    pub culprits: Vec<Culprit>,
    /// Ranks blocked in collectives.
    pub waiting: Vec<Waiting>,
    /// Groups in flight that all members entered and that do not finish
    /// (the transport or a device, not a rank's program).
    pub stuck_groups: Vec<String>,
    /// Ranks read, with what.
    pub ranks: Vec<RankSummary>,
    /// The bound a pending collective must exceed to count as hung, s.
    pub min_wait_s: f64,
    /// What was skipped or could not be judged.
    pub notes: Vec<String>,
}

/// One rank's evidence, in a line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankSummary {
    /// World rank.
    pub rank: u32,
    /// Flight Recorder entries read.
    pub collectives: usize,
    /// Stacks read, by source.
    pub stack_sources: Vec<String>,
    /// Its process had exited.
    pub exited: bool,
    /// When this line stands for a run of ranks that left nothing
    /// (`rank..=last_rank`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rank: Option<u32>,
}
