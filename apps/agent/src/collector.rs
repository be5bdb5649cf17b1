//! One interface for everything the agent collects about the registered
//! training processes (and the host beside them), and one driver that runs
//! them: the [`Registry`] is scanned once per tick by the driver, and every
//! collector sees the same add/remove events; what they produce goes
//! through one [`Spool`].
//!
//! Each collector runs on a thread of its own, so that a source that blocks
//! (an eBPF ring polled with a timeout, a profile period) does not hold
//! the others back. The driver calls, on that thread and in this order:
//! [`Collector::start`] once, then [`Collector::on_added`] /
//! [`Collector::on_removed`] for each registry event (within 50 ms of the
//! scan that saw it) and [`Collector::tick`] whenever the wait the last
//! tick asked for is over, and [`Collector::flush`] once when the agent
//! stops.
//!
//! # How to add a source
//!
//! 1. Write a type that implements [`Collector`] in `sources/` (the five
//!    there are the examples: `os.rs` is the smallest). Keep per-process
//!    state in `on_added` / `on_removed`, keyed by [`Process::key`] (a pid
//!    alone is reused); do the periodic work in `tick` and return how long
//!    to wait before the next one; write what remains in `flush`.
//! 2. Write through the [`Spool`]: [`Spool::write`] for whole files (a
//!    profile: atomic, and the size cap is kept), [`Spool::append`] with a
//!    [`RecordKind`](crate::spool::RecordKind) for line records (rotated
//!    each period). A new kind of file needs its suffix in the spool
//!    (`spool.rs`), so that the cap counts it, and in the uploader.
//! 3. Log through [`AgentEvent`](crate::events::AgentEvent), never print.
//!    Read only: a collector must never stop, signal or ptrace a process.
//!    Per-process work that costs the agent CPU pauses while
//!    [`crate::governor::hold`] says so.
//! 4. Add its option to `ProfilerArgs` and its constructor to
//!    `profiler::collectors`. The configuration is shared (`Arc`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::registry::{Event, Process, Registry};
use crate::spool::Spool;

/// How often the driver scans the registrations.
pub const SCAN_EVERY: Duration = Duration::from_millis(500);

/// The longest a collector thread sleeps before it looks at its events and
/// the stop flag again.
const NAP: Duration = Duration::from_millis(50);

/// What a tick asks of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Tick again after this long (events are delivered meanwhile).
    After(Duration),
    /// The source ended (it logged why, or the governor stopped it): its
    /// thread ends without a flush.
    Done,
}

/// A source of evidence about the registered processes or the host.
pub trait Collector: Send {
    /// A short name (its thread's name: `whyslow-<name>`).
    fn name(&self) -> &'static str;

    /// Opens what the source needs (an eBPF program, a tracer), on the
    /// collector's thread; `false` when it cannot (it logged why): the
    /// collector is dropped and the rest of the agent goes on.
    fn start(&mut self) -> bool {
        true
    }

    /// A training process registered.
    fn on_added(&mut self, _p: &Process, _spool: &Spool) {}

    /// A training process exited.
    fn on_removed(&mut self, _p: &Process, _spool: &Spool) {}

    /// The source's periodic work; `stop` is set when the agent stops (a
    /// tick that blocks should return soon after).
    fn tick(&mut self, spool: &Spool, stop: &AtomicBool) -> Next;

    /// The agent stops: write what is pending (a partial period).
    fn flush(&mut self, _spool: &Spool) {}
}

/// Runs one collector on the calling thread until `stop` (then flushes) or
/// until it is done.
fn drive(mut c: Box<dyn Collector>, events: Receiver<Event>, spool: &Spool, stop: &AtomicBool) {
    if !c.start() {
        return;
    }
    let mut due = Instant::now();
    loop {
        loop {
            match events.try_recv() {
                Ok(Event::Added(p)) => c.on_added(&p, spool),
                Ok(Event::Removed(p)) => c.on_removed(&p, spool),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        if stop.load(Ordering::Relaxed) {
            return c.flush(spool);
        }
        let now = Instant::now();
        if now >= due {
            match c.tick(spool, stop) {
                Next::After(wait) => due = Instant::now() + wait,
                Next::Done => return,
            }
        } else {
            std::thread::sleep((due - now).min(NAP));
        }
    }
}

/// Starts every collector on its own thread and feeds them the registry's
/// events (a scan every [`SCAN_EVERY`]) until `stop`; returns once each
/// collector has flushed.
pub fn run(
    collectors: Vec<Box<dyn Collector>>,
    mut registry: Registry,
    spool: Arc<Spool>,
    stop: Arc<AtomicBool>,
) {
    let mut workers = Vec::new();
    for c in collectors {
        let (tx, rx) = channel();
        let (spool, stop) = (spool.clone(), stop.clone());
        let name = c.name();
        let spawned = std::thread::Builder::new()
            .name(format!("whyslow-{name}"))
            .spawn(move || {
                // A bug in one source stops that source, not the agent's
                // other evidence (nor, ever, a watched process).
                let run = std::panic::AssertUnwindSafe(|| drive(c, rx, &spool, &stop));
                if let Err(p) = std::panic::catch_unwind(run) {
                    let reason = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "panic".into());
                    crate::events::AgentEvent::CollectorFailed {
                        collector: name,
                        reason,
                    }
                    .emit();
                }
            });
        if let Ok(h) = spawned {
            workers.push((tx, h));
        }
    }
    while !stop.load(Ordering::Relaxed) {
        for e in registry.scan() {
            for (tx, _) in &workers {
                // A collector that ended no longer listens.
                let _ = tx.send(e.clone());
            }
        }
        let t = Instant::now();
        while t.elapsed() < SCAN_EVERY && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(NAP);
        }
    }
    for (tx, h) in workers {
        drop(tx);
        let _ = h.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records what the driver called.
    struct Probe(Arc<Mutex<Vec<String>>>, u32);

    impl Collector for Probe {
        fn name(&self) -> &'static str {
            "probe"
        }
        fn on_added(&mut self, p: &Process, _: &Spool) {
            self.0.lock().unwrap().push(format!("+{}", p.pid));
        }
        fn tick(&mut self, _: &Spool, _: &AtomicBool) -> Next {
            self.1 += 1;
            Next::After(Duration::from_millis(10))
        }
        fn flush(&mut self, _: &Spool) {
            let ticks = self.1;
            self.0
                .lock()
                .unwrap()
                .push(format!("flush after {}", ticks.min(1)));
        }
    }

    #[test]
    fn every_collector_sees_the_registrys_events_and_flushes_at_stop() {
        let d = std::env::temp_dir().join(format!("whyslow-collector-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let me = std::process::id();
        std::fs::write(
            d.join(format!("proc-{me}.json")),
            format!(r#"{{"pid": {me}}}"#),
        )
        .unwrap();
        let seen = [
            Arc::new(Mutex::new(Vec::new())),
            Arc::new(Mutex::new(Vec::new())),
        ];
        let collectors: Vec<Box<dyn Collector>> = seen
            .iter()
            .map(|s| Box::new(Probe(s.clone(), 0)) as Box<dyn Collector>)
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let spool = Arc::new(Spool::new(d.join("spool"), 0, Duration::from_secs(1)));
        let (reg, st) = (Registry::new(d.clone()), stop.clone());
        let h = std::thread::spawn(move || run(collectors, reg, spool, st));
        let t = Instant::now();
        while seen.iter().any(|s| s.lock().unwrap().is_empty()) && t.elapsed().as_secs() < 10 {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::SeqCst);
        h.join().unwrap();
        for s in &seen {
            assert_eq!(
                *s.lock().unwrap(),
                vec![format!("+{me}"), "flush after 1".into()]
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Panics on its first tick.
    struct Buggy;

    impl Collector for Buggy {
        fn name(&self) -> &'static str {
            "buggy"
        }
        fn tick(&mut self, _: &Spool, _: &AtomicBool) -> Next {
            panic!("a bug")
        }
    }

    #[test]
    fn a_collector_that_panics_stops_alone() {
        let d = std::env::temp_dir().join(format!("whyslow-collector-bug-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let collectors: Vec<Box<dyn Collector>> =
            vec![Box::new(Buggy), Box::new(Probe(seen.clone(), 0))];
        let stop = Arc::new(AtomicBool::new(false));
        let spool = Arc::new(Spool::new(d.join("spool"), 0, Duration::from_secs(1)));
        let (reg, st) = (Registry::new(d.clone()), stop.clone());
        let before = crate::events::counts()[19];
        let h = std::thread::spawn(move || run(collectors, reg, spool, st));
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::SeqCst);
        h.join().expect("the driver survives a collector's panic");
        assert!(
            crate::events::counts()[19] > before,
            "collector_failed logged"
        );
        assert_eq!(*seen.lock().unwrap(), vec!["flush after 1".to_string()]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
