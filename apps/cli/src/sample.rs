//! `whyslow sample`: hardware utilization of a running training process,
//! written as a samples file that `analyze` / `summarize` pair with the
//! worker's trace (PerfTracker §4.1–§4.2: μ and σ from samples taken during
//! the profiling window). Runs as a sidecar next to an unprivileged job.

use std::path::PathBuf;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use whyslow_sampler::{NetInterface, Sampler, SamplerConfig, TimeBase};

#[derive(Args, Debug)]
pub struct SampleArgs {
    /// Process to sample (the training process of one rank).
    #[arg(long)]
    pid: i32,
    /// The training thread (default: the process's main thread).
    #[arg(long)]
    tid: Option<i32>,
    /// Samples per second (1 to 10000).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Stop after this many seconds (default: until Ctrl-C or the process ends).
    #[arg(long, value_name = "SECONDS")]
    duration: Option<f64>,
    /// Network interface to sample, optionally with its capacity in Mbit/s
    /// (`eth0`, `veth1:1000`); repeatable.
    #[arg(long = "interface", value_name = "IF[:MBIT]")]
    interfaces: Vec<String>,
    /// The trace's `baseTimeNanoseconds`, so timestamps share its origin (newer PyTorch).
    #[arg(long, value_name = "NS")]
    kineto_base_ns: Option<i64>,
    /// Rank of the worker, written as the `worker` column.
    #[arg(long)]
    worker: Option<u32>,
    /// Samples file to write (name it `rank-N.samples.csv` to pair it by name);
    /// the extra file (per-thread CPU, CPU frequency, …) goes next to it as
    /// `rank-N.sampler-extra.csv`.
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
}

pub(crate) fn parse_interface(spec: &str) -> Result<NetInterface> {
    Ok(spec.parse()?)
}

/// Samples until the duration ends, Ctrl-C, or the process exits.
pub fn run(args: SampleArgs) -> Result<u8> {
    if !(1.0..=10_000.0).contains(&args.rate) {
        bail!("--rate {} is outside 1..=10000", args.rate);
    }
    let cfg = SamplerConfig {
        rate_hz: args.rate,
        pid: Some(args.pid),
        training_tid: args.tid,
        interfaces: args
            .interfaces
            .iter()
            .map(|s| parse_interface(s))
            .collect::<Result<_>>()?,
        time_base: match args.kineto_base_ns {
            Some(base_ns) => TimeBase::KinetoBase { base_ns },
            None => TimeBase::UnixEpoch,
        },
        ..SamplerConfig::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let sampler = Sampler::start(cfg).with_context(|| format!("sampling pid {}", args.pid))?;
    let until = args
        .duration
        .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0)));
    let proc_dir = PathBuf::from(format!("/proc/{}", args.pid));
    while !stop.load(Ordering::SeqCst)
        && until.is_none_or(|u| Instant::now() < u)
        && proc_dir.exists()
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let samples = sampler.stop()?;
    whyslow_sampler::write_samples_csv(&args.output, args.worker, &samples.series)
        .with_context(|| format!("writing {}", args.output.display()))?;
    // Per-thread CPU, per-interface tx/rx, CPU frequency, GPU extras.
    let extra = whyslow_sampler::extra_path_for(&args.output);
    whyslow_sampler::write_extra_csv(&extra, args.worker, &samples)
        .with_context(|| format!("writing {}", extra.display()))?;
    for note in &samples.notes {
        eprintln!("whyslow: note: {note}");
    }
    let s = &samples.stats;
    eprintln!(
        "whyslow: {} ticks at {:.0} Hz ({} overruns), sampler CPU {:.2}% -> {}",
        s.ticks,
        s.achieved_hz(),
        s.overruns,
        100.0 * s.sampler_cpu_ns as f64 / s.elapsed_ns.max(1) as f64,
        args.output.display()
    );
    Ok(0)
}
