//! DWARF call-frame information compiled into the compact rows the in-kernel
//! unwinder searches (SysOM-AI §3.3, Algorithm 1: "unwind with DWARF CFI rows
//! that userspace precomputes from `.eh_frame` into BPF maps").
//!
//! Each row covers the addresses from its `pc` up to the next row's and says
//! how to find the caller on x86-64: the canonical frame address (CFA) from
//! `rsp` or `rbp` plus an offset (or the PLT's fixed expression), the return
//! address at CFA − 8, and where the caller's `rbp` was saved. Rules the
//! kernel side cannot evaluate (other DWARF expressions, the CFA in another
//! register) are kept as [`CfaKind::Unsupported`] rows, so the unwinder
//! stops there rather than guessing; addresses no FDE covers get a
//! [`CfaKind::NoCfi`] row, where the hybrid unwinder takes a validated
//! frame-pointer step instead.
//!
//! Pure: bytes in, rows out. No I/O.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};

/// How a row finds the canonical frame address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CfaKind {
    /// No FDE covers these addresses (hand-written code, a gap between
    /// functions): the hybrid unwinder tries a validated frame-pointer step.
    NoCfi = 0,
    /// CFA = rsp + offset.
    Rsp = 1,
    /// CFA = rbp + offset.
    Rbp = 2,
    /// A PLT entry: CFA = rsp + 8, plus 8 when (rip & 15) >= offset.
    Plt = 3,
    /// A rule the kernel side does not evaluate: unwinding stops here.
    Unsupported = 4,
    /// The return address is undefined: the outermost frame (`_start`,
    /// `clone3`'s child).
    End = 5,
}

/// Where the caller's `rbp` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RbpKind {
    /// Unchanged by this function (so far).
    Same = 0,
    /// Saved at CFA + offset.
    AtCfa = 1,
}

/// One row: the rule from `pc` (an address in the ELF file's own address
/// space, SVMA) up to the next row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CfiRow {
    /// First address the rule holds for (SVMA).
    pub pc: u64,
    /// How to find the CFA.
    pub cfa: CfaKind,
    /// Offset added to the CFA's register (the PLT threshold for [`CfaKind::Plt`]).
    pub cfa_offset: i32,
    /// Where the caller's rbp is.
    pub rbp: RbpKind,
    /// Offset from the CFA of the saved rbp.
    pub rbp_offset: i32,
}

impl CfiRow {
    fn gap(pc: u64) -> Self {
        CfiRow {
            pc,
            cfa: CfaKind::NoCfi,
            cfa_offset: 0,
            rbp: RbpKind::Same,
            rbp_offset: 0,
        }
    }

    fn same_rule(&self, other: &CfiRow) -> bool {
        (self.cfa, self.cfa_offset, self.rbp, self.rbp_offset)
            == (other.cfa, other.cfa_offset, other.rbp, other.rbp_offset)
    }
}

/// What went into a module's rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CfiSummary {
    /// FDEs read.
    pub fdes: u64,
    /// FDEs that could not be parsed (skipped).
    pub bad_fdes: u64,
    /// Rows with a rule the kernel side does not evaluate.
    pub unsupported: u64,
}

/// Compiles an `.eh_frame` section (`bytes`, loaded at SVMA `eh_frame_svma`;
/// `text_svma` for text-relative pointers) into rows sorted by `pc`, one per
/// change of rule. Malformed entries are skipped and counted, never fatal.
pub fn compile_eh_frame(
    bytes: &[u8],
    eh_frame_svma: u64,
    text_svma: u64,
) -> (Vec<CfiRow>, CfiSummary) {
    let eh = EhFrame::new(bytes, LittleEndian);
    let bases = BaseAddresses::default()
        .set_eh_frame(eh_frame_svma)
        .set_text(text_svma);
    let mut ctx = UnwindContext::new();
    let mut rows: Vec<CfiRow> = Vec::new();
    let mut summary = CfiSummary::default();
    let mut entries = eh.entries(&bases);
    loop {
        let entry = match entries.next() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            // The rest of the section cannot be walked past a broken length.
            Err(_) => {
                summary.bad_fdes += 1;
                break;
            }
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(|s, b, o| s.cie_from_offset(b, o)) else {
            summary.bad_fdes += 1;
            continue;
        };
        summary.fdes += 1;
        if fde.cie().return_address_register() != X86_64::RA {
            summary.unsupported += 1;
            continue;
        }
        let Ok(mut table) = fde.rows(&eh, &bases, &mut ctx) else {
            summary.bad_fdes += 1;
            continue;
        };
        let first = rows.len();
        loop {
            match table.next_row() {
                Ok(Some(row)) => {
                    let r = convert(row, &eh);
                    if r.cfa == CfaKind::Unsupported {
                        summary.unsupported += 1;
                    }
                    rows.push(CfiRow {
                        pc: row.start_address(),
                        ..r
                    });
                }
                Ok(None) => break,
                Err(_) => {
                    summary.bad_fdes += 1;
                    rows.truncate(first);
                    break;
                }
            }
        }
        if rows.len() > first {
            rows.push(CfiRow::gap(fde.end_address()));
        }
    }
    (normalize(rows), summary)
}

fn convert<S: gimli::UnwindContextStorage<usize>>(
    row: &gimli::UnwindTableRow<usize, S>,
    eh: &EhFrame<gimli::EndianSlice<'_, LittleEndian>>,
) -> CfiRow {
    let mut out = CfiRow::gap(0);
    match row.register(X86_64::RA) {
        RegisterRule::Offset(-8) => {}
        RegisterRule::Undefined => {
            out.cfa = CfaKind::End;
            return out;
        }
        _ => {
            out.cfa = CfaKind::Unsupported;
            return out;
        }
    }
    match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let Ok(off) = i32::try_from(*offset) else {
                out.cfa = CfaKind::Unsupported;
                return out;
            };
            out.cfa_offset = off;
            out.cfa = if *register == X86_64::RSP {
                CfaKind::Rsp
            } else if *register == X86_64::RBP {
                CfaKind::Rbp
            } else {
                CfaKind::Unsupported
            };
        }
        CfaRule::Expression(e) => {
            // Only the PLT's expression is known by its shape.
            let bytes = e.get(eh).map(|x| x.0.slice()).unwrap_or(&[]);
            match plt_threshold(bytes) {
                Some(n) => {
                    out.cfa = CfaKind::Plt;
                    out.cfa_offset = n;
                }
                None => out.cfa = CfaKind::Unsupported,
            }
        }
    }
    match row.register(X86_64::RBP) {
        RegisterRule::Offset(o) => match i32::try_from(o) {
            Ok(o) => {
                out.rbp = RbpKind::AtCfa;
                out.rbp_offset = o;
            }
            Err(_) => out.cfa = CfaKind::Unsupported,
        },
        RegisterRule::SameValue | RegisterRule::Undefined => {}
        _ => out.cfa = CfaKind::Unsupported,
    }
    out
}

/// Sorts rows by address; where an FDE starts where the previous one ended,
/// the real rule wins over the gap marker; consecutive rows with the same
/// rule become one.
fn normalize(mut rows: Vec<CfiRow>) -> Vec<CfiRow> {
    // Stable: at equal pc the later row (an FDE's first) follows the earlier
    // FDE's end marker.
    rows.sort_by_key(|r| r.pc);
    let mut out: Vec<CfiRow> = Vec::with_capacity(rows.len());
    for r in rows {
        if let Some(last) = out.last_mut() {
            if last.pc == r.pc {
                if last.cfa == CfaKind::NoCfi || r.cfa != CfaKind::NoCfi {
                    *last = r;
                }
                continue;
            }
            if last.same_rule(&r) {
                continue;
            }
        }
        out.push(r);
    }
    out
}

/// The row for `pc` in rows sorted by `pc` (the last one at or below it).
pub fn lookup(rows: &[CfiRow], pc: u64) -> Option<&CfiRow> {
    let i = rows.partition_point(|r| r.pc <= pc);
    rows[..i].last()
}

/// The PLT threshold of a CFA expression of the form that linkers emit for
/// `.plt` (`DW_OP_breg7 8; DW_OP_breg16 0; DW_OP_lit15; DW_OP_and;
/// DW_OP_litN; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`): N.
pub fn plt_threshold(expr: &[u8]) -> Option<i32> {
    match expr {
        [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, lit, 0x2a, 0x33, 0x24, 0x22]
            if (0x30..=0x4f).contains(lit) =>
        {
            Some(i32::from(lit - 0x30))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pc: u64, cfa: CfaKind, off: i32) -> CfiRow {
        CfiRow {
            pc,
            cfa,
            cfa_offset: off,
            rbp: RbpKind::Same,
            rbp_offset: 0,
        }
    }

    #[test]
    fn rows_merge_and_fde_starts_beat_gap_markers() {
        let rows = vec![
            row(0x100, CfaKind::Rsp, 8),
            row(0x104, CfaKind::Rsp, 16),
            row(0x110, CfaKind::NoCfi, 0),
            // Next FDE starts where the previous ended.
            row(0x110, CfaKind::Rsp, 8),
            row(0x118, CfaKind::Rsp, 8),
            row(0x120, CfaKind::NoCfi, 0),
            row(0x200, CfaKind::Rsp, 8),
            row(0x210, CfaKind::NoCfi, 0),
        ];
        let n = normalize(rows);
        let pcs: Vec<u64> = n.iter().map(|r| r.pc).collect();
        assert_eq!(pcs, vec![0x100, 0x104, 0x110, 0x120, 0x200, 0x210]);
        assert_eq!(lookup(&n, 0x112).unwrap().cfa_offset, 8);
        assert_eq!(lookup(&n, 0x150).unwrap().cfa, CfaKind::NoCfi);
        assert!(lookup(&n, 0x50).is_none());
    }

    #[test]
    fn the_plt_expression_is_recognized() {
        let e = [
            0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22,
        ];
        assert_eq!(plt_threshold(&e), Some(11));
        assert_eq!(plt_threshold(&e[..10]), None);
        assert_eq!(plt_threshold(&[0x77, 0x08]), None);
    }

    #[test]
    fn garbage_gives_no_rows_and_no_panic() {
        for bytes in [&[][..], &[0xff; 64][..], &[4, 0, 0, 0, 0, 0, 0, 0][..]] {
            let (rows, _) = compile_eh_frame(bytes, 0x1000, 0x2000);
            assert!(rows.iter().all(|r| r.cfa != CfaKind::Rsp || r.pc > 0));
        }
    }

    /// This test binary's own `.eh_frame` (Rust code built with CFI): every
    /// function start has a row, almost all rules are evaluable in the
    /// kernel, and a function's entry says CFA = rsp + 8.
    #[test]
    fn this_binary_compiles_to_evaluable_rows() {
        use object::{Object, ObjectSection};
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&exe[..]).unwrap();
        let eh = obj.section_by_name(".eh_frame").unwrap();
        let text = obj.section_by_name(".text").unwrap();
        let (rows, summary) = compile_eh_frame(eh.data().unwrap(), eh.address(), text.address());
        assert!(summary.fdes > 1000, "{summary:?}");
        assert_eq!(summary.bad_fdes, 0);
        assert!(summary.unsupported * 100 < summary.fdes, "{summary:?}");
        assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc));
        let sym = obj
            .symbols()
            .find(|s| {
                use object::ObjectSymbol;
                s.name()
                    .is_ok_and(|n| n.contains("this_binary_compiles_to_evaluable_rows"))
            })
            .map(|s| {
                use object::ObjectSymbol;
                s.address()
            })
            .expect("the test's own symbol");
        let r = lookup(&rows, sym).expect("a row at the function's entry");
        assert_eq!((r.cfa, r.cfa_offset), (CfaKind::Rsp, 8), "{r:?}");
    }
}
