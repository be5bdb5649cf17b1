//! The HTML page of `whyslow diagnose` (SysOM-AI §3.1): the verdict as text,
//! the per-rank entry-time plot of each group with a late rank (SysOM-AI
//! Fig. 5: how long after the group's first rank each rank entered each
//! collective) and the differential flame graphs (Fig. 6–7), each in its own
//! frame so their zoom scripts and ids do not meet.

use std::fmt::Write as _;

use whyslow_model::diagnosis::{DiagnoseReport, GpuPattern, LossSide};

use crate::html::escape;
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

/// Renders the page: `summary` is the terminal report (preformatted).
pub fn render_diagnose_html(
    title: &str,
    summary: &str,
    plots: &[EntryPlot],
    flames: &[FlameGraph],
) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>{}</h1><pre>{}</pre>",
        escape(title),
        escape(summary)
    );
    body.push_str("<h2>Entry into collectives, per rank</h2>");
    if plots.is_empty() {
        body.push_str(
            "<p>No group with collective records from at least 3 ranks: nothing to plot.</p>",
        );
    }
    for p in plots {
        let _ = write!(
            body,
            "<h3>group {}</h3><p>Each line is one rank: how long after the group's first rank it \
             entered each collective (clocks aligned on the collectives' common exits). A rank \
             that makes its group wait stays above the others (red).</p>{}",
            escape(&p.group),
            line_chart_svg(&p.series, "seconds", "entry after the first rank (ms)")
        );
    }
    body.push_str("<h2>Differential flame graphs</h2>");
    if flames.is_empty() {
        body.push_str("<p>No rank profiles to compare.</p>");
    }
    for f in flames {
        let _ = write!(
            body,
            "<h3>{}</h3><p>Width: the compared profile's samples; red: wider than in the base, \
             blue: narrower, hatched: only in the compared profile. Click to zoom.</p>\
             <iframe class=\"flame\" title=\"{}\" srcdoc=\"{}\"></iframe>",
            escape(&f.title),
            escape(&f.title),
            escape(&f.svg)
        );
    }
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:2em;max-width:1300px}}\
         pre{{background:#f6f6f6;padding:1em;overflow-x:auto}}\
         iframe.flame{{width:100%;height:620px;border:1px solid #ccc}}</style>\
         </head><body>{body}</body></html>\n",
        t = escape(title)
    )
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
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_and_flame_graphs_are_embedded_and_escaped() {
        let page = render_diagnose_html(
            "diagnose <dir>",
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
        let empty = render_diagnose_html("t", "", &[], &[]);
        assert!(empty.contains("nothing to plot") && empty.contains("No rank profiles"));
    }
}
