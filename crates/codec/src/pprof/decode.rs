//! Reading pprof: gzip inflated within a bound, the profile checked and
//! read as a [`PprofView`] whose frames borrow its string table, and the
//! [`StackProfile`] built from it.

use std::collections::BTreeMap;
use std::io::Read;

use rustc_hash::FxHashMap;
use whyslow_model::stack::{Frame, FrameKind, StackProfile, StackProfileBuilder};

#[cfg(doc)]
use super::to_pprof;
use super::{proto, wire, PprofError, MAX_PPROF_DECOMPRESSED, THREAD_LABEL};

/// Reads a pprof profile, gzip-compressed (as `to_pprof` writes and most
/// tools do) or raw.
///
/// Frames come back root first. A location's kind: mapped to a file named
/// `[kernel…` → kernel; another mapping → native (module and Build-ID from
/// it); no mapping but a function file name → Python (module = that file);
/// otherwise native. A function name equal to what [`Frame::display`] would
/// show for the unsymbolized frame gives `name = None`. A location with
/// several lines (inlined calls) gives one frame per line, the caller
/// first. Sample labels `thread`, `thread.1`, … become label frames at the
/// root (a label frame that was below the root in the profile given to
/// [`to_pprof`] comes back at the root).
///
/// The count is the value of the sample type named `samples` or of unit
/// `count` (else the default sample type, else the first); `hz` is
/// 10⁹/period when the period is in nanoseconds (else 0); comments of the
/// form `key=value` become labels.
pub fn from_pprof(bytes: &[u8]) -> Result<StackProfile, PprofError> {
    from_pprof_limited(bytes, MAX_PPROF_DECOMPRESSED)
}

/// The protobuf bytes of a pprof profile, gzip-compressed or not, inflated
/// to at most `max_decompressed` bytes.
pub(super) fn inflate(
    bytes: &[u8],
    max_decompressed: u64,
) -> Result<std::borrow::Cow<'_, [u8]>, PprofError> {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return Ok(std::borrow::Cow::Borrowed(bytes));
    }
    // Agents' profiles inflate about threefold: start there, not at zero.
    let mut out = Vec::with_capacity(bytes.len().saturating_mul(4).min(max_decompressed as usize));
    flate2::read::MultiGzDecoder::new(bytes)
        .take(max_decompressed + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > max_decompressed {
        return Err(PprofError::TooLarge {
            limit: max_decompressed,
        });
    }
    Ok(std::borrow::Cow::Owned(out))
}

/// Which of a sample's values is the count: the first type named `samples`
/// or with unit `count`, else the default sample type, else the first.
pub(super) fn count_index<'a>(
    sample_type: &[proto::ValueType],
    default_sample_type: i64,
    s: impl Fn(i64) -> Result<&'a str, PprofError>,
) -> Result<usize, PprofError> {
    for (i, t) in sample_type.iter().enumerate() {
        if s(t.r#type)? == "samples" || s(t.unit)? == "count" {
            return Ok(i);
        }
    }
    let default_type = s(default_sample_type)?;
    if !default_type.is_empty() {
        for (i, t) in sample_type.iter().enumerate() {
            if s(t.r#type)? == default_type {
                return Ok(i);
            }
        }
    }
    Ok(0)
}

/// The count of sample `i`: its value at `count_index`, not negative.
pub(super) fn sample_count(
    values: &[i64],
    i: usize,
    count_index: usize,
) -> Result<u64, PprofError> {
    let value = *values.get(count_index).ok_or(PprofError::MissingValue {
        sample: i,
        index: count_index,
        len: values.len(),
    })?;
    u64::try_from(value).map_err(|_| PprofError::NegativeValue { sample: i, value })
}

/// The string table as text. prost checks `string` fields are UTF-8; the
/// table is decoded as bytes (no copy): checked alike, with prost's error.
pub(super) fn utf8_table<'a>(table: &[&'a [u8]]) -> Result<Vec<&'a str>, PprofError> {
    table
        .iter()
        .map(|t| std::str::from_utf8(t))
        .collect::<Result<Vec<&str>, _>>()
        .map_err(|_| {
            PprofError::Decode(prost::DecodeError::new(
                "invalid string value: data is not UTF-8 encoded",
            ))
        })
}

/// A frame as [`from_pprof_limited`] reads it, its text borrowed from the
/// profile's string table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRef<'a> {
    /// What runs there.
    pub kind: FrameKind,
    /// Symbol or Python function.
    pub name: Option<&'a str>,
    /// Module (native), Python file.
    pub module: Option<&'a str>,
    /// Build-ID (hex).
    pub build_id: Option<&'a str>,
    /// File offset (native), 0 otherwise.
    pub offset: u64,
    /// Line, when known.
    pub line: Option<u32>,
}

impl FrameRef<'_> {
    /// The owned frame.
    pub fn to_frame(&self) -> Frame {
        Frame {
            kind: self.kind,
            name: self.name.map(str::to_string),
            module: self.module.map(str::to_string),
            build_id: self.build_id.map(str::to_string),
            offset: self.offset,
            line: self.line,
        }
    }
}

/// A pprof profile as [`from_pprof_limited`] reads it, checked the same
/// way, without building it: frames borrow the profile's strings and
/// stacks are not merged, so a store that files stacks by their frames
/// (SysOM-AI §3.4's central side) allocates per stack it has not seen, not
/// per frame of every upload.
#[derive(Debug, Clone)]
pub struct PprofView<'a> {
    /// Frames: one per line of each location, then the thread labels.
    pub frames: Vec<FrameRef<'a>>,
    /// Frame indices of all stacks, root first, one after another.
    pub stack_frames: Vec<u32>,
    /// Each pprof sample: (first index into `stack_frames`, frames, count).
    pub stacks: Vec<(u32, u32, u64)>,
    /// Labels from `key=value` comments.
    pub labels: BTreeMap<String, String>,
    /// Samples per second (10⁹/period in ns; 0 otherwise).
    pub hz: f64,
    /// Start of the period, Unix ns.
    pub start_unix_ns: u64,
    /// Length of the period, ns.
    pub duration_ns: u64,
}

impl<'a> PprofView<'a> {
    /// The frames of stack `i` (as indices into `frames`), root first.
    pub fn stack(&self, i: usize) -> &[u32] {
        let (start, len, _) = self.stacks[i];
        &self.stack_frames[start as usize..(start + len) as usize]
    }
}

/// Reads a pprof profile (within `max_decompressed` inflated bytes) as a
/// [`PprofView`] handed to `f`: the same checks and errors as
/// [`from_pprof_limited`].
pub fn visit_pprof_limited<R>(
    bytes: &[u8],
    max_decompressed: u64,
    f: impl FnOnce(&PprofView<'_>) -> R,
) -> Result<R, PprofError> {
    // The string table as slices of the inflated bytes, checked as UTF-8
    // once: an owned String per entry was a large share of a server's
    // ingest into ClickHouse.
    let raw = inflate(bytes, max_decompressed)?;
    let raw_len = raw.len();
    let p = wire::Flat::decode(&raw)?;
    let strings = utf8_table(&p.string_table)?;
    let s = |index: i64| -> Result<&str, PprofError> {
        if index == 0 {
            // Always "" (an empty message has no table at all).
            return Ok("");
        }
        usize::try_from(index)
            .ok()
            .and_then(|i| strings.get(i).copied())
            .ok_or(PprofError::BadString {
                index,
                len: strings.len(),
            })
    };

    let count_index = count_index(&p.sample_type, p.default_sample_type, s)?;

    let (mut frames, location_frames) = location_frames(&p, &s)?;
    let (stack_frames, stacks) =
        sample_stacks(&p, &s, &mut frames, &location_frames, raw_len, count_index)?;
    let mut comments = BTreeMap::new();
    for &c in &p.comment {
        if let Some((k, v)) = s(c)?.split_once('=') {
            comments.insert(k.to_string(), v.to_string());
        }
    }
    let hz = match &p.period_type {
        Some(t) if s(t.unit)? == "nanoseconds" && p.period > 0 => 1e9 / p.period as f64,
        _ => 0.0,
    };
    Ok(f(&PprofView {
        frames,
        stack_frames,
        stacks,
        labels: comments,
        hz,
        start_unix_ns: u64::try_from(p.time_nanos).unwrap_or(0),
        duration_ns: u64::try_from(p.duration_nanos).unwrap_or(0),
    }))
}

/// Location id → its frames: (first, count) in the frame list, root first.
type LocationFrames = FxHashMap<u64, (u32, u32)>;

/// A stack: (first, count) in the stack frame list, and its count.
type StackRange = (u32, u32, u64);

/// Each location's frames (a range of the returned frames, root first):
/// its mapping (kernel, native module or none) and, innermost last, one
/// frame per line of its function (a Python frame when it has a file and
/// no mapping).
fn location_frames<'s>(
    p: &wire::Flat<'_>,
    s: &impl Fn(i64) -> Result<&'s str, PprofError>,
) -> Result<(Vec<FrameRef<'s>>, LocationFrames), PprofError> {
    let mappings: FxHashMap<u64, &proto::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    let functions: FxHashMap<u64, &proto::Function> =
        p.function.iter().map(|f| (f.id, f)).collect();
    let mut frames: Vec<FrameRef<'_>> = Vec::with_capacity(p.location.len() + 8);
    // Location id → its frames (a range of `frames`), root first.
    let mut location_frames: FxHashMap<u64, (u32, u32)> = FxHashMap::default();
    location_frames.reserve(p.location.len());
    for loc in &p.location {
        let mapping = match loc.mapping_id {
            0 => None,
            id => Some(*mappings.get(&id).ok_or(PprofError::UnknownMapping {
                location: loc.id,
                id,
            })?),
        };
        let (kind, module, build_id) = match mapping {
            Some(m) => {
                let file = s(m.filename)?;
                let build = s(m.build_id)?;
                let build = (!build.is_empty()).then_some(build);
                if file.starts_with("[kernel") {
                    (FrameKind::Kernel, None, build)
                } else {
                    (FrameKind::Native, (!file.is_empty()).then_some(file), build)
                }
            }
            None => (FrameKind::Native, None, None),
        };
        let base = FrameRef {
            kind,
            name: None,
            module,
            build_id,
            offset: loc.address,
            line: None,
        };
        let first = frames.len() as u32;
        let lines = p.lines(loc);
        if lines.is_empty() {
            frames.push(base);
        } else {
            for line in lines.iter().rev() {
                let f = functions
                    .get(&line.function_id)
                    .ok_or(PprofError::UnknownFunction {
                        location: loc.id,
                        id: line.function_id,
                    })?;
                let mut frame = base;
                let file = s(f.filename)?;
                if mapping.is_none() && !file.is_empty() {
                    frame.kind = FrameKind::Python;
                    frame.module = Some(file);
                }
                frame.line = u32::try_from(line.line).ok().filter(|&l| l > 0);
                let name = s(f.name)?;
                // A nameless frame's pprof name is its display
                // (`module+0x…`); only such a name needs the comparison.
                let is_display = name.contains("+0x") && name == frame.to_frame().display();
                if !name.is_empty() && !is_display {
                    frame.name = Some(name);
                }
                frames.push(frame);
            }
        }
        location_frames.insert(loc.id, (first, frames.len() as u32 - first));
    }

    Ok((frames, location_frames))
}

/// Each sample's stack as a range of the returned frame ids, root first:
/// its thread labels (as label frames, added to `frames`), then its
/// locations' frames; with its count. Fails past a budget of frames
/// proportional to the profile's size (a small upload cannot expand into
/// unbounded stacks).
fn sample_stacks<'s>(
    p: &wire::Flat<'_>,
    s: &impl Fn(i64) -> Result<&'s str, PprofError>,
    frames: &mut Vec<FrameRef<'s>>,
    location_frames: &LocationFrames,
    raw_len: usize,
    count_index: usize,
) -> Result<(Vec<u32>, Vec<StackRange>), PprofError> {
    let mut thread_labels: FxHashMap<&str, u32> = FxHashMap::default();
    let mut labels: BTreeMap<usize, u32> = BTreeMap::new();
    let mut stack_frames: Vec<u32> = Vec::new();
    let mut stacks = Vec::with_capacity(p.sample.len());
    let frame_budget = raw_len.saturating_mul(8).saturating_add(1 << 20);
    let mut frames_seen = 0usize;
    for (i, sample) in p.sample.iter().enumerate() {
        let count = sample_count(p.values(sample), i, count_index)?;
        labels.clear();
        for l in p.labels(sample) {
            let key = s(l.key)?;
            let n = match key.strip_prefix(THREAD_LABEL) {
                Some("") => 0,
                Some(rest) => match rest.strip_prefix('.').and_then(|n| n.parse().ok()) {
                    Some(n) => n,
                    None => continue,
                },
                None => continue,
            };
            let value = s(l.str)?;
            if !value.is_empty() {
                let id = *thread_labels.entry(value).or_insert_with(|| {
                    frames.push(FrameRef {
                        kind: FrameKind::Label,
                        name: Some(value),
                        module: None,
                        build_id: None,
                        offset: 0,
                        line: None,
                    });
                    frames.len() as u32 - 1
                });
                labels.insert(n, id);
            }
        }
        let start = stack_frames.len() as u32;
        stack_frames.extend(labels.values().copied());
        for id in p.location_ids(sample).iter().rev() {
            let &(first, n) = location_frames
                .get(id)
                .ok_or(PprofError::UnknownLocation { sample: i, id: *id })?;
            frames_seen = frames_seen.saturating_add(n as usize);
            if frames_seen > frame_budget {
                return Err(PprofError::TooManyFrames {
                    limit: frame_budget,
                });
            }
            stack_frames.extend(first..first + n);
        }
        stacks.push((start, stack_frames.len() as u32 - start, count));
    }
    Ok((stack_frames, stacks))
}

/// [`from_pprof`] with another bound on the decompressed size (a service
/// taking profiles from the network keeps it near what agents send).
pub fn from_pprof_limited(bytes: &[u8], max_decompressed: u64) -> Result<StackProfile, PprofError> {
    visit_pprof_limited(bytes, max_decompressed, |v| {
        let mut builder = StackProfileBuilder::new();
        // Equal frames (two locations of one symbol) are one frame.
        let ids: Vec<u32> = v
            .frames
            .iter()
            .map(|f| builder.frame(f.to_frame()))
            .collect();
        let mut stacks: FxHashMap<Vec<u32>, u64> = FxHashMap::default();
        let mut order = Vec::new();
        for (i, &(_, _, count)) in v.stacks.iter().enumerate() {
            let frames: Vec<u32> = v.stack(i).iter().map(|&f| ids[f as usize]).collect();
            match stacks.get_mut(&frames) {
                Some(c) => *c = c.saturating_add(count),
                None => {
                    stacks.insert(frames.clone(), count);
                    order.push(frames);
                }
            }
        }
        for frames in order {
            let count = stacks.get(&frames).copied().unwrap_or(0);
            builder.add(frames, count);
        }
        for (k, val) in &v.labels {
            builder.label(k, val.clone());
        }
        builder.finish(v.hz, v.start_unix_ns, v.duration_ns)
    })
}
