//! A self-contained HTML page with one line chart, for reports whose data is
//! a set of time series (LLMPrism Fig. 5: mean DP bandwidth per switch per step).

use std::fmt::Write as _;

use crate::html::escape;

/// One line of a [`render_lines_page`] chart.
#[derive(Debug, Clone, PartialEq)]
pub struct LineSeries {
    /// Legend label.
    pub label: String,
    /// Drawn in red and bold when true (a flagged subject).
    pub flagged: bool,
    /// (x, y) points in x order.
    pub points: Vec<(f64, f64)>,
}

/// Renders `summary` (preformatted text) and a line chart of `series` as one
/// HTML page with inline SVG and no external assets.
pub fn render_lines_page(
    title: &str,
    summary: &str,
    series: &[LineSeries],
    x_label: &str,
    y_label: &str,
) -> String {
    let svg = line_chart_svg(series, x_label, y_label);
    let body = maud::html! {
        pre { (summary) }
        (maud::PreEscaped(svg))
    };
    crate::layout::page(title, None, &[], "", body)
}

/// A line chart of `series` as one inline SVG element (flagged series red
/// and bold, a legend on the right).
pub fn line_chart_svg(series: &[LineSeries], x_label: &str, y_label: &str) -> String {
    let (w, h, ml, mb, mt, mr) = (860.0, 420.0, 70.0, 50.0, 20.0, 180.0);
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0f64);
    for &(x, y) in pts.filter(|(x, y)| x.is_finite() && y.is_finite()) {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= 0.0 {
        y1 = 1.0;
    }
    let sx = |x: f64| ml + (x - x0) / (x1 - x0) * (w - ml - mr);
    let sy = |y: f64| h - mb - y / (y1 * 1.05) * (h - mb - mt);
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = write!(
        svg,
        r##"<line x1="{ml}" y1="{b}" x2="{r}" y2="{b}" stroke="#333"/><line x1="{ml}" y1="{mt}" x2="{ml}" y2="{b}" stroke="#333"/>"##,
        b = h - mb,
        r = w - mr
    );
    for i in 0..=4 {
        let fy = y1 * 1.05 * i as f64 / 4.0;
        let fx = x0 + (x1 - x0) * i as f64 / 4.0;
        let _ = write!(
            svg,
            r##"<text x="{tx}" y="{ty}" text-anchor="end">{fy:.1}</text><text x="{ux}" y="{uy}" text-anchor="middle">{fx:.1}</text>"##,
            tx = ml - 6.0,
            ty = sy(fy) + 4.0,
            ux = sx(fx),
            uy = h - mb + 16.0
        );
    }
    let _ = write!(
        svg,
        r#"<text x="{cx}" y="{by}" text-anchor="middle">{xl}</text><text x="14" y="{cy}" transform="rotate(-90 14 {cy})" text-anchor="middle">{yl}</text>"#,
        cx = (ml + w - mr) / 2.0,
        by = h - 10.0,
        cy = (mt + h - mb) / 2.0,
        xl = escape(x_label),
        yl = escape(y_label)
    );
    const PALETTE: [&str; 6] = [
        "#4c78a8", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#9d755d",
    ];
    for (i, s) in series.iter().enumerate() {
        let color = if s.flagged {
            "#d62728"
        } else {
            PALETTE[i % PALETTE.len()]
        };
        let width = if s.flagged { 2.5 } else { 1.2 };
        let path: Vec<String> = s
            .points
            .iter()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = write!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="{width}" points="{}"/>"#,
            path.join(" ")
        );
        let ly = mt + 16.0 * i as f64;
        let _ = write!(
            svg,
            r#"<line x1="{a}" y1="{ly}" x2="{b}" y2="{ly}" stroke="{color}" stroke-width="{width}"/><text x="{t}" y="{ty}">{}{}</text>"#,
            escape(&s.label),
            if s.flagged { " (flagged)" } else { "" },
            a = w - mr + 10.0,
            b = w - mr + 30.0,
            t = w - mr + 34.0,
            ty = ly + 4.0
        );
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_is_self_contained_and_escaped() {
        let page = render_lines_page(
            "flows <job>",
            "a & b",
            &[LineSeries {
                label: "leaf<1>".into(),
                flagged: true,
                points: vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, 3.0)],
            }],
            "s",
            "Gb/s",
        );
        assert!(page.contains("flows &lt;job&gt;") && page.contains("a &amp; b"));
        assert!(page.contains("leaf&lt;1&gt; (flagged)"));
        assert!(!page.contains("http://") || page.contains("xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(!page.contains("<script"));
    }

    #[test]
    fn empty_series_do_not_panic() {
        let page = render_lines_page("t", "", &[], "x", "y");
        assert!(page.contains("<svg"));
    }
}
