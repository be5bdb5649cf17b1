//! Hang evidence from a node agent's collective records
//! (`whyslow_model::hang::records`), judged by the hang analysis: shared
//! gloo group names split into the real groups, an open record names the
//! rank that never entered (SysOM-AI §3.2).

use std::collections::BTreeSet;

use whyslow_hang::{analyze, HangConfig};
use whyslow_model::collective::CollectiveRecord;
use whyslow_model::hang::records::{any_open, evidence_from_records};
use whyslow_model::hang::HangReason;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn rec(
    gr: u32,
    local: u32,
    group: &str,
    seq: u64,
    entry: u64,
    exit: u64,
    open: bool,
) -> CollectiveRecord {
    CollectiveRecord {
        rank: local,
        global_rank: Some(gr),
        group: group.into(),
        op: "allreduce".into(),
        seq: Some(seq),
        entry_ns: entry,
        exit_ns: exit,
        bytes: 4096,
        source: "gloo-uprobe".into(),
        open,
    }
}

/// 2 dp x 2 tp as the agent names them: every rank's first size-2
/// group is its tp group (`j/gloo2#0`, {0,1} and {2,3} alike), the
/// second its dp group (`j/gloo2#1`, {0,2} and {1,3}), then the world.
/// Healthy steps 1..=10; at step 11 `culprit` issues nothing.
fn job(culprit: Option<u32>) -> Vec<CollectiveRecord> {
    let tp = |r: u32| (r / 2, r % 2);
    let dp = |r: u32| (r % 2, r / 2);
    let mut out = Vec::new();
    // Members of an instance finish within µs of each other; the two
    // instances of a name finish a few hundred µs apart, varying.
    let mut rng = whyslow_model::rng::SplitMix64::new(7);
    for step in 1..=10u64 {
        let t = step * S;
        let tp_end = [t + 10 * MS, t + 10 * MS + rng.below(900_000) + 100_000];
        let dp_end = [t + 30 * MS, t + 30 * MS + rng.below(900_000) + 100_000];
        for r in 0..4u32 {
            let jitter = r as u64 * MS / 4;
            let us = rng.below(20_000);
            out.push(rec(
                r,
                tp(r).1,
                "j/gloo2#0",
                step,
                t + jitter,
                tp_end[tp(r).0 as usize] + us,
                false,
            ));
            out.push(rec(
                r,
                dp(r).1,
                "j/gloo2#1",
                step,
                t + 20 * MS + jitter,
                dp_end[dp(r).0 as usize] + us,
                false,
            ));
            out.push(rec(
                r,
                r,
                "j/gloo4#0",
                step,
                t + 40 * MS + jitter,
                t + 50 * MS + us,
                false,
            ));
        }
    }
    if let Some(c) = culprit {
        // Step 11: the culprit's tp partner waits in tp; the other tp
        // pair finishes tp and waits in dp (one for the culprit, one
        // for the partner stuck in tp). Seen open 30 s later.
        let t = 11 * S;
        let seen = t + 30 * S;
        let partner = c ^ 1;
        out.push(rec(partner, tp(partner).1, "j/gloo2#0", 11, t, seen, true));
        for r in (0..4).filter(|r| r / 2 != c / 2) {
            out.push(rec(r, tp(r).1, "j/gloo2#0", 11, t, t + 10 * MS, false));
            out.push(rec(r, dp(r).1, "j/gloo2#1", 11, t + 20 * MS, seen, true));
        }
    }
    out
}

#[test]
fn shared_names_split_into_the_real_groups() {
    let ev = evidence_from_records(&job(None));
    let groups: BTreeSet<(String, Vec<u32>)> = ev
        .ranks
        .iter()
        .flat_map(|r| r.groups.iter())
        .map(|g| (g.name.clone(), g.ranks.clone().unwrap()))
        .collect();
    let sets: BTreeSet<Vec<u32>> = groups.iter().map(|g| g.1.clone()).collect();
    let want: BTreeSet<Vec<u32>> = [
        vec![0, 1],
        vec![2, 3],
        vec![0, 2],
        vec![1, 3],
        vec![0, 1, 2, 3],
    ]
    .into_iter()
    .collect();
    assert_eq!(sets, want, "{groups:?}");
}

#[test]
fn open_records_name_the_rank_that_never_entered() {
    for culprit in 0..4 {
        let records = job(Some(culprit));
        assert!(any_open(&records));
        let r = analyze(&evidence_from_records(&records), &HangConfig::default());
        assert!(r.hang, "{r:?}");
        assert_eq!(
            r.culprits
                .iter()
                .map(|c| (c.rank, c.reason))
                .collect::<Vec<_>>(),
            vec![(culprit, HangReason::NeverReached)],
            "culprit {culprit}: {r:?}"
        );
        assert_eq!(r.culprits[0].waited_by.len(), 3, "{r:?}");
    }
}

#[test]
fn finished_records_alone_are_no_hang() {
    let records = job(None);
    assert!(!any_open(&records));
    let r = analyze(&evidence_from_records(&records), &HangConfig::default());
    assert!(!r.hang && r.culprits.is_empty(), "{r:?}");
}
