//! Helpers shared by the integration tests.

use std::path::PathBuf;

/// The repository's real-trace fixtures (`whyslow_testkit::fixtures`);
/// panics when absent.
pub fn fixtures() -> Option<PathBuf> {
    Some(whyslow_testkit::fixtures())
}
