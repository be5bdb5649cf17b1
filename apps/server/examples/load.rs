//! Load on `whyslow server` (issue 14): N workers upload their fingerprints
//! for one session concurrently over loopback; then the session's report is
//! requested. Prints upload throughput, lost uploads, the time from the last
//! upload to the report, and the server's peak RSS.
//!
//! ```sh
//! cargo build --release -p whyslow -p whyslow-server --example load
//! target/release/examples/load target/release/whyslow 10000 64
//! target/release/examples/load target/release/whyslow 10000 64 --clickhouse http://127.0.0.1:8123
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn request(addr: &str, method: &str, path: &str, token: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let status = String::from_utf8_lossy(&resp[..resp.len().min(16)])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, resp)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .map(String::as_str)
        .unwrap_or("target/release/whyslow");
    let workers: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let conc: usize = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(64);
    let data = std::env::temp_dir().join(format!("whyslow-load-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    // The embedded store in a scratch directory, or a scratch database of
    // the ClickHouse at --clickhouse URL.
    let store: Vec<String> = match args.iter().position(|a| a == "--clickhouse") {
        Some(i) => vec![
            "--clickhouse".into(),
            args.get(i + 1).expect("--clickhouse URL").clone(),
            "--clickhouse-database".into(),
            format!("whyslow_load_{}", std::process::id()),
        ],
        None => vec!["--data".into(), data.display().to_string()],
    };
    let tok = Command::new(bin)
        .args(["server", "token", "create"])
        .args(&store)
        .args(["--tenant", "load"])
        .output()
        .expect("token create");
    let token = String::from_utf8(tok.stdout)
        .unwrap()
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut srv = Command::new(bin)
        .args(["server", "--listen", "127.0.0.1:0"])
        .args(&store)
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    let mut line = String::new();
    BufReader::new(srv.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();

    // One real fingerprint (a testbed rank), renumbered per worker.
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/testbed/slow-link-busy-host/rank-0.fingerprint.json");
    let base: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&fixture).unwrap()).unwrap();
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(
        (0..workers)
            .map(|w| {
                let mut v = base.clone();
                v["worker"] = serde_json::json!(w);
                serde_json::to_vec(&v).unwrap()
            })
            .collect(),
    );
    let bytes: usize = bodies.iter().map(Vec::len).sum();
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let t0 = Instant::now();
    let threads: Vec<_> = (0..conc)
        .map(|_| {
            let (bodies, next, failed, addr, token) = (
                bodies.clone(),
                next.clone(),
                failed.clone(),
                addr.clone(),
                token.clone(),
            );
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= bodies.len() {
                    break;
                }
                let (st, body) = request(
                    &addr,
                    "POST",
                    "/api/v1/jobs/load/sessions/s1/fingerprints",
                    &token,
                    &bodies[i],
                );
                if st != 201 {
                    let n = failed.fetch_add(1, Ordering::Relaxed);
                    if n < 5 {
                        let text = String::from_utf8_lossy(&body);
                        let tail = text.split("\r\n\r\n").nth(1).unwrap_or(&text);
                        eprintln!("worker {i}: status {st}: {}", tail.trim());
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let upload = t0.elapsed();
    let t1 = Instant::now();
    let (st, rep) = request(
        &addr,
        "GET",
        "/api/v1/jobs/load/sessions/s1/report",
        &token,
        b"",
    );
    let report = t1.elapsed();
    let body = rep.split(|&b| b == b'{').count();
    let hwm = std::fs::read_to_string(format!("/proc/{}/status", srv.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    // The server's own CPU time (utime + stime), in seconds.
    let cpu_s = std::fs::read_to_string(format!("/proc/{}/stat", srv.id()))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let ticks: u64 =
                after.get(11)?.parse::<u64>().ok()? + after.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0)
        })
        .unwrap_or(f64::NAN);
    let (_, list) = request(&addr, "GET", "/api/v1/jobs", &token, b"");
    let list = String::from_utf8_lossy(&list);
    let stored = list
        .split("\"fingerprints\":")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .unwrap_or("?")
        .to_string();
    let _ = srv.kill();
    let _ = srv.wait();
    let _ = std::fs::remove_dir_all(&data);
    println!(
        "{workers} uploads ({:.1} MB) over {conc} connections in {:.2} s: {:.0}/s; failed {}; stored {stored}",
        bytes as f64 / 1e6,
        upload.as_secs_f64(),
        workers as f64 / upload.as_secs_f64(),
        failed.load(Ordering::Relaxed)
    );
    println!(
        "report (status {st}, {} JSON objects) {:.2} s after the last upload; server {hwm}, CPU {cpu_s:.2} s",
        body,
        report.as_secs_f64()
    );
}
