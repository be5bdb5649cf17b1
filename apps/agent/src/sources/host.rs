//! CPU profiles of every process of the host (`--profile-host`) or of
//! cgroups (`--profile-cgroup`) with the eBPF sampler: stacks counted in
//! the kernel and drained every 5 s, one profile per period under `host/`
//! in the spool. Interference often comes from a process that never
//! registered (SysOM-AI §3.3). Where eBPF cannot load, one line says why
//! and the rest of the agent goes on.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use whyslow_model::stack::StackProfileBuilder;
use whyslow_stacks::ebpf;

use crate::collector::{Collector, Next};
use crate::events::AgentEvent;
use crate::profiler::ProfilerArgs;
use crate::spool::Spool;

/// How often the sampler's ring is polled.
const POLL: Duration = Duration::from_millis(100);

/// The host (or cgroup) profiler.
pub struct Host {
    cfg: Arc<ProfilerArgs>,
    node: String,
    shared: Option<whyslow_stacks::Shared>,
    on: Option<Running>,
}

/// The open sampler and the period being counted.
struct Running {
    sampler: ebpf::EbpfSampler,
    symbols: ebpf::Symbolizer,
    rate_hz: f64,
    period: Duration,
    drain_every: Duration,
    start_unix_ns: u64,
    t0: Instant,
    last_drain: Instant,
    builder: StackProfileBuilder,
    failed: Option<ebpf::EbpfError>,
}

impl Host {
    /// The profiler of this node (`node`: its `host` label).
    pub fn new(cfg: Arc<ProfilerArgs>, node: String, shared: whyslow_stacks::Shared) -> Self {
        Host {
            cfg,
            node,
            shared: Some(shared),
            on: None,
        }
    }

    fn scope(&self) -> &'static str {
        if self.cfg.profile_cgroup.is_empty() {
            "host"
        } else {
            "cgroup"
        }
    }

    /// Begins a period.
    fn begin(&mut self) {
        let scope = self.scope();
        let Some(r) = self.on.as_mut() else { return };
        r.start_unix_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        r.t0 = Instant::now();
        r.last_drain = r.t0;
        r.builder = StackProfileBuilder::new();
        r.builder.label("host", self.node.clone());
        r.builder.label("scope", scope);
    }

    /// Ends the period: its profile into the spool; `false` when the
    /// sampler failed (logged).
    fn finish(&mut self, spool: &Spool) -> bool {
        let Some(r) = self.on.as_mut() else {
            return false;
        };
        match r.sampler.drain() {
            Ok(c) => r.symbols.add(&c, &mut r.builder),
            Err(e) => r.failed = Some(e),
        }
        // Once a period: the pages the period's lookups touched leave the
        // RSS (host-wide, they grew it by ≈ 0.4 MB/s).
        r.symbols.release_pages();
        if let Some(e) = r.failed.take() {
            AgentEvent::ProfileFailed {
                pid: 0,
                reason: format!("host profile (eBPF) stopped: {e}"),
            }
            .emit();
            return false;
        }
        let builder = std::mem::take(&mut r.builder);
        let profile = builder.finish(r.rate_hz, r.start_unix_ns, r.t0.elapsed().as_nanos() as u64);
        let path = spool.host_file(&self.node, r.start_unix_ns / 1_000_000_000);
        match spool.write(&path, &whyslow_stack_output::to_pprof(&profile)) {
            Ok(()) => AgentEvent::ProfileWritten {
                pid: 0,
                rank: None,
                samples: profile.total(),
                path: &path,
            }
            .emit(),
            Err(e) => AgentEvent::ProfileFailed {
                pid: 0,
                reason: e.to_string(),
            }
            .emit(),
        }
        true
    }
}

impl Collector for Host {
    fn name(&self) -> &'static str {
        "host"
    }

    fn start(&mut self) -> bool {
        let cfg = &self.cfg;
        let target = if cfg.profile_cgroup.is_empty() {
            ebpf::Target::Host
        } else {
            ebpf::Target::Cgroups(cfg.profile_cgroup.clone())
        };
        let hz = cfg.profile_hz.clamp(10, 999);
        let rate = (cfg.profile_sampling_rate / 100.0).clamp(0.001, 1.0);
        let opts = ebpf::EbpfOptions {
            hz,
            sampling_rate: rate,
            target,
            measure: false,
            off_cpu: false,
            unwind: cfg.profile_unwind,
            max_cfi_rows: ebpf::DEFAULT_MAX_CFI_ROWS,
            python: true,
        };
        let sampler = match ebpf::EbpfSampler::open(&opts) {
            Ok(s) => s,
            Err(e) => {
                AgentEvent::ProfileFailed {
                    pid: 0,
                    reason: format!("host profile (eBPF) not started: {e}"),
                }
                .emit();
                return false;
            }
        };
        let Some(shared) = self.shared.take() else {
            return false;
        };
        let period = Duration::from_secs_f64(cfg.profile_period.max(1.0));
        self.on = Some(Running {
            sampler,
            symbols: ebpf::Symbolizer::new(shared, true),
            rate_hz: hz as f64 * rate,
            period,
            drain_every: Duration::from_secs(5).min(period),
            start_unix_ns: 0,
            t0: Instant::now(),
            last_drain: Instant::now(),
            builder: StackProfileBuilder::new(),
            failed: None,
        });
        AgentEvent::ProfileStarted {
            pid: 0,
            rank: None,
            job: "host",
        }
        .emit();
        if crate::governor::stopped() {
            return false;
        }
        self.begin();
        true
    }

    fn tick(&mut self, spool: &Spool, _: &AtomicBool) -> Next {
        let Some(r) = self.on.as_mut() else {
            return Next::Done;
        };
        if r.t0.elapsed() < r.period {
            r.sampler.poll();
            if r.last_drain.elapsed() >= r.drain_every {
                r.last_drain = Instant::now();
                match r.sampler.drain() {
                    Ok(c) => r.symbols.add(&c, &mut r.builder),
                    Err(e) => r.failed = Some(e),
                }
                r.symbols.refresh();
            }
            return Next::After(POLL);
        }
        if !self.finish(spool) || crate::governor::stopped() {
            return Next::Done;
        }
        self.begin();
        Next::After(POLL)
    }

    /// The period so far.
    fn flush(&mut self, spool: &Spool) {
        self.finish(spool);
    }
}
