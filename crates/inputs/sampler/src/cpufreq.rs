//! Clock frequency of the core the training thread runs on (PerfTracker
//! §4.2: Python functions are governed by the training thread's CPU; a thread
//! that is on-CPU 100 % of the time still runs slowly on a core that is
//! clocked down by power capping, thermal limits or a `powersave` governor,
//! which the on-CPU fraction alone cannot show).
//!
//! At each reading the sampler takes the core the thread last ran on from
//! field 39 (`processor`) of `/proc/PID/task/TID/stat`, then reads that core's
//! `/sys/devices/system/cpu/cpuN/cpufreq/scaling_cur_freq` (kHz) and divides
//! it by `cpuinfo_max_freq` (kHz, read once per core). The result, the core's
//! current clock as a fraction of its maximum, goes to the extra file as kind
//! `cpu_freq` with `id` = the core number (module `write`).
//!
//! Limits:
//! - Virtual machines and containers often have no `cpufreq` directory (the
//!   development VM has none): the frequency is then reported as not
//!   available ([`CpuFreqStatus::NotAvailable`]), never as an error, and the
//!   rest of the sampling is unaffected.
//! - `scaling_cur_freq` is the kernel's estimate (APERF/MPERF on x86,
//!   refreshed on the scheduler tick, or the last frequency requested); with
//!   turbo it may exceed `cpuinfo_max_freq` on some drivers (the fraction is
//!   written as is, > 1 then).
//! - `processor` is where the thread ran last, not necessarily where it
//!   spent the whole interval.
//! - It is read at most [`CPU_FREQ_MAX_HZ`] times a second whatever the
//!   sampling rate (the kernel does not refresh it faster than its tick).

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The most `cpu_freq` readings per second.
pub const CPU_FREQ_MAX_HZ: f64 = 100.0;

/// Whether CPU frequency was sampled.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CpuFreqStatus {
    /// Not asked for (no process, or [`SamplerConfig::cpu_freq`] off).
    ///
    /// [`SamplerConfig::cpu_freq`]: crate::SamplerConfig::cpu_freq
    #[default]
    NotRequested,
    /// Not available, and why (no `cpufreq` in sysfs, thread not found).
    NotAvailable(String),
    /// Sampled (extra file kind `cpu_freq`).
    Sampling,
}

/// The core a thread last ran on: field 39 (`processor`) of a `stat` line.
/// The command name may hold spaces and parentheses: fields are counted
/// after the last ')'.
pub fn parse_stat_processor(text: &str) -> Option<u32> {
    let rest = &text[text.rfind(')')? + 1..];
    // After ')': field 3 (state) is index 0, so field 39 is index 36.
    rest.split_ascii_whitespace().nth(36)?.parse().ok()
}

/// `cur_khz / max_khz`, `None` when the maximum is not positive.
pub fn freq_fraction(cur_khz: u64, max_khz: u64) -> Option<f32> {
    (max_khz > 0).then(|| (cur_khz as f64 / max_khz as f64) as f32)
}

fn read_u64(f: &File) -> Option<u64> {
    let mut buf = [0u8; 64];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

struct Core {
    cur: File,
    max_khz: u64,
}

/// Reads the training thread's core and that core's frequency.
pub(crate) struct CpuFreqReader {
    root: PathBuf,
    stat: File,
    cores: HashMap<u32, Option<Core>>,
}

impl CpuFreqReader {
    /// Opens the thread's `stat` and checks that the core it runs on has
    /// `cpufreq` under `root` (normally `/sys/devices/system/cpu`);
    /// `Err(why)` when not available.
    pub fn open(stat_path: &Path, root: &Path) -> Result<CpuFreqReader, String> {
        let stat =
            File::open(stat_path).map_err(|e| format!("cpu_freq: {}: {e}", stat_path.display()))?;
        let mut r = CpuFreqReader {
            root: root.to_path_buf(),
            stat,
            cores: HashMap::new(),
        };
        let cpu = r
            .processor()
            .ok_or_else(|| format!("cpu_freq: no `processor` in {}", stat_path.display()))?;
        if r.core(cpu).is_none() {
            return Err(format!(
                "cpu_freq: not available ({}/cpu{cpu}/cpufreq missing or unreadable; \
                 common in VMs and containers)",
                root.display()
            ));
        }
        Ok(r)
    }

    fn processor(&self) -> Option<u32> {
        let mut buf = [0u8; 1024];
        let n = self.stat.read_at(&mut buf, 0).ok()?;
        parse_stat_processor(std::str::from_utf8(&buf[..n]).ok()?)
    }

    fn core(&mut self, cpu: u32) -> Option<&Core> {
        let root = &self.root;
        self.cores
            .entry(cpu)
            .or_insert_with(|| {
                let dir = root.join(format!("cpu{cpu}")).join("cpufreq");
                let max = File::open(dir.join("cpuinfo_max_freq")).ok()?;
                let max_khz = read_u64(&max).filter(|&m| m > 0)?;
                let cur = File::open(dir.join("scaling_cur_freq")).ok()?;
                Some(Core { cur, max_khz })
            })
            .as_ref()
    }

    /// (core, current / max frequency); `None` when the thread is gone or the
    /// core has no readable `cpufreq`.
    pub fn sample(&mut self) -> Option<(u32, f32)> {
        let cpu = self.processor()?;
        let core = self.core(cpu)?;
        let cur = read_u64(&core.cur)?;
        Some((cpu, freq_fraction(cur, core.max_khz)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_line(cpu: u32) -> String {
        // 52 fields; field 39 = processor.
        let mut f: Vec<String> = (3..=52).map(|i| i.to_string()).collect();
        f[0] = "R".into();
        f[39 - 3] = cpu.to_string();
        format!("42 (py (w) 1) {}", f.join(" "))
    }

    #[test]
    fn parses_processor() {
        assert_eq!(parse_stat_processor(&stat_line(7)), Some(7));
        assert_eq!(parse_stat_processor("42 (x) R 1 2"), None);
        assert_eq!(parse_stat_processor("garbage"), None);
        // This thread's own stat has a processor field.
        let own = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        assert!(parse_stat_processor(&own).is_some(), "{own}");
    }

    #[test]
    fn fraction() {
        assert_eq!(freq_fraction(1_500_000, 3_000_000), Some(0.5));
        assert_eq!(freq_fraction(1, 0), None);
    }

    #[test]
    fn reads_a_fake_sysfs_and_degrades_without_one() {
        let dir = std::env::temp_dir().join(format!("whyslow-cpufreq-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let stat = dir.join("stat");
        std::fs::create_dir_all(dir.join("sys/cpu3/cpufreq")).unwrap();
        std::fs::write(&stat, stat_line(3)).unwrap();
        std::fs::write(dir.join("sys/cpu3/cpufreq/cpuinfo_max_freq"), "3000000\n").unwrap();
        std::fs::write(dir.join("sys/cpu3/cpufreq/scaling_cur_freq"), "2400000\n").unwrap();
        let mut r = CpuFreqReader::open(&stat, &dir.join("sys")).unwrap();
        assert_eq!(r.sample(), Some((3, 0.8)));
        // The thread moved to a core without cpufreq: no reading, no error.
        std::fs::write(&stat, stat_line(5)).unwrap();
        assert_eq!(r.sample(), None);
        // No cpufreq at all: not available.
        let e = CpuFreqReader::open(&stat, &dir.join("nosys"))
            .err()
            .unwrap();
        assert!(e.contains("not available"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
