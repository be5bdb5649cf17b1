//! Who waits where, and for whom: a rank's oldest unfinished collective per
//! group waits for the members that have not issued it; a point-to-point
//! send or receive waits for its one peer (NCCL's pipeline stages), and
//! never for the rest of the group.

use std::collections::{BTreeMap, BTreeSet};

use whyslow_model::hang::{CollectiveState, RecordedCollective};

use crate::job::Job;
use crate::ranks::RankRuns;

#[derive(Debug, Clone)]
pub(crate) struct Wait {
    pub rank: u32,
    pub group: String,
    pub seq: u64,
    pub op: String,
    pub sizes: Vec<Vec<i64>>,
    pub waited_s: Option<f64>,
    /// A send or receive: it waits for its peer alone.
    pub p2p: bool,
    /// Members with evidence it waits for.
    pub waits_for: BTreeSet<u32>,
    /// Members that left nothing it waits for.
    pub silent: RankRuns,
    pub not_started: BTreeSet<u32>,
}

impl Wait {
    /// Whether it waits for anyone at all.
    pub fn points(&self) -> bool {
        !self.waits_for.is_empty() || !self.silent.is_empty() || !self.not_started.is_empty()
    }
}

fn waited(job: &Job, r: u32, entry: Option<&RecordedCollective>) -> Option<f64> {
    let dumped = job.ranks.get(&r).and_then(|e| e.dumped_at_ns)?;
    let created = entry?.created_ns?;
    Some(dumped.saturating_sub(created) as f64 / 1e9)
}

/// The oldest unfinished collective per (rank, group), and how many were
/// too young to count.
pub(crate) fn collective_waits(job: &Job, min_wait_s: f64) -> (Vec<Wait>, usize) {
    let mut waits = Vec::new();
    let mut young = 0;
    for (&(r, ref g), p) in &job.progress {
        let Some(enq) = p.enqueued else { continue };
        if p.completed.is_some_and(|c| c >= enq) {
            continue;
        }
        let seq = p.completed.map_or(1, |c| c.saturating_add(1));
        let entry = job.entry(r, g, seq);
        let waited_s = waited(job, r, entry);
        if waited_s.is_some_and(|w| w < min_wait_s) {
            young += 1;
            continue;
        }
        waits.push(Wait {
            rank: r,
            group: g.clone(),
            seq,
            op: entry.map(|e| e.op.clone()).unwrap_or_default(),
            sizes: entry.map(|e| e.input_sizes.clone()).unwrap_or_default(),
            waited_s,
            p2p: false,
            waits_for: BTreeSet::new(),
            silent: RankRuns::default(),
            not_started: BTreeSet::new(),
        });
    }
    (waits, young)
}

fn complementary(a: &str, b: &str) -> bool {
    matches!((a, b), ("send", "recv") | ("recv", "send"))
}

/// Per rank and group, its unfinished sends and receives: it waits for
/// the peer of the first whose peer has not posted the matching half (a
/// batch's halves both sides posted go once that one does); when every
/// half is matched, its oldest waits for nobody (both sides are in: the
/// transfer waits on something else, e.g. a device).
pub(crate) fn p2p_waits(job: &Job, min_wait_s: f64) -> (Vec<Wait>, usize) {
    let pending = |e: &RecordedCollective| e.p2p && e.state != CollectiveState::Completed;
    let mut waits = Vec::new();
    let mut young = 0;
    for (&r, ev) in &job.ranks {
        let mut by_group: BTreeMap<&str, Vec<&RecordedCollective>> = BTreeMap::new();
        for c in ev.collectives.iter().filter(|c| pending(c)) {
            if c.peer.is_some_and(|q| q != r) {
                by_group.entry(c.group.as_str()).or_default().push(c);
            }
        }
        for (group, ops) in by_group {
            let matched = |c: &RecordedCollective| {
                let peer = c.peer.unwrap_or(u32::MAX);
                job.ranks.get(&peer).is_some_and(|pe| {
                    pe.collectives.iter().any(|x| {
                        pending(x)
                            && x.group == group
                            && x.peer == Some(r)
                            && complementary(&x.op, &c.op)
                    })
                })
            };
            let open = ops.iter().copied().find(|c| !matched(c));
            let c = open.unwrap_or(ops[0]);
            let waited_s = waited(job, r, Some(c));
            if waited_s.is_some_and(|w| w < min_wait_s) {
                young += 1;
                continue;
            }
            let mut w = Wait {
                rank: r,
                group: group.to_string(),
                seq: c.seq,
                op: c.op.clone(),
                sizes: c.input_sizes.clone(),
                waited_s,
                p2p: true,
                waits_for: BTreeSet::new(),
                silent: RankRuns::default(),
                not_started: BTreeSet::new(),
            };
            if let (Some(_), Some(peer)) = (open, c.peer) {
                if job.ranks.contains_key(&peer) {
                    w.waits_for.insert(peer);
                } else if peer < job.world {
                    w.silent = RankRuns::from_ranks([peer]);
                }
            }
            waits.push(w);
        }
    }
    (waits, young)
}

/// A collective's identity for pairing: op, sizes and where the program
/// issued it.
type Signature = (String, Vec<Vec<i64>>, String);

fn signature(c: &RecordedCollective) -> Signature {
    let site = c
        .call_site()
        .map(|f| format!("{}:{}", f.file, f.line))
        .unwrap_or_default();
    (c.op.clone(), c.input_sizes.clone(), site)
}

fn short(site: &str) -> String {
    match site.rsplit_once('/') {
        Some((_, s)) => s.to_string(),
        None => site.to_string(),
    }
}

/// What one pending instance of a group says.
#[derive(Debug, Default)]
struct Instance {
    laggards: BTreeSet<u32>,
    silent: RankRuns,
    not_started: BTreeSet<u32>,
}

/// The verdict on every pending collective instance.
#[derive(Debug, Default)]
pub(crate) struct Judged {
    /// Groups every member entered and none finished.
    pub stuck_groups: BTreeSet<String>,
    /// Rank → (group, seq, words): it issued another collective than its
    /// peers at that sequence number.
    pub mismatched: BTreeMap<u32, (String, u64, String)>,
    /// Silent ranks a wait points at only because a group's members were
    /// inferred (no dump lists them).
    pub inferred: BTreeSet<u32>,
    pub notes: Vec<String>,
}

/// Whom each collective waiter waits for: per pending (group, seq), once.
pub(crate) fn judge(job: &Job, waits: &mut [Wait]) -> Judged {
    let mut out = Judged::default();
    let keys: BTreeSet<(String, u64)> = waits
        .iter()
        .filter(|w| !w.p2p)
        .map(|w| (w.group.clone(), w.seq))
        .collect();
    let mut instances: BTreeMap<(String, u64), Instance> = BTreeMap::new();
    for (group, seq) in keys {
        let mut inst = Instance {
            silent: job.silent_members(&group),
            ..Default::default()
        };
        let mut entered = Vec::new();
        for m in job.known_members(&group) {
            if !job.has_fr(m) || job.prog(m, &group).enqueued.is_none_or(|e| e < seq) {
                inst.laggards.insert(m);
            } else {
                entered.push(m);
            }
        }
        let mismatch_here = find_mismatch(job, &group, seq, &entered, &mut out.mismatched);
        if inst.laggards.is_empty() && inst.silent.is_empty() && job.unlisted(&group) {
            if let Some((silent, note)) = infer_missing_members(job, &group) {
                out.inferred
                    .extend(silent.runs().iter().flat_map(|&(a, b)| a..=b));
                inst.silent = silent;
                out.notes.push(note);
            }
        }
        if inst.laggards.is_empty() && inst.silent.is_empty() {
            // Everyone issued it. NCCL says whether each device started it.
            let started: BTreeSet<u32> = entered
                .iter()
                .copied()
                .filter(|&m| job.prog(m, &group).started.is_some_and(|s| s >= seq))
                .collect();
            if !started.is_empty() {
                inst.not_started = entered
                    .iter()
                    .copied()
                    .filter(|m| !started.contains(m))
                    .collect();
            }
            if inst.not_started.is_empty() && !mismatch_here {
                out.stuck_groups.insert(group.clone());
            }
        }
        instances.insert((group, seq), inst);
    }
    for w in waits.iter_mut().filter(|w| !w.p2p) {
        let inst = &instances[&(w.group.clone(), w.seq)];
        // A rank does not wait for itself.
        w.waits_for = inst
            .laggards
            .iter()
            .copied()
            .filter(|&m| m != w.rank)
            .collect();
        w.silent = inst.silent.clone();
        w.not_started = inst
            .not_started
            .iter()
            .copied()
            .filter(|&m| m != w.rank)
            .collect();
    }
    out
}

/// Same sequence number, different collective: the minority mismatches.
fn find_mismatch(
    job: &Job,
    group: &str,
    seq: u64,
    entered: &[u32],
    mismatched: &mut BTreeMap<u32, (String, u64, String)>,
) -> bool {
    let mut sigs: BTreeMap<Signature, Vec<u32>> = BTreeMap::new();
    for &m in entered {
        if let Some(e) = job.entry(m, group, seq) {
            sigs.entry(signature(e)).or_default().push(m);
        }
    }
    if sigs.len() < 2 {
        return false;
    }
    let most = sigs.values().map(Vec::len).max().unwrap_or(0);
    let majority: Vec<_> = sigs.iter().filter(|(_, v)| v.len() == most).collect();
    let [(maj_sig, _)] = majority[..] else {
        return false;
    };
    let site = |x: &str| {
        if x.is_empty() {
            String::new()
        } else {
            format!(", {}", short(x))
        }
    };
    let mut any = false;
    for (sig, rs) in &sigs {
        if sig == maj_sig {
            continue;
        }
        for &r in rs {
            any = true;
            let detail = format!(
                "issued {} ({:?}{}) as seq {seq} of {} where its peers issued {} ({:?}{})",
                sig.0,
                sig.1,
                site(&sig.2),
                job.label(group),
                maj_sig.0,
                maj_sig.1,
                site(&maj_sig.2),
            );
            mismatched.insert(r, (group.to_string(), seq, detail));
        }
    }
    any
}

/// A group no dump lists the members of, whose known members all issued
/// the pending collective: its other members are ranks that left nothing.
/// Groups of one kind (the same ops from the same places) split the world
/// alike, so this one should be as large as the largest of its kind; the
/// candidates are the silent ranks (and ranks past the highest one seen,
/// up to kind × size) in no group of that kind.
fn infer_missing_members(job: &Job, group: &str) -> Option<(RankRuns, String)> {
    let kind = job.kind(group);
    if kind.is_empty() {
        return None;
    }
    let same: Vec<&String> = job
        .groups
        .keys()
        .filter(|g| !job.whole_world.contains(*g) && job.kind(g) == kind)
        .collect();
    let size = |g: &str| job.known_members(g).count() as u32;
    let expected = same.iter().map(|g| size(g)).max().unwrap_or(0);
    let have = size(group);
    if have >= expected || expected < 2 {
        return None;
    }
    let seen: BTreeSet<u32> = same.iter().flat_map(|g| job.known_members(g)).collect();
    let span = (same.len() as u32)
        .saturating_mul(expected)
        .min(whyslow_model::hang::MAX_WORLD_SIZE);
    let beyond = if span > job.world {
        RankRuns::from_ranks(job.world..span)
    } else {
        RankRuns::default()
    };
    let candidates = job.silent.union(&beyond);
    let candidates = RankRuns::from_ranks(
        candidates
            .runs()
            .iter()
            .flat_map(|&(a, b)| a..=b)
            .filter(|r| !seen.contains(r))
            .take(1 << 16),
    );
    if candidates.is_empty() {
        return None;
    }
    let note =
        format!(
        "{}: no dump lists its members; {} of its kind ({} group(s) issuing the same collectives \
         from the same places) have {expected} members and it shows {have}: its missing \
         member(s) taken among the ranks that left nothing: {}",
        job.label(group),
        if same.len() > 1 { "the others" } else { "groups" },
        same.len(),
        candidates.label()
    );
    Some((candidates, note))
}

/// Dumps are snapshots taken rank by rank, not at one instant. A collective
/// completes for every member or for none, so a pending instance that any
/// member's dump shows completed is not hung: that rank's dump is simply
/// later. Likewise a member that "never reached" it, but whose dump was
/// taken before the collective had been issued for `min_wait_s`, had not yet
/// been absent long enough to count (the bound that makes a waiter count
/// makes an absentee count too). Drops such waits and returns how many.
/// (Dumps gathered after a real stall are all taken while everyone waits,
/// so neither case arises there.)
pub(crate) fn drop_snapshot_skew(job: &Job, waits: &mut Vec<Wait>, min_wait_s: f64) -> usize {
    let keys: BTreeSet<(String, u64)> = waits
        .iter()
        .filter(|w| !w.p2p)
        .map(|w| (w.group.clone(), w.seq))
        .collect();
    let mut skewed: BTreeSet<(String, u64)> = BTreeSet::new();
    for (group, seq) in keys {
        let members: Vec<u32> = job.known_members(&group).collect();
        let finished = members
            .iter()
            .any(|&m| job.prog(m, &group).completed.is_some_and(|c| c >= seq));
        // When the waiters issued it: the earliest creation among them.
        let issued_ns = members
            .iter()
            .filter_map(|&m| job.entry(m, &group, seq))
            .filter_map(|e| e.created_ns)
            .min();
        let laggards: Vec<u32> = members
            .iter()
            .copied()
            .filter(|&m| job.has_fr(m) && job.prog(m, &group).enqueued.is_none_or(|e| e < seq))
            .collect();
        let all_stale = !laggards.is_empty()
            && laggards.iter().all(|&m| {
                let dumped = job.ranks.get(&m).and_then(|e| e.dumped_at_ns);
                matches!((dumped, issued_ns),
                    (Some(d), Some(i)) if (d as f64) < i as f64 + min_wait_s * 1e9)
            });
        if finished || all_stale {
            skewed.insert((group, seq));
        }
    }
    let before = waits.len();
    waits.retain(|w| w.p2p || !skewed.contains(&(w.group.clone(), w.seq)));
    before - waits.len()
}

/// A rank whose device stopped finishing work (NCCL): its peers in a group
/// finished an instance it had issued too, but its own counters never saw
/// that instance finish. A collective finishes for all members together,
/// so its completions stopped being observed: a GPU fault, or a watchdog
/// that stopped. Only where its dump is not older than the peer's (an
/// older snapshot simply predates the completions).
#[derive(Debug, Clone)]
pub(crate) struct Stale {
    pub group: String,
    /// The newest instance a peer finished.
    pub peer_completed: u64,
    pub peer: u32,
    pub own_completed: Option<u64>,
    pub own_enqueued: u64,
}

pub(crate) fn stale_devices(job: &Job) -> BTreeMap<u32, Stale> {
    let mut out: BTreeMap<u32, Stale> = BTreeMap::new();
    for g in job.groups.keys() {
        let members: Vec<u32> = job.known_members(g).filter(|&m| job.has_fr(m)).collect();
        let Some((peer, done)) = members
            .iter()
            .filter_map(|&m| job.prog(m, g).completed.map(|c| (m, c)))
            .max_by_key(|&(m, c)| (c, std::cmp::Reverse(m)))
        else {
            continue;
        };
        let peer_at = job.ranks.get(&peer).and_then(|e| e.dumped_at_ns);
        for &m in &members {
            let p = job.prog(m, g);
            let Some(enq) = p.enqueued else { continue };
            if enq < done || p.completed.is_some_and(|c| c >= done) {
                continue;
            }
            let own_at = job.ranks.get(&m).and_then(|e| e.dumped_at_ns);
            if matches!((own_at, peer_at), (Some(a), Some(b)) if a < b) {
                continue;
            }
            let s = Stale {
                group: g.clone(),
                peer_completed: done,
                peer,
                own_completed: p.completed,
                own_enqueued: enq,
            };
            // Keep the group where it lags the most.
            let lag = |s: &Stale| s.peer_completed - s.own_completed.unwrap_or(0);
            if out.get(&m).is_none_or(|o| lag(&s) > lag(o)) {
                out.insert(m, s);
            }
        }
    }
    out
}
