//! Shared helpers for the summarize tests: hand-built traces and a seeded RNG.
#![allow(dead_code)]

use whyslow_model::{
    Execution, FunctionId, FunctionKind, RankSource, Resource, WorkerMeta, WorkerTrace,
    UNKNOWN_UTIL,
};

/// The tests' deterministic generator.
pub use whyslow_model::rng::SplitMix64 as Rng;

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
