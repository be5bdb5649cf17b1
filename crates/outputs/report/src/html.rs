//! The self-contained HTML report: summary table, per-finding scatter plots
//! (PerfTracker Figure 13) and β CDFs (Figure 15), as inline SVG.
//! This module draws the SVG plots (numbers and escaped labels, with
//! `write!`) and assembles the page; its sections are maud components in
//! `sections`, escaped by the template engine.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use whyslow_model::{Finding, IterationSeries, IterationTimes, Report, Verdict, WorkerPoint};

use maud::{html, Markup};

use crate::format::*;

mod sections;
use sections::*;

/// Escapes text for the SVG plots' element content and attribute values
/// (the plots are drawn with `write!`; the pages around them are maud
/// templates, escaped by the engine).
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

const W: f64 = 380.0;
const H: f64 = 280.0;
/// Width of the iteration-time plot.
const W_WIDE: f64 = 780.0;
const ML: f64 = 56.0;
const MR: f64 = 16.0;
const MT: f64 = 16.0;
const MB: f64 = 44.0;
/// Flagged workers labeled by rank in a plot, at most.
const MAX_LABELS: usize = 24;

/// Every axis is a share in [0, 1] (β, μ, σ, fraction of workers): ticks
/// read as percentages ("25%", "0.5%"), not "0.24" or "6.7e-3".
fn fmt_tick(v: f64) -> String {
    let pct = v * 100.0;
    let s = if v == 0.0 {
        "0".to_string()
    } else if pct.abs() >= 10.0 {
        format!("{pct:.0}")
    } else if pct.abs() >= 1.0 {
        format!("{pct:.1}")
    } else {
        format!("{pct:.2}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    format!("{s}%")
}

/// The smallest of 1, 2, 2.5, 5 × 10^k at or above `raw`: tick steps people read.
fn nice_step(raw: f64) -> f64 {
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|&s| s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag)
}

/// Four tick steps of a readable size, covering `m`.
fn nice_max(m: f64) -> f64 {
    if m.is_finite() && m > 0.0 {
        4.0 * nice_step(m / 4.0)
    } else {
        1.0
    }
}

struct Axes {
    /// Width of the plot, px.
    w: f64,
    xmin: f64,
    xmax: f64,
    ymax: f64,
    fx: fn(f64) -> String,
    fy: fn(f64) -> String,
}

impl Axes {
    /// Axes for shares in [0, 1], from 0 to a readable maximum.
    fn new(xmax: f64, ymax: f64) -> Axes {
        Axes {
            w: W,
            xmin: 0.0,
            xmax: nice_max(xmax),
            ymax: nice_max(ymax),
            fx: fmt_tick,
            fy: fmt_tick,
        }
    }
    fn x(&self, v: f64) -> f64 {
        let span = (self.xmax - self.xmin).max(f64::MIN_POSITIVE);
        ML + ((v - self.xmin) / span).clamp(0.0, 1.0) * (self.w - ML - MR)
    }
    fn y(&self, v: f64) -> f64 {
        H - MB - (v / self.ymax).clamp(0.0, 1.0) * (H - MT - MB)
    }
    fn frame(&self, out: &mut String, xlabel: &str, ylabel: &str) {
        let _ = write!(
            out,
            r##"<rect x="{ML}" y="{MT}" width="{}" height="{}" fill="#fff" stroke="#999"/>"##,
            self.w - ML - MR,
            H - MT - MB
        );
        for i in 0..=4 {
            let fx = self.xmin + (self.xmax - self.xmin) * f64::from(i) / 4.0;
            let fy = self.ymax * f64::from(i) / 4.0;
            let (px, py) = (self.x(fx), self.y(fy));
            let _ = write!(
                out,
                r##"<line x1="{px:.1}" y1="{MT}" x2="{px:.1}" y2="{:.1}" stroke="#eee"/><text x="{px:.1}" y="{:.1}" text-anchor="middle" class="tick">{}</text>"##,
                H - MB,
                H - MB + 14.0,
                (self.fx)(fx)
            );
            let _ = write!(
                out,
                r##"<line x1="{ML}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
                self.w - MR,
                ML - 4.0,
                py + 4.0,
                (self.fy)(fy)
            );
        }
        let _ = write!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="axis">{}</text><text transform="translate(14 {:.1}) rotate(-90)" text-anchor="middle" class="axis">{}</text>"#,
            (ML + self.w - MR) / 2.0,
            H - 8.0,
            escape(xlabel),
            (MT + H - MB) / 2.0,
            escape(ylabel)
        );
    }
}

fn svg_open(out: &mut String, title: &str) {
    svg_open_wide(out, title, W);
}

fn svg_open_wide(out: &mut String, title: &str, w: f64) {
    let _ = write!(
        out,
        r#"<svg width="{w}" height="{H}" viewBox="0 0 {w} {H}" role="img"><title>{}</title>"#,
        escape(title)
    );
}

/// Scatter of the workers' patterns, flagged ones red and labeled (Fig. 13).
fn scatter(
    f: &Finding,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    get: fn(&WorkerPoint) -> (f64, f64),
) -> String {
    let finite = |v: f64| if v.is_finite() { v } else { 0.0 };
    let pts: Vec<(f64, f64, &WorkerPoint)> = f
        .points
        .iter()
        .map(|p| {
            let (x, y) = get(p);
            (finite(x), finite(y), p)
        })
        .collect();
    let ax = Axes::new(
        pts.iter().map(|p| p.0).fold(0.0, f64::max),
        pts.iter().map(|p| p.1).fold(0.0, f64::max),
    );
    let mut out = String::new();
    svg_open(&mut out, title);
    ax.frame(&mut out, xlabel, ylabel);
    for (x, y, p) in &pts {
        if !p.flagged {
            let _ = write!(
                out,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" class="ok"><title>worker {}</title></circle>"#,
                ax.x(*x),
                ax.y(*y),
                p.worker
            );
        }
    }
    let mut labeled = 0usize;
    let mut placed: Vec<(f64, f64)> = Vec::new();
    for (x, y, p) in &pts {
        if p.flagged {
            let (cx, cy) = (ax.x(*x), ax.y(*y));
            let _ = write!(
                out,
                r#"<circle cx="{cx:.1}" cy="{cy:.1}" r="3.5" class="bad"><title>worker {}</title></circle>"#,
                p.worker
            );
            if labeled < MAX_LABELS {
                // Stack labels of nearby points instead of overlapping them.
                let (lx, mut ly) = (cx + 5.0, cy - 4.0);
                while placed
                    .iter()
                    .any(|&(x, y): &(f64, f64)| (x - lx).abs() < 24.0 && (y - ly).abs() < 10.0)
                {
                    ly -= 10.0;
                }
                if ly < MT + 8.0 {
                    continue; // no room left above: leave it unlabeled
                }
                placed.push((lx, ly));
                labeled += 1;
                let _ = write!(
                    out,
                    r#"<text x="{lx:.1}" y="{:.1}" class="lbl">{}</text>"#,
                    ly, p.worker
                );
            }
        }
    }
    out.push_str("</svg>");
    out
}

/// Iteration time over the steps (one line per worker, or the job's median
/// line and the flagged workers' when there are many), the onset dashed.
fn iteration_plot(it: &IterationTimes, flagged: &BTreeSet<u32>) -> String {
    const MAX_LINES: usize = 16;
    let mut lines: Vec<(&IterationSeries, bool)> = if it.series.len() <= MAX_LINES {
        it.series
            .iter()
            .map(|s| (s, s.worker.is_some_and(|w| flagged.contains(&w))))
            .collect()
    } else {
        it.series
            .iter()
            .filter(|s| s.worker.is_some_and(|w| flagged.contains(&w)))
            .take(MAX_LINES)
            .map(|s| (s, true))
            .collect()
    };
    // Unflagged first, so the flagged lines are drawn on top.
    lines.sort_by_key(|l| l.1);
    let median_line = (it.series.len() > MAX_LINES).then(|| job_median(&it.series));

    let mut all: Vec<f64> = it
        .series
        .iter()
        .flat_map(|s| s.ms.iter().copied())
        .filter(|v| v.is_finite())
        .collect();
    all.sort_by(f64::total_cmp);
    let (first, last) = it
        .series
        .iter()
        .filter_map(|s| Some((*s.steps.first()?, *s.steps.last()?)))
        .fold((u64::MAX, 0), |(a, b), (f, l)| (a.min(f), b.max(l)));
    if all.is_empty() || first > last {
        return String::new();
    }
    // A rare very long iteration (a checkpoint) would flatten the rest: the
    // axis ends a little above the 99th percentile and longer ones are clipped.
    let p99 = all[(all.len() - 1) * 99 / 100];
    // Four tick steps of a readable size from a multiple of the step.
    let (first, last) = (first as f64, last as f64);
    let tick = [1.0, 2.0, 5.0]
        .into_iter()
        .flat_map(|m| (0..12).map(move |e| m * 10f64.powi(e)))
        .filter(|t| {
            let lo = (first / t).floor() * t;
            lo + 4.0 * t >= last
        })
        .fold(f64::INFINITY, f64::min);
    let xmin = (first / tick).floor() * tick;
    let ax = Axes {
        w: W_WIDE,
        xmin,
        xmax: xmin + 4.0 * tick,
        ymax: nice_max(p99 * 1.15),
        fx: |v| format!("{v:.0}"),
        fy: |v| {
            format!("{v:.3}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        },
    };
    let mut out = String::new();
    svg_open_wide(&mut out, "Iteration time over the steps", W_WIDE);
    ax.frame(&mut out, "step", "iteration time (ms)");
    let path = |steps: &[u64], ms: &[f64]| {
        let mut d = String::new();
        for (i, (st, v)) in steps.iter().zip(ms).filter(|p| p.1.is_finite()).enumerate() {
            let _ = write!(
                d,
                "{}{:.1} {:.1}",
                if i == 0 { "M" } else { " L" },
                ax.x(*st as f64),
                ax.y(*v)
            );
        }
        d
    };
    for (s, bad) in &lines {
        let who = s
            .worker
            .map(|w| format!("worker {w}"))
            .unwrap_or_else(|| "the job".into());
        let _ = write!(
            out,
            r##"<path d="{}" fill="none" stroke="{}" stroke-width="{}" stroke-opacity="{}"><title>{who}</title></path>"##,
            path(&s.steps, &s.ms),
            if *bad { "#cf222e" } else { "#2563eb" },
            if *bad { 1.5 } else { 1.0 },
            if *bad { 1.0 } else { 0.6 },
        );
    }
    if let Some((steps, ms)) = median_line {
        let _ = write!(
            out,
            r##"<path d="{}" fill="none" stroke="#2563eb" stroke-width="1.5"><title>median over the workers</title></path>"##,
            path(&steps, &ms)
        );
    }
    if let Some(o) = &it.onset {
        let x = ax.x(o.step as f64);
        let _ = write!(
            out,
            r##"<line x1="{x:.1}" y1="{MT}" x2="{x:.1}" y2="{:.1}" stroke="#9a6700" stroke-width="1.5" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" class="onset">onset: step {}</text>"##,
            H - MB,
            (x + 4.0).min(W_WIDE - MR - 80.0),
            MT + 12.0,
            o.step
        );
    }
    out.push_str("</svg>");
    out
}

/// The job's iteration time per step: the median over the series.
fn job_median(series: &[IterationSeries]) -> (Vec<u64>, Vec<f64>) {
    let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for s in series {
        for (st, v) in s.steps.iter().zip(&s.ms) {
            by_step.entry(*st).or_default().push(*v);
        }
    }
    by_step
        .into_iter()
        .map(|(st, mut v)| {
            v.sort_by(f64::total_cmp);
            (st, v[v.len() / 2])
        })
        .unzip()
}

/// CDF of β across the workers, flagged workers marked (Fig. 15).
fn cdf(f: &Finding) -> String {
    let mut betas: Vec<(f64, bool)> = f
        .points
        .iter()
        .map(|p| (if p.beta.is_finite() { p.beta } else { 0.0 }, p.flagged))
        .collect();
    betas.sort_by(|a, b| a.0.total_cmp(&b.0));
    let ax = Axes::new(betas.last().map_or(0.0, |b| b.0), 1.0);
    let mut out = String::new();
    svg_open(&mut out, "CDF of β across workers");
    ax.frame(&mut out, "β (critical-path share)", "fraction of workers");
    let n = betas.len();
    if n > 0 {
        let mut d = format!("M{:.1} {:.1}", ax.x(0.0), ax.y(0.0));
        for (i, (b, _)) in betas.iter().enumerate() {
            let x = ax.x(*b);
            let _ = write!(
                d,
                " L{x:.1} {:.1} L{x:.1} {:.1}",
                ax.y(i as f64 / n as f64),
                ax.y((i + 1) as f64 / n as f64)
            );
        }
        let _ = write!(
            out,
            r##"<path d="{d}" fill="none" stroke="#2563eb" stroke-width="1.5"/>"##
        );
        for (i, (b, flagged)) in betas.iter().enumerate() {
            if *flagged {
                let _ = write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3" class="bad"/>"#,
                    ax.x(*b),
                    ax.y((i + 1) as f64 / n as f64)
                );
            }
        }
    }
    out.push_str("</svg>");
    out
}

const CSS: &str = r#"
h2{word-break:break-all}
.meta{color:#57606a;margin-bottom:16px}
table{margin-bottom:20px}
th,td{border:1px solid #d0d7de} td.fn{word-break:break-all;max-width:420px}
.up{color:#cf222e;font-weight:600} .card{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:14px;margin-bottom:18px}
.stack{color:#57606a;font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.hint{background:#fff8c5;border:1px solid #d4a72c;border-radius:4px;padding:8px;margin:8px 0}
.plots{display:flex;flex-wrap:wrap;gap:12px}
svg .tick{font-size:10px;fill:#57606a} svg .axis{font-size:11px;fill:#1f2328} svg .lbl{font-size:10px;fill:#cf222e}
svg .ok{fill:#8c959f;fill-opacity:.6} svg .onset{font-size:11px;fill:#9a6700} svg .bad{fill:#cf222e}
.not-measured{color:#57606a;font-style:italic;max-width:340px}
.glossary{margin-top:24px} .glossary dt{font-weight:600} .glossary dd{margin:0 0 6px 16px}
.ok-msg{font-size:16px;color:#1a7f37;font-weight:600}
.warn-msg{font-size:16px;color:#b35900;font-weight:600}
.warn{color:#9a6700}
"#;

/// Renders a self-contained HTML page (inline CSS and SVG, no scripts or
/// external assets): a summary table of the findings, then per finding the
/// scatter plots (β, μ) and (μ, σ) of its workers with the flagged ones red
/// and labeled (PerfTracker Figure 13) and the CDF of β across workers
/// (Figure 15), with the hint and the source excerpt. All text is escaped.
pub fn render_html(report: &Report) -> String {
    render_html_with(report, &HtmlOptions::default())
}

/// What the page links to besides itself.
#[derive(Debug, Clone, Default)]
pub struct HtmlOptions {
    /// The Perfetto trace written beside the page (`whyslow analyze
    /// --perfetto`), as a path relative to the page.
    pub perfetto_file: Option<String>,
    /// The cross-layer diagnosis page written beside this one (the online
    /// package's `diagnose.html`), as a path relative to the page.
    pub diagnosis_file: Option<String>,
}

/// [`render_html`] with links to the files written beside the page.
pub fn render_html_with(report: &Report, opts: &HtmlOptions) -> String {
    render_html_in(&crate::layout::Nav::default(), report, opts)
}

/// [`render_html_with`] under the navigation bar `nav` (the server's
/// session page: its jobs, the job, the fix button).
pub fn render_html_in(nav: &crate::layout::Nav, report: &Report, opts: &HtmlOptions) -> String {
    // The verdict first (issue 46), then what it rests on.
    let health = match report.verdict {
        Verdict::CouldNotJudge => "unknown",
        _ if report.findings.is_empty() => "healthy",
        _ => "slow",
    };
    let judged = !report.findings.is_empty() && report.verdict != Verdict::CouldNotJudge;
    let via = divergent_frames(&report.findings);
    let body = html! {
        (crate::layout::verdict_card(health, &crate::verdict_line(report), html! {}))
        (meta_lines(report, opts))
        @if let Some(d) = &report.cross_layer {
            (cross_layer_section(d, opts.diagnosis_file.as_deref()))
        }
        (fix_section(report))
        @if judged {
            (findings_table(report, &via))
        }
        (iteration_section(report))
        @if judged {
            @for (i, f) in report.findings.iter().enumerate() {
                (finding_card(f, i, via[i].as_deref()))
            }
        }
        @if !report.warnings.is_empty() {
            h2.warn { "Warnings" }
            ul { @for w in &report.warnings { li { (w) } } }
        }
        (glossary())
        p.meta {
            "Method: PerfTracker §4.3 (expected ranges and differential distance over runtime \
             behavior patterns β, μ, σ)."
        }
    };
    crate::layout::page_in(nav, "Why is this training job slow?", CSS, body)
}

/// What was analyzed, and the Perfetto file written beside the page.
fn meta_lines(report: &Report, opts: &HtmlOptions) -> Markup {
    let missing = if report.missing_workers.is_empty() {
        "none".to_string()
    } else {
        format!(
            "{} {}",
            report.missing_workers.len(),
            compact_ranks(&report.missing_workers, 80)
        )
    };
    html! {
        div.meta {
            (report.workers) " workers analyzed · missing: " (missing)
            " · utilization: " (report.utilization_source)
            @if let Some(h) = report.hosts { " · " (h) " hosts" }
        }
        @if let Some(file) = &opts.perfetto_file {
            div.meta {
                "The flagged spans, on the flagged workers and on peers: "
                a href=(file) download { (file) }
                " — open it in " a href="https://ui.perfetto.dev" { "ui.perfetto.dev" }
                " (Open trace file) or chrome://tracing."
            }
        }
    }
}

/// The model's proposal (`--suggest-fix`) or why there is none.
fn fix_section(report: &Report) -> Markup {
    let Some(f) = &report.fix else {
        return match &report.fix_error {
            Some(e) => html! { p."warn-msg" { "No fix proposal: " (e) } },
            None => html! {},
        };
    };
    let applies = match (f.applies, &f.applies_error) {
        (Some(true), _) => html! { "the patch applies (" code { "git apply fix.patch" } ")" },
        (Some(false), Some(e)) => html! { "the patch does not apply: " (e) },
        (Some(false), None) => html! { "the patch does not apply" },
        (None, _) => html! { "the model proposed no change" },
    };
    html! {
        section.fix {
            h2 {
                "Proposed fix "
                small {
                    "(a model's proposal: " (f.model) "; "
                    (crate::format::fix_verification(f)) ")"
                }
            }
            p { (applies) "; " (crate::format::fix_cost(f)) "." }
            @if f.patch.is_some() {
                pre { (f.text) }
            } @else {
                details { summary { "its answer, without a diff" } pre { (f.text) } }
            }
            @if let Some(p) = &f.patch {
                pre.patch { (p) }
            }
        }
    }
}

#[cfg(test)]
mod axis_tests {
    use super::*;

    #[test]
    fn ticks_are_readable_percentages_on_round_steps() {
        assert_eq!(fmt_tick(0.0), "0%");
        assert_eq!(fmt_tick(0.25), "25%");
        assert_eq!(fmt_tick(0.0067), "0.67%");
        assert_eq!(fmt_tick(0.015), "1.5%");
        assert_eq!(fmt_tick(1.0), "100%");
        // A largest β of 0.7 gives steps of 0.2 (0–80 %), not 0.24, 0.48, 0.72.
        let ax = Axes::new(0.7, 1.0);
        assert!((ax.xmax - 0.8).abs() < 1e-12 && (ax.ymax - 1.0).abs() < 1e-12);
        assert!((Axes::new(0.0062, 0.3).xmax - 0.008).abs() < 1e-12);
        assert!((nice_step(0.06) - 0.1).abs() < 1e-12);
        assert!((nice_step(0.0025) - 0.0025).abs() < 1e-12);
    }
}
