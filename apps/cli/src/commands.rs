//! Subcommands: `analyze` (the whole pipeline), `summarize` (one worker),
//! `localize` (central, from fingerprints).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rayon::prelude::*;

use whyslow_ingest::InputFile;
use whyslow_localize::LocalizeConfig;
use whyslow_model::{Report, Verdict, WorkerTrace};
use whyslow_summarize::SummarizeOptions;

/// Tells which function, on which workers, is slowing a training job, and why.
#[derive(Parser, Debug)]
#[command(name = "whyslow", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Read every worker's trace, fingerprint it and name the abnormal (function, workers).
    ///
    /// Inputs are files or directories (searched recursively): PyTorch profiler
    /// (Kineto) traces `*.json[.gz]`, generic event files `*.csv|*.jsonl[.gz]`,
    /// hardware samples `*.samples.csv[.gz]` and fingerprints `*.fingerprint.json`.
    Analyze(AnalyzeArgs),
    /// Fingerprint one worker's trace (PerfTracker §4.2) into a small JSON file.
    Summarize(SummarizeArgs),
    /// Compare fingerprints of all workers and name the abnormal ones (PerfTracker §4.3).
    Localize(LocalizeArgs),
    /// Sample a training process's CPU and network utilization into a samples file.
    Sample(crate::sample::SampleArgs),
    /// Privileged sidecar: serve sampling requests that training ranks write into a shared directory.
    ///
    /// Protocol in docs/agent.md: `rank-<r>.request.json` / `rank-<r>.stop` in,
    /// `rank-<r>.samples.csv` + `rank-<r>.done` (or `.error`) out; holds
    /// `whyslow.pause` while a window is active so other monitors step aside.
    #[cfg(feature = "node")]
    Agent(whyslow_agent::AgentArgs),
    /// Black-box diagnosis from switch-level network flow records (LLMPrism).
    #[command(subcommand)]
    Flows(crate::flows::FlowsCommand),
    /// CPU stack profile of a running process: kernel and native stacks (DWARF
    /// unwinding), symbolized; written as folded stacks, pprof, a flame graph
    /// or speedscope JSON (by the output's extension).
    #[cfg(feature = "node")]
    Profile(crate::record::ProfileArgs),
    /// Flame graph of saved profiles, or a differential one against `--diff BASE`.
    Flamegraph(crate::profile::FlamegraphArgs),
    /// Trace the gloo collectives of running processes with eBPF uprobes
    /// (SysOM-AI §3.2), as collective records for `diagnose`.
    #[cfg(feature = "node")]
    Collectives(crate::collectives::CollectivesArgs),
    /// Cross-layer diagnosis over the agents' profile spools (SysOM-AI §3.1):
    /// the per-group CPU waterline and the temporal baseline.
    Diagnose(crate::diagnose::DiagnoseArgs),
    /// A hung job: the ranks every other rank waits for, and what they do
    /// instead, from Flight Recorder dumps, stacks and collective records.
    Hang(crate::hang::HangArgs),
    /// The central service: fingerprints uploaded by every job, localized
    /// centrally, reports over HTTP (`server token create` makes tokens).
    #[cfg(feature = "server")]
    Server(crate::server::ServerArgs),
    /// Symbols for the server: ELF files uploaded once per Build-ID, so that
    /// profiles from nodes without symbols are named centrally.
    #[cfg(feature = "node")]
    Symbols(crate::symbols::SymbolsArgs),
}

#[derive(Args, Debug)]
struct AnalyzeArgs {
    /// Trace files or directories.
    #[arg(required = true)]
    inputs: Vec<PathBuf>,
    #[command(flatten)]
    window: WindowArgs,
    #[command(flatten)]
    output: OutputArgs,
    /// Also write the flagged functions' spans on the flagged workers and a
    /// few peers as a Chrome trace-event file for Perfetto (ui.perfetto.dev).
    #[arg(long, value_name = "FILE")]
    perfetto: Option<PathBuf>,
    /// Also write each worker's fingerprint into this directory.
    #[arg(long, value_name = "DIR")]
    fingerprints_out: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct SummarizeArgs {
    /// One trace file (Kineto JSON[.gz], or a generic events file of one worker).
    trace: PathBuf,
    /// Where to write the fingerprint (`-` for stdout).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Hardware samples for this worker (`resource,ts_us,value`).
    #[arg(long, value_name = "FILE")]
    samples: Option<PathBuf>,
    #[command(flatten)]
    window: WindowArgs,
}

#[derive(Args, Debug)]
struct LocalizeArgs {
    /// Fingerprint files or directories holding `*.fingerprint.json`.
    #[arg(required = true)]
    fingerprints: Vec<PathBuf>,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args, Debug)]
struct WindowArgs {
    /// Restrict the window to ProfilerSteps A..B (inclusive), e.g. `--steps 10..19`.
    #[arg(long, value_name = "A..B", value_parser = parse_steps)]
    steps: Option<(u64, u64)>,
}

#[derive(Args, Debug)]
struct OutputArgs {
    /// Output format on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Also write a self-contained HTML report with plots.
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// Also write the JSON report to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Localization settings (expected ranges, δ, k, seed) as TOML.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Number of workers in the job; ranks below it without data are reported missing.
    #[arg(long, value_name = "N")]
    world_size: Option<u32>,
    /// Directories to look for Python sources in, to quote the flagged lines.
    #[arg(long, value_name = "DIR")]
    source_root: Vec<PathBuf>,
    /// Treat any unreadable or incomplete input as fatal instead of warning:
    /// a bad or truncated file, a worker without events in its window, a
    /// rank given twice, missing ranks.
    #[arg(long)]
    strict: bool,
    /// Exit with code 3 when anomalies are found.
    #[arg(long)]
    fail_on_anomaly: bool,
    /// Never color the table.
    #[arg(long)]
    no_color: bool,
    /// Ask a model for a fix (EROICA's first step): one request with the
    /// findings and their code (the enclosing functions, under
    /// --source-root) to the OpenAI-compatible API at WHYSLOW_LLM_URL
    /// (WHYSLOW_LLM_MODEL, WHYSLOW_LLM_API_KEY or _FILE). Its answer goes
    /// into the report (`fix`, or `fix_error`) and its patch into fix.patch
    /// beside the report written with --json or --html (nothing is written
    /// elsewhere); a failure costs nothing else. Never by default.
    #[arg(long)]
    suggest_fix: bool,
    /// With --suggest-fix: print exactly the request body and send nothing.
    #[arg(long, requires = "suggest_fix")]
    dry_run: bool,
    /// With --suggest-fix: seconds for the whole exchange.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 120.0,
        requires = "suggest_fix"
    )]
    llm_timeout: f64,
    /// With --suggest-fix: bytes of code sent at most (the last findings'
    /// code is cut first).
    #[arg(long, value_name = "BYTES", default_value_t = whyslow_fix::DEFAULT_MAX_CODE_BYTES, requires = "suggest_fix")]
    max_code_bytes: usize,
    /// With --suggest-fix: tokens of the answer at most (`max_tokens`; a
    /// small local model otherwise writes until its context is full).
    #[arg(long, value_name = "TOKENS", default_value_t = whyslow_fix::DEFAULT_MAX_TOKENS, requires = "suggest_fix")]
    llm_max_tokens: u32,
    /// With --suggest-fix: check the proposed patch with the command after
    /// `--` (e.g. `-- python train.py --iters 60`): it runs in a scratch copy
    /// of the first --source-root as it is and in one with the patch
    /// applied, --verify-runs times each, alternating; `fix.verified` says
    /// whether the patch made it faster (median speed-up > 1 at one-sided
    /// Mann–Whitney p < 0.05). The user's files are never changed.
    #[arg(long, requires = "suggest_fix")]
    verify_fix: bool,
    /// With --verify-fix: runs of each side.
    #[arg(long, value_name = "N", default_value_t = 10, requires = "verify_fix")]
    verify_runs: usize,
    /// With --verify-fix: seconds one run may take before it counts as
    /// failed.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 600.0,
        requires = "verify_fix"
    )]
    verify_timeout: f64,
    /// The command that --verify-fix reruns, after `--`.
    #[arg(last = true, value_name = "CMD")]
    verify_command: Vec<String>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Json,
}

fn parse_steps(s: &str) -> Result<(u64, u64), String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("expected A..B, got {s:?}"))?;
    let a: u64 = a.trim().parse().map_err(|_| format!("bad step {a:?}"))?;
    let b: u64 = b
        .trim()
        .trim_start_matches('=')
        .parse()
        .map_err(|_| format!("bad step {b:?}"))?;
    if b < a {
        return Err(format!("empty step range {s:?}"));
    }
    Ok((a, b))
}

/// Runs one subcommand.
pub fn run(cli: Cli) -> Result<u8> {
    match cli.command {
        Command::Analyze(args) => analyze(args),
        Command::Summarize(args) => summarize(args),
        Command::Localize(args) => localize(args),
        Command::Flows(cmd) => crate::flows::run(cmd),
        Command::Sample(args) => crate::sample::run(args),
        #[cfg(feature = "node")]
        Command::Agent(args) => whyslow_agent::run(args),
        #[cfg(feature = "node")]
        Command::Profile(args) => crate::record::run_profile(args),
        Command::Flamegraph(args) => crate::profile::run_flamegraph(args),
        Command::Diagnose(args) => crate::diagnose::run(args),
        Command::Hang(args) => crate::hang::run(args),
        #[cfg(feature = "node")]
        Command::Collectives(args) => crate::collectives::run(args),
        #[cfg(feature = "server")]
        Command::Server(args) => crate::server::run(args),
        #[cfg(feature = "node")]
        Command::Symbols(args) => crate::symbols::run(args),
    }
}

fn warn(msg: &str) {
    eprintln!("whyslow: warning: {msg}");
}

fn progress_bar(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    if !io::stderr().is_terminal() || len < 2 {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{bar:30}] {pos}/{len} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

fn load_config(path: Option<&Path>) -> Result<LocalizeConfig> {
    match path {
        None => Ok(LocalizeConfig::default()),
        Some(p) => {
            let text =
                fs::read_to_string(p).with_context(|| format!("reading config {}", p.display()))?;
            LocalizeConfig::from_toml_str(&text).with_context(|| format!("config {}", p.display()))
        }
    }
}

/// Skips a bad input with a warning, or fails under `--strict`.
fn skip_or_fail(
    strict: bool,
    err: impl std::fmt::Display,
    warnings: &mut Vec<String>,
) -> Result<()> {
    if strict {
        bail!("{err} (--strict)");
    }
    let msg = format!("skipped {err}");
    warn(&msg);
    warnings.push(msg);
    Ok(())
}

fn analyze(args: AnalyzeArgs) -> Result<u8> {
    let cfg = load_config(args.output.config.as_deref())?;
    let policy = policy(&args.output, cfg);
    let opts = whyslow_pipeline::InputOptions {
        steps: args.window.steps,
        keep_traces: args.perfetto.is_some(),
    };
    let bar: std::sync::Mutex<Option<ProgressBar>> = std::sync::Mutex::new(None);
    let progress = |p: whyslow_pipeline::Progress| {
        let Ok(mut bar) = bar.lock() else { return };
        match p {
            whyslow_pipeline::Progress::Start { what, total } => {
                *bar = Some(progress_bar(total, what))
            }
            whyslow_pipeline::Progress::Tick => {
                if let Some(b) = bar.as_ref() {
                    b.inc(1)
                }
            }
            whyslow_pipeline::Progress::Finish => {
                if let Some(b) = bar.take() {
                    b.finish_and_clear()
                }
            }
        }
    };
    let done = whyslow_pipeline::analyze_inputs(&args.inputs, &policy, &opts, &progress)?;
    for w in &done.input_warnings {
        warn(w);
    }
    if let Some(dir) = &args.fingerprints_out {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for fp in &done.fingerprints {
            let path = dir.join(format!("rank-{}.fingerprint.json", fp.worker));
            whyslow_ingest::write_fingerprint(&path, fp)?;
        }
    }
    let said: Vec<String> = done.input_warnings.clone();
    let perfetto = args.perfetto.clone().map(|p| (p, done.traces));
    write_report(done.report, &said, &args.output, perfetto)
}

/// `file` as a link from the page at `page`: relative when both are in the
/// same directory, else absolute.
fn relative_to(file: &Path, page: &Path) -> String {
    let dir = |p: &Path| {
        p.parent()
            .map(|d| d.to_path_buf())
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."))
    };
    match (fs::canonicalize(dir(file)), fs::canonicalize(dir(page))) {
        (Ok(a), Ok(b)) if a == b => file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        (Ok(a), _) => a
            .join(file.file_name().unwrap_or_default())
            .display()
            .to_string(),
        _ => file.display().to_string(),
    }
}

fn summarize(args: SummarizeArgs) -> Result<u8> {
    let trace = whyslow_ingest::read_worker_trace(&args.trace)?;
    for w in &trace.warnings {
        warn(&format!("{}: {w}", args.trace.display()));
    }
    let samples = match &args.samples {
        Some(p) => whyslow_ingest::read_samples(p)?.series,
        None => BTreeMap::new(),
    };
    let opts = SummarizeOptions {
        steps: args.window.steps,
        ..SummarizeOptions::default()
    };
    let fp = whyslow_summarize::summarize(&trace, &samples, &opts);
    if args.output.as_os_str() == "-" {
        let mut out = io::stdout().lock();
        serde_json::to_writer(&mut out, &fp)?;
        writeln!(out)?;
    } else {
        whyslow_ingest::write_fingerprint(&args.output, &fp)?;
        eprintln!(
            "whyslow: rank {}: {} functions on the critical path over {:.3} s -> {}",
            fp.worker,
            fp.functions.len(),
            fp.window_us / 1e6,
            args.output.display()
        );
    }
    Ok(0)
}

/// Fingerprint files read in parallel at a time by `localize`.
const READ_CHUNK: usize = 4096;

fn localize(args: LocalizeArgs) -> Result<u8> {
    let cfg = load_config(args.output.config.as_deref())?;
    let files = whyslow_ingest::discover(&args.fingerprints)?;
    let mut warnings = Vec::new();
    let paths: Vec<PathBuf> = files
        .into_iter()
        .filter_map(|f| match f {
            InputFile::Fingerprint(p) => Some(p),
            _ => None,
        })
        .collect();
    if paths.is_empty() {
        bail!(
            "no fingerprints (*.fingerprint.json) in {}",
            display_paths(&args.fingerprints)
        );
    }
    let bar = progress_bar(paths.len(), "reading fingerprints");
    // Read in parallel a chunk at a time, each fingerprint into the job's
    // compact form in input order as it comes: a million workers'
    // fingerprints are never all in memory at once.
    let mut fps = whyslow_pipeline::JobFingerprints::with_capacity(paths.len());
    for chunk in paths.chunks(READ_CHUNK) {
        let results: Vec<_> = chunk
            .par_iter()
            .map(|p| {
                let r = whyslow_ingest::read_fingerprint(p);
                bar.inc(1);
                r
            })
            .collect();
        for r in results {
            match r {
                Ok(fp) => fps.push(fp),
                Err(e) => skip_or_fail(args.output.strict, e, &mut warnings)?,
            }
        }
    }
    bar.finish_and_clear();
    localize_and_report(fps, cfg, &args.output, &args.fingerprints, warnings)
}

/// The job policy the command line asks for (`--world-size`, `--strict`,
/// `--source-root` and the working directory for excerpts).
fn policy(out: &OutputArgs, localize: LocalizeConfig) -> whyslow_pipeline::JobPolicy {
    let mut roots = out.source_root.clone();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    whyslow_pipeline::JobPolicy {
        localize,
        world_size: out.world_size,
        strict: out.strict,
        source_roots: Some(roots),
    }
}

/// Judges the fingerprints through the job pipeline (the same call as the
/// server's and the Python package's) and writes the report.
fn localize_and_report(
    fps: whyslow_pipeline::JobFingerprints,
    cfg: LocalizeConfig,
    out: &OutputArgs,
    inputs: &[PathBuf],
    warnings: Vec<String>,
) -> Result<u8> {
    if fps.is_empty() {
        bail!(
            "no input could be read in {}{}",
            display_paths(inputs),
            if warnings.is_empty() {
                String::new()
            } else {
                format!(": {}", warnings.join("; "))
            }
        );
    }
    let said = warnings.clone();
    let evidence = whyslow_pipeline::JobEvidence {
        fingerprints: fps,
        warnings,
        ..Default::default()
    };
    let report = whyslow_pipeline::analyze_job(evidence, &policy(out, cfg))?;
    write_report(report, &said, out, None)
}

/// `--verify-fix`: the proposed patch against the user's command, in
/// scratch copies of the first source root; a line per run on stderr.
fn verify_fix(patch: Option<&str>, out: &OutputArgs) -> whyslow_model::fix::FixVerification {
    let root = out
        .source_root
        .first()
        .cloned()
        .unwrap_or_else(|| PathBuf::from("."));
    let args = whyslow_pipeline::verify::VerifyArgs {
        root: &root,
        command: &out.verify_command,
        runs: out.verify_runs,
        run_timeout_s: out.verify_timeout,
    };
    let v =
        whyslow_pipeline::verify::verify(patch, &args, &mut |line| eprintln!("whyslow: {line}"));
    if !v.faster {
        warn(&format!(
            "--verify-fix: {}",
            v.detail.as_deref().unwrap_or("not faster")
        ));
    }
    v
}

/// Shows the pipeline's warnings (those not `said` already) and writes the
/// report where `out` asks, with the Perfetto file of the flagged spans.
fn write_report(
    mut report: Report,
    said: &[String],
    out: &OutputArgs,
    perfetto: Option<(PathBuf, Vec<WorkerTrace>)>,
) -> Result<u8> {
    for w in report.warnings.iter().filter(|w| !said.contains(w)) {
        warn(w);
    }
    let extras = ReportExtras { perfetto };

    let mut written = Vec::new();
    if out.suggest_fix {
        anyhow::ensure!(
            out.llm_timeout.is_finite() && out.llm_timeout > 0.0,
            "--llm-timeout {}: want seconds > 0",
            out.llm_timeout
        );
        anyhow::ensure!(
            !out.verify_fix || !out.verify_command.is_empty(),
            "--verify-fix needs the command to rerun after `--` (e.g. -- python train.py --iters 60)"
        );
        anyhow::ensure!(
            out.verify_command.is_empty() || out.verify_fix,
            "a command after `--` is only run with --verify-fix"
        );
        anyhow::ensure!(
            out.verify_timeout.is_finite() && out.verify_timeout > 0.0 && out.verify_runs > 0,
            "--verify-runs {} / --verify-timeout {}: want at least one run and seconds > 0",
            out.verify_runs,
            out.verify_timeout
        );
        let args = whyslow_pipeline::suggest::SuggestArgs {
            dry_run: out.dry_run,
            timeout_s: out.llm_timeout,
            roots: &out.source_root,
            max_code_bytes: out.max_code_bytes,
            max_tokens: out.llm_max_tokens,
        };
        match whyslow_pipeline::suggest::suggest(&mut report, &args) {
            whyslow_pipeline::suggest::Outcome::DryRun(body) => {
                println!("{body}");
                eprintln!("whyslow: --dry-run: the request above was not sent");
                return Ok(0);
            }
            whyslow_pipeline::suggest::Outcome::Asked(patch) => {
                if let Some(e) = &report.fix_error {
                    warn(&format!("no fix proposal: {e}"));
                }
                if let (true, Some(fix)) = (out.verify_fix, report.fix.as_mut()) {
                    fix.verified = Some(verify_fix(patch.as_deref(), out));
                }
                // Beside a report the user asked for, never into the
                // working directory unasked.
                let report_file = out.json.as_ref().or(out.html.as_ref());
                if let (Some(p), Some(file)) = (patch, report_file) {
                    let dir = file
                        .parent()
                        .filter(|d| !d.as_os_str().is_empty())
                        .map(Path::to_path_buf)
                        .unwrap_or_else(|| PathBuf::from("."));
                    let path = dir.join("fix.patch");
                    fs::write(&path, p).with_context(|| format!("writing {}", path.display()))?;
                    written.push(format!("the proposed patch {}", path.display()));
                }
            }
        }
    }
    if let Some((path, traces)) = &extras.perfetto {
        fs::write(path, whyslow_report::render_perfetto(&report, traces))
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(format!("Perfetto trace {}", path.display()));
    }
    if let Some(path) = &out.html {
        let opts = whyslow_report::HtmlOptions {
            perfetto_file: extras.perfetto.as_ref().map(|(p, _)| relative_to(p, path)),
            diagnosis_file: None,
        };
        fs::write(path, whyslow_report::render_html_with(&report, &opts))
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(format!("HTML report {}", path.display()));
    }
    if let Some(path) = &out.json {
        fs::write(path, whyslow_report::render_json(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        written.push(format!("JSON report {}", path.display()));
    }
    let mut stdout = io::stdout().lock();
    match out.format {
        Format::Json => writeln!(stdout, "{}", whyslow_report::render_json(&report))?,
        Format::Table => {
            let color = !out.no_color && io::stdout().is_terminal();
            write!(stdout, "{}", whyslow_report::render_table(&report, color))?;
        }
    }
    stdout.flush()?;
    if !written.is_empty() {
        eprintln!("whyslow: wrote {}", written.join(", "));
    }
    Ok(exit_code(&report, out.fail_on_anomaly))
}

/// The traces, when a Perfetto file of the flagged spans is asked for.
struct ReportExtras {
    perfetto: Option<(PathBuf, Vec<WorkerTrace>)>,
}

fn exit_code(report: &Report, fail_on_anomaly: bool) -> u8 {
    if report.verdict == Verdict::CouldNotJudge {
        4
    } else if fail_on_anomaly && !report.findings.is_empty() {
        3
    } else {
        0
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
