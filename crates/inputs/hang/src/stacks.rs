//! whyslow's own stack files: `stacks-rank<r>.json` (every thread's
//! stack, the rank's process groups) and the older
//! `blocked-rank<r>-<time>.txt`.

use whyslow_model::hang::{GroupInfo, StackFrame, ThreadStack};

/// whyslow's `stacks-rank<r>.json` (written by the online package).
#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct StacksDoc {
    pub(crate) format: String,
    pub(crate) rank: u32,
    #[serde(default)]
    pub(crate) dumped_at_ns: Option<u64>,
    #[serde(default = "python")]
    pub(crate) source: String,
    #[serde(default)]
    pub(crate) threads: Vec<ThreadDoc>,
    #[serde(default)]
    pub(crate) groups: Vec<GroupInfo>,
    #[serde(default)]
    pub(crate) exited: bool,
}

fn python() -> String {
    "python".to_string()
}

#[derive(Debug, Clone, serde::Deserialize)]
pub(crate) struct ThreadDoc {
    pub(crate) thread: String,
    pub(crate) frames: Vec<StackFrame>,
}

/// Reads whyslow's `blocked-rank<r>-<time>.txt`: `--- thread NAME` then
/// Python's `traceback.format_stack` text (outermost first).
pub fn read_blocked_text(text: &str) -> Vec<ThreadStack> {
    let mut out: Vec<ThreadStack> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.strip_prefix("--- thread ") {
            out.push(ThreadStack {
                thread: name.trim().to_string(),
                frames: Vec::new(),
                source: "python".into(),
                taken_at_ns: None,
            });
            continue;
        }
        let l = line.trim_start();
        let Some(rest) = l.strip_prefix("File \"") else {
            continue;
        };
        let Some(cur) = out.last_mut() else { continue };
        // File "path", line N, in func
        let Some((file, rest)) = rest.split_once("\", line ") else {
            continue;
        };
        let (line_no, func) = match rest.split_once(", in ") {
            Some((n, f)) => (n.trim().parse().unwrap_or(0), f.trim().to_string()),
            None => (rest.trim().parse().unwrap_or(0), String::new()),
        };
        cur.frames.push(StackFrame {
            function: func,
            file: file.to_string(),
            line: line_no,
        });
    }
    for t in &mut out {
        t.frames.reverse();
    }
    out
}
