//! Off-CPU profiles of the registered processes (`--profile-offcpu`; beyond
//! SysOM-AI, which lists blocked time as a limitation of CPU sampling):
//! one eBPF program on sched_switch for all of them, one profile per
//! process and period (`*-offcpu-<t>.pb.gz`), labelled like its CPU
//! profiles plus `kind=offcpu`, counts in µs. A thread's blocked interval
//! is counted when it runs again, in the period that sees it wake.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use whyslow_model::stack::StackProfileBuilder;
use whyslow_stacks::ebpf;

use crate::collector::{Collector, Next};
use crate::events::AgentEvent;
use crate::profiler::ProfilerArgs;
use crate::registry::Process;
use crate::spool::{unix_secs, Spool};

/// The longest wait between two ticks.
const NAP: Duration = Duration::from_millis(500);

/// The off-CPU profiler.
pub struct OffCpu {
    cfg: Arc<ProfilerArgs>,
    shared: Option<whyslow_stacks::Shared>,
    on: Option<Running>,
    /// The processes in the sampler's filter, by pid.
    traced: HashMap<u32, Process>,
    /// Those that exited: they leave the filter once their last period is
    /// written.
    gone: HashSet<u32>,
    /// The sampler refused a process: off-CPU profiling ends.
    failed: bool,
}

struct Running {
    sampler: ebpf::EbpfSampler,
    symbols: ebpf::Symbolizer,
    period: Duration,
    start: SystemTime,
    t0: Instant,
}

impl OffCpu {
    /// The profiler; `shared` holds the modules and kernel symbols.
    pub fn new(cfg: Arc<ProfilerArgs>, shared: whyslow_stacks::Shared) -> Self {
        OffCpu {
            cfg,
            shared: Some(shared),
            on: None,
            traced: HashMap::new(),
            gone: HashSet::new(),
            failed: false,
        }
    }

    /// Ends the period: one profile per process into the spool; `false`
    /// when the sampler failed (logged).
    fn finish(&mut self, spool: &Spool) -> bool {
        let Some(r) = self.on.as_mut() else {
            return false;
        };
        let start_unix_ns = r
            .start
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let counted = match r.sampler.drain() {
            Ok(c) => c,
            Err(e) => {
                AgentEvent::ProfileFailed {
                    pid: 0,
                    reason: format!("off-CPU profile (eBPF) stopped: {e}"),
                }
                .emit();
                return false;
            }
        };
        let mut by_pid: HashMap<u32, Vec<ebpf::CountedStack>> = HashMap::new();
        for c in counted {
            by_pid.entry(c.pid).or_default().push(c);
        }
        let mut builders: HashMap<u32, StackProfileBuilder> = HashMap::new();
        for (pid, stacks) in by_pid {
            let b = builders.entry(pid).or_default();
            r.symbols.add(&stacks, b);
        }
        r.symbols.refresh();
        let elapsed = r.t0.elapsed().as_nanos() as u64;
        for (pid, b) in builders {
            let Some(p) = self.traced.get(&pid) else {
                continue;
            };
            let mut profile = b.finish(1e6, start_unix_ns, elapsed);
            for (k, v) in p.labels() {
                profile.labels.insert(k, v);
            }
            profile.labels.insert("kind".into(), "offcpu".into());
            let path = spool.process_file(p, Some("offcpu"), unix_secs(r.start), "pb.gz");
            match spool.write(&path, &whyslow_stack_output::to_pprof(&profile)) {
                Ok(()) => AgentEvent::ProfileWritten {
                    pid: p.pid,
                    rank: p.rank,
                    samples: profile.total(),
                    path: &path,
                }
                .emit(),
                Err(e) => AgentEvent::ProfileFailed {
                    pid: p.pid,
                    reason: e.to_string(),
                }
                .emit(),
            }
        }
        // Processes that exited leave the filter.
        for pid in self.gone.drain() {
            let _ = r.sampler.remove_pid(pid);
            self.traced.remove(&pid);
        }
        true
    }
}

impl Collector for OffCpu {
    fn name(&self) -> &'static str {
        "offcpu"
    }

    fn start(&mut self) -> bool {
        let opts = ebpf::EbpfOptions {
            hz: 99,
            sampling_rate: 1.0,
            target: ebpf::Target::Pids(Vec::new()),
            measure: false,
            off_cpu: true,
            unwind: self.cfg.profile_unwind,
            max_cfi_rows: ebpf::DEFAULT_MAX_CFI_ROWS,
            python: true,
        };
        let sampler = match ebpf::EbpfSampler::open(&opts) {
            Ok(s) => s,
            Err(e) => {
                AgentEvent::ProfileFailed {
                    pid: 0,
                    reason: format!("off-CPU profile (eBPF) not started: {e}"),
                }
                .emit();
                return false;
            }
        };
        let Some(shared) = self.shared.take() else {
            return false;
        };
        self.on = Some(Running {
            sampler,
            symbols: ebpf::Symbolizer::new(shared, false),
            period: Duration::from_secs_f64(self.cfg.profile_period.max(1.0)),
            start: SystemTime::now(),
            t0: Instant::now(),
        });
        !crate::governor::stopped()
    }

    fn on_added(&mut self, p: &Process, _: &Spool) {
        let Some(r) = self.on.as_mut().filter(|_| !self.failed) else {
            return;
        };
        let pid = p.pid as u32;
        if !self.traced.contains_key(&pid) {
            if let Err(e) = r.sampler.add_pid(pid) {
                AgentEvent::ProfileFailed {
                    pid: p.pid,
                    reason: format!("off-CPU profile: {e}"),
                }
                .emit();
                self.failed = true;
                return;
            }
        }
        // A recycled pid stays in the filter, under its new process.
        self.traced.insert(pid, p.clone());
        self.gone.remove(&pid);
    }

    fn on_removed(&mut self, p: &Process, _: &Spool) {
        let pid = p.pid as u32;
        if self.traced.get(&pid).is_some_and(|t| t.key() == p.key()) {
            self.gone.insert(pid);
        }
    }

    fn tick(&mut self, spool: &Spool, _: &AtomicBool) -> Next {
        if self.failed {
            return Next::Done;
        }
        let Some(r) = self.on.as_ref() else {
            return Next::Done;
        };
        let left = r.period.saturating_sub(r.t0.elapsed());
        if !left.is_zero() {
            return Next::After(left.min(NAP));
        }
        if !self.finish(spool) || crate::governor::stopped() {
            return Next::Done;
        }
        if let Some(r) = self.on.as_mut() {
            r.start = SystemTime::now();
            r.t0 = Instant::now();
        }
        Next::After(NAP)
    }

    /// The period so far.
    fn flush(&mut self, spool: &Spool) {
        if !self.failed {
            self.finish(spool);
        }
    }
}
