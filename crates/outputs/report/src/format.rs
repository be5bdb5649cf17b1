//! Formatting helpers shared by the terminal and HTML outputs.

use whyslow_model::{Finding, FunctionKind, Reason};

/// Compact rank list: `{0-15,32}`. At most `max_chars` characters of ranges
/// are written; the rest is elided as `,…`.
pub fn compact_ranks(ranks: &[u32], max_chars: usize) -> String {
    let mut sorted: Vec<u32> = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end.wrapping_add(1) && end != u32::MAX {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    let mut out = String::from("{");
    let mut len = 0usize;
    for (k, p) in parts.iter().enumerate() {
        let extra = p.len() + usize::from(k > 0);
        if len + extra > max_chars && k > 0 {
            out.push_str(",…");
            break;
        }
        if k > 0 {
            out.push(',');
        }
        out.push_str(p);
        len += extra;
    }
    out.push('}');
    out
}

/// The workers of a finding in words: `all 64 workers`, `worker 7`,
/// `workers {0-3}`, `workers {0-15,32,…} (300 workers on 40 hosts)`.
pub fn workers_phrase(f: &Finding) -> String {
    let n = f.workers.len();
    let hosts = f.hosts.len();
    let on_hosts = if hosts > 1 {
        format!(" on {hosts} hosts")
    } else if hosts == 1 {
        format!(" on host {}", f.hosts[0])
    } else {
        String::new()
    };
    if f.group_workers > 0 && n >= f.group_workers {
        let scope = if f.group.is_some() {
            " of the group"
        } else {
            ""
        };
        return if n == 1 {
            format!("all (1 worker{scope}){on_hosts}")
        } else {
            format!("all {n} workers{scope}{on_hosts}")
        };
    }
    match n {
        0 => "no worker".to_string(),
        1 => format!("worker {}{on_hosts}", f.workers[0]),
        _ => {
            let list = compact_ranks(&f.workers, 48);
            if hosts == 1 {
                format!("workers {list}{on_hosts}")
            } else if n > 8 || hosts > 1 {
                format!("workers {list} ({n} workers{on_hosts})")
            } else {
                format!("workers {list}")
            }
        }
    }
}

/// Why, in words (Eq. 11).
pub fn reason_phrase(r: Reason) -> &'static str {
    match r {
        Reason::Unexpected => "unexpected (outside its expected range)",
        Reason::PeerOutlier => "differs from peers",
        Reason::Both => "unexpected and differs from peers",
        Reason::Network => "waits on its host's network",
    }
}

/// A fraction as a percentage: `31.2%`.
pub fn pct(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".into();
    }
    let p = x * 100.0;
    if p != 0.0 && p.abs() < 0.1 {
        format!("{p:.2}%")
    } else {
        format!("{p:.1}%")
    }
}

/// Direction of value vs peers: ↑, ↓ or = (within 0.05 percentage point or 2%).
pub fn arrow(value: f64, peers: f64) -> &'static str {
    let d = value - peers;
    if d.abs() < 0.0005 || d.abs() <= 0.02 * peers.abs().max(value.abs()) {
        "="
    } else if d > 0.0 {
        "↑"
    } else {
        "↓"
    }
}

/// Signed difference in percentage points: `+30.1pp`.
pub fn pp(value: f64, peers: f64) -> String {
    let d = (value - peers) * 100.0;
    if !d.is_finite() {
        return "n/a".into();
    }
    format!("{}{:.1}pp", if d >= 0.0 { "+" } else { "-" }, d.abs())
}

/// A duration in µs for people: `850 µs`, `312.0 ms`, `1.20 s`.
pub fn duration_us(us: f64) -> String {
    if !us.is_finite() {
        return "n/a".into();
    }
    let a = us.abs();
    if a < 1000.0 {
        format!("{us:.0} µs")
    } else if a < 1e6 {
        format!("{:.1} ms", us / 1e3)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

pub use whyslow_model::python_frame::{frames, parse_frame};

/// A frame with its file shortened to the base name: `socket.py(704): recv_into`.
pub fn short_frame(frame: &str) -> String {
    match parse_frame(frame) {
        Some((path, line, name)) => {
            let base = path.rsplit(['/', '\\']).next().unwrap_or(path);
            format!("{base}({line}): {name}")
        }
        None => frame.to_string(),
    }
}

/// Title of a finding's function: innermost frame for Python, the name
/// (truncated to `max` characters) otherwise.
pub fn function_title(f: &Finding, max: usize) -> String {
    if f.kind == FunctionKind::Python {
        let fr = frames(&f.function);
        if let Some(last) = fr.last() {
            return truncate_end(&short_frame(last), max);
        }
    }
    truncate_end(&f.function, max)
}

/// The Python stack outermost → innermost, keeping its innermost end within
/// `max` characters. `None` for non-Python functions or one-frame stacks.
pub fn stack_line(f: &Finding, max: usize) -> Option<String> {
    if f.kind != FunctionKind::Python {
        return None;
    }
    let fr = frames(&f.function);
    if fr.len() < 2 {
        return None;
    }
    let s = fr
        .iter()
        .map(|x| short_frame(x))
        .collect::<Vec<_>>()
        .join(" › ");
    Some(truncate_start(&s, max))
}

/// For each finding whose title (innermost frame) another finding of the
/// report shares while their stacks differ, the frame where its stack leaves
/// the other's (the latest such point, so the frame is the one that tells
/// them apart), short form; `None` for the others.
pub fn divergent_frames(findings: &[Finding]) -> Vec<Option<String>> {
    let titles: Vec<String> = findings.iter().map(|f| function_title(f, 100)).collect();
    findings
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mine = frames(&f.function);
            let mut at: Option<usize> = None;
            for (j, g) in findings.iter().enumerate() {
                if j == i || g.function == f.function || titles[j] != titles[i] {
                    continue;
                }
                let theirs = frames(&g.function);
                let common = mine.iter().zip(&theirs).take_while(|(a, b)| a == b).count();
                at = Some(at.map_or(common, |a| a.max(common)));
            }
            at.and_then(|p| mine.get(p)).map(|fr| short_frame(fr))
        })
        .collect()
}

/// Keeps the first `max` characters, with `…` when cut.
pub fn truncate_end(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Keeps the last `max` characters, with `…` when cut.
pub fn truncate_start(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n <= max {
        return s.to_string();
    }
    let mut out = String::from("…");
    out.extend(s.chars().skip(n - max.saturating_sub(1)));
    out
}

/// Replaces control characters (terminal escape injection) by `?`.
pub fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() && c != '\n' { '?' } else { c })
        .collect()
}

/// What a model's fix cost, for both renderings: the code sent, the
/// exchange's seconds and token counts, and whether the answer was cut.
pub(crate) fn fix_cost(f: &whyslow_model::fix::Fix) -> String {
    format!(
        "{} bytes of code were sent{}{}{}",
        f.code_bytes,
        f.seconds
            .map(|x| format!("; answered in {x:.1} s"))
            .unwrap_or_default(),
        f.usage
            .map(|u| format!(
                "; {} prompt + {} answer tokens",
                u.prompt_tokens, u.completion_tokens
            ))
            .unwrap_or_default(),
        if f.truncated {
            "; the answer was cut at the bound on its length (--llm-max-tokens)"
        } else {
            ""
        }
    )
}

/// Whether a proposal was shown to be a fix (`fix.verified`), in words: the
/// table and the HTML say the same.
pub(crate) fn fix_verification(f: &whyslow_model::fix::Fix) -> String {
    use whyslow_model::fix::VerifyStatus;
    let Some(v) = &f.verified else {
        return "not verified (rerun with --verify-fix -- CMD)".into();
    };
    let detail = v.detail.as_deref().unwrap_or("");
    match v.status {
        VerifyStatus::Faster => format!(
            "verified: {:.2}× faster (medians of {} runs a side, Mann–Whitney p = {:.3})",
            v.speedup.unwrap_or(f64::NAN),
            v.runs,
            v.p_value.unwrap_or(f64::NAN)
        ),
        VerifyStatus::NotFaster => format!("not a fix: {detail}"),
        VerifyStatus::NoPatch => "the model proposed no change".into(),
        VerifyStatus::DoesNotApply => format!("not a fix: the patch does not apply ({detail})"),
        VerifyStatus::RunFailed => format!("not verified: {detail}"),
    }
}
