//! Renderings of the LLMPrism flow report (Jiang et al.): the per-rank
//! timelines as a Perfetto trace (Fig. 4), a text table, and the per-switch
//! bandwidth series (Fig. 5).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::json;

use whyslow_model::flow::{FindingLevel, FlowReport, PairType};

/// Chrome trace JSON (opens in ui.perfetto.dev and chrome://tracing) of the
/// reconstructed timelines (LLMPrism Fig. 4): one process per job, per rank one track
/// of steps (with the computation gap before the DP burst implied) and as many
/// communication tracks as needed to lay out overlapping flows without overlap.
/// Timestamps are microseconds relative to the window start.
pub fn to_perfetto_trace(report: &FlowReport) -> String {
    let t0 = report.window_start_us;
    let mut ev: Vec<serde_json::Value> = Vec::new();
    for j in &report.jobs {
        ev.push(json!({"ph": "M", "name": "process_name", "pid": j.id + 1, "args": {"name": format!("job {} ({} ranks)", j.id, j.members.len())}}));
    }
    for (ri, r) in report.ranks.iter().enumerate() {
        let pid = r.job + 1;
        let base = ri * 64;
        ev.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": base, "args": {"name": format!("{} steps", r.address)}}));
        ev.push(json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": base, "args": {"sort_index": base}}));
        for (k, s) in r.steps.iter().enumerate() {
            ev.push(json!({"ph": "X", "name": format!("step {k}"), "cat": "step", "pid": pid, "tid": base,
                "ts": s.start_us.saturating_sub(t0), "dur": s.dur_us(), "args": {"duration_ms": s.dur_us() as f64 / 1e3}}));
        }
        // Greedy interval partitioning into lanes.
        let mut lane_end: Vec<u64> = Vec::new();
        if let Some(events) = report.timelines.events.get(ri) {
            for e in events {
                let peer = report
                    .ranks
                    .get(e.peer as usize)
                    .map_or("?", |p| p.address.as_str());
                let end = e.start_us.saturating_add(e.dur_us.max(1));
                let lane = match lane_end.iter().position(|&le| le <= e.start_us) {
                    Some(l) => l,
                    None => {
                        if lane_end.len() >= 63 {
                            continue;
                        }
                        lane_end.push(0);
                        let l = lane_end.len() - 1;
                        ev.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": base + 1 + l, "args": {"name": format!("{} comm {}", r.address, l)}}));
                        ev.push(json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": base + 1 + l, "args": {"sort_index": base + 1 + l}}));
                        l
                    }
                };
                lane_end[lane] = end;
                let kind = match e.kind {
                    PairType::Dp => "DP",
                    PairType::Pp => "PP",
                };
                let name = match (e.kind, e.send) {
                    (PairType::Dp, _) => {
                        format!("DP {} {}", if e.send { "→" } else { "←" }, peer)
                    }
                    (PairType::Pp, true) => format!("PP send → {peer}"),
                    (PairType::Pp, false) => format!("PP recv ← {peer}"),
                };
                ev.push(json!({"ph": "X", "name": name, "cat": kind, "pid": pid, "tid": base + 1 + lane,
                    "ts": e.start_us.saturating_sub(t0), "dur": e.dur_us.max(1), "args": {"bytes": e.bytes, "peer": peer}}));
            }
        }
    }
    serde_json::to_string(&json!({"traceEvents": ev, "displayTimeUnit": "ms"})).unwrap_or_default()
}

/// One switch's line of the Fig. 5 plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchSeries {
    /// Switch name.
    pub switch: String,
    /// True when a switch-level finding names this switch.
    pub flagged: bool,
    /// (window midpoint in seconds since the window start, mean DP Gb/s).
    pub points: Vec<(f64, f64)>,
}

/// Data of the per-switch DP bandwidth plot (LLMPrism Fig. 5): one series per switch.
pub fn switch_bandwidth_series(report: &FlowReport) -> Vec<SwitchSeries> {
    let t0 = report.window_start_us;
    report
        .switches
        .iter()
        .map(|s| SwitchSeries {
            switch: s.name.clone(),
            flagged: report.findings.iter().any(|f| {
                f.level == FindingLevel::Switch && f.subject.ends_with(&format!(" {}", s.name))
            }),
            points: s
                .per_step
                .iter()
                .map(|&(a, b, g)| ((a / 2 + b / 2).saturating_sub(t0) as f64 / 1e6, g))
                .collect(),
        })
        .collect()
}

/// Plain-text rendering: jobs, pair types, per-rank step durations, switches, findings.
pub fn render_table(report: &FlowReport) -> String {
    let mut s = String::new();
    if report.flows == 0 {
        if let Some(why) = &report.could_not_judge {
            let _ = writeln!(s, "Could not judge: {why}.");
            return s;
        }
    }
    let _ = writeln!(
        s,
        "{} flows from {} ({:.3} s; {} duplicate switch reports merged, {} control messages left out)",
        report.flows,
        whyslow_model::time::utc_span(report.window_start_us, report.window_end_us),
        report.window_end_us.saturating_sub(report.window_start_us) as f64 / 1e6,
        report.merged_duplicates,
        report.control_flows,
    );
    if let Some(why) = &report.could_not_judge {
        let _ = writeln!(s, "\nCould not judge: {why}.");
        return s;
    }
    // The verdict first: what is slow, then the jobs it was judged from.
    render_findings(&mut s, report);
    for j in &report.jobs {
        let dp = report
            .pairs
            .iter()
            .filter(|p| p.job == j.id && p.kind == PairType::Dp)
            .count();
        let pp = report
            .pairs
            .iter()
            .filter(|p| p.job == j.id && p.kind == PairType::Pp)
            .count();
        let _ = writeln!(
            s,
            "\njob {}: {} ranks on {} machines ({} cross-machine clusters), {} DP pairs, {} PP pairs, {} DP groups",
            j.id,
            j.members.len(),
            j.machines.len(),
            j.clusters,
            dp,
            pp,
            j.dp_groups.len()
        );
        if let Some(us) = j.step_us {
            let _ = writeln!(
                s,
                "  step period {:.3} ms (median over its ranks)",
                us / 1e3
            );
        }
        for st in &j.recurring_stalls {
            let _ = writeln!(
                s,
                "  recurring stall: every {} steps from step {}, +{:.3} ms on {} ranks (a checkpoint or evaluation? not a finding)",
                st.every,
                st.first_step,
                st.extra_us / 1e3,
                st.ranks
            );
        }
        let _ = writeln!(
            s,
            "  {:<40} {:>6} {:>12} {:>12} {:>12}",
            "rank", "steps", "mean ms", "min ms", "max ms"
        );
        for r in report.ranks.iter().filter(|r| r.job == j.id) {
            let d: Vec<f64> = r.steps.iter().map(|x| x.dur_us() as f64 / 1e3).collect();
            let min = d.iter().cloned().fold(f64::INFINITY, f64::min);
            let max = d.iter().cloned().fold(0.0, f64::max);
            if d.is_empty() {
                let _ = writeln!(
                    s,
                    "  {:<40} {:>6} {:>12} {:>12} {:>12}",
                    r.address, 0, "-", "-", "-"
                );
            } else {
                let _ = writeln!(
                    s,
                    "  {:<40} {:>6} {:>12.3} {:>12.3} {:>12.3}",
                    r.address,
                    d.len(),
                    r.mean_step_us / 1e3,
                    min,
                    max
                );
            }
        }
        for p in report.pairs.iter().filter(|p| p.job == j.id) {
            let _ = writeln!(
                s,
                "  pair {:>2} {} - {} ({} flows, {} steps, mode N_k = {}{})",
                match p.kind {
                    PairType::Dp => "dp",
                    PairType::Pp => "pp",
                },
                p.src,
                p.dst,
                p.flows,
                p.steps,
                p.mode_distinct_sizes,
                if p.refined { ", refined" } else { "" }
            );
        }
    }
    if !report.switches.is_empty() {
        let _ = writeln!(
            s,
            "\n  {:<28} {:>10} {:>14} {:>14} {:>16}",
            "switch / link", "DP flows", "mean DP Gb/s", "p90 DP Gb/s", "max concurrent"
        );
        for w in &report.switches {
            let _ = writeln!(
                s,
                "  {:<28} {:>10} {:>14.2} {:>14.2} {:>16}",
                w.name, w.dp_flows, w.mean_dp_gbps, w.p90_dp_gbps, w.max_concurrent_dp_flows
            );
        }
    }
    if !report.hops.is_empty() {
        let _ = writeln!(
            s,
            "\n  {:<28} {:>11} {:>12} {:>9} {:>9}",
            "hop (same flows, 2 switches)", "connections", "MB", "stretch", "peak"
        );
        for h in &report.hops {
            let _ = writeln!(
                s,
                "  {:<28} {:>11} {:>12.1} {:>9.2} {:>9.2}",
                format!("{} -> {}", h.from, h.to),
                h.connections,
                h.bytes as f64 / 1e6,
                h.stretch,
                h.peak_stretch
            );
        }
    }
    s
}

fn render_findings(s: &mut String, report: &FlowReport) {
    if report.findings.is_empty() {
        let _ = writeln!(s, "\nno findings");
    } else {
        let _ = writeln!(s, "\nfindings:");
        for f in &report.findings {
            let level = match f.level {
                FindingLevel::Step => "step",
                FindingLevel::Group => "group",
                FindingLevel::Switch => "switch",
            };
            let _ = writeln!(s, "  [{level}] {}: {}", f.subject, f.reason);
        }
    }
}

/// The flow analysis as a page body (issue 46): the verdict card first
/// (the findings, with dates), then the findings table, the jobs found
/// with their step periods, the per-switch DP bandwidth (LLMPrism Fig. 5),
/// each job's ranks collapsed, and the text report collapsed last. The
/// CLI's `flows --html` and the server's job page both draw this.
pub fn render_html_body(report: &FlowReport) -> maud::Markup {
    use maud::html;
    let when = |f: &whyslow_model::flow::FlowFinding| match (f.start_us, f.end_us) {
        (Some(a), Some(b)) => whyslow_model::time::utc_span(a, b),
        (Some(a), None) => whyslow_model::time::utc_ms(a),
        _ => String::new(),
    };
    let (health, headline) = if let Some(why) = &report.could_not_judge {
        ("unknown", format!("Could not judge: {why}."))
    } else if report.findings.is_empty() {
        (
            "healthy",
            format!(
                "No slow step, group or switch in {} flows of {} job(s).",
                report.flows,
                report.jobs.len()
            ),
        )
    } else {
        let first = &report.findings[0];
        (
            "slow",
            format!(
                "{} finding(s); first: {} — {}",
                report.findings.len(),
                first.subject,
                first.reason
            ),
        )
    };
    let window = format!(
        "{} flows from {} ({} duplicate switch reports merged, {} control messages left out)",
        report.flows,
        whyslow_model::time::utc_span(report.window_start_us, report.window_end_us),
        report.merged_duplicates,
        report.control_flows
    );
    let series: Vec<crate::LineSeries> = switch_bandwidth_series(report)
        .into_iter()
        .map(|s| crate::LineSeries {
            label: s.switch,
            flagged: s.flagged,
            points: s.points,
        })
        .collect();
    html! {
        (crate::layout::verdict_card(health, &headline, html! { p.muted { (window) } }))
        @if !report.findings.is_empty() {
            h2 { "Findings" }
            table {
                tr { th { "level" } th { "subject" } th { "why" } th { "when (UTC)" } }
                @for f in &report.findings {
                    tr {
                        td { (finding_level(f.level)) }
                        td { (f.subject) }
                        td { (f.reason) }
                        td { (when(f)) }
                    }
                }
            }
        }
        @if !report.jobs.is_empty() {
            h2 { "Training jobs found in the flows" }
            table {
                tr { th { "job" } th { "ranks" } th { "machines" } th { "step period" } th { "DP / PP pairs" } }
                @for j in &report.jobs {
                    tr {
                        td { (j.id) }
                        td { (j.members.len()) }
                        td { (j.machines.len()) }
                        td { @match j.step_us { Some(us) => (format!("{:.3} ms", us / 1e3)), None => "-" } }
                        td { (pairs_of(report, j.id, PairType::Dp)) " / " (pairs_of(report, j.id, PairType::Pp)) }
                    }
                }
            }
        }
        @if !series.is_empty() {
            h2 { "Mean DP bandwidth per switch" }
            (maud::PreEscaped(crate::line_chart_svg(&series, "time since window start (s)", "mean DP bandwidth (Gb/s)")))
        }
        @for j in &report.jobs {
            details {
                summary { "Job " (j.id) ": steps per rank" }
                table {
                    tr { th { "rank" } th { "steps" } th { "mean ms" } th { "min ms" } th { "max ms" } }
                    @for r in report.ranks.iter().filter(|r| r.job == j.id) {
                        @let d: Vec<f64> = r.steps.iter().map(|x| x.dur_us() as f64 / 1e3).collect();
                        tr {
                            td { (r.address) }
                            td { (d.len()) }
                            @if d.is_empty() {
                                td { "-" } td { "-" } td { "-" }
                            } @else {
                                td { (format!("{:.3}", r.mean_step_us / 1e3)) }
                                td { (format!("{:.3}", d.iter().cloned().fold(f64::INFINITY, f64::min))) }
                                td { (format!("{:.3}", d.iter().cloned().fold(0.0, f64::max))) }
                            }
                        }
                    }
                }
            }
        }
        details {
            summary { "The whole analysis as text" }
            pre { (render_table(report)) }
        }
    }
}

fn finding_level(l: FindingLevel) -> &'static str {
    match l {
        FindingLevel::Step => "step",
        FindingLevel::Group => "group",
        FindingLevel::Switch => "switch",
    }
}

fn pairs_of(report: &FlowReport, job: usize, kind: PairType) -> usize {
    report
        .pairs
        .iter()
        .filter(|p| p.job == job && p.kind == kind)
        .count()
}

/// The flow analysis as a whole page ([`render_html_body`] in the shared
/// layout): what `whyslow flows analyze --html` writes.
pub fn render_html(title: &str, report: &FlowReport) -> String {
    crate::layout::page(title, None, &[], "", render_html_body(report))
}
