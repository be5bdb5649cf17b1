//! Generic event files for profilers other than Kineto: CSV (header row
//! required) or JSON Lines, optionally gzip-compressed.
//!
//! Columns (CSV header names / JSONL keys): `worker`, `name`, `kind`,
//! `start_us`, `dur_us`, and optionally `thread`, `stack`, `host`, `group`,
//! `util`.
//! - `kind`: one of `gpu_kernel`, `memory`, `comm`, `python`, `cpu_op`.
//! - `stack`: a Python call stack, outermost frame first, frames joined by
//!   `;`. For `python` rows the function is the stack when given, else `name`.
//! - `util`: the utilization the profiler measured for this execution, in [0, 1].
//! - `worker`: the rank (an integer); one [`WorkerTrace`] per worker value. A
//!   non-integer worker is numbered by first appearance (with a warning).
//!
//! Resources by kind: python, cpu_op → CPU; gpu_kernel → SM; memory → PCIe;
//! comm → NIC.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use serde::Deserialize;
use whyslow_model::{
    Execution, FunctionKind, RankSource, Resource, WorkerMeta, WorkerTrace, UNKNOWN_UTIL,
};

use crate::error::{ErrorKind, IngestError, Location};
use crate::open::{base_name, open};

/// Reads a generic CSV/JSONL event file into one trace per worker, by rank.
pub fn read_generic(path: &Path) -> Result<Vec<WorkerTrace>, IngestError> {
    let (r, _) = open(path)?;
    let name = base_name(path);
    if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        return read_jsonl(r, path);
    }
    if name.ends_with(".csv") {
        return read_csv(r, path);
    }
    // Unknown extension: sniff.
    let mut br = BufReader::new(r);
    let head = br
        .fill_buf()
        .map_err(|e| IngestError::io(path, "cannot read", &e))?;
    let first = head.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first == Some(b'{') {
        read_jsonl(br, path)
    } else {
        read_csv(br, path)
    }
}

/// The resource a generic row of `kind` is governed by.
pub fn resource_of_kind(kind: FunctionKind) -> Resource {
    match kind {
        FunctionKind::Python | FunctionKind::CpuOp => Resource::Cpu,
        FunctionKind::GpuKernel => Resource::Sm,
        FunctionKind::Memory => Resource::Pcie,
        FunctionKind::Comm => Resource::Nic,
    }
}

struct Row {
    worker: String,
    name: String,
    kind: String,
    start_us: String,
    dur_us: String,
    thread: Option<String>,
    stack: Option<String>,
    host: Option<String>,
    group: Option<String>,
    util: Option<String>,
}

#[derive(Default)]
struct Worker {
    trace: Option<WorkerTrace>,
    lanes: BTreeMap<String, u32>,
    busy: Vec<i128>,
}

struct Collector<'p> {
    path: &'p Path,
    workers: BTreeMap<String, Worker>,
}

fn err(path: &Path, line: u64, kind: ErrorKind, msg: impl Into<String>) -> IngestError {
    IngestError::new(path, Location::Line(line), kind, msg)
}

fn num_us_to_ns(path: &Path, line: u64, col: &str, v: &str) -> Result<i64, IngestError> {
    let f: f64 = v.trim().parse().map_err(|_| {
        err(
            path,
            line,
            ErrorKind::Content,
            format!("{col} = {v:?}: expected a number of microseconds"),
        )
    })?;
    let ns = (f * 1000.0).round();
    if !ns.is_finite() || ns.abs() > 9.0e18 {
        return Err(err(
            path,
            line,
            ErrorKind::Content,
            format!("{col} = {v:?}: out of range"),
        ));
    }
    Ok(ns as i64)
}

impl Collector<'_> {
    fn add(&mut self, line: u64, row: Row) -> Result<(), IngestError> {
        let p = self.path;
        let kind: FunctionKind = row.kind.parse().map_err(|e: whyslow_model::ModelError| {
            err(p, line, ErrorKind::Content, e.to_string())
        })?;
        let start = num_us_to_ns(p, line, "start_us", &row.start_us)?;
        let dur = num_us_to_ns(p, line, "dur_us", &row.dur_us)?;
        if dur < 0 {
            return Err(err(
                p,
                line,
                ErrorKind::Content,
                format!("dur_us = {}: expected a duration ≥ 0", row.dur_us),
            ));
        }
        let util = match row.util.as_deref().map(str::trim) {
            None | Some("") => UNKNOWN_UTIL,
            Some(u) => match u.parse::<f32>() {
                Ok(v) if (0.0..=1.0).contains(&v) => v,
                _ => {
                    return Err(err(
                        p,
                        line,
                        ErrorKind::Content,
                        format!("util = {u:?}: expected a utilization in [0, 1]"),
                    ))
                }
            },
        };
        let worker_key = row.worker.trim().to_string();
        if worker_key.is_empty() {
            return Err(err(
                p,
                line,
                ErrorKind::Content,
                "empty worker: expected a rank",
            ));
        }
        let stack = row
            .stack
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty());
        let fname = match (kind, stack) {
            (FunctionKind::Python, Some(s)) => s.to_string(),
            _ => row.name.trim().to_string(),
        };
        if fname.is_empty() {
            return Err(err(
                p,
                line,
                ErrorKind::Content,
                "empty name: expected a function name",
            ));
        }
        let w = self.workers.entry(worker_key.clone()).or_default();
        let t = w.trace.get_or_insert_with(|| {
            let (rank, src) = match worker_key.parse::<u32>() {
                Ok(r) => (r, RankSource::Trace),
                Err(_) => (u32::MAX, RankSource::FileOrder),
            };
            WorkerTrace::new(WorkerMeta {
                rank,
                host: None,
                group: None,
                rank_source: src,
                source: p.display().to_string(),
                world_size: None,
            })
        });
        if t.meta.host.is_none() {
            t.meta.host = row
                .host
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty());
        }
        if t.meta.group.is_none() {
            t.meta.group = row
                .group
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty());
        }
        let thread = row.thread.map(|s| s.trim().to_string()).unwrap_or_default();
        let next = w.lanes.len() as u32;
        let lane = *w.lanes.entry(thread).or_insert(next);
        if lane as usize >= w.busy.len() {
            w.busy.resize(lane as usize + 1, 0);
        }
        if matches!(kind, FunctionKind::Python | FunctionKind::CpuOp) {
            w.busy[lane as usize] += i128::from(dur);
        }
        let f = t.functions.intern(kind, &fname, resource_of_kind(kind));
        let end = start.saturating_add(dur);
        t.executions.push(Execution {
            function: f,
            start_ns: start,
            end_ns: end,
            thread: lane,
            trace_util: util,
        });
        t.span = if t.executions.len() == 1 {
            (start, end)
        } else {
            (t.span.0.min(start), t.span.1.max(end))
        };
        Ok(())
    }

    fn finish(self) -> Vec<WorkerTrace> {
        let mut out = Vec::new();
        for (key, w) in self.workers {
            let Some(mut t) = w.trace else { continue };
            t.training_thread = w
                .busy
                .iter()
                .enumerate()
                .max_by_key(|(i, b)| (**b, std::cmp::Reverse(*i)))
                .map(|(i, _)| i as u32);
            out.push((key, t));
        }
        let (keys, mut out): (Vec<String>, Vec<WorkerTrace>) = out.into_iter().unzip();
        let path = self.path;
        crate::number_unranked(&mut out, |i, next| {
            format!(
                "{}: worker {:?} is not an integer rank; numbered {next}",
                path.display(),
                keys[i]
            )
        });
        out.sort_by_key(|t| t.meta.rank);
        out
    }
}

fn read_csv<R: Read>(r: R, path: &Path) -> Result<Vec<WorkerTrace>, IngestError> {
    let mut rdr = csv_reader(r);
    let headers = rdr.headers().map_err(|e| csv_err(path, &e))?.clone();
    let col = |n: &str| headers.iter().position(|h| h.eq_ignore_ascii_case(n));
    let need = |n: &str| {
        col(n).ok_or_else(|| {
            err(
                path,
                1,
                ErrorKind::Content,
                format!(
                    "missing column {n:?}: expected a header with worker,name,kind,start_us,dur_us"
                ),
            )
        })
    };
    let (cw, cn, ck, cs, cd) = (
        need("worker")?,
        need("name")?,
        need("kind")?,
        need("start_us")?,
        need("dur_us")?,
    );
    let (ct, cst, ch, cg, cu) = (
        col("thread"),
        col("stack"),
        col("host"),
        col("group"),
        col("util"),
    );
    let mut c = Collector {
        path,
        workers: BTreeMap::new(),
    };
    let mut rec = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(csv_err(path, &e)),
        }
        let line = rec.position().map_or(0, |p| p.line());
        let get = |i: usize| rec.get(i).unwrap_or("").to_string();
        let opt = |i: Option<usize>| i.and_then(|i| rec.get(i)).map(str::to_string);
        if rec.iter().all(|f| f.is_empty()) {
            continue;
        }
        c.add(
            line,
            Row {
                worker: get(cw),
                name: get(cn),
                kind: get(ck),
                start_us: get(cs),
                dur_us: get(cd),
                thread: opt(ct),
                stack: opt(cst),
                host: opt(ch),
                group: opt(cg),
                util: opt(cu),
            },
        )?;
    }
    Ok(c.finish())
}

/// The CSV reader every whyslow CSV input uses: a header row, trimmed fields,
/// rows that may be shorter than the header (optional trailing columns).
pub(crate) fn csv_reader<R: Read>(r: R) -> csv::Reader<R> {
    csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(r)
}

pub(crate) fn csv_err(path: &Path, e: &csv::Error) -> IngestError {
    let line = e.position().map_or(0, |p| p.line());
    let kind = if matches!(e.kind(), csv::ErrorKind::Io(_)) {
        ErrorKind::Io
    } else {
        ErrorKind::Syntax
    };
    let loc = if line > 0 {
        Location::Line(line)
    } else {
        Location::File
    };
    IngestError::new(path, loc, kind, format!("invalid CSV: {e}"))
}

/// A JSONL row: any scalar type for every field.
#[derive(Deserialize, Default)]
#[serde(default)]
struct JsonRow {
    worker: Scalar,
    name: Scalar,
    kind: Scalar,
    start_us: Scalar,
    dur_us: Scalar,
    thread: Scalar,
    stack: Scalar,
    host: Scalar,
    group: Scalar,
    util: Scalar,
}

/// A JSON scalar as text (`None` for null/absent).
#[derive(Default)]
struct Scalar(Option<String>);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(Scalar(match v {
            serde_json::Value::Null => None,
            serde_json::Value::String(s) => Some(s),
            serde_json::Value::Number(n) => Some(n.to_string()),
            serde_json::Value::Bool(b) => Some(b.to_string()),
            other => Some(other.to_string()),
        }))
    }
}

fn read_jsonl<R: Read>(r: R, path: &Path) -> Result<Vec<WorkerTrace>, IngestError> {
    let mut c = Collector {
        path,
        workers: BTreeMap::new(),
    };
    let mut br = BufReader::new(r);
    let mut buf = Vec::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        let n = br.read_until(b'\n', &mut buf).map_err(|e| {
            IngestError::new(
                path,
                Location::Line(line + 1),
                ErrorKind::Io,
                format!("read error: {e}"),
            )
        })?;
        if n == 0 {
            break;
        }
        line += 1;
        if buf.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let row: JsonRow = serde_json::from_slice(&buf).map_err(|e| {
            let mut m = e.to_string();
            if let Some(i) = m.rfind(" at line ") {
                m.truncate(i);
            }
            err(
                path,
                line,
                ErrorKind::Syntax,
                format!("expected a JSON object per line: {m}"),
            )
        })?;
        let req = |s: Scalar, n: &str| {
            s.0.ok_or_else(|| err(path, line, ErrorKind::Content, format!("missing {n:?}")))
        };
        c.add(
            line,
            Row {
                worker: req(row.worker, "worker")?,
                name: row.name.0.unwrap_or_default(),
                kind: req(row.kind, "kind")?,
                start_us: req(row.start_us, "start_us")?,
                dur_us: req(row.dur_us, "dur_us")?,
                thread: row.thread.0,
                stack: row.stack.0,
                host: row.host.0,
                group: row.group.0,
                util: row.util.0,
            },
        )?;
    }
    Ok(c.finish())
}
