//! Helpers shared by the integration tests.

use std::path::PathBuf;

/// The repository's real-trace fixtures (`whyslow_testkit::fixtures`);
/// panics when absent.
#[allow(dead_code)]
pub fn fixtures() -> Option<PathBuf> {
    Some(whyslow_testkit::fixtures())
}

/// A Chromium on PATH (Debian's `chromium`), or `None` with a line saying
/// the browser part is skipped; with `WHYSLOW_REQUIRE_BROWSER` set (CI
/// installs one) a missing browser fails the test instead.
#[allow(dead_code)]
pub fn chromium() -> Option<PathBuf> {
    let candidates = ["chromium", "chromium-browser", "google-chrome", "chrome"];
    let found = candidates.iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    });
    if found.is_none() {
        assert!(
            std::env::var_os("WHYSLOW_REQUIRE_BROWSER").is_none(),
            "WHYSLOW_REQUIRE_BROWSER is set but no chromium is on PATH"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install chromium)");
    }
    found
}
