//! The job policy on real traces: the shipped demo (4 CPU ranks over gloo,
//! rank 2 slow; `examples/data/slow-rank-cpu-gloo`) and single-rank traces
//! of other jobs (`tests/fixtures/kineto/single`, see its README).

use std::path::{Path, PathBuf};

use super::*;
use whyslow_model::Verdict;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fingerprint_of(path: &Path) -> Fingerprint {
    let t = whyslow_ingest::read_worker_trace(path).expect("fixture trace reads");
    whyslow_summarize::summarize(&t, &Default::default(), &Default::default())
}

fn demo(rank: u32) -> Fingerprint {
    fingerprint_of(&repo().join(format!(
        "examples/data/slow-rank-cpu-gloo/rank-{rank}.json.gz"
    )))
}

fn single(name: &str) -> Fingerprint {
    fingerprint_of(&repo().join("tests/fixtures/kineto/single").join(name))
}

fn evidence(fingerprints: Vec<Fingerprint>) -> JobEvidence {
    JobEvidence {
        fingerprints: fingerprints.into(),
        ..Default::default()
    }
}

#[test]
fn fingerprints_carry_the_job_identity_of_their_trace() {
    let fp = demo(0);
    let job = fp
        .job
        .as_ref()
        .expect("the demo's traces say their world size");
    assert_eq!(job.world_size, Some(4));
    assert_eq!(job.backend.as_deref(), Some("gloo"));
    assert_eq!(job.id, None);
}

#[test]
fn three_of_four_ranks_name_the_fourth_missing_and_still_find_the_slow_one() {
    let report = analyze_job(evidence((0..3).map(demo).collect()), &JobPolicy::default()).unwrap();
    assert_eq!(report.missing_workers, vec![3]);
    assert_eq!(report.verdict, Verdict::Anomalies, "{:?}", report.findings);
    assert!(
        report.findings.iter().any(|f| f.workers == vec![2]),
        "{:?}",
        report.findings
    );
    // Under --strict the missing rank is a refusal.
    let strict = JobPolicy {
        strict: true,
        ..Default::default()
    };
    let err = analyze_job(evidence((0..3).map(demo).collect()), &strict).unwrap_err();
    assert_eq!(
        err,
        Refusal::MissingRanks {
            count: 1,
            ranks: "{3}".into()
        }
    );
    // The user's world size overrides the fingerprints', with a warning.
    let given = JobPolicy {
        world_size: Some(3),
        ..Default::default()
    };
    let report = analyze_job(evidence((0..3).map(demo).collect()), &given).unwrap();
    assert!(report.missing_workers.is_empty());
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("--world-size 3 overrides the job's world size 4")),
        "{:?}",
        report.warnings
    );
}

#[test]
fn fingerprints_of_different_jobs_are_refused_naming_each() {
    let err = analyze_job(
        evidence(vec![
            single("a100-rank3of8.json.gz"),
            single("mi250-rocm.json.gz"),
        ]),
        &JobPolicy::default(),
    )
    .unwrap_err();
    let Refusal::DifferentJobs { what, jobs } = &err else {
        panic!("{err}");
    };
    assert_eq!(*what, "fingerprints");
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert!(err.to_string().contains("2 different jobs"), "{err}");
    // A job id alone tells two jobs apart, even on the same device.
    let mut a = demo(0);
    let mut b = demo(1);
    a.job.as_mut().unwrap().id = Some("job-a".into());
    b.job.as_mut().unwrap().id = Some("job-b".into());
    let err = analyze_job(evidence(vec![a, b]), &JobPolicy::default()).unwrap_err();
    assert!(err.to_string().contains("job job-a"), "{err}");
}

#[test]
fn old_fingerprints_without_identity_are_judged_as_before() {
    let fps: Vec<Fingerprint> = (0..3)
        .map(|r| {
            let mut fp = demo(r);
            fp.job = None;
            fp.version = 1;
            fp
        })
        .collect();
    let report = analyze_job(evidence(fps), &JobPolicy::default()).unwrap();
    // Without a world size the expected ranks are 0..=max seen.
    assert!(report.missing_workers.is_empty());
    assert!(report.findings.iter().any(|f| f.workers == vec![2]));
}

#[test]
fn empty_windows_are_left_out_and_duplicates_refused_only_when_strict() {
    let mut empty = demo(1);
    empty.functions.clear();
    let fps = vec![demo(0), empty.clone(), demo(2), demo(3)];
    let report = analyze_job(evidence(fps.clone()), &JobPolicy::default()).unwrap();
    assert_eq!(report.missing_workers, vec![1]);
    assert!(report
        .warnings
        .iter()
        .any(|w| w.contains("rank 1") && w.contains("no events in its profiling window")));
    let strict = JobPolicy {
        strict: true,
        ..Default::default()
    };
    assert!(matches!(
        analyze_job(evidence(fps), &strict),
        Err(Refusal::EmptyWindow { rank: 1, .. })
    ));
    let dup = vec![demo(0), demo(1), demo(1)];
    assert!(analyze_job(evidence(dup.clone()), &JobPolicy::default()).is_ok());
    assert!(matches!(
        analyze_job(evidence(dup), &strict),
        Err(Refusal::DuplicateRank { rank: 1, .. })
    ));
    // All empty: judged as "could not judge", not as healthy.
    let report = analyze_job(evidence(vec![empty]), &JobPolicy::default()).unwrap();
    assert_eq!(report.verdict, Verdict::CouldNotJudge);
    assert_eq!(
        analyze_job(evidence(vec![]), &JobPolicy::default()).unwrap_err(),
        Refusal::NoEvidence
    );
}

#[test]
fn the_healthy_ranks_alone_name_no_worker_apart() {
    // They wait for rank 2 in their all-reduce (an expectation finding on
    // all of them), but none of them differs from the others.
    let report = analyze_job(
        evidence(vec![demo(0), demo(1), demo(3)]),
        &JobPolicy::default(),
    )
    .unwrap();
    assert_eq!(report.missing_workers, vec![2]);
    for f in &report.findings {
        assert_eq!(f.workers, vec![0, 1, 3], "{}: {:?}", f.function, f.workers);
    }
}

/// A rank's network over its window: `segs` TCP segments per second out
/// and in, `re` % of them resent and `ofo` % received out of order, on its
/// own host `h{rank}`.
fn network(rank: u32, segs: f64, re: f64, ofo: f64) -> whyslow_model::os::OsSample {
    use whyslow_model::os::*;
    let signals = [
        (TCP_OUT_SEGS, segs),
        (TCP_RETRANS_SEGS, segs * re / 100.0),
        (TCP_IN_SEGS, segs),
        (TCP_OUT_OF_ORDER, segs * ofo / 100.0),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    OsSample {
        job: String::new(),
        host: format!("h{rank}"),
        rank: Some(rank),
        pid: 100 + rank as i32,
        start_unix_ns: 0,
        duration_ns: 4_000_000_000,
        cpus: Vec::new(),
        netns: Some(4026531000 + rank as u64),
        signals,
        connections: Vec::new(),
    }
}

/// Issue 29: the in-process report reads the network. With rank 1's host
/// losing packets (its own TCP counters: half its segments out of order),
/// the first finding is its collective, reason `network`, with the
/// evidence; the healthy demo's hosts (all alike) add nothing.
#[test]
fn a_lossy_host_is_named_on_its_collective_and_healthy_hosts_add_nothing() {
    let with = |f: fn(u32) -> whyslow_model::os::OsSample| {
        (0..4)
            .map(|r| {
                let mut fp = demo(r);
                fp.network = Some(f(r));
                fp
            })
            .collect::<Vec<_>>()
    };
    let lossy = |r: u32| {
        if r == 1 {
            network(r, 20_000.0, 1.8, 51.0)
        } else {
            network(r, 20_000.0, 0.6 + 0.2 * r as f64, 0.6)
        }
    };
    let report = analyze_job(evidence(with(lossy)), &JobPolicy::default()).unwrap();
    let first = &report.findings[0];
    assert_eq!(first.workers, vec![1], "{:?}", report.findings);
    assert_eq!(first.kind, whyslow_model::FunctionKind::Comm);
    assert!(first.function.contains("all_reduce"), "{}", first.function);
    let hint = first.hint.as_deref().unwrap();
    assert!(
        hint.contains("h1 loses packets") && hint.contains("51.00 %"),
        "{hint}"
    );
    assert_eq!(report.network[0].host, "h1");
    // The slow rank 2's own finding is still there.
    assert!(report.findings.iter().any(|f| f.workers == vec![2]));

    let healthy = |r: u32| network(r, 20_000.0, 0.1, 0.2 + 0.05 * r as f64);
    let plain = analyze_job(evidence((0..4).map(demo).collect()), &JobPolicy::default()).unwrap();
    let report = analyze_job(evidence(with(healthy)), &JobPolicy::default()).unwrap();
    assert!(report.network.is_empty());
    assert_eq!(
        report.findings, plain.findings,
        "healthy hosts change nothing"
    );
}

/// Whether two values are equal but for numbers `f32` rounding moves (a
/// relative 1e-6, or 1e-7 apart: shares such as `explains` are differences
/// of β values, each rounded by up to 6e-8); the paths that differ
/// otherwise.
fn differences(a: &serde_json::Value, b: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            if (x - y).abs() > 1e-6 * x.abs().max(y.abs()) + 1e-7 {
                out.push(format!("{path}: {x} vs {y}"));
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (x, y)) in x.iter().zip(y).enumerate() {
                differences(x, y, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Object(x), Value::Object(y)) if x.keys().eq(y.keys()) => {
            for (k, x) in x {
                differences(x, &y[k], &format!("{path}.{k}"), out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("{path}: {a} vs {b}")),
    }
}

/// The doors localize the table (values as `f32`): on every fixture job
/// it finds what localizing the fingerprints themselves finds, with the
/// same warnings, numbers apart by `f32` rounding only.
#[test]
fn the_table_finds_what_the_fingerprints_do_on_the_fixtures() {
    let testbed = repo().join("tests/fixtures/testbed");
    let mut jobs: Vec<(String, Vec<Fingerprint>)> = std::fs::read_dir(&testbed)
        .unwrap()
        .map(|d| {
            let dir = d.unwrap().path();
            let mut notes = Vec::new();
            let fps = read_fingerprints(std::slice::from_ref(&dir), &mut notes).unwrap();
            (dir.display().to_string(), fps)
        })
        .collect();
    jobs.push(("demo".into(), (0..4).map(demo).collect()));
    let singles: Vec<Fingerprint> = std::fs::read_dir(repo().join("tests/fixtures/kineto/single"))
        .unwrap()
        .map(|d| d.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gz" || e == "json"))
        .map(|p| single(p.file_name().unwrap().to_str().unwrap()))
        .collect();
    jobs.extend(
        singles
            .into_iter()
            .map(|fp| ("single".to_string(), vec![fp])),
    );
    let mut findings = 0;
    for (name, fps) in &jobs {
        assert!(!fps.is_empty(), "{name}");
        let table = whyslow_localize::FingerprintTable::from_fingerprints(fps).unwrap();
        let cfg = LocalizeConfig::default();
        let a = whyslow_localize::localize(fps, &cfg, None);
        let b = whyslow_localize::localize_table(&table, &cfg, None);
        let mut out = Vec::new();
        differences(
            &serde_json::to_value(&a).unwrap(),
            &serde_json::to_value(&b).unwrap(),
            "",
            &mut out,
        );
        assert!(out.is_empty(), "{name}: {out:#?}");
        findings += a.findings.len();
    }
    assert!(findings >= 5, "the fixtures have findings ({findings})");
}

/// A policy whose localization parameters cannot be used is refused by
/// `analyze_job` itself, whichever door built it (a TOML file is checked as
/// it is read; the Python package and tests build configs in code).
#[test]
fn a_bad_localization_policy_is_refused_whichever_door_built_it() {
    let bad = |edit: fn(&mut LocalizeConfig)| {
        let mut policy = JobPolicy::default();
        edit(&mut policy.localize);
        analyze_job(evidence(vec![demo(0), demo(1)]), &policy)
    };
    for edit in [
        (|c: &mut LocalizeConfig| c.delta = 0.0) as fn(&mut LocalizeConfig),
        |c| c.k = f64::NAN,
        |c| c.max_peers = 0,
        |c| c.beta_min = -0.1,
        |c| c.expected.get_mut(whyslow_model::FunctionKind::Python).beta = (0.5, 0.1),
    ] {
        match bad(edit) {
            Err(Refusal::BadPolicy(why)) => assert!(why.contains("expected"), "{why}"),
            other => panic!("not refused: {:?}", other.map(|r| r.findings.len())),
        }
    }
    // The defaults pass.
    assert!(bad(|_| {}).is_ok());
}
