//! `whyslow server` end to end through its script contract (issue 14):
//! token creation, fingerprint upload, job list, central report, 401 without
//! a token, 404 across tenants, /healthz and /metrics without one.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

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
        let mut child = whyslow()
            .args(["server", "--listen", "127.0.0.1:0", "--data"])
            .arg(data)
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

    /// One HTTP/1.1 request; (status, body).
    fn request(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(body).unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).unwrap();
        let text = String::from_utf8_lossy(&resp).into_owned();
        let status: u16 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        // Chunked bodies: join the chunks.
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            let mut out = String::new();
            let mut rest = body;
            while let Some((size, tail)) = rest.split_once("\r\n") {
                let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
                if n == 0 {
                    break;
                }
                out.push_str(&tail[..n]);
                rest = &tail[n + 2..];
            }
            out
        } else {
            body.to_string()
        };
        (status, body)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
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
