//! Collective operations as the tracers record them (SysOM-AI §3.2): one
//! record per rank and collective call, whatever the framework or transport
//! (gloo uprobes, the NCCL profiler plugin, NCCL entry-point uprobes).

use serde::{Deserialize, Serialize};

/// One rank's part in one collective.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CollectiveRecord {
    /// Rank within the communication group.
    pub rank: u32,
    /// Rank in the job (world).
    #[serde(default)]
    pub global_rank: Option<u32>,
    /// Communication group (process group name, NCCL comm hash).
    pub group: String,
    /// Operation (`allreduce`, `allgather`, `send`, …).
    pub op: String,
    /// The collective's sequence number in its group, when the source has
    /// one; instances are matched by (group, op, sequence), else by overlap
    /// in time.
    #[serde(default)]
    pub seq: Option<u64>,
    /// Entry (host-side call, or the start of execution), ns on this rank's
    /// clock.
    pub entry_ns: u64,
    /// Exit (completion), ns on this rank's clock.
    pub exit_ns: u64,
    /// Bytes of the collective's payload on this rank.
    #[serde(default)]
    pub bytes: u64,
    /// What recorded it (`gloo-uprobe`, `nccl-plugin`, …).
    #[serde(default)]
    pub source: String,
    /// Entered and not finished when it was written (`exit_ns` is then the
    /// time it was seen still open): what a hang leaves (`whyslow hang`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open: bool,
}
