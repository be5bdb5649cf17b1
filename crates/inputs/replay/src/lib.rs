//! Replays one real worker trace as many workers: per-execution timing noise
//! and injected faults on a faithful timeline. This is how whyslow's tests and
//! its accuracy table build multi-worker jobs from the public single-rank
//! traces (multi-rank GPU traces of one job are rare in public). Pure: no I/O.
//!
//! Two noise models, because real jitter is both:
//!
//! * [`NoiseMode::Scale`]: each execution's duration is multiplied by an
//!   independent factor in [1 − a, 1 + a] and nothing else moves (what a
//!   replay script that edits `dur` in a Kineto file does: nested and
//!   following events may then overlap slightly).
//! * [`NoiseMode::Shift`]: the same factors, but the time an execution gains
//!   or loses moves what starts after it on the same thread or stream, so
//!   each timeline stays consistent (a slower operator delays what follows it).
//!
//! [`stretch`] is the timeline-faithful way to inject a fault: time added to
//! an execution shifts every later event, and the traced span keeps its
//! length (β is a share of the window, PerfTracker Eq. 2).
#![deny(missing_docs)]

use whyslow_model::{Execution, FunctionId, FunctionKind, Resource, WorkerTrace, UNKNOWN_UTIL};

/// The replays' generator (one stream per rank).
pub use whyslow_model::rng::SplitMix64 as Rng;

/// How per-execution noise is applied (see the crate docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseMode {
    /// Durations scaled in place; nothing else moves.
    Scale,
    /// Durations scaled and later events of the same thread or stream shifted by the difference.
    Shift,
}

/// Per-execution timing noise: every duration × a factor uniform in
/// [1 − `amount`, 1 + `amount`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Noise {
    /// Relative amplitude (0.02 = ±2 %).
    pub amount: f64,
    /// How the factors are applied.
    pub mode: NoiseMode,
    /// Seed; each rank draws from its own stream.
    pub seed: u64,
}

/// A replica of `base` as worker `rank` of a job, with `noise`.
pub fn replica(base: &WorkerTrace, rank: u32, noise: &Noise) -> WorkerTrace {
    let mut t = base.clone();
    t.meta.rank = rank;
    t.meta.source = format!("replay of {} as rank {rank}", base.meta.source);
    let mut rng = Rng::new(noise.seed ^ (u64::from(rank) + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let delta: Vec<i64> = t
        .executions
        .iter()
        .map(|e| (e.dur_ns() as f64 * rng.range(-noise.amount, noise.amount)).round() as i64)
        .collect();
    match noise.mode {
        NoiseMode::Scale => {
            for (e, d) in t.executions.iter_mut().zip(delta) {
                e.end_ns = (e.end_ns + d).max(e.start_ns);
            }
        }
        NoiseMode::Shift => shift(&mut t, |i, _| delta[i], false),
    }
    // A real trace holds every event: noise moves its end, it cuts nothing.
    for e in &t.executions {
        t.span.0 = t.span.0.min(e.start_ns);
        t.span.1 = t.span.1.max(e.end_ns);
    }
    t
}

/// Adds `extra(i, exec)` ns (negative: removes) to execution i and shifts
/// every later event by the sum of the changes before it, so that the
/// timeline stays consistent; enclosing executions (a Python frame around a
/// slowed operator) grow too. The traced span keeps its length.
pub fn stretch(t: &mut WorkerTrace, extra: impl Fn(usize, &Execution) -> i64) {
    shift(t, extra, true);
}

/// [`stretch`]; with `global` false a change moves only the later events of
/// its own thread or stream (independent noise per timeline).
fn shift(t: &mut WorkerTrace, extra: impl Fn(usize, &Execution) -> i64, global: bool) {
    // A change never takes an execution below zero length.
    let own: Vec<i64> = t
        .executions
        .iter()
        .enumerate()
        .map(|(i, e)| extra(i, e).max(-e.dur_ns()))
        .collect();
    // Shift points (time, amount): every event starting after `time` moves
    // by `amount`; an execution that encloses the point on the same thread
    // (a Python frame around a slowed operator) grows by it.
    let points = |filter: &dyn Fn(&Execution) -> bool| -> Shifts {
        let mut at: Vec<(i64, i64)> = t
            .executions
            .iter()
            .zip(&own)
            .filter(|(e, &x)| x != 0 && filter(e))
            .map(|(e, &x)| (e.end_ns, x))
            .collect();
        at.sort_unstable();
        Shifts::new(at)
    };
    let all = points(&|_| true);
    let mut threads: Vec<u32> = t.executions.iter().map(|e| e.thread).collect();
    threads.sort_unstable();
    threads.dedup();
    let per_thread: Vec<Shifts> = threads
        .iter()
        .map(|&th| points(&|e: &Execution| e.thread == th))
        .collect();
    for (e, own) in t.executions.iter_mut().zip(own) {
        let local = &per_thread[threads.binary_search(&e.thread).unwrap_or(0)];
        let s = if global {
            all.at(e.start_ns, true)
        } else {
            local.at(e.start_ns, true)
        };
        let inner = local.at(e.end_ns, false) - local.at(e.start_ns, true);
        let start = e.start_ns + s;
        e.end_ns = (e.end_ns + s + inner + own).max(start);
        e.start_ns = start;
    }
    let shift_at = |ts: i64, inclusive: bool| if global { all.at(ts, inclusive) } else { 0 };
    for step in &mut t.steps {
        let s = shift_at(step.1, true);
        step.2 = (step.2 + shift_at(step.2, false)).max(step.1 + s);
        step.1 += s;
    }
}

/// Inserts `gap_ns` of the Python function `stack` (outermost frame first,
/// `;`-joined) on the training thread at `at`: the thread is busy there, every
/// later event moves by `gap_ns`, enclosing frames on the thread grow.
pub fn insert_python(t: &mut WorkerTrace, at: i64, gap_ns: i64, stack: &str) {
    let Some(thread) = t.training_thread else {
        return;
    };
    for e in &mut t.executions {
        if e.start_ns >= at {
            e.start_ns += gap_ns;
            e.end_ns += gap_ns;
        } else if e.end_ns > at && e.thread == thread {
            e.end_ns += gap_ns;
        }
    }
    for step in &mut t.steps {
        if step.1 >= at {
            step.1 += gap_ns;
            step.2 += gap_ns;
        } else if step.2 > at {
            step.2 += gap_ns;
        }
    }
    let function = t
        .functions
        .intern(FunctionKind::Python, stack, Resource::Cpu);
    t.executions.push(Execution {
        function,
        start_ns: at,
        end_ns: at + gap_ns,
        thread,
        trace_util: UNKNOWN_UTIL,
    });
}

/// Start of every `ProfilerStep`, or of the traced span when the trace has none.
pub fn step_starts(t: &WorkerTrace) -> Vec<i64> {
    if t.steps.is_empty() {
        vec![t.span.0]
    } else {
        t.steps.iter().map(|s| s.1).collect()
    }
}

/// Ids of every function of `kind`.
pub fn function_ids(t: &WorkerTrace, kind: FunctionKind) -> Vec<FunctionId> {
    t.functions
        .iter()
        .filter(|(_, f)| f.kind == kind)
        .map(|(id, _)| id)
        .collect()
}

/// The function of `kind` with the most total execution time, with its name.
pub fn busiest(t: &WorkerTrace, kind: FunctionKind) -> Option<(FunctionId, String)> {
    busiest_where(t, |f| f.kind == kind)
}

/// The function matching `pred` with the most total execution time.
pub fn busiest_where(
    t: &WorkerTrace,
    pred: impl Fn(&whyslow_model::FunctionInfo) -> bool,
) -> Option<(FunctionId, String)> {
    let mut total = vec![0i64; t.functions.len()];
    for e in &t.executions {
        if pred(t.functions.get(e.function)) {
            total[e.function.0 as usize] += e.dur_ns();
        }
    }
    let (i, &d) = total.iter().enumerate().max_by_key(|(_, d)| **d)?;
    (d > 0).then(|| {
        let id = FunctionId(i as u32);
        (id, t.functions.get(id).name.clone())
    })
}

/// Cumulative shifts at points in time.
struct Shifts {
    at: Vec<(i64, i64)>,
    cum: Vec<i64>,
}

impl Shifts {
    fn new(at: Vec<(i64, i64)>) -> Self {
        let mut acc = 0;
        let cum = at
            .iter()
            .map(|&(_, x)| {
                acc += x;
                acc
            })
            .collect();
        Shifts { at, cum }
    }
    /// The sum of the shifts at points before `ts` (or at it, when inclusive).
    fn at(&self, ts: i64, inclusive: bool) -> i64 {
        let n = self
            .at
            .partition_point(|&(p, _)| if inclusive { p <= ts } else { p < ts });
        if n == 0 {
            0
        } else {
            self.cum[n - 1]
        }
    }
}

/// A straggler and the peers that wait for it: `slow` gets `extra(i, exec)`
/// ns on its executions; every other worker of `traces` then waits inside
/// its k-th execution of a `collective` function for as long as the slow
/// worker is late to its own k-th one (collectives match by order, as in
/// NCCL and gloo). Waiting already accrued by the peers is not subtracted.
pub fn straggle(
    traces: &mut [WorkerTrace],
    slow: usize,
    extra: impl Fn(usize, &Execution) -> i64,
    collective: impl Fn(FunctionId) -> bool,
) {
    let before = collective_starts(&traces[slow], &collective);
    stretch(&mut traces[slow], extra);
    let after = collective_starts(&traces[slow], &collective);
    let late: Vec<i64> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b).max(0))
        .collect();
    // Lateness accumulates; each collective absorbs the increase since the last.
    let mut inc = Vec::with_capacity(late.len());
    let mut prev = 0;
    for &l in &late {
        inc.push((l - prev).max(0));
        prev = prev.max(l);
    }
    for (r, t) in traces.iter_mut().enumerate() {
        if r == slow {
            continue;
        }
        let mut order: Vec<usize> = (0..t.executions.len())
            .filter(|&i| collective(t.executions[i].function))
            .collect();
        order.sort_by_key(|&i| t.executions[i].start_ns);
        let mut wait = vec![0i64; t.executions.len()];
        for (k, &i) in order.iter().enumerate() {
            wait[i] = inc.get(k).copied().unwrap_or(0);
        }
        stretch(t, |i, _| wait[i]);
    }
}

fn collective_starts(t: &WorkerTrace, collective: &impl Fn(FunctionId) -> bool) -> Vec<i64> {
    let mut s: Vec<i64> = t
        .executions
        .iter()
        .filter(|e| collective(e.function))
        .map(|e| e.start_ns)
        .collect();
    s.sort_unstable();
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use whyslow_model::{RankSource, WorkerMeta};

    fn toy() -> WorkerTrace {
        let mut t = WorkerTrace::new(WorkerMeta {
            rank: 0,
            host: None,
            group: None,
            rank_source: RankSource::Trace,
            source: "toy".into(),
            world_size: None,
        });
        let a = t.functions.intern(FunctionKind::CpuOp, "a", Resource::Cpu);
        let b = t.functions.intern(FunctionKind::CpuOp, "b", Resource::Cpu);
        for (f, s, e) in [(a, 0, 100), (b, 100, 200), (a, 10, 50)] {
            t.executions.push(Execution {
                function: f,
                start_ns: s,
                end_ns: e,
                thread: 1,
                trace_util: UNKNOWN_UTIL,
            });
        }
        t.steps = vec![(1, 0, 200)];
        t.span = (0, 200);
        t
    }

    #[test]
    fn stretch_shifts_later_events_and_grows_enclosing_ones() {
        let mut t = toy();
        stretch(&mut t, |i, _| if i == 2 { 20 } else { 0 });
        let spans: Vec<_> = t
            .executions
            .iter()
            .map(|e| (e.start_ns, e.end_ns))
            .collect();
        assert_eq!(spans, vec![(0, 120), (120, 220), (10, 70)]);
        assert_eq!(t.steps, vec![(1, 0, 220)]);
        assert_eq!(t.span, (0, 200));
    }

    #[test]
    fn shrinking_moves_later_events_back() {
        let mut t = toy();
        stretch(&mut t, |i, _| if i == 0 { -1000 } else { 0 });
        assert_eq!(t.executions[0].dur_ns(), 0);
        assert_eq!(t.executions[1].start_ns, 0);
    }

    #[test]
    fn noise_stays_within_its_amplitude() {
        let base = toy();
        for mode in [NoiseMode::Scale, NoiseMode::Shift] {
            let noise = Noise {
                amount: 0.05,
                mode,
                seed: 7,
            };
            let r = replica(&base, 3, &noise);
            assert_eq!(r.meta.rank, 3);
            for (e, b) in r.executions.iter().zip(&base.executions) {
                let ratio = e.dur_ns() as f64 / b.dur_ns() as f64;
                // Enclosing executions also absorb their children's change.
                assert!((0.85..=1.15).contains(&ratio), "{mode:?}: {ratio}");
            }
        }
    }

    #[test]
    fn straggler_peers_wait_in_the_collective() {
        let mut traces = vec![toy(), toy(), toy()];
        let b = FunctionId(1);
        straggle(
            &mut traces,
            1,
            |i, _| if i == 0 { 30 } else { 0 },
            |f| f == b,
        );
        assert_eq!(traces[1].executions[1].start_ns, 130);
        // Peers enter b on time and leave it when the straggler arrives.
        assert_eq!(traces[0].executions[1].start_ns, 100);
        assert_eq!(traces[0].executions[1].end_ns, 230);
    }

    #[test]
    fn choose_is_distinct_and_sorted() {
        let c = Rng::new(1).choose(16, 4);
        assert_eq!(c.len(), 4);
        assert!(c.windows(2).all(|w| w[0] < w[1]));
    }
}
