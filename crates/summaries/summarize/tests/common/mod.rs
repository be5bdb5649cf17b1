//! Shared helpers for the summarize tests: hand-built traces and a seeded RNG.
#![allow(dead_code)]

use whyslow_model::{
    Execution, FunctionId, FunctionKind, RankSource, Resource, WorkerMeta, WorkerTrace,
    UNKNOWN_UTIL,
};

/// A tiny deterministic RNG (SplitMix64).
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

pub fn meta(rank: u32) -> WorkerMeta {
    WorkerMeta {
        rank,
        host: Some("node-0".into()),
        group: None,
        rank_source: RankSource::Trace,
        source: format!("rank-{rank}.json"),
        world_size: None,
    }
}

/// A trace under construction: `f(kind, name)` interns, `x(...)` adds an execution.
pub struct Builder {
    pub trace: WorkerTrace,
}

impl Builder {
    pub fn new(span: (i64, i64)) -> Self {
        let mut trace = WorkerTrace::new(meta(0));
        trace.span = span;
        trace.training_thread = Some(1);
        Builder { trace }
    }

    pub fn f(&mut self, kind: FunctionKind, name: &str) -> FunctionId {
        let r = match kind {
            FunctionKind::GpuKernel => Resource::Sm,
            FunctionKind::Memory => Resource::Pcie,
            FunctionKind::Comm => Resource::Nvlink,
            FunctionKind::Python | FunctionKind::CpuOp => Resource::Cpu,
        };
        self.trace.functions.intern(kind, name, r)
    }

    /// Adds an execution; returns its index.
    pub fn x(&mut self, f: FunctionId, start: i64, end: i64, thread: u32) -> usize {
        self.xu(f, start, end, thread, UNKNOWN_UTIL)
    }

    pub fn xu(&mut self, f: FunctionId, start: i64, end: i64, thread: u32, util: f32) -> usize {
        self.trace.executions.push(Execution {
            function: f,
            start_ns: start,
            end_ns: end,
            thread,
            trace_util: util,
        });
        self.trace.executions.len() - 1
    }
}
