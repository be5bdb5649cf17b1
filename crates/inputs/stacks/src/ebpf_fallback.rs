//! Finishing the in-kernel walks that met a CFI rule the program does not
//! evaluate (SysOM-AI §3.3, Algorithm 1's fallback to "a userspace unwinder
//! on a copied stack"): `bpf/unwind.bpf.h` sends such a sample through the
//! `copied` ring buffer with the frames it found, the registers of the frame
//! that stopped it and the stack above; here the walk goes on with
//! [`crate::cfi_eval`] (gimli's full evaluator) over that copy, with
//! validated frame-pointer steps where a module has no CFI, as in the kernel.

use std::collections::HashMap;
use std::sync::Arc;

use crate::cfi_eval::{self, EhSections, Regs, Step, StepError};
use crate::elf::ElfModule;
use crate::maps::{self, Mapping};
use crate::unwind::ModuleCache;

const MAX_DEPTH: usize = 127;
const PAGE_BYTES: usize = 4096;
const STACK_COPY: usize = 4 * PAGE_BYTES;
const HEADER: usize = 64;
/// `struct copied_stack`'s size (`bpf/unwind.bpf.h`).
pub(crate) const RECORD_BYTES: usize = HEADER + MAX_DEPTH * 8 + STACK_COPY + PAGE_BYTES;

/// One record of the `copied` ring buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CopiedStack {
    pub tgid: u32,
    pub tid: u32,
    pub kernel: u64,
    /// The hash of the thread's Python stack (0: none).
    pub python: u64,
    /// Frames the kernel found, innermost first; the last is the frame at
    /// `regs`.
    pub ips: Vec<u64>,
    pub regs: Regs,
    /// The stack from `regs.sp` up.
    pub stack: Vec<u8>,
}

impl CopiedStack {
    /// Reads a record laid out as `struct copied_stack`; None when it is
    /// shorter than that.
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < RECORD_BYTES {
            return None;
        }
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        let depth = (u32_at(20) as usize).min(MAX_DEPTH);
        let len = (u64_at(48) as usize).min(STACK_COPY + PAGE_BYTES);
        let stack_at = HEADER + MAX_DEPTH * 8;
        Some(CopiedStack {
            tgid: u32_at(0),
            tid: u32_at(4),
            kernel: u64_at(8),
            python: u64_at(56),
            ips: (0..depth).map(|i| u64_at(HEADER + i * 8)).collect(),
            regs: Regs {
                ip: u64_at(24),
                sp: u64_at(32),
                bp: u64_at(40),
            },
            stack: b[stack_at..stack_at + len].to_vec(),
        })
    }
}

/// What the userspace walks did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FallbackCounters {
    /// Samples whose walk was finished here.
    pub walks: u64,
    /// Frames found here.
    pub frames: u64,
    /// Walks that reached the outermost frame.
    pub complete: u64,
}

/// The process's modules as the walk needs them.
#[derive(Default)]
pub(crate) struct Fallback {
    modules: ModuleCache,
    /// Mappings of the processes seen in this drain (read once per drain).
    maps: HashMap<u32, Option<Vec<Mapping>>>,
    /// By process and path: the same path may name another file in another
    /// container (the cache below shares one file's module by inode).
    elves: HashMap<(u32, String), Option<Arc<ElfModule>>>,
    pub counters: FallbackCounters,
}

impl Fallback {
    /// Forgets the mappings read (they may change before the next drain)
    /// and, now and then, the modules.
    pub fn new_drain(&mut self) {
        self.maps.clear();
        if self.elves.len() > 4096 {
            self.elves.clear();
        }
    }

    /// The whole user stack of `c`, innermost first.
    pub fn finish(&mut self, c: &CopiedStack) -> Vec<u64> {
        self.counters.walks += 1;
        let pid = c.tgid;
        let maps = self
            .maps
            .entry(pid)
            .or_insert_with(|| maps::read_maps(pid as i32).ok())
            .clone();
        let mut ips = c.ips.clone();
        let Some(maps) = maps else {
            return ips; // exited since
        };
        let mut read = cfi_eval::stack_reader(c.regs.sp, &c.stack);
        let mut regs = c.regs;
        let mut leaf = ips.len() <= 1;
        while ips.len() < MAX_DEPTH {
            let Some(m) = maps::find(&maps, regs.ip).filter(|m| m.exec && m.is_file()) else {
                break;
            };
            let stepped = match self.module(pid, m, &maps) {
                Some((elf, bias)) => match sections(&elf) {
                    Some(s) => cfi_eval::step(&s, bias, &regs, leaf, &mut read),
                    None => Err(StepError::NoCfi(regs.ip)),
                },
                None => Err(StepError::NoCfi(regs.ip)),
            };
            let next = match stepped {
                Ok(Step::Caller(r)) => r,
                Ok(Step::End) => {
                    self.counters.complete += 1;
                    break;
                }
                // Algorithm 1's validated frame-pointer step, as the kernel
                // takes it where a module has no CFI.
                Err(StepError::NoCfi(_)) => {
                    let bp = regs.bp;
                    if bp < regs.sp || !bp.is_multiple_of(8) {
                        break;
                    }
                    let (Some(ra), Some(caller_bp)) = (read(bp + 8), read(bp)) else {
                        break;
                    };
                    Regs {
                        ip: ra,
                        sp: bp + 16,
                        bp: caller_bp,
                    }
                }
                Err(_) => break,
            };
            if next.ip == 0 {
                self.counters.complete += 1;
                break;
            }
            // The stack grows down: a caller's frame lies above.
            if next.sp <= regs.sp || maps::find(&maps, next.ip).is_none_or(|m| !m.exec) {
                break;
            }
            ips.push(next.ip);
            self.counters.frames += 1;
            regs = next;
            leaf = false;
        }
        ips
    }

    /// The module mapped at `m` and its load bias.
    fn module(&mut self, pid: u32, m: &Mapping, maps: &[Mapping]) -> Option<(Arc<ElfModule>, u64)> {
        let elf = self
            .elves
            .entry((pid, m.path.clone()))
            .or_insert_with(|| self.modules.get(&maps::file_path(pid as i32, &m.path)).ok())
            .clone()?;
        // Any mapping of the file gives the bias: its start holds file
        // offset `offset`, which the load segments place at some SVMA.
        let bias = maps.iter().filter(|x| x.path == m.path).find_map(|x| {
            let svma = elf.svma_of_offset(x.offset)?;
            Some(x.start.wrapping_sub(svma))
        })?;
        Some((elf, bias))
    }
}

fn sections(elf: &ElfModule) -> Option<EhSections<'_>> {
    let u = &elf.unwind;
    let (eh_range, eh) = u.eh_frame.as_ref()?;
    Some(EhSections {
        eh_frame: eh,
        eh_frame_svma: eh_range.start,
        eh_frame_hdr: u.eh_frame_hdr.as_ref().map(|(r, b)| (&b[..], r.start)),
        text_svma: u.text.as_ref().map(|t| t.0.start).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_as_the_program_lays_them_out() {
        let mut b = vec![0u8; RECORD_BYTES];
        b[0..4].copy_from_slice(&7u32.to_ne_bytes());
        b[4..8].copy_from_slice(&8u32.to_ne_bytes());
        b[8..16].copy_from_slice(&99u64.to_ne_bytes());
        b[20..24].copy_from_slice(&2u32.to_ne_bytes());
        b[24..32].copy_from_slice(&0x1000u64.to_ne_bytes());
        b[32..40].copy_from_slice(&0x7000u64.to_ne_bytes());
        b[40..48].copy_from_slice(&0x7040u64.to_ne_bytes());
        b[48..56].copy_from_slice(&16u64.to_ne_bytes());
        b[56..64].copy_from_slice(&0xfeedu64.to_ne_bytes());
        b[64..72].copy_from_slice(&0x2000u64.to_ne_bytes());
        b[72..80].copy_from_slice(&0x1000u64.to_ne_bytes());
        let at = HEADER + MAX_DEPTH * 8;
        b[at] = 0xab;
        let c = CopiedStack::parse(&b).unwrap();
        assert_eq!((c.tgid, c.tid, c.kernel, c.python), (7, 8, 99, 0xfeed));
        assert_eq!(c.ips, vec![0x2000, 0x1000]);
        assert_eq!(c.regs.sp, 0x7000);
        assert_eq!(c.stack.len(), 16);
        assert_eq!(c.stack[0], 0xab);
        assert!(CopiedStack::parse(&b[..RECORD_BYTES - 1]).is_none());
        // A length past the buffer is cut to it.
        b[48..56].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert_eq!(
            CopiedStack::parse(&b).unwrap().stack.len(),
            STACK_COPY + PAGE_BYTES
        );
    }
}
