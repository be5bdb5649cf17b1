//! From NCCL profiler events to collective records (SysOM-AI §3.2), pure:
//! no FFI, no clock, no file.
//!
//! NCCL (profiler API v4) reports a collective as a `Coll` event, started
//! when the rank's host thread enqueues it and stopped when the enqueue is
//! done, and one `KernelCh` event per GPU channel that ran it, with the
//! GPU's global timer at the channel's start (in the event) and at its end
//! (in the `KernelChStop` state). A collective is complete when its `Coll`
//! event stopped and every channel stopped. Its record's entry is the GPU
//! side's start (the earliest channel start), its exit the latest channel
//! end: what a late rank delays is when its kernel starts. Without channel
//! events (NCCL built without them, or none activated) the host's enqueue
//! and stop times stand in.
//!
//! GPU timer → Unix clock: the offset is the least (host Unix time −
//! GPU time) seen when a channel's end is reported. The host learns of the
//! end after it happened, so each such difference over-estimates the offset
//! by the report's latency; the least of them is the closest.

use whyslow_model::collective::CollectiveRecord;

/// A communicator as NCCL's `init` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comm {
    /// NCCL's communicator hash: equal on every rank of the communicator.
    pub hash: u64,
    /// The user's name for it (may be empty).
    pub name: String,
    /// This rank in the communicator.
    pub rank: u32,
    /// Ranks in the communicator.
    pub nranks: u32,
    /// This process's rank in the job (`RANK`), when known.
    pub global_rank: Option<u32>,
}

impl Comm {
    /// The group name of its records: `nccl-<hash>`, the same on every rank.
    pub fn group(&self) -> String {
        format!("nccl-{:016x}", self.hash)
    }
}

/// One collective in flight.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// NCCL's sequence number of the collective in its communicator (none
    /// for point-to-point calls: those match by overlap in time).
    pub seq: Option<u64>,
    /// Operation, as whyslow names them (`allreduce`, `reduce_scatter`, …).
    pub op: String,
    /// Payload bytes on this rank.
    pub bytes: u64,
    /// Host Unix time of the `Coll` event's start and stop, ns.
    pub host_start_ns: u64,
    host_stop_ns: Option<u64>,
    gpu_start: Option<u64>,
    gpu_end: Option<u64>,
    open_channels: u32,
}

impl Pending {
    /// A collective whose `Coll` event started at `host_start_ns`.
    pub fn new(
        seq: Option<u64>,
        func: &str,
        count: u64,
        datatype: &str,
        host_start_ns: u64,
    ) -> Self {
        Pending {
            seq,
            op: op_name(func),
            bytes: count.saturating_mul(datatype_bytes(datatype)),
            host_start_ns,
            host_stop_ns: None,
            gpu_start: None,
            gpu_end: None,
            open_channels: 0,
        }
    }

    /// A channel started at GPU time `gpu_ns`.
    pub fn channel_started(&mut self, gpu_ns: u64) {
        self.open_channels += 1;
        if gpu_ns > 0 {
            self.gpu_start = Some(self.gpu_start.map_or(gpu_ns, |t| t.min(gpu_ns)));
        }
    }

    /// A channel ended at GPU time `gpu_ns` (0 when NCCL gave none).
    pub fn channel_stopped(&mut self, gpu_ns: u64) {
        self.open_channels = self.open_channels.saturating_sub(1);
        if gpu_ns > 0 {
            self.gpu_end = Some(self.gpu_end.map_or(gpu_ns, |t| t.max(gpu_ns)));
        }
    }

    /// The `Coll` event stopped at host time `host_ns`.
    pub fn stopped(&mut self, host_ns: u64) {
        self.host_stop_ns = Some(host_ns);
    }

    /// Whether the collective is complete: its event and all its channels
    /// stopped.
    pub fn done(&self) -> bool {
        self.host_stop_ns.is_some() && self.open_channels == 0
    }

    /// Its record, GPU times moved to the Unix clock by `gpu_offset_ns`
    /// (Unix − GPU) when known.
    pub fn record(&self, comm: &Comm, gpu_offset_ns: Option<i128>) -> CollectiveRecord {
        let unix = |gpu: Option<u64>| -> Option<u64> {
            let t = gpu? as i128 + gpu_offset_ns?;
            u64::try_from(t).ok()
        };
        let (entry, exit, source) = match (unix(self.gpu_start), unix(self.gpu_end)) {
            (Some(a), Some(b)) if b >= a => (a, b, "nccl-plugin-gpu"),
            _ => (
                self.host_start_ns,
                self.host_stop_ns
                    .unwrap_or(self.host_start_ns)
                    .max(self.host_start_ns),
                "nccl-plugin-host",
            ),
        };
        CollectiveRecord {
            rank: comm.rank,
            global_rank: comm.global_rank,
            group: comm.group(),
            op: self.op.clone(),
            seq: self.seq,
            entry_ns: entry,
            exit_ns: exit,
            bytes: self.bytes,
            source: source.into(),
            open: false,
        }
    }
}

/// The GPU → Unix clock offset (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuClock {
    offset_ns: Option<i128>,
}

impl GpuClock {
    /// A channel end at GPU time `gpu_ns` was reported at Unix time
    /// `host_ns`.
    pub fn observe(&mut self, gpu_ns: u64, host_ns: u64) {
        if gpu_ns == 0 {
            return;
        }
        let d = host_ns as i128 - gpu_ns as i128;
        self.offset_ns = Some(self.offset_ns.map_or(d, |o| o.min(d)));
    }

    /// Unix − GPU, ns, once a channel end was seen.
    pub fn offset_ns(&self) -> Option<i128> {
        self.offset_ns
    }
}

/// NCCL's function name (`AllReduce`, `ReduceScatter`, …) as whyslow names
/// operations: lower case, words joined by `_` (`allreduce`,
/// `reduce_scatter`, `allgather`, `alltoall`, `send`, `recv`).
pub fn op_name(func: &str) -> String {
    match func {
        "AllReduce" => "allreduce".into(),
        "AllGather" => "allgather".into(),
        "AlltoAll" => "alltoall".into(),
        "ReduceScatter" => "reduce_scatter".into(),
        "SendRecv" => "sendrecv".into(),
        other => other.to_ascii_lowercase(),
    }
}

/// Bytes per element of an NCCL datatype name (`ncclFloat32` …); 1 for a
/// name not known (the count is then bytes' stand-in).
pub fn datatype_bytes(datatype: &str) -> u64 {
    match datatype.trim_start_matches("nccl") {
        "Int8" | "Uint8" | "Char" | "Float8e4m3" | "Float8e5m2" => 1,
        "Float16" | "Half" | "Bfloat16" => 2,
        "Int32" | "Int" | "Uint32" | "Float32" | "Float" => 4,
        "Int64" | "Uint64" | "Float64" | "Double" => 8,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comm() -> Comm {
        Comm {
            hash: 0xabc,
            name: "dp".into(),
            rank: 3,
            nranks: 8,
            global_rank: Some(11),
        }
    }

    #[test]
    fn gpu_times_make_the_record_once_every_channel_ended() {
        let mut clock = GpuClock::default();
        let mut p = Pending::new(Some(7), "AllReduce", 1 << 20, "ncclFloat32", 1_000);
        for (start, end) in [(5_000, 9_000), (5_200, 9_500)] {
            p.channel_started(start);
            assert!(!p.done());
            p.channel_stopped(end);
            // Reported 40 ns and 25 ns late on a host clock 1e9 ahead.
            clock.observe(
                end,
                1_000_000_000 + end + if end == 9_000 { 40 } else { 25 },
            );
        }
        assert!(!p.done(), "the Coll event has not stopped");
        p.stopped(2_000);
        assert!(p.done());
        let r = p.record(&comm(), clock.offset_ns());
        assert_eq!(r.group, "nccl-0000000000000abc");
        assert_eq!((r.rank, r.global_rank, r.seq), (3, Some(11), Some(7)));
        assert_eq!(r.op, "allreduce");
        assert_eq!(r.bytes, 4 << 20);
        assert_eq!(r.source, "nccl-plugin-gpu");
        assert_eq!(r.entry_ns, 1_000_000_025 + 5_000);
        assert_eq!(r.exit_ns, 1_000_000_025 + 9_500);
    }

    #[test]
    fn without_channel_times_the_host_times_stand_in() {
        let mut p = Pending::new(Some(1), "ReduceScatter", 10, "ncclBfloat16", 100);
        p.stopped(250);
        assert!(p.done());
        let r = p.record(&comm(), None);
        assert_eq!(
            (r.entry_ns, r.exit_ns, r.bytes, r.op.as_str()),
            (100, 250, 20, "reduce_scatter")
        );
        assert_eq!(r.source, "nccl-plugin-host");
        // Channels that ended with no timer: host times too.
        let mut q = Pending::new(None, "Broadcast", 1, "ncclInt8", 100);
        q.channel_started(0);
        q.channel_stopped(0);
        q.stopped(300);
        assert_eq!(q.record(&comm(), Some(5)).source, "nccl-plugin-host");
    }

    #[test]
    fn names_and_sizes() {
        for (f, o) in [
            ("AllGather", "allgather"),
            ("AlltoAll", "alltoall"),
            ("Send", "send"),
            ("Recv", "recv"),
            ("Broadcast", "broadcast"),
        ] {
            assert_eq!(op_name(f), o);
        }
        assert_eq!(datatype_bytes("ncclFloat64"), 8);
        assert_eq!(datatype_bytes("ncclFloat8e5m2"), 1);
        assert_eq!(datatype_bytes("mystery"), 1);
    }
}
