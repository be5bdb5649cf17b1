//! The loaded uprobes and their ring buffer.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::uprobe::UProbeLinkId;
use aya::programs::UProbe;
use aya::{Ebpf, EbpfLoader};

use crate::{chain, gloo_functions, TraceError, OPS};

/// The compiled program (`bpf/gloo.bpf.c`, built by `scripts/build-bpf`).
pub static GLOO_OBJECT: &[u8] = aya::include_bytes_aligned!("../bpf/gloo.bpf.o");

/// Words of the options object the program copies (`OPTION_WORDS`).
const OPTION_WORDS: usize = 20;

/// One collective call as the probes saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlooEvent {
    /// Process.
    pub pid: u32,
    /// Thread that ran the collective.
    pub tid: u32,
    /// Operation index in [`OPS`].
    pub op: usize,
    /// Rank in the gloo context (`-1` if unreadable).
    pub rank: i32,
    /// Size of the gloo context (`-1` if unreadable).
    pub size: i32,
    /// Address of the gloo context in the process: one per process group.
    pub context: u64,
    /// Entry, ns of CLOCK_MONOTONIC.
    pub entry_ns: u64,
    /// Return, ns of CLOCK_MONOTONIC.
    pub exit_ns: u64,
    /// The first words of the call's options object.
    pub options: [u64; OPTION_WORDS],
}

impl GlooEvent {
    /// Decodes one ring-buffer record (`struct event` of the program).
    pub fn parse(b: &[u8]) -> Option<GlooEvent> {
        if b.len() < 56 + 8 * OPTION_WORDS {
            return None;
        }
        let u32_at = |i: usize| u32::from_ne_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_ne_bytes(b[i..i + 8].try_into().unwrap());
        let mut options = [0u64; OPTION_WORDS];
        for (k, o) in options.iter_mut().enumerate() {
            *o = u64_at(56 + 8 * k);
        }
        let op = u32_at(8) as usize;
        let words: Vec<i32> = (0..4).map(|k| u32_at(16 + 4 * k) as i32).collect();
        // `int rank; int size;` first, or after an 8-byte vtable pointer.
        let plausible = |r: i32, s: i32| s > 0 && s <= 1 << 20 && (0..s).contains(&r);
        let (rank, size) = if plausible(words[0], words[1]) {
            (words[0], words[1])
        } else if plausible(words[2], words[3]) {
            (words[2], words[3])
        } else {
            (-1, -1)
        };
        (op < OPS.len()).then(|| GlooEvent {
            pid: u32_at(0),
            tid: u32_at(4),
            op,
            rank,
            size,
            context: u64_at(32),
            entry_ns: u64_at(40),
            exit_ns: u64_at(48),
            options,
        })
    }

    /// The collective's tag where the options' layout is known: PyTorch
    /// numbers each process group's collectives (`ProcessGroupGloo`'s
    /// collective counter, passed as gloo's tag), the same on every rank,
    /// whenever the tracer attached. `AllreduceOptions` holds, after the
    /// sizes, the reduction function (32 bytes), then the tag (word 16) and
    /// `maxSegmentSize` (word 17, a power of two): read from PyTorch 2.x,
    /// where successive all-reduces gave tags 1, 2, 3, … on every rank.
    pub fn tag(&self) -> Option<u64> {
        if self.bytes() == 0 || !self.options[17].is_power_of_two() {
            return None;
        }
        Some(self.options[16] & 0xffff_ffff)
    }

    /// Payload bytes where the options' layout is known: gloo's
    /// `AllreduceOptions` holds the context (16 bytes), the timeout (8), a
    /// flag word, the input and output buffer vectors (24 each), then
    /// `size_t elements` and `size_t elementSize` (read from PyTorch 2.x's
    /// libtorch_cpu.so: 1000 floats gave words 10 and 11 = 1000 and 4).
    /// 0 when unknown or implausible.
    pub fn bytes(&self) -> u64 {
        if OPS[self.op] != "allreduce" {
            return 0;
        }
        let (elements, element_size) = (self.options[10], self.options[11]);
        if matches!(element_size, 1 | 2 | 4 | 8 | 16) && elements < (1 << 40) {
            elements * element_size
        } else {
            0
        }
    }
}

/// The program's counters (`stats` map), summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TracerStats {
    /// Calls entered by traced processes.
    pub entries: u64,
    /// Events written.
    pub events: u64,
    /// Returns without a recorded entry (attached mid-call).
    pub no_entry: u64,
    /// Events lost to a full ring buffer.
    pub ring_full: u64,
    /// Options objects that could not be read.
    pub read_errors: u64,
}

/// Entry and return uprobes of one BPF object (`enter_<name>` and
/// `exit_<name>` programs, a `targets` pid filter, an `events` ring buffer,
/// a per-CPU `stats` array), attached per process: what the gloo and the
/// NCCL tracers share.
pub(crate) struct Uprobes {
    ebpf: Ebpf,
    events: RingBuf<MapData>,
    attached: HashMap<u32, Vec<(String, UProbeLinkId)>>,
}

impl Uprobes {
    /// Loads `object` and its `enter_`/`exit_` programs for each of `names`.
    pub(crate) fn open(object: &[u8], names: &[&str]) -> Result<Self, TraceError> {
        let mut ebpf = EbpfLoader::new()
            .load(object)
            .map_err(|e| TraceError::Load(chain(&e)))?;
        for name in names {
            for kind in ["enter", "exit"] {
                let prog_name = format!("{kind}_{name}");
                let prog: &mut UProbe = ebpf
                    .program_mut(&prog_name)
                    .ok_or_else(|| {
                        TraceError::Load(format!("no program {prog_name} in the object"))
                    })?
                    .try_into()
                    .map_err(|e: aya::programs::ProgramError| TraceError::Load(chain(&e)))?;
                prog.load().map_err(|e| TraceError::Load(chain(&e)))?;
            }
        }
        let events = ebpf
            .take_map("events")
            .ok_or_else(|| TraceError::Map("events", "not in the object".into()))?;
        let events = RingBuf::try_from(events).map_err(|e| TraceError::Map("events", chain(&e)))?;
        Ok(Uprobes {
            ebpf,
            events,
            attached: HashMap::new(),
        })
    }

    /// How many functions `pid` is traced in, if it is.
    pub(crate) fn attached(&self, pid: u32) -> Option<usize> {
        self.attached.get(&pid).map(|links| links.len() / 2)
    }

    /// Puts the probes of each (program name, symbol, file offset) of
    /// `functions` on `pid`'s `library`; on a failure none stays.
    pub(crate) fn attach(
        &mut self,
        pid: u32,
        library: &Path,
        functions: &[(&str, String, u64)],
    ) -> Result<usize, TraceError> {
        {
            let mut targets: BpfHashMap<&mut MapData, u32, u8> = self
                .ebpf
                .map_mut("targets")
                .ok_or_else(|| TraceError::Map("targets", "not in the object".into()))?
                .try_into()
                .map_err(|e: aya::maps::MapError| TraceError::Map("targets", chain(&e)))?;
            targets
                .insert(pid, 1, 0)
                .map_err(|e| TraceError::Map("targets", chain(&e)))?;
        }
        let mut links = Vec::new();
        for (name, symbol, offset) in functions {
            for kind in ["enter", "exit"] {
                let prog_name = format!("{kind}_{name}");
                let prog: &mut UProbe = self
                    .ebpf
                    .program_mut(&prog_name)
                    .expect("loaded in open")
                    .try_into()
                    .expect("a uprobe");
                match prog.attach(None, *offset, library, Some(pid as i32)) {
                    Ok(id) => links.push((prog_name, id)),
                    Err(e) => {
                        self.attached.insert(pid, links);
                        self.detach(pid);
                        return Err(TraceError::Attach {
                            function: symbol.clone(),
                            path: library.display().to_string(),
                            reason: chain(&e),
                        });
                    }
                }
            }
        }
        self.attached.insert(pid, links);
        Ok(functions.len())
    }

    /// Removes `pid`'s probes and filter entry (nothing if it had none).
    pub(crate) fn detach(&mut self, pid: u32) {
        for (name, id) in self.attached.remove(&pid).unwrap_or_default() {
            if let Some(p) = self.ebpf.program_mut(&name) {
                let prog: Result<&mut UProbe, _> = p.try_into();
                if let Ok(prog) = prog {
                    let _ = prog.detach(id);
                }
            }
        }
        if let Some(m) = self.ebpf.map_mut("targets") {
            let targets: Result<BpfHashMap<&mut MapData, u32, u8>, _> = m.try_into();
            if let Ok(mut t) = targets {
                let _ = t.remove(&pid);
            }
        }
    }

    /// The processes traced now.
    pub(crate) fn pids(&self) -> Vec<u32> {
        let mut p: Vec<u32> = self.attached.keys().copied().collect();
        p.sort();
        p
    }

    /// The ring buffer's records so far decoded by `parse`, waiting up to
    /// `timeout` for the first.
    pub(crate) fn poll<T>(
        &mut self,
        timeout: Duration,
        parse: impl Fn(&[u8]) -> Option<T>,
    ) -> Vec<T> {
        let until = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            while let Some(item) = self.events.next() {
                if let Some(e) = parse(&item) {
                    out.push(e);
                }
            }
            if !out.is_empty() || Instant::now() >= until {
                return out;
            }
            std::thread::sleep(Duration::from_millis(20).min(until - Instant::now()));
        }
    }

    /// The raw `inflight` entries (calls entered and not returned), by
    /// thread id: `N` bytes of the program's `struct entry` each.
    pub(crate) fn in_flight<const N: usize>(&self) -> Vec<(u32, [u8; N])> {
        let Some(m) = self.ebpf.map("inflight") else {
            return Vec::new();
        };
        let Ok(map) = BpfHashMap::<&MapData, u32, [u8; N]>::try_from(m) else {
            return Vec::new();
        };
        map.iter().filter_map(Result::ok).collect()
    }

    /// The program's counters.
    pub(crate) fn stats(&self) -> Result<TracerStats, TraceError> {
        let m = self
            .ebpf
            .map("stats")
            .ok_or_else(|| TraceError::Map("stats", "not in the object".into()))?;
        let arr: PerCpuArray<&MapData, u64> = m
            .try_into()
            .map_err(|e: aya::maps::MapError| TraceError::Map("stats", chain(&e)))?;
        let get = |i: u32| -> u64 { arr.get(&i, 0).map(|v| v.iter().sum::<u64>()).unwrap_or(0) };
        Ok(TracerStats {
            entries: get(0),
            events: get(1),
            no_entry: get(2),
            ring_full: get(3),
            read_errors: get(4),
        })
    }
}

/// gloo's collectives of chosen processes, traced with uprobes.
pub struct GlooTracer {
    probes: Uprobes,
}

impl GlooTracer {
    /// Loads the program (no probe attached yet).
    pub fn open() -> Result<Self, TraceError> {
        Ok(GlooTracer {
            probes: Uprobes::open(GLOO_OBJECT, &OPS)?,
        })
    }

    /// Traces `pid`'s calls into the gloo functions of `library` (a file the
    /// process mapped: [`crate::gloo_library`]). Returns how many operations
    /// were found there; 0 means the library holds no gloo.
    pub fn attach(&mut self, pid: u32, library: &Path) -> Result<usize, TraceError> {
        if let Some(n) = self.probes.attached(pid) {
            return Ok(n);
        }
        let functions: Vec<(&str, String, u64)> = gloo_functions(library)?
            .into_iter()
            .map(|f| (OPS[f.op], f.symbol, f.file_offset))
            .collect();
        self.probes.attach(pid, library, &functions)
    }

    /// Stops tracing `pid` (its probes removed; nothing if it had none).
    pub fn detach(&mut self, pid: u32) {
        self.probes.detach(pid)
    }

    /// The processes traced now.
    pub fn pids(&self) -> Vec<u32> {
        self.probes.pids()
    }

    /// The events written so far, waiting up to `timeout` for the first.
    pub fn poll(&mut self, timeout: Duration) -> Vec<GlooEvent> {
        self.probes.poll(timeout, GlooEvent::parse)
    }

    /// Calls entered and not returned yet, as events with `exit_ns` 0:
    /// what a rank waiting in a collective that never finishes shows (a
    /// hang). The process of each thread is read from `/proc`; threads
    /// gone since are left out.
    pub fn in_flight(&self) -> Vec<GlooEvent> {
        // `struct entry`: entry_ns, context, context_words[4], op, pad,
        // options[OPTION_WORDS].
        const ENTRY: usize = 40 + 8 * OPTION_WORDS;
        let mut out = Vec::new();
        for (tid, e) in self.probes.in_flight::<ENTRY>() {
            let Some(pid) = tgid_of(tid) else { continue };
            // Laid out as the ring buffer's `struct event`.
            let mut b = vec![0u8; 56 + 8 * OPTION_WORDS];
            b[0..4].copy_from_slice(&pid.to_ne_bytes());
            b[4..8].copy_from_slice(&tid.to_ne_bytes());
            b[8..12].copy_from_slice(&e[32..36]); // op
            b[16..32].copy_from_slice(&e[16..32]); // context words
            b[32..40].copy_from_slice(&e[8..16]); // context
            b[40..48].copy_from_slice(&e[0..8]); // entry_ns
            b[56..].copy_from_slice(&e[40..]); // options
            out.extend(GlooEvent::parse(&b));
        }
        out
    }

    /// The program's counters.
    pub fn stats(&self) -> Result<TracerStats, TraceError> {
        self.probes.stats()
    }
}

/// The process a thread belongs to (`Tgid:` of `/proc/TID/status`).
fn tgid_of(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
