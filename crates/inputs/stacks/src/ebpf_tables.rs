//! The unwind tables of the in-kernel unwinder (`bpf/unwind.bpf.h`,
//! SysOM-AI §3.3 Algorithm 1): each executable module's `.eh_frame` compiled
//! into rows ([`crate::cfi`]) once per file and stored in the `cfi_rows`
//! array; each target process's executable mappings, sorted, with the slice
//! of rows that describes each, in `proc_maps`. Processes are re-read at
//! every drain, so a library loaded since (dlopen) gets its rows, and an
//! exited process leaves the map. Anonymous executable mappings (JIT code)
//! get no rows: the hybrid walk takes validated frame-pointer steps there.

use std::collections::{HashMap, HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::{Ebpf, Pod};

use crate::cfi::{compile_eh_frame, CfiRow};
use crate::ebpf::EbpfError;
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
    /// Modules whose rows are in the kernel.
    pub modules: u64,
    /// Rows stored.
    pub rows: u64,
    /// Modules left to frame-pointer steps: no `.eh_frame`, unreadable, or
    /// the row array was full.
    pub modules_without_rows: u64,
    /// Large modules mapped but not loaded: no sample has landed in them.
    pub modules_waiting: u64,
    /// Processes with tables.
    pub processes: u64,
}

/// One module (file) the tables know.
struct ModuleEntry {
    path: std::path::PathBuf,
    segments: Vec<Segment>,
    /// Its rows in `cfi_rows`; None until loaded; (0, 0) when it has none.
    rows: Option<(u32, u32)>,
}

/// One executable mapping of a process.
#[derive(Clone, PartialEq, Eq)]
struct ProcMapping {
    start: u64,
    end: u64,
    offset: u64,
    module: Option<FileKey>,
}

/// `cfi_rows`, memory-mapped: a module's rows are written with one copy.
struct RowsMmap {
    ptr: *mut RowC,
    len: usize,
    bytes: usize,
}

// SAFETY: the mapping is owned by this value and only written through
// `&mut self` (the tables are used from one thread at a time).
unsafe impl Send for RowsMmap {}

impl RowsMmap {
    fn new(ebpf: &Ebpf, capacity: u32) -> Result<Self, EbpfError> {
        use std::os::fd::{AsFd, AsRawFd};
        let map = ebpf
            .map("cfi_rows")
            .ok_or_else(|| EbpfError::Map("cfi_rows", "not in the object".into()))?;
        let aya::maps::Map::Array(data) = map else {
            return Err(EbpfError::Map("cfi_rows", "not an array".into()));
        };
        let fd = data.fd().as_fd().as_raw_fd();
        let page = 4096usize;
        let bytes = (capacity as usize * std::mem::size_of::<RowC>()).div_ceil(page) * page;
        // SAFETY: mapping a BPF array created with BPF_F_MMAPABLE, shared,
        // for its full (page-rounded) size; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(EbpfError::Map(
                "cfi_rows",
                format!("mmap: {}", std::io::Error::last_os_error()),
            ));
        }
        Ok(RowsMmap {
            ptr: ptr.cast(),
            len: capacity as usize,
            bytes,
        })
    }

    fn write(&mut self, at: usize, rows: &[RowC]) {
        assert!(at + rows.len() <= self.len);
        // SAFETY: in bounds (checked), the mapping lives as long as self.
        unsafe { std::ptr::copy_nonoverlapping(rows.as_ptr(), self.ptr.add(at), rows.len()) };
    }
}

impl Drop for RowsMmap {
    fn drop(&mut self) {
        // SAFETY: unmapping what `new` mapped, once.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

/// The userspace side of the in-kernel unwinder's maps.
pub struct UnwindTables {
    capacity: u32,
    next_row: u32,
    rows_map: Option<RowsMmap>,
    modules: HashMap<FileKey, ModuleEntry>,
    /// Each loaded process's executable mappings.
    processes: HashMap<u32, Vec<ProcMapping>>,
    /// What the kernel's `proc_maps` holds per process.
    written: HashMap<u32, Vec<ExecMappingC>>,
    /// Processes that could not be read (gone, no permission): not retried.
    failed: HashSet<u32>,
    stats: TableStats,
}

impl UnwindTables {
    /// Tables for a program whose `cfi_rows` holds `capacity` rows.
    pub fn new(capacity: u32) -> Self {
        UnwindTables {
            capacity,
            next_row: 0,
            rows_map: None,
            modules: HashMap::new(),
            processes: HashMap::new(),
            written: HashMap::new(),
            failed: HashSet::new(),
            stats: TableStats::default(),
        }
    }

    /// What the tables hold.
    pub fn stats(&self) -> TableStats {
        TableStats {
            processes: self.processes.len() as u64,
            modules_waiting: self.modules.values().filter(|m| m.rows.is_none()).count() as u64,
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

    /// A sampled user address of `pid`: loads the rows of a large module
    /// the first time a sample lands in it. Call [`UnwindTables::flush`]
    /// after a batch.
    pub fn hit(&mut self, ebpf: &mut Ebpf, pid: u32, ip: u64) -> Result<(), EbpfError> {
        let Some(key) = self.processes.get(&pid).and_then(|ms| {
            ms.iter()
                .find(|m| (m.start..m.end).contains(&ip))
                .and_then(|m| m.module)
        }) else {
            return Ok(());
        };
        if self.modules.get(&key).is_some_and(|e| e.rows.is_none()) {
            self.load_rows(ebpf, key)?;
        }
        Ok(())
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
        let (segments, eager) = match ElfModule::open(&path) {
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
            },
        );
        if eager {
            self.load_rows(ebpf, key)?;
        }
        Ok(Some(key))
    }

    /// Compiles and stores a module's rows; (0, 0) when it has none or they
    /// do not fit.
    fn load_rows(&mut self, ebpf: &mut Ebpf, key: FileKey) -> Result<(), EbpfError> {
        let Some(path) = self.modules.get(&key).map(|e| e.path.clone()) else {
            return Ok(());
        };
        let rows = match ElfModule::open(&path) {
            Ok(module) => match &module.unwind.eh_frame {
                Some((range, bytes)) => {
                    let text = module
                        .unwind
                        .text
                        .as_ref()
                        .map(|(r, _)| r.start)
                        .unwrap_or(0);
                    compile_eh_frame(bytes, range.start, text).0
                }
                None => Vec::new(),
            },
            Err(_) => Vec::new(),
        };
        let fits_u32 = rows.last().is_none_or(|r| r.pc <= u64::from(u32::MAX));
        let len = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        let placed = if rows.is_empty() || !fits_u32 || self.capacity - self.next_row < len {
            self.stats.modules_without_rows += 1;
            (0, 0)
        } else {
            if self.rows_map.is_none() {
                self.rows_map = Some(RowsMmap::new(ebpf, self.capacity)?);
            }
            let start = self.next_row;
            let packed: Vec<RowC> = rows.iter().map(row_c).collect();
            if let Some(m) = &mut self.rows_map {
                m.write(start as usize, &packed);
            }
            self.next_row += len;
            self.stats.modules += 1;
            self.stats.rows += u64::from(len);
            (start, len)
        };
        if let Some(e) = self.modules.get_mut(&key) {
            e.rows = Some(placed);
        }
        Ok(())
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

    #[test]
    fn layouts_match_the_program() {
        // unwind.bpf.h: struct cfi_row (16 bytes), struct exec_mapping (32),
        // struct proc_mappings (8 + 512 × 32).
        assert_eq!(std::mem::size_of::<RowC>(), 16);
        assert_eq!(std::mem::size_of::<ExecMappingC>(), 32);
        assert_eq!(std::mem::size_of::<ProcMappingsC>(), 8 + MAX_MAPPINGS * 32);
    }

    #[test]
    fn unwind_settings_parse() {
        assert_eq!("hybrid".parse::<UserUnwind>(), Ok(UserUnwind::Hybrid));
        assert_eq!("fp".parse::<UserUnwind>(), Ok(UserUnwind::FramePointer));
        assert!("x".parse::<UserUnwind>().unwrap_err().contains("hybrid"));
    }
}
