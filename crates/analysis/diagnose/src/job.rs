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
use whyslow_model::diagnosis::{CpuDiff, DiagnoseReport};
use whyslow_model::os::{
    OsSample, TcpConnection, TCP_IN_SEGS, TCP_OUT_OF_ORDER, TCP_OUT_SEGS, TCP_RETRANS_SEGS,
};
use whyslow_model::stack::StackProfile;
use whyslow_model::FunctionKind;

use crate::gpu::KernelTime;
use crate::layer::{handler_functions, mean_signals};
use crate::network::{
    dropping_hosts, lossy_hosts, merge_readings, slow_hosts_dropping, HostConnections, HostTcp,
    LossyHost, NetworkConfig,
};
use crate::stragglers::GroupLateness;
use crate::{waterline, Config, Shares, WaterlineFlag};

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

impl DiagnoseConfig {
    /// Refuses periods that are not `0 <= A < B` (finite) and a negative or
    /// non-finite `until`, whichever door built the config (the command
    /// line and the server parse theirs with [`parse_range`]; the Python
    /// package passes numbers).
    pub fn validate(&self) -> Result<(), DiagnoseError> {
        for (what, r) in [("baseline", self.baseline), ("window", self.window)] {
            if let Some((a, b)) = r {
                if !(a.is_finite() && b.is_finite() && a >= 0.0 && a < b) {
                    return Err(DiagnoseError::BadRange {
                        what,
                        given: format!("{a}..{b}"),
                        why: "needs 0 <= A < B".into(),
                    });
                }
            }
        }
        if let Some(u) = self.until {
            if !(u.is_finite() && u >= 0.0) {
                return Err(DiagnoseError::BadRange {
                    what: "until",
                    given: u.to_string(),
                    why: "needs a number of seconds >= 0".into(),
                });
            }
        }
        Ok(())
    }
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
    /// empty.
    pub group_diffs: Vec<FlamePair>,
    /// The job's window against its baseline for each kind of profile it
    /// has (see [`Diagnosis::what_changed`]).
    pub job_diffs: Vec<(ProfileKind, FlamePair)>,
}

/// Which profiles a window-against-baseline picture compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    /// The ranks' on-CPU profiles.
    Cpu,
    /// The ranks' off-CPU (blocked-time) profiles.
    OffCpu,
    /// Node-wide profiles: every process of the host.
    Host,
}

impl ProfileKind {
    /// Every kind, in the order pages show them.
    pub const ALL: [ProfileKind; 3] = [ProfileKind::Cpu, ProfileKind::OffCpu, ProfileKind::Host];

    /// The name the command line, the API and the stores use.
    pub fn name(self) -> &'static str {
        match self {
            ProfileKind::Cpu => "cpu",
            ProfileKind::OffCpu => "offcpu",
            ProfileKind::Host => "host",
        }
    }

    /// The kind named `name` (`cpu`, `offcpu`, `host`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

impl Diagnosis {
    /// What changed since the job ran well: the job's judged window against
    /// its temporal baseline (SysOM-AI §3.1, Fig. 7), for profiles of
    /// `kind`, over the same periods the verdict compared. For CPU
    /// profiles, the group whose functions rose (the verdict's), else the
    /// job's one group, else all its ranks. The one answer to "what
    /// changed" of every door: `whyslow diagnose --diff-svg` and the
    /// server's `diff.svg`. `None` when the job has no profile of `kind`.
    pub fn what_changed(&self, kind: ProfileKind) -> Option<&FlamePair> {
        self.job_diffs
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, pair)| pair)
    }
}

/// A late rank as the steps below see it.
pub(crate) struct Late {
    pub(crate) rank: u32,
    pub(crate) group: String,
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
pub(crate) fn kernel_times(fps: &[whyslow_model::Fingerprint]) -> BTreeMap<u32, Vec<KernelTime>> {
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
pub(crate) fn training_span(records: &[CollectiveRecord], t0: u64, end: u64) -> Option<(f64, f64)> {
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
pub(crate) fn slowdown_onset(records: &[CollectiveRecord], t0: u64) -> Option<f64> {
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
pub(crate) struct HostView {
    /// The late rank's host.
    pub(crate) host: String,
    /// Host → its shares, for the hosts of the rank's group with samples.
    pub(crate) shares: BTreeMap<String, Shares>,
}

/// The [`HostView`] of a late rank, from the host profiles (`scope` label)
/// `in_window`; `None` without a host profile of its host.
pub(crate) fn host_view(
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
pub(crate) fn rank_row(f: WaterlineFlag) -> Option<CpuDiff> {
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
pub(crate) fn host_diff(s: &Late, view: &HostView) -> Vec<CpuDiff> {
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
pub(crate) fn handler_path(signal: &str, shares: &Shares) -> Option<(String, f64)> {
    handler_functions(signal)
        .iter()
        .filter_map(|f| Some((shares.samples.get(*f).copied()?, shares.hottest.get(*f)?)))
        .max_by_key(|(n, _)| *n)
        .map(|(n, (path, _))| (path.join(";"), n as f64 / shares.total.max(1) as f64))
}

/// The late ranks' off-CPU paths above their groups' waterline of
/// blocked-time shares (`offcpu` profiles `in_window`, per group label, a
/// rank's periods together; the waterline's rules with δ = 5 pp).
pub(crate) fn offcpu_diff(
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
pub(crate) fn host_tcp(samples: &[&OsSample]) -> Vec<HostTcp> {
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
pub(crate) fn host_connections(samples: &[&OsSample]) -> Vec<HostConnections> {
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
pub(crate) fn peer_pair(
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

// The diagnosis itself runs as named stages (crate::stages); re-exported
// here, where its configuration, errors and helpers are.
pub use crate::stages::diagnose;
