//! `whyslow agent --samples-dir DIR`: the privileged sampling sidecar.
//!
//! PerfTracker §5 runs profiling inside the unprivileged training container,
//! while hardware counters (and other processes' `/proc` files) need a
//! privileged monitor next to it; the two share a Kubernetes `emptyDir`.
//! EROICA (slides: "sidecar metrics") adds that such a monitor must co-exist
//! with the cluster's other monitors (e.g. DCGM holding the same profiling
//! counters): while whyslow profiles, those step aside.
//!
//! The agent polls DIR (every `--poll-ms`, 50 ms by default; plain `std`, no
//! inotify) for sampling requests written by the training ranks, runs one
//! [`Sampler`] thread per requesting rank, and writes the samples back into
//! DIR. While any window is active it holds a pause file telling other
//! monitors to step aside. The file protocol is specified in `docs/agent.md`:
//!
//! - rank → agent: `rank-<r>.request.json` (written atomically: tmp + rename)
//!   at window start; `rank-<r>.stop` at window end;
//! - agent → rank: `rank-<r>.samples.csv` and `rank-<r>.sampler-extra.csv`
//!   (atomically), then `rank-<r>.done` (JSON), or `rank-<r>.error` (one
//!   line) when the request cannot be served;
//! - agent → other monitors: `whyslow.pause` (or `--pause-file`), JSON
//!   `{who, why, pid, ranks, since_unix_s, until_unix_s}`, present exactly
//!   while a window is active; optional `--pause-cmd` / `--resume-cmd` hooks.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;

use crate::events::{init_logging, AgentEvent};
use crate::registry::proc_start_ticks;
use crate::spool::tmp_path;
use whyslow_model::wire::{AgentDone, AgentRequest};
use whyslow_sampler::{NetInterface, Sampler, SamplerConfig, Samples, TimeBase};

#[derive(Args, Debug)]
pub struct AgentArgs {
    /// Directory shared with the training processes (e.g. a Kubernetes emptyDir).
    #[arg(long, value_name = "DIR")]
    samples_dir: PathBuf,
    /// Pause file held while a window is active (default: DIR/whyslow.pause).
    #[arg(long, value_name = "PATH")]
    pause_file: Option<PathBuf>,
    /// Shell command run (sh -c) when the first window starts, e.g. to stop
    /// dcgm-exporter's profiling metrics.
    #[arg(long, value_name = "CMD")]
    pause_cmd: Option<String>,
    /// Shell command run (sh -c) when the last window ends.
    #[arg(long, value_name = "CMD")]
    resume_cmd: Option<String>,
    /// Longest a hook may run before it is killed, seconds.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    hook_timeout: f64,
    /// Longest window, seconds (a rank that never writes its stop file).
    #[arg(long, default_value_t = 600.0, value_name = "SECONDS")]
    max_window: f64,
    /// How often DIR is polled, milliseconds.
    #[arg(long, default_value_t = 50, value_name = "MS")]
    poll_ms: u64,
    /// `text`: one line per event for people; `json`: one JSON object per
    /// event (its name in `fields.event`) for supervisors and tests.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(flatten)]
    profiler: crate::profiler::ProfilerArgs,
    #[command(flatten)]
    caps: crate::governor::CapArgs,
}

/// How the agent writes its events to stderr.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per event.
    Text,
    /// One JSON object per line.
    Json,
}

/// `rank-<r>.request.json` (docs/agent.md), typed in `whyslow_model::wire`.
type Request = AgentRequest;

struct Window {
    req: Request,
    sampler: Sampler,
    deadline: Instant,
    until_unix_s: f64,
    start_ticks: Option<u64>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Writes `bytes` to `path` atomically (tmp + rename, [`crate::spool`]).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::spool::write_atomic(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// The rank of `rank-<r>.<suffix>`.
fn rank_of(name: &str, suffix: &str) -> Option<u32> {
    name.strip_prefix("rank-")?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

struct Agent {
    dir: PathBuf,
    pause_file: PathBuf,
    args: AgentArgs,
    active: BTreeMap<u32, Window>,
    /// `Some(since_unix_s)` while the pause file is held.
    paused_since: Option<f64>,
    /// The ranks the pause file was last written for.
    paused_ranks: Vec<u32>,
}

impl Agent {
    fn path(&self, rank: u32, suffix: &str) -> PathBuf {
        self.dir.join(format!("rank-{rank}{suffix}"))
    }

    /// Startup: stale temporary files, stop files without a window, and a
    /// pause file left by an agent that died are removed; requests already
    /// present are served on the first poll (their process is checked then).
    fn clean_stale(&mut self) -> Result<()> {
        for e in fs::read_dir(&self.dir)
            .with_context(|| format!("reading {}", self.dir.display()))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let stale = (name.starts_with(".rank-") && name.ends_with(".tmp"))
                || rank_of(&name, ".stop").is_some();
            if stale {
                AgentEvent::StaleRemoved { name }.emit();
                let _ = fs::remove_file(e.path());
            }
        }
        if self.pause_file.exists() {
            AgentEvent::StaleRemoved {
                name: self.pause_file.display().to_string(),
            }
            .emit();
            let _ = fs::remove_file(&self.pause_file);
        }
        Ok(())
    }

    fn write_error(&self, rank: u32, msg: &str) {
        // The error file first: the event says the rank has been told.
        let line = format!("{}\n", msg.replace('\n', " "));
        if let Err(e) = write_atomic(&self.path(rank, ".error"), line.as_bytes()) {
            AgentEvent::ErrorFileFailed {
                rank,
                error: format!("{e:#}"),
            }
            .emit();
        }
        AgentEvent::RequestFailed { rank, reason: msg }.emit();
    }

    /// Reads, removes and validates one request; `Err(message)` for the
    /// rank's error file.
    fn take_request(&self, rank: u32, path: &Path) -> Result<Request, String> {
        let text = fs::read_to_string(path).map_err(|e| format!("reading request: {e}"));
        let _ = fs::remove_file(path);
        let req = Request::from_json(&text?).map_err(|e| format!("bad request: {e}"))?;
        if let Some(r) = req.rank {
            if r != rank {
                return Err(format!("request names rank {r} in the file of rank {rank}"));
            }
        }
        if !(1.0..=10_000.0).contains(&req.rate_hz) {
            return Err(format!("rate_hz {} outside 1..=10000", req.rate_hz));
        }
        if req.pid <= 0 || !Path::new(&format!("/proc/{}", req.pid)).is_dir() {
            return Err(format!(
                "process {} not found (exited, or in another PID namespace: \
                 share the pod's process namespace)",
                req.pid
            ));
        }
        if let Some(want) = req.proc_start_ticks {
            if proc_start_ticks(req.pid) != Some(want) {
                return Err(format!(
                    "pid {} is not the requesting process (start time differs: \
                     another PID namespace, or the pid was reused)",
                    req.pid
                ));
            }
        }
        Ok(req)
    }

    fn start_window(&mut self, rank: u32, req: Request) {
        let mut interfaces = Vec::new();
        for spec in &req.interfaces {
            match spec.parse::<NetInterface>() {
                Ok(i) => interfaces.push(i),
                Err(e) => return self.write_error(rank, &format!("{e:#}")),
            }
        }
        let cfg = SamplerConfig {
            rate_hz: req.rate_hz,
            pid: Some(req.pid),
            training_tid: req.tid,
            interfaces,
            gpu: req.gpu_index.is_some(),
            gpu_index: req.gpu_index.unwrap_or(0),
            time_base: if req.time_base_ns != 0 {
                TimeBase::KinetoBase {
                    base_ns: req.time_base_ns,
                }
            } else {
                TimeBase::UnixEpoch
            },
            ..SamplerConfig::default()
        };
        let sampler = match Sampler::start(cfg) {
            Ok(s) => s,
            Err(e) => return self.write_error(rank, &format!("sampler: {e}")),
        };
        let now = unix_now();
        let until = req
            .until_unix_s
            .filter(|u| u.is_finite())
            .unwrap_or(f64::INFINITY)
            .min(now + self.args.max_window);
        let deadline = Instant::now() + Duration::from_secs_f64((until - now).max(0.0));
        AgentEvent::WindowStarted {
            rank,
            pid: req.pid,
            tid: req.tid.unwrap_or(req.pid),
            rate_hz: req.rate_hz,
            request: req.id.as_deref(),
        }
        .emit();
        let start_ticks = proc_start_ticks(req.pid);
        self.active.insert(
            rank,
            Window {
                req,
                sampler,
                deadline,
                until_unix_s: until,
                start_ticks,
            },
        );
    }

    /// Stops a window and writes its samples, extra file and done marker.
    fn finish(&mut self, rank: u32, reason: &str) {
        let Some(w) = self.active.remove(&rank) else {
            return;
        };
        let samples = match w.sampler.stop() {
            Ok(s) => s,
            Err(e) => return self.write_error(rank, &format!("sampler: {e}")),
        };
        match self.write_samples(rank, &w.req, &samples, reason) {
            Ok(()) => AgentEvent::WindowDone {
                rank,
                ticks: samples.stats.ticks,
                achieved_hz: samples.stats.achieved_hz(),
                reason,
            }
            .emit(),
            Err(e) => self.write_error(rank, &format!("{e:#}")),
        }
    }

    fn write_samples(&self, rank: u32, req: &Request, s: &Samples, reason: &str) -> Result<()> {
        let samples = self.path(rank, ".samples.csv");
        let extra = whyslow_sampler::extra_path_for(&samples);
        let worker = Some(req.rank.unwrap_or(rank));
        let tmp = tmp_path(&samples);
        whyslow_sampler::write_samples_csv(&tmp, worker, &s.series)?;
        fs::rename(&tmp, &samples).with_context(|| format!("renaming to {}", samples.display()))?;
        let tmp = tmp_path(&extra);
        whyslow_sampler::write_extra_csv(&tmp, worker, s)?;
        fs::rename(&tmp, &extra).with_context(|| format!("renaming to {}", extra.display()))?;
        let st = &s.stats;
        let done = AgentDone {
            id: req.id.clone(),
            rank,
            pid: req.pid,
            reason: reason.to_string(),
            samples: samples
                .file_name()
                .map(|n| n.to_string_lossy().into_owned()),
            extra: extra.file_name().map(|n| n.to_string_lossy().into_owned()),
            time_base_ns: req.time_base_ns,
            series: s
                .series
                .iter()
                .filter(|(_, v)| !v.ts_ns.is_empty())
                .map(|(r, _)| r.as_str().to_string())
                .collect(),
            ticks: st.ticks,
            overruns: st.overruns,
            achieved_hz: st.achieved_hz(),
            elapsed_s: st.elapsed_ns as f64 / 1e9,
            sampler_cpu_fraction: st.sampler_cpu_fraction(),
            notes: s.notes.clone(),
        };
        let done = serde_json::to_string(&done)?;
        write_atomic(&self.path(rank, ".done"), format!("{done}\n").as_bytes())
    }

    /// Runs a hook with `sh -c`, bounded by `--hook-timeout`; failures log.
    fn hook(&self, what: &str, cmd: &Option<String>, ranks: &[u32]) {
        let Some(cmd) = cmd else { return };
        let ranks = ranks
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let child = Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .env("WHYSLOW_PAUSE_FILE", &self.pause_file)
            .env("WHYSLOW_ACTIVE_RANKS", &ranks)
            .stdin(Stdio::null())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                return AgentEvent::HookFailed {
                    hook: what,
                    problem: format!("not run: {e}"),
                }
                .emit()
            }
        };
        let started = Instant::now();
        let until = started + Duration::from_secs_f64(self.args.hook_timeout.max(0.0));
        loop {
            match child.try_wait() {
                Ok(Some(st)) if st.success() => {
                    return AgentEvent::HookRan {
                        hook: what,
                        seconds: started.elapsed().as_secs_f64(),
                    }
                    .emit()
                }
                Ok(Some(st)) => {
                    return AgentEvent::HookFailed {
                        hook: what,
                        problem: format!("failed: {st}"),
                    }
                    .emit()
                }
                Ok(None) if Instant::now() >= until => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return AgentEvent::HookFailed {
                        hook: what,
                        problem: format!("killed after {} s", self.args.hook_timeout),
                    }
                    .emit();
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => {
                    return AgentEvent::HookFailed {
                        hook: what,
                        problem: e.to_string(),
                    }
                    .emit()
                }
            }
        }
    }

    fn write_pause_file(&self, since: f64, ranks: &[u32], until: f64) {
        let body = json!({
            "who": "whyslow agent",
            "why": "profiling window: the PyTorch profiler and whyslow's sampler are reading \
                    hardware counters; monitors that read conflicting counters (e.g. DCGM \
                    profiling fields) should step aside until this file is removed",
            "pid": std::process::id(),
            "ranks": ranks,
            "since_unix_s": since,
            "until_unix_s": until.is_finite().then_some(until),
        });
        if let Err(e) = write_atomic(&self.pause_file, format!("{body}\n").as_bytes()) {
            AgentEvent::PauseFileFailed {
                problem: format!("{e:#}"),
            }
            .emit();
        }
    }

    /// Brings the pause file (and hooks) in line with the active windows.
    fn update_pause(&mut self) {
        let ranks: Vec<u32> = self.active.keys().copied().collect();
        let until = self
            .active
            .values()
            .map(|w| w.until_unix_s)
            .fold(f64::NEG_INFINITY, f64::max);
        match (self.paused_since, ranks.is_empty()) {
            (None, false) => {
                let since = unix_now();
                self.write_pause_file(since, &ranks, until);
                self.hook("pause", &self.args.pause_cmd, &ranks);
                self.paused_since = Some(since);
                self.paused_ranks = ranks;
            }
            (Some(since), false) if ranks != self.paused_ranks => {
                self.write_pause_file(since, &ranks, until);
                self.paused_ranks = ranks;
            }
            (Some(_), true) => self.resume(),
            _ => {}
        }
    }

    fn resume(&mut self) {
        if self.paused_since.take().is_some() {
            if let Err(e) = fs::remove_file(&self.pause_file) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    AgentEvent::PauseFileFailed {
                        problem: format!("removing {}: {e}", self.pause_file.display()),
                    }
                    .emit();
                }
            }
            let ranks = std::mem::take(&mut self.paused_ranks);
            self.hook("resume", &self.args.resume_cmd, &ranks);
        }
    }

    /// One poll of the directory.
    fn poll(&mut self) -> Result<()> {
        let mut requests = Vec::new();
        let mut stops = Vec::new();
        for e in fs::read_dir(&self.dir)
            .with_context(|| format!("reading {}", self.dir.display()))?
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(r) = rank_of(&name, ".request.json") {
                requests.push((r, e.path()));
            } else if let Some(r) = rank_of(&name, ".stop") {
                stops.push((r, e.path()));
            }
        }
        requests.sort();
        let mut valid = Vec::new();
        for (rank, path) in requests {
            if self.active.contains_key(&rank) {
                // The rank started a new window without stopping the old
                // one (its stop file was lost): keep what was sampled.
                self.finish(rank, "superseded by a new request");
            }
            match self.take_request(rank, &path) {
                Ok(req) => valid.push((rank, req)),
                Err(msg) => self.write_error(rank, &msg),
            }
        }
        if !valid.is_empty() && self.paused_since.is_none() {
            // Other monitors step aside before sampling starts.
            let mut ranks: Vec<u32> = self.active.keys().copied().collect();
            ranks.extend(valid.iter().map(|(r, _)| *r));
            ranks.sort_unstable();
            let until = unix_now() + self.args.max_window;
            let since = unix_now();
            self.write_pause_file(since, &ranks, until);
            self.hook("pause", &self.args.pause_cmd, &ranks);
            self.paused_since = Some(since);
            self.paused_ranks = Vec::new(); // rewritten with real deadlines below
        }
        for (rank, req) in valid {
            self.start_window(rank, req);
        }
        for (rank, path) in stops {
            let _ = fs::remove_file(&path);
            if self.active.contains_key(&rank) {
                self.finish(rank, "stop file");
            }
            // A stop file without a window (it ended, failed, or the request
            // was never served) is dropped.
        }
        let now = Instant::now();
        let ended: Vec<(u32, &'static str)> = self
            .active
            .iter()
            .filter_map(|(&r, w)| {
                if now >= w.deadline {
                    Some((r, "deadline"))
                } else if proc_start_ticks(w.req.pid).is_none()
                    || (w.start_ticks.is_some() && proc_start_ticks(w.req.pid) != w.start_ticks)
                {
                    Some((r, "process exited"))
                } else {
                    None
                }
            })
            .collect();
        for (rank, reason) in ended {
            self.finish(rank, reason);
        }
        self.update_pause();
        Ok(())
    }

    fn shutdown(&mut self) {
        let ranks: Vec<u32> = self.active.keys().copied().collect();
        for rank in ranks {
            self.finish(rank, "agent stopped");
        }
        self.resume();
    }
}

/// Serves sampling requests until SIGINT / SIGTERM / SIGHUP.
pub fn run(args: AgentArgs) -> Result<u8> {
    init_logging(args.log_format == LogFormat::Json);
    let dir = args.samples_dir.clone();
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pause_file = args
        .pause_file
        .clone()
        .unwrap_or_else(|| dir.join("whyslow.pause"));
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst))
            .context("installing the SIGINT/SIGTERM handler")?;
    }
    let poll = Duration::from_millis(args.poll_ms.clamp(1, 10_000));
    // The collectors' options, shared by reference from here on.
    let cfg = Arc::new(args.profiler.clone());
    // Its own stop, set once the profiler wrote its last profiles.
    let upload_stop = Arc::new(AtomicBool::new(false));
    let uploader = match (crate::profiler::upload_target(&cfg)?, &cfg.profile_spool) {
        (Some(up), Some(spool)) => {
            let (spool, regs, stop) = (spool.clone(), dir.clone(), upload_stop.clone());
            Some(std::thread::spawn(move || {
                crate::upload::run(up, spool, regs, Duration::from_secs(5), stop)
            }))
        }
        (Some(_), None) => {
            anyhow::bail!("--server uploads the profiling spool: add --profile-spool DIR")
        }
        (None, _) => None,
    };
    let governor = {
        let (caps, stop) = (args.caps.clone(), stop.clone());
        std::thread::spawn(move || crate::governor::watch(caps, stop))
    };
    let profiler = crate::profiler::run(dir.clone(), cfg, stop.clone());
    let mut agent = Agent {
        dir,
        pause_file,
        args,
        active: BTreeMap::new(),
        paused_since: None,
        paused_ranks: Vec::new(),
    };
    agent.clean_stale()?;
    AgentEvent::Watching {
        dir: &agent.dir,
        pause_file: &agent.pause_file,
    }
    .emit();
    let mut result = Ok(());
    while !stop.load(Ordering::SeqCst) {
        if let Err(e) = agent.poll() {
            result = Err(e);
            break;
        }
        std::thread::sleep(poll);
    }
    agent.shutdown();
    stop.store(true, Ordering::SeqCst);
    if let Some(p) = profiler {
        let _ = p.join();
    }
    // After the profiler: its last profiles go in the uploader's last pass.
    upload_stop.store(true, Ordering::SeqCst);
    if let Some(u) = uploader {
        let _ = u.join();
    }
    let _ = governor.join();
    AgentEvent::Stopped.emit();
    result.map(|_| 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_stat() {
        assert_eq!(rank_of("rank-12.request.json", ".request.json"), Some(12));
        assert_eq!(rank_of("rank-x.stop", ".stop"), None);
        assert_eq!(rank_of(".rank-1.stop", ".stop"), None);
        let own = proc_start_ticks(std::process::id() as i32);
        assert!(own.is_some());
        assert!(proc_start_ticks(-5).is_none());
        let t = tmp_path(Path::new("/d/rank-1.done"));
        assert!(t
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".rank-1.done."));
    }

    #[test]
    fn parses_requests() {
        let r = Request::from_json(
            r#"{"pid": 7, "tid": 8, "rank": 1, "rate_hz": 500, "interfaces": ["lo:1000"],
                "time_base_ns": 17, "until_unix_s": 1.5, "id": 3, "gpu_index": 0,
                "proc_start_ticks": 99}"#,
        )
        .unwrap();
        assert_eq!(
            (r.tid, r.rank, r.rate_hz, r.time_base_ns, r.until_unix_s),
            (Some(8), Some(1), 500.0, 17, Some(1.5))
        );
        assert_eq!(
            (r.id.as_deref(), r.gpu_index, r.proc_start_ticks),
            (Some("3"), Some(0), Some(99))
        );
        assert_eq!(r.interfaces, vec!["lo:1000"]);
        for bad in [r#"{}"#, r#"{"pid": "x"}"#, "not json"] {
            assert!(Request::from_json(bad).is_err(), "{bad}");
        }
    }
}
