//! pprof (Google's `profile.proto`), gzip-compressed as `go tool pprof`,
//! Pyroscope and Parca read it. The messages are written by hand with the
//! field tags of `profile.proto` (no code generation).

use std::collections::{BTreeMap, HashMap};
use std::io::Read;

use prost::Message;
use rustc_hash::FxHashMap;
use thiserror::Error;
use whyslow_model::stack::{Frame, FrameKind, StackProfile, StackProfileBuilder};

/// The most bytes [`from_pprof`] inflates a gzip-compressed profile to
/// (256 MiB): a guard against decompression bombs.
pub const MAX_PPROF_DECOMPRESSED: u64 = 256 << 20;

/// The mapping kernel frames are put in (the name perf and pprof use).
const KERNEL_MAPPING: &str = "[kernel.kallsyms]";

/// The sample label key of the root-most label frame; the next ones get
/// `thread.1`, `thread.2`, ….
const THREAD_LABEL: &str = "thread";

/// A pprof profile that could not be read.
#[derive(Debug, Error)]
pub enum PprofError {
    /// The gzip stream is corrupt.
    #[error("pprof: gzip: {0}")]
    Gzip(#[from] std::io::Error),
    /// The gzip stream inflates past [`MAX_PPROF_DECOMPRESSED`].
    #[error("pprof: the profile inflates past {limit} bytes")]
    TooLarge {
        /// The limit, bytes.
        limit: u64,
    },
    /// The bytes are not a `Profile` message.
    #[error("pprof: not a profile.proto Profile: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A string index past the end of the string table.
    #[error("pprof: string index {index} is past the string table ({len} strings)")]
    BadString {
        /// The index.
        index: i64,
        /// The table's length.
        len: usize,
    },
    /// A sample names a location id that is not in the profile.
    #[error("pprof: sample {sample} names location id {id}, which is not in the profile")]
    UnknownLocation {
        /// 0-based sample index.
        sample: usize,
        /// The location id.
        id: u64,
    },
    /// A location names a function id that is not in the profile.
    #[error("pprof: location {location} names function id {id}, which is not in the profile")]
    UnknownFunction {
        /// The location id.
        location: u64,
        /// The function id.
        id: u64,
    },
    /// A location names a mapping id that is not in the profile.
    #[error("pprof: location {location} names mapping id {id}, which is not in the profile")]
    UnknownMapping {
        /// The location id.
        location: u64,
        /// The mapping id.
        id: u64,
    },
    /// A sample has no value at the index of the sample count.
    #[error("pprof: sample {sample} has {len} values, expected at least {}", index + 1)]
    MissingValue {
        /// 0-based sample index.
        sample: usize,
        /// The index of the count among the sample types.
        index: usize,
        /// How many values the sample has.
        len: usize,
    },
    /// The samples reference more frames (location lines, summed over all
    /// samples) than 8 per input byte plus 2^20: a guard against profiles
    /// built to exhaust memory.
    #[error("pprof: the samples reference more than {limit} frames in all")]
    TooManyFrames {
        /// The limit.
        limit: usize,
    },
    /// A sample count below zero.
    #[error("pprof: sample {sample} has a negative count {value}")]
    NegativeValue {
        /// 0-based sample index.
        sample: usize,
        /// The value.
        value: i64,
    },
}

#[path = "pprof_wire.rs"]
mod wire;

/// `profile.proto` messages, tags as in Google's pprof.
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// [`Profile`] with the string table as bytes: what the flat decoder
    /// (`pprof_wire.rs`) is checked against.
    #[cfg(test)]
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ProfileRaw {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        #[prost(bytes = "bytes", repeated, tag = "6")]
        pub string_table: Vec<bytes::Bytes>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The string table under construction (index 0 is `""`).
struct Strings {
    table: Vec<String>,
    index: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Self {
        let mut s = Strings {
            table: Vec::new(),
            index: HashMap::new(),
        };
        s.get("");
        s
    }

    fn get(&mut self, text: &str) -> i64 {
        if let Some(&i) = self.index.get(text) {
            return i;
        }
        let i = self.table.len() as i64;
        self.table.push(text.to_string());
        self.index.insert(text.to_string(), i);
        i
    }
}

/// `v` as `i64`, saturating.
fn sat_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The profile as a gzip-compressed pprof `Profile`.
///
/// - Sample types `samples/count` and `cpu/nanoseconds` (a sample's CPU
///   value is its count × 10⁹/hz); period type `cpu/nanoseconds`, period
///   10⁹/hz. Without a usable rate (`hz` ≤ 0 or not finite) both values are
///   the count, the second type is `cpu/count` and the period is 1 count.
/// - `time_nanos`/`duration_nanos` from the profile; its labels as
///   `key=value` comments.
/// - One `Mapping` per distinct (module, Build-ID) of native frames, with
///   `filename` and `build_id`; kernel frames share the mapping
///   `[kernel.kallsyms]` (one per kernel Build-ID). Mappings span the
///   offsets seen (`memory_start` 0, `file_offset` 0), so a location's
///   address is the file offset to symbolize with (§3.4).
/// - One `Location` per frame, `address` = [`Frame::offset`], with one
///   `Line` (its line number when known) of a `Function` per distinct
///   (name, module): the name is the symbol, else [`Frame::display`]; the
///   function's `filename` is the module (the Python file for Python
///   frames).
/// - Sample `location_id`s run leaf first (pprof's order); label frames
///   ([`FrameKind::Label`]) are not locations but sample labels: `thread`
///   for the root-most, then `thread.1`, `thread.2`, ….
///
/// Stacks with no samples are left out.
pub fn to_pprof(profile: &StackProfile) -> Vec<u8> {
    let mut strings = Strings::new();
    let hz = profile.usable_hz();
    let samples = strings.get("samples");
    let count = strings.get("count");
    let cpu = strings.get("cpu");
    let ns = strings.get("nanoseconds");
    let (cpu_unit, period, per_sample) = match hz {
        Some(hz) => {
            let p = 1e9 / hz;
            (ns, p.round().max(1.0) as i64, Some(p))
        }
        None => (count, 1, None),
    };
    let mut b = PprofTables {
        strings,
        mappings: Vec::new(),
        mapping_ids: HashMap::new(),
        functions: Vec::new(),
        function_ids: HashMap::new(),
        locations: Vec::new(),
        location_ids: HashMap::new(),
    };
    let mut out_samples = Vec::new();
    for stack in &profile.stacks {
        if stack.count == 0 {
            continue;
        }
        let mut label = Vec::new();
        let mut location_id = Vec::new();
        for &fid in &stack.frames {
            let frame = profile.frame_or_unknown(fid);
            if frame.kind == FrameKind::Label {
                let key = match label.len() {
                    0 => THREAD_LABEL.to_string(),
                    n => format!("{THREAD_LABEL}.{n}"),
                };
                label.push(proto::Label {
                    key: b.strings.get(&key),
                    str: b.strings.get(&frame.display()),
                    num: 0,
                    num_unit: 0,
                });
                continue;
            }
            location_id.push(b.location(fid, frame));
        }
        location_id.reverse();
        let c = sat_i64(stack.count);
        let v = match per_sample {
            Some(p) => {
                let v = stack.count as f64 * p;
                if v >= i64::MAX as f64 {
                    i64::MAX
                } else {
                    v.round() as i64
                }
            }
            None => c,
        };
        out_samples.push(proto::Sample {
            location_id,
            value: vec![c, v],
            label,
        });
    }
    let PprofTables {
        mut strings,
        mappings,
        functions,
        locations,
        ..
    } = b;
    let comment = profile
        .labels
        .iter()
        .map(|(k, v)| strings.get(&format!("{k}={v}")))
        .collect();
    let msg = proto::Profile {
        sample_type: vec![
            proto::ValueType {
                r#type: samples,
                unit: count,
            },
            proto::ValueType {
                r#type: cpu,
                unit: cpu_unit,
            },
        ],
        sample: out_samples,
        mapping: mappings,
        location: locations,
        function: functions,
        string_table: strings.table,
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: sat_i64(profile.start_unix_ns),
        duration_nanos: sat_i64(profile.duration_ns),
        period_type: Some(proto::ValueType {
            r#type: cpu,
            unit: cpu_unit,
        }),
        period,
        comment,
        default_sample_type: cpu,
    };
    let raw = msg.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = std::io::Write::write_all(&mut gz, &raw);
    gz.finish().unwrap_or_default()
}

/// The profile's tables as [`to_pprof`] fills them: one mapping per
/// (kernel?, module, Build-ID), one function per (name, module), one
/// location per frame; ids are 1-based as pprof wants.
struct PprofTables<'p> {
    strings: Strings,
    mappings: Vec<proto::Mapping>,
    mapping_ids: HashMap<(bool, Option<&'p str>, Option<&'p str>), u64>,
    functions: Vec<proto::Function>,
    function_ids: HashMap<(String, Option<&'p str>), u64>,
    locations: Vec<proto::Location>,
    location_ids: HashMap<u32, u64>,
}

impl<'p> PprofTables<'p> {
    /// The location of frame `fid`, made on its first use.
    fn location(&mut self, fid: u32, frame: &'p Frame) -> u64 {
        if let Some(&id) = self.location_ids.get(&fid) {
            return id;
        }
        let mapping_id = self.mapping(frame);
        let function_id = self.function(frame);
        let id = self.locations.len() as u64 + 1;
        self.locations.push(proto::Location {
            id,
            mapping_id: mapping_id.unwrap_or(0),
            address: frame.offset,
            line: vec![proto::Line {
                function_id,
                line: frame.line.map_or(0, i64::from),
            }],
            is_folded: false,
        });
        self.location_ids.insert(fid, id);
        id
    }

    /// The mapping of a native or kernel frame (its span grown to cover
    /// the frame's offset); `None` for other frames.
    fn mapping(&mut self, frame: &'p Frame) -> Option<u64> {
        match frame.kind {
            FrameKind::Native if frame.module.is_some() || frame.build_id.is_some() => {
                Some((false, frame.module.as_deref(), frame.build_id.as_deref()))
            }
            FrameKind::Kernel => Some((true, None, frame.build_id.as_deref())),
            _ => None,
        }
        .map(|key| {
            let next = self.mappings.len() as u64 + 1;
            let id = *self.mapping_ids.entry(key).or_insert(next);
            if id == next {
                let (kernel, module, build_id) = key;
                let filename = if kernel {
                    KERNEL_MAPPING
                } else {
                    module.unwrap_or("")
                };
                self.mappings.push(proto::Mapping {
                    id,
                    memory_start: 0,
                    memory_limit: 0,
                    file_offset: 0,
                    filename: self.strings.get(filename),
                    build_id: self.strings.get(build_id.unwrap_or("")),
                    has_functions: true,
                    has_filenames: false,
                    has_line_numbers: false,
                    has_inline_frames: false,
                });
            }
            let m = &mut self.mappings[(id - 1) as usize];
            m.memory_limit = m.memory_limit.max(frame.offset.saturating_add(1));
            m.has_functions &= frame.name.is_some();
            m.has_line_numbers |= frame.line.is_some();
            id
        })
    }

    /// The function of a frame: its symbol, else how it displays, in its
    /// module.
    fn function(&mut self, frame: &'p Frame) -> u64 {
        let name = frame.name.clone().unwrap_or_else(|| frame.display());
        let module = match frame.kind {
            FrameKind::Kernel => None,
            _ => frame.module.as_deref(),
        };
        let next = self.functions.len() as u64 + 1;
        let function_id = *self
            .function_ids
            .entry((name.clone(), module))
            .or_insert(next);
        if function_id == next {
            let n = self.strings.get(&name);
            self.functions.push(proto::Function {
                id: function_id,
                name: n,
                system_name: n,
                filename: self.strings.get(module.unwrap_or("")),
                start_line: 0,
            });
        }
        function_id
    }
}

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
fn inflate(bytes: &[u8], max_decompressed: u64) -> Result<std::borrow::Cow<'_, [u8]>, PprofError> {
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
fn count_index<'a>(
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
fn sample_count(values: &[i64], i: usize, count_index: usize) -> Result<u64, PprofError> {
    let value = *values.get(count_index).ok_or(PprofError::MissingValue {
        sample: i,
        index: count_index,
        len: values.len(),
    })?;
    u64::try_from(value).map_err(|_| PprofError::NegativeValue { sample: i, value })
}

/// What a service needs to file a profile, read without building it: the
/// labels (its `key=value` comments), the total sample count, the number of
/// pprof samples (stacks) and the period's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PprofSummary {
    /// Labels from the profile's comments, as [`from_pprof`] reads them.
    pub labels: BTreeMap<String, String>,
    /// Sum of the sample counts ([`StackProfile::total`] of the profile).
    pub samples: u64,
    /// pprof samples (stacks as written; equal stacks are not merged).
    pub stacks: usize,
    /// Start of the period, Unix ns.
    pub start_unix_ns: u64,
}

/// Checks a pprof profile as [`from_pprof_limited`] does, accepting and
/// rejecting exactly the same bytes with the same errors, and returns its
/// [`PprofSummary`] without building the profile: no frame is interned and
/// no string copied. A server's ingest runs this on every upload (SysOM-AI
/// §3.4: the central side stores what the agents send, and decodes it when a
/// flame graph is asked for); building the profile was two thirds of its
/// CPU per upload.
pub fn pprof_summary_limited(
    bytes: &[u8],
    max_decompressed: u64,
) -> Result<PprofSummary, PprofError> {
    pprof_summary_inflated(bytes, max_decompressed).map(|(s, _)| s)
}

/// [`pprof_summary_limited`], and the profile's protobuf bytes inflated:
/// a service that reads the profile again right away (a store filing its
/// stacks) hands them on and inflates once.
pub fn pprof_summary_inflated(
    bytes: &[u8],
    max_decompressed: u64,
) -> Result<(PprofSummary, bytes::Bytes), PprofError> {
    let raw = inflate_shared(bytes, max_decompressed)?;
    let summary = summarize_flat(&raw)?;
    Ok((summary, raw))
}

/// [`pprof_summary_inflated`] of the inflated bytes.
fn summarize_flat(raw: &[u8]) -> Result<PprofSummary, PprofError> {
    let p = wire::Flat::decode(raw)?;
    let raw_len = raw.len();
    // Once per string, not per reference (that was a sixth of an upload).
    let strings = utf8_table(&p.string_table)?;
    let s = |index: i64| -> Result<&str, PprofError> {
        if index == 0 {
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

    // Ids as from_pprof_limited resolves them: the last of equal ids wins.
    // Fx, not SipHash: the ids are the profile's own small integers, and
    // hashing them was a tenth of the check.
    let mappings: FxHashMap<u64, &proto::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    let functions: FxHashMap<u64, &proto::Function> =
        p.function.iter().map(|f| (f.id, f)).collect();
    // Location id → frames it stands for.
    let mut location_frames: FxHashMap<u64, usize> = FxHashMap::default();
    location_frames.reserve(p.location.len());
    for loc in &p.location {
        if loc.mapping_id != 0 {
            let m = mappings
                .get(&loc.mapping_id)
                .ok_or(PprofError::UnknownMapping {
                    location: loc.id,
                    id: loc.mapping_id,
                })?;
            s(m.filename)?;
            s(m.build_id)?;
        }
        let lines = p.lines(loc);
        for line in lines.iter().rev() {
            let f = functions
                .get(&line.function_id)
                .ok_or(PprofError::UnknownFunction {
                    location: loc.id,
                    id: line.function_id,
                })?;
            s(f.filename)?;
            s(f.name)?;
        }
        location_frames.insert(loc.id, lines.len().max(1));
    }

    let frame_budget = raw_len.saturating_mul(8).saturating_add(1 << 20);
    let (mut frames_seen, mut samples) = (0usize, 0u64);
    for (i, sample) in p.sample.iter().enumerate() {
        let count = sample_count(p.values(sample), i, count_index)?;
        samples = samples.saturating_add(count);
        for l in p.labels(sample) {
            let key = s(l.key)?;
            let thread = match key.strip_prefix(THREAD_LABEL) {
                Some("") => true,
                Some(rest) => rest
                    .strip_prefix('.')
                    .is_some_and(|n| n.parse::<usize>().is_ok()),
                None => false,
            };
            if thread {
                s(l.str)?;
            }
        }
        for id in p.location_ids(sample).iter().rev() {
            let n = location_frames
                .get(id)
                .ok_or(PprofError::UnknownLocation { sample: i, id: *id })?;
            frames_seen = frames_seen.saturating_add(*n);
            if frames_seen > frame_budget {
                return Err(PprofError::TooManyFrames {
                    limit: frame_budget,
                });
            }
        }
    }
    let mut labels = BTreeMap::new();
    for &c in &p.comment {
        if let Some((k, v)) = s(c)?.split_once('=') {
            labels.insert(k.to_string(), v.to_string());
        }
    }
    if let Some(t) = &p.period_type {
        s(t.unit)?;
    }
    Ok(PprofSummary {
        labels,
        samples,
        stacks: p.sample.len(),
        start_unix_ns: u64::try_from(p.time_nanos).unwrap_or(0),
    })
}

/// The profile inflated (within `max_decompressed`) as shared bytes.
fn inflate_shared(bytes: &[u8], max_decompressed: u64) -> Result<bytes::Bytes, PprofError> {
    Ok(match inflate(bytes, max_decompressed)? {
        std::borrow::Cow::Borrowed(b) => bytes::Bytes::copy_from_slice(b),
        std::borrow::Cow::Owned(v) => bytes::Bytes::from(v),
    })
}

/// The string table as text. prost checks `string` fields are UTF-8; the
/// table is decoded as bytes (no copy): checked alike, with prost's error.
fn utf8_table<'a>(table: &[&'a [u8]]) -> Result<Vec<&'a str>, PprofError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> proto::Profile {
        let mut raw = Vec::new();
        flate2::read::GzDecoder::new(bytes)
            .read_to_end(&mut raw)
            .unwrap();
        proto::Profile::decode(&raw[..]).unwrap()
    }

    #[test]
    fn mappings_carry_build_ids_and_locations_run_leaf_first() {
        let mut b = StackProfileBuilder::new();
        let t = b.frame(Frame::label("worker"));
        let native = |name: Option<&str>, module: &str, build: &str, offset| Frame {
            kind: FrameKind::Native,
            name: name.map(str::to_string),
            module: Some(module.to_string()),
            build_id: Some(build.to_string()),
            offset,
            line: None,
        };
        let main = b.frame(native(Some("main"), "/bin/app", "b1", 0x10));
        let f = b.frame(native(None, "/lib/libc.so.6", "c2", 0x20));
        let g = b.frame(native(Some("g"), "/lib/libc.so.6", "c2", 0x30));
        let k = b.frame(Frame {
            kind: FrameKind::Kernel,
            name: Some("schedule".into()),
            module: None,
            build_id: None,
            offset: 0xffff_0000,
            line: None,
        });
        b.add(vec![t, main, f, g, k], 7);
        b.label("job", "llm");
        let p = decode(&to_pprof(&b.finish(100.0, 5, 6)));
        let st = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(st(0), "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (st(t.r#type), st(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let pt = p.period_type.as_ref().unwrap();
        assert_eq!(
            (st(pt.r#type), st(pt.unit), p.period),
            ("cpu", "nanoseconds", 10_000_000)
        );
        assert_eq!((p.time_nanos, p.duration_nanos), (5, 6));
        assert_eq!(st(p.comment[0]), "job=llm");
        let maps: Vec<_> = p
            .mapping
            .iter()
            .map(|m| (m.id, st(m.filename), st(m.build_id)))
            .collect();
        assert_eq!(
            maps,
            [
                (1, "/bin/app", "b1"),
                (2, "/lib/libc.so.6", "c2"),
                (3, KERNEL_MAPPING, "")
            ]
        );
        assert!(p.mapping[0].has_functions && !p.mapping[1].has_functions);
        let s = &p.sample[0];
        assert_eq!(s.value, [7, 70_000_000]);
        assert_eq!(st(s.label[0].key), "thread");
        assert_eq!(st(s.label[0].str), "worker");
        // Leaf first: schedule, g, libc+0x20, main.
        let loc = |id: u64| p.location.iter().find(|l| l.id == id).unwrap();
        let fname = |id: u64| {
            let l = loc(id);
            let f = p
                .function
                .iter()
                .find(|f| f.id == l.line[0].function_id)
                .unwrap();
            st(f.name)
        };
        let names: Vec<_> = s.location_id.iter().map(|&id| fname(id)).collect();
        assert_eq!(names, ["schedule", "g", "libc.so.6+0x20", "main"]);
        let addrs: Vec<_> = s.location_id.iter().map(|&id| loc(id).address).collect();
        assert_eq!(addrs, [0xffff_0000, 0x30, 0x20, 0x10]);
        let maps: Vec<_> = s.location_id.iter().map(|&id| loc(id).mapping_id).collect();
        assert_eq!(maps, [3, 2, 2, 1]);
        // Addresses lie inside their mappings.
        for l in &p.location {
            let m = &p.mapping[(l.mapping_id - 1) as usize];
            assert!(m.memory_start <= l.address && l.address < m.memory_limit);
        }
    }
}
