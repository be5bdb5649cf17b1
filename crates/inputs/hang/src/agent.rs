//! A node agent's evidence of a hung job: its collective records
//! (`*.collectives.jsonl`) for ranks without Flight Recorder state, and
//! where a rank that could not answer was, from its CPU and off-CPU
//! profiles.

use std::collections::BTreeMap;
use std::path::Path;

use whyslow_model::hang::{RankEvidence, StackFrame, ThreadStack};

use crate::folder::{merge_groups, rank_entry};

/// Collective record files (`*.collectives.jsonl`) stand in for ranks
/// without Flight Recorder state.
pub(crate) fn attach_records(
    records: &[(String, Vec<u8>)],
    ranks: &mut BTreeMap<u32, RankEvidence>,
    notes: &mut Vec<String>,
) {
    let mut recs = Vec::new();
    for (shown, bytes) in records {
        parse_records(shown, bytes, &mut recs, notes);
    }
    if !recs.is_empty() {
        for from in whyslow_model::hang::records::evidence_from_records(&recs).ranks {
            let ev = rank_entry(ranks, from.rank);
            if ev.fr_version.is_some() {
                continue;
            }
            ev.files
                .push(format!("{} collective record file(s)", records.len()));
            merge_groups(&mut ev.groups, from.groups);
            ev.progress = from.progress;
            ev.collectives = from.collectives;
            ev.dumped_at_ns = ev.dumped_at_ns.or(from.dumped_at_ns);
        }
    }
}

/// A node agent's profiles: where a rank that could not answer was, seen
/// from outside (its last period's heaviest stacks, CPU and off-CPU).
pub(crate) fn attach_profiles(
    dir: &Path,
    ranks: &mut BTreeMap<u32, RankEvidence>,
    notes: &mut Vec<String>,
) {
    match whyslow_spool::read_spool(dir) {
        Ok(spool) => {
            for (r, stacks) in agent_stacks(&spool.evidence.profiles) {
                let ev = rank_entry(ranks, r);
                ev.stacks.extend(stacks);
            }
        }
        Err(e) => notes.push(format!("agent profiles not read: {e}")),
    }
}

/// Per rank, the heaviest stack of its latest CPU and off-CPU profile
/// (`source` `agent`), the one the rank spent its time in first: CPU when
/// it was on a CPU for most of that period, else off-CPU.
fn agent_stacks(
    profiles: &[whyslow_model::stack::StackProfile],
) -> BTreeMap<u32, Vec<ThreadStack>> {
    use whyslow_model::stack::FrameKind;
    let mut latest: BTreeMap<(u32, bool), &whyslow_model::stack::StackProfile> = BTreeMap::new();
    for p in profiles {
        let Some(rank) = p.labels.get("rank").and_then(|r| r.parse::<u32>().ok()) else {
            continue;
        };
        let offcpu = p.labels.get("kind").is_some_and(|k| k == "offcpu");
        let e = latest.entry((rank, offcpu)).or_insert(p);
        if p.start_unix_ns > e.start_unix_ns {
            *e = p;
        }
    }
    let mut out: BTreeMap<u32, Vec<(bool, ThreadStack)>> = BTreeMap::new();
    for ((rank, offcpu), p) in latest {
        let Some(top) = p.stacks.iter().max_by_key(|s| s.count) else {
            continue;
        };
        let frames = top
            .frames
            .iter()
            .rev()
            .filter_map(|&i| p.frames.get(i as usize))
            .filter(|f| f.kind != FrameKind::Label)
            .map(|f| StackFrame {
                function: f
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("0x{:x}", f.offset)),
                file: f.module.clone().unwrap_or_default(),
                line: f.line.unwrap_or(0),
            })
            .collect();
        let on_cpu =
            !offcpu && p.hz > 0.0 && p.total() as f64 >= 0.5 * p.hz * p.duration_ns as f64 / 1e9;
        out.entry(rank).or_default().push((
            on_cpu || offcpu,
            ThreadStack {
                thread: format!(
                    "main ({} profile, the node agent)",
                    if offcpu { "off-CPU" } else { "CPU" }
                ),
                frames,
                source: "agent".into(),
                taken_at_ns: Some(p.start_unix_ns + p.duration_ns),
            },
        ));
    }
    out.into_iter()
        .map(|(r, mut v)| {
            // The profile that accounts for the period first.
            v.sort_by_key(|(first, _)| !first);
            (r, v.into_iter().map(|(_, s)| s).collect())
        })
        .collect()
}

/// Collective records (one JSON per line); lines that do not parse are
/// counted in a note.
fn parse_records(
    shown: &str,
    bytes: &[u8],
    out: &mut Vec<whyslow_model::collective::CollectiveRecord>,
    notes: &mut Vec<String>,
) {
    let mut bad = 0usize;
    for line in String::from_utf8_lossy(bytes).lines() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(r) => out.push(r),
            Err(_) => bad += 1,
        }
    }
    if bad > 0 {
        notes.push(format!(
            "{shown}: {bad} line(s) skipped: not collective records"
        ));
    }
}
