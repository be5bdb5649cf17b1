//! The userspace half of SysOM-AI §3.3's hybrid unwinding (Algorithm 1:
//! "complex CFI rules fall back to a userspace unwinder on a copied stack").
//!
//! The kernel side evaluates the common rules only (CFA = rsp or rbp plus an
//! offset, the PLT's expression; [`crate::cfi`]). Where a walk meets any other
//! rule — a DWARF expression such as the stack-realigning prologue's
//! `CFA = *(rbp − 8)`, the caller's rbp saved at an expression, the CFA in
//! another register — the program copies the frame's registers and the stack
//! above it, and the walk goes on here with gimli's full CFI evaluator
//! (expressions included) over that copy.
//!
//! Pure: section bytes, registers and a memory reader in, the caller's
//! registers out. No I/O.

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, Evaluation, EvaluationResult,
    LittleEndian, Location, Register, RegisterRule, UnwindContext, UnwindSection, Value, X86_64,
};

type R<'a> = EndianSlice<'a, LittleEndian>;

/// The registers a frame's walk knows: instruction, stack and frame pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regs {
    /// Instruction pointer (a return address for callers).
    pub ip: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (rbp), or whatever the register holds.
    pub bp: u64,
}

/// One module's unwind sections, with the addresses they are linked at
/// (SVMA: the ELF file's own address space).
#[derive(Debug, Clone, Copy)]
pub struct EhSections<'a> {
    /// `.eh_frame`.
    pub eh_frame: &'a [u8],
    /// Its SVMA.
    pub eh_frame_svma: u64,
    /// `.eh_frame_hdr` and its SVMA, when the module has one (binary search;
    /// without it, FDEs are searched in order).
    pub eh_frame_hdr: Option<(&'a [u8], u64)>,
    /// `.text`'s SVMA (text-relative pointers).
    pub text_svma: u64,
}

/// Where a step led.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The caller's registers.
    Caller(Regs),
    /// The outermost frame: the return address is undefined.
    End,
}

/// Why a frame could not be stepped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// No FDE covers the address.
    #[error("no CFI for address {0:#x}")]
    NoCfi(u64),
    /// The CFI could not be read.
    #[error("malformed CFI: {0}")]
    Malformed(String),
    /// A rule needs what a copied stack does not hold (another register, a
    /// TLS address).
    #[error("rule needs {0}")]
    Unevaluable(String),
    /// A read outside the copied stack.
    #[error("memory at {0:#x} was not copied")]
    Memory(u64),
}

fn malformed(e: gimli::Error) -> StepError {
    StepError::Malformed(e.to_string())
}

/// Steps from the frame at `regs` to its caller with the module's CFI.
/// `bias`: the module's load address minus its SVMA. `leaf`: whether `regs.ip`
/// is the interrupted instruction (else a return address, looked up one byte
/// back, in the call). `read`: 8 bytes of the stack at an address.
pub fn step(
    sections: &EhSections<'_>,
    bias: u64,
    regs: &Regs,
    leaf: bool,
    read: &mut dyn FnMut(u64) -> Option<u64>,
) -> Result<Step, StepError> {
    let pc = regs
        .ip
        .wrapping_sub(bias)
        .wrapping_sub(if leaf { 0 } else { 1 });
    let eh = EhFrame::new(sections.eh_frame, LittleEndian);
    let mut bases = BaseAddresses::default()
        .set_eh_frame(sections.eh_frame_svma)
        .set_text(sections.text_svma);
    let fde = match sections.eh_frame_hdr {
        Some((hdr, hdr_svma)) => {
            bases = bases.set_eh_frame_hdr(hdr_svma);
            let parsed = EhFrameHdr::new(hdr, LittleEndian)
                .parse(&bases, 8)
                .map_err(malformed)?;
            match parsed.table() {
                Some(table) => table.fde_for_address(&eh, &bases, pc, EhFrame::cie_from_offset),
                None => eh.fde_for_address(&bases, pc, EhFrame::cie_from_offset),
            }
        }
        None => eh.fde_for_address(&bases, pc, EhFrame::cie_from_offset),
    };
    let fde = match fde {
        Ok(f) => f,
        Err(gimli::Error::NoUnwindInfoForAddress) => return Err(StepError::NoCfi(regs.ip)),
        Err(e) => return Err(malformed(e)),
    };
    let encoding = fde.cie().encoding();
    let ra_register = fde.cie().return_address_register();
    let mut ctx = Box::new(UnwindContext::new());
    let row = fde
        .unwind_info_for_address(&eh, &bases, &mut ctx, pc)
        .map_err(|e| match e {
            gimli::Error::NoUnwindInfoForAddress => StepError::NoCfi(regs.ip),
            e => malformed(e),
        })?;
    let register = |r: Register| -> Result<u64, StepError> {
        match r {
            X86_64::RSP => Ok(regs.sp),
            X86_64::RBP => Ok(regs.bp),
            X86_64::RA => Ok(regs.ip),
            other => Err(StepError::Unevaluable(format!("register {}", other.0))),
        }
    };
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset {
            register: r,
            offset,
        } => register(*r)?.wrapping_add(*offset as u64),
        CfaRule::Expression(e) => {
            let expr = e.get(&eh).map_err(malformed)?;
            evaluate(expr.evaluation(encoding), None, &register, read)?
        }
    };
    // The value a register had in the caller: None where the rule leaves it
    // undefined.
    let mut restore = |r: Register| -> Result<Option<u64>, StepError> {
        Ok(Some(match row.register(r) {
            RegisterRule::Undefined => return Ok(None),
            RegisterRule::SameValue => register(r)?,
            RegisterRule::Offset(o) => {
                let at = cfa.wrapping_add(o as u64);
                read(at).ok_or(StepError::Memory(at))?
            }
            RegisterRule::ValOffset(o) => cfa.wrapping_add(o as u64),
            RegisterRule::Register(other) => register(other)?,
            RegisterRule::Expression(e) => {
                let expr = e.get(&eh).map_err(malformed)?;
                let at = evaluate(expr.evaluation(encoding), Some(cfa), &register, read)?;
                read(at).ok_or(StepError::Memory(at))?
            }
            RegisterRule::ValExpression(e) => {
                let expr = e.get(&eh).map_err(malformed)?;
                evaluate(expr.evaluation(encoding), Some(cfa), &register, read)?
            }
            other => return Err(StepError::Unevaluable(format!("rule {other:?}"))),
        }))
    };
    let Some(ra) = restore(ra_register)? else {
        return Ok(Step::End);
    };
    // An rbp the CFI does not mention stays as it was (SameValue's default
    // for callee-saved registers in the x86-64 psABI).
    let bp = restore(X86_64::RBP)?.unwrap_or(regs.bp);
    if ra == 0 {
        return Ok(Step::End);
    }
    Ok(Step::Caller(Regs {
        ip: ra,
        sp: cfa,
        bp,
    }))
}

/// Runs a DWARF expression to its end, answering its register and memory
/// requests; `initial`: the value pushed first (the CFA, for register rules).
fn evaluate(
    mut eval: Evaluation<R<'_>>,
    initial: Option<u64>,
    register: &dyn Fn(Register) -> Result<u64, StepError>,
    read: &mut dyn FnMut(u64) -> Option<u64>,
) -> Result<u64, StepError> {
    if let Some(v) = initial {
        eval.set_initial_value(v);
    }
    let mut state = eval.evaluate().map_err(malformed)?;
    // Expressions in CFI are short; a bound keeps a malicious loop finite
    // (gimli also bounds its own iterations).
    for _ in 0..64 {
        state = match state {
            EvaluationResult::Complete => {
                let pieces = eval.as_result();
                return match pieces.first().map(|p| &p.location) {
                    Some(Location::Address { address }) => Ok(*address),
                    Some(Location::Value { value }) => value
                        .to_u64(u64::MAX)
                        .map_err(|_| StepError::Unevaluable("a non-integer value".into())),
                    _ => Err(StepError::Unevaluable(
                        "a location other than memory".into(),
                    )),
                };
            }
            EvaluationResult::RequiresMemory { address, size, .. } => {
                if size != 8 {
                    return Err(StepError::Unevaluable(format!("a {size}-byte read")));
                }
                let v = read(address).ok_or(StepError::Memory(address))?;
                eval.resume_with_memory(Value::Generic(v))
                    .map_err(malformed)?
            }
            EvaluationResult::RequiresRegister { register: r, .. } => {
                let v = register(r)?;
                eval.resume_with_register(Value::Generic(v))
                    .map_err(malformed)?
            }
            other => return Err(StepError::Unevaluable(format!("{other:?}"))),
        };
    }
    Err(StepError::Unevaluable(
        "an expression that does not end".into(),
    ))
}

/// A copy of the stack from `base` up: reads 8 bytes at an address inside it.
pub fn stack_reader(base: u64, bytes: &[u8]) -> impl FnMut(u64) -> Option<u64> + '_ {
    move |addr| {
        let off = usize::try_from(addr.checked_sub(base)?).ok()?;
        let b = bytes.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built `.eh_frame`: one CIE (code align 1, data align −8, RA
    /// r16, CFA = rsp + 8, RA at CFA − 8) and one FDE for [0x1000, 0x1100)
    /// with the stack-realigning prologue gcc emits for
    /// `force_align_arg_pointer` (from 0x1010: CFA = *(rbp − 8), rbp saved
    /// at rbp).
    fn realigning_eh_frame() -> Vec<u8> {
        let mut cie = vec![
            0, 0, 0, 0, // CIE id
            1, // version
            b'z', b'R', 0,    // augmentation
            1,    // code alignment
            0x78, // data alignment −8
            16,   // return address register
            1,    // augmentation data length
            0x00, // FDE pointers: absolute, 8 bytes
            0x0c, 7, 8, // DW_CFA_def_cfa rsp 8
            0x90, 1, // DW_CFA_offset r16 at cfa−8
        ];
        while (cie.len() + 4) % 8 != 0 {
            cie.push(0); // DW_CFA_nop
        }
        let mut out = Vec::new();
        out.extend_from_slice(&(cie.len() as u32).to_le_bytes());
        out.extend_from_slice(&cie);
        let fde_at = out.len();
        let mut fde = Vec::new();
        fde.extend_from_slice(&((fde_at + 4) as u32).to_le_bytes()); // CIE pointer
        fde.extend_from_slice(&0x1000u64.to_le_bytes());
        fde.extend_from_slice(&0x100u64.to_le_bytes());
        fde.push(0); // augmentation data length
        fde.extend_from_slice(&[
            0x50, // DW_CFA_advance_loc 16
            0x0f, 3, 0x76, 0x78, 0x06, // DW_CFA_def_cfa_expression: breg6 −8; deref
            0x10, 6, 2, 0x76, 0x00, // DW_CFA_expression rbp: breg6 0
        ]);
        while (fde.len() + 4) % 8 != 0 {
            fde.push(0);
        }
        out.extend_from_slice(&(fde.len() as u32).to_le_bytes());
        out.extend_from_slice(&fde);
        out.extend_from_slice(&[0, 0, 0, 0]);
        out
    }

    #[test]
    fn a_realigned_frame_is_stepped_with_its_expressions() {
        let eh = realigning_eh_frame();
        let sections = EhSections {
            eh_frame: &eh,
            eh_frame_svma: 0x2000,
            eh_frame_hdr: None,
            text_svma: 0x1000,
        };
        // Stack copy from 0x7000: at rbp (0x7040) the caller's rbp, at
        // rbp − 8 the CFA (0x7100), at CFA − 8 the return address.
        let mut stack = vec![0u8; 0x200];
        fn put(stack: &mut [u8], addr: u64, v: u64) {
            let o = (addr - 0x7000) as usize;
            stack[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        put(&mut stack, 0x7040, 0xcafe0);
        put(&mut stack, 0x7038, 0x7100);
        put(&mut stack, 0x70f8, 0x55_5555_1234);
        let regs = Regs {
            ip: 0x40_1050, // SVMA 0x1050 with a bias of 0x40_0000
            sp: 0x7000,
            bp: 0x7040,
        };
        let got = step(
            &sections,
            0x40_0000,
            &regs,
            false,
            &mut stack_reader(0x7000, &stack),
        )
        .unwrap();
        assert_eq!(
            got,
            Step::Caller(Regs {
                ip: 0x55_5555_1234,
                sp: 0x7100,
                bp: 0xcafe0
            })
        );
        // Before the realignment: the CIE's plain rule.
        put(&mut stack, 0x7000, 0x99);
        let entry = Regs {
            ip: 0x40_1000,
            ..regs
        };
        let got = step(
            &sections,
            0x40_0000,
            &entry,
            true,
            &mut stack_reader(0x7000, &stack),
        )
        .unwrap();
        assert_eq!(
            got,
            Step::Caller(Regs {
                ip: 0x99,
                sp: 0x7008,
                bp: 0x7040
            })
        );
    }

    #[test]
    fn what_the_copy_lacks_is_an_error_not_a_guess() {
        let eh = realigning_eh_frame();
        let sections = EhSections {
            eh_frame: &eh,
            eh_frame_svma: 0x2000,
            eh_frame_hdr: None,
            text_svma: 0x1000,
        };
        let regs = Regs {
            ip: 0x1050,
            sp: 0x7000,
            bp: 0x9000,
        };
        let stack = [0u8; 64];
        let mut read = stack_reader(0x7000, &stack);
        assert_eq!(
            step(&sections, 0, &regs, false, &mut read),
            Err(StepError::Memory(0x8ff8))
        );
        assert_eq!(
            step(&sections, 0, &Regs { ip: 0x5000, ..regs }, false, &mut read),
            Err(StepError::NoCfi(0x5000))
        );
        for garbage in [&[][..], &[0xff; 40][..]] {
            let s = EhSections {
                eh_frame: garbage,
                ..sections
            };
            assert!(step(&s, 0, &regs, false, &mut read).is_err());
        }
    }
}
