//! PyTorch Flight Recorder dumps (PerfTracker §4.1: a blocked job), torch's
//! pickle (decoded as data by [`pickle`]) or JSON, decoded into a rank's
//! groups, progress counters and collectives.

use std::collections::{BTreeMap, BTreeSet};

use whyslow_model::hang::{
    CollectiveState, GroupInfo, GroupProgress, RecordedCollective, StackFrame, MAX_RANK,
};

use crate::pickle::{self, Value};

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
