//! The terminal table (PerfTracker Figure 7, EROICA's output table).

use std::fmt::Write;

use whyslow_model::{Finding, Relation, Report, UtilizationSource, Verdict};

use crate::format::*;

struct Style {
    on: bool,
}

impl Style {
    fn wrap(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }
    fn red(&self, s: &str) -> String {
        self.wrap("1;31", s)
    }
    fn green(&self, s: &str) -> String {
        self.wrap("32", s)
    }
    fn yellow(&self, s: &str) -> String {
        self.wrap("33", s)
    }
    fn dim(&self, s: &str) -> String {
        self.wrap("2", s)
    }
    fn cyan(&self, s: &str) -> String {
        self.wrap("36", s)
    }
}

/// "31.2% ↑ +30.1pp vs 1.1%", red when it goes the abnormal way.
fn versus(st: &Style, value: f64, peers: f64, label: &str) -> String {
    let a = arrow(value, peers);
    let v = format!("{}{label}", pct(value));
    if a == "=" {
        format!("{v} = peers {}", pct(peers))
    } else {
        format!(
            "{} vs {}",
            st.red(&format!("{v} {a} {}", pp(value, peers))),
            pct(peers)
        )
    }
}

/// Greedy word wrap at `width` characters.
fn wrap(s: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for word in s.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(word);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}

fn finding_block(out: &mut String, st: &Style, idx: usize, f: &Finding, via: Option<&str>) {
    let title = printable(&function_title(f, 100));
    let group = f
        .group
        .as_deref()
        .map(|g| format!(" · group {}", printable(g)))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{} {}  {}",
        st.bold(&format!("#{idx}")),
        st.bold(&title),
        st.dim(&format!("[{}{group}]", f.kind))
    );
    if let Some(stack) = stack_line(f, 160) {
        let _ = writeln!(
            out,
            "    {}",
            st.dim(&format!("stack: {}", printable(&stack)))
        );
    }
    if let Some(frame) = via {
        let _ = writeln!(
            out,
            "    {} {}",
            st.bold("called through:"),
            printable(frame)
        );
    }
    let _ = writeln!(
        out,
        "    on {} — {}",
        st.cyan(&workers_phrase(f)),
        reason_phrase(f.reason)
    );
    // With every worker of the group flagged there are no peers to compare with.
    let no_peers = f.group_workers > 0 && f.workers.len() >= f.group_workers;
    if no_peers {
        let _ = writeln!(
            out,
            "    critical path: β {} ({} per window, no unflagged peers)",
            st.red(&pct(f.beta.value)),
            duration_us(f.critical_us.value)
        );
    } else {
        let _ = writeln!(
            out,
            "    critical path: β {} ({} vs {} per window)",
            versus(st, f.beta.value, f.beta.peers, ""),
            duration_us(f.critical_us.value),
            duration_us(f.critical_us.peers)
        );
    }
    if f.util_source == UtilizationSource::None {
        let _ = writeln!(
            out,
            "    utilization: n/a ({} not measured)",
            f.resource.label()
        );
    } else if no_peers || !f.mu.has_peers() {
        let _ = writeln!(
            out,
            "    μ {} {}   σ {}{}",
            pct(f.mu.value),
            f.resource.label(),
            pct(f.sigma.value),
            if no_peers {
                ""
            } else {
                "   (not on the peers' critical path)"
            }
        );
    } else {
        let label = format!(" {}", f.resource.label());
        let _ = writeln!(
            out,
            "    μ {}   σ {}",
            versus(st, f.mu.value, f.mu.peers, &label),
            versus(st, f.sigma.value, f.sigma.peers, "")
        );
    }
    if let (Some(r), false) = (f.resource_mu, no_peers) {
        let label = f.resource.label();
        let _ = writeln!(
            out,
            "    {label} over all critical-path {label} work: {}",
            versus(st, r.value, r.peers, "")
        );
    }
    if let Some(h) = &f.hint {
        let lines = wrap(&printable(h), 92);
        for (i, l) in lines.iter().enumerate() {
            if i == 0 {
                let _ = writeln!(out, "    {} {l}", st.yellow("hint:"));
            } else {
                let _ = writeln!(out, "          {l}");
            }
        }
    }
    for c in &f.consequences {
        let name = printable(&truncate_end(&c.function, 80));
        let line = match c.relation {
            Relation::WaitsFor => format!(
                "→ workers {} wait for these workers in {name}: β {} vs {} here",
                compact_ranks(&c.workers, 40),
                pct(c.beta.value),
                pct(c.beta.peers)
            ),
            Relation::AlsoSlower => format!(
                "→ also slower on these workers: {name}, β {} vs {} on the peers",
                pct(c.beta.value),
                pct(c.beta.peers)
            ),
        };
        let _ = writeln!(out, "    {}", st.cyan(&line));
    }
    if let Some(src) = &f.source_excerpt {
        let _ = writeln!(out, "    {}", st.dim("the relevant code is here:"));
        for line in src.lines() {
            let _ = writeln!(out, "      {}", printable(line));
        }
    }
}

/// Renders a report for a terminal: a header line (workers analyzed, missing
/// workers, utilization source), then one block per finding in the spirit of
/// PerfTracker's Figure 7 and EROICA's output table: function (Python: the
/// innermost frame, then the stack), its workers (`all`, `{0-15,32}`, hosts),
/// β vs peers with the critical-path time, μ and σ with the resource and the
/// difference to peers, the reason, the hint and the source excerpt. A
/// healthy report prints "No anomaly found in N workers.". `color` adds
/// plain ANSI codes (use `false` for pipes).
pub fn render_table(report: &Report, color: bool) -> String {
    let st = Style { on: color };
    let mut out = String::new();
    let missing = if report.missing_workers.is_empty() {
        "none".to_string()
    } else {
        format!(
            "{} {}",
            report.missing_workers.len(),
            compact_ranks(&report.missing_workers, 60)
        )
    };
    let hosts = report
        .hosts
        .map(|h| format!(" · {h} hosts"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "{} {} workers analyzed · missing: {} · utilization: {}{hosts}",
        st.bold("whyslow:"),
        report.workers,
        if report.missing_workers.is_empty() {
            missing
        } else {
            st.red(&missing)
        },
        printable(&report.utilization_source),
    );
    if report.utilization_source == "none" && report.workers > 0 {
        let _ = writeln!(
            out,
            "{}",
            st.dim("(no utilization data: μ and σ are 0; only β is compared)")
        );
    }
    out.push('\n');
    // EROICA's first step, above the findings: a model's proposal.
    if let Some(f) = &report.fix {
        let applies = match (f.applies, &f.applies_error) {
            (Some(true), _) => "the patch applies (git apply fix.patch)".to_string(),
            (Some(false), Some(e)) => format!("the patch does not apply: {}", printable(e)),
            (Some(false), None) => "the patch does not apply".to_string(),
            (None, _) => "the model proposed no change".to_string(),
        };
        let _ = writeln!(
            out,
            "{}",
            st.bold(&format!(
                "Proposed fix — a model's proposal ({}), {}: {applies}",
                printable(&f.model),
                printable(&crate::format::fix_verification(f))
            ))
        );
        if f.patch.is_some() {
            for l in f.text.lines().take(40) {
                let _ = writeln!(out, "  {}", printable(l));
            }
        } else {
            // No diff: its words are not a fix; a few lines say what it
            // answered.
            let _ = writeln!(out, "  {}", st.dim("its answer, without a diff:"));
            for l in f.text.lines().take(6) {
                let _ = writeln!(out, "  {}", st.dim(&printable(l)));
            }
        }
        if let Some(p) = &f.patch {
            for l in p.lines().take(80) {
                let _ = writeln!(out, "  {}", printable(l));
            }
        }
        let _ = writeln!(
            out,
            "{}\n",
            st.dim(&format!("({})", crate::format::fix_cost(f)))
        );
    } else if let Some(e) = &report.fix_error {
        let _ = writeln!(
            out,
            "{}\n",
            st.yellow(&format!("no fix proposal: {}", printable(e)))
        );
    }
    if report.verdict == Verdict::CouldNotJudge {
        let _ = writeln!(out, "{}", st.red(&printable(&crate::verdict_line(report))));
    } else if report.findings.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            st.green(&printable(&crate::verdict_line(report)))
        );
    } else {
        let _ = writeln!(
            out,
            "{}\n",
            st.bold(&printable(&crate::verdict_line(report)))
        );
        let _ = writeln!(
            out,
            "{} abnormal function execution(s), the cause of most of the slowdown first:\n",
            report.findings.len()
        );
        let via = divergent_frames(&report.findings);
        for (i, f) in report.findings.iter().enumerate() {
            finding_block(&mut out, &st, i + 1, f, via[i].as_deref());
            out.push('\n');
        }
    }
    if !report.warnings.is_empty() {
        let _ = writeln!(out, "{}", st.yellow("warnings:"));
        for w in report.warnings.iter().take(20) {
            let _ = writeln!(out, "  - {}", printable(w));
        }
        if report.warnings.len() > 20 {
            let _ = writeln!(out, "  … and {} more", report.warnings.len() - 20);
        }
    }
    out
}
