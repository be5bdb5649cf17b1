//! `whyslow agent`: the sampling sidecar's file protocol (docs/agent.md) with
//! real processes: busy children as training ranks, the agent binary as the
//! privileged monitor, a temporary directory as the shared emptyDir.

mod common;
use common::start_ticks;

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The tests spin busy processes on a small machine: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// utime + stime of a process, in clock ticks (100 Hz on Linux).
fn cpu_ticks(pid: u32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// A busy child process (a spinning shell): the "training rank".
struct Busy(Child);

impl Busy {
    fn spawn() -> Busy {
        Busy(
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap(),
        )
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent binary, its JSON events (`--log-format json`) read from its
/// stderr as they come: tests wait for what the agent says it did.
struct Agent {
    child: Child,
    events: Receiver<Value>,
    seen: Vec<Value>,
}

impl Agent {
    fn spawn(dir: &Path, extra: &[&str]) -> Agent {
        let mut child = Command::new(env!("CARGO_BIN_EXE_whyslow"))
            .arg("agent")
            .arg("--samples-dir")
            .arg(dir)
            .args(["--poll-ms", "20", "--log-format", "json"])
            .args(extra)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, events) = channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("agent log line is not JSON ({e}): {line}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        Agent {
            child,
            events,
            seen: Vec::new(),
        }
    }

    /// Waits for the next event `name` whose fields satisfy `pred`; returns
    /// its fields. Every event read is kept in `seen`.
    fn wait_event(&mut self, name: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(e) = self
            .seen
            .iter()
            .find(|e| e["fields"]["event"] == name && pred(&e["fields"]))
        {
            return e["fields"].clone();
        }
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let e = self
                .events
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no {name} event; saw {:#?}", self.seen));
            self.seen.push(e.clone());
            if e["fields"]["event"] == name && pred(&e["fields"]) {
                return e["fields"].clone();
            }
        }
    }

    /// Names of the events read so far.
    fn seen_names(&self) -> Vec<String> {
        self.seen
            .iter()
            .map(|e| e["fields"]["event"].as_str().unwrap_or("").to_string())
            .collect()
    }

    /// SIGTERM, then the exit status (success expected).
    fn terminate(&mut self) -> std::process::ExitStatus {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < until, "agent did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, timeout_s: f64, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs_f64(timeout_s);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Writes a file the way the protocol asks: a temporary name, then rename.
fn put(dir: &Path, name: &str, body: &str) {
    let tmp = dir.join(format!(".{name}.test.tmp"));
    fs::write(&tmp, body).unwrap();
    fs::rename(&tmp, dir.join(name)).unwrap();
}

fn request(dir: &Path, rank: u32, pid: u32, id: &str) {
    let body = serde_json::json!({
        "pid": pid, "tid": null, "rank": rank, "rate_hz": 500,
        "interfaces": ["lo:1000"], "time_base_ns": 0, "until_unix_s": null, "id": id,
    });
    put(dir, &format!("rank-{rank}.request.json"), &body.to_string());
}

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(p).unwrap()).unwrap()
}

fn cpu_values(p: &Path) -> Vec<f32> {
    cpu_series(p).values
}

fn cpu_series(p: &Path) -> whyslow_model::SampleSeries {
    let s = whyslow_ingest::read_samples(p).expect("whyslow-ingest reads the agent's samples");
    s.series[&whyslow_model::Resource::Cpu].clone()
}

/// Time-weighted mean: when spinning processes starve the sampler thread
/// its intervals vary (long ones while the spinner runs), so a plain mean
/// over samples is biased low. Weights from the spacing of the midpoint
/// stamps, as in the sampler's own tests.
fn time_weighted_mean(s: &whyslow_model::SampleSeries) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for i in 1..s.ts_ns.len() {
        let w = (s.ts_ns[i] - s.ts_ns[i - 1]) as f64;
        num += w * s.values[i] as f64;
        den += w;
    }
    num / den
}

#[test]
#[ignore = "system test (./scripts/test --all): the node agent serving live ranks"]
fn serves_two_ranks_holds_the_pause_file_and_runs_hooks() {
    let _g = serial();
    let _dir_guard = whyslow_testkit::temp_dir("two");
    let dir = _dir_guard.path().to_path_buf();
    let hooks = dir.join("hooks.log");
    // Stale files of an agent that died: removed at startup.
    put(&dir, "whyslow.pause", "{}");
    put(&dir, "rank-7.stop", "");
    let pause_cmd = format!("echo pause $WHYSLOW_ACTIVE_RANKS >> {}", hooks.display());
    // A slow hook, so the test depends on the agent's hook_ran event and
    // not on how fast `sh` starts.
    let resume_cmd = format!("sleep 0.3; echo resume >> {}", hooks.display());
    let mut agent = Agent::spawn(
        &dir,
        &["--pause-cmd", &pause_cmd, "--resume-cmd", &resume_cmd],
    );
    let pause = dir.join("whyslow.pause");
    agent.wait_event("watching", |_| true);
    let stale: Vec<String> = agent
        .seen
        .iter()
        .filter(|e| e["fields"]["event"] == "stale_removed")
        .map(|e| e["fields"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(stale.len(), 2, "{stale:?}");
    assert!(stale.iter().any(|n| n == "rank-7.stop"), "{stale:?}");
    assert!(!pause.exists() && !dir.join("rank-7.stop").exists());

    let (a, b) = (Busy::spawn(), Busy::spawn());
    let t0 = Instant::now();
    let ticks0 = [cpu_ticks(a.pid()), cpu_ticks(b.pid())];
    request(&dir, 0, a.pid(), "w0");
    request(&dir, 1, b.pid(), "w1");
    for (rank, id) in [(0, "w0"), (1, "w1")] {
        let e = agent.wait_event("window_started", |f| f["rank"] == rank);
        assert_eq!(e["request"], id);
        assert_eq!(e["rate_hz"], 500.0);
    }
    wait_for("the pause file", 5.0, || pause.exists());
    let p = read_json(&pause);
    assert_eq!(p["who"], "whyslow agent");
    assert!(p["why"].as_str().unwrap().contains("step aside"));
    wait_for("both ranks in the pause file", 5.0, || {
        read_json(&pause)["ranks"] == serde_json::json!([0, 1])
    });
    assert!(
        !dir.join("rank-0.request.json").exists(),
        "request consumed"
    );
    std::thread::sleep(Duration::from_millis(600));

    // Rank 0 ends its window; rank 1's is still active: pause file stays.
    let truth0 = (cpu_ticks(a.pid()) - ticks0[0]) as f64 / 100.0 / t0.elapsed().as_secs_f64();
    put(&dir, "rank-0.stop", "");
    let e = agent.wait_event("window_done", |f| f["rank"] == 0);
    assert_eq!(e["reason"], "stop file");
    assert!(dir.join("rank-0.done").exists());
    assert!(pause.exists());
    wait_for("pause file rewritten for rank 1", 5.0, || {
        read_json(&pause)["ranks"] == serde_json::json!([1])
    });
    std::thread::sleep(Duration::from_millis(200));
    let truth1 = (cpu_ticks(b.pid()) - ticks0[1]) as f64 / 100.0 / t0.elapsed().as_secs_f64();
    put(&dir, "rank-1.stop", "");
    wait_for("rank 1 done", 5.0, || dir.join("rank-1.done").exists());
    wait_for("pause file removed", 5.0, || !pause.exists());
    // The resume hook runs after the file is removed: wait for the agent to
    // say it ran before reading the hook log.
    let e = agent.wait_event("hook_ran", |f| f["hook"] == "resume");
    assert!(e["seconds"].as_f64().unwrap() >= 0.0);

    for (rank, id, truth) in [(0, "w0", truth0), (1, "w1", truth1)] {
        let done = read_json(&dir.join(format!("rank-{rank}.done")));
        assert_eq!(done["id"], id);
        assert_eq!(done["reason"], "stop file");
        assert!(
            done["series"].as_array().unwrap().contains(&"cpu".into()),
            "{done}"
        );
        // Two spinning children on a 2-core machine (often shared with
        // builds) starve the sampler threads: only loose bounds on the rate.
        let hz = done["achieved_hz"].as_f64().unwrap();
        assert!(hz > 40.0 && hz < 600.0, "{done}");
        let series = cpu_series(&dir.join(format!("rank-{rank}.samples.csv")));
        let cpu = &series.values;
        assert!(cpu.len() > 30, "{} samples", cpu.len());
        assert!(cpu.iter().all(|v| (0.0..=1.0).contains(v)));
        // A spinning process gets whatever the shared 2-core machine
        // leaves it: the sampled mean must match its CPU time from
        // /proc/PID/stat over (about) the same window.
        let mean = time_weighted_mean(&series);
        // How much a spinner gets depends on the machine's load (0.09 of a
        // CPU seen beside a busy loop, a test suite and a testbed run).
        assert!(
            mean > 0.0 && truth > 0.0,
            "mean cpu {mean}, /proc says {truth}"
        );
        assert!(
            (mean - truth).abs() < 0.25,
            "mean cpu {mean}, /proc says {truth}"
        );
        let samples = fs::read_to_string(dir.join(format!("rank-{rank}.samples.csv"))).unwrap();
        assert!(samples.starts_with("resource,ts_us,value,worker\n"));
        assert!(samples
            .lines()
            .nth(1)
            .unwrap()
            .ends_with(&format!(",{rank}")));
        let extra = fs::read_to_string(dir.join(format!("rank-{rank}.sampler-extra.csv"))).unwrap();
        assert!(
            extra.contains("thread_cpu,"),
            "{}",
            &extra[..200.min(extra.len())]
        );
        assert!(extra.contains("nic_tx,lo,"));
    }
    // Stop files are consumed; no error files; no temporary files left.
    let names: Vec<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.ends_with(".stop") || n.ends_with(".error") || n.ends_with(".tmp")),
        "{names:?}"
    );
    // Hooks: one pause when the first window started, one resume at the end.
    let log = fs::read_to_string(&hooks).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(lines[0].starts_with("pause "), "{log}");
    assert_eq!(lines[1], "resume");
}

#[test]
#[ignore = "system test (./scripts/test --all): the node agent serving live ranks"]
fn missing_process_gets_an_error_file() {
    let _g = serial();
    let _dir_guard = whyslow_testkit::temp_dir("missing");
    let dir = _dir_guard.path().to_path_buf();
    let mut agent = Agent::spawn(&dir, &[]);
    // Far above any pid_max: no such process.
    request(&dir, 2, 99_999_999, "gone");
    let err = dir.join("rank-2.error");
    let e = agent.wait_event("request_failed", |f| f["rank"] == 2);
    assert!(e["reason"].as_str().unwrap().contains("not found"), "{e}");
    assert!(err.exists());
    let msg = fs::read_to_string(&err).unwrap();
    assert_eq!(msg.lines().count(), 1, "{msg}");
    assert!(
        msg.contains("99999999") && msg.contains("not found"),
        "{msg}"
    );
    assert!(!dir.join("rank-2.done").exists());
    assert!(!dir.join("rank-2.request.json").exists());
    // A malformed request: an error file too, and the agent keeps serving.
    put(&dir, "rank-3.request.json", "{\"pid\": \"x\"}");
    let e = agent.wait_event("request_failed", |f| f["rank"] == 3);
    assert!(e["reason"].as_str().unwrap().contains("bad request"), "{e}");
    assert!(dir.join("rank-3.error").exists());
    // No window was opened for either: the agent said so before the next one.
    let busy = Busy::spawn();
    request(&dir, 4, busy.pid(), "ok");
    agent.wait_event("window_started", |f| f["rank"] == 4);
    let names = agent.seen_names();
    assert_eq!(
        names.iter().filter(|n| *n == "window_started").count(),
        1,
        "{names:?}"
    );
    wait_for("pause", 5.0, || dir.join("whyslow.pause").exists());
}

#[test]
#[ignore = "system test (./scripts/test --all): the node agent serving live ranks"]
fn sigterm_writes_what_was_sampled_and_removes_the_pause_file() {
    let _g = serial();
    let _dir_guard = whyslow_testkit::temp_dir("term");
    let dir = _dir_guard.path().to_path_buf();
    let pause = dir.join("elsewhere.pause");
    let mut agent = Agent::spawn(&dir, &["--pause-file", pause.to_str().unwrap()]);
    let busy = Busy::spawn();
    request(&dir, 0, busy.pid(), "t");
    wait_for("the pause file elsewhere", 5.0, || pause.exists());
    assert!(!dir.join("whyslow.pause").exists());
    std::thread::sleep(Duration::from_millis(400));
    let st = agent.terminate();
    assert!(st.success(), "{st:?}");
    assert!(!pause.exists(), "pause file left after SIGTERM");
    let e = agent.wait_event("window_done", |f| f["rank"] == 0);
    assert_eq!(e["reason"], "agent stopped");
    let e = agent.wait_event("stopped", |_| true);
    assert_eq!(e["windows"], 1);
    let done = read_json(&dir.join("rank-0.done"));
    assert_eq!(done["reason"], "agent stopped");
    assert!(cpu_values(&dir.join("rank-0.samples.csv")).len() > 30);
}

#[test]
#[ignore = "system test (./scripts/test --all): the node agent serving live ranks"]
fn window_ends_when_the_process_exits() {
    let _g = serial();
    let _dir_guard = whyslow_testkit::temp_dir("exit");
    let dir = _dir_guard.path().to_path_buf();
    let _agent = Agent::spawn(&dir, &[]);
    let mut busy = Busy::spawn();
    request(&dir, 0, busy.pid(), "x");
    wait_for("pause", 5.0, || dir.join("whyslow.pause").exists());
    std::thread::sleep(Duration::from_millis(300));
    busy.0.kill().unwrap();
    busy.0.wait().unwrap();
    wait_for("done after exit", 5.0, || dir.join("rank-0.done").exists());
    assert_eq!(
        read_json(&dir.join("rank-0.done"))["reason"],
        "process exited"
    );
    wait_for("pause removed", 5.0, || !dir.join("whyslow.pause").exists());
}

#[test]
#[ignore = "system test (./scripts/test --all): the node agent serving live ranks"]
fn registered_processes_are_profiled_into_a_bounded_spool() {
    let _g = serial();
    let _dir_guard = whyslow_testkit::temp_dir("profile");
    let dir = _dir_guard.path().to_path_buf();
    let spool = dir.join("spool");
    let mut agent = Agent::spawn(
        &dir,
        &[
            "--profile-spool",
            spool.to_str().unwrap(),
            "--profile-period",
            "1",
        ],
    );
    let busy = Busy::spawn();
    let ticks = start_ticks(busy.pid());
    put(
        &dir,
        &format!("proc-{}.json", busy.pid()),
        &format!(
            r#"{{"pid": {}, "proc_start_ticks": {ticks}, "rank": 3, "local_rank": 1, "world_size": 8, "job": "job-a", "host": "h1"}}"#,
            busy.pid()
        ),
    );
    // A recycled pid (start time differs) and a bad file are not profiled.
    put(
        &dir,
        "proc-1.json",
        r#"{"pid": 1, "proc_start_ticks": 1, "job": "x"}"#,
    );
    put(&dir, "proc-2.json", "{\"pid\": -4}");
    let pid = busy.pid() as i64;
    agent.wait_event("profile_started", |f| f["pid"] == pid);
    let w = agent.wait_event("profile_written", |f| f["pid"] == pid);
    // Periods until the process had 20 samples in all: a loaded machine
    // gives it less CPU (a busy-core run saw 12 in one 1 s period).
    let until = Instant::now() + Duration::from_secs(120);
    let written = |seen: &[Value]| -> u64 {
        seen.iter()
            .filter(|e| e["fields"]["event"] == "profile_written" && e["fields"]["pid"] == pid)
            .map(|e| e["fields"]["samples"].as_u64().unwrap_or(0))
            .sum()
    };
    while written(&agent.seen) <= 20 {
        let left = until.saturating_duration_since(Instant::now());
        let e = agent
            .events
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("20 samples never profiled; saw {:#?}", agent.seen));
        agent.seen.push(e);
    }
    let path = PathBuf::from(w["path"].as_str().unwrap());
    assert!(path.starts_with(spool.join("job-a")), "{}", path.display());
    assert!(path
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("h1-rank3-pid"));
    let p = whyslow_stack_output::from_pprof(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(
        p.total(),
        w["samples"].as_u64().unwrap(),
        "the file holds what the event said"
    );
    for (k, v) in [("job", "job-a"), ("rank", "3"), ("host", "h1")] {
        assert_eq!(
            p.labels.get(k).map(String::as_str),
            Some(v),
            "{:?}",
            p.labels
        );
    }
    assert!(
        !agent
            .seen
            .iter()
            .any(|e| e["fields"]["event"] == "profile_started" && e["fields"]["pid"] == 1),
        "a recycled pid was profiled"
    );
    // The spool stays under its cap: the oldest profiles go.
    let removed = whyslow_agent::spool::enforce_cap(&spool, 0);
    assert!(removed >= 1);
    assert_eq!(fs::read_dir(spool.join("job-a")).unwrap().count(), 0);
    assert!(agent.terminate().success());
}

/// `--profile-host`: the eBPF sampler profiles every process, registered or
/// not; a busy process that never registered shows in the host profile under
/// its own process frame. Skips where BPF cannot load, unless
/// WHYSLOW_REQUIRE_BPF=1 (CI).
#[test]
#[ignore = "system test (./scripts/test --all): the node agent serving live ranks"]
fn the_host_profile_shows_a_process_that_never_registered() {
    let _g = serial();
    let _dir_guard = whyslow_testkit::temp_dir("profile-host");
    let dir = _dir_guard.path().to_path_buf();
    let spool = dir.join("spool");
    let busy = Busy::spawn();
    let mut agent = Agent::spawn(
        &dir,
        &[
            "--profile-spool",
            spool.to_str().unwrap(),
            "--profile-period",
            "2",
            "--profile-host",
        ],
    );
    let first = agent.wait_event("profile_started", |f| f["pid"] == 0);
    assert_eq!(first["job"], "host");
    // The first host profile, or the line saying why there is none. The
    // first period symbolizes every process seen (a debug build indexing a
    // busy machine's libtorch_cpu takes tens of seconds).
    let until = Instant::now() + Duration::from_secs(120);
    let w = loop {
        let done = agent.seen.iter().find(|e| {
            let f = &e["fields"];
            f["pid"] == 0 && (f["event"] == "profile_written" || f["event"] == "profile_failed")
        });
        if let Some(e) = done {
            let f = e["fields"].clone();
            if f["event"] == "profile_failed" {
                let why = f["reason"].as_str().unwrap_or("").to_string();
                if std::env::var("WHYSLOW_REQUIRE_BPF").as_deref() == Ok("1") {
                    panic!("host profile failed: {why}");
                }
                whyslow_testkit::skip(&why);
                return;
            }
            break f;
        }
        let left = until.saturating_duration_since(Instant::now());
        let e = agent
            .events
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no host profile; saw {:#?}", agent.seen));
        agent.seen.push(e);
    };
    let path = PathBuf::from(w["path"].as_str().unwrap());
    assert!(path.starts_with(spool.join("host")), "{}", path.display());
    let p = whyslow_stack_output::from_pprof(&fs::read(&path).unwrap()).unwrap();
    let tag = format!("[{}]", busy.pid());
    let of_busy: u64 = p
        .stacks
        .iter()
        .filter(|s| {
            s.frames
                .first()
                .and_then(|&i| p.frames[i as usize].name.as_deref())
                .is_some_and(|n| n.ends_with(&tag))
        })
        .map(|s| s.count)
        .sum();
    assert!(of_busy >= 20, "{of_busy} of {} samples", p.total());
    assert_eq!(p.labels.get("scope").map(String::as_str), Some("host"));
    assert!(agent.terminate().success());
}

/// The agent's own memory cap: over it, profiling stops with one event and
/// no profile is written, while the profiled process runs on untouched.
#[test]
#[ignore = "system test (./scripts/test --all): the node agent serving live ranks"]
fn over_its_memory_cap_the_agent_stops_profiling_and_the_job_runs_on() {
    let _g = serial();
    let _dir_guard = whyslow_testkit::temp_dir("capped");
    let dir = _dir_guard.path().to_path_buf();
    let spool = dir.join("spool");
    let mut agent = Agent::spawn(
        &dir,
        &[
            "--profile-spool",
            spool.to_str().unwrap(),
            "--profile-period",
            "1",
            "--max-rss-mib",
            "1",
        ],
    );
    let capped = agent.wait_event("capped", |f| f["what"] == "rss_mib");
    assert_eq!(capped["action"], "profiling stopped", "{capped}");
    assert!(capped["value"].as_f64().unwrap() > 1.0, "{capped}");
    let busy = Busy::spawn();
    let before = cpu_ticks(busy.pid());
    let ticks = start_ticks(busy.pid());
    put(
        &dir,
        &format!("proc-{}.json", busy.pid()),
        &format!(
            r#"{{"pid": {}, "proc_start_ticks": {ticks}, "rank": 0, "job": "job-c", "host": "h1"}}"#,
            busy.pid()
        ),
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(cpu_ticks(busy.pid()) > before, "the job stopped running");
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent exited"
    );
    assert!(agent.terminate().success());
    let written = agent
        .events
        .try_iter()
        .chain(agent.seen.iter().cloned())
        .filter(|e| {
            ["profile_started", "profile_written"]
                .contains(&e["fields"]["event"].as_str().unwrap_or(""))
        })
        .count();
    assert_eq!(written, 0, "a profiler started over the cap");
    // (The OS readings go on: *.os.jsonl.)
    let profiles = fs::read_dir(spool.join("job-c"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(profiles, 0, "the spool holds profiles");
}
