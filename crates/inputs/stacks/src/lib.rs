//! whyslow's CPU stack sampler (SysOM-AI §3.3–§3.4): samples a process's
//! threads with perf_event (software CPU clock), takes the kernel callchain
//! from the kernel and unwinds the user stack from a copy of it with DWARF CFI
//! ([`unwind`]), and returns a [`StackProfile`] whose frames carry the
//! module's Build-ID and the file offset (for deferred symbolization) and,
//! symbolized locally, the function names (ELF symbol tables by containment,
//! kallsyms for the kernel).
//!
//! Not yet here (issue 12): the eBPF sampler with in-kernel aggregation and
//! DWARF tables in BPF maps, and Python frames stitched in place of the
//! interpreter's evaluation frames. The perf path is the fallback the paper
//! keeps; it costs a 16 KiB stack copy per sample.
#![deny(missing_docs)]

pub mod cfi;
pub mod cfi_eval;
pub mod ebpf;
mod ebpf_fallback;
mod ebpf_python;
pub mod ebpf_rowcache;
mod ebpf_symbols;
mod ebpf_tables;
pub mod elf;
pub mod maps;
pub mod perf;
pub mod python;
pub mod symindex;
pub mod unwind;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use whyslow_model::stack::{Frame, StackProfile, StackProfileBuilder};

use crate::ebpf_python::{replace_evals, EVAL_FRAME};
use crate::elf::KernelSymbols;
use crate::perf::{PerfSampler, RawSample};
use crate::unwind::StackWalker;

/// What can go wrong while sampling.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    /// A file under /proc or a module could not be read.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// An ELF file did not parse.
    #[error("{0}: not a readable ELF file: {1}")]
    Elf(String, String),
    /// perf_event_open or its ring buffer was refused for a thread.
    #[error("perf_event_open on thread {0}: {1} (needs root or perf_event_paranoid ≤ 1, and a kernel with perf events)")]
    Perf(i32, #[source] std::io::Error),
    /// The process has no threads to sample (it exited).
    #[error("process {0} has no thread to sample (did it exit?)")]
    NoProcess(i32),
}

/// Settings of [`profile_process`].
#[derive(Debug, Clone)]
pub struct ProfileOptions {
    /// Samples per second per thread (1..=999; 99 avoids lockstep with timers).
    pub hz: u64,
    /// How long to sample.
    pub duration: Duration,
    /// Bytes of user stack copied per sample (deeper stacks are cut there).
    pub stack_bytes: u32,
    /// Stitch Python frames in (CPython 3.11–3.13 with a shared libpython).
    pub python: bool,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            hz: 99,
            duration: Duration::from_secs(10),
            stack_bytes: 16 * 1024,
            python: true,
        }
    }
}

/// What the sampler saw besides the stacks.
#[derive(Debug, Clone, Default)]
pub struct ProfileStats {
    /// Samples taken.
    pub samples: u64,
    /// Samples the kernel dropped (ring buffer full).
    pub lost: u64,
    /// Threads sampled (at the end).
    pub threads: usize,
    /// Modules that could not be read, with the reason.
    pub unreadable: Vec<String>,
    /// Kernel symbols known (0: kallsyms hidden; kernel frames unnamed).
    pub kernel_symbols: usize,
    /// The Python runtime whose frames were stitched in, if any.
    pub python: Option<String>,
    /// Samples whose interpreter frames were replaced by Python frames.
    pub python_stitched: u64,
    /// Samples of Python threads left with the interpreter's frames (the
    /// Python stack read after the sample no longer matched it).
    pub python_mismatched: u64,
    /// Samples of Python threads left with the interpreter's frames because
    /// the reader came to them too late (more than 2 ms after the tick).
    pub python_stale: u64,
}

/// Samples every thread of `pid` for `opts.duration` (or until `stop` is
/// set), symbolizes locally and returns the profile, root first: the thread's
/// name, then user frames from the outermost, then kernel frames. The target
/// is never stopped.
pub fn profile_process(
    pid: i32,
    opts: &ProfileOptions,
    stop: &AtomicBool,
) -> Result<(StackProfile, ProfileStats), StackError> {
    let shared = Shared::new();
    ProcessProfiler::new(pid, opts, &shared)?.profile(opts.duration, stop)
}

/// What profilers of several processes share: the modules (each ELF file
/// mapped and indexed once: four ranks of one job share libtorch_cpu's
/// symbol table) and the kernel's symbols.
#[derive(Clone, Default)]
pub struct Shared {
    modules: unwind::ModuleCache,
    kernel: std::sync::Arc<KernelSymbols>,
}

impl Shared {
    /// Reads kallsyms once.
    pub fn new() -> Self {
        Shared {
            modules: Default::default(),
            kernel: std::sync::Arc::new(KernelSymbols::load()),
        }
    }

    /// Drops the modules' file pages from the resident set (a long-running
    /// agent calls it once a period, so that the pages its lookups touched
    /// do not count against its memory cap).
    pub fn release_pages(&self) {
        self.modules.release_pages();
    }
}

/// Profiles one process period after period, keeping its perf events,
/// unwinder and symbolized frames between periods.
pub struct ProcessProfiler {
    pid: i32,
    hz: u64,
    walker: StackWalker,
    python: Option<python::PythonReader>,
    sampler: PerfSampler,
    names: HashMap<u32, String>,
    kernel_symbols: usize,
}

impl ProcessProfiler {
    /// Opens the process's perf events (after loading its modules: samples
    /// taken while they load would overflow the ring buffers).
    pub fn new(pid: i32, opts: &ProfileOptions, shared: &Shared) -> Result<Self, StackError> {
        let walker = StackWalker::new(pid, shared.kernel.clone(), shared.modules.clone());
        let python = if opts.python {
            maps::read_maps(pid)
                .ok()
                .and_then(|m| python::PythonReader::new(pid, &m))
        } else {
            None
        };
        let sampler = PerfSampler::open(pid, opts.hz, opts.stack_bytes)?;
        Ok(ProcessProfiler {
            pid,
            hz: opts.hz,
            walker,
            python,
            sampler,
            names: HashMap::new(),
            kernel_symbols: shared.kernel.len(),
        })
    }

    /// One period: samples for `duration` (or until `stop`) and returns its
    /// profile.
    pub fn profile(
        &mut self,
        duration: Duration,
        stop: &AtomicBool,
    ) -> Result<(StackProfile, ProfileStats), StackError> {
        let pid = self.pid;
        let mut builder = StackProfileBuilder::new();
        builder.label("pid", pid.to_string());
        if let Ok(cmd) = std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            builder.label("command", cmd.trim());
        }
        let start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let t0 = Instant::now();
        let mut last_refresh = t0;
        let mut batch: Vec<RawSample> = Vec::new();
        // Frame ids by address: interned once per address and period.
        let mut native_ids: HashMap<u64, u32> = HashMap::new();
        let mut kernel_ids: HashMap<u64, u32> = HashMap::new();
        let mut samples = 0u64;
        let lost_before = self.sampler.lost;
        let mut stitched = (0u64, 0u64); // (stitched, interpreter frames kept)
        let mut stale = 0u64;
        loop {
            let done = t0.elapsed() >= duration || stop.load(Ordering::Relaxed);
            self.sampler.drain(&mut batch);
            let read_at = perf::monotonic_ns();
            let py_stacks = match (&mut self.python, batch.is_empty()) {
                (Some(r), false) => r.stacks(),
                _ => HashMap::new(),
            };
            for s in batch.drain(..) {
                samples += 1;
                let name = self.names.entry(s.tid).or_insert_with(|| {
                    std::fs::read_to_string(format!("/proc/{pid}/task/{}/comm", s.tid))
                        .map(|c| c.trim().to_string())
                        .unwrap_or_else(|_| format!("thread {}", s.tid))
                });
                let mut ids = vec![builder.frame(Frame::label(name.clone()))];
                let user = self.walker.user_addresses(&s);
                let walker = &mut self.walker;
                // The Python stack is read now, not at the tick: a sample
                // older than MAX_PYTHON_LAG may have run another function
                // (a loaded host delays the reader), so its interpreter
                // frames stay unstitched rather than named wrongly.
                let fresh = read_at.saturating_sub(s.time) <= MAX_PYTHON_LAG_NS;
                if !fresh && py_stacks.contains_key(&s.tid) {
                    stale += 1;
                }
                match py_stacks.get(&s.tid).filter(|_| fresh) {
                    Some(py) => {
                        let native: Vec<Frame> =
                            user.iter().rev().map(|&a| walker.native_frame(a)).collect();
                        for f in stitch_python(native, py, &mut stitched) {
                            ids.push(builder.frame(f));
                        }
                    }
                    None => {
                        for &a in user.iter().rev() {
                            let id = *native_ids
                                .entry(a)
                                .or_insert_with(|| builder.frame(walker.native_frame(a)));
                            ids.push(id);
                        }
                    }
                }
                for &a in s.kernel.iter().rev() {
                    let id = *kernel_ids
                        .entry(a)
                        .or_insert_with(|| builder.frame(walker.kernel_frame(a)));
                    ids.push(id);
                }
                builder.add(ids, 1);
            }
            if done {
                break;
            }
            if last_refresh.elapsed() >= Duration::from_secs(1) {
                last_refresh = Instant::now();
                self.sampler.refresh_threads();
                if self.walker.refresh_maps() {
                    native_ids.clear();
                }
            }
            self.sampler.wait(Duration::from_millis(20));
        }
        let stats = ProfileStats {
            samples,
            lost: self.sampler.lost - lost_before,
            threads: self.sampler.thread_count(),
            unreadable: self
                .walker
                .unreadable
                .iter()
                .map(|(p, e)| format!("{p}: {e}"))
                .collect(),
            kernel_symbols: self.kernel_symbols,
            python: self
                .python
                .as_ref()
                .map(|p| format!("CPython 3.{}", p.minor())),
            python_stitched: stitched.0,
            python_mismatched: stitched.1,
            python_stale: stale,
        };
        let profile = builder.finish(
            self.hz as f64,
            start_unix_ns,
            t0.elapsed().as_nanos() as u64,
        );
        Ok((profile, stats))
    }
}

/// The oldest a sample may be when the Python stacks are read for its
/// frames to be stitched in: Python functions of a few milliseconds are
/// common in training loops.
const MAX_PYTHON_LAG_NS: u64 = 2_000_000;

/// Replaces each evaluation frame of `native` (root first) by the Python
/// frames it runs, when their number matches the C calls in `py` (innermost
/// first); counts into `counts` (stitched, mismatched).
fn stitch_python(
    native: Vec<Frame>,
    py: &[python::PyFrame],
    counts: &mut (u64, u64),
) -> Vec<Frame> {
    let evals = native
        .iter()
        .filter(|f| f.name.as_deref() == Some(EVAL_FRAME))
        .count();
    if evals == 0 {
        return native;
    }
    let groups = python::groups_root_first(py);
    if groups.len() != evals {
        counts.1 += 1;
        return native;
    }
    counts.0 += 1;
    replace_evals(native, groups, 0)
}
