//! The speedscope file format (<https://www.speedscope.app/file-format-schema.json>).

use std::collections::HashMap;

use serde::Serialize;
use whyslow_model::stack::{FrameKind, StackProfile};

/// The `$schema` of speedscope files.
pub const SPEEDSCOPE_SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared,
    profiles: Vec<Profile<'a>>,
    name: &'a str,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: &'static str,
}

#[derive(Serialize)]
struct Shared {
    frames: Vec<SFrame>,
}

#[derive(Serialize, PartialEq, Eq, Hash, Clone)]
struct SFrame {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
struct Profile<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// The profile as a speedscope file: one `sampled` profile whose samples
/// are frame indices root first, one per distinct stack, weighted by its
/// count (`unit: "none"`) or, with a usable rate, by its CPU time
/// count × 10⁹/hz rounded (`unit: "nanoseconds"`); `endValue` is the sum
/// of the weights (saturating). Frames are shared by (name, file, line):
/// the name is the symbol, else
/// [`Frame::display`](whyslow_model::stack::Frame::display); the file is
/// the module (the
/// Python file, the ELF path) for Python and native frames. The profile
/// and file are named after the `command` label, else `job`, else
/// `whyslow`. Stacks with no samples are left out.
pub fn to_speedscope_json(profile: &StackProfile) -> String {
    let name = ["command", "job"]
        .iter()
        .find_map(|k| profile.labels.get(*k))
        .map_or("whyslow", String::as_str);
    let per_sample = profile.usable_hz().map(|hz| 1e9 / hz);
    let mut frames: Vec<SFrame> = Vec::new();
    let mut frame_index: HashMap<SFrame, usize> = HashMap::new();
    let mut by_id: HashMap<u32, usize> = HashMap::new();
    let mut samples = Vec::new();
    let mut weights = Vec::new();
    for stack in &profile.stacks {
        if stack.count == 0 {
            continue;
        }
        let mut sample = Vec::with_capacity(stack.frames.len());
        for &id in &stack.frames {
            let i = match by_id.get(&id) {
                Some(&i) => i,
                None => {
                    let f = profile.frame_or_unknown(id);
                    let sf = SFrame {
                        name: f.name.clone().unwrap_or_else(|| f.display()),
                        file: match f.kind {
                            FrameKind::Python | FrameKind::Native => f.module.clone(),
                            _ => None,
                        },
                        line: f.line,
                    };
                    let next = frames.len();
                    let i = *frame_index.entry(sf.clone()).or_insert(next);
                    if i == next {
                        frames.push(sf);
                    }
                    by_id.insert(id, i);
                    i
                }
            };
            sample.push(i);
        }
        samples.push(sample);
        weights.push(match per_sample {
            Some(p) => {
                let w = stack.count as f64 * p;
                if w >= u64::MAX as f64 {
                    u64::MAX
                } else {
                    w.round() as u64
                }
            }
            None => stack.count,
        });
    }
    let end_value = match per_sample {
        Some(_) => weights.iter().fold(0u64, |a, &w| a.saturating_add(w)),
        None => profile.total_saturating(),
    };
    let file = File {
        schema: SPEEDSCOPE_SCHEMA,
        shared: Shared { frames },
        profiles: vec![Profile {
            kind: "sampled",
            name,
            unit: if per_sample.is_some() {
                "nanoseconds"
            } else {
                "none"
            },
            start_value: 0,
            end_value,
            samples,
            weights,
        }],
        name,
        active_profile_index: 0,
        exporter: "whyslow",
    };
    serde_json::to_string(&file).unwrap_or_default()
}
