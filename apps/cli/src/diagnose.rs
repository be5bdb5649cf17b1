//! `whyslow diagnose DIR`: the cross-layer diagnosis of SysOM-AI §3.1 over
//! what the node agents wrote: profile spools (`*.pb.gz`) give the per-group
//! CPU waterline over the window and the temporal baseline of the window
//! against a healthy period; collective records (`*.collectives.jsonl`, one
//! `whyslow_model::collective::CollectiveRecord` per line) give the slow
//! ranks (`whyslow agent --trace-collectives` writes them); OS signals
//! (`*.os.jsonl`, `whyslow_model::os::OsSample`) give the OS layer of a late
//! rank against its peers, and the TCP retransmissions of each host (the
//! network layer); GPU kernel times per rank (`--fingerprints`:
//! fingerprints or PyTorch profiler traces) give the GPU layer: a late
//! rank's kernels uniformly slower (hardware) or specific kernels slower
//! (software). A layer without its data is not judged, and the report says
//! so instead of claiming nothing there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use whyslow_diagnose::gpu::{gpu_diff, GpuConfig, GpuFinding, GpuPattern, KernelTime};
use whyslow_diagnose::layer::{
    handler_functions, mean_signals, os_diff, verdict, NetworkEvidence, OsConfig,
};
use whyslow_diagnose::network::{lossy_hosts, HostTcp, LossyHost, NetworkConfig};
use whyslow_diagnose::stragglers::{instance_periods, lateness, slow_ranks, StragglerConfig};
use whyslow_diagnose::{regressions, waterline, Config, Regression, Shares, WaterlineFlag};
use whyslow_model::collective::CollectiveRecord;
use whyslow_model::os::{
    OsSample, CPU_TIME, TCP_IN_SEGS, TCP_OUT_OF_ORDER, TCP_OUT_SEGS, TCP_RETRANS_SEGS,
};
use whyslow_model::stack::StackProfile;
use whyslow_model::FunctionKind;

/// `whyslow diagnose`.
#[derive(Args, Debug)]
pub struct DiagnoseArgs {
    /// What the agents wrote: profile spools (`*.pb.gz`, searched recursively),
    /// one directory per host or all in one.
    dir: PathBuf,
    /// The healthy period, seconds since the earliest profile in DIR: `A..B`.
    /// Default: the training (the span of the collective records) before
    /// its collectives came slower, when they did well inside it; else its
    /// first third, or that of all the data without collective records.
    #[arg(long)]
    baseline: Option<String>,
    /// The period to judge, `A..B` seconds since the earliest profile.
    /// Default: the training from the slowdown's onset on (see --baseline);
    /// else its last third, or that of all the data.
    #[arg(long)]
    window: Option<String>,
    /// Judge only what the agents had written by UNTIL seconds since the
    /// earliest profile or OS reading (profiles and readings whose period
    /// ended by then, collectives that had returned): the verdict as it
    /// stood at that moment (for replaying how soon a fault was named).
    #[arg(long, value_name = "SECONDS")]
    until: Option<f64>,
    /// GPU kernel times per rank, for the GPU layer: fingerprints (what
    /// `whyslow summarize` writes; the online package's `fingerprints/`
    /// folder) or PyTorch profiler traces, files or folders. A
    /// fingerprint's worker is its world rank.
    #[arg(long, value_name = "PATH", num_args = 1..)]
    fingerprints: Vec<PathBuf>,
    /// Output on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Write the output (in `--format`) to FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    output: Option<PathBuf>,
    /// Also write the differential flame graph of the window against the
    /// baseline (SVG) of the first group with a regression, else of the
    /// first group.
    #[arg(long)]
    diff_svg: Option<PathBuf>,
    /// Also write an HTML page: the verdict, the per-rank entry-time plot of
    /// each group with a late rank (SysOM-AI Fig. 5) and the differential
    /// flame graphs (a late rank against a peer; the window against the
    /// baseline).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
}

/// Output format of `whyslow diagnose`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A report for the terminal.
    Table,
    /// The JSON contract.
    Json,
}

/// A CPU path above its group's waterline (`cpu_diff` in the JSON): the
/// rank's own (`scope` `rank`), or another process's on a late rank's host
/// against its peers' hosts (`scope` `host`, shares of the host's samples).
#[derive(Debug, Serialize)]
struct CpuDiff {
    group: String,
    rank: String,
    /// `rank` (the rank's profile) or `host` (its host's profile).
    scope: &'static str,
    /// The rank's host, for `scope` `host`.
    #[serde(skip_serializing_if = "Option::is_none")]
    host: Option<String>,
    function: String,
    stack: String,
    straggler_share: f64,
    peer_share: f64,
    threshold: f64,
}

impl From<WaterlineFlag> for CpuDiff {
    fn from(f: WaterlineFlag) -> Self {
        CpuDiff {
            group: f.group,
            rank: f.rank,
            scope: "rank",
            host: None,
            function: f.function,
            stack: f.stack,
            straggler_share: f.share,
            peer_share: f.peer_share,
            threshold: f.threshold,
        }
    }
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

/// A late rank's GPU kernels slower than its peers' (`gpu_diff` in the JSON).
#[derive(Debug, Serialize)]
struct GpuDiff {
    group: String,
    rank: String,
    /// Peers compared with (those with kernel times).
    peers: usize,
    #[serde(flatten)]
    finding: GpuFinding,
}

/// Each world rank's GPU kernel times from fingerprints or traces under
/// `paths` (several files of one rank add up); unreadable files are skipped
/// with a note.
fn gpu_kernel_times(
    paths: &[PathBuf],
    notes: &mut Vec<String>,
) -> Result<BTreeMap<u32, Vec<KernelTime>>> {
    use whyslow_ingest::InputFile;
    let mut out: BTreeMap<u32, Vec<KernelTime>> = BTreeMap::new();
    if paths.is_empty() {
        return Ok(out);
    }
    for file in whyslow_ingest::discover(paths)? {
        let fp = match &file {
            InputFile::Fingerprint(p) => {
                whyslow_ingest::read_fingerprint(p).map_err(|e| e.to_string())
            }
            InputFile::Kineto(p) => whyslow_ingest::read_worker_trace(p)
                .map(|t| {
                    whyslow_summarize::summarize(
                        &t,
                        &Default::default(),
                        &whyslow_summarize::SummarizeOptions::default(),
                    )
                })
                .map_err(|e| e.to_string()),
            _ => continue,
        };
        let fp = match fp {
            Ok(fp) => fp,
            Err(e) => {
                notes.push(format!("skipped {}: {e}", file.path().display()));
                continue;
            }
        };
        out.entry(fp.worker).or_default().extend(
            fp.functions
                .iter()
                .filter(|f| f.kind == FunctionKind::GpuKernel)
                .map(|f| KernelTime {
                    name: f.name.clone(),
                    calls: f.calls,
                    total_us: f.total_us,
                }),
        );
    }
    out.retain(|_, v| !v.is_empty());
    Ok(out)
}

#[derive(Debug, Serialize)]
struct Straggler {
    rank: String,
    group: String,
    late_us: f64,
    /// The paired t statistic of its lateness over its peers'.
    t: f64,
}

/// A late rank's OS signal above its peers' (`os_diff` in the JSON).
#[derive(Debug, Serialize)]
struct OsDiff {
    group: String,
    rank: String,
    #[serde(flatten)]
    diff: whyslow_diagnose::layer::OsDiff,
    /// For an interrupt or softirq signal, the heaviest CPU path through
    /// its kernel handler (`net_rx_action` for NET_RX …): on the rank's
    /// host (all its processes) where the agent profiled it, else in the
    /// rank's own profile.
    #[serde(skip_serializing_if = "Option::is_none")]
    handler_stack: Option<String>,
    /// That path's share of the samples it was found in.
    #[serde(skip_serializing_if = "Option::is_none")]
    handler_share: Option<f64>,
    /// `host` or `rank`: which profile the path is from.
    #[serde(skip_serializing_if = "Option::is_none")]
    handler_scope: Option<&'static str>,
}

#[derive(Debug, Serialize)]
struct Report {
    /// Ranks late into their collectives (needs collective records).
    stragglers: Vec<Straggler>,
    /// `gpu|cpu|os|network|none`.
    layer: &'static str,
    cpu_diff: Vec<CpuDiff>,
    /// A late rank's blocked time (off the CPU: reads, locks, sleeps) by
    /// path, above its group's waterline of blocked-time shares; needs the
    /// agent's --profile-offcpu.
    offcpu_diff: Vec<CpuDiff>,
    os_diff: Vec<OsDiff>,
    /// Hosts (network namespaces) that resend TCP segments or receive them
    /// out of order over the floors, the largest share first (the network
    /// layer).
    network_diff: Vec<LossyHost>,
    /// A late rank's GPU kernels against its peers' (needs --fingerprints).
    gpu_diff: Vec<GpuDiff>,
    regressions: Vec<Regression>,
    /// Seconds since the earliest profile.
    /// Time 0 of `baseline`, `window` (and `--until`): the earliest profile
    /// or OS reading, Unix ns.
    origin_unix_ns: u64,
    baseline: (f64, f64),
    window: (f64, f64),
    profiles: usize,
    /// OS signal readings read (`*.os.jsonl` lines).
    os_samples: usize,
    /// Per communication group with collective records: each rank's mean
    /// lateness into the window's collectives.
    collective_groups: Vec<CollectiveGroup>,
    groups: Vec<GroupSummary>,
    notes: Vec<String>,
}

#[derive(Debug, Serialize)]
struct CollectiveGroup {
    group: String,
    /// Complete instances judged (the last W).
    instances: usize,
    /// Mean time between two instances, µs.
    period_us: f64,
    /// World rank → mean lateness behind the group's first rank, µs.
    mean_late_us: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize)]
struct GroupSummary {
    group: String,
    ranks: usize,
    baseline_samples: u64,
    window_samples: u64,
    /// Each rank's samples in the window (the waterline judges ranks with
    /// at least `min_samples`).
    window_samples_by_rank: BTreeMap<String, u64>,
}

fn parse_range(s: &str, what: &str) -> Result<(f64, f64)> {
    let (a, b) = s
        .split_once("..")
        .with_context(|| format!("--{what} {s:?}: expected A..B (seconds)"))?;
    let a: f64 = a
        .trim()
        .parse()
        .with_context(|| format!("--{what} {s:?}: {a:?} is not a number of seconds"))?;
    let b: f64 = b
        .trim()
        .parse()
        .with_context(|| format!("--{what} {s:?}: {b:?} is not a number of seconds"))?;
    if !(a.is_finite() && b.is_finite() && a < b && a >= 0.0) {
        bail!("--{what} {s:?}: needs 0 <= A < B");
    }
    Ok((a, b))
}

fn spool_files(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) -> Result<()> {
    let rd = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            spool_files(&p, suffix, out)?;
        } else if p.to_string_lossy().ends_with(suffix) {
            out.push(p);
        }
    }
    Ok(())
}

/// The records of every `*SUFFIX` file under `dir`, one JSON value per
/// line; lines that do not parse are skipped and counted in a note.
fn jsonl_records<T: serde::de::DeserializeOwned>(
    dir: &Path,
    suffix: &str,
    notes: &mut Vec<String>,
) -> Result<Vec<T>> {
    let mut files = Vec::new();
    spool_files(dir, suffix, &mut files)?;
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text =
            std::fs::read_to_string(&f).with_context(|| format!("reading {}", f.display()))?;
        let mut bad = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<T>(line) {
                Ok(r) => out.push(r),
                Err(e) => bad.push(format!("line {}: {e}", n + 1)),
            }
        }
        if !bad.is_empty() {
            notes.push(format!(
                "{}: {} line(s) skipped ({})",
                f.display(),
                bad.len(),
                bad.into_iter().take(3).collect::<Vec<_>>().join("; ")
            ));
        }
    }
    Ok(out)
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
    s: &Straggler,
    rank_profiles: &[StackProfile],
    host_profiles: &[StackProfile],
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
    let mine = host_of.get(&s.rank)?.clone();
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
                .filter(|p| p.labels.get("host") == Some(h) && in_window(p));
            (h.clone(), Shares::of_processes(ps, &name))
        })
        .filter(|(_, sh)| sh.total > 0)
        .collect();
    shares
        .contains_key(&mine)
        .then_some(HostView { host: mine, shares })
}

/// The late rank's host against its group's other hosts (the waterline,
/// hosts as its members; at least 3 hosts). Paths in the late rank's own
/// process are left to its rank profile; the rest (a neighbour, the
/// kernel's work for it) are the rows, `scope` `host`.
fn host_diff(s: &Straggler, view: &HostView) -> Vec<CpuDiff> {
    let own = format!("rank {}{PROCESS_SUFFIX}", s.rank);
    waterline(&s.group, &view.shares, &Config::default())
        .into_iter()
        .filter(|f| {
            f.rank == view.host && f.function != own && !f.stack.starts_with(&format!("{own};"))
        })
        .map(|f| CpuDiff {
            group: f.group,
            rank: s.rank.clone(),
            scope: "host",
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
    stragglers: &[Straggler],
    offcpu: &[StackProfile],
    in_window: impl Fn(&StackProfile) -> bool,
) -> Vec<CpuDiff> {
    let mut by_group: BTreeMap<String, BTreeMap<String, Vec<&StackProfile>>> = BTreeMap::new();
    for p in offcpu.iter().filter(|p| in_window(p)) {
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
    let late: Vec<&str> = stragglers.iter().map(|s| s.rank.as_str()).collect();
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
            if late.contains(&f.rank.as_str()) {
                out.push(CpuDiff::from(f));
            }
        }
    }
    out
}

/// Runs `whyslow diagnose`.
pub fn run(args: DiagnoseArgs) -> Result<u8> {
    let mut files = Vec::new();
    spool_files(&args.dir, ".pb.gz", &mut files)?;
    files.sort();
    let mut notes = Vec::new();
    let mut profiles: Vec<StackProfile> = Vec::new();
    for f in &files {
        let bytes = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
        match whyslow_stack_output::from_pprof(&bytes) {
            Ok(p) => profiles.push(p),
            Err(e) => eprintln!(
                "whyslow: skipped {}: not a readable profile: {e}",
                f.display()
            ),
        }
    }
    // Node-wide (host/cgroup) profiles belong to no rank.
    let (host_profiles, mut profiles): (Vec<StackProfile>, Vec<StackProfile>) = profiles
        .into_iter()
        .partition(|p| p.labels.contains_key("scope"));
    profiles.retain(|p| p.labels.contains_key("rank"));
    // Off-CPU profiles (the agent's --profile-offcpu; counts are µs blocked)
    // are judged apart from the CPU samples.
    let (offcpu_profiles, profiles): (Vec<StackProfile>, Vec<StackProfile>) = profiles
        .into_iter()
        .partition(|p| p.labels.get("kind").map(String::as_str) == Some("offcpu"));
    let records: Vec<CollectiveRecord> =
        jsonl_records(&args.dir, ".collectives.jsonl", &mut notes)?;
    let os_samples: Vec<OsSample> = jsonl_records(&args.dir, ".os.jsonl", &mut notes)?;
    if profiles.is_empty() && records.is_empty() && os_samples.is_empty() {
        bail!(
            "{}: no rank profile (*.pb.gz, {} file(s) read; the agent writes them with --profile-spool), \
             no collective records (*.collectives.jsonl) and no OS signals (*.os.jsonl): nothing to diagnose",
            args.dir.display(),
            files.len()
        );
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
    let (profiles, offcpu_profiles, host_profiles, records, os_samples) = match args.until {
        None => (
            profiles,
            offcpu_profiles,
            host_profiles,
            records,
            os_samples,
        ),
        Some(u) => {
            let cut = t0.saturating_add((u.max(0.0) * 1e9) as u64);
            end = end.min(cut);
            let done = |p: &StackProfile| p.start_unix_ns.saturating_add(p.duration_ns) <= cut;
            let keep = |v: Vec<StackProfile>| v.into_iter().filter(done).collect::<Vec<_>>();
            (
                keep(profiles),
                keep(offcpu_profiles),
                keep(host_profiles),
                records
                    .into_iter()
                    .filter(|r| r.exit_ns <= cut)
                    .collect::<Vec<_>>(),
                os_samples
                    .into_iter()
                    .filter(|o| o.start_unix_ns.saturating_add(o.duration_ns) <= cut)
                    .collect::<Vec<_>>(),
            )
        }
    };
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
    let onset = (args.baseline.is_none() && args.window.is_none())
        .then(|| slowdown_onset(&records, t0))
        .flatten()
        .filter(|&on| on - s0 >= 0.15 * (s1 - s0) && s1 - on >= 0.15 * (s1 - s0));
    if let Some(on) = onset {
        notes.push(format!(
            "the collectives came slower from {on:.1} s: the baseline is the training before it, the window after it"
        ));
    }
    let baseline = match (&args.baseline, onset) {
        (Some(s), _) => parse_range(s, "baseline")?,
        (None, Some(on)) => (s0, on),
        (None, None) => (s0, s0 + third),
    };
    let window = match (&args.window, onset) {
        (Some(s), _) => parse_range(s, "window")?,
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
    let cfg = Config::default();
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
            window_samples_by_rank: ranks.iter().map(|(r, s)| (r.clone(), s.total)).collect(),
        });
        if sb.total < cfg.min_samples || sa.total < cfg.min_samples {
            notes.push(format!(
                "group {g}: {} baseline and {} window samples; at least {} each are needed to compare",
                sb.total, sa.total, cfg.min_samples
            ));
        }
        flags.extend(waterline(g, &ranks, &cfg));
        regs.extend(regressions(g, &sb, &sa, &cfg));
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
    let stragglers: Vec<Straggler> = found
        .iter()
        .map(|s| Straggler {
            rank: world(&s.group, s.rank).to_string(),
            group: s.group.clone(),
            late_us: s.late_us - s.peers_late_us,
            t: s.t,
        })
        .collect();
    let host_views: Vec<Option<HostView>> = stragglers
        .iter()
        .map(|s| {
            host_view(s, &profiles, &host_profiles, &records, &|p| {
                within(p, window)
            })
        })
        .collect();
    // The OS layer: each late rank's signals over the window against the
    // other ranks of its group.
    let os_window: Vec<&OsSample> = os_samples
        .iter()
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
    for s in &found {
        let me = world(&s.group, s.rank);
        let peer_ranks: Vec<u32> = records
            .iter()
            .filter(|r| r.group == s.group && r.rank != s.rank)
            .map(|r| r.global_rank.unwrap_or(r.rank))
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .collect();
        let Some(mine) = means.get(&me) else {
            notes.push(format!(
                "group {} rank {me}: no OS signals in the window (*.os.jsonl): the OS layer is not judged",
                s.group
            ));
            continue;
        };
        let peers: Vec<BTreeMap<String, f64>> = peer_ranks
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
        let view = stragglers
            .iter()
            .zip(&host_views)
            .find(|(x, _)| x.group == s.group && x.rank == me.to_string())
            .and_then(|(_, v)| v.as_ref());
        let own = Shares::of(profiles.iter().filter(|p| {
            p.labels.get("rank").map(String::as_str) == Some(me.to_string().as_str())
                && within(p, window)
        }));
        for diff in os_diff(mine, &peers, &OsConfig::default()) {
            let on_host = view
                .and_then(|v| handler_path(&diff.signal, &v.shares[&v.host]))
                .map(|p| (p, "host"));
            let path = on_host.or_else(|| handler_path(&diff.signal, &own).map(|p| (p, "rank")));
            os_rows.push(OsDiff {
                group: s.group.clone(),
                rank: me.to_string(),
                handler_stack: path.as_ref().map(|((st, _), _)| st.clone()),
                handler_share: path.as_ref().map(|((_, sh), _)| *sh),
                handler_scope: path.as_ref().map(|(_, scope)| *scope),
                diff,
            });
        }
    }
    let tcp_hosts = host_tcp(&os_window);
    let network_rows = lossy_hosts(&tcp_hosts, &NetworkConfig::default());
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
    let kernels = gpu_kernel_times(&args.fingerprints, &mut notes)?;
    let mut gpu_rows = Vec::new();
    if kernels.is_empty() {
        notes.push(if args.fingerprints.is_empty() {
            "no GPU kernel times (--fingerprints: fingerprints or profiler traces per rank): the GPU layer is not judged".into()
        } else {
            "no GPU kernels in the --fingerprints files: the GPU layer is not judged".into()
        });
    } else {
        for s in &found {
            let me = world(&s.group, s.rank);
            let peers: Vec<Vec<KernelTime>> = records
                .iter()
                .filter(|r| r.group == s.group && r.rank != s.rank)
                .map(|r| r.global_rank.unwrap_or(r.rank))
                .collect::<std::collections::BTreeSet<u32>>()
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
                    rank: me.to_string(),
                    peers: peers.len(),
                    finding,
                });
            }
        }
    }
    let host_rows: Vec<CpuDiff> = stragglers
        .iter()
        .zip(&host_views)
        .filter_map(|(s, v)| Some(host_diff(s, v.as_ref()?)))
        .flatten()
        .collect();
    if host_profiles.is_empty() && !stragglers.is_empty() {
        notes.push(
            "no host profiles (the agent's --profile-host or --profile-cgroup): \
             other processes on a late rank's host are not judged"
                .into(),
        );
    }
    let late_ranks: Vec<&str> = stragglers.iter().map(|s| s.rank.as_str()).collect();
    let straggler_cpu: Vec<WaterlineFlag> = flags
        .iter()
        .filter(|f| late_ranks.contains(&f.rank.as_str()))
        .cloned()
        .chain(host_rows.iter().map(|d| WaterlineFlag {
            group: d.group.clone(),
            rank: d.rank.clone(),
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
    } else if network_rows.iter().any(|h| {
        h.ranks
            .iter()
            .any(|r| stragglers.iter().any(|s| s.rank == r.to_string()))
    }) {
        NetworkEvidence::OnLateHost
    } else {
        NetworkEvidence::Elsewhere
    };
    let mut layer = verdict(
        !stragglers.is_empty(),
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
    let offcpu_rows = offcpu_diff(&stragglers, &offcpu_profiles, |p| within(p, window));
    if !offcpu_rows.is_empty() && layer == whyslow_diagnose::layer::Layer::None {
        // Waiting in the kernel for I/O or a lock is the OS layer's to own.
        layer = whyslow_diagnose::layer::Layer::Os;
    }
    if offcpu_profiles.is_empty() && !stragglers.is_empty() {
        notes.push(
            "no off-CPU profiles (the agent's --profile-offcpu): time a late rank spent blocked is not judged"
                .into(),
        );
    }
    if !stragglers.is_empty() && layer == whyslow_diagnose::layer::Layer::None {
        notes.push(
            "a rank is late but neither its CPU profile nor its OS signals differ from its peers': \
             the cause is in a layer not seen here (the network, the GPU where its kernel times \
             were not given, or before the window)"
                .into(),
        );
    }
    let report = Report {
        stragglers,
        layer: layer.as_str(),
        cpu_diff: host_rows
            .into_iter()
            .chain(flags.into_iter().map(CpuDiff::from))
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
        collective_groups: lateness(&records, &scfg)
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
                            (world(&g.group, r).to_string(), mean)
                        })
                        .collect(),
                }
            })
            .collect(),
        groups: summaries,
        notes,
    };
    if let Some(svg) = &args.diff_svg {
        let g = report
            .regressions
            .first()
            .map(|r| r.group.clone())
            .or_else(|| groups.keys().next().cloned())
            .unwrap_or_default();
        match groups.get(&g) {
            None => eprintln!(
                "whyslow: --diff-svg {}: not written: no rank profiles to draw a flame graph from",
                svg.display()
            ),
            Some(ps) => {
                let merge = |r: (f64, f64)| {
                    crate::profile::merge(ps.iter().copied().filter(|p| within(p, r)))
                };
                let opts = whyslow_stack_output::FlameOptions {
                    title: format!(
                        "group {g}: {:.0}..{:.0} s against {:.0}..{:.0} s",
                        window.0, window.1, baseline.0, baseline.1
                    ),
                    ..Default::default()
                };
                let out = whyslow_stack_output::to_diff_flamegraph_svg(
                    &merge(baseline),
                    &merge(window),
                    &opts,
                );
                std::fs::write(svg, out).with_context(|| format!("writing {}", svg.display()))?;
                eprintln!(
                    "whyslow: wrote the differential flame graph {}",
                    svg.display()
                );
            }
        }
    }
    if let Some(path) = &args.html {
        let plots = lateness(&records, &scfg)
            .into_iter()
            .filter(|g| report.stragglers.iter().any(|s| s.group == g.group))
            .map(|g| entry_plot(&g, &found))
            .collect::<Vec<_>>();
        let mut flames = Vec::new();
        for (i, s) in report.stragglers.iter().enumerate().take(4) {
            let in_window: Vec<&StackProfile> =
                profiles.iter().filter(|p| within(p, window)).collect();
            flames.extend(peer_flame(&in_window, "rank", &s.rank, |peer| {
                format!("late rank {} against rank {peer}", s.rank)
            }));
            let blocked: Vec<&StackProfile> = offcpu_profiles
                .iter()
                .filter(|p| within(p, window))
                .collect();
            flames.extend(peer_flame(&blocked, "rank", &s.rank, |peer| {
                format!(
                    "late rank {} against rank {peer}: time blocked off the CPU",
                    s.rank
                )
            }));
            if let Some(view) = host_views.get(i).and_then(Option::as_ref) {
                let hosts: Vec<&StackProfile> = host_profiles
                    .iter()
                    .filter(|p| {
                        within(p, window)
                            && p.labels
                                .get("host")
                                .is_some_and(|h| view.shares.contains_key(h))
                    })
                    .collect();
                flames.extend(peer_flame(&hosts, "host", &view.host, |peer| {
                    format!(
                        "late rank {}'s host {} against host {peer}: all their processes",
                        s.rank, view.host
                    )
                }));
            }
        }
        for g in report.groups.iter().take(4) {
            let ps = &groups[&g.group];
            let merge =
                |r: (f64, f64)| crate::profile::merge(ps.iter().copied().filter(|p| within(p, r)));
            let (b, a) = (merge(baseline), merge(window));
            if b.total() == 0 || a.total() == 0 {
                continue;
            }
            let title = format!(
                "group {}: {:.0}..{:.0} s against the baseline {:.0}..{:.0} s",
                g.group, window.0, window.1, baseline.0, baseline.1
            );
            let svg = whyslow_stack_output::to_diff_flamegraph_svg(
                &b,
                &a,
                &whyslow_stack_output::FlameOptions {
                    title: title.clone(),
                    ..Default::default()
                },
            );
            flames.push(whyslow_report::diagnose::FlameGraph { title, svg });
        }
        let mut summary = Vec::new();
        write_table(&mut summary, &report)?;
        let page = whyslow_report::diagnose::render_diagnose_html(
            &format!("whyslow diagnose {}", args.dir.display()),
            &String::from_utf8_lossy(&summary),
            &plots,
            &flames,
        );
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("whyslow: wrote the HTML report {}", path.display());
    }
    let mut text: Vec<u8> = Vec::new();
    match args.format {
        Format::Json => {
            serde_json::to_writer_pretty(&mut text, &report)?;
            text.push(b'\n');
        }
        Format::Table => write_table(&mut text, &report)?,
    }
    match &args.output {
        Some(path) => {
            std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::Write::write_all(&mut std::io::stdout().lock(), &text)?,
    }
    Ok(0)
}

/// Each network namespace's TCP rates over `samples`, named by host (and
/// namespace, where one host name holds several), with the ranks in it.
/// Processes of one namespace read the same counters: their means agree,
/// and the mean over all of them is the namespace's.
fn host_tcp(samples: &[&OsSample]) -> Vec<HostTcp> {
    let mut by_ns: BTreeMap<(String, Option<u64>), Vec<&OsSample>> = BTreeMap::new();
    for s in samples {
        if [
            TCP_OUT_SEGS,
            TCP_RETRANS_SEGS,
            TCP_IN_SEGS,
            TCP_OUT_OF_ORDER,
        ]
        .iter()
        .all(|k| s.signals.contains_key(*k))
        {
            by_ns.entry((s.host.clone(), s.netns)).or_default().push(s);
        }
    }
    let shared_names: std::collections::BTreeSet<&String> = by_ns
        .keys()
        .zip(by_ns.keys().skip(1))
        .filter(|(a, b)| a.0 == b.0)
        .flat_map(|(a, b)| [&a.0, &b.0])
        .collect();
    by_ns
        .iter()
        .map(|((host, ns), v)| {
            let m = mean_signals(v.iter().copied());
            let name = if host.is_empty() { "host ?" } else { host };
            let ranks: std::collections::BTreeSet<u32> = v.iter().filter_map(|s| s.rank).collect();
            HostTcp {
                host: match ns {
                    Some(ns) if shared_names.contains(host) => format!("{name} net:[{ns}]"),
                    _ => name.to_string(),
                },
                ranks: ranks.into_iter().collect(),
                out_segs_per_s: m.get(TCP_OUT_SEGS).copied().unwrap_or(0.0),
                retrans_segs_per_s: m.get(TCP_RETRANS_SEGS).copied().unwrap_or(0.0),
                in_segs_per_s: m.get(TCP_IN_SEGS).copied().unwrap_or(0.0),
                out_of_order_per_s: m.get(TCP_OUT_OF_ORDER).copied().unwrap_or(0.0),
            }
        })
        .collect()
}

/// A differential flame graph of the profiles whose `key` label is `me`
/// against those of the first other value (the peer), titled by `title`
/// from the peer's value; `None` when either side has none.
fn peer_flame(
    profiles: &[&StackProfile],
    key: &str,
    me: &str,
    title: impl Fn(&str) -> String,
) -> Option<whyslow_report::diagnose::FlameGraph> {
    let value = |p: &StackProfile| p.labels.get(key).cloned();
    let mine: Vec<&StackProfile> = profiles
        .iter()
        .copied()
        .filter(|p| value(p).as_deref() == Some(me))
        .collect();
    let peer_value = profiles.iter().filter_map(|p| value(p)).find(|v| v != me)?;
    let peer: Vec<&StackProfile> = profiles
        .iter()
        .copied()
        .filter(|p| value(p).as_ref() == Some(&peer_value))
        .collect();
    if mine.is_empty() {
        return None;
    }
    let title = title(&peer_value);
    let svg = whyslow_stack_output::to_diff_flamegraph_svg(
        &crate::profile::merge(peer),
        &crate::profile::merge(mine),
        &whyslow_stack_output::FlameOptions {
            title: title.clone(),
            ..Default::default()
        },
    );
    Some(whyslow_report::diagnose::FlameGraph { title, svg })
}

/// The per-rank entry-time plot of one group (SysOM-AI Fig. 5).
fn entry_plot(
    g: &whyslow_diagnose::stragglers::GroupLateness,
    late: &[whyslow_diagnose::stragglers::Straggler],
) -> whyslow_report::diagnose::EntryPlot {
    let flagged: Vec<u32> = late
        .iter()
        .filter(|s| s.group == g.group)
        .map(|s| s.rank)
        .collect();
    whyslow_report::diagnose::EntryPlot::from_instances(&g.group, &g.ranks, &g.instances, &flagged)
}

fn write_table(out: &mut dyn std::io::Write, r: &Report) -> std::io::Result<()> {
    writeln!(out,
        "{} rank profiles in {} group(s); baseline {:.0}..{:.0} s, window {:.0}..{:.0} s (since the earliest profile)",
        r.profiles,
        r.groups.len(),
        r.baseline.0,
        r.baseline.1,
        r.window.0,
        r.window.1
    )?;
    for g in &r.groups {
        writeln!(
            out,
            "  group {}: {} ranks, {} baseline / {} window samples",
            g.group, g.ranks, g.baseline_samples, g.window_samples
        )?;
    }
    if r.stragglers.is_empty() {
        writeln!(out, "stragglers: none")?;
    } else {
        for s in &r.stragglers {
            writeln!(
            out,
                "straggler: group {} rank {}: enters its collectives {:.1} ms after the others (mean over the window)",
                s.group,
                s.rank,
                s.late_us / 1e3
            )?;
        }
    }
    writeln!(out, "layer: {}", r.layer)?;
    if r.cpu_diff.is_empty() {
        writeln!(out, "CPU waterline: no rank above its group's")?;
    } else {
        writeln!(
            out,
            "CPU waterline (a rank's share above its group's μ + 2σ):"
        )?;
        for d in &r.cpu_diff {
            let who = match &d.host {
                Some(h) => format!("rank {}'s host {h} (all its processes)", d.rank),
                None => format!("rank {}", d.rank),
            };
            writeln!(
                out,
                "  group {} {who}: {} {:.1} % vs peers {:.1} % (line {:.1} %)\n    {}",
                d.group,
                d.function,
                100.0 * d.straggler_share,
                100.0 * d.peer_share,
                100.0 * d.threshold,
                d.stack
            )?;
        }
    }
    if !r.offcpu_diff.is_empty() {
        writeln!(
            out,
            "off the CPU (a late rank's share of blocked time above its group's μ + 2σ):"
        )?;
        for d in &r.offcpu_diff {
            writeln!(
                out,
                "  group {} rank {}: {} {:.1} % vs peers {:.1} %\n    {}",
                d.group,
                d.rank,
                d.function,
                100.0 * d.straggler_share,
                100.0 * d.peer_share,
                d.stack
            )?;
        }
    }
    if r.regressions.is_empty() {
        writeln!(
            out,
            "temporal baseline: no function's share rose by more than 0.5 pp"
        )?;
    } else {
        writeln!(
            out,
            "temporal baseline (share rose by > 0.5 pp since the baseline):"
        )?;
        for x in &r.regressions {
            writeln!(
                out,
                "  group {}: {} {:.1} % -> {:.1} %\n    {}",
                x.group,
                x.function,
                100.0 * x.before_share,
                100.0 * x.after_share,
                x.stack
            )?;
        }
    }
    for g in &r.gpu_diff {
        let what = match g.finding.pattern {
            GpuPattern::Uniform => "uniformly slower: the hardware (clocks held down by power or temperature, a degraded part; nvidia-smi -q -d PERFORMANCE,CLOCK)",
            GpuPattern::Specific => "specific kernels slower, the rest at their peers' pace: software (shapes, algorithm choice, data)",
        };
        writeln!(
            out,
            "GPU kernels: group {} rank {}: {:.2}x its {} peers' kernel time, {what}",
            g.group, g.rank, g.finding.overall_ratio, g.peers
        )?;
        for k in g.finding.kernels.iter().take(8) {
            writeln!(
                out,
                "  {} {:.1} µs vs {:.1} µs per call ({:.2}x, +{:.1} % of its GPU time)",
                k.kernel,
                k.straggler_us,
                k.peers_us,
                k.ratio,
                100.0 * k.excess_share
            )?;
        }
    }
    if r.os_diff.is_empty() {
        writeln!(out, "OS signals: no late rank stands out from its peers")?;
    } else {
        writeln!(out, "OS signals (a late rank's above its peers' μ + 2σ):")?;
        for d in &r.os_diff {
            writeln!(
                out,
                "  group {} rank {}: {} {:.1} vs peers {:.1}",
                d.group, d.rank, d.diff.signal, d.diff.straggler, d.diff.peers
            )?;
            if let (Some(st), Some(sh), Some(scope)) =
                (&d.handler_stack, d.handler_share, d.handler_scope)
            {
                writeln!(
                    out,
                    "    its kernel handler in {:.1} % of the {} profile's samples:\n    {st}",
                    100.0 * sh,
                    if scope == "host" { "host" } else { "rank" }
                )?;
            }
        }
    }
    let cfg = NetworkConfig::default();
    if r.network_diff.is_empty() {
        writeln!(
            out,
            "network: no host resends over {:.1} % of its TCP segments or receives over {:.1} % \
             out of order",
            cfg.min_retrans_pct, cfg.min_out_of_order_pct
        )?;
    } else {
        writeln!(out, "network (TCP segments lost, per host):")?;
        for h in &r.network_diff {
            let ranks: Vec<String> = h.ranks.iter().map(u32::to_string).collect();
            writeln!(
                out,
                "  {} ({} {}): {}{}",
                h.host,
                if ranks.len() == 1 { "rank" } else { "ranks" },
                ranks.join(", "),
                match h.side {
                    "sends" => "resends what it sends",
                    "receives" => "receives out of order",
                    _ => "resends and receives out of order",
                },
                if h.stands_out {
                    ""
                } else {
                    " (so do its peers: the loss is not this host's alone)"
                }
            )?;
            let side = |what: &str, s: &whyslow_diagnose::network::LossSide, segs: f64| {
                let peers = s
                    .peers_pct
                    .map(|p| format!("the other hosts' median {p:.2} %"))
                    .unwrap_or_else(|| "no other host".into());
                format!(
                    "    {what}: {:.2} % of {segs:.0} segments/s, vs {peers}",
                    s.pct
                )
            };
            if let Some(s) = &h.resent {
                writeln!(out, "{}", side("resent", s, h.out_segs_per_s))?;
            }
            if let Some(s) = &h.out_of_order {
                writeln!(out, "{}", side("out of order", s, h.in_segs_per_s))?;
            }
        }
    }
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}
