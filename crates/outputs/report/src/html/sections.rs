//! The analyze report's sections as [`maud`] components (every value
//! escaped by the engine): the findings table, a finding's card, the
//! iteration-time card, the cross-layer diagnosis and the glossary. The
//! plots inside them are the SVG drawn by the parent module.

use std::collections::BTreeSet;

use maud::{html, Markup, PreEscaped};
use whyslow_model::diagnosis::{DiagnoseReport, LossyHost};
use whyslow_model::{
    Consequence, Finding, IterationSource, IterationTimes, Relation, Report, UtilizationSource,
};

use super::{cdf, iteration_plot, scatter};
use crate::format::*;

/// Every worker of the group is flagged: nothing to compare with.
pub(super) fn no_peers(f: &Finding) -> bool {
    f.group_workers > 0 && f.workers.len() >= f.group_workers
}

/// A measure against the peers': `31.2% = peers`, or the value and its
/// distance in red, then the peers'.
fn stat_cell(value: f64, peers: f64, label: &str) -> Markup {
    let a = arrow(value, peers);
    html! {
        @if a == "=" {
            (pct(value)) (label) " = peers"
        } @else {
            span.up { (pct(value)) (label) " " (a) " " (pp(value, peers)) }
            " vs " (pct(peers))
        }
    }
}

/// The findings' summary table, one row a finding (`via[i]`: the frame
/// finding `i` is called through, when findings share a title).
pub(super) fn findings_table(report: &Report, via: &[Option<String>]) -> Markup {
    html! {
        table {
            tr {
                th { "#" }
                th { "Abnormal function execution" }
                th { "Workers" }
                th { "Critical path β" }
                th { "Avg resource util. μ" }
                th { "Util. std σ" }
                th { "Why" }
            }
            @for (i, f) in report.findings.iter().enumerate() {
                (finding_row(f, i + 1, via.get(i).and_then(|v| v.as_deref())))
            }
        }
    }
}

/// One row of the findings table.
fn finding_row(f: &Finding, n: usize, via: Option<&str>) -> Markup {
    let critical = if no_peers(f) {
        duration_us(f.critical_us.value)
    } else {
        format!(
            "{} vs {}",
            duration_us(f.critical_us.value),
            duration_us(f.critical_us.peers)
        )
    };
    html! {
        tr {
            td { a href={ "#f" (n) } { (n) } }
            td.fn {
                b { (function_title(f, 200)) }
                @if let Some(v) = via { " " small { "via " (v) } }
                " " small { "[" (f.kind) "]" }
            }
            td { (workers_phrase(f)) }
            td {
                @if no_peers(f) {
                    (pct(f.beta.value))
                } @else {
                    (stat_cell(f.beta.value, f.beta.peers, ""))
                }
                " " small { "(" (critical) ")" }
            }
            td { (mu_cell(f)) }
            td { (sigma_cell(f)) }
            td { (reason_phrase(f.reason)) }
        }
    }
}

/// The μ column: n/a without utilization samples, else against the peers'
/// when they ran the function on their critical path.
fn mu_cell(f: &Finding) -> Markup {
    let label = f.resource.label();
    html! {
        @if f.util_source == UtilizationSource::None {
            "n/a"
        } @else if no_peers(f) || !f.mu.has_peers() {
            (pct(f.mu.value)) " " (label)
        } @else {
            (stat_cell(f.mu.value, f.mu.peers, &format!(" {label}")))
        }
    }
}

/// The σ column, as [`mu_cell`].
fn sigma_cell(f: &Finding) -> Markup {
    html! {
        @if f.util_source == UtilizationSource::None {
            "n/a"
        } @else if no_peers(f) || !f.sigma.has_peers() {
            (pct(f.sigma.value))
        } @else {
            (stat_cell(f.sigma.value, f.sigma.peers, ""))
        }
    }
}

/// One finding's card: where it is, on whom, why, what follows, the code
/// and its β/μ/σ plots.
pub(super) fn finding_card(f: &Finding, i: usize, via: Option<&str>) -> Markup {
    let n = i + 1;
    html! {
        div.card id={ "f" (n) } {
            h2 { "#" (n) " " (function_title(f, 300)) }
            (card_stack(f, via))
            p {
                (f.kind) " on " (workers_phrase(f)) " — " (reason_phrase(f.reason))
                @if let Some(g) = &f.group { " · group " (g) }
                ". Flagged: " (compact_ranks(&f.workers, 400))
            }
            @if let (Some(r), false) = (f.resource_mu, no_peers(f)) {
                p {
                    (f.resource.label()) " over all critical-path " (f.resource.label())
                    " work: " (stat_cell(r.value, r.peers, ""))
                }
            }
            @if let Some(h) = &f.hint {
                div.hint { b { "Hint:" } " " (h) }
            }
            @if !f.consequences.is_empty() {
                ul.consequences {
                    @for c in &f.consequences { li { (consequence(c)) } }
                }
            }
            @if let Some(src) = &f.source_excerpt {
                p { "The relevant code is here:" }
                pre { (src) }
            }
            @if !f.points.is_empty() {
                (card_plots(f))
            }
        }
    }
}

/// The call stack under a card's title (and the frame it is called
/// through), or the whole name when the title had to cut it.
fn card_stack(f: &Finding, via: Option<&str>) -> Markup {
    html! {
        @if let Some(stack) = stack_line(f, 2000) {
            div.stack { (stack) }
            @if let Some(v) = via {
                p { b { "Called through:" } " " (v) }
            }
        } @else if f.function.chars().count() > 300 {
            div.stack { (f.function) }
        }
    }
}

/// What follows from a finding: who waits for it, what else is slower.
fn consequence(c: &Consequence) -> Markup {
    html! {
        @match c.relation {
            Relation::WaitsFor => {
                "Workers " (compact_ranks(&c.workers, 200)) " wait for these workers in "
                b { (c.function) }
                ": β " (pct(c.beta.value)) " vs " (pct(c.beta.peers)) " here"
            }
            Relation::AlsoSlower => {
                "Also slower on these workers: " b { (c.function) }
                ", β " (pct(c.beta.value)) " vs " (pct(c.beta.peers)) " on the peers"
            }
        }
    }
}

/// A card's plots: (β, μ) and (μ, σ) scatters (or why there are none)
/// and the β CDF.
fn card_plots(f: &Finding) -> Markup {
    let label = f.resource.label();
    let (mu_label, sigma_label) = (format!("μ ({label})"), format!("σ ({label})"));
    html! {
        @if f.group_workers > f.points.len() {
            p { small {
                "Plots show " (f.points.len()) " of the " (f.group_workers)
                " workers (all flagged ones first)."
            } }
        }
        div.plots {
            @if f.util_source == UtilizationSource::None {
                // μ and σ are 0 for want of data: plots of zeros would look like a finding.
                p."not-measured" {
                    (label) " utilization not measured: no μ/σ plots. Sample it during the \
                     window (the Python package does at 1 kHz by default; "
                    code { "whyslow sample" }
                    " or the sidecar agent for traces taken elsewhere)."
                }
            } @else {
                @let beta = "β (critical-path share)";
                (PreEscaped(scatter(f, "β vs μ", beta, &mu_label, |p| (p.beta, p.mu))))
                (PreEscaped(scatter(f, "μ vs σ", &mu_label, &sigma_label, |p| (p.mu, p.sigma))))
            }
            (PreEscaped(cdf(f)))
        }
    }
}

/// The iteration-time section: the plot, and in words what it shows.
pub(super) fn iteration_section(report: &Report) -> Markup {
    let Some(it) = &report.iterations else {
        return html! {
            div.card {
                h2 { "Iteration time" }
                p."not-measured" {
                    "Not recorded: the traces have no ProfilerStep spans (profile with \
                     torch.profiler's schedule and prof.step())."
                }
            }
        };
    };
    let flagged: BTreeSet<u32> = report
        .findings
        .iter()
        .filter(|f| !no_peers(f))
        .flat_map(|f| f.workers.iter().copied())
        .collect();
    let source = match it.source {
        IterationSource::ProfilerSteps => {
            "the traces' ProfilerStep spans (the profiled window only)"
        }
        IterationSource::Detector => {
            "the online detector's history (PerfTracker §4.1), up to the profiling window"
        }
    };
    html! {
        div.card {
            h2 { "Iteration time" }
            div.plots { (PreEscaped(iteration_plot(it, &flagged))) }
            p {
                (onset_sentence(it)) " "
                small { "From " (source) "; red: workers flagged on part of their group." }
            }
        }
    }
}

/// When the iteration time rose, in words, or that it did not.
fn onset_sentence(it: &IterationTimes) -> String {
    match &it.onset {
        Some(o) => format!(
            "Iteration time rose at step {}: {:.1} ms → {:.1} ms (+{:.0}%).",
            o.step,
            o.before_ms,
            o.after_ms,
            (o.after_ms / o.before_ms - 1.0) * 100.0
        ),
        None => match it.source {
            IterationSource::ProfilerSteps => {
                "No rise within these steps: a slowdown, if any, began before the window."
                    .to_string()
            }
            IterationSource::Detector => "No lasting rise in this history.".to_string(),
        },
    }
}

/// The node agents' verdict on the same job (SysOM-AI §3.1), joined with
/// the fingerprints': late ranks, the layer, the top of each diff; `page`:
/// the whole diagnosis written beside this page.
pub(super) fn cross_layer_section(d: &DiagnoseReport, page: Option<&str>) -> Markup {
    let late: Vec<String> = d
        .stragglers
        .iter()
        .map(|s| {
            format!(
                "rank {} (group {}, {:.1} ms late)",
                s.rank,
                s.group,
                s.late_us / 1e3
            )
        })
        .collect();
    html! {
        section #cross-layer {
            h2 { "Cross-layer diagnosis" }
            p {
                @if late.is_empty() {
                    "No rank makes its group wait."
                } @else {
                    "Late: " (late.join(", ")) "."
                }
                " Layer: " b { (d.layer) } "."
                @if let Some(p) = page {
                    " The node agents' whole diagnosis, with its flame graphs: "
                    a href=(p) { (p) } "."
                }
            }
            ul { (cross_layer_tops(d)) }
        }
    }
}

/// The top row of each of the diagnosis's diffs, one item each.
fn cross_layer_tops(d: &DiagnoseReport) -> Markup {
    let top = |what: &str, rank: u32, function: &str| {
        html! { li { (what) ": rank " (rank) ": " code { (function) } } }
    };
    html! {
        @if let Some(c) = d.cpu_diff.first() { (top("CPU", c.rank, &c.function)) }
        @if let Some(c) = d.offcpu_diff.first() { (top("off the CPU", c.rank, &c.function)) }
        @if let Some(o) = d.os_diff.first() { (top("OS", o.rank, &o.diff.signal)) }
        @if let Some(g) = d.gpu_diff.first() {
            (top("GPU", g.rank, &format!("{:.2}x its peers' kernel time", g.finding.overall_ratio)))
        }
        @if let Some(n) = d.network_diff.first() {
            li { "network: host " code { (n.host) } " " (network_phrase(n)) }
        }
        @if let Some(r) = d.regressions.first() {
            li {
                "since the baseline: " code { (r.function) } " "
                (format!("{:.1} % → {:.1} %", 100.0 * r.before_share, 100.0 * r.after_share))
            }
        }
    }
}

/// What is wrong with a host's network, in words.
fn network_phrase(n: &LossyHost) -> &'static str {
    if n.cause == "slow" && n.resent.as_ref().is_some_and(|s| s.over_floor) {
        "has slow connections (its queue overflows)"
    } else if n.cause == "slow" {
        "has slow connections (nothing lost)"
    } else {
        "loses TCP segments"
    }
}

/// What the report's words mean (PerfTracker §4.2–§4.3; whyslow's additions).
pub(super) fn glossary() -> Markup {
    const TERMS: [(&str, &str); 7] = [
        ("β (critical-path share)", "The share of the worker's profiling window during which this function was on its critical path: the work the iteration waited for. Peers: the median over the group's other workers."),
        ("μ (mean utilization)", "The function's resource (CPU, NIC, SM activity, PCIe, NVLink) averaged while it ran on the critical path, 0–100 %. Low μ with a long β: the function was starved or waiting."),
        ("σ (utilization spread)", "The standard deviation of that utilization: a slow link is low and steady (small σ), peers that wait and burst have a large σ."),
        ("pp", "Percentage points: 46.5 pp is 46.5 % of the window more than the peers."),
        ("unexpected", "Outside the function class's expected range (e.g. Python code over 1 % of the critical path, communication over 30 %) on most of the workers."),
        ("differs from peers", "Far from most other workers in (β, μ, σ) (the differential distance), and borne out off the critical path: the worker ran the function longer, or starved of its resource."),
        ("waits for / also slower", "Consequences folded under a cause: the other workers wait for it in a collective, or other functions are slower on the same workers."),
    ];
    html! {
        details.glossary {
            summary { "What β, μ, σ and the reasons mean" }
            dl {
                @for (term, meaning) in TERMS { dt { (term) } dd { (meaning) } }
            }
        }
    }
}
