//! Where gloo's collectives are: the library a process mapped that exports
//! them, and each function's file offset (what a uprobe attaches to).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::{TraceError, OPS};

/// One traced function of a library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlooFunction {
    /// Operation index in [`OPS`].
    pub op: usize,
    /// Its (mangled) symbol.
    pub symbol: String,
    /// Its offset in the file.
    pub file_offset: u64,
}

/// The mapped file of `pid` that may hold gloo (`libtorch_cpu.so`, or any
/// library whose name says gloo), by its path in the process's mount
/// namespace as seen from here (`/proc/PID/root/...`).
pub fn gloo_library(pid: u32) -> Option<PathBuf> {
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    let mut candidates: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.starts_with('/'))
        .filter(|p| {
            let name = p.rsplit('/').next().unwrap_or("");
            name.starts_with("libtorch_cpu.so") || name.contains("gloo")
        })
        .collect();
    candidates.dedup();
    let path = candidates.first()?;
    let in_ns = PathBuf::from(format!("/proc/{pid}/root{path}"));
    Some(if in_ns.exists() {
        in_ns
    } else {
        PathBuf::from(path)
    })
}

/// The gloo collective functions `path` defines, by operation: the free
/// functions `gloo::<op>(gloo::<Op>Options&)` of gloo's current API, found in
/// the dynamic symbol table (then the full one), mapped from address to file
/// offset through the loadable segments.
pub fn gloo_functions(path: &Path) -> Result<Vec<GlooFunction>, TraceError> {
    let prefixes: Vec<String> = OPS
        .iter()
        .map(|op| format!("_ZN4gloo{}{}E", op.len(), op))
        .collect();
    let found = defined_functions(path, true, |name| {
        // `_ZN4gloo9allreduceE` + parameters: a free function of namespace
        // gloo with that name (a method would be `_ZN4gloo...` nested).
        prefixes.iter().position(|p| {
            name.strip_prefix(p.as_str())
                .is_some_and(|rest| rest.starts_with('R'))
        })
    })?;
    Ok(found
        .into_iter()
        .map(|(op, symbol, file_offset)| GlooFunction {
            op,
            symbol,
            file_offset,
        })
        .collect())
}

/// The functions of the ELF file at `path` that `pick` recognizes (its
/// index for a symbol name), the first definition of each index, as
/// (index, symbol, file offset), by index: from the dynamic symbol table,
/// and the full one when `all_symbols`.
pub(crate) fn defined_functions(
    path: &Path,
    all_symbols: bool,
    mut pick: impl FnMut(&str) -> Option<usize>,
) -> Result<Vec<(usize, String, u64)>, TraceError> {
    let err = |reason: String| TraceError::Library {
        path: path.display().to_string(),
        reason,
    };
    let file = fs::File::open(path).map_err(|e| err(e.to_string()))?;
    // SAFETY: read-only map of a library; a concurrent truncation could
    // fault, which is the same risk every symbolizer of mapped code takes.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(e.to_string()))?;
    let obj = object::File::parse(&*map).map_err(|e| err(format!("not ELF: {e}")))?;
    let mut found: BTreeMap<usize, (String, u64)> = BTreeMap::new();
    let full = all_symbols.then(|| obj.symbols()).into_iter().flatten();
    for sym in obj.dynamic_symbols().chain(full) {
        if !sym.is_definition() || sym.address() == 0 {
            continue;
        }
        let Ok(name) = sym.name() else { continue };
        let Some(i) = pick(name) else { continue };
        found
            .entry(i)
            .or_insert_with(|| (name.to_string(), sym.address()));
    }
    Ok(found
        .into_iter()
        .filter_map(|(i, (symbol, addr))| Some((i, symbol, file_offset(&obj, addr)?)))
        .collect())
}

/// The file offset of virtual address `addr` of `obj`, through its loadable
/// segments (what a uprobe attaches to).
pub(crate) fn file_offset(obj: &object::File<'_>, addr: u64) -> Option<u64> {
    obj.segments().find_map(|s| {
        let (start, size) = (s.address(), s.size());
        let (file_off, _) = s.file_range();
        (addr >= start && addr < start + size).then(|| addr - start + file_off)
    })
}
