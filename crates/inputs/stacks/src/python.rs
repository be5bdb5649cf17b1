//! Python frames (SysOM-AI §3.3: one stack from Python to the kernel): the
//! interpreter's evaluation frames are replaced by the Python functions they
//! run, read from the target's memory (`process_vm_readv`; the process is
//! never stopped).
//!
//! Where the structures are: CPython 3.11–3.13 keep every thread's frame chain
//! in `_PyRuntime` → interpreters → threads → (cframe →) current frame →
//! previous …; each frame points at its code object (qualified name, file,
//! first line). The field offsets are read from libpython's own DWARF debug
//! information, so no per-version table is kept by hand.
//!
//! **Accuracy.** perf copies the C stack at the tick, but Python frames live
//! on the heap; they are read right after each batch of samples (every
//! 20 ms), so a sample is stitched with its thread's Python stack of a few
//! milliseconds later. Long-running functions (the ones a profile is for)
//! are stitched right; short ones may be attributed to their caller. The
//! number of C evaluation calls is checked against the Python chain's entry
//! frames and a stack that disagrees keeps the interpreter's frames.

use std::collections::HashMap;
use std::path::Path;

use gimli::{AttributeValue, EndianSlice, RunTimeEndian, UnitOffset};
use object::{Object, ObjectSection, ObjectSymbol};

use crate::maps::{self, Mapping};

/// Field offsets of the interpreter's structures, from DWARF.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// CPython minor version (10, 11, 12, 13).
    pub minor: u32,
    pub(crate) runtime_interp_head: u64,
    pub(crate) interp_next: u64,
    pub(crate) interp_threads_head: u64,
    pub(crate) tstate_next: u64,
    pub(crate) tstate_native_tid: u64,
    /// 3.11/3.12: `_ts.cframe` then `_PyCFrame.current_frame`; 3.13:
    /// `_ts.current_frame` (second is None).
    pub(crate) tstate_frame: (u64, Option<u64>),
    pub(crate) frame_code: u64,
    pub(crate) frame_previous: u64,
    /// 3.11: `is_entry` (bool); 3.12+: `owner` (char, 3 = C stack shim).
    pub(crate) frame_entry: (u64, bool),
    /// 3.10: the thread state names its thread by `pthread_self()`
    /// (`thread_id`), not by its Linux tid, and each frame is one C-level
    /// evaluation call (frame objects, no inlined calls).
    pub(crate) pthread_ids: bool,
    pub(crate) code_qualname: u64,
    pub(crate) code_filename: u64,
    pub(crate) code_firstlineno: u64,
    pub(crate) ascii_length: u64,
    pub(crate) ascii_state: u64,
    pub(crate) ascii_size: u64,
    pub(crate) compact_size: u64,
}

type R<'a> = EndianSlice<'a, RunTimeEndian>;

/// Maps a file read-only (its pages are shared and reclaimable, unlike a copy).
fn map_file(path: &Path) -> std::io::Result<memmap2::Mmap> {
    let f = std::fs::File::open(path)?;
    // SAFETY: read-only mapping of a library file; see crate::elf.
    unsafe { memmap2::Mmap::map(&f) }
}

struct Types<'a> {
    dwarf: gimli::Dwarf<R<'a>>,
    units: Vec<gimli::Unit<R<'a>>>,
    /// name → (unit index, offset) of struct or typedef definitions.
    by_name: HashMap<String, (usize, UnitOffset)>,
}

impl<'a> Types<'a> {
    fn load(
        sections: &'a gimli::DwarfSections<std::borrow::Cow<'a, [u8]>>,
        endian: RunTimeEndian,
        wanted: &[&str],
    ) -> Option<Self> {
        let dwarf = sections.borrow(|s| EndianSlice::new(&s[..], endian));
        let mut units = Vec::new();
        let mut by_name = HashMap::new();
        let mut headers = dwarf.units();
        while let Ok(Some(h)) = headers.next() {
            let Ok(unit) = dwarf.unit(h) else { continue };
            let idx = units.len();
            let mut entries = unit.entries();
            while let Ok(Some((_, e))) = entries.next_dfs() {
                let tag = e.tag();
                if tag != gimli::DW_TAG_structure_type && tag != gimli::DW_TAG_typedef {
                    continue;
                }
                if let Ok(Some(gimli::AttributeValue::Flag(true))) =
                    e.attr_value(gimli::DW_AT_declaration)
                {
                    continue;
                }
                let Ok(Some(n)) = e.attr_value(gimli::DW_AT_name) else {
                    continue;
                };
                let Ok(name) = dwarf.attr_string(&unit, n) else {
                    continue;
                };
                let name = name.to_string_lossy().into_owned();
                if wanted.contains(&name.as_str()) && !by_name.contains_key(&name) {
                    by_name.insert(name, (idx, e.offset()));
                }
            }
            units.push(unit);
            if wanted.iter().all(|w| by_name.contains_key(*w)) {
                break;
            }
        }
        Some(Types {
            dwarf,
            units,
            by_name,
        })
    }

    /// Follows typedefs and qualifiers to the struct entry.
    fn resolve(&self, u: usize, mut off: UnitOffset) -> Option<(usize, UnitOffset)> {
        for _ in 0..8 {
            let e = self.units[u].entry(off).ok()?;
            match e.tag() {
                gimli::DW_TAG_structure_type | gimli::DW_TAG_union_type => return Some((u, off)),
                _ => match e.attr_value(gimli::DW_AT_type).ok()?? {
                    AttributeValue::UnitRef(o) => off = o,
                    _ => return None,
                },
            }
        }
        None
    }

    fn size(&self, name: &str) -> Option<u64> {
        let &(u, off) = self.by_name.get(name)?;
        let (u, off) = self.resolve(u, off)?;
        self.units[u]
            .entry(off)
            .ok()?
            .attr_value(gimli::DW_AT_byte_size)
            .ok()??
            .udata_value()
    }

    /// Offset of the member at `path` (nested members through their types).
    fn offset(&self, name: &str, path: &[&str]) -> Option<u64> {
        let &(u, off) = self.by_name.get(name)?;
        let (mut u, mut off) = self.resolve(u, off)?;
        let mut total = 0;
        for (i, want) in path.iter().enumerate() {
            let unit = &self.units[u];
            let mut tree = unit.entries_tree(Some(off)).ok()?;
            let root = tree.root().ok()?;
            let mut children = root.children();
            let mut found = None;
            while let Ok(Some(child)) = children.next() {
                let e = child.entry();
                if e.tag() != gimli::DW_TAG_member {
                    continue;
                }
                let Ok(Some(n)) = e.attr_value(gimli::DW_AT_name) else {
                    continue;
                };
                if self.dwarf.attr_string(unit, n).ok()?.to_string_lossy() != *want {
                    continue;
                }
                let loc = e
                    .attr_value(gimli::DW_AT_data_member_location)
                    .ok()??
                    .udata_value()?;
                let ty = match e.attr_value(gimli::DW_AT_type).ok()? {
                    Some(AttributeValue::UnitRef(o)) => Some(o),
                    _ => None,
                };
                found = Some((loc, ty));
                break;
            }
            let (loc, ty) = found?;
            total += loc;
            if i + 1 < path.len() {
                (u, off) = self.resolve(u, ty?)?;
            }
        }
        Some(total)
    }
}

impl Layout {
    /// Reads the layout from the debug information of `libpython` (the file
    /// at `path`, CPython 3.`minor`). None when the file has no usable DWARF
    /// or the version is not supported (3.10–3.13; the perf path's own
    /// reader walks 3.11–3.13, whose thread states carry the Linux tid).
    pub fn from_library(path: &Path, minor: u32) -> Option<Layout> {
        Self::read(path, minor).ok()
    }

    /// As [`Layout::from_library`], read once per library file (by device
    /// and inode) for the life of the process: a host's Python processes
    /// share a few libpythons, whose DWARF takes a while to walk.
    pub fn cached(path: &Path, minor: u32) -> Option<Layout> {
        use std::os::unix::fs::MetadataExt;
        use std::sync::{Mutex, OnceLock};
        type Cache = Mutex<HashMap<(u64, u64, u32), Option<Layout>>>;
        static CACHE: OnceLock<Cache> = OnceLock::new();
        let meta = std::fs::metadata(path).ok()?;
        let key = (meta.dev(), meta.ino(), minor);
        let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
        if let Some(l) = cache.lock().ok()?.get(&key) {
            return l.clone();
        }
        let l = Self::from_library(path, minor);
        cache.lock().ok()?.insert(key, l.clone());
        l
    }

    /// As [`Layout::from_library`], saying what is missing.
    pub fn read(path: &Path, minor: u32) -> Result<Layout, String> {
        if !(10..=13).contains(&minor) {
            return Err(format!("CPython 3.{minor} is not supported (3.10-3.13)"));
        }
        let data = map_file(path).map_err(|e| e.to_string())?;
        let obj = object::File::parse(&data[..]).map_err(|e| e.to_string())?;
        let endian = if obj.is_little_endian() {
            RunTimeEndian::Little
        } else {
            RunTimeEndian::Big
        };
        let sections = gimli::DwarfSections::load(|id| -> Result<_, gimli::Error> {
            Ok(obj
                .section_by_name(id.name())
                .and_then(|s| s.uncompressed_data().ok())
                .unwrap_or(std::borrow::Cow::Borrowed(&[][..])))
        })
        .map_err(|e| e.to_string())?;
        let wanted = [
            "pyruntimestate",
            "_is",
            "_ts",
            "_PyCFrame",
            "_PyInterpreterFrame",
            "PyCodeObject",
            "PyASCIIObject",
            "PyCompactUnicodeObject",
        ];
        // 3.13 has no _PyCFrame (the thread state points at the frame).
        // 3.13 has no _PyCFrame (the thread state points at the frame);
        // 3.10 chains frame objects (`struct _frame`).
        let wanted: Vec<&str> = wanted
            .into_iter()
            .filter(|w| minor < 13 || *w != "_PyCFrame")
            .map(|w| match (minor, w) {
                (10, "_PyCFrame" | "_PyInterpreterFrame") => "_frame",
                _ => w,
            })
            .collect();
        let t = Types::load(&sections, endian, &wanted).ok_or("no DWARF debug information")?;
        let off = |ty: &str, path: &[&str]| -> Result<u64, String> {
            t.offset(ty, path)
                .ok_or_else(|| format!("no {ty}.{} in the debug information", path.join(".")))
        };
        let strings = |l: Layout| -> Result<Layout, String> {
            Ok(Layout {
                ascii_length: off("PyASCIIObject", &["length"])?,
                ascii_state: off("PyASCIIObject", &["state"])?,
                ascii_size: t.size("PyASCIIObject").ok_or("no PyASCIIObject size")?,
                compact_size: t
                    .size("PyCompactUnicodeObject")
                    .ok_or("no PyCompactUnicodeObject size")?,
                ..l
            })
        };
        if minor == 10 {
            // No co_qualname before 3.11: functions go by their co_name.
            return strings(Layout {
                minor,
                runtime_interp_head: off("pyruntimestate", &["interpreters", "head"])?,
                interp_next: off("_is", &["next"])?,
                interp_threads_head: off("_is", &["tstate_head"])?,
                tstate_next: off("_ts", &["next"])?,
                tstate_native_tid: off("_ts", &["thread_id"])?,
                tstate_frame: (off("_ts", &["frame"])?, None),
                frame_code: off("_frame", &["f_code"])?,
                frame_previous: off("_frame", &["f_back"])?,
                frame_entry: (0, true),
                pthread_ids: true,
                code_qualname: off("PyCodeObject", &["co_name"])?,
                code_filename: off("PyCodeObject", &["co_filename"])?,
                code_firstlineno: off("PyCodeObject", &["co_firstlineno"])?,
                ..Layout::default()
            });
        }
        let tstate_frame = if minor >= 13 {
            (off("_ts", &["current_frame"])?, None)
        } else {
            (
                off("_ts", &["cframe"])?,
                Some(off("_PyCFrame", &["current_frame"])?),
            )
        };
        let frame_code = if minor >= 13 {
            off("_PyInterpreterFrame", &["f_executable"])?
        } else {
            off("_PyInterpreterFrame", &["f_code"])?
        };
        let frame_entry = if minor == 11 {
            (off("_PyInterpreterFrame", &["is_entry"])?, true)
        } else {
            (off("_PyInterpreterFrame", &["owner"])?, false)
        };
        strings(Layout {
            minor,
            runtime_interp_head: off("pyruntimestate", &["interpreters", "head"])?,
            interp_next: off("_is", &["next"])?,
            interp_threads_head: off("_is", &["threads", "head"])?,
            tstate_next: off("_ts", &["next"])?,
            tstate_native_tid: off("_ts", &["native_thread_id"])?,
            tstate_frame,
            frame_code,
            frame_previous: off("_PyInterpreterFrame", &["previous"])?,
            frame_entry,
            pthread_ids: false,
            code_qualname: off("PyCodeObject", &["co_qualname"])?,
            code_filename: off("PyCodeObject", &["co_filename"])?,
            code_firstlineno: off("PyCodeObject", &["co_firstlineno"])?,
            ..Layout::default()
        })
    }
}

/// One Python frame: qualified name, file, first line of the function.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyFrame {
    /// `co_qualname`.
    pub name: String,
    /// `co_filename`.
    pub file: String,
    /// `co_firstlineno`.
    pub line: u32,
    /// The first frame of a C-level evaluation call (its group ends here,
    /// walking from the innermost frame).
    pub entry: bool,
}

/// Reads the Python stacks of one process.
pub struct PythonReader {
    pid: i32,
    layout: Layout,
    runtime: u64,
    strings: HashMap<u64, String>,
}

fn read_mem(pid: i32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: reads from another process into our buffer; the kernel checks
    // the remote range (an unmapped one fails, it does not fault us).
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    n == buf.len() as isize
}

impl PythonReader {
    /// A reader for `pid` when it runs CPython 3.11–3.13 from a shared
    /// libpython with debug information (`maps` are its mappings).
    pub fn new(pid: i32, maps: &[Mapping]) -> Option<Self> {
        let lib = maps.iter().find(|m| {
            let base = m.path.rsplit('/').next().unwrap_or("");
            base.starts_with("libpython3.") && base.contains(".so")
        })?;
        let base = lib.path.rsplit('/').next().unwrap_or("");
        let minor: u32 = base
            .trim_start_matches("libpython3.")
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()?;
        let file = maps::file_path(pid, &lib.path);
        let layout = Layout::cached(&file, minor)?;
        // _PyRuntime's address: its SVMA plus the library's load bias.
        let data = map_file(&file).ok()?;
        let obj = object::File::parse(&data[..]).ok()?;
        let sym = obj
            .dynamic_symbols()
            .chain(obj.symbols())
            .find(|s| s.name() == Ok("_PyRuntime"))?;
        let elf = crate::elf::ElfModule::open(&file).ok()?;
        let bias = maps
            .iter()
            .filter(|m| m.path == lib.path)
            .find_map(|m| Some(m.start.wrapping_sub(elf.svma_of_offset(m.offset)?)))?;
        Some(PythonReader {
            pid,
            layout,
            runtime: bias.wrapping_add(sym.address()),
            strings: HashMap::new(),
        })
    }

    /// CPython's minor version.
    pub fn minor(&self) -> u32 {
        self.layout.minor
    }

    /// The structures' layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The address of `_PyRuntime` in the process.
    pub fn runtime(&self) -> u64 {
        self.runtime
    }

    /// Forgets the strings read: their memory may since hold other ones
    /// (the eBPF path reads code objects long after the tick).
    pub fn forget_strings(&mut self) {
        self.strings.clear();
    }

    /// The function of the code object at `code`: qualified name, file and
    /// first line (None when its memory cannot be read).
    pub fn code_frame(&mut self, code: u64) -> Option<PyFrame> {
        let l = self.layout.clone();
        let name = self.u64_at(code + l.code_qualname)?;
        let file = self.u64_at(code + l.code_filename)?;
        let mut ln = [0u8; 4];
        if !read_mem(self.pid, code + l.code_firstlineno, &mut ln) {
            return None;
        }
        Some(PyFrame {
            name: self.string(name),
            file: self.string(file),
            line: i32::from_ne_bytes(ln).max(0) as u32,
            entry: false,
        })
    }

    fn u64_at(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        read_mem(self.pid, addr, &mut b).then(|| u64::from_ne_bytes(b))
    }

    fn string(&mut self, addr: u64) -> String {
        if let Some(s) = self.strings.get(&addr) {
            return s.clone();
        }
        let l = &self.layout;
        let s = (|| {
            let len = self.u64_at(addr + l.ascii_length)? as usize;
            let mut st = [0u8; 4];
            read_mem(self.pid, addr + l.ascii_state, &mut st).then_some(())?;
            let state = u32::from_ne_bytes(st);
            let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
            if compact == 0 || len > 4096 {
                return None;
            }
            let data = addr
                + if ascii == 1 {
                    l.ascii_size
                } else {
                    l.compact_size
                };
            let mut buf = vec![0u8; len * kind.max(1) as usize];
            read_mem(self.pid, data, &mut buf).then_some(())?;
            Some(match kind {
                1 => buf.iter().map(|&c| c as char).collect(),
                2 => String::from_utf16_lossy(
                    &buf.chunks_exact(2)
                        .map(|c| u16::from_ne_bytes([c[0], c[1]]))
                        .collect::<Vec<_>>(),
                ),
                _ => buf
                    .chunks_exact(4)
                    .filter_map(|c| char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                    .collect(),
            })
        })()
        .unwrap_or_else(|| "?".to_string());
        if self.strings.len() < 100_000 {
            self.strings.insert(addr, s.clone());
        }
        s
    }

    /// Every Python thread's stack, innermost frame first, by native thread id.
    /// (Empty on 3.10, whose thread states do not carry the Linux tid.)
    pub fn stacks(&mut self) -> HashMap<u32, Vec<PyFrame>> {
        let mut out = HashMap::new();
        let l = self.layout.clone();
        if l.pthread_ids {
            return out;
        }
        let mut interp = self
            .u64_at(self.runtime + l.runtime_interp_head)
            .unwrap_or(0);
        let mut guard = 0;
        while interp != 0 && guard < 64 {
            guard += 1;
            let mut ts = self.u64_at(interp + l.interp_threads_head).unwrap_or(0);
            let mut tguard = 0;
            while ts != 0 && tguard < 4096 {
                tguard += 1;
                let tid = self.u64_at(ts + l.tstate_native_tid).unwrap_or(0) as u32;
                let mut frame = match l.tstate_frame {
                    (off, None) => self.u64_at(ts + off).unwrap_or(0),
                    (off, Some(cf)) => self
                        .u64_at(ts + off)
                        .filter(|&c| c != 0)
                        .and_then(|c| self.u64_at(c + cf))
                        .unwrap_or(0),
                };
                let mut frames = Vec::new();
                while frame != 0 && frames.len() < 512 {
                    let mut entry = [0u8; 1];
                    let ok = read_mem(self.pid, frame + l.frame_entry.0, &mut entry);
                    let shim = !l.frame_entry.1 && ok && entry[0] == 3;
                    if shim {
                        // 3.12+: a C-stack shim; the frame below it (already
                        // pushed) started that C evaluation call.
                        if let Some(last) = frames.last_mut() {
                            let f: &mut PyFrame = last;
                            f.entry = true;
                        }
                    } else if let Some(code) = self.u64_at(frame + l.frame_code).filter(|&c| c != 0)
                    {
                        let name = self.u64_at(code + l.code_qualname).map(|a| self.string(a));
                        let file = self.u64_at(code + l.code_filename).map(|a| self.string(a));
                        let mut ln = [0u8; 4];
                        let line = if read_mem(self.pid, code + l.code_firstlineno, &mut ln) {
                            i32::from_ne_bytes(ln).max(0) as u32
                        } else {
                            0
                        };
                        frames.push(PyFrame {
                            name: name.unwrap_or_else(|| "?".into()),
                            file: file.unwrap_or_else(|| "?".into()),
                            line,
                            entry: l.frame_entry.1 && ok && entry[0] != 0,
                        });
                    }
                    frame = self.u64_at(frame + l.frame_previous).unwrap_or(0);
                }
                if tid != 0 && !frames.is_empty() {
                    if let Some(last) = frames.last_mut() {
                        last.entry = true; // the outermost frame starts the first call
                    }
                    out.insert(tid, frames);
                }
                ts = self.u64_at(ts + l.tstate_next).unwrap_or(0);
            }
            interp = self.u64_at(interp + l.interp_next).unwrap_or(0);
        }
        out
    }
}

/// Groups a thread's Python stack (innermost first) by C evaluation call,
/// outermost call first, each group root first.
pub fn groups_root_first(frames: &[PyFrame]) -> Vec<Vec<&PyFrame>> {
    let mut groups: Vec<Vec<&PyFrame>> = Vec::new();
    let mut cur = Vec::new();
    for f in frames {
        cur.push(f);
        if f.entry {
            cur.reverse();
            groups.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        cur.reverse();
        groups.push(cur);
    }
    groups.reverse();
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_come_from_each_installed_libpython() {
        let mut seen = 0;
        for minor in 10..=13 {
            let dir = std::path::PathBuf::from("/root/.pyenv/versions");
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let v = e.file_name().to_string_lossy().into_owned();
                if !v.starts_with(&format!("3.{minor}.")) {
                    continue;
                }
                let lib = e.path().join(format!("lib/libpython3.{minor}.so.1.0"));
                if !lib.exists() {
                    continue;
                }
                let l =
                    Layout::read(&lib, minor).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
                assert!(
                    l.code_qualname > 0 && l.frame_previous > 0 && l.ascii_size >= 32,
                    "{l:?}"
                );
                seen += 1;
            }
        }
        eprintln!("{seen} libpython layouts read");
    }
}
