//! User stacks from a sample's registers and stack copy: DWARF CFI from each
//! module's `.eh_frame` (framehop; frame pointers where a module has no CFI),
//! then each address turned into a frame identified by (Build-ID, file
//! offset) — SysOM-AI §3.3's hybrid unwinding, done in userspace on the
//! perf path — and named from the module's symbol table (§3.4).

use std::collections::HashMap;
use std::sync::Arc;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder};
use whyslow_model::stack::{Frame, FrameKind};

use crate::elf::{ElfModule, KernelSymbols, MappedBytes};
use crate::maps::{self, Mapping};
use crate::perf::RawSample;

/// At most this many user frames per stack.
const MAX_FRAMES: usize = 256;

/// A file's identity: device, inode, size, modification time.
type FileKey = (u64, u64, u64, i64);

/// ELF modules by file (device, inode), shared by the walkers of several processes (one
/// mapping and one symbol index per file). A file replaced on disk (other
/// size or modification time) is read again.
#[derive(Clone, Default)]
pub struct ModuleCache {
    inner: Arc<std::sync::Mutex<HashMap<FileKey, Arc<ElfModule>>>>,
}

impl ModuleCache {
    /// Drops every cached module's file pages from the resident set
    /// ([`ElfModule::release_pages`]); they are read back as needed.
    pub(crate) fn release_pages(&self) {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for m in map.values() {
            m.release_pages();
        }
    }

    pub(crate) fn get(&self, file: &std::path::Path) -> Result<Arc<ElfModule>, crate::StackError> {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(file)
            .map_err(|e| crate::StackError::Io(file.display().to_string(), e))?;
        // The file's identity, not its path: /proc/<pid>/root/… differs per
        // process for the same library.
        let key = (md.dev(), md.ino(), md.size(), md.mtime());
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = map.get(&key) {
            return Ok(m.clone());
        }
        let mut m = ElfModule::open(file)?;
        // A stripped module's separate debug file names what its own
        // tables cannot (as perf and gdb do).
        if let Some(d) = m
            .debug_file(std::path::Path::new(crate::elf::DEBUG_DIR))
            .and_then(|p| ElfModule::open(&p).ok())
        {
            m.use_symbols_of(d);
        }
        let m = Arc::new(m);
        map.insert(key, m.clone());
        Ok(m)
    }
}

/// Unwinds and names the user and kernel frames of one process's samples.
pub struct StackWalker {
    pid: i32,
    maps: Vec<Mapping>,
    modules: HashMap<String, Option<Arc<ElfModule>>>,
    unwinder: UnwinderX86_64<MappedBytes>,
    cache: CacheX86_64,
    kernel: Arc<KernelSymbols>,
    shared: ModuleCache,
    /// Modules that could not be read (path → reason), reported once.
    pub unreadable: HashMap<String, String>,
}

impl StackWalker {
    /// A walker for `pid`, with its current mappings and modules.
    pub fn new(pid: i32, kernel: Arc<KernelSymbols>, shared: ModuleCache) -> Self {
        let mut w = StackWalker {
            pid,
            maps: Vec::new(),
            modules: HashMap::new(),
            unwinder: UnwinderX86_64::new(),
            cache: CacheX86_64::new(),
            kernel,
            shared,
            unreadable: HashMap::new(),
        };
        w.refresh_maps();
        w
    }

    /// Re-reads the process's mappings and adds modules mapped since (dlopen);
    /// true when the mappings changed.
    pub fn refresh_maps(&mut self) -> bool {
        let Ok(maps) = maps::read_maps(self.pid) else {
            return false;
        };
        if maps == self.maps {
            return false;
        }
        self.maps = maps;
        let paths: Vec<String> = self
            .maps
            .iter()
            .filter(|m| m.exec && m.is_file())
            .map(|m| m.path.clone())
            .collect();
        for path in paths {
            if !self.modules.contains_key(&path) {
                let module = self.load_module(&path);
                self.modules.insert(path, module);
            }
        }
        true
    }

    fn load_module(&mut self, path: &str) -> Option<Arc<ElfModule>> {
        let file = maps::file_path(self.pid, path);
        let elf = match self.shared.get(&file) {
            Ok(e) => e,
            Err(e) => {
                self.unreadable.insert(path.to_string(), e.to_string());
                return None;
            }
        };
        let of_path: Vec<&Mapping> = self.maps.iter().filter(|m| m.path == path).collect();
        let start = of_path.iter().map(|m| m.start).min()?;
        let end = of_path.iter().map(|m| m.end).max()?;
        // Load bias from any mapping: its start holds the file offset
        // `offset`, which the load segments place at some SVMA.
        let bias = of_path.iter().find_map(|m| {
            let svma = elf.svma_of_offset(m.offset)?;
            Some(m.start.wrapping_sub(svma))
        })?;
        let u = &elf.unwind;
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: u.text.as_ref().map(|t| t.0.clone()),
            text: u.text.as_ref().map(|t| t.1.clone()),
            got_svma: u.got.clone(),
            eh_frame_svma: u.eh_frame.as_ref().map(|t| t.0.clone()),
            eh_frame: u.eh_frame.as_ref().map(|t| t.1.clone()),
            eh_frame_hdr_svma: u.eh_frame_hdr.as_ref().map(|t| t.0.clone()),
            eh_frame_hdr: u.eh_frame_hdr.as_ref().map(|t| t.1.clone()),
            debug_frame: u.debug_frame.clone(),
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            text_segment_svma: None,
            text_segment: None,
        };
        self.unwinder
            .add_module(Module::new(path.to_string(), start..end, bias, info));
        Some(elf)
    }

    /// The user stack of `s`, leaf first, as lookup addresses (the sampled
    /// instruction, then each return address minus one).
    pub fn user_addresses(&mut self, s: &RawSample) -> Vec<u64> {
        let Some([ip, sp, bp]) = s.user_regs else {
            return Vec::new();
        };
        let stack = &s.stack;
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let bytes = stack.get(off..off + 8).ok_or(())?;
            Ok(u64::from_ne_bytes(bytes.try_into().map_err(|_| ())?))
        };
        let mut it = self.unwinder.iter_frames(
            ip,
            UnwindRegsX86_64::new(ip, sp, bp),
            &mut self.cache,
            &mut read_stack,
        );
        let mut out = Vec::new();
        while let Ok(Some(frame)) = it.next() {
            out.push(frame.address_for_lookup());
            if out.len() >= MAX_FRAMES {
                break;
            }
        }
        out
    }

    /// The frame at user address `addr`: module, Build-ID, file offset and,
    /// when the module's symbols hold it, the function name.
    pub fn native_frame(&self, addr: u64) -> Frame {
        let mut f = Frame {
            kind: FrameKind::Native,
            name: None,
            module: None,
            build_id: None,
            offset: addr,
            line: None,
        };
        let Some(m) = maps::find(&self.maps, addr) else {
            return f;
        };
        if !m.is_file() {
            f.module = Some(if m.path.is_empty() {
                "[anon]".to_string() // JIT code or unmapped since
            } else {
                m.path.clone()
            });
            f.offset = addr - m.start;
            return f;
        }
        f.offset = m.file_offset(addr);
        f.module = Some(m.path.clone());
        if let Some(Some(elf)) = self.modules.get(&m.path) {
            f.build_id = elf.build_id.clone();
            if let Some(svma) = elf.svma_of_offset(f.offset) {
                f.name = elf
                    .symbol_at(svma)
                    .and_then(|s| elf.symbol_name(s))
                    .map(crate::elf::demangle);
            }
        }
        f
    }

    /// The frame at kernel address `addr`, named from kallsyms.
    pub fn kernel_frame(&self, addr: u64) -> Frame {
        Frame {
            kind: FrameKind::Kernel,
            name: self.kernel.name(addr).map(str::to_string),
            module: Some("[kernel]".to_string()),
            build_id: None,
            offset: addr,
            line: None,
        }
    }
}
