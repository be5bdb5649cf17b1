//! A symbol index file, one per Build-ID (SysOM-AI §3.4: symbols resolved
//! after collection, centrally, by Build-ID). Built once from an ELF file's
//! full symbol tables; read in place (memory-mapped by the caller) with a
//! binary search, so a lookup never loads the whole file; a symbol answers
//! only for addresses inside its own range, never the "nearest lower
//! symbol" across a gap (§5.3's misattribution).
//!
//! Layout, little-endian:
//!
//! | bytes | what |
//! |---|---|
//! | 8 | magic `WSYMIDX1` |
//! | 4, 4, 8 | segments, symbols, bytes of names |
//! | 24 × segments | load segments: file offset, size in the file, virtual address |
//! | 16 × symbols | sorted by address: address, size (u32), offset of the name (u32) |
//! | names | demangled names, UTF-8, back to back |

use std::path::Path;

use crate::elf::{demangle, ElfModule, Segment};
use crate::StackError;

const MAGIC: &[u8; 8] = b"WSYMIDX1";
const HEADER: usize = 24;

/// Builds the index of the ELF file at `path`. `layout`: the load segments
/// of the program or library the file belongs to, needed when it is a
/// separate debug file (whose own segments no longer say where code lies in
/// the program's file: frames carry file offsets of the program); `None`
/// takes the file's own, and refuses a debug file.
pub fn build_index(
    path: &Path,
    layout: Option<&[Segment]>,
) -> Result<(Vec<u8>, IndexSummary), StackError> {
    let m = ElfModule::open(path)?;
    let segments = match layout {
        Some(l) => l,
        None if !m.code_in_file => {
            return Err(StackError::Elf(
                path.display().to_string(),
                "a separate debug file (its code is not in it): the load segments of the \
                 program or library it belongs to are needed"
                    .into(),
            ))
        }
        None => &m.segments[..],
    };
    let mut names: Vec<u8> = Vec::new();
    let mut rows: Vec<(u64, u32, u32)> = Vec::with_capacity(m.symbols.len());
    for s in &m.symbols {
        let (Some(raw), Ok(size)) = (m.symbol_name(s), u32::try_from(s.size)) else {
            continue;
        };
        let Ok(at) = u32::try_from(names.len()) else {
            break; // over 4 GiB of names: the rest is left out
        };
        let name = demangle(raw);
        names.extend_from_slice(name.as_bytes());
        rows.push((s.address, size, at));
    }
    let mut out =
        Vec::with_capacity(HEADER + 24 * segments.len() + 16 * rows.len() + names.len() + 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    out.extend_from_slice(&(names.len() as u64).to_le_bytes());
    for s in segments {
        out.extend_from_slice(&s.offset.to_le_bytes());
        out.extend_from_slice(&s.filesz.to_le_bytes());
        out.extend_from_slice(&s.vaddr.to_le_bytes());
    }
    for (a, size, at) in &rows {
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&size.to_le_bytes());
        out.extend_from_slice(&at.to_le_bytes());
    }
    out.extend_from_slice(&names);
    Ok((
        out,
        IndexSummary {
            build_id: m.build_id.clone(),
            symbols: rows.len() as u64,
        },
    ))
}

/// Most load segments a layout may name.
pub const MAX_LAYOUT_SEGMENTS: usize = 64;

/// The load segments of the ELF file at `path` (file offset, bytes in the
/// file, virtual address), as [`format_layout`] sends them with a separate
/// debug file.
pub fn layout_of(path: &Path) -> Result<Vec<Segment>, StackError> {
    Ok(ElfModule::open(path)?.segments)
}

/// `segments` as the symbol upload's `segments` query parameter: one
/// `offset-filesz-vaddr` triple in hex per segment, comma-separated.
pub fn format_layout(segments: &[Segment]) -> String {
    segments
        .iter()
        .map(|s| format!("{:x}-{:x}-{:x}", s.offset, s.filesz, s.vaddr))
        .collect::<Vec<_>>()
        .join(",")
}

/// Reads [`format_layout`]'s text; the error says which triple is wrong.
pub fn parse_layout(text: &str) -> Result<Vec<Segment>, String> {
    let out: Vec<Segment> = text
        .split(',')
        .map(|t| {
            let v: Vec<u64> = t
                .split('-')
                .map(|h| u64::from_str_radix(h, 16))
                .collect::<Result<_, _>>()
                .map_err(|e| format!("segment {t:?}: {e}"))?;
            match v[..] {
                [offset, filesz, vaddr] if offset.checked_add(filesz).is_some() => Ok(Segment {
                    offset,
                    filesz,
                    vaddr,
                }),
                _ => Err(format!(
                    "segment {t:?}: expected offset-filesz-vaddr in hex"
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    if out.len() > MAX_LAYOUT_SEGMENTS {
        return Err(format!(
            "{} segments: at most {MAX_LAYOUT_SEGMENTS}",
            out.len()
        ));
    }
    Ok(out)
}

/// What an index holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSummary {
    /// The file's Build-ID (lowercase hex), if it has one.
    pub build_id: Option<String>,
    /// Symbols indexed.
    pub symbols: u64,
}

/// An index read in place.
#[derive(Debug, Clone, Copy)]
pub struct SymbolIndex<'a> {
    segments: &'a [u8],
    symbols: &'a [u8],
    names: &'a [u8],
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

impl<'a> SymbolIndex<'a> {
    /// Checks the layout of `bytes`; an error says what is wrong.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, String> {
        if bytes.len() < HEADER || &bytes[..8] != MAGIC {
            return Err("not a whyslow symbol index (bad magic)".into());
        }
        let n_seg = u32_at(bytes, 8) as usize;
        let n_sym = u32_at(bytes, 12) as usize;
        let n_names = usize::try_from(u64_at(bytes, 16)).map_err(|_| "names too long")?;
        let seg_end = HEADER + 24 * n_seg;
        let sym_end = seg_end + 16 * n_sym;
        if bytes.len() != sym_end + n_names {
            return Err(format!(
                "symbol index of {} bytes, its header says {}",
                bytes.len(),
                sym_end + n_names
            ));
        }
        Ok(SymbolIndex {
            segments: &bytes[HEADER..seg_end],
            symbols: &bytes[seg_end..sym_end],
            names: &bytes[sym_end..],
        })
    }

    /// Symbols in the index.
    pub fn len(&self) -> usize {
        self.symbols.len() / 16
    }

    /// Whether it holds no symbol.
    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The function holding the instruction at file offset `offset`, or
    /// `None` (no load segment holds it, or it falls between symbols).
    pub fn name_at_offset(&self, offset: u64) -> Option<&'a str> {
        let svma = (0..self.segments.len() / 24).find_map(|i| {
            let (off, size, vaddr) = (
                u64_at(self.segments, 24 * i),
                u64_at(self.segments, 24 * i + 8),
                u64_at(self.segments, 24 * i + 16),
            );
            (off..off.saturating_add(size))
                .contains(&offset)
                .then(|| vaddr + (offset - off))
        })?;
        self.name_at(svma)
    }

    /// The function whose range holds `svma`: binary search, then a look
    /// back over a few nested symbols (aliases of other sizes).
    pub fn name_at(&self, svma: u64) -> Option<&'a str> {
        let n = self.len();
        let (mut lo, mut hi) = (0usize, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if u64_at(self.symbols, 16 * mid) <= svma {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        (lo.saturating_sub(8)..lo).rev().find_map(|i| {
            let at = 16 * i;
            let (addr, size) = (
                u64_at(self.symbols, at),
                u64::from(u32_at(self.symbols, at + 8)),
            );
            if svma >= addr + size {
                return None;
            }
            let start = u32_at(self.symbols, at + 12) as usize;
            let end = if i + 1 < n {
                u32_at(self.symbols, 16 * (i + 1) + 12) as usize
            } else {
                self.names.len()
            };
            self.names
                .get(start..end)
                .and_then(|b| std::str::from_utf8(b).ok())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_binary_indexes_and_its_functions_are_found_gaps_are_not() {
        let exe = std::env::current_exe().unwrap();
        let (bytes, summary) = build_index(&exe, None).unwrap();
        assert!(
            summary.symbols > 1000 && summary.build_id.is_some(),
            "{summary:?}"
        );
        let idx = SymbolIndex::parse(&bytes).unwrap();
        assert_eq!(idx.len() as u64, summary.symbols);
        let m = ElfModule::open(&exe).unwrap();
        let mut checked = 0;
        for s in m.symbols.iter().step_by((m.symbols.len() / 100).max(1)) {
            let want = demangle(m.symbol_name(s).unwrap());
            // Aliases at one address: any of them is right.
            let got = idx.name_at(s.address + s.size / 2).unwrap();
            let same_start = m
                .symbols
                .iter()
                .filter(|o| {
                    o.address <= s.address + s.size / 2
                        && s.address + s.size / 2 < o.address + o.size
                })
                .any(|o| demangle(m.symbol_name(o).unwrap()) == got);
            assert!(got == want || same_start, "{got} vs {want}");
            checked += 1;
        }
        assert!(checked > 50);
        // Between two symbols with a gap: nothing.
        let gap = m
            .symbols
            .windows(2)
            .find(|w| w[0].address + w[0].size + 4 < w[1].address)
            .expect("a gap between symbols");
        assert_eq!(idx.name_at(gap[0].address + gap[0].size + 1), None);
        // Truncated or foreign bytes are refused with the reason.
        assert!(SymbolIndex::parse(&bytes[..bytes.len() - 1])
            .unwrap_err()
            .contains("header says"));
        assert!(SymbolIndex::parse(b"garbage garbage garbage!").is_err());
    }

    #[test]
    fn layouts_round_trip_and_bad_ones_say_which_segment() {
        let exe = std::env::current_exe().unwrap();
        let l = layout_of(&exe).unwrap();
        assert!(!l.is_empty());
        assert_eq!(parse_layout(&format_layout(&l)).unwrap(), l);
        assert!(parse_layout("10-20").unwrap_err().contains("\"10-20\""));
        assert!(parse_layout("10-zz-30").unwrap_err().contains("zz"));
        assert!(parse_layout("ffffffffffffffff-2-0").is_err());
        assert!(parse_layout(&vec!["0-1-0"; 65].join(","))
            .unwrap_err()
            .contains("at most 64"));
    }
}
