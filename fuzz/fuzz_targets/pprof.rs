//! Fuzzes the pprof readers a server runs on every upload: any bytes (plain
//! or gzip) must give a profile or an error, never a panic; the ingest check
//! (`pprof_summary_limited`) accepts exactly what the full read accepts, and
//! counts the same samples.
//!
//! `cargo +nightly fuzz run pprof` from the repository root.
#![no_main]

use libfuzzer_sys::fuzz_target;

const LIMIT: u64 = 16 << 20;

fuzz_target!(|data: &[u8]| {
    let full = whyslow_stack_output::from_pprof_limited(data, LIMIT);
    let summary = whyslow_stack_output::pprof_summary_limited(data, LIMIT);
    match (full, summary) {
        (Ok(p), Ok(s)) => assert_eq!(p.total(), s.samples),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        (a, b) => panic!("the check and the read disagree: {:?} / {:?}", a.err(), b.err()),
    }
});
