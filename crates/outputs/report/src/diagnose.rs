//! The HTML page of `whyslow diagnose` (SysOM-AI §3.1): the verdict as text,
//! the per-rank entry-time plot of each group with a late rank (SysOM-AI
//! Fig. 5: how long after the group's first rank each rank entered each
//! collective) and the differential flame graphs (Fig. 6–7), each in its own
//! frame so their zoom scripts and ids do not meet.

use std::fmt::Write as _;

use whyslow_model::diagnosis::{DiagnoseReport, GpuPattern, LossSide};

use maud::{html, Markup, PreEscaped};

use crate::layout::Nav;
use crate::lines::{line_chart_svg, LineSeries};

/// One group's entry-time plot.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryPlot {
    /// Communication group.
    pub group: String,
    /// One line per rank: (seconds since the window's first instance,
    /// lateness behind the group's first rank in ms); late ranks flagged.
    pub series: Vec<LineSeries>,
}

impl EntryPlot {
    /// The plot of one group from its instances: per instance, the time of
    /// its first entry (ns) and each rank's lateness behind it (ns, in the
    /// order of `ranks`); `flagged` ranks drawn red.
    pub fn from_instances(
        group: &str,
        ranks: &[u32],
        instances: &[(f64, Vec<f64>)],
        flagged: &[u32],
    ) -> Self {
        let t0 = instances.first().map(|x| x.0).unwrap_or(0.0);
        let series = ranks
            .iter()
            .enumerate()
            .map(|(k, &rank)| LineSeries {
                label: format!("rank {rank}"),
                flagged: flagged.contains(&rank),
                points: instances
                    .iter()
                    .filter_map(|(first, late)| Some(((first - t0) / 1e9, late.get(k)? / 1e3)))
                    .collect(),
            })
            .collect();
        EntryPlot {
            group: group.to_string(),
            series,
        }
    }

    /// The plot as an SVG line chart.
    pub fn svg(&self) -> String {
        line_chart_svg(&self.series, "seconds", "entry after the first rank (ms)")
    }
}

/// A flame graph to show: a title and the SVG document.
#[derive(Debug, Clone, PartialEq)]
pub struct FlameGraph {
    /// What it compares.
    pub title: String,
    /// The SVG document (`whyslow_stack_output`'s flame graphs).
    pub svg: String,
}

/// What decided the layer, in one line: the first row of the layer's own
/// diff (SysOM-AI §3.1: the layer whose signals set the late rank apart).
pub fn deciding_measure(r: &DiagnoseReport) -> Option<String> {
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    match r.layer.as_str() {
        "cpu" => r
            .cpu_diff
            .first()
            .map(|d| {
                format!(
                    "{} on rank {}: {} of its {} samples against {} on its peers (waterline {})",
                    d.function,
                    d.rank,
                    pct(d.straggler_share),
                    if d.scope == "host" { "host's" } else { "CPU" },
                    pct(d.peer_share),
                    pct(d.threshold)
                )
            })
            .or_else(|| {
                r.regressions.first().map(|g| {
                    format!(
                        "{} rose from {} to {} of the job's samples since the baseline",
                        g.function,
                        pct(g.before_share),
                        pct(g.after_share)
                    )
                })
            }),
        "os" => r
            .os_diff
            .first()
            .map(|d| {
                format!(
                    "{} on rank {}: {:.1} against {:.1} on its peers (threshold {:.1})",
                    d.diff.signal, d.rank, d.diff.straggler, d.diff.peers, d.diff.threshold
                )
            })
            .or_else(|| {
                r.offcpu_diff.first().map(|d| {
                    format!(
                        "rank {} blocked in {}: {} of its blocked time against {} on its peers",
                        d.rank,
                        d.function,
                        pct(d.straggler_share),
                        pct(d.peer_share)
                    )
                })
            }),
        "network" => r.network_diff.first().map(|h| {
            let m: Vec<String> = h
                .measures
                .iter()
                .map(|m| format!("{} {:.1} against {:.1}", m.name, m.value, m.peers))
                .collect();
            let loss = h
                .resent
                .as_ref()
                .map(|l| format!("{:.2}% of segments resent", l.pct))
                .unwrap_or_default();
            format!(
                "host {} ({}): {}{}{}",
                h.host,
                h.cause,
                loss,
                if loss.is_empty() || m.is_empty() {
                    ""
                } else {
                    "; "
                },
                m.join(", ")
            )
        }),
        "gpu" => r.gpu_diff.first().map(|g| {
            format!(
                "rank {}: its kernels {:.2}x its {} peers' time",
                g.rank, g.finding.overall_ratio, g.peers
            )
        }),
        _ => None,
    }
}

/// A share as a bar beside its number.
fn bar(share: f64, class: &str) -> Markup {
    let w = (share.clamp(0.0, 1.0) * 100.0).round();
    html! {
        span class={ "bar " (class) } style={ "width:" (w) "px" } {}
        " " (format!("{:.1}%", 100.0 * share))
    }
}

fn cpu_table(rows: &[whyslow_model::diagnosis::CpuDiff], what: &str) -> Markup {
    if rows.is_empty() {
        return html! {};
    }
    html! {
        h3 { (what) }
        table {
            tr {
                th { "rank" } th { "scope" } th { "function" }
                th { "its share" } th { "peers'" } th { "waterline" }
            }
            @for d in rows.iter().take(12) {
                tr {
                    td { (d.rank) }
                    td { (d.scope) }
                    td title=(d.stack) { code { (d.function) } }
                    td { (bar(d.straggler_share, "me")) }
                    td { (bar(d.peer_share, "peers")) }
                    td { (format!("{:.1}%", 100.0 * d.threshold)) }
                }
            }
        }
    }
}

/// A late rank's OS signals above its peers', with the handler path.
fn os_table(r: &DiagnoseReport) -> Markup {
    if r.os_diff.is_empty() {
        return html! {};
    }
    html! {
        h3 { "OS signals above the peers'" }
        table {
            tr {
                th { "rank" } th { "signal" } th { "its value" } th { "peers'" }
                th { "threshold" } th { "handler path" }
            }
            @for d in r.os_diff.iter().take(12) {
                tr {
                    td { (d.rank) }
                    td { code { (d.diff.signal) } }
                    td { (format!("{:.1}", d.diff.straggler)) }
                    td { (format!("{:.1}", d.diff.peers)) }
                    td { (format!("{:.1}", d.diff.threshold)) }
                    td { code { (d.handler_stack.as_deref().unwrap_or("")) } }
                }
            }
        }
    }
}

/// The hosts that lose segments or sit behind a slow link.
fn network_table(r: &DiagnoseReport) -> Markup {
    if r.network_diff.is_empty() {
        return html! {};
    }
    html! {
        h3 { "Network: hosts that lose segments or sit behind a slow link" }
        table {
            tr {
                th { "host" } th { "ranks" } th { "cause" } th { "side" }
                th { "stands out" } th { "measures" }
            }
            @for h in r.network_diff.iter().take(12) {
                @let m: Vec<String> = h
                    .measures
                    .iter()
                    .map(|m| format!("{} {:.1} (others {:.1})", m.name, m.value, m.peers))
                    .collect();
                tr {
                    td { (h.host) }
                    td { (crate::compact_ranks(&h.ranks, 30)) }
                    td { (h.cause) }
                    td { (h.side) }
                    td { @if h.stands_out { "yes" } @else { "no" } }
                    td { (m.join("; ")) }
                }
            }
        }
    }
}

/// What rose since the baseline.
fn regression_table(r: &DiagnoseReport) -> Markup {
    if r.regressions.is_empty() {
        return html! {};
    }
    html! {
        h3 { "What rose since the baseline" }
        table {
            tr { th { "group" } th { "function" } th { "before" } th { "now" } }
            @for g in r.regressions.iter().take(12) {
                tr {
                    td { (g.group) }
                    td title=(g.stack) { code { (g.function) } }
                    td { (bar(g.before_share, "peers")) }
                    td { (bar(g.after_share, "me")) }
                }
            }
        }
    }
}

/// The ranks that make their groups wait.
fn late_ranks_table(r: &DiagnoseReport) -> Markup {
    if r.stragglers.is_empty() {
        return html! {};
    }
    html! {
        h2 { "Late ranks" }
        table {
            tr { th { "rank" } th { "group" } th { "late per collective" } th { "t" } }
            @for s in &r.stragglers {
                tr {
                    td { (s.rank) }
                    td { (s.group) }
                    td { (crate::format::duration_us(s.late_us)) }
                    td { (format!("{:.1}", s.t)) }
                }
            }
        }
    }
}

/// Each group's entry-time plot (SysOM-AI Fig. 5).
fn entry_plots_section(plots: &[EntryPlot]) -> Markup {
    html! {
        h2 { "Entry into collectives, per rank" }
        @if plots.is_empty() {
            p { "No group with collective records from at least 3 ranks: nothing to plot." }
        }
        @for p in plots {
            h3 { "group " (p.group) }
            p {
                "Each line is one rank: how long after the group's first rank it entered each \
                 collective (clocks aligned on the collectives' common exits). A rank that makes \
                 its group wait stays above the others (red)."
            }
            // The chart's SVG, escaped by whyslow_report::lines.
            (PreEscaped(line_chart_svg(&p.series, "seconds", "entry after the first rank (ms)")))
        }
    }
}

/// The differential flame graphs (SysOM-AI Fig. 7), each in its own frame.
fn flames_section(flames: &[FlameGraph]) -> Markup {
    html! {
        h2 { "Differential flame graphs" }
        @if flames.is_empty() {
            p { "No rank profiles to compare." }
        }
        @for f in flames {
            h3 { (f.title) }
            p {
                "Width: the compared profile's samples; red: wider than in the base, blue: \
                 narrower, hatched: only in the compared profile. Click to zoom."
            }
            // Out of the Tab order: a flame graph is worked with the mouse,
            // and a focused frame shows no ring (Chromium matches neither
            // :focus nor :focus-within on it), so Tab would vanish into it.
            iframe.flame tabindex="-1" title=(f.title) srcdoc=(f.svg) {}
        }
    }
}

/// Renders the page (issue 46: a report, the verdict first): the verdict
/// card with the layer and the measure that decided it, the late ranks,
/// each layer's diff as a table, the entry-time plots (Fig. 5), the
/// differential flame graphs (Fig. 7), and the terminal report collapsed.
pub fn render_diagnose_html(
    title: &str,
    r: &DiagnoseReport,
    summary: &str,
    plots: &[EntryPlot],
    flames: &[FlameGraph],
) -> String {
    render_diagnose_page(&Nav::default(), title, r, summary, plots, flames)
}

/// [`render_diagnose_html`] under the navigation bar `nav` (the server's
/// page links back to its job; the command line's file links nowhere).
pub fn render_diagnose_page(
    nav: &Nav,
    title: &str,
    r: &DiagnoseReport,
    summary: &str,
    plots: &[EntryPlot],
    flames: &[FlameGraph],
) -> String {
    let status = crate::status::diagnosis_status(r);
    let layer = html! {
        p {
            "Layer: " b { (r.layer) }
            @if let Some(m) = deciding_measure(r) { " — " (m) }
        }
    };
    let body = html! {
        (crate::layout::verdict_card(status.health.as_str(), &status.line, layer))
        @if let Some(h) = &r.hang {
            p.hang { b { "Hang:" } " " (h.verdict) }
        }
        (late_ranks_table(r))
        (cpu_table(&r.cpu_diff, "CPU: paths above their group's waterline"))
        (cpu_table(&r.offcpu_diff, "Off the CPU: blocked paths above the waterline"))
        (os_table(r))
        (network_table(r))
        (regression_table(r))
        (entry_plots_section(plots))
        (flames_section(flames))
        details {
            summary { "The whole report as text (notes, every row)" }
            pre { (summary) }
        }
    };
    crate::layout::page_in(nav, title, "", body)
}

/// The diagnosis as text for the terminal (and the HTML page's summary).
/// `network_floors_pct`: the least resent and out-of-order shares the
/// network layer judges (`whyslow_diagnose::network::NetworkConfig`), for
/// the line that says no host is over them.
pub fn render_diagnose_table(r: &DiagnoseReport, network_floors_pct: (f64, f64)) -> String {
    let mut s = String::new();
    let _ = write_table(&mut s, r, network_floors_pct);
    s
}

fn write_table(
    out: &mut String,
    r: &DiagnoseReport,
    (min_retrans_pct, min_out_of_order_pct): (f64, f64),
) -> std::fmt::Result {
    if let Some(h) = &r.hang {
        writeln!(out, "HANG (from the collective records)")?;
        for l in crate::hang::hang_table(h).lines() {
            writeln!(out, "  {l}")?;
        }
        writeln!(out)?;
    }
    writeln!(out,
        "{} rank profiles in {} group(s); baseline {:.0}..{:.0} s, window {:.0}..{:.0} s (since the earliest profile)",
        r.profiles,
        r.groups.len(),
        r.baseline.0,
        r.baseline.1,
        r.window.0,
        r.window.1
    )?;
    for g in &r.groups {
        writeln!(
            out,
            "  group {}: {} ranks, {} baseline / {} window samples",
            g.group, g.ranks, g.baseline_samples, g.window_samples
        )?;
    }
    if r.stragglers.is_empty() {
        writeln!(out, "stragglers: none")?;
    } else {
        for s in &r.stragglers {
            writeln!(
            out,
                "straggler: group {} rank {}: enters its collectives {:.1} ms after the others (mean over the window)",
                s.group,
                s.rank,
                s.late_us / 1e3
            )?;
        }
    }
    writeln!(out, "layer: {}", r.layer)?;
    write_cpu(out, r)?;
    write_gpu(out, r)?;
    write_os(out, r)?;
    write_network(out, r, (min_retrans_pct, min_out_of_order_pct))?;
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

/// The CPU waterline, the off-CPU diff and the temporal baseline.
fn write_cpu(out: &mut String, r: &DiagnoseReport) -> std::fmt::Result {
    if r.cpu_diff.is_empty() {
        writeln!(out, "CPU waterline: no rank above its group's")?;
    } else {
        writeln!(
            out,
            "CPU waterline (a rank's share above its group's μ + 2σ):"
        )?;
        for d in &r.cpu_diff {
            let who = match &d.host {
                Some(h) => format!("rank {}'s host {h} (all its processes)", d.rank),
                None => format!("rank {}", d.rank),
            };
            writeln!(
                out,
                "  group {} {who}: {} {:.1} % vs peers {:.1} % (line {:.1} %)\n    {}",
                d.group,
                d.function,
                100.0 * d.straggler_share,
                100.0 * d.peer_share,
                100.0 * d.threshold,
                d.stack
            )?;
        }
    }
    if !r.offcpu_diff.is_empty() {
        writeln!(
            out,
            "off the CPU (a late rank's share of blocked time above its group's μ + 2σ):"
        )?;
        for d in &r.offcpu_diff {
            writeln!(
                out,
                "  group {} rank {}: {} {:.1} % vs peers {:.1} %\n    {}",
                d.group,
                d.rank,
                d.function,
                100.0 * d.straggler_share,
                100.0 * d.peer_share,
                d.stack
            )?;
        }
    }
    if r.regressions.is_empty() {
        writeln!(
            out,
            "temporal baseline: no function's share rose by more than 0.5 pp"
        )?;
    } else {
        writeln!(
            out,
            "temporal baseline (share rose by > 0.5 pp since the baseline):"
        )?;
        for x in &r.regressions {
            writeln!(
                out,
                "  group {}: {} {:.1} % -> {:.1} %\n    {}",
                x.group,
                x.function,
                100.0 * x.before_share,
                100.0 * x.after_share,
                x.stack
            )?;
        }
    }
    Ok(())
}

/// The GPU kernel diff of each late rank.
fn write_gpu(out: &mut String, r: &DiagnoseReport) -> std::fmt::Result {
    for g in &r.gpu_diff {
        let what = match g.finding.pattern {
            GpuPattern::Uniform => "uniformly slower: the hardware (clocks held down by power or temperature, a degraded part; nvidia-smi -q -d PERFORMANCE,CLOCK)",
            GpuPattern::Specific => "specific kernels slower, the rest at their peers' pace: software (shapes, algorithm choice, data)",
            GpuPattern::Workload => "every kernel slower, by more than clocks can explain: more work per call (larger shapes, a bigger batch): software",
        };
        writeln!(
            out,
            "GPU kernels: group {} rank {}: {:.2}x its {} peers' kernel time, {what}",
            g.group, g.rank, g.finding.overall_ratio, g.peers
        )?;
        for k in g.finding.kernels.iter().take(8) {
            writeln!(
                out,
                "  {} {:.1} µs vs {:.1} µs per call ({:.2}x, +{:.1} % of its GPU time)",
                k.kernel,
                k.straggler_us,
                k.peers_us,
                k.ratio,
                100.0 * k.excess_share
            )?;
        }
    }
    Ok(())
}

/// The OS signals of late ranks and their kernel handlers.
fn write_os(out: &mut String, r: &DiagnoseReport) -> std::fmt::Result {
    if r.os_diff.is_empty() {
        writeln!(out, "OS signals: no late rank stands out from its peers")?;
    } else {
        writeln!(out, "OS signals (a late rank's above its peers' μ + 2σ):")?;
        for d in &r.os_diff {
            writeln!(
                out,
                "  group {} rank {}: {} {:.1} vs peers {:.1}",
                d.group, d.rank, d.diff.signal, d.diff.straggler, d.diff.peers
            )?;
            if let (Some(st), Some(sh), Some(scope)) = (
                &d.handler_stack,
                d.handler_share,
                d.handler_scope.as_deref(),
            ) {
                writeln!(
                    out,
                    "    its kernel handler in {:.1} % of the {} profile's samples:\n    {st}",
                    100.0 * sh,
                    if scope == "host" { "host" } else { "rank" }
                )?;
            }
        }
    }
    Ok(())
}

/// The hosts whose TCP segments are lost or whose connections are slow.
fn write_network(
    out: &mut String,
    r: &DiagnoseReport,
    (min_retrans_pct, min_out_of_order_pct): (f64, f64),
) -> std::fmt::Result {
    if r.network_diff.is_empty() {
        writeln!(
            out,
            "network: no host resends over {:.1} % of its TCP segments or receives over {:.1} % \
             out of order",
            min_retrans_pct, min_out_of_order_pct
        )?;
    } else {
        writeln!(
            out,
            "network (per host: TCP segments lost, or connections slow):"
        )?;
        for h in &r.network_diff {
            let ranks: Vec<String> = h.ranks.iter().map(u32::to_string).collect();
            if h.cause == "slow" {
                write_slow_host(out, h, &ranks)?;
                continue;
            }
            writeln!(
                out,
                "  {} ({} {}): {}{}",
                h.host,
                if ranks.len() == 1 { "rank" } else { "ranks" },
                ranks.join(", "),
                match h.side.as_str() {
                    "sends" => "resends what it sends",
                    "receives" => "receives out of order",
                    _ => "resends and receives out of order",
                },
                if h.stands_out {
                    ""
                } else {
                    " (so do its peers: the loss is not this host's alone)"
                }
            )?;
            let side = |what: &str, s: &LossSide, segs: f64| {
                let peers = s
                    .peers_pct
                    .map(|p| format!("the other hosts' median {p:.2} %"))
                    .unwrap_or_else(|| "no other host".into());
                format!(
                    "    {what}: {:.2} % of {segs:.0} segments/s, vs {peers}",
                    s.pct
                )
            };
            if let Some(s) = &h.resent {
                writeln!(out, "{}", side("resent", s, h.out_segs_per_s))?;
            }
            if let Some(s) = &h.out_of_order {
                writeln!(out, "{}", side("out of order", s, h.in_segs_per_s))?;
            }
        }
    }
    Ok(())
}

/// A host whose connections deliver far below the others', with its measures.
fn write_slow_host(
    out: &mut String,
    h: &whyslow_model::diagnosis::LossyHost,
    ranks: &[String],
) -> std::fmt::Result {
    let lost = match h.resent.as_ref().filter(|s| s.over_floor) {
        Some(s) => format!("its queue overflows, {:.2} % of segments resent", s.pct),
        None => "nothing lost".to_string(),
    };
    writeln!(
        out,
        "  {} ({} {}): its connections deliver far below the others', {lost} \
         (a shaped, congested or mis-negotiated link; {})",
        h.host,
        if ranks.len() == 1 { "rank" } else { "ranks" },
        ranks.join(", "),
        match h.side.as_str() {
            "sends" => "those it sends on",
            "receives" => "those it receives on",
            _ => "both ways",
        }
    )?;
    for m in &h.measures {
        let line = match m.name.as_str() {
            "slow_connections" => {
                format!("{:.0} of its {:.0} busy connections slow", m.value, m.peers)
            }
            "sending_rate_mbit_s" => format!(
                "delivered {:.1} Mbit/s while sending, vs the other connections' median {:.1}",
                m.value, m.peers
            ),
            "rtt_over_min" => format!(
                "smoothed RTT {:.1}x its lowest (a queue in front of the link), vs {:.1}x",
                m.value, m.peers
            ),
            other => format!("{other}: {:.3} vs {:.3}", m.value, m.peers),
        };
        writeln!(out, "    {line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_and_flame_graphs_are_embedded_and_escaped() {
        let r = DiagnoseReport::default();
        let page = render_diagnose_html(
            "diagnose <dir>",
            &r,
            "straggler: rank 2 & more",
            &[EntryPlot {
                group: "job/gloo3#0".into(),
                series: vec![LineSeries {
                    label: "rank 2".into(),
                    flagged: true,
                    points: vec![(0.0, 25.0), (0.1, 24.0)],
                }],
            }],
            &[FlameGraph {
                title: "rank 2 vs rank 0".into(),
                svg: "<svg id=\"x\"><script><![CDATA[a<b]]></script></svg>".into(),
            }],
        );
        assert!(page.contains("diagnose &lt;dir&gt;") && page.contains("rank 2 &amp; more"));
        assert!(page.contains("rank 2 (flagged)"));
        assert!(page.contains("srcdoc=\"&lt;svg id=&quot;x&quot;&gt;"));
        // The flame graph's script stays inside its frame's document.
        assert_eq!(page.matches("<script").count(), 0);
        let empty = render_diagnose_html("t", &r, "", &[], &[]);
        assert!(empty.contains("nothing to plot") && empty.contains("No rank profiles"));
        // A file links nowhere; the server's page leads back to its job.
        assert!(empty.contains(
            r#"<nav class="top" aria-label="whyslow"><span class="brand">whyslow</span></nav>"#
        ));
        let nav = Nav {
            home: Some("/ui/".into()),
            links: vec![crate::layout::NavLink::new("/ui/jobs/j<1>", "Job j<1>")],
            actions: None,
        };
        let served = render_diagnose_page(&nav, "t", &r, "", &[], &[]);
        assert!(
            served.contains(r#"<a href="/ui/jobs/j&lt;1&gt;">Job j&lt;1&gt;</a>"#),
            "{served}"
        );
        assert!(served.contains(r#"<a class="brand" href="/ui/">whyslow</a>"#));
        assert_eq!(
            served.replace(r#"<a class="brand" href="/ui/">whyslow</a><a href="/ui/jobs/j&lt;1&gt;">Job j&lt;1&gt;</a>"#, ""),
            empty.replace(r#"<span class="brand">whyslow</span>"#, ""),
            "the same page but for its bar"
        );
    }
}
