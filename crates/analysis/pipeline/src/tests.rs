//! The job policy on real traces: the shipped demo (4 CPU ranks over gloo,
//! rank 2 slow; `examples/data/slow-rank-cpu-gloo`) and single-rank traces
//! of other jobs (`tests/fixtures/kineto/single`, see its README).

use std::path::{Path, PathBuf};

use super::*;
use whyslow_model::Verdict;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
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
        fingerprints,
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
