//! The flagged spans as a Chrome trace-event file that Perfetto
//! (<https://ui.perfetto.dev>, "Open trace file") and `chrome://tracing`
//! open: per worker one process, a track of its `ProfilerStep`s and one track
//! per finding with the executions of the flagged function and of the
//! functions folded under it (the collective the peers wait in). Flagged
//! workers and a few unflagged peers are included, so the slow spans sit
//! next to healthy ones on the same time axis.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};
use whyslow_model::{FunctionKind, Relation, Report, WorkerTrace};

use crate::format::{function_title, short_frame};

/// Flagged workers kept per finding, at most.
const MAX_FLAGGED: usize = 8;
/// Unflagged peers kept per finding, at most.
const MAX_PEERS: usize = 2;
/// Spans kept per track, at most (the file stays small enough to open).
const MAX_SPANS: usize = 20_000;

/// Renders the Chrome trace-event JSON of the report's findings over
/// `traces` (the traces the report was computed from; workers not among them
/// are left out). Times are the traces' own, in microseconds.
pub fn render_perfetto(report: &Report, traces: &[WorkerTrace]) -> String {
    let by_rank: BTreeMap<u32, &WorkerTrace> = traces.iter().map(|t| (t.meta.rank, t)).collect();
    // Which workers to show, and whether each is flagged in some finding.
    let mut shown: BTreeMap<u32, BTreeSet<usize>> = BTreeMap::new();
    for (i, f) in report.findings.iter().enumerate() {
        for w in f
            .workers
            .iter()
            .filter(|w| by_rank.contains_key(w))
            .take(MAX_FLAGGED)
        {
            shown.entry(*w).or_default().insert(i + 1);
        }
        let peers = f
            .points
            .iter()
            .filter(|p| !p.flagged && by_rank.contains_key(&p.worker))
            .take(MAX_PEERS);
        for p in peers {
            shown.entry(p.worker).or_default();
        }
    }

    let mut events: Vec<Value> = Vec::new();
    let mut truncated = false;
    for (&rank, flagged_in) in &shown {
        let t = by_rank[&rank];
        let role = if flagged_in.is_empty() {
            "peer".to_string()
        } else {
            let ids: Vec<String> = flagged_in.iter().map(|i| format!("#{i}")).collect();
            format!("flagged in {}", ids.join(", "))
        };
        events.push(json!({"ph": "M", "name": "process_name", "pid": rank,
            "args": {"name": format!("worker {rank} ({role})")}}));
        events.push(json!({"ph": "M", "name": "process_sort_index", "pid": rank,
            "args": {"sort_index": rank}}));
        events.push(
            json!({"ph": "M", "name": "thread_name", "pid": rank, "tid": 0,
            "args": {"name": "ProfilerStep"}}),
        );
        for &(step, start, end) in t.steps.iter().take(MAX_SPANS) {
            events.push(span(
                &format!("ProfilerStep#{step}"),
                rank,
                0,
                start,
                end,
                json!({}),
            ));
        }
        for (i, f) in report.findings.iter().enumerate() {
            let tid = i + 1;
            events.push(
                json!({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                "args": {"name": format!("#{tid} {}", function_title(f, 80))}}),
            );
            let mut wanted = vec![(f.kind, f.function.as_str(), "flagged function")];
            wanted.extend(
                f.consequences
                    .iter()
                    .map(|c| (c.kind, c.function.as_str(), relation(c.relation))),
            );
            let mut n = 0usize;
            for (kind, name, role) in wanted {
                let Some(id) = t.functions.find(kind, name) else {
                    continue;
                };
                let label = if kind == FunctionKind::Python {
                    short_frame(name.rsplit(';').next().unwrap_or(name))
                } else {
                    name.to_string()
                };
                for e in t.executions.iter().filter(|e| e.function == id) {
                    if n == MAX_SPANS {
                        truncated = true;
                        break;
                    }
                    n += 1;
                    events.push(span(
                        &label,
                        rank,
                        tid,
                        e.start_ns,
                        e.end_ns,
                        json!({"finding": tid, "role": role, "kind": kind.to_string()}),
                    ));
                }
            }
        }
    }
    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "whyslow",
            "verdict": crate::verdict_line(report),
            "truncated": truncated,
        },
    });
    doc.to_string()
}

fn span(name: &str, pid: u32, tid: usize, start_ns: i64, end_ns: i64, args: Value) -> Value {
    json!({
        "ph": "X",
        "name": name,
        "pid": pid,
        "tid": tid,
        "ts": start_ns as f64 / 1e3,
        "dur": (end_ns - start_ns).max(0) as f64 / 1e3,
        "args": args,
    })
}

fn relation(r: Relation) -> &'static str {
    match r {
        Relation::WaitsFor => "waits for the flagged workers",
        Relation::AlsoSlower => "also slower on the flagged workers",
    }
}
