//! Reading a hung job's folder (PerfTracker §4.1): every file found under
//! it sorted per rank, a note for each one not used, the dumps of one rank
//! weighed against each other and the counters no entry names mapped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use whyslow_model::hang::{
    GroupInfo, GroupProgress, HangEvidence, RankEvidence, ThreadStack, MAX_RANK,
};

use crate::agent::{attach_profiles, attach_records};
use crate::stacks::{read_blocked_text, StacksDoc};
use crate::{read_dump, trailing_rank, DumpError, FlightRecorderDump, HangInputError};

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), HangInputError> {
    let rd = std::fs::read_dir(dir).map_err(|cause| HangInputError {
        path: dir.to_path_buf(),
        cause,
    })?;
    let mut entries: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else {
            out.push(p);
        }
    }
    Ok(())
}

/// `r` when it can be a world rank, else a note.
fn plausible_rank(r: u32, shown: &str, notes: &mut Vec<String>) -> Option<u32> {
    if r <= MAX_RANK {
        Some(r)
    } else {
        notes.push(format!("{shown}: skipped: rank {r} is beyond {MAX_RANK}"));
        None
    }
}

pub(crate) fn rank_entry(ranks: &mut BTreeMap<u32, RankEvidence>, r: u32) -> &mut RankEvidence {
    ranks.entry(r).or_insert_with(|| RankEvidence {
        rank: r,
        ..Default::default()
    })
}

pub(crate) fn merge_groups(into: &mut Vec<GroupInfo>, from: Vec<GroupInfo>) {
    for g in from {
        match into.iter_mut().find(|x| x.name == g.name) {
            Some(x) => {
                if x.desc.is_empty() {
                    x.desc = g.desc;
                }
                if x.ranks.is_none() {
                    x.ranks = g.ranks;
                }
            }
            None => into.push(g),
        }
    }
}

/// Whether `kept` says more than `other` (two dumps of one rank: a rerun,
/// a copy, a file dumped twice): the newer by its own clock, else the one
/// with more entries and counters.
fn says_more(kept: &FlightRecorderDump, other: &FlightRecorderDump) -> bool {
    let weight = |d: &FlightRecorderDump| {
        (
            d.newest_event_ns,
            d.collectives.len() + d.progress.len() + d.unnamed_progress.len(),
        )
    };
    weight(kept) >= weight(other)
}

/// `0-3,7,9-12`.
pub fn compact(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j > i + 1 {
            format!("{}-{}", ranks[i], ranks[j])
        } else if j == i + 1 {
            format!("{},{}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// A rank with nothing pending leaves entries that name no group, so its
/// counters (keyed by the process's own group index, `pg_id`) name none
/// either. Programs create their groups in one order on every rank
/// (Megatron does), so other ranks' entries say which kind of group an
/// index is (its description); the rank's own `pg_config` then says which
/// group of that kind it belongs to. Only an index every rank reads alike
/// is mapped.
fn name_unnamed_progress(
    dumps: &mut BTreeMap<u32, (FlightRecorderDump, String)>,
    notes: &mut Vec<String>,
) {
    // Learned only from ranks that created the same groups (the same
    // layout): a first pipeline stage numbers its groups unlike a middle one.
    let mut kinds: BTreeMap<(&BTreeSet<String>, String), BTreeSet<String>> = BTreeMap::new();
    for (d, _) in dumps.values() {
        for (pg_id, (_, desc)) in &d.pg_names {
            kinds
                .entry((&d.status_keys, pg_id.clone()))
                .or_default()
                .insert(desc.clone());
        }
    }
    let kinds: BTreeMap<(BTreeSet<String>, String), BTreeSet<String>> = kinds
        .into_iter()
        .map(|((k, id), v)| ((k.clone(), id), v))
        .collect();
    let mut mapped = Vec::new();
    for (&r, (d, _)) in dumps.iter_mut() {
        let unnamed = std::mem::take(&mut d.unnamed_progress);
        for (pg_id, counters) in unnamed {
            let desc = match kinds.get(&(d.status_keys.clone(), pg_id.clone())) {
                Some(k) if k.len() == 1 => k.iter().next().cloned().unwrap_or_default(),
                _ => continue,
            };
            if desc.is_empty() {
                continue;
            }
            let mut candidates = d
                .groups
                .iter()
                .filter(|g| g.desc == desc && g.ranks.as_ref().is_none_or(|m| m.contains(&r)));
            let (Some(g), None) = (candidates.next(), candidates.next()) else {
                continue;
            };
            let name = g.name.clone();
            if d.progress.iter().any(|p| p.group == name) {
                continue;
            }
            d.progress.push(GroupProgress {
                group: name,
                ..counters
            });
            mapped.push(r);
        }
    }
    mapped.dedup();
    if !mapped.is_empty() {
        notes.push(format!(
            "rank(s) {}: counters of groups no entry names mapped through other ranks' dumps \
             (the same group index, the same kind of group)",
            compact(&mapped)
        ));
    }
}

/// Everything under `dir` (searched recursively), per rank.
pub fn read_dir(dir: &Path) -> Result<HangEvidence, HangInputError> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    let mut ranks: BTreeMap<u32, RankEvidence> = BTreeMap::new();
    let mut notes = Vec::new();
    let mut records = Vec::new();
    // Flight Recorder dumps per rank, with the file each came from; ages
    // come from the evidence's own clocks, never from file times (a copy
    // or a checkout resets those).
    let mut dumps: BTreeMap<u32, (FlightRecorderDump, String)> = BTreeMap::new();
    let mut has_profiles = false;
    for path in files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let shown = path.display().to_string();
        if name.starts_with("hang-report") || name == "timing.json" || name.starts_with('.') {
            continue;
        }
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) => {
                notes.push(format!("{shown}: cannot read: {e}"));
                continue;
            }
        };
        if name.ends_with(".collectives.jsonl") {
            records.push((shown, bytes));
            continue;
        }
        if name.ends_with(".pb.gz") || name.ends_with(".os.jsonl") {
            has_profiles |= name.ends_with(".pb.gz");
            continue;
        }
        if name.starts_with("blocked-rank") && name.ends_with(".txt") {
            read_blocked_file(&name, shown, &bytes, &mut ranks, &mut notes);
            continue;
        }
        if name.starts_with("stacks-rank") && name.ends_with(".json") {
            read_stacks_file(shown, &bytes, &mut ranks, &mut notes);
            continue;
        }
        read_dump_file(&name, shown, &bytes, &mut dumps, &mut notes);
    }
    name_unnamed_progress(&mut dumps, &mut notes);
    attach_dumps(dumps, &mut ranks, &mut notes);
    attach_records(&records, &mut ranks, &mut notes);
    if has_profiles {
        attach_profiles(dir, &mut ranks, &mut notes);
    }
    Ok(HangEvidence {
        ranks: ranks.into_values().collect(),
        world_size: None,
        notes,
    })
}

/// A `blocked-rank<R>-….txt` file: the rank's stacks as text (kept only
/// when no JSON stack file of the same moment says more).
fn read_blocked_file(
    name: &str,
    shown: String,
    bytes: &[u8],
    ranks: &mut BTreeMap<u32, RankEvidence>,
    notes: &mut Vec<String>,
) {
    let r = name["blocked-rank".len()..]
        .split('-')
        .next()
        .and_then(|s| s.parse::<u32>().ok());
    match r.and_then(|r| plausible_rank(r, &shown, notes)) {
        Some(r) => {
            let stacks = read_blocked_text(&String::from_utf8_lossy(bytes));
            let ev = rank_entry(ranks, r);
            ev.files.push(shown);
            // The JSON stacks of the same moment say more: keep the
            // text only when there are none.
            if ev.stacks.is_empty() {
                ev.stacks = stacks;
            }
        }
        None => notes.push(format!("{shown}: skipped: no rank in the name")),
    }
}

/// A `stacks-rank<R>.json` file (whyslow's own, `whyslow-hang-rank`).
fn read_stacks_file(
    shown: String,
    bytes: &[u8],
    ranks: &mut BTreeMap<u32, RankEvidence>,
    notes: &mut Vec<String>,
) {
    match serde_json::from_slice::<StacksDoc>(bytes) {
        Ok(doc) if doc.format == "whyslow-hang-rank" => {
            if plausible_rank(doc.rank, &shown, notes).is_none() {
                return;
            }
            let ev = rank_entry(ranks, doc.rank);
            ev.files.push(shown);
            ev.stacks = doc
                .threads
                .into_iter()
                .map(|t| ThreadStack {
                    thread: t.thread,
                    frames: t.frames,
                    source: doc.source.clone(),
                    taken_at_ns: doc.dumped_at_ns,
                })
                .collect();
            ev.dumped_at_ns = doc.dumped_at_ns.or(ev.dumped_at_ns);
            ev.exited |= doc.exited;
            merge_groups(&mut ev.groups, doc.groups);
        }
        Ok(doc) => notes.push(format!(
            "{shown}: skipped: format {:?}, not whyslow-hang-rank",
            doc.format
        )),
        Err(e) => notes.push(format!("{shown}: skipped: not a whyslow stack file: {e}")),
    }
}

/// A Flight Recorder dump (pickle or JSON), kept per rank: of two dumps of
/// one rank the one that says more.
fn read_dump_file(
    name: &str,
    shown: String,
    bytes: &[u8],
    dumps: &mut BTreeMap<u32, (FlightRecorderDump, String)>,
    notes: &mut Vec<String>,
) {
    let is_json = name.ends_with(".json");
    let named_rank = trailing_rank(name);
    if !is_json && named_rank.is_none() {
        notes.push(format!(
            "{shown}: skipped: not a dump (no rank at the end of its name)"
        ));
        return;
    }
    match read_dump(bytes) {
        Ok(d) => {
            let Some(r) = d.rank.or(named_rank) else {
                notes.push(format!("{shown}: skipped: {}", DumpError::NoRank));
                return;
            };
            let Some(r) = plausible_rank(r, &shown, notes) else {
                return;
            };
            let d = if d.rank.is_none() {
                d.with_peers(Some(r))
            } else {
                d
            };
            match dumps.get(&r) {
                Some((kept, _)) if says_more(kept, &d) => {
                    notes.push(format!(
                        "{shown}: set aside: a second dump of rank {r}, older or emptier than {}",
                        dumps[&r].1
                    ));
                    return;
                }
                Some((_, other)) => notes.push(format!(
                    "{other}: set aside: a second dump of rank {r}, older or emptier than {shown}"
                )),
                None => {}
            }
            dumps.insert(r, (d, shown));
        }
        Err(e) => notes.push(format!("{shown}: skipped: {e}")),
    }
}

/// Each rank's chosen dump into its evidence; a note for dumps without a
/// clock of their own.
fn attach_dumps(
    dumps: BTreeMap<u32, (FlightRecorderDump, String)>,
    ranks: &mut BTreeMap<u32, RankEvidence>,
    notes: &mut Vec<String>,
) {
    let mut unclocked = Vec::new();
    for (r, (d, shown)) in dumps {
        let ev = rank_entry(ranks, r);
        ev.files.push(shown);
        // torch writes no time of the dump: only the rank's own stack file,
        // written when the evidence was gathered, says when (the newest
        // event a dump records is when its rank last issued or finished
        // something, not how long it has waited since).
        if ev.dumped_at_ns.is_none() && !d.collectives.is_empty() {
            unclocked.push(r);
        }
        ev.fr_version = Some(d.version);
        merge_groups(&mut ev.groups, d.groups);
        ev.progress = d.progress;
        ev.collectives = d.collectives;
    }
    if !unclocked.is_empty() {
        notes.push(format!(
            "the dumps of rank(s) {} carry no time of their own (torch writes none) and no stack \
             file says when they were taken: how long their collectives had waited is unknown, \
             and they are judged as dumped at a stall",
            compact(&unclocked)
        ));
    }
}
