//! The server's API called in-process (its router over a store, no
//! process, no socket): uploads, retries, flame graphs, the cross-job
//! function query, isolation and refusals — on the embedded store, and on
//! ClickHouse when `WHYSLOW_CLICKHOUSE_URL` names one (the chdb stand-in
//! of tests/python/chdb_http.py, or a server). Issue 31.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use tower::ServiceExt;
use whyslow_model::stack::{Frame, FrameKind, StackProfileBuilder};
use whyslow_server::{AppState, Store};

/// The stores to run on: SQLite always, ClickHouse when given.
fn stores(name: &str) -> Vec<(String, Box<dyn Store>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let mut out: Vec<(String, Box<dyn Store>, Option<tempfile::TempDir>)> = vec![(
        "sqlite".into(),
        Box::new(whyslow_server::SqliteStore::open(dir.path()).unwrap()),
        Some(dir),
    )];
    match std::env::var("WHYSLOW_CLICKHOUSE_URL") {
        Ok(url) => out.push((
            "clickhouse".into(),
            Box::new(
                whyslow_server::ClickHouseStore::open(whyslow_server::ClickHouseConfig {
                    url,
                    database: format!("whyslow_api_{name}_{}", std::process::id()),
                    user: None,
                    password: None,
                    retention_days: 30,
                })
                .unwrap(),
            ),
            None,
        )),
        Err(_) => whyslow_testkit::skip(
            "ClickHouse half: needs WHYSLOW_CLICKHOUSE_URL (tests/python/test_server_clickhouse.py runs it against the chdb stand-in)",
        ),
    }
    out
}

fn app(store: Box<dyn Store>) -> (axum::Router, String, String) {
    let a = store.create_token("tenant-a").unwrap();
    let b = store.create_token("tenant-b").unwrap();
    let state = Arc::new(AppState {
        retention_days: 30,
        compact_after_s: 3600,
        store,
        symbols: None,
        raw: None,
        metrics: Default::default(),
        fix: None,
        tokens: Default::default(),
        identities: Default::default(),
    });
    (whyslow_server::router(state), a, b)
}

async fn call(
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
        .body(Body::from(body))
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 26)
        .await
        .unwrap();
    (status, bytes.to_vec())
}

/// One request with exactly these headers (no token unless one of them
/// carries it).
async fn request(
    app: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &[u8])],
    body: Vec<u8>,
) -> (StatusCode, Vec<u8>) {
    let mut req = Request::builder().method(method).uri(uri);
    for (name, value) in headers {
        req = req.header(*name, axum::http::HeaderValue::from_bytes(value).unwrap());
    }
    let resp = app
        .clone()
        .oneshot(req.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 26)
        .await
        .unwrap();
    (status, bytes.to_vec())
}

fn json(b: &[u8]) -> serde_json::Value {
    serde_json::from_slice(b).unwrap_or(serde_json::Value::Null)
}

/// A CPU profile of one rank starting at `start_s`: `stacks` of native
/// function names (root first) and their samples.
fn profile(start_s: u64, rank: u32, stacks: &[(&[&str], u64)]) -> Vec<u8> {
    let mut b = StackProfileBuilder::new();
    for (names, n) in stacks {
        let mut ids = vec![b.frame(Frame::label("python"))];
        for name in *names {
            ids.push(b.frame(Frame {
                kind: FrameKind::Native,
                name: Some((*name).into()),
                module: Some("/usr/lib/libtorch_cpu.so".into()),
                build_id: None,
                offset: 0x1000,
                line: None,
            }));
        }
        b.add(ids, *n);
    }
    b.label("rank", rank.to_string());
    b.label("host", "node-1");
    whyslow_stack_output::to_pprof(&b.finish(99.0, start_s * 1_000_000_000, 10_000_000_000))
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn profiles_flame_graphs_and_the_cross_job_function_query_answer_alike_on_every_store() {
    let mut answers = Vec::new();
    // One clock for both stores, so their answers compare whole.
    let t0 = now_s() - 1800;
    for (name, store, _dir) in stores("flame") {
        let (app, a, b) = app(store);
        // Job 1 gets slower: its later profiles spend more in `gemm`.
        for i in 0..6u64 {
            let gemm = if i < 3 { 10 } else { 40 };
            let body = profile(
                t0 + i * 60,
                (i % 2) as u32,
                &[
                    (&["train", "forward", "gemm"], gemm),
                    (&["train", "allreduce"], 20),
                ],
            );
            let (code, out) = call(
                &app,
                "POST",
                &format!("/api/v1/jobs/job-1/profiles/p{i}"),
                &a,
                body.clone(),
            )
            .await;
            assert_eq!(
                code,
                StatusCode::CREATED,
                "{name}: {}",
                String::from_utf8_lossy(&out)
            );
            // A retry is answered, not stored twice.
            let (code, out) = call(
                &app,
                "POST",
                &format!("/api/v1/jobs/job-1/profiles/p{i}"),
                &a,
                body,
            )
            .await;
            assert_eq!(code, StatusCode::OK, "{name}");
            assert_eq!(json(&out)["stored"], false, "{name}");
        }
        let body = profile(t0 + 30, 0, &[(&["train", "dataloader"], 30)]);
        assert_eq!(
            call(&app, "POST", "/api/v1/jobs/job-2/profiles/q0", &a, body)
                .await
                .0,
            StatusCode::CREATED
        );

        // Flame graph: the latest profiles merged by the store.
        let (code, svg) = call(
            &app,
            "GET",
            "/api/v1/jobs/job-1/flamegraph.svg?limit=3",
            &a,
            vec![],
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{name}");
        let svg = String::from_utf8(svg).unwrap();
        assert!(
            svg.contains("<svg") && svg.contains("gemm") && svg.contains("latest 3 profiles"),
            "{name}"
        );
        // Differential: the diagnosis's window against its baseline.
        let (code, diff) = call(&app, "GET", "/api/v1/jobs/job-1/diff.svg", &a, vec![]).await;
        assert_eq!(
            code,
            StatusCode::OK,
            "{name}: {}",
            String::from_utf8_lossy(&diff)
        );
        // Tenant b sees none of it.
        assert_eq!(
            call(&app, "GET", "/api/v1/jobs/job-1/flamegraph.svg", &b, vec![])
                .await
                .0,
            StatusCode::NOT_FOUND
        );

        // The cross-job query: the last 10 minutes against the 10 before.
        let (from, to) = (t0 + 180, t0 + 360);
        let uri = format!(
            "/api/v1/functions?from={from}&to={to}&base_from={}&base_to={from}",
            t0 - 60
        );
        let (code, out) = call(&app, "GET", &uri, &a, vec![]).await;
        assert_eq!(
            code,
            StatusCode::OK,
            "{name}: {}",
            String::from_utf8_lossy(&out)
        );
        let t = json(&out);
        assert_eq!(t["samples"], 180, "{name}: {t}");
        assert_eq!(t["profiles"], 3, "{name}: {t}");
        assert_eq!(t["base_samples"], 120, "{name}: {t}");
        let top = &t["functions"][0];
        assert_eq!(top["function"], "gemm", "{name}: {t}");
        assert_eq!(top["self_samples"], 120, "{name}: {t}");
        let change = top["self_share_change"].as_f64().unwrap();
        assert!(
            (change - (120.0 / 180.0 - 30.0 / 120.0)).abs() < 1e-9,
            "{name}: {t}"
        );
        // Only job-2, no baseline.
        let uri = format!(
            "/api/v1/functions?jobs=job-2&from={}&to={to}&baseline=none",
            t0 - 60
        );
        let t = json(&call(&app, "GET", &uri, &a, vec![]).await.1);
        assert_eq!(t["samples"], 30, "{name}: {t}");
        assert_eq!(t["functions"][0]["function"], "dataloader", "{name}: {t}");
        assert!(t.get("base_samples").is_none(), "{name}: {t}");
        // Isolation and refusals.
        let t = json(
            &call(
                &app,
                "GET",
                &format!("/api/v1/functions?from={}&to={to}", t0 - 60),
                &b,
                vec![],
            )
            .await
            .1,
        );
        assert_eq!(t["samples"], 0, "{name}: {t}");
        for bad in [
            "kind=gpu",
            "from=10&to=5",
            "jobs=../x",
            "limit=0",
            "baseline=yes",
            "from=-1",
            "base_from=-1",
            "to=-5",
            "base_from=10&base_to=10",
        ] {
            let (code, out) =
                call(&app, "GET", &format!("/api/v1/functions?{bad}"), &a, vec![]).await;
            assert_eq!(code, StatusCode::BAD_REQUEST, "{name} {bad}");
            assert!(
                json(&out)["error"].as_str().is_some_and(|e| !e.is_empty()),
                "{name} {bad}"
            );
        }
        assert_eq!(
            call(&app, "GET", "/api/v1/functions", "wsk_nope", vec![])
                .await
                .0,
            StatusCode::UNAUTHORIZED
        );
        // The web UI's jobs page shows the same cross-job view (the last
        // hour against the one before: these profiles are 30 minutes old).
        let req = Request::builder()
            .uri("/ui/")
            .header("cookie", format!("whyslow_token={a}"))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        let html = axum::body::to_bytes(resp.into_body(), 1 << 24)
            .await
            .unwrap();
        let html = String::from_utf8_lossy(&html);
        assert!(
            html.contains("Functions across your jobs") && html.contains("<code>gemm</code>"),
            "{name}: {html}"
        );
        answers.push(json(
            &call(
                &app,
                "GET",
                &format!(
                    "/api/v1/functions?from={from}&to={to}&base_from={}&base_to={from}",
                    t0 - 60
                ),
                &a,
                vec![],
            )
            .await
            .1,
        ));
    }
    // Both stores give the same answer.
    if answers.len() == 2 {
        assert_eq!(answers[0], answers[1]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_batches_are_stored_once_and_bad_uploads_are_refused_with_the_reason() {
    for (name, store, _dir) in stores("batches") {
        let (app, a, b) = app(store);
        let (code, _) = call(
            &app,
            "POST",
            "/api/v1/jobs/j/profiles/x",
            &a,
            b"not a profile".to_vec(),
        )
        .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{name}");
        let (code, out) = call(
            &app,
            "POST",
            "/api/v1/jobs/..%2Fx/profiles/x",
            &a,
            profile(1, 0, &[(&["f"], 1)]),
        )
        .await;
        assert_eq!(
            code,
            StatusCode::BAD_REQUEST,
            "{name}: {}",
            String::from_utf8_lossy(&out)
        );
        let (code, _) = call(&app, "POST", "/api/v1/jobs/j/profiles/x", &a, vec![]).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{name}");
        // OS readings: JSON lines; stored once; per tenant.
        let line = br#"{"t_unix_ns":1,"host":"n1","signal":"cpu_busy","value":0.5}"#.to_vec();
        let first = call(&app, "POST", "/api/v1/jobs/j/os/o1", &a, line.clone()).await;
        if first.0 == StatusCode::CREATED {
            assert_eq!(
                call(&app, "POST", "/api/v1/jobs/j/os/o1", &a, line).await.0,
                StatusCode::OK,
                "{name}"
            );
        } else {
            assert_eq!(
                first.0,
                StatusCode::BAD_REQUEST,
                "{name}: {}",
                String::from_utf8_lossy(&first.1)
            );
        }
        // The web UI's pages check names as the API does, answering a page
        // that says which name and why (before asking anyone to sign in).
        for uri in [
            "/ui/jobs/..%2Fx",
            "/ui/jobs/.hidden/diagnosis.html",
            "/ui/jobs/j/sessions/s%2F1",
            "/ui/jobs/j%20k/diff.svg?kind=cpu",
        ] {
            let (code, page) = request(&app, "GET", uri, &[], vec![]).await;
            let page = String::from_utf8_lossy(&page);
            assert_eq!(code, StatusCode::NOT_FOUND, "{name} {uri}: {page}");
            assert!(page.contains("No such page: "), "{name} {uri}: {page}");
            assert!(
                page.contains("<!DOCTYPE html>") || page.contains("<!doctype html>"),
                "{page}"
            );
        }
        let (code, _) = request(&app, "GET", "/ui/jobs/j", &[], vec![]).await;
        assert!(
            code.is_redirection(),
            "{name}: a good name asks to sign in: {code}"
        );
        assert_eq!(
            call(&app, "GET", "/api/v1/jobs/j/hang", &b, vec![]).await.0,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            call(&app, "GET", "/api/v1/jobs/j/flows", &a, vec![])
                .await
                .0,
            StatusCode::NOT_FOUND
        );
    }
}

/// Many agents at once, each batch sent twice at the same time (a retry
/// racing the first try): every batch is stored once and answered once as
/// stored — through the embedded store's transactions and ClickHouse's
/// group commits alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_uploads_and_racing_retries_are_stored_exactly_once() {
    for (name, store, _dir) in stores("racing") {
        let (app, a, _) = app(store);
        let t0 = now_s() - 600;
        let mut tasks = Vec::new();
        for i in 0..40u64 {
            let body = profile(t0 + i, (i % 8) as u32, &[(&["train", "step"], 1 + i % 5)]);
            for _ in 0..2 {
                let (app, a, body) = (app.clone(), a.clone(), body.clone());
                tasks.push(tokio::spawn(async move {
                    call(
                        &app,
                        "POST",
                        &format!("/api/v1/jobs/job-r/profiles/r{i}"),
                        &a,
                        body,
                    )
                    .await
                    .0
                }));
            }
        }
        let mut created = 0;
        for t in tasks {
            match t.await.unwrap() {
                StatusCode::CREATED => created += 1,
                StatusCode::OK => {}
                other => panic!("{name}: {other}"),
            }
        }
        assert_eq!(created, 40, "{name}");
        let uri = format!(
            "/api/v1/functions?jobs=job-r&from={}&to={}&baseline=none",
            t0 - 1,
            t0 + 60
        );
        let t = json(&call(&app, "GET", &uri, &a, vec![]).await.1);
        let want: u64 = (0..40u64).map(|i| 1 + i % 5).sum();
        assert_eq!(t["samples"], want, "{name}: {t}");
        assert_eq!(t["profiles"], 40, "{name}: {t}");
    }
}

/// The OpenAPI description is served and matches the router: every route
/// it documents answers (401 without a token where it asks for one, not
/// the "no such route" 404), and a route that asks for a token documents
/// its 401. (Moved in-process from `apps/cli/tests/server.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_description_matches_the_routes() {
    for (name, store, _dir) in stores("openapi") {
        let (app, _, _) = app(store);
        let (st, body) = request(&app, "GET", "/api/v1/openapi.json", &[], vec![]).await;
        assert_eq!(st, StatusCode::OK, "{name}");
        let spec = json(&body);
        assert_eq!(spec["openapi"], "3.0.3");
        let paths = spec["paths"].as_object().unwrap();
        assert!(paths.len() >= 8, "{}", paths.len());
        for (path, ops) in paths {
            let mut concrete = path
                .replace("{job}", "job-1")
                .replace("{session}", "s1")
                .replace("{batch}", "b1")
                .replace("{build_id}", "abcd")
                .replace("{part}", "0");
            if path.ends_with("{part}") {
                concrete.push_str("?of=1");
            }
            for (method, op) in ops.as_object().unwrap() {
                let public = op
                    .get("security")
                    .is_some_and(|s| s.as_array().is_some_and(|a| a.is_empty()));
                let (st, body) =
                    request(&app, &method.to_uppercase(), &concrete, &[], b"{}".to_vec()).await;
                let body = String::from_utf8_lossy(&body);
                if public {
                    assert_eq!(st, StatusCode::OK, "{name}: {method} {path}: {body}");
                } else {
                    assert_eq!(
                        st,
                        StatusCode::UNAUTHORIZED,
                        "{name}: {method} {path} without a token: {body}"
                    );
                    assert!(
                        op["responses"].get("401").is_some(),
                        "{method} {path} does not document 401"
                    );
                }
            }
        }
    }
}

/// Random and hostile requests (odd path segments, bad tokens and cookies,
/// truncated and corrupted uploads, a gzip bomb) get answers below 500 and
/// leave the server serving, on every store. (Moved in-process from
/// `apps/cli/tests/server.rs`; the HTTP framing itself is hyper's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_and_hostile_requests_never_break_the_server() {
    use std::io::Write as _;
    use whyslow_model::rng::SplitMix64;
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/testbed");
    let fp = std::fs::read(fixtures.join("slow-link-busy-host/rank-0.fingerprint.json")).unwrap();
    // 100 MiB of zeros as gzip (~100 KB): over the decompressed bound.
    let bomb = {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..100 {
            z.write_all(&chunk).unwrap();
        }
        z.finish().unwrap()
    };
    let segments = [
        "job-1",
        "s1",
        "..",
        "%2e%2e",
        "a%00b",
        &"x".repeat(300),
        "%C3%BCn%C3%AF",
        "a%20b",
        "",
        "-",
        "@:.",
    ];
    let routes = [
        "/api/v1/jobs/{}/sessions/{}/fingerprints",
        "/api/v1/jobs/{}/sessions/{}/report",
        "/api/v1/jobs/{}/profiles/{}",
        "/api/v1/jobs/{}/flamegraph.svg?kind={}",
        "/api/v1/jobs",
        "/api/v1/functions?from={}&to={}",
        "/ui/jobs/{}/sessions/{}",
        "/ui/jobs/{}/flamegraph.svg?limit={}",
        "/ui/login?next={}",
        "/{}/{}",
    ];
    for (name, store, _dir) in stores("hostile") {
        let (app, ta, _) = app(store);
        let mut rng = SplitMix64::new(0x5eed);
        let mut statuses = std::collections::BTreeMap::new();
        for i in 0..400 {
            let route = routes[rng.below(routes.len() as u64) as usize];
            let mut path = route.to_string();
            while path.contains("{}") {
                let seg = segments[rng.below(segments.len() as u64) as usize];
                path = path.replacen("{}", seg, 1);
            }
            let method = ["GET", "POST", "PUT", "DELETE"][rng.below(4) as usize];
            let body: Vec<u8> = match rng.below(6) {
                0 => Vec::new(),
                1 => (0..rng.below(4096)).map(|_| rng.next_u64() as u8).collect(),
                2 => fp[..rng.below(fp.len() as u64) as usize].to_vec(),
                3 => {
                    // A fingerprint with one byte changed.
                    let mut b = fp.clone();
                    let k = rng.below(b.len() as u64) as usize;
                    b[k] = rng.next_u64() as u8;
                    b
                }
                4 => bomb.clone(),
                _ => fp.clone(),
            };
            let bearer = format!("Bearer {ta}");
            let cookie = format!("whyslow_token={ta}");
            let basic = format!("Basic {ta}");
            let headers: Vec<(&str, &[u8])> = match rng.below(4) {
                0 => vec![],
                1 => vec![("authorization", b"Bearer wsk_bogus")],
                2 => vec![
                    ("authorization", bearer.as_bytes()),
                    ("cookie", cookie.as_bytes()),
                ],
                _ => vec![
                    ("authorization", basic.as_bytes()),
                    ("cookie", b"whyslow_token=\xff\xfe"),
                ],
            };
            let (st, body) = request(&app, method, &path, &headers, body).await;
            assert!(
                st.as_u16() < 500,
                "{name}: request {i}: {method} {path} -> {st}: {}",
                String::from_utf8_lossy(&body)
            );
            *statuses.entry(st.as_u16()).or_insert(0) += 1;
        }
        eprintln!("{name}: {statuses:?}");
        // Still serving, and the hostile requests were answered.
        let (st, _) = request(&app, "GET", "/healthz", &[], vec![]).await;
        assert_eq!(st, StatusCode::OK);
        assert!(statuses.len() >= 4, "{name}: {statuses:?}");
        let (st, body) = call(
            &app,
            "POST",
            "/api/v1/jobs/j/profiles/bomb",
            &ta,
            bomb.clone(),
        )
        .await;
        let body = String::from_utf8_lossy(&body);
        assert_eq!(st, StatusCode::BAD_REQUEST, "{name}: {body}");
        assert!(
            body.contains("inflates past 67108864 bytes"),
            "{name}: {body}"
        );
    }
}
