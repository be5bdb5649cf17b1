//! Python frames on the eBPF path (SysOM-AI §3.3: one stack from the Python
//! function down to the kernel, for every process of the host).
//!
//! `bpf/python.bpf.h` walks a CPython 3.10–3.13 thread's frame chain at the
//! tick and records its code objects' addresses; [`PythonProcs`] tells the
//! program where each process's interpreter lives (the `py_procs` map, from
//! libpython's DWARF: [`crate::python::Layout`]) and [`PythonFrames`] names
//! the recorded code objects from the process's memory and puts them in
//! place of the interpreter's evaluation frames ([`stitch_at_tick`]).
//!
//! Unlike the perf path, whose Python stacks are read after the sample, the
//! chain here is the tick's own: only the names are read later (a code
//! object lives as long as its function, and names are read again each
//! drain, so a freed and reused address is not named from an old read).

use std::collections::{HashMap, HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::{Ebpf, Pod};
use whyslow_model::stack::{Frame, FrameKind};

use crate::ebpf::{map_mut, EbpfError};
use crate::maps;
use crate::python::{self, PyFrame, PythonReader};

/// `struct py_proc` (`bpf/python.bpf.h`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PyProcC {
    runtime: u64,
    interp_head: u32,
    interp_next: u32,
    interp_threads: u32,
    tstate_next: u32,
    tstate_tid: u32,
    tstate_frame: u32,
    cframe_frame: u32,
    frame_code: u32,
    frame_previous: u32,
    frame_entry: u32,
    entry_is_flag: u32,
    tid_is_pthread: u32,
}
// SAFETY: plain C struct of integers, no padding holes (56 bytes, the pad
// explicit).
unsafe impl Pod for PyProcC {}

const NO_CFRAME: u32 = u32::MAX;

impl PyProcC {
    fn of(reader: &PythonReader) -> Option<Self> {
        let l = reader.layout();
        let o = |v: u64| u32::try_from(v).ok().filter(|&v| v != NO_CFRAME);
        Some(PyProcC {
            runtime: reader.runtime(),
            interp_head: o(l.runtime_interp_head)?,
            interp_next: o(l.interp_next)?,
            interp_threads: o(l.interp_threads_head)?,
            tstate_next: o(l.tstate_next)?,
            tstate_tid: o(l.tstate_native_tid)?,
            tstate_frame: o(l.tstate_frame.0)?,
            cframe_frame: match l.tstate_frame.1 {
                Some(v) => o(v)?,
                None => NO_CFRAME,
            },
            frame_code: o(l.frame_code)?,
            frame_previous: o(l.frame_previous)?,
            frame_entry: o(l.frame_entry.0)?,
            // 2: every frame began its own call (3.10's frame objects).
            entry_is_flag: if l.pthread_ids {
                2
            } else {
                l.frame_entry.1 as u32
            },
            tid_is_pthread: l.pthread_ids as u32,
        })
    }
}

/// The processes whose interpreter the program knows (`py_procs`).
#[derive(Debug, Default)]
pub(crate) struct PythonProcs {
    /// Processes looked at: Some(CPython minor version) where the program
    /// walks their Python frames.
    seen: HashMap<u32, Option<u32>>,
    /// Python processes whose runtime could not be read yet (one sampled
    /// before its interpreter started): when, and how many times, tried.
    retry: HashMap<u32, (std::time::Instant, u32)>,
    /// False: no process gets an entry (Python frames are off).
    enabled: bool,
}

/// Looks at a Python process whose runtime did not read: up to this many
/// times, this far apart.
const PYTHON_TRIES: u32 = 3;
const PYTHON_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

impl PythonProcs {
    /// `enabled`: whether processes get an entry at all.
    pub fn new(enabled: bool) -> Self {
        PythonProcs {
            seen: HashMap::new(),
            retry: HashMap::new(),
            enabled,
        }
    }

    /// Whether `pid` was looked at (and is not due for another look).
    pub fn knows(&self, pid: u32) -> bool {
        self.seen.contains_key(&pid)
            && self
                .retry
                .get(&pid)
                .is_none_or(|&(at, n)| n >= PYTHON_TRIES || at.elapsed() < PYTHON_RETRY)
    }

    /// Processes whose Python frames the program walks.
    pub fn walked(&self) -> usize {
        self.seen.values().filter(|v| v.is_some()).count()
    }

    /// Looks at `pid` once: a CPython 3.10–3.13 with a shared libpython
    /// that has debug information gets an entry (anything else, or a
    /// process that cannot be read, none: its stacks stay native).
    pub fn load(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), EbpfError> {
        if self.knows(pid) || !self.enabled {
            return Ok(());
        }
        let maps = maps::read_maps(pid as i32).unwrap_or_default();
        let proc_ =
            PythonReader::new(pid as i32, &maps).and_then(|r| Some((PyProcC::of(&r)?, r.minor())));
        self.seen.insert(pid, proc_.map(|p| p.1));
        if proc_.is_none() && !python::runtime_modules(pid as i32, &maps).is_empty() {
            let tries = self.retry.get(&pid).map_or(0, |r| r.1);
            self.retry
                .insert(pid, (std::time::Instant::now(), tries + 1));
        } else {
            self.retry.remove(&pid);
        }
        if let Some((p, _)) = proc_ {
            let mut map: BpfHashMap<&mut MapData, u32, PyProcC> = map_mut(ebpf, "py_procs")?;
            map.insert(pid, p, 0)
                .map_err(|e| EbpfError::Map("py_procs", e.to_string()))?;
        }
        Ok(())
    }

    /// Forgets the processes that exited.
    pub fn refresh(&mut self, ebpf: &mut Ebpf) -> Result<(), EbpfError> {
        let gone: Vec<u32> = self
            .seen
            .keys()
            .copied()
            .filter(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .collect();
        if gone.is_empty() {
            return Ok(());
        }
        let mut map: BpfHashMap<&mut MapData, u32, PyProcC> = map_mut(ebpf, "py_procs")?;
        for pid in gone {
            self.retry.remove(&pid);
            if self.seen.remove(&pid).flatten().is_some() {
                let _ = map.remove(&pid);
            }
        }
        Ok(())
    }
}

/// How the Python stacks recorded at the tick were put in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PythonCounters {
    /// Samples with a Python stack.
    pub samples: u64,
    /// ... whose every evaluation frame was replaced by its Python frames.
    pub stitched: u64,
    /// ... whose native walk stopped before the outermost evaluation
    /// frames: the Python frames they ran were put at the root.
    pub rooted: u64,
    /// ... left with the interpreter's frames (more evaluation frames than
    /// C-level calls in the Python stack, or code objects not readable).
    pub kept: u64,
}

/// Names the code objects of recorded Python stacks, per process.
#[derive(Default)]
pub(crate) struct PythonFrames {
    readers: HashMap<u32, Option<PythonReader>>,
    /// Code objects named in this drain, by (process, address).
    named: HashMap<(u32, u64), Option<PyFrame>>,
    pub counters: PythonCounters,
}

impl PythonFrames {
    /// The Python frames of `codes` (innermost first, bit 0 marking the
    /// frames that began a C-level call) in process `pid`.
    pub fn frames(&mut self, pid: u32, codes: &[u64]) -> Option<Vec<PyFrame>> {
        let reader = self.readers.entry(pid).or_insert_with(|| {
            maps::read_maps(pid as i32)
                .ok()
                .and_then(|m| PythonReader::new(pid as i32, &m))
        });
        let reader = reader.as_mut()?;
        let mut out = Vec::with_capacity(codes.len());
        for &c in codes {
            let addr = c & !1;
            let mut f = self
                .named
                .entry((pid, addr))
                .or_insert_with(|| reader.code_frame(addr))
                .clone()?;
            f.entry = c & 1 == 1;
            out.push(f);
        }
        if let Some(last) = out.last_mut() {
            last.entry = true; // the outermost frame began the first call
        }
        Some(out)
    }

    /// Between drains: names are read again (memory may be reused), and
    /// processes that exited or exec'd are forgotten.
    pub fn new_drain(&mut self, exec_changed: &HashSet<u32>) {
        self.named.clear();
        self.readers.retain(|pid, _| {
            !exec_changed.contains(pid) && std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        for r in self.readers.values_mut().flatten() {
            r.forget_strings();
        }
    }
}

/// The evaluation function's name: one native frame per C-level call into
/// the bytecode loop.
pub(crate) const EVAL_FRAME: &str = "_PyEval_EvalFrameDefault";

/// The profile frame of a Python frame.
pub(crate) fn python_frame(p: &PyFrame) -> Frame {
    Frame {
        kind: FrameKind::Python,
        name: Some(p.name.clone()),
        module: Some(p.file.clone()),
        build_id: None,
        offset: 0,
        line: Some(p.line),
    }
}

/// Puts the Python stack `py` (innermost first) taken at the same tick as
/// `native` (root first) in place of its evaluation frames: group k of C-level
/// calls, counted from the innermost, replaces the k-th evaluation frame from
/// the innermost. A native walk that stopped early (frame pointers through a
/// CPython built without them, an unreadable frame) lacks the outermost
/// calls: their Python frames go at the root, before the native frames
/// found. More evaluation frames than calls keeps the native stack as it is.
pub fn stitch_at_tick(
    native: Vec<Frame>,
    py: &[PyFrame],
    counts: &mut PythonCounters,
) -> Vec<Frame> {
    counts.samples += 1;
    let evals = native
        .iter()
        .filter(|f| f.name.as_deref() == Some(EVAL_FRAME))
        .count();
    let groups = python::groups_root_first(py);
    if groups.len() < evals || groups.is_empty() {
        counts.kept += 1;
        return native;
    }
    let missing = groups.len() - evals;
    if missing == 0 {
        counts.stitched += 1;
    } else {
        counts.rooted += 1;
    }
    replace_evals(native, groups, missing)
}

/// `native` (root first) with each evaluation frame replaced by the next of
/// `groups` (root first), after the first `missing` groups put at the root.
pub(crate) fn replace_evals(
    native: Vec<Frame>,
    groups: Vec<Vec<&PyFrame>>,
    missing: usize,
) -> Vec<Frame> {
    let mut groups = groups.into_iter();
    let mut out = Vec::with_capacity(native.len() + 8);
    for g in groups.by_ref().take(missing) {
        out.extend(g.into_iter().map(python_frame));
    }
    for f in native {
        if f.name.as_deref() == Some(EVAL_FRAME) {
            out.extend(
                groups
                    .next()
                    .unwrap_or_default()
                    .into_iter()
                    .map(python_frame),
            );
        } else {
            out.push(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(names: &[&str]) -> Vec<Frame> {
        names
            .iter()
            .map(|n| Frame {
                kind: FrameKind::Native,
                name: Some(n.to_string()),
                module: None,
                build_id: None,
                offset: 0,
                line: None,
            })
            .collect()
    }

    fn py(names: &[(&str, bool)]) -> Vec<PyFrame> {
        names
            .iter()
            .map(|&(n, entry)| PyFrame {
                name: n.into(),
                file: "t.py".into(),
                line: 1,
                entry,
            })
            .collect()
    }

    fn names(fs: &[Frame]) -> Vec<&str> {
        fs.iter().map(|f| f.name.as_deref().unwrap_or("")).collect()
    }

    #[test]
    fn each_evaluation_frame_gets_its_calls_python_frames() {
        let mut c = PythonCounters::default();
        // main → run (one C call), then a C callback → inner (a second call).
        let n = native(&["_start", EVAL_FRAME, "PyObject_Call", EVAL_FRAME, "deflate"]);
        let p = py(&[("inner", true), ("run", false), ("main", true)]);
        let out = stitch_at_tick(n, &p, &mut c);
        assert_eq!(
            names(&out),
            ["_start", "main", "run", "PyObject_Call", "inner", "deflate"]
        );
        assert_eq!((c.stitched, c.rooted, c.kept), (1, 0, 0));
    }

    #[test]
    fn a_walk_that_stopped_early_gets_the_outer_calls_at_the_root() {
        let mut c = PythonCounters::default();
        // Frame pointers: two native frames, no evaluation frame reached.
        let n = native(&["zlib_compress", "deflate"]);
        let p = py(&[("compress_forever", false), ("run", true)]);
        let out = stitch_at_tick(n, &p, &mut c);
        assert_eq!(
            names(&out),
            ["run", "compress_forever", "zlib_compress", "deflate"]
        );
        // One of two calls reached.
        let n = native(&[EVAL_FRAME, "PyObject_Call", EVAL_FRAME, "f"]);
        let p = py(&[("c", true), ("b", true), ("a", true)]);
        let out = stitch_at_tick(n, &p, &mut c);
        assert_eq!(names(&out), ["a", "b", "PyObject_Call", "c", "f"]);
        assert_eq!((c.stitched, c.rooted, c.kept), (0, 2, 0));
    }

    #[test]
    fn more_evaluation_frames_than_calls_keeps_the_native_stack() {
        let mut c = PythonCounters::default();
        let n = native(&[EVAL_FRAME, "x", EVAL_FRAME]);
        let p = py(&[("only", true)]);
        assert_eq!(names(&stitch_at_tick(n.clone(), &p, &mut c)), names(&n));
        assert_eq!(names(&stitch_at_tick(n.clone(), &[], &mut c)), names(&n));
        assert_eq!((c.samples, c.kept), (2, 2));
    }

    #[test]
    fn the_program_record_matches_its_c_layout() {
        assert_eq!(std::mem::size_of::<PyProcC>(), 56);
    }
}
