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

use crate::collective::CollectiveRecord;
use crate::hang::{
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
        .filter(|r| r.global_rank.is_some_and(|g| g <= crate::hang::MAX_RANK) && r.seq.is_some())
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
