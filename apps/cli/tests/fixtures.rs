//! Fingerprints of real traces from `tests/fixtures` (PerfTracker §4.2),
//! checked against `insta` snapshots in `tests/snapshots/`. After an intended
//! change: `cargo insta review` (or `INSTA_UPDATE=always cargo test -p whyslow
//! --test fixtures`, then review the diff).

mod common;
use common::fixtures;
use std::collections::BTreeMap;

use serde_json::{json, Value};
use whyslow_summarize::SummarizeOptions;

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

/// A stable digest of a fingerprint: the top functions with β and μ rounded.
fn digest(fp: &whyslow_model::Fingerprint) -> Value {
    let top: Vec<Value> = fp
        .functions
        .iter()
        .take(6)
        .map(|f| {
            json!({
                "kind": f.kind,
                "name": f.name.chars().rev().take(90).collect::<String>().chars().rev().collect::<String>(),
                "resource": f.resource,
                "beta": round(f.beta, 3),
                "mu": round(f.mu, 2),
                "util_source": f.util_source,
            })
        })
        .collect();
    json!({
        "worker": fp.worker,
        "window_ms": round(fp.window_us / 1e3, 1),
        "utilization_source": fp.utilization_source,
        "functions": fp.functions.len(),
        "top": top,
    })
}

fn check(fixture: &str, snapshot: &str) {
    let Some(dir) = fixtures() else { return };
    let trace = whyslow_ingest::read_kineto(&dir.join(fixture)).expect("fixture loads");
    let fp = whyslow_summarize::summarize(&trace, &BTreeMap::new(), &SummarizeOptions::default());

    // Invariants of Eq. 2–5 on real data.
    let total: f64 = fp.functions.iter().map(|f| f.beta).sum();
    assert!(total <= 1.0 + 1e-9, "Σβ = {total} > 1");
    for f in &fp.functions {
        assert!((0.0..=1.0).contains(&f.beta) && (0.0..=1.0).contains(&f.mu));
        assert!((0.0..=1.0).contains(&f.sigma));
    }
    // PerfTracker §4.2: ~30 KB for ~20 critical functions. Fingerprints keep up
    // to 100 functions (β ≥ 0.001, so peers' small values are known too): the
    // budget is per function.
    let size = serde_json::to_vec(&fp).unwrap().len();
    let budget = 30 * 1024 * fp.functions.len().max(20) / 20;
    assert!(
        size <= budget,
        "fingerprint is {size} bytes for {} functions",
        fp.functions.len()
    );

    insta::assert_json_snapshot!(snapshot, digest(&fp));
}

#[test]
fn a100_nccl_fingerprint() {
    check(
        "kineto/single/a100-nccl-rank0of2.json.gz",
        "a100-nccl-rank0of2",
    );
}

#[test]
fn b200_python_stacks_fingerprint() {
    check(
        "kineto/single/b200-eager-rank0of8.json.gz",
        "b200-eager-rank0of8",
    );
}

#[test]
fn amd_without_occupancy_fingerprint() {
    check("kineto/single/mi250-rocm.json.gz", "mi250-rocm");
}

#[test]
fn cpu_only_gloo_fingerprint() {
    check(
        "kineto/single/cpu-only-gloo-rank34of300.pt.trace.json.gz",
        "cpu-only-gloo-rank34of300",
    );
}

#[test]
fn hta_128_rank_job_rank1_fingerprint() {
    check(
        "kineto/hta-sampled-128rank/rank-1.json.gz",
        "hta-128rank-rank-1",
    );
}
