//! Helpers shared by the integration tests.

use std::path::PathBuf;

/// `../shared/fixtures` (or `$WHYSLOW_FIXTURES`), or `None` with a SKIP message
/// when absent, so tests that need it skip instead of failing.
pub fn fixtures() -> Option<PathBuf> {
    let dir = std::env::var_os("WHYSLOW_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../shared/fixtures")
        });
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "SKIP: fixtures not found at {} (set WHYSLOW_FIXTURES to ../shared/fixtures)",
            dir.display()
        );
        None
    }
}
