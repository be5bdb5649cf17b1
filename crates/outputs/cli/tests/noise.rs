//! Healthy jobs stay silent (issue #8): every real fixture trace replayed as
//! 16 and 128 workers with independent ±2 % and ±5 % noise on every
//! execution (both noise models of `whyslow-replay`) must give no finding on
//! a subset of the workers. Functions at the edge of the critical path flip
//! on and off it under such noise; the localizer must not read that as an
//! anomaly (crate docs of `whyslow-localize`, "Noise").

mod common;
use common::fixtures;
use std::collections::BTreeMap;
use std::path::PathBuf;

use rayon::prelude::*;
use whyslow_localize::LocalizeConfig;
use whyslow_model::{Fingerprint, Report, WorkerTrace};
use whyslow_replay::{replica, Noise, NoiseMode};
use whyslow_summarize::SummarizeOptions;

fn fixture_traces() -> Vec<(String, WorkerTrace)> {
    let dir = fixtures().unwrap().join("kineto");
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("single"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.push(dir.join("hta-sampled-128rank/rank-0.json.gz"));
    files.sort();
    files
        .iter()
        .map(|p| {
            let t = whyslow_ingest::read_kineto(p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), t)
        })
        .collect()
}

fn replay_fingerprints(base: &WorkerTrace, workers: u32, noise: &Noise) -> Vec<Fingerprint> {
    (0..workers)
        .into_par_iter()
        .map(|r| {
            let t = replica(base, r, noise);
            whyslow_summarize::summarize(&t, &BTreeMap::new(), &SummarizeOptions::default())
        })
        .collect()
}

fn partial(report: &Report) -> Vec<String> {
    report
        .findings
        .iter()
        .filter(|f| f.workers.len() < report.workers)
        .map(|f| {
            format!(
                "{:?} {:?} β {:.4} vs {:.4} on {:?}",
                f.kind, f.function, f.beta.value, f.beta.peers, f.workers
            )
        })
        .collect()
}

fn sweep(workers: &[u32]) {
    let cfg = LocalizeConfig::default();
    let mut failures = Vec::new();
    for (name, base) in fixture_traces() {
        for &n in workers {
            for amount in [0.02, 0.05] {
                for mode in [NoiseMode::Scale, NoiseMode::Shift] {
                    let noise = Noise {
                        amount,
                        mode,
                        seed: 0x5eed ^ u64::from(n),
                    };
                    let fps = replay_fingerprints(&base, n, &noise);
                    let report = whyslow_localize::localize(&fps, &cfg, Some(n));
                    let p = partial(&report);
                    eprintln!(
                        "{name} ×{n} ±{:.0}% {mode:?}: {} findings, {} on a subset",
                        amount * 100.0,
                        report.findings.len(),
                        p.len()
                    );
                    for line in &p {
                        eprintln!("    {line}");
                    }
                    if !p.is_empty() {
                        failures.push(format!("{name} ×{n} ±{amount} {mode:?}: {p:#?}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "false alarms on clean replays:\n{}", failures.join("\n"));
}

#[test]
fn clean_replays_of_every_fixture_as_16_workers_are_silent() {
    sweep(&[16]);
}

#[test]
fn clean_replays_of_every_fixture_as_128_workers_are_silent() {
    sweep(&[128]);
}
