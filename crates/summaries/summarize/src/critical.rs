//! The critical path of PerfTracker §4.2 (Figure 9), as one sweep over the
//! executions' boundaries.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use whyslow_model::{FunctionKind, WorkerTrace};

/// Number of critical-path tiers of the sweep (see [`critical_path`]): kernel
/// (0), memory op (1), comm op (2), training-thread Python (3),
/// training-thread CPU op (4), CPU op on another thread (5).
const TIERS: usize = 6;
/// `pos` value of an execution that is not a candidate now.
const ABSENT: u32 = u32::MAX;

/// One stretch of time during which one execution is on the critical path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CriticalSegment {
    /// Start, ns (inclusive).
    pub start_ns: i64,
    /// End, ns (exclusive).
    pub end_ns: i64,
    /// Index of the execution in `trace.executions`.
    pub execution: u32,
    /// How many executions of the same tier share this stretch (≥ 1); this
    /// execution is credited `(end_ns - start_ns) / share` ns.
    pub share: u32,
}

/// The critical path of one worker over one window (PerfTracker §4.2, Figure 9;
/// C(f, w, t) of Eq. 3 for every execution).
#[derive(Debug, Clone, PartialEq)]
pub struct CriticalPath {
    /// The window the path was computed over (start_ns, end_ns).
    pub window: (i64, i64),
    /// Critical time of each execution in ns, indexed like `trace.executions`
    /// (0 for executions outside the window or never critical). Fractional
    /// when concurrent executions of one tier share time.
    pub critical_ns: Vec<f64>,
    /// The critical sub-intervals, one per (execution, maximal stretch with a
    /// constant share), ordered by start time. Concurrent executions that share
    /// a stretch each get a segment.
    pub segments: Vec<CriticalSegment>,
    /// Time in the window during which something is on the critical path, ns
    /// (equals Σ `critical_ns`, up to rounding).
    pub covered_ns: f64,
    /// Executions overlapping the window for a positive time.
    pub in_window: usize,
    /// Executions ignored as malformed: `end_ns < start_ns`, or a function id
    /// that is not in the trace's function table.
    pub ignored: usize,
}

impl CriticalPath {
    /// Critical time per function in ns, indexed by [`whyslow_model::FunctionId`].
    pub fn by_function(&self, trace: &WorkerTrace) -> Vec<f64> {
        let mut out = vec![0.0; trace.functions.len()];
        for (x, &ns) in trace.executions.iter().zip(&self.critical_ns) {
            if let Some(slot) = out.get_mut(x.function.0 as usize) {
                *slot += ns;
            }
        }
        out
    }
}

/// `b − a` in ns as f64 (0 when `b ≤ a`), without overflow for any i64s.
#[inline]
pub(crate) fn span_ns(a: i64, b: i64) -> f64 {
    if b > a {
        // b − a < 2^64, so the wrapped difference read as u64 is exact.
        b.wrapping_sub(a) as u64 as f64
    } else {
        0.0
    }
}

/// A hasher for u32 thread ids (std's SipHash is needlessly slow here).
#[derive(Default)]
struct ThreadHasher(u64);

impl std::hash::Hasher for ThreadHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u32(&mut self, i: u32) {
        self.0 = (self.0 ^ i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type ThreadMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<ThreadHasher>>;

/// True when a Python call stack (outermost frame first, `;`-joined) is rooted
/// in `threading`'s `_bootstrap`, i.e. runs on a thread that Python started,
/// not the training thread (PerfTracker §4.2).
pub fn is_bootstrap_stack(stack: &str) -> bool {
    stack
        .split(';')
        .next()
        .is_some_and(|f| f.contains("_bootstrap"))
}

/// Computes the critical path of `trace` over `window` (PerfTracker §4.2,
/// Figure 9) and the critical time of every execution.
///
/// # Rules
///
/// Executions are clipped to the window; empty ones (after clipping) take no
/// part. Every instant is credited to the executions of the highest-priority
/// *tier* that has a candidate at that instant:
///
/// 0. GPU kernels — every running kernel, on any stream;
/// 1. memory operations — every running one, on any thread or stream;
/// 2. communication — every running one, on any thread or stream;
/// 3. Python functions on a training thread, while *running* (see below);
/// 4. CPU ops on a training thread, while running;
/// 5. CPU ops on any other thread, while running — i.e. only when nothing of
///    tiers 0–4 runs at all (whyslow's choice; the paper is silent).
///
/// This is the paper's "on the critical path iff no higher-priority function
/// is executing". When k executions of the top tier run at once (kernels on two
/// streams, …) each is credited 1/k of the time, so Σβ ≤ 1.
///
/// **CPU-side nesting.** Python functions and CPU ops nest by time containment
/// on their `thread`. On each thread the *running* execution is the active one
/// that started last (ties: the shorter, then the later index); the others are
/// its ancestors and are not running ("no child functions … are executing").
/// This is the innermost one for properly nested intervals, and stays well
/// defined for overlapping-but-not-nested ones: when A = [0, 10) and
/// B = [5, 15) share a thread, A runs on [0, 5) and B on [5, 15). Memory and
/// communication ops and kernels do not take part in nesting: whenever one runs
/// it outranks every Python function and CPU op anyway, so its parent's time is
/// excluded all the same.
///
/// **Training thread.** With `trace.training_thread = Some(t)` only thread t is
/// a training thread. With `None`, every thread is one unless some Python
/// execution on it has a stack rooted in `_bootstrap` ([`is_bootstrap_stack`]).
/// Python on other threads is never critical (§4.2).
///
/// Runs in O(n log n) (one sort of the start events; ends go through a heap
/// holding only the running executions) and never panics.
pub fn critical_path(trace: &WorkerTrace, window: (i64, i64)) -> CriticalPath {
    let mut critical_ns = vec![0.0; trace.executions.len()];
    let r = sweep(trace, window, Sink::PerExecution(&mut critical_ns), true);
    CriticalPath {
        window,
        critical_ns,
        segments: r.segments,
        covered_ns: r.covered_ns,
        in_window: r.in_window,
        ignored: r.ignored,
    }
}

/// Critical time per function (ns, indexed by function id), for `summarize`.
pub(crate) fn critical_by_function(trace: &WorkerTrace, window: (i64, i64)) -> (Vec<f64>, Swept) {
    let mut out = vec![0.0; trace.functions.len()];
    let r = sweep(trace, window, Sink::PerFunction(&mut out), false);
    (out, r)
}

/// What a sweep found besides the critical times.
pub(crate) struct Swept {
    pub segments: Vec<CriticalSegment>,
    pub covered_ns: f64,
    pub in_window: usize,
    pub ignored: usize,
}

/// Where critical time is credited.
enum Sink<'a> {
    PerExecution(&'a mut [f64]),
    PerFunction(&'a mut [f64]),
}

/// Bits of a start event's payload below the tier: the stack lane.
const LANE_BITS: u32 = 29;
const LANE_MASK: u32 = (1 << LANE_BITS) - 1;
/// Lane of executions that take no part in CPU-side nesting.
const NO_STACK: u32 = LANE_MASK;
/// Tier value of executions that are never critical (Python off the training
/// thread); fits the 3 bits above the lane.
const NOT_CRITICAL: u8 = 7;
/// Flag bit: the execution has ended (for the lazy per-thread stacks).
const ENDED: u8 = 0x80;

/// The candidates of every tier and the lazy accounting of their time.
///
/// Executions are handled by *rank* (position in start order), so that the
/// per-execution state is read and written almost sequentially.
///
/// `acc[c]` is ∫ 1/k_c dt over the time tier c was the top tier (k_c its
/// candidate count). An execution that is a candidate from time a to time b is
/// credited `acc[c](b) − acc[c](a)`: `credit[r]` gets −acc on entry and +acc on
/// exit, O(1) per transition however many candidates share the time.
struct Candidates {
    acc: [f64; TIERS],
    sets: [Vec<u32>; TIERS],
    pos: Vec<u32>,
    credit: Vec<f64>,
    /// Tier (low 3 bits) and [`ENDED`], per rank.
    flags: Vec<u8>,
}

impl Candidates {
    #[inline]
    fn add(&mut self, r: u32) {
        let c = self.flags[r as usize] & 7;
        if c == NOT_CRITICAL {
            return;
        }
        let set = &mut self.sets[c as usize];
        self.pos[r as usize] = set.len() as u32;
        set.push(r);
        self.credit[r as usize] -= self.acc[c as usize];
    }

    #[inline]
    fn remove(&mut self, r: u32) {
        let p = self.pos[r as usize];
        if p == ABSENT {
            return;
        }
        let c = (self.flags[r as usize] & 7) as usize;
        self.credit[r as usize] += self.acc[c];
        let set = &mut self.sets[c];
        set.swap_remove(p as usize);
        if let Some(&moved) = set.get(p as usize) {
            self.pos[moved as usize] = p;
        }
        self.pos[r as usize] = ABSENT;
    }
}

/// A start event per execution in the window: (start, Reverse(end), index,
/// tier << LANE_BITS | lane); lane: a dense index of the CPU thread, or
/// NO_STACK.
type StartEvent = (i64, Reverse<i64>, u32, u32);

/// The start events of [`sweep`] ([`StartEvent`]): each execution clipped
/// to the window and put in its tier (kernels, memory, comm, then
/// training-thread Python and CPU ops, then other threads'), sorted by
/// start, longest first, index; with the number of lanes and of the
/// executions ignored (end before start, unknown function).
fn start_events(trace: &WorkerTrace, window: (i64, i64)) -> (Vec<StartEvent>, usize, usize) {
    let (w0, w1) = window;
    let execs = &trace.executions;
    let n_fn = trace.functions.len();
    // Per function: kind, and whether it is a `_bootstrap`-rooted Python stack.
    let mut kinds = Vec::with_capacity(n_fn);
    let mut bootstrap_fn = Vec::with_capacity(n_fn);
    for (_, f) in trace.functions.iter() {
        kinds.push(f.kind);
        bootstrap_fn.push(f.kind == FunctionKind::Python && is_bootstrap_stack(&f.name));
    }
    // Threads Python started (only needed when the training thread is unknown).
    let mut bootstrap_threads: ThreadMap<()> = ThreadMap::default();
    if trace.training_thread.is_none() && bootstrap_fn.iter().any(|&b| b) {
        for x in execs {
            if bootstrap_fn.get(x.function.0 as usize) == Some(&true) {
                bootstrap_threads.insert(x.thread, ());
            }
        }
    }
    let is_training = |thread: u32| match trace.training_thread {
        Some(t) => thread == t,
        None => !bootstrap_threads.contains_key(&thread),
    };

    // Start events sorted by (start, longest first, index), carrying
    // tier << LANE_BITS | lane (lane: dense CPU thread index, or NO_STACK).
    let mut starts: Vec<StartEvent> = Vec::with_capacity(execs.len());
    let mut lanes: ThreadMap<u32> = ThreadMap::default();
    let mut cache: Option<(u32, u32, bool)> = None;
    let mut ignored = 0usize;
    for (i, x) in execs.iter().enumerate() {
        let Some(&kind) = kinds.get(x.function.0 as usize) else {
            ignored += 1;
            continue;
        };
        if x.end_ns < x.start_ns {
            ignored += 1;
            continue;
        }
        let s = x.start_ns.max(w0);
        let e = x.end_ns.min(w1);
        if e <= s {
            continue;
        }
        let (tier, lane) = match kind {
            FunctionKind::GpuKernel => (0, NO_STACK),
            FunctionKind::Memory => (1, NO_STACK),
            FunctionKind::Comm => (2, NO_STACK),
            FunctionKind::Python | FunctionKind::CpuOp => {
                let (lane, training) = match cache {
                    Some((th, lane, tr)) if th == x.thread => (lane, tr),
                    _ => {
                        // More than 2^29 - 1 threads cannot happen in practice;
                        // if it did, the extra threads would share one lane.
                        let next = (lanes.len() as u32).min(NO_STACK - 1);
                        let lane = *lanes.entry(x.thread).or_insert(next);
                        let tr = is_training(x.thread);
                        cache = Some((x.thread, lane, tr));
                        (lane, tr)
                    }
                };
                let tier = match (kind, training) {
                    (FunctionKind::Python, true) => 3,
                    (FunctionKind::Python, false) => NOT_CRITICAL,
                    (_, true) => 4,
                    (_, false) => 5,
                };
                (tier, lane)
            }
        };
        starts.push((s, Reverse(e), i as u32, (tier as u32) << LANE_BITS | lane));
    }
    starts.sort_unstable();
    (starts, lanes.len(), ignored)
}

fn sweep(trace: &WorkerTrace, window: (i64, i64), sink: Sink<'_>, record: bool) -> Swept {
    let (w0, _) = window;
    let execs = &trace.executions;
    let (starts, n_lanes, ignored) = start_events(trace, window);
    let m = starts.len();

    let mut cands = Candidates {
        acc: [0.0; TIERS],
        sets: Default::default(),
        pos: vec![ABSENT; m],
        credit: vec![0.0; m],
        flags: starts.iter().map(|x| (x.3 >> LANE_BITS) as u8).collect(),
    };
    let mut stacks: Vec<Vec<u32>> = vec![Vec::new(); n_lanes];
    let mut segments: Vec<CriticalSegment> = Vec::new();
    let mut last_seg: Vec<u32> = if record { vec![ABSENT; m] } else { Vec::new() };
    // Running executions by end: (end, rank, lane).
    let mut running: BinaryHeap<Reverse<(i64, u32, u32)>> = BinaryHeap::new();
    let mut covered = 0.0f64;
    let mut t_prev = w0;
    let mut i = 0usize;

    loop {
        let next_start = starts.get(i).map(|x| x.0);
        let next_end = running.peek().map(|r| r.0 .0);
        let t = match (next_start, next_end) {
            (None, None) => break,
            (Some(a), None) => a,
            (None, Some(b)) => b,
            (Some(a), Some(b)) => a.min(b),
        };
        if t > t_prev {
            // Credit [t_prev, t) to the top tier.
            if let Some(c) = (0..TIERS).find(|&c| !cands.sets[c].is_empty()) {
                let dt = span_ns(t_prev, t);
                let k = cands.sets[c].len();
                cands.acc[c] += dt / k as f64;
                covered += dt;
                if record {
                    for &r in &cands.sets[c] {
                        let ls = last_seg[r as usize];
                        match segments.get_mut(ls as usize) {
                            Some(seg) if seg.end_ns == t_prev && seg.share == k as u32 => {
                                seg.end_ns = t;
                            }
                            _ => {
                                last_seg[r as usize] = segments.len() as u32;
                                segments.push(CriticalSegment {
                                    start_ns: t_prev,
                                    end_ns: t,
                                    execution: starts[r as usize].2,
                                    share: k as u32,
                                });
                            }
                        }
                    }
                }
            }
            t_prev = t;
        }
        // Ends at t, then starts at t (abutting executions do not overlap).
        while let Some(&Reverse((te, r, lane))) = running.peek() {
            if te != t {
                break;
            }
            running.pop();
            if lane == NO_STACK {
                cands.remove(r);
                continue;
            }
            cands.flags[r as usize] |= ENDED;
            let stack = &mut stacks[lane as usize];
            if stack.last() == Some(&r) {
                cands.remove(r);
                while stack
                    .last()
                    .is_some_and(|&x| cands.flags[x as usize] & ENDED != 0)
                {
                    stack.pop();
                }
                if let Some(&x) = stack.last() {
                    cands.add(x);
                }
            }
        }
        while let Some(&(s, Reverse(te), _, payload)) = starts.get(i) {
            if s != t {
                break;
            }
            let r = i as u32;
            i += 1;
            let lane = payload & LANE_MASK;
            running.push(Reverse((te, r, lane)));
            if lane != NO_STACK {
                let stack = &mut stacks[lane as usize];
                if let Some(&parent) = stack.last() {
                    cands.remove(parent);
                }
                stack.push(r);
            }
            cands.add(r);
        }
    }

    match sink {
        Sink::PerExecution(out) => {
            for (x, &c) in starts.iter().zip(&cands.credit) {
                out[x.2 as usize] = c;
            }
        }
        Sink::PerFunction(out) => {
            for (x, &c) in starts.iter().zip(&cands.credit) {
                out[execs[x.2 as usize].function.0 as usize] += c;
            }
        }
    }

    Swept {
        segments,
        covered_ns: covered,
        in_window: m,
        ignored,
    }
}
