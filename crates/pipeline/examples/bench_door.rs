//! Benchmark of localization through the doors' path (PerfTracker §4.3 at
//! the scale of a million workers): W workers × F functions of synthetic
//! fingerprints are received one at a time, as a door receives them, into
//! [`whyslow_pipeline::JobEvidence`], and judged by
//! [`whyslow_pipeline::analyze_job`] (the call the CLI, the server and the
//! Python package make).
//!
//! Modes: `values` hands each [`Fingerprint`] value to the evidence as
//! it is made (a loader that has parsed it); `json` serializes each one to
//! a JSON line and parses it back with `whyslow_ingest::parse_fingerprint`
//! first (what the server does with a stored fingerprint, the CLI with a
//! file). Values carry 3 % jitter (not `f32`-exact), a few injected
//! outliers that must be found exactly; every worker has its own source
//! name, a host per 8 workers and the job's identity.
//!
//! ```text
//! cargo build --release -p whyslow-pipeline --example bench_door
//! /usr/bin/time -v target/release/examples/bench_door [workers] [functions] [values|json] [steps] [sized]
//! ```
//!
//! `sized`: the evidence is made for the number of workers
//! ([`whyslow_pipeline::JobFingerprints::with_capacity`], as the CLI's
//! `localize`, the server and the Python package make it, knowing how many
//! fingerprints they hold); otherwise it grows as they come.
//!
//! Prints, per phase (receiving: making, [serializing, parsing,] handing
//! over; judging: `analyze_job`), wall and CPU time and the peak RSS so far.
//!
//! Measured on a shared 2-core machine (load ≈ 4–5), 1 M × 20, `values`:
//! `analyze_job` 2.1–2.6 s CPU, peak RSS 0.87 GB for the whole process;
//! before the evidence was columnar (a `Vec<Fingerprint>` localized by
//! `localize`), 11–12 s CPU and 4.35 GB. `json`: parsing 5.7 GB of JSON
//! lines takes ~46 s CPU, the peak RSS stays 0.87 GB.

use std::time::Instant;

use whyslow_model::rng::SplitMix64;
use whyslow_model::{
    Fingerprint, FunctionKind, FunctionPattern, JobIdentity, Resource, UtilizationSource,
    FINGERPRINT_FORMAT, FINGERPRINT_VERSION,
};
use whyslow_pipeline::{analyze_job, JobEvidence, JobPolicy};

/// This process's CPU time (user + system) in seconds, from /proc (Linux).
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|s| s.parse::<f64>().ok());
    match (tick(11), tick(12)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

/// Peak resident memory so far (VmHWM), GB.
fn peak_rss_gb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb * 1024.0 / 1e9)
}

/// The synthetic job: base functions and the injected outliers.
struct Job {
    workers: usize,
    base: Vec<(FunctionKind, Resource, String, f64, f64, f64)>,
    gemm: usize,
    gemm_outlier: u32,
    comm: usize,
    comm_outliers: Vec<u32>,
    gc_workers: Vec<u32>,
    steps: usize,
}

const GC_NAME: &str = "train.py(120): main;gradmode.py(80): __init__";

impl Job {
    fn new(workers: usize, nfun: usize, steps: usize, rng: &mut SplitMix64) -> Self {
        let base = (0..nfun)
            .map(|i| match i % 10 {
                0..=5 => (
                    FunctionKind::GpuKernel,
                    Resource::Sm,
                    format!("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_{i}"),
                    0.6 / nfun as f64 * 2.0,
                    0.7,
                    0.1,
                ),
                6 | 7 => (
                    FunctionKind::Comm,
                    Resource::Nic,
                    format!("ncclDevKernel_AllReduce_Sum_bf16_RING_LL_{i}"),
                    0.1,
                    0.55,
                    0.3,
                ),
                8 => (
                    FunctionKind::Memory,
                    Resource::Pcie,
                    format!("Memcpy HtoD (Pinned -> Device) {i}"),
                    0.02,
                    0.4,
                    0.1,
                ),
                _ => (
                    FunctionKind::Python,
                    Resource::Cpu,
                    format!("train.py(120): main;engine.py(88): train_step;model.py({i}): forward"),
                    0.005,
                    0.9,
                    0.05,
                ),
            })
            .collect();
        let mut gc_workers: Vec<u32> = (0..3)
            .map(|_| (rng.next_u64() % workers as u64) as u32)
            .collect();
        gc_workers.sort_unstable();
        gc_workers.dedup();
        Self {
            workers,
            base,
            gemm: 3,
            gemm_outlier: (workers as u32) / 8 + 1,
            comm: 6,
            comm_outliers: (0..5).map(|i| (workers as u32) / 2 + i).collect(),
            gc_workers,
            steps,
        }
    }

    /// Worker `w`'s fingerprint.
    fn fingerprint(&self, w: u32, rng: &mut SplitMix64) -> Fingerprint {
        let window_us = 20e6;
        let mut functions = Vec::with_capacity(self.base.len() + 1);
        for (i, (kind, resource, name, b, m, s)) in self.base.iter().enumerate() {
            let mut beta = b * (1.0 + 0.03 * rng.symmetric());
            let mut mu = m * (1.0 + 0.03 * rng.symmetric());
            let mut sigma = s * (1.0 + 0.03 * rng.symmetric());
            if i == self.gemm && w == self.gemm_outlier {
                beta *= 3.0;
            }
            if i == self.comm && self.comm_outliers.contains(&w) {
                mu = 0.25;
                sigma = 0.03;
            }
            functions.push(FunctionPattern {
                name: name.clone(),
                kind: *kind,
                resource: *resource,
                beta,
                mu,
                sigma,
                util_source: UtilizationSource::Samples,
                calls: 100,
                critical_us: beta * window_us,
                total_us: beta * window_us * 1.25,
            });
        }
        if self.gc_workers.contains(&w) {
            functions.push(FunctionPattern {
                name: GC_NAME.to_string(),
                kind: FunctionKind::Python,
                resource: Resource::Cpu,
                beta: 0.05,
                mu: 0.3,
                sigma: 0.1,
                util_source: UtilizationSource::Samples,
                calls: 1,
                critical_us: 1e6,
                total_us: 1e6,
            });
        }
        Fingerprint {
            format: FINGERPRINT_FORMAT.to_string(),
            version: FINGERPRINT_VERSION,
            worker: w,
            host: Some(format!("node{:06}", w / 8)),
            group: None,
            window_start_us: 0.0,
            window_us,
            device: Some("NVIDIA H100 80GB HBM3".to_string()),
            job: Some(JobIdentity {
                id: Some("bench".to_string()),
                world_size: Some(self.workers as u32),
                backend: Some("nccl".to_string()),
                ..JobIdentity::default()
            }),
            utilization_source: UtilizationSource::Samples,
            source: format!("traces/rank-{w}.pt.trace.json"),
            functions,
            total_floor: 0.0,
            omitted: Vec::new(),
            warnings: Vec::new(),
            network: None,
            kernels: Vec::new(),
            steps: (0..self.steps as u64)
                .map(|s| (s + 10, 2000.0 * (1.0 + 0.01 * rng.symmetric())))
                .collect(),
        }
    }

    /// Whether the report names exactly the injected outliers.
    fn check(&self, report: &whyslow_model::Report) -> bool {
        let expect = [
            (self.base[self.gemm].2.as_str(), vec![self.gemm_outlier]),
            (self.base[self.comm].2.as_str(), self.comm_outliers.clone()),
            (GC_NAME, self.gc_workers.clone()),
        ];
        let mut ok = report.findings.len() == expect.len();
        for (name, ws) in &expect {
            match report.findings.iter().find(|f| f.function == *name) {
                Some(f) if &f.workers == ws => {}
                other => {
                    ok = false;
                    eprintln!(
                        "MISMATCH for {name}: expected {ws:?}, got {:?}",
                        other.map(|f| &f.workers)
                    );
                }
            }
        }
        ok
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: usize| {
        args.get(i)
            .and_then(|a| a.replace('_', "").parse().ok())
            .unwrap_or(default)
    };
    let workers = num(0, 1_000_000).max(10);
    let nfun = num(1, 20).max(8);
    let json = args.get(2).is_some_and(|m| m == "json");
    let steps = num(3, 0);
    let mut rng = SplitMix64::new(42);
    let job = Job::new(workers, nfun, steps, &mut rng);

    let (t0, c0) = (Instant::now(), cpu_seconds());
    let mut evidence = JobEvidence::default();
    if args.get(4).is_some_and(|a| a == "sized") {
        evidence.fingerprints = whyslow_pipeline::JobFingerprints::with_capacity(workers);
    }
    let mut bytes = 0usize;
    for w in 0..workers as u32 {
        let fp = job.fingerprint(w, &mut rng);
        let fp = if json {
            let line = serde_json::to_string(&fp).expect("serialize");
            bytes += line.len() + 1;
            drop(fp);
            whyslow_ingest::parse_fingerprint(line.as_bytes(), std::path::Path::new("bench"))
                .expect("parse")
        } else {
            fp
        };
        evidence.fingerprints.push(fp);
    }
    let (t1, c1) = (Instant::now(), cpu_seconds());
    println!(
        "received {workers} workers x {nfun} functions ({}): wall {:.2} s, CPU {:.2} s, peak RSS so far {:.3} GB",
        if json {
            format!("JSON lines, {:.2} GB, serialized, parsed and handed over", bytes as f64 / 1e9)
        } else {
            "Fingerprint values made and handed over".to_string()
        },
        (t1 - t0).as_secs_f64(),
        c1 - c0,
        peak_rss_gb()
    );
    let report = match analyze_job(evidence, &JobPolicy::default()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("refused: {e}");
            std::process::exit(2);
        }
    };
    let (t2, c2) = (Instant::now(), cpu_seconds());
    println!(
        "analyze_job (localization and the job policy): wall {:.2} s, CPU {:.2} s, peak RSS so far {:.3} GB",
        (t2 - t1).as_secs_f64(),
        c2 - c1,
        peak_rss_gb()
    );
    for f in &report.findings {
        let shown: Vec<u32> = f.workers.iter().copied().take(8).collect();
        println!(
            "  finding: {} [{:?}] workers {:?}{} β {:.3} vs {:.3}",
            f.function,
            f.reason,
            shown,
            if f.workers.len() > 8 { " …" } else { "" },
            f.beta.value,
            f.beta.peers
        );
    }
    for w in report.warnings.iter().take(5) {
        println!("  warning: {w}");
    }
    let ok = job.check(&report);
    println!(
        "injected outliers found exactly: {}",
        if ok { "yes" } else { "NO" }
    );
    if !ok {
        std::process::exit(1);
    }
}
