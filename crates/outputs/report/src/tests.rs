//! Tests of the outputs.

use std::path::PathBuf;

use super::*;
use whyslow_ingest::source::attach_source_excerpts;
use whyslow_model::{
    Finding, FunctionKind, Reason, Resource, Stat, UtilizationSource, Verdict, WorkerPoint,
    REPORT_VERSION,
};

fn st(value: f64, peers: f64) -> Stat {
    Stat {
        value,
        peers,
        peer_count: None,
    }
}

fn finding(function: &str, kind: FunctionKind, workers: Vec<u32>, group_workers: usize) -> Finding {
    let points = (0..group_workers as u32)
        .map(|w| WorkerPoint {
            worker: w,
            beta: if workers.contains(&w) { 0.3 } else { 0.01 },
            mu: 0.5,
            sigma: 0.1,
            flagged: workers.contains(&w),
        })
        .collect();
    Finding {
        function: function.into(),
        kind,
        workers,
        reason: Reason::PeerOutlier,
        beta: st(0.312, 0.011),
        mu: st(0.33, 0.99),
        sigma: st(0.05, 0.05),
        resource: Resource::Sm,
        util_source: UtilizationSource::Samples,
        group: None,
        group_workers,
        hosts: vec![],
        critical_us: st(312_000.0, 11_000.0),
        resource_mu: None,
        hint: Some("check <clocks> & power".into()),
        source_excerpt: None,
        points,
        explains: 0.0,
        consequences: Vec::new(),
    }
}

fn report(findings: Vec<Finding>) -> Report {
    let findings_empty = findings.is_empty();
    Report {
        version: REPORT_VERSION,
        workers: 64,
        missing_workers: vec![],
        findings,
        utilization_source: "samples".into(),
        hosts: Some(8),
        warnings: vec![],
        verdict: if findings_empty {
            Verdict::NoAnomaly
        } else {
            Verdict::Anomalies
        },
        not_judged: vec![],
        iterations: None,
        cross_layer: None,
        network: Vec::new(),
        fix: None,
        fix_error: None,
    }
}

#[test]
fn compact_rank_formatting() {
    assert_eq!(compact_ranks(&[], 100), "{}");
    assert_eq!(compact_ranks(&[7], 100), "{7}");
    assert_eq!(compact_ranks(&[0, 1, 2, 3], 100), "{0-3}");
    let mut v: Vec<u32> = (0..16).collect();
    v.push(32);
    assert_eq!(compact_ranks(&v, 100), "{0-15,32}");
    assert_eq!(compact_ranks(&[5, 3, 4, 9, 9, 1], 100), "{1,3-5,9}");
    assert_eq!(
        compact_ranks(&[u32::MAX - 1, u32::MAX], 100),
        "{4294967294-4294967295}"
    );
    let many: Vec<u32> = (0..100).map(|i| i * 2).collect();
    let s = compact_ranks(&many, 20);
    assert!(s.ends_with(",…}") && s.len() < 40, "{s}");
}

#[test]
fn workers_in_words() {
    let f = finding("gemm", FunctionKind::GpuKernel, (0..64).collect(), 64);
    assert!(format::workers_phrase(&f).starts_with("all 64 workers"));
    let f = finding("gemm", FunctionKind::GpuKernel, vec![0, 1, 2, 3], 64);
    assert_eq!(format::workers_phrase(&f), "workers {0-3}");
    let mut f = finding("gemm", FunctionKind::GpuKernel, (0..20).collect(), 64);
    f.hosts = vec!["a".into(), "b".into(), "c".into()];
    assert_eq!(
        format::workers_phrase(&f),
        "workers {0-19} (20 workers on 3 hosts)"
    );
    let f = finding("ring", FunctionKind::Comm, vec![7], 64);
    assert_eq!(format::workers_phrase(&f), "worker 7");
}

#[test]
fn healthy_report_message() {
    let r = report(vec![]);
    let t = render_table(&r, false);
    assert!(t.contains("No anomaly found in 64 workers."), "{t}");
    assert!(t.contains("64 workers analyzed"));
    assert!(t.contains("missing: none"));
    assert!(t.contains("utilization: samples"));
    assert!(render_html(&r).contains("No anomaly found in 64 workers."));
}

#[test]
fn table_rows_like_figure_7() {
    let py = finding(
        "train.py(10): main;/usr/lib/python3.11/socket.py(704): recv_into",
        FunctionKind::Python,
        (0..64).collect(),
        64,
    );
    let mut r = report(vec![
        py,
        finding("gemm", FunctionKind::GpuKernel, vec![0, 1, 2, 3], 64),
    ]);
    r.missing_workers = vec![64, 65, 66, 70];
    let t = render_table(&r, false);
    assert!(!t.contains('\x1b'));
    assert!(t.contains("socket.py(704): recv_into"), "{t}");
    assert!(t.contains("stack: train.py(10): main › socket.py(704): recv_into"));
    assert!(t.contains("on all 64 workers"));
    assert!(t.contains("β 31.2% ↑ +30.1pp vs 1.1%"), "{t}");
    assert!(t.contains("312.0 ms vs 11.0 ms"));
    assert!(t.contains("μ 33.0% SM activity ↓ -66.0pp vs 99.0%"), "{t}");
    assert!(t.contains("differs from peers"));
    assert!(t.contains("hint: check <clocks> & power"));
    assert!(t.contains("missing: 4 {64-66,70}"));
    let c = render_table(&r, true);
    assert!(c.contains("\x1b[1m") && c.contains("\x1b[0m"));
}

#[test]
fn peers_without_the_function_and_the_resource_view() {
    let mut f = finding("aten::sum", FunctionKind::CpuOp, vec![2], 4);
    f.resource = Resource::Cpu;
    f.mu.peer_count = Some(0);
    f.sigma.peer_count = Some(0);
    f.resource_mu = Some(Stat {
        value: 0.24,
        peers: 0.52,
        peer_count: Some(3),
    });
    let r = report(vec![f]);
    let t = render_table(&r, false);
    assert!(
        t.contains("μ 33.0% CPU   σ 5.0%   (not on the peers' critical path)"),
        "{t}"
    );
    assert!(!t.contains("vs 99.0%"), "{t}");
    assert!(
        t.contains("CPU over all critical-path CPU work: 24.0% ↓ -28.0pp vs 52.0%"),
        "{t}"
    );
    let h = render_html(&r);
    assert!(h.contains("CPU over all critical-path CPU work"));
    assert!(!h.contains("vs 99.0%"));
}

#[test]
fn control_characters_are_not_printed() {
    let f = finding("evil\x1b[2Jname", FunctionKind::CpuOp, vec![1], 64);
    let t = render_table(&report(vec![f]), false);
    assert!(!t.contains('\x1b'));
}

#[test]
fn html_escapes_and_is_self_contained() {
    let mut f = finding(
        "void at::native::<lambda>&(float*) \"q\" 'x'",
        FunctionKind::GpuKernel,
        vec![3],
        10,
    );
    f.group = Some("<script>alert(1)</script>".into());
    let mut r = report(vec![f]);
    r.warnings.push("a < b & c".into());
    let h = render_html(&r);
    // Escaped by the template engine (maud), which leaves `'` as it is.
    assert!(h.contains("void at::native::&lt;lambda&gt;&amp;(float*) &quot;q&quot; 'x'"));
    assert!(!h.contains("<script>"));
    assert!(h.contains("&lt;script&gt;"));
    assert!(h.contains("a &lt; b &amp; c"));
    assert!(!h.contains("http://") && !h.contains("https://") && !h.contains(" src="));
    assert_eq!(h.matches("<svg").count(), 3);
    assert!(h.contains(r#"class="bad""#));
    assert!(h.contains(r#"<text x="#));
    assert_eq!(
        html::escape("<a href='x'>&</a>"),
        "&lt;a href=&#39;x&#39;&gt;&amp;&lt;/a&gt;"
    );
}

#[test]
fn html_survives_degenerate_values() {
    let mut f = finding("k", FunctionKind::GpuKernel, vec![0], 1);
    f.points[0].beta = f64::NAN;
    f.mu = st(f64::INFINITY, f64::NAN);
    f.points.push(WorkerPoint {
        worker: 1,
        beta: 0.0,
        mu: 0.0,
        sigma: 0.0,
        flagged: false,
    });
    let h = render_html(&report(vec![f.clone()]));
    assert!(!h.contains("NaN"));
    let _ = render_table(&report(vec![f.clone()]), true);
    let j = render_json(&report(vec![f]));
    assert!(j.contains("null"));
}

#[test]
fn json_has_contract_keys() {
    let r = report(vec![finding(
        "gemm",
        FunctionKind::GpuKernel,
        vec![1, 2],
        64,
    )]);
    let j = render_json(&r);
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    for k in [
        "version",
        "workers",
        "missing_workers",
        "findings",
        "utilization_source",
    ] {
        assert!(v.get(k).is_some(), "missing {k}");
    }
    let f = &v["findings"][0];
    for k in [
        "function",
        "kind",
        "workers",
        "reason",
        "beta",
        "mu",
        "sigma",
        "critical_us",
    ] {
        assert!(f.get(k).is_some(), "missing findings[].{k}");
    }
    for k in ["beta", "mu", "sigma"] {
        assert!(f[k].get("value").is_some() && f[k].get("peers").is_some());
    }
    assert_eq!(f["kind"], "gpu_kernel");
    assert_eq!(f["reason"], "peer_outlier");
    let back: Report = serde_json::from_str(&j).unwrap();
    assert_eq!(back, r);
}

/// EROICA's "the relevant code is here" must survive a checkout newer than
/// the trace: the function's `def` moved down by 4 lines.
#[test]
fn source_excerpt_follows_a_moved_function() {
    let dir = std::env::temp_dir().join(format!("whyslow-report-moved-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut body: String = (1..=13).map(|i| format!("# line {i}\n")).collect();
    body.push_str("def injected_slow_rank_work(ms):\n    pass\n");
    std::fs::write(dir.join("train.py"), body).unwrap();
    let mut r = report(vec![
        finding(
            "train.py(10): injected_slow_rank_work",
            FunctionKind::Python,
            vec![2],
            4,
        ),
        finding(
            "train.py(14): injected_slow_rank_work",
            FunctionKind::Python,
            vec![2],
            4,
        ),
        finding("train.py(3): <module>", FunctionKind::Python, vec![2], 4),
    ]);
    attach_source_excerpts(&mut r, std::slice::from_ref(&dir));
    let moved = r.findings[0].source_excerpt.as_deref().unwrap();
    assert!(
        moved.contains("train.py:14 (the trace says line 10"),
        "{moved}"
    );
    assert!(
        moved.contains("> 14 | def injected_slow_rank_work(ms):"),
        "{moved}"
    );
    let same = r.findings[1].source_excerpt.as_deref().unwrap();
    assert!(
        same.contains("train.py:14\n") && !same.contains("changed"),
        "{same}"
    );
    let module = r.findings[2].source_excerpt.as_deref().unwrap();
    assert!(module.contains("> 3 | # line 3"), "{module}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn source_excerpts_are_attached() {
    let dir = std::env::temp_dir().join(format!("whyslow-report-test-{}", std::process::id()));
    let pkg = dir.join("mypkg");
    std::fs::create_dir_all(&pkg).unwrap();
    let body: String = (1..=20).map(|i| format!("line {i}\n")).collect();
    std::fs::write(pkg.join("loader.py"), body).unwrap();
    let mut r = report(vec![
        finding(
            "train.py(1): main;/opt/conda/site-packages/mypkg/loader.py(10): load;<built-in method recv_into of socket object>",
            FunctionKind::Python,
            vec![1],
            4,
        ),
        finding("mypkg/loader.py(99): nope", FunctionKind::Python, vec![1], 4),
        finding("missing.py(3): x", FunctionKind::Python, vec![1], 4),
        finding("mypkg/loader.py(2): k", FunctionKind::GpuKernel, vec![1], 4),
    ]);
    attach_source_excerpts(&mut r, &[PathBuf::from("/nonexistent"), dir.clone()]);
    let x = r.findings[0].source_excerpt.as_deref().expect("excerpt");
    assert!(x.contains("loader.py:10"), "{x}");
    assert!(x.contains("> 10 | line 10"), "{x}");
    assert!(
        x.contains("   8 | line 8") && x.contains("  12 | line 12"),
        "{x}"
    );
    assert!(!x.contains("line 13"));
    assert!(r.findings[1].source_excerpt.is_none());
    assert!(r.findings[2].source_excerpt.is_none());
    assert!(r.findings[3].source_excerpt.is_none());
    let t = render_table(&r, false);
    assert!(t.contains("the relevant code is here:"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn html_says_not_measured_instead_of_plotting_zero_utilization() {
    let mut f = finding("aten::mm", FunctionKind::CpuOp, vec![3], 10);
    f.util_source = UtilizationSource::None;
    let h = render_html(&report(vec![f]));
    assert_eq!(h.matches("<svg").count(), 1, "only the β CDF");
    assert!(h.contains("utilization not measured: no μ/σ plots"), "{h}");
    assert!(h.contains("What β, μ, σ and the reasons mean"));
    assert!(
        h.contains(r#"<section class="verdict slow" aria-label="verdict"><p class="headline">Rank 3 is slow: aten::mm takes "#),
        "{h}"
    );
}

fn iterations(onset: Option<u64>, workers: u32) -> whyslow_model::IterationTimes {
    use whyslow_model::{IterationSeries, IterationSource, IterationTimes, Onset};
    IterationTimes {
        source: IterationSource::ProfilerSteps,
        series: (0..workers)
            .map(|w| IterationSeries {
                worker: Some(w),
                steps: (132..192).collect(),
                ms: (132..192)
                    .map(|s| if s < 150 { 30.0 } else { 60.0 } + f64::from(w % 3))
                    .collect(),
            })
            .collect(),
        onset: onset.map(|step| Onset {
            step,
            before_ms: 30.0,
            after_ms: 60.0,
        }),
    }
}

#[test]
fn html_plots_iteration_time_and_marks_the_onset() {
    let mut r = report(vec![finding(
        "train.py(41): work",
        FunctionKind::Python,
        vec![2],
        4,
    )]);
    let page = render_html(&r);
    assert!(page.contains("Iteration time"));
    assert!(page.contains("Not recorded"), "no steps: said, not plotted");

    r.iterations = Some(iterations(Some(150), 4));
    let page = render_html(&r);
    assert!(page.contains("Iteration time rose at step 150: 30.0 ms → 60.0 ms (+100%)."));
    assert!(page.contains("onset: step 150"));
    // One line per worker, the flagged one red.
    assert_eq!(page.matches("stroke-opacity=").count(), 4);
    assert!(page.contains(
        r##"stroke="#cf222e" stroke-width="1.5" stroke-opacity="1"><title>worker 2</title>"##
    ));

    // No rise: said in words, no onset line; many workers: the median line.
    r.iterations = Some(iterations(None, 40));
    let page = render_html(&r);
    assert!(page.contains("No rise within these steps"));
    assert!(!page.contains("onset: step"));
    assert!(page.contains("median over the workers"));

    // Degenerate series never break the page.
    let mut it = iterations(None, 2);
    it.series[0].ms = vec![f64::NAN; 60];
    it.series[1].steps.clear();
    it.series[1].ms.clear();
    r.iterations = Some(it);
    let page = render_html(&r);
    assert!(page.ends_with("</html>\n") || page.trim_end().ends_with("</html>"));
}

#[test]
fn perfetto_file_has_the_flagged_spans_and_peers() {
    use whyslow_model::{Execution, RankSource, WorkerMeta, WorkerTrace, UNKNOWN_UTIL};
    let f = finding(
        "a.py(1): main;b.py(7): slow \"work\"",
        FunctionKind::Python,
        vec![2],
        4,
    );
    let r = report(vec![f]);
    let traces: Vec<WorkerTrace> = (0..4u32)
        .map(|rank| {
            let mut t = WorkerTrace::new(WorkerMeta {
                rank,
                host: None,
                group: None,
                rank_source: RankSource::Trace,
                source: format!("rank-{rank}.json"),
                world_size: Some(4),
            });
            let id = t.functions.intern(
                FunctionKind::Python,
                if rank == 2 {
                    "a.py(1): main;b.py(7): slow \"work\""
                } else {
                    "a.py(1): main"
                },
                Resource::Cpu,
            );
            for i in 0..10i64 {
                t.steps.push((i as u64, i * 1_000_000, (i + 1) * 1_000_000));
                t.executions.push(Execution {
                    function: id,
                    start_ns: i * 1_000_000,
                    end_ns: i * 1_000_000 + 500_000,
                    thread: 1,
                    trace_util: UNKNOWN_UTIL,
                });
            }
            t
        })
        .collect();
    let doc: serde_json::Value = serde_json::from_str(&render_perfetto(&r, &traces)).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let spans = |pid: u32, tid: u32| {
        events
            .iter()
            .filter(|e| e["ph"] == "X" && e["pid"] == pid && e["tid"] == tid)
            .count()
    };
    assert_eq!(spans(2, 1), 10, "the flagged worker's spans");
    assert_eq!(spans(0, 1), 0, "peers never ran it");
    assert_eq!(spans(0, 0), 10, "peers' steps are there to compare");
    assert_eq!(spans(3, 0), 0, "two peers are enough");
    let span = events
        .iter()
        .find(|e| e["ph"] == "X" && e["pid"] == 2 && e["tid"] == 1)
        .unwrap();
    assert_eq!(span["name"], "b.py(7): slow \"work\"");
    assert_eq!(span["ts"], 0.0);
    assert_eq!(span["dur"], 500.0);
    let names: Vec<&str> = events
        .iter()
        .filter(|e| e["name"] == "process_name")
        .map(|e| e["args"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "worker 0 (peer)",
            "worker 1 (peer)",
            "worker 2 (flagged in #1)"
        ]
    );
    // No traces, no findings: still a valid file.
    let empty: serde_json::Value =
        serde_json::from_str(&render_perfetto(&report(vec![]), &[])).unwrap();
    assert_eq!(empty["traceEvents"].as_array().unwrap().len(), 0);
}

#[test]
fn hang_html_escapes_what_the_dumps_say_and_folds_long_text() {
    use whyslow_model::hang::{Culprit, HangReason, HangReport, StackFrame, ThreadStack, Waiting};
    let long = format!(
        "Never reached <op>. {}",
        "It waited on a lock & did \"other\" work. ".repeat(6)
    );
    let r = HangReport {
        version: 1,
        hang: true,
        verdict: "hang: rank 1 <script>".into(),
        culprits: vec![Culprit {
            rank: 1,
            group: "0".into(),
            group_desc: "tp<&>".into(),
            group_ranks: vec![0, 1],
            op: "all_reduce</td>".into(),
            seq: 7,
            sizes: vec![vec![192, 192]],
            reason: HangReason::NeverReached,
            detail: long,
            stack: Some(ThreadStack {
                source: "py-spy".into(),
                thread: "main<1>".into(),
                frames: vec![StackFrame {
                    function: "f<T>".into(),
                    file: "a&b.py".into(),
                    line: 3,
                }],
                taken_at_ns: None,
            }),
            waited_by: vec![0],
            last_rank: None,
        }],
        waiting: vec![Waiting {
            rank: 0,
            group: "<g>".into(),
            group_desc: String::new(),
            op: "all_reduce".into(),
            seq: 7,
            waits_for: vec![1],
            waits_for_ranges: vec![],
            waited_s: Some(12.34),
        }],
        stuck_groups: vec![],
        ranks: vec![],
        min_wait_s: 5.0,
        notes: vec!["a < b".into()],
    };
    let body = hang::hang_html_body(&r);
    assert!(
        !body.contains("<script>") && !body.contains("all_reduce</td>"),
        "{body}"
    );
    assert!(body.contains(r#"<section class="verdict hang" aria-label="verdict"><p class="headline">hang: rank 1 &lt;script&gt;</p></section>"#), "{body}");
    assert!(body.contains("<td>group tp&lt;&amp;&gt; (group 0) (ranks {0-1}): all_reduce&lt;/td&gt; #7 on tensor(s) 192×192</td>"), "{body}");
    assert!(body.contains("<td>Never reached &lt;op&gt;.<details><summary>more</summary>It waited on a lock &amp; did &quot;other&quot; work."), "{body}");
    assert!(
        body.contains("<summary>its stack (main&lt;1&gt; thread, py-spy)</summary><pre>f&lt;T&gt; (a&amp;b.py:3)</pre>"),
        "{body}"
    );
    assert!(
        body.contains("<td>&lt;g&gt;</td><td>all_reduce #7</td><td>12.3 s</td><td>{1}</td>"),
        "{body}"
    );
    assert!(
        body.contains("<li>a &lt; b</li>") && body.contains("<svg"),
        "{body}"
    );
    let page = hang::hang_html("hang <t>", &r);
    assert!(page.contains(&body) && page.contains("<h1>hang &lt;t&gt;</h1>"));
}
