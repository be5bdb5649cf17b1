//! Hardware utilization sample files: CSV with a header row and the columns
//! `resource,ts_us,value` plus an optional `worker`. `resource` is one of
//! `sm`, `cpu`, `nvlink`, `nic`, `pcie`, `dram`; `ts_us` is on the trace's
//! clock (µs, as in the trace); `value` is a utilization in [0, 1]. Rows need
//! not be sorted: each series is sorted by time after reading.

use std::collections::BTreeMap;
use std::path::Path;

use whyslow_model::{Resource, SampleSeries};

use crate::error::{ErrorKind, IngestError, Location};
use crate::generic::csv_err;
use crate::open::open;

/// Points of one worker, per resource, as read.
type Points = BTreeMap<Resource, Vec<(i64, f32)>>;

/// One worker's sample series.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkerSamples {
    /// The rank from the `worker` column; `None` when the file has none (it
    /// then applies to the worker whose rank is in the file name).
    pub worker: Option<u32>,
    /// One series per resource, sorted by time.
    pub series: BTreeMap<Resource, SampleSeries>,
}

/// Reads a samples file that holds one worker (or no `worker` column).
/// A file with several workers is an error: use [`read_samples_all`].
pub fn read_samples(path: &Path) -> Result<WorkerSamples, IngestError> {
    let mut all = read_samples_all(path)?;
    match all.len() {
        0 => Ok(WorkerSamples::default()),
        1 => Ok(all.remove(0)),
        n => Err(IngestError::new(
            path,
            Location::File,
            ErrorKind::Content,
            format!(
                "samples for {n} workers in one file: expected one worker (use read_samples_all)"
            ),
        )),
    }
}

/// Reads a samples file, one [`WorkerSamples`] per distinct `worker` value
/// (ascending), or a single one with `worker: None` without that column.
pub fn read_samples_all(path: &Path) -> Result<Vec<WorkerSamples>, IngestError> {
    let (r, _) = open(path)?;
    let mut rdr = crate::generic::csv_reader(r);
    let headers = rdr.headers().map_err(|e| csv_err(path, &e))?.clone();
    let col = |n: &str| headers.iter().position(|h| h.eq_ignore_ascii_case(n));
    let need = |n: &str| {
        col(n).ok_or_else(|| {
            IngestError::new(
                path,
                Location::Line(1),
                ErrorKind::Content,
                format!("missing column {n:?}: expected a header resource,ts_us,value[,worker]"),
            )
        })
    };
    let (cr, ct, cv) = (need("resource")?, need("ts_us")?, need("value")?);
    let cw = col("worker");
    let mut by_worker: BTreeMap<Option<u32>, Points> = BTreeMap::new();
    let mut rec = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(csv_err(path, &e)),
        }
        if rec.iter().all(|f| f.is_empty()) {
            continue;
        }
        let line = rec.position().map_or(0, |p| p.line());
        let bad =
            |msg: String| IngestError::new(path, Location::Line(line), ErrorKind::Content, msg);
        let field = |i: usize| rec.get(i).unwrap_or("");
        let res: Resource = field(cr)
            .to_ascii_lowercase()
            .parse()
            .map_err(|e: whyslow_model::ModelError| bad(e.to_string()))?;
        let ts: f64 = field(ct).parse().map_err(|_| {
            bad(format!(
                "ts_us = {:?}: expected a number of microseconds",
                field(ct)
            ))
        })?;
        let ns = (ts * 1000.0).round();
        if !ns.is_finite() || ns.abs() > 9.0e18 {
            return Err(bad(format!("ts_us = {:?}: out of range", field(ct))));
        }
        let value: f32 = match field(cv).parse::<f32>() {
            Ok(v) if (0.0..=1.0).contains(&v) => v,
            _ => {
                return Err(bad(format!(
                    "value = {:?}: expected a utilization in [0, 1]",
                    field(cv)
                )))
            }
        };
        let worker = match cw.map(field) {
            None | Some("") => None,
            Some(w) => Some(
                w.parse::<u32>()
                    .map_err(|_| bad(format!("worker = {w:?}: expected a rank (integer)")))?,
            ),
        };
        by_worker
            .entry(worker)
            .or_default()
            .entry(res)
            .or_default()
            .push((ns as i64, value));
    }
    Ok(by_worker
        .into_iter()
        .map(|(worker, series)| WorkerSamples {
            worker,
            series: series
                .into_iter()
                .map(|(r, mut v)| {
                    v.sort_by_key(|p| p.0);
                    let (ts_ns, values) = v.into_iter().unzip();
                    (r, SampleSeries { ts_ns, values })
                })
                .collect(),
        })
        .collect())
}
