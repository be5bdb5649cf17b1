//! Who a hung job waits for (PerfTracker §4.1 detects the stall: no event
//! for 5× the mean iteration; this names the culprit).
//!
//! Every collective of a process group pairs the members' calls by their
//! sequence number in the group. From each rank's last issued, started and
//! finished sequence numbers per group (PyTorch's Flight Recorder, or a
//! node agent's open collective records) a rank that has waited in
//! collective `s` of group `g` for longer than a bound waits for every
//! member of `g` that has not issued `s`. Those edges form a waits-for
//! graph across groups (a rank stuck in tensor-parallel all-gather waits
//! for a peer stuck in a data-parallel all-reduce that waits for the
//! culprit); the culprits are its roots:
//!
//! * a member that is in no collective: it never reached this one (its
//!   stack says where it is);
//! * a member with no evidence: it could not answer, or its process is gone;
//! * a member that issued a different collective at the same sequence
//!   number, or whose collectives left its own program order (it skipped
//!   one): a mismatch, which shows as a cycle of waits between groups;
//! * a member whose device never started the collective (NCCL);
//! * if every member issued and none finished, the collective itself is
//!   stuck: the transport or a device, not a rank's program.
//!
//! Without Flight Recorder state, stacks alone still tell ranks blocked in
//! a collective call from ranks elsewhere.
#![deny(missing_docs)]

use std::collections::{BTreeMap, BTreeSet};

// Built where the records' type lives (whyslow-model), so that the readers
// of spools make hang evidence without depending on this analysis.
pub use whyslow_model::hang::records::{any_open, evidence_from_records};

mod graph;
mod job;
pub mod ranks;
mod waits;

use graph::WaitGraph;
use job::Job;
use ranks::RankRuns;
use waits::Wait;

use whyslow_model::hang::{
    CollectiveState, Culprit, HangEvidence, HangReason, HangReport, RankEvidence, RankSummary,
    RecordedCollective, StackFrame, ThreadStack, Waiting, HANG_REPORT_VERSION, LISTED_RUN,
    MAX_WORLD_SIZE,
};

/// Settings of [`analyze`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HangConfig {
    /// A pending collective counts as hung after this long, seconds; None:
    /// 5× the iteration period the dumps show (PerfTracker §4.1's factor),
    /// at least [`MIN_WAIT_FLOOR_S`].
    pub min_wait_s: Option<f64>,
    /// The job's world size, when the caller knows it.
    pub world_size: Option<u32>,
}

/// A [`HangConfig`] no analysis can honour.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HangConfigError {
    /// The wait bound is negative or not a number.
    #[error("min wait {0}: want seconds >= 0")]
    MinWait(f64),
    /// The world is empty or beyond what a report can stand for.
    #[error("world size {0}: want 1 to {MAX_WORLD_SIZE} ranks")]
    WorldSize(u32),
}

impl HangConfig {
    /// Checks the settings, whichever door built them (CLI, Python, server).
    pub fn validate(&self) -> Result<(), HangConfigError> {
        if let Some(w) = self.min_wait_s {
            if !(w.is_finite() && w >= 0.0) {
                return Err(HangConfigError::MinWait(w));
            }
        }
        if let Some(n) = self.world_size {
            if n == 0 || n > MAX_WORLD_SIZE {
                return Err(HangConfigError::WorldSize(n));
            }
        }
        Ok(())
    }
}

/// The shortest wait counted as a hang when the bound is derived.
pub const MIN_WAIT_FLOOR_S: f64 = 0.5;

/// PyTorch's collective entry points, as they appear in Python stacks.
const COLLECTIVE_FUNCTIONS: &[&str] = &[
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "wait",
];

fn site_of(c: &RecordedCollective) -> String {
    c.call_site()
        .map(|f| {
            let file = f.file.rsplit('/').next().unwrap_or(&f.file);
            format!("{file}:{}", f.line)
        })
        .unwrap_or_default()
}

/// The median gap between a rank's collectives issued from the same place
/// (one per iteration), seconds.
fn iteration_period_s(ev: &HangEvidence) -> Option<f64> {
    let mut periods = Vec::new();
    for r in &ev.ranks {
        let mut last: BTreeMap<(String, String, String), u64> = BTreeMap::new();
        let mut gaps = Vec::new();
        for c in &r.collectives {
            let Some(t) = c.created_ns else { continue };
            let key = (c.group.clone(), c.op.clone(), site_of(c));
            if let Some(prev) = last.insert(key, t) {
                if t > prev {
                    gaps.push((t - prev) as f64 / 1e9);
                }
            }
        }
        if gaps.len() >= 3 {
            gaps.sort_by(f64::total_cmp);
            periods.push(gaps[gaps.len() / 2]);
        }
    }
    if periods.is_empty() {
        return None;
    }
    periods.sort_by(f64::total_cmp);
    Some(periods[periods.len() / 2])
}

/// Whether a stack's innermost frames are in a torch.distributed call.
fn in_collective(s: &ThreadStack) -> Option<String> {
    s.frames.iter().take(6).find_map(|f| {
        (f.file.contains("torch/distributed/")
            && COLLECTIVE_FUNCTIONS.contains(&f.function.as_str()))
        .then(|| f.function.clone())
    })
}

fn main_stack(ev: Option<&RankEvidence>) -> Option<ThreadStack> {
    let ev = ev?;
    ev.stacks
        .iter()
        .find(|s| s.thread == "main")
        .or_else(|| ev.stacks.first())
        .cloned()
}

/// The innermost frame of the user's code (outside the interpreter's
/// libraries), else the innermost.
fn where_in(s: &ThreadStack) -> Option<&StackFrame> {
    s.frames
        .iter()
        .find(|f| {
            !f.file.contains("/torch/")
                && !f.file.contains("/lib/python3")
                && !f.file.starts_with('<')
                && !f.file.is_empty()
        })
        .or_else(|| s.frames.first())
}

/// The verdict for one hang's evidence: who waits where (collectives and
/// point-to-point), whom for, the graph's roots, then each culprit in words.
pub fn analyze(ev: &HangEvidence, cfg: &HangConfig) -> HangReport {
    let mut notes = ev.notes.clone();
    let world = job::world_size(ev, cfg.world_size);
    let job = Job::new(ev, world);
    let period = iteration_period_s(ev);
    let min_wait_s = cfg
        .min_wait_s
        .unwrap_or_else(|| period.map_or(MIN_WAIT_FLOOR_S, |p| (5.0 * p).max(MIN_WAIT_FLOOR_S)));
    let summaries = rank_summaries(&job);

    // 1. Who waits where.
    let (mut waits, young_c) = waits::collective_waits(&job, min_wait_s);
    let (p2p, young_p) = waits::p2p_waits(&job, min_wait_s);
    waits.extend(p2p);
    let young = young_c + young_p;
    let skewed = waits::drop_snapshot_skew(&job, &mut waits, min_wait_s);
    if skewed > 0 {
        notes.push(format!(
            "{skewed} pending collective(s) set aside: the ranks' dumps were taken at different \
             moments, and a peer's dump shows the collective finished, or predates it"
        ));
    }
    if waits.is_empty() {
        return no_flight_recorder_verdict(ev, &job, summaries, min_wait_s, young, notes);
    }

    // 2. Whom each waiter waits for.
    let judged = waits::judge(&job, &mut waits);
    notes.extend(judged.notes.iter().cloned());

    // 3. The graph's roots: ranks waited for that wait for nobody, ranks
    // that left nothing, and cycles with no way out.
    let mut graph = WaitGraph::new(job.ranks.keys().copied(), &waits);
    let mut roots = graph.roots();
    // A root blocked in a send or receive (its stack says so; gloo's Flight
    // Recorder records no point-to-point) waits for its peer: a pipeline
    // stage that has not reached its next collective because it waits for
    // the next stage is a waiter, not a root.
    let blocked = blocked_in_p2p(&job, &roots, &judged);
    if !blocked.is_empty() {
        waits.extend(blocked);
        graph = WaitGraph::new(job.ranks.keys().copied(), &waits);
        roots = graph.roots();
    }
    let mut cyclic = graph.cyclic(&roots);
    // A mismatch inside a cycle explains it: name those ranks, not every
    // member of the cycle. Else: the rank whose pending collective leaves
    // its own program order (it skipped one).
    let mut out_of_order: BTreeMap<u32, String> = BTreeMap::new();
    if !cyclic.is_empty() {
        let named: BTreeSet<u32> = cyclic
            .iter()
            .copied()
            .filter(|r| judged.mismatched.contains_key(r))
            .collect();
        if named.is_empty() {
            for &r in &cyclic {
                if let Some(d) = program_order_break(&job, r, &waits) {
                    out_of_order.insert(r, d);
                }
            }
        }
        if !named.is_empty() || !out_of_order.is_empty() {
            roots.extend(named.iter().copied());
            roots.extend(out_of_order.keys().copied());
            cyclic.clear();
        }
    }
    roots.extend(
        judged
            .mismatched
            .keys()
            .copied()
            .filter(|r| !cyclic.contains(r)),
    );
    roots.extend(cyclic.iter().copied());
    // Devices that stopped finishing work hold up their groups whether or
    // not a waiter's counters point at them.
    let stale = waits::stale_devices(&job);
    for &r in stale.keys() {
        let points = waits.iter().any(|w| w.rank == r && w.points());
        if !points && !cyclic.contains(&r) {
            roots.insert(r);
        }
    }

    // 4. Culprits, each with the group whose members wait for it.
    let ctx = Verdicts {
        job: &job,
        waits: &waits,
        graph: &graph,
        judged: &judged,
        stale: &stale,
        cyclic: &cyclic,
        out_of_order: &out_of_order,
    };
    let mut culprits: Vec<Culprit> = roots.iter().map(|&r| ctx.rank_culprit(r)).collect();
    culprits.extend(ctx.silent_culprits());
    culprits.sort_by_key(|c| c.rank);
    let waiting = waiting_lines(&job, &waits, &roots);
    let waiting_only = waits
        .iter()
        .map(|w| w.rank)
        .filter(|r| !roots.contains(r))
        .collect::<BTreeSet<u32>>()
        .len();
    let verdict = verdict_line(&job, &culprits, &judged.stuck_groups, waiting_only);
    if period.is_none() && cfg.min_wait_s.is_none() {
        notes.push(format!(
            "no iteration period in the dumps: pending collectives count as hung after {MIN_WAIT_FLOOR_S} s"
        ));
    }
    if !job.silent.is_empty() {
        notes.push(format!("no evidence from rank(s) {}", job.silent.label()));
    }
    HangReport {
        version: HANG_REPORT_VERSION,
        hang: true,
        verdict,
        culprits,
        waiting,
        stuck_groups: judged.stuck_groups.iter().cloned().collect(),
        ranks: summaries,
        min_wait_s,
        notes,
    }
}

/// Point-to-point entry points, as they appear in Python stacks.
const P2P_FUNCTIONS: &[&str] = &["send", "recv", "isend", "irecv", "batch_isend_irecv"];

/// Roots whose main stack is inside a torch.distributed send or receive,
/// as waits on the other roots they share a group with (the peer is not
/// in the stack). Only when some root is not inside one: ranks that all
/// wait in point-to-point calls stay roots (a send/recv deadlock).
fn blocked_in_p2p(job: &Job, roots: &BTreeSet<u32>, judged: &waits::Judged) -> Vec<Wait> {
    let in_p2p = |r: u32| -> Option<String> {
        let st = main_stack(job.ranks.get(&r).copied())?;
        in_collective(&st).filter(|f| P2P_FUNCTIONS.contains(&f.as_str()))
    };
    let blocked: BTreeMap<u32, String> = roots
        .iter()
        .filter(|r| !judged.mismatched.contains_key(r))
        .filter_map(|&r| in_p2p(r).map(|f| (r, f)))
        .collect();
    let others: Vec<u32> = roots
        .iter()
        .copied()
        .filter(|r| !blocked.contains_key(r))
        .collect();
    if others.is_empty() {
        return Vec::new();
    }
    let shares = |a: u32, b: u32| {
        job.members
            .iter()
            .any(|(g, m)| !job.whole_world.contains(g) && m.contains(&a) && m.contains(&b))
    };
    blocked
        .into_iter()
        .map(|(r, op)| {
            let mut peers: BTreeSet<u32> =
                others.iter().copied().filter(|&o| shares(r, o)).collect();
            if peers.is_empty() {
                peers = others.iter().copied().collect();
            }
            Wait {
                rank: r,
                group: String::new(),
                seq: 0,
                op,
                sizes: Vec::new(),
                waited_s: None,
                p2p: true,
                waits_for: peers,
                silent: RankRuns::default(),
                not_started: BTreeSet::new(),
            }
        })
        .collect()
}

/// One line per rank that left evidence; ranks that left nothing rank by
/// rank in short runs, one line per long run.
fn rank_summaries(job: &Job) -> Vec<RankSummary> {
    let mut out: Vec<RankSummary> = job
        .ranks
        .values()
        .filter(|e| e.rank < job.world)
        .map(|e| {
            let mut sources: Vec<String> = e.stacks.iter().map(|s| s.source.clone()).collect();
            sources.sort();
            sources.dedup();
            RankSummary {
                rank: e.rank,
                collectives: e.collectives.len(),
                stack_sources: sources,
                exited: e.exited,
                last_rank: None,
            }
        })
        .collect();
    let (one, ranges) = job.silent.split_listed(LISTED_RUN);
    let silent = |rank, last_rank| RankSummary {
        rank,
        collectives: 0,
        stack_sources: Vec::new(),
        exited: false,
        last_rank,
    };
    out.extend(one.into_iter().map(|r| silent(r, None)));
    out.extend(ranges.into_iter().map(|[a, b]| silent(a, Some(b))));
    out.sort_by_key(|s| s.rank);
    out
}

fn waiting_lines(job: &Job, waits: &[Wait], roots: &BTreeSet<u32>) -> Vec<Waiting> {
    waits
        .iter()
        .filter(|w| !roots.contains(&w.rank) || w.points())
        .map(|w| {
            let (mut one, ranges) = w.silent.split_listed(LISTED_RUN);
            one.extend(w.waits_for.union(&w.not_started).copied());
            one.sort_unstable();
            one.dedup();
            Waiting {
                rank: w.rank,
                group: w.group.clone(),
                group_desc: job.desc(&w.group),
                op: w.op.clone(),
                seq: w.seq,
                waits_for: one,
                waits_for_ranges: ranges,
                waited_s: w.waited_s,
            }
        })
        .collect()
}

fn verdict_line(
    job: &Job,
    culprits: &[Culprit],
    stuck_groups: &BTreeSet<String>,
    waiting_only: usize,
) -> String {
    if !culprits.is_empty() {
        let names: Vec<String> = culprits
            .iter()
            .map(|c| {
                let who = match c.last_rank {
                    Some(l) => format!("ranks {}-{l}", c.rank),
                    None => format!("rank {}", c.rank),
                };
                format!(
                    "{who} ({}, {} seq {} of {})",
                    c.reason.as_str(),
                    c.op,
                    c.seq,
                    job.label(&c.group)
                )
            })
            .collect();
        format!(
            "hang: {} hold(s) up {} waiting rank(s)",
            names.join("; "),
            waiting_only
        )
    } else if !stuck_groups.is_empty() {
        format!(
            "hang: every member issued the pending collective of {} and none finished: the transport or a device, not a rank's program",
            stuck_groups
                .iter()
                .map(|g| job.label(g))
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        "hang: ranks wait in collectives, but the evidence names no rank they wait for".to_string()
    }
}

/// What the culprits are built from.
struct Verdicts<'a, 'j> {
    job: &'a Job<'j>,
    waits: &'a [Wait],
    graph: &'a WaitGraph,
    judged: &'a waits::Judged,
    stale: &'a BTreeMap<u32, waits::Stale>,
    cyclic: &'a BTreeSet<u32>,
    out_of_order: &'a BTreeMap<u32, String>,
}

impl Verdicts<'_, '_> {
    /// The (group, seq) most of the given waits wait in, else the rank's
    /// own.
    fn where_waited<'w>(&'w self, direct: &[&'w Wait], r: u32) -> Option<&'w Wait> {
        // A wait read from a stack alone names no group: count it only when
        // no wait with a group points here.
        let grouped = direct.iter().any(|w| !w.group.is_empty());
        let mut by_group: BTreeMap<(&str, u64), usize> = BTreeMap::new();
        for w in direct.iter().filter(|w| !grouped || !w.group.is_empty()) {
            *by_group.entry((w.group.as_str(), w.seq)).or_default() += 1;
        }
        let best = by_group
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(k, _)| *k);
        match best {
            Some((g, s)) => direct.iter().copied().find(|w| w.group == g && w.seq == s),
            None => self.waits.iter().find(|w| w.rank == r),
        }
    }

    fn rank_culprit(&self, r: u32) -> Culprit {
        let job = self.job;
        let direct: Vec<&Wait> = self
            .waits
            .iter()
            .filter(|w| w.waits_for.contains(&r) || w.not_started.contains(&r))
            .collect();
        let ev_r = job.ranks.get(&r).copied();
        let stack = main_stack(ev_r);
        let at = self.where_waited(&direct, r);
        let (mut group, mut seq) = at.map(|w| (w.group.clone(), w.seq)).unwrap_or_default();
        let mut op = at.map(|w| w.op.clone()).unwrap_or_default();
        let mut sizes = at.map(|w| w.sizes.clone()).unwrap_or_default();
        let (reason, detail) = if let Some((g, s, d)) = self.judged.mismatched.get(&r) {
            let e = job.entry(r, g, *s);
            (group, seq) = (g.clone(), *s);
            op = e.map(|e| e.op.clone()).unwrap_or_default();
            sizes = e.map(|e| e.input_sizes.clone()).unwrap_or_default();
            (HangReason::Mismatch, d.clone())
        } else if let Some(d) = self.out_of_order.get(&r) {
            (HangReason::Mismatch, d.clone())
        } else if self.cyclic.contains(&r) {
            (
                HangReason::Deadlock,
                format!(
                    "waits in a cycle of groups: ranks {} each wait for another of them",
                    join(self.cyclic)
                ),
            )
        } else if let (true, Some(st)) = (direct.is_empty(), self.stale.get(&r)) {
            (group, seq) = (st.group.clone(), st.peer_completed);
            (HangReason::NotStarted, stale_words(job, r, st))
        } else if direct.iter().any(|w| w.not_started.contains(&r)) {
            (
                HangReason::NotStarted,
                format!(
                    "issued {op} seq {seq} of {} but its device never started it: work queued before it does not finish",
                    job.label(&group)
                ),
            )
        } else if ev_r.is_some_and(|e| e.exited) {
            (HangReason::Exited, "its process had exited".to_string())
        } else if ev_r
            .is_none_or(|e| !job.has_fr(r) && e.stacks.iter().all(|s| s.source != "python"))
        {
            let kernel = stack.as_ref().and_then(|s| {
                where_in(s).map(|f| (format!("{} ({})", s.thread, s.source), f.label()))
            });
            (
                HangReason::Unresponsive,
                match kernel {
                    Some((thread, f)) => format!(
                        "did not answer: alive, its {thread} in {f}; a rank that cannot run Python (holding the GIL in native code) or is stopped"
                    ),
                    None => "left no dump and no stack: it could not answer (holding the GIL in native code, stopped) or its process is gone".to_string(),
                },
            )
        } else if direct.iter().all(|w| w.p2p) && !direct.is_empty() {
            (
                HangReason::NeverReached,
                format!(
                    "never posted the matching half of {} {} (seq {seq}) of {}{}",
                    direct[0].rank,
                    direct[0].op,
                    job.label(&group),
                    never_reached_tail(job, r, stack.as_ref())
                ),
            )
        } else {
            (
                HangReason::NeverReached,
                never_reached(job, r, &group, seq, stack.as_ref()),
            )
        };
        let mut detail = detail;
        let mut waited_by = self.graph.waiting_on(&[r], false);
        if let Some(st) = self.stale.get(&r) {
            if reason != HangReason::NotStarted {
                detail.push_str("; ");
                detail.push_str(&stale_words(job, r, st));
            }
            // Its group's waiters wait for it, whatever their counters say.
            let in_group: Vec<u32> = self
                .waits
                .iter()
                .filter(|w| {
                    w.rank != r
                        && job
                            .members
                            .get(&st.group)
                            .is_some_and(|m| m.contains(&w.rank))
                })
                .map(|w| w.rank)
                .collect();
            waited_by.extend(self.graph.waiting_on(&in_group, true));
            waited_by.retain(|&x| x != r);
            waited_by.sort_unstable();
            waited_by.dedup();
        }
        Culprit {
            rank: r,
            group_desc: job.desc(&group),
            group_ranks: job.member_list(&group),
            group,
            op,
            seq,
            sizes,
            reason,
            detail,
            stack: stack.or_else(|| last_issue_stack(ev_r)),
            waited_by,
            last_rank: None,
        }
    }

    /// Ranks that left nothing and that waiters point at: rank by rank in
    /// short runs, one culprit per long run of ranks waited for alike.
    fn silent_culprits(&self) -> Vec<Culprit> {
        let job = self.job;
        let pointing: Vec<&Wait> = self.waits.iter().filter(|w| !w.silent.is_empty()).collect();
        if pointing.is_empty() {
            return Vec::new();
        }
        // Cut the silent ranks waited for where any wait's runs start or
        // end: inside a piece, every rank is waited for by the same waits.
        let mut cuts: BTreeSet<u64> = BTreeSet::new();
        for w in &pointing {
            for &(a, b) in w.silent.runs() {
                cuts.insert(u64::from(a));
                cuts.insert(u64::from(b) + 1);
            }
        }
        let cuts: Vec<u64> = cuts.into_iter().collect();
        let mut out = Vec::new();
        for pair in cuts.windows(2) {
            let (a, b) = (pair[0] as u32, (pair[1] - 1) as u32);
            let direct: Vec<&Wait> = pointing
                .iter()
                .copied()
                .filter(|w| w.silent.contains(a))
                .collect();
            if direct.is_empty() {
                continue;
            }
            let starts: Vec<u32> = direct.iter().map(|w| w.rank).collect();
            let waited_by = self.graph.waiting_on(&starts, true);
            let at = self.where_waited(&direct, a);
            let group = at.map(|w| w.group.clone()).unwrap_or_default();
            let inferred = self.judged.inferred.contains(&a);
            let known = (a..=b).all(|r| job.named_silent.contains(&r));
            let (reason, detail) = if known && !inferred {
                (
                    HangReason::Unresponsive,
                    "left no dump and no stack: it could not answer (holding the GIL in native code, stopped) or its process is gone".to_string(),
                )
            } else {
                (
                    HangReason::NoDump,
                    format!(
                        "left no dump, stack or record; {} waits for it{}: it could not answer (holding the GIL in native code, stopped) or its process is gone",
                        job.label(&group),
                        if inferred {
                            " (its membership inferred: no dump lists the group's members)"
                        } else {
                            ""
                        }
                    ),
                )
            };
            let culprit = |rank, last_rank| Culprit {
                rank,
                group: group.clone(),
                group_desc: job.desc(&group),
                group_ranks: job.member_list(&group),
                op: at.map(|w| w.op.clone()).unwrap_or_default(),
                seq: at.map_or(0, |w| w.seq),
                sizes: at.map(|w| w.sizes.clone()).unwrap_or_default(),
                reason,
                detail: detail.clone(),
                stack: None,
                waited_by: waited_by.clone(),
                last_rank,
            };
            if b - a < LISTED_RUN {
                out.extend((a..=b).map(|r| culprit(r, None)));
            } else {
                out.push(culprit(a, Some(b)));
            }
        }
        out
    }
}

fn join<'a>(rs: impl IntoIterator<Item = &'a u32>) -> String {
    rs.into_iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A device that stopped finishing work, in words.
fn stale_words(job: &Job, r: u32, st: &waits::Stale) -> String {
    format!(
        "its device stopped finishing work: rank {} finished seq {} of {}, which rank {r} issued \
         too (it issued up to {}) but saw finish only up to {} (a GPU fault, or its watchdog stopped)",
        st.peer,
        st.peer_completed,
        job.label(&st.group),
        st.own_enqueued,
        st.own_completed.map_or("none".to_string(), |c| c.to_string()),
    )
}

/// Where a rank that never issued the collective is instead.
fn never_reached(job: &Job, r: u32, g: &str, s: u64, stack: Option<&ThreadStack>) -> String {
    format!(
        "never issued seq {s} of {}{}",
        job.label(g),
        never_reached_tail(job, r, stack)
    )
}

/// `; its last collective: …; its main thread is in …`.
fn never_reached_tail(job: &Job, r: u32, stack: Option<&ThreadStack>) -> String {
    let mut parts = Vec::new();
    if let Some(last) = job.ranks.get(&r).and_then(|e| e.collectives.last()) {
        let site = site_of(last);
        parts.push(format!(
            "its last collective: {} seq {} of {}{} ({})",
            last.op,
            last.seq,
            job.label(&last.group),
            if site.is_empty() {
                String::new()
            } else {
                format!(" from {site}")
            },
            match last.state {
                CollectiveState::Completed => "finished",
                CollectiveState::Started => "started",
                CollectiveState::Scheduled => "issued",
            }
        ));
    } else if job.has_fr(r) {
        parts.push("its dump shows nothing pending: it finished all it issued".to_string());
    }
    if let Some(st) = stack {
        if let Some(f) = where_in(st) {
            parts.push(format!("its {} thread is in {}", st.thread, f.label()));
        }
        if let Some(c) = in_collective(st) {
            parts.push(format!(
                "(inside torch.distributed.{c}, of a group without a dump)"
            ));
        }
    }
    parts.into_iter().map(|p| format!("; {p}")).collect()
}

/// The Python frames that issued the rank's last collective, when no
/// stack of the moment exists.
fn last_issue_stack(ev: Option<&RankEvidence>) -> Option<ThreadStack> {
    let last = ev?
        .collectives
        .iter()
        .rev()
        .find(|c| !c.frames.is_empty())?;
    Some(ThreadStack {
        thread: "main".into(),
        frames: last.frames.clone(),
        source: "flight-recorder".into(),
        taken_at_ns: last.created_ns,
    })
}

/// A rank whose pending collective does not follow the collective before
/// it the way its own history does: it skipped one (or issued one too
/// many). Returns the words for the report.
fn program_order_break(job: &Job, r: u32, waits: &[Wait]) -> Option<String> {
    let waits: Vec<&Wait> = waits.iter().filter(|w| !w.p2p).collect();
    let ev = job.ranks.get(&r)?;
    let cs: Vec<&RecordedCollective> = ev.collectives.iter().filter(|c| !c.p2p).collect();
    let key = |c: &RecordedCollective| (c.group.clone(), c.op.clone(), site_of(c));
    let w = waits.iter().find(|w| w.rank == r)?;
    let pos = cs
        .iter()
        .rposition(|c| c.group == w.group && c.seq == w.seq)?;
    if pos == 0 {
        return None;
    }
    let prev = key(cs[pos - 1]);
    let cur = key(cs[pos]);
    // What followed `prev` before, in this rank's history.
    let mut followers: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    for i in 0..pos.saturating_sub(1) {
        if key(cs[i]) == prev {
            *followers.entry(key(cs[i + 1])).or_default() += 1;
        }
    }
    let total: usize = followers.values().sum();
    if total < 3 || followers.get(&cur).copied().unwrap_or(0) * 10 >= total {
        return None;
    }
    let (usual, _) = followers.iter().max_by_key(|(_, n)| **n)?;
    Some(format!(
        "left its program order: after {} of {} ({}) it issued {} seq {} of {} ({}), where {} of {} times it issued {} of {} ({}) next: it skipped that collective, so its collectives no longer pair with its peers'",
        prev.1,
        job.label(&prev.0),
        prev.2,
        cur.1,
        w.seq,
        job.label(&cur.0),
        cur.2,
        followers.values().max().copied().unwrap_or(0),
        total,
        usual.1,
        job.label(&usual.0),
        usual.2,
    ))
}

/// No collective is hung by the Flight Recorder's account: either nothing
/// hangs, or there is no Flight Recorder state and the stacks must tell.
fn no_flight_recorder_verdict(
    ev: &HangEvidence,
    job: &Job,
    ranks: Vec<RankSummary>,
    min_wait_s: f64,
    young: usize,
    mut notes: Vec<String>,
) -> HangReport {
    let any_fr = ev.ranks.iter().any(|r| job.has_fr(r.rank));
    let mut culprits = Vec::new();
    let mut waiting = Vec::new();
    let verdict = if any_fr {
        if young > 0 {
            notes.push(format!(
                "{young} collective(s) in flight for less than {min_wait_s:.1} s: a slow step, not a hang"
            ));
        }
        "no hang: no collective has waited longer than the bound".to_string()
    } else {
        // Stacks only: ranks inside a collective call wait; the others
        // (with a stack) are where they are instead.
        let mut inside = BTreeSet::new();
        let mut outside = BTreeMap::new();
        for r in &ev.ranks {
            let Some(st) = main_stack(Some(r)) else {
                continue;
            };
            match in_collective(&st) {
                Some(op) => {
                    inside.insert(r.rank);
                    waiting.push(Waiting {
                        rank: r.rank,
                        group: String::new(),
                        group_desc: String::new(),
                        op,
                        seq: 0,
                        waits_for: Vec::new(),
                        waits_for_ranges: Vec::new(),
                        waited_s: None,
                    });
                }
                None => {
                    outside.insert(r.rank, st);
                }
            }
        }
        let (silent, silent_ranges) = job.silent.split_listed(LISTED_RUN);
        if inside.is_empty() {
            "no hang named: no rank's stack is inside a collective (and no Flight Recorder dump)"
                .to_string()
        } else {
            let all: Vec<u32> = outside
                .keys()
                .copied()
                .chain(silent.iter().copied())
                .collect();
            for w in &mut waiting {
                w.waits_for = all.clone();
                w.waits_for_ranges = silent_ranges.clone();
            }
            for (&r, st) in &outside {
                let at = where_in(st).map(StackFrame::label).unwrap_or_default();
                culprits.push(Culprit {
                    rank: r,
                    group: String::new(),
                    group_desc: String::new(),
                    group_ranks: Vec::new(),
                    op: String::new(),
                    seq: 0,
                    sizes: Vec::new(),
                    reason: HangReason::NeverReached,
                    detail: format!("not in a collective: its {} thread is in {at}", st.thread),
                    stack: Some(st.clone()),
                    waited_by: inside.iter().copied().collect(),
                    last_rank: None,
                });
            }
            let runs = silent
                .iter()
                .map(|&r| (r, None))
                .chain(silent_ranges.iter().map(|&[a, b]| (a, Some(b))));
            for (r, last_rank) in runs {
                culprits.push(Culprit {
                    rank: r,
                    last_rank,
                    group: String::new(),
                    group_desc: String::new(),
                    group_ranks: Vec::new(),
                    op: String::new(),
                    seq: 0,
                    sizes: Vec::new(),
                    reason: HangReason::Unresponsive,
                    detail: "left no stack: it could not answer (holding the GIL in native code, stopped) or its process is gone".into(),
                    stack: None,
                    waited_by: inside.iter().copied().collect(),
                });
            }
            notes.push("no Flight Recorder state: groups and sequence numbers unknown; judged from stacks alone".into());
            if culprits.is_empty() {
                "hang: every rank with a stack is inside a collective; nothing names whom they wait for".into()
            } else {
                format!(
                    "hang (from stacks): rank(s) {} not in a collective while {} wait in one",
                    culprits
                        .iter()
                        .map(|c| c.rank.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    join(&inside)
                )
            }
        }
    };
    let hang = !waiting.is_empty();
    HangReport {
        version: HANG_REPORT_VERSION,
        hang,
        verdict,
        culprits,
        waiting,
        stuck_groups: Vec::new(),
        ranks,
        min_wait_s,
        notes,
    }
}

#[cfg(test)]
mod tests {
    //! Shapes the recorded gloo jobs do not have: NCCL's started/completed
    //! states, other sizes at the same sequence number, a collective all
    //! members entered, three-level chains, ranks that left nothing.
    use super::*;
    use whyslow_model::hang::{GroupInfo, GroupProgress, StackFrame};

    const S: u64 = 1_000_000_000;

    fn judge(ranks: Vec<RankEvidence>) -> HangReport {
        analyze(
            &HangEvidence {
                ranks,
                ..Default::default()
            },
            &HangConfig::default(),
        )
    }

    fn coll(
        group: &str,
        seq: u64,
        op: &str,
        n: i64,
        state: CollectiveState,
        t: u64,
        line: u32,
    ) -> RecordedCollective {
        RecordedCollective {
            group: group.into(),
            seq,
            p2p: false,
            op: op.into(),
            input_sizes: vec![vec![n]],
            output_sizes: vec![vec![n]],
            dtypes: vec!["Float".into()],
            state,
            created_ns: Some(t),
            frames: vec![StackFrame {
                function: "train".into(),
                file: "/job/train.py".into(),
                line,
            }],
            peer: None,
        }
    }

    fn group(name: &str, desc: &str, ranks: &[u32]) -> GroupInfo {
        GroupInfo {
            name: name.into(),
            desc: desc.into(),
            ranks: Some(ranks.to_vec()),
        }
    }

    /// `steps` healthy iterations of one all-reduce per group in `groups`
    /// (1 s apart), then the given extra entries; dumped at `dump_s`.
    fn rank(
        r: u32,
        groups: &[GroupInfo],
        steps: u64,
        extra: Vec<RecordedCollective>,
        dump_s: u64,
    ) -> RankEvidence {
        let mut cs = Vec::new();
        for s in 1..=steps {
            for (k, g) in groups.iter().enumerate() {
                cs.push(coll(
                    &g.name,
                    s,
                    "all_reduce",
                    1024,
                    CollectiveState::Completed,
                    s * S + k as u64,
                    10 + k as u32,
                ));
            }
        }
        cs.extend(extra);
        RankEvidence {
            rank: r,
            groups: groups.to_vec(),
            collectives: cs,
            dumped_at_ns: Some(dump_s * S),
            ..Default::default()
        }
    }

    #[test]
    fn nccl_a_rank_whose_device_never_started_the_collective() {
        // 4 ranks, one group; all issued seq 11, three started it.
        let g = [group("0", "default_pg", &[0, 1, 2, 3])];
        let ranks = (0..4)
            .map(|r| {
                let st = if r == 3 {
                    CollectiveState::Scheduled
                } else {
                    CollectiveState::Started
                };
                rank(
                    r,
                    &g,
                    10,
                    vec![coll("0", 11, "all_reduce", 1024, st, 11 * S, 10)],
                    200,
                )
            })
            .collect();
        let r = judge(ranks);
        assert_eq!(r.culprits.len(), 1, "{r:?}");
        assert_eq!(
            (r.culprits[0].rank, r.culprits[0].reason),
            (3, HangReason::NotStarted)
        );
        assert_eq!(r.culprits[0].waited_by, vec![0, 1, 2]);
    }

    #[test]
    fn every_member_in_and_none_finished_is_the_transport() {
        let g = [group("0", "default_pg", &[0, 1, 2])];
        let ranks = (0..3)
            .map(|r| {
                rank(
                    r,
                    &g,
                    10,
                    vec![coll(
                        "0",
                        11,
                        "all_reduce",
                        1024,
                        CollectiveState::Started,
                        11 * S,
                        10,
                    )],
                    200,
                )
            })
            .collect();
        let r = judge(ranks);
        assert!(r.hang && r.culprits.is_empty(), "{r:?}");
        assert_eq!(r.stuck_groups, vec!["0".to_string()]);
        assert!(r.verdict.contains("transport"), "{}", r.verdict);
    }

    /// A healthy job dumped rank by rank: rank 0's dump caught seq 11 in
    /// flight long after it began (its peer was busy dumping); rank 1's later
    /// dump shows seq 11 done and seq 12 issued; rank 2's dump is older than
    /// seq 11. None of that is a hang.
    #[test]
    fn dumps_taken_at_different_moments_are_no_hang() {
        let g = [group("0", "default_pg", &[0, 1, 2])];
        let pending = |st| coll("0", 11, "all_reduce", 1024, st, 11 * S, 10);
        let r0 = rank(0, &g, 10, vec![pending(CollectiveState::Started)], 40);
        let mut r1 = rank(1, &g, 10, vec![pending(CollectiveState::Completed)], 41);
        r1.collectives.push(coll(
            "0",
            12,
            "all_reduce",
            1024,
            CollectiveState::Started,
            41 * S,
            10,
        ));
        let r = judge(vec![r0.clone(), r1, rank(2, &g, 10, vec![], 40)]);
        assert!(!r.hang && r.culprits.is_empty(), "{r:?}");
        assert!(
            r.notes.iter().any(|n| n.contains("different moments")),
            "{:?}",
            r.notes
        );

        // Rank 2 dumped at 10.5 s, before seq 11 was issued at 11 s; or
        // at 12 s, before it had been absent for the bound (5 s: 5 periods).
        let mut r2 = rank(2, &g, 10, vec![], 0);
        r2.dumped_at_ns = Some(10 * S + S / 2);
        let r = judge(vec![
            r0.clone(),
            rank(1, &g, 10, vec![pending(CollectiveState::Started)], 40),
            r2.clone(),
        ]);
        assert!(!r.hang && r.culprits.is_empty(), "{r:?}");
        r2.dumped_at_ns = Some(12 * S);
        let r = judge(vec![
            r0,
            rank(1, &g, 10, vec![pending(CollectiveState::Started)], 40),
            r2,
        ]);
        assert!(!r.hang && r.culprits.is_empty(), "{r:?}");

        // The same rank 2 dumped after seq 11 was issued is the culprit.
        let r = judge(vec![
            rank(0, &g, 10, vec![pending(CollectiveState::Started)], 40),
            rank(1, &g, 10, vec![pending(CollectiveState::Started)], 40),
            rank(2, &g, 10, vec![], 40),
        ]);
        assert!(r.hang && r.culprits.iter().map(|c| c.rank).eq([2]), "{r:?}");
    }

    #[test]
    fn other_sizes_at_the_same_sequence_number_is_a_mismatch() {
        let g = [group("0", "default_pg", &[0, 1, 2])];
        let ranks = (0..3)
            .map(|r| {
                let n = if r == 1 { 4096 } else { 1024 };
                rank(
                    r,
                    &g,
                    10,
                    vec![coll(
                        "0",
                        11,
                        "all_reduce",
                        n,
                        CollectiveState::Scheduled,
                        11 * S,
                        10,
                    )],
                    200,
                )
            })
            .collect();
        let r = judge(ranks);
        assert_eq!(r.culprits.len(), 1, "{r:?}");
        assert_eq!(
            (r.culprits[0].rank, r.culprits[0].reason),
            (1, HangReason::Mismatch)
        );
        assert!(
            r.culprits[0].detail.contains("4096"),
            "{}",
            r.culprits[0].detail
        );
    }

    #[test]
    fn a_three_level_chain_names_its_root_only() {
        // tp {0,1}, ep {1,2}, dp {2,3}, each rank's step: its groups in
        // that order. 3 is computing; 2 waits for it in dp; 1 waits for 2
        // in ep (2 is in dp); 0 waits for 1 in tp (1 is still in ep).
        let tp = group("1", "tp", &[0, 1]);
        let ep = group("2", "ep", &[1, 2]);
        let dp = group("3", "dp", &[2, 3]);
        let pend = |g: &str, line: u32| {
            coll(
                g,
                11,
                "all_reduce",
                1024,
                CollectiveState::Scheduled,
                11 * S,
                line,
            )
        };
        let ranks = vec![
            // rank 0: [tp] → pending tp 11
            rank(0, std::slice::from_ref(&tp), 10, vec![pend("1", 10)], 300),
            // rank 1: [ep, tp] → ep 11 pending (tp 11 not issued yet)
            rank(1, &[ep.clone(), tp.clone()], 10, vec![pend("2", 10)], 300),
            // rank 2: [dp, ep] → dp 11 pending
            rank(2, &[dp.clone(), ep.clone()], 10, vec![pend("3", 10)], 300),
            // rank 3: [dp] → nothing issued for step 11
            rank(3, std::slice::from_ref(&dp), 10, vec![], 300),
        ];
        let r = judge(ranks);
        assert_eq!(
            r.culprits.iter().map(|c| c.rank).collect::<Vec<_>>(),
            vec![3],
            "{r:?}"
        );
        let c = &r.culprits[0];
        assert_eq!(
            (c.reason, c.group_desc.as_str()),
            (HangReason::NeverReached, "dp")
        );
        assert_eq!(c.waited_by, vec![0, 1, 2]);
        let w0 = r.waiting.iter().find(|w| w.rank == 0).unwrap();
        assert_eq!(w0.waits_for, vec![1]);
    }

    #[test]
    fn a_member_that_left_nothing_is_unresponsive() {
        // NCCL's pg_config names rank 3 a member; rank 3 left no file.
        let g = [group("0", "default_pg", &[0, 1, 2, 3])];
        let ranks = (0..3)
            .map(|r| {
                rank(
                    r,
                    &g,
                    10,
                    vec![coll(
                        "0",
                        11,
                        "all_reduce",
                        1024,
                        CollectiveState::Scheduled,
                        11 * S,
                        10,
                    )],
                    200,
                )
            })
            .collect();
        let r = judge(ranks);
        assert_eq!(
            r.culprits
                .iter()
                .map(|c| (c.rank, c.reason))
                .collect::<Vec<_>>(),
            vec![(3, HangReason::Unresponsive)]
        );
        assert!(
            r.notes
                .iter()
                .any(|n| n.contains("no evidence from rank(s) 3")),
            "{:?}",
            r.notes
        );
    }

    #[test]
    fn a_pending_collective_younger_than_the_bound_is_no_hang() {
        // Rank 2 is 0.2 s late into seq 11 (iterations 1 s apart): slow.
        let g = [group("0", "default_pg", &[0, 1, 2])];
        let ranks = (0..3)
            .map(|r| {
                let extra = if r == 2 {
                    vec![]
                } else {
                    vec![coll(
                        "0",
                        11,
                        "all_reduce",
                        1024,
                        CollectiveState::Scheduled,
                        11 * S,
                        10,
                    )]
                };
                rank(r, &g, 10, extra, 11 * S / S)
            })
            .map(|mut e| {
                e.dumped_at_ns = Some(11 * S + S / 5);
                e
            })
            .collect();
        let r = judge(ranks);
        assert!(!r.hang && r.culprits.is_empty(), "{r:?}");
        assert!(
            (r.min_wait_s - 5.0).abs() < 1e-9,
            "5x the 1 s period: {}",
            r.min_wait_s
        );
    }

    #[test]
    fn a_cycle_with_no_rank_out_of_order_is_a_deadlock() {
        // 0 waits for 1 in group a, 1 waits for 0 in group b, both from
        // their first collective (no history to tell who left its order).
        let a = group("1", "a", &[0, 1]);
        let b = group("2", "b", &[0, 1]);
        let ranks = vec![
            RankEvidence {
                rank: 0,
                groups: vec![a.clone(), b.clone()],
                collectives: vec![coll(
                    "1",
                    1,
                    "all_reduce",
                    8,
                    CollectiveState::Scheduled,
                    S,
                    1,
                )],
                dumped_at_ns: Some(100 * S),
                ..Default::default()
            },
            RankEvidence {
                rank: 1,
                groups: vec![a, b],
                collectives: vec![coll(
                    "2",
                    1,
                    "all_reduce",
                    8,
                    CollectiveState::Scheduled,
                    S,
                    2,
                )],
                dumped_at_ns: Some(100 * S),
                ..Default::default()
            },
        ];
        let r = judge(ranks);
        assert_eq!(
            r.culprits
                .iter()
                .map(|c| (c.rank, c.reason))
                .collect::<Vec<_>>(),
            vec![(0, HangReason::Deadlock), (1, HangReason::Deadlock)],
            "{r:?}"
        );
    }

    #[test]
    fn progress_counters_without_entries_are_enough() {
        // A dump whose ring buffer lost the entries keeps pg_status.
        let g = [group("0", "default_pg", &[0, 1])];
        let mk = |r: u32, enq: u64| RankEvidence {
            rank: r,
            groups: g.to_vec(),
            progress: vec![GroupProgress {
                group: "0".into(),
                last_enqueued: Some(enq),
                last_started: None,
                last_completed: Some(10),
            }],
            dumped_at_ns: Some(100 * S),
            ..Default::default()
        };
        let r = analyze(
            &HangEvidence {
                ranks: vec![mk(0, 11), mk(1, 10)],
                ..Default::default()
            },
            &HangConfig::default(),
        );
        assert_eq!(
            r.culprits
                .iter()
                .map(|c| (c.rank, c.reason))
                .collect::<Vec<_>>(),
            vec![(1, HangReason::NeverReached)],
            "{r:?}"
        );
    }

    /// A pipeline stage's pending send or receive (NCCL's `nccl:send 1->2`).
    fn p2p(op: &str, peer: u32, seq: u64, t: u64) -> RecordedCollective {
        RecordedCollective {
            p2p: true,
            peer: Some(peer),
            ..coll("pp", seq, op, 4096, CollectiveState::Scheduled, t, 40)
        }
    }

    /// Four pipeline stages {0,1,2,3} (Megatron's PIPELINE_MODEL_PARALLEL
    /// group, point-to-point only) in one world group. `stuck` issues
    /// nothing more; its neighbours wait on it alone.
    fn pipeline(stuck: u32) -> Vec<RankEvidence> {
        let g = [
            group("0", "default_pg", &[0, 1, 2, 3]),
            group("pp", "PIPELINE_MODEL_PARALLEL_GROUP", &[0, 1, 2, 3]),
        ];
        (0..4u32)
            .map(|r| {
                let mut extra = Vec::new();
                if r != stuck {
                    // Every healthy stage has posted both halves with its
                    // healthy neighbours; toward the stuck one, nothing
                    // comes back.
                    if r > 0 {
                        extra.push(p2p("recv", r - 1, 100 + u64::from(r), 11 * S));
                    }
                    if r < 3 {
                        extra.push(p2p("send", r + 1, 101 + u64::from(r), 11 * S + 1));
                    }
                }
                rank(r, &g[..1], 10, extra, 200).with_groups(&g)
            })
            .collect()
    }

    trait WithGroups {
        fn with_groups(self, g: &[GroupInfo]) -> Self;
    }
    impl WithGroups for RankEvidence {
        fn with_groups(mut self, g: &[GroupInfo]) -> Self {
            self.groups = g.to_vec();
            self
        }
    }

    #[test]
    fn pipeline_send_and_recv_wait_for_one_peer_only() {
        for stuck in 0..4u32 {
            let r = judge(pipeline(stuck));
            assert!(r.hang, "stuck {stuck}: {r:?}");
            assert_eq!(
                r.culprits
                    .iter()
                    .map(|c| (c.rank, c.reason))
                    .collect::<Vec<_>>(),
                vec![(stuck, HangReason::NeverReached)],
                "stuck {stuck}: {}",
                r.verdict
            );
            let c = &r.culprits[0];
            // Its neighbours wait for it, and only they.
            let mut neighbours: Vec<u32> = [stuck.wrapping_sub(1), stuck + 1]
                .into_iter()
                .filter(|&n| n < 4)
                .collect();
            neighbours.sort();
            let direct: BTreeSet<u32> = r
                .waiting
                .iter()
                .filter(|w| w.waits_for.contains(&stuck))
                .map(|w| w.rank)
                .collect();
            assert_eq!(direct.into_iter().collect::<Vec<_>>(), neighbours, "{r:?}");
            assert!(c.detail.contains("matching half"), "{}", c.detail);
            // A stage whose halves both sides posted waits for nobody.
            for w in r.waiting.iter().filter(|w| !neighbours.contains(&w.rank)) {
                assert!(w.waits_for.is_empty(), "{w:?}");
            }
        }
    }

    #[test]
    fn pipeline_counters_are_not_collective_progress() {
        // NCCL counts a pipeline group's sends and receives in pg_status;
        // the reader leaves those out, and entries alone must not make the
        // first stage (fewer sends than a middle one) a laggard.
        let mut ranks = pipeline(9);
        for r in &mut ranks {
            r.collectives.retain(|c| !c.p2p);
        }
        let r = judge(ranks);
        assert!(!r.hang && r.culprits.is_empty(), "{r:?}");
    }
}
