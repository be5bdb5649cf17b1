//! Helpers shared by the integration tests.

use std::path::PathBuf;

/// The repository's real-trace fixtures (`tests/fixtures`, or `$WHYSLOW_FIXTURES`).
/// Panics when absent: a test whose data is missing must fail, not pass.
pub fn fixtures() -> Option<PathBuf> {
    let dir = std::env::var_os("WHYSLOW_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures"));
    assert!(
        dir.join("kineto").is_dir(),
        "fixtures not found at {} (they ship in the repository under tests/fixtures)",
        dir.display()
    );
    Some(dir)
}
