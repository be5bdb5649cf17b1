//! Fuzzes the streamed Kineto reader: any bytes (plain or gzip) must give a
//! trace or an error, never a panic, and errors are one line.
//!
//! `cargo +nightly fuzz run kineto` from the repository root.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    match whyslow_ingest::read_kineto_from_reader(data, "fuzz.json") {
        Ok(t) => {
            for e in &t.executions {
                assert!(e.end_ns >= e.start_ns);
                let _ = t.functions.get(e.function);
            }
        }
        Err(e) => assert_eq!(e.to_string().lines().count(), 1),
    }
});
