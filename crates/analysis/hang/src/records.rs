//! Hang evidence from collective records alone (a node agent's
//! `*.collectives.jsonl`, SysOM-AI §3.2): a call the agent saw in flight for
//! long is written as an open record; every rank's last records per group
//! give its progress, as a Flight Recorder's counters do.
//!
//! The agent names a gloo group by its size and the order a process first
//! used it (`job/gloo2#0`), so two disjoint groups of one size (tensor
//! parallel {0,1} and {2,3}) can share a name. Where two ranks hold the same
//! rank within one such name, the name is split into the groups whose
//! members' calls of one instance overlap in time (a collective's members
//! are all inside it together).

use std::collections::{BTreeMap, BTreeSet};

use whyslow_model::collective::CollectiveRecord;
use whyslow_model::hang::{
    CollectiveState, GroupInfo, GroupProgress, HangEvidence, RankEvidence, RecordedCollective,
};

/// Instances of a group compared when splitting a shared name.
const SPLIT_INSTANCES: usize = 64;

fn find(parent: &mut BTreeMap<u32, u32>, x: u32) -> u32 {
    let mut r = x;
    while let Some(&p) = parent.get(&r) {
        if p == r {
            break;
        }
        r = p;
    }
    parent.insert(x, r);
    r
}

/// The members of each group name, split where the name is shared.
fn instances(records: &[&CollectiveRecord]) -> BTreeMap<(String, u32), String> {
    let mut by_group: BTreeMap<&str, Vec<&CollectiveRecord>> = BTreeMap::new();
    for r in records {
        by_group.entry(r.group.as_str()).or_default().push(r);
    }
    let mut out = BTreeMap::new();
    for (g, rs) in by_group {
        let mut local: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for r in &rs {
            local
                .entry(r.rank)
                .or_default()
                .insert(r.global_rank.unwrap_or(u32::MAX));
        }
        let shared = local.values().any(|s| s.len() > 1);
        let globals: BTreeSet<u32> = rs.iter().filter_map(|r| r.global_rank).collect();
        if !shared {
            for &gr in &globals {
                out.insert((g.to_string(), gr), g.to_string());
            }
            continue;
        }
        // Members of one instance finish it together: pair ranks by how
        // close their finishes of the same sequence numbers are, closest
        // first, never two with one local rank in a group.
        let mut exits: BTreeMap<u32, BTreeMap<u64, u64>> = BTreeMap::new();
        let mut local_of: BTreeMap<u32, u32> = BTreeMap::new();
        for r in rs.iter().filter(|r| !r.open) {
            if let (Some(gr), Some(s)) = (r.global_rank, r.seq) {
                exits.entry(gr).or_default().insert(s, r.exit_ns);
                local_of.insert(gr, r.rank);
            }
        }
        let size = local.len();
        let mut pairs = Vec::new();
        let gl: Vec<u32> = globals.iter().copied().collect();
        for (i, &a) in gl.iter().enumerate() {
            for &b in &gl[i + 1..] {
                if local_of.get(&a) == local_of.get(&b) {
                    continue;
                }
                let (Some(ea), Some(eb)) = (exits.get(&a), exits.get(&b)) else {
                    continue;
                };
                let mut d: Vec<u64> = ea
                    .iter()
                    .rev()
                    .filter_map(|(s, x)| eb.get(s).map(|y| x.abs_diff(*y)))
                    .take(SPLIT_INSTANCES)
                    .collect();
                if d.is_empty() {
                    continue;
                }
                d.sort_unstable();
                pairs.push((d[d.len() / 2], a, b));
            }
        }
        pairs.sort_unstable();
        let mut parent: BTreeMap<u32, u32> = globals.iter().map(|&r| (r, r)).collect();
        let mut locals: BTreeMap<u32, BTreeSet<u32>> = globals
            .iter()
            .map(|&r| (r, local_of.get(&r).copied().into_iter().collect()))
            .collect();
        for (_, a, b) in pairs {
            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
            if ra == rb {
                continue;
            }
            let (la, lb) = (&locals[&ra], &locals[&rb]);
            if !la.is_disjoint(lb) || la.len() + lb.len() > size {
                continue;
            }
            let merged: BTreeSet<u32> = la.union(lb).copied().collect();
            let (lo, hi) = (ra.min(rb), ra.max(rb));
            parent.insert(hi, lo);
            locals.insert(lo, merged);
        }
        for &gr in &globals {
            let root = find(&mut parent, gr);
            out.insert((g.to_string(), gr), format!("{g}@{root}"));
        }
    }
    out
}

/// Per rank, the groups, progress and calls its records show; a rank's
/// evidence is as of the last time the agent saw it (its latest record).
pub fn evidence_from_records(records: &[CollectiveRecord]) -> HangEvidence {
    let usable: Vec<&CollectiveRecord> = records
        .iter()
        .filter(|r| {
            r.global_rank
                .is_some_and(|g| g <= whyslow_model::hang::MAX_RANK)
                && r.seq.is_some()
        })
        .collect();
    let names = instances(&usable);
    let mut members: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
    for ((_, gr), name) in &names {
        members.entry(name.clone()).or_default().insert(*gr);
    }
    let mut ranks: BTreeMap<u32, RankEvidence> = BTreeMap::new();
    let mut sorted = usable;
    sorted.sort_by_key(|r| (r.global_rank, r.entry_ns));
    for r in sorted {
        let gr = r.global_rank.expect("filtered");
        let seq = r.seq.expect("filtered");
        let name = names[&(r.group.clone(), gr)].clone();
        let ev = ranks.entry(gr).or_insert_with(|| RankEvidence {
            rank: gr,
            ..Default::default()
        });
        let done = !r.open;
        match ev.progress.iter_mut().find(|p| p.group == name) {
            Some(p) => {
                p.last_enqueued = p.last_enqueued.max(Some(seq));
                if done {
                    p.last_completed = p.last_completed.max(Some(seq));
                }
            }
            None => ev.progress.push(GroupProgress {
                group: name.clone(),
                last_enqueued: Some(seq),
                last_started: None,
                last_completed: done.then_some(seq),
            }),
        }
        if !ev.groups.iter().any(|g| g.name == name) {
            ev.groups.push(GroupInfo {
                name: name.clone(),
                desc: String::new(),
                ranks: members.get(&name).map(|m| m.iter().copied().collect()),
            });
        }
        ev.dumped_at_ns = ev.dumped_at_ns.max(Some(r.exit_ns));
        ev.collectives.push(RecordedCollective {
            group: name,
            seq,
            p2p: matches!(r.op.as_str(), "send" | "recv"),
            op: r.op.clone(),
            input_sizes: Vec::new(),
            output_sizes: Vec::new(),
            dtypes: Vec::new(),
            state: if done {
                CollectiveState::Completed
            } else {
                CollectiveState::Started
            },
            created_ns: Some(r.entry_ns),
            frames: Vec::new(),
            peer: None,
        });
    }
    // The agents watch every rank at once: a rank with no open record was
    // seen not waiting as of the latest observation, not as of its own last
    // call. (A per-rank "dump time" would make the rank that never entered
    // look like a stale snapshot.)
    let seen = ranks.values().filter_map(|e| e.dumped_at_ns).max();
    for e in ranks.values_mut() {
        e.dumped_at_ns = seen;
    }
    HangEvidence {
        ranks: ranks.into_values().collect(),
        world_size: None,
        notes: Vec::new(),
    }
}

/// Whether the records hold any call seen in flight (worth a hang check).
pub fn any_open(records: &[CollectiveRecord]) -> bool {
    records.iter().any(|r| r.open)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{analyze, HangConfig};
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
}
