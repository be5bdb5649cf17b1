//! The NCCL fallback tracer (SysOM-AI §3.2): uprobes on NCCL's exported
//! collective calls (`bpf/nccl.bpf.c`), for GPU jobs whose NCCL does not
//! load whyslow's profiler plugin (`apps/nccl-plugin`, which sees the GPU
//! side). What the probes see is the host side: when a rank called into
//! NCCL to enqueue a collective and when the call returned (NCCL returns
//! before the kernel runs). A rank late to call is late here too; a rank
//! whose GPU is slow is not.
//!
//! Groups and sequence numbers: a communicator is an address in a process,
//! so a group is named by the order in which the process first used it
//! (`job/nccl#0`: the first communicator, the default process group's on
//! every rank, PyTorch creating communicators in the same order on all
//! ranks), and its calls are numbered from the first one traced: NCCL
//! requires every rank to issue a communicator's collectives in the same
//! order, so the numbers agree when the tracer attached before the job's
//! first collective — which the agent does, attaching when the process maps
//! libnccl (at `import torch`), long before `init_process_group`. Host-side
//! calls are too short to match by overlap in time. Point-to-point calls
//! (send/recv) are recorded without a number.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use whyslow_model::collective::CollectiveRecord;

use crate::tracer::Uprobes;
use crate::{symbols::defined_functions, TraceError, TracerStats};

/// The compiled program (`bpf/nccl.bpf.c`, built by `scripts/build-bpf`).
pub static NCCL_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/nccl.bpf.o");

/// NCCL's traced entry points and whyslow's names for them, in the order of
/// the program's operation numbers (`OP_*` in `bpf/nccl.bpf.c`).
pub const NCCL_OPS: [(&str, &str); 7] = [
    ("ncclAllReduce", "allreduce"),
    ("ncclBroadcast", "broadcast"),
    ("ncclReduce", "reduce"),
    ("ncclAllGather", "allgather"),
    ("ncclReduceScatter", "reduce_scatter"),
    ("ncclSend", "send"),
    ("ncclRecv", "recv"),
];

/// One NCCL call as the probes saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclEvent {
    /// Process.
    pub pid: u32,
    /// Thread that called.
    pub tid: u32,
    /// Operation index in [`NCCL_OPS`].
    pub op: usize,
    /// The call's `ncclResult_t` (0: success).
    pub result: i32,
    /// The communicator's address in the process.
    pub comm: u64,
    /// Elements.
    pub count: u64,
    /// `ncclDataType_t`.
    pub datatype: i32,
    /// Peer rank of a send/recv (−1 for collectives).
    pub peer: i32,
    /// Entry, ns of CLOCK_MONOTONIC.
    pub entry_ns: u64,
    /// Return, ns of CLOCK_MONOTONIC.
    pub exit_ns: u64,
}

impl NcclEvent {
    /// Decodes one ring-buffer record (`struct event` of the program).
    pub fn parse(b: &[u8]) -> Option<NcclEvent> {
        if b.len() < 56 {
            return None;
        }
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().unwrap());
        let op = u32_at(8) as usize;
        (op < NCCL_OPS.len()).then(|| NcclEvent {
            pid: u32_at(0),
            tid: u32_at(4),
            op,
            result: u32_at(12) as i32,
            comm: u64_at(16),
            count: u64_at(24),
            datatype: u32_at(32) as i32,
            peer: u32_at(36) as i32,
            entry_ns: u64_at(40),
            exit_ns: u64_at(48),
        })
    }

    /// Payload bytes: the count times the size of `ncclDataType_t`'s
    /// element (0 for a datatype not known).
    pub fn bytes(&self) -> u64 {
        let size = match self.datatype {
            0 | 1 | 10 | 11 => 1, // int8, uint8, fp8 e4m3, fp8 e5m2
            6 | 9 => 2,           // float16, bfloat16
            2 | 3 | 7 => 4,       // int32, uint32, float32
            4 | 5 | 8 => 8,       // int64, uint64, float64
            _ => 0,
        };
        self.count.saturating_mul(size)
    }
}

/// The libnccl `pid` mapped, by its path as seen from here.
pub fn nccl_library(pid: u32) -> Option<PathBuf> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let path = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            p.starts_with('/') && p.rsplit('/').next().unwrap_or("").starts_with("libnccl.so")
        })?;
    let in_ns = PathBuf::from(format!("/proc/{pid}/root{path}"));
    Some(if in_ns.exists() {
        in_ns
    } else {
        PathBuf::from(path)
    })
}

/// The traced entry points `path` exports: (operation index, file offset).
pub fn nccl_functions(path: &Path) -> Result<Vec<(usize, u64)>, TraceError> {
    let found = defined_functions(path, false, |name| {
        NCCL_OPS.iter().position(|(s, _)| *s == name)
    })?;
    Ok(found.into_iter().map(|(op, _, off)| (op, off)).collect())
}

/// NCCL's calls of chosen processes, traced with uprobes.
pub struct NcclTracer {
    probes: Uprobes,
}

impl NcclTracer {
    /// Loads the program (no probe attached yet).
    pub fn open() -> Result<Self, TraceError> {
        let names: Vec<&str> = NCCL_OPS.iter().map(|(symbol, _)| *symbol).collect();
        Ok(NcclTracer {
            probes: Uprobes::open(NCCL_OBJECT, &names)?,
        })
    }

    /// Traces `pid`'s calls into `library` (its libnccl:
    /// [`nccl_library`]). Returns how many entry points were found there.
    pub fn attach(&mut self, pid: u32, library: &Path) -> Result<usize, TraceError> {
        if let Some(n) = self.probes.attached(pid) {
            return Ok(n);
        }
        let functions: Vec<(&str, String, u64)> = nccl_functions(library)?
            .into_iter()
            .map(|(op, offset)| (NCCL_OPS[op].0, NCCL_OPS[op].0.to_string(), offset))
            .collect();
        self.probes.attach(pid, library, &functions)
    }

    /// Stops tracing `pid`.
    pub fn detach(&mut self, pid: u32) {
        self.probes.detach(pid)
    }

    /// The events written so far, waiting up to `timeout` for the first.
    pub fn poll(&mut self, timeout: Duration) -> Vec<NcclEvent> {
        self.probes.poll(timeout, NcclEvent::parse)
    }

    /// The program's counters (`read_errors`: ncclReduce communicators
    /// that could not be read from the stack).
    pub fn stats(&self) -> Result<TracerStats, TraceError> {
        self.probes.stats()
    }
}

/// From NCCL events to collective records (pure; see the module docs for
/// the naming and numbering).
#[derive(Debug, Default)]
pub struct NcclSequencer {
    /// (pid, comm) → (group name, calls so far).
    comms: HashMap<(u32, u64), (String, u64)>,
    /// pid → communicators seen.
    per_process: HashMap<u32, u32>,
    clock_offset_ns: i64,
}

impl NcclSequencer {
    /// Records on CLOCK_MONOTONIC + `offset_ns` (the Unix clock with
    /// CLOCK_REALTIME − CLOCK_MONOTONIC, as [`crate::Sequencer`]).
    pub fn with_clock_offset(offset_ns: i64) -> Self {
        NcclSequencer {
            clock_offset_ns: offset_ns,
            ..Self::default()
        }
    }

    /// The record of `e` for a process of job `job` with world rank
    /// `global_rank`; events in each process's order of entry. `None` for a
    /// call NCCL refused (a result other than success) or one with no
    /// communicator.
    pub fn record(
        &mut self,
        e: &NcclEvent,
        job: &str,
        global_rank: Option<u32>,
    ) -> Option<CollectiveRecord> {
        if e.result != 0 || e.comm == 0 {
            return None;
        }
        let n = self.per_process.entry(e.pid).or_insert(0);
        let (group, calls) = self.comms.entry((e.pid, e.comm)).or_insert_with(|| {
            let g = format!("{job}/nccl#{n}");
            *n += 1;
            (g, 0)
        });
        let p2p = e.peer >= 0;
        let seq = (!p2p).then_some(*calls);
        if !p2p {
            *calls += 1;
        }
        Some(CollectiveRecord {
            // The rank in the communicator is NCCL's to know; the world rank
            // tells the ranks apart within the group.
            rank: global_rank.unwrap_or(e.pid),
            global_rank,
            group: group.clone(),
            op: NCCL_OPS[e.op].1.to_string(),
            seq,
            entry_ns: e.entry_ns.saturating_add_signed(self.clock_offset_ns),
            exit_ns: e.exit_ns.saturating_add_signed(self.clock_offset_ns),
            bytes: e.bytes(),
            source: "nccl-uprobe".into(),
            open: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(pid: u32, comm: u64, op: usize, peer: i32, result: i32) -> NcclEvent {
        NcclEvent {
            pid,
            tid: pid,
            op,
            result,
            comm,
            count: 1000,
            datatype: 7,
            peer,
            entry_ns: 10,
            exit_ns: 20,
        }
    }

    #[test]
    fn groups_are_named_and_calls_numbered_alike_on_every_rank() {
        let mut s = NcclSequencer::with_clock_offset(1_000);
        // Two ranks, two communicators each at different addresses, used in
        // the same order: same names and numbers.
        let mut got = Vec::new();
        for (pid, base) in [(1, 0x1000), (2, 0x9000)] {
            for (comm, op) in [(base, 0), (base, 0), (base + 8, 3), (base, 4)] {
                let r = s
                    .record(&event(pid, comm, op, -1, 0), "job", Some(pid))
                    .unwrap();
                got.push((pid, r.group, r.op, r.seq));
            }
        }
        let names = |p: u32| -> Vec<(String, String, Option<u64>)> {
            got.iter()
                .filter(|g| g.0 == p)
                .map(|g| (g.1.clone(), g.2.clone(), g.3))
                .collect()
        };
        assert_eq!(names(1), names(2));
        assert_eq!(
            names(1),
            vec![
                ("job/nccl#0".into(), "allreduce".into(), Some(0)),
                ("job/nccl#0".into(), "allreduce".into(), Some(1)),
                ("job/nccl#1".into(), "allgather".into(), Some(0)),
                ("job/nccl#0".into(), "reduce_scatter".into(), Some(2)),
            ]
        );
        let r = s
            .record(&event(1, 0x1000, 5, 3, 0), "job", Some(1))
            .unwrap();
        assert_eq!((r.op.as_str(), r.seq, r.bytes), ("send", None, 4000));
        assert_eq!(
            (r.entry_ns, r.exit_ns, r.source.as_str()),
            (1_010, 1_020, "nccl-uprobe")
        );
        // A refused call is no collective.
        assert!(s
            .record(&event(1, 0x1000, 0, -1, 4), "job", Some(1))
            .is_none());
    }

    #[test]
    fn events_parse_from_the_programs_layout() {
        let mut b = vec![0u8; 56];
        b[0..4].copy_from_slice(&7u32.to_ne_bytes());
        b[8..12].copy_from_slice(&4u32.to_ne_bytes());
        b[12..16].copy_from_slice(&(-3i32).to_ne_bytes());
        b[16..24].copy_from_slice(&0xabcu64.to_ne_bytes());
        b[24..32].copy_from_slice(&10u64.to_ne_bytes());
        b[32..36].copy_from_slice(&9i32.to_ne_bytes());
        b[36..40].copy_from_slice(&(-1i32).to_ne_bytes());
        let e = NcclEvent::parse(&b).unwrap();
        assert_eq!(
            (e.pid, e.op, e.result, e.comm, e.count),
            (7, 4, -3, 0xabc, 10)
        );
        assert_eq!(e.bytes(), 20);
        assert!(NcclEvent::parse(&b[..40]).is_none());
        b[8..12].copy_from_slice(&99u32.to_ne_bytes());
        assert!(NcclEvent::parse(&b).is_none());
    }
}
