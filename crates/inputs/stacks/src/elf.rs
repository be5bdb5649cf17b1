//! ELF modules: Build-ID, load segments, unwind sections (for the DWARF
//! unwinder) and symbol tables (for deferred symbolization, SysOM-AI §3.4).
//!
//! Symbols are looked up by **containment**: a symbol covers
//! `[address, address + size)`, and an address in no symbol's range has no
//! name (it is shown as `module+offset`), never the "nearest lower symbol"
//! across a gap, which misattributes samples in stripped or partially
//! symbolized code (§5.3).

use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;
use object::read::elf::{SectionHeader, Sym};
use object::{Object, ObjectSection, ObjectSegment};

use crate::StackError;

/// A byte range of a memory-mapped file (section data handed to the
/// unwinder without copying).
#[derive(Clone)]
pub struct MappedBytes {
    map: Arc<Mmap>,
    range: Range<usize>,
}

/// Drops `len` bytes of `map` from `offset` out of this process's resident
/// set. The file's pages stay in the page cache (shared with the programs
/// that run the file); a later read faults them back in. Reading a large
/// library's symbol table touched 56 MB of it (libtorch_cpu), which stayed
/// in the agent's RSS, against its memory cap, though never read again.
fn release(map: &Mmap, offset: usize, len: usize) {
    // SAFETY: `map` is a read-only shared mapping of a file: MADV_DONTNEED
    // only drops this process's page-table entries for the range, and the
    // next access reads the same bytes from the page cache; no reference
    // into the map is invalidated.
    let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len) };
}

/// Symbols read between two [`release`]s of the symbol table (1.5 MB).
const SYMBOLS_PER_RELEASE: usize = 1 << 16;

impl Deref for MappedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// A `PT_LOAD` segment: file bytes `[offset, offset + filesz)` at virtual
/// address `vaddr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// File offset.
    pub offset: u64,
    /// Bytes in the file.
    pub filesz: u64,
    /// Virtual address (SVMA) of `offset`.
    pub vaddr: u64,
}

/// A symbol: `[address, address + size)` in SVMA; its name stays in the
/// mapped file (`name_at`: file offset of the NUL-terminated string), so a
/// module with a million symbols (libtorch_cpu) costs 24 bytes per symbol,
/// not a copy of its 80 MB string table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Symbol {
    /// Start (SVMA).
    pub address: u64,
    /// Size in bytes (> 0).
    pub size: u64,
    /// File offset of the name.
    pub name_at: u64,
}

/// Sections the unwinder uses, located in the file.
#[derive(Clone, Default)]
pub struct UnwindSections {
    /// `.text` range and bytes.
    pub text: Option<(Range<u64>, MappedBytes)>,
    /// `.eh_frame`.
    pub eh_frame: Option<(Range<u64>, MappedBytes)>,
    /// `.eh_frame_hdr`.
    pub eh_frame_hdr: Option<(Range<u64>, MappedBytes)>,
    /// `.debug_frame` (bytes only).
    pub debug_frame: Option<MappedBytes>,
    /// `.got` range.
    pub got: Option<Range<u64>>,
}

/// An ELF file's identity, layout, unwind data and symbols.
pub struct ElfModule {
    map: Arc<Mmap>,
    /// The file the symbols' names are in: `map`, or a separate debug file's.
    names: Arc<Mmap>,
    /// GNU Build-ID, lowercase hex (None when the file has none).
    pub build_id: Option<String>,
    /// Load segments, by file offset.
    pub segments: Vec<Segment>,
    /// Symbols with a size, sorted by address.
    pub symbols: Vec<Symbol>,
    /// Unwind sections.
    pub unwind: UnwindSections,
    /// Whether the file holds its code: false for a separate debug file
    /// (`objcopy --only-keep-debug`: `.text` is NOBITS and the load segments
    /// no longer say where code lies in the program's file).
    pub code_in_file: bool,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where separate debug files are looked up by Build-ID when profiling.
pub const DEBUG_DIR: &str = "/usr/lib/debug";

/// The GNU Build-ID of the ELF file at `path` (lowercase hex), without
/// reading its symbols: the key of the symbol store (SysOM-AI §3.4).
pub fn build_id_of(path: &Path) -> Result<Option<String>, StackError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| StackError::Io(shown.clone(), e))?;
    // SAFETY: as in `ElfModule::open`: mapped read-only, only the notes read.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| StackError::Io(shown.clone(), e))?;
    let obj = object::File::parse(&map[..]).map_err(|e| StackError::Elf(shown, e.to_string()))?;
    Ok(obj.build_id().ok().flatten().map(hex))
}

impl ElfModule {
    /// Opens and parses `path`.
    pub fn open(path: &Path) -> Result<Self, StackError> {
        Self::open_with(path, true)
    }

    /// Opens and parses `path` for its segments and unwind sections only:
    /// no symbol table is read (`symbols` stays empty), which for a large
    /// library (libtorch_cpu.so) saves tens of MB and most of the time.
    pub fn open_without_symbols(path: &Path) -> Result<Self, StackError> {
        Self::open_with(path, false)
    }

    fn open_with(path: &Path, with_symbols: bool) -> Result<Self, StackError> {
        let shown = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|e| StackError::Io(shown.clone(), e))?;
        // SAFETY: the file is mapped read-only; a concurrent truncation could
        // fault, as with any profiler reading binaries in use (perf, samply).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| StackError::Io(shown.clone(), e))?;
        let map = Arc::new(map);
        let obj = object::File::parse(&map[..])
            .map_err(|e| StackError::Elf(shown.clone(), e.to_string()))?;
        let build_id = obj.build_id().ok().flatten().map(hex);
        let segments = obj
            .segments()
            .filter_map(|s| {
                let (offset, filesz) = s.file_range();
                (filesz > 0).then_some(Segment {
                    offset,
                    filesz,
                    vaddr: s.address(),
                })
            })
            .collect();
        let section = |name: &str| -> Option<(Range<u64>, MappedBytes)> {
            let s = obj.section_by_name(name)?;
            let (off, size) = s.file_range()?;
            let range = off as usize..(off + size) as usize;
            (range.end <= map.len()).then(|| {
                (
                    s.address()..s.address() + s.size(),
                    MappedBytes {
                        map: map.clone(),
                        range,
                    },
                )
            })
        };
        let unwind = UnwindSections {
            text: section(".text"),
            eh_frame: section(".eh_frame"),
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame: section(".debug_frame").map(|s| s.1),
            got: obj
                .section_by_name(".got")
                .map(|s| s.address()..s.address() + s.size()),
        };
        let mut symbols = Vec::new();
        let elf = if with_symbols {
            object::read::elf::ElfFile64::<object::Endianness>::parse(&map[..]).ok()
        } else {
            None
        };
        if let Some(elf) = elf {
            let endian = elf.endian();
            for table in [elf.elf_symbol_table(), elf.elf_dynamic_symbol_table()] {
                let Ok(strtab) = elf.elf_section_table().section(table.string_section()) else {
                    continue;
                };
                let Some((str_off, str_len)) = strtab.file_range(endian) else {
                    continue;
                };
                let all = table.symbols();
                for chunk in all.chunks(SYMBOLS_PER_RELEASE) {
                    for sym in chunk {
                        let (addr, size) = (sym.st_value(endian), sym.st_size(endian));
                        let name = u64::from(sym.st_name(endian));
                        if sym.st_type() == object::elf::STT_FUNC
                            && size > 0
                            && addr > 0
                            && name < str_len
                        {
                            symbols.push(Symbol {
                                address: addr,
                                size,
                                name_at: str_off + name,
                            });
                        }
                    }
                    // The chunk is read: its pages leave the RSS as the
                    // table is walked, not only at the end.
                    let at = chunk.as_ptr() as usize - map.as_ptr() as usize;
                    release(&map, at, std::mem::size_of_val(chunk));
                }
            }
        }
        let code_in_file = obj
            .section_by_name(".text")
            .is_none_or(|t| t.file_range().is_some());
        symbols.sort_by_key(|s| (s.address, std::cmp::Reverse(s.size)));
        symbols.dedup_by_key(|s| s.address);
        symbols.shrink_to_fit();
        // Headers, notes and section tables read while parsing.
        release(&map, 0, map.len());
        Ok(ElfModule {
            names: map.clone(),
            map: map.clone(),
            build_id,
            segments,
            symbols,
            unwind,
            code_in_file,
        })
    }

    /// Drops the file's pages from this process's resident set ([`release`]):
    /// the names looked up over a period (a page each) add up, in a
    /// long-running agent, to much of a large library's string table.
    pub fn release_pages(&self) {
        release(&self.map, 0, self.map.len());
        if !Arc::ptr_eq(&self.map, &self.names) {
            release(&self.names, 0, self.names.len());
        }
    }

    /// The SVMA of file offset `offset` (through the load segment holding it).
    pub fn svma_of_offset(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| (s.offset..s.offset + s.filesz).contains(&offset))
            .map(|s| s.vaddr + (offset - s.offset))
    }

    /// The separate debug file of this module under `debug_dir`
    /// (`.build-id/xx/yyyy.debug`, where `-dbg`/`-dbgsym` packages put
    /// them), when one exists with the same Build-ID.
    pub fn debug_file(&self, debug_dir: &Path) -> Option<std::path::PathBuf> {
        let id = self.build_id.as_deref().filter(|id| id.len() > 2)?;
        let p = debug_dir
            .join(".build-id")
            .join(&id[..2])
            .join(format!("{}.debug", &id[2..]));
        (build_id_of(&p).ok()?.as_deref() == Some(id)).then_some(p)
    }

    /// Names this module's code from `debug`, its separate debug file, when
    /// that has the same Build-ID and more symbols (a stripped library's
    /// static functions: glibc's `_int_malloc`); returns whether it did.
    /// Addresses stay this module's: a debug file keeps the symbols' SVMAs.
    pub fn use_symbols_of(&mut self, debug: ElfModule) -> bool {
        if debug.build_id.is_none()
            || debug.build_id != self.build_id
            || debug.symbols.len() <= self.symbols.len()
        {
            return false;
        }
        self.symbols = debug.symbols;
        self.names = debug.map;
        true
    }

    /// The name of `sym` (as in the file: mangled C++ stays mangled).
    pub fn symbol_name(&self, sym: &Symbol) -> Option<&str> {
        let start = usize::try_from(sym.name_at).ok()?;
        let bytes = self.names.get(start..)?;
        let end = bytes.iter().take(4096).position(|&b| b == 0)?;
        std::str::from_utf8(&bytes[..end]).ok()
    }

    /// The symbol whose range holds `svma` (containment, never nearest-lower).
    pub fn symbol_at(&self, svma: u64) -> Option<&Symbol> {
        let i = self.symbols.partition_point(|s| s.address <= svma);
        // Symbols may nest (aliases of different sizes): look back a little.
        self.symbols[..i]
            .iter()
            .rev()
            .take(8)
            .find(|s| svma < s.address + s.size)
    }
}

/// A symbol name as people read it: Rust and C++ (Itanium) names demangled
/// without parameter lists (the frame is the function; overloads that differ
/// only in parameters merge, as in perf's default), others as they are.
pub fn demangle(raw: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        return format!("{d:#}");
    }
    if raw.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(raw) {
            let opts = cpp_demangle::DemangleOptions::new()
                .no_params()
                .no_return_type();
            if let Ok(d) = sym.demangle_with_options(&opts) {
                return d;
            }
        }
    }
    raw.to_string()
}

/// Kernel symbols from `/proc/kallsyms` (text symbols only, sorted). Kernel
/// text is contiguous, so a symbol ends where the next begins.
#[derive(Debug, Default, Clone)]
pub struct KernelSymbols {
    syms: Vec<(u64, String)>,
}

impl KernelSymbols {
    /// Parses the text of `/proc/kallsyms`; zero addresses (hidden by
    /// `kptr_restrict`) give an empty table.
    pub fn parse(text: &str) -> Self {
        let mut syms: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let addr = u64::from_str_radix(it.next()?, 16).ok()?;
                let kind = it.next()?;
                let name = it.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W"))
                    .then(|| (addr, name.to_string()))
            })
            .collect();
        syms.sort();
        KernelSymbols { syms }
    }

    /// Reads `/proc/kallsyms` (empty when unreadable).
    pub fn load() -> Self {
        std::fs::read_to_string("/proc/kallsyms")
            .map(|t| Self::parse(&t))
            .unwrap_or_default()
    }

    /// The kernel function holding `addr`.
    pub fn name(&self, addr: u64) -> Option<&str> {
        let i = self.syms.partition_point(|s| s.0 <= addr);
        if i == 0 || i == self.syms.len() {
            return None; // below the first or past the last: not kernel text we know
        }
        Some(self.syms[i - 1].1.as_str())
    }

    /// Symbols known.
    pub fn len(&self) -> usize {
        self.syms.len()
    }

    /// No symbols (kallsyms hidden or unreadable).
    pub fn is_empty(&self) -> bool {
        self.syms.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_has_a_build_id_and_its_own_symbols() {
        let exe = std::env::current_exe().unwrap();
        let m = ElfModule::open(&exe).unwrap();
        assert!(m.build_id.as_deref().is_some_and(|b| b.len() >= 16));
        assert!(m.unwind.eh_frame.is_some());
        // A symbol's own start resolves to it; one past its end does not
        // resolve to it (containment).
        let s = *m.symbols.iter().find(|s| s.size > 4).unwrap();
        assert!(m.symbol_name(&s).is_some_and(|n| !n.is_empty()));
        assert_eq!(m.symbol_at(s.address).unwrap().address, s.address);
        let after = m.symbol_at(s.address + s.size);
        assert!(after.is_none_or(|a| a.address != s.address || a.size > s.size));
    }

    #[test]
    fn names_are_demangled_and_others_kept() {
        assert_eq!(
            demangle("_ZN2at6native6addmm_ERNS_6TensorERKS1_S4_RKN3c106ScalarES8_"),
            "at::native::addmm_"
        );
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("deflate"), "deflate");
        assert_eq!(demangle("_Znot valid"), "_Znot valid");
    }

    #[test]
    fn kallsyms_parse() {
        let k = KernelSymbols::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t do_thing\nffffffff81000200 d data\nffffffff81000300 T end\n",
        );
        assert_eq!(k.len(), 3);
        assert_eq!(k.name(0xffffffff81000150), Some("do_thing"));
        assert_eq!(k.name(0xffffffff80000000), None);
        assert!(KernelSymbols::parse("0000000000000000 T hidden\n").is_empty());
    }
}
