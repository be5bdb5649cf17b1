//! Shared test helpers.
#![allow(dead_code)]

use std::path::PathBuf;

use whyslow_model::{FunctionKind, WorkerTrace};

/// The repository's real-trace fixtures (`whyslow_testkit::fixtures`);
/// panics when absent.
pub fn fixtures() -> Option<PathBuf> {
    Some(whyslow_testkit::fixtures())
}

/// Executions per kind.
pub fn count(t: &WorkerTrace, kind: FunctionKind) -> usize {
    t.executions
        .iter()
        .filter(|e| t.functions.get(e.function).kind == kind)
        .count()
}
