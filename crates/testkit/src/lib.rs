//! Test support shared by whyslow's crates (tests, examples and benchmarks
//! only; nothing shipped depends on it): where the repository's fixtures
//! are, a seeded generator, and synthetic LLMPrism-style flow jobs with
//! their ground truth ([`flows`]).

use std::path::PathBuf;

pub mod flows;

pub use whyslow_model::rng::SplitMix64;

/// The repository's fixtures (`tests/fixtures`, or `$WHYSLOW_FIXTURES`).
/// Panics when absent: a test whose data is missing must fail, not pass.
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("WHYSLOW_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"));
    assert!(
        dir.join("kineto").is_dir(),
        "fixtures not found at {} (they ship in the repository under tests/fixtures)",
        dir.display()
    );
    dir
}

/// A fresh directory for one test, removed when the returned guard drops
/// (also when the test fails); `name` goes into its file name so that a
/// directory left by a killed run says whose it was.
pub fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("whyslow-{name}-"))
        .tempdir()
        .expect("a temporary directory")
}

/// Says that the calling test cannot run here, and why: printed, and
/// appended as `test<TAB>reason` to `$WHYSLOW_SKIP_LOG` when set
/// (`./scripts/test` sets it, then counts and lists the skips in its
/// summary), so a skip is never mistaken for a pass. The caller returns
/// right after. The test's name is its thread's (libtest names each test's
/// thread after it).
pub fn skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    eprintln!("skipped: {test}: {reason}");
    if let Some(path) = std::env::var_os("WHYSLOW_SKIP_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            // One write of the whole line: tests skipping at once in one
            // process (threads) must not interleave their lines.
            let line = format!("{test}\t{}\n", reason.replace(['\n', '\t'], " "));
            let _ = f.write_all(line.as_bytes());
        }
    }
}
