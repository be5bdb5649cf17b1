//! pprof (Google's `profile.proto`), gzip-compressed as `go tool pprof`,
//! Pyroscope and Parca read it. The messages are written by hand with the
//! field tags of `profile.proto` (no code generation).

use thiserror::Error;

mod decode;
mod encode;
mod proto;
mod summary;

pub use decode::{from_pprof, from_pprof_limited, visit_pprof_limited, FrameRef, PprofView};
pub use encode::to_pprof;
pub use summary::{pprof_summary_inflated, pprof_summary_limited, PprofSummary};

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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;
    use std::io::Read;
    use whyslow_model::stack::{Frame, FrameKind, StackProfileBuilder};

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
