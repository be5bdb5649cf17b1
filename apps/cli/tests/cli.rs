//! The `whyslow` binary end to end on the example job shipped in the repo
//! (`examples/data/slow-rank-cpu-gloo`: 4 CPU ranks, rank 2 slowed by
//! `injected_slow_rank_work`), including bad inputs mixed into the directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn whyslow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .args(args)
        .output()
        .expect("run whyslow")
}

fn example_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/data/slow-rank-cpu-gloo")
}

fn copy_example(to: &Path) {
    for entry in fs::read_dir(example_dir()).unwrap() {
        let p = entry.unwrap().path();
        fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
    }
}

fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "whyslow failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// The finding for `needle` (a substring of the function), if any.
fn finding<'a>(report: &'a Value, needle: &str) -> Option<&'a Value> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["function"].as_str().unwrap().contains(needle))
}

#[test]
fn analyze_names_the_injected_function_on_the_slow_rank() {
    let report = json(&whyslow(&[
        "analyze",
        example_dir().to_str().unwrap(),
        "--format",
        "json",
    ]));
    assert_eq!(report["workers"], 4);
    assert_eq!(report["missing_workers"], serde_json::json!([]));
    let f = finding(&report, "injected_slow_rank_work").expect("injected function named");
    assert_eq!(f["workers"], serde_json::json!([2]));
    assert_eq!(f["kind"], "python");
    assert!(f["beta"]["value"].as_f64().unwrap() > 0.1);
    assert!(f["beta"]["peers"].as_f64().unwrap() < 0.01);
    // Nothing else singles out rank 2 alone.
    for f in report["findings"].as_array().unwrap() {
        if f["workers"] == serde_json::json!([2]) {
            assert!(f["function"]
                .as_str()
                .unwrap()
                .contains("injected_slow_rank_work"));
        }
    }
}

/// The report shows when the job slowed down: the demo's window starts at
/// step 135 and rank 2's extra work at step 150 (`--fault-at 150`).
#[test]
fn iteration_times_show_the_onset_of_the_fault() {
    let report = json(&whyslow(&[
        "analyze",
        example_dir().to_str().unwrap(),
        "--format",
        "json",
    ]));
    let it = &report["iterations"];
    assert_eq!(it["source"], "profiler_steps");
    assert_eq!(it["series"].as_array().unwrap().len(), 4);
    let onset = &it["onset"];
    let step = onset["step"].as_u64().expect("an onset");
    assert!((149..=152).contains(&step), "onset at step {step}");
    assert!(onset["after_ms"].as_f64().unwrap() > 1.3 * onset["before_ms"].as_f64().unwrap());
}

/// `--perfetto` writes a Chrome trace-event file with the flagged function's
/// spans on the flagged worker and the same tracks on peers.
#[test]
fn perfetto_export_holds_the_flagged_spans() {
    let _dir_guard = whyslow_testkit::temp_dir("perfetto");
    let dir = _dir_guard.path().to_path_buf();
    let trace = dir.join("flagged.json");
    let page = dir.join("report.html");
    let out = whyslow(&[
        "analyze",
        example_dir().to_str().unwrap(),
        "--perfetto",
        trace.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("Perfetto trace"));
    let doc: Value = serde_json::from_slice(&fs::read(&trace).unwrap()).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let spans = |pid: u64, needle: &str| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid)
            .filter(|e| e["name"].as_str().unwrap().contains(needle))
            .count()
    };
    assert!(
        spans(2, "injected_slow_rank_work") >= 30,
        "the slow rank's spans"
    );
    assert_eq!(spans(0, "injected_slow_rank_work"), 0);
    assert!(
        spans(0, "ProfilerStep#") >= 50,
        "a peer's steps, for comparison"
    );
    for e in events.iter().filter(|e| e["ph"] == "X") {
        assert!(e["ts"].as_f64().is_some() && e["dur"].as_f64().unwrap() >= 0.0);
    }
    // The page links to it.
    let html = fs::read_to_string(&page).unwrap();
    assert!(html.contains(r#"href="flagged.json""#));
    let _ = fs::remove_dir_all(&dir);
}

/// `whyslow localize` (JSON) over a testbed run's recorded fingerprints
/// (`tests/fixtures/testbed/RUN`), with the testbed's CPU config.
fn localize_testbed_run(run: &str) -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("tests/fixtures/testbed").join(run);
    assert!(dir.is_dir(), "fixture missing: {}", dir.display());
    json(&whyslow(&[
        "localize",
        dir.to_str().unwrap(),
        "--config",
        root.join("testbed/localize-cpu.toml").to_str().unwrap(),
        "--format",
        "json",
    ]))
}

/// Real testbed runs (tests/fixtures/README.md) of host 1's throttled link:
/// its allreduce must be a finding of its own, on worker 1 alone, low and
/// steady on the NIC. In `slow-link-busy-host` it must not be folded as
/// "waiting for" the CPU-starved worker 3 beside it; in
/// `slow-link-not-flagged` worker 0, upstream of the slow link, is half as
/// steady and hid it from Eq. 11's Δ (found now as far from the typical
/// pattern of the four workers).
#[test]
fn a_slow_link_is_named_on_its_host_alone() {
    for run in ["slow-link-busy-host", "slow-link-not-flagged"] {
        let report = localize_testbed_run(run);
        let link = finding(&report, "gloo:all_reduce")
            .unwrap_or_else(|| panic!("{run}: the slow link is no finding"));
        assert_eq!(link["workers"], serde_json::json!([1]), "{run}");
        let below =
            |k: &str| link[k]["value"].as_f64().unwrap() < link[k]["peers"].as_f64().unwrap();
        assert!(below("mu") && below("sigma"), "{run}: {link}");
        assert!(link["hint"].as_str().unwrap().contains("NIC"), "{run}");
    }
}

/// The ranks' own TCP readings (issue 29), recorded on the testbed: a
/// shaper that drops what overflows its queue is named on its host, not on
/// the ring neighbour that receives its resends out of order; a lossy link
/// without a queue stays `loss`. `tests/fixtures/README.md` gives the runs.
#[test]
fn the_network_reading_names_the_link_not_its_neighbour() {
    for (run, cause, words) in [
        ("slow-link-drops", "slow", "sits behind a slow link"),
        ("slow-link-ingress-drops", "slow", "sits behind a slow link"),
        ("lossy-host", "loss", "loses packets"),
    ] {
        let report = localize_testbed_run(run);
        let network = report["network"].as_array().unwrap();
        assert_eq!(network[0]["host"], "h1", "{run}: {network:?}");
        assert_eq!(network[0]["cause"], cause, "{run}: {network:?}");
        let on_links: Vec<&serde_json::Value> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["hint"].as_str().is_some_and(|h| h.contains("Its host")))
            .collect();
        assert_eq!(on_links.len(), 1, "{run}: {on_links:?}");
        assert_eq!(on_links[0]["workers"], serde_json::json!([1]), "{run}");
        assert!(
            on_links[0]["function"]
                .as_str()
                .unwrap()
                .contains("all_reduce"),
            "{run}"
        );
        let hint = on_links[0]["hint"].as_str().unwrap();
        assert!(hint.contains(words), "{run}: {hint}");
    }
}

#[test]
fn bad_files_are_skipped_with_one_clear_line_each_and_the_rest_is_analyzed() {
    let _dir_guard = whyslow_testkit::temp_dir("bad");
    let dir = _dir_guard.path().to_path_buf();
    copy_example(&dir);
    let good = fs::read(dir.join("rank-0.json.gz")).unwrap();
    fs::write(dir.join("truncated.json.gz"), &good[..good.len() / 2]).unwrap();
    fs::write(dir.join("not-json.json"), b"this is not json\n").unwrap();
    fs::write(dir.join("empty.json"), b"").unwrap();
    fs::write(dir.join("no-events.json"), br#"{"schemaVersion": 1}"#).unwrap();

    let out = whyslow(&["analyze", dir.to_str().unwrap(), "--format", "json"]);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let report = json(&out);
    for bad in ["not-json.json", "empty.json", "no-events.json"] {
        let line = stderr
            .lines()
            .find(|l| l.contains(bad))
            .unwrap_or_else(|| panic!("no warning for {bad}: {stderr}"));
        assert!(line.starts_with("whyslow: warning: skipped"), "{line}");
    }
    // The truncated copy is either skipped or kept as a partial rank-0 duplicate,
    // but never stops the analysis.
    assert!(stderr.contains("truncated.json.gz"), "{stderr}");
    let f = finding(&report, "injected_slow_rank_work").expect("still diagnosed");
    assert_eq!(f["workers"], serde_json::json!([2]));

    let strict = whyslow(&["analyze", dir.to_str().unwrap(), "--strict"]);
    assert_eq!(
        strict.status.code(),
        Some(1),
        "--strict makes a bad file fatal"
    );
    let err = String::from_utf8_lossy(&strict.stderr);
    assert_eq!(
        err.lines()
            .filter(|l| l.starts_with("whyslow: error:"))
            .count(),
        1
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn summarize_then_localize_gives_the_same_answer_as_analyze() {
    let _dir_guard = whyslow_testkit::temp_dir("fp");
    let dir = _dir_guard.path().to_path_buf();
    for r in 0..4 {
        let trace = example_dir().join(format!("rank-{r}.json.gz"));
        let fp = dir.join(format!("rank-{r}.fingerprint.json"));
        let out = whyslow(&[
            "summarize",
            trace.to_str().unwrap(),
            "-o",
            fp.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // PerfTracker §4.2: ~30 KB for ~20 critical functions; whyslow's also
        // lists the functions that ran off the critical path (the same budget per function).
        let size = fs::metadata(&fp).unwrap().len() as usize;
        let parsed: serde_json::Value = serde_json::from_slice(&fs::read(&fp).unwrap()).unwrap();
        let functions = parsed["functions"].as_array().unwrap().len();
        assert!(
            size <= 30 * 1024 * functions.max(20) / 20,
            "fingerprint of rank {r} is {size} bytes for {functions} functions"
        );
    }
    let central = json(&whyslow(&[
        "localize",
        dir.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let whole = json(&whyslow(&[
        "analyze",
        example_dir().to_str().unwrap(),
        "--format",
        "json",
    ]));
    let names = |r: &Value| -> Vec<(String, Value)> {
        r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["function"].as_str().unwrap().to_string(),
                    f["workers"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(names(&central), names(&whole));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn html_report_is_written_and_self_contained() {
    let _dir_guard = whyslow_testkit::temp_dir("html");
    let dir = _dir_guard.path().to_path_buf();
    let html = dir.join("report.html");
    let out = whyslow(&[
        "analyze",
        example_dir().to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
        "--no-color",
    ]);
    assert!(out.status.success());
    let page = fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg") && page.contains("injected_slow_rank_work"));
    assert!(!page.contains("<script src"));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("injected_slow_rank_work"), "{table}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn fail_on_anomaly_and_usage_exit_codes() {
    let out = whyslow(&[
        "analyze",
        example_dir().to_str().unwrap(),
        "--fail-on-anomaly",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let out = whyslow(&["analyze"]);
    assert_eq!(out.status.code(), Some(2));
    let out = whyslow(&["analyze", "/nonexistent/whyslow-input"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/whyslow-input"), "{err}");
}

/// `whyslow sample` on a busy process writes a samples file that `analyze`
/// reads (resource `cpu` of the training thread, PerfTracker §4.2).
#[test]
fn sample_writes_a_readable_samples_file_for_a_busy_process() {
    let mut busy = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("spawn a busy loop");
    let _dir_guard = whyslow_testkit::temp_dir("sample");
    let dir = _dir_guard.path().to_path_buf();
    let file = dir.join("rank-0.samples.csv");
    let out = whyslow(&[
        "sample",
        "--pid",
        &busy.id().to_string(),
        "--rate",
        "500",
        "--duration",
        "1",
        "-o",
        file.to_str().unwrap(),
    ]);
    let _ = busy.kill();
    let _ = busy.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples = whyslow_ingest::read_samples(&file).expect("ingest reads what sample wrote");
    let cpu = &samples.series[&whyslow_model::Resource::Cpu];
    assert!(cpu.values.len() > 200, "{} samples", cpu.values.len());
    let mean = cpu.values.iter().map(|&v| v as f64).sum::<f64>() / cpu.values.len() as f64;
    // A spinning thread on a shared 2-core machine: clearly busy, never above 1.
    assert!(mean > 0.05 && mean <= 1.0, "mean cpu {mean}");
    let _ = fs::remove_dir_all(&dir);
}

/// Recorded on an H100 (scripts/gpu-check, 2026-11-27): 4 ranks on the one
/// GPU (gloo), rank 2 launching 24 extra sorts per iteration; ProfilerSteps
/// 680-689 of the online package's window with its NVML samples
/// (tests/fixtures/README.md).
fn h100_extra_kernel() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/gpu/h100-extra-kernel");
    assert!(dir.is_dir(), "fixture missing: {}", dir.display());
    dir
}

#[test]
fn a_recorded_h100_run_names_the_extra_cuda_kernel_on_its_rank() {
    let report = json(&whyslow(&[
        "analyze",
        h100_extra_kernel().to_str().unwrap(),
        "--format",
        "json",
    ]));
    let findings = report["findings"].as_array().unwrap();
    let sort = findings
        .iter()
        .find(|f| f["function"].as_str().unwrap().contains("DeviceRadixSort"))
        .unwrap_or_else(|| panic!("the sort kernel is no finding: {report}"));
    assert_eq!(sort["kind"], "gpu_kernel");
    assert_eq!(sort["workers"], serde_json::json!([2]));
    // μ from NVML's SM utilization, not from the trace (PerfTracker §4.2).
    assert_eq!(sort["util_source"], "samples");
    let mu = sort["mu"]["value"].as_f64().unwrap();
    assert!(mu > 0.5 && mu <= 1.0, "{sort}");
    // Nothing else on a subset of the ranks.
    for f in findings {
        let n = f["workers"].as_array().unwrap().len();
        assert!(n == 4 || f["workers"] == serde_json::json!([2]), "{f}");
    }
}

#[test]
fn a_fingerprint_keeps_every_kernel_for_the_gpu_diff() {
    // Rank 0's GPU idles: each kernel is far under the floor of the
    // fingerprint's functions, yet the GPU diff needs its times.
    let _dir_guard = whyslow_testkit::temp_dir("h100-kernels");
    let dir = _dir_guard.path().to_path_buf();
    let fp = dir.join("rank-0.fingerprint.json");
    let out = whyslow(&[
        "summarize",
        h100_extra_kernel().join("rank-0.json.gz").to_str().unwrap(),
        "-o",
        fp.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fp: serde_json::Value = serde_json::from_slice(&fs::read(&fp).unwrap()).unwrap();
    let kernels = fp["kernels"].as_array().expect("no kernel table");
    assert!(kernels.len() >= 5, "{}", kernels.len());
    assert!(kernels
        .iter()
        .all(|k| k["calls"].as_u64().unwrap() > 0 && k["total_us"].as_f64().unwrap() > 0.0));
    let in_functions = fp["functions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "gpu_kernel")
        .count();
    assert!(in_functions < kernels.len(), "{in_functions}");
}

/// The shipped demo (issue 47): the headline names the slow rank and its
/// function first, job-wide findings as the job's, and the trace's line of
/// `injected_slow_rank_work` is the line `examples/train.py` has it on (the
/// demo's traces are recorded from the file as shipped; when it changes,
/// record them again: docs/commands/analyze.md, "The demo").
#[test]
fn the_demo_names_rank_2_first_at_the_line_the_shipped_file_has() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let source = fs::read_to_string(repo.join("examples/train.py")).unwrap();
    let line = source
        .lines()
        .position(|l| l.starts_with("def injected_slow_rank_work("))
        .expect("examples/train.py defines injected_slow_rank_work")
        + 1;
    let demo = repo.join("examples/data/slow-rank-cpu-gloo");
    let examples = repo.join("examples");
    let out = whyslow(&[
        "analyze",
        demo.to_str().unwrap(),
        "--source-root",
        examples.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let headline = text
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with("whyslow:"));
    let want = format!("Rank 2 is slow: train.py({line}): injected_slow_rank_work takes ");
    assert!(
        headline.is_some_and(|h| h.starts_with(&want) && h.contains("on all 4 workers (the job itself")),
        "{text}"
    );
    assert!(!text.contains("the file has changed since"), "{text}");
    assert!(text.contains(&format!("train.py:{line}\n")), "{text}");
}

/// Issue 46: the flows page leads with its verdict, dates instead of raw
/// microseconds, the findings before the jobs they were judged from.
#[test]
fn the_flows_page_leads_with_its_findings_in_dates() {
    let dir = whyslow_testkit::temp_dir("flows-page");
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/flows/testbed-slow-uplink-50mbit");
    let page = dir.path().join("flows.html");
    let out = whyslow(&[
        "flows",
        "analyze",
        fixture.join("flows.csv.gz").to_str().unwrap(),
        "--topology",
        fixture.join("topology.json").to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let html = std::fs::read_to_string(&page).unwrap();
    let verdict = html
        .find(r#"<section class="verdict slow" aria-label="verdict">"#)
        .expect("a verdict card");
    let findings = html.find("<h2>Findings</h2>").expect("findings");
    let jobs = html
        .find("<h2>Training jobs found in the flows</h2>")
        .expect("jobs");
    assert!(verdict < findings && findings < jobs, "{html}");
    assert!(html.contains("link leaf0&lt;-&gt;spine"), "{html}");
    assert!(
        html.contains(" UTC</td>"),
        "dates in the findings table: {html}"
    );
}
