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
