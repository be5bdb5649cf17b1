//! The culprits of real hangs (tests/fixtures/hang: torchrun jobs, 4 CPU
//! ranks, gloo, 2 dp x 2 tp, hangs injected by tests/python/hang_cases.py)
//! named against their truth (`truth.json`), and healthy or merely slow
//! jobs left silent (PerfTracker §4.1: a stall is the detector's; the
//! culprit is ours).

use std::path::PathBuf;

use whyslow_hang::{analyze, HangConfig};
use whyslow_model::hang::HangReport;

fn fixtures() -> PathBuf {
    whyslow_testkit::fixtures().join("hang")
}

fn verdict(case: &str) -> (HangReport, serde_json::Value) {
    let dir = fixtures().join(case);
    let ev = whyslow_hang_inputs::read_dir(&dir).unwrap();
    assert!(
        ev.notes
            .iter()
            .all(|n| !n.contains("skipped") || n.contains("truth.json")),
        "{:?}",
        ev.notes
    );
    let truth: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("truth.json")).unwrap()).unwrap();
    (analyze(&ev, &HangConfig::default()), truth)
}

fn check(case: &str) {
    let (r, truth) = verdict(case);
    let show = whyslow_report::hang::hang_table(&r);
    let want = truth["culprits"].as_object().unwrap();
    if !truth["hang"].as_bool().unwrap() {
        assert!(!r.hang && r.culprits.is_empty(), "{case}: {show}");
        return;
    }
    assert!(r.hang, "{case}: {show}");
    let named: Vec<u32> = r.culprits.iter().map(|c| c.rank).collect();
    let mut want_ranks: Vec<u32> = want.keys().map(|k| k.parse().unwrap()).collect();
    want_ranks.sort();
    assert_eq!(named, want_ranks, "{case}: {show}");
    for c in &r.culprits {
        let t = &want[&c.rank.to_string()];
        assert_eq!(
            c.reason.as_str(),
            t["reason"].as_str().unwrap(),
            "{case}: {show}"
        );
        let groups: Vec<&str> = t["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap())
            .collect();
        assert!(groups.contains(&c.group_desc.as_str()), "{case}: {show}");
        assert_eq!(c.group_ranks.len(), 2, "{case}: a 2-rank group: {show}");
        assert!(c.group_ranks.contains(&c.rank), "{case}: {show}");
        if let Some(f) = t["function"].as_str() {
            let stack = c.stack.as_ref().expect("a stack");
            assert!(
                stack.frames.iter().any(|x| x.function == f),
                "{case}: {f} not on the stack: {show}"
            );
        }
        // Every other rank waits for the culprit, directly or not.
        assert_eq!(c.waited_by.len(), 3, "{case}: {show}");
    }
    // Waiters are never named.
    for w in &r.waiting {
        assert!(
            !named.contains(&w.rank) || !w.waits_for.is_empty(),
            "{case}: {show}"
        );
    }
}

#[test]
fn a_rank_sleeping_in_python_is_named_with_its_stack() {
    check("sleep");
}

#[test]
fn a_rank_holding_the_gil_is_named_unresponsive() {
    check("gil");
    let (r, _) = verdict("gil");
    // Its kernel stack, read from /proc by a peer on its host.
    let st = r.culprits[0].stack.as_ref().unwrap();
    assert_eq!(st.source, "proc");
    assert!(
        st.frames.iter().any(|f| f.function.contains("sleep")),
        "{st:?}"
    );
}

#[test]
fn a_rank_whose_process_exited_is_named() {
    check("exit");
}

#[test]
fn a_rank_that_skipped_a_collective_is_named_not_the_cycle() {
    check("mismatch");
}

#[test]
fn across_testbed_hosts_a_sleeping_rank_is_named() {
    check("testbed-sleep");
}

#[test]
fn across_testbed_hosts_a_rank_holding_the_gil_is_unresponsive() {
    // No peer on its host: no /proc view, only what the others wait for.
    check("testbed-gil");
}

#[test]
fn a_pipeline_stage_sleeping_is_named_not_the_peer_waiting_in_recv() {
    // 2 stages x 2 dp (gloo: its Flight Recorder records no send/recv).
    // Rank 1 (stage 0) waits in recv for rank 3 and so never reaches its
    // dp all-reduce: its stack says where it waits; it is not a culprit.
    check("pp-sleep");
}

#[test]
fn a_pipeline_stage_holding_the_gil_is_named_not_the_peer_waiting_in_recv() {
    check("pp-gil");
}

#[test]
fn a_slow_job_is_not_a_hang() {
    check("slow");
}

#[test]
fn a_healthy_job_is_not_a_hang() {
    check("healthy");
}

#[test]
fn dumps_alone_without_stack_files_still_name_the_culprit() {
    // What a user has from torch alone: the Flight Recorder files.
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures().join("sleep")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("fr_trace_rank_") {
            std::fs::copy(&p, tmp.path().join(&name)).unwrap();
        }
    }
    let ev = whyslow_hang_inputs::read_dir(tmp.path()).unwrap();
    let r = analyze(&ev, &HangConfig::default());
    let show = whyslow_report::hang::hang_table(&r);
    assert_eq!(
        r.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(),
        vec![2],
        "{show}"
    );
    // The frames that issued its last collective stand in for a stack.
    assert_eq!(
        r.culprits[0].stack.as_ref().unwrap().source,
        "flight-recorder"
    );
}

#[test]
fn stacks_alone_name_the_rank_outside_the_collectives() {
    // The Flight Recorder off: whyslow's stack files only.
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixtures().join("sleep")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("stacks-rank") {
            let mut doc: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            doc["fr_dump"] = serde_json::Value::Null;
            std::fs::write(tmp.path().join(&name), doc.to_string()).unwrap();
        }
    }
    let ev = whyslow_hang_inputs::read_dir(tmp.path()).unwrap();
    let r = analyze(&ev, &HangConfig::default());
    let show = whyslow_report::hang::hang_table(&r);
    assert!(r.hang, "{show}");
    assert_eq!(
        r.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(),
        vec![2],
        "{show}"
    );
    assert!(
        r.culprits[0].detail.contains("stalled_data_loader"),
        "{show}"
    );
}

#[test]
fn a_damaged_file_is_named_and_the_rest_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&fixtures().join("sleep"), tmp.path());
    // Rank 0's dump cut in half, and a foreign file.
    let d0 = tmp.path().join("fr_trace_rank_0");
    let b = std::fs::read(&d0).unwrap();
    std::fs::write(&d0, &b[..b.len() / 2]).unwrap();
    std::fs::write(tmp.path().join("notes_rank_7"), b"not a dump").unwrap();
    let ev = whyslow_hang_inputs::read_dir(tmp.path()).unwrap();
    assert!(
        ev.notes
            .iter()
            .any(|n| n.contains("fr_trace_rank_0") && n.contains("ends early")),
        "{:?}",
        ev.notes
    );
    assert!(
        ev.notes.iter().any(|n| n.contains("notes_rank_7")),
        "{:?}",
        ev.notes
    );
    let r = analyze(&ev, &HangConfig::default());
    let show = whyslow_report::hang::hang_table(&r);
    assert_eq!(
        r.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(),
        vec![2],
        "{show}"
    );
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_tree(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

#[test]
fn real_agent_spools_without_open_calls_are_no_hang() {
    // Recorded on the testbed (tests/fixtures/diagnose): a healthy job and
    // one with a noisy neighbour slowing a rank; neither hangs.
    for case in ["healthy", "noisy-neighbour"] {
        let dir = whyslow_testkit::fixtures()
            .join("diagnose")
            .join(case)
            .join("agent");
        let ev = whyslow_hang_inputs::read_dir(&dir).unwrap();
        let r = analyze(&ev, &HangConfig::default());
        assert!(!r.hang && r.culprits.is_empty(), "{case}: {}", r.verdict);
        // The agent's profiles gave each rank a stack.
        assert!(
            r.ranks.iter().all(|x| x.stack_sources == ["agent"]),
            "{case}: {:?}",
            r.ranks
        );
    }
}

#[test]
fn open_calls_in_a_real_agent_spool_name_the_rank_that_never_entered() {
    // The healthy spool, then ranks 0, 1 and 3 seen 60 s inside the next
    // all-reduce of the world group while rank 2 never enters it: as the
    // agent writes a call in flight past its bound.
    let src = whyslow_testkit::fixtures().join("diagnose/healthy/agent");
    let tmp = tempfile::tempdir().unwrap();
    copy_tree(&src, tmp.path());
    let mut records = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".collectives.jsonl") {
                for l in std::fs::read_to_string(&p).unwrap().lines() {
                    records.push(
                        serde_json::from_str::<whyslow_model::collective::CollectiveRecord>(l)
                            .unwrap(),
                    );
                }
            }
        }
    }
    let world = records
        .iter()
        .filter(|r| r.group.contains("gloo4"))
        .max_by_key(|r| r.seq)
        .unwrap()
        .clone();
    let last_exit = records.iter().map(|r| r.exit_ns).max().unwrap();
    let mut open = String::new();
    for rank in [0u32, 1, 3] {
        let mut r = world.clone();
        r.rank = rank;
        r.global_rank = Some(rank);
        r.seq = Some(world.seq.unwrap() + 1);
        r.entry_ns = last_exit + 100_000_000;
        r.exit_ns = r.entry_ns + 60_000_000_000;
        r.open = true;
        open.push_str(&serde_json::to_string(&r).unwrap());
        open.push('\n');
    }
    std::fs::write(tmp.path().join("open.collectives.jsonl"), open).unwrap();
    let ev = whyslow_hang_inputs::read_dir(tmp.path()).unwrap();
    let r = analyze(&ev, &HangConfig::default());
    let show = whyslow_report::hang::hang_table(&r);
    assert_eq!(
        r.culprits
            .iter()
            .map(|c| (c.rank, c.reason.as_str()))
            .collect::<Vec<_>>(),
        vec![(2, "never_reached")],
        "{show}"
    );
    assert_eq!(
        r.culprits[0].stack.as_ref().unwrap().source,
        "agent",
        "{show}"
    );
    assert_eq!(r.waiting.len(), 3, "{show}");
}
