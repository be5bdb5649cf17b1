//! The gloo collectives of the registered processes (`--trace-collectives`,
//! SysOM-AI §3.2, eBPF uprobes), and NCCL's calls of those that map
//! libnccl: one `*.collectives.jsonl` records file per process and profile
//! period in the spool, the input of `whyslow diagnose`'s slow-rank
//! detection and of `whyslow hang`. A process that has not loaded gloo yet
//! is tried again at each scan (torch.distributed may load later than the
//! registration).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use whyslow_collectives::nccl::{NcclEvent, NcclSequencer, NcclTracer};
use whyslow_collectives::{gloo_library, GlooEvent, GlooTracer, Sequencer};

use crate::collector::{Collector, Next, SCAN_EVERY};
use crate::events::AgentEvent;
use crate::registry::Process;
use crate::spool::{RecordKind, Spool};

/// A collective in flight this long is written as an open record: far
/// beyond any healthy collective (they take ms), well before PyTorch's
/// collective timeouts (10-30 min).
const OPEN_AFTER_NS: u64 = 10_000_000_000;

/// How long the tracer's ring is waited on in a round.
const POLL: Duration = Duration::from_millis(200);

/// CLOCK_MONOTONIC in ns: the clock of `bpf_ktime_get_ns`, and of the
/// events' entry and exit times.
fn monotonic_ns() -> u64 {
    // Never negative: seconds since boot.
    whyslow_sampler::clock::monotonic_ns() as u64
}

/// The collective tracer.
pub struct Collectives {
    tracer: Option<GlooTracer>,
    /// Registered, gloo not loaded yet.
    waiting: BTreeMap<i32, Process>,
    traced: HashMap<u32, Process>,
    sequencer: Sequencer,
    pending: Vec<GlooEvent>,
    /// NCCL's calls (GPU jobs), traced once a process maps libnccl: the
    /// host side, for when NCCL does not load whyslow's profiler plugin.
    nccl: Option<NcclTracer>,
    nccl_done: BTreeSet<u32>,
    nccl_sequencer: NcclSequencer,
    pending_nccl: Vec<NcclEvent>,
    /// Calls in flight longer than [`OPEN_AFTER_NS`] are written once as
    /// open records (a hang: `whyslow hang`, `diagnose`), keyed by
    /// process, thread and entry.
    reported_open: BTreeSet<(u32, u32, u64)>,
    last_open_scan: Instant,
    last_scan: Option<Instant>,
}

impl Default for Collectives {
    fn default() -> Self {
        Self::new()
    }
}

impl Collectives {
    /// The tracer (opened by [`Collector::start`]).
    pub fn new() -> Self {
        let offset = whyslow_sampler::clock::realtime_ns() - whyslow_sampler::clock::monotonic_ns();
        Collectives {
            tracer: None,
            waiting: BTreeMap::new(),
            traced: HashMap::new(),
            sequencer: Sequencer::with_clock_offset(offset),
            pending: Vec::new(),
            nccl: None,
            nccl_done: BTreeSet::new(),
            nccl_sequencer: NcclSequencer::with_clock_offset(offset),
            pending_nccl: Vec::new(),
            reported_open: BTreeSet::new(),
            last_open_scan: Instant::now(),
            last_scan: None,
        }
    }

    /// Attaches to the registered processes that loaded gloo since the
    /// last scan, and to NCCL in the traced ones that mapped it.
    fn attach(&mut self, spool: &Spool) {
        let Some(tracer) = self.tracer.as_mut() else {
            return;
        };
        let mut attached = Vec::new();
        for (&pid, p) in &self.waiting {
            if !p.alive() {
                continue;
            }
            // Not yet: torch.distributed may load later than registration.
            let Some(lib) = gloo_library(pid as u32) else {
                continue;
            };
            match tracer.attach(pid as u32, &lib) {
                Ok(0) => AgentEvent::CollectivesFailed {
                    pid,
                    reason: format!("{} exports no gloo collective", lib.display()),
                }
                .emit(),
                Ok(n) => {
                    AgentEvent::CollectivesTraced {
                        pid,
                        rank: p.rank,
                        functions: n,
                        library: &lib,
                    }
                    .emit();
                    spool.start_records(p, RecordKind::Collectives);
                    self.traced.insert(pid as u32, p.clone());
                }
                Err(e) => AgentEvent::CollectivesFailed {
                    pid,
                    reason: e.to_string(),
                }
                .emit(),
            }
            // Traced, or refused for good.
            attached.push(pid);
        }
        for pid in attached {
            self.waiting.remove(&pid);
        }
        for (&pid, p) in &self.traced {
            if self.nccl_done.contains(&pid) {
                continue;
            }
            let Some(lib) = whyslow_collectives::nccl::nccl_library(pid) else {
                continue;
            };
            self.nccl_done.insert(pid);
            if self.nccl.is_none() {
                match NcclTracer::open() {
                    Ok(n) => self.nccl = Some(n),
                    Err(e) => {
                        AgentEvent::CollectivesFailed {
                            pid: p.pid,
                            reason: format!("NCCL tracer: {e}"),
                        }
                        .emit();
                        continue;
                    }
                }
            }
            let Some(n) = self.nccl.as_mut() else {
                continue;
            };
            match n.attach(pid, &lib) {
                Ok(k) => AgentEvent::CollectivesTraced {
                    pid: p.pid,
                    rank: p.rank,
                    functions: k,
                    library: &lib,
                }
                .emit(),
                Err(e) => AgentEvent::CollectivesFailed {
                    pid: p.pid,
                    reason: e.to_string(),
                }
                .emit(),
            }
        }
    }

    /// One round: waits for the tracers' events (not when `stopping`),
    /// turns the settled ones (all when `stopping`) and the calls in flight
    /// too long into records, and appends them to their processes' files.
    fn round(&mut self, spool: &Spool, stopping: bool) {
        let Some(tracer) = self.tracer.as_mut() else {
            return;
        };
        let wait = if stopping { Duration::ZERO } else { POLL };
        self.pending.extend(tracer.poll(wait));
        // In entry order per process (the sequence numbers count that way);
        // a call still in flight on another thread of the process returns
        // later, so events younger than a second wait for the next round.
        self.pending.sort_by_key(|e| (e.pid, e.entry_ns));
        let now_ns = monotonic_ns();
        let settled = |exit_ns: u64| stopping || now_ns.saturating_sub(exit_ns) > 1_000_000_000;
        let (ready, young): (Vec<_>, Vec<_>) =
            self.pending.drain(..).partition(|e| settled(e.exit_ns));
        self.pending = young;
        if let Some(n) = self.nccl.as_mut() {
            self.pending_nccl.extend(n.poll(Duration::ZERO));
        }
        self.pending_nccl.sort_by_key(|e| (e.pid, e.entry_ns));
        let (ready_nccl, young_nccl): (Vec<_>, Vec<_>) = self
            .pending_nccl
            .drain(..)
            .partition(|e| settled(e.exit_ns));
        self.pending_nccl = young_nccl;
        let mut lines: HashMap<u32, String> = HashMap::new();
        let mut push = |pid: u32, json: serde_json::Result<String>| {
            if let Ok(j) = json {
                let l = lines.entry(pid).or_default();
                l.push_str(&j);
                l.push('\n');
                true
            } else {
                false
            }
        };
        for e in &ready_nccl {
            let Some(t) = self.traced.get(&e.pid) else {
                continue;
            };
            if let Some(r) = self.nccl_sequencer.record(e, &t.job, t.rank) {
                push(e.pid, serde_json::to_string(&r));
            }
        }
        for e in &ready {
            let Some(t) = self.traced.get(&e.pid) else {
                continue;
            };
            if let Some(r) = self.sequencer.record(e, &t.job, t.rank) {
                push(e.pid, serde_json::to_string(&r));
            }
        }
        if self.last_open_scan.elapsed() >= Duration::from_secs(1) {
            self.last_open_scan = Instant::now();
            let open = tracer.in_flight();
            let now = monotonic_ns();
            self.reported_open
                .retain(|k| open.iter().any(|e| (e.pid, e.tid, e.entry_ns) == *k));
            for mut e in open {
                let key = (e.pid, e.tid, e.entry_ns);
                if now.saturating_sub(e.entry_ns) < OPEN_AFTER_NS
                    || self.reported_open.contains(&key)
                {
                    continue;
                }
                let Some(t) = self.traced.get(&e.pid) else {
                    continue;
                };
                e.exit_ns = now;
                if let Some(mut r) = self.sequencer.record(&e, &t.job, t.rank) {
                    r.open = true;
                    if push(e.pid, serde_json::to_string(&r)) {
                        self.reported_open.insert(key);
                    }
                }
            }
        }
        for (pid, text) in lines {
            let Some(t) = self.traced.get(&pid) else {
                continue;
            };
            if let Err(e) = spool.append(t, RecordKind::Collectives, &text) {
                AgentEvent::CollectivesFailed {
                    pid: pid as i32,
                    reason: e.to_string(),
                }
                .emit();
            }
        }
    }
}

impl Collector for Collectives {
    fn name(&self) -> &'static str {
        "collectives"
    }

    fn start(&mut self) -> bool {
        match GlooTracer::open() {
            Ok(t) => {
                self.tracer = Some(t);
                true
            }
            Err(e) => {
                AgentEvent::CollectivesFailed {
                    pid: 0,
                    reason: e.to_string(),
                }
                .emit();
                false
            }
        }
    }

    fn on_added(&mut self, p: &Process, _: &Spool) {
        self.waiting.insert(p.pid, p.clone());
    }

    fn on_removed(&mut self, p: &Process, spool: &Spool) {
        if self.waiting.get(&p.pid).is_some_and(|w| w.key() == p.key()) {
            self.waiting.remove(&p.pid);
        }
        let pid = p.pid as u32;
        if self.traced.get(&pid).is_none_or(|t| t.key() != p.key()) {
            return;
        }
        if let Some(t) = self.tracer.as_mut() {
            t.detach(pid);
        }
        self.sequencer.forget(pid);
        if let Some(n) = self.nccl.as_mut() {
            n.detach(pid);
        }
        self.nccl_done.remove(&pid);
        self.traced.remove(&pid);
        spool.end_records(p);
    }

    fn tick(&mut self, spool: &Spool, _: &AtomicBool) -> Next {
        if self.last_scan.is_none_or(|t| t.elapsed() >= SCAN_EVERY) {
            self.last_scan = Some(Instant::now());
            self.attach(spool);
        }
        // The round waits on the ring: no wait between rounds.
        self.round(spool, false);
        Next::After(Duration::ZERO)
    }

    /// One last round writes everything still pending.
    fn flush(&mut self, spool: &Spool) {
        self.round(spool, true);
    }
}
