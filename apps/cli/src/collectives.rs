//! `whyslow collectives`: the gloo collectives of running processes, and
//! NCCL's calls (the host side) of those that map libnccl, traced with eBPF
//! uprobes (SysOM-AI §3.2), written as collective records (JSON lines) that
//! `whyslow diagnose` reads. The same tracers as the node agent's.

use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use whyslow_collectives::nccl::{nccl_library, NcclSequencer, NcclTracer};
use whyslow_collectives::{gloo_library, GlooTracer, Sequencer};

/// `whyslow collectives` options.
#[derive(Args, Debug)]
pub struct CollectivesArgs {
    /// Process to trace (repeat for several ranks of the host).
    #[arg(long = "pid", required = true, value_name = "PID")]
    pub pids: Vec<u32>,
    /// How long to trace, seconds (Ctrl-C stops earlier).
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub duration: f64,
    /// Job name, the first part of each group's name.
    #[arg(long, default_value = "job")]
    pub job: String,
    /// Output (JSON lines, one collective record per call); stdout if omitted.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `whyslow collectives`.
pub fn run(args: CollectivesArgs) -> Result<u8> {
    let mut tracer = GlooTracer::open()?;
    let mut nccl: Option<NcclTracer> = None;
    for &pid in &args.pids {
        let lib = gloo_library(pid).with_context(|| {
            format!("process {pid}: no library with gloo mapped (is it a PyTorch process that imported torch.distributed?)")
        })?;
        let n = tracer
            .attach(pid, &lib)
            .with_context(|| format!("process {pid}"))?;
        if n == 0 {
            bail!(
                "process {pid}: {} exports no gloo collective",
                lib.display()
            );
        }
        eprintln!(
            "whyslow: tracing {n} gloo collectives of process {pid} in {}",
            lib.display()
        );
        // A GPU job: NCCL's exported calls too.
        if let Some(lib) = nccl_library(pid) {
            if nccl.is_none() {
                nccl = Some(NcclTracer::open().context("the NCCL tracer")?);
            }
            let t = nccl.as_mut().expect("opened above");
            let n = t
                .attach(pid, &lib)
                .with_context(|| format!("process {pid}: {}", lib.display()))?;
            eprintln!(
                "whyslow: tracing {n} NCCL calls of process {pid} in {}",
                lib.display()
            );
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let s = stop.clone();
        let _ = ctrlc::set_handler(move || s.store(true, Ordering::Relaxed));
    }
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(std::io::BufWriter::new(
            fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut seq = Sequencer::with_clock_offset(
        whyslow_sampler::clock::realtime_ns() - whyslow_sampler::clock::monotonic_ns(),
    );
    let mut nccl_seq = NcclSequencer::with_clock_offset(
        whyslow_sampler::clock::realtime_ns() - whyslow_sampler::clock::monotonic_ns(),
    );
    let until = Instant::now() + Duration::from_secs_f64(args.duration.max(0.0));
    let mut written = 0u64;
    loop {
        let done = stop.load(Ordering::Relaxed) || Instant::now() >= until;
        let mut events = tracer.poll(Duration::from_millis(if done { 0 } else { 200 }));
        events.sort_by_key(|e| (e.pid, e.entry_ns));
        for e in &events {
            if std::env::var_os("WHYSLOW_DEBUG_GLOO").is_some() {
                eprintln!("{e:x?}");
            }
            if let Some(r) = seq.record(e, &args.job, None) {
                serde_json::to_writer(&mut out, &r)?;
                out.write_all(b"\n")?;
                written += 1;
            }
        }
        if let Some(t) = nccl.as_mut() {
            let mut events = t.poll(Duration::ZERO);
            events.sort_by_key(|e| (e.pid, e.entry_ns));
            for e in &events {
                if let Some(r) = nccl_seq.record(e, &args.job, None) {
                    serde_json::to_writer(&mut out, &r)?;
                    out.write_all(b"\n")?;
                    written += 1;
                }
            }
        }
        if done {
            break;
        }
    }
    out.flush()?;
    let st = tracer.stats()?;
    let (mut seen, mut lost) = (st.entries, st.ring_full);
    if let Some(t) = nccl.as_ref() {
        let n = t.stats()?;
        seen += n.entries;
        lost += n.ring_full;
    }
    eprintln!(
        "whyslow: {written} collective records ({seen} calls seen, {lost} lost to a full buffer)"
    );
    Ok(0)
}
