//! `whyslow diagnose DIR`: the cross-layer diagnosis of SysOM-AI §3.1 over
//! what the node agents wrote: profile spools (`*.pb.gz`) give the per-group
//! CPU waterline over the window and the temporal baseline of the window
//! against a healthy period; collective records (`*.collectives.jsonl`, one
//! `whyslow_model::collective::CollectiveRecord` per line) give the slow
//! ranks. No tracer writes collective records yet, and OS signals are not
//! collected: the report says so instead of claiming none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use whyslow_diagnose::stragglers::{slow_ranks, StragglerConfig};
use whyslow_diagnose::{regressions, waterline, Config, Regression, Shares, WaterlineFlag};
use whyslow_model::collective::CollectiveRecord;
use whyslow_model::stack::StackProfile;

/// `whyslow diagnose`.
#[derive(Args, Debug)]
pub struct DiagnoseArgs {
    /// What the agents wrote: profile spools (`*.pb.gz`, searched recursively),
    /// one directory per host or all in one.
    dir: PathBuf,
    /// The healthy period, seconds since the earliest profile in DIR: `A..B`.
    /// Default: the first third of the data.
    #[arg(long)]
    baseline: Option<String>,
    /// The period to judge, `A..B` seconds since the earliest profile.
    /// Default: the last third of the data.
    #[arg(long)]
    window: Option<String>,
    /// Output on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also write the differential flame graph of the window against the
    /// baseline (SVG) of the first group with a regression, else of the
    /// first group.
    #[arg(long)]
    diff_svg: Option<PathBuf>,
}

/// Output format of `whyslow diagnose`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A report for the terminal.
    Table,
    /// The JSON contract.
    Json,
}

/// A rank's CPU path above its group's waterline (`cpu_diff` in the JSON).
#[derive(Debug, Serialize)]
struct CpuDiff {
    group: String,
    rank: String,
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
            function: f.function,
            stack: f.stack,
            straggler_share: f.share,
            peer_share: f.peer_share,
            threshold: f.threshold,
        }
    }
}

#[derive(Debug, Serialize)]
struct Straggler {
    rank: String,
    group: String,
    late_us: f64,
}

#[derive(Debug, Serialize)]
struct OsDiff {
    signal: String,
    straggler: f64,
    peers: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    /// Ranks late into their collectives (needs collective records).
    stragglers: Vec<Straggler>,
    /// `gpu|cpu|os|network|none`.
    layer: &'static str,
    cpu_diff: Vec<CpuDiff>,
    os_diff: Vec<OsDiff>,
    regressions: Vec<Regression>,
    /// Seconds since the earliest profile.
    baseline: (f64, f64),
    window: (f64, f64),
    profiles: usize,
    groups: Vec<GroupSummary>,
    notes: Vec<String>,
}

#[derive(Debug, Serialize)]
struct GroupSummary {
    group: String,
    ranks: usize,
    baseline_samples: u64,
    window_samples: u64,
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

/// Collective records of every `*.collectives.jsonl` under `dir`; lines that
/// do not parse are skipped and counted in a note.
fn collective_records(dir: &Path, notes: &mut Vec<String>) -> Result<Vec<CollectiveRecord>> {
    let mut files = Vec::new();
    spool_files(dir, ".collectives.jsonl", &mut files)?;
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
            match serde_json::from_str::<CollectiveRecord>(line) {
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
    let host_profiles = profiles
        .iter()
        .filter(|p| p.labels.contains_key("scope"))
        .count();
    profiles.retain(|p| !p.labels.contains_key("scope") && p.labels.contains_key("rank"));
    let records = collective_records(&args.dir, &mut notes)?;
    if profiles.is_empty() && records.is_empty() {
        bail!(
            "{}: no rank profile (*.pb.gz, {} file(s) read; the agent writes them with --profile-spool) \
             and no collective records (*.collectives.jsonl): nothing to diagnose",
            args.dir.display(),
            files.len()
        );
    }
    if profiles.is_empty() {
        notes.push("no rank profiles: the CPU layer is not judged".into());
    }
    if host_profiles > 0 {
        notes.push(format!(
            "{host_profiles} node-wide profile(s) (--profile-host) are not compared yet"
        ));
    }
    let t0 = profiles.iter().map(|p| p.start_unix_ns).min().unwrap_or(0);
    let end = profiles
        .iter()
        .map(|p| p.start_unix_ns.saturating_add(p.duration_ns))
        .max()
        .unwrap_or(t0);
    let span = (end - t0) as f64 / 1e9;
    let baseline = match &args.baseline {
        Some(s) => parse_range(s, "baseline")?,
        None => (0.0, span / 3.0),
    };
    let window = match &args.window {
        Some(s) => parse_range(s, "window")?,
        None => (2.0 * span / 3.0, span),
    };
    let mid = |p: &StackProfile| {
        (p.start_unix_ns.saturating_sub(t0) as f64 + p.duration_ns as f64 / 2.0) / 1e9
    };
    let within = |p: &StackProfile, r: (f64, f64)| (r.0..=r.1).contains(&mid(p));
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
    let (mut cpu_diff, mut regs, mut summaries) = (Vec::new(), Vec::new(), Vec::new());
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
        });
        if sb.total < cfg.min_samples || sa.total < cfg.min_samples {
            notes.push(format!(
                "group {g}: {} baseline and {} window samples; at least {} each are needed to compare",
                sb.total, sa.total, cfg.min_samples
            ));
        }
        cpu_diff.extend(waterline(g, &ranks, &cfg).into_iter().map(CpuDiff::from));
        regs.extend(regressions(g, &sb, &sa, &cfg));
    }
    let stragglers: Vec<Straggler> = if records.is_empty() {
        notes.push("no collective records (*.collectives.jsonl): slow ranks are not judged".into());
        Vec::new()
    } else {
        slow_ranks(&records, &StragglerConfig::default())
            .into_iter()
            .map(|s| Straggler {
                rank: s.rank.to_string(),
                group: s.group,
                late_us: s.late_us - s.peers_late_us,
            })
            .collect()
    };
    notes.push(
        "GPU kernel times and OS signals are not collected yet: those layers are not judged".into(),
    );
    // The CPU layer when the CPU profiles show a cause; otherwise none that
    // whyslow can see yet.
    let layer = if cpu_diff.is_empty() && regs.is_empty() {
        "none"
    } else {
        "cpu"
    };
    let report = Report {
        stragglers,
        layer,
        cpu_diff,
        os_diff: Vec::new(),
        regressions: regs,
        baseline,
        window,
        profiles: profiles.len(),
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
        let ps = &groups[&g];
        let merge =
            |r: (f64, f64)| crate::profile::merge(ps.iter().copied().filter(|p| within(p, r)));
        let opts = whyslow_stack_output::FlameOptions {
            title: format!(
                "group {g}: {:.0}..{:.0} s against {:.0}..{:.0} s",
                window.0, window.1, baseline.0, baseline.1
            ),
            ..Default::default()
        };
        let out =
            whyslow_stack_output::to_diff_flamegraph_svg(&merge(baseline), &merge(window), &opts);
        std::fs::write(svg, out).with_context(|| format!("writing {}", svg.display()))?;
        eprintln!(
            "whyslow: wrote the differential flame graph {}",
            svg.display()
        );
    }
    match args.format {
        Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Format::Table => print_table(&report),
    }
    Ok(0)
}

fn print_table(r: &Report) {
    println!(
        "{} rank profiles in {} group(s); baseline {:.0}..{:.0} s, window {:.0}..{:.0} s (since the earliest profile)",
        r.profiles,
        r.groups.len(),
        r.baseline.0,
        r.baseline.1,
        r.window.0,
        r.window.1
    );
    for g in &r.groups {
        println!(
            "  group {}: {} ranks, {} baseline / {} window samples",
            g.group, g.ranks, g.baseline_samples, g.window_samples
        );
    }
    if r.stragglers.is_empty() {
        println!("stragglers: none");
    } else {
        for s in &r.stragglers {
            println!(
                "straggler: group {} rank {}: enters its collectives {:.1} ms after the others (mean over the window)",
                s.group,
                s.rank,
                s.late_us / 1e3
            );
        }
    }
    println!("layer: {}", r.layer);
    if r.cpu_diff.is_empty() {
        println!("CPU waterline: no rank above its group's");
    } else {
        println!("CPU waterline (a rank's share above its group's μ + 2σ):");
        for d in &r.cpu_diff {
            println!(
                "  group {} rank {}: {} {:.1} % vs peers {:.1} % (line {:.1} %)\n    {}",
                d.group,
                d.rank,
                d.function,
                100.0 * d.straggler_share,
                100.0 * d.peer_share,
                100.0 * d.threshold,
                d.stack
            );
        }
    }
    if r.regressions.is_empty() {
        println!("temporal baseline: no function's share rose by more than 0.5 pp");
    } else {
        println!("temporal baseline (share rose by > 0.5 pp since the baseline):");
        for x in &r.regressions {
            println!(
                "  group {}: {} {:.1} % -> {:.1} %\n    {}",
                x.group,
                x.function,
                100.0 * x.before_share,
                100.0 * x.after_share,
                x.stack
            );
        }
    }
    for n in &r.notes {
        println!("note: {n}");
    }
}
