//! The HTML report in a real browser: headless Chromium (Debian's
//! `chromium`) loads the page written by `whyslow analyze --html` and must
//! render it without console errors, with the verdict and the plots in the
//! document it built. Without a Chromium this test says so and passes, unless
//! `WHYSLOW_REQUIRE_BROWSER=1` (CI sets it after installing one).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::chromium;

/// (DOM after parsing and layout, browser log).
fn render(browser: &Path, page: &Path) -> (String, String) {
    let profile = page.with_extension("chromium-profile");
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1280,2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let _ = std::fs::remove_dir_all(&profile);
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "chromium failed on {}:\n{log}",
        page.display()
    );
    (String::from_utf8_lossy(&out.stdout).into_owned(), log)
}

/// Console messages the page caused (the browser's own D-Bus and GPU noise
/// in a container is not the page's).
fn console_errors(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| {
            l.contains("CONSOLE") || l.contains("Uncaught") || l.contains("Failed to load resource")
        })
        .collect()
}

fn analyze(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .args(args)
        .output()
        .expect("run whyslow")
}

#[test]
#[ignore = "system test (./scripts/test --all): Chromium renders the report"]
fn report_renders_in_headless_chromium() {
    let Some(browser) = chromium() else { return };
    let dir = std::env::temp_dir().join(format!("whyslow-browser-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let demo =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/data/slow-rank-cpu-gloo");

    // The demo: findings, plots, the iteration time.
    let page = dir.join("demo.html");
    let out = analyze(&[
        "analyze",
        demo.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let source = std::fs::read_to_string(&page).unwrap();
    let (dom, log) = render(&browser, &page);
    assert!(console_errors(&log).is_empty(), "console errors:\n{log}");
    assert!(
        dom.contains("Rank 2 is slow: train.py("),
        "no verdict in the rendered page"
    );
    assert!(dom.contains("injected_slow_rank_work"));
    assert!(dom.contains("Iteration time"), "no iteration-time section");
    // Every inline SVG survived parsing, with marks in it.
    assert_eq!(dom.matches("<svg").count(), source.matches("<svg").count());
    assert!(dom.matches("<svg").count() >= 4);
    assert!(
        dom.matches("<circle").count() >= 8,
        "scatter points missing"
    );
    assert!(dom.contains("<path"), "no lines drawn");

    // A page that could not judge says so, and renders too.
    let empty = dir.join("empty.json");
    std::fs::write(&empty, r#"{"traceEvents": []}"#).unwrap();
    let page = dir.join("empty.html");
    let out = analyze(&[
        "analyze",
        empty.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (dom, log) = render(&browser, &page);
    assert!(console_errors(&log).is_empty(), "console errors:\n{log}");
    assert!(
        dom.contains("Could not judge"),
        "no verdict in the rendered page"
    );

    let _ = std::fs::remove_dir_all(&dir);
}
