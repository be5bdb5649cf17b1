//! Source excerpts for Python findings (EROICA: "the relevant code is here").

use std::path::{Component, Path, PathBuf};

use whyslow_model::{FunctionKind, Report};

use whyslow_model::python_frame::{frames, parse_frame};

/// Lines shown on each side of the frame's line.
const CONTEXT: u32 = 2;
/// Files larger than this are not read.
const MAX_FILE_BYTES: u64 = 16 << 20;

/// Finds the file of a frame: the path itself when absolute (or relative to
/// the working directory) and present, else relative to one of `roots`, else
/// its longest suffix that exists under one of `roots`.
fn resolve(path: &str, roots: &[PathBuf]) -> Option<PathBuf> {
    let p = Path::new(path);
    if p.is_file() && (p.is_absolute() || roots.is_empty()) {
        return Some(p.to_path_buf());
    }
    let comps: Vec<&str> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    for start in 0..comps.len() {
        let suffix: PathBuf = comps[start..].iter().collect();
        for root in roots {
            let cand = root.join(&suffix);
            if cand.is_file() {
                return Some(cand);
            }
        }
    }
    if p.is_file() {
        return Some(p.to_path_buf());
    }
    None
}

/// The line of `def name(` (or `async def`) nearest to `idx` (0-based), when
/// the recorded line does not define `name`: the file changed since the
/// trace was taken (lines added above the function), as happens when a
/// report is read against a newer checkout. `None` keeps the recorded line.
fn moved_def(lines: &[&str], idx: usize, name: &str) -> Option<usize> {
    let plain = !name.is_empty() && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    if !plain {
        return None; // <module>, <listcomp>, built-ins: nothing to look for
    }
    let defines = |l: &str| {
        let t = l.trim_start();
        let t = t.strip_prefix("async ").unwrap_or(t);
        t.strip_prefix("def ")
            .and_then(|r| r.strip_prefix(name))
            .is_some_and(|r| r.trim_start().starts_with('('))
    };
    if lines.get(idx).is_some_and(|l| defines(l)) {
        return None;
    }
    (0..lines.len())
        .filter(|&i| defines(lines[i]))
        .min_by_key(|&i| i.abs_diff(idx))
}

/// ~5 lines around `line` (1-based), numbered, the line itself marked `>`;
/// when the file has changed and `def name` now stands elsewhere, around that.
fn excerpt(file: &Path, line: u32, name: &str) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    if meta.len() > MAX_FILE_BYTES || line == 0 {
        return None;
    }
    let bytes = std::fs::read(file).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let recorded = usize::try_from(line).ok()?.checked_sub(1)?;
    let moved = moved_def(&lines, recorded, name);
    let idx = moved.unwrap_or(recorded);
    if idx >= lines.len() {
        return None;
    }
    let from = idx.saturating_sub(CONTEXT as usize);
    let to = (idx + CONTEXT as usize).min(lines.len() - 1);
    let width = (to + 1).to_string().len();
    let mut out = match moved {
        Some(m) => format!(
            "{}:{} (the trace says line {line}: the file has changed since)\n",
            file.display(),
            m + 1
        ),
        None => format!("{}:{line}\n", file.display()),
    };
    for (i, l) in lines.iter().enumerate().take(to + 1).skip(from) {
        let marker = if i == idx { '>' } else { ' ' };
        out.push_str(&format!(
            "{marker} {:>width$} | {}\n",
            i + 1,
            l.trim_end_matches('\r')
        ));
    }
    Some(out)
}

/// For every Python finding, reads the innermost frame `path/file.py(123):
/// name` (the innermost one that names a file) and puts ~5 lines around line 123 (numbered, the line marked `>`,
/// preceded by `path:line`) into [`whyslow_model::Finding::source_excerpt`]
/// (EROICA: "the relevant code is here"). The file is the frame's path when
/// it exists, else that path relative to one of `roots`, else its longest
/// suffix found under one of `roots` (e.g. a site-packages path matched in a
/// source checkout). Unreadable or missing files are skipped silently.
pub fn attach_source_excerpts(report: &mut Report, roots: &[PathBuf]) {
    for f in &mut report.findings {
        if f.kind != FunctionKind::Python {
            continue;
        }
        // The innermost frame that names a file (built-ins such as
        // `<built-in method recv_into …>` have none).
        let Some((path, line, name)) = frames(&f.function).into_iter().rev().find_map(parse_frame)
        else {
            continue;
        };
        if let Some(file) = resolve(path, roots) {
            if let Some(x) = excerpt(&file, line, name) {
                f.source_excerpt = Some(x);
            }
        }
    }
}

/// Lines of code sent for one function at most (longer ones are centered
/// on the flagged line).
const MAX_FUNCTION_LINES: usize = 200;

/// [from, to) of the Python function enclosing `idx` (0-based): the nearest
/// `def` above it with less indentation, to the end of its block; the lines
/// around `idx` at module level.
fn enclosing(lines: &[&str], idx: usize) -> (usize, usize) {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let is_def = |l: &str| {
        let t = l.trim_start();
        t.starts_with("def ") || t.starts_with("async def ")
    };
    let here = indent(lines[idx]);
    let start = (0..=idx)
        .rev()
        .find(|&i| is_def(lines[i]) && (i == idx || indent(lines[i]) < here));
    let (from, to) = match start {
        Some(s) => {
            let base = indent(lines[s]);
            let end = (s + 1..lines.len())
                .find(|&i| !lines[i].trim().is_empty() && indent(lines[i]) <= base)
                .unwrap_or(lines.len());
            // Decorators belong to the function.
            let mut from = s;
            while from > 0 && lines[from - 1].trim_start().starts_with('@') {
                from -= 1;
            }
            (from, end)
        }
        None => (idx.saturating_sub(10), (idx + 11).min(lines.len())),
    };
    if to - from > MAX_FUNCTION_LINES {
        let half = MAX_FUNCTION_LINES / 2;
        let f = idx.saturating_sub(half).max(from);
        return (f, (f + MAX_FUNCTION_LINES).min(to));
    }
    (from, to)
}

/// Lines on each side of the call site in the caller's code.
const CALLER_CONTEXT: usize = 12;

fn read_lines(file: &Path) -> Option<String> {
    let meta = std::fs::metadata(file).ok()?;
    if meta.len() > MAX_FILE_BYTES {
        return None;
    }
    Some(String::from_utf8_lossy(&std::fs::read(file).ok()?).into_owned())
}

fn shown_path(file: &Path, roots: &[PathBuf]) -> String {
    roots
        .iter()
        .filter_map(|r| {
            let r = std::fs::canonicalize(r).ok()?;
            let p = std::fs::canonicalize(file).ok()?;
            p.strip_prefix(&r).ok().map(|x| x.display().to_string())
        })
        .next()
        .unwrap_or_else(|| file.display().to_string())
}

/// For every Python finding, the relevant code from the user's files, for
/// a fix proposal (EROICA: "the relevant code"): the enclosing function of
/// the innermost frame found under `roots`, and the lines around the call
/// to it in the next frame out (where rank-dependent work is usually
/// switched on). Files resolve as for [`attach_source_excerpts`]; paths are
/// given relative to the root they were found under (the path a patch
/// names). Unreadable files are skipped.
pub fn code_contexts(report: &Report, roots: &[PathBuf]) -> Vec<whyslow_model::fix::CodeContext> {
    let mut out = Vec::new();
    for (i, f) in report.findings.iter().enumerate() {
        if f.kind != FunctionKind::Python {
            continue;
        }
        let found: Vec<(PathBuf, u32, &str)> = frames(&f.function)
            .into_iter()
            .rev()
            .filter_map(parse_frame)
            .filter_map(|(path, line, name)| resolve(path, roots).map(|p| (p, line, name)))
            .take(2)
            .collect();
        for (k, (file, line, name)) in found.iter().enumerate() {
            let Some(text) = read_lines(file) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            let Some(recorded) = (*line as usize).checked_sub(1) else {
                continue;
            };
            let idx = moved_def(&lines, recorded, name).unwrap_or(recorded);
            if idx >= lines.len() {
                continue;
            }
            let (from, mut to) = if k == 0 {
                enclosing(&lines, idx)
            } else {
                (
                    idx.saturating_sub(CALLER_CONTEXT),
                    (idx + CALLER_CONTEXT + 1).min(lines.len()),
                )
            };
            while to > from + 1 && lines[to - 1].trim().is_empty() {
                to -= 1;
            }
            let mut body = lines[from..to].join("\n");
            body.push('\n');
            out.push(whyslow_model::fix::CodeContext {
                finding: i,
                path: shown_path(file, roots),
                start_line: from as u32 + 1,
                line: idx as u32 + 1,
                text: body,
            });
        }
    }
    out
}

/// A file a patch names (relative to a source root), read from under one
/// of `roots`; never a path outside them (absolute, or with `..`).
pub fn read_source_file(roots: &[PathBuf], path: &str) -> Option<String> {
    let p = Path::new(path);
    if p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return None;
    }
    roots
        .iter()
        .map(|r| r.join(p))
        .find(|f| f.is_file())
        .and_then(|f| read_lines(&f))
}
