//! Fuzzes the Flight Recorder reader (pickle and JSON dumps from other
//! machines): any bytes give a dump or an error, never a panic, never
//! unbounded memory (the pickle reader refuses expansion bombs), and the
//! hang analysis of what decodes never panics either.
//!
//! `cargo +nightly fuzz run flight_recorder` from the repository root
//! (seed corpus: tests/fixtures/hang/*/fr_trace_rank_*).
#![no_main]

use libfuzzer_sys::fuzz_target;
use whyslow_model::hang::{HangEvidence, RankEvidence};

fuzz_target!(|data: &[u8]| {
    if let Ok(d) = whyslow_hang_inputs::read_dump(data) {
        let ev = HangEvidence {
            ranks: vec![RankEvidence {
                rank: d.rank.unwrap_or(0).min(1 << 16),
                groups: d.groups,
                progress: d.progress,
                collectives: d.collectives,
                dumped_at_ns: Some(u64::MAX / 2),
                ..Default::default()
            }],
            ..Default::default()
        };
        let _ = whyslow_hang::analyze(&ev, &Default::default());
    }
});
