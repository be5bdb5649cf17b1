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

/// The modules of `pid` that may hold a CPython runtime: a shared
/// libpython, else a `python…` executable (that links it in); empty for
/// any other process.
pub fn runtime_modules(pid: i32, maps: &[Mapping]) -> Vec<String> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| p.rsplit('/').next().unwrap_or("").starts_with("python"));
    let mut out: Vec<String> = Vec::new();
    for m in maps {
        let base = m.path.rsplit('/').next().unwrap_or("");
        if base.starts_with("libpython3.") && base.contains(".so") && !out.contains(&m.path) {
            out.push(m.path.clone());
        }
    }
    if let Some(exe) = exe {
        if maps.iter().any(|m| m.path == exe) && !out.contains(&exe) {
            out.push(exe);
        }
    }
    out
}

/// Bytes of CPython 3.13's `_Py_DebugOffsets` read (through the Unicode
/// object's offsets).
const DEBUG_OFFSETS_BYTES: usize = 568;

impl Layout {
    /// The layout from CPython 3.13's `_Py_DebugOffsets`, the first field
    /// of `_PyRuntime`, made for out-of-process readers (PEP 768's
    /// groundwork): exact for the build at hand, debug information or not.
    pub fn from_debug_offsets(b: &[u8]) -> Option<Layout> {
        if b.len() < DEBUG_OFFSETS_BYTES || &b[..8] != b"xdebugpy" {
            return None;
        }
        let at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let version = at(8);
        if version >> 24 != 3 || (version >> 16) & 0xff != 13 || at(16) != 0 {
            return None; // another layout of the struct, or free-threaded
        }
        let ascii_size = at(560);
        Some(Layout {
            minor: 13,
            runtime_interp_head: at(40),
            interp_next: at(64),
            interp_threads_head: at(72),
            tstate_next: at(168),
            tstate_native_tid: at(200),
            tstate_frame: (at(184), None),
            frame_code: at(240),
            frame_previous: at(232),
            frame_entry: (at(264), false),
            pthread_ids: false,
            code_qualname: at(296),
            code_filename: at(280),
            code_firstlineno: at(312),
            ascii_length: at(552),
            ascii_state: at(544),
            ascii_size,
            // PyCompactUnicodeObject: the ASCII header, utf8_length, utf8.
            compact_size: ascii_size.wrapping_add(16),
        })
    }

    /// The layout of the x86-64 CPython 3.11 and 3.12 builds whyslow was
    /// tested on (pyenv 3.11.7 and 3.12.1 from their DWARF, Debian's 3.11.2),
    /// for a runtime without debug information; the reader checks it against
    /// the live process before use.
    pub fn builtin(minor: u32) -> Option<Layout> {
        if !cfg!(target_arch = "x86_64") {
            return None;
        }
        match minor {
            11 => Some(Layout {
                minor: 11,
                runtime_interp_head: 40,
                interp_next: 0,
                interp_threads_head: 16,
                tstate_next: 8,
                tstate_native_tid: 160,
                tstate_frame: (56, Some(8)),
                frame_code: 32,
                frame_previous: 48,
                frame_entry: (68, true),
                pthread_ids: false,
                code_qualname: 128,
                code_filename: 112,
                code_firstlineno: 72,
                ascii_length: 16,
                ascii_state: 32,
                ascii_size: 48,
                compact_size: 72,
            }),
            12 => Some(Layout {
                minor: 12,
                runtime_interp_head: 40,
                interp_next: 0,
                interp_threads_head: 72,
                tstate_next: 8,
                tstate_native_tid: 144,
                tstate_frame: (56, Some(0)),
                frame_code: 0,
                frame_previous: 8,
                frame_entry: (70, false),
                pthread_ids: false,
                code_qualname: 128,
                code_filename: 112,
                code_firstlineno: 68,
                ascii_length: 16,
                ascii_state: 32,
                ascii_size: 40,
                compact_size: 56,
            }),
            _ => None,
        }
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
    /// A reader for `pid` when it runs CPython 3.10–3.13, from a shared
    /// libpython or from an executable that has the runtime linked in
    /// (Debian's `/usr/bin/python3`, conda's python); `maps` are its
    /// mappings. The structures' layout comes from the runtime's own
    /// `_Py_DebugOffsets` (3.13), else from the module's DWARF, else from
    /// the layouts of the CPython builds whyslow was tested on (3.11, 3.12),
    /// checked against the live process (its thread states must carry its
    /// threads' ids, a running frame must point at a code object). None
    /// when no layout holds.
    pub fn new(pid: i32, maps: &[Mapping]) -> Option<Self> {
        runtime_modules(pid, maps)
            .into_iter()
            .find_map(|path| Self::from_module(pid, maps, &path))
    }

    fn from_module(pid: i32, maps: &[Mapping], path: &str) -> Option<Self> {
        let file = maps::file_path(pid, path);
        let data = map_file(&file).ok()?;
        let obj = object::File::parse(&data[..]).ok()?;
        let symbol = |name: &str| {
            obj.dynamic_symbols()
                .chain(obj.symbols())
                .find(|s| s.name() == Ok(name))
                .map(|s| s.address())
        };
        let runtime_svma = symbol("_PyRuntime")?;
        let elf = crate::elf::ElfModule::open(&file).ok()?;
        let bias = maps
            .iter()
            .filter(|m| m.path == path)
            .find_map(|m| Some(m.start.wrapping_sub(elf.svma_of_offset(m.offset)?)))?;
        let runtime = bias.wrapping_add(runtime_svma);
        let code_type = symbol("PyCode_Type").map(|a| bias.wrapping_add(a));
        // The version: `Py_Version` (3.11+) in memory, else the file name.
        let mut minor = symbol("Py_Version").and_then(|a| {
            let mut b = [0u8; 4];
            read_mem(pid, bias.wrapping_add(a), &mut b).then(|| {
                let hex = u32::from_ne_bytes(b);
                (hex >> 24 == 3).then_some((hex >> 16) & 0xff)
            })?
        });
        if minor.is_none() {
            let base = path.rsplit('/').next().unwrap_or("");
            minor = base
                .trim_start_matches("libpython3.")
                .trim_start_matches("python3.")
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|v| v.parse().ok());
        }
        let minor = minor?;
        drop(data);
        let mut reader = PythonReader {
            pid,
            layout: Layout::default(),
            runtime,
            strings: HashMap::new(),
        };
        let layouts = [
            (minor >= 13)
                .then(|| Layout::from_debug_offsets(&reader.bytes(runtime, DEBUG_OFFSETS_BYTES)?))
                .flatten(),
            Layout::cached(&file, minor),
            Layout::builtin(minor),
        ];
        for layout in layouts.into_iter().flatten() {
            if layout.minor != minor {
                continue;
            }
            reader.layout = layout;
            if reader.looks_right(code_type) {
                return Some(reader);
            }
        }
        None
    }

    fn bytes(&self, addr: u64, n: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; n];
        read_mem(self.pid, addr, &mut b).then_some(b)
    }

    /// Whether the layout reads the live process sensibly: an interpreter
    /// whose thread states (3.11+) carry ids of the process's threads, and,
    /// where a thread runs Python, a frame whose code object is one.
    fn looks_right(&self, code_type: Option<u64>) -> bool {
        let l = &self.layout;
        let Some(interp) = self.u64_at(self.runtime.wrapping_add(l.runtime_interp_head)) else {
            return false;
        };
        if interp == 0 {
            return false;
        }
        let tids: std::collections::HashSet<u64> =
            std::fs::read_dir(format!("/proc/{}/task", self.pid))
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().to_str()?.parse().ok())
                        .collect()
                })
                .unwrap_or_default();
        let mut ts = self
            .u64_at(interp.wrapping_add(l.interp_threads_head))
            .unwrap_or(0);
        let mut threads = 0;
        while ts != 0 && threads < 64 {
            threads += 1;
            if !l.pthread_ids {
                let tid = self
                    .u64_at(ts.wrapping_add(l.tstate_native_tid))
                    .unwrap_or(0);
                if !tids.contains(&tid) {
                    return false;
                }
            }
            let frame = match l.tstate_frame {
                (off, None) => self.u64_at(ts.wrapping_add(off)).unwrap_or(0),
                (off, Some(cf)) => self
                    .u64_at(ts.wrapping_add(off))
                    .filter(|&c| c != 0)
                    .and_then(|c| self.u64_at(c.wrapping_add(cf)))
                    .unwrap_or(0),
            };
            if let (Some(want), true) = (code_type, frame != 0) {
                let code = self.u64_at(frame.wrapping_add(l.frame_code)).unwrap_or(0);
                let ty = self.u64_at(code.wrapping_add(8)).unwrap_or(0); // ob_type
                if code == 0 || ty != want {
                    return false;
                }
            }
            ts = self.u64_at(ts.wrapping_add(l.tstate_next)).unwrap_or(0);
        }
        threads > 0
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
        let name = self.u64_at(code.wrapping_add(l.code_qualname))?;
        let file = self.u64_at(code.wrapping_add(l.code_filename))?;
        let mut ln = [0u8; 4];
        if !read_mem(self.pid, code.wrapping_add(l.code_firstlineno), &mut ln) {
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
            let len = self.u64_at(addr.wrapping_add(l.ascii_length))? as usize;
            let mut st = [0u8; 4];
            read_mem(self.pid, addr.wrapping_add(l.ascii_state), &mut st).then_some(())?;
            let state = u32::from_ne_bytes(st);
            let (kind, compact, ascii) = ((state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1);
            if compact == 0 || len > 4096 {
                return None;
            }
            let data = addr.wrapping_add(if ascii == 1 {
                l.ascii_size
            } else {
                l.compact_size
            });
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
            .u64_at(self.runtime.wrapping_add(l.runtime_interp_head))
            .unwrap_or(0);
        let mut guard = 0;
        while interp != 0 && guard < 64 {
            guard += 1;
            let mut ts = self
                .u64_at(interp.wrapping_add(l.interp_threads_head))
                .unwrap_or(0);
            let mut tguard = 0;
            while ts != 0 && tguard < 4096 {
                tguard += 1;
                let tid = self
                    .u64_at(ts.wrapping_add(l.tstate_native_tid))
                    .unwrap_or(0) as u32;
                let mut frame = match l.tstate_frame {
                    (off, None) => self.u64_at(ts.wrapping_add(off)).unwrap_or(0),
                    (off, Some(cf)) => self
                        .u64_at(ts.wrapping_add(off))
                        .filter(|&c| c != 0)
                        .and_then(|c| self.u64_at(c.wrapping_add(cf)))
                        .unwrap_or(0),
                };
                let mut frames = Vec::new();
                while frame != 0 && frames.len() < 512 {
                    let mut entry = [0u8; 1];
                    let ok = read_mem(self.pid, frame.wrapping_add(l.frame_entry.0), &mut entry);
                    let shim = !l.frame_entry.1 && ok && entry[0] == 3;
                    if shim {
                        // 3.12+: a C-stack shim; the frame below it (already
                        // pushed) started that C evaluation call.
                        if let Some(last) = frames.last_mut() {
                            let f: &mut PyFrame = last;
                            f.entry = true;
                        }
                    } else if let Some(code) = self
                        .u64_at(frame.wrapping_add(l.frame_code))
                        .filter(|&c| c != 0)
                    {
                        let name = self
                            .u64_at(code.wrapping_add(l.code_qualname))
                            .map(|a| self.string(a));
                        let file = self
                            .u64_at(code.wrapping_add(l.code_filename))
                            .map(|a| self.string(a));
                        let mut ln = [0u8; 4];
                        let line =
                            if read_mem(self.pid, code.wrapping_add(l.code_firstlineno), &mut ln) {
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
                    frame = self
                        .u64_at(frame.wrapping_add(l.frame_previous))
                        .unwrap_or(0);
                }
                if tid != 0 && !frames.is_empty() {
                    if let Some(last) = frames.last_mut() {
                        last.entry = true; // the outermost frame starts the first call
                    }
                    out.insert(tid, frames);
                }
                ts = self.u64_at(ts.wrapping_add(l.tstate_next)).unwrap_or(0);
            }
            interp = self.u64_at(interp.wrapping_add(l.interp_next)).unwrap_or(0);
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

    fn pyenv_lib(minor: u32) -> Option<std::path::PathBuf> {
        std::fs::read_dir("/root/.pyenv/versions")
            .ok()?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("3.{minor}."))
            })
            .map(|e| e.path().join(format!("lib/libpython3.{minor}.so.1.0")))
            .find(|p| p.exists())
    }

    #[test]
    fn builtin_layouts_are_the_tested_builds_own() {
        for minor in [11, 12] {
            let Some(lib) = pyenv_lib(minor) else {
                whyslow_testkit::skip(&format!("no pyenv CPython 3.{minor} here"));
                continue;
            };
            assert_eq!(
                Layout::builtin(minor),
                Some(Layout::read(&lib, minor).unwrap()),
                "{}",
                lib.display()
            );
        }
        assert_eq!(Layout::builtin(10), None);
    }

    /// CPython 3.13's `_Py_DebugOffsets` (the first bytes of `_PyRuntime`,
    /// in the library's data) give what its DWARF gives.
    #[test]
    fn debug_offsets_give_the_dwarf_layout() {
        let Some(lib) = pyenv_lib(13) else {
            whyslow_testkit::skip("no pyenv CPython 3.13 here");
            return;
        };
        let data = std::fs::read(&lib).unwrap();
        let obj = object::File::parse(&data[..]).unwrap();
        let sym = obj
            .dynamic_symbols()
            .find(|s| s.name() == Ok("_PyRuntime"))
            .unwrap();
        let section = obj
            .sections()
            .find(|s| (s.address()..s.address() + s.size()).contains(&sym.address()))
            .unwrap();
        let (off, _) = section.file_range().unwrap();
        let at = (off + sym.address() - section.address()) as usize;
        let got = Layout::from_debug_offsets(&data[at..at + DEBUG_OFFSETS_BYTES]).unwrap();
        assert_eq!(got, Layout::read(&lib, 13).unwrap());
        // Anything else is refused.
        assert_eq!(
            Layout::from_debug_offsets(&[0u8; DEBUG_OFFSETS_BYTES]),
            None
        );
        assert_eq!(Layout::from_debug_offsets(&data[at..at + 100]), None);
    }

    /// The target's memory is input: garbage pointers (a freed code
    /// object, a layout that does not fit, random bytes) give no frame or
    /// "?", never a panic (an address past the top once overflowed).
    #[test]
    fn garbage_memory_never_panics_the_reader() {
        use whyslow_model::rng::SplitMix64;
        let mut rng = SplitMix64::new(7);
        // Random words, some of them pointers back into the buffer.
        let mut heap: Vec<u64> = (0..4096).map(|_| rng.next_u64()).collect();
        let base = heap.as_ptr() as u64;
        for i in (0..heap.len()).step_by(3) {
            heap[i] = base + (rng.below(4096 * 8) & !7);
        }
        for round in 0..200 {
            let layout = if round % 2 == 0 {
                Layout::builtin(11 + (round % 4 / 2) as u32).unwrap_or_default()
            } else {
                let mut o = || rng.below(1 << 16);
                Layout {
                    minor: 12,
                    runtime_interp_head: o(),
                    interp_next: o(),
                    interp_threads_head: o(),
                    tstate_next: o(),
                    tstate_native_tid: o(),
                    tstate_frame: (o(), Some(o())),
                    frame_code: o(),
                    frame_previous: o(),
                    frame_entry: (o(), false),
                    pthread_ids: false,
                    code_qualname: o(),
                    code_filename: o(),
                    code_firstlineno: o(),
                    ascii_length: o(),
                    ascii_state: o(),
                    ascii_size: u64::MAX - o(),
                    compact_size: o(),
                }
            };
            let runtime = match round % 3 {
                0 => u64::MAX - rng.below(64),
                1 => base + rng.below(4096 * 8),
                _ => rng.next_u64(),
            };
            let mut r = PythonReader {
                pid: std::process::id() as i32,
                layout,
                runtime,
                strings: HashMap::new(),
            };
            let _ = r.stacks();
            let _ = r.looks_right(Some(base));
            for addr in [u64::MAX, u64::MAX - 7, 0, base, runtime, rng.next_u64()] {
                let _ = r.code_frame(addr);
                let _ = r.string(addr);
            }
        }
        drop(heap);
        // Debug offsets with offsets near the top.
        let mut b = vec![0xffu8; DEBUG_OFFSETS_BYTES];
        b[..8].copy_from_slice(b"xdebugpy");
        b[8..16].copy_from_slice(&0x030d_00f0u64.to_ne_bytes());
        b[16..24].copy_from_slice(&0u64.to_ne_bytes());
        let l = Layout::from_debug_offsets(&b).unwrap();
        assert_eq!(l.compact_size, u64::MAX.wrapping_add(16));
    }
}
