//! whyslow's summaries stage: one worker's trace → its [`Fingerprint`], the
//! per-function behavior patterns P_{f,w} = (β, μ, σ) of PerfTracker §4.2
//! (Eq. 1–5). Pure: no I/O, no threads.
//!
//! The steps, each documented where it is implemented:
//!
//! 1. [`window`]: the profiling window T (traced span or a range of
//!    `ProfilerStep`s); executions are clipped to it.
//! 2. [`critical_path`]: which (sub-intervals of) executions are on the
//!    worker's critical path (§4.2, Figure 9) — C(f, w, t) of Eq. 3.
//! 3. [`critical_execution_duration`]: Algorithm 1, the critical execution
//!    duration L(e) inside one execution's utilization samples (Figure 10).
//! 4. [`summarize`]: β (Eq. 2), μ (Eq. 4) and σ (Eq. 5) per function.
//!
//! # Choices where the paper is silent
//!
//! * CPU ops are a fifth tier below Python; CPU ops on threads other than the
//!   training thread are a sixth, critical only when nothing else runs.
//! * With no known training thread, every thread is one unless some Python
//!   stack on it is rooted in `_bootstrap`.
//! * On a CPU thread the running execution is the active one that started
//!   last; this is the innermost for nested events and a consistent rule for
//!   overlapping ones. Memory and comm ops do not nest (they outrank Python).
//! * Concurrent executions of the top tier share time equally (Σβ ≤ 1).
//! * Algorithm 1 returns, for the smallest feasible g, the heaviest then
//!   shortest interval (unique: the qualifying piece without edge zeros).
//! * μ/σ use every execution of the function in the window, not only its
//!   critical part; |L(e)| counts samples; executions without samples or with
//!   only zeros add nothing; with no usable samples μ/σ fall back to the
//!   trace's per-execution utilization.
#![deny(missing_docs)]

mod critical;
mod duration;
mod window;

use std::collections::BTreeMap;

use whyslow_model::{
    Fingerprint, FunctionPattern, JobIdentity, Resource, SampleSeries, UtilizationSource,
    WorkerTrace, FINGERPRINT_FORMAT, FINGERPRINT_VERSION,
};

pub use critical::{critical_path, is_bootstrap_stack, CriticalPath, CriticalSegment};
pub use duration::{critical_execution_duration, CRITICAL_MASS_FRACTION};
pub use window::window;

/// How to summarize a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct SummarizeOptions {
    /// Summarize from the start of `ProfilerStep#a` to the end of
    /// `ProfilerStep#b` instead of the whole traced span (see [`window`]).
    pub steps: Option<(u64, u64)>,
    /// Keep only functions with β ≥ this (default 0.001). Functions left out
    /// read as β = μ = σ = 0 in localization. NaN reads as 0.
    pub beta_floor: f64,
    /// Keep at most this many functions, highest β first (default 100).
    pub max_functions: usize,
}

impl Default for SummarizeOptions {
    fn default() -> Self {
        SummarizeOptions {
            steps: None,
            beta_floor: 0.001,
            max_functions: 100,
        }
    }
}

/// Summarizes one worker's trace into its fingerprint (PerfTracker §4.2).
///
/// For every function f with executions in the window T:
///
/// * **β** (Eq. 2) = (critical time of f's executions, from
///   [`critical_path`]) / |T|; Σβ ≤ 1.
/// * **μ, σ** (Eq. 4, 5), from the sample series of f's resource in
///   `samples` when there is one. For *every* execution e of f in the window
///   (not only its critical part — Eq. 4 sums over all of E_{f,w}): the samples
///   with timestamps in e's clipped [start, end) give L(e) by Algorithm 1
///   ([`critical_execution_duration`]), then avg_U(L(e)) and std_U(L(e))
///   (population std) over the samples in L(e); μ = Σ|L(e)| avg / Σ|L(e)| and
///   σ = Σ|L(e)| std / Σ|L(e)|. |L(e)| is the number of samples in L(e), which is
///   proportional to its length in time at a fixed sampling rate. Sample values
///   are clamped to [0, 1]; NaN counts as 0. Executions without samples inside
///   (shorter than the sampling period) or with only zeros (no L(e)) add
///   nothing. `util_source = Samples`.
/// * **Trace fallback**: when there is no series for f's resource, or none of
///   f's executions holds a sample, μ and σ come from the utilization the trace
///   carries ([`whyslow_model::Execution::trace_util`], NaN = unknown,
///   clamped to [0, 1]): μ = duration-weighted mean over the executions that
///   have one, σ = duration-weighted std across those executions (each
///   weighted by its clipped duration, at least 1 ns). This is not the paper's
///   within-execution σ. `util_source = Trace`.
/// * Neither: μ = σ = 0, `util_source = None`.
///
/// Functions are sorted by β descending (ties: total time, then kind, then
/// name), those with β ≥ `beta_floor` kept, at most `max_functions`.
///
/// When the requested steps are not in the trace the whole traced span is
/// summarized, with a warning (call [`window`] first to refuse instead). The
/// fingerprint's warnings are the trace's followed by the summarizer's. Never
/// panics.
pub fn summarize(
    trace: &WorkerTrace,
    samples: &BTreeMap<Resource, SampleSeries>,
    opts: &SummarizeOptions,
) -> Fingerprint {
    let mut warnings = trace.warnings.clone();

    // 1. The window T.
    let (w0, w1) = requested_window(trace, opts, &mut warnings);
    let window_ns = critical::span_ns(w0, w1);
    let mut fp = empty_fingerprint(trace, w0, window_ns);

    // 2. Critical time per function (Eq. 2, 3).
    let (critical, swept) = critical::critical_by_function(trace, (w0, w1));
    if swept.ignored > 0 {
        warnings.push(format!(
            "{} executions ignored: end before start, or a function id not in the trace's \
             function table",
            swept.ignored
        ));
    }
    if trace.training_thread.is_none()
        && trace
            .functions
            .iter()
            .any(|(_, f)| f.kind == whyslow_model::FunctionKind::Python)
    {
        warnings.push(
            "training thread unknown: Python on every thread without a `_bootstrap`-rooted stack \
             counted as training-thread Python"
                .to_string(),
        );
    }
    let (calls, total_ns) = calls_and_totals(trace, (w0, w1));
    if calls.iter().all(|&c| c == 0) {
        warnings.push(if window_ns > 0.0 {
            "window has no executions".to_string()
        } else {
            "window is empty (zero length); nothing to summarize".to_string()
        });
    }
    let totals = Totals {
        trace,
        calls,
        total_ns,
        critical,
        window_ns,
    };

    // 3. β, then which functions to keep.
    let kept = choose_functions(&totals, opts, &mut fp, &mut warnings);
    fp.kernels = kernel_totals(&totals);

    // 4. μ, σ (Eq. 4, 5) for the kept functions.
    let util = utilization(trace, samples, &kept, (w0, w1), &mut warnings);
    push_patterns(&mut fp, &totals, &kept, &util);
    fp.warnings = warnings;
    fp
}

/// The window T (§4.1): the requested ProfilerSteps, else the whole traced
/// span, with a warning when steps were asked for and are (partly) missing.
fn requested_window(
    trace: &WorkerTrace,
    opts: &SummarizeOptions,
    warnings: &mut Vec<String>,
) -> (i64, i64) {
    let win = match opts.steps {
        None => window(trace, None),
        Some((a, b)) => match window(trace, Some((a, b))) {
            Some(w) => {
                let (a, b) = (a.min(b), a.max(b));
                if let Some((first, last)) = window::steps_found(trace, a, b) {
                    if first != a || last != b {
                        warnings.push(format!(
                            "steps {a}..={b} requested but the trace holds only steps \
                             {first}..={last} of them; summarized those"
                        ));
                    }
                }
                Some(w)
            }
            None => {
                warnings.push(format!(
                    "steps {a}..={b} are not in the trace ({} ProfilerSteps); summarized the \
                     whole traced span",
                    trace.steps.len()
                ));
                window(trace, None)
            }
        },
    };
    win.unwrap_or((trace.span.0, trace.span.0))
}

/// A fingerprint of `trace` over the window from `w0` (ns), `window_ns`
/// long, with no functions yet.
fn empty_fingerprint(trace: &WorkerTrace, w0: i64, window_ns: f64) -> Fingerprint {
    Fingerprint {
        format: FINGERPRINT_FORMAT.to_string(),
        version: FINGERPRINT_VERSION,
        worker: trace.meta.rank,
        host: trace.meta.host.clone(),
        group: trace.meta.group.clone(),
        window_start_us: w0 as f64 / 1000.0,
        window_us: window_ns / 1000.0,
        device: trace.device.clone(),
        job: JobIdentity {
            world_size: trace.meta.world_size,
            backend: trace.backend.clone(),
            ..JobIdentity::default()
        }
        .known(),
        utilization_source: UtilizationSource::None,
        source: trace.meta.source.clone(),
        functions: Vec::new(),
        total_floor: 0.0,
        omitted: Vec::new(),
        warnings: Vec::new(),
        network: None,
        kernels: Vec::new(),
        steps: trace
            .steps
            .iter()
            .map(|s| (s.0, s.2.saturating_sub(s.1) as f64 / 1e6))
            .collect(),
    }
}

/// Calls and total time (ns, clipped to the window) of every function.
fn calls_and_totals(trace: &WorkerTrace, (w0, w1): (i64, i64)) -> (Vec<u64>, Vec<f64>) {
    let n_fn = trace.functions.len();
    let mut calls = vec![0u64; n_fn];
    let mut total_ns = vec![0f64; n_fn];
    for x in &trace.executions {
        let f = x.function.0 as usize;
        if f >= n_fn || x.end_ns < x.start_ns {
            continue;
        }
        let s = x.start_ns.max(w0);
        let e = x.end_ns.min(w1);
        if e > s || (x.start_ns == x.end_ns && x.start_ns >= w0 && x.start_ns < w1) {
            calls[f] += 1;
            total_ns[f] += critical::span_ns(s, e);
        }
    }

    (calls, total_ns)
}

/// Per-function figures over the window, by function index.
struct Totals<'t> {
    trace: &'t WorkerTrace,
    calls: Vec<u64>,
    total_ns: Vec<f64>,
    critical: Vec<f64>,
    window_ns: f64,
}

impl Totals<'_> {
    /// β (Eq. 3): critical time over the window, in [0, 1].
    fn beta(&self, f: usize) -> f64 {
        if self.window_ns > 0.0 {
            (self.critical[f] / self.window_ns).clamp(0.0, 1.0)
        } else {
            0.0
        }
    }

    /// Share of the window the function ran, on the critical path or not.
    fn share(&self, f: usize) -> f64 {
        if self.window_ns > 0.0 {
            self.total_ns[f] / self.window_ns
        } else {
            0.0
        }
    }

    /// The fingerprint's order: β descending, then total time, kind, name.
    fn order(&self, a: usize, b: usize) -> std::cmp::Ordering {
        let (fa, fb) = (
            self.trace.functions.get(id(a)),
            self.trace.functions.get(id(b)),
        );
        self.beta(b)
            .total_cmp(&self.beta(a))
            .then(self.total_ns[b].total_cmp(&self.total_ns[a]))
            .then(fa.kind.cmp(&fb.kind))
            .then(fa.name.cmp(&fb.name))
    }
}

/// The functions the fingerprint keeps, in its order: β ≥ the floor (at
/// most `max_functions`), then those that ran a share of the window off the
/// critical path (as many more); sets `total_floor` and `omitted`.
fn choose_functions(
    t: &Totals,
    opts: &SummarizeOptions,
    fp: &mut Fingerprint,
    warnings: &mut Vec<String>,
) -> Vec<usize> {
    let n_fn = t.calls.len();
    let floor = if opts.beta_floor.is_nan() {
        0.0
    } else {
        opts.beta_floor
    };
    let mut kept: Vec<usize> = (0..n_fn)
        .filter(|&f| t.calls[f] > 0 && t.beta(f) >= floor)
        .collect();
    kept.sort_by(|&a, &b| t.order(a, b));
    let mut rest: Vec<usize> = if kept.len() > opts.max_functions {
        warnings.push(format!(
            "{} functions with β ≥ {floor} left out beyond max_functions = {}",
            kept.len() - opts.max_functions,
            opts.max_functions
        ));
        kept.split_off(opts.max_functions)
    } else {
        Vec::new()
    };
    // Functions that run a share of the window but are (nearly) off the
    // critical path are kept too, up to max_functions more, so that the
    // localizer knows how long every notable function ran on every worker:
    // a function at the edge of the critical path is on it on some workers
    // and off it on others under mere timing noise.
    rest.extend((0..n_fn).filter(|&f| t.calls[f] > 0 && t.beta(f) < floor));
    rest.retain(|&f| t.share(f) >= floor);
    rest.sort_by(|&a, &b| {
        t.share(b)
            .total_cmp(&t.share(a))
            .then_with(|| t.order(a, b))
    });
    let extra = rest.len().min(opts.max_functions);
    kept.extend_from_slice(&rest[..extra]);
    // Every function left out ran for less than this share of the window.
    fp.total_floor = rest.get(extra).map_or(floor, |&f| t.share(f).max(floor));
    fp.omitted = rest[extra..]
        .iter()
        .map(|&f| {
            let info = t.trace.functions.get(id(f));
            whyslow_model::function_hash(info.kind, &info.name)
        })
        .collect();
    fp.omitted.sort_unstable();
    fp.omitted.dedup();
    kept
}

/// Every kernel's time, for the GPU diff (SysOM-AI §3.1), whatever its β.
fn kernel_totals(t: &Totals) -> Vec<whyslow_model::KernelTotal> {
    let mut kernels: Vec<usize> = (0..t.calls.len())
        .filter(|&f| {
            t.calls[f] > 0
                && t.trace.functions.get(id(f)).kind == whyslow_model::FunctionKind::GpuKernel
        })
        .collect();
    kernels.sort_by(|&a, &b| {
        t.total_ns[b]
            .total_cmp(&t.total_ns[a])
            .then_with(|| t.order(a, b))
    });
    kernels.truncate(whyslow_model::MAX_KERNELS);
    kernels
        .into_iter()
        .map(|f| whyslow_model::KernelTotal {
            name: t.trace.functions.get(id(f)).name.clone(),
            calls: t.calls[f],
            total_us: t.total_ns[f] / 1000.0,
        })
        .collect()
}

/// The utilization accumulated over each kept function's executions in the
/// window: from the resource's samples (Algorithm 1) and from the trace's
/// own per-execution figures.
fn utilization(
    trace: &WorkerTrace,
    samples: &BTreeMap<Resource, SampleSeries>,
    kept: &[usize],
    (w0, w1): (i64, i64),
    warnings: &mut Vec<String>,
) -> Vec<UtilAcc> {
    let n_fn = trace.functions.len();
    let mut series: BTreeMap<Resource, Series> = BTreeMap::new();
    for (&r, s) in samples {
        let needed = kept
            .iter()
            .any(|&f| trace.functions.get(id(f)).resource == r);
        if needed {
            series.insert(r, Series::new(r, s, warnings));
        }
    }
    let mut slot = vec![usize::MAX; n_fn];
    for (k, &f) in kept.iter().enumerate() {
        slot[f] = k;
    }
    let mut util = vec![UtilAcc::default(); kept.len()];
    for x in &trace.executions {
        let f = x.function.0 as usize;
        let Some(&k) = slot.get(f) else { continue };
        if k == usize::MAX || x.end_ns < x.start_ns {
            continue;
        }
        let s = x.start_ns.max(w0);
        let e = x.end_ns.min(w1);
        let point = x.start_ns == x.end_ns && x.start_ns >= w0 && x.start_ns < w1;
        if e <= s && !point {
            continue;
        }
        let acc = &mut util[k];
        if let Some(ser) = series.get(&trace.functions.get(id(f)).resource) {
            acc.add_samples(ser, s, e);
        }
        if x.trace_util.is_finite() {
            let w = critical::span_ns(s, e).max(1.0);
            let u = x.trace_util.clamp(0.0, 1.0) as f64;
            acc.t_w += w;
            acc.t_u += w * u;
            acc.t_u2 += w * u * u;
        }
    }

    util
}

/// μ and σ (Eq. 4, 5) of each kept function from its accumulated
/// utilization, pushed as the fingerprint's patterns; sets its
/// `utilization_source`.
fn push_patterns(fp: &mut Fingerprint, t: &Totals, kept: &[usize], util: &[UtilAcc]) {
    let mut any_samples = false;
    let mut any_trace = false;
    for (k, &f) in kept.iter().enumerate() {
        let info = t.trace.functions.get(id(f));
        let a = &util[k];
        let (mu, sigma, src) = if a.had_samples {
            if a.l_total > 0.0 {
                (
                    a.l_avg / a.l_total,
                    a.l_std / a.l_total,
                    UtilizationSource::Samples,
                )
            } else {
                (0.0, 0.0, UtilizationSource::Samples)
            }
        } else if a.t_w > 0.0 {
            let mu = a.t_u / a.t_w;
            let var = (a.t_u2 / a.t_w - mu * mu).max(0.0);
            (mu, var.sqrt(), UtilizationSource::Trace)
        } else {
            (0.0, 0.0, UtilizationSource::None)
        };
        any_samples |= src == UtilizationSource::Samples;
        any_trace |= src == UtilizationSource::Trace;
        fp.functions.push(FunctionPattern {
            name: info.name.clone(),
            kind: info.kind,
            resource: info.resource,
            beta: t.beta(f),
            mu: mu.clamp(0.0, 1.0),
            sigma: sigma.clamp(0.0, 1.0),
            util_source: src,
            calls: t.calls[f],
            critical_us: t.critical[f].max(0.0) / 1000.0,
            total_us: t.total_ns[f] / 1000.0,
        });
    }
    fp.utilization_source = if any_samples {
        UtilizationSource::Samples
    } else if any_trace {
        UtilizationSource::Trace
    } else {
        UtilizationSource::None
    };
}

fn id(f: usize) -> whyslow_model::FunctionId {
    whyslow_model::FunctionId(f as u32)
}

/// A sample series made safe to search: ascending timestamps, values in [0, 1].
struct Series {
    ts: Vec<i64>,
    values: Vec<f32>,
}

impl Series {
    fn new(r: Resource, s: &SampleSeries, warnings: &mut Vec<String>) -> Series {
        let n = s.ts_ns.len().min(s.values.len());
        if s.ts_ns.len() != s.values.len() {
            warnings.push(format!(
                "samples for {r}: {} timestamps but {} values; used the first {n}",
                s.ts_ns.len(),
                s.values.len()
            ));
        }
        let mut bad = 0usize;
        let mut pairs: Vec<(i64, f32)> = s.ts_ns[..n]
            .iter()
            .zip(&s.values[..n])
            .map(|(&t, &v)| {
                if !v.is_finite() {
                    bad += 1;
                    (t, 0.0)
                } else {
                    (t, v.clamp(0.0, 1.0))
                }
            })
            .collect();
        if bad > 0 {
            warnings.push(format!(
                "samples for {r}: {bad} non-finite values counted as 0"
            ));
        }
        if !pairs.windows(2).all(|w| w[0].0 <= w[1].0) {
            warnings.push(format!(
                "samples for {r}: timestamps not ascending; sorted them"
            ));
            pairs.sort_by_key(|p| p.0);
        }
        Series {
            ts: pairs.iter().map(|p| p.0).collect(),
            values: pairs.iter().map(|p| p.1).collect(),
        }
    }
}

/// Running sums of Eq. 4 / 5 (samples) and of the trace fallback.
#[derive(Clone, Default)]
struct UtilAcc {
    had_samples: bool,
    /// Σ |L(e)|.
    l_total: f64,
    /// Σ |L(e)| avg_U(L(e)).
    l_avg: f64,
    /// Σ |L(e)| std_U(L(e)).
    l_std: f64,
    t_w: f64,
    t_u: f64,
    t_u2: f64,
}

impl UtilAcc {
    /// Adds execution [s, e) of Eq. 4 / 5.
    fn add_samples(&mut self, ser: &Series, s: i64, e: i64) {
        let i0 = ser.ts.partition_point(|&t| t < s);
        let i1 = ser.ts.partition_point(|&t| t < e);
        if i1 <= i0 {
            return;
        }
        self.had_samples = true;
        let u = &ser.values[i0..i1];
        let Some((l, r)) = critical_execution_duration(u) else {
            return;
        };
        let l_e = &u[l..=r];
        let len = l_e.len() as f64;
        let mean = l_e.iter().map(|&v| v as f64).sum::<f64>() / len;
        let var = l_e
            .iter()
            .map(|&v| (v as f64 - mean) * (v as f64 - mean))
            .sum::<f64>()
            / len;
        self.l_total += len;
        self.l_avg += len * mean;
        self.l_std += len * var.sqrt();
    }
}
