//! Folded stacks (Brendan Gregg's `stackcollapse` format): one line per
//! distinct stack, `root;caller;…;leaf count`.

use std::collections::{BTreeMap, HashMap};

use thiserror::Error;
use whyslow_model::stack::{Frame, FrameKind, StackProfile, StackProfileBuilder};

/// The suffix perf's folding (`stackcollapse-perf.pl --kernel`) appends to
/// kernel frames, and that `flamegraph.pl` colours by.
const KERNEL_SUFFIX: &str = "_[k]";

/// A folded-stack line that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FoldedError {
    /// The line has no space-separated sample count after the stack.
    #[error("line {line}: expected `frame;frame;… count` (a stack, a space, then a sample count)")]
    MissingCount {
        /// 1-based line number.
        line: usize,
    },
    /// The last field is not a non-negative integer.
    #[error("line {line}: expected a non-negative integer sample count, found `{found}`")]
    BadCount {
        /// 1-based line number.
        line: usize,
        /// The field found instead (cut to 40 characters).
        found: String,
    },
    /// The stack before the count is empty.
    #[error("line {line}: expected at least one frame before the count")]
    EmptyStack {
        /// 1-based line number.
        line: usize,
    },
    /// Two `;` with nothing between them, or a `;` at either end.
    #[error("line {line}: expected a frame name between `;` separators (frame {frame} is empty)")]
    EmptyFrame {
        /// 1-based line number.
        line: usize,
        /// 1-based position of the empty frame, root first.
        frame: usize,
    },
    /// The counts of one stack add up past `u64::MAX`.
    #[error("line {line}: expected the sample counts of one stack to add up to at most 2^64-1")]
    CountOverflow {
        /// 1-based line number.
        line: usize,
    },
}

/// The text of one frame in a folded stack: [`Frame::display`], with `;`
/// replaced by `:` and line breaks by spaces (the separators of the format),
/// an empty or blank name as `[unknown]`, and `_[k]` appended to kernel frames (as
/// perf's folding writes them, so the kind survives [`parse_folded`] and
/// `flamegraph.pl` colours them).
pub(crate) fn folded_frame(frame: &Frame) -> String {
    let mut s = sanitize(&frame.display());
    if frame.kind == FrameKind::Kernel {
        s.push_str(KERNEL_SUFFIX);
    }
    s
}

/// `text` without the folded format's separators.
fn sanitize(text: &str) -> String {
    let s: String = text
        .chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect();
    if s.trim().is_empty() {
        "[unknown]".to_string()
    } else {
        s
    }
}

/// The profile as folded stacks: one line `frame;frame;…;leaf count` per
/// distinct rendered stack, root first, each line ending in `\n`.
///
/// Frames render as [`Frame::display`] with the separators replaced (`;` →
/// `:`, line breaks → space, a blank name → `[unknown]`); kernel frames get
/// perf's `_[k]` suffix. Stacks
/// that render to the same text have their counts summed (saturating);
/// stacks with no samples or no frames are left out. Lines are sorted by
/// their stack text, so equal profiles give equal text.
pub fn to_folded(profile: &StackProfile) -> String {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for stack in &profile.stacks {
        if stack.count == 0 || stack.frames.is_empty() {
            continue;
        }
        let text = stack
            .frames
            .iter()
            .map(|&id| folded_frame(profile.frame_or_unknown(id)))
            .collect::<Vec<_>>()
            .join(";");
        let c = lines.entry(text).or_insert(0);
        *c = c.saturating_add(stack.count);
    }
    let mut out = String::new();
    for (stack, count) in lines {
        out.push_str(&stack);
        out.push(' ');
        out.push_str(&count.to_string());
        out.push('\n');
    }
    out
}

/// Reads folded stacks: [`to_folded`]'s output, or Brendan Gregg's
/// `stackcollapse-*` output.
///
/// Each line is `frame;frame;…;leaf count`, root first; the count is the
/// last space- or tab-separated field and must be a non-negative integer.
/// Empty lines and lines starting with `#` are skipped, trailing
/// whitespace (`\r` included) ignored, and counts of repeated stacks summed.
///
/// Frames become [`FrameKind::Native`] with `name = Some(text)`, except:
/// - `name_[k]` (perf's kernel annotation) → [`FrameKind::Kernel`] `name`;
/// - `[kernel]+0xADDR` (an unsymbolized kernel frame) → kernel, no name,
///   `offset = ADDR`;
/// - `name (file:LINE)` or `name (file.py)` → [`FrameKind::Python`] with
///   `module = file` and `line`;
/// - `module+0xOFF` where `module` is `[unknown]`, or has no `/` and holds
///   a `.` or starts with `[` (`libc.so.6+0x1f00`, `[vdso]+0x9a0`) → an
///   unsymbolized native frame with that module and offset.
///
/// Numbers are taken only as [`Frame::display`] writes them (lowercase hex
/// without leading zeros, decimal lines without leading zeros), so every
/// frame renders back to the same text with [`to_folded`]. The
/// profile has no rate or period (`hz = 0`, times 0).
pub fn parse_folded(text: &str) -> Result<StackProfile, FoldedError> {
    let mut builder = StackProfileBuilder::new();
    let mut frame_ids: HashMap<&str, u32> = HashMap::new();
    let mut stacks: HashMap<Vec<u32>, (usize, u64)> = HashMap::new();
    let mut order: Vec<Vec<u32>> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim_end();
        if trimmed.trim_start().is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some((stack, count)) = trimmed.rsplit_once([' ', '\t']) else {
            return Err(FoldedError::MissingCount { line });
        };
        let count: u64 = count.parse().map_err(|_| FoldedError::BadCount {
            line,
            found: count.chars().take(40).collect(),
        })?;
        if stack.trim().is_empty() {
            return Err(FoldedError::EmptyStack { line });
        }
        let mut ids = Vec::new();
        for (j, name) in stack.split(';').enumerate() {
            if name.is_empty() {
                return Err(FoldedError::EmptyFrame { line, frame: j + 1 });
            }
            let id = match frame_ids.get(name) {
                Some(&id) => id,
                None => {
                    let id = builder.frame(parse_frame(name));
                    frame_ids.insert(name, id);
                    id
                }
            };
            ids.push(id);
        }
        match stacks.get_mut(&ids) {
            Some((_, c)) => {
                *c = c
                    .checked_add(count)
                    .ok_or(FoldedError::CountOverflow { line })?;
            }
            None => {
                stacks.insert(ids.clone(), (order.len(), count));
                order.push(ids);
            }
        }
    }
    for ids in order {
        let count = stacks.get(&ids).map_or(0, |&(_, c)| c);
        builder.add(ids, count);
    }
    Ok(builder.finish(0.0, 0, 0))
}

/// One frame's text → a [`Frame`] (see [`parse_folded`]).
fn parse_frame(text: &str) -> Frame {
    let mut frame = Frame {
        kind: FrameKind::Native,
        name: Some(text.to_string()),
        module: None,
        build_id: None,
        offset: 0,
        line: None,
    };
    if let Some(name) = text.strip_suffix(KERNEL_SUFFIX).filter(|n| !n.is_empty()) {
        frame.kind = FrameKind::Kernel;
        match module_offset(name) {
            Some(("[kernel]", off)) => {
                frame.name = None;
                frame.offset = off;
            }
            _ => frame.name = Some(name.to_string()),
        }
        return frame;
    }
    if let Some((module, off)) = module_offset(text) {
        if module == "[kernel]" {
            frame.kind = FrameKind::Kernel;
            frame.name = None;
            frame.offset = off;
            return frame;
        }
        // Only what `Frame::display` writes for an unsymbolized frame (a
        // base name, no `/`), so the frame renders back to `text`.
        if module == "[unknown]"
            || (!module.contains('/') && (module.contains('.') || module.starts_with('[')))
        {
            frame.name = None;
            frame.module = (module != "[unknown]").then(|| module.to_string());
            frame.offset = off;
            return frame;
        }
    }
    if let Some((name, module, line)) = python(text) {
        frame.kind = FrameKind::Python;
        frame.name = Some(name.to_string());
        frame.module = Some(module.to_string());
        frame.line = line;
    }
    frame
}

/// `module+0xHEX` → (module, offset).
fn module_offset(text: &str) -> Option<(&str, u64)> {
    let (module, hex) = text.rsplit_once("+0x")?;
    if module.is_empty() || hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let offset = u64::from_str_radix(hex, 16).ok()?;
    // Canonical (`{:#x}`) only, so the frame renders back to `text`.
    (format!("{offset:x}") == hex).then_some((module, offset))
}

/// `name (file:LINE)` or `name (file.py)` → (name, file, line).
fn python(text: &str) -> Option<(&str, &str, Option<u32>)> {
    let inner_end = text.strip_suffix(')')?;
    let (name, inner) = inner_end.rsplit_once(" (")?;
    if name.is_empty() || inner.is_empty() {
        return None;
    }
    if let Some((file, line)) = inner.rsplit_once(':') {
        if !file.is_empty() && !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = line.parse::<u32>() {
                if n.to_string() == line {
                    return Some((name, file, Some(n)));
                }
            }
        }
    }
    inner.ends_with(".py").then_some((name, inner, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_parse_by_their_shape() {
        let k = parse_frame("do_syscall_64_[k]");
        assert_eq!(
            (k.kind, k.name.as_deref()),
            (FrameKind::Kernel, Some("do_syscall_64"))
        );
        let k = parse_frame("[kernel]+0xffffffff81000000_[k]");
        assert_eq!(
            (k.kind, &k.name, k.offset),
            (FrameKind::Kernel, &None, 0xffffffff81000000)
        );
        let p = parse_frame("forward (model.py:42)");
        assert_eq!(p.kind, FrameKind::Python);
        assert_eq!(p.module.as_deref(), Some("model.py"));
        assert_eq!(p.line, Some(42));
        let n = parse_frame("libc.so.6+0x1f00");
        assert_eq!(
            (n.name, n.module.as_deref(), n.offset),
            (None, Some("libc.so.6"), 0x1f00)
        );
        let n = parse_frame("operator() (anon)");
        assert_eq!(n.kind, FrameKind::Native);
        assert_eq!(n.name.as_deref(), Some("operator() (anon)"));
        let n = parse_frame("_[k]");
        assert_eq!(n.kind, FrameKind::Native);
        for f in [&k, &p] {
            assert_eq!(parse_frame(&folded_frame(f)), *f);
        }
    }
}
