//! The profiling window T of PerfTracker §4.2 (Eq. 2).

use whyslow_model::WorkerTrace;

/// The profiling window T (start_ns, end_ns), end exclusive.
///
/// * `steps = None`: the traced span `trace.span`. When that span is empty or
///   inverted (e.g. a trace built without one), the extent of the executions
///   (earliest start to latest end) instead; `None` when there is neither.
/// * `steps = Some((a, b))`: from the start of `ProfilerStep#a` to the end of
///   `ProfilerStep#b` (`trace.steps`). `a` and `b` may come in either order.
///   When some of the steps a..=b are missing, the window spans the ones that
///   are present (earliest start to latest end among steps numbered a..=b);
///   `None` when none of them is in the trace.
///
/// Executions are clipped to the window by the callers. Never panics.
pub fn window(trace: &WorkerTrace, steps: Option<(u64, u64)>) -> Option<(i64, i64)> {
    match steps {
        None => {
            let (s, e) = trace.span;
            if e > s {
                return Some((s, e));
            }
            let mut lo = i64::MAX;
            let mut hi = i64::MIN;
            for x in &trace.executions {
                if x.end_ns >= x.start_ns {
                    lo = lo.min(x.start_ns);
                    hi = hi.max(x.end_ns);
                }
            }
            (lo <= hi).then_some((lo, hi))
        }
        Some((a, b)) => {
            let (a, b) = (a.min(b), a.max(b));
            let mut lo = i64::MAX;
            let mut hi = i64::MIN;
            for &(n, s, e) in &trace.steps {
                if n >= a && n <= b && e >= s {
                    lo = lo.min(s);
                    hi = hi.max(e);
                }
            }
            (lo <= hi).then_some((lo, hi))
        }
    }
}

/// Which of the steps a..=b the trace holds: (first, last) step numbers found.
pub(crate) fn steps_found(trace: &WorkerTrace, a: u64, b: u64) -> Option<(u64, u64)> {
    let (a, b) = (a.min(b), a.max(b));
    let mut first = None::<u64>;
    let mut last = None::<u64>;
    for &(n, s, e) in &trace.steps {
        if n >= a && n <= b && e >= s {
            first = Some(first.map_or(n, |f| f.min(n)));
            last = Some(last.map_or(n, |l| l.max(n)));
        }
    }
    Some((first?, last?))
}
