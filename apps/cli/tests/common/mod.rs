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
        whyslow_testkit::skip("no chromium on PATH (apt-get install chromium)");
    }
    found
}

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// `/proc/PID/stat`), as agent registrations carry it.
#[allow(dead_code)]
pub fn start_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat[stat.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .parse()
        .unwrap()
}

/// Whether this test may sample other processes with perf events: root,
/// or a perf_event_paranoid that allows it.
#[allow(dead_code)]
pub fn perf_events_allowed() -> bool {
    let uid_root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(3);
    uid_root || paranoid <= 1
}
