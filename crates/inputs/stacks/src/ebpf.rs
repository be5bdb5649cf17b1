//! The eBPF sampler (SysOM-AI §3.3): `bpf/profile.bpf.c` on a software
//! cpu-clock perf event per CPU, stacks aggregated in BPF maps and read here
//! period by period, with no per-sample wake-up.
//!
//! The program counts (process, thread, kernel stack, user stack) into one of
//! two generations; [`EbpfSampler::drain`] flips the generation, then reads and
//! deletes the counts of the other one (double buffering: an increment that
//! races the flip lands in the next drain, or at worst is lost). Stacks are
//! stored once in the kernel under a 64-bit hash and copied out once.
//!
//! User stacks are walked in the kernel per [`EbpfOptions::unwind`]: with
//! DWARF rows compiled from each module's `.eh_frame` into BPF maps, else
//! validated frame-pointer steps (the paper's Algorithm 1, `bpf/unwind.bpf.h`
//! and [`crate::cfi`]), or with the kernel's frame-pointer walk alone
//! (complete for code built with frame pointers, 1–3 frames for a CPython
//! without them). A CPython 3.10–3.13 thread's Python frames are walked at
//! the same tick (`bpf/python.bpf.h`, [`crate::ebpf_python`]) and put in
//! place of the interpreter's frames. What this path adds is reach and cost: every
//! process of the host, a cgroup or a set of processes, kernel stacks
//! included, at a few µs per sample and a fraction of ticks (the paper's
//! "sampling rate") taking a stack.
//!
//! Loaded with aya (pure Rust: no libbpf, libelf or C toolchain on the user's
//! machine); the object is built by `scripts/build-bpf` and checked in.

use std::collections::HashMap;
use std::path::PathBuf;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{
    perf_sw_ids::PERF_COUNT_SW_CPU_CLOCK, PerfEventScope, PerfTypeId, SamplePolicy,
};
use aya::programs::PerfEvent;
use aya::{Ebpf, EbpfLoader, Pod};

pub use crate::ebpf_fallback::FallbackCounters;
use crate::ebpf_fallback::{CopiedStack, Fallback};
pub use crate::ebpf_python::PythonCounters;
use crate::ebpf_python::PythonProcs;
pub use crate::ebpf_symbols::Symbolizer;
use crate::ebpf_tables::UnwindTables;
pub use crate::ebpf_tables::{TableStats, UserUnwind};

/// The compiled program (`bpf/profile.bpf.c`, built by `scripts/build-bpf`),
/// 8-byte aligned as the ELF parser needs.
pub static PROFILE_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/profile.bpf.o");

/// The off-CPU program (`bpf/offcpu.bpf.c`): a raw tracepoint on
/// `sched_switch` that counts the microseconds a target thread spent
/// blocked under the stacks it blocked with (same maps and drain as the
/// sampler's; the counts are µs, not samples).
pub static OFFCPU_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/offcpu.bpf.o");

const MAX_DEPTH: usize = 127;
/// `control[0]` that stops counting (`stacks.bpf.h`).
const GENERATION_STOPPED: u32 = 2;

/// What the program samples.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every process of the host (interference often comes from another one).
    Host,
    /// These processes (thread group ids); more can be added while running.
    Pids(Vec<u32>),
    /// Processes in these cgroups or their descendants. Cgroup v2
    /// directories are filtered in the kernel by cgroup id; with any v1
    /// directory (`/sys/fs/cgroup/cpu/…`, whose ids the kernel's helper
    /// does not report) the program samples the host and the drain keeps the
    /// processes listed in the directories' `cgroup.procs` (re-read by
    /// [`EbpfSampler::track_cgroups`] and at each drain).
    Cgroups(Vec<PathBuf>),
}

/// Settings of [`EbpfSampler::open`].
#[derive(Debug, Clone)]
pub struct EbpfOptions {
    /// Measure the program's own run time ([`enable_run_time_stats`]) during
    /// [`profile`]; read it from [`EbpfStats::run_time_ns`].
    pub measure: bool,
    /// Ticks per second per CPU (10..=999).
    pub hz: u64,
    /// Fraction of ticks that take a stack (SysOM-AI's "sampling rate",
    /// Table 2): 1.0 takes every tick, 0.1 one in ten.
    pub sampling_rate: f64,
    /// What to sample.
    pub target: Target,
    /// Off-CPU instead of on-CPU: count the time target threads spend
    /// blocked (reads, locks, sleeps; not preemption), in µs, under the
    /// stacks they blocked with (`bpf/offcpu.bpf.c`, Linux 5.18+). `hz` and
    /// `sampling_rate` do not apply.
    pub off_cpu: bool,
    /// How user stacks are walked in the kernel (hybrid: DWARF CFI rows,
    /// else validated frame-pointer steps).
    pub unwind: UserUnwind,
    /// Rows the kernel's CFI table holds (16 bytes each); modules that do
    /// not fit get frame-pointer steps.
    pub max_cfi_rows: u32,
    /// Walk the Python frames of CPython 3.10–3.13 processes at the tick
    /// and put them in place of the interpreter's (`bpf/python.bpf.h`).
    pub python: bool,
}

/// Default [`EbpfOptions::max_cfi_rows`]: 4 Mi rows, 64 MiB of kernel
/// memory (libtorch_cpu.so alone needs about 1.3 M).
pub const DEFAULT_MAX_CFI_ROWS: u32 = 4 << 20;

/// Why the eBPF sampler could not start or read.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// Loading or verifying the program failed.
    #[error(
        "loading the BPF program: {0} (needs root or CAP_BPF + CAP_PERFMON, and a kernel with BPF)"
    )]
    Load(String),
    /// Attaching to a CPU's perf event failed.
    #[error("attaching to cpu-clock on CPU {0}: {1}")]
    Attach(u32, String),
    /// A map could not be read or written.
    #[error("BPF map {0}: {1}")]
    Map(&'static str, String),
    /// A setting is out of range.
    #[error("{0}")]
    Setting(String),
}

/// Counters the program keeps (summed over CPUs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EbpfStats {
    /// Ticks the program ran on.
    pub ticks: u64,
    /// Ticks in a process outside the target.
    pub filtered: u64,
    /// Ticks left out by the sampling rate.
    pub skipped: u64,
    /// Samples counted.
    pub samples: u64,
    /// Kernel stack reads that failed.
    pub kernel_stack_errors: u64,
    /// User stack reads that failed.
    pub user_stack_errors: u64,
    /// Stacks not stored: the stack map was full.
    pub stacks_full: u64,
    /// Samples not counted: the count map was full.
    pub counts_full: u64,
    /// Ticks on an idle CPU.
    pub idle: u64,
    /// Nanoseconds the program ran in the kernel (with `measure`; else 0).
    pub run_time_ns: u64,
    /// Program runs counted with it.
    pub runs: u64,
    /// In-kernel user stack walks (DWARF or hybrid) and how they ended.
    pub unwind: UnwindCounters,
    /// What the unwind tables hold.
    pub tables: TableStats,
    /// Processes whose Python frames the program walks.
    pub python_processes: u64,
    /// How the Python stacks were put in (filled by [`profile`] from its
    /// [`Symbolizer`]; zero from [`EbpfSampler::stats`]).
    pub python: PythonCounters,
}

/// How the in-kernel user stack walks went (`bpf/unwind.bpf.h`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindCounters {
    /// Walks that reached the outermost frame.
    pub complete: u64,
    /// Walks cut at the maximum depth.
    pub truncated: u64,
    /// Walks that stopped where there was no CFI row and no valid frame pointer.
    pub no_cfi: u64,
    /// Walks that stopped at a rule the program does not evaluate.
    pub unsupported: u64,
    /// Walks that stopped at a return address outside executable code.
    pub bad_address: u64,
    /// Walks that stopped at unreadable user memory.
    pub read_errors: u64,
    /// Samples of processes without tables yet (the kernel's FP walk).
    pub not_loaded: u64,
    /// Frames found with a CFI row.
    pub dwarf_steps: u64,
    /// Frames found with a frame-pointer step.
    pub fp_steps: u64,
    /// Walks stopped at an unsupported rule whose sample went to userspace
    /// with a copy of the stack (on-CPU samples).
    pub copied: u64,
    /// ... of which the ring buffer had no room for: counted with the
    /// frames found in the kernel.
    pub copy_lost: u64,
    /// What userspace did with the copies.
    pub fallback: FallbackCounters,
}

/// One aggregated stack of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CountedStack {
    /// Process (thread group) id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Kernel addresses, innermost first (empty when the tick was in user mode).
    pub kernel: Vec<u64>,
    /// User addresses, innermost first (frame-pointer walk).
    pub user: Vec<u64>,
    /// The thread's Python stack at the tick: code object addresses,
    /// innermost first, bit 0 set on a frame that began a C-level
    /// evaluation call (empty outside CPython).
    pub python: Vec<u64>,
    /// Samples.
    pub count: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct CountKey {
    tgid: u32,
    tid: u32,
    kernel: u64,
    user: u64,
    python: u64,
    generation: u32,
    pad: u32,
}
// SAFETY: plain C struct of integers, no padding holes (the pad is explicit).
unsafe impl Pod for CountKey {}

#[repr(C)]
#[derive(Clone, Copy)]
struct Stack {
    depth: u64,
    ips: [u64; MAX_DEPTH],
}
// SAFETY: plain C struct of integers.
unsafe impl Pod for Stack {}

/// The loaded, attached program and its maps.
pub struct EbpfSampler {
    ebpf: Ebpf,
    /// The in-kernel unwinder's tables (None: the kernel's FP walk).
    tables: Option<UnwindTables>,
    generation: u32,
    stacks: HashMap<u64, Vec<u64>>,
    /// Cgroup v1 targets, filtered here: the directories and the processes
    /// seen in them.
    members: Option<CgroupMembers>,
    /// Samples whose walk the program handed over (`copied`), and the
    /// unwinder that finishes them.
    copied: Option<RingBuf<MapData>>,
    fallback: Fallback,
    /// Finished samples not drained yet, by (process, thread, kernel stack
    /// hash, Python stack hash, user stack).
    pending: HashMap<PendingKey, u64>,
    /// The processes whose Python frames the program walks.
    python: PythonProcs,
}

/// (process, thread, kernel stack hash, Python stack hash, user stack).
type PendingKey = (u32, u32, u64, u64, Vec<u64>);

/// Processes seen in a set of cgroup directories (any version), by their
/// `cgroup.procs` files, recursively. A process stays a member once seen:
/// its last samples are drained after it exited.
#[derive(Debug, Default)]
struct CgroupMembers {
    dirs: Vec<PathBuf>,
    pids: std::collections::HashSet<u32>,
}

impl CgroupMembers {
    fn refresh(&mut self) {
        fn walk(dir: &std::path::Path, out: &mut std::collections::HashSet<u32>, depth: u32) {
            if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
            if depth == 0 {
                return;
            }
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out, depth - 1);
                }
            }
        }
        for d in &self.dirs {
            walk(d, &mut self.pids, 8);
        }
    }
}

impl EbpfSampler {
    /// Loads the program and attaches it to every online CPU.
    pub fn open(opts: &EbpfOptions) -> Result<Self, EbpfError> {
        if !(10..=999).contains(&opts.hz) {
            return Err(EbpfError::Setting(format!(
                "sampling frequency {} Hz is outside 10..=999",
                opts.hz
            )));
        }
        if !(opts.sampling_rate > 0.0 && opts.sampling_rate <= 1.0) {
            return Err(EbpfError::Setting(format!(
                "sampling rate {} is outside (0, 1]",
                opts.sampling_rate
            )));
        }
        // Cgroup v1 directories are filtered in userspace (see `Target`).
        let members = match &opts.target {
            Target::Cgroups(dirs) => {
                let mut v1 = false;
                for d in dirs {
                    if !d.join("cgroup.procs").is_file() {
                        return Err(EbpfError::Setting(format!(
                            "cgroup {}: not a cgroup directory (no cgroup.procs)",
                            d.display()
                        )));
                    }
                    v1 |= !is_cgroup2(d).unwrap_or(false);
                }
                v1.then(|| {
                    let mut m = CgroupMembers {
                        dirs: dirs.clone(),
                        ..CgroupMembers::default()
                    };
                    m.refresh();
                    m
                })
            }
            _ => None,
        };
        let filter: u32 = match opts.target {
            Target::Host => 0,
            Target::Pids(_) => 1,
            Target::Cgroups(_) if members.is_some() => 0,
            Target::Cgroups(_) => 2,
        };
        let rate = ((opts.sampling_rate * 1000.0).round() as u32).clamp(1, 1000);
        let unwind = opts.unwind.mode();
        let rows = if opts.unwind == UserUnwind::FramePointer {
            1
        } else {
            opts.max_cfi_rows.max(1)
        };
        let mut ebpf = EbpfLoader::new()
            .set_global("FILTER", &filter, true)
            .set_global("RATE_PER_MILLE", &rate, true)
            .set_global("UNWIND", &unwind, true)
            .set_max_entries("cfi_rows", rows)
            .load(if opts.off_cpu {
                OFFCPU_OBJECT
            } else {
                PROFILE_OBJECT
            })
            .map_err(|e| EbpfError::Load(chain(&e)))?;
        let mut tables = (opts.unwind != UserUnwind::FramePointer).then(|| UnwindTables::new(rows));
        let mut python = PythonProcs::new(opts.python);
        match &opts.target {
            Target::Host => {}
            Target::Pids(pids) => {
                for &p in pids {
                    add_pid(&mut ebpf, p)?;
                    python.load(&mut ebpf, p)?;
                    if let Some(t) = &mut tables {
                        t.load(&mut ebpf, p)?;
                    }
                }
            }
            Target::Cgroups(_) if members.is_some() => {}
            Target::Cgroups(dirs) => {
                let mut map: BpfHashMap<&mut MapData, u64, u8> = map_mut(&mut ebpf, "cgroups")?;
                for d in dirs {
                    let id = cgroup_id(d)?;
                    map.insert(id, 1, 0)
                        .map_err(|e| EbpfError::Map("cgroups", chain(&e)))?;
                }
            }
        }
        if opts.off_cpu {
            let prog: &mut aya::programs::RawTracePoint = ebpf
                .program_mut("on_sched_switch")
                .ok_or_else(|| EbpfError::Load("no program on_sched_switch in the object".into()))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| EbpfError::Load(chain(&e)))?;
            prog.load().map_err(|e| EbpfError::Load(chain(&e)))?;
            prog.attach("sched_switch").map_err(|e| {
                EbpfError::Load(format!("attaching to sched_switch: {}", chain(&e)))
            })?;
        } else {
            let prog: &mut PerfEvent = ebpf
                .program_mut("on_cpu_clock")
                .ok_or_else(|| EbpfError::Load("no program on_cpu_clock in the object".into()))?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| EbpfError::Load(chain(&e)))?;
            prog.load().map_err(|e| EbpfError::Load(chain(&e)))?;
            let cpus = aya::util::online_cpus()
                .map_err(|(what, e)| EbpfError::Load(format!("{what}: {e}")))?;
            for cpu in cpus {
                prog.attach(
                    PerfTypeId::Software,
                    PERF_COUNT_SW_CPU_CLOCK as u64,
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(opts.hz),
                    false,
                )
                .map_err(|e| EbpfError::Attach(cpu, chain(&e)))?;
            }
        }
        let copied = match &tables {
            Some(_) => {
                let map = ebpf
                    .take_map("copied")
                    .ok_or_else(|| EbpfError::Map("copied", "not in the object".into()))?;
                Some(RingBuf::try_from(map).map_err(|e| EbpfError::Map("copied", chain(&e)))?)
            }
            None => None,
        };
        Ok(EbpfSampler {
            ebpf,
            tables,
            generation: 0,
            stacks: HashMap::new(),
            members,
            copied,
            fallback: Fallback::default(),
            pending: HashMap::new(),
            python,
        })
    }

    /// Re-reads the cgroup v1 targets' member processes (nothing for other
    /// targets): call it now and then between drains, so that a process
    /// that lived only between two drains is kept too.
    pub fn track_cgroups(&mut self) {
        if let Some(m) = &mut self.members {
            m.refresh();
        }
    }

    /// The work between drains, to call every 50–100 ms: re-reads cgroup
    /// v1 members ([`Self::track_cgroups`]) and finishes the samples the
    /// program handed to userspace (its ring buffer holds about 190 of them:
    /// read often, it rarely fills; a full one keeps the frames the kernel
    /// found, counted in [`UnwindCounters::copy_lost`]).
    pub fn poll(&mut self) {
        self.track_cgroups();
        self.take_copied();
    }

    /// Adds a process to a [`Target::Pids`] sampler.
    pub fn add_pid(&mut self, pid: u32) -> Result<(), EbpfError> {
        add_pid(&mut self.ebpf, pid)?;
        self.python.load(&mut self.ebpf, pid)?;
        if let Some(t) = &mut self.tables {
            t.load(&mut self.ebpf, pid)?;
        }
        Ok(())
    }

    /// Removes a process from a [`Target::Pids`] sampler.
    pub fn remove_pid(&mut self, pid: u32) -> Result<(), EbpfError> {
        if let Some(t) = &mut self.tables {
            t.forget(&mut self.ebpf, pid)?;
        }
        let mut map: BpfHashMap<&mut MapData, u32, u8> = map_mut(&mut self.ebpf, "pids")?;
        match map.remove(&pid) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(EbpfError::Map("pids", chain(&e))),
        }
    }

    /// The counts since the last drain: flips the generation the program
    /// counts into, then reads and deletes the previous one.
    pub fn drain(&mut self) -> Result<Vec<CountedStack>, EbpfError> {
        let old = self.generation;
        self.generation ^= 1;
        {
            let mut control: Array<&mut MapData, u32> = map_mut(&mut self.ebpf, "control")?;
            control
                .set(0, self.generation, 0)
                .map_err(|e| EbpfError::Map("control", chain(&e)))?;
        }
        let out = self.drain_generation(old)?;
        // Python frames of the processes sampled without them (host and
        // cgroup targets): walked from their next sample on.
        self.python.refresh(&mut self.ebpf)?;
        let mut new: Vec<u32> = out
            .iter()
            .map(|s| s.pid)
            .filter(|p| !self.python.knows(*p))
            .collect();
        new.sort_unstable();
        new.dedup();
        for pid in new {
            self.python.load(&mut self.ebpf, pid)?;
        }
        // Tables for the processes sampled without them (host and cgroup
        // targets: walked from their next sample on), new libraries of the
        // others, and none for processes that exited.
        if let Some(t) = &mut self.tables {
            t.refresh(&mut self.ebpf)?;
            let mut new: Vec<u32> = out.iter().map(|s| s.pid).filter(|p| !t.knows(*p)).collect();
            new.sort_unstable();
            new.dedup();
            for pid in new {
                t.load(&mut self.ebpf, pid)?;
            }
            // Large modules get their rows once a sample lands in them
            // (as the sampled address, or where a walk stopped).
            let mut hits: Vec<(u32, u64)> = out
                .iter()
                .flat_map(|s| s.user.iter().map(move |&ip| (s.pid, ip)))
                .collect();
            hits.sort_unstable();
            hits.dedup();
            for &(pid, ip) in &hits {
                t.touch(pid, ip);
            }
            for (pid, ip) in hits {
                t.hit(&mut self.ebpf, pid, ip)?;
            }
            t.flush(&mut self.ebpf)?;
        }
        Ok(out)
    }

    /// Reads and deletes the counts of generation `old`, with their stacks.
    fn drain_generation(&mut self, old: u32) -> Result<Vec<CountedStack>, EbpfError> {
        let finished = self.finish_copied();
        let mut counts: BpfHashMap<&mut MapData, CountKey, u64> =
            map_mut(&mut self.ebpf, "counts")?;
        let mut taken: Vec<(CountKey, u64)> = Vec::new();
        for item in counts.iter() {
            let Ok((k, v)) = item else { continue }; // deleted while iterating
            if k.generation == old {
                taken.push((k, v));
            }
        }
        for (k, _) in &taken {
            let _ = counts.remove(k);
        }
        let mut finished = finished;
        if let Some(m) = &mut self.members {
            m.refresh();
            taken.retain(|(k, _)| m.pids.contains(&k.tgid));
            finished.retain(|k, _| m.pids.contains(&k.0));
        }
        // The copy of stacks stays bounded: cleared before a drain, never in
        // the middle of one (a count may name a stack only the copy holds).
        if self.stacks.len() > 100_000 {
            self.stacks.clear();
        }
        let mut stacks: BpfHashMap<&mut MapData, u64, Stack> = map_mut(&mut self.ebpf, "stacks")?;
        let mut copied: Vec<u64> = Vec::new();
        let mut read = |h: u64, cache: &mut HashMap<u64, Vec<u64>>| -> Vec<u64> {
            if h == 0 {
                return Vec::new();
            }
            if let Some(s) = cache.get(&h) {
                return s.clone();
            }
            let ips = match stacks.get(&h, 0) {
                Ok(s) => s.ips[..(s.depth as usize).min(MAX_DEPTH)].to_vec(),
                Err(_) => Vec::new(),
            };
            copied.push(h);
            cache.insert(h, ips.clone());
            ips
        };
        let mut out = Vec::with_capacity(taken.len());
        for (k, count) in taken {
            out.push(CountedStack {
                pid: k.tgid,
                tid: k.tid,
                kernel: read(k.kernel, &mut self.stacks),
                user: read(k.user, &mut self.stacks),
                python: read(k.python, &mut self.stacks),
                count,
            });
        }
        for ((pid, tid, kernel, python, user), count) in finished {
            out.push(CountedStack {
                pid,
                tid,
                kernel: read(kernel, &mut self.stacks),
                user,
                python: read(python, &mut self.stacks),
                count,
            });
        }
        // Copied stacks leave the kernel's map (a sample re-inserts one it
        // needs again), which then holds only what one period brings.
        for h in copied {
            let _ = stacks.remove(&h);
        }
        Ok(out)
    }

    /// Finishes the samples the program handed over, into `pending`.
    fn take_copied(&mut self) {
        let Some(ring) = &mut self.copied else {
            return;
        };
        // Bounded: the ring buffer holds a few hundred records.
        while let Some(item) = ring.next() {
            let Some(c) = CopiedStack::parse(&item) else {
                continue;
            };
            drop(item);
            let user = self.fallback.finish(&c);
            *self
                .pending
                .entry((c.tgid, c.tid, c.kernel, c.python, user))
                .or_default() += 1;
        }
    }

    /// The samples finished in userspace since the last drain, counted by
    /// (process, thread, kernel stack hash, user stack).
    fn finish_copied(&mut self) -> HashMap<PendingKey, u64> {
        self.take_copied();
        // Mappings are read again for the next period's samples.
        self.fallback.new_drain();
        std::mem::take(&mut self.pending)
    }

    /// Stops counting and returns what was counted since the last drain:
    /// after it, the counters and the drained counts agree exactly.
    pub fn finish(&mut self) -> Result<Vec<CountedStack>, EbpfError> {
        {
            let mut control: Array<&mut MapData, u32> = map_mut(&mut self.ebpf, "control")?;
            control
                .set(0, GENERATION_STOPPED, 0)
                .map_err(|e| EbpfError::Map("control", chain(&e)))?;
        }
        // A program already past the check on another CPU finishes within
        // microseconds.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let mut out = self.drain_generation(self.generation)?;
        out.extend(self.drain_generation(self.generation ^ 1)?);
        Ok(out)
    }

    /// The program's counters, summed over CPUs.
    pub fn stats(&self) -> Result<EbpfStats, EbpfError> {
        let map: PerCpuArray<&MapData, u64> = map_ref(&self.ebpf, "stats")?;
        let mut v = [0u64; 20];
        for (i, slot) in v.iter_mut().enumerate() {
            *slot = map
                .get(&(i as u32), 0)
                .map(|per_cpu| per_cpu.iter().sum())
                .map_err(|e| EbpfError::Map("stats", chain(&e)))?;
        }
        Ok(EbpfStats {
            ticks: v[0],
            filtered: v[1],
            skipped: v[2],
            samples: v[3],
            kernel_stack_errors: v[4],
            user_stack_errors: v[5],
            stacks_full: v[6],
            counts_full: v[7],
            idle: v[8],
            run_time_ns: 0,
            runs: 0,
            unwind: UnwindCounters {
                complete: v[9],
                truncated: v[10],
                no_cfi: v[11],
                unsupported: v[12],
                bad_address: v[13],
                read_errors: v[14],
                not_loaded: v[15],
                dwarf_steps: v[16],
                fp_steps: v[17],
                copied: v[18],
                copy_lost: v[19],
                fallback: self.fallback.counters,
            },
            tables: self.tables.as_ref().map(|t| t.stats()).unwrap_or_default(),
            python_processes: self.python.walked() as u64,
            python: PythonCounters::default(),
        })
    }

    /// Program id (for `bpftool prog show id N`).
    pub fn program_id(&self) -> Option<u32> {
        let prog: &PerfEvent = self.ebpf.program("on_cpu_clock")?.try_into().ok()?;
        prog.info().ok().map(|i| i.id())
    }

    /// Time the program has run in the kernel and how many times, while
    /// [`enable_run_time_stats`] was held (zero otherwise).
    pub fn run_time(&self) -> Option<(std::time::Duration, u64)> {
        let prog: &PerfEvent = self.ebpf.program("on_cpu_clock")?.try_into().ok()?;
        prog.info().ok().map(|i| (i.run_time(), i.run_count()))
    }
}

/// Turns on the kernel's BPF run-time statistics (every program's run time
/// and count) for as long as the returned descriptor is open. They cost two
/// clock reads per program run, system-wide: only for measurements.
pub fn enable_run_time_stats() -> Result<std::os::fd::OwnedFd, EbpfError> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| EbpfError::Load(format!("enabling BPF run-time statistics: {}", chain(&e))))
}

fn add_pid(ebpf: &mut Ebpf, pid: u32) -> Result<(), EbpfError> {
    let mut map: BpfHashMap<&mut MapData, u32, u8> = map_mut(ebpf, "pids")?;
    map.insert(pid, 1, 0)
        .map_err(|e| EbpfError::Map("pids", chain(&e)))
}

pub(crate) fn map_mut<'a, V>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<V, EbpfError>
where
    V: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf
        .map_mut(name)
        .ok_or_else(|| EbpfError::Map(name, "not in the object".into()))?;
    V::try_from(m).map_err(|e| EbpfError::Map(name, chain(&e)))
}

fn map_ref<'a, V>(ebpf: &'a Ebpf, name: &'static str) -> Result<V, EbpfError>
where
    V: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf
        .map(name)
        .ok_or_else(|| EbpfError::Map(name, "not in the object".into()))?;
    V::try_from(m).map_err(|e| EbpfError::Map(name, chain(&e)))
}

/// The cgroup id the kernel reports for a cgroup directory: its inode
/// number. Only cgroup v2 directories: `bpf_get_current_cgroup_id` reads the
/// unified hierarchy, so the id of a v1 directory (`/sys/fs/cgroup/cpu/…`)
/// never matches (that is an error naming the directory; [`Target::Cgroups`]
/// filters v1 directories in userspace instead).
pub fn cgroup_id(dir: &std::path::Path) -> Result<u64, EbpfError> {
    use std::os::unix::fs::MetadataExt;
    let err = |why: String| EbpfError::Setting(format!("cgroup {}: {why}", dir.display()));
    if !is_cgroup2(dir).map_err(|e| err(e.to_string()))? {
        return Err(err(
            "not a cgroup v2 directory (eBPF filters by the unified hierarchy's cgroup ids; \
             give the process's cgroup under the cgroup2 mount, or --pid)"
                .into(),
        ));
    }
    std::fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(|e| err(e.to_string()))
}

/// Whether `dir` lies on a cgroup2 file system.
pub fn is_cgroup2(dir: &std::path::Path) -> std::io::Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statfs fills the struct it is given; `path` is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// Samples `opts.target` for `duration` (or until `stop`), draining the
/// kernel's counts every `drain_every`, and returns the symbolized profile
/// and the program's counters.
pub fn profile(
    opts: &EbpfOptions,
    duration: std::time::Duration,
    drain_every: std::time::Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(whyslow_model::stack::StackProfile, EbpfStats), EbpfError> {
    use std::sync::atomic::Ordering;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    // Kernel symbols first (they can take a while to load): once attached,
    // the loop below must run at once, to read the ring buffer of samples
    // handed to userspace before it fills.
    let mut symbols = Symbolizer::new(
        crate::Shared::new(),
        !matches!(&opts.target, Target::Pids(p) if p.len() == 1),
    );
    // The period starts before the program is attached: it covers all it
    // counts.
    let t0 = Instant::now();
    let measuring = if opts.measure {
        Some(enable_run_time_stats()?)
    } else {
        None
    };
    let mut sampler = EbpfSampler::open(opts)?;
    // Sampling lasts `duration` from here, the program attached.
    let attached = Instant::now();
    let mut builder = whyslow_model::stack::StackProfileBuilder::new();
    if let Target::Pids(p) = &opts.target {
        if let [pid] = p.as_slice() {
            builder.label("pid", pid.to_string());
        }
    }
    let mut last = attached;
    let mut drained = false;
    loop {
        let done = attached.elapsed() >= duration || stop.load(Ordering::Relaxed);
        // The first drain comes after a second: it loads the unwind rows of
        // the large modules the first samples landed in.
        let due = if drained {
            drain_every
        } else {
            drain_every.min(std::time::Duration::from_secs(1))
        };
        if done || last.elapsed() >= due {
            drained = true;
            last = Instant::now();
            let counted = sampler.drain()?;
            symbols.add(&counted, &mut builder);
            symbols.refresh();
        }
        if done {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        sampler.poll();
    }
    // The rest, counting stopped: increments that raced the last drain.
    let counted = sampler.finish()?;
    symbols.add(&counted, &mut builder);
    let mut stats = sampler.stats()?;
    stats.python = symbols.python_counters();
    if measuring.is_some() {
        if let Some((t, n)) = sampler.run_time() {
            stats.run_time_ns = t.as_nanos() as u64;
            stats.runs = n;
        }
    }
    drop(measuring);
    // Off-CPU counts are µs: "samples" at 1 MHz, so a count × 10⁹/hz is
    // the nanoseconds spent blocked.
    let hz = if opts.off_cpu {
        1e6
    } else {
        opts.hz as f64 * opts.sampling_rate
    };
    let profile = builder.finish(hz, start_unix_ns, t0.elapsed().as_nanos() as u64);
    Ok((profile, stats))
}

#[cfg(test)]
mod cgroup_tests {
    use super::*;

    #[test]
    fn only_cgroup2_directories_have_an_id() {
        // A directory that is no cgroup at all is refused with its name.
        let e = cgroup_id(std::path::Path::new("/tmp"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/tmp") && e.contains("cgroup v2"), "{e}");
        assert!(cgroup_id(std::path::Path::new("/no/such/dir")).is_err());
        // Where this machine mounts cgroup2 (the unified tree), its root has one.
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let v2 = mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
        });
        if let Some(root) = v2 {
            assert!(is_cgroup2(std::path::Path::new(&root)).unwrap());
            assert!(cgroup_id(std::path::Path::new(&root)).unwrap() > 0);
        }
    }
}
