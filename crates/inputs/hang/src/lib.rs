//! Reads what the ranks of a hung job left behind into
//! [`HangEvidence`] (PerfTracker §4.1: a blocked job; `whyslow hang`):
//!
//! * PyTorch Flight Recorder dumps, in torch's pickle format (versions 2.x,
//!   NCCL and gloo process groups; decoded as data by [`pickle`], never by
//!   running an unpickler) or as JSON (`_dump_fr_trace_json`). The rank is
//!   the trailing integer of the file name, as torch names them
//!   (`nccl_trace_rank_3`), unless the dump carries its own `rank`;
//! * whyslow's own files: `stacks-rank<r>.json` (every thread's stack,
//!   the rank's process groups, when it was taken) and the older
//!   `blocked-rank<r>-<time>.txt`;
//! * a node agent's collective records (`*.collectives.jsonl`).
//!
//! A damaged or foreign file gets one note naming it; the rest are still
//! read. Only a folder that cannot be listed is an error.
#![deny(missing_docs)]

pub mod pickle;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use whyslow_model::hang::{
    CollectiveState, GroupInfo, GroupProgress, HangEvidence, RankEvidence, RecordedCollective,
    StackFrame, ThreadStack, MAX_RANK,
};

use pickle::Value;

/// A folder that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{}: cannot list the folder: {cause}", path.display())]
pub struct HangInputError {
    /// The folder.
    pub path: PathBuf,
    /// Why (in the message, not a second link of the error chain: one
    /// cause, said once).
    pub cause: std::io::Error,
}

/// Why one file was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    /// Not a pickle that decodes, nor JSON.
    #[error("not a Flight Recorder dump (pickle: {0})")]
    Pickle(#[from] pickle::PickleError),
    /// JSON that does not parse.
    #[error("not a Flight Recorder dump (JSON: {0})")]
    Json(String),
    /// Decodes, but is not shaped like a dump.
    #[error("not a Flight Recorder dump: {0}")]
    Shape(String),
    /// No rank in the dump or the file name.
    #[error("no rank: neither the dump nor the file name (a trailing integer) gives one")]
    NoRank,
}

/// A Flight Recorder dump decoded: the rank's groups, progress and
/// collectives.
#[derive(Debug, Clone, PartialEq)]
pub struct FlightRecorderDump {
    /// The rank the dump says it is from, if it says.
    pub rank: Option<u32>,
    /// Format version (`2.10`).
    pub version: String,
    /// Groups with members (NCCL's `pg_config`).
    pub groups: Vec<GroupInfo>,
    /// Per-group counters (`pg_status`) of collectives, for the groups the
    /// entries name. Counters of a group whose newest work was
    /// point-to-point are left out: NCCL then counts its `p2p_seq_id`, which
    /// does not pair across the group's members.
    pub progress: Vec<GroupProgress>,
    /// Counters keyed by the process's own group index (`pg_id`) that no
    /// entry names (a dump of a rank with nothing pending): the reader of a
    /// whole folder maps them through other ranks' dumps.
    pub unnamed_progress: BTreeMap<String, GroupProgress>,
    /// `pg_id` → group name, as the entries show it.
    pub pg_names: BTreeMap<String, (String, String)>,
    /// Every `pg_id` of `pg_status`: which groups the process created, a
    /// signature of its place in the job's layout.
    pub status_keys: BTreeSet<String>,
    /// Entries, oldest first.
    pub collectives: Vec<RecordedCollective>,
    /// Per entry, a point-to-point op's (own, peer) ranks as its name
    /// writes them (world or group ranks).
    pub p2p_ranks: Vec<Option<(u32, u32)>>,
    /// The newest time the dump records (an entry issued, started or seen
    /// finished), Unix ns. torch writes no time of the dump itself, so this
    /// is no age: it only tells which of two dumps of one rank is later.
    pub newest_event_ns: Option<u64>,
}

impl FlightRecorderDump {
    /// Sets each point-to-point entry's `peer` (a world rank) as seen from
    /// `rank` (the dump's own, else the one its file name gives).
    pub fn with_peers(mut self, rank: Option<u32>) -> Self {
        for (c, raw) in self.collectives.iter_mut().zip(&self.p2p_ranks) {
            if let Some((me, peer)) = raw {
                let members = self
                    .groups
                    .iter()
                    .find(|g| g.name == c.group)
                    .and_then(|g| g.ranks.as_deref());
                c.peer = resolve_peer(*me, *peer, rank, members);
            }
        }
        self
    }
}

/// Decodes a dump from its bytes (pickle, or JSON when it starts with `{`).
pub fn read_dump(bytes: &[u8]) -> Result<FlightRecorderDump, DumpError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if first.is_none() {
        return Err(DumpError::Shape("the file is empty".into()));
    }
    let v = if first == Some(b'{') {
        let j: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| DumpError::Json(e.to_string()))?;
        from_json(&j)
    } else {
        pickle::loads(bytes)?
    };
    from_value(&v)
}

fn from_json(j: &serde_json::Value) -> Value {
    match j {
        serde_json::Value::Null => Value::None,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Value::Int(i),
            None => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        serde_json::Value::String(s) => Value::Str(s.clone()),
        serde_json::Value::Array(a) => Value::List(a.iter().map(from_json).collect()),
        serde_json::Value::Object(o) => {
            Value::Dict(o.iter().map(|(k, v)| (k.clone(), from_json(v))).collect())
        }
    }
}

fn int(v: Option<&Value>) -> Option<i64> {
    v.and_then(|v| match v {
        Value::Str(s) => s.trim().parse().ok(),
        other => other.as_i64(),
    })
}

fn text(v: Option<&Value>) -> String {
    v.and_then(Value::as_str).unwrap_or_default().to_string()
}

fn sizes(v: Option<&Value>) -> Vec<Vec<i64>> {
    v.and_then(Value::as_seq)
        .map(|outer| {
            outer
                .iter()
                .map(|s| {
                    s.as_seq()
                        .map(|d| d.iter().filter_map(Value::as_i64).collect())
                        .unwrap_or_default()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `"[0, 1, 2]"` (how torch writes members) or a list.
fn ranks_of(v: Option<&Value>) -> Option<Vec<u32>> {
    match v? {
        Value::Str(s) => {
            let inner = s.trim().trim_start_matches('[').trim_end_matches(']');
            if inner.trim().is_empty() {
                return Some(Vec::new());
            }
            inner
                .split(',')
                .map(|x| x.trim().parse::<u32>().ok().filter(|&r| r <= MAX_RANK))
                .collect()
        }
        other => other.as_seq().map(|s| {
            s.iter()
                .filter_map(|x| x.as_i64().and_then(|i| u32::try_from(i).ok()))
                .filter(|&r| r <= MAX_RANK)
                .collect()
        }),
    }
}

fn counter(v: Option<&Value>) -> Option<u64> {
    int(v).and_then(|i| u64::try_from(i).ok())
}

/// `send 0->3` / `recv 0<-3` (torch's profiling name without its backend):
/// the op and the two ranks as written (self, peer).
fn p2p_parts(name: &str) -> Option<(&str, u32, u32)> {
    let (op, ranks) = name.split_once(' ')?;
    let (a, b) = match op {
        "send" => ranks.split_once("->")?,
        "recv" => ranks.split_once("<-")?,
        _ => return None,
    };
    Some((op, a.trim().parse().ok()?, b.trim().parse().ok()?))
}

/// The peer's world rank. torch writes either world ranks or the group's
/// own ranks (both occur in one Megatron dump): world ranks when `me` is
/// this rank and the peer a member, else group ranks, indices into the
/// group's members in order.
fn resolve_peer(me: u32, peer: u32, rank: Option<u32>, members: Option<&[u32]>) -> Option<u32> {
    let members = members?;
    let rank = rank?;
    if me == rank && members.contains(&peer) && peer != rank {
        return Some(peer);
    }
    if members.get(me as usize) == Some(&rank) {
        return members.get(peer as usize).copied();
    }
    None
}

fn from_value(v: &Value) -> Result<FlightRecorderDump, DumpError> {
    let Value::Dict(top) = v else {
        return Err(DumpError::Shape("the top level is not a dict".into()));
    };
    let entries = top
        .get("entries")
        .and_then(Value::as_seq)
        .ok_or_else(|| DumpError::Shape("no `entries` list".into()))?;
    let version = match top.get("version") {
        Some(Value::Str(s)) => s.clone(),
        Some(Value::Float(f)) => f.to_string(),
        Some(Value::Int(i)) => i.to_string(),
        _ => return Err(DumpError::Shape("no `version`".into())),
    };
    let mut pg_names: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut collectives = Vec::with_capacity(entries.len());
    let mut p2p_raw: Vec<Option<(u32, u32)>> = Vec::with_capacity(entries.len());
    let mut newest_event_ns = None;
    for e in entries {
        let Value::Dict(_) = e else { continue };
        let (collective, p2p_ranks, newest) = read_entry(e, &mut pg_names);
        collectives.push(collective);
        p2p_raw.push(p2p_ranks);
        newest_event_ns = newest_event_ns.max(newest);
    }
    let mut groups = config_groups(top);
    let rank = counter(top.get("rank")).and_then(|r| u32::try_from(r).ok());
    let (progress, unnamed_progress, status_keys) = group_progress(top, &pg_names, &collectives);
    name_groups(&mut groups, &pg_names);
    Ok(FlightRecorderDump {
        rank,
        version,
        groups,
        progress,
        unnamed_progress,
        pg_names,
        status_keys,
        collectives,
        p2p_ranks: p2p_raw,
        newest_event_ns,
    }
    .with_peers(rank))
}

/// One Flight Recorder entry as a recorded collective, with its p2p ranks
/// (me, peer) and its newest event time; its group's name and description
/// go into `pg_names` under its `pg_id`.
fn read_entry(
    e: &Value,
    pg_names: &mut BTreeMap<String, (String, String)>,
) -> (RecordedCollective, Option<(u32, u32)>, Option<u64>) {
    let (group, desc) = match e.get("process_group").and_then(Value::as_seq) {
        Some([name, desc, ..]) => (text(Some(name)), text(Some(desc))),
        _ => (text(e.get("process_group")), String::new()),
    };
    let pg_id = int(e.get("pg_id"))
        .map(|i| i.to_string())
        .unwrap_or_default();
    if !pg_id.is_empty() {
        pg_names.insert(pg_id, (group.clone(), desc.clone()));
    }
    let p2p = matches!(e.get("is_p2p"), Some(Value::Bool(true)));
    let seq = if p2p {
        counter(e.get("p2p_seq_id"))
    } else {
        counter(e.get("collective_seq_id")).or_else(|| counter(e.get("seq_id")))
    }
    .unwrap_or(0);
    let name = text(e.get("profiling_name"));
    let mut op = name.rsplit(':').next().unwrap_or_default().to_string();
    let mut p2p_ranks = None;
    if p2p {
        if let Some((kind, me, peer)) = p2p_parts(&op) {
            p2p_ranks = Some((me, peer));
            op = kind.to_string();
        }
    }
    let retired = matches!(e.get("retired"), Some(Value::Bool(true)));
    let state = match text(e.get("state")).as_str() {
        _ if retired => CollectiveState::Completed,
        "completed" => CollectiveState::Completed,
        "started" => CollectiveState::Started,
        _ => CollectiveState::Scheduled,
    };
    let frames = e
        .get("frames")
        .and_then(Value::as_seq)
        .unwrap_or_default()
        .iter()
        .map(|f| StackFrame {
            function: text(f.get("name")),
            file: text(f.get("filename")),
            line: counter(f.get("line")).unwrap_or(0) as u32,
        })
        .collect();
    let collective = RecordedCollective {
        group,
        seq,
        p2p,
        op,
        input_sizes: sizes(e.get("input_sizes")),
        output_sizes: sizes(e.get("output_sizes")),
        dtypes: e
            .get("input_dtypes")
            .and_then(Value::as_seq)
            .unwrap_or_default()
            .iter()
            .map(|d| text(Some(d)))
            .collect(),
        state,
        created_ns: counter(e.get("time_created_ns")),
        frames,
        peer: None,
    };
    let mut newest_event_ns = None;
    for k in [
        "time_created_ns",
        "time_discovered_started_ns",
        "time_discovered_completed_ns",
    ] {
        newest_event_ns = newest_event_ns.max(counter(e.get(k)));
    }
    (collective, p2p_ranks, newest_event_ns)
}

/// The groups `pg_config` describes (gloo's nameless entry left out).
fn config_groups(top: &BTreeMap<String, Value>) -> Vec<GroupInfo> {
    let mut groups = Vec::new();
    if let Some(Value::Dict(cfg)) = top.get("pg_config") {
        for (key, g) in cfg {
            let name = match text(g.get("name")) {
                n if n.is_empty() => key.clone(),
                n => n,
            };
            // gloo's dumps carry one nameless entry that describes no group.
            if name.is_empty() {
                continue;
            }
            groups.push(GroupInfo {
                name,
                desc: text(g.get("desc")),
                ranks: ranks_of(g.get("ranks")),
            });
        }
    }
    groups
}

/// `pg_status`'s counters per group: named through `pg_names` (a group whose
/// newest entry is p2p is left out: its counters are p2p's), the unnamed
/// ones apart, and every key seen.
#[allow(clippy::type_complexity)]
fn group_progress(
    top: &BTreeMap<String, Value>,
    pg_names: &BTreeMap<String, (String, String)>,
    collectives: &[RecordedCollective],
) -> (
    Vec<GroupProgress>,
    BTreeMap<String, GroupProgress>,
    BTreeSet<String>,
) {
    let mut progress = Vec::new();
    let mut unnamed_progress = BTreeMap::new();
    let mut status_keys = BTreeSet::new();
    if let Some(Value::Dict(status)) = top.get("pg_status") {
        for (pg_id, s) in status {
            status_keys.insert(pg_id.clone());
            let counters = GroupProgress {
                group: String::new(),
                last_enqueued: counter(s.get("last_enqueued_collective")),
                last_started: counter(s.get("last_started_collective")),
                last_completed: counter(s.get("last_completed_collective")),
            };
            // Keys are the process's group indices (`pg_id`); entries map
            // them to the group's name, which every rank shares.
            let Some((name, _)) = pg_names.get(pg_id) else {
                unnamed_progress.insert(pg_id.clone(), counters);
                continue;
            };
            let newest_is_p2p = collectives
                .iter()
                .rev()
                .find(|c| &c.group == name)
                .is_some_and(|c| c.p2p);
            if newest_is_p2p {
                continue;
            }
            progress.push(GroupProgress {
                group: name.clone(),
                ..counters
            });
        }
    }
    (progress, unnamed_progress, status_keys)
}

/// Groups the entries name but `pg_config` does not, added; descriptions
/// filled in from the entries.
fn name_groups(groups: &mut Vec<GroupInfo>, pg_names: &BTreeMap<String, (String, String)>) {
    for (name, desc) in pg_names.values() {
        if !groups.iter().any(|g| &g.name == name) {
            groups.push(GroupInfo {
                name: name.clone(),
                desc: desc.clone(),
                ranks: None,
            });
        } else if let Some(g) = groups.iter_mut().find(|g| &g.name == name) {
            if g.desc.is_empty() {
                g.desc = desc.clone();
            }
        }
    }
}

/// The trailing integer of a file name (`nccl_trace_rank_12` → 12).
pub fn trailing_rank(name: &str) -> Option<u32> {
    let stem = name.strip_suffix(".json").unwrap_or(name);
    let digits: String = stem
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if digits.is_empty() {
        None
    } else {
        digits.parse().ok()
    }
}

/// whyslow's `stacks-rank<r>.json` (written by the online package).
#[derive(Debug, Clone, serde::Deserialize)]
struct StacksDoc {
    format: String,
    rank: u32,
    #[serde(default)]
    dumped_at_ns: Option<u64>,
    #[serde(default = "python")]
    source: String,
    #[serde(default)]
    threads: Vec<ThreadDoc>,
    #[serde(default)]
    groups: Vec<GroupInfo>,
    #[serde(default)]
    exited: bool,
}

fn python() -> String {
    "python".to_string()
}

#[derive(Debug, Clone, serde::Deserialize)]
struct ThreadDoc {
    thread: String,
    frames: Vec<StackFrame>,
}

/// Reads whyslow's `blocked-rank<r>-<time>.txt`: `--- thread NAME` then
/// Python's `traceback.format_stack` text (outermost first).
pub fn read_blocked_text(text: &str) -> Vec<ThreadStack> {
    let mut out: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("--- thread ") {
            out.push(ThreadStack {
                thread: name.trim().to_string(),
                frames: Vec::new(),
                source: "python".into(),
                taken_at_ns: None,
            });
            continue;
        }
        let l = line.trim_start();
        let Some(rest) = l.strip_prefix("File \"") else {
            continue;
        };
        let Some(cur) = out.last_mut() else { continue };
        // File "path", line N, in func
        let Some((file, rest)) = rest.split_once("\", line ") else {
            continue;
        };
        let (line_no, func) = match rest.split_once(", in ") {
            Some((n, f)) => (n.trim().parse().unwrap_or(0), f.trim().to_string()),
            None => (rest.trim().parse().unwrap_or(0), String::new()),
        };
        cur.frames.push(StackFrame {
            function: func,
            file: file.to_string(),
            line: line_no,
        });
    }
    for t in &mut out {
        t.frames.reverse();
    }
    out
}

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

fn rank_entry(ranks: &mut BTreeMap<u32, RankEvidence>, r: u32) -> &mut RankEvidence {
    ranks.entry(r).or_insert_with(|| RankEvidence {
        rank: r,
        ..Default::default()
    })
}

fn merge_groups(into: &mut Vec<GroupInfo>, from: Vec<GroupInfo>) {
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

/// Collective record files (`*.collectives.jsonl`) stand in for ranks
/// without Flight Recorder state.
fn attach_records(
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
fn attach_profiles(dir: &Path, ranks: &mut BTreeMap<u32, RankEvidence>, notes: &mut Vec<String>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailing_rank_as_torch_names_files() {
        assert_eq!(trailing_rank("nccl_trace_rank_12"), Some(12));
        assert_eq!(trailing_rank("fr_trace_rank_0.json"), Some(0));
        assert_eq!(trailing_rank("README"), None);
    }

    #[test]
    fn blocked_text_is_innermost_first() {
        let t = "--- thread main\n  File \"/a/train.py\", line 10, in <module>\n    main()\n  File \"/a/train.py\", line 5, in main\n    time.sleep(1)\n\n--- thread 1234\n  File \"/x.py\", line 1, in run\n";
        let s = read_blocked_text(t);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].thread, "main");
        assert_eq!(s[0].frames[0].function, "main");
        assert_eq!(s[0].frames[0].line, 5);
        assert_eq!(s[0].frames[1].function, "<module>");
        assert_eq!(s[1].frames[0].file, "/x.py");
    }
}
