//! `whyslow hang DIR`: names the ranks a hung job waits for, from what the
//! ranks left in DIR: PyTorch Flight Recorder dumps (pickle or JSON),
//! whyslow's stack files (`stacks-rank<r>.json`, `blocked-rank<r>-*.txt`)
//! and agent collective records (`*.collectives.jsonl`). Glue only: the
//! verdict is `whyslow_pipeline::analyze_hang_dir`, the same call as the
//! online package's.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

/// `whyslow hang`.
#[derive(Args, Debug)]
pub struct HangArgs {
    /// What the ranks left (searched recursively).
    dir: PathBuf,
    /// Output on stdout.
    #[arg(long, value_enum, default_value_t = crate::diagnose::Format::Table)]
    format: crate::diagnose::Format,
    /// Also write an HTML page (the waits-for graph, culprits and stacks).
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// A collective counts as hung once pending this long (seconds); default
    /// 5× the iteration period the dumps show, at least 1 s.
    #[arg(long, value_name = "SECONDS")]
    min_wait: Option<f64>,
    /// The job's world size, when some ranks left nothing at all (at most
    /// 4,194,304; ranks that left nothing are reported as ranges).
    #[arg(long)]
    world_size: Option<u32>,
}

/// Runs `whyslow hang`; exit status 0 whether or not the job hangs.
pub fn run(args: HangArgs) -> Result<u8> {
    let cfg = whyslow_hang::HangConfig {
        min_wait_s: args.min_wait,
        world_size: args.world_size,
    };
    let report = whyslow_pipeline::analyze_hang_dir(&args.dir, &cfg)?;
    if let Some(path) = &args.html {
        let page = whyslow_report::hang::hang_html(
            &format!("whyslow hang {}", args.dir.display()),
            &report,
        );
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("whyslow: wrote the HTML report {}", path.display());
    }
    let text = match args.format {
        crate::diagnose::Format::Json => {
            let mut t = serde_json::to_string_pretty(&report)?;
            t.push('\n');
            t
        }
        crate::diagnose::Format::Table => whyslow_report::hang::hang_table(&report),
    };
    std::io::Write::write_all(&mut std::io::stdout().lock(), text.as_bytes())?;
    Ok(0)
}
