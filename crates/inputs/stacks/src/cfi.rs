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
    let mut rows = Vec::new();
    let summary = stream_eh_frame(bytes, eh_frame_svma, text_svma, |r| {
        rows.push(r);
        true
    });
    (rows, summary)
}

/// [`compile_eh_frame`] without holding the rows: each row goes to `emit`
/// as soon as it is final, in increasing `pc` (`emit` returns false to stop
/// early). What it holds meanwhile is one entry per FDE (its start address
/// and offset, 16 bytes) and one FDE's rows, so a 17 MiB `.eh_frame`
/// (libtorch_cpu.so) compiles in a few MB, not hundreds.
///
/// FDEs are evaluated in the order of their start address. Where FDEs
/// overlap (malformed input), the one that starts first keeps its rows up to
/// its end; the other's rows below that are dropped.
pub fn stream_eh_frame(
    bytes: &[u8],
    eh_frame_svma: u64,
    text_svma: u64,
    mut emit: impl FnMut(CfiRow) -> bool,
) -> CfiSummary {
    let eh = EhFrame::new(bytes, LittleEndian);
    let bases = BaseAddresses::default()
        .set_eh_frame(eh_frame_svma)
        .set_text(text_svma);
    let mut summary = CfiSummary::default();
    // Pass 1: where each FDE starts, by address.
    let mut fdes: Vec<(u64, usize)> = Vec::new();
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
        match partial.parse(|s, b, o| s.cie_from_offset(b, o)) {
            Ok(fde) => fdes.push((fde.initial_address(), partial.offset())),
            Err(_) => summary.bad_fdes += 1,
        }
    }
    // Stable: FDEs at the same address keep the section's order.
    fdes.sort_by_key(|f| f.0);
    // Pass 2: each FDE's rows, in address order, normalized on the fly.
    let mut ctx = UnwindContext::new();
    let mut out = Normalizer::default();
    let mut one: Vec<CfiRow> = Vec::new();
    for (_, offset) in fdes {
        let Ok(fde) = eh.fde_from_offset(
            &bases,
            gimli::EhFrameOffset(offset),
            EhFrame::cie_from_offset,
        ) else {
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
        one.clear();
        let mut ok = true;
        loop {
            match table.next_row() {
                Ok(Some(row)) => {
                    let r = convert(row, &eh);
                    if r.cfa == CfaKind::Unsupported {
                        summary.unsupported += 1;
                    }
                    one.push(CfiRow {
                        pc: row.start_address(),
                        ..r
                    });
                }
                Ok(None) => break,
                Err(_) => {
                    summary.bad_fdes += 1;
                    ok = false;
                    break;
                }
            }
        }
        if !ok || one.is_empty() {
            continue;
        }
        one.push(CfiRow::gap(fde.end_address()));
        for r in one.drain(..) {
            if !out.push(r, &mut emit) {
                return summary;
            }
        }
    }
    out.finish(&mut emit);
    summary
}

/// The normalization of rows (see `normalize`) on rows that come in increasing `pc` (within an FDE, and
/// FDEs by start address), one at a time: the row last seen is held until
/// the next one shows it is final.
#[derive(Default)]
struct Normalizer {
    last: Option<CfiRow>,
    stopped: bool,
}

impl Normalizer {
    /// Takes `r`; false once `emit` asked to stop.
    fn push(&mut self, r: CfiRow, emit: &mut impl FnMut(CfiRow) -> bool) -> bool {
        if self.stopped {
            return false;
        }
        let Some(last) = &mut self.last else {
            self.last = Some(r);
            return true;
        };
        if last.pc == r.pc {
            if last.cfa == CfaKind::NoCfi || r.cfa != CfaKind::NoCfi {
                *last = r;
            }
            return true;
        }
        // Below a row already final (overlapping FDEs), or the same rule.
        if r.pc < last.pc || last.same_rule(&r) {
            return true;
        }
        let done = std::mem::replace(last, r);
        if !emit(done) {
            self.stopped = true;
        }
        !self.stopped
    }

    fn finish(&mut self, emit: &mut impl FnMut(CfiRow) -> bool) {
        if let Some(last) = self.last.take() {
            if !self.stopped {
                emit(last);
            }
        }
    }
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

#[cfg(test)]
/// Sorts rows by address; where an FDE starts where the previous one ended,
/// the real rule wins over the gap marker; consecutive rows with the same
/// rule become one.
fn normalize(mut rows: Vec<CfiRow>) -> Vec<CfiRow> {
    // Stable: at equal pc the later row (an FDE's first) follows the earlier
    // FDE's end marker.
    rows.sort_by_key(|r| r.pc);
    let mut out: Vec<CfiRow> = Vec::with_capacity(rows.len());
    let mut n = Normalizer::default();
    let mut emit = |r| {
        out.push(r);
        true
    };
    for r in rows {
        n.push(r, &mut emit);
    }
    n.finish(&mut emit);
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

    /// The whole-table compile this module did before rows were streamed
    /// (every FDE's rows in section order, then sorted and normalized): the
    /// streamed rows are the same on this test binary's `.eh_frame`.
    #[test]
    fn streamed_rows_equal_the_sorted_whole_table() {
        use object::{Object, ObjectSection};
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let obj = object::File::parse(&exe[..]).unwrap();
        let eh = obj.section_by_name(".eh_frame").unwrap();
        let text = obj.section_by_name(".text").unwrap();
        let bytes = eh.data().unwrap();
        let section = EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(eh.address())
            .set_text(text.address());
        let mut ctx = UnwindContext::new();
        let mut all = Vec::new();
        let mut entries = section.entries(&bases);
        while let Ok(Some(e)) = entries.next() {
            let CieOrFde::Fde(p) = e else { continue };
            let fde = p.parse(|s, b, o| s.cie_from_offset(b, o)).unwrap();
            if fde.cie().return_address_register() != X86_64::RA {
                continue;
            }
            let mut t = fde.rows(&section, &bases, &mut ctx).unwrap();
            let first = all.len();
            while let Some(row) = t.next_row().unwrap() {
                all.push(CfiRow {
                    pc: row.start_address(),
                    ..convert(row, &section)
                });
            }
            if all.len() > first {
                all.push(CfiRow::gap(fde.end_address()));
            }
        }
        let whole = normalize(all);
        let (streamed, _) = compile_eh_frame(bytes, eh.address(), text.address());
        assert!(whole.len() > 1000);
        // The same rule at every address, except where an FDE starts where
        // a same-rule row ended and another FDE's end marker at that address
        // came after it in the section: the whole-table compile lost that
        // FDE (NoCfi), streaming keeps it.
        let mut lost = 0;
        for r in streamed.iter().chain(&whole) {
            let (a, b) = (lookup(&streamed, r.pc), lookup(&whole, r.pc));
            if a != b {
                assert_eq!(b.map(|x| x.cfa), Some(CfaKind::NoCfi), "{a:?} vs {b:?}");
                lost += 1;
            }
        }
        assert!(lost * 100 < whole.len(), "{lost}");
        // Stopping early stops the compile.
        let mut n = 0;
        stream_eh_frame(bytes, eh.address(), text.address(), |_| {
            n += 1;
            n < 10
        });
        assert_eq!(n, 10);
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
