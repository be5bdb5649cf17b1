//! `whyslow profile`: CPU stack profiles of running processes (perf
//! events and DWARF unwinding, or eBPF): the node's part of the command
//! line (feature `node`, left out of the Python wheel).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use whyslow_model::stack::StackProfile;
use whyslow_stack_output as out;

use crate::profile::{format_of, Format};

/// `whyslow profile`.
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// Process to profile (all its threads; it is never stopped or ptraced).
    #[arg(long, required_unless_present_any = ["all", "cgroup"])]
    pid: Option<i32>,
    /// Every process of the host (eBPF engine).
    #[arg(long, conflicts_with_all = ["pid", "cgroup"])]
    all: bool,
    /// Processes in this cgroup directory, e.g. /sys/fs/cgroup/… (eBPF engine;
    /// repeat for several).
    #[arg(long)]
    cgroup: Vec<PathBuf>,
    /// `perf`: user stacks unwound with DWARF from copied stacks, Python
    /// frames stitched in (one process). `ebpf`: stacks taken, unwound and
    /// counted in the kernel (user stacks per --unwind, kernel stacks; any
    /// process set, a fraction of the cost; no Python frames). Default: perf
    /// for --pid, ebpf otherwise.
    #[arg(long, value_enum)]
    engine: Option<Engine>,
    /// Percent of ticks that take a stack (eBPF engine; SysOM-AI's sampling
    /// rate, 1–100).
    #[arg(long, default_value_t = 100.0)]
    sampling_rate: f64,
    /// Measure the eBPF program's own run time (the kernel's BPF statistics,
    /// on for every program while profiling) and print it per sample.
    #[arg(long)]
    bpf_stats: bool,
    /// eBPF engine: how user stacks are walked in the kernel. `hybrid`:
    /// DWARF rows compiled from each module's .eh_frame into BPF maps, else
    /// validated frame-pointer steps (SysOM-AI Algorithm 1); `dwarf`: rows
    /// only; `fp`: the kernel's frame-pointer walk.
    #[arg(long, default_value = "hybrid", value_name = "hybrid|dwarf|fp")]
    unwind: whyslow_stacks::ebpf::UserUnwind,
    /// Seconds to sample (Ctrl-C ends earlier and still writes the profile).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Samples per second per thread (10–999).
    #[arg(long, default_value_t = 99)]
    hz: u64,
    /// Bytes of user stack copied per sample (deeper stacks are cut).
    #[arg(long, default_value_t = 16384)]
    stack_bytes: u32,
    /// Keep the interpreter's frames instead of stitching in Python's.
    #[arg(long)]
    no_python: bool,
    /// Output; the format follows the extension: `.folded` (or `.txt`),
    /// `.pb.gz` (pprof), `.svg` (flame graph), `.json` (speedscope).
    #[arg(short, long)]
    output: PathBuf,
}

/// Stack sampling engine of `whyslow profile`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// perf_event with copied user stacks unwound in userspace (DWARF).
    Perf,
    /// An eBPF program that takes and counts stacks in the kernel.
    Ebpf,
}

fn write_profile(profile: &StackProfile, path: &Path, title: &str) -> Result<()> {
    let bytes = match format_of(path)? {
        Format::Folded => out::to_folded(profile).into_bytes(),
        Format::Pprof => out::to_pprof(profile),
        Format::Svg => {
            let opts = out::FlameOptions {
                title: title.to_string(),
                ..Default::default()
            };
            out::to_flamegraph_svg(profile, &opts).into_bytes()
        }
        Format::Speedscope => out::to_speedscope_json(profile).into_bytes(),
    };
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Reads a saved profile (folded or pprof).
/// Runs `whyslow profile`.
pub fn run_profile(args: ProfileArgs) -> Result<u8> {
    if !(10..=999).contains(&args.hz) {
        bail!("--hz {} is outside 10..=999", args.hz);
    }
    format_of(&args.output)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let engine = args.engine.unwrap_or(match args.pid {
        Some(_) => Engine::Perf,
        None => Engine::Ebpf,
    });
    if engine == Engine::Ebpf {
        return run_ebpf_profile(&args, &stop);
    }
    let Some(pid) = args.pid else {
        bail!("--engine perf profiles one process: give --pid");
    };
    let opts = whyslow_stacks::ProfileOptions {
        hz: args.hz,
        duration: Duration::from_secs_f64(args.duration.max(0.0)),
        stack_bytes: args.stack_bytes,
        python: !args.no_python,
    };
    let (profile, stats) = whyslow_stacks::profile_process(pid, &opts, &stop)
        .with_context(|| format!("profiling pid {pid}"))?;
    for m in &stats.unreadable {
        eprintln!("whyslow: note: module not read (its frames stay unnamed): {m}");
    }
    if let Some(py) = &stats.python {
        eprintln!(
            "whyslow: {py}: Python frames stitched into {} samples ({} kept the interpreter's frames: the Python stack had moved on; {} read more than 2 ms after their tick)",
            stats.python_stitched, stats.python_mismatched, stats.python_stale
        );
    }
    if stats.kernel_symbols == 0 {
        eprintln!(
            "whyslow: note: /proc/kallsyms is hidden (kptr_restrict): kernel frames stay unnamed"
        );
    }
    let title = format!(
        "pid {} ({}), {} samples at {} Hz",
        pid,
        profile
            .labels
            .get("command")
            .map(String::as_str)
            .unwrap_or("?"),
        stats.samples,
        args.hz
    );
    write_profile(&profile, &args.output, &title)?;
    eprintln!(
        "whyslow: {} samples of {} threads ({} lost), {} distinct stacks -> {}",
        stats.samples,
        stats.threads,
        stats.lost,
        profile.stacks.len(),
        args.output.display()
    );
    Ok(0)
}

/// `whyslow profile --engine ebpf`.
fn run_ebpf_profile(args: &ProfileArgs, stop: &AtomicBool) -> Result<u8> {
    use whyslow_stacks::ebpf;
    if !(args.sampling_rate > 0.0 && args.sampling_rate <= 100.0) {
        bail!(
            "--sampling-rate {} is outside 1..=100 (percent)",
            args.sampling_rate
        );
    }
    let (target, what) = match (args.pid, args.all) {
        (Some(pid), _) => (ebpf::Target::Pids(vec![pid as u32]), format!("pid {pid}")),
        (None, true) => (ebpf::Target::Host, "all processes".to_string()),
        (None, false) => (
            ebpf::Target::Cgroups(args.cgroup.clone()),
            format!("cgroup {}", args.cgroup[0].display()),
        ),
    };
    let opts = ebpf::EbpfOptions {
        hz: args.hz,
        sampling_rate: args.sampling_rate / 100.0,
        target,
        measure: args.bpf_stats,
        off_cpu: false,
        unwind: args.unwind,
        max_cfi_rows: whyslow_stacks::ebpf::DEFAULT_MAX_CFI_ROWS,
        python: !args.no_python,
    };
    let duration = Duration::from_secs_f64(args.duration.max(0.0));
    let mut unwind = args.unwind;
    let (profile, stats) = match ebpf::profile(&opts, duration, Duration::from_secs(5), stop) {
        // A kernel without bpf_loop or mmap-able arrays (before 5.17) loads
        // the program only without the in-kernel unwinder: say so, go on.
        Err(ebpf::EbpfError::Load(reason)) if unwind != ebpf::UserUnwind::FramePointer => {
            eprintln!(
                "whyslow: in-kernel DWARF unwinding is not available here ({}); user stacks by frame pointers",
                reason.lines().next().unwrap_or("")
            );
            unwind = ebpf::UserUnwind::FramePointer;
            let fp = ebpf::EbpfOptions {
                unwind,
                ..opts.clone()
            };
            ebpf::profile(&fp, duration, Duration::from_secs(5), stop)
        }
        other => other,
    }
    .with_context(|| format!("profiling {what} with eBPF"))?;
    let title = format!(
        "{what}, {} samples at {} Hz (eBPF, {} % of ticks)",
        stats.samples, args.hz, args.sampling_rate
    );
    write_profile(&profile, &args.output, &title)?;
    eprintln!(
        "whyslow: eBPF: {} samples ({} ticks, {} outside the target, {} left out by the sampling rate, {} stack read errors, {} not stored: maps full), {} distinct stacks -> {}",
        stats.samples,
        stats.ticks - stats.idle,
        stats.filtered,
        stats.skipped,
        stats.kernel_stack_errors + stats.user_stack_errors,
        stats.stacks_full + stats.counts_full,
        profile.stacks.len(),
        args.output.display()
    );
    if unwind != ebpf::UserUnwind::FramePointer {
        let u = &stats.unwind;
        eprintln!(
            "whyslow: eBPF {} unwinding: {} modules' rows ({} rows, at most {}; {} loads ({} from the row cache), {} evicted for room, {} put off; {} modules without, {} large or evicted ones not sampled since: not loaded), {} frames from rows, {} from frame pointers; walks: {} to the outermost frame, {} at a gap in the rows, {} at an unsupported rule ({} finished in userspace on a copied stack with {} more frames, {} not copied: ring buffer full), {} at a bad return address, {} at unreadable memory, {} cut at the depth limit, {} before the process's tables were loaded",
            match unwind {
                ebpf::UserUnwind::Dwarf => "DWARF",
                _ => "hybrid",
            },
            stats.tables.modules,
            stats.tables.rows,
            stats.tables.peak_rows,
            stats.tables.loads,
            stats.tables.cached_loads,
            stats.tables.evictions,
            stats.tables.deferred,
            stats.tables.modules_without_rows,
            stats.tables.modules_waiting,
            u.dwarf_steps,
            u.fp_steps,
            u.complete,
            u.no_cfi,
            u.unsupported,
            u.fallback.walks,
            u.fallback.frames,
            u.copy_lost,
            u.bad_address,
            u.read_errors,
            u.truncated,
            u.not_loaded
        );
    }
    if stats.python_processes > 0 {
        let p = &stats.python;
        eprintln!(
            "whyslow: eBPF Python frames: {} CPython processes walked; {} samples with a Python stack: {} stitched in place of the interpreter's frames, {} put at the root (the native walk stopped early), {} kept the interpreter's frames",
            stats.python_processes, p.samples, p.stitched, p.rooted, p.kept
        );
    }
    if args.bpf_stats && stats.runs > 0 {
        eprintln!(
            "whyslow: eBPF program: {} runs, {:.2} ms in the kernel, {:.2} µs per run",
            stats.runs,
            stats.run_time_ns as f64 / 1e6,
            stats.run_time_ns as f64 / stats.runs as f64 / 1e3
        );
    }
    Ok(0)
}
