//! The unwind tables of the in-kernel unwinder (`bpf/unwind.bpf.h`,
//! SysOM-AI §3.3 Algorithm 1): each executable module's `.eh_frame` compiled
//! into rows ([`crate::cfi`]) once per file and stored in the `cfi_rows`
//! array; each target process's executable mappings, sorted, with the slice
//! of rows that describes each, in `proc_maps`. Processes are re-read at
//! every drain, so a library loaded since (dlopen) gets its rows, and an
//! exited process leaves the map. Anonymous executable mappings (JIT code)
//! get no rows: the hybrid walk takes validated frame-pointer steps there.

use std::collections::{HashMap, HashSet};

use aya::maps::{Array, HashMap as BpfHashMap, MapData};
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
    /// Processes with tables.
    pub processes: u64,
}

/// The userspace side of the in-kernel unwinder's maps.
pub struct UnwindTables {
    capacity: u32,
    next_row: u32,
    /// Per file: its rows in `cfi_rows` and its load segments.
    modules: HashMap<FileKey, ((u32, u32), Vec<Segment>)>,
    /// Each loaded process's executable mappings as last written.
    processes: HashMap<u32, Vec<ExecMappingC>>,
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
            modules: HashMap::new(),
            processes: HashMap::new(),
            failed: HashSet::new(),
            stats: TableStats::default(),
        }
    }

    /// What the tables hold.
    pub fn stats(&self) -> TableStats {
        TableStats {
            processes: self.processes.len() as u64,
            ..self.stats
        }
    }

    /// Whether `pid` has tables (or could not get any).
    pub fn knows(&self, pid: u32) -> bool {
        self.processes.contains_key(&pid) || self.failed.contains(&pid)
    }

    /// Reads `pid`'s executable mappings and writes its tables, compiling
    /// the rows of modules not seen before. A process that cannot be read
    /// keeps the kernel's frame-pointer walk.
    pub fn load(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), EbpfError> {
        let Ok(all) = maps::read_maps(pid as i32) else {
            self.failed.insert(pid);
            return Ok(());
        };
        let mut mappings: Vec<ExecMappingC> = Vec::new();
        for m in all.iter().filter(|m| m.exec) {
            mappings.push(self.mapping(ebpf, pid, m)?);
        }
        // The program searches the first MAX_MAPPINGS; the main program and
        // libraries come first in address order only by chance, so keep
        // those with rows when there are too many.
        if mappings.len() > MAX_MAPPINGS {
            mappings.sort_by_key(|m| (m.rows_len == 0, m.start));
            mappings.truncate(MAX_MAPPINGS);
            mappings.sort_by_key(|m| m.start);
        }
        if self.processes.get(&pid) == Some(&mappings) {
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
                self.processes.insert(pid, mappings);
            }
            // The map is full: this process keeps the kernel's walk.
            Err(_) => {
                self.failed.insert(pid);
            }
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
        let mut map: BpfHashMap<&mut MapData, u32, ProcMappingsC> =
            crate::ebpf::map_mut(ebpf, "proc_maps")?;
        let _ = map.remove(&pid);
        Ok(())
    }

    fn mapping(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        m: &Mapping,
    ) -> Result<ExecMappingC, EbpfError> {
        let mut out = ExecMappingC {
            start: m.start,
            end: m.end,
            ..ExecMappingC::default()
        };
        if !m.is_file() {
            return Ok(out); // JIT code, [vdso]: frame-pointer steps
        }
        let path = maps::file_path(pid as i32, &m.path);
        let Some(key) = file_key(&path) else {
            return Ok(out);
        };
        if !self.modules.contains_key(&key) {
            let entry = match ElfModule::open(&path) {
                Ok(module) => (self.store_rows(ebpf, &module)?, module.segments.clone()),
                Err(_) => {
                    self.stats.modules_without_rows += 1;
                    ((0, 0), Vec::new())
                }
            };
            self.modules.insert(key, entry);
        }
        let ((start, len), segments) = &self.modules[&key];
        let (start, len) = (*start, *len);
        let Some(svma) = segments
            .iter()
            .find(|s| (s.offset..s.offset + s.filesz).contains(&m.offset))
            .map(|s| s.vaddr + (m.offset - s.offset))
        else {
            return Ok(out);
        };
        out.bias = m.start.wrapping_sub(svma);
        out.rows_start = start;
        out.rows_len = len;
        Ok(out)
    }

    /// Compiles and stores a module's rows; (0, 0) when it has none or they
    /// do not fit.
    fn store_rows(&mut self, ebpf: &mut Ebpf, module: &ElfModule) -> Result<(u32, u32), EbpfError> {
        let Some((range, bytes)) = &module.unwind.eh_frame else {
            self.stats.modules_without_rows += 1;
            return Ok((0, 0));
        };
        let text = module
            .unwind
            .text
            .as_ref()
            .map(|(r, _)| r.start)
            .unwrap_or(0);
        let (rows, _) = compile_eh_frame(bytes, range.start, text);
        let fits_u32 = rows.last().is_none_or(|r| r.pc <= u64::from(u32::MAX));
        let len = u32::try_from(rows.len()).unwrap_or(u32::MAX);
        if rows.is_empty() || !fits_u32 || self.capacity - self.next_row < len {
            self.stats.modules_without_rows += 1;
            return Ok((0, 0));
        }
        let start = self.next_row;
        let mut array: Array<&mut MapData, RowC> = crate::ebpf::map_mut(ebpf, "cfi_rows")?;
        for (i, r) in rows.iter().enumerate() {
            array
                .set(start + i as u32, row_c(r), 0)
                .map_err(|e| EbpfError::Map("cfi_rows", e.to_string()))?;
        }
        self.next_row += len;
        self.stats.modules += 1;
        self.stats.rows += u64::from(len);
        Ok((start, len))
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
