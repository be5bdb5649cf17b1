//! The whole cross-layer diagnosis of one job (SysOM-AI §3.1): evidence in,
//! [`DiagnoseReport`] out. `whyslow diagnose`, the server's
//! `GET /api/v1/jobs/{job}/diagnosis` and the Python package all call
//! [`diagnose`]; none of them decides anything about the evidence itself.
//!
//! The steps: time 0 and the training span; the baseline and the window
//! (the user's, else split at the collectives' slowdown onset, else the
//! thirds of the training); per group the CPU waterline and the temporal
//! baseline (kept only when the job did slow); the slow ranks from the
//! collective records (§3.2); for each late rank its host's other
//! processes (§3.3), its OS signals, its GPU kernels against its peers',
//! its blocked time; the hosts losing TCP segments; and the layer.

use std::collections::{BTreeMap, BTreeSet};

use whyslow_model::collective::CollectiveRecord;
use whyslow_model::diagnosis::{
    CollectiveGroup, CpuDiff, DiagnoseEvidence, DiagnoseReport, GpuDiff, GroupSummary, OsDiffRow,
    StragglerRow,
};
use whyslow_model::os::{
    OsSample, TcpConnection, CPU_TIME, TCP_IN_SEGS, TCP_OUT_OF_ORDER, TCP_OUT_SEGS,
    TCP_RETRANS_SEGS,
};
use whyslow_model::stack::StackProfile;
use whyslow_model::FunctionKind;

use crate::gpu::{gpu_diff, GpuConfig, KernelTime};
use crate::layer::{
    handler_functions, mean_signals, os_diff, verdict, Layer, NetworkEvidence, OsConfig,
};
use crate::network::{
    dropping_hosts, lossy_hosts, merge_readings, slow_hosts_dropping, HostConnections, HostTcp,
    LossyHost, NetworkConfig,
};
use crate::stragglers::{instance_periods, lateness, slow_ranks, GroupLateness, StragglerConfig};
use crate::{regressions, waterline, Config, Shares, WaterlineFlag};

/// Which periods to compare; `Default`: chosen from the evidence.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DiagnoseConfig {
    /// The healthy period, seconds since the earliest profile or OS
    /// reading. Default: the training before its collectives came slower,
    /// when they did well inside it; else its first third.
    pub baseline: Option<(f64, f64)>,
    /// The period to judge. Default: the training from the slowdown's
    /// onset on; else its last third.
    pub window: Option<(f64, f64)>,
    /// Judge only what had been written by this many seconds since the
    /// earliest profile or OS reading: the verdict as it stood then.
    pub until: Option<f64>,
}

/// Why there is no diagnosis at all.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DiagnoseError {
    /// No rank profile, no collective record and no OS reading.
    #[error(
        "no rank profile (*.pb.gz; the agent writes them with --profile-spool), no collective \
         records (*.collectives.jsonl) and no OS signals (*.os.jsonl): nothing to diagnose"
    )]
    NothingToDiagnose,
    /// A period that is not `0 <= A < B`.
    #[error("--{what} {given:?}: {why}")]
    BadRange {
        /// `baseline` or `window`.
        what: &'static str,
        /// What was given.
        given: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Parses a period `A..B` (seconds, `0 <= A < B`) for `what` (`baseline`,
/// `window`): the command line's `--baseline` and the server's `?baseline=`.
pub fn parse_range(s: &str, what: &'static str) -> Result<(f64, f64), DiagnoseError> {
    let bad = |why: String| DiagnoseError::BadRange {
        what,
        given: s.to_string(),
        why,
    };
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| bad("expected A..B (seconds)".into()))?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| bad(format!("{x:?} is not a number of seconds")))
    };
    let (a, b) = (num(a)?, num(b)?);
    if !(a.is_finite() && b.is_finite() && a < b && a >= 0.0) {
        return Err(bad("needs 0 <= A < B".into()));
    }
    Ok((a, b))
}

/// A differential flame graph to draw: `base` against `test`.
#[derive(Debug, Clone)]
pub struct FlamePair {
    /// Its title.
    pub title: String,
    /// The group it belongs to, for a window-against-baseline pair.
    pub group: Option<String>,
    /// The reference (a peer, the baseline).
    pub base: StackProfile,
    /// What is judged (the late rank, the window).
    pub test: StackProfile,
}

/// One group's entry-time plot data (SysOM-AI Fig. 5).
#[derive(Debug, Clone)]
pub struct LateGroup {
    /// Each instance's lateness per rank.
    pub lateness: GroupLateness,
    /// Its late group ranks.
    pub flagged: Vec<u32>,
}

/// The report with what its pictures are drawn from.
#[derive(Debug, Clone)]
pub struct Diagnosis {
    /// The verdict.
    pub report: DiagnoseReport,
    /// Groups with a late rank, for the entry-time plot.
    pub late_groups: Vec<LateGroup>,
    /// Differential flame graphs: each late rank against a peer (CPU,
    /// blocked time, its host), then each group's window against its
    /// baseline (at most 4 of each).
    pub flames: Vec<FlamePair>,
    /// Each group's window against its baseline, whether or not either is
    /// empty (the command line's `--diff-svg`).
    pub group_diffs: Vec<FlamePair>,
}

/// A late rank as the steps below see it.
struct Late {
    rank: u32,
    group: String,
}

/// How a host profile's process label (`comm [pid]`) reads as a function:
/// a registered rank's process as `rank R (process)`, any other by its
/// command, `sh (process)`.
fn process_function(label: &str, rank_of_pid: &BTreeMap<String, String>) -> String {
    match label.rsplit_once(" [") {
        Some((comm, pid)) => match rank_of_pid.get(pid.trim_end_matches(']')) {
            Some(r) => format!("rank {r}{PROCESS_SUFFIX}"),
            None => format!("{comm}{PROCESS_SUFFIX}"),
        },
        None => format!("{label}{PROCESS_SUFFIX}"),
    }
}

const PROCESS_SUFFIX: &str = " (process)";

/// Each world rank's GPU kernel times from its fingerprints (several of
/// one rank add up): their table of every kernel, or in fingerprints
/// written before it the kernels kept among their functions.
fn kernel_times(fps: &[whyslow_model::Fingerprint]) -> BTreeMap<u32, Vec<KernelTime>> {
    let mut out: BTreeMap<u32, Vec<KernelTime>> = BTreeMap::new();
    for fp in fps {
        let mine = out.entry(fp.worker).or_default();
        if fp.kernels.is_empty() {
            mine.extend(
                fp.functions
                    .iter()
                    .filter(|f| f.kind == FunctionKind::GpuKernel)
                    .map(|f| KernelTime {
                        name: f.name.clone(),
                        calls: f.calls,
                        total_us: f.total_us,
                    }),
            );
        } else {
            mine.extend(fp.kernels.iter().map(|k| KernelTime {
                name: k.name.clone(),
                calls: k.calls,
                total_us: k.total_us,
            }));
        }
    }
    out.retain(|_, v| !v.is_empty());
    out
}

/// Seconds since `t0` (ns, Unix) of the first entry and the last exit of
/// `records`, when they lie within the profiles' span give or take a minute
/// (records on another clock, or a few, say nothing of the training).
fn training_span(records: &[CollectiveRecord], t0: u64, end: u64) -> Option<(f64, f64)> {
    if t0 == 0 {
        return None;
    }
    let first = records.iter().map(|r| r.entry_ns).min()?;
    let last = records.iter().map(|r| r.exit_ns).max()?;
    let minute = 60_000_000_000;
    let plausible = first + minute >= t0 && last <= end + minute && last > first;
    let (a, b) = (
        first.saturating_sub(t0) as f64 / 1e9,
        last.saturating_sub(t0) as f64 / 1e9,
    );
    (plausible && b - a >= 3.0).then_some((a, b))
}

/// Seconds since `t0` at which the job's collectives came slower (one
/// change point in their period, PerfTracker §4.1's iteration-time rise),
/// from the rank with the most records of the busiest group: the period
/// of each run of consecutive calls (about 60 runs), split where the
/// later ones are persistently ≥ 10 % slower. `None` without such a rise.
fn slowdown_onset(records: &[CollectiveRecord], t0: u64) -> Option<f64> {
    let mut count: BTreeMap<(&str, u32), usize> = BTreeMap::new();
    for r in records {
        *count.entry((r.group.as_str(), r.rank)).or_default() += 1;
    }
    let (&(group, rank), _) = count.iter().max_by_key(|(_, &n)| n)?;
    let mut entries: Vec<u64> = records
        .iter()
        .filter(|r| r.group == group && r.rank == rank)
        .map(|r| r.entry_ns)
        .collect();
    entries.sort_unstable();
    let run = (entries.len() / 60).max(5);
    let periods: Vec<f64> = entries
        .chunks_exact(run)
        .map(|c| (c[run - 1] - c[0]) as f64 / (run - 1) as f64)
        .collect();
    let cfg = whyslow_online::OnsetConfig {
        min_side: 3,
        ..Default::default()
    };
    let split = whyslow_online::find_onset(&periods, &cfg)?;
    Some(entries[split.index * run].saturating_sub(t0) as f64 / 1e9)
}

/// A late rank's host beside its group's other hosts: each host's shares
/// over the window with processes counted as functions (SysOM-AI §3.3:
/// interference often comes from a process that never registered).
struct HostView {
    /// The late rank's host.
    host: String,
    /// Host → its shares, for the hosts of the rank's group with samples.
    shares: BTreeMap<String, Shares>,
}

/// The [`HostView`] of a late rank, from the host profiles (`scope` label)
/// `in_window`; `None` without a host profile of its host.
fn host_view(
    s: &Late,
    rank_profiles: &[&StackProfile],
    host_profiles: &[&StackProfile],
    records: &[CollectiveRecord],
    in_window: &dyn Fn(&StackProfile) -> bool,
) -> Option<HostView> {
    let label = |p: &StackProfile, k: &str| p.labels.get(k).cloned();
    let host_of: BTreeMap<String, String> = rank_profiles
        .iter()
        .filter_map(|p| Some((label(p, "rank")?, label(p, "host")?)))
        .collect();
    let rank_of_pid: BTreeMap<String, String> = rank_profiles
        .iter()
        .filter_map(|p| Some((label(p, "pid")?, label(p, "rank")?)))
        .collect();
    let name = |l: &str| process_function(l, &rank_of_pid);
    let mine = host_of.get(&s.rank.to_string())?.clone();
    let mut hosts: Vec<&String> = records
        .iter()
        .filter(|r| r.group == s.group)
        .filter_map(|r| host_of.get(&r.global_rank.unwrap_or(r.rank).to_string()))
        .collect();
    hosts.sort();
    hosts.dedup();
    let shares: BTreeMap<String, Shares> = hosts
        .into_iter()
        .map(|h| {
            let ps = host_profiles
                .iter()
                .copied()
                .filter(|p| p.labels.get("host") == Some(h) && in_window(p));
            (h.clone(), Shares::of_processes(ps, &name))
        })
        .filter(|(_, sh)| sh.total > 0)
        .collect();
    shares
        .contains_key(&mine)
        .then_some(HostView { host: mine, shares })
}

/// A waterline flag as a `cpu_diff`/`offcpu_diff` row of the rank's own
/// profile; `None` when its rank label is not a number.
fn rank_row(f: WaterlineFlag) -> Option<CpuDiff> {
    Some(CpuDiff {
        rank: f.rank.parse().ok()?,
        group: f.group,
        scope: "rank".into(),
        host: None,
        function: f.function,
        stack: f.stack,
        straggler_share: f.share,
        peer_share: f.peer_share,
        threshold: f.threshold,
    })
}

/// The late rank's host against its group's other hosts (the waterline,
/// hosts as its members; at least 3 hosts). Paths in the late rank's own
/// process are left to its rank profile; the rest (a neighbour, the
/// kernel's work for it) are the rows, `scope` `host`.
fn host_diff(s: &Late, view: &HostView) -> Vec<CpuDiff> {
    let own = format!("rank {}{PROCESS_SUFFIX}", s.rank);
    waterline(&s.group, &view.shares, &Config::default())
        .into_iter()
        .filter(|f| {
            f.rank == view.host && f.function != own && !f.stack.starts_with(&format!("{own};"))
        })
        .map(|f| CpuDiff {
            group: f.group,
            rank: s.rank,
            scope: "host".into(),
            host: Some(view.host.clone()),
            function: f.function,
            stack: f.stack,
            straggler_share: f.share,
            peer_share: f.peer_share,
            threshold: f.threshold,
        })
        .collect()
}

/// The evidence of an interrupt signal in CPU stacks: the heaviest path
/// through the kernel function that does its work (`handler_functions`)
/// in `shares`, with its share; `None` when no sample went through one.
fn handler_path(signal: &str, shares: &Shares) -> Option<(String, f64)> {
    handler_functions(signal)
        .iter()
        .filter_map(|f| Some((shares.samples.get(*f).copied()?, shares.hottest.get(*f)?)))
        .max_by_key(|(n, _)| *n)
        .map(|(n, (path, _))| (path.join(";"), n as f64 / shares.total.max(1) as f64))
}

/// The late ranks' off-CPU paths above their groups' waterline of
/// blocked-time shares (`offcpu` profiles `in_window`, per group label, a
/// rank's periods together; the waterline's rules with δ = 5 pp).
fn offcpu_diff(
    late: &[Late],
    offcpu: &[&StackProfile],
    in_window: impl Fn(&StackProfile) -> bool,
) -> Vec<CpuDiff> {
    let mut by_group: BTreeMap<String, BTreeMap<String, Vec<&StackProfile>>> = BTreeMap::new();
    for p in offcpu.iter().copied().filter(|p| in_window(p)) {
        let (Some(g), Some(r)) = (
            p.labels.get("group").or_else(|| p.labels.get("job")),
            p.labels.get("rank"),
        ) else {
            continue;
        };
        by_group
            .entry(g.clone())
            .or_default()
            .entry(r.clone())
            .or_default()
            .push(p);
    }
    let late: Vec<String> = late.iter().map(|s| s.rank.to_string()).collect();
    let mut out = Vec::new();
    for (g, ranks) in by_group {
        let shares: BTreeMap<String, Shares> = ranks
            .into_iter()
            .map(|(r, ps)| (r, Shares::of(ps)))
            .collect();
        // Counts are µs, not independent samples: the z guard says little,
        // so the least excess is 5 pp of the blocked time, not 0.5.
        let cfg = Config {
            delta: 0.05,
            ..Config::default()
        };
        for f in waterline(&g, &shares, &cfg) {
            if late.contains(&f.rank) {
                out.extend(rank_row(f));
            }
        }
    }
    out
}

/// `samples` by network namespace, each named by its host (and the
/// namespace, where one host name holds several), with the ranks in it.
/// One naming for the TCP counters and the connections, so that a host
/// named for both is one host.
fn by_namespace<'a>(samples: &[&'a OsSample]) -> Vec<(String, Vec<u32>, Vec<&'a OsSample>)> {
    let mut by_ns: BTreeMap<(&str, Option<u64>), Vec<&OsSample>> = BTreeMap::new();
    for s in samples {
        by_ns.entry((s.host.as_str(), s.netns)).or_default().push(s);
    }
    let shared_names: BTreeSet<&str> = by_ns
        .keys()
        .zip(by_ns.keys().skip(1))
        .filter(|(a, b)| a.0 == b.0)
        .flat_map(|(a, b)| [a.0, b.0])
        .collect();
    by_ns
        .into_iter()
        .map(|((host, ns), v)| {
            let name = if host.is_empty() { "host ?" } else { host };
            let ranks: BTreeSet<u32> = v.iter().filter_map(|s| s.rank).collect();
            let named = match ns {
                Some(ns) if shared_names.contains(host) => format!("{name} net:[{ns}]"),
                _ => name.to_string(),
            };
            (named, ranks.into_iter().collect(), v)
        })
        .collect()
}

/// Each network namespace's TCP rates over `samples` ([`by_namespace`]).
/// Processes of one namespace read the same counters: their means agree,
/// and the mean over all of them is the namespace's.
fn host_tcp(samples: &[&OsSample]) -> Vec<HostTcp> {
    let has_tcp = |s: &&OsSample| {
        [
            TCP_OUT_SEGS,
            TCP_RETRANS_SEGS,
            TCP_IN_SEGS,
            TCP_OUT_OF_ORDER,
        ]
        .iter()
        .all(|k| s.signals.contains_key(*k))
    };
    by_namespace(samples)
        .into_iter()
        .filter_map(|(host, _, v)| {
            let v: Vec<&OsSample> = v.into_iter().filter(has_tcp).collect();
            if v.is_empty() {
                return None;
            }
            let m = mean_signals(v.iter().copied());
            let ranks: BTreeSet<u32> = v.iter().filter_map(|s| s.rank).collect();
            Some(HostTcp {
                host,
                ranks: ranks.into_iter().collect(),
                out_segs_per_s: m.get(TCP_OUT_SEGS).copied().unwrap_or(0.0),
                retrans_segs_per_s: m.get(TCP_RETRANS_SEGS).copied().unwrap_or(0.0),
                in_segs_per_s: m.get(TCP_IN_SEGS).copied().unwrap_or(0.0),
                out_of_order_per_s: m.get(TCP_OUT_OF_ORDER).copied().unwrap_or(0.0),
            })
        })
        .collect()
}

/// The network layer over the OS samples of a window (the agent's, or the
/// ones the ranks read in-process): hosts that lose TCP segments
/// ([`lossy_hosts`]) and hosts behind slow links ([`slow_hosts`]), a host
/// named once ([`merge_readings`]), those that stand out first. Called the
/// same way by `whyslow diagnose`, the server and the job pipeline.
pub fn judge_network(samples: &[&OsSample]) -> Vec<LossyHost> {
    let cfg = NetworkConfig::default();
    let loss = lossy_hosts(&host_tcp(samples), &cfg);
    let dropping = dropping_hosts(&loss, &cfg);
    let slow = slow_hosts_dropping(&host_connections(samples), &cfg, &dropping);
    let mut rows = merge_readings(loss, slow);
    // Those that stand out first; among them the likeliest link first: a
    // host that both resends and receives out of order (or is behind a slow
    // link) before one at the receiving end only, before one that only
    // resends (the peer sending into a lossy link resends too).
    rows.sort_by_key(|h| (!h.stands_out, link_rank(h)));
    rows
}

/// How directly a network row points at its own host's link (0: most).
pub fn link_rank(h: &LossyHost) -> u8 {
    match (h.cause.as_str(), h.side.as_str()) {
        ("slow", _) | (_, "both") => 0,
        (_, "receives") => 1,
        _ => 2,
    }
}

/// Each network namespace's connections over `samples` ([`by_namespace`]): per connection, its rates averaged over the periods of
/// the window (a period that did not see it counts as idle), its RTT the
/// mean and its lowest RTT the least.
fn host_connections(samples: &[&OsSample]) -> Vec<HostConnections> {
    let mut out = Vec::new();
    for (host, ranks, v) in by_namespace(samples) {
        // Periods per process: a connection's rates are averaged over its
        // own process's periods.
        let mut periods: BTreeMap<i32, usize> = BTreeMap::new();
        let mut conns: BTreeMap<(i32, &str, &str), Vec<&TcpConnection>> = BTreeMap::new();
        for s in v {
            *periods.entry(s.pid).or_default() += 1;
            for c in &s.connections {
                conns
                    .entry((s.pid, c.local.as_str(), c.remote.as_str()))
                    .or_default()
                    .push(c);
            }
        }
        if conns.is_empty() {
            continue;
        }
        let connections = conns
            .iter()
            .map(|((pid, local, remote), cs)| {
                let n = periods[pid].max(cs.len()) as f64;
                let mean =
                    |f: &dyn Fn(&TcpConnection) -> f64| cs.iter().map(|c| f(c)).sum::<f64>() / n;
                let opt_mean = |f: &dyn Fn(&TcpConnection) -> Option<f64>| {
                    cs.iter()
                        .any(|c| f(c).is_some())
                        .then(|| cs.iter().filter_map(|c| f(c)).sum::<f64>() / n)
                };
                TcpConnection {
                    local: local.to_string(),
                    remote: remote.to_string(),
                    sent_bytes_per_s: mean(&|c| c.sent_bytes_per_s),
                    received_bytes_per_s: mean(&|c| c.received_bytes_per_s),
                    busy_ms_per_s: opt_mean(&|c| c.busy_ms_per_s),
                    rwnd_limited_ms_per_s: opt_mean(&|c| c.rwnd_limited_ms_per_s),
                    sndbuf_limited_ms_per_s: opt_mean(&|c| c.sndbuf_limited_ms_per_s),
                    retrans_per_s: mean(&|c| c.retrans_per_s),
                    rtt_us: cs.iter().map(|c| c.rtt_us).sum::<f64>() / cs.len() as f64,
                    min_rtt_us: cs.iter().filter_map(|c| c.min_rtt_us).reduce(f64::min),
                    delivery_rate_bytes_per_s: cs
                        .iter()
                        .filter_map(|c| c.delivery_rate_bytes_per_s)
                        .reduce(f64::max),
                }
            })
            .collect();
        out.push(HostConnections {
            host,
            ranks,
            connections,
        });
    }
    out
}

/// The profiles whose `key` label is `me` against those of the first other
/// value (the peer), titled by `title` from the peer's value; `None` when
/// either side has none.
fn peer_pair(
    profiles: &[&StackProfile],
    key: &str,
    me: &str,
    title: impl Fn(&str) -> String,
) -> Option<FlamePair> {
    let value = |p: &StackProfile| p.labels.get(key).cloned();
    let mine: Vec<&StackProfile> = profiles
        .iter()
        .copied()
        .filter(|p| value(p).as_deref() == Some(me))
        .collect();
    let peer_value = profiles.iter().filter_map(|p| value(p)).find(|v| v != me)?;
    if mine.is_empty() {
        return None;
    }
    let peer = profiles
        .iter()
        .copied()
        .filter(|p| value(p).as_ref() == Some(&peer_value));
    Some(FlamePair {
        title: title(&peer_value),
        group: None,
        base: StackProfile::merged(peer),
        test: StackProfile::merged(mine),
    })
}

/// Runs the cross-layer diagnosis (SysOM-AI §3.1–§3.3) over `evidence`.
pub fn diagnose(
    evidence: &DiagnoseEvidence,
    cfg: &DiagnoseConfig,
) -> Result<Diagnosis, DiagnoseError> {
    let mut notes = evidence.notes.clone();
    // Node-wide (host/cgroup) profiles belong to no rank; off-CPU profiles
    // (counts are µs blocked) are judged apart from the CPU samples.
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
    if profiles.is_empty() && records.is_empty() && os_samples.is_empty() && hang.is_none() {
        return Err(DiagnoseError::NothingToDiagnose);
    }
    if profiles.is_empty() {
        notes.push("no rank profiles: the CPU layer is not judged".into());
    }
    // Time 0 is the earliest profile or OS reading (both on the Unix clock).
    let starts = profiles
        .iter()
        .map(|p| (p.start_unix_ns, p.duration_ns))
        .chain(os_samples.iter().map(|s| (s.start_unix_ns, s.duration_ns)));
    let t0 = starts.clone().map(|x| x.0).min().unwrap_or(0);
    let mut end = starts.map(|(a, d)| a.saturating_add(d)).max().unwrap_or(t0);
    if let Some(u) = cfg.until {
        let cut = t0.saturating_add((u.max(0.0) * 1e9) as u64);
        end = end.min(cut);
        let done = |p: &&StackProfile| p.start_unix_ns.saturating_add(p.duration_ns) <= cut;
        profiles.retain(done);
        offcpu_profiles.retain(done);
        host_profiles.retain(done);
        records.retain(|r| r.exit_ns <= cut);
        os_samples.retain(|o| o.start_unix_ns.saturating_add(o.duration_ns) <= cut);
    }
    let records: Vec<CollectiveRecord> = records.into_iter().cloned().collect();
    let span = (end - t0) as f64 / 1e9;
    // The default thirds are of the training: the span of the collective
    // records where they are on the same (Unix) clock as the profiles, so
    // that start-up (imports, rendezvous) is neither the healthy baseline
    // nor the judged window; else of all the data.
    let (s0, s1) = training_span(&records, t0, end).unwrap_or((0.0, span));
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
    // Each rank's training on the profiles' clock: from its first
    // collective entry to its last exit. A profile period reaching outside
    // it by more than a tenth holds start-up (imports, rendezvous) or
    // shutdown (the interpreter's final garbage collection: 18 % of a
    // window's samples in one CI run), which is no training to compare.
    let mut rank_spans: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    if training_span(&records, t0, end).is_some() {
        for r in &records {
            let s = rank_spans
                .entry(r.global_rank.unwrap_or(r.rank).to_string())
                .or_insert((r.entry_ns, r.exit_ns));
            s.0 = s.0.min(r.entry_ns);
            s.1 = s.1.max(r.exit_ns);
        }
    }
    let in_training = |p: &StackProfile| {
        let Some(&(first, last)) = p.labels.get("rank").and_then(|r| rank_spans.get(r)) else {
            return true;
        };
        let slack = p.duration_ns / 10;
        p.start_unix_ns.saturating_add(slack) >= first
            && p.start_unix_ns.saturating_add(p.duration_ns) <= last.saturating_add(slack)
    };
    let outside = profiles.iter().filter(|p| !in_training(p)).count();
    if outside > 0 {
        notes.push(format!(
            "{outside} rank profile period(s) reaching into start-up or shutdown (before the rank's \
             first collective or after its last) are left out"
        ));
    }
    // A profile belongs to a range when most of its period lies in it.
    let within = |p: &StackProfile, r: (f64, f64)| {
        if !in_training(p) {
            return false;
        }
        let a = p.start_unix_ns.saturating_sub(t0) as f64 / 1e9;
        let b = a + p.duration_ns as f64 / 1e9;
        let inside = (b.min(r.1) - a.max(r.0)).max(0.0);
        inside > 0.5 * (b - a) || (b - a <= 0.0 && (r.0..=r.1).contains(&a))
    };
    // Groups: the communication group label when the agent has it, else the job.
    let mut groups: BTreeMap<String, Vec<&StackProfile>> = BTreeMap::new();
    for p in &profiles {
        let g = p
            .labels
            .get("group")
            .or_else(|| p.labels.get("job"))
            .cloned()
            .unwrap_or_else(|| "unknown-job".into());
        groups.entry(g).or_default().push(p);
    }
    let wcfg = Config::default();
    let (mut flags, mut regs, mut summaries) = (Vec::new(), Vec::new(), Vec::new());
    for (g, ps) in &groups {
        let before: Vec<&StackProfile> =
            ps.iter().copied().filter(|p| within(p, baseline)).collect();
        let after: Vec<&StackProfile> = ps.iter().copied().filter(|p| within(p, window)).collect();
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
    // The temporal baseline answers "what changed since the job was
    // healthy" when the job slowed (SysOM-AI §3.1). Where collective records
    // on the profiles' clock tell the time per collective, a job whose
    // collectives came no slower in the window than in the baseline has no
    // slowdown to explain: a share that rose since (warm-up in the baseline,
    // a phase change) is not a regression then.
    let secs_to_ns = |s: f64| t0.saturating_add((s * 1e9) as u64);
    let periods = |r: (f64, f64)| instance_periods(&records, secs_to_ns(r.0), secs_to_ns(r.1), 5);
    let (pb, pw) = (periods(baseline), periods(window));
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
    let scfg = StragglerConfig::default();
    let found = if records.is_empty() {
        notes.push("no collective records (*.collectives.jsonl): slow ranks are not judged".into());
        Vec::new()
    } else {
        slow_ranks(&records, &scfg)
    };
    // A group rank's world rank (what profiles and OS readings carry).
    let world = |group: &str, rank: u32| -> u32 {
        records
            .iter()
            .find(|r| r.group == group && r.rank == rank)
            .and_then(|r| r.global_rank)
            .unwrap_or(rank)
    };
    // The world ranks of a group's other members than `rank`.
    let peers_of = |group: &str, rank: u32| -> Vec<u32> {
        records
            .iter()
            .filter(|r| r.group == group && r.rank != rank)
            .map(|r| r.global_rank.unwrap_or(r.rank))
            .collect::<BTreeSet<u32>>()
            .into_iter()
            .collect()
    };
    let late: Vec<Late> = found
        .iter()
        .map(|s| Late {
            rank: world(&s.group, s.rank),
            group: s.group.clone(),
        })
        .collect();
    let stragglers: Vec<StragglerRow> = found
        .iter()
        .zip(&late)
        .map(|(s, l)| StragglerRow {
            rank: l.rank,
            group: s.group.clone(),
            late_us: s.late_us - s.peers_late_us,
            t: s.t,
        })
        .collect();
    let in_window = |p: &StackProfile| within(p, window);
    let host_views: Vec<Option<HostView>> = late
        .iter()
        .map(|s| host_view(s, &profiles, &host_profiles, &records, &in_window))
        .collect();
    // The OS layer: each late rank's signals over the window against the
    // other ranks of its group.
    let os_window: Vec<&OsSample> = os_samples
        .iter()
        .copied()
        .filter(|s| {
            let mid =
                (s.start_unix_ns.saturating_sub(t0) as f64 + s.duration_ns as f64 / 2.0) / 1e9;
            (window.0..=window.1).contains(&mid)
        })
        .collect();
    let mut by_rank: BTreeMap<u32, Vec<&OsSample>> = BTreeMap::new();
    for s in &os_window {
        if let Some(r) = s.rank {
            by_rank.entry(r).or_default().push(s);
        }
    }
    let means: BTreeMap<u32, BTreeMap<String, f64>> = by_rank
        .iter()
        .map(|(r, v)| (*r, mean_signals(v.iter().copied())))
        .collect();
    let mut os_rows = Vec::new();
    let mut cpu_ms: Option<(f64, f64)> = None;
    for (s, (l, view)) in found.iter().zip(late.iter().zip(&host_views)) {
        let me = l.rank;
        let Some(mine) = means.get(&me) else {
            notes.push(format!(
                "group {} rank {me}: no OS signals in the window (*.os.jsonl): the OS layer is not judged",
                s.group
            ));
            continue;
        };
        let peers: Vec<BTreeMap<String, f64>> = peers_of(&s.group, s.rank)
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
                .filter(|p| p.labels.get("rank") == Some(&me_label) && within(p, window)),
        );
        for diff in os_diff(mine, &peers, &OsConfig::default()) {
            let on_host = view
                .as_ref()
                .and_then(|v| handler_path(&diff.signal, &v.shares[&v.host]))
                .map(|p| (p, "host"));
            let path = on_host.or_else(|| handler_path(&diff.signal, &own).map(|p| (p, "rank")));
            os_rows.push(OsDiffRow {
                group: s.group.clone(),
                rank: me,
                handler_stack: path.as_ref().map(|((st, _), _)| st.clone()),
                handler_share: path.as_ref().map(|((_, sh), _)| *sh),
                handler_scope: path.as_ref().map(|(_, scope)| scope.to_string()),
                diff,
            });
        }
    }
    let tcp_hosts = host_tcp(&os_window);
    let conn_hosts = host_connections(&os_window);
    let network_rows = judge_network(&os_window);
    if !os_samples.is_empty() && conn_hosts.is_empty() {
        notes.push(
            "no per-connection TCP state in the window's OS signals (an agent before it read \
             them, or no socket diagnostics in the ranks' namespaces): slow links without loss \
             are not judged"
                .into(),
        );
    }
    if !os_samples.is_empty() && tcp_hosts.is_empty() {
        notes.push(
            "no TCP counters in the window's OS signals (an agent before they were read, or no \
             /proc/PID/net/snmp): the network layer is not judged"
                .into(),
        );
    }
    if network_rows.len() > 1 {
        notes.push(
            "several hosts lose TCP segments: loss between two hosts shows on both (the sender \
             resends, the receiver gets segments out of order), whichever end's link drops it; \
             a host that does both, or that every peer of it names, is the likeliest link"
                .into(),
        );
    }
    if os_samples.is_empty() {
        notes.push("no OS signals (*.os.jsonl; the agent writes them with --profile-spool): the OS layer is not judged".into());
    }
    // The GPU layer: each late rank's kernel times against its group's.
    let kernels = evidence
        .fingerprints
        .as_deref()
        .map(kernel_times)
        .unwrap_or_default();
    let mut gpu_rows = Vec::new();
    if kernels.is_empty() {
        notes.push(if evidence.fingerprints.is_none() {
            "no GPU kernel times (--fingerprints: fingerprints or profiler traces per rank): the GPU layer is not judged".into()
        } else {
            "no GPU kernels in the --fingerprints files: the GPU layer is not judged".into()
        });
    } else {
        for (s, l) in found.iter().zip(&late) {
            let me = l.rank;
            let peers: Vec<Vec<KernelTime>> = peers_of(&s.group, s.rank)
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
                gpu_rows.push(GpuDiff {
                    group: s.group.clone(),
                    rank: me,
                    peers: peers.len(),
                    finding,
                });
            }
        }
    }
    let host_rows: Vec<CpuDiff> = late
        .iter()
        .zip(&host_views)
        .filter_map(|(s, v)| Some(host_diff(s, v.as_ref()?)))
        .flatten()
        .collect();
    if host_profiles.is_empty() && !late.is_empty() {
        notes.push(
            "no host profiles (the agent's --profile-host or --profile-cgroup): \
             other processes on a late rank's host are not judged"
                .into(),
        );
    }
    let late_labels: Vec<String> = late.iter().map(|s| s.rank.to_string()).collect();
    let straggler_cpu: Vec<WaterlineFlag> = flags
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
    let os_for_verdict: Vec<_> = os_rows.iter().map(|d| d.diff.clone()).collect();
    let network = if network_rows.is_empty() {
        NetworkEvidence::Quiet
    } else if network_rows
        .iter()
        .any(|h| h.ranks.iter().any(|r| late.iter().any(|s| s.rank == *r)))
    {
        NetworkEvidence::OnLateHost
    } else {
        NetworkEvidence::Elsewhere
    };
    let mut layer = verdict(
        !late.is_empty(),
        !gpu_rows.is_empty(),
        &straggler_cpu,
        &os_for_verdict,
        cpu_ms,
        // With collective records and nobody late, a rank above the
        // waterline holds nobody up: only a regression is a cause then.
        !regs.is_empty() || (records.is_empty() && !flags.is_empty()),
        network,
    );
    // Off the CPU: a late rank that blocks where its peers do not (a slow
    // read, a lock), each group's blocked-time shares over the window.
    let offcpu_rows = offcpu_diff(&late, &offcpu_profiles, in_window);
    if !offcpu_rows.is_empty() && layer == Layer::None {
        // Waiting in the kernel for I/O or a lock is the OS layer's to own.
        layer = Layer::Os;
    }
    if offcpu_profiles.is_empty() && !late.is_empty() {
        notes.push(
            "no off-CPU profiles (the agent's --profile-offcpu): time a late rank spent blocked is not judged"
                .into(),
        );
    }
    if let (Some(on), true) = (onset, late.is_empty() && layer == Layer::None) {
        notes.push(format!(
            "the collectives came slower from {on:.1} s, and no layer judged here shows a cause: \
             no rank is late, no CPU path rose, no OS signal differs and no host loses segments \
             or sits behind a slow link (look at what was not judged: the GPU, or the network \
             beyond the hosts' own connections)"
        ));
    }
    if !late.is_empty() && layer == Layer::None {
        notes.push(
            "a rank is late but neither its CPU profile nor its OS signals differ from its peers': \
             the cause is in a layer not seen here (the network, the GPU where its kernel times \
             were not given, or before the window)"
                .into(),
        );
    }
    let all_lateness = lateness(&records, &scfg);
    let report = DiagnoseReport {
        stragglers,
        layer: layer.as_str().to_string(),
        cpu_diff: host_rows
            .into_iter()
            .chain(flags.into_iter().filter_map(rank_row))
            .collect(),
        offcpu_diff: offcpu_rows,
        os_diff: os_rows,
        network_diff: network_rows,
        gpu_diff: gpu_rows,
        regressions: regs,
        origin_unix_ns: t0,
        baseline,
        window,
        profiles: profiles.len(),
        os_samples: os_samples.len(),
        collective_groups: all_lateness
            .iter()
            .map(|g| {
                let n = g.instances.len().max(1) as f64;
                let span = g.instances.last().map(|x| x.0).unwrap_or(0.0)
                    - g.instances.first().map(|x| x.0).unwrap_or(0.0);
                CollectiveGroup {
                    group: g.group.clone(),
                    instances: g.instances.len(),
                    period_us: span / 1e3 / (n - 1.0).max(1.0),
                    mean_late_us: g
                        .ranks
                        .iter()
                        .enumerate()
                        .map(|(k, &r)| {
                            let mean = g.instances.iter().map(|x| x.1[k]).sum::<f64>() / n;
                            (world(&g.group, r), mean)
                        })
                        .collect(),
                }
            })
            .collect(),
        groups: summaries,
        notes,
        hang,
    };

    // What the pictures are drawn from.
    let late_groups = all_lateness
        .into_iter()
        .filter(|g| found.iter().any(|s| s.group == g.group))
        .map(|g| LateGroup {
            flagged: found
                .iter()
                .filter(|s| s.group == g.group)
                .map(|s| s.rank)
                .collect(),
            lateness: g,
        })
        .collect();
    let group_diffs: Vec<FlamePair> = groups
        .iter()
        .map(|(g, ps)| {
            let merge =
                |r: (f64, f64)| StackProfile::merged(ps.iter().copied().filter(|p| within(p, r)));
            FlamePair {
                title: format!(
                    "group {g}: {:.0}..{:.0} s against the baseline {:.0}..{:.0} s",
                    window.0, window.1, baseline.0, baseline.1
                ),
                group: Some(g.clone()),
                base: merge(baseline),
                test: merge(window),
            }
        })
        .collect();
    let mut flames = Vec::new();
    let window_rank: Vec<&StackProfile> =
        profiles.iter().copied().filter(|p| in_window(p)).collect();
    let window_blocked: Vec<&StackProfile> = offcpu_profiles
        .iter()
        .copied()
        .filter(|p| in_window(p))
        .collect();
    for (s, view) in late.iter().zip(&host_views).take(4) {
        let me = s.rank.to_string();
        flames.extend(peer_pair(&window_rank, "rank", &me, |peer| {
            format!("late rank {me} against rank {peer}")
        }));
        flames.extend(peer_pair(&window_blocked, "rank", &me, |peer| {
            format!("late rank {me} against rank {peer}: time blocked off the CPU")
        }));
        if let Some(view) = view {
            let hosts: Vec<&StackProfile> = host_profiles
                .iter()
                .copied()
                .filter(|p| {
                    in_window(p)
                        && p.labels
                            .get("host")
                            .is_some_and(|h| view.shares.contains_key(h))
                })
                .collect();
            flames.extend(peer_pair(&hosts, "host", &view.host, |peer| {
                format!(
                    "late rank {me}'s host {} against host {peer}: all their processes",
                    view.host
                )
            }));
        }
    }
    flames.extend(
        group_diffs
            .iter()
            .filter(|d| d.base.total() > 0 && d.test.total() > 0)
            .take(4)
            .cloned(),
    );
    Ok(Diagnosis {
        report,
        late_groups,
        flames,
        group_diffs,
    })
}
