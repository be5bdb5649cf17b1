//! Python frames as whyslow's function identities spell them: a stack is
//! `outer;…;inner`, a frame `path/to/file.py(123): name` (PerfTracker §3.2:
//! a Python function is identified by its whole call stack).

/// The frames of a Python stack, outermost first.
pub fn frames(name: &str) -> Vec<&str> {
    name.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// A frame `path/to/file.py(123): name` as (path, line, name).
pub fn parse_frame(frame: &str) -> Option<(&str, u32, &str)> {
    let close = frame.rfind("): ")?;
    let head = &frame[..close];
    let open = head.rfind('(')?;
    let line: u32 = head[open + 1..].trim().parse().ok()?;
    let path = head[..open].trim();
    if path.is_empty() {
        return None;
    }
    Some((path, line, frame[close + 3..].trim()))
}
