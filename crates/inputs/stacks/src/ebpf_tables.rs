//! The unwind tables of the in-kernel unwinder (`bpf/unwind.bpf.h`,
//! SysOM-AI §3.3 Algorithm 1): each executable module's `.eh_frame` compiled
//! into rows ([`crate::cfi`]) once per file (keyed by device, inode, size
//! and modification time), stored once in the `cfi_rows` array and shared by
//! every process that maps the file; each target process's executable
//! mappings, sorted, with the slice of rows that describes each, in
//! `proc_maps`. Processes are re-read at every drain, so a library loaded
//! since (dlopen) gets its rows, and an exited process leaves the map.
//! Anonymous executable mappings (JIT code) get no rows: the hybrid walk
//! takes validated frame-pointer steps there.
//!
//! Bounded, as the OTel eBPF profiler and parca-agent do it:
//! * lazily: a module's rows are compiled when a process mapping it is first
//!   seen (small `.eh_frame`s) or when a sample first lands in it (large
//!   ones, such as libtorch_cpu.so's 17 MiB);
//! * streamed: rows go from the `.eh_frame` parser straight into the
//!   kernel's array through a 1 MiB window of it, so compiling a module
//!   holds a few MB (one entry per FDE), whatever its size, and the 64 MiB
//!   array never counts in the process's resident memory;
//! * capped: the array holds `max_cfi_rows` rows; when a module does not
//!   fit, modules no process maps any more are evicted, then those not
//!   sampled for a minute, least recent first (their processes fall back to
//!   frame-pointer steps there until a sample lands in them again and
//!   reloads them), counted in [`TableStats::evictions`]; a module that
//!   still does not fit waits for a later sample ([`TableStats::deferred`]).

use std::collections::{HashMap, HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::{Ebpf, Pod};

use crate::cfi::{stream_eh_frame, CfiRow};
use crate::ebpf::EbpfError;
use crate::ebpf_rowcache::{CachedRow, RowCache};
use crate::elf::{ElfModule, Segment};
use crate::maps::{self, Mapping};

/// Mappings per process the program searches (`MAX_MAPPINGS`).
pub const MAX_MAPPINGS: usize = 512;

/// How user stacks are taken in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UserUnwind {
    /// The kernel's frame-pointer walk (`bpf_get_stack`): 1–3 frames for
    /// code built without frame pointers.
    FramePointer,
    /// DWARF CFI rows only: the walk stops where a module has none.
    Dwarf,
    /// CFI rows, else a validated frame-pointer step (Algorithm 1).
    #[default]
    Hybrid,
}

impl UserUnwind {
    /// The program's `UNWIND` setting.
    pub fn mode(self) -> u32 {
        match self {
            UserUnwind::FramePointer => 0,
            UserUnwind::Dwarf => 1,
            UserUnwind::Hybrid => 2,
        }
    }
}

impl std::str::FromStr for UserUnwind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fp" | "frame-pointer" => Ok(UserUnwind::FramePointer),
            "dwarf" => Ok(UserUnwind::Dwarf),
            "hybrid" => Ok(UserUnwind::Hybrid),
            _ => Err(format!(
                "unknown unwinding {s:?}: expected hybrid, dwarf or fp"
            )),
        }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RowC {
    pc: u32,
    cfa: u8,
    rbp: u8,
    pad: u16,
    cfa_offset: i32,
    rbp_offset: i32,
}
// SAFETY: plain C struct of integers; the padding is explicit.
unsafe impl Pod for RowC {}

#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct ExecMappingC {
    start: u64,
    end: u64,
    bias: u64,
    rows_start: u32,
    rows_len: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ProcMappingsC {
    n: u32,
    pad: u32,
    m: [ExecMappingC; MAX_MAPPINGS],
}
// SAFETY: plain C structs of integers.
unsafe impl Pod for ProcMappingsC {}

/// A file's identity: device, inode, size, modification time.
type FileKey = (u64, u64, u64, i64);

/// Modules whose `.eh_frame` is at most this large get their rows when a
/// process is loaded; larger ones (libtorch_cpu's is 17 MiB: 2.7 M rows)
/// when a sample first lands in them, so a CPU job never pays for
/// libtorch_cuda's.
const EAGER_EH_FRAME_BYTES: usize = 2 << 20;

/// What the tables hold, for the command's summary line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Modules whose rows are in the kernel now.
    pub modules: u64,
    /// Rows stored now.
    pub rows: u64,
    /// Modules left to frame-pointer steps: no `.eh_frame`, unreadable, or
    /// more rows than the whole array holds.
    pub modules_without_rows: u64,
    /// Modules mapped but not loaded: large ones no sample has landed in,
    /// and evicted ones not sampled since.
    pub modules_waiting: u64,
    /// Processes with tables.
    pub processes: u64,
    /// Module rows compiled and loaded (a module evicted and sampled again
    /// counts again).
    pub loads: u64,
    /// Modules whose rows were evicted to make room for another's.
    pub evictions: u64,
    /// Loads put off: no room without evicting a module sampled recently
    /// (retried at the module's next sample in a later drain).
    pub deferred: u64,
    /// Largest number of rows held at once.
    pub peak_rows: u64,
    /// Loads whose rows came from the on-disk cache (compiled by an
    /// earlier run: [`crate::ebpf_rowcache`]) instead of `.eh_frame`.
    pub cached_loads: u64,
}

/// One module (file) the tables know.
struct ModuleEntry {
    path: std::path::PathBuf,
    segments: Vec<Segment>,
    /// Its rows in `cfi_rows`; None until loaded (or once evicted); (0, 0)
    /// when it has none.
    rows: Option<(u32, u32)>,
    /// How many rows it compiles to, once known (a reload needs that room).
    count: Option<u32>,
    /// The drain a sample last landed in it (or it was loaded): the
    /// least recent goes first.
    used: u64,
    /// The drain its load was last put off for lack of room (retried at a
    /// sample in a later drain).
    put_off: Option<u64>,
}

/// One executable mapping of a process.
#[derive(Clone, PartialEq, Eq)]
struct ProcMapping {
    start: u64,
    end: u64,
    offset: u64,
    module: Option<FileKey>,
}

/// Drains without a sample after which a module still mapped may be
/// evicted for another's rows (a minute of the agent's 5 s drains).
const STALE_DRAINS: u64 = 12;

/// Rows of `cfi_rows` mapped at once while writing (1 MiB; a multiple of
/// the 256 rows of a page).
const WINDOW_ROWS: usize = 64 << 10;

/// Writes rows into `cfi_rows` (created with BPF_F_MMAPABLE) through a
/// window of it mapped at a time: the kernel maps every page of a mapped
/// BPF array at once, and they count in this process's resident memory.
struct RowWriter {
    fd: std::os::fd::RawFd,
    capacity: usize,
    /// The first row of the mapped window, the mapping, its length in bytes.
    window: Option<(usize, *mut RowC, usize)>,
}

impl RowWriter {
    fn new(ebpf: &Ebpf, capacity: u32) -> Result<Self, EbpfError> {
        use std::os::fd::{AsFd, AsRawFd};
        let map = ebpf
            .map("cfi_rows")
            .ok_or_else(|| EbpfError::Map("cfi_rows", "not in the object".into()))?;
        let aya::maps::Map::Array(data) = map else {
            return Err(EbpfError::Map("cfi_rows", "not an array".into()));
        };
        Ok(RowWriter {
            fd: data.fd().as_fd().as_raw_fd(),
            capacity: capacity as usize,
            window: None,
        })
    }

    /// Stores `row` at index `at` (< capacity).
    fn put(&mut self, at: usize, row: RowC) -> Result<(), EbpfError> {
        debug_assert!(at < self.capacity);
        let ptr = match self.window {
            Some((first, ptr, _)) if (first..first + WINDOW_ROWS).contains(&at) => {
                // SAFETY: `at` is inside the mapped window (and the array).
                unsafe { ptr.add(at - first) }
            }
            _ => {
                self.unmap();
                let first = at / WINDOW_ROWS * WINDOW_ROWS;
                let rows = WINDOW_ROWS.min(self.capacity - first);
                let bytes = (rows * std::mem::size_of::<RowC>()).div_ceil(4096) * 4096;
                // SAFETY: mapping `bytes` of the array from a page-aligned
                // offset inside it, shared; checked for MAP_FAILED.
                let p = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        bytes,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        self.fd,
                        (first * std::mem::size_of::<RowC>()) as libc::off_t,
                    )
                };
                if p == libc::MAP_FAILED {
                    return Err(EbpfError::Map(
                        "cfi_rows",
                        format!("mmap: {}", std::io::Error::last_os_error()),
                    ));
                }
                let p: *mut RowC = p.cast();
                self.window = Some((first, p, bytes));
                // SAFETY: as above.
                unsafe { p.add(at - first) }
            }
        };
        // SAFETY: in the mapped window; RowC is plain data.
        unsafe { ptr.write(row) };
        Ok(())
    }

    fn unmap(&mut self) {
        if let Some((_, ptr, bytes)) = self.window.take() {
            // SAFETY: unmapping what `put` mapped, once.
            unsafe { libc::munmap(ptr.cast(), bytes) };
        }
    }
}

impl Drop for RowWriter {
    fn drop(&mut self) {
        self.unmap();
    }
}

/// The free ranges of `cfi_rows` (start → length), merged with their
/// neighbours.
#[derive(Debug, Default)]
struct FreeRows(std::collections::BTreeMap<u32, u32>);

impl FreeRows {
    fn new(capacity: u32) -> Self {
        let mut f = FreeRows::default();
        if capacity > 0 {
            f.0.insert(0, capacity);
        }
        f
    }

    /// The largest free range.
    fn largest(&self) -> Option<(u32, u32)> {
        self.0
            .iter()
            .max_by_key(|(s, l)| (**l, std::cmp::Reverse(**s)))
            .map(|(s, l)| (*s, *l))
    }

    /// The smallest free range of at least `len` rows.
    fn fit(&self, len: u32) -> Option<(u32, u32)> {
        self.0
            .iter()
            .filter(|(_, l)| **l >= len)
            .min_by_key(|(s, l)| (**l, **s))
            .map(|(s, l)| (*s, *l))
    }

    /// Takes `len` rows at the start of the free range at `start`.
    fn take(&mut self, start: u32, len: u32) {
        let Some(have) = self.0.remove(&start) else {
            return;
        };
        if have > len {
            self.0.insert(start + len, have - len);
        }
    }

    /// Gives back `len` rows at `start`.
    fn give(&mut self, mut start: u32, mut len: u32) {
        if len == 0 {
            return;
        }
        if let Some((&s, &l)) = self.0.range(..start).next_back() {
            if s + l == start {
                self.0.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = self.0.remove(&(start + len)) {
            len += l;
        }
        self.0.insert(start, len);
    }
}

/// The userspace side of the in-kernel unwinder's maps.
pub struct UnwindTables {
    capacity: u32,
    free: FreeRows,
    /// Rows held now.
    held: u64,
    /// Drains so far: the clock of [`ModuleEntry::used`].
    clock: u64,
    modules: HashMap<FileKey, ModuleEntry>,
    /// Each loaded process's executable mappings.
    processes: HashMap<u32, Vec<ProcMapping>>,
    /// What the kernel's `proc_maps` holds per process.
    written: HashMap<u32, Vec<ExecMappingC>>,
    /// Processes that could not be read (gone, no permission): not retried.
    failed: HashSet<u32>,
    stats: TableStats,
    /// Rows compiled before, by Build-ID.
    cache: RowCache,
}

impl UnwindTables {
    /// Tables for a program whose `cfi_rows` holds `capacity` rows.
    pub fn new(capacity: u32) -> Self {
        UnwindTables {
            capacity,
            free: FreeRows::new(capacity),
            held: 0,
            clock: 0,
            modules: HashMap::new(),
            processes: HashMap::new(),
            written: HashMap::new(),
            failed: HashSet::new(),
            stats: TableStats::default(),
            cache: RowCache::from_env(),
        }
    }

    /// What the tables hold.
    pub fn stats(&self) -> TableStats {
        TableStats {
            processes: self.processes.len() as u64,
            modules_waiting: self.modules.values().filter(|m| m.rows.is_none()).count() as u64,
            modules: self
                .modules
                .values()
                .filter(|m| m.rows.is_some_and(|(_, n)| n > 0))
                .count() as u64,
            rows: self.held,
            ..self.stats
        }
    }

    /// Whether `pid` has tables (or could not get any).
    pub fn knows(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid) || self.failed.contains(&pid)
    }

    /// Reads `pid`'s executable mappings and writes its tables; modules
    /// with a small `.eh_frame` get their rows now, large ones at their
    /// first sample ([`UnwindTables::hit`]). A process that cannot be read
    /// keeps the kernel's frame-pointer walk.
    pub fn load(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), EbpfError> {
        let Ok(all) = maps::read_maps(pid as i32) else {
            self.failed.insert(pid);
            return Ok(());
        };
        let mut mappings = Vec::new();
        for m in all.iter().filter(|m| m.exec) {
            let module = if m.is_file() {
                self.module(ebpf, pid, m)?
            } else {
                None // JIT code, [vdso]: frame-pointer steps
            };
            mappings.push(ProcMapping {
                start: m.start,
                end: m.end,
                offset: m.offset,
                module,
            });
        }
        self.processes.insert(pid, mappings);
        self.write(ebpf, pid)
    }

    /// A sampled user address of `pid`: marks its module used in this
    /// drain (the least recently used are evicted first). Call it for every
    /// address of a drain before [`UnwindTables::hit`], so that no module
    /// sampled in the drain is evicted for another.
    pub fn touch(&mut self, pid: u32, ip: u64) {
        let clock = self.clock;
        if let Some(e) = self
            .module_at(pid, ip)
            .and_then(|k| self.modules.get_mut(&k))
        {
            e.used = clock;
        }
    }

    /// A sampled user address of `pid`: loads the rows of its module the
    /// first time a sample lands in it (a large module, or one evicted).
    /// Call [`UnwindTables::flush`] after a batch.
    pub fn hit(&mut self, ebpf: &mut Ebpf, pid: u32, ip: u64) -> Result<(), EbpfError> {
        self.touch(pid, ip);
        let Some(key) = self.module_at(pid, ip) else {
            return Ok(());
        };
        let clock = self.clock;
        if self
            .modules
            .get(&key)
            .is_some_and(|e| e.rows.is_none() && e.put_off != Some(clock))
        {
            self.load_rows(ebpf, key)?;
        }
        Ok(())
    }

    fn module_at(&self, pid: u32, ip: u64) -> Option<FileKey> {
        self.processes.get(&pid).and_then(|ms| {
            ms.iter()
                .find(|m| (m.start..m.end).contains(&ip))
                .and_then(|m| m.module)
        })
    }

    /// Rewrites the kernel's mappings of every process whose rows changed.
    pub fn flush(&mut self, ebpf: &mut Ebpf) -> Result<(), EbpfError> {
        let pids: Vec<u32> = self.processes.keys().copied().collect();
        for pid in pids {
            self.write(ebpf, pid)?;
        }
        Ok(())
    }

    /// Re-reads the loaded processes (new libraries) and forgets exited ones.
    pub fn refresh(&mut self, ebpf: &mut Ebpf) -> Result<(), EbpfError> {
        self.clock += 1;
        let pids: Vec<u32> = self.processes.keys().copied().collect();
        for pid in pids {
            if std::path::Path::new(&format!("/proc/{pid}")).exists() {
                self.load(ebpf, pid)?;
            } else {
                self.forget(ebpf, pid)?;
            }
        }
        self.failed
            .retain(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        Ok(())
    }

    /// Removes `pid`'s tables (its module rows stay for other processes).
    pub fn forget(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), EbpfError> {
        self.processes.remove(&pid);
        self.written.remove(&pid);
        let mut map: BpfHashMap<&mut MapData, u32, ProcMappingsC> =
            crate::ebpf::map_mut(ebpf, "proc_maps")?;
        let _ = map.remove(&pid);
        Ok(())
    }

    /// The kernel's view of `pid`'s mappings, written when it changed.
    fn write(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), EbpfError> {
        let Some(ms) = self.processes.get(&pid) else {
            return Ok(());
        };
        let mut mappings: Vec<ExecMappingC> = ms
            .iter()
            .map(|m| {
                let mut out = ExecMappingC {
                    start: m.start,
                    end: m.end,
                    ..ExecMappingC::default()
                };
                let Some(e) = m.module.and_then(|k| self.modules.get(&k)) else {
                    return out;
                };
                let svma = e
                    .segments
                    .iter()
                    .find(|s| (s.offset..s.offset + s.filesz).contains(&m.offset))
                    .map(|s| s.vaddr + (m.offset - s.offset));
                if let (Some(svma), Some((start, len))) = (svma, e.rows) {
                    out.bias = m.start.wrapping_sub(svma);
                    out.rows_start = start;
                    out.rows_len = len;
                }
                out
            })
            .collect();
        // The program searches the first MAX_MAPPINGS; keep those with rows
        // when there are more.
        if mappings.len() > MAX_MAPPINGS {
            mappings.sort_by_key(|m| (m.rows_len == 0, m.start));
            mappings.truncate(MAX_MAPPINGS);
            mappings.sort_by_key(|m| m.start);
        }
        if self.written.get(&pid) == Some(&mappings) {
            return Ok(());
        }
        let mut value = ProcMappingsC {
            n: mappings.len() as u32,
            pad: 0,
            m: [ExecMappingC::default(); MAX_MAPPINGS],
        };
        value.m[..mappings.len()].copy_from_slice(&mappings);
        let mut map: BpfHashMap<&mut MapData, u32, ProcMappingsC> =
            crate::ebpf::map_mut(ebpf, "proc_maps")?;
        match map.insert(pid, value, 0) {
            Ok(()) => {
                self.written.insert(pid, mappings);
            }
            // The map is full: this process keeps the kernel's walk.
            Err(_) => {
                self.processes.remove(&pid);
                self.failed.insert(pid);
            }
        }
        Ok(())
    }

    /// The module of a file-backed mapping, registered (and its rows
    /// loaded when its `.eh_frame` is small) the first time it is seen.
    fn module(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        m: &Mapping,
    ) -> Result<Option<FileKey>, EbpfError> {
        let path = maps::file_path(pid as i32, &m.path);
        let Some(key) = file_key(&path) else {
            return Ok(None);
        };
        if self.modules.contains_key(&key) {
            return Ok(Some(key));
        }
        let (segments, eager) = match ElfModule::open_without_symbols(&path) {
            Ok(module) => {
                let small = module
                    .unwind
                    .eh_frame
                    .as_ref()
                    .is_none_or(|(_, b)| b.len() <= EAGER_EH_FRAME_BYTES);
                (module.segments.clone(), small)
            }
            Err(_) => {
                self.stats.modules_without_rows += 1;
                self.modules.insert(
                    key,
                    ModuleEntry {
                        path,
                        segments: Vec::new(),
                        rows: Some((0, 0)),
                        count: Some(0),
                        used: self.clock,
                        put_off: None,
                    },
                );
                return Ok(Some(key));
            }
        };
        self.modules.insert(
            key,
            ModuleEntry {
                path,
                segments,
                rows: None,
                count: None,
                used: self.clock,
                put_off: None,
            },
        );
        if eager {
            self.load_rows(ebpf, key)?;
        }
        Ok(Some(key))
    }

    /// Compiles a module's rows straight into `cfi_rows`; (0, 0) when it
    /// has none or they do not fit in the whole array. Where the free rows
    /// are too few, the modules sampled least recently are evicted first.
    fn load_rows(&mut self, ebpf: &mut Ebpf, key: FileKey) -> Result<(), EbpfError> {
        let Some((path, mut need)) = self.modules.get(&key).map(|e| (e.path.clone(), e.count))
        else {
            return Ok(());
        };
        let module = ElfModule::open_without_symbols(&path).ok();
        let eh = module.as_ref().and_then(|m| {
            let (range, bytes) = m.unwind.eh_frame.as_ref()?;
            let text = m.unwind.text.as_ref().map(|(r, _)| r.start).unwrap_or(0);
            Some((&bytes[..], range.start, text))
        });
        let build_id = module.as_ref().and_then(|m| m.build_id.as_deref());
        let mut cached = build_id.and_then(|id| Some(id).zip(self.cache.count(id)));
        if let Some((_, n)) = cached {
            need = Some(n);
        }
        let mut deferred = false;
        let placed = 'placed: {
            let Some((bytes, eh_svma, text)) = eh else {
                break 'placed None;
            };
            // At most two tries: into the largest free range, then, if the
            // rows did not fit, into room made for their known number.
            for _ in 0..2 {
                let room = match need {
                    Some(0) => break 'placed None,
                    Some(n) if n > self.capacity => break 'placed None,
                    Some(n) => self.make_room(ebpf, key, n)?,
                    None => match self.free.largest() {
                        Some(r) => Some(r),
                        None => self.make_room(ebpf, key, 1)?,
                    },
                };
                let Some((start, avail)) = room else {
                    // No room without evicting modules sampled in this
                    // drain: it waits for its next sample.
                    deferred = true;
                    break 'placed None;
                };
                let mut writer = RowWriter::new(ebpf, self.capacity)?;
                let mut put = |n: u32, row: RowC| match n < avail {
                    true => writer.put((start + n) as usize, row),
                    false => Ok(()),
                };
                let n = match cached {
                    Some((id, _)) => match self.put_cached(id, &mut put)? {
                        Some(n) => Some(n),
                        // Unreadable after all: compile it.
                        None => {
                            cached = None;
                            compile_rows(bytes, eh_svma, text, None, &mut put)?
                        }
                    },
                    None => {
                        let rows = build_id.and_then(|id| self.cache.writer(id));
                        compile_rows(bytes, eh_svma, text, rows, &mut put)?
                    }
                };
                drop(writer);
                let Some(n) = n else {
                    break 'placed None; // addresses past 4 GiB
                };
                need = Some(n);
                if n == 0 {
                    break 'placed None;
                }
                if n <= avail {
                    self.free.take(start, n);
                    if cached.is_some() {
                        self.stats.cached_loads += 1;
                    }
                    break 'placed Some((start, n));
                }
            }
            None
        };
        let clock = self.clock;
        if let Some(e) = self.modules.get_mut(&key) {
            e.count = need;
            e.used = clock;
            e.rows = if deferred {
                e.put_off = Some(clock);
                None
            } else {
                Some(placed.unwrap_or((0, 0)))
            };
        }
        if deferred {
            self.stats.deferred += 1;
            return Ok(());
        }
        match placed {
            Some((_, n)) => {
                self.held += u64::from(n);
                self.stats.loads += 1;
                self.stats.peak_rows = self.stats.peak_rows.max(self.held);
            }
            None => self.stats.modules_without_rows += 1,
        }
        Ok(())
    }

    /// A free range of at least `len` rows (`len` <= capacity), evicting
    /// modules (not `keep`) until there is one: those no process maps,
    /// then those not sampled for [`STALE_DRAINS`] drains, least recent
    /// first; None when those are not enough.
    /// Processes that mapped an evicted module are rewritten to
    /// frame-pointer steps there before its rows are reused.
    fn make_room(
        &mut self,
        ebpf: &mut Ebpf,
        keep: FileKey,
        len: u32,
    ) -> Result<Option<(u32, u32)>, EbpfError> {
        let mut evicted = false;
        let room = loop {
            if let Some(r) = self.free.fit(len) {
                break Some(r);
            }
            // Modules no process maps any more first, then those not
            // sampled for STALE_DRAINS drains, least recent first: a
            // working set larger than the array is not thrashed.
            let mapped: HashSet<FileKey> = self
                .processes
                .values()
                .flat_map(|ms| ms.iter().filter_map(|m| m.module))
                .collect();
            let clock = self.clock;
            let victim = self
                .modules
                .iter()
                .filter(|(k, e)| **k != keep && e.rows.is_some_and(|(_, n)| n > 0))
                .filter(|(k, e)| !mapped.contains(*k) || e.used + STALE_DRAINS <= clock)
                .min_by_key(|(k, e)| (mapped.contains(*k), e.used))
                .map(|(k, _)| *k);
            let Some(victim) = victim else {
                break None;
            };
            if let Some(e) = self.modules.get_mut(&victim) {
                if let Some((s, n)) = e.rows.take() {
                    self.free.give(s, n);
                    self.held -= u64::from(n);
                    self.stats.evictions += 1;
                    evicted = true;
                }
            }
        };
        if evicted {
            self.flush(ebpf)?;
        }
        Ok(room)
    }
}

impl UnwindTables {
    /// The module's cached rows through `put`; `None` (after maybe some
    /// rows) when the file could not be read whole.
    fn put_cached(
        &self,
        build_id: &str,
        put: &mut impl FnMut(u32, RowC) -> Result<(), EbpfError>,
    ) -> Result<Option<u32>, EbpfError> {
        let mut n = 0u32;
        let mut failed = None;
        let read = self.cache.for_each(build_id, |r| {
            if let Err(e) = put(n, row_from_cache(r)) {
                failed = Some(e);
                return false;
            }
            n += 1;
            true
        });
        match failed {
            Some(e) => Err(e),
            None => Ok(read.filter(|&m| m == n)),
        }
    }
}

/// Compiles `.eh_frame` rows through `put` (and into the cache's `keep`
/// when given, kept only when every row was seen); the number of rows, or
/// `None` when the module's addresses do not fit the program's 32 bits.
fn compile_rows(
    bytes: &[u8],
    eh_svma: u64,
    text: u64,
    mut keep: Option<crate::ebpf_rowcache::RowWriter>,
    put: &mut impl FnMut(u32, RowC) -> Result<(), EbpfError>,
) -> Result<Option<u32>, EbpfError> {
    let mut n: u32 = 0;
    let mut wide = false;
    let mut failed = None;
    stream_eh_frame(bytes, eh_svma, text, |r| {
        if r.pc > u64::from(u32::MAX) {
            wide = true;
            return false;
        }
        let row = row_c(&r);
        if let Err(e) = put(n, row) {
            failed = Some(e);
            return false;
        }
        if let Some(k) = &mut keep {
            k.push(row_to_cache(row));
        }
        n = n.saturating_add(1);
        true
    });
    if let Some(e) = failed {
        return Err(e);
    }
    if wide {
        return Ok(None);
    }
    if let Some(k) = keep {
        k.finish();
    }
    Ok(Some(n))
}

fn row_to_cache(r: RowC) -> CachedRow {
    CachedRow {
        pc: r.pc,
        cfa: r.cfa,
        rbp: r.rbp,
        cfa_offset: r.cfa_offset,
        rbp_offset: r.rbp_offset,
    }
}

fn row_from_cache(r: CachedRow) -> RowC {
    RowC {
        pc: r.pc,
        cfa: r.cfa,
        rbp: r.rbp,
        pad: 0,
        cfa_offset: r.cfa_offset,
        rbp_offset: r.rbp_offset,
    }
}

fn row_c(r: &CfiRow) -> RowC {
    RowC {
        pc: r.pc as u32,
        cfa: r.cfa as u8,
        rbp: r.rbp as u8,
        pad: 0,
        cfa_offset: r.cfa_offset,
        rbp_offset: r.rbp_offset,
    }
}

fn file_key(path: &std::path::Path) -> Option<FileKey> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path).ok()?;
    Some((md.dev(), md.ino(), md.size(), md.mtime()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 48: rows read back from the on-disk cache are the rows the
    /// compile put, in order (this test binary's `.eh_frame`), and a second
    /// module's compile does not disturb the first's file.
    #[test]
    fn cached_rows_are_the_compiled_rows() {
        use object::{Object, ObjectSection};
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&exe[..]).unwrap();
        let eh = obj.section_by_name(".eh_frame").unwrap();
        let text = obj.section_by_name(".text").unwrap();
        let dir = whyslow_testkit::temp_dir("cfi-cache");
        let cache = RowCache::at(Some(dir.path().to_path_buf()));
        let mut compiled = Vec::new();
        let n = compile_rows(
            eh.data().unwrap(),
            eh.address(),
            text.address(),
            cache.writer("00aa"),
            &mut |_, r| {
                compiled.push(row_to_cache(r));
                Ok(())
            },
        )
        .unwrap()
        .unwrap();
        assert!(n > 1000 && n as usize == compiled.len(), "{n}");
        assert_eq!(cache.count("00aa"), Some(n));
        let tables = UnwindTables {
            cache,
            ..UnwindTables::new(1)
        };
        let mut back = Vec::new();
        let read = tables
            .put_cached("00aa", &mut |k, r| {
                assert_eq!(k as usize, back.len());
                back.push(row_to_cache(r));
                Ok(())
            })
            .unwrap();
        assert_eq!(read, Some(n));
        assert_eq!(back, compiled);
        assert_eq!(tables.put_cached("00bb", &mut |_, _| Ok(())).unwrap(), None);
    }

    #[test]
    fn layouts_match_the_program() {
        // unwind.bpf.h: struct cfi_row (16 bytes), struct exec_mapping (32),
        // struct proc_mappings (8 + 512 × 32).
        assert_eq!(std::mem::size_of::<RowC>(), 16);
        assert_eq!(std::mem::size_of::<ExecMappingC>(), 32);
        assert_eq!(std::mem::size_of::<ProcMappingsC>(), 8 + MAX_MAPPINGS * 32);
    }

    #[test]
    fn free_rows_fit_and_merge() {
        let mut f = FreeRows::new(100);
        assert_eq!(f.largest(), Some((0, 100)));
        f.take(0, 30); // [0, 30) used
        assert_eq!(f.largest(), Some((30, 70)));
        f.take(30, 20); // [30, 50) used
        f.take(50, 10); // [50, 60) used
        assert_eq!(f.fit(41), None);
        assert_eq!(f.fit(40), Some((60, 40)));
        f.give(0, 30);
        // The smallest range that fits.
        assert_eq!(f.fit(25), Some((0, 30)));
        f.give(50, 10); // merges with [60, 100)
        assert_eq!(f.largest(), Some((50, 50)));
        f.give(30, 20); // merges both sides: all free again
        assert_eq!(f.0.len(), 1);
        assert_eq!(f.largest(), Some((0, 100)));
        assert_eq!(FreeRows::new(0).largest(), None);
    }

    #[test]
    fn unwind_settings_parse() {
        assert_eq!("hybrid".parse::<UserUnwind>(), Ok(UserUnwind::Hybrid));
        assert_eq!("fp".parse::<UserUnwind>(), Ok(UserUnwind::FramePointer));
        assert!("x".parse::<UserUnwind>().unwrap_err().contains("hybrid"));
    }
}
