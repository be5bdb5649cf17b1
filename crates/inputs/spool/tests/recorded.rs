//! The cross-layer diagnosis (SysOM-AI §3.1) on agent spools recorded from
//! real testbed runs (`tests/fixtures/diagnose/`, see its README): four
//! hosts of one gloo job, one `whyslow agent` each (CPU, off-CPU and host
//! profiles, collective records, OS signals). The verdicts are pinned here
//! and varied by taking evidence away, so the logic is tested without
//! starting agents and ranks.

use std::path::{Path, PathBuf};

use whyslow_diagnose::{diagnose, DiagnoseConfig};
use whyslow_model::diagnosis::{DiagnoseEvidence, DiagnoseReport};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../tests/fixtures/diagnose")
        .join(name)
        .join("agent")
}

fn evidence(name: &str) -> DiagnoseEvidence {
    whyslow_spool::read_spool(&fixture(name))
        .expect("the recorded spool reads")
        .evidence
}

fn run(e: &DiagnoseEvidence) -> DiagnoseReport {
    diagnose(e, &DiagnoseConfig::default())
        .expect("evidence to diagnose")
        .report
}

#[test]
fn a_noisy_neighbour_is_named_on_the_late_ranks_host() {
    // Host 2's CPU cgroup shared with two busy loops from 5 s on.
    let e = evidence("noisy-neighbour");
    assert!(e.notes.is_empty(), "{:?}", e.notes);
    let r = run(&e);
    let late: Vec<u32> = r.stragglers.iter().map(|s| s.rank).collect();
    assert_eq!(late, vec![2], "{:?}", r.notes);
    assert_eq!(r.layer, "os");
    let top = &r.cpu_diff[0];
    assert_eq!(
        (
            top.scope.as_str(),
            top.rank,
            top.function.as_str(),
            top.host.as_deref()
        ),
        ("host", 2, "sh (process)", Some("h2"))
    );
    assert!(r
        .os_diff
        .iter()
        .any(|d| d.rank == 2 && d.diff.signal == "runqueue_delay_ms_per_s"));
    assert!(r.regressions.is_empty(), "{:?}", r.regressions);
    assert!(r.names_anything());
    // Every JSON rank is an integer.
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["stragglers"][0]["rank"].is_u64(), "{json}");
    assert!(json["cpu_diff"][0]["rank"].is_u64(), "{json}");
}

#[test]
fn without_host_profiles_the_neighbour_is_not_seen_but_the_late_rank_is() {
    let mut e = evidence("noisy-neighbour");
    e.profiles.retain(|p| !p.labels.contains_key("scope"));
    let r = run(&e);
    let late: Vec<u32> = r.stragglers.iter().map(|s| s.rank).collect();
    assert_eq!(late, vec![2]);
    assert!(
        r.cpu_diff.iter().all(|d| d.scope == "rank"),
        "{:?}",
        r.cpu_diff
    );
    assert!(
        r.notes.iter().any(|n| n.contains("no host profiles")),
        "{:?}",
        r.notes
    );
    // Without the OS readings too, the OS layer says it was not judged.
    e.os_samples.clear();
    let r = run(&e);
    assert!(r.os_diff.is_empty());
    assert!(
        r.notes.iter().any(|n| n.contains("no OS signals")),
        "{:?}",
        r.notes
    );
}

#[test]
fn the_healthy_run_names_nothing() {
    let r = run(&evidence("healthy"));
    assert!(!r.names_anything(), "{r:#?}");
    assert_eq!(r.layer, "none");
    assert_eq!(r.collective_groups.len(), 1);
    assert_eq!(r.collective_groups[0].mean_late_us.len(), 4);
}

#[test]
fn replayed_before_the_fault_the_late_rank_is_not_named_yet() {
    // `--until`: the verdict as it stood 4 s into the data (the busy loops
    // start 5 s into training, after start-up).
    let e = evidence("noisy-neighbour");
    let early = diagnose(
        &e,
        &DiagnoseConfig {
            until: Some(4.0),
            ..Default::default()
        },
    )
    .expect("4 s of evidence");
    assert!(early.report.profiles > 0);
    assert!(
        early.report.stragglers.is_empty(),
        "{:?}",
        early.report.stragglers
    );
}

#[test]
fn a_spool_with_nothing_to_diagnose_is_an_error_not_a_healthy_job() {
    let dir = std::env::temp_dir().join(format!("whyslow-empty-spool-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let e = whyslow_spool::read_spool(&dir).unwrap().evidence;
    assert!(diagnose(&e, &DiagnoseConfig::default()).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
