//! CPU profiles of the registered processes (SysOM-AI §3.3): one thread
//! per live process (at most `--profile-max-processes`) profiles it period
//! after period with perf events and writes each period's profile, labelled
//! with the process's job, rank, host and pid, as gzip pprof into the
//! spool. A process that exits or whose pid was recycled is dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use crate::collector::{Collector, Next, SCAN_EVERY};
use crate::events::AgentEvent;
use crate::profiler::ProfilerArgs;
use crate::registry::Process;
use crate::spool::{unix_secs, Spool};

/// The per-process CPU profilers.
pub struct Profiles {
    cfg: Arc<ProfilerArgs>,
    spool: Arc<Spool>,
    stop: Arc<AtomicBool>,
    shared: whyslow_stacks::Shared,
    /// The registered processes, by pid.
    known: BTreeMap<i32, Process>,
    running: HashMap<i32, JoinHandle<()>>,
    /// Over `--profile-max-processes` when they registered.
    refused: BTreeSet<i32>,
}

impl Profiles {
    /// Profilers writing into `spool` until `stop`; `shared` holds the
    /// modules and kernel symbols every profiler reads.
    pub fn new(
        cfg: Arc<ProfilerArgs>,
        spool: Arc<Spool>,
        stop: Arc<AtomicBool>,
        shared: whyslow_stacks::Shared,
    ) -> Self {
        Profiles {
            cfg,
            spool,
            stop,
            shared,
            known: BTreeMap::new(),
            running: HashMap::new(),
            refused: BTreeSet::new(),
        }
    }
}

impl Collector for Profiles {
    fn name(&self) -> &'static str {
        "profile"
    }

    fn on_added(&mut self, p: &Process, _: &Spool) {
        self.known.insert(p.pid, p.clone());
    }

    fn on_removed(&mut self, p: &Process, _: &Spool) {
        // Its thread ends by itself: it sees the process gone.
        self.known.remove(&p.pid);
        self.refused.remove(&p.pid);
    }

    /// Starts a profiler for each registered process that has none (again
    /// after one ended while its process runs on).
    fn tick(&mut self, _: &Spool, _: &AtomicBool) -> Next {
        self.running.retain(|_, h| !h.is_finished());
        let max = self.cfg.profile_max_processes;
        for p in self.known.values() {
            if self.running.contains_key(&p.pid) || self.refused.contains(&p.pid) || !p.alive() {
                continue;
            }
            if crate::governor::stopped() {
                break;
            }
            if self.running.len() >= max {
                self.refused.insert(p.pid);
                AgentEvent::ProfileFailed {
                    pid: p.pid,
                    reason: format!(
                        "not profiled: {max} processes already are (--profile-max-processes)"
                    ),
                }
                .emit();
                continue;
            }
            AgentEvent::ProfileStarted {
                pid: p.pid,
                rank: p.rank,
                job: &p.job,
            }
            .emit();
            let (p2, cfg, spool, stop, shared) = (
                p.clone(),
                self.cfg.clone(),
                self.spool.clone(),
                self.stop.clone(),
                self.shared.clone(),
            );
            self.running.insert(
                p.pid,
                std::thread::spawn(move || profile_loop(p2, &cfg, &spool, &stop, shared)),
            );
        }
        Next::After(SCAN_EVERY)
    }

    fn flush(&mut self, _: &Spool) {
        for (_, h) in self.running.drain() {
            let _ = h.join();
        }
    }
}

/// Stops profiling `p` after `e`, saying why unless the process is gone
/// (not permitted or not supported).
fn give_up(p: &Process, e: whyslow_stacks::StackError) {
    if p.alive() {
        AgentEvent::ProfileFailed {
            pid: p.pid,
            reason: e.to_string(),
        }
        .emit();
    }
}

/// Profiles one process, period after period, until it exits or `stop`.
fn profile_loop(
    p: Process,
    cfg: &ProfilerArgs,
    spool: &Spool,
    stop: &AtomicBool,
    shared: whyslow_stacks::Shared,
) {
    let opts = whyslow_stacks::ProfileOptions {
        hz: cfg.profile_hz.clamp(1, 999),
        duration: Duration::from_secs_f64(cfg.profile_period.max(1.0)),
        ..Default::default()
    };
    let mut profiler = match whyslow_stacks::ProcessProfiler::new(p.pid, &opts, &shared) {
        Ok(pr) => pr,
        Err(e) => return give_up(&p, e),
    };
    while !stop.load(Ordering::Relaxed) && p.alive() {
        if !crate::governor::hold(stop) {
            return;
        }
        match profiler.profile(opts.duration, stop) {
            Ok((mut profile, stats)) => {
                // The period's unwinding and lookups touched the modules'
                // pages: out of the RSS (read back as needed).
                shared.release_pages();
                for (k, v) in p.labels() {
                    profile.labels.insert(k, v);
                }
                let path = spool.process_file(&p, None, unix_secs(SystemTime::now()), "pb.gz");
                match spool.write(&path, &whyslow_stack_output::to_pprof(&profile)) {
                    Ok(()) => AgentEvent::ProfileWritten {
                        pid: p.pid,
                        rank: p.rank,
                        samples: stats.samples,
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
            Err(e) => return give_up(&p, e),
        }
    }
}
