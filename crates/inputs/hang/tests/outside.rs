//! `whyslow hang` on dumps the project did not make, and on what people
//! actually collect (issue 42):
//!
//! * NVRx's real 16-rank Megatron dumps on NCCL (tests/fixtures/hang/nvrx-*,
//!   Apache-2.0): tensor, pipeline, data, context and expert parallel
//!   groups, two ranks faulted by a GPU error or a held GIL, dumped on the
//!   watchdog's timeout. Truth: the case's `fault_injection.log`. Pipeline
//!   send/recv is waited on one peer, never read as a collective.
//! * torch's gloo dumps alone, where the culprit left no dump and gloo
//!   leaves `pg_config` empty: the group's missing member is inferred.
//! * ages from the evidence's clocks, not the files' times; a damaged,
//!   foreign or second dump changes nothing else; world sizes of real jobs
//!   in bounded output.

use std::path::{Path, PathBuf};

use whyslow_hang::{analyze, HangConfig};
use whyslow_model::hang::{HangReason, HangReport};

fn fixtures() -> PathBuf {
    whyslow_testkit::fixtures().join("hang")
}

fn judge(dir: &Path, cfg: &HangConfig) -> HangReport {
    let ev = whyslow_hang_inputs::read_dir(dir).unwrap();
    analyze(&ev, cfg)
}

fn culprits(r: &HangReport) -> Vec<u32> {
    r.culprits.iter().map(|c| c.rank).collect()
}

/// `Fault ranks: [12, 14]`.
fn fault_ranks(case: &str) -> Vec<u32> {
    let log = std::fs::read_to_string(fixtures().join(case).join("fault_injection.log")).unwrap();
    let line = log.lines().find(|l| l.starts_with("Fault ranks:")).unwrap();
    let inner = line.split_once('[').unwrap().1.trim_end_matches(']');
    inner
        .split(',')
        .map(|x| x.trim().parse().unwrap())
        .collect()
}

const NVRX: [&str; 4] = [
    "nvrx-gpu-error-1st",
    "nvrx-gpu-error-2nd",
    "nvrx-lock-gil-1st",
    "nvrx-lock-gil-2nd",
];

#[test]
fn real_megatron_dumps_name_the_faulted_ranks_and_nothing_else() {
    for case in NVRX {
        let r = judge(&fixtures().join(case), &HangConfig::default());
        let show = whyslow_report::hang::hang_table(&r);
        assert!(r.hang, "{case}: {show}");
        assert_eq!(culprits(&r), fault_ranks(case), "{case}: {show}");
        // Pipeline point-to-point is never judged as a collective the
        // first stage "never reached".
        for c in &r.culprits {
            assert_ne!(
                c.group_desc, "PIPELINE_MODEL_PARALLEL_GROUP",
                "{case}: {show}"
            );
            assert!(!c.waited_by.is_empty(), "{case}: {show}");
        }
        // torch writes no time of the dump: no age is made up.
        assert!(r.waiting.iter().all(|w| w.waited_s.is_none()), "{case}");
        assert!(
            r.notes.iter().any(|n| n.contains("no time of their own")),
            "{case}: {:?}",
            r.notes
        );
    }
}

#[test]
fn a_gpu_whose_completions_stopped_is_named_with_its_device() {
    // Rank 14 issued everything its peers did; its peers finished instances
    // it never saw finish (NVRx's own analyzer misses it).
    let r = judge(
        &fixtures().join("nvrx-gpu-error-1st"),
        &HangConfig::default(),
    );
    let c = r.culprits.iter().find(|c| c.rank == 14).unwrap();
    assert_eq!(c.reason, HangReason::NotStarted, "{c:?}");
    assert!(c.detail.contains("device stopped finishing work"), "{c:?}");
}

fn copy_dumps(case: &str, to: &Path, keep: impl Fn(&str) -> bool) {
    for e in std::fs::read_dir(fixtures().join(case)).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if keep(&name) {
            std::fs::copy(&p, to.join(&name)).unwrap();
        }
    }
}

#[test]
fn a_culprit_that_left_no_dump_is_named_where_gloo_lists_no_members() {
    // torch's gloo dumps alone (no stack files): pg_config is empty, the
    // culprit (holding the GIL, or exited) wrote nothing. Its group's
    // members are inferred from the other groups of the same kind.
    for (case, want) in [("gil", 1), ("testbed-gil", 1), ("exit", 3)] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dumps(case, tmp.path(), |n| n.starts_with("fr_trace_rank_"));
        let r = judge(tmp.path(), &HangConfig::default());
        let show = whyslow_report::hang::hang_table(&r);
        assert_eq!(culprits(&r), vec![want], "{case}: {show}");
        assert_eq!(r.culprits[0].reason, HangReason::NoDump, "{case}: {show}");
        assert_eq!(r.culprits[0].waited_by.len(), 3, "{case}: {show}");
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("no dump lists its members")),
            "{case}: {:?}",
            r.notes
        );
    }
    // Every rank dumped: nothing is inferred, the sleeper is named.
    for (case, want) in [("sleep", 2), ("testbed-sleep", 2), ("mismatch", 2)] {
        let tmp = tempfile::tempdir().unwrap();
        copy_dumps(case, tmp.path(), |n| n.starts_with("fr_trace_rank_"));
        let r = judge(tmp.path(), &HangConfig::default());
        assert_eq!(culprits(&r), vec![want], "{case}");
        assert!(
            r.notes.iter().all(|n| !n.contains("no dump lists")),
            "{case}"
        );
    }
}

/// The report without its notes (what a changed file may add to).
fn verdict_json(r: &HangReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap();
    v.as_object_mut().unwrap().remove("notes");
    v
}

#[test]
fn file_times_change_nothing() {
    // Dumps copied, checked out or a year old: ages come from the evidence.
    for case in ["nvrx-gpu-error-2nd", "sleep"] {
        let want = verdict_json(&judge(&fixtures().join(case), &HangConfig::default()));
        for secs in [0u64, 4_102_444_800] {
            let tmp = tempfile::tempdir().unwrap();
            copy_dumps(case, tmp.path(), |_| true);
            for e in std::fs::read_dir(tmp.path()).unwrap() {
                let f = std::fs::File::options()
                    .write(true)
                    .open(e.unwrap().path())
                    .unwrap();
                f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
                    .unwrap();
            }
            let got = verdict_json(&judge(tmp.path(), &HangConfig::default()));
            assert_eq!(got, want, "{case} at mtime {secs}");
        }
    }
}

#[test]
fn garbage_among_real_dumps_is_named_and_changes_nothing_else() {
    for case in ["nvrx-lock-gil-2nd", "sleep"] {
        let want = verdict_json(&judge(&fixtures().join(case), &HangConfig::default()));
        let tmp = tempfile::tempdir().unwrap();
        copy_dumps(case, tmp.path(), |_| true);
        let first = std::fs::read_dir(fixtures().join(case))
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                let n = p.file_name().unwrap().to_string_lossy();
                n.starts_with("_dump_") || n.starts_with("fr_trace_rank_")
            })
            .unwrap();
        let bytes = std::fs::read(&first).unwrap();
        // Random bytes named like a dump, a cut copy of a real one, a
        // second (empty) dump of rank 0, and a foreign JSON file.
        let noise: Vec<u8> = (0..4096u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        std::fs::write(tmp.path().join("_dump_3.bak7"), &noise).unwrap();
        std::fs::write(tmp.path().join("copy_of_rank_5"), &bytes[..bytes.len() / 3]).unwrap();
        std::fs::write(
            tmp.path().join("old_trace_rank_0.json"),
            br#"{"version": "2.10", "entries": [], "pg_config": {}, "pg_status": {}}"#,
        )
        .unwrap();
        std::fs::write(tmp.path().join("package.json"), br#"{"name": "x"}"#).unwrap();
        let r = judge(tmp.path(), &HangConfig::default());
        assert_eq!(verdict_json(&r), want, "{case}: {:?}", r.notes);
        for f in [
            "_dump_3.bak7",
            "copy_of_rank_5",
            "old_trace_rank_0.json",
            "package.json",
        ] {
            assert!(
                r.notes.iter().any(|n| n.contains(f)),
                "{case}: {f} not named: {:?}",
                r.notes
            );
        }
    }
}

#[test]
fn world_sizes_of_real_jobs_stay_bounded() {
    let dir = fixtures().join("nvrx-lock-gil-1st");
    let small = judge(&dir, &HangConfig::default());
    for world in [10_000u32, 1_000_000, whyslow_model::hang::MAX_WORLD_SIZE] {
        let cfg = HangConfig {
            world_size: Some(world),
            ..Default::default()
        };
        cfg.validate().unwrap();
        let r = judge(&dir, &cfg);
        // 16 ranks read, the rest one run: the same culprits first, then the
        // silent ranks as one range, waited for by the default group.
        assert!(r.ranks.len() <= 17, "{world}: {} lines", r.ranks.len());
        let silent = r.ranks.last().unwrap();
        assert_eq!((silent.rank, silent.last_rank), (16, Some(world - 1)));
        let named: Vec<u32> = culprits(&r).into_iter().filter(|&c| c < 16).collect();
        assert_eq!(named, culprits(&small), "{world}");
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.len() < 200_000, "{world}: {} bytes", json.len());
        assert!(r
            .notes
            .iter()
            .any(|n| n.contains(&format!("16-{}", world - 1))));
    }
    for bad in [0u32, whyslow_model::hang::MAX_WORLD_SIZE + 1, u32::MAX] {
        let cfg = HangConfig {
            world_size: Some(bad),
            ..Default::default()
        };
        assert!(cfg.validate().is_err(), "{bad}");
    }
}
