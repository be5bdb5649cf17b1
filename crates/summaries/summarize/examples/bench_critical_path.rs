//! Throughput of the summaries stage on a synthetic 3-million-execution trace,
//! on one thread.
//!
//! ```text
//! cargo run --release -p whyslow-summarize --example bench_critical_path [executions]
//! ```
//!
//! The trace mimics 20 s of training: a training thread with nested Python
//! frames and CPU ops, an autograd thread, a `_bootstrap` data-loader thread,
//! compute kernels on two streams, NCCL on a third, and memcpys; plus 10 kHz
//! SM / NVLink / CPU sample series for the μ/σ path.

use std::collections::BTreeMap;
use std::time::Instant;

use whyslow_model::{
    Execution, FunctionId, FunctionKind, RankSource, Resource, SampleSeries, WorkerMeta,
    WorkerTrace,
};
use whyslow_summarize::{critical_path, summarize, window, SummarizeOptions};

use whyslow_model::rng::SplitMix64 as Rng;

fn synthetic(target: usize) -> WorkerTrace {
    let mut t = WorkerTrace::new(WorkerMeta {
        rank: 0,
        host: None,
        group: None,
        rank_source: RankSource::Trace,
        source: "synthetic".into(),
        world_size: None,
    });
    t.training_thread = Some(1);
    let mut rng = Rng(1);
    let py: Vec<FunctionId> = (0..200)
        .map(|i| {
            t.functions.intern(
                FunctionKind::Python,
                &format!("train.py: main;model.py: forward;layer{}.py: f{i}", i % 20),
                Resource::Cpu,
            )
        })
        .collect();
    let ops: Vec<FunctionId> = (0..100)
        .map(|i| {
            t.functions
                .intern(FunctionKind::CpuOp, &format!("aten::op{i}"), Resource::Cpu)
        })
        .collect();
    let kernels: Vec<FunctionId> = (0..100)
        .map(|i| {
            t.functions
                .intern(FunctionKind::GpuKernel, &format!("kernel{i}"), Resource::Sm)
        })
        .collect();
    let nccl = t
        .functions
        .intern(FunctionKind::Comm, "ncclAllReduce", Resource::Nvlink);
    let memcpy = t
        .functions
        .intern(FunctionKind::Memory, "Memcpy HtoD", Resource::Pcie);
    let loader = t.functions.intern(
        FunctionKind::Python,
        "threading.py: _bootstrap;loader.py: run",
        Resource::Cpu,
    );
    let push = |t: &mut WorkerTrace, f, s: i64, e: i64, th| {
        t.executions.push(Execution {
            function: f,
            start_ns: s,
            end_ns: e,
            thread: th,
            trace_util: 0.5,
        })
    };
    let window_ns: i64 = 20_000_000_000;
    // Each "block" on the training thread: a Python frame holding 3 nested
    // Python frames each with 4 CPU ops, 16 kernels across two streams, one
    // NCCL call, one memcpy, 4 autograd CPU ops, 1 loader call: 39 executions.
    let blocks = target / 39;
    let block_ns = window_ns / blocks.max(1) as i64;
    for b in 0..blocks as i64 {
        let t0 = b * block_ns;
        push(
            &mut t,
            py[rng.below(200) as usize],
            t0,
            t0 + block_ns - 10,
            1,
        );
        let sub = (block_ns - 20) / 3;
        for j in 0..3 {
            let s = t0 + 5 + j * sub;
            push(&mut t, py[rng.below(200) as usize], s, s + sub - 5, 1);
            let op_len = (sub - 10) / 4;
            for k in 0..4 {
                let os = s + 2 + k * op_len;
                push(&mut t, ops[rng.below(100) as usize], os, os + op_len - 2, 1);
            }
        }
        for k in 0..16 {
            let ks = t0 + (k * block_ns) / 16 + rng.below(50) as i64;
            let len = (block_ns / 20) + rng.below((block_ns / 10) as u64 + 1) as i64;
            push(
                &mut t,
                kernels[rng.below(100) as usize],
                ks,
                ks + len,
                7 + (k % 2) as u32,
            );
        }
        push(&mut t, nccl, t0 + block_ns / 3, t0 + block_ns, 20);
        push(&mut t, memcpy, t0, t0 + block_ns / 10, 21);
        for k in 0..4 {
            let s = t0 + k * block_ns / 4;
            push(&mut t, ops[rng.below(100) as usize], s, s + block_ns / 5, 2);
        }
        push(&mut t, loader, t0, t0 + block_ns / 2, 3);
    }
    // Shuffle so the sort does real work (ingest gives no order guarantee).
    let n = t.executions.len();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        t.executions.swap(i, j);
    }
    t.span = (0, window_ns);
    t
}

fn series(window_ns: i64, rng: &mut Rng) -> SampleSeries {
    let ts: Vec<i64> = (0..window_ns).step_by(100_000).collect();
    let values = ts
        .iter()
        .map(|_| {
            if rng.below(4) == 0 {
                0.0
            } else {
                rng.below(1000) as f32 / 1000.0
            }
        })
        .collect();
    SampleSeries { ts_ns: ts, values }
}

/// This thread's time on a CPU, in s (Linux `/proc/thread-self/schedstat`),
/// so that numbers stay meaningful on a loaded machine; NaN elsewhere.
fn cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |ns| ns / 1e9)
}

/// Runs `f`, printing wall and CPU time and throughput.
fn timed<T>(label: &str, n: usize, f: impl FnOnce() -> T) -> T {
    let (t, c) = (Instant::now(), cpu_s());
    let out = f();
    let (wall, cpu) = (t.elapsed().as_secs_f64(), cpu_s() - c);
    println!(
        "{label}: wall {wall:.3} s ({:.2} M executions/s), thread CPU {cpu:.3} s ({:.2} M executions/s)",
        n as f64 / wall / 1e6,
        n as f64 / cpu / 1e6
    );
    out
}

fn main() {
    let target: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(3_000_000);
    let t = Instant::now();
    let trace = synthetic(target);
    let n = trace.executions.len();
    println!(
        "synthetic trace: {n} executions, {} functions (built in {:.2} s)",
        trace.functions.len(),
        t.elapsed().as_secs_f64()
    );
    let w = window(&trace, None).expect("window");

    let cp = timed("critical_path (with segments)", n, || {
        critical_path(&trace, w)
    });
    println!(
        "  {} segments, covered {:.3} of the window",
        cp.segments.len(),
        cp.covered_ns / (w.1 - w.0) as f64
    );
    drop(cp);

    let opts = SummarizeOptions::default();
    let fp = timed("summarize (trace utilization)", n, || {
        summarize(&trace, &BTreeMap::new(), &opts)
    });
    println!("  {} functions kept", fp.functions.len());

    let mut rng = Rng(2);
    let samples = BTreeMap::from([
        (Resource::Sm, series(w.1, &mut rng)),
        (Resource::Nvlink, series(w.1, &mut rng)),
        (Resource::Cpu, series(w.1, &mut rng)),
    ]);
    let fp = timed("summarize (3 x 200k-sample series, Algorithm 1)", n, || {
        summarize(&trace, &samples, &opts)
    });
    let sum: f64 = fp.functions.iter().map(|p| p.beta).sum();
    println!(
        "  {} functions kept, sum of their beta = {sum:.4}",
        fp.functions.len()
    );
}
