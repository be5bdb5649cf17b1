//! The training processes of this node, as one view for every collector.
//!
//! A training process registers by writing `proc-<pid>.json` into the
//! agent's directory (`import whyslow`; the record is
//! `whyslow_model::wire::ProcessRegistration`, written atomically) and
//! removes it at exit. [`Registry::scan`] reads the directory once per tick
//! and turns what changed into [`Event`]s: a process is *added* when its
//! registration appears and the process is alive, and *removed* when the
//! process exits. A pid is not an identity (pids are reused): a process is
//! its pid and its start time (field 22 of `/proc/<pid>/stat`), so a
//! recycled pid is the old process removed and, if it registered, a new one
//! added. A registration file that disappears while its process still runs
//! (the rank unregisters in `atexit`, then shuts down) does not remove it:
//! the collectors follow the process until it is gone.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use whyslow_model::wire::ProcessRegistration;

/// Field 22 (`starttime`, clock ticks since boot) of `/proc/PID/stat`: with
/// the pid it identifies a process (pids are reused).
pub fn proc_start_ticks(pid: i32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    // After ')': field 3 is index 0, so field 22 is index 19.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

/// A registered training process: its registration (labels: job, rank,
/// host, …) and the start time that, with the pid, identifies it.
#[derive(Debug, Clone, PartialEq)]
pub struct Process {
    /// What the process registered.
    pub reg: ProcessRegistration,
    /// Its start time in clock ticks since boot (the registration's, else
    /// the one read when it was added).
    pub start_ticks: Option<u64>,
}

impl std::ops::Deref for Process {
    type Target = ProcessRegistration;
    fn deref(&self) -> &ProcessRegistration {
        &self.reg
    }
}

impl Process {
    /// Whether the process still runs (same pid, same start time).
    pub fn alive(&self) -> bool {
        same_process(proc_start_ticks(self.reg.pid), self.start_ticks)
    }

    /// Its identity: pid and start time.
    pub fn key(&self) -> (i32, Option<u64>) {
        (self.reg.pid, self.start_ticks)
    }
}

/// Whether a process whose start time is now `now` is the one that started
/// at `then` (unknown: any process with the pid).
fn same_process(now: Option<u64>, then: Option<u64>) -> bool {
    match (now, then) {
        (Some(now), Some(then)) => now == then,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// Whether the process of `r` still runs.
pub fn alive(r: &ProcessRegistration) -> bool {
    same_process(proc_start_ticks(r.pid), r.proc_start_ticks)
}

/// The registrations in `dir`, by pid (files that do not parse are skipped:
/// the writer replaces them atomically, so a bad one is not ours to judge).
pub fn registrations(dir: &Path) -> Vec<ProcessRegistration> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<ProcessRegistration> = rd
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("proc-") && n.ends_with(".json")
        })
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .filter_map(|t| ProcessRegistration::from_json(&t).ok())
        .collect();
    out.sort_by_key(|r| r.pid);
    out
}

/// The registrations in `dir` whose process runs now (one look, for who
/// needs no events: the uploader's jobs of the node).
pub fn live(dir: &Path) -> Vec<ProcessRegistration> {
    registrations(dir).into_iter().filter(alive).collect()
}

/// What changed between two scans.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A process registered (once per process: a recycled pid is a new one).
    Added(Process),
    /// A process exited.
    Removed(Process),
}

/// The registered processes of one directory, scanned tick after tick.
#[derive(Debug)]
pub struct Registry {
    dir: PathBuf,
    known: BTreeMap<i32, Process>,
}

impl Registry {
    /// A registry of the registrations in `dir` (nothing known yet: the
    /// first [`Registry::scan`] adds every live process).
    pub fn new(dir: PathBuf) -> Self {
        Registry {
            dir,
            known: BTreeMap::new(),
        }
    }

    /// Reads the directory and `/proc` once: the processes that exited
    /// (removed, first) and the ones that registered (added), by pid.
    pub fn scan(&mut self) -> Vec<Event> {
        let regs = registrations(&self.dir);
        self.apply(regs, proc_start_ticks)
    }

    /// [`Registry::scan`] of given registrations, with `ticks` for
    /// [`proc_start_ticks`] (tests give both as plain data).
    pub fn apply(
        &mut self,
        regs: Vec<ProcessRegistration>,
        ticks: impl Fn(i32) -> Option<u64>,
    ) -> Vec<Event> {
        let mut events = Vec::new();
        self.known.retain(|&pid, p| {
            let alive = same_process(ticks(pid), p.start_ticks);
            if !alive {
                events.push(Event::Removed(p.clone()));
            }
            alive
        });
        for reg in regs {
            if reg.pid <= 0 || self.known.contains_key(&reg.pid) {
                continue;
            }
            let now = ticks(reg.pid);
            if now.is_none() || !same_process(now, reg.proc_start_ticks) {
                // Exited, or a stale file naming a recycled pid.
                continue;
            }
            let p = Process {
                start_ticks: reg.proc_start_ticks.or(now),
                reg,
            };
            self.known.insert(p.pid, p.clone());
            events.push(Event::Added(p));
        }
        events
    }

    /// The processes known now, by pid.
    pub fn processes(&self) -> impl Iterator<Item = &Process> {
        self.known.values()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn reg(pid: i32, ticks: Option<u64>, rank: u32) -> ProcessRegistration {
        ProcessRegistration::from_json(&format!(
            r#"{{"pid": {pid}, "proc_start_ticks": {}, "rank": {rank}, "job": "job-a", "host": "h1"}}"#,
            ticks.map(|t| t.to_string()).unwrap_or("null".into())
        ))
        .unwrap()
    }

    fn pids(events: &[Event]) -> Vec<(char, i32, Option<u64>)> {
        events
            .iter()
            .map(|e| match e {
                Event::Added(p) => ('+', p.pid, p.start_ticks),
                Event::Removed(p) => ('-', p.pid, p.start_ticks),
            })
            .collect()
    }

    #[test]
    fn processes_are_added_once_and_removed_when_they_exit() {
        let mut r = Registry::new(PathBuf::from("/nonexistent"));
        let mut procs: HashMap<i32, u64> = HashMap::from([(10, 100), (11, 110)]);
        let regs = || {
            vec![
                reg(10, Some(100), 0),
                reg(11, Some(110), 1),
                reg(12, Some(5), 2),
            ]
        };
        // 12 never ran (or exited before the scan): not added.
        let e = r.apply(regs(), |p| procs.get(&p).copied());
        assert_eq!(pids(&e), vec![('+', 10, Some(100)), ('+', 11, Some(110))]);
        if let Event::Added(p) = &e[1] {
            assert_eq!(
                (p.rank, p.job.as_str(), p.host.as_str()),
                (Some(1), "job-a", "h1")
            );
            assert_eq!(p.labels().get("rank").map(String::as_str), Some("1"));
        }
        // Nothing changed: no event.
        assert!(r.apply(regs(), |p| procs.get(&p).copied()).is_empty());
        // 10 unregisters (its file is gone) but still runs: kept.
        assert!(r
            .apply(vec![reg(11, Some(110), 1)], |p| procs.get(&p).copied())
            .is_empty());
        // 10 exits.
        procs.remove(&10);
        let e = r.apply(vec![reg(11, Some(110), 1)], |p| procs.get(&p).copied());
        assert_eq!(pids(&e), vec![('-', 10, Some(100))]);
        assert_eq!(r.processes().map(|p| p.pid).collect::<Vec<_>>(), vec![11]);
    }

    #[test]
    fn a_recycled_pid_is_the_old_process_removed_and_a_new_one_added() {
        let mut r = Registry::new(PathBuf::from("/nonexistent"));
        let ticks = |t: u64| move |p: i32| (p == 7).then_some(t);
        assert_eq!(
            pids(&r.apply(vec![reg(7, Some(70), 0)], ticks(70))),
            vec![('+', 7, Some(70))]
        );
        // Pid 7 now belongs to another process; the old file stays: the
        // old process goes and the stale file adds nothing.
        let e = r.apply(vec![reg(7, Some(70), 0)], ticks(99));
        assert_eq!(pids(&e), vec![('-', 7, Some(70))]);
        // The new process registers under the same pid.
        let e = r.apply(vec![reg(7, Some(99), 3)], ticks(99));
        assert_eq!(pids(&e), vec![('+', 7, Some(99))]);
        // A registration without a start time takes the one read when it
        // was added, so its pid's reuse is seen too.
        let mut r = Registry::new(PathBuf::from("/nonexistent"));
        let e = r.apply(vec![reg(8, None, 0)], |_| Some(80));
        assert_eq!(pids(&e), vec![('+', 8, Some(80))]);
        let e = r.apply(vec![reg(8, None, 0)], |_| Some(81));
        assert_eq!(pids(&e), vec![('-', 8, Some(80)), ('+', 8, Some(81))]);
        // Pids <= 0 are never processes of ours (the wire type refuses
        // them too).
        let mut zero = reg(9, None, 0);
        zero.pid = 0;
        let mut r = Registry::new(PathBuf::from("/nonexistent"));
        assert!(r.apply(vec![zero], |_| Some(1)).is_empty());
    }

    #[test]
    fn scans_the_directorys_registrations() {
        let d = std::env::temp_dir().join(format!("whyslow-registry-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        let me = std::process::id() as i32;
        let ticks = proc_start_ticks(me);
        assert!(ticks.is_some());
        assert!(proc_start_ticks(-5).is_none());
        let text = format!(
            r#"{{"pid": {me}, "proc_start_ticks": {}, "rank": 2, "job": "j"}}"#,
            ticks.unwrap()
        );
        fs::write(d.join(format!("proc-{me}.json")), text).unwrap();
        fs::write(d.join("proc-1.json"), "not json").unwrap();
        fs::write(d.join("other.json"), r#"{"pid": 1}"#).unwrap();
        assert_eq!(live(&d).len(), 1);
        let mut r = Registry::new(d.clone());
        let e = r.scan();
        assert_eq!(pids(&e), vec![('+', me, ticks)]);
        if let Event::Added(p) = &e[0] {
            assert!(p.alive());
            assert_eq!(p.key(), (me, ticks));
        }
        assert!(r.scan().is_empty());
        let _ = fs::remove_dir_all(&d);
    }
}
