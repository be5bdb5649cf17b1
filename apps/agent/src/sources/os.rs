//! OS signals of every registered live process every `--os-interval`
//! seconds (SysOM-AI §3.1's OS layer): one `whyslow_model::os::OsSample`
//! line per process and reading, in one `*.os.jsonl` file per process and
//! profile period. Plain `/proc` reads: nothing is attached to the process.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use whyslow_sampler::os::OsSignals;

use crate::collector::{Collector, Next};
use crate::events::AgentEvent;
use crate::registry::Process;
use crate::spool::{RecordKind, Spool};

/// The OS readings.
pub struct Os {
    interval: Duration,
    next: Instant,
    /// Registered, first read at the next reading.
    pending: Vec<Process>,
    watched: HashMap<i32, (Process, OsSignals)>,
}

impl Os {
    /// Readings every `interval_s` seconds (at least 0.1).
    pub fn new(interval_s: f64) -> Self {
        Os {
            interval: Duration::from_secs_f64(interval_s.max(0.1)),
            next: Instant::now(),
            pending: Vec::new(),
            watched: HashMap::new(),
        }
    }
}

impl Collector for Os {
    fn name(&self) -> &'static str {
        "os"
    }

    fn on_added(&mut self, p: &Process, _: &Spool) {
        self.pending.push(p.clone());
    }

    fn on_removed(&mut self, p: &Process, spool: &Spool) {
        self.pending.retain(|q| q.key() != p.key());
        if self
            .watched
            .get(&p.pid)
            .is_some_and(|(w, _)| w.key() == p.key())
        {
            self.watched.remove(&p.pid);
            spool.end_records(p);
        }
    }

    fn tick(&mut self, spool: &Spool, _: &AtomicBool) -> Next {
        let now = Instant::now();
        if now < self.next {
            return Next::After(self.next - now);
        }
        self.next += self.interval;
        // New processes are first read at a reading (and read again at the
        // next while /proc cannot be read).
        let mut waiting = Vec::new();
        for p in std::mem::take(&mut self.pending) {
            if self.watched.contains_key(&p.pid) || !p.alive() {
                continue;
            }
            match OsSignals::open(p.pid) {
                Some(signals) => {
                    spool.start_records(&p, RecordKind::Os);
                    self.watched.insert(p.pid, (p, signals));
                }
                None => waiting.push(p),
            }
        }
        self.pending = waiting;
        self.watched.retain(|_, (p, _)| {
            let alive = p.alive();
            if !alive {
                spool.end_records(p);
            }
            alive
        });
        for (p, signals) in self.watched.values_mut() {
            let Some(mut sample) = signals.sample() else {
                continue;
            };
            sample.job = p.job.clone();
            sample.host = p.host.clone();
            sample.rank = p.rank;
            let Ok(mut line) = serde_json::to_string(&sample) else {
                continue;
            };
            line.push('\n');
            if let Err(e) = spool.append(p, RecordKind::Os, &line) {
                AgentEvent::ProfileFailed {
                    pid: p.pid,
                    reason: e.to_string(),
                }
                .emit();
            }
        }
        Next::After(self.next.saturating_duration_since(Instant::now()))
    }
}
