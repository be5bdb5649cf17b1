//! whyslow's inputs stage: profiler traces and companion files → the shared
//! model ([`whyslow_model`]).
//!
//! - [`read_kineto`]: PyTorch profiler (Kineto) traces, `.json`/`.json.gz`,
//!   streamed in bounded memory and classified into PerfTracker §4.2's five
//!   function kinds (rules in [`kineto`]).
//! - [`read_generic`]: CSV/JSONL event files for other profilers.
//! - [`read_samples`]: hardware utilization sample series.
//! - [`read_fingerprint`] / [`write_fingerprint`]: per-worker fingerprints.
//! - [`discover`] and [`read_traces`]: directories in, traces out, in parallel.
#![deny(missing_docs)]

mod error;
mod fingerprint;
pub mod generic;
pub mod kineto;
mod open;
pub mod peaks;
mod samples;
pub mod source;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use whyslow_model::{RankSource, WorkerTrace};

pub use error::{ErrorKind, IngestError, Location};
pub use fingerprint::{parse_fingerprint, read_fingerprint, write_fingerprint};
pub use generic::read_generic;
pub use kineto::{
    read_kineto, read_kineto_base_time_ns, read_kineto_from_reader, read_kineto_from_reader_with,
    read_kineto_with,
};
pub use samples::{read_samples, read_samples_all, WorkerSamples};

/// Options for reading inputs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReadOptions {
    /// Fail on anything that would otherwise be skipped with a warning
    /// (malformed events, truncated files).
    pub strict: bool,
}

/// The rank a file name carries: `rank-N`, `rank_N` or `rankN` (any case),
/// in the file name itself or else in its parent directory names.
pub fn rank_from_file_name(path: &Path) -> Option<u32> {
    for comp in path.components().rev() {
        let s = comp.as_os_str().to_string_lossy().to_ascii_lowercase();
        let bytes = s.as_bytes();
        let mut i = 0;
        while let Some(off) = s[i..].find("rank") {
            let mut j = i + off + 4;
            if j < bytes.len() && (bytes[j] == b'-' || bytes[j] == b'_') {
                j += 1;
            }
            let k = bytes[j..].iter().take_while(|b| b.is_ascii_digit()).count();
            if k > 0 {
                if let Ok(n) = s[j..j + k].parse::<u32>() {
                    return Some(n);
                }
            }
            i += off + 4;
        }
    }
    None
}

/// An input file, classified.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum InputFile {
    /// A Kineto trace (`*.json`, `*.json.gz`, `*.pt.trace.json(.gz)`).
    Kineto(PathBuf),
    /// A generic event file (`*.csv`, `*.jsonl`, optionally `.gz`).
    Generic(PathBuf),
    /// A samples file (`*.samples.csv`, optionally `.gz`).
    Samples(PathBuf),
    /// A fingerprint (`*.fingerprint.json`, or a `.json` that is one).
    Fingerprint(PathBuf),
}

impl InputFile {
    /// The file's path.
    pub fn path(&self) -> &Path {
        match self {
            InputFile::Kineto(p)
            | InputFile::Generic(p)
            | InputFile::Samples(p)
            | InputFile::Fingerprint(p) => p,
        }
    }
}

/// Classifies a file by name (and, for `.json`, by a peek at its start);
/// `None` for files whyslow does not read.
pub fn classify(path: &Path) -> Option<InputFile> {
    let name = open::base_name(path);
    let p = path.to_path_buf();
    if name.ends_with(".fingerprint.json") {
        Some(InputFile::Fingerprint(p))
    } else if name.ends_with(".samples.csv") {
        Some(InputFile::Samples(p))
    } else if name.ends_with(".json") {
        if looks_like_fingerprint(path) {
            Some(InputFile::Fingerprint(p))
        } else {
            Some(InputFile::Kineto(p))
        }
    } else if name.ends_with(".csv") || name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        Some(InputFile::Generic(p))
    } else {
        None
    }
}

/// True when the first KiB of the (decompressed) file names the fingerprint format.
fn looks_like_fingerprint(path: &Path) -> bool {
    let Ok((r, _)) = open::open(path) else {
        return false;
    };
    let mut head = Vec::with_capacity(1024);
    if r.take(1024).read_to_end(&mut head).is_err() {
        return false;
    }
    let head = String::from_utf8_lossy(&head);
    head.contains(whyslow_model::FINGERPRINT_FORMAT) && head.contains("\"format\"")
}

/// Expands directories (recursively, in name order) and classifies files.
/// Files of other kinds inside directories are ignored; a file named
/// explicitly that matches no pattern is taken as a Kineto trace. A path that
/// does not exist is an error.
pub fn discover(paths: &[PathBuf]) -> Result<Vec<InputFile>, IngestError> {
    let mut out = Vec::new();
    for p in paths {
        let md = std::fs::metadata(p).map_err(|e| IngestError::io(p, "cannot access", &e))?;
        if md.is_dir() {
            walk(p, &mut out)?;
        } else {
            out.push(classify(p).unwrap_or_else(|| InputFile::Kineto(p.clone())));
        }
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|f| seen.insert(f.path().to_path_buf()));
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<InputFile>) -> Result<(), IngestError> {
    let rd = std::fs::read_dir(dir).map_err(|e| IngestError::io(dir, "cannot list", &e))?;
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for p in entries {
        // Follows symlinks; unreadable entries are skipped.
        match std::fs::metadata(&p) {
            Ok(md) if md.is_dir() => walk(&p, out)?,
            Ok(_) => out.extend(classify(&p)),
            Err(_) => {}
        }
    }
    Ok(())
}

fn read_one(path: &Path) -> Result<Vec<WorkerTrace>, IngestError> {
    match classify(path) {
        Some(InputFile::Generic(p)) => read_generic(&p),
        Some(InputFile::Samples(_)) => Err(IngestError::new(
            path,
            Location::File,
            ErrorKind::Content,
            "a samples file: expected a trace file",
        )),
        Some(InputFile::Fingerprint(_)) => Err(IngestError::new(
            path,
            Location::File,
            ErrorKind::Content,
            "a fingerprint file: expected a trace file",
        )),
        Some(InputFile::Kineto(p)) => read_kineto(&p).map(|t| vec![t]),
        None => read_kineto(path).map(|t| vec![t]),
    }
}

/// Reads trace files (Kineto or generic) in parallel (rayon), calling
/// `progress(n_done)` as each file finishes. Never panics: a bad file becomes
/// an error in the second list, next to the good traces.
///
/// Ranks: `distributedInfo.rank` (or the generic `worker` column) > the file
/// name (`rank-N`, `rankN`, `rank_N`) > file order: traces with neither get
/// the smallest ranks no other trace has, in the order of `files`, with a
/// warning. Traces are returned by rank; a rank held by several traces is
/// warned about on each of them.
pub fn read_traces(
    files: &[PathBuf],
    progress: &(dyn Fn(usize) + Sync),
) -> (Vec<WorkerTrace>, Vec<IngestError>) {
    let done = AtomicUsize::new(0);
    let results: Vec<Result<Vec<WorkerTrace>, IngestError>> = files
        .par_iter()
        .map(|p| {
            let r = std::panic::catch_unwind(|| read_one(p)).unwrap_or_else(|_| {
                Err(IngestError::new(
                    p,
                    Location::File,
                    ErrorKind::Content,
                    "internal error while reading (please report): file skipped",
                ))
            });
            let n = done.fetch_add(1, Ordering::Relaxed) + 1;
            progress(n);
            r
        })
        .collect();
    let mut traces = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(ts) => traces.extend(ts),
            Err(e) => errors.push(e),
        }
    }
    assign_ranks(&mut traces);
    (traces, errors)
}

/// Gives file-order ranks to traces without one, and warns about duplicates.
fn assign_ranks(traces: &mut [WorkerTrace]) {
    let sources: Vec<String> = traces.iter().map(|t| t.meta.source.clone()).collect();
    number_unranked(traces, |i, next| {
        format!(
            "{}: rank {next} assigned from file order (no rank in the trace or file name)",
            sources[i]
        )
    });
    let mut count: std::collections::BTreeMap<u32, usize> = Default::default();
    for t in traces.iter() {
        *count.entry(t.meta.rank).or_default() += 1;
    }
    for t in traces.iter_mut() {
        if count[&t.meta.rank] > 1 {
            t.warnings.push(format!(
                "rank {} is held by {} input traces",
                t.meta.rank, count[&t.meta.rank]
            ));
        }
    }
    traces.sort_by_key(|t| t.meta.rank);
}

/// Gives each trace without a rank ([`RankSource::FileOrder`]), in order,
/// the smallest rank no other trace holds, with the warning `why(index, rank)`.
pub(crate) fn number_unranked(traces: &mut [WorkerTrace], why: impl Fn(usize, u32) -> String) {
    let mut used: std::collections::BTreeSet<u32> = traces
        .iter()
        .filter(|t| t.meta.rank_source != RankSource::FileOrder)
        .map(|t| t.meta.rank)
        .collect();
    let mut next = 0u32;
    for (i, t) in traces.iter_mut().enumerate() {
        if t.meta.rank_source == RankSource::FileOrder {
            while used.contains(&next) {
                next += 1;
            }
            t.meta.rank = next;
            used.insert(next);
            t.warnings.push(why(i, next));
        }
    }
}

/// Reads the one worker's trace in `path` (a Kineto trace, or a generic
/// events file holding a single worker): what `summarize` takes. An error
/// names the file when it holds no worker or several.
pub fn read_worker_trace(path: &Path) -> Result<WorkerTrace, IngestError> {
    let mut traces = match classify(path).unwrap_or_else(|| InputFile::Kineto(path.to_path_buf())) {
        InputFile::Kineto(p) => vec![read_kineto(&p)?],
        InputFile::Generic(p) => read_generic(&p)?,
        other => {
            return Err(IngestError::new(
                path,
                Location::File,
                ErrorKind::Content,
                format!(
                "not a trace (expected Kineto JSON[.gz] or a generic events file), found {other:?}"
            ),
            ))
        }
    };
    match traces.len() {
        1 => Ok(traces.remove(0)),
        0 => Err(IngestError::new(
            path,
            Location::File,
            ErrorKind::Content,
            "no worker in this file",
        )),
        n => Err(IngestError::new(
            path,
            Location::File,
            ErrorKind::Content,
            format!("holds {n} workers; one worker's trace was expected (`analyze` takes several)"),
        )),
    }
}
