//! The trace-level sibling of [`crate::analyze_job`]: a job's files in,
//! the report out — what `whyslow analyze` and the Python package's
//! `whyslow.analyze` both call. Reads every worker's trace (Kineto, generic
//! events), hardware samples and fingerprints under the given paths, checks
//! the traces are one job ([`crate::check_traces`]), fingerprints each
//! worker (PerfTracker §4.2) and judges them under the policy.
//!
//! An unreadable input is a warning (the rest is judged), or under
//! `strict` the refusal.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use whyslow_ingest::{InputFile, WorkerSamples};
use whyslow_model::{Fingerprint, Report, Resource, SampleSeries, WorkerTrace};
use whyslow_summarize::SummarizeOptions;

use crate::{analyze_job, check_traces, iterations_from_traces, JobEvidence, JobPolicy, Refusal};

/// How to read the inputs.
#[derive(Debug, Clone, Default)]
pub struct InputOptions {
    /// Restrict each window to these `ProfilerStep`s (inclusive).
    pub steps: Option<(u64, u64)>,
    /// Hand the traces back (for a Perfetto file of the flagged spans).
    pub keep_traces: bool,
}

/// Progress of [`analyze_inputs`], for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// A stage begins over `total` items (`reading traces`, `fingerprinting`).
    Start {
        /// What the stage does.
        what: &'static str,
        /// Items in it.
        total: usize,
    },
    /// One item done.
    Tick,
    /// The stage is over.
    Finish,
}

/// Why a job's files gave no report.
#[derive(Debug, thiserror::Error)]
pub enum AnalyzeError {
    /// The paths could not be listed.
    #[error("listing inputs: {0}")]
    Listing(#[source] whyslow_ingest::IngestError),
    /// Nothing under the paths is an input whyslow reads.
    #[error(
        "no traces found in {0} (expected Kineto *.json[.gz], generic *.csv/*.jsonl[.gz] or *.fingerprint.json)"
    )]
    NoInputs(String),
    /// Inputs were there but none could be read: each file with why.
    #[error("no input could be read in {paths}: {}", why.join("; "))]
    NoneReadable {
        /// The paths given.
        paths: String,
        /// Per file: what it is and why it was skipped.
        why: Vec<String>,
    },
    /// An unreadable input under `strict`.
    #[error("{0} (--strict)")]
    Strict(#[source] whyslow_ingest::IngestError),
    /// The job policy refused the evidence.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// What [`analyze_inputs`] gives back.
#[derive(Debug)]
pub struct AnalyzedInputs {
    /// The report.
    pub report: Report,
    /// The fingerprints made from the traces (not those read as files).
    pub fingerprints: Vec<Fingerprint>,
    /// The traces, when [`InputOptions::keep_traces`].
    pub traces: Vec<WorkerTrace>,
    /// The warnings the reading itself gave (also in the report): inputs
    /// skipped, samples without a worker.
    pub input_warnings: Vec<String>,
}

fn display(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn merge_samples(
    by_rank: &mut BTreeMap<u32, BTreeMap<Resource, SampleSeries>>,
    path: &Path,
    samples: WorkerSamples,
    warnings: &mut Vec<String>,
) {
    let rank = samples
        .worker
        .or_else(|| whyslow_ingest::rank_from_file_name(path));
    let Some(rank) = rank else {
        warnings.push(format!(
            "{}: samples file names no worker (add a `worker` column or name it rank-N.samples.csv); ignored",
            path.display()
        ));
        return;
    };
    let entry = by_rank.entry(rank).or_default();
    for (resource, series) in samples.series {
        entry.insert(resource, series);
    }
}

/// Reads, fingerprints and judges the job under `paths` (files or
/// directories, searched recursively).
pub fn analyze_inputs(
    paths: &[PathBuf],
    policy: &JobPolicy,
    opts: &InputOptions,
    progress: &(dyn Fn(Progress) + Sync),
) -> Result<AnalyzedInputs, AnalyzeError> {
    let files = whyslow_ingest::discover(paths).map_err(AnalyzeError::Listing)?;
    let mut warnings = Vec::new();
    let skip = |e: whyslow_ingest::IngestError, warnings: &mut Vec<String>| {
        if policy.strict {
            return Err(AnalyzeError::Strict(e));
        }
        warnings.push(format!("skipped {e}"));
        Ok(())
    };
    let (mut trace_paths, mut sample_paths) = (Vec::new(), Vec::new());
    // Fingerprint files go into the job's compact form as they are read.
    let mut fingerprints = crate::JobFingerprints::default();
    for file in files {
        match file {
            InputFile::Kineto(p) | InputFile::Generic(p) => trace_paths.push(p),
            InputFile::Samples(p) => sample_paths.push(p),
            InputFile::Fingerprint(p) => match whyslow_ingest::read_fingerprint(&p) {
                Ok(fp) => fingerprints.push(fp),
                Err(e) => skip(e, &mut warnings)?,
            },
        }
    }
    if trace_paths.is_empty() && fingerprints.is_empty() {
        return Err(AnalyzeError::NoInputs(display(paths)));
    }
    progress(Progress::Start {
        what: "reading traces",
        total: trace_paths.len(),
    });
    let (traces, errors) = whyslow_ingest::read_traces(&trace_paths, &|_| progress(Progress::Tick));
    progress(Progress::Finish);
    for e in errors {
        skip(e, &mut warnings)?;
    }
    // Notes for the report that are no warning to shout (stepless traces).
    let mut notes = Vec::new();
    check_traces(&traces, policy, &mut notes)?;
    let mut samples_by_rank: BTreeMap<u32, BTreeMap<Resource, SampleSeries>> = BTreeMap::new();
    for p in &sample_paths {
        match whyslow_ingest::read_samples(p) {
            Ok(s) => merge_samples(&mut samples_by_rank, p, s, &mut warnings),
            Err(e) => skip(e, &mut warnings)?,
        }
    }
    let sopts = SummarizeOptions {
        steps: opts.steps,
        ..SummarizeOptions::default()
    };
    progress(Progress::Start {
        what: "fingerprinting",
        total: traces.len(),
    });
    let empty = BTreeMap::new();
    let made: Vec<Fingerprint> = traces
        .par_iter()
        .map(|t| {
            let samples = samples_by_rank.get(&t.meta.rank).unwrap_or(&empty);
            let fp = whyslow_summarize::summarize(t, samples, &sopts);
            progress(Progress::Tick);
            fp
        })
        .collect();
    progress(Progress::Finish);
    let iterations = iterations_from_traces(&traces);
    let traces = if opts.keep_traces { traces } else { Vec::new() };
    made.iter().for_each(|fp| fingerprints.push_ref(fp));
    if fingerprints.is_empty() {
        return Err(AnalyzeError::NoneReadable {
            paths: display(paths),
            why: std::mem::take(&mut warnings),
        });
    }
    let evidence = JobEvidence {
        fingerprints,
        iterations,
        warnings: notes.into_iter().chain(warnings.iter().cloned()).collect(),
        cross_layer: None,
    };
    let report = analyze_job(evidence, policy)?;
    Ok(AnalyzedInputs {
        report,
        fingerprints: made,
        traces,
        input_warnings: warnings,
    })
}

/// Each rank's fingerprints under `paths` (files or folders): fingerprint
/// files as they are, profiler traces summarized (PerfTracker §4.2). What
/// the diagnosis's GPU layer reads per rank (`whyslow diagnose
/// --fingerprints`, `whyslow.diagnose(fingerprints=…)`); an unreadable file
/// is skipped with a note.
pub fn read_fingerprints(
    paths: &[PathBuf],
    notes: &mut Vec<String>,
) -> Result<Vec<Fingerprint>, AnalyzeError> {
    let mut out = Vec::new();
    for file in whyslow_ingest::discover(paths).map_err(AnalyzeError::Listing)? {
        let fp = match &file {
            InputFile::Fingerprint(p) => whyslow_ingest::read_fingerprint(p),
            InputFile::Kineto(p) => whyslow_ingest::read_worker_trace(p).map(|t| {
                whyslow_summarize::summarize(&t, &BTreeMap::new(), &SummarizeOptions::default())
            }),
            _ => continue,
        };
        match fp {
            Ok(fp) => out.push(fp),
            Err(e) => notes.push(format!("skipped {}: {e}", file.path().display())),
        }
    }
    Ok(out)
}
