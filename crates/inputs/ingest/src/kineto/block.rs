//! Byte classes of a 16-byte block as bit masks (bit k = byte k), the
//! structural-index idea of simdjson (Langdale & Lemire 2019) at the size the
//! fast path needs: a trace event's keys and values are mostly shorter than
//! 16 bytes, so one block usually answers where a byte-at-a-time loop took
//! several steps. SSE2 on x86-64 (always present there); plain code elsewhere.

/// Bytes per block.
pub(crate) const WIDTH: usize = 16;

/// Masks of one block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Block {
    /// `"`.
    pub quote: u32,
    /// `\`.
    pub escape: u32,
    /// `{` or `[`.
    pub open: u32,
    /// `}` or `]`.
    pub close: u32,
    /// Bytes that end a bare scalar (a number or literal): whitespace and
    /// control bytes, `,`, `:`, `"`, brackets, and non-ASCII bytes (which
    /// no valid scalar holds, so they end it too and the caller decides).
    pub scalar_end: u32,
}

/// The 16 bytes at `sl[at..]`, padded with zeros past the end of `sl` (zero
/// is in no class but `scalar_end`, whose callers check the position).
#[inline]
fn load(sl: &[u8], at: usize) -> [u8; WIDTH] {
    match sl.get(at..at + WIDTH) {
        Some(b) => b.try_into().unwrap_or([0; WIDTH]),
        None => {
            let mut b = [0; WIDTH];
            let rest = sl.get(at..).unwrap_or(&[]);
            b[..rest.len()].copy_from_slice(rest);
            b
        }
    }
}

/// The masks of the block at `sl[at..]` (zero-padded past the end).
#[inline]
pub(crate) fn block(sl: &[u8], at: usize) -> Block {
    classify(&load(sl, at))
}

/// Only the `"` | `\` mask (strings need no more).
#[inline]
pub(crate) fn quote_or_escape(sl: &[u8], at: usize) -> u32 {
    let b = load(sl, at);
    quote_or_escape_of(&b)
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn quote_or_escape_of(b: &[u8; WIDTH]) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of the x86-64 baseline; `b` is 16 readable bytes
    // and the load is unaligned.
    unsafe {
        let v = _mm_loadu_si128(b.as_ptr().cast());
        let q = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let e = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        _mm_movemask_epi8(_mm_or_si128(q, e)) as u32
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn quote_or_escape_of(b: &[u8; WIDTH]) -> u32 {
    let c = portable(b);
    c.quote | c.escape
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn classify(b: &[u8; WIDTH]) -> Block {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of the x86-64 baseline; `b` is 16 readable bytes
    // and the load is unaligned.
    unsafe {
        let v = _mm_loadu_si128(b.as_ptr().cast());
        let eq = |c: u8| _mm_cmpeq_epi8(v, _mm_set1_epi8(c as i8));
        // Or-ing 0x20 folds `[`/`]` onto `{`/`}`, and nothing else onto them.
        let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
        let open = _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'{' as i8));
        let close = _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'}' as i8));
        let quote = eq(b'"');
        // Signed compare: bytes <= 0x20 and every byte >= 0x80 (negative).
        let low_or_high = _mm_cmplt_epi8(v, _mm_set1_epi8(0x21));
        let end = _mm_or_si128(
            _mm_or_si128(low_or_high, _mm_or_si128(eq(b','), eq(b':'))),
            _mm_or_si128(quote, _mm_or_si128(open, close)),
        );
        let mask = |x| _mm_movemask_epi8(x) as u32;
        Block {
            quote: mask(quote),
            escape: mask(eq(b'\\')),
            open: mask(open),
            close: mask(close),
            scalar_end: mask(end),
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn classify(b: &[u8; WIDTH]) -> Block {
    portable(b)
}

/// The reference classifier: plain code, used where SSE2 is absent and by
/// the tests as the definition.
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn portable(b: &[u8; WIDTH]) -> Block {
    let mut out = Block::default();
    for (k, &c) in b.iter().enumerate() {
        let bit = 1u32 << k;
        match c {
            b'"' => out.quote |= bit,
            b'\\' => out.escape |= bit,
            b'{' | b'[' => out.open |= bit,
            b'}' | b']' => out.close |= bit,
            _ => {}
        }
        if c <= 0x20 || c >= 0x80 || matches!(c, b',' | b':' | b'"' | b'{' | b'[' | b'}' | b']') {
            out.scalar_end |= bit;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_value_is_classified_as_the_reference_does() {
        // Each byte value at each position, among varied neighbours.
        for c in 0..=255u8 {
            for k in 0..WIDTH {
                let mut b = [b'a'; WIDTH];
                b[k] = c;
                b[(k + 5) % WIDTH] = c.wrapping_mul(31).wrapping_add(k as u8);
                assert_eq!(classify(&b), portable(&b), "byte {c:#x} at {k}");
                let r = portable(&b);
                assert_eq!(quote_or_escape_of(&b), r.quote | r.escape);
            }
        }
    }

    #[test]
    fn blocks_past_the_end_are_zero_padded() {
        let sl = b"ab\"c";
        let b = block(sl, 1);
        assert_eq!(b.quote, 0b10);
        // The padding's zeros end a scalar (positions the caller bounds).
        assert_eq!(b.scalar_end & 0b1111, 0b1010);
        assert_eq!(block(sl, 9), block(b"", 0));
    }
}
