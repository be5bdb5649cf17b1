//! whyslow's hardware utilization sampler.
//!
//! PerfTracker (§4.1–4.2) summarizes each function execution as a fingerprint
//! P = (β, μ, σ), where μ and σ are the mean and standard deviation of the
//! utilization of the hardware resource that governs the function, sampled at
//! up to 10 kHz during the profiling window. This crate produces those
//! utilization series and writes them as the samples file that
//! `whyslow-ingest` reads (`resource,ts_us,value[,worker]`).
//!
//! A [`Sampler`] runs in a background thread at a configured rate
//! (1 Hz – 10 kHz) until [`Sampler::stop`]:
//!
//! - `cpu`: on-CPU fraction of the target process's training thread (the main
//!   thread, tid == pid, unless configured), from `schedstat` ns counters
//!   (module [`cpu`] explains why not `stat` jiffies). Every other thread of
//!   the process (data loaders, …) is recorded too, in [`Samples::threads`],
//!   written by [`write_extra_csv`] to a second file ([`extra_path_for`]).
//! - `nic`: per-interface tx/rx bytes over link capacity; the `nic` series is
//!   the maximum over the configured interfaces of max(tx, rx) (module
//!   [`net`]); per-interface tx and rx go to the extra file.
//! - `cpu_freq` (extra file): the clock of the core the training thread runs
//!   on, as a fraction of its maximum, from `cpufreq` in sysfs (module
//!   [`cpufreq`]); reported as not available in [`Samples::cpu_freq`] where
//!   sysfs has no `cpufreq` (VMs), never as an error.
//! - `sm`, `dram`, `pcie`, `nvlink` and, in the extra file, SM clock, power,
//!   temperature and throttle reasons (feature `nvml`, NVML loaded at run
//!   time; untested on GPU hardware): see module [`gpu`]. Without the feature
//!   or without a GPU, GPU sampling is reported as not available in
//!   [`Samples::gpu`], never as an error.
//!
//! Timestamps are on the profiler's clock (module [`clock`]): `CLOCK_REALTIME`
//! minus a [`TimeBase`] (0 for traces without `baseTimeNanoseconds`, that
//! value otherwise). A sample stands for the interval since the previous one
//! and is stamped at the interval's midpoint. A CPU or NIC reading that
//! covers several periods (the sampler ran late) is written as one sample per
//! period, evenly spread over it, so that every sample stands for the same
//! time, as PerfTracker's Eq. 4 counts them: a starved process's in-process
//! sampler otherwise overstated its CPU share (0.082 against 0.061).
//!
//! # Cost (measured)
//!
//! `cargo run --release -p whyslow-sampler --example sampler_cost` on the
//! development VM (2 shared vCPUs, kernel 6.18, load ≈ 2 from other builds),
//! sampling its own process (CPU of every thread + `lo`), 5 s per row; CPU of
//! the sampler thread from its `schedstat`, as % of one core:
//!
//! | rate | threads sampled | achieved | overruns | sampler CPU |
//! |------|-----------------|----------|----------|-------------|
//! | 1 kHz | 2 | 1000 Hz | 1 | 1.5 % |
//! | 10 kHz | 2 | 9969 Hz | 26 | 6.2 % |
//! | 1 kHz | 34 | 998 Hz | 5 | 3.3 % |
//! | 10 kHz | 34 | 9942 Hz | 35 | 18.1 % |
//!
//! An overrun is a deadline missed by more than one period (the sampler
//! thread was not scheduled in time); the interval then simply lasts longer,
//! and its reading is written once per period it covers.

#![deny(missing_docs)]

pub mod clock;
pub mod cpu;
pub mod cpufreq;
pub mod gpu;
pub mod net;
pub mod os;
pub mod tcp_diag;
mod write;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub use clock::{kineto_base_time_ns, rebase, TimeBase};
pub use cpu::CpuSource;
pub use cpufreq::CpuFreqStatus;
pub use gpu::GpuStatus;
pub use net::{InterfaceSpecError, NetInterface};
pub use whyslow_model::{Resource, SampleSeries};
pub use write::{extra_path_for, write_extra_csv, write_samples_csv};

/// Errors of the sampler.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    /// The configuration is invalid (rate out of range, …).
    #[error("invalid sampler configuration: {0}")]
    Config(String),
    /// The target process does not exist (no `/proc/PID/task`).
    #[error("process {0} not found (no /proc/{0}/task)")]
    NoProcess(i32),
    /// The sampler thread could not be started, or panicked.
    #[error("sampler thread: {0}")]
    Thread(String),
    /// Writing a samples file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// The lowest sampling rate.
pub const MIN_RATE_HZ: f64 = 1.0;
/// The highest sampling rate (PerfTracker §4.1 samples at 10 kHz).
pub const MAX_RATE_HZ: f64 = 10_000.0;

/// What to sample and how fast.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Samples per second, in [[`MIN_RATE_HZ`], [`MAX_RATE_HZ`]].
    pub rate_hz: f64,
    /// Process whose threads' CPU utilization is sampled; `None`: no CPU.
    pub pid: Option<i32>,
    /// The training thread; `None`: the main thread (tid == pid).
    pub training_tid: Option<i32>,
    /// Record every thread of the process in [`Samples::threads`] (not only
    /// the training thread).
    pub all_threads: bool,
    /// How often the thread list is rescanned for new threads.
    pub thread_rescan: Duration,
    /// Preferred per-thread CPU time source (falls back to ticks if missing).
    pub cpu_source: CpuSource,
    /// Network interfaces to sample.
    pub interfaces: Vec<NetInterface>,
    /// Sample the clock frequency of the training thread's core (module
    /// [`cpufreq`]; at most [`cpufreq::CPU_FREQ_MAX_HZ`] readings a second).
    pub cpu_freq: bool,
    /// Sample the GPU through NVML when the `nvml` feature is on.
    pub gpu: bool,
    /// Which GPU (NVML index).
    pub gpu_index: u32,
    /// Origin of the timestamps.
    pub time_base: TimeBase,
    /// Stop recording after this many ticks (bounds memory: each tick stores
    /// ~12 bytes per series).
    pub max_ticks: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            rate_hz: 1000.0,
            pid: None,
            training_tid: None,
            all_threads: true,
            thread_rescan: Duration::from_millis(100),
            cpu_source: CpuSource::Schedstat,
            interfaces: Vec::new(),
            cpu_freq: true,
            gpu: true,
            gpu_index: 0,
            time_base: TimeBase::UnixEpoch,
            max_ticks: 2_000_000,
        }
    }
}

/// One thread's CPU utilization series.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSeries {
    /// Thread id.
    pub tid: i32,
    /// Thread name (`/proc/PID/task/TID/comm`) when first seen.
    pub name: String,
    /// Whether this is the training thread (its values are also the `cpu`
    /// series). When a process samples itself, the sampler's own thread
    /// (`whyslow-sampler`) is one of the threads.
    pub training: bool,
    /// On-CPU fraction per interval; a thread appears from the sample after
    /// it is discovered and ends when it exits.
    pub series: SampleSeries,
}

/// One interface's throughput series.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InterfaceSeries {
    /// Interface name.
    pub name: String,
    /// Transmit utilization.
    pub tx: SampleSeries,
    /// Receive utilization.
    pub rx: SampleSeries,
}

/// A series of the extra file that is neither a thread's CPU nor an
/// interface's tx/rx: `cpu_freq`, `nvlink_tx`, `nvlink_rx`, `gpu_sm_clock`,
/// `gpu_power_w`, `gpu_temp_c`, `gpu_throttle` (units in module `write` and
/// the modules [`cpufreq`] and [`gpu`]).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExtraSeries {
    /// The extra file's `kind` column.
    pub kind: String,
    /// The `id` column: core number (`cpu_freq`), NVML index (GPU kinds).
    pub id: String,
    /// Values in the kind's unit (not clamped to [0, 1]).
    pub series: SampleSeries,
}

/// How the sampling went.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SamplerStats {
    /// Requested rate.
    pub rate_hz: f64,
    /// Samples taken.
    pub ticks: u64,
    /// Deadlines missed by more than one period (those periods are merged
    /// into one longer interval, not invented).
    pub overruns: u64,
    /// Wall time sampled, ns.
    pub elapsed_ns: i64,
    /// CPU time of the sampler thread itself, ns (`CLOCK_THREAD_CPUTIME_ID`).
    pub sampler_cpu_ns: i64,
}

impl SamplerStats {
    /// Achieved rate.
    pub fn achieved_hz(&self) -> f64 {
        if self.elapsed_ns <= 0 {
            0.0
        } else {
            self.ticks as f64 * 1e9 / self.elapsed_ns as f64
        }
    }

    /// The sampler thread's CPU use as a fraction of one core.
    pub fn sampler_cpu_fraction(&self) -> f64 {
        if self.elapsed_ns <= 0 {
            0.0
        } else {
            self.sampler_cpu_ns as f64 / self.elapsed_ns as f64
        }
    }
}

/// Everything a sampling run produced.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Samples {
    /// The samples-file series, per resource (`cpu`, `nic`, `sm`, `dram`,
    /// `pcie`, `nvlink` as available).
    pub series: BTreeMap<Resource, SampleSeries>,
    /// Per-thread CPU series of the target process (extra file).
    pub threads: Vec<ThreadSeries>,
    /// Per-interface tx/rx series (extra file).
    pub interfaces: Vec<InterfaceSeries>,
    /// Other extra-file series (CPU frequency, NVLink tx/rx, GPU clock,
    /// power, temperature, throttle reasons).
    pub extra: Vec<ExtraSeries>,
    /// CPU frequency availability.
    pub cpu_freq: CpuFreqStatus,
    /// GPU availability.
    pub gpu: GpuStatus,
    /// Why something was not sampled, or sampled coarsely.
    pub notes: Vec<String>,
    /// Rate and cost.
    pub stats: SamplerStats,
}

/// A running sampler (background thread). Dropping it stops the thread and
/// discards the samples; call [`Sampler::stop`] to get them.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Samples>>,
    tid: i32,
}

impl Sampler {
    /// Validates `config` and starts sampling in a background thread.
    pub fn start(config: SamplerConfig) -> Result<Sampler, SamplerError> {
        if !(MIN_RATE_HZ..=MAX_RATE_HZ).contains(&config.rate_hz) {
            return Err(SamplerError::Config(format!(
                "rate {} Hz outside [{MIN_RATE_HZ}, {MAX_RATE_HZ}]",
                config.rate_hz
            )));
        }
        if config.max_ticks == 0 {
            return Err(SamplerError::Config("max_ticks = 0".into()));
        }
        if let Some(pid) = config.pid {
            if !cpu::task_dir(pid).is_dir() {
                return Err(SamplerError::NoProcess(pid));
            }
        }
        for i in &config.interfaces {
            if let Some(c) = i.capacity_mbit {
                if !(c > 0.0 && c.is_finite()) {
                    return Err(SamplerError::Config(format!(
                        "interface {}: capacity {c} Mbit/s",
                        i.name
                    )));
                }
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("whyslow-sampler".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                let _ = tx.send(unsafe { libc::gettid() });
                run::run(config, &stop2)
            })
            .map_err(|e| SamplerError::Thread(e.to_string()))?;
        let tid = rx
            .recv()
            .map_err(|_| SamplerError::Thread("sampler thread died at start".into()))?;
        Ok(Sampler {
            stop,
            handle: Some(handle),
            tid,
        })
    }

    /// The sampler thread's tid (to exclude or measure it).
    pub fn thread_id(&self) -> i32 {
        self.tid
    }

    /// Stops sampling and returns what was sampled.
    pub fn stop(mut self) -> Result<Samples, SamplerError> {
        self.stop.store(true, Ordering::Release);
        let h = self.handle.take().expect("handle present until stop/drop");
        h.join()
            .map_err(|_| SamplerError::Thread("sampler thread panicked".into()))
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

mod run;
