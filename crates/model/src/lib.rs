//! The data model every whyslow stage shares, free of I/O.
//!
//! Data flows through whyslow in four stages, and this crate holds the types
//! that pass between them:
//!
//! 1. **inputs** (`whyslow-ingest`) turn profiler traces into a [`WorkerTrace`]:
//!    one worker's function [`Execution`]s, already classified by [`FunctionKind`];
//!    hardware sample files become [`SampleSeries`].
//! 2. **summaries** (`whyslow-summarize`) reduce a [`WorkerTrace`] to a
//!    [`Fingerprint`]: one [`FunctionPattern`] P = (β, μ, σ) per function on the
//!    critical path (PerfTracker §4.2).
//! 3. **analysis** (`whyslow-localize`) compares the fingerprints of all workers
//!    and produces a [`Report`] of abnormal (function, workers) [`Finding`]s
//!    (PerfTracker §4.3).
//! 4. **outputs** (`whyslow-report`) render a [`Report`] for terminals, scripts
//!    (JSON) and browsers (HTML).
#![deny(missing_docs)]

pub mod collective;
pub mod diagnosis;
mod fingerprint;
pub mod fix;
pub mod flow;
pub mod hang;
pub mod os;
pub mod python_frame;
mod report;
pub mod rng;
pub mod stack;
pub mod stats;
pub mod time;
pub mod topology;
mod trace;
pub mod wire;

pub use fingerprint::{
    function_hash, Fingerprint, FunctionPattern, JobIdentity, KernelTotal, UtilizationSource,
    FINGERPRINT_FORMAT, FINGERPRINT_VERSION, MAX_KERNELS,
};
pub use report::{
    Consequence, Finding, IterationSeries, IterationSource, IterationTimes, Onset, Reason,
    Relation, Report, Stat, Verdict, WorkerPoint, REPORT_VERSION,
};
pub use trace::{
    Execution, FunctionId, FunctionInfo, FunctionKind, FunctionTable, RankSource, Resource,
    SampleSeries, WorkerMeta, WorkerTrace, UNKNOWN_UTIL,
};

/// Error for values that do not parse into a model type.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A function kind string that is none of the five kinds.
    #[error(
        "unknown function kind {0:?}: expected one of gpu_kernel, memory, comm, python, cpu_op"
    )]
    UnknownKind(String),
    /// A resource name that whyslow does not know.
    #[error("unknown resource {0:?}: expected one of sm, cpu, nvlink, nic, pcie, dram")]
    UnknownResource(String),
}
