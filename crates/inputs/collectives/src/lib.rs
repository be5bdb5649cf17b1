//! Collective tracing (SysOM-AI §3.2): each rank's entry into and exit from
//! its collectives, the input of slow-rank detection
//! (`whyslow_diagnose::stragglers`).
//!
//! [`GlooTracer`] puts eBPF uprobes on the entry and return of gloo's
//! collective functions (`gloo::allreduce`, `allgather`, `broadcast`, …) in
//! the library that holds them (PyTorch's `libtorch_cpu.so`): no change to
//! the job, no ptrace, and nothing in the training process but the probes'
//! breakpoints (a few µs per collective call). Each call comes back as a
//! [`GlooEvent`]; a [`Sequencer`] (pure) turns events into
//! [`CollectiveRecord`]s: the group is the gloo context the call ran in,
//! named alike on every rank, and the sequence number counts a rank's calls
//! of that operation in that group, so instances match across ranks.
//!
//! What the probes see is gloo's own execution on ProcessGroupGloo's worker
//! thread: for an asynchronous collective (DDP's gradient buckets) entry is
//! when the work started, not when Python asked for it, which is what a late
//! rank delays. Point-to-point send/recv (pipeline stages) of gloo are not
//! traced. [`nccl`] traces NCCL's exported calls the same way (the host
//! side; the GPU side comes from the NCCL profiler plugin).

#![deny(missing_docs)]

pub mod nccl;
mod sequence;
mod symbols;
mod tracer;

pub use sequence::Sequencer;
pub use symbols::{gloo_functions, gloo_library, GlooFunction};
pub use tracer::{GlooEvent, GlooTracer, TracerStats};

/// Why tracing could not start or read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Loading or verifying the program failed.
    #[error(
        "loading the BPF program: {0} (needs root or CAP_BPF + CAP_PERFMON, and a kernel with BPF)"
    )]
    Load(String),
    /// Attaching a probe failed.
    #[error("attaching to {function} in {path}: {reason}")]
    Attach {
        /// The function.
        function: String,
        /// The library.
        path: String,
        /// What the kernel said.
        reason: String,
    },
    /// A library could not be read as ELF.
    #[error("reading {path}: {reason}")]
    Library {
        /// The library.
        path: String,
        /// Why.
        reason: String,
    },
    /// A map could not be read or written.
    #[error("BPF map {0}: {1}")]
    Map(&'static str, String),
}

/// The collective operations traced, in the order of the BPF program's
/// operation numbers (`OP_*` in `bpf/gloo.bpf.c`).
pub const OPS: [&str; 10] = [
    "allreduce",
    "allgather",
    "allgatherv",
    "broadcast",
    "reduce",
    "barrier",
    "gather",
    "scatter",
    "alltoall",
    "alltoallv",
];

pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
