//! [`diagnose`] as a sequence of named stages (SysOM-AI §3.1–§3.3), each a
//! function of what the stages before it found:
//!
//! 1. [`Evidence::ordered`]: rank, off-CPU and host profiles apart, in one
//!    canonical order whatever the door read them in; a hang's open calls
//!    apart from the finished ones.
//! 2. [`Periods::choose`]: time 0, the judged span (`--until`), the training
//!    span, the baseline and the window (the user's, else split at the
//!    collectives' slowdown onset, else the thirds of the training), and
//!    which profile periods lie in them.
//! 3. [`cpu_layer`]: per group the CPU waterline and the temporal baseline,
//!    kept only when the job did slow.
//! 4. [`LateRanks::find`]: the slow ranks from the collective records
//!    (§3.2).
//! 5. [`os_layer`], [`network_layer`], [`gpu_layer`]: each late rank's OS
//!    signals and GPU kernels against its peers'; the hosts that lose
//!    segments or sit behind a slow link.
//! 6. [`judge`]: the host's other processes (§3.3), the blocked time, the
//!    layer.
//! 7. [`report_of`] and [`pictures`]: the report, and what its plots and
//!    flame graphs are drawn from.

use std::collections::{BTreeMap, BTreeSet};

use whyslow_model::collective::CollectiveRecord;
use whyslow_model::diagnosis::{
    CpuDiff, DiagnoseEvidence, GpuDiff, GroupSummary, LossyHost, OsDiffRow, StragglerRow,
};
use whyslow_model::hang::HangReport;
use whyslow_model::os::{OsSample, CPU_TIME};
use whyslow_model::stack::StackProfile;

use crate::gpu::{gpu_diff, GpuConfig, KernelTime};
use crate::job::{
    handler_path, host_connections, host_diff, host_tcp, host_view, judge_network, kernel_times,
    offcpu_diff, slowdown_onset, training_span, DiagnoseConfig, DiagnoseError, Diagnosis, HostView,
    Late,
};
use crate::layer::{mean_signals, os_diff, verdict, Layer, NetworkEvidence, OsConfig};
use crate::stragglers::{instance_periods, lateness, slow_ranks, Straggler, StragglerConfig};
use crate::{regressions, waterline, Config, Regression, Shares, WaterlineFlag};

mod output;
use output::{group_diffs, job_diffs, late_groups, pictures, report_of};

/// Runs the cross-layer diagnosis (SysOM-AI §3.1–§3.3) over `evidence`.
pub fn diagnose(
    evidence: &DiagnoseEvidence,
    cfg: &DiagnoseConfig,
) -> Result<Diagnosis, DiagnoseError> {
    cfg.validate()?;
    let mut notes = evidence.notes.clone();
    let mut ev = Evidence::ordered(evidence);
    if ev.profiles.is_empty()
        && ev.records.is_empty()
        && ev.os_samples.is_empty()
        && ev.hang.is_none()
    {
        return Err(DiagnoseError::NothingToDiagnose);
    }
    if ev.profiles.is_empty() {
        notes.push("no rank profiles: the CPU layer is not judged".into());
    }
    let periods = Periods::choose(&mut ev, cfg, &mut notes);
    let records = &periods.records;
    let groups = profile_groups(&ev.profiles);
    let cpu = cpu_layer(&groups, &periods, &mut notes);
    let late = LateRanks::find(records, &mut notes);
    let host_views: Vec<Option<HostView>> = late
        .late
        .iter()
        .map(|s| {
            host_view(s, &ev.profiles, &ev.host_profiles, records, &|p| {
                periods.in_window(p)
            })
        })
        .collect();
    let os_window = periods.os_window(&ev.os_samples);
    let os = os_layer(
        &late,
        &host_views,
        &os_window,
        &ev.profiles,
        &periods,
        &mut notes,
    );
    let network_rows = network_layer(&os_window, !ev.os_samples.is_empty(), &mut notes);
    let gpu_rows = gpu_layer(evidence, &late, &mut notes);
    let judged = judge(
        &ev,
        &periods,
        &cpu,
        &late,
        &host_views,
        &os,
        &network_rows,
        &gpu_rows,
        &mut notes,
    );
    let all_lateness = lateness(records, &StragglerConfig::default());
    let diffs = group_diffs(&groups, &periods);
    let flames = pictures(&ev, &periods, &late, &host_views, &diffs);
    let regressed = cpu.regressions.first().map(|r| r.group.clone());
    let changed = job_diffs(&ev, &periods, &diffs, regressed.as_deref());
    let late_groups = late_groups(&all_lateness, &late.found);
    let report = report_of(
        &ev,
        &periods,
        cpu,
        &late,
        os.rows,
        network_rows,
        gpu_rows,
        judged,
        &all_lateness,
        notes,
    );
    Ok(Diagnosis {
        report,
        late_groups,
        flames,
        group_diffs: diffs,
        job_diffs: changed,
    })
}

/// Stage 1: the evidence split by kind and put in one canonical order.
struct Evidence<'a> {
    /// Rank CPU profiles (a `rank` label, not off-CPU).
    profiles: Vec<&'a StackProfile>,
    /// Rank off-CPU profiles (counts are µs blocked).
    offcpu_profiles: Vec<&'a StackProfile>,
    /// Node-wide (host/cgroup) profiles: a `scope` label, no rank.
    host_profiles: Vec<&'a StackProfile>,
    /// Finished collective calls.
    records: Vec<&'a CollectiveRecord>,
    /// OS readings.
    os_samples: Vec<&'a OsSample>,
    /// A hang, when calls were seen still in flight.
    hang: Option<HangReport>,
}

impl<'a> Evidence<'a> {
    fn ordered(evidence: &'a DiagnoseEvidence) -> Self {
        let mut host_profiles: Vec<&StackProfile> = Vec::new();
        let mut offcpu_profiles: Vec<&StackProfile> = Vec::new();
        let mut profiles: Vec<&StackProfile> = Vec::new();
        for p in &evidence.profiles {
            if p.labels.contains_key("scope") {
                host_profiles.push(p);
            } else if !p.labels.contains_key("rank") {
                continue;
            } else if p.labels.get("kind").map(String::as_str) == Some("offcpu") {
                offcpu_profiles.push(p);
            } else {
                profiles.push(p);
            }
        }
        // Calls seen still in flight are a hang's evidence, not a late entry.
        let hang = whyslow_hang::any_open(&evidence.collectives)
            .then(|| {
                whyslow_hang::analyze(
                    &whyslow_hang::evidence_from_records(&evidence.collectives),
                    &Default::default(),
                )
            })
            .filter(|h| h.hang);
        let mut records: Vec<&CollectiveRecord> =
            evidence.collectives.iter().filter(|r| !r.open).collect();
        let mut os_samples: Vec<&OsSample> = evidence.os_samples.iter().collect();
        // One order whatever the door read the evidence in (a spool's file
        // names, a store's upload order): sums of shares are then the same to
        // the last bit, and so is the verdict.
        for v in [&mut profiles, &mut offcpu_profiles, &mut host_profiles] {
            v.sort_by(|a, b| {
                (
                    a.start_unix_ns,
                    a.duration_ns,
                    &a.labels,
                    a.stacks.len(),
                    a.total(),
                )
                    .cmp(&(
                        b.start_unix_ns,
                        b.duration_ns,
                        &b.labels,
                        b.stacks.len(),
                        b.total(),
                    ))
            });
        }
        records.sort_by(|a, b| {
            (&a.group, a.rank, a.entry_ns, a.exit_ns, a.seq, &a.op)
                .cmp(&(&b.group, b.rank, b.entry_ns, b.exit_ns, b.seq, &b.op))
        });
        os_samples.sort_by(|a, b| {
            (
                a.start_unix_ns,
                &a.host,
                a.rank,
                a.pid,
                a.duration_ns,
                &a.job,
            )
                .cmp(&(
                    b.start_unix_ns,
                    &b.host,
                    b.rank,
                    b.pid,
                    b.duration_ns,
                    &b.job,
                ))
        });
        Evidence {
            profiles,
            offcpu_profiles,
            host_profiles,
            records,
            os_samples,
            hang,
        }
    }
}

/// Stage 2: the clock and the periods compared.
struct Periods {
    /// Time 0: the earliest profile or OS reading (Unix ns).
    t0: u64,
    /// The healthy period, seconds since `t0`.
    baseline: (f64, f64),
    /// The judged period, seconds since `t0`.
    window: (f64, f64),
    /// Where the collectives came slower, when well inside the training.
    onset: Option<f64>,
    /// Each rank's training on the profiles' clock: its first collective
    /// entry to its last exit.
    rank_spans: BTreeMap<String, (u64, u64)>,
    /// The finished collective records judged (up to `--until`).
    records: Vec<CollectiveRecord>,
}

impl Periods {
    fn choose(ev: &mut Evidence<'_>, cfg: &DiagnoseConfig, notes: &mut Vec<String>) -> Self {
        let starts = ev
            .profiles
            .iter()
            .map(|p| (p.start_unix_ns, p.duration_ns))
            .chain(
                ev.os_samples
                    .iter()
                    .map(|s| (s.start_unix_ns, s.duration_ns)),
            );
        let t0 = starts.clone().map(|x| x.0).min().unwrap_or(0);
        let mut end = starts.map(|(a, d)| a.saturating_add(d)).max().unwrap_or(t0);
        if let Some(u) = cfg.until {
            let cut = t0.saturating_add((u.max(0.0) * 1e9) as u64);
            end = end.min(cut);
            let done = |p: &&StackProfile| p.start_unix_ns.saturating_add(p.duration_ns) <= cut;
            ev.profiles.retain(done);
            ev.offcpu_profiles.retain(done);
            ev.host_profiles.retain(done);
            ev.records.retain(|r| r.exit_ns <= cut);
            ev.os_samples
                .retain(|o| o.start_unix_ns.saturating_add(o.duration_ns) <= cut);
        }
        let records: Vec<CollectiveRecord> = ev.records.iter().map(|r| (*r).clone()).collect();
        let span = (end - t0) as f64 / 1e9;
        // The default thirds are of the training: the span of the collective
        // records where they are on the same (Unix) clock as the profiles, so
        // that start-up (imports, rendezvous) is neither the healthy baseline
        // nor the judged window; else of all the data.
        let training = training_span(&records, t0, end);
        let (s0, s1) = training.unwrap_or((0.0, span));
        let third = (s1 - s0) / 3.0;
        // Where the collectives came slower (a rise well inside the training),
        // the healthy past ends there and the judged window starts there: the
        // thirds would put part of a slowdown that began early into the
        // baseline, or leave the window with only part of it.
        let onset = (cfg.baseline.is_none() && cfg.window.is_none())
            .then(|| slowdown_onset(&records, t0))
            .flatten()
            .filter(|&on| on - s0 >= 0.15 * (s1 - s0) && s1 - on >= 0.15 * (s1 - s0));
        if let Some(on) = onset {
            notes.push(format!(
                "the collectives came slower from {on:.1} s: the baseline is the training before it, the window after it"
            ));
        }
        let baseline = match (cfg.baseline, onset) {
            (Some(r), _) => r,
            (None, Some(on)) => (s0, on),
            (None, None) => (s0, s0 + third),
        };
        let window = match (cfg.window, onset) {
            (Some(r), _) => r,
            (None, Some(on)) => (on, s1),
            (None, None) => (s1 - third, s1),
        };
        // A profile period reaching outside its rank's training by more than
        // a tenth holds start-up (imports, rendezvous) or shutdown (the
        // interpreter's final garbage collection: 18 % of a window's samples
        // in one CI run), which is no training to compare.
        let mut rank_spans: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        if training.is_some() {
            for r in &records {
                let s = rank_spans
                    .entry(r.global_rank.unwrap_or(r.rank).to_string())
                    .or_insert((r.entry_ns, r.exit_ns));
                s.0 = s.0.min(r.entry_ns);
                s.1 = s.1.max(r.exit_ns);
            }
        }
        let periods = Periods {
            t0,
            baseline,
            window,
            onset,
            rank_spans,
            records,
        };
        let outside = ev
            .profiles
            .iter()
            .filter(|p| !periods.in_training(p))
            .count();
        if outside > 0 {
            notes.push(format!(
                "{outside} rank profile period(s) reaching into start-up or shutdown (before the rank's \
                 first collective or after its last) are left out"
            ));
        }
        periods
    }

    /// Whether a profile's period lies in its rank's training.
    fn in_training(&self, p: &StackProfile) -> bool {
        let Some(&(first, last)) = p.labels.get("rank").and_then(|r| self.rank_spans.get(r)) else {
            return true;
        };
        let slack = p.duration_ns / 10;
        p.start_unix_ns.saturating_add(slack) >= first
            && p.start_unix_ns.saturating_add(p.duration_ns) <= last.saturating_add(slack)
    }

    /// Whether most of a profile's period lies in `range` (and in training).
    fn within(&self, p: &StackProfile, range: (f64, f64)) -> bool {
        if !self.in_training(p) {
            return false;
        }
        let a = p.start_unix_ns.saturating_sub(self.t0) as f64 / 1e9;
        let b = a + p.duration_ns as f64 / 1e9;
        let inside = (b.min(range.1) - a.max(range.0)).max(0.0);
        inside > 0.5 * (b - a) || (b - a <= 0.0 && (range.0..=range.1).contains(&a))
    }

    fn in_window(&self, p: &StackProfile) -> bool {
        self.within(p, self.window)
    }

    /// The OS readings whose middle lies in the window.
    fn os_window<'a>(&self, samples: &[&'a OsSample]) -> Vec<&'a OsSample> {
        samples
            .iter()
            .copied()
            .filter(|s| {
                let mid = (s.start_unix_ns.saturating_sub(self.t0) as f64
                    + s.duration_ns as f64 / 2.0)
                    / 1e9;
                (self.window.0..=self.window.1).contains(&mid)
            })
            .collect()
    }

    /// A group rank's world rank (what profiles and OS readings carry).
    fn world(&self, group: &str, rank: u32) -> u32 {
        world_rank(&self.records, group, rank)
    }
}

/// A group rank's world rank in `records`.
fn world_rank(records: &[CollectiveRecord], group: &str, rank: u32) -> u32 {
    records
        .iter()
        .find(|r| r.group == group && r.rank == rank)
        .and_then(|r| r.global_rank)
        .unwrap_or(rank)
}

/// Rank profiles by group: the communication group label when the agent
/// has it, else the job.
fn profile_groups<'a>(profiles: &[&'a StackProfile]) -> BTreeMap<String, Vec<&'a StackProfile>> {
    let mut groups: BTreeMap<String, Vec<&StackProfile>> = BTreeMap::new();
    for p in profiles {
        let g = p
            .labels
            .get("group")
            .or_else(|| p.labels.get("job"))
            .cloned()
            .unwrap_or_else(|| "unknown-job".into());
        groups.entry(g).or_default().push(p);
    }
    groups
}

/// Stage 3's findings: ranks above their group's CPU waterline, functions
/// that rose since the baseline, and what each group's comparison rested on.
struct CpuLayer {
    flags: Vec<WaterlineFlag>,
    regressions: Vec<Regression>,
    summaries: Vec<GroupSummary>,
}

/// Stage 3: per group the CPU waterline over the window and the temporal
/// baseline (§3.1), the latter kept only when the job did slow.
fn cpu_layer(
    groups: &BTreeMap<String, Vec<&StackProfile>>,
    periods: &Periods,
    notes: &mut Vec<String>,
) -> CpuLayer {
    let wcfg = Config::default();
    let (mut flags, mut regs, mut summaries) = (Vec::new(), Vec::new(), Vec::new());
    for (g, ps) in groups {
        let before: Vec<&StackProfile> = ps
            .iter()
            .copied()
            .filter(|p| periods.within(p, periods.baseline))
            .collect();
        let after: Vec<&StackProfile> = ps
            .iter()
            .copied()
            .filter(|p| periods.in_window(p))
            .collect();
        let mut by_rank: BTreeMap<String, Vec<&StackProfile>> = BTreeMap::new();
        for p in &after {
            by_rank
                .entry(p.labels.get("rank").cloned().unwrap_or_default())
                .or_default()
                .push(p);
        }
        let ranks: BTreeMap<String, Shares> = by_rank
            .into_iter()
            .map(|(r, v)| (r, Shares::of(v)))
            .collect();
        let (sb, sa) = (
            Shares::of(before.iter().copied()),
            Shares::of(after.iter().copied()),
        );
        summaries.push(GroupSummary {
            group: g.clone(),
            ranks: ranks.len(),
            baseline_samples: sb.total,
            window_samples: sa.total,
            window_samples_by_rank: ranks
                .iter()
                .filter_map(|(r, s)| Some((r.parse().ok()?, s.total)))
                .collect(),
        });
        if sb.total < wcfg.min_samples || sa.total < wcfg.min_samples {
            notes.push(format!(
                "group {g}: {} baseline and {} window samples; at least {} each are needed to compare",
                sb.total, sa.total, wcfg.min_samples
            ));
        }
        flags.extend(waterline(g, &ranks, &wcfg));
        regs.extend(regressions(g, &sb, &sa, &wcfg));
    }
    keep_regressions_if_slowed(&mut regs, periods, notes);
    CpuLayer {
        flags,
        regressions: regs,
        summaries,
    }
}

/// The temporal baseline answers "what changed since the job was healthy"
/// when the job slowed (SysOM-AI §3.1). Where collective records on the
/// profiles' clock tell the time per collective, a job whose collectives
/// came no slower in the window than in the baseline has no slowdown to
/// explain: a share that rose since (warm-up in the baseline, a phase
/// change) is not a regression then.
fn keep_regressions_if_slowed(
    regs: &mut Vec<Regression>,
    periods: &Periods,
    notes: &mut Vec<String>,
) {
    let records = &periods.records;
    let secs_to_ns = |s: f64| periods.t0.saturating_add((s * 1e9) as u64);
    let of = |r: (f64, f64)| instance_periods(records, secs_to_ns(r.0), secs_to_ns(r.1), 5);
    let (pb, pw) = (of(periods.baseline), of(periods.window));
    let compared: Vec<(String, f64, f64)> = pb
        .iter()
        .filter_map(|(g, b)| Some((g.clone(), (*b)?, (*pw.get(g)?)?)))
        .collect();
    if !regs.is_empty() && !compared.is_empty() {
        if compared.iter().all(|(_, b, w)| *w < 1.1 * b) {
            let (g, b, w) = &compared[0];
            notes.push(format!(
                "{} function share(s) rose since the baseline, but the job did not slow: group {g} \
                 ran a collective every {:.1} ms in the baseline and {:.1} ms in the window; \
                 not reported as regressions",
                regs.len(),
                b / 1e6,
                w / 1e6
            ));
            regs.clear();
        }
    } else if !regs.is_empty() && !records.is_empty() {
        notes.push(
            "the collective records do not cover both the baseline and the window: \
             regressions are reported without checking that the job slowed"
                .into(),
        );
    }
}

/// Stage 4: the slow ranks (§3.2) from the collective records.
struct LateRanks {
    /// As the lateness judge found them (group ranks).
    found: Vec<Straggler>,
    /// The same, by world rank.
    late: Vec<Late>,
    /// The report's rows.
    stragglers: Vec<StragglerRow>,
    /// Each group's other members' world ranks, by (group, group rank).
    peers: BTreeMap<(String, u32), Vec<u32>>,
}

impl LateRanks {
    fn find(records: &[CollectiveRecord], notes: &mut Vec<String>) -> Self {
        let found = if records.is_empty() {
            notes.push(
                "no collective records (*.collectives.jsonl): slow ranks are not judged".into(),
            );
            Vec::new()
        } else {
            slow_ranks(records, &StragglerConfig::default())
        };
        let late: Vec<Late> = found
            .iter()
            .map(|s| Late {
                rank: world_rank(records, &s.group, s.rank),
                group: s.group.clone(),
            })
            .collect();
        let stragglers = found
            .iter()
            .zip(&late)
            .map(|(s, l)| StragglerRow {
                rank: l.rank,
                group: s.group.clone(),
                late_us: s.late_us - s.peers_late_us,
                t: s.t,
            })
            .collect();
        let peers = found
            .iter()
            .map(|s| {
                let others: BTreeSet<u32> = records
                    .iter()
                    .filter(|r| r.group == s.group && r.rank != s.rank)
                    .map(|r| r.global_rank.unwrap_or(r.rank))
                    .collect();
                ((s.group.clone(), s.rank), others.into_iter().collect())
            })
            .collect();
        LateRanks {
            found,
            late,
            stragglers,
            peers,
        }
    }

    /// The world ranks of a late rank's group's other members.
    fn peers_of(&self, s: &Straggler) -> &[u32] {
        self.peers
            .get(&(s.group.clone(), s.rank))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }
}

/// Stage 5a's findings.
struct OsLayer {
    rows: Vec<OsDiffRow>,
    /// The first late rank's CPU ms per s against its peers'.
    cpu_ms: Option<(f64, f64)>,
}

/// Stage 5a: each late rank's OS signals over the window against the other
/// ranks of its group, with the handler path that explains a signal.
fn os_layer(
    late: &LateRanks,
    host_views: &[Option<HostView>],
    os_window: &[&OsSample],
    profiles: &[&StackProfile],
    periods: &Periods,
    notes: &mut Vec<String>,
) -> OsLayer {
    let mut by_rank: BTreeMap<u32, Vec<&OsSample>> = BTreeMap::new();
    for s in os_window {
        if let Some(r) = s.rank {
            by_rank.entry(r).or_default().push(s);
        }
    }
    let means: BTreeMap<u32, BTreeMap<String, f64>> = by_rank
        .iter()
        .map(|(r, v)| (*r, mean_signals(v.iter().copied())))
        .collect();
    let mut rows = Vec::new();
    let mut cpu_ms: Option<(f64, f64)> = None;
    for (s, (l, view)) in late.found.iter().zip(late.late.iter().zip(host_views)) {
        let me = l.rank;
        let Some(mine) = means.get(&me) else {
            notes.push(format!(
                "group {} rank {me}: no OS signals in the window (*.os.jsonl): the OS layer is not judged",
                s.group
            ));
            continue;
        };
        let peers: Vec<BTreeMap<String, f64>> = late
            .peers_of(s)
            .iter()
            .filter_map(|r| means.get(r).cloned())
            .collect();
        if peers.is_empty() {
            notes.push(format!(
                "group {}: no peer of rank {me} has OS signals in the window: the OS layer is not judged",
                s.group
            ));
            continue;
        }
        let peer_cpu =
            peers.iter().filter_map(|p| p.get(CPU_TIME)).sum::<f64>() / peers.len() as f64;
        if cpu_ms.is_none() {
            cpu_ms = mine.get(CPU_TIME).map(|&m| (m, peer_cpu));
        }
        let me_label = me.to_string();
        let own = Shares::of(
            profiles
                .iter()
                .copied()
                .filter(|p| p.labels.get("rank") == Some(&me_label) && periods.in_window(p)),
        );
        for diff in os_diff(mine, &peers, &OsConfig::default()) {
            let on_host = view
                .as_ref()
                .and_then(|v| handler_path(&diff.signal, &v.shares[&v.host]))
                .map(|p| (p, "host"));
            let path = on_host.or_else(|| handler_path(&diff.signal, &own).map(|p| (p, "rank")));
            rows.push(OsDiffRow {
                group: s.group.clone(),
                rank: me,
                handler_stack: path.as_ref().map(|((st, _), _)| st.clone()),
                handler_share: path.as_ref().map(|((_, sh), _)| *sh),
                handler_scope: path.as_ref().map(|(_, scope)| scope.to_string()),
                diff,
            });
        }
    }
    OsLayer { rows, cpu_ms }
}

/// Stage 5b: the hosts that lose TCP segments or sit behind a slow link,
/// from the window's OS readings; notes on what could not be judged.
fn network_layer(os_window: &[&OsSample], any_os: bool, notes: &mut Vec<String>) -> Vec<LossyHost> {
    let rows = judge_network(os_window);
    if any_os && host_connections(os_window).is_empty() {
        notes.push(
            "no per-connection TCP state in the window's OS signals (an agent before it read \
             them, or no socket diagnostics in the ranks' namespaces): slow links without loss \
             are not judged"
                .into(),
        );
    }
    if any_os && host_tcp(os_window).is_empty() {
        notes.push(
            "no TCP counters in the window's OS signals (an agent before they were read, or no \
             /proc/PID/net/snmp): the network layer is not judged"
                .into(),
        );
    }
    if rows.len() > 1 {
        notes.push(
            "several hosts lose TCP segments: loss between two hosts shows on both (the sender \
             resends, the receiver gets segments out of order), whichever end's link drops it; \
             a host that does both, or that every peer of it names, is the likeliest link"
                .into(),
        );
    }
    if !any_os {
        notes.push("no OS signals (*.os.jsonl; the agent writes them with --profile-spool): the OS layer is not judged".into());
    }
    rows
}

/// Stage 5c: each late rank's GPU kernel times against its group's.
fn gpu_layer(
    evidence: &DiagnoseEvidence,
    late: &LateRanks,
    notes: &mut Vec<String>,
) -> Vec<GpuDiff> {
    let kernels = evidence
        .fingerprints
        .as_deref()
        .map(kernel_times)
        .unwrap_or_default();
    let mut rows = Vec::new();
    if kernels.is_empty() {
        notes.push(if evidence.fingerprints.is_none() {
            "no GPU kernel times (--fingerprints: fingerprints or profiler traces per rank): the GPU layer is not judged".into()
        } else {
            "no GPU kernels in the --fingerprints files: the GPU layer is not judged".into()
        });
        return rows;
    }
    for (s, l) in late.found.iter().zip(&late.late) {
        let me = l.rank;
        let peers: Vec<Vec<KernelTime>> = late
            .peers_of(s)
            .iter()
            .filter_map(|r| kernels.get(r).cloned())
            .collect();
        let Some(mine) = kernels.get(&me) else {
            notes.push(format!(
                "group {} rank {me}: no GPU kernel times: the GPU layer is not judged",
                s.group
            ));
            continue;
        };
        if peers.is_empty() {
            notes.push(format!(
                "group {}: no peer of rank {me} has GPU kernel times: the GPU layer is not judged",
                s.group
            ));
            continue;
        }
        if let Some(finding) = gpu_diff(mine, &peers, &GpuConfig::default()) {
            rows.push(GpuDiff {
                group: s.group.clone(),
                rank: me,
                peers: peers.len(),
                finding,
            });
        }
    }
    rows
}

/// Stage 6's findings: the late ranks' hosts' other processes, their
/// blocked time and the layer.
struct Judged {
    host_rows: Vec<CpuDiff>,
    offcpu_rows: Vec<CpuDiff>,
    layer: Layer,
}

/// Stage 6: what the late ranks' hosts ran besides them (§3.3), the layer
/// from every layer's findings, then their time blocked off the CPU.
#[allow(clippy::too_many_arguments)]
fn judge(
    ev: &Evidence<'_>,
    periods: &Periods,
    cpu: &CpuLayer,
    late: &LateRanks,
    host_views: &[Option<HostView>],
    os: &OsLayer,
    network_rows: &[LossyHost],
    gpu_rows: &[GpuDiff],
    notes: &mut Vec<String>,
) -> Judged {
    let host_rows: Vec<CpuDiff> = late
        .late
        .iter()
        .zip(host_views)
        .filter_map(|(s, v)| Some(host_diff(s, v.as_ref()?)))
        .flatten()
        .collect();
    if ev.host_profiles.is_empty() && !late.late.is_empty() {
        notes.push(
            "no host profiles (the agent's --profile-host or --profile-cgroup): \
             other processes on a late rank's host are not judged"
                .into(),
        );
    }
    let late_labels: Vec<String> = late.late.iter().map(|s| s.rank.to_string()).collect();
    let straggler_cpu: Vec<WaterlineFlag> = cpu
        .flags
        .iter()
        .filter(|f| late_labels.contains(&f.rank))
        .cloned()
        .chain(host_rows.iter().map(|d| WaterlineFlag {
            group: d.group.clone(),
            rank: d.rank.to_string(),
            function: d.function.clone(),
            stack: d.stack.clone(),
            share: d.straggler_share,
            peer_share: d.peer_share,
            threshold: d.threshold,
        }))
        .collect();
    let os_for_verdict: Vec<_> = os.rows.iter().map(|d| d.diff.clone()).collect();
    let network = if network_rows.is_empty() {
        NetworkEvidence::Quiet
    } else if network_rows.iter().any(|h| {
        h.ranks
            .iter()
            .any(|r| late.late.iter().any(|s| s.rank == *r))
    }) {
        NetworkEvidence::OnLateHost
    } else {
        NetworkEvidence::Elsewhere
    };
    let mut layer = verdict(
        !late.late.is_empty(),
        !gpu_rows.is_empty(),
        &straggler_cpu,
        &os_for_verdict,
        os.cpu_ms,
        // With collective records and nobody late, a rank above the
        // waterline holds nobody up: only a regression is a cause then.
        !cpu.regressions.is_empty() || (periods.records.is_empty() && !cpu.flags.is_empty()),
        network,
    );
    // Off the CPU: a late rank that blocks where its peers do not (a slow
    // read, a lock), each group's blocked-time shares over the window.
    let offcpu_rows = offcpu_diff(&late.late, &ev.offcpu_profiles, |p| periods.in_window(p));
    if !offcpu_rows.is_empty() && layer == Layer::None {
        // Waiting in the kernel for I/O or a lock is the OS layer's to own.
        layer = Layer::Os;
    }
    explain_the_layer(ev, periods, late, layer, notes);
    Judged {
        host_rows,
        offcpu_rows,
        layer,
    }
}

/// Notes on what the layer rests on when it is `none` or blocked time is
/// not seen.
fn explain_the_layer(
    ev: &Evidence<'_>,
    periods: &Periods,
    late: &LateRanks,
    layer: Layer,
    notes: &mut Vec<String>,
) {
    if ev.offcpu_profiles.is_empty() && !late.late.is_empty() {
        notes.push(
            "no off-CPU profiles (the agent's --profile-offcpu): time a late rank spent blocked is not judged"
                .into(),
        );
    }
    if let (Some(on), true) = (periods.onset, late.late.is_empty() && layer == Layer::None) {
        notes.push(format!(
            "the collectives came slower from {on:.1} s, and no layer judged here shows a cause: \
             no rank is late, no CPU path rose, no OS signal differs and no host loses segments \
             or sits behind a slow link (look at what was not judged: the GPU, or the network \
             beyond the hosts' own connections)"
        ));
    }
    if !late.late.is_empty() && layer == Layer::None {
        notes.push(
            "a rank is late but neither its CPU profile nor its OS signals differ from its peers': \
             the cause is in a layer not seen here (the network, the GPU where its kernel times \
             were not given, or before the window)"
                .into(),
        );
    }
}
