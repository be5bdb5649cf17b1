//! Profile ingest under load (issue 14): N simulated node agents each upload
//! one CPU profile every P seconds for D seconds, spread evenly over the
//! period (open loop: an upload goes at its time, whatever the server's
//! answer time), over loopback. Each profile is a pprof as the agent writes
//! it: `--stacks` distinct stacks of 24–40 frames from a pool of native,
//! Python and kernel frames, labels job/rank/host. Prints what was
//! acknowledged (and lost), the sustained stacks/s and bytes/s, and the
//! server's own CPU time (utime + stime of its process), so the figures per
//! core do not depend on how busy the machine was.
//!
//! `--pprof FILE` posts that real profile (e.g. one the agent or
//! `whyslow profile` wrote) as every upload instead, under distinct batch
//! names, so each is stored (issue 31: "a real whyslow profile posted 3,000
//! times"); its sample count is the stacks per upload.
//!
//! `--keep-alive`: each sending thread keeps its connection between uploads,
//! as a pooling client does (the default opens one per upload).
//!
//! `--query`: once the uploads are in, times what a user asks of them
//! (issue 31's "answered within a second"): the flame graph of the job's
//! latest 1,000 profiles, and the cross-job function query over all of
//! them with and without a baseline range (best and worst of 3 each).
//!
//! ```sh
//! cargo build --release -p whyslow -p whyslow-server --example agents
//! target/release/examples/agents target/release/whyslow --agents 1000 --period 30 --duration 60
//! target/release/examples/agents target/release/whyslow --clickhouse http://127.0.0.1:8123 …
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use whyslow_model::stack::{Frame, FrameKind, StackProfileBuilder};

/// GET `path`: (status, body bytes).
fn get(addr: &str, path: &str, token: &str) -> (u16, usize) {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return (0, 0);
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(120)));
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).is_err() {
        return (0, 0);
    }
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.find("\r\n\r\n").map_or(0, |i| out.len() - i - 4);
    (status, body)
}

fn post(addr: &str, path: &str, token: &str, body: &[u8]) -> u16 {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return 0;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).is_err() || s.write_all(body).is_err() {
        return 0;
    }
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    String::from_utf8_lossy(&resp[..resp.len().min(16)])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// One upload on a kept-alive connection (opened when `conn` has none, as
/// a pooling HTTP client such as the agent's does); the status, 0 when the
/// connection failed (it is dropped, the next upload opens another).
fn post_kept(
    conn: &mut Option<TcpStream>,
    addr: &str,
    path: &str,
    token: &str,
    body: &[u8],
) -> u16 {
    if conn.is_none() {
        let Ok(s) = TcpStream::connect(addr) else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(60)));
        let _ = s.set_nodelay(true);
        *conn = Some(s);
    }
    let Some(s) = conn.as_mut() else {
        return 0;
    };
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let status = (|| -> Option<u16> {
        s.write_all(head.as_bytes()).ok()?;
        s.write_all(body).ok()?;
        // Headers, then exactly Content-Length bytes of body.
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).ok()? == 0 {
                return None;
            }
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        let mut rest = vec![0u8; len];
        s.read_exact(&mut rest).ok()?;
        Some(status)
    })();
    if status.is_none() {
        *conn = None;
    }
    status.unwrap_or(0)
}

/// SplitMix64: the profiles' shapes, the same on every run.
fn mix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e3779b97f4a7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
    z ^ (z >> 31)
}

fn profile(agent: usize, n: u64, stacks: usize) -> Vec<u8> {
    let mut seed = (agent as u64) << 32 | n;
    let mut b = StackProfileBuilder::new();
    b.label("job", "load");
    b.label("rank", agent.to_string());
    b.label("host", format!("node-{agent}"));
    let pool: Vec<Frame> = (0..600u64)
        .map(|i| match i % 3 {
            0 => Frame {
                kind: FrameKind::Native,
                name: Some(format!("at::native::op_{i}")),
                module: Some("/usr/lib/libtorch_cpu.so".into()),
                build_id: Some("4f0b2a71c3d9e8a1".into()),
                offset: 0x100000 + i * 64,
                line: None,
            },
            1 => Frame {
                kind: FrameKind::Python,
                name: Some(format!("layer_{i}")),
                module: Some("model.py".into()),
                build_id: None,
                offset: 0,
                line: Some(i as u32),
            },
            _ => Frame {
                kind: FrameKind::Kernel,
                name: Some(format!("kfunc_{i}")),
                module: Some("[kernel]".into()),
                build_id: None,
                offset: 0xffff_ffff_8100_0000 + i * 32,
                line: None,
            },
        })
        .collect();
    let ids: Vec<u32> = pool.into_iter().map(|f| b.frame(f)).collect();
    for _ in 0..stacks {
        let depth = 24 + (mix(&mut seed) % 17) as usize;
        let frames: Vec<u32> = (0..depth)
            .map(|_| ids[(mix(&mut seed) % ids.len() as u64) as usize])
            .collect();
        b.add(frames, 1 + mix(&mut seed) % 50);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    whyslow_stack_output::to_pprof(&b.finish(99.0, now, 30_000_000_000))
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 of stat (utime, stime) are 11 and 12 after the ')'.
    (ticks(11) + ticks(12)) / 100.0
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bin = args
        .get(1)
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| "target/release/whyslow".into());
    let agents: usize = arg(&args, "--agents", 1000);
    let period: f64 = arg(&args, "--period", 30.0);
    let duration: f64 = arg(&args, "--duration", 60.0);
    let mut stacks: usize = arg(&args, "--stacks", 200);
    let real: Option<Vec<u8>> = args
        .iter()
        .position(|a| a == "--pprof")
        .and_then(|i| args.get(i + 1))
        .map(|f| std::fs::read(f).unwrap_or_else(|e| panic!("--pprof {f}: {e}")));
    if let Some(body) = &real {
        let p = whyslow_stack_output::from_pprof(body).expect("--pprof: not a pprof profile");
        stacks = p.stacks.len();
    }
    let conc: usize = arg(&args, "--concurrency", 64);
    // Each sending thread keeps its connection open between uploads.
    let keep_alive = args.iter().any(|a| a == "--keep-alive");
    let clickhouse: Option<String> = arg(&args, "--clickhouse", String::new())
        .chars()
        .next()
        .map(|_| arg(&args, "--clickhouse", String::new()));
    let data = std::env::temp_dir().join(format!("whyslow-agents-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let db = format!("whyslow_load_{}", std::process::id());
    let store: Vec<String> = match &clickhouse {
        Some(url) => vec![
            "--clickhouse".into(),
            url.clone(),
            "--clickhouse-database".into(),
            db,
        ],
        None => vec!["--data".into(), data.display().to_string()],
    };
    let tok = Command::new(&bin)
        .args(["server", "token", "create"])
        .args(&store)
        .args(["--tenant", "load"])
        .output()
        .expect("token create");
    let token = String::from_utf8(tok.stdout).unwrap().trim().to_string();
    let mut srv = Command::new(&bin)
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

    // Each agent's profiles, built before the clock starts.
    let per_agent = (duration / period).ceil().max(1.0) as usize;
    let mut events: Vec<(f64, usize, usize)> = Vec::new();
    for a in 0..agents {
        for k in 0..per_agent {
            let t = k as f64 * period + a as f64 * period / agents as f64;
            if t < duration {
                events.push((t, a, k));
            }
        }
    }
    events.sort_by(|x, y| x.0.total_cmp(&y.0));
    let bodies: Arc<Vec<Vec<u8>>> = Arc::new(
        events
            .iter()
            .map(|&(_, a, k)| match &real {
                Some(body) => body.clone(),
                None => profile(a, k as u64, stacks),
            })
            .collect(),
    );
    let events = Arc::new(events);
    let next = Arc::new(AtomicUsize::new(0));
    let (ok, lost, bytes) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let cpu0 = cpu_seconds(srv.id());
    let t0 = Instant::now();
    let threads: Vec<_> = (0..conc)
        .map(|_| {
            let (events, bodies, next, ok, lost, bytes, addr, token) = (
                events.clone(),
                bodies.clone(),
                next.clone(),
                ok.clone(),
                lost.clone(),
                bytes.clone(),
                addr.clone(),
                token.clone(),
            );
            let mut conn = None;
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(t, a, k)) = events.get(i) else {
                    break;
                };
                let wait = t - t0.elapsed().as_secs_f64();
                if wait > 0.0 {
                    std::thread::sleep(Duration::from_secs_f64(wait));
                }
                let path = format!("/api/v1/jobs/load/profiles/a{a}-p{k}");
                let st = if keep_alive {
                    post_kept(&mut conn, &addr, &path, &token, &bodies[i])
                } else {
                    post(&addr, &path, &token, &bodies[i])
                };
                if st == 201 {
                    ok.fetch_add(1, Ordering::Relaxed);
                    bytes.fetch_add(bodies[i].len() as u64, Ordering::Relaxed);
                } else {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds(srv.id()) - cpu0;
    if args.iter().any(|a| a == "--query") {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let far = now + 86_400;
        for (what, path) in [
            (
                "flame graph of the latest 1,000 profiles",
                "/api/v1/jobs/load/flamegraph.svg?limit=1000".to_string(),
            ),
            (
                "functions over all profiles, no baseline",
                format!("/api/v1/functions?from=0&to={far}&baseline=none"),
            ),
            (
                "functions over all profiles against a baseline range",
                format!(
                    "/api/v1/functions?from={}&to={far}&base_from=0&base_to={}",
                    far / 2,
                    far / 2
                ),
            ),
        ] {
            let mut times = Vec::new();
            let mut answer = (0, 0);
            for _ in 0..3 {
                let t = Instant::now();
                answer = get(&addr, &path, &token);
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            println!(
                "query: {what}: HTTP {} ({} bytes) in {:.3}-{:.3} s",
                answer.0, answer.1, times[0], times[2]
            );
        }
    }
    let hwm = std::fs::read_to_string(format!("/proc/{}/status", srv.id()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(str::to_string)
        })
        .unwrap_or_default();
    let _ = srv.kill();
    let _ = srv.wait();
    let _ = std::fs::remove_dir_all(&data);
    let (ok, lost, bytes) = (
        ok.load(Ordering::Relaxed),
        lost.load(Ordering::Relaxed),
        bytes.load(Ordering::Relaxed),
    );
    let stacks_total = ok * stacks as u64;
    println!(
        "{} store: {agents} agents, a profile each every {period} s for {duration} s ({stacks} stacks each{}): {ok} acknowledged, {lost} lost, in {wall:.1} s",
        if clickhouse.is_some() { "ClickHouse" } else { "embedded" },
        if keep_alive { ", connections kept alive" } else { "" }
    );
    println!(
        "sustained: {:.0} stacks/s, {:.2} MB/s; server CPU {cpu:.2} s: {:.0} stacks and {:.2} MB per CPU-second; {hwm}",
        stacks_total as f64 / wall,
        bytes as f64 / wall / 1e6,
        stacks_total as f64 / cpu.max(1e-9),
        bytes as f64 / cpu.max(1e-9) / 1e6
    );
}
