//! One brain behind every door (issue 26): the same fingerprints give the
//! same verdict from `whyslow analyze` and from `whyslow server`'s report,
//! and two jobs are refused by both. The server runs in-process (its
//! router over an embedded store), the command line as the binary.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;

mod common;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn whyslow(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .args(args)
        .output()
        .expect("run whyslow");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An in-process server over an embedded store in `dir`, and a token.
fn server(dir: &Path) -> (axum::Router, String) {
    let store = whyslow_server::SqliteStore::open(dir).expect("open the store");
    let token = whyslow_server::Store::create_token(&store, "tenant-a").unwrap();
    let state = Arc::new(whyslow_server::AppState {
        retention_days: 7,
        compact_after_s: 3600,
        store: Box::new(store),
        symbols: None,
        raw: None,
        metrics: Default::default(),
        fix: None,
        tokens: Default::default(),
        identities: Default::default(),
    });
    (whyslow_server::router(state), token)
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    token: &str,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let (status, bytes) = call_raw(app, method, uri, token, body).await;
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

/// The answer's status and body as sent.
async fn call_raw(
    app: &axum::Router,
    method: &str,
    uri: &str,
    token: &str,
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {token}"))
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 24)
        .await
        .unwrap();
    (status, bytes.to_vec())
}

/// (function, workers) of each finding, in order.
fn findings(report: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    report["findings"]
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
}

#[test]
fn the_server_judges_three_of_four_ranks_as_analyze_does() {
    let _dir_guard = whyslow_testkit::temp_dir("demo");
    let dir = _dir_guard.path().to_path_buf();
    let traces = dir.join("traces");
    fs::create_dir_all(&traces).unwrap();
    for r in 0..3 {
        let name = format!("rank-{r}.json.gz");
        fs::copy(
            repo().join("examples/data/slow-rank-cpu-gloo").join(&name),
            traces.join(&name),
        )
        .unwrap();
    }
    let fps = dir.join("fingerprints");
    let (code, stdout, stderr) = whyslow(&[
        "analyze",
        traces.to_str().unwrap(),
        "--format",
        "json",
        "--fingerprints-out",
        fps.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let cli: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(cli["missing_workers"], serde_json::json!([3]), "{stdout}");
    assert!(
        findings(&cli)
            .iter()
            .any(|(_, w)| w == &serde_json::json!([2])),
        "{stdout}"
    );

    let (app, token) = server(&dir.join("store"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for r in 0..3 {
            let body = fs::read(fps.join(format!("rank-{r}.fingerprint.json"))).unwrap();
            let (status, json) = call(
                &app,
                "POST",
                "/api/v1/jobs/demo/sessions/s1/fingerprints",
                &token,
                body,
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{json}");
        }
        let (status, report) = call(
            &app,
            "GET",
            "/api/v1/jobs/demo/sessions/s1/report",
            &token,
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{report}");
        assert_eq!(
            report["missing_workers"],
            serde_json::json!([3]),
            "{report}"
        );
        assert_eq!(report["verdict"], cli["verdict"]);
        assert_eq!(findings(&report), findings(&cli));
        // Issue 46: the steps travel with the fingerprints, so the server
        // has the iteration times (and their onset) the traces gave.
        assert!(
            cli["iterations"]["series"]
                .as_array()
                .is_some_and(|s| s.len() == 3),
            "{stdout}"
        );
        assert_eq!(report["iterations"], cli["iterations"], "{report}");
    });
}

#[test]
fn two_jobs_are_refused_by_the_command_line_and_the_server_alike() {
    let _dir_guard = whyslow_testkit::temp_dir("mixed");
    let dir = _dir_guard.path().to_path_buf();
    let single = common::fixtures().unwrap().join("kineto/single");
    let mut bodies = Vec::new();
    for name in ["a100-rank3of8.json.gz", "mi250-rocm.json.gz"] {
        let out = dir.join(format!("{name}.fingerprint.json"));
        let (code, _, stderr) = whyslow(&[
            "summarize",
            single.join(name).to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(0), "{stderr}");
        bodies.push(fs::read(&out).unwrap());
    }
    let (code, stdout, stderr) = whyslow(&["localize", dir.to_str().unwrap()]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stderr.contains("2 different jobs"), "{stderr}");

    let (app, token) = server(&dir.join("store"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for body in bodies {
            let (status, json) = call(
                &app,
                "POST",
                "/api/v1/jobs/j/sessions/s/fingerprints",
                &token,
                body,
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{json}");
        }
        let (status, json) = call(
            &app,
            "GET",
            "/api/v1/jobs/j/sessions/s/report",
            &token,
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{json}");
        let error = json["error"].as_str().unwrap();
        assert!(
            error.contains("2 different jobs")
                && error.contains("AMD Radeon")
                && error.contains("A100"),
            "{error}"
        );
    });
}

/// Every file of an agent spool, uploaded as the agents do (profiles,
/// collective records, OS readings), batch ids from the host folder and
/// file name.
async fn upload_spool(app: &axum::Router, token: &str, job: &str, spool: &Path) {
    let mut files = Vec::new();
    let mut dirs = vec![spool.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files.sort();
    for (i, f) in files.iter().enumerate() {
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let what = if name.ends_with(".pb.gz") {
            "profiles"
        } else if name.ends_with(".collectives.jsonl") {
            "collectives"
        } else if name.ends_with(".os.jsonl") {
            "os"
        } else {
            continue;
        };
        let body = fs::read(f).unwrap();
        if what != "profiles" && body.iter().all(u8::is_ascii_whitespace) {
            continue; // the agents send no empty batch either
        }
        let uri = format!("/api/v1/jobs/{job}/{what}/b{i}");
        let (status, json) = call(app, "POST", &uri, token, body).await;
        assert_eq!(status, StatusCode::CREATED, "{uri} {}: {json}", f.display());
    }
}

#[test]
fn the_server_diagnoses_a_recorded_spool_as_the_library_does() {
    for case in ["noisy-neighbour", "healthy"] {
        let spool = repo()
            .join("tests/fixtures/diagnose")
            .join(case)
            .join("agent");
        let diagnosis = whyslow_diagnose::diagnose(
            &whyslow_spool::read_spool(&spool).unwrap().evidence,
            &Default::default(),
        )
        .unwrap();
        let changed = diagnosis
            .what_changed(whyslow_diagnose::ProfileKind::Cpu)
            .expect("the spool has rank profiles")
            .title
            .clone();
        let local = diagnosis.report;
        let _dir_guard = whyslow_testkit::temp_dir(&format!("spool-{case}"));
        let dir = _dir_guard.path().to_path_buf();
        let (app, token) = server(&dir.join("store"));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let central = rt.block_on(async {
            upload_spool(&app, &token, "job-a", &spool).await;
            let (status, json) =
                call(&app, "GET", "/api/v1/jobs/job-a/diagnosis", &token, vec![]).await;
            assert_eq!(status, StatusCode::OK, "{json}");
            // A bad period is a 400 that names it.
            let (status, err) = call(
                &app,
                "GET",
                "/api/v1/jobs/job-a/diagnosis?baseline=5..2",
                &token,
                vec![],
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
            let (status, svg) =
                call_raw(&app, "GET", "/api/v1/jobs/job-a/diff.svg", &token, vec![]).await;
            let svg = String::from_utf8(svg).unwrap();
            assert_eq!(status, StatusCode::OK, "{svg}");
            (json, svg)
        });
        let (central, central_svg) = central;
        // What changed: the server's diff.svg is the command line's
        // --diff-svg, titles apart (the server names the job).
        let svg_file = dir.join("diff.svg");
        let (code, _, err) = whyslow(&[
            "diagnose",
            spool.to_str().unwrap(),
            "--diff-svg",
            svg_file.to_str().unwrap(),
        ]);
        assert_eq!(code, Some(0), "{err}");
        let cli_svg = std::fs::read_to_string(&svg_file).unwrap();
        let server_title = format!(
            "job job-a: cpu, {changed} (seconds since its first profile; red: wider now, blue: narrower)"
        );
        assert!(
            central_svg.contains(&server_title),
            "{case}: {server_title}"
        );
        assert_eq!(
            central_svg.replace(&server_title, "TITLE"),
            cli_svg.replace(&changed, "TITLE"),
            "{case}: the two doors drew different pictures"
        );
        let _: whyslow_model::diagnosis::DiagnoseReport = serde_json::from_value(central.clone())
            .expect("the server's diagnosis is a DiagnoseReport");
        // Both through JSON text, as a client reads them (serde_json parses
        // some decimals one ulp off the f64 they were printed from).
        let local: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&local).unwrap()).unwrap();
        assert_eq!(central["stragglers"], local["stragglers"], "{case}");
        assert_eq!(central["layer"], local["layer"], "{case}");
        assert_eq!(central["cpu_diff"], local["cpu_diff"], "{case}");
        assert_eq!(central["offcpu_diff"], local["offcpu_diff"], "{case}");
        assert_eq!(central["os_diff"], local["os_diff"], "{case}");
        assert_eq!(central["network_diff"], local["network_diff"], "{case}");
        assert_eq!(central["regressions"], local["regressions"], "{case}");
        assert_eq!(central["baseline"], local["baseline"], "{case}");
        assert_eq!(central["window"], local["window"], "{case}");
        assert_eq!(
            central["stragglers"].as_array().unwrap().is_empty(),
            case == "healthy"
        );
    }
}

#[test]
fn a_hang_report_reads_the_same_from_the_command_line_and_the_server() {
    // What the online package uploads after a stall: the report of
    // `whyslow hang`, computed by the same library call.
    let dir_in = repo().join("tests/fixtures/hang/sleep");
    let (code, out, err) = whyslow(&["hang", dir_in.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let local: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(local["culprits"][0]["rank"], 2, "{out}");
    let _dir_guard = whyslow_testkit::temp_dir("hang");
    let dir = _dir_guard.path().to_path_buf();
    let (app, token) = server(&dir.join("store"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let uri = "/api/v1/jobs/job-h/hangs/hang-1";
        let (status, json) = call(&app, "POST", uri, &token, out.clone().into_bytes()).await;
        assert_eq!(status, StatusCode::CREATED, "{json}");
        assert_eq!(json["culprits"], serde_json::json!([2]));
        let (status, _) = call(&app, "POST", uri, &token, out.clone().into_bytes()).await;
        assert_eq!(status, StatusCode::OK, "a retry is stored once");
        let (status, json) = call(&app, "GET", "/api/v1/jobs/job-h/hang", &token, vec![]).await;
        assert_eq!(status, StatusCode::OK, "{json}");
        assert_eq!(json, local);
        // Not a hang report: a 400 that says what was expected.
        let (status, json) = call(
            &app,
            "POST",
            "/api/v1/jobs/job-h/hangs/bad",
            &token,
            b"{\"jobs\": []}".to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
        assert!(json.to_string().contains("not a hang report"), "{json}");
        // The job page shows it first, with the waits-for graph.
        let req = Request::builder()
            .uri("/ui/jobs/job-h")
            .header("cookie", format!("whyslow_token={token}"))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let page = axum::body::to_bytes(resp.into_body(), 1 << 24)
            .await
            .unwrap();
        let page = String::from_utf8_lossy(&page);
        assert_eq!(status, StatusCode::OK, "{page}");
        assert!(page.contains("<h2>Hang</h2>"), "{page}");
        assert!(page.contains("stalled_data_loader"), "{page}");
        assert!(page.contains("waits-for graph"), "{page}");
    });
}

/// The shipped demo's four fingerprints, as `analyze --fingerprints-out`
/// writes them under `dir/fingerprints`.
fn demo_fingerprints(dir: &Path) -> PathBuf {
    let fps = dir.join("fingerprints");
    let (code, _, stderr) = whyslow(&[
        "analyze",
        repo()
            .join("examples/data/slow-rank-cpu-gloo")
            .to_str()
            .unwrap(),
        "--format",
        "json",
        "--fingerprints-out",
        fps.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    fps
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The job list says what the scheduler calls each job (issue 30): the
/// name and labels the ranks put in their fingerprints, the run id beside
/// it, in the API and on the UI's list.
#[test]
fn the_job_list_names_jobs_as_their_scheduler_does() {
    let _dir_guard = whyslow_testkit::temp_dir("identity");
    let dir = _dir_guard.path().to_path_buf();
    let fps = demo_fingerprints(&dir);
    let (app, token) = server(&dir.join("store"));
    let rt = runtime();
    rt.block_on(async {
        for r in 0..4 {
            let text = fs::read_to_string(fps.join(format!("rank-{r}.fingerprint.json"))).unwrap();
            let mut fp: serde_json::Value = serde_json::from_str(&text).unwrap();
            let job = fp["job"].as_object_mut().unwrap();
            job.insert("name".into(), "llama-pretrain".into());
            job.insert(
                "labels".into(),
                serde_json::json!({"slurm.job_id": "4242", "slurm.job_name": "llama-pretrain"}),
            );
            let body = serde_json::to_vec(&fp).unwrap();
            let uri = "/api/v1/jobs/slurm-4242/sessions/s1/fingerprints";
            let (status, json) = call(&app, "POST", uri, &token, body).await;
            assert_eq!(status, StatusCode::CREATED, "{json}");
        }
        // A job without an identity (profiles only would be the same).
        let plain = fs::read(fps.join("rank-0.fingerprint.json")).unwrap();
        let uri = "/api/v1/jobs/other/sessions/s1/fingerprints";
        let (status, _) = call(&app, "POST", uri, &token, plain).await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, jobs) = call(&app, "GET", "/api/v1/jobs", &token, vec![]).await;
        assert_eq!(status, StatusCode::OK, "{jobs}");
        let by_job: std::collections::BTreeMap<&str, &serde_json::Value> = jobs
            .as_array()
            .unwrap()
            .iter()
            .map(|j| (j["job"].as_str().unwrap(), j))
            .collect();
        assert_eq!(by_job["slurm-4242"]["name"], "llama-pretrain", "{jobs}");
        assert_eq!(by_job["slurm-4242"]["labels"]["slurm.job_id"], "4242");
        assert!(by_job["other"].get("name").is_none(), "{jobs}");
        // The UI's list: the name first, the run id beside it.
        let req = Request::builder()
            .uri("/ui/")
            .header("cookie", format!("whyslow_token={token}"))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let page = axum::body::to_bytes(resp.into_body(), 1 << 22)
            .await
            .unwrap();
        let page = String::from_utf8_lossy(&page);
        let at_name = page
            .find("<b>llama-pretrain</b>")
            .expect("the name on the list");
        assert!(page[at_name..].contains("slurm-4242") && page.contains("slurm.job_id=4242"));
    });
}

/// The server's per-job gauges (issue 30: alerts where people look): the
/// session's last rank makes the server judge it at once, so
/// `whyslow_job_findings` and `whyslow_job_slowdown_ratio` have the job's
/// series without anyone opening a page; a hang report sets
/// `whyslow_job_hang`; a job with nothing concluded has none.
#[test]
fn what_the_server_concluded_of_each_job_is_on_metrics() {
    let _dir_guard = whyslow_testkit::temp_dir("gauges");
    let dir = _dir_guard.path().to_path_buf();
    let fps = demo_fingerprints(&dir);
    let (app, token) = server(&dir.join("store"));
    let rt = runtime();
    let metrics = |app: axum::Router| async move {
        let req = Request::builder()
            .uri("/metrics")
            .body(Body::empty())
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        let b = axum::body::to_bytes(resp.into_body(), 1 << 22)
            .await
            .unwrap();
        String::from_utf8_lossy(&b).into_owned()
    };
    rt.block_on(async {
        let before = metrics(app.clone()).await;
        assert!(before.contains("# TYPE whyslow_job_hang gauge"), "{before}");
        assert!(!before.contains("whyslow_job_findings{"), "{before}");
        for r in 0..4 {
            let body = fs::read(fps.join(format!("rank-{r}.fingerprint.json"))).unwrap();
            let uri = "/api/v1/jobs/demo/sessions/s1/fingerprints";
            let (status, json) = call(&app, "POST", uri, &token, body).await;
            assert_eq!(status, StatusCode::CREATED, "{json}");
            let now = metrics(app.clone()).await;
            // Judged when the fourth (the world size) arrives, not before.
            assert_eq!(
                now.contains("job=\"demo\""),
                r == 3,
                "after rank {r}: {now}"
            );
        }
        let now = metrics(app.clone()).await;
        let findings = now
            .lines()
            .find(|l| l.starts_with("whyslow_job_findings{") && l.contains("job=\"demo\""))
            .expect("the demo's findings gauge");
        let n: f64 = findings.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(n >= 1.0, "{findings}");
        // A hang report of another job (a recorded hang: rank 2 asleep).
        let (code, body, stderr) = whyslow(&[
            "hang",
            repo().join("tests/fixtures/hang/sleep").to_str().unwrap(),
            "--format",
            "json",
        ]);
        assert_eq!(code, Some(0), "{stderr}");
        let body = body.into_bytes();
        let (status, json) = call(&app, "POST", "/api/v1/jobs/stuck/hangs/b1", &token, body).await;
        assert!(status.is_success(), "{json}");
        let now = metrics(app.clone()).await;
        assert!(
            now.lines().any(|l| l.starts_with("whyslow_job_hang{")
                && l.contains("job=\"stuck\"")
                && l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(1.0)),
            "{now}"
        );
    });
}
