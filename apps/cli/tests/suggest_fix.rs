//! `--suggest-fix` (EROICA's first step) against a local stand-in for an
//! OpenAI-compatible server that records what it gets and replays an
//! answer: the request carries each finding and its code, the answer lands
//! in JSON, table and HTML, the patch is checked against the sources, the
//! key goes only in the header, `--dry-run` and runs without the flag send
//! nothing, and a server that fails costs nothing else.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

const KEY: &str = "sk-test-0123456789-secret";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A request the stand-in received: (request line and headers, body).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

/// Serves `status` + `answer` to every request on a free port, recording
/// each; the URL base (`http://127.0.0.1:PORT/v1`).
fn stand_in(status: u16, answer: String) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut head = String::new();
            let mut len = 0usize;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0u8; len];
            let _ = reader.read_exact(&mut body);
            log.lock()
                .unwrap()
                .push((head, String::from_utf8_lossy(&body).into_owned()));
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (format!("http://127.0.0.1:{port}/v1"), seen)
}

fn analyze(url: &str, extra: &[&str], dir: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .current_dir(dir)
        .arg("analyze")
        .arg(repo().join("examples/data/slow-rank-cpu-gloo"))
        .arg("--source-root")
        .arg(repo().join("examples"))
        .args(extra)
        .env("WHYSLOW_LLM_URL", url)
        .env("WHYSLOW_LLM_MODEL", "stand-in-model")
        .env("WHYSLOW_LLM_API_KEY", KEY)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("whyslow-fix-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The model's answer: the cause, and a patch that removes the injected
/// call from examples/train.py (its lines as they stand).
fn answer(patch_line: &str) -> String {
    let content = format!(
        "Rank 2 runs injected_slow_rank_work in every step; the others wait for it in all_reduce.\n\
         Remove the call.\n```diff\n--- a/train.py\n+++ b/train.py\n@@ -213,5 +213,4 @@\n             if FAULT_ACTIVE:\n                 if a.fault == \"slow-rank\" and rank == a.fault_rank:\n-{patch_line}\n+                    pass\n                 elif a.fault == \"slow-read\" and rank == a.fault_rank:\n```\n"
    );
    serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
        .to_string()
}

#[test]
fn the_answer_lands_in_json_table_and_html_and_the_key_only_in_the_header() {
    let (url, seen) = stand_in(
        200,
        answer("                    injected_slow_rank_work(a.fault_ms)"),
    );
    let dir = temp("answer");
    let (code, out, err) = analyze(
        &url,
        &[
            "--suggest-fix",
            "--format",
            "json",
            "--json",
            "r.json",
            "--html",
            "r.html",
        ],
        &dir,
    );
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let fix = &report["fix"];
    assert_eq!(fix["model"], "stand-in-model", "{out}");
    assert!(fix["text"]
        .as_str()
        .unwrap()
        .contains("injected_slow_rank_work"));
    assert_eq!(fix["applies"], true, "{fix}");
    assert!(fix["code_bytes"].as_u64().unwrap() > 0);
    // Beside the report, for git apply.
    let patch = std::fs::read_to_string(dir.join("fix.patch")).unwrap();
    assert!(patch.starts_with("--- a/train.py"), "{patch}");
    let html = std::fs::read_to_string(dir.join("r.html")).unwrap();
    assert!(
        html.contains("Proposed fix") && html.contains("a model's proposal: stand-in-model"),
        "html"
    );
    // The request: one, to {base}/chat/completions, every finding and the
    // flagged code in it, the key in the header and nowhere else.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (head, body) = &seen[0];
    assert!(head.starts_with("POST /v1/chat/completions "), "{head}");
    assert!(head.contains(&format!("Bearer {KEY}")), "{head}");
    assert!(!body.contains(KEY));
    let req: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(req["model"], "stand-in-model");
    let user = req["messages"][1]["content"].as_str().unwrap();
    for f in report["findings"].as_array().unwrap() {
        assert!(user.contains(f["function"].as_str().unwrap()), "{user}");
    }
    assert!(user.contains("def injected_slow_rank_work(ms):"), "{user}");
    assert!(
        user.contains("injected_slow_rank_work(a.fault_ms)"),
        "the call site: {user}"
    );
    for text in [
        &out,
        &err,
        &html,
        &std::fs::read_to_string(dir.join("r.json")).unwrap(),
    ] {
        assert!(!text.contains(KEY));
    }
    // The table shows it above the findings.
    let (_, table, _) = analyze(&url, &["--suggest-fix", "--no-color"], &dir);
    let at_fix = table.find("Proposed fix").expect("in the table");
    let at_findings = table.find("abnormal function execution").unwrap();
    assert!(at_fix < at_findings, "{table}");
}

#[test]
fn a_patch_that_does_not_match_the_sources_says_why() {
    let (url, _seen) = stand_in(
        200,
        answer("                    injected_slow_rank_work(a.other_ms)"),
    );
    let dir = temp("mismatch");
    let (code, out, err) = analyze(&url, &["--suggest-fix", "--format", "json"], &dir);
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["fix"]["applies"], false);
    assert!(report["fix"]["applies_error"]
        .as_str()
        .unwrap()
        .contains("hunk 1"));
}

#[test]
fn failures_cost_nothing_but_a_warning_and_no_flag_sends_nothing() {
    let dir = temp("fail");
    let (code0, plain, _) = analyze("http://127.0.0.1:9/v1", &["--format", "json"], &dir);
    let plain: serde_json::Value = serde_json::from_str(&plain).unwrap();
    let strip = |mut v: serde_json::Value| {
        v.as_object_mut().unwrap().remove("fix_error");
        v
    };
    // Nobody listening; a 500; an answer that is not JSON; one without choices.
    let (u500, _) = stand_in(500, "{\"error\": {\"message\": \"overloaded\"}}".into());
    let (uhtml, _) = stand_in(200, "<html>gateway</html>".into());
    let (unone, _) = stand_in(200, "{\"choices\": []}".into());
    for (url, why) in [
        ("http://127.0.0.1:9/v1", "127.0.0.1:9"),
        (u500.as_str(), "HTTP 500"),
        (uhtml.as_str(), "not JSON"),
        (unone.as_str(), "no choices"),
    ] {
        let (code, out, err) = analyze(
            url,
            &["--suggest-fix", "--format", "json", "--llm-timeout", "5"],
            &dir,
        );
        assert_eq!(code, code0, "{err}");
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        let e = r["fix_error"].as_str().unwrap_or_default();
        assert!(e.contains(why), "{why}: {e}");
        assert_eq!(e.lines().count(), 1);
        assert!(r.get("fix").is_none());
        assert_eq!(
            strip(r),
            plain,
            "the report is the same as without --suggest-fix"
        );
        assert!(err.contains("no fix proposal"), "{err}");
        assert!(!err.contains(KEY) && !out.contains(KEY));
    }
    // Without the flag, and with --dry-run, nothing reaches the server.
    let (url, seen) = stand_in(200, answer("x"));
    let (code, _, _) = analyze(&url, &["--format", "json"], &dir);
    assert_eq!(code, Some(0));
    let (code, body, err) = analyze(&url, &["--suggest-fix", "--dry-run"], &dir);
    assert_eq!(code, Some(0), "{err}");
    assert!(seen.lock().unwrap().is_empty(), "sent without being asked");
    let req: serde_json::Value = serde_json::from_str(&body).expect("the request body");
    assert_eq!(req["model"], "stand-in-model");
    assert!(!body.contains(KEY));
    assert!(err.contains("not sent"), "{err}");
}

/// The server's fix button (a server-side setting) asks what
/// `analyze --suggest-fix` asks for the same evidence, shows the same
/// answer on later reports and on the session page, sends the key only in
/// the header, and without the setting refuses with 404 (saying why).
#[test]
fn the_server_asks_what_the_command_line_asks() {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;

    let (url, seen) = stand_in(
        200,
        answer("                    injected_slow_rank_work(a.fault_ms)"),
    );
    let dir = temp("server");
    let fps = dir.join("fps");
    let (code, out, err) = analyze(
        &url,
        &[
            "--suggest-fix",
            "--format",
            "json",
            "--fingerprints-out",
            fps.to_str().unwrap(),
        ],
        &dir,
    );
    assert_eq!(code, Some(0), "{err}");
    let cli: serde_json::Value = serde_json::from_str(&out).unwrap();

    let app = |fix: Option<whyslow_server::fix::FixSetting>| {
        let store = whyslow_server::SqliteStore::open(&dir.join("store")).unwrap();
        let token = whyslow_server::Store::create_token(&store, "t").unwrap();
        let state = Arc::new(whyslow_server::AppState {
            retention_days: 7,
            compact_after_s: 3600,
            store: Box::new(store),
            symbols: None,
            raw: None,
            metrics: Default::default(),
            fix,
            tokens: Default::default(),
            identities: Default::default(),
        });
        (whyslow_server::router(state), token)
    };
    async fn call(
        app: &axum::Router,
        method: &str,
        uri: &str,
        auth: (&str, String),
        body: Vec<u8>,
    ) -> (StatusCode, String) {
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .header(auth.0, auth.1)
            .body(Body::from(body))
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let b = axum::body::to_bytes(resp.into_body(), 1 << 24)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&b).into_owned())
    }
    let setting = whyslow_server::fix::FixSetting::new(
        whyslow_pipeline::suggest::Endpoint::new(&url, "stand-in-model", Some(KEY.into())),
        vec![repo().join("examples")],
        30.0,
        whyslow_fix::DEFAULT_MAX_CODE_BYTES,
    );
    let (with, token) = app(Some(setting));
    let bearer = || ("authorization", format!("Bearer {token}"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for entry in std::fs::read_dir(&fps).unwrap() {
            let body = std::fs::read(entry.unwrap().path()).unwrap();
            let uri = "/api/v1/jobs/demo/sessions/s1/fingerprints";
            let (status, text) = call(&with, "POST", uri, bearer(), body).await;
            assert_eq!(status, StatusCode::CREATED, "{text}");
        }
        let uri = "/api/v1/jobs/demo/sessions/s1/fix";
        let (status, text) = call(&with, "POST", uri, bearer(), vec![]).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        let server: serde_json::Value = serde_json::from_str(&text).unwrap();
        // The same answer, checked alike; how long each exchange took is a
        // measurement of that exchange, not part of the answer.
        let answer = |v: &serde_json::Value| {
            let mut f = v["fix"].clone();
            assert!(f["seconds"].as_f64().is_some_and(|s| s >= 0.0), "{f}");
            f.as_object_mut().unwrap().remove("seconds");
            f
        };
        assert_eq!(
            answer(&server),
            answer(&cli),
            "the same answer, checked alike"
        );
        assert_eq!(server["fix"]["applies"], true);
        // One request each, and the same one.
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].1, seen[1].1, "the server sent what the CLI sent");
        assert!(seen[1].0.contains(&format!("Bearer {KEY}")));
        assert!(!seen[1].1.contains(KEY));
        // Later reports and the session page carry the answer; no new
        // request.
        let uri = "/api/v1/jobs/demo/sessions/s1/report";
        let (_, text) = call(&with, "GET", uri, bearer(), vec![]).await;
        let later: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(answer(&later), answer(&cli));
        assert_eq!(
            later["fix"]["seconds"], server["fix"]["seconds"],
            "kept, not asked again"
        );
        let cookie = ("cookie", format!("whyslow_token={token}"));
        let (status, page) = call(
            &with,
            "GET",
            "/ui/jobs/demo/sessions/s1",
            cookie.clone(),
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(
            page.contains("Proposed fix") && page.contains("Ask again:"),
            "page"
        );
        assert!(page.contains("action=\"/ui/jobs/demo/sessions/s1/fix\""));
        assert!(!page.contains(KEY) && !text.contains(KEY));
        // The button: asks, then shows the session.
        let (status, _) = call(
            &with,
            "POST",
            "/ui/jobs/demo/sessions/s1/fix",
            cookie,
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::SEE_OTHER);
    });
    assert_eq!(seen.lock().unwrap().len(), 3, "the button asked once more");

    // Without the setting: no button, and the API says why.
    let (without, token) = app(None);
    rt.block_on(async {
        let bearer = ("authorization", format!("Bearer {token}"));
        let (status, text) = call(
            &without,
            "POST",
            "/api/v1/jobs/demo/sessions/s1/fix",
            bearer,
            vec![],
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{text}");
        assert!(text.contains("--suggest-fix"), "{text}");
        let cookie = ("cookie", format!("whyslow_token={token}"));
        let (_, page) = call(&without, "GET", "/ui/jobs/demo/sessions/s1", cookie, vec![]).await;
        assert!(!page.contains("/fix\""), "no button without the setting");
    });
}

/// Issue 44: the exchange is bounded (`max_tokens`, stop sequences), its
/// cost is in the report (seconds, the endpoint's token counts, a cut
/// answer said so), an answer without a diff is "no change" and not a fix,
/// and nothing lands in the working directory unasked.
#[test]
fn the_exchange_is_bounded_and_its_cost_reported() {
    let body = serde_json::json!({
        "choices": [{"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "def unrelated():\n    return 42\n"}}],
        "usage": {"prompt_tokens": 3811, "completion_tokens": 256, "total_tokens": 4067}
    })
    .to_string();
    let (url, seen) = stand_in(200, body);
    let dir = temp("bounded");
    let (code, out, err) = analyze(
        &url,
        &[
            "--suggest-fix",
            "--llm-max-tokens",
            "256",
            "--format",
            "json",
        ],
        &dir,
    );
    assert_eq!(code, Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let fix = &report["fix"];
    assert!(fix["patch"].is_null() && fix["applies"].is_null(), "{fix}");
    assert_eq!(fix["usage"]["prompt_tokens"], 3811, "{fix}");
    assert_eq!(fix["usage"]["completion_tokens"], 256, "{fix}");
    assert_eq!(fix["truncated"], true, "{fix}");
    assert!(fix["seconds"].as_f64().unwrap() >= 0.0, "{fix}");
    let request: serde_json::Value = serde_json::from_str(&seen.lock().unwrap()[0].1).unwrap();
    assert_eq!(request["max_tokens"], 256, "{request}");
    assert!(!request["stop"].as_array().unwrap().is_empty(), "{request}");
    // Nothing was asked to be written: nothing is.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    // The table says no change was proposed, and what it cost.
    let (_, table, _) = analyze(&url, &["--suggest-fix", "--no-color"], &dir);
    assert!(table.contains("the model proposed no change"), "{table}");
    assert!(table.contains("3811 prompt + 256 answer tokens"), "{table}");
    assert!(table.contains("cut at the bound"), "{table}");
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

/// `--verify-fix -- CMD`: the patch is tried on scratch copies of the
/// source root and called a fix only when the command ran faster
/// (issue 44); the user's files are never changed. The command stands in
/// for a training run: it takes 0.4 s while train.py still makes the
/// injected call, and the patch removes it.
#[test]
fn a_patch_is_verified_by_rerunning_the_command_and_called_a_fix_only_when_faster() {
    let (url, _seen) = stand_in(
        200,
        answer("                    injected_slow_rank_work(a.fault_ms)"),
    );
    let dir = temp("verify");
    let train = repo().join("examples/train.py");
    let before = std::fs::read_to_string(&train).unwrap();
    let rerun = |script: &str| {
        let (code, out, err) = analyze(
            &url,
            &[
                "--suggest-fix",
                "--format",
                "json",
                "--verify-fix",
                "--verify-runs",
                "4",
                "--",
                "sh",
                "-c",
                script,
            ],
            &dir,
        );
        assert_eq!(code, Some(0), "{err}");
        let report: serde_json::Value = serde_json::from_str(&out).unwrap();
        (report["fix"]["verified"].clone(), err)
    };
    let (v, err) =
        rerun("grep -q 'injected_slow_rank_work(a.fault_ms)' train.py && sleep 0.4; true");
    assert_eq!(v["status"], "faster", "{v}\n{err}");
    assert_eq!(v["faster"], true);
    assert_eq!(v["runs"], 4);
    assert!(v["speedup"].as_f64().unwrap() > 2.0, "{v}");
    assert!(v["p_value"].as_f64().unwrap() < 0.05, "{v}");
    assert_eq!(err.matches("verify-fix: run ").count(), 8, "{err}");
    // Slower after the patch: shown, and not as a fix.
    let (v, err) = rerun("grep -q 'injected_slow_rank_work(a.fault_ms)' train.py || sleep 0.3");
    assert_eq!(v["status"], "not_faster", "{v}");
    assert!(err.contains("--verify-fix: not faster"), "{err}");
    // A command that fails.
    let (v, _) = rerun("echo broken >&2; exit 2");
    assert_eq!(v["status"], "run_failed", "{v}");
    assert!(v["detail"].as_str().unwrap().contains("broken"), "{v}");
    assert_eq!(std::fs::read_to_string(&train).unwrap(), before);
    // Without the command, nothing is asked.
    let (code, _, err) = analyze(&url, &["--suggest-fix", "--verify-fix"], &dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("after `--`"), "{err}");
}
