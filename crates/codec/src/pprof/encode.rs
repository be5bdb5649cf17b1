//! Writing pprof: a [`StackProfile`] as a gzip-compressed `Profile`
//! message, its string, mapping, function and location tables built as the
//! stacks are walked (SysOM-AI §3.3–§3.4: Build-ID + offset frames).

use std::collections::HashMap;

use prost::Message;
use whyslow_model::stack::{Frame, FrameKind, StackProfile};

use super::{proto, KERNEL_MAPPING, THREAD_LABEL};

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
