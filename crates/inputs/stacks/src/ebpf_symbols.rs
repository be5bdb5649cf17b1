//! Drained eBPF stacks made into named frames ([`Symbolizer`]): the
//! process and thread, user frames (native through each process's
//! [`crate::unwind::StackWalker`], Python from the frames the program
//! copied), kernel frames.

use std::collections::HashMap;

use crate::ebpf::CountedStack;
use crate::ebpf_python::{PythonCounters, PythonFrames};

/// Symbolizes drained stacks into a profile, root first: with several
/// processes a `command [pid]` frame, then the thread's name, user frames from
/// the outermost, kernel frames. Return addresses (every frame but the
/// innermost) are looked up one byte back, inside the call.
pub struct Symbolizer {
    shared: crate::Shared,
    walkers: HashMap<u32, crate::unwind::StackWalker>,
    names: HashMap<(u32, u32), String>,
    /// Each process's executable when its name and walker were cached: a
    /// process that exec'd since (`ip netns exec … sh`) is another program.
    exes: HashMap<u32, Option<std::path::PathBuf>>,
    per_process_root: bool,
    python: PythonFrames,
}

impl Symbolizer {
    /// `per_process_root`: put a process frame above the thread frame (for
    /// host and cgroup targets).
    pub fn new(shared: crate::Shared, per_process_root: bool) -> Self {
        Symbolizer {
            shared,
            walkers: HashMap::new(),
            names: HashMap::new(),
            exes: HashMap::new(),
            per_process_root,
            python: PythonFrames::default(),
        }
    }

    /// Drops the modules' file pages from the resident set
    /// ([`crate::Shared::release_pages`]).
    pub fn release_pages(&self) {
        self.shared.release_pages();
    }

    /// Adds `stacks` to `builder`.
    pub fn add(
        &mut self,
        stacks: &[CountedStack],
        builder: &mut whyslow_model::stack::StackProfileBuilder,
    ) {
        use whyslow_model::stack::Frame;
        // Forget what was cached of a process that exec'd another program.
        let mut pids: Vec<u32> = stacks.iter().map(|s| s.pid).collect();
        pids.sort_unstable();
        pids.dedup();
        let mut exec_changed = std::collections::HashSet::new();
        for pid in pids {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
            match self.exes.insert(pid, exe.clone()) {
                Some(before) if before != exe => {
                    self.names.retain(|(p, _), _| *p != pid);
                    self.walkers.remove(&pid);
                    exec_changed.insert(pid);
                }
                _ => {}
            }
        }
        self.python.new_drain(&exec_changed);
        for s in stacks {
            let mut ids = Vec::with_capacity(s.user.len() + s.kernel.len() + 2);
            if self.per_process_root {
                let name = self
                    .names
                    .entry((s.pid, 0))
                    .or_insert_with(|| {
                        let comm = std::fs::read_to_string(format!("/proc/{}/comm", s.pid))
                            .map(|c| c.trim().to_string())
                            .unwrap_or_else(|_| "exited".to_string());
                        format!("{comm} [{}]", s.pid)
                    })
                    .clone();
                ids.push(builder.frame(Frame::label(name)));
            }
            let thread = self
                .names
                .entry((s.pid, s.tid))
                .or_insert_with(|| {
                    std::fs::read_to_string(format!("/proc/{}/task/{}/comm", s.pid, s.tid))
                        .map(|c| c.trim().to_string())
                        .unwrap_or_else(|_| format!("thread {}", s.tid))
                })
                .clone();
            ids.push(builder.frame(Frame::label(thread)));
            let shared = &self.shared;
            let walker = self.walkers.entry(s.pid).or_insert_with(|| {
                crate::unwind::StackWalker::new(
                    s.pid as i32,
                    shared.kernel.clone(),
                    shared.modules.clone(),
                )
            });
            let user = s.user.iter().enumerate().rev().map(|(i, &a)| {
                let a = if i == 0 { a } else { a.saturating_sub(1) };
                walker.native_frame(a)
            });
            let py = (!s.python.is_empty())
                .then(|| self.python.frames(s.pid, &s.python))
                .flatten();
            match py {
                Some(py) => {
                    let native: Vec<Frame> = user.collect();
                    let counters = &mut self.python.counters;
                    for f in crate::ebpf_python::stitch_at_tick(native, &py, counters) {
                        ids.push(builder.frame(f));
                    }
                }
                None => {
                    for f in user {
                        ids.push(builder.frame(f));
                    }
                }
            }
            for (i, &a) in s.kernel.iter().enumerate().rev() {
                let a = if i == 0 { a } else { a.saturating_sub(1) };
                ids.push(builder.frame(walker.kernel_frame(a)));
            }
            builder.add(ids, s.count);
        }
    }

    /// How the Python stacks were put in so far.
    pub fn python_counters(&self) -> PythonCounters {
        self.python.counters
    }

    /// Re-reads the mappings of the processes seen (new modules: dlopen).
    pub fn refresh(&mut self) {
        self.walkers
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        self.exes
            .retain(|pid, _| std::path::Path::new(&format!("/proc/{pid}")).exists());
        for w in self.walkers.values_mut() {
            w.refresh_maps();
        }
    }
}
