//! Shared test helpers.
#![allow(dead_code)]

use std::path::PathBuf;

use whyslow_model::{FunctionKind, WorkerTrace};

/// The shared fixtures directory, or `None` (with a printed note) when absent.
pub fn fixtures() -> Option<PathBuf> {
    let dir = std::env::var_os("WHYSLOW_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../shared/fixtures")
        });
    if dir.join("kineto").is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIPPED: fixtures not found at {} (set WHYSLOW_FIXTURES)",
            dir.display()
        );
        None
    }
}

/// Executions per kind.
pub fn count(t: &WorkerTrace, kind: FunctionKind) -> usize {
    t.executions
        .iter()
        .filter(|e| t.functions.get(e.function).kind == kind)
        .count()
}
