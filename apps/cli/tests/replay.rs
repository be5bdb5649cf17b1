//! Diagnosis tests on real traces (issue #2 "Show"): a real single-rank GPU
//! trace from `tests/fixtures` is replayed as 16 workers with small jitter,
//! known anomalies are injected on chosen workers, and whyslow must name
//! exactly the injected functions and workers (PerfTracker §4.2–§4.3, §6).
//!
//! Injections keep the timeline faithful: time added to an execution shifts
//! everything after it, and every rank's window keeps the same wall-clock
//! length (β is a share of that window, PerfTracker Eq. 2), so a slow worker's
//! extra time is not normalized away.

mod common;
use common::fixtures;
use std::collections::BTreeMap;
use std::sync::OnceLock;

use whyslow_localize::LocalizeConfig;
use whyslow_model::{Execution, FunctionKind, Reason, Report, Resource, SampleSeries, WorkerTrace};
use whyslow_replay::{function_ids, insert_python, step_starts};
use whyslow_summarize::SummarizeOptions;

fn busiest(t: &WorkerTrace, kind: FunctionKind) -> (whyslow_model::FunctionId, String) {
    whyslow_replay::busiest(t, kind).expect("kind present")
}

const WORKERS: u32 = 16;

/// The real trace every replay starts from: A100, NCCL collectives, ProfilerSteps.
fn base_trace() -> Option<&'static WorkerTrace> {
    static BASE: OnceLock<Option<WorkerTrace>> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = fixtures()?;
        let path = dir.join("kineto/single/a100-nccl-rank0of2.json.gz");
        Some(whyslow_ingest::read_kineto(&path).expect("fixture trace loads"))
    })
    .as_ref()
}

/// Small deterministic jitter (xorshift), so workers are alike but not identical.
struct Jitter(u64);
impl Jitter {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A replica of `base` as worker `rank`: durations jittered by ±1%.
fn replica(base: &WorkerTrace, rank: u32) -> WorkerTrace {
    let mut t = base.clone();
    t.meta.rank = rank;
    t.meta.source = format!("replay of {} as rank {rank}", base.meta.source);
    let mut j = Jitter(0x9E37_79B9_7F4A_7C15 ^ (rank as u64 + 1));
    // Jitter by stretching each execution a little and shifting what follows,
    // so nothing overlaps that did not before.
    let extra: Vec<i64> = t
        .executions
        .iter()
        .map(|e| ((e.dur_ns() as f64) * 0.01 * (j.next() - 0.5)) as i64)
        .collect();
    stretch(&mut t, |i, _| extra[i].max(0));
    t
}

/// Adds `extra(i, exec)` ns to execution i and shifts every later event so
/// that the timeline stays consistent; the window keeps its original length.
fn stretch(t: &mut WorkerTrace, extra: impl Fn(usize, &Execution) -> i64) {
    let (span_start, span_end) = t.span;
    // Shift points: (time, amount), applied to every timestamp after `time`.
    let mut shifts: Vec<(i64, i64)> = t
        .executions
        .iter()
        .enumerate()
        .filter_map(|(i, e)| {
            let x = extra(i, e);
            (x > 0).then_some((e.end_ns, x))
        })
        .collect();
    shifts.sort_unstable();
    let mut cum = Vec::with_capacity(shifts.len());
    let mut acc = 0;
    for &(_, x) in &shifts {
        acc += x;
        cum.push(acc);
    }
    let shift_at = |ts: i64, inclusive: bool| -> i64 {
        let n = shifts.partition_point(|&(at, _)| if inclusive { at <= ts } else { at < ts });
        if n == 0 {
            0
        } else {
            cum[n - 1]
        }
    };
    let own: Vec<i64> = t
        .executions
        .iter()
        .enumerate()
        .map(|(i, e)| extra(i, e).max(0))
        .collect();
    for (e, own) in t.executions.iter_mut().zip(own) {
        let s = shift_at(e.start_ns, true);
        // Enclosing executions (a Python frame around a slowed op) grow too.
        let end_shift = shift_at(e.end_ns, false);
        e.start_ns += s;
        e.end_ns += end_shift.max(s) + own;
    }
    for step in &mut t.steps {
        let s = shift_at(step.1, true);
        step.2 += shift_at(step.2, false).max(s);
        step.1 += s;
    }
    t.span = (span_start, span_end);
}

fn diagnose(
    traces: &[WorkerTrace],
    samples: &BTreeMap<u32, BTreeMap<Resource, SampleSeries>>,
) -> Report {
    let empty = BTreeMap::new();
    let fps: Vec<_> = traces
        .iter()
        .map(|t| {
            whyslow_summarize::summarize(
                t,
                samples.get(&t.meta.rank).unwrap_or(&empty),
                &SummarizeOptions::default(),
            )
        })
        .collect();
    let report = whyslow_localize::localize(&fps, &LocalizeConfig::default(), Some(WORKERS));
    eprintln!("{}", whyslow_report::render_table(&report, false));
    report
}

fn all_ranks() -> Vec<u32> {
    (0..WORKERS).collect()
}

/// Findings that are not shared by all workers: what a replay injection must produce.
fn partial_findings(report: &Report) -> Vec<&whyslow_model::Finding> {
    report
        .findings
        .iter()
        .filter(|f| f.workers != all_ranks())
        .collect()
}

fn clean_job() -> Option<Vec<WorkerTrace>> {
    let base = base_trace()?;
    Some((0..WORKERS).map(|r| replica(base, r)).collect())
}

#[test]
fn clean_replay_flags_nothing_beyond_common_problems() {
    let Some(traces) = clean_job() else { return };
    let report = diagnose(&traces, &BTreeMap::new());
    assert_eq!(report.workers, WORKERS as usize);
    assert!(report.missing_workers.is_empty());
    assert!(
        partial_findings(&report).is_empty(),
        "a healthy replay must not single out workers: {:#?}",
        partial_findings(&report)
    );
}

/// PerfTracker §6 Case 1 (GEMM slow on some workers): one kernel 4× slower on
/// workers 3 and 7 → that kernel, exactly those workers.
#[test]
fn one_kernel_slower_on_some_workers() {
    let Some(mut traces) = clean_job() else {
        return;
    };
    let (kernel, name) = busiest(base_trace().unwrap(), FunctionKind::GpuKernel);
    for r in [3usize, 7] {
        stretch(&mut traces[r], |_, e| {
            if e.function == kernel {
                e.dur_ns() * 3
            } else {
                0
            }
        });
    }
    let report = diagnose(&traces, &BTreeMap::new());
    let partial = partial_findings(&report);
    let hit = partial
        .iter()
        .find(|f| f.function == name)
        .unwrap_or_else(|| panic!("{name} not flagged: {partial:#?}"));
    assert_eq!(hit.workers, vec![3, 7]);
    for f in &partial {
        assert!(
            f.workers.iter().all(|w| [3, 7].contains(w)),
            "unexpected workers flagged: {f:#?}"
        );
    }
}

/// A straggler: every GPU kernel 2× slower on worker 5 while its peers wait
/// for it in the next collective. Only worker 5 may be named, for GPU kernels.
#[test]
fn uniformly_slower_gpu_on_one_worker() {
    let Some(mut traces) = clean_job() else {
        return;
    };
    let base = base_trace().unwrap();
    let kernels = function_ids(base, FunctionKind::GpuKernel);
    // Peers wait on the GPU, inside the NCCL kernels (not the CPU-side launch ops).
    let comms: Vec<_> = function_ids(base, FunctionKind::Comm)
        .into_iter()
        .filter(|&id| {
            base.functions
                .get(id)
                .name
                .to_ascii_lowercase()
                .starts_with("nccl")
        })
        .collect();
    assert!(!comms.is_empty(), "the base trace has NCCL kernels");
    // The slow worker's extra time accumulated between consecutive collectives,
    // in the order of the base trace's collectives.
    let slow = &traces[5];
    let mut order: Vec<usize> = (0..slow.executions.len()).collect();
    order.sort_by_key(|&i| slow.executions[i].start_ns);
    let mut extra_before_comm: Vec<(i64, i64)> = Vec::new();
    let mut pending = 0;
    for &i in &order {
        let e = slow.executions[i];
        if kernels.contains(&e.function) {
            pending += e.dur_ns();
        } else if comms.contains(&e.function) {
            extra_before_comm.push((e.start_ns, pending));
            pending = 0;
        }
    }
    stretch(&mut traces[5], |_, e| {
        if kernels.contains(&e.function) {
            e.dur_ns()
        } else {
            0
        }
    });
    for (r, t) in traces.iter_mut().enumerate() {
        if r == 5 {
            continue;
        }
        // Peers wait inside the k-th collective for as long as worker 5 is
        // late to it (collectives match by order, as they do in NCCL).
        let mut peer_comms: Vec<usize> = (0..t.executions.len())
            .filter(|&i| comms.contains(&t.executions[i].function))
            .collect();
        peer_comms.sort_by_key(|&i| t.executions[i].start_ns);
        let mut wait = vec![0i64; t.executions.len()];
        for (k, &i) in peer_comms.iter().enumerate() {
            wait[i] = extra_before_comm.get(k).map_or(0, |&(_, x)| x);
        }
        stretch(t, |i, _| wait[i]);
    }
    let report = diagnose(&traces, &BTreeMap::new());
    let partial = partial_findings(&report);
    assert!(
        partial
            .iter()
            .any(|f| f.kind == FunctionKind::GpuKernel && f.workers == vec![5]),
        "GPU kernels on worker 5 not flagged: {partial:#?}"
    );
    for f in &partial {
        assert_eq!(f.workers, vec![5], "only worker 5 may be named: {f:#?}");
    }
}

/// PerfTracker §3 (Figures 3–5): a throttled link. Worker 9's busiest
/// collective runs at a steady low NIC throughput; its ring peers burst and
/// wait (high σ). Hardware samples drive μ/σ here. → that collective, worker 9.
#[test]
fn slow_link_collective_with_steady_low_utilization() {
    let Some(mut traces) = clean_job() else {
        return;
    };
    let (comm, name) = busiest(base_trace().unwrap(), FunctionKind::Comm);
    // Everyone's collective takes 3× longer: the ring runs at the slow link's pace.
    for t in traces.iter_mut() {
        stretch(t, |_, e| {
            if e.function == comm {
                e.dur_ns() * 2
            } else {
                0
            }
        });
    }
    let mut samples = BTreeMap::new();
    for t in &traces {
        let rank = t.meta.rank;
        let mut series = SampleSeries::default();
        let mut j = Jitter(rank as u64 * 7919 + 13);
        let mut comm_execs: Vec<_> = t.executions.iter().filter(|e| e.function == comm).collect();
        comm_execs.sort_by_key(|e| e.start_ns);
        for e in comm_execs {
            // 10 kHz would be too coarse for µs kernels: sample each execution 40 times.
            let step = (e.dur_ns() / 40).max(1);
            let mut ts = e.start_ns;
            let mut i = 0;
            while ts < e.end_ns {
                let v = if rank == 9 {
                    0.25 + 0.02 * (j.next() as f32 - 0.5)
                } else if (i / 4) % 2 == 0 {
                    0.9 + 0.1 * j.next() as f32
                } else {
                    0.05 * j.next() as f32
                };
                series.ts_ns.push(ts);
                series.values.push(v);
                ts += step;
                i += 1;
            }
        }
        let resource = t.functions.get(comm).resource;
        samples.insert(rank, BTreeMap::from([(resource, series)]));
    }
    let report = diagnose(&traces, &samples);
    let partial = partial_findings(&report);
    let hit = partial
        .iter()
        .find(|f| f.function == name)
        .unwrap_or_else(|| panic!("{name} not flagged: {partial:#?}"));
    assert_eq!(hit.workers, vec![9]);
    assert!(hit.mu.value < hit.mu.peers, "slow link: lower μ than peers");
    assert!(
        hit.sigma.value < hit.sigma.peers,
        "slow link: steadier than peers"
    );
    for f in &partial {
        assert_eq!(f.workers, vec![9], "only worker 9 may be named: {f:#?}");
    }
}

const DATA_LOADING: &str = "train.py(88): <module>;train.py(61): train_epoch;\
torch/utils/data/dataloader.py(631): __next__;torch/utils/data/dataloader.py(1329): _next_data;\
multiprocessing/connection.py(414): _recv;socket.py(705): recv_into";

/// PerfTracker §6 Figure 15: slow data loading on all workers — a Python
/// function on ~30% of the time everywhere is unexpected (β > 0.01 for Python).
#[test]
fn slow_data_loading_on_all_workers() {
    let Some(mut traces) = clean_job() else {
        return;
    };
    for t in traces.iter_mut() {
        let starts = step_starts(t);
        let window = (t.span.1 - t.span.0) as f64;
        let gap = (window * 0.3 / starts.len() as f64) as i64;
        // Insert from the last step backwards so earlier insertions do not move later points.
        for &s in starts.iter().rev() {
            insert_python(t, s, gap, DATA_LOADING);
        }
    }
    let report = diagnose(&traces, &BTreeMap::new());
    let hit = report
        .findings
        .iter()
        .find(|f| f.function == DATA_LOADING)
        .unwrap_or_else(|| panic!("data loading not flagged: {:#?}", report.findings));
    assert_eq!(hit.workers, all_ranks());
    assert!(matches!(hit.reason, Reason::Unexpected | Reason::Both));
    assert!(hit.beta.value > 0.2, "β should be near 0.3: {hit:#?}");
    assert!(
        partial_findings(&report).is_empty(),
        "{:#?}",
        partial_findings(&report)
    );
}

const GC: &str = "train.py(88): <module>;train.py(64): train_epoch;gc.py(0): collect";

/// PerfTracker §6: garbage collection on random workers → those workers.
#[test]
fn gc_on_random_workers() {
    let Some(mut traces) = clean_job() else {
        return;
    };
    let gc_workers = [2u32, 11, 13];
    for &r in &gc_workers {
        let t = &mut traces[r as usize];
        let starts = step_starts(t);
        let window = (t.span.1 - t.span.0) as f64;
        let gap = (window * 0.06 / starts.len() as f64) as i64;
        for &s in starts.iter().rev() {
            insert_python(t, s + 1, gap, GC);
        }
    }
    let report = diagnose(&traces, &BTreeMap::new());
    let hit = report
        .findings
        .iter()
        .find(|f| f.function == GC)
        .unwrap_or_else(|| panic!("GC not flagged: {:#?}", report.findings));
    assert_eq!(hit.workers, gc_workers.to_vec());
    for f in partial_findings(&report) {
        assert!(
            f.workers.iter().all(|w| gc_workers.contains(w)),
            "unexpected workers flagged: {f:#?}"
        );
    }
}
