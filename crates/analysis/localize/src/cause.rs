//! The cause first (crate docs, "The cause first"; not in the papers): what
//! each finding explains, the consequences folded under their cause, and the
//! order of the findings.

use whyslow_model::{Consequence, Finding, FunctionKind, Relation, Stat, UtilizationSource};

use crate::stats::median;
use crate::LocalizeConfig;

/// The cause first (whyslow, not in the papers): each finding's share of the
/// iteration ([`Finding::explains`]); a collective in which the other
/// workers wait for the workers of a finding on part of the group, and other
/// functions slower on exactly those workers, are folded under that finding
/// as [`Finding::consequences`]; then the findings are ordered by what they
/// explain.
pub(crate) fn cause_first(mut findings: Vec<Finding>, cfg: &LocalizeConfig) -> Vec<Finding> {
    let partial = |f: &Finding| f.group_workers > 0 && f.workers.len() < f.group_workers;
    for f in &mut findings {
        f.explains = if partial(f) {
            (f.beta.value - f.beta.peers).max(0.0)
        } else {
            (f.beta.value - cfg.range_for(f.kind, &f.function).beta.1).max(0.0)
        };
    }
    // Causes: findings on part of a group that are not themselves waiting.
    let mut order: Vec<usize> = (0..findings.len()).collect();
    order.sort_by(|&a, &b| {
        findings[b]
            .explains
            .total_cmp(&findings[a].explains)
            .then_with(|| findings[a].function.cmp(&findings[b].function))
    });
    let mut folded = vec![false; findings.len()];
    let mut rescored: Vec<(usize, f64)> = Vec::new();
    for &c in &order {
        if folded[c] || !partial(&findings[c]) || findings[c].kind == FunctionKind::Comm {
            continue;
        }
        let mut consequences = Vec::new();
        for &o in &order {
            if o == c || folded[o] || findings[o].group != findings[c].group {
                continue;
            }
            let (cause, other) = (&findings[c], &findings[o]);
            let relation = if other.kind == FunctionKind::Comm {
                // Waiting: the others spend more of their window in the
                // collective than the cause's workers do.
                let (on, off) = split_points(other, &cause.workers);
                let (mut on, mut off) = (on, off);
                let (b_on, b_off) = (median(&mut on), median(&mut off));
                // Not folded: a collective flagged on the cause's own
                // workers, or one above its expected range even there; one
                // whose plot points do not include the cause's workers (no
                // evidence either way); and one flagged on other workers that
                // do not themselves spend more of their window in it than the
                // cause's workers (a slow link of their own, not waiting).
                let own = partial(other) && other.workers.iter().any(|w| cause.workers.contains(w));
                let range_max = cfg.range_for(other.kind, &other.function).beta.1;
                let beyond = b_on > range_max;
                let waits = !partial(other) || other.beta.value - b_on >= cfg.min_effect;
                // Flagged on other workers *starved* in it (μ or σ that far
                // below their peers': low and steady, PerfTracker Fig. 5):
                // a slow link of their own, not a wait for the cause.
                let starved_itself = partial(other)
                    && other.util_source != UtilizationSource::None
                    && other.mu.has_peers()
                    && (other.mu.value <= other.mu.peers - cfg.min_util_diff
                        || other.sigma.value <= other.sigma.peers - cfg.min_util_diff);
                let waiting_on_cause = !own
                    && !starved_itself
                    && waits
                    && !on.is_empty()
                    && !off.is_empty()
                    && b_off - b_on >= cfg.min_effect;
                if waiting_on_cause && beyond {
                    // Above its range even on the cause's workers: the
                    // collective stays a finding of its own, but what it
                    // explains is only that excess; the rest is waiting.
                    rescored.push((o, (b_on - range_max).max(0.0)));
                }
                (waiting_on_cause && !beyond).then(|| {
                    let waiting: Vec<u32> = other
                        .points
                        .iter()
                        .filter(|p| !cause.workers.contains(&p.worker))
                        .map(|p| p.worker)
                        .collect();
                    (Relation::WaitsFor, waiting, b_off, b_on)
                })
            } else if partial(other) && other.workers == cause.workers {
                Some((
                    Relation::AlsoSlower,
                    other.workers.clone(),
                    other.beta.value,
                    other.beta.peers,
                ))
            } else {
                None
            };
            let Some((relation, workers, value, peers)) = relation else {
                continue;
            };
            consequences.push(Consequence {
                function: other.function.clone(),
                kind: other.kind,
                relation,
                workers,
                beta: Stat {
                    value,
                    peers,
                    peer_count: None,
                },
            });
            folded[o] = true;
        }
        findings[c].consequences = consequences;
    }
    for (o, explains) in rescored {
        findings[o].explains = findings[o].explains.min(explains);
    }
    let mut kept: Vec<Finding> = findings
        .into_iter()
        .zip(folded)
        .filter_map(|(f, folded)| (!folded).then_some(f))
        .collect();
    kept.sort_by(|a, b| {
        b.explains
            .total_cmp(&a.explains)
            .then_with(|| by_weight(a, b))
    });
    kept
}

/// Median flagged β × flagged workers, descending; then function and group
/// names, so that the order does not depend on the input's.
pub(crate) fn by_weight(a: &Finding, b: &Finding) -> std::cmp::Ordering {
    let ka = a.beta.value * a.workers.len() as f64;
    let kb = b.beta.value * b.workers.len() as f64;
    kb.total_cmp(&ka)
        .then_with(|| a.function.cmp(&b.function))
        .then_with(|| a.group.cmp(&b.group))
}

/// β of a finding's plotted workers on `workers` and on the others.
fn split_points(f: &Finding, workers: &[u32]) -> (Vec<f64>, Vec<f64>) {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for p in &f.points {
        if workers.contains(&p.worker) {
            on.push(p.beta);
        } else {
            off.push(p.beta);
        }
    }
    (on, off)
}
