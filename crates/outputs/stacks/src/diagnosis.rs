//! The diagnosis page (SysOM-AI §3.1, Fig. 5–7): the verdict as text, the
//! entry-time plot of each group with a late rank and the differential
//! flame graphs, drawn from a [`Diagnosis`]. The command line's `--html`,
//! the server's job page and the Python package show this one page.

use whyslow_diagnose::network::NetworkConfig;
use whyslow_diagnose::{Diagnosis, FlamePair};
use whyslow_model::diagnosis::DiagnoseReport;
use whyslow_report::diagnose::{
    render_diagnose_html, render_diagnose_table, EntryPlot, FlameGraph,
};

use crate::{to_diff_flamegraph_svg, FlameOptions};

/// The diagnosis as text for the terminal.
pub fn diagnosis_table(report: &DiagnoseReport) -> String {
    let n = NetworkConfig::default();
    render_diagnose_table(report, (n.min_retrans_pct, n.min_out_of_order_pct))
}

/// A differential flame graph of `pair` (its base against its test).
pub fn diff_flamegraph(pair: &FlamePair) -> FlameGraph {
    let svg = to_diff_flamegraph_svg(
        &pair.base,
        &pair.test,
        &FlameOptions {
            title: pair.title.clone(),
            ..Default::default()
        },
    );
    FlameGraph {
        title: pair.title.clone(),
        svg,
    }
}

/// The whole page, titled `title`.
pub fn diagnosis_html(title: &str, d: &Diagnosis) -> String {
    let plots: Vec<EntryPlot> = d
        .late_groups
        .iter()
        .map(|g| {
            EntryPlot::from_instances(
                &g.lateness.group,
                &g.lateness.ranks,
                &g.lateness.instances,
                &g.flagged,
            )
        })
        .collect();
    let flames: Vec<FlameGraph> = d.flames.iter().map(diff_flamegraph).collect();
    render_diagnose_html(
        title,
        &d.report,
        &diagnosis_table(&d.report),
        &plots,
        &flames,
    )
}
