//! `whyslow diagnose` on profiles the agent really wrote (SysOM-AI §3.1):
//! four registered Python "ranks" of one job, profiled by `whyslow agent
//! --profile-spool`. Rank 2 does extra work from the start (above the CPU
//! waterline); every rank starts a costly per-iteration call half-way (the
//! temporal baseline's regression). Needs root for perf events (skips with
//! the reason otherwise).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

const RANK: &str = r#"
import os, sys, time
rank, seconds, regress_at = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
barrier, world = sys.argv[4], 4

def forward():
    s = 0
    for i in range(20000):
        s += i * i
    return s

def neighbour_work():
    s = 0
    for i in range(15000):
        s ^= i * 3
    return s

def log_tensor_stats():
    s = 0.0
    for i in range(12000):
        s += (i % 7) ** 0.5
    return s

def reached(phase):
    # A rank leaves a phase when every rank has had its CPU time in it, as
    # ranks of a real job move together through their collectives: on a
    # loaded machine each phase still holds enough samples of every rank,
    # and all ranks switch at the same wall-clock moment.
    open(os.path.join(barrier, f"{phase}-{rank}"), "w").close()
    return all(os.path.exists(os.path.join(barrier, f"{phase}-{r}")) for r in range(world))

def train():
    new_call = False
    while True:
        forward()
        if rank == 2:
            neighbour_work()
        if new_call:
            log_tensor_stats()
        cpu = time.process_time()
        if not new_call and cpu > regress_at and reached("regress"):
            new_call = True
        if new_call and cpu > seconds and reached("end"):
            return

print("ready", flush=True)
train()
"#;

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

use common::{perf_events_allowed, start_ticks};

/// `whyslow diagnose SPOOL --format json ARGS…`, which must succeed.
fn diagnose_json(spool: &Path, args: &[&std::ffi::OsStr]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .arg("diagnose")
        .arg(spool)
        .args(["--format", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "diagnose failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn diagnose(spool: &Path) -> Value {
    let svg = spool.join("diff.svg");
    diagnose_json(spool, &["--diff-svg".as_ref(), svg.as_os_str()])
}

#[test]
#[ignore = "system test (./scripts/test --all): node agents profiling live ranks"]
fn the_waterline_names_the_busy_rank_and_the_baseline_names_the_new_call() {
    if !perf_events_allowed() {
        whyslow_testkit::skip("perf events need root or perf_event_paranoid <= 1");
        return;
    }
    let _dir_guard = whyslow_testkit::temp_dir("job");
    let dir = _dir_guard.path().to_path_buf();
    let spool = dir.join("spool");
    let _agent = Kill(
        Command::new(env!("CARGO_BIN_EXE_whyslow"))
            .arg("agent")
            .arg("--samples-dir")
            .arg(&dir)
            .args(["--profile-period", "2", "--profile-spool"])
            .arg(&spool)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    // CPU seconds per rank, and when the new call starts: half-way, as far
    // as can be from both default ranges (the first and the last third of
    // the span). A window profile may reach up to half its period before the
    // window, and the ranks switch when the slowest of them gets there: with
    // the switch at 5 of 9 s, a loaded CI run's window held the new call at
    // 0.32 of the group's samples (0.38-0.43 in idle runs): pre-switch
    // periods, unevenly across ranks (rank 3 at 0.43 against its peers'
    // 0.29, flagged beside the injected work).
    let (seconds, regress_at) = (9.0, 4.5);
    let barrier = dir.join("barrier");
    fs::create_dir_all(&barrier).unwrap();
    let ranks: Vec<Kill> = (0..4)
        .map(|r| {
            let mut c = Command::new(&python)
                .args(["-c", RANK, &r.to_string(), &seconds.to_string(), &regress_at.to_string()])
                .arg(&barrier)
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufRead::read_line(
                &mut std::io::BufReader::new(c.stdout.as_mut().unwrap()),
                &mut line,
            )
            .unwrap();
            assert_eq!(line.trim(), "ready");
            let pid = c.id();
            fs::write(
                dir.join(format!("proc-{pid}.json")),
                format!(
                    r#"{{"pid": {pid}, "proc_start_ticks": {}, "rank": {r}, "local_rank": {r}, "world_size": 4, "job": "job-d", "host": "h0"}}"#,
                    start_ticks(pid)
                ),
            )
            .unwrap();
            Kill(c)
        })
        .collect();
    // Until the ranks end and the agent wrote their last profiles.
    let until = Instant::now() + Duration::from_secs(300);
    for mut r in ranks {
        while r.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < until, "a rank did not finish");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    std::thread::sleep(Duration::from_secs(3));
    let report = diagnose(&spool);
    let show = serde_json::to_string_pretty(&report).unwrap();
    assert_eq!(report["stragglers"], Value::Array(vec![]), "{show}");
    assert_eq!(report["layer"], "cpu", "{show}");
    // The temporal baseline: the new call is among the first regressions
    // (its native callees rise as much: the perf engine reads a thread's
    // Python stack just after the sample, and in a fraction of samples the
    // thread is back in its caller by then, so `pow` sits under `train`).
    let regs = report["regressions"].as_array().unwrap();
    let new_call = regs
        .iter()
        .take(3)
        .find(|r| {
            r["function"]
                .as_str()
                .unwrap_or("")
                .starts_with("log_tensor_stats")
        })
        .unwrap_or_else(|| panic!("log_tensor_stats is not among the first regressions: {show}"));
    assert!(new_call["before_share"].as_f64().unwrap() < 0.02, "{show}");
    assert!(new_call["after_share"].as_f64().unwrap() > 0.1, "{show}");
    // Nothing outside the new path rose: forward's share fell.
    assert!(
        regs.iter()
            .all(|r| !r["function"].as_str().unwrap_or("").starts_with("forward")),
        "{show}"
    );
    // The waterline: rank 2 and its extra work lead (flags come largest
    // excess first). Five CPU-bound processes on two cores are not alike: a
    // rank switched out more often spends measurably more in cache-cold
    // allocation (one busy run: rank 1 at 7.8 % in PyFloat_FromDouble
    // against its peers' 2.1 %, 20 samples against 5, the same in every
    // period). Such a flag is real but must stay small beside the injected
    // work.
    let diffs = report["cpu_diff"].as_array().unwrap();
    let excess =
        |d: &Value| d["straggler_share"].as_f64().unwrap() - d["peer_share"].as_f64().unwrap();
    let top = diffs
        .first()
        .unwrap_or_else(|| panic!("no waterline flag: {show}"));
    assert_eq!(top["rank"], 2, "{show}");
    assert!(
        diffs.iter().any(|d| d["rank"] == 2
            && d["function"]
                .as_str()
                .unwrap_or("")
                .starts_with("neighbour_work")),
        "{show}"
    );
    assert!(
        diffs
            .iter()
            .filter(|d| d["rank"] != 2)
            .all(|d| excess(d) < excess(top) / 2.0),
        "another rank's excess is as large as the injected one: {show}"
    );
    let svg = fs::read_to_string(spool.join("diff.svg")).unwrap();
    assert!(
        svg.contains("log_tensor_stats"),
        "the differential flame graph shows the new call"
    );
}

/// Collective records alone: the late rank is named; a bad line is skipped
/// with a note; a directory with nothing to diagnose is an error that says
/// what was looked for.
#[test]
#[ignore = "system test (./scripts/test --all): node agents profiling live ranks"]
fn collective_records_name_the_late_rank_and_bad_input_is_reported() {
    let _dir_guard = whyslow_testkit::temp_dir("collectives");
    let dir = _dir_guard.path().to_path_buf();
    let mut lines = String::new();
    for k in 0..60u64 {
        let t = 1_000_000_000 + k * 50_000_000; // ns, a step every 50 ms
        for rank in 0..4u64 {
            // Rank 3's clock is 20 ms ahead; rank 1 enters 6 ms late.
            let skew = if rank == 3 { 20_000_000 } else { 0 };
            let late = if rank == 1 { 6_000_000 } else { 0 };
            let jitter = (k * 7919 + rank * 104_729) % 200_000;
            let entry = t + late + jitter + skew;
            let exit = t + 6_000_000 + 3_000_000 + (rank * 10_000) + skew;
            lines.push_str(&format!(
                r#"{{"rank": {rank}, "group": "dp0", "op": "allreduce", "seq": {k}, "entry_ns": {entry}, "exit_ns": {exit}, "bytes": 1048576, "source": "test"}}"#
            ));
            lines.push('\n');
        }
    }
    lines.push_str("{\"rank\": \"x\"}\n");
    fs::create_dir_all(dir.join("h0")).unwrap();
    fs::write(dir.join("h0").join("job.collectives.jsonl"), lines).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .arg("diagnose")
        .arg(&dir)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let show = serde_json::to_string_pretty(&report).unwrap();
    let s = report["stragglers"].as_array().unwrap();
    assert_eq!(s.len(), 1, "{show}");
    assert_eq!(s[0]["rank"], 1, "{show}");
    assert_eq!(s[0]["group"], "dp0", "{show}");
    let late = s[0]["late_us"].as_f64().unwrap();
    assert!((5_000.0..7_000.0).contains(&late), "{show}");
    let notes = report["notes"].to_string();
    assert!(
        notes.contains("job.collectives.jsonl: 1 line(s) skipped (line 241"),
        "{show}"
    );

    let _empty_guard = whyslow_testkit::temp_dir("empty");

    let empty = _empty_guard.path().to_path_buf();
    let out = Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .arg("diagnose")
        .arg(&empty)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nothing to diagnose") && err.contains("*.collectives.jsonl"),
        "{err}"
    );
}

/// 300 all-reduces of ranks 0-3 from `t0`, one per 100 ms: each rank
/// enters `late(rank)` ns after the instance's start (plus < 0.2 ms of
/// jitter), and all leave `exit_ns` after it.
fn four_rank_collectives(t0: u64, exit_ns: u64, late: impl Fn(u64) -> u64) -> String {
    let mut lines = String::new();
    for k in 0..300u64 {
        let t = t0 + k * 100_000_000;
        for rank in 0..4u64 {
            let jitter = (k * 7919 + rank * 104_729) % 200_000;
            lines.push_str(&format!(
                "{{\"rank\": {rank}, \"global_rank\": {rank}, \"group\": \"j/gloo4#0\", \"op\": \"allreduce\", \"seq\": {k}, \"entry_ns\": {}, \"exit_ns\": {}, \"source\": \"test\"}}\n",
                t + late(rank) + jitter,
                t + exit_ns + rank * 10_000
            ));
        }
    }
    lines
}

/// Collective records where rank 1 enters 15 ms late (of 100 ms per
/// collective: above the 10 % floor), and OS readings of the
/// four ranks (30 s, one per second); `flood` raises rank 1's NET_RX
/// softirqs per CPU-second.
fn late_rank_spool(name: &str, flood: f64) -> PathBuf {
    // Returned to the caller: kept (the caller's run reads it).
    let dir = whyslow_testkit::temp_dir(name).keep();
    fs::create_dir_all(dir.join("h0")).unwrap();
    let t0: u64 = 1_795_000_000_000_000_000;
    let lines = four_rank_collectives(
        t0,
        18_000_000,
        |rank| {
            if rank == 1 {
                15_000_000
            } else {
                0
            }
        },
    );
    fs::write(dir.join("h0").join("job.collectives.jsonl"), lines).unwrap();
    let mut os = String::new();
    for s in 0..30u64 {
        for rank in 0..4u64 {
            let j = ((s * 31 + rank * 17) % 10) as f64;
            let net_rx = if rank == 1 { flood } else { 900.0 + 20.0 * j };
            os.push_str(&format!(
                "{{\"job\": \"j\", \"host\": \"h0\", \"rank\": {rank}, \"pid\": {}, \"start_unix_ns\": {}, \"duration_ns\": 1000000000, \"cpus\": [{rank}], \"signals\": {{\"cpu_ms_per_s\": {}, \"runqueue_delay_ms_per_s\": {}, \"softirq_NET_RX_per_cpu_s\": {net_rx}, \"softirq_TIMER_per_cpu_s\": {}}}}}\n",
                100 + rank,
                t0 + s * 1_000_000_000,
                600.0 + 5.0 * j,
                4.0 + j / 5.0,
                250.0 + j
            ));
        }
    }
    fs::write(dir.join("h0").join("job.os.jsonl"), os).unwrap();
    dir
}

fn diagnose_html(dir: &Path) -> (Value, String) {
    let html = dir.join("report.html");
    let out = Command::new(env!("CARGO_BIN_EXE_whyslow"))
        .arg("diagnose")
        .arg(dir)
        .args(["--format", "json", "--html"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        fs::read_to_string(html).unwrap(),
    )
}

#[test]
#[ignore = "system test (./scripts/test --all): node agents profiling live ranks"]
fn a_late_ranks_softirq_load_is_the_os_layer_and_plain_lateness_is_unexplained() {
    // NET_RX at 5x to 50x the peers' on the late rank's CPU: layer os, the
    // softirq named; the page plots the entries with rank 1 flagged.
    for flood in [5_000.0, 50_000.0] {
        let dir = late_rank_spool(&format!("softirq-{flood}"), flood);
        let (report, html) = diagnose_html(&dir);
        let show = serde_json::to_string_pretty(&report).unwrap();
        assert_eq!(report["stragglers"][0]["rank"], 1, "{show}");
        assert_eq!(report["layer"], "os", "{show}");
        let os = report["os_diff"].as_array().unwrap();
        assert_eq!(os.len(), 1, "{show}");
        assert_eq!(os[0]["signal"], "softirq_NET_RX_per_cpu_s", "{show}");
        assert_eq!(os[0]["rank"], 1, "{show}");
        assert!(html.contains("rank 1 (flagged)") && html.contains("<polyline"));
        // Issue 46: the page leads with the verdict, the layer and the
        // measure that decided it, before the plots and the tables.
        let verdict = html.find("class=\"verdict slow\"").expect("a verdict card");
        assert!(
            verdict < html.find("Entry into collectives").unwrap(),
            "{html}"
        );
        assert!(
            html[verdict..]
                .starts_with("class=\"verdict slow\" aria-label=\"verdict\"><p class=\"headline\">Rank 1 is late")
                && html.contains("Layer: <b>os</b> — softirq_NET_RX_per_cpu_s on rank 1: "),
            "{}",
            &html[verdict..verdict + 600]
        );
    }
    // The same lateness with ordinary OS readings: no layer whyslow sees
    // explains it, and the report says so instead of naming one.
    let dir = late_rank_spool("no-os-cause", 1_000.0);
    let (report, _) = diagnose_html(&dir);
    let show = serde_json::to_string_pretty(&report).unwrap();
    assert_eq!(report["stragglers"][0]["rank"], 1, "{show}");
    assert_eq!(report["layer"], "none", "{show}");
    assert!(report["os_diff"].as_array().unwrap().is_empty(), "{show}");
    assert!(
        report["notes"]
            .to_string()
            .contains("a layer not seen here"),
        "{show}"
    );
}

/// Collective records of 4 ranks, nobody late, and OS readings (30 s, one
/// per second) with the TCP counters of each rank's network namespace (one
/// per rank, all on host name "node"): rank r resends `loss[r].0` % of the
/// segments it sends and receives `loss[r].1` % out of order; `None` leaves
/// the counters out (an older agent).
fn tcp_spool(name: &str, loss: Option<[(f64, f64); 4]>) -> PathBuf {
    // Returned to the caller: kept (the caller's run reads it).
    let dir = whyslow_testkit::temp_dir(name).keep();
    fs::create_dir_all(dir.join("node")).unwrap();
    let t0: u64 = 1_795_000_000_000_000_000;
    let lines = four_rank_collectives(t0, 60_000_000, |_| 0);
    fs::write(dir.join("node").join("job.collectives.jsonl"), lines).unwrap();
    let mut os = String::new();
    for s in 0..30u64 {
        for rank in 0..4u64 {
            let j = ((s * 31 + rank * 17) % 10) as f64;
            let segs = 3_000.0 + 100.0 * j;
            let tcp = match loss {
                Some(l) => {
                    let (re, ofo) = l[rank as usize];
                    format!(
                        ", \"tcp_out_segs_per_s\": {segs}, \"tcp_retrans_segs_per_s\": {}, \"tcp_in_segs_per_s\": {segs}, \"tcp_ofo_queued_per_s\": {}",
                        segs * re / 100.0,
                        segs * ofo / 100.0
                    )
                }
                None => String::new(),
            };
            os.push_str(&format!(
                "{{\"job\": \"j\", \"host\": \"node\", \"rank\": {rank}, \"pid\": {}, \"netns\": {}, \"start_unix_ns\": {}, \"duration_ns\": 1000000000, \"cpus\": [{rank}], \"signals\": {{\"cpu_ms_per_s\": {}, \"runqueue_delay_ms_per_s\": 4.0{tcp}}}}}\n",
                100 + rank,
                4_026_532_000 + rank,
                t0 + s * 1_000_000_000,
                600.0 + 5.0 * j,
            ));
        }
    }
    fs::write(dir.join("node").join("job.os.jsonl"), os).unwrap();
    dir
}

#[test]
#[ignore = "system test (./scripts/test --all): node agents profiling live ranks"]
fn the_hosts_that_lose_tcp_segments_are_the_network_layer_and_healthy_tcp_is_silent() {
    // A ring where rank r+1 sends to rank r. Loss into rank 1: rank 2
    // resends, rank 1 receives out of order. Both ways on rank 1's link:
    // rank 1 resends as well and rank 0 receives out of order. Nobody is
    // late; the layer is the network, and each host is named by its side.
    for (pct, both_ways) in [(1.5, false), (2.0, false), (2.0, true), (10.0, true)] {
        let mut l = [(0.02, 0.0), (0.01, 4.0 * pct), (pct, 0.05), (0.05, 0.0)];
        if both_ways {
            l[1].0 = pct;
            l[0].1 = 4.0 * pct * 0.9;
        }
        let dir = tcp_spool(&format!("tcp-{pct}-{both_ways}"), Some(l));
        let report = diagnose(&dir);
        let show = serde_json::to_string_pretty(&report).unwrap();
        assert_eq!(report["stragglers"].as_array().unwrap().len(), 0, "{show}");
        assert_eq!(report["layer"], "network", "{show}");
        let net = report["network_diff"].as_array().unwrap();
        let mut sides: Vec<(String, String)> = net
            .iter()
            .map(|h| {
                (
                    h["ranks"].to_string(),
                    h["side"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let mut expect = vec![
            (
                "[1]".to_string(),
                if both_ways { "both" } else { "receives" }.to_string(),
            ),
            ("[2]".to_string(), "sends".to_string()),
        ];
        if both_ways {
            expect.push(("[0]".to_string(), "receives".to_string()));
        }
        sides.sort();
        expect.sort();
        assert_eq!(sides, expect, "{show}");
        assert_eq!(net[0]["host"], "node net:[4026532001]", "{show}");
        assert!(
            (net[0]["out_of_order"]["pct"].as_f64().unwrap() - 4.0 * pct).abs() < 1e-6,
            "{show}"
        );
        // The ends that receive out of order stand out; the sender, whose
        // resends they explain, is named without standing out.
        for h in net {
            assert_eq!(h["stands_out"], h["side"] != "sends", "{show}");
        }
        assert!(
            report["notes"]
                .to_string()
                .contains("several hosts lose TCP segments"),
            "{show}"
        );
    }
    // Healthy TCP (what the testbed's healthy runs show: up to 0.2 %
    // resent, 0.35 % out of order): no network finding, no layer.
    let dir = tcp_spool(
        "tcp-healthy",
        Some([(0.18, 0.19), (0.13, 0.33), (0.15, 0.17), (0.14, 0.35)]),
    );
    let report = diagnose(&dir);
    let show = serde_json::to_string_pretty(&report).unwrap();
    assert_eq!(report["layer"], "none", "{show}");
    assert!(
        report["network_diff"].as_array().unwrap().is_empty(),
        "{show}"
    );
    // An agent that did not read the counters: the layer is not judged, and
    // the report says so.
    let dir = tcp_spool("tcp-absent", None);
    let report = diagnose(&dir);
    let show = serde_json::to_string_pretty(&report).unwrap();
    assert_eq!(report["layer"], "none", "{show}");
    assert!(
        report["notes"]
            .to_string()
            .contains("the network layer is not judged"),
        "{show}"
    );
}

/// Fingerprints of ranks 0-3 from a real GPU trace (`kineto/single/NAME`),
/// each with ±3 % noise of its own; `slow(rank, i)` gives the extra time
/// (a fraction of the execution's duration) of a rank's executions of the
/// i-th heaviest GPU kernel.
fn gpu_fingerprints(dir: &Path, name: &str, slow: impl Fn(u32, usize) -> f64) {
    use whyslow_model::FunctionKind;
    use whyslow_replay::{function_ids, replica, Noise, NoiseMode};
    let base =
        whyslow_ingest::read_kineto(&common::fixtures().unwrap().join("kineto/single").join(name))
            .expect("fixture trace loads");
    // Kernels heaviest first (by device time in the trace).
    let mut kernels = function_ids(&base, FunctionKind::GpuKernel);
    assert!(kernels.len() > 3, "{name}: too few GPU kernels to judge");
    let time = |k: &whyslow_model::FunctionId| -> i64 {
        base.executions
            .iter()
            .filter(|e| e.function == *k)
            .map(|e| e.dur_ns())
            .sum()
    };
    kernels.sort_by_key(|k| std::cmp::Reverse(time(k)));
    fs::create_dir_all(dir).unwrap();
    for rank in 0..4u32 {
        let noise = Noise {
            amount: 0.03,
            mode: NoiseMode::Shift,
            seed: 7,
        };
        let mut t = replica(&base, rank, &noise);
        // Device time stretched in place: a slower kernel ends later on
        // its stream; what the host did does not move.
        for e in t.executions.iter_mut() {
            if let Some(i) = kernels.iter().position(|k| *k == e.function) {
                e.end_ns += (e.dur_ns() as f64 * slow(rank, i)) as i64;
            }
        }
        let fp = whyslow_summarize::summarize(&t, &Default::default(), &Default::default());
        whyslow_ingest::write_fingerprint(&dir.join(format!("rank-{rank}.json")), &fp).unwrap();
    }
}

fn diagnose_with(spool: &Path, fingerprints: &Path) -> Value {
    diagnose_json(
        spool,
        &["--fingerprints".as_ref(), fingerprints.as_os_str()],
    )
}

#[test]
#[ignore = "system test (./scripts/test --all): node agents profiling live ranks"]
fn a_late_ranks_slower_gpu_kernels_are_the_gpu_layer_uniform_or_specific() {
    // Real traces of three GPUs; rank 1 enters its collectives 15 ms late.
    for trace in [
        "a100-nccl-rank0of2.json.gz",
        "h100-qwen-0.5b.json.gz",
        "b200-eager-rank0of8.json.gz",
    ] {
        let dir = late_rank_spool(&format!("gpu-{trace}"), 1_000.0);
        // Every kernel of rank 1 1.3x-1.6x slower (clocks held down): uniform.
        for x in [0.3, 0.6] {
            let fps = dir.join(format!("uniform-{x}"));
            gpu_fingerprints(&fps, trace, |r, _| if r == 1 { x } else { 0.0 });
            let report = diagnose_with(&dir, &fps);
            let show = serde_json::to_string_pretty(&report).unwrap();
            assert_eq!(report["layer"], "gpu", "{trace} x{x}: {show}");
            let g = &report["gpu_diff"][0];
            assert_eq!(g["rank"], 1, "{show}");
            assert_eq!(g["pattern"], "uniform", "{show}");
            let ratio = g["overall_ratio"].as_f64().unwrap();
            assert!((ratio - (1.0 + x)).abs() < 0.15, "{show}");
            assert_eq!(report["gpu_diff"].as_array().unwrap().len(), 1, "{show}");
        }
        // The second-heaviest kernel 3x slower on rank 1, the rest at their
        // pace: specific, that kernel named.
        let fps = dir.join("specific");
        gpu_fingerprints(&fps, trace, |r, i| if r == 1 && i == 1 { 2.0 } else { 0.0 });
        let report = diagnose_with(&dir, &fps);
        let show = serde_json::to_string_pretty(&report).unwrap();
        let g = &report["gpu_diff"];
        assert_eq!(report["layer"], "gpu", "{trace}: {show}");
        assert_eq!(g[0]["pattern"], "specific", "{trace}: {show}");
        assert_eq!(g[0]["kernels"].as_array().unwrap().len(), 1, "{show}");
        let r = g[0]["kernels"][0]["ratio"].as_f64().unwrap();
        assert!((2.6..3.4).contains(&r), "{show}");
        // Healthy kernels everywhere: the GPU layer names nothing and the
        // lateness stays unexplained.
        let fps = dir.join("healthy");
        gpu_fingerprints(&fps, trace, |_, _| 0.0);
        let report = diagnose_with(&dir, &fps);
        let show = serde_json::to_string_pretty(&report).unwrap();
        assert!(
            report["gpu_diff"].as_array().unwrap().is_empty(),
            "{trace}: {show}"
        );
        assert_eq!(report["layer"], "none", "{trace}: {show}");
    }
    // Without kernel times the report says the GPU layer was not judged.
    // (--diff-svg without rank profiles: the SVG is skipped with a line,
    // the report still comes.)
    let dir = late_rank_spool("gpu-none", 1_000.0);
    let report = diagnose(&dir);
    assert!(
        report["notes"]
            .to_string()
            .contains("the GPU layer is not judged"),
        "{report}"
    );
}

/// A spool where every rank starts a new call at `onset_s` of 40 s and
/// the collectives come 1.5x slower from then: 4 ranks, CPU profiles of 2 s.
fn regression_spool(name: &str, onset_s: u64) -> PathBuf {
    use whyslow_model::stack::{Frame, FrameKind, StackProfileBuilder};
    // Returned to the caller: kept (the caller's run reads it).
    let dir = whyslow_testkit::temp_dir(name).keep();
    let h = dir.join("h0");
    fs::create_dir_all(&h).unwrap();
    let t0: u64 = 1_795_000_000_000_000_000;
    let onset = t0 + onset_s * 1_000_000_000;
    let mut lines = String::new();
    let (mut t, mut k) = (t0, 0u64);
    while t < t0 + 40_000_000_000 {
        for rank in 0..4u64 {
            let jitter = (k * 7919 + rank * 104_729) % 300_000;
            lines.push_str(&format!(
                "{{\"rank\": {rank}, \"global_rank\": {rank}, \"group\": \"j/gloo4#0\", \"op\": \"allreduce\", \"seq\": {k}, \"entry_ns\": {}, \"exit_ns\": {}, \"source\": \"test\"}}\n",
                t + jitter,
                t + 2_000_000
            ));
        }
        t += if t < onset { 30_000_000 } else { 45_000_000 };
        k += 1;
    }
    fs::write(h.join("job.collectives.jsonl"), lines).unwrap();
    let py = |name: &str| Frame {
        kind: FrameKind::Python,
        name: Some(name.into()),
        module: Some("train.py".into()),
        build_id: None,
        offset: 0,
        line: Some(1),
    };
    for rank in 0..4u32 {
        for p in 0..20u64 {
            let start = t0 + p * 2_000_000_000;
            let mut b = StackProfileBuilder::new();
            let main = b.frame(py("main"));
            let fwd = b.frame(py("forward"));
            let log = b.frame(py("log_tensor_stats"));
            let after = start >= onset;
            b.add(vec![main, fwd], 200);
            if after {
                b.add(vec![main, log], 100);
            }
            b.label("rank", rank.to_string());
            b.label("job", "j");
            b.label("host", "h0");
            let prof = b.finish(99.0, start, 2_000_000_000);
            fs::write(
                h.join(format!("h0-rank{rank}-{p}.pb.gz")),
                whyslow_stack_output::to_pprof(&prof),
            )
            .unwrap();
        }
    }
    dir
}

#[test]
#[ignore = "system test (./scripts/test --all): node agents profiling live ranks"]
fn the_baseline_ends_where_the_collectives_came_slower() {
    // Onsets before, at and after the first third (13.3 s): the baseline
    // ends at the onset, so the new call is not in it, and it comes first.
    for onset in [9u64, 14, 22] {
        let dir = regression_spool(&format!("onset-{onset}"), onset);
        let report = diagnose_json(&dir, &[]);
        let show = serde_json::to_string_pretty(&report).unwrap();
        let b = report["baseline"][1].as_f64().unwrap();
        assert!((b - onset as f64).abs() < 1.5, "onset {onset}: {show}");
        let r = &report["regressions"][0];
        assert!(
            r["function"]
                .as_str()
                .unwrap()
                .starts_with("log_tensor_stats"),
            "onset {onset}: {show}"
        );
        assert!(
            r["before_share"].as_f64().unwrap() < 0.01,
            "onset {onset}: {show}"
        );
        assert!(
            report["notes"].to_string().contains("came slower from"),
            "{show}"
        );
    }
}
