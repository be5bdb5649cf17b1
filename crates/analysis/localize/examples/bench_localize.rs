//! Synthetic benchmark of `localize` (PerfTracker §4.3 at scale).
//!
//! Generates W workers × F functions in memory (3% jitter), injects a few
//! outliers, times `localize_table` and checks that exactly the injected
//! outliers are found.
//!
//! The input is built as a [`FingerprintTable`], the most compact form the
//! localizer accepts, as a caller holding a million workers' fingerprints
//! would (a `Vec<Fingerprint>` of 1M × 20 takes ~3.5 GB; the table ~0.45 GB).
//! The doors' whole path (fingerprints received one at a time, then
//! `analyze_job`) is `whyslow-pipeline`'s `bench_door` example.
//! It is the input, so its memory counts in the peak RSS; its building is
//! timed apart from localization ("generated … in"). `localize` on
//! fingerprints runs the same algorithm (see `whyslow_localize::localize`).
//!
//! ```text
//! cargo run --release -p whyslow-localize --example bench_localize -- [workers] [functions] [repeats]
//! ```
//!
//! `repeats = 0` only generates the input (to measure its memory alone).
//!
//! ```text
//! ```
use std::time::Instant;

use whyslow_localize::{
    localize_table, FingerprintTable, LocalizeConfig, TableFunction, TablePattern, TableWorker,
};
use whyslow_model::rng::SplitMix64;
use whyslow_model::{FunctionKind, Resource, UtilizationSource};

/// This process's CPU time (user + system) in seconds, from /proc (Linux);
/// less sensitive than wall time to other load on the machine.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.replace('_', "").parse().ok())
        .collect();
    let workers = args.first().copied().unwrap_or(1_000_000).max(10);
    let nfun = args.get(1).copied().unwrap_or(20).max(4);
    let repeats = args.get(2).copied().unwrap_or(1); // 0: only generate (to measure the input's memory)

    // Base functions: kernels, collectives, a memcpy, Python.
    let mut base: Vec<(FunctionKind, Resource, String, f64, f64, f64)> = Vec::new();
    for i in 0..nfun {
        let b = match i % 10 {
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
        };
        base.push(b);
    }
    let gemm = 3usize;
    let comm = 6usize;
    let gemm_outlier = (workers as u32) / 8 + 1;
    let comm_outliers: Vec<u32> = (0..5).map(|i| (workers as u32) / 2 + i).collect();
    let mut rng = SplitMix64::new(42);
    let gc_workers: Vec<u32> = {
        let mut v: Vec<u32> = (0..3)
            .map(|_| (rng.next_u64() % workers as u64) as u32)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let gc_name = "train.py(120): main;gradmode.py(80): __init__";

    let t0 = Instant::now();
    let mut functions: Vec<TableFunction> = base
        .iter()
        .map(|(kind, resource, name, ..)| TableFunction {
            kind: *kind,
            name: name.clone(),
            resource: *resource,
        })
        .collect();
    functions.push(TableFunction {
        kind: FunctionKind::Python,
        name: gc_name.to_string(),
        resource: Resource::Cpu,
    });
    let gc = (functions.len() - 1) as u32;
    let mut fps = match FingerprintTable::new(functions, workers) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mut patterns: Vec<TablePattern> = Vec::with_capacity(nfun + 1);
    let mut host = String::new();
    for w in 0..workers as u32 {
        patterns.clear();
        for (i, (_, _, _, b, m, s)) in base.iter().enumerate() {
            let mut beta = b * (1.0 + 0.03 * rng.symmetric());
            let mut mu = m * (1.0 + 0.03 * rng.symmetric());
            let mut sigma = s * (1.0 + 0.03 * rng.symmetric());
            if i == gemm && w == gemm_outlier {
                beta *= 3.0;
            }
            if i == comm && comm_outliers.contains(&w) {
                mu = 0.25;
                sigma = 0.03;
            }
            if !beta.is_finite() {
                beta = 0.0;
            }
            patterns.push(TablePattern {
                function: i as u32,
                beta: beta as f32,
                mu: mu as f32,
                sigma: sigma as f32,
                util_source: UtilizationSource::Samples,
                critical_us: (beta * 20e6) as f32,
                total_us: (beta * 25e6) as f32,
            });
        }
        if gc_workers.contains(&w) {
            patterns.push(TablePattern {
                function: gc,
                beta: 0.05,
                mu: 0.3,
                sigma: 0.1,
                util_source: UtilizationSource::Samples,
                critical_us: 1e6,
                total_us: 1e6,
            });
        }
        if w % 8 == 0 {
            host = format!("node{:06}", w / 8);
        }
        let worker = TableWorker {
            worker: w,
            host: Some(&host),
            group: None,
            source: "",
            utilization_source: UtilizationSource::Samples,
            window_us: 20e6,
            total_floor: 0.0,
            omitted: &[],
        };
        if let Err(e) = fps.push_worker(&worker, &patterns) {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
    eprintln!(
        "generated {workers} workers x {nfun} functions in {:.2?}",
        t0.elapsed()
    );

    if repeats == 0 {
        return;
    }
    let cfg = LocalizeConfig::default();
    let mut best = f64::INFINITY;
    let mut report = None;
    let cpu0 = cpu_seconds();
    for _ in 0..repeats {
        let t = Instant::now();
        let r = localize_table(&fps, &cfg, Some(workers as u32));
        let dt = t.elapsed().as_secs_f64();
        best = best.min(dt);
        report = Some(r);
    }
    if let (Some(a), Some(b)) = (cpu0, cpu_seconds()) {
        println!(
            "localize CPU time: {:.2} s per run (user+system, 10 ms ticks)",
            (b - a) / repeats as f64
        );
    }
    let Some(report) = report else { return };
    println!(
        "localize: {workers} workers x {nfun} functions: best {:.1} ms over {repeats} run(s)",
        best * 1e3
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
    let expect = [
        (base[gemm].2.as_str(), vec![gemm_outlier]),
        (base[comm].2.as_str(), comm_outliers.clone()),
        (gc_name, gc_workers.clone()),
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
    println!(
        "injected outliers found exactly: {}",
        if ok { "yes" } else { "NO" }
    );
    if !ok {
        std::process::exit(1);
    }
}
