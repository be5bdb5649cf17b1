//! Critical path (PerfTracker §4.2, Figure 9) on hand-built timelines, and the
//! sweep against a brute-force per-nanosecond reference on random traces.

mod common;

use common::{Builder, Rng};
use whyslow_model::{FunctionId, FunctionKind, WorkerTrace};
use whyslow_summarize::{critical_path, window, CriticalSegment};

use FunctionKind::*;

fn seg(start_ns: i64, end_ns: i64, execution: usize, share: u32) -> CriticalSegment {
    CriticalSegment {
        start_ns,
        end_ns,
        execution: execution as u32,
        share,
    }
}

/// PerfTracker §4.2 / Figure 9: a comm kernel overlapping a GPU compute kernel
/// is critical only outside the compute kernel.
#[test]
fn perftracker_4_2_comm_overlapping_kernel_is_critical_only_outside_it() {
    let mut b = Builder::new((0, 100));
    let gemm = b.f(GpuKernel, "gemm");
    let ar = b.f(Comm, "ncclAllReduce");
    let k = b.x(gemm, 10, 50, 7);
    let c = b.x(ar, 30, 80, 20);
    let cp = critical_path(&b.trace, (0, 100));
    assert_eq!(cp.critical_ns[k], 40.0);
    assert_eq!(cp.critical_ns[c], 30.0); // [50, 80)
    assert_eq!(cp.segments, vec![seg(10, 50, k, 1), seg(50, 80, c, 1)]);
    assert_eq!(cp.covered_ns, 70.0);
}

/// PerfTracker §4.2: memory ops outrank comm, kernels outrank memory.
#[test]
fn perftracker_4_2_priority_kernel_memory_comm_python_cpu_op() {
    let mut b = Builder::new((0, 100));
    let k = b.f(GpuKernel, "k");
    let m = b.f(Memory, "memcpy");
    let c = b.f(Comm, "allreduce");
    let p = b.f(Python, "train.py: main");
    let o = b.f(CpuOp, "aten::add");
    let xp = b.x(p, 0, 100, 1);
    let xo = b.x(o, 90, 95, 1); // child of the Python function
    let xc = b.x(c, 0, 60, 30);
    let xm = b.x(m, 10, 40, 31);
    let xk = b.x(k, 20, 30, 7);
    let cp = critical_path(&b.trace, (0, 100));
    assert_eq!(cp.critical_ns[xk], 10.0); // [20, 30)
    assert_eq!(cp.critical_ns[xm], 20.0); // [10, 20) + [30, 40)
    assert_eq!(cp.critical_ns[xc], 30.0); // [0, 10) + [40, 60)
    assert_eq!(cp.critical_ns[xo], 5.0); // [90, 95)
    assert_eq!(cp.critical_ns[xp], 35.0); // [60, 90) + [95, 100)
    assert_eq!(cp.critical_ns.iter().sum::<f64>(), 100.0);
}

/// PerfTracker §4.2: a Python function is critical only while none of its
/// children (Python or CPU op, nested by time on the same thread) runs.
#[test]
fn perftracker_4_2_python_is_critical_only_outside_its_children() {
    let mut b = Builder::new((0, 100));
    let outer = b.f(Python, "train.py: main");
    let inner = b.f(Python, "train.py: main;model.py: forward");
    let op = b.f(CpuOp, "aten::mm");
    let xo = b.x(outer, 0, 100, 1);
    let xi = b.x(inner, 20, 60, 1);
    let xop = b.x(op, 30, 40, 1);
    let cp = critical_path(&b.trace, (0, 100));
    assert_eq!(cp.critical_ns[xo], 60.0); // [0, 20) + [60, 100)
    assert_eq!(cp.critical_ns[xi], 30.0); // [20, 30) + [40, 60)
    assert_eq!(cp.critical_ns[xop], 10.0);
    assert_eq!(
        cp.segments,
        vec![
            seg(0, 20, xo, 1),
            seg(20, 30, xi, 1),
            seg(30, 40, xop, 1),
            seg(40, 60, xi, 1),
            seg(60, 100, xo, 1),
        ]
    );
}

/// PerfTracker §4.2: Python on a thread started by `_bootstrap` is never on the
/// critical path, whether the training thread is known or derived.
#[test]
fn perftracker_4_2_python_on_bootstrap_thread_is_never_critical() {
    for known in [true, false] {
        let mut b = Builder::new((0, 100));
        if !known {
            b.trace.training_thread = None;
        }
        let main = b.f(Python, "train.py: <module>;train.py: main");
        let worker = b.f(
            Python,
            "threading.py(995): _bootstrap;threading.py(1038): _bootstrap_inner;loader.py: run",
        );
        let worker_leaf = b.f(
            Python,
            "threading.py(995): _bootstrap;threading.py(1038): _bootstrap_inner;loader.py: run;socket.py: recv",
        );
        let xm = b.x(main, 0, 40, 1);
        let xw = b.x(worker, 0, 100, 2);
        let xl = b.x(worker_leaf, 50, 90, 2);
        let cp = critical_path(&b.trace, (0, 100));
        assert_eq!(cp.critical_ns[xm], 40.0, "known={known}");
        assert_eq!(cp.critical_ns[xw], 0.0, "known={known}");
        assert_eq!(cp.critical_ns[xl], 0.0, "known={known}");
        assert_eq!(cp.covered_ns, 40.0);
    }
}

/// Known training thread: Python on other threads is not critical even
/// without a `_bootstrap` frame; CPU ops on other threads fill only time when
/// nothing else runs (whyslow's rule for the paper's "all other functions").
#[test]
fn perftracker_4_2_other_threads_only_fill_idle_time_with_cpu_ops() {
    let mut b = Builder::new((0, 100));
    let py = b.f(Python, "other.py: loop");
    let bwd = b.f(CpuOp, "autograd::engine::evaluate_function: MmBackward0");
    let main = b.f(Python, "train.py: main");
    let xpy = b.x(py, 0, 100, 5);
    let xbwd = b.x(bwd, 10, 70, 6);
    let xmain = b.x(main, 50, 60, 1);
    let cp = critical_path(&b.trace, (0, 100));
    assert_eq!(cp.critical_ns[xpy], 0.0);
    assert_eq!(cp.critical_ns[xmain], 10.0);
    assert_eq!(cp.critical_ns[xbwd], 50.0); // [10, 50) + [60, 70)
}

/// PerfTracker §4.2 with Σβ ≤ 1: two kernels on two streams share their
/// overlap equally.
#[test]
fn perftracker_4_2_concurrent_kernels_split_time() {
    let mut b = Builder::new((0, 100));
    let a = b.f(GpuKernel, "gemm");
    let c = b.f(GpuKernel, "softmax");
    let xa = b.x(a, 0, 60, 7);
    let xc = b.x(c, 40, 100, 8);
    let xd = b.x(c, 50, 55, 9);
    let cp = critical_path(&b.trace, (0, 100));
    // [0,40) a; [40,50) a,c halves; [50,55) thirds; [55,60) halves; [60,100) c
    assert!((cp.critical_ns[xa] - (40.0 + 5.0 + 5.0 / 3.0 + 2.5)).abs() < 1e-9);
    assert!((cp.critical_ns[xc] - (5.0 + 5.0 / 3.0 + 2.5 + 40.0)).abs() < 1e-9);
    assert!((cp.critical_ns[xd] - 5.0 / 3.0).abs() < 1e-9);
    assert!((cp.critical_ns.iter().sum::<f64>() - 100.0).abs() < 1e-9);
    assert!(cp.segments.contains(&seg(40, 50, xa, 2)));
    assert!(cp.segments.contains(&seg(50, 55, xd, 3)));
}

/// Real traces have CPU events on one thread that overlap without nesting:
/// the one that started last runs; nothing panics; time is conserved.
#[test]
fn overlapping_but_not_nested_cpu_events_latest_start_runs() {
    let mut b = Builder::new((0, 100));
    let a = b.f(CpuOp, "a");
    let c = b.f(CpuOp, "b");
    let xa = b.x(a, 0, 10, 1);
    let xc = b.x(c, 5, 15, 1);
    let cp = critical_path(&b.trace, (0, 100));
    assert_eq!(cp.critical_ns[xa], 5.0);
    assert_eq!(cp.critical_ns[xc], 10.0);

    // A buried execution that ends while not on top is dropped lazily.
    let mut b = Builder::new((0, 100));
    let p = b.f(Python, "p");
    let q = b.f(Python, "q");
    let r = b.f(CpuOp, "r");
    let xp = b.x(p, 0, 50, 1);
    let xq = b.x(q, 10, 30, 1);
    let xr = b.x(r, 20, 40, 1); // crosses q's end
    let cp = critical_path(&b.trace, (0, 100));
    assert_eq!(cp.critical_ns[xp], 20.0); // [0,10) + [40,50)
    assert_eq!(cp.critical_ns[xq], 10.0); // [10,20)
    assert_eq!(cp.critical_ns[xr], 20.0); // [20,40)
}

/// Executions are clipped to the window; malformed ones are ignored.
#[test]
fn clipping_and_malformed_executions() {
    let mut b = Builder::new((0, 100));
    let k = b.f(GpuKernel, "k");
    let x0 = b.x(k, -50, 20, 7);
    let x1 = b.x(k, 90, 200, 7);
    let x2 = b.x(k, 60, 50, 7); // end < start
    b.trace.executions.push(whyslow_model::Execution {
        function: FunctionId(99),
        start_ns: 30,
        end_ns: 40,
        thread: 1,
        trace_util: f32::NAN,
    });
    let cp = critical_path(&b.trace, (10, 95));
    assert_eq!(cp.critical_ns[x0], 10.0);
    assert_eq!(cp.critical_ns[x1], 5.0);
    assert_eq!(cp.critical_ns[x2], 0.0);
    assert_eq!(cp.ignored, 2);
    assert_eq!(cp.in_window, 2);
}

#[test]
fn empty_trace_and_zero_length_window() {
    let b = Builder::new((0, 0));
    let cp = critical_path(&b.trace, (0, 0));
    assert!(cp.critical_ns.is_empty() && cp.segments.is_empty());
    assert_eq!(window(&b.trace, None), None);
    let mut b = Builder::new((5, 5));
    let k = b.f(GpuKernel, "k");
    b.x(k, 0, 10, 1);
    let cp = critical_path(&b.trace, (5, 5));
    assert_eq!(cp.critical_ns, vec![0.0]);
    // Degenerate span: the executions' extent.
    assert_eq!(window(&b.trace, None), Some((0, 10)));
    // Extreme timestamps do not overflow.
    let mut b = Builder::new((i64::MIN, i64::MAX));
    let k = b.f(GpuKernel, "k");
    b.x(k, i64::MIN, i64::MAX, 1);
    let cp = critical_path(&b.trace, (i64::MIN, i64::MAX));
    assert!(cp.critical_ns[0] > 1e19);
}

/// The steps window: from the start of step a to the end of step b.
#[test]
fn steps_window() {
    let mut b = Builder::new((0, 1000));
    b.trace.steps = vec![(3, 100, 300), (4, 300, 500), (5, 500, 700)];
    assert_eq!(window(&b.trace, None), Some((0, 1000)));
    assert_eq!(window(&b.trace, Some((4, 5))), Some((300, 700)));
    assert_eq!(window(&b.trace, Some((5, 4))), Some((300, 700)));
    assert_eq!(window(&b.trace, Some((4, 4))), Some((300, 500)));
    assert_eq!(window(&b.trace, Some((4, 9))), Some((300, 700)));
    assert_eq!(window(&b.trace, Some((7, 9))), None);
}

// ---------------------------------------------------------------------------
// Brute force: walk every nanosecond of a small random trace and apply the
// rules of `critical_path` literally.

fn reference(trace: &WorkerTrace, (w0, w1): (i64, i64)) -> Vec<f64> {
    let n = trace.executions.len();
    let mut out = vec![0.0; n];
    let kind = |i: usize| trace.functions.get(trace.executions[i].function).kind;
    let bootstrap_threads: Vec<u32> = trace
        .executions
        .iter()
        .filter(|x| {
            let f = trace.functions.get(x.function);
            f.kind == Python && f.name.split(';').next().unwrap().contains("_bootstrap")
        })
        .map(|x| x.thread)
        .collect();
    let training = |th: u32| match trace.training_thread {
        Some(t) => t == th,
        None => !bootstrap_threads.contains(&th),
    };
    for t in w0..w1 {
        let active: Vec<usize> = (0..n)
            .filter(|&i| {
                let x = &trace.executions[i];
                x.start_ns.max(w0) <= t && t < x.end_ns.min(w1)
            })
            .collect();
        // Running execution per CPU thread: the latest (start, -end, index).
        let mut tiers: Vec<Vec<usize>> = vec![Vec::new(); 6];
        let mut threads: Vec<u32> = Vec::new();
        for &i in &active {
            match kind(i) {
                GpuKernel => tiers[0].push(i),
                Memory => tiers[1].push(i),
                Comm => tiers[2].push(i),
                _ => threads.push(trace.executions[i].thread),
            }
        }
        threads.sort();
        threads.dedup();
        for th in threads {
            let run = active
                .iter()
                .copied()
                .filter(|&i| matches!(kind(i), Python | CpuOp) && trace.executions[i].thread == th)
                .max_by_key(|&i| {
                    let x = &trace.executions[i];
                    (x.start_ns.max(w0), std::cmp::Reverse(x.end_ns.min(w1)), i)
                })
                .unwrap();
            match (kind(run), training(th)) {
                (Python, true) => tiers[3].push(run),
                (Python, false) => {}
                (_, true) => tiers[4].push(run),
                (_, false) => tiers[5].push(run),
            }
        }
        if let Some(top) = tiers.iter().find(|v| !v.is_empty()) {
            for &i in top {
                out[i] += 1.0 / top.len() as f64;
            }
        }
    }
    out
}

fn random_trace(rng: &mut Rng) -> WorkerTrace {
    let mut b = Builder::new((0, 80));
    if rng.chance(0.5) {
        b.trace.training_thread = None;
    }
    let fns: Vec<FunctionId> = vec![
        b.f(GpuKernel, "k1"),
        b.f(GpuKernel, "k2"),
        b.f(Memory, "m"),
        b.f(Comm, "c"),
        b.f(Python, "main"),
        b.f(Python, "main;f"),
        b.f(Python, "threading.py: _bootstrap;run"),
        b.f(CpuOp, "op1"),
        b.f(CpuOp, "op2"),
    ];
    let n = 1 + rng.below(25) as usize;
    for _ in 0..n {
        let f = fns[rng.below(fns.len() as u64) as usize];
        let s = rng.below(90) as i64 - 5;
        let len = rng.below(40) as i64;
        let th = rng.below(4) as u32;
        b.x(f, s, s + len, th);
    }
    b.trace
}

#[test]
fn sweep_matches_brute_force_on_random_traces() {
    let mut rng = Rng(42);
    for case in 0..3000 {
        let trace = random_trace(&mut rng);
        let w = if rng.chance(0.3) { (10, 70) } else { (0, 80) };
        let cp = critical_path(&trace, w);
        let want = reference(&trace, w);
        for (i, (&got, &want)) in cp.critical_ns.iter().zip(&want).enumerate() {
            assert!(
                (got - want).abs() < 1e-6,
                "case {case}, execution {i}: got {got}, want {want}\n{:?}",
                trace.executions
            );
        }
        let total: f64 = cp.critical_ns.iter().sum();
        assert!(total <= (w.1 - w.0) as f64 + 1e-6);
        assert!((total - cp.covered_ns).abs() < 1e-6);
        // Segments add up to the same per-execution time.
        let mut from_segs = vec![0.0; trace.executions.len()];
        for s in &cp.segments {
            from_segs[s.execution as usize] += (s.end_ns - s.start_ns) as f64 / s.share as f64;
        }
        for (a, b) in from_segs.iter().zip(&cp.critical_ns) {
            assert!((a - b).abs() < 1e-6, "case {case}");
        }
        assert!(cp
            .segments
            .windows(2)
            .all(|p| p[0].start_ns <= p[1].start_ns));
    }
}
