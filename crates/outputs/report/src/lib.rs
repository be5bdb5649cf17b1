//! whyslow's outputs: a terminal table (PerfTracker Figure 7, EROICA's output
//! table), JSON (the report contract) and a self-contained HTML page with the
//! per-worker scatter plots of PerfTracker Figure 13 and the β CDFs of
//! Figure 15. Source excerpts for Python findings (EROICA's "the relevant code is
//! here") are read by `whyslow_ingest::source` and only shown here.
//!
//! Nothing here panics on any [`Report`]; all text from the inputs (function
//! names, hosts, groups) is escaped in HTML and stripped of control
//! characters in the terminal.
#![deny(missing_docs)]

pub mod diagnose;
pub mod flows;
mod format;
pub mod hang;
mod html;
pub mod layout;
mod lines;
mod perfetto;
pub mod status;
mod table;

pub use format::compact_ranks;
pub use html::{render_html, render_html_in, render_html_with, HtmlOptions};
pub use lines::{line_chart_svg, render_lines_page, LineSeries};
pub use perfetto::render_perfetto;
pub use table::render_table;

use whyslow_model::{Finding, Report, Verdict};

/// The report's one-line verdict: what was found, that nothing was, or why
/// the data could not support either ("No anomaly found" is a claim: it is
/// only made when the workers had data to judge).
pub fn verdict_line(report: &Report) -> String {
    match report.verdict {
        Verdict::CouldNotJudge => format!(
            "Could not judge: {}.",
            if report.not_judged.is_empty() {
                "the data cannot support a verdict".to_string()
            } else {
                report.not_judged.join("; ")
            }
        ),
        _ if report.findings.is_empty() => {
            let mut s = format!("No anomaly found in {} workers.", report.workers);
            if !report.missing_workers.is_empty() {
                s.push_str(&format!(
                    " (Judged without the {} missing rank(s) {}.)",
                    report.missing_workers.len(),
                    compact_ranks(&report.missing_workers, 40)
                ));
            }
            s
        }
        _ => findings_headline(report),
    }
}

/// Whether a finding is on every worker of its comparison group: the job's
/// own behaviour (PerfTracker §4.3's "unexpected" on all workers), not a
/// slow worker among healthy peers.
pub fn is_job_wide(f: &Finding) -> bool {
    f.group_workers > 0 && f.workers.len() >= f.group_workers
}

/// The verdict of a report with findings, the story first: which ranks are
/// slow and in what (the first finding on part of a group, findings being
/// ordered by the share of the iteration they explain), then how many
/// findings are the whole job's.
fn findings_headline(report: &Report) -> String {
    let (wide, partial): (Vec<&Finding>, Vec<&Finding>) =
        report.findings.iter().partition(|f| is_job_wide(f));
    let job_wide = match wide.len() {
        0 => String::new(),
        n => format!(
            "{n} function(s) abnormal on all {} workers (the job itself, not a slow rank).",
            report.workers
        ),
    };
    let Some(top) = partial.first() else {
        return format!("No slow rank: {job_wide}");
    };
    let mut ranks: Vec<u32> = partial.iter().flat_map(|f| f.workers.clone()).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let who = match ranks.as_slice() {
        [r] => format!("Rank {r} is slow"),
        rs => format!("Ranks {} are slow", compact_ranks(rs, 40)),
    };
    let on = if top.workers.len() == ranks.len() {
        String::new()
    } else {
        format!(" on {}", format::workers_phrase(top))
    };
    let mut s = format!(
        "{who}: {}{on} takes {} of the critical path (peers {})",
        format::function_title(top, 80),
        format::pct(top.beta.value),
        format::pct(top.beta.peers)
    );
    if partial.len() > 1 {
        s.push_str(&format!(
            " (+{} more finding(s) on those ranks)",
            partial.len() - 1
        ));
    }
    s.push('.');
    if !job_wide.is_empty() {
        s.push(' ');
        s.push_str(&job_wide);
    }
    s
}

/// Renders the report as pretty JSON (the contract of `whyslow_model::Report`:
/// `workers`, `missing_workers`, `findings` with `function`, `kind`,
/// `workers`, `reason`, `beta`/`mu`/`sigma` {`value`, `peers`}, …).
/// Non-finite numbers are written as `null`.
pub fn render_json(report: &Report) -> String {
    match serde_json::to_string_pretty(report) {
        Ok(s) => s,
        Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
    }
}

#[cfg(test)]
mod tests;
