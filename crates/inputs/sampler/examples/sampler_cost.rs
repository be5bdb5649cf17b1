//! The sampler's own cost (issue 4 item 1): samples this process at 1 kHz and
//! 10 kHz for 5 s each (CPU of every thread, plus `lo` as a NIC) and reports
//! the sampler thread's CPU use, read from its own
//! `/proc/self/task/TID/schedstat` (and, as a cross-check, from
//! `CLOCK_THREAD_CPUTIME_ID` inside the thread).
//!
//! Run: `cargo run --release -p whyslow-sampler --example sampler_cost
//! [-- SECONDS [EXTRA_THREADS...]]` (defaults: 5 s; 0 and 32 extra idle
//! threads, as a PyTorch process has dozens of threads and each costs one
//! `pread` per sample).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use whyslow_sampler::{NetInterface, Sampler, SamplerConfig};

fn schedstat_ns(tid: i32) -> Option<i64> {
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    s.split_ascii_whitespace().next()?.parse().ok()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: f64 = args.first().map(|s| s.parse()).transpose()?.unwrap_or(5.0);
    let extras: Vec<usize> = if args.len() > 1 {
        args[1..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![0, 32]
    };
    println!(
        "{:>9} {:>8} {:>8} {:>10} {:>9} {:>12} {:>12}",
        "rate_hz", "threads", "ticks", "achieved", "overruns", "cpu%_sched", "cpu%_clock"
    );
    for &extra in &extras {
        let stop = Arc::new(AtomicBool::new(false));
        let idle: Vec<_> = (0..extra)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                })
            })
            .collect();
        for rate_hz in [1000.0, 10_000.0] {
            let s = Sampler::start(SamplerConfig {
                rate_hz,
                pid: Some(std::process::id() as i32),
                interfaces: vec![NetInterface::with_capacity_mbit("lo", 100_000.0)],
                gpu: false,
                ..Default::default()
            })?;
            let tid = s.thread_id();
            let c0 = schedstat_ns(tid).ok_or("no schedstat for the sampler thread")?;
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(secs));
            let c1 = schedstat_ns(tid).ok_or("no schedstat for the sampler thread")?;
            let wall = t0.elapsed().as_nanos() as f64;
            let out = s.stop()?;
            println!(
                "{:>9} {:>8} {:>8} {:>10.0} {:>9} {:>11.2}% {:>11.2}%",
                rate_hz,
                out.threads.len(),
                out.stats.ticks,
                out.stats.achieved_hz(),
                out.stats.overruns,
                100.0 * (c1 - c0) as f64 / wall,
                100.0 * out.stats.sampler_cpu_fraction()
            );
        }
        stop.store(true, Ordering::Relaxed);
        idle.into_iter().for_each(|h| h.join().unwrap());
    }
    Ok(())
}
