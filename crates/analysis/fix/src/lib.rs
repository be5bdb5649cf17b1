//! EROICA's first step ("first try AI auto-fix", the paper's last slides):
//! the request an OpenAI-compatible chat model gets from a report's findings
//! and the relevant code, what its answer means, and whether its patch
//! applies. No I/O here: the doors send the request (the command line with
//! its HTTP client, the online package with Python's) and read the files.
//!
//! What is sent, in the report's order: each finding (function, kind,
//! workers against their peers, β/μ/σ against the peers, consequences, the
//! hint), then the code: each finding's enclosing function. Code is bounded
//! by [`FixOptions::max_code_bytes`]; what is cut first is the code of the
//! last findings (a function that does not fit is cut to the lines around
//! the flagged one, then left out), never a finding itself.
#![deny(missing_docs)]

use std::fmt::Write;

use serde_json::{json, Value};
use whyslow_model::fix::CodeContext;
use whyslow_model::{Finding, Report};

/// Bytes of code sent by default.
pub const DEFAULT_MAX_CODE_BYTES: usize = 16 * 1024;

/// The bound on the answer by default, tokens: room for a short
/// explanation and a diff of a few hunks, and an answer in about 15 s from
/// a 135M-parameter model on 2 CPU cores (without a bound a small model
/// writes until its context is full: 9 minutes).
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// Where an answer ends: chat templates' end-of-turn markers some local
/// servers let through, and a run of blank lines (a small model rambling).
pub const STOP: &[&str] = &["<|im_end|>", "<end_of_turn>", "<|endoftext|>", "\n\n\n\n\n"];

/// Lines kept on each side of the flagged line when a function is cut.
const CUT_CONTEXT: usize = 15;

/// What a request may hold.
#[derive(Debug, Clone, PartialEq)]
pub struct FixOptions {
    /// The model (`WHYSLOW_LLM_MODEL`).
    pub model: String,
    /// Bytes of code at most.
    pub max_code_bytes: usize,
    /// Tokens of the answer at most (`max_tokens`).
    pub max_tokens: u32,
}

/// Why an answer gave no proposal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FixError {
    /// Not JSON.
    #[error("the answer is not JSON: {0}")]
    NotJson(String),
    /// JSON without `choices[0].message.content`.
    #[error("the answer has no choices[0].message.content")]
    NoChoices,
    /// An error object from the server.
    #[error("the server answered an error: {0}")]
    Server(String),
}

const SYSTEM: &str = "You are a performance engineer for distributed PyTorch training. \
whyslow measured the job and localized what slows it (PerfTracker/EROICA: a function's \
share of the iteration beta, its utilization mu and sigma, on the flagged workers against \
their peers). Propose the smallest change to the user's code that removes the cause. \
Answer with a short explanation (the cause, the change, what it costs), then the change \
as one unified diff in a ```diff fenced block, with paths exactly as given (--- a/PATH, \
+++ b/PATH) and hunks whose context lines match the code shown. If the code shown is not \
where the fix belongs, say so and give no diff.";

fn stat(s: &whyslow_model::Stat) -> String {
    format!("{:.3} (peers {:.3})", s.value, s.peers)
}

fn finding_text(i: usize, f: &Finding) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Finding {}: {}", i + 1, f.function);
    let _ = writeln!(
        s,
        "  kind {:?}, reason {:?}, workers {:?} of {} in its group",
        f.kind, f.reason, f.workers, f.group_workers
    );
    let _ = writeln!(
        s,
        "  beta {}, mu {}, sigma {}; explains {:.1} % of the iteration",
        stat(&f.beta),
        stat(&f.mu),
        stat(&f.sigma),
        f.explains * 100.0
    );
    for c in &f.consequences {
        let _ = writeln!(
            s,
            "  consequence: {} ({:?}) on workers {:?}, beta {}",
            c.function,
            c.relation,
            c.workers,
            stat(&c.beta)
        );
    }
    if let Some(h) = &f.hint {
        let _ = writeln!(s, "  hint: {h}");
    }
    s
}

/// `ctx` cut to fit `room` bytes: whole, else the lines around the flagged
/// one, else nothing.
fn fit(ctx: &CodeContext, room: usize) -> Option<(u32, String)> {
    if ctx.text.len() <= room {
        return Some((ctx.start_line, ctx.text.clone()));
    }
    let lines: Vec<&str> = ctx.text.lines().collect();
    let at = ctx.line.saturating_sub(ctx.start_line) as usize;
    let from = at.saturating_sub(CUT_CONTEXT);
    let to = (at + CUT_CONTEXT + 1).min(lines.len());
    let cut = lines.get(from..to)?.join("\n") + "\n";
    (cut.len() <= room).then(|| (ctx.start_line + from as u32, cut))
}

/// The chat-completions request body, and the bytes of code in it.
pub fn request(report: &Report, code: &[CodeContext], opts: &FixOptions) -> (Value, usize) {
    let mut user = String::from("whyslow's findings for this job, most iteration time first:\n\n");
    for (i, f) in report.findings.iter().enumerate() {
        user.push_str(&finding_text(i, f));
        user.push('\n');
    }
    let mut room = opts.max_code_bytes;
    let mut sent = 0usize;
    let mut left_out = Vec::new();
    let mut code_text = String::new();
    for c in code {
        match fit(c, room) {
            Some((start, text)) => {
                let _ = writeln!(
                    code_text,
                    "Code of finding {} ({}, from line {start}; the flagged line is {}):\n```python\n{}```\n",
                    c.finding + 1,
                    c.path,
                    c.line,
                    text
                );
                room -= text.len();
                sent += text.len();
            }
            None => left_out.push(c.finding + 1),
        }
    }
    if !code_text.is_empty() {
        user.push_str("The relevant code:\n\n");
        user.push_str(&code_text);
    }
    if !left_out.is_empty() {
        let _ = writeln!(
            user,
            "(The code of finding(s) {left_out:?} was left out: over the {} bytes of code sent.)",
            opts.max_code_bytes
        );
    }
    let body = json!({
        "model": opts.model,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": user},
        ],
        "temperature": 0.2,
        "max_tokens": opts.max_tokens,
        "stop": STOP,
    });
    (body, sent)
}

/// The explanation and the patch (the first ```diff block, else a diff in
/// the text) of a chat-completions answer.
pub fn parse_answer(body: &str) -> Result<(String, Option<String>), FixError> {
    let v: Value = serde_json::from_str(body).map_err(|e| FixError::NotJson(e.to_string()))?;
    if let Some(e) = v.get("error") {
        let msg = e
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string());
        return Err(FixError::Server(
            msg.lines().next().unwrap_or("").to_string(),
        ));
    }
    let content = v
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("message"))
        .and_then(|m| m.get("content"))
        .and_then(Value::as_str)
        .ok_or(FixError::NoChoices)?;
    Ok(split_patch(content))
}

/// (text without the diff block, the diff).
fn split_patch(content: &str) -> (String, Option<String>) {
    for fence in ["```diff", "```patch", "```udiff"] {
        if let Some(i) = content.find(fence) {
            let after = &content[i + fence.len()..];
            let body_start = after.find('\n').map_or(after.len(), |n| n + 1);
            let body = &after[body_start..];
            let end = body.find("```").unwrap_or(body.len());
            let patch = body[..end].to_string();
            let rest = format!(
                "{}{}",
                &content[..i],
                body.get(end + 3..).unwrap_or_default()
            );
            if patch.contains("@@") {
                return (rest.trim().to_string(), Some(patch));
            }
        }
    }
    // A bare diff: from the first `--- ` line followed by `+++ `.
    let lines: Vec<&str> = content.lines().collect();
    for i in 0..lines.len().saturating_sub(1) {
        if lines[i].starts_with("--- ") && lines[i + 1].starts_with("+++ ") {
            let patch = lines[i..].join("\n") + "\n";
            return (lines[..i].join("\n").trim().to_string(), Some(patch));
        }
    }
    (content.trim().to_string(), None)
}

/// What the endpoint says of the exchange besides the text: its token
/// counts and whether the answer hit the length bound.
pub fn answer_meta(body: &str) -> (Option<whyslow_model::fix::FixUsage>, bool) {
    let Ok(v) = serde_json::from_str::<Value>(body) else {
        return (None, false);
    };
    let usage = v.get("usage").and_then(|u| {
        Some(whyslow_model::fix::FixUsage {
            prompt_tokens: u.get("prompt_tokens")?.as_u64()?,
            completion_tokens: u.get("completion_tokens")?.as_u64()?,
        })
    });
    let truncated = v
        .get("choices")
        .and_then(|c| c.get(0))
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
        == Some("length");
    (usage, truncated)
}

/// Puts what came back into the report: `fix` (with the patch checked
/// against the files `read` gives) or `fix_error` in one line. `answer` is
/// the HTTP answer's body, or why there was none. Returns the patch. Every
/// door (the command line, the online package) ends its request here.
pub fn apply_answer(
    report: &mut Report,
    model: &str,
    code_bytes: usize,
    answer: Result<&str, String>,
    read: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let (usage, truncated) = answer
        .as_ref()
        .map(|a| answer_meta(a))
        .unwrap_or((None, false));
    let parsed = answer.and_then(|a| parse_answer(a).map_err(|e| e.to_string()));
    match parsed {
        Err(why) => {
            report.fix = None;
            report.fix_error = Some(why.lines().next().unwrap_or_default().to_string());
            None
        }
        Ok((text, patch)) => {
            let checked = patch.as_ref().map(|p| check_patch(p, read));
            report.fix_error = None;
            report.fix = Some(whyslow_model::fix::Fix {
                model: model.to_string(),
                text,
                patch: patch.clone(),
                applies: checked.as_ref().map(Result::is_ok),
                applies_error: checked.and_then(Result::err),
                code_bytes,
                usage,
                seconds: None,
                truncated,
                verified: None,
            });
            patch
        }
    }
}

fn strip_prefix(path: &str) -> &str {
    let p = path.split('\t').next().unwrap_or(path).trim();
    p.strip_prefix("a/")
        .or_else(|| p.strip_prefix("b/"))
        .unwrap_or(p)
}

/// Whether `patch` applies to the files `read` returns (a path relative to
/// the source root → its text): every hunk's context and removed lines must
/// stand in the file, at the hunk's line or near it (as `git apply` allows
/// offsets). `Err` holds the first reason it does not.
pub fn check_patch(patch: &str, read: &dyn Fn(&str) -> Option<String>) -> Result<(), String> {
    apply_patch(patch, read).map(|_| ())
}

/// A file as a patch leaves it: its path under the source root and its new
/// text (`None`: the patch deletes it).
pub type PatchedFile = (String, Option<String>);

/// The files `patch` changes, as it leaves them ([`check_patch`]'s rules:
/// each hunk where its context and removed lines stand, nearest its line
/// after the lines the hunks before it added or removed, and after the
/// previous hunk). Applied by `--verify-fix` to a scratch copy only.
pub fn apply_patch(
    patch: &str,
    read: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<PatchedFile>, String> {
    let lines: Vec<&str> = patch.lines().collect();
    let mut i = 0;
    let mut out: Vec<PatchedFile> = Vec::new();
    while i < lines.len() {
        if !(lines[i].starts_with("--- ")
            && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ ")))
        {
            i += 1;
            continue;
        }
        let old = strip_prefix(&lines[i][4..]).to_string();
        let new = strip_prefix(&lines[i + 1][4..]).to_string();
        i += 2;
        let text = if old == "/dev/null" {
            String::new()
        } else {
            read(&old).ok_or_else(|| format!("{old}: no such file under the source root"))?
        };
        let mut file: Vec<String> = text.lines().map(str::to_string).collect();
        let (mut hunk, mut delta, mut floor) = (0usize, 0isize, 0usize);
        while i < lines.len() && lines[i].starts_with("@@") {
            hunk += 1;
            let header = lines[i];
            let start: usize = header
                .trim_start_matches('@')
                .trim()
                .strip_prefix('-')
                .and_then(|r| r.split([',', ' ']).next())
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("{new}: hunk {hunk}: bad header {header:?}"))?;
            i += 1;
            let (mut want, mut put): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
            while i < lines.len() && !lines[i].starts_with("@@") && !lines[i].starts_with("--- ") {
                let l = lines[i];
                match l.chars().next() {
                    Some(' ') => {
                        want.push(&l[1..]);
                        put.push(&l[1..]);
                    }
                    None => {
                        want.push("");
                        put.push("");
                    }
                    Some('-') => want.push(&l[1..]),
                    Some('+') => put.push(&l[1..]),
                    Some('\\') => {}
                    _ => {
                        return Err(format!(
                            "{new}: hunk {hunk}: a line that is not context, + or -: {l:?}"
                        ))
                    }
                }
                i += 1;
            }
            let at = (start.saturating_sub(1) as isize + delta).max(0) as usize;
            let at = at.max(floor);
            let matches_at = |k: usize| {
                k >= floor
                    && k + want.len() <= file.len()
                    && want
                        .iter()
                        .zip(&file[k..])
                        .all(|(w, f)| w.trim_end() == f.trim_end())
            };
            let found = (0..=file.len()).find_map(|d| {
                if d <= at && matches_at(at - d) {
                    Some(at - d)
                } else if matches_at(at + d) {
                    Some(at + d)
                } else {
                    None
                }
            });
            let Some(k) = found else {
                return Err(format!(
                    "{new}: hunk {hunk} (line {start}): its context and removed lines are not in the file"
                ));
            };
            file.splice(k..k + want.len(), put.iter().map(|l| l.to_string()));
            delta += put.len() as isize - want.len() as isize;
            floor = k + put.len();
        }
        let text = if new == "/dev/null" {
            None
        } else {
            let mut t = file.join("\n");
            if !file.is_empty() {
                t.push('\n');
            }
            Some(t)
        };
        out.push((if new == "/dev/null" { old } else { new }, text));
    }
    if out.is_empty() {
        return Err("no file in the patch (--- a/PATH, +++ b/PATH)".into());
    }
    Ok(out)
}

/// Least confidence for a rerun to call a patch faster: the one-sided
/// Mann–Whitney p-value must be below this.
pub const VERIFY_ALPHA: f64 = 0.05;

/// The verdict on a patch from the times (s) of the user's command before
/// and after it ([`whyslow_model::fix::FixVerification`]): faster when the
/// median speed-up is above 1 and the runs before took longer at
/// p < [`VERIFY_ALPHA`] (one-sided Mann–Whitney U, as performance
/// benchmarks compare two sets of runs). Fewer than 3 runs a side cannot
/// reach that: it is `not_faster` with the reason.
pub fn judge_rerun(before_s: &[f64], after_s: &[f64]) -> whyslow_model::fix::FixVerification {
    use whyslow_model::fix::{FixVerification, VerifyStatus};
    use whyslow_model::stats::{mann_whitney_greater, median};
    let speedup = match (
        median(&mut before_s.to_vec()),
        median(&mut after_s.to_vec()),
    ) {
        (Some(b), Some(a)) if a > 0.0 => Some(b / a),
        _ => None,
    };
    let p_value = mann_whitney_greater(before_s, after_s);
    let runs = before_s.len().min(after_s.len());
    let faster = speedup.is_some_and(|s| s > 1.0) && p_value.is_some_and(|p| p < VERIFY_ALPHA);
    let detail = if faster {
        None
    } else if runs < 3 {
        Some(format!(
            "{runs} run(s) a side cannot show a difference at p < {VERIFY_ALPHA}"
        ))
    } else {
        Some(format!(
            "not faster: median speed-up {:.3}, p = {:.3} (want > 1 at p < {VERIFY_ALPHA})",
            speedup.unwrap_or(f64::NAN),
            p_value.unwrap_or(f64::NAN)
        ))
    };
    FixVerification {
        status: if faster {
            VerifyStatus::Faster
        } else {
            VerifyStatus::NotFaster
        },
        faster,
        speedup,
        p_value,
        runs,
        before_s: before_s.to_vec(),
        after_s: after_s.to_vec(),
        detail,
    }
}

/// A verdict without runs: the patch could not be tried ([`VerifyStatus`]'s
/// `no_patch`, `does_not_apply`, `run_failed`), with why.
///
/// [`VerifyStatus`]: whyslow_model::fix::VerifyStatus
pub fn not_verified(
    status: whyslow_model::fix::VerifyStatus,
    detail: impl Into<String>,
) -> whyslow_model::fix::FixVerification {
    whyslow_model::fix::FixVerification {
        status,
        faster: false,
        speedup: None,
        p_value: None,
        runs: 0,
        before_s: Vec::new(),
        after_s: Vec::new(),
        detail: Some(detail.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "import time\n\ndef step(batch):\n    x = load(batch)\n    time.sleep(0.01)\n    return x\n";

    fn read(p: &str) -> Option<String> {
        (p == "train.py").then(|| FILE.to_string())
    }

    #[test]
    fn a_patch_that_matches_applies_and_one_that_does_not_says_why() {
        let good = "--- a/train.py\n+++ b/train.py\n@@ -3,4 +3,3 @@\n def step(batch):\n     x = load(batch)\n-    time.sleep(0.01)\n     return x\n";
        assert_eq!(check_patch(good, &read), Ok(()));
        // Offset line numbers still apply, as with git apply.
        let moved = good.replace("@@ -3,4", "@@ -1,4");
        assert_eq!(check_patch(&moved, &read), Ok(()));
        let wrong = good.replace("time.sleep(0.01)", "time.sleep(1)");
        assert!(check_patch(&wrong, &read).unwrap_err().contains("hunk 1"));
        let other = good.replace("train.py", "model.py");
        assert!(check_patch(&other, &read)
            .unwrap_err()
            .contains("no such file"));
        assert!(check_patch("no diff here", &read).is_err());
    }

    #[test]
    fn a_patch_is_applied_where_it_matches() {
        let good = "--- a/train.py\n+++ b/train.py\n@@ -3,4 +3,4 @@\n def step(batch):\n     x = load(batch)\n-    time.sleep(0.01)\n+    pass\n     return x\n";
        let files = apply_patch(good, &read).unwrap();
        assert_eq!(
            files,
            vec![(
                "train.py".to_string(),
                Some(FILE.replace("time.sleep(0.01)", "pass"))
            )]
        );
        // Offsets as git apply takes them; two hunks in order.
        let two = "--- a/train.py\n+++ b/train.py\n@@ -2,2 +2,3 @@\n \n+# fast\n def step(batch):\n@@ -6,1 +7,1 @@\n-    return x\n+    return x * 2\n";
        let (_, text) = &apply_patch(two, &read).unwrap()[0];
        let want = FILE
            .replace("\ndef step", "\n# fast\ndef step")
            .replace("return x\n", "return x * 2\n");
        assert_eq!(text.as_deref(), Some(want.as_str()));
        // A new file.
        let added = "--- /dev/null\n+++ b/fast.py\n@@ -0,0 +1,1 @@\n+FAST = True\n";
        assert_eq!(
            apply_patch(added, &read).unwrap(),
            vec![("fast.py".to_string(), Some("FAST = True\n".to_string()))]
        );
    }

    #[test]
    fn a_rerun_calls_a_patch_faster_only_when_it_is() {
        use whyslow_model::fix::VerifyStatus;
        let before = [10.2, 10.0, 10.4, 10.1, 10.3, 10.6, 10.2, 10.5, 10.0, 10.3];
        let after = [8.1, 8.0, 8.3, 8.2, 7.9, 8.4, 8.0, 8.2, 8.1, 8.3];
        let v = judge_rerun(&before, &after);
        assert_eq!(v.status, VerifyStatus::Faster);
        assert!(v.p_value.unwrap() < 1e-4 && (v.speedup.unwrap() - 10.25 / 8.15).abs() < 1e-9);
        assert_eq!(v.runs, 10);
        // The same times on both sides (noise only), or slower: not a fix.
        let same = judge_rerun(&before, &before);
        assert_eq!(same.status, VerifyStatus::NotFaster);
        assert!(same.detail.unwrap().contains("not faster"));
        assert_eq!(judge_rerun(&after, &before).status, VerifyStatus::NotFaster);
        // Two runs a side cannot show it, however far apart.
        let two = judge_rerun(&[10.0, 10.1], &[1.0, 1.1]);
        assert!(!two.faster && two.detail.unwrap().contains("2 run(s)"));
    }

    #[test]
    fn answers_give_text_and_patch_or_a_reason() {
        let body = json!({"choices": [{"message": {"role": "assistant", "content":
            "The sleep stalls every step.\n```diff\n--- a/train.py\n+++ b/train.py\n@@ -5 +5 @@\n-    time.sleep(0.01)\n+    pass\n```\nDone."}}]});
        let (text, patch) = parse_answer(&body.to_string()).unwrap();
        assert!(
            text.starts_with("The sleep") && text.ends_with("Done."),
            "{text}"
        );
        assert!(patch.unwrap().starts_with("--- a/train.py"));
        assert_eq!(
            parse_answer("<html>"),
            Err(FixError::NotJson(
                "expected value at line 1 column 1".into()
            ))
        );
        assert_eq!(parse_answer("{\"choices\": []}"), Err(FixError::NoChoices));
        assert!(matches!(
            parse_answer("{\"error\": {\"message\": \"model not found\"}}"),
            Err(FixError::Server(m)) if m == "model not found"
        ));
        let (_, none) = parse_answer(
            &json!({"choices": [{"message": {"content": "no change needed"}}]}).to_string(),
        )
        .unwrap();
        assert_eq!(none, None);
    }

    #[test]
    fn code_is_cut_from_the_last_findings_first() {
        let big = "x = 1\n".repeat(100);
        let ctx = |finding, text: &str| CodeContext {
            finding,
            path: "train.py".into(),
            start_line: 1,
            line: 50,
            text: text.into(),
        };
        let code = [ctx(0, &big), ctx(1, &big)];
        let report: Report = serde_json::from_value(json!({
            "version": 3, "workers": 4, "missing_workers": [], "findings": [],
            "utilization_source": "none"}))
        .unwrap();
        let opts = FixOptions {
            model: "m".into(),
            max_code_bytes: 700,
            max_tokens: DEFAULT_MAX_TOKENS,
        };
        let (body, sent) = request(&report, &code, &opts);
        let user = body["messages"][1]["content"].as_str().unwrap();
        assert!(sent <= 700, "{sent}");
        // The first finding's function, cut around its line; the second's left out.
        assert!(user.contains("Code of finding 1"), "{user}");
        assert!(!user.contains("Code of finding 2"), "{user}");
        assert!(user.contains("finding(s) [2] was left out"), "{user}");
    }
}
