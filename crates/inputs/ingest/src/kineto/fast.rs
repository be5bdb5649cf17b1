//! The fast path for one trace event: a hand-written scanner for the common
//! shape of Kineto events (unescaped keys and strings, plain numbers), which
//! skips unneeded values without parsing them. Anything unusual returns
//! [`Fast::Fallback`] and the event goes through serde_json instead, so the
//! fast path never decides what is valid JSON, only what is easy.
//!
//! It also reads `ts`/`dur` decimals exactly: `1712195495406752.8` µs is
//! `1712195495406752800` ns, with no f64 rounding.

use super::raw::{Args, Bytes, Num, RawEvent};

/// Result of the fast path.
pub(crate) enum Fast<T> {
    /// Parsed; the event took this many bytes.
    Done(T, usize),
    /// The window ends inside the event: read more and retry.
    Incomplete,
    /// Not the easy shape: use the general parser.
    Fallback,
}

/// `?` for the scanner: `None` = out of bytes, `Err` = fallback.
type Step<T> = Result<Option<T>, ()>;

macro_rules! step {
    ($e:expr) => {
        match $e {
            Ok(Some(v)) => v,
            Ok(None) => return Fast::Incomplete,
            Err(()) => return Fast::Fallback,
        }
    };
}

#[inline]
fn ws(sl: &[u8], mut i: usize) -> Option<usize> {
    while i < sl.len() {
        match sl[i] {
            b' ' | b'\n' | b'\r' | b'\t' => i += 1,
            _ => return Some(i),
        }
    }
    None
}

/// Bytes searched eight at a time before handing a string to `memchr`: most
/// keys and values in a trace event are shorter, and a SIMD search costs more
/// than it saves on them.
const SHORT: usize = 32;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The first `"` or `\\` at or after `from`: eight bytes per step in a
/// register for short strings, `memchr` for long ones.
#[inline]
fn quote_or_escape(sl: &[u8], from: usize) -> Option<usize> {
    let mut j = from;
    while let Some(chunk) = sl.get(j..j + 8) {
        let v = u64::from_le_bytes(chunk.try_into().ok()?);
        let (q, e) = (v ^ (ONES * u64::from(b'"')), v ^ (ONES * u64::from(b'\\')));
        // A zero byte in `q` or `e` is a match; the lowest flagged byte is
        // exact (borrows only flag bytes above a true zero).
        let hits = zero_bytes(q) | zero_bytes(e);
        if hits != 0 {
            return Some(j + (hits.trailing_zeros() / 8) as usize);
        }
        j += 8;
        if j - from >= SHORT {
            return memchr::memchr2(b'"', b'\\', &sl[j..]).map(|k| j + k);
        }
    }
    sl.get(j..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| j + k)
}

/// At an opening quote: the string's content range and the index after it.
/// Escapes → fallback (the general parser unescapes).
#[inline]
fn string(sl: &[u8], i: usize) -> Step<(usize, usize, usize)> {
    if sl.get(i) != Some(&b'"') {
        return Err(());
    }
    match quote_or_escape(sl, i + 1) {
        Some(k) if sl[k] == b'"' => Ok(Some((i + 1, k, k + 1))),
        Some(_) => Err(()),
        None => Ok(None),
    }
}

/// Skips a string at `i` (an opening quote), escapes included.
#[inline]
fn skip_string(sl: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = quote_or_escape(sl, j)?;
        if sl[k] == b'"' {
            return Some(k + 1);
        }
        j = k + 2;
    }
}

/// Whether any byte of `v` is zero, as the high bit of the lowest such byte
/// (bytes above it may be flagged falsely; the lowest is exact).
#[inline]
fn zero_bytes(v: u64) -> u64 {
    v.wrapping_sub(ONES) & !v & HIGHS
}

/// The first of `"`, `{`, `}`, `[`, `]` at or after `from`, eight bytes per
/// step: or-ing 0x20 folds `[`/`]` onto `{`/`}` (and nothing else onto them).
#[inline]
fn structural(sl: &[u8], from: usize) -> Option<usize> {
    let mut j = from;
    while let Some(chunk) = sl.get(j..j + 8) {
        let v = u64::from_le_bytes(chunk.try_into().ok()?);
        let folded = v | (ONES * 0x20);
        let hits = zero_bytes(v ^ (ONES * u64::from(b'"')))
            | zero_bytes(folded ^ (ONES * u64::from(b'{')))
            | zero_bytes(folded ^ (ONES * u64::from(b'}')));
        if hits != 0 {
            return Some(j + (hits.trailing_zeros() / 8) as usize);
        }
        j += 8;
    }
    sl.get(j..)?
        .iter()
        .position(|c| matches!(c, b'"' | b'{' | b'}' | b'[' | b']'))
        .map(|k| j + k)
}

/// Skips any JSON value at `i` structurally.
fn skip_value(sl: &[u8], i: usize) -> Step<usize> {
    match sl.get(i) {
        None => Ok(None),
        Some(b'"') => Ok(skip_string(sl, i)),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while let Some(k) = structural(sl, j) {
                match sl[k] {
                    b'"' => match skip_string(sl, k) {
                        Some(after) => {
                            j = after;
                            continue;
                        }
                        None => return Ok(None),
                    },
                    b'{' | b'[' => depth += 1,
                    _ => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(Some(k + 1));
                        }
                    }
                }
                j = k + 1;
            }
            Ok(None)
        }
        Some(b'}' | b']' | b',' | b':') => Err(()),
        Some(_) => {
            let mut j = i;
            while j < sl.len() {
                match sl[j] {
                    b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t' => return Ok(Some(j)),
                    b'"' | b'{' | b'[' | b':' => return Err(()),
                    _ => j += 1,
                }
            }
            Ok(None)
        }
    }
}

/// The value of the eight ASCII digits at `sl[i..i + 8]`, if they all are
/// digits (the SWAR method of simdjson, Lemire 2019).
#[inline]
fn eight_digits(sl: &[u8], i: usize) -> Option<u64> {
    let bytes: [u8; 8] = sl.get(i..i + 8)?.try_into().ok()?;
    let v = u64::from_le_bytes(bytes);
    // Every byte in 0x30..=0x39: high nibble 3, and adding 6 keeps it 3.
    let all_digits = (v & 0xF0F0_F0F0_F0F0_F0F0)
        | ((v.wrapping_add(0x0606_0606_0606_0606) & 0xF0F0_F0F0_F0F0_F0F0) >> 4)
        == 0x3333_3333_3333_3333;
    if !all_digits {
        return None;
    }
    let mut v = v - 0x3030_3030_3030_3030;
    // Pairs, then quads, then the whole: the first digit is the lowest byte.
    v = (v * 10) + (v >> 8);
    v = (v & 0x0000_00FF_0000_00FF)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32)))
        >> 32;
    Some(v)
}

/// A plain number (`-?digits(.digits)?`, no exponent): the integer, or for a
/// decimal the value × 1000 rounded half away from zero (µs → ns), exactly.
fn number(sl: &[u8], i: usize) -> Step<(Num, usize)> {
    let mut j = i;
    let neg = sl.get(j) == Some(&b'-');
    if neg {
        j += 1;
    }
    let start = j;
    let mut int: u64 = 0;
    // Eight digits at a time while they last (timestamps have 16).
    while let Some(v) = eight_digits(sl, j) {
        int = int.wrapping_mul(100_000_000).wrapping_add(v);
        j += 8;
        if j - start > 16 {
            break;
        }
    }
    while let Some(&c) = sl.get(j) {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            break;
        }
        int = int.wrapping_mul(10).wrapping_add(u64::from(d));
        j += 1;
    }
    // 19 digits always fit in a u64; longer (or leading-zero-padded) numbers
    // go to the general parser, which decides exactly.
    if j - start > 19 {
        return Err(());
    }
    if j == sl.len() {
        return Ok(None);
    }
    if j == start {
        return Err(());
    }
    match sl[j] {
        b'.' => {
            j += 1;
            let fs = j;
            let mut milli: u64 = 0; // first three fractional digits
            let mut round_up = false;
            while j < sl.len() && sl[j].is_ascii_digit() {
                let d = u64::from(sl[j] - b'0');
                match j - fs {
                    0..=2 => milli = milli * 10 + d,
                    3 => round_up = d >= 5,
                    _ => {}
                }
                j += 1;
            }
            if j == sl.len() {
                return Ok(None);
            }
            if j == fs || matches!(sl[j], b'e' | b'E') {
                return Err(());
            }
            for _ in (j - fs).min(3)..3 {
                milli *= 10;
            }
            let ns = int
                .checked_mul(1000)
                .and_then(|v| v.checked_add(milli + u64::from(round_up)))
                .and_then(|v| i64::try_from(v).ok())
                .ok_or(())?;
            Ok(Some((Num::Ns(if neg { -ns } else { ns }), j)))
        }
        b'e' | b'E' => Err(()),
        _ => {
            let v = if neg {
                Num::I(0i64.checked_sub_unsigned(int).ok_or(())?)
            } else {
                Num::U(int)
            };
            Ok(Some((v, j)))
        }
    }
}

/// The `args` object at `i`, reading only the keys whyslow uses into `a`
/// (filled in place: `Args` is a few hundred bytes, and moving it per event
/// showed in profiles). Returns the index after the object.
fn args<'a>(sl: &'a [u8], mut i: usize, a: &mut Args<'a>) -> Step<usize> {
    if sl.get(i) != Some(&b'{') {
        return Err(());
    }
    i += 1;
    let mut first = true;
    loop {
        i = match ws(sl, i) {
            Some(i) => i,
            None => return Ok(None),
        };
        if sl[i] == b'}' && first {
            return Ok(Some(i + 1));
        }
        first = false;
        let Some((ka, kb, after)) = string(sl, i)? else {
            return Ok(None);
        };
        let Some(j) = ws(sl, after) else {
            return Ok(None);
        };
        if sl[j] != b':' {
            return Err(());
        }
        let Some(j) = ws(sl, j + 1) else {
            return Ok(None);
        };
        i = j;
        let num = |i: usize| -> Step<(Num, usize)> {
            if sl.get(i) == Some(&b'"') {
                return Err(());
            }
            number(sl, i)
        };
        let text = |i: usize| -> Step<(Bytes<'_>, usize)> {
            Ok(string(sl, i)?
                .map(|(a, b, after)| (Bytes(std::borrow::Cow::Borrowed(&sl[a..b])), after)))
        };
        macro_rules! get {
            ($f:expr) => {
                match $f? {
                    Some(v) => v,
                    None => return Ok(None),
                }
            };
        }
        match &sl[ka..kb] {
            b"est. achieved occupancy %" => (a.occupancy, i) = get!(num(i)),
            b"memory bandwidth (GB/s)" => (a.bandwidth, i) = get!(num(i)),
            b"Python id" => (a.py_id, i) = get!(num(i)),
            b"Python parent id" => (a.py_parent, i) = get!(num(i)),
            b"In msg nelems" => (a.in_nelems, i) = get!(num(i)),
            b"Out msg nelems" => (a.out_nelems, i) = get!(num(i)),
            b"Group size" => (a.group_size, i) = get!(num(i)),
            b"device" => (a.device, i) = get!(num(i)),
            b"stream" => (a.stream, i) = get!(num(i)),
            b"Collective name" => (a.collective, i) = get!(text(i)),
            b"dtype" => (a.dtype, i) = get!(text(i)),
            b"Process Group Name" => (a.pg_name, i) = get!(text(i)),
            b"Process Group Ranks" => {
                let (v, after) = get!(text(i));
                if v.as_slice()
                    .iter()
                    .any(|b| matches!(b, b'-' | b'.' | b'e' | b'E'))
                {
                    return Err(());
                }
                a.pg_ranks = super::raw::Ranks(super::raw::parse_rank_list(v.as_slice()));
                i = after;
            }
            _ => i = get!(skip_value(sl, i)),
        }
        i = match ws(sl, i) {
            Some(i) => i,
            None => return Ok(None),
        };
        match sl[i] {
            b',' => i += 1,
            b'}' => return Ok(Some(i + 1)),
            _ => return Err(()),
        }
    }
}

/// Parses the event at the start of `sl` (after whitespace) into `e`, which
/// must be default on entry.
pub(crate) fn event<'a>(sl: &'a [u8], e: &mut RawEvent<'a>) -> Fast<()> {
    let mut i = step!(Ok::<_, ()>(ws(sl, 0)));
    if sl[i] != b'{' {
        return Fast::Fallback;
    }
    i += 1;
    let (mut has_cat, mut has_name) = (false, false);
    let mut first = true;
    loop {
        i = step!(Ok::<_, ()>(ws(sl, i)));
        if sl[i] == b'}' && first {
            return Fast::Done((), i + 1);
        }
        first = false;
        let (ka, kb, after) = step!(string(sl, i));
        i = step!(Ok::<_, ()>(ws(sl, after)));
        if sl[i] != b':' {
            return Fast::Fallback;
        }
        i = step!(Ok::<_, ()>(ws(sl, i + 1)));
        let key = &sl[ka..kb];
        match key {
            b"ph" | b"cat" | b"name" => {
                let (a, b, after) = step!(string(sl, i));
                let v = Bytes(std::borrow::Cow::Borrowed(&sl[a..b]));
                match key {
                    b"ph" => e.ph = v,
                    b"cat" => {
                        e.cat = v;
                        has_cat = true;
                    }
                    _ => {
                        e.name = v;
                        has_name = true;
                    }
                }
                i = after;
            }
            b"pid" | b"tid" | b"ts" | b"dur" => {
                let (n, after) = step!(number(sl, i));
                match key {
                    b"pid" | b"tid" if matches!(n, Num::Ns(_)) => return Fast::Fallback,
                    b"pid" => e.pid = n,
                    b"tid" => e.tid = n,
                    b"ts" => e.ts = n,
                    _ => e.dur = n,
                }
                i = after;
            }
            b"args" => {
                let cat = has_cat.then(|| e.cat.as_slice());
                let name = has_name.then(|| e.name.as_slice());
                if super::raw::args_needed(cat, name) {
                    let a = e.args.insert(Args::default());
                    i = step!(args(sl, i, a));
                } else {
                    i = step!(skip_value(sl, i));
                }
            }
            _ => i = step!(skip_value(sl, i)),
        }
        i = step!(Ok::<_, ()>(ws(sl, i)));
        match sl[i] {
            b',' => i += 1,
            b'}' => return Fast::Done((), i + 1),
            _ => return Fast::Fallback,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (no dependency for one test).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            self.0 >> 11
        }
        fn digits(&mut self, n: usize) -> String {
            (0..n)
                .map(|_| char::from(b'0' + (self.next() % 10) as u8))
                .collect()
        }
    }

    #[test]
    fn quote_or_escape_finds_the_first() {
        let mut g = Lcg(7);
        for _ in 0..20_000 {
            let len = (g.next() % 80) as usize;
            let text: Vec<u8> = (0..len)
                .map(|_| match g.next() % 40 {
                    0 => b'"',
                    1 => b'\\',
                    2 => 0x80 | (g.next() as u8),
                    3 => 0xdc, // '\\' with the high bit set
                    _ => b'a' + (g.next() % 26) as u8,
                })
                .collect();
            let from = (g.next() as usize) % (len + 1);
            let want = text[from..]
                .iter()
                .position(|&c| c == b'"' || c == b'\\')
                .map(|k| from + k);
            assert_eq!(quote_or_escape(&text, from), want, "{text:?} from {from}");
        }
    }

    #[test]
    fn structural_finds_the_first() {
        let mut g = Lcg(11);
        let pick = b"\"{}[]ab1,:; \x5b\x7b\xdb\xfb\xdd\xfd\x02";
        for _ in 0..20_000 {
            let len = (g.next() % 80) as usize;
            let text: Vec<u8> = (0..len)
                .map(|_| match g.next() % 6 {
                    0 => pick[(g.next() as usize) % pick.len()],
                    _ => b'a' + (g.next() % 26) as u8,
                })
                .collect();
            let from = (g.next() as usize) % (len + 1);
            let want = text[from..]
                .iter()
                .position(|c| matches!(c, b'"' | b'{' | b'}' | b'[' | b']'))
                .map(|k| from + k);
            assert_eq!(structural(&text, from), want, "{text:?} from {from}");
        }
    }

    #[test]
    fn eight_digits_reads_every_position() {
        for s in ["00000000", "12345678", "99999999", "10000001", "90000009"] {
            assert_eq!(eight_digits(s.as_bytes(), 0), s.parse().ok(), "{s}");
        }
        for bad in [
            "1234567", "1234567a", "123:5678", "/2345678", " 2345678", "1234.678",
        ] {
            assert_eq!(eight_digits(bad.as_bytes(), 0), None, "{bad}");
        }
    }

    /// The fast number reader agrees with serde_json on integers and with
    /// the exact decimal µs → ns conversion on decimals, for every length up
    /// to where it hands over to the general parser (issue 32: keep the
    /// equivalence with the serde path).
    #[test]
    fn numbers_match_serde_for_every_length() {
        let mut g = Lcg(0x5eed);
        for round in 0..20_000 {
            let int_len = 1 + (g.next() % 21) as usize;
            let frac_len = (g.next() % 7) as usize;
            let neg = g.next().is_multiple_of(4);
            let mut text = String::new();
            if neg {
                text.push('-');
            }
            let int = g.digits(int_len);
            // JSON has no leading zeros; keep a lone 0.
            let int = match int.trim_start_matches('0') {
                "" => "0".to_string(),
                t => t.to_string(),
            };
            text.push_str(&int);
            if frac_len > 0 {
                text.push('.');
                text.push_str(&g.digits(frac_len));
            }
            text.push(',');
            let got = number(text.as_bytes(), 0);
            let want: serde_json::Value = serde_json::from_str(&text[..text.len() - 1]).unwrap();
            match got {
                Ok(Some((Num::U(v), end))) => {
                    assert_eq!(end, text.len() - 1);
                    assert_eq!(want.as_u64(), Some(v), "{text}");
                }
                // serde_json reads `-0` as the float -0.0.
                Ok(Some((Num::I(v), _))) => assert_eq!(want.as_f64(), Some(v as f64), "{text}"),
                Ok(Some((Num::Ns(ns), _))) => {
                    // Exact: the decimal's first three fractional digits,
                    // rounded half away from zero on the fourth.
                    let (i, f) = text[..text.len() - 1]
                        .trim_start_matches('-')
                        .split_once('.')
                        .unwrap();
                    let mut f3: String = f.chars().take(3).collect();
                    while f3.len() < 3 {
                        f3.push('0');
                    }
                    let up = f.as_bytes().get(3).is_some_and(|&d| d >= b'5');
                    let abs = i.parse::<i128>().unwrap() * 1000
                        + f3.parse::<i128>().unwrap()
                        + i128::from(up);
                    let exact = if neg { -abs } else { abs };
                    assert_eq!(i128::from(ns), exact, "{text}");
                }
                Err(()) => {
                    // Handed over: only numbers too long for the fast path.
                    assert!(int.len() > 15, "{text} round {round}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }
}
