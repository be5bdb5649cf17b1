//! CPU stack profiles (SysOM-AI §3.3–§3.4): what the node agent and
//! `whyslow profile` sample, and what the flame graph, pprof, folded and
//! speedscope outputs render.
//!
//! A [`StackProfile`] holds interned [`Frame`]s and [`StackCount`]s whose
//! frame lists run **root first** (the thread's entry, then its callees, the
//! sampled leaf last), as folded stacks and flame graphs read. A frame is
//! identified by where its code lives — the module's Build-ID and the file
//! offset of the instruction ([`Frame::build_id`], [`Frame::offset`]) — so
//! symbols can be resolved after collection, on another machine (§3.4:
//! deferred symbolization); [`Frame::name`] is filled by symbolization.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which layer a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FrameKind {
    /// Kernel code (address from the kernel's callchain).
    Kernel,
    /// Native user code (ELF module + file offset).
    Native,
    /// A Python function (`function (file:line)`), stitched in place of the
    /// interpreter's evaluation frames.
    Python,
    /// A thread or process label put at the root (not code).
    Label,
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Frame {
    /// Layer.
    pub kind: FrameKind,
    /// Function name once symbolized (`None`: not (yet) resolved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Module: the ELF file's path (native), `[kernel]`, or the Python file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<String>,
    /// The module's GNU Build-ID, lowercase hex (native frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// File offset of the instruction in the module (native), the kernel
    /// address (kernel), or 0.
    #[serde(default)]
    pub offset: u64,
    /// Source line (Python frames; native ones when debug info resolved it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
}

impl Frame {
    /// A label frame (thread name, process) with `name`.
    pub fn label(name: impl Into<String>) -> Self {
        Frame {
            kind: FrameKind::Label,
            name: Some(name.into()),
            module: None,
            build_id: None,
            offset: 0,
            line: None,
        }
    }

    /// What flame graphs and folded stacks show: the name, else
    /// `module+0xoffset` (never a guessed symbol).
    pub fn display(&self) -> String {
        match (&self.name, self.kind) {
            (Some(n), FrameKind::Python) => match (&self.module, self.line) {
                (Some(m), Some(l)) => format!("{n} ({m}:{l})"),
                (Some(m), None) => format!("{n} ({m})"),
                _ => n.clone(),
            },
            (Some(n), _) => n.clone(),
            (None, FrameKind::Kernel) => format!("[kernel]+{:#x}", self.offset),
            (None, _) => {
                let m = self.module.as_deref().unwrap_or("[unknown]");
                let base = m.rsplit('/').next().unwrap_or(m);
                format!("{base}+{:#x}", self.offset)
            }
        }
    }
}

/// How many samples hit one stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StackCount {
    /// Indices into [`StackProfile::frames`], root first.
    pub frames: Vec<u32>,
    /// Samples.
    pub count: u64,
}

/// A stack profile of one target over one period.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StackProfile {
    /// Interned frames.
    pub frames: Vec<Frame>,
    /// Distinct stacks and their counts.
    pub stacks: Vec<StackCount>,
    /// Sampling frequency, Hz.
    pub hz: f64,
    /// Start of the period, Unix ns.
    pub start_unix_ns: u64,
    /// Length of the period, ns.
    pub duration_ns: u64,
    /// Labels: `pid`, `host`, `job`, `rank`, `group`, `command`, …
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// What a frame index outside [`StackProfile::frames`] reads as.
static MISSING_FRAME: Frame = Frame {
    kind: FrameKind::Native,
    name: None,
    module: None,
    build_id: None,
    offset: 0,
    line: None,
};

impl StackProfile {
    /// Total samples.
    pub fn total(&self) -> u64 {
        self.stacks.iter().map(|s| s.count).sum()
    }

    /// Total samples, adding up saturating (unlike [`StackProfile::total`],
    /// which may overflow on hostile counts).
    pub fn total_saturating(&self) -> u64 {
        self.stacks
            .iter()
            .fold(0u64, |acc, s| acc.saturating_add(s.count))
    }

    /// The frame `id`, or an unknown native frame when `id` is out of range
    /// (a hand-built or decoded profile may hold any index).
    pub fn frame_or_unknown(&self, id: u32) -> &Frame {
        self.frames.get(id as usize).unwrap_or(&MISSING_FRAME)
    }

    /// The sampling rate when it is usable (finite and positive).
    pub fn usable_hz(&self) -> Option<f64> {
        (self.hz.is_finite() && self.hz > 0.0).then_some(self.hz)
    }

    /// One profile holding the stacks of `profiles` (frames interned anew,
    /// equal stacks summed): from the earliest start, the longest period,
    /// the last one's rate; no labels.
    pub fn merged<'a>(profiles: impl IntoIterator<Item = &'a StackProfile>) -> StackProfile {
        let mut m = StackProfileMerger::default();
        for p in profiles {
            m.add(p);
        }
        m.finish()
    }
}

/// [`StackProfile::merged`] one profile at a time, so a caller that decodes
/// thousands of profiles holds one of them at once, not all.
#[derive(Debug, Default)]
pub struct StackProfileMerger {
    b: StackProfileBuilder,
    hz: f64,
    start: Option<u64>,
    duration: u64,
    profiles: usize,
}

impl StackProfileMerger {
    /// Adds one profile's stacks.
    pub fn add(&mut self, p: &StackProfile) {
        self.profiles += 1;
        self.hz = p.hz;
        self.start = Some(
            self.start
                .map_or(p.start_unix_ns, |s| s.min(p.start_unix_ns)),
        );
        self.duration = self.duration.max(p.duration_ns);
        // Each of the profile's frames interned once, not once per stack.
        let ids: Vec<u32> = p.frames.iter().map(|f| self.b.frame_ref(f)).collect();
        for s in &p.stacks {
            let frames = s
                .frames
                .iter()
                .filter_map(|&i| ids.get(i as usize).copied())
                .collect();
            self.b.add(frames, s.count);
        }
    }

    /// Adds what another merger gathered (merging in parallel).
    pub fn absorb(&mut self, other: StackProfileMerger) {
        if other.profiles == 0 {
            return;
        }
        let (hz, start, duration, n) = (other.hz, other.start, other.duration, other.profiles);
        self.add(&other.b.finish(hz, start.unwrap_or(0), duration));
        self.profiles += n - 1;
    }

    /// Profiles added.
    pub fn profiles(&self) -> usize {
        self.profiles
    }

    /// The merged profile.
    pub fn finish(self) -> StackProfile {
        self.b
            .finish(self.hz, self.start.unwrap_or(0), self.duration)
    }
}

/// Interns frames and sums stack counts while building a [`StackProfile`].
#[derive(Debug, Default)]
pub struct StackProfileBuilder {
    profile: StackProfile,
    frame_ids: rustc_hash::FxHashMap<Frame, u32>,
    stack_ids: rustc_hash::FxHashMap<Vec<u32>, usize>,
}

impl StackProfileBuilder {
    /// An empty builder.
    pub fn new() -> Self {
        Self::default()
    }

    /// The id of `frame`, interning it on first use.
    pub fn frame(&mut self, frame: Frame) -> u32 {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return id;
        }
        let id = self.profile.frames.len() as u32;
        self.profile.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }

    /// [`Self::frame`] of a borrowed frame: cloned only when new.
    pub fn frame_ref(&mut self, frame: &Frame) -> u32 {
        match self.frame_ids.get(frame) {
            Some(&id) => id,
            None => self.frame(frame.clone()),
        }
    }

    /// Adds `count` samples of the stack `frames` (ids, root first).
    pub fn add(&mut self, frames: Vec<u32>, count: u64) {
        match self.stack_ids.get(&frames) {
            Some(&i) => self.profile.stacks[i].count += count,
            None => {
                self.stack_ids
                    .insert(frames.clone(), self.profile.stacks.len());
                self.profile.stacks.push(StackCount { frames, count });
            }
        }
    }

    /// The profile, with the period and rate given.
    pub fn finish(mut self, hz: f64, start_unix_ns: u64, duration_ns: u64) -> StackProfile {
        self.profile.hz = hz;
        self.profile.start_unix_ns = start_unix_ns;
        self.profile.duration_ns = duration_ns;
        self.profile
    }

    /// Sets a label.
    pub fn label(&mut self, key: &str, value: impl Into<String>) {
        self.profile.labels.insert(key.to_string(), value.into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_interns_frames_and_sums_stacks() {
        let mut b = StackProfileBuilder::new();
        let t = b.frame(Frame::label("main"));
        let k = b.frame(Frame {
            kind: FrameKind::Kernel,
            name: None,
            module: None,
            build_id: None,
            offset: 0xffff_ffff_8100_0000,
            line: None,
        });
        assert_eq!(b.frame(Frame::label("main")), t);
        b.add(vec![t, k], 2);
        b.add(vec![t, k], 3);
        b.add(vec![t], 1);
        let p = b.finish(99.0, 0, 1_000_000_000);
        assert_eq!(p.frames.len(), 2);
        assert_eq!(p.stacks.len(), 2);
        assert_eq!(p.total(), 6);
        assert_eq!(p.frames[1].display(), "[kernel]+0xffffffff81000000");
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<StackProfile>(&json).unwrap(), p);
    }
}
