//! One worker's classified function executions, as the inputs stage produces them.

use rustc_hash::FxHashMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ModelError;

/// The five classes of functions of PerfTracker §4.2, in critical-path priority
/// order (Figure 9): GPU compute > memory > communication > Python. Other CPU
/// ops are the lowest class: they are on the critical path only when none of the
/// others runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FunctionKind {
    /// A GPU computation kernel (GEMM, elementwise, attention, …).
    GpuKernel,
    /// A memory operation: device memcpy/memset, host-side allocation and pinning.
    Memory,
    /// Collective or point-to-point communication (NCCL kernels, gloo, send/recv).
    Comm,
    /// A Python function, identified by its whole call stack.
    Python,
    /// Any other CPU operator (aten ops, CUDA runtime calls, user annotations).
    CpuOp,
}

impl FunctionKind {
    /// All kinds, highest critical-path priority first.
    pub const ALL: [FunctionKind; 5] = [
        FunctionKind::GpuKernel,
        FunctionKind::Memory,
        FunctionKind::Comm,
        FunctionKind::Python,
        FunctionKind::CpuOp,
    ];

    /// Critical-path priority, 0 = highest (PerfTracker §4.2, Figure 9).
    pub fn priority(self) -> u8 {
        self as u8
    }

    /// The snake_case name used in files and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FunctionKind::GpuKernel => "gpu_kernel",
            FunctionKind::Memory => "memory",
            FunctionKind::Comm => "comm",
            FunctionKind::Python => "python",
            FunctionKind::CpuOp => "cpu_op",
        }
    }
}

impl fmt::Display for FunctionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FunctionKind {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FunctionKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s.trim())
            .ok_or_else(|| ModelError::UnknownKind(s.to_string()))
    }
}

/// The hardware resource whose utilization governs a function (PerfTracker §4.2:
/// GPU kernels → SM, Python → CPU of the training thread, intra-host collectives
/// → NVLink, inter-host collectives → GPU–NIC, memory ops → PCIe/DRAM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resource {
    /// GPU streaming-multiprocessor activity.
    Sm,
    /// CPU time of the training thread.
    Cpu,
    /// NVLink throughput (intra-host collectives).
    Nvlink,
    /// NIC / GPU–NIC throughput (inter-host collectives).
    Nic,
    /// PCIe throughput (host↔device copies).
    Pcie,
    /// Device memory (DRAM/HBM) bandwidth.
    Dram,
}

impl Resource {
    /// All resources.
    pub const ALL: [Resource; 6] = [
        Resource::Sm,
        Resource::Cpu,
        Resource::Nvlink,
        Resource::Nic,
        Resource::Pcie,
        Resource::Dram,
    ];

    /// The snake_case name used in files and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Resource::Sm => "sm",
            Resource::Cpu => "cpu",
            Resource::Nvlink => "nvlink",
            Resource::Nic => "nic",
            Resource::Pcie => "pcie",
            Resource::Dram => "dram",
        }
    }

    /// A label for reports ("SM activity", "NIC throughput", …).
    pub fn label(self) -> &'static str {
        match self {
            Resource::Sm => "SM activity",
            Resource::Cpu => "CPU",
            Resource::Nvlink => "NVLink",
            Resource::Nic => "NIC",
            Resource::Pcie => "PCIe",
            Resource::Dram => "DRAM",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Resource {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Resource::ALL
            .into_iter()
            .find(|r| r.as_str() == s.trim())
            .ok_or_else(|| ModelError::UnknownResource(s.to_string()))
    }
}

/// Index of a function in a [`FunctionTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FunctionId(pub u32);

/// What whyslow knows of one function.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionInfo {
    /// The function's identity. For Python functions the whole call stack,
    /// outermost frame first, frames joined by `;` (PerfTracker §4.2: the same
    /// function only if the entire call stack is identical). Otherwise the
    /// kernel or operator name.
    pub name: String,
    /// Its class.
    pub kind: FunctionKind,
    /// The resource that governs it.
    pub resource: Resource,
}

/// A kind's place in [`FunctionKind::ALL`].
fn kind_slot(kind: FunctionKind) -> usize {
    match kind {
        FunctionKind::GpuKernel => 0,
        FunctionKind::Memory => 1,
        FunctionKind::Comm => 2,
        FunctionKind::Python => 3,
        FunctionKind::CpuOp => 4,
    }
}

/// Interned functions of one worker, so that executions carry a 4-byte id.
#[derive(Debug, Clone, Default)]
pub struct FunctionTable {
    infos: Vec<FunctionInfo>,
    /// Per kind (in [`FunctionKind::ALL`]'s order), name → id: looked up by
    /// `&str` without building a key, hashed with Fx (Python names are whole
    /// call stacks, hundreds of bytes; SipHash over them showed in profiles).
    index: [FxHashMap<String, FunctionId>; 5],
}

impl FunctionTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of (kind, name), adding it with `resource` if new.
    pub fn intern(&mut self, kind: FunctionKind, name: &str, resource: Resource) -> FunctionId {
        let index = &mut self.index[kind_slot(kind)];
        if let Some(id) = index.get(name) {
            return *id;
        }
        let id = FunctionId(self.infos.len() as u32);
        self.infos.push(FunctionInfo {
            name: name.to_string(),
            kind,
            resource,
        });
        index.insert(name.to_string(), id);
        id
    }

    /// The id of (kind, name), if interned.
    pub fn find(&self, kind: FunctionKind, name: &str) -> Option<FunctionId> {
        self.index[kind_slot(kind)].get(name).copied()
    }

    /// The function behind `id`.
    pub fn get(&self, id: FunctionId) -> &FunctionInfo {
        &self.infos[id.0 as usize]
    }

    /// Number of distinct functions.
    pub fn len(&self) -> usize {
        self.infos.len()
    }

    /// True when no function was interned.
    pub fn is_empty(&self) -> bool {
        self.infos.is_empty()
    }

    /// All functions with their ids.
    pub fn iter(&self) -> impl Iterator<Item = (FunctionId, &FunctionInfo)> {
        self.infos
            .iter()
            .enumerate()
            .map(|(i, f)| (FunctionId(i as u32), f))
    }
}

/// Marker for "the trace carries no utilization for this execution".
pub const UNKNOWN_UTIL: f32 = f32::NAN;

/// One execution of a function on one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Execution {
    /// Which function ran.
    pub function: FunctionId,
    /// Start, in nanoseconds on the trace's clock.
    pub start_ns: i64,
    /// End (exclusive), in nanoseconds on the trace's clock; `end_ns >= start_ns`.
    pub end_ns: i64,
    /// The CPU thread (for Python and CPU ops) or GPU stream lane it ran on.
    /// CPU-side nesting (a Python function's children) is derived from time
    /// containment on the same thread.
    pub thread: u32,
    /// Utilization of the governing resource that the trace itself carries
    /// (kernel occupancy, memcpy bandwidth / peak, collective bus bandwidth /
    /// peak), in [0, 1]; [`UNKNOWN_UTIL`] (NaN) when the trace has none.
    pub trace_util: f32,
}

impl Execution {
    /// Duration in nanoseconds.
    pub fn dur_ns(&self) -> i64 {
        self.end_ns - self.start_ns
    }
}

/// How the worker's rank was determined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RankSource {
    /// From the trace's `distributedInfo.rank` (or the generic file's `worker` column).
    Trace,
    /// From the file name (`rank-N`, `rankN`).
    FileName,
    /// From the position of the file among the inputs (a guess; warned about).
    FileOrder,
}

/// Identity of a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerMeta {
    /// Global rank.
    pub rank: u32,
    /// Host name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Group of workers expected to behave alike (e.g. a pipeline stage), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Where the rank came from.
    pub rank_source: RankSource,
    /// The input file(s) this worker was read from.
    pub source: String,
    /// Number of workers in the job, when the trace says
    /// (Kineto `distributedInfo.world_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
}

/// One worker's trace after ingestion and classification.
#[derive(Debug, Clone)]
pub struct WorkerTrace {
    /// Who this is.
    pub meta: WorkerMeta,
    /// Functions referenced by `executions`.
    pub functions: FunctionTable,
    /// All executions, in no particular order.
    pub executions: Vec<Execution>,
    /// The training thread: Python counts on the critical path only there
    /// (PerfTracker §4.2). `None` when it could not be determined.
    pub training_thread: Option<u32>,
    /// `ProfilerStep#N` spans as (step number, start_ns, end_ns), in time order.
    pub steps: Vec<(u64, i64, i64)>,
    /// The traced span (start_ns, end_ns).
    pub span: (i64, i64),
    /// Device name (e.g. "NVIDIA A100-SXM4-80GB"), when the trace says.
    pub device: Option<String>,
    /// The collective backend (`nccl`, `gloo`; Kineto
    /// `distributedInfo.backend`), when the trace says.
    pub backend: Option<String>,
    /// Non-fatal problems met while reading (format drift, guesses).
    pub warnings: Vec<String>,
    /// The input ended before the data did (a killed job, a cut copy): only
    /// what came before the cut was kept.
    pub truncated: bool,
}

impl WorkerTrace {
    /// An empty trace for `meta`.
    pub fn new(meta: WorkerMeta) -> Self {
        WorkerTrace {
            meta,
            functions: FunctionTable::new(),
            executions: Vec::new(),
            training_thread: None,
            steps: Vec::new(),
            span: (0, 0),
            device: None,
            backend: None,
            warnings: Vec::new(),
            truncated: false,
        }
    }
}

/// A hardware utilization series for one resource (the samples file of the
/// analyze command; PerfTracker §4.1 samples at 10 kHz).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SampleSeries {
    /// Sample times in nanoseconds on the trace's clock, ascending.
    pub ts_ns: Vec<i64>,
    /// Utilization in [0, 1], one per timestamp.
    pub values: Vec<f32>,
}
