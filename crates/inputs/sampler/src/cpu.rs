//! Per-thread CPU utilization of a target process (PerfTracker §4.2: Python
//! functions are governed by the CPU of the training thread).
//!
//! # Source and resolution
//!
//! `/proc/PID/task/TID/stat` (utime + stime) counts in clock ticks
//! (`USER_HZ` = 100 on Linux, 10 ms): at 10 kHz (100 µs intervals) every
//! sample would read 0 or 100 (one tick = 100 intervals' worth). So the
//! sampler reads `/proc/PID/task/TID/schedstat`, whose first field is the
//! thread's on-CPU time in **ns** (`se.sum_exec_runtime`, kernel
//! `CONFIG_SCHED_INFO`). For a thread running on another CPU that value is
//! brought up to date only at scheduler ticks and context switches, so at
//! rates above the kernel's tick rate one interval can show more CPU time than
//! its length and the next none; the sampler carries the excess into the
//! following intervals (up to [`MAX_CARRY_NS`]) so that the series keeps the
//! thread's CPU time and a busy thread reads ≈ 1.0 throughout (measured: an
//! unweighted 0.55 instead of 0.95 without the carry at 500 Hz). When `schedstat` is
//! missing the sampler falls back to `stat` ticks and says so in
//! [`Samples::notes`](crate::Samples::notes); utilization is then quantized
//! to 10 ms and only meaningful at rates ≲ 10 Hz.
//!
//! Files are opened once and re-read with `pread(fd, 0)` (procfs regenerates
//! the content at offset 0), so a sample costs one syscall per thread. The
//! thread list is rescanned every [`SamplerConfig::thread_rescan`]; a thread
//! whose files fail to read (it exited: `ESRCH`/`ENOENT`) is dropped
//! silently, never a panic. A tid is opened once: a new thread that reuses
//! the tid of one that exited during the run is not followed.
//!
//! Cost: each sampled thread adds one `pread` per tick (≈ 0.37 µs measured,
//! see the crate docs), so at 10 kHz a process with 32 threads costs ≈ 12 %
//! of a core more than one with 2; set
//! [`SamplerConfig::all_threads`](crate::SamplerConfig::all_threads) to
//! `false` to read the training thread only.
//!
//! [`SamplerConfig::thread_rescan`]: crate::SamplerConfig::thread_rescan

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

/// How a thread's CPU time is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuSource {
    /// `/proc/PID/task/TID/schedstat`, ns resolution.
    Schedstat,
    /// `/proc/PID/task/TID/stat` utime+stime, `USER_HZ` tick resolution.
    StatTicks,
}

pub(crate) struct ThreadClock {
    pub tid: i32,
    pub name: String,
    file: File,
    source: CpuSource,
    ns_per_tick: i64,
    pub last_ns: Option<i64>,
    /// Monotonic time just after the last read: a value is CPU time over
    /// the time between this thread's own reads, not between the sampler's
    /// ticks, so a sampler preempted between its tick and the read does not
    /// count the busy thread's CPU time against a too-short interval.
    pub last_read_at: Option<i64>,
    /// CPU time read but not yet attributed (see the module docs).
    pub carry_ns: i64,
}

/// Most CPU time carried into later intervals: a few scheduler ticks.
pub const MAX_CARRY_NS: i64 = 40_000_000;

impl ThreadClock {
    /// On-CPU fraction of the interval `dt_ns` that ends at a reading of
    /// `ns`; excess over the interval is carried (module docs).
    pub(crate) fn utilization(&mut self, ns: i64, dt_ns: i64) -> f32 {
        let prev = self.last_ns.replace(ns).unwrap_or(ns);
        let dt = dt_ns.max(1);
        let busy = (ns - prev).max(0) + self.carry_ns;
        let used = busy.min(dt);
        self.carry_ns = (busy - used).min(MAX_CARRY_NS);
        (used as f64 / dt as f64) as f32
    }
}

pub(crate) fn task_dir(pid: i32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/task"))
}

/// Lists the thread ids of `pid` (empty when it is gone).
pub(crate) fn list_tids(pid: i32) -> Vec<i32> {
    let Ok(rd) = std::fs::read_dir(task_dir(pid)) else {
        return Vec::new();
    };
    let mut v: Vec<i32> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    v.sort_unstable();
    v
}

pub(crate) fn user_hz() -> i64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as i64
    } else {
        100
    }
}

impl ThreadClock {
    /// Opens the thread's CPU-time file; `None` if the thread is gone.
    pub fn open(pid: i32, tid: i32, prefer: CpuSource) -> Option<ThreadClock> {
        let dir = task_dir(pid).join(tid.to_string());
        let name = std::fs::read_to_string(dir.join("comm"))
            .map(|s| s.trim_end().to_string())
            .unwrap_or_default();
        let (file, source) = match prefer {
            CpuSource::Schedstat => match File::open(dir.join("schedstat")) {
                Ok(f) => (f, CpuSource::Schedstat),
                Err(_) => (File::open(dir.join("stat")).ok()?, CpuSource::StatTicks),
            },
            CpuSource::StatTicks => (File::open(dir.join("stat")).ok()?, CpuSource::StatTicks),
        };
        let mut t = ThreadClock {
            tid,
            name,
            file,
            source,
            ns_per_tick: 1_000_000_000 / user_hz(),
            last_ns: None,
            last_read_at: None,
            carry_ns: 0,
        };
        t.last_ns = Some(t.read_ns()?);
        t.last_read_at = Some(crate::clock::monotonic_ns());
        Some(t)
    }

    pub fn source(&self) -> CpuSource {
        self.source
    }

    /// The thread's cumulative CPU time in ns; `None` when it cannot be read
    /// (the thread exited).
    pub fn read_ns(&mut self) -> Option<i64> {
        let mut buf = [0u8; 1024];
        let n = self.file.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..n]).ok()?;
        match self.source {
            CpuSource::Schedstat => parse_schedstat(text),
            CpuSource::StatTicks => parse_stat_ticks(text).map(|t| t * self.ns_per_tick),
        }
    }
}

/// First field of `schedstat`: on-CPU time in ns.
pub(crate) fn parse_schedstat(text: &str) -> Option<i64> {
    text.split_ascii_whitespace().next()?.parse().ok()
}

/// utime + stime (fields 14 and 15) of a `stat` line, in ticks. The command
/// name may hold spaces and parentheses: fields are counted after the last ')'.
pub(crate) fn parse_stat_ticks(text: &str) -> Option<i64> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut it = rest.split_ascii_whitespace();
    // After ')': field 3 (state) is index 0, so utime (14) is index 11.
    let utime: i64 = it.nth(11)?.parse().ok()?;
    let stime: i64 = it.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_schedstat_and_stat() {
        assert_eq!(parse_schedstat("123456 789 10\n"), Some(123456));
        assert_eq!(parse_schedstat(""), None);
        let stat = "42 (py (worker) 1) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1 0 5";
        assert_eq!(parse_stat_ticks(stat), Some(10));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }
}

#[cfg(test)]
mod carry_tests {
    use super::*;

    /// schedstat of a thread busy on another CPU advances in tick-sized
    /// jumps: 0, 2 ms, 0, 2 ms … over 1 ms intervals. The series must keep
    /// the thread's CPU time (all 1.0), not alternate 0 and a clamped 1.0.
    #[test]
    fn tick_sized_jumps_are_spread_over_the_following_intervals() {
        let pid = std::process::id() as i32;
        let mut tc = ThreadClock::open(pid, pid, CpuSource::Schedstat).expect("own thread");
        tc.last_ns = Some(0);
        tc.carry_ns = 0;
        let ms = 1_000_000;
        let mut reading = 0;
        let mut got = Vec::new();
        for i in 0..10 {
            if i % 2 == 0 {
                reading += 2 * ms;
            }
            got.push(tc.utilization(reading, ms));
        }
        assert_eq!(got, vec![1.0; 10]);
        // Idle afterwards: nothing left to carry, zeros.
        assert_eq!(tc.utilization(reading, ms), 0.0);
        // A long stall in reading (40 ms of CPU in 1 ms) carries at most MAX_CARRY_NS.
        tc.utilization(reading + 100 * ms, ms);
        assert_eq!(tc.carry_ns, MAX_CARRY_NS);
    }
}
