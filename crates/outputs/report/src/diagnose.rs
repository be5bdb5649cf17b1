//! The HTML page of `whyslow diagnose` (SysOM-AI §3.1): the verdict as text,
//! the per-rank entry-time plot of each group with a late rank (SysOM-AI
//! Fig. 5: how long after the group's first rank each rank entered each
//! collective) and the differential flame graphs (Fig. 6–7), each in its own
//! frame so their zoom scripts and ids do not meet.

use std::fmt::Write as _;

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
