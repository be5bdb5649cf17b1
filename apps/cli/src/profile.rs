//! `whyslow flamegraph` (render, or diff, saved profiles) and the profile
//! formats `whyslow profile` writes (`crate::record`). SysOM-AI §3.3–§3.4
//! and Fig. 6–7.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;

use whyslow_model::stack::StackProfile;
use whyslow_stack_output as out;

/// `whyslow flamegraph`.
#[derive(Args, Debug)]
pub struct FlamegraphArgs {
    /// Profiles (`.folded`/`.txt` or `.pb.gz`); several are merged.
    #[arg(required = true)]
    profiles: Vec<PathBuf>,
    /// A baseline profile: draw a differential flame graph (red: share grew,
    /// blue: shrank).
    #[arg(long)]
    diff: Option<PathBuf>,
    /// Title of the graph.
    #[arg(long)]
    title: Option<String>,
    /// Root at the top (icicle graph).
    #[arg(long)]
    icicle: bool,
    /// Output SVG.
    #[arg(short, long)]
    output: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    Folded,
    Pprof,
    Svg,
    Speedscope,
}

pub(crate) fn format_of(path: &Path) -> Result<Format> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    Ok(if name.ends_with(".folded") || name.ends_with(".txt") {
        Format::Folded
    } else if name.ends_with(".pb.gz") || name.ends_with(".pb") || name.ends_with(".pprof") {
        Format::Pprof
    } else if name.ends_with(".svg") {
        Format::Svg
    } else if name.ends_with(".json") {
        Format::Speedscope
    } else {
        bail!(
            "{}: unknown profile format (use .folded, .pb.gz, .svg or .json)",
            path.display()
        )
    })
}

pub fn read_profile(path: &Path) -> Result<StackProfile> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    match format_of(path)? {
        Format::Folded => {
            let text = String::from_utf8(bytes)
                .map_err(|_| anyhow::anyhow!("{}: not UTF-8 text", path.display()))?;
            out::parse_folded(&text).with_context(|| format!("{}", path.display()))
        }
        Format::Pprof => out::from_pprof(&bytes).with_context(|| format!("{}", path.display())),
        other => bail!(
            "{}: {other:?} profiles cannot be read back (use .folded or .pb.gz)",
            path.display()
        ),
    }
}

/// One profile holding the stacks of `profiles`.
pub(crate) fn merge<'a>(profiles: impl IntoIterator<Item = &'a StackProfile>) -> StackProfile {
    StackProfile::merged(profiles)
}

/// Runs `whyslow flamegraph`.
pub fn run_flamegraph(args: FlamegraphArgs) -> Result<u8> {
    let profiles = args
        .profiles
        .iter()
        .map(|p| read_profile(p))
        .collect::<Result<Vec<_>>>()?;
    let new = merge(&profiles);
    let opts = out::FlameOptions {
        title: args.title.clone().unwrap_or_else(|| match &args.diff {
            Some(b) => format!("{} vs. {}", args.profiles[0].display(), b.display()),
            None => args.profiles[0].display().to_string(),
        }),
        icicle: args.icicle,
        ..Default::default()
    };
    let svg = match &args.diff {
        Some(base) => out::to_diff_flamegraph_svg(&read_profile(base)?, &new, &opts),
        None => out::to_flamegraph_svg(&new, &opts),
    };
    std::fs::write(&args.output, svg)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "whyslow: {} samples, {} stacks -> {}",
        new.total(),
        new.stacks.len(),
        args.output.display()
    );
    Ok(0)
}
