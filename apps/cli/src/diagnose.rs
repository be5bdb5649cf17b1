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

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use whyslow_diagnose::{DiagnoseConfig, DiagnoseError};

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
    /// Also write what changed: the differential flame graph (SVG) of the
    /// window against the baseline, CPU profiles of the group with a
    /// regression, else of the job's ranks (the server's `diff.svg` draws
    /// the same)
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

fn write(path: &Path, body: &[u8]) -> Result<()> {
    std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))
}

/// Runs `whyslow diagnose`: reads the spool, calls the diagnosis library
/// (the same call as the server's and the Python package's), writes it.
pub fn run(args: DiagnoseArgs) -> Result<u8> {
    let spool = whyslow_spool::read_spool(&args.dir)?;
    let mut evidence = spool.evidence;
    if !args.fingerprints.is_empty() {
        evidence.fingerprints = Some(whyslow_pipeline::read_fingerprints(
            &args.fingerprints,
            &mut evidence.notes,
        )?);
    }
    let range = |s: &Option<String>, what| {
        s.as_deref()
            .map(|s| whyslow_diagnose::parse_range(s, what))
            .transpose()
    };
    let cfg = DiagnoseConfig {
        baseline: range(&args.baseline, "baseline")?,
        window: range(&args.window, "window")?,
        until: args.until,
    };
    let d = match whyslow_diagnose::diagnose(&evidence, &cfg) {
        Ok(d) => d,
        Err(e @ DiagnoseError::NothingToDiagnose) => bail!(
            "{}: {e} ({} profile file(s) read)",
            args.dir.display(),
            spool.profile_files
        ),
        Err(e) => return Err(e.into()),
    };
    if let Some(svg) = &args.diff_svg {
        match d.what_changed(whyslow_diagnose::ProfileKind::Cpu) {
            None => eprintln!(
                "whyslow: --diff-svg {}: not written: no rank profiles to draw a flame graph from",
                svg.display()
            ),
            Some(pair) => {
                write(
                    svg,
                    whyslow_stack_output::diff_flamegraph(pair).svg.as_bytes(),
                )?;
                eprintln!(
                    "whyslow: wrote the differential flame graph {}",
                    svg.display()
                );
            }
        }
    }
    if let Some(path) = &args.html {
        let page = whyslow_stack_output::diagnosis_html(
            &format!("whyslow diagnose {}", args.dir.display()),
            &d,
        );
        write(path, page.as_bytes())?;
        eprintln!("whyslow: wrote the HTML report {}", path.display());
    }
    let text = match args.format {
        Format::Json => {
            let mut t = serde_json::to_vec_pretty(&d.report)?;
            t.push(b'\n');
            t
        }
        Format::Table => whyslow_stack_output::diagnosis_table(&d.report).into_bytes(),
    };
    match &args.output {
        Some(path) => write(path, &text)?,
        None => std::io::Write::write_all(&mut std::io::stdout().lock(), &text)?,
    }
    Ok(0)
}
