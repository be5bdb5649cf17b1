//! The agent's caps on its own CPU and memory, so that it never takes
//! from the job it watches what it is there to explain (SysOM-AI §4: the
//! node agent's overhead budget). A watchdog reads the agent's CPU time
//! (`getrusage`) and resident memory (`/proc/self/statm`) every 2 s:
//!
//! * **CPU** above `--max-cpu-percent` of one core, averaged over the last
//!   30 s: the per-process profilers (the agent's costly part: stack copies
//!   unwound and symbolized in userspace) pause for at least 30 s and until
//!   the average is back under 80 % of the cap; one log line when they
//!   pause, one when they resume. (The eBPF samplers' cost is in the
//!   kernel, on the sampled CPUs, and bounded by their sampling rate.)
//! * **Memory** above `--max-rss-mib`: every profiler stops for good
//!   (their symbol tables are what grows), one log line; the ranks'
//!   sampling windows and the collective and OS readings go on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use crate::events::AgentEvent;

/// `whyslow agent` caps on itself.
#[derive(Args, Debug, Clone)]
pub struct CapArgs {
    /// The agent's own CPU, percent of one core averaged over 30 s, above
    /// which its profilers pause (0: no cap).
    #[arg(long, default_value_t = 50.0, value_name = "PCT")]
    pub max_cpu_percent: f64,
    /// The agent's resident memory, MiB, above which its profilers stop
    /// (0: no cap).
    #[arg(long, default_value_t = 1024, value_name = "MIB")]
    pub max_rss_mib: u64,
}

/// The averaging window of the CPU cap.
const CPU_WINDOW: Duration = Duration::from_secs(30);

/// What the watchdog decides from one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nothing changes.
    Keep,
    /// Pause the profilers (CPU over its cap).
    Pause,
    /// Resume them.
    Resume,
    /// Stop them for good (memory over its cap).
    Stop,
}

/// The caps' state, fed one reading at a time (pure: times are given).
#[derive(Debug)]
pub struct Governor {
    caps: CapArgs,
    /// (seconds since start, CPU seconds used) readings of the last window.
    cpu: VecDeque<(f64, f64)>,
    paused_since: Option<f64>,
    stopped: bool,
}

impl Governor {
    /// A governor for `caps`.
    pub fn new(caps: CapArgs) -> Self {
        Governor {
            caps,
            cpu: VecDeque::new(),
            paused_since: None,
            stopped: false,
        }
    }

    /// The CPU percent over the window ending at the latest reading (None
    /// before a second reading).
    pub fn cpu_percent(&self) -> Option<f64> {
        let (&(t0, c0), &(t1, c1)) = (self.cpu.front()?, self.cpu.back()?);
        (t1 > t0).then(|| 100.0 * (c1 - c0) / (t1 - t0))
    }

    /// One reading: at `t` seconds since start the agent had used
    /// `cpu_s` CPU seconds and held `rss_mib` MiB.
    pub fn observe(&mut self, t: f64, cpu_s: f64, rss_mib: u64) -> Decision {
        if self.stopped {
            return Decision::Keep;
        }
        if self.caps.max_rss_mib > 0 && rss_mib > self.caps.max_rss_mib {
            self.stopped = true;
            return Decision::Stop;
        }
        self.cpu.push_back((t, cpu_s));
        while self
            .cpu
            .front()
            .is_some_and(|&(t0, _)| t - t0 > CPU_WINDOW.as_secs_f64())
        {
            self.cpu.pop_front();
        }
        let cap = self.caps.max_cpu_percent;
        // Judge a full window only: the start (symbol tables read once) is
        // not the steady cost.
        let full = self
            .cpu
            .front()
            .is_some_and(|&(t0, _)| t - t0 >= CPU_WINDOW.as_secs_f64() * 0.9);
        let Some(pct) = self.cpu_percent().filter(|_| full && cap > 0.0) else {
            return Decision::Keep;
        };
        match self.paused_since {
            None if pct > cap => {
                self.paused_since = Some(t);
                Decision::Pause
            }
            Some(since) if t - since >= CPU_WINDOW.as_secs_f64() && pct < 0.8 * cap => {
                self.paused_since = None;
                Decision::Resume
            }
            _ => Decision::Keep,
        }
    }
}

/// Set while the per-process profilers must not sample (CPU cap).
static PAUSED: AtomicBool = AtomicBool::new(false);
/// Set once the profilers must end (memory cap).
static STOPPED: AtomicBool = AtomicBool::new(false);

/// Whether the profilers must end (the memory cap was crossed).
pub fn stopped() -> bool {
    STOPPED.load(Ordering::Relaxed)
}

/// Called by a per-process profiler before each period: waits while the
/// CPU cap holds the profilers; `false` when it must end (the memory cap,
/// or `stop`).
pub fn hold(stop: &AtomicBool) -> bool {
    while PAUSED.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) && !stopped() {
        std::thread::sleep(Duration::from_millis(200));
    }
    !stop.load(Ordering::Relaxed) && !stopped()
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn rss_mib() -> u64 {
    // statm: size resident shared … in pages.
    let pages: u64 = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    (pages * page) >> 20
}

/// Watches the agent every 2 s until `stop`, pausing or stopping the
/// profilers.
pub fn watch(caps: CapArgs, stop: Arc<AtomicBool>) {
    let start = Instant::now();
    let mut g = Governor::new(caps.clone());
    while !stop.load(Ordering::Relaxed) {
        let rss = rss_mib();
        match g.observe(start.elapsed().as_secs_f64(), cpu_seconds(), rss) {
            Decision::Keep => {}
            Decision::Pause => {
                PAUSED.store(true, Ordering::Relaxed);
                AgentEvent::Capped {
                    what: "cpu",
                    value: g.cpu_percent().unwrap_or(0.0),
                    cap: caps.max_cpu_percent,
                    action: "profiling paused",
                }
                .emit();
            }
            Decision::Resume => {
                PAUSED.store(false, Ordering::Relaxed);
                AgentEvent::Capped {
                    what: "cpu",
                    value: g.cpu_percent().unwrap_or(0.0),
                    cap: caps.max_cpu_percent,
                    action: "profiling resumed",
                }
                .emit();
            }
            Decision::Stop => {
                STOPPED.store(true, Ordering::Relaxed);
                AgentEvent::Capped {
                    what: "rss_mib",
                    value: rss as f64,
                    cap: caps.max_rss_mib as f64,
                    action: "profiling stopped",
                }
                .emit();
            }
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(2) && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(cpu: f64, rss: u64) -> CapArgs {
        CapArgs {
            max_cpu_percent: cpu,
            max_rss_mib: rss,
        }
    }

    #[test]
    fn a_busy_agent_pauses_for_a_window_and_resumes_when_calm() {
        let mut g = Governor::new(caps(10.0, 0));
        let mut cpu = 0.0;
        let mut decisions = Vec::new();
        // 60 s at 30 % of a core (paused from the first full window), then
        // nearly idle while paused.
        for i in 0..=120 {
            let t = i as f64;
            cpu += if g.paused_since.is_some() { 0.005 } else { 0.3 };
            let d = g.observe(t, cpu, 100);
            if d != Decision::Keep {
                decisions.push((i, d));
            }
        }
        assert_eq!(decisions[0].1, Decision::Pause, "{decisions:?}");
        assert!((27..=31).contains(&decisions[0].0), "{decisions:?}");
        assert_eq!(decisions[1].1, Decision::Resume, "{decisions:?}");
        // Not before 30 s paused, and only once the window average fell.
        assert!(decisions[1].0 - decisions[0].0 >= 30, "{decisions:?}");
    }

    #[test]
    fn a_calm_agent_and_its_start_are_never_capped_memory_stops_for_good() {
        let mut g = Governor::new(caps(10.0, 200));
        // The first seconds cost a lot (symbol tables), then 2 %.
        let mut cpu = 3.0;
        for i in 0..100 {
            cpu += 0.02;
            assert_eq!(g.observe(i as f64 + 1.0, cpu, 150), Decision::Keep);
        }
        assert_eq!(g.observe(101.0, cpu, 201), Decision::Stop);
        assert_eq!(g.observe(102.0, cpu, 50), Decision::Keep);
        // No cap: nothing ever happens.
        let mut g = Governor::new(caps(0.0, 0));
        for i in 0..100 {
            assert_eq!(g.observe(i as f64, i as f64, 1 << 20), Decision::Keep);
        }
        assert!(rss_mib() > 0 && cpu_seconds() >= 0.0);
    }
}
