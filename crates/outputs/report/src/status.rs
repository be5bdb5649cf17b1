//! A job's status in one line per kind of evidence, for the server's jobs
//! list and the top of its job page (issue 46: the verdict first): the
//! latest profiling session's report (PerfTracker §4.3: which function on
//! which ranks), the latest cross-layer diagnosis (SysOM-AI §3.1: which
//! ranks are late and the layer), the latest hang report, and the latest
//! flow analysis (LLMPrism: the step, group or link). Every door
//! that shows a job's status calls these, so they say the same thing.

use whyslow_model::diagnosis::DiagnoseReport;
use whyslow_model::flow::{FindingLevel, FlowReport};
use whyslow_model::hang::HangReport;
use whyslow_model::{Report, Verdict};

use crate::format::compact_ranks;

/// How a job stands, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// A hang report says it hangs.
    Hang,
    /// A rank is slow or late, or the job slowed.
    Slow,
    /// The evidence was judged and nothing was found.
    Healthy,
    /// Nothing judged yet (or only evidence that cannot support a verdict).
    Unknown,
}

impl Health {
    /// `hang`, `slow`, `healthy`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Hang => "hang",
            Health::Slow => "slow",
            Health::Healthy => "healthy",
            Health::Unknown => "unknown",
        }
    }
}

/// One piece of a job's status: how it stands by one kind of evidence, in
/// words.
#[derive(Debug, Clone, PartialEq)]
pub struct StatusLine {
    /// How the job stands by this evidence.
    pub health: Health,
    /// What it says, one line.
    pub line: String,
}

/// The status by a session's report: its verdict line
/// ([`crate::verdict_line`]), slow when a finding is on part of a group or
/// iteration time rose.
pub fn report_status(r: &Report) -> StatusLine {
    let slowed = r
        .iterations
        .as_ref()
        .and_then(|i| i.onset.as_ref())
        .filter(|o| o.before_ms > 0.0 && o.after_ms > 1.1 * o.before_ms);
    let health = match r.verdict {
        Verdict::CouldNotJudge => Health::Unknown,
        _ if r.findings.iter().any(|f| !crate::is_job_wide(f)) || slowed.is_some() => Health::Slow,
        _ => Health::Healthy,
    };
    let mut line = crate::verdict_line(r);
    if let Some(o) = slowed {
        line.push_str(&format!(
            " Iteration time rose from {:.1} to {:.1} ms.",
            o.before_ms, o.after_ms
        ));
    }
    StatusLine { health, line }
}

/// The status by a diagnosis: the late ranks and the layer that explains
/// them, or that none is late.
pub fn diagnosis_status(d: &DiagnoseReport) -> StatusLine {
    let mut ranks: Vec<u32> = d.stragglers.iter().map(|s| s.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let layer = if d.layer == "none" {
        "no layer explains it".to_string()
    } else {
        format!("layer: {}", d.layer)
    };
    match ranks.as_slice() {
        [] if d.regressions.is_empty() => StatusLine {
            health: Health::Healthy,
            line: "No rank is late into its collectives.".into(),
        },
        [] => StatusLine {
            health: Health::Slow,
            line: format!(
                "No rank is late, but the job slowed: {} rose since the baseline ({layer}).",
                d.regressions[0].function
            ),
        },
        [r] => StatusLine {
            health: Health::Slow,
            line: format!(
                "Rank {r} is late into its collectives by {} ({layer}).",
                crate::format::duration_us(late_us(d, *r))
            ),
        },
        rs => StatusLine {
            health: Health::Slow,
            line: format!(
                "Ranks {} are late into their collectives ({layer}).",
                compact_ranks(rs, 40)
            ),
        },
    }
}

fn late_us(d: &DiagnoseReport, rank: u32) -> f64 {
    d.stragglers
        .iter()
        .filter(|s| s.rank == rank)
        .map(|s| s.late_us)
        .fold(0.0, f64::max)
}

/// The status by a hang report: its verdict.
pub fn hang_status(h: &HangReport) -> StatusLine {
    StatusLine {
        health: if h.hang {
            Health::Hang
        } else {
            Health::Healthy
        },
        line: h.verdict.clone(),
    }
}

/// The status by a flow analysis: what it found slowing the job, a switch
/// or link first (the cause; slow steps and groups are its symptoms), its
/// reason without the numbers in parentheses (the job page's table has
/// them); healthy when it found nothing, unknown when it could not judge.
pub fn flows_status(f: &FlowReport) -> StatusLine {
    if let Some(why) = &f.could_not_judge {
        return StatusLine {
            health: Health::Unknown,
            line: format!("The flow records cannot be judged: {why}"),
        };
    }
    let first = f
        .findings
        .iter()
        .find(|x| x.level == FindingLevel::Switch)
        .or(f.findings.first());
    let Some(first) = first else {
        return StatusLine {
            health: Health::Healthy,
            line: format!(
                "The flow records show {} job(s) and nothing slowing them.",
                f.jobs.len()
            ),
        };
    };
    let more = match f.findings.len() - 1 {
        0 => String::new(),
        n => format!(" ({n} more finding(s) in the flow analysis)"),
    };
    StatusLine {
        health: Health::Slow,
        line: format!(
            "Flow records: {}: {}.{more}",
            first.subject,
            without_parentheses(&first.reason).trim_end_matches('.')
        ),
    }
}

/// `s` without its parenthesized parts (and the space before each).
fn without_parentheses(s: &str) -> String {
    let mut out = String::new();
    let mut depth = 0usize;
    for c in s.chars() {
        match c {
            '(' => {
                if depth == 0 {
                    let kept = out.trim_end().len();
                    out.truncate(kept);
                }
                depth += 1;
            }
            ')' if depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// A job's status from its parts: the worst health, and the lines worst
/// first (a hang, then what is slow, then what is healthy).
pub fn job_status(parts: &[StatusLine]) -> (Health, Vec<String>) {
    let mut sorted: Vec<&StatusLine> = parts.iter().collect();
    sorted.sort_by_key(|p| p.health);
    let health = sorted.first().map_or(Health::Unknown, |p| p.health);
    (health, sorted.iter().map(|p| p.line.clone()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(health: Health, s: &str) -> StatusLine {
        StatusLine {
            health,
            line: s.into(),
        }
    }

    #[test]
    fn the_worst_part_leads() {
        let (h, lines) = job_status(&[
            line(Health::Healthy, "a"),
            line(Health::Hang, "b"),
            line(Health::Slow, "c"),
        ]);
        assert_eq!(h, Health::Hang);
        assert_eq!(lines, ["b", "c", "a"]);
        assert_eq!(job_status(&[]).0, Health::Unknown);
    }

    #[test]
    fn a_flow_analysis_names_the_link_before_its_symptoms() {
        use whyslow_model::flow::FlowFinding;
        let finding = |level, subject: &str, reason: &str| FlowFinding {
            level,
            subject: subject.into(),
            reason: reason.into(),
            job: None,
            value: 2.0,
            threshold: 1.2,
            start_us: None,
            end_us: None,
        };
        let mut f: FlowReport = serde_json::from_str(
            r#"{"version":1,"flows":0,"merged_duplicates":0,"window_start_us":0,"window_end_us":0,
                "jobs":[],"pairs":[],"ranks":[],"findings":[],"switches":[]}"#,
        )
        .unwrap();
        assert_eq!(flows_status(&f).health, Health::Healthy);
        f.findings.push(finding(
            FindingLevel::Step,
            "job 0 step 26",
            "step took 579 ms",
        ));
        f.findings.push(finding(
            FindingLevel::Switch,
            "link leaf0<->spine",
            "flows take longer (leaf0 → spine: ×1.28 (0.17 Gb/s)): the link is throttled",
        ));
        let s = flows_status(&f);
        assert_eq!(s.health, Health::Slow);
        assert_eq!(
            s.line,
            "Flow records: link leaf0<->spine: flows take longer: the link is throttled. \
             (1 more finding(s) in the flow analysis)"
        );
    }

    #[test]
    fn a_diagnosis_names_its_late_ranks_and_layer() {
        let mut d = DiagnoseReport {
            layer: "os".into(),
            ..Default::default()
        };
        assert_eq!(diagnosis_status(&d).health, Health::Healthy);
        d.stragglers.push(whyslow_model::diagnosis::StragglerRow {
            rank: 2,
            group: "g".into(),
            late_us: 3100.0,
            t: 9.0,
        });
        let s = diagnosis_status(&d);
        assert_eq!(s.health, Health::Slow);
        assert!(
            s.line.starts_with("Rank 2 is late") && s.line.contains("layer: os"),
            "{}",
            s.line
        );
    }
}
