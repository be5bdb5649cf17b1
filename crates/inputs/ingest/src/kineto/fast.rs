//! The fast path for one trace event: a hand-written scanner for the common
//! shape of Kineto events (unescaped keys and strings, plain numbers), which
//! skips unneeded values without parsing them. Anything unusual returns
//! [`Fast::Fallback`] and the event goes through serde_json instead, so the
//! fast path never decides what is valid JSON, only what is easy.
//!
//! It also reads `ts`/`dur` decimals exactly: `1712195495406752.8` µs is
//! `1712195495406752800` ns, with no f64 rounding.

use super::block;
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

/// Bytes searched a block at a time before handing a string to `memchr`:
/// most keys and values in a trace event are shorter, and the longer search
/// costs more than it saves on them.
const SHORT: usize = 48;

/// The first `"` or `\\` at or after `from`: 16 bytes per step for short
/// strings, `memchr` for long ones.
#[inline]
fn quote_or_escape(sl: &[u8], from: usize) -> Option<usize> {
    let mut j = from;
    while j < sl.len() {
        let hits = block::quote_or_escape(sl, j);
        if hits != 0 {
            // Padding past the end is zero, never a hit: the hit is in `sl`.
            return Some(j + hits.trailing_zeros() as usize);
        }
        j += block::WIDTH;
        if j - from >= SHORT && j < sl.len() {
            return memchr::memchr2(b'"', b'\\', &sl[j..]).map(|k| j + k);
        }
    }
    None
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

/// Skips the object or array opening at `i`, a block at a time: within a
/// block, the quotes, escapes and brackets are visited as mask bits, so a
/// value like `[[512,512],[],[]]` costs two blocks, not a step per bracket.
/// `None`: the window ends inside it.
fn skip_container(sl: &[u8], i: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut at = i;
    while at < sl.len() {
        let b = block::block(sl, at);
        // Bits below `off` are consumed; `off` passes 16 when an escape's
        // next byte lies in the following block.
        let mut off = 0u32;
        while (off as usize) < block::WIDTH {
            let pending = if in_string {
                b.quote | b.escape
            } else {
                b.quote | b.open | b.close
            } & (u32::MAX << off);
            if pending == 0 {
                break;
            }
            let p = pending.trailing_zeros();
            let bit = 1u32 << p;
            off = p + 1;
            if b.quote & bit != 0 {
                in_string = !in_string;
            } else if in_string {
                off = p + 2; // an escape: its next byte is not a quote
            } else if b.open & bit != 0 {
                depth += 1;
            } else {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(at + p as usize + 1);
                }
            }
        }
        at += (off as usize).max(block::WIDTH);
    }
    None
}

/// Skips any JSON value at `i` structurally.
fn skip_value(sl: &[u8], i: usize) -> Step<usize> {
    match sl.get(i) {
        None => Ok(None),
        Some(b'"') => Ok(skip_string(sl, i)),
        Some(b'{' | b'[') => Ok(skip_container(sl, i)),
        Some(b'}' | b']' | b',' | b':') => Err(()),
        Some(_) => {
            let mut at = i;
            while at < sl.len() {
                let ends = block::block(sl, at).scalar_end;
                if ends != 0 {
                    let j = at + ends.trailing_zeros() as usize;
                    return match sl.get(j) {
                        // Padding: the window ends inside the scalar.
                        None => Ok(None),
                        Some(b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') => Ok(Some(j)),
                        // Not a plain scalar: the general parser decides.
                        Some(_) => Err(()),
                    };
                }
                at += block::WIDTH;
            }
            Ok(None)
        }
    }
}

/// The value of eight digit values (0–9, one per byte, the first digit in
/// the lowest byte): the SWAR method of simdjson (Lemire 2019).
#[inline]
fn combine8(mut v: u64) -> u64 {
    // Pairs, then quads, then the whole.
    v = (v * 10) + (v >> 8);
    (v & 0x0000_00FF_0000_00FF)
        .wrapping_mul(100 + (1_000_000 << 32))
        .wrapping_add(((v >> 16) & 0x0000_00FF_0000_00FF).wrapping_mul(1 + (10_000 << 32)))
        >> 32
}

/// The value of the eight ASCII digits at `sl[i..i + 8]`, if they all are
/// digits.
#[inline]
fn eight_digits(sl: &[u8], i: usize) -> Option<u64> {
    let bytes: [u8; 8] = sl.get(i..i + 8)?.try_into().ok()?;
    let v = u64::from_le_bytes(bytes);
    // Every byte in 0x30..=0x39: high nibble 3, and adding 6 keeps it 3.
    let all_digits = (v & 0xF0F0_F0F0_F0F0_F0F0)
        | ((v.wrapping_add(0x0606_0606_0606_0606) & 0xF0F0_F0F0_F0F0_F0F0) >> 4)
        == 0x3333_3333_3333_3333;
    all_digits.then(|| combine8(v - 0x3030_3030_3030_3030))
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
    // Eight digits at a time while they last (timestamps have 13–16), then
    // a byte at a time: most numbers are short, and a byte loop beats the
    // longer dependency chain of a partial eight-byte read on them.
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
            let digit = |k: usize| sl.get(k).map(|c| c.wrapping_sub(b'0')).filter(|&d| d <= 9);
            // Kineto writes µs with three decimals (ns): read those at once.
            match (digit(fs), digit(fs + 1), digit(fs + 2), sl.get(fs + 3)) {
                (Some(a), Some(b), Some(c), Some(d)) if !d.is_ascii_digit() => {
                    milli = u64::from(a) * 100 + u64::from(b) * 10 + u64::from(c);
                    j = fs + 3;
                }
                _ => {
                    while j < sl.len() && sl[j].is_ascii_digit() {
                        let d = u64::from(sl[j] - b'0');
                        match j - fs {
                            0..=2 => milli = milli * 10 + d,
                            3 => round_up = d >= 5,
                            _ => {}
                        }
                        j += 1;
                    }
                    for _ in (j - fs).min(3)..3 {
                        milli *= 10;
                    }
                }
            }
            if j == sl.len() {
                return Ok(None);
            }
            if j == fs || matches!(sl[j], b'e' | b'E') {
                return Err(());
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

/// The `args` keys the fast path reads; the rest are skipped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ArgKey {
    Occupancy,
    Bandwidth,
    PyId,
    PyParent,
    InNelems,
    OutNelems,
    GroupSize,
    Device,
    Stream,
    Collective,
    Dtype,
    PgName,
    PgRanks,
    Skip,
}

impl ArgKey {
    fn of(key: &[u8]) -> ArgKey {
        match key {
            b"est. achieved occupancy %" => ArgKey::Occupancy,
            b"memory bandwidth (GB/s)" => ArgKey::Bandwidth,
            b"Python id" => ArgKey::PyId,
            b"Python parent id" => ArgKey::PyParent,
            b"In msg nelems" => ArgKey::InNelems,
            b"Out msg nelems" => ArgKey::OutNelems,
            b"Group size" => ArgKey::GroupSize,
            b"device" => ArgKey::Device,
            b"stream" => ArgKey::Stream,
            b"Collective name" => ArgKey::Collective,
            b"dtype" => ArgKey::Dtype,
            b"Process Group Name" => ArgKey::PgName,
            b"Process Group Ranks" => ArgKey::PgRanks,
            _ => ArgKey::Skip,
        }
    }
}

/// The common `args` keys with their colon, as Kineto writes them, matched
/// by their first letter and a compare of constant length (no search for
/// the closing quote, whose latency sat on each key's critical path): the
/// key and the index after the colon.
#[inline]
fn known_arg(sl: &[u8], i: usize) -> Option<(ArgKey, usize)> {
    use ArgKey::*;
    let rest = sl.get(i..)?;
    macro_rules! first_of {
        ($($pat:literal => $key:expr),* $(,)?) => {{
            $(
                if rest.starts_with($pat) {
                    return Some(($key, i + $pat.len()));
                }
            )*
            None
        }};
    }
    // Near the window's end the general path asks for more.
    if rest.len() < 32 {
        return None;
    }
    match rest[1] {
        b'E' => first_of!(b"\"Ev Idx\":" => Skip, b"\"External id\":" => Skip),
        b'P' => first_of!(
            b"\"Python id\":" => PyId,
            b"\"Python parent id\":" => PyParent,
            b"\"Process Group Name\":" => PgName,
            b"\"Process Group Ranks\":" => PgRanks,
            b"\"Profiler Event Index\":" => Skip,
        ),
        b'R' => first_of!(b"\"Record function id\":" => Skip),
        b'I' => first_of!(
            b"\"Input Dims\":" => Skip,
            b"\"Input type\":" => Skip,
            b"\"Input Strides\":" => Skip,
            b"\"In msg nelems\":" => InNelems,
        ),
        b'C' => first_of!(
            b"\"Concrete Inputs\":" => Skip,
            b"\"Collective name\":" => Collective,
            b"\"Call stack\":" => Skip,
        ),
        b'c' => {
            first_of!(b"\"correlation\":" => Skip, b"\"cbid\":" => Skip, b"\"context\":" => Skip)
        }
        b'd' => first_of!(b"\"device\":" => Device, b"\"dtype\":" => Dtype),
        b's' => first_of!(b"\"stream\":" => Stream, b"\"shared memory\":" => Skip),
        b'T' => first_of!(b"\"Trace name\":" => Skip, b"\"Trace iteration\":" => Skip),
        b'M' => first_of!(b"\"Module Hierarchy\":" => Skip),
        b'F' => first_of!(b"\"Fwd thread id\":" => Skip),
        b'S' => first_of!(b"\"Sequence number\":" => Skip),
        _ => None,
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
        let key = match known_arg(sl, i) {
            Some((key, after)) => {
                i = after;
                key
            }
            None => {
                let Some((ka, kb, after)) = string(sl, i)? else {
                    return Ok(None);
                };
                let Some(j) = ws(sl, after) else {
                    return Ok(None);
                };
                if sl[j] != b':' {
                    return Err(());
                }
                i = j + 1;
                ArgKey::of(&sl[ka..kb])
            }
        };
        let Some(j) = ws(sl, i) else {
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
        match key {
            ArgKey::Occupancy => (a.occupancy, i) = get!(num(i)),
            ArgKey::Bandwidth => (a.bandwidth, i) = get!(num(i)),
            ArgKey::PyId => (a.py_id, i) = get!(num(i)),
            ArgKey::PyParent => (a.py_parent, i) = get!(num(i)),
            ArgKey::InNelems => (a.in_nelems, i) = get!(num(i)),
            ArgKey::OutNelems => (a.out_nelems, i) = get!(num(i)),
            ArgKey::GroupSize => (a.group_size, i) = get!(num(i)),
            ArgKey::Device => (a.device, i) = get!(num(i)),
            ArgKey::Stream => (a.stream, i) = get!(num(i)),
            ArgKey::Collective => (a.collective, i) = get!(text(i)),
            ArgKey::Dtype => (a.dtype, i) = get!(text(i)),
            ArgKey::PgName => (a.pg_name, i) = get!(text(i)),
            ArgKey::PgRanks => {
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
            ArgKey::Skip => i = get!(skip_value(sl, i)),
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

/// The event keys the fast path reads.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Key {
    Ph,
    Cat,
    Name,
    Pid,
    Tid,
    Ts,
    Dur,
    Args,
    Other,
}

impl Key {
    fn of(key: &[u8]) -> Key {
        match key {
            b"ph" => Key::Ph,
            b"cat" => Key::Cat,
            b"name" => Key::Name,
            b"pid" => Key::Pid,
            b"tid" => Key::Tid,
            b"ts" => Key::Ts,
            b"dur" => Key::Dur,
            b"args" => Key::Args,
            _ => Key::Other,
        }
    }
}

/// `"key":` as the low bytes of a little-endian word, and its length.
const fn pattern(text: &[u8]) -> (u64, usize) {
    let mut w = 0u64;
    let mut k = text.len();
    while k > 0 {
        k -= 1;
        w = (w << 8) | text[k] as u64;
    }
    (w, text.len())
}

/// The keys as Kineto writes them (no space before the colon), tried with
/// one load and a masked compare each instead of searching for the closing
/// quote: the search's latency sat on every event's critical path.
const PATTERNS: [(Key, (u64, usize)); 8] = [
    (Key::Ts, pattern(b"\"ts\":")),
    (Key::Dur, pattern(b"\"dur\":")),
    (Key::Ph, pattern(b"\"ph\":")),
    (Key::Pid, pattern(b"\"pid\":")),
    (Key::Tid, pattern(b"\"tid\":")),
    (Key::Cat, pattern(b"\"cat\":")),
    (Key::Name, pattern(b"\"name\":")),
    (Key::Args, pattern(b"\"args\":")),
];

/// A known key and colon at `sl[i..]`: the key and the index after the colon.
#[inline]
fn known_key(sl: &[u8], i: usize) -> Option<(Key, usize)> {
    let w = u64::from_le_bytes(sl.get(i..i + 8)?.try_into().ok()?);
    PATTERNS.iter().find_map(|&(key, (p, len))| {
        let mask = u64::MAX >> (64 - 8 * len);
        (w & mask == p).then_some((key, i + len))
    })
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
        let key = match known_key(sl, i) {
            Some((key, after)) => {
                i = after;
                key
            }
            None => {
                let (ka, kb, after) = step!(string(sl, i));
                i = step!(Ok::<_, ()>(ws(sl, after)));
                if sl[i] != b':' {
                    return Fast::Fallback;
                }
                i += 1;
                Key::of(&sl[ka..kb])
            }
        };
        i = step!(Ok::<_, ()>(ws(sl, i)));
        match key {
            Key::Ph | Key::Cat | Key::Name => {
                let (a, b, after) = step!(string(sl, i));
                let v = Bytes(std::borrow::Cow::Borrowed(&sl[a..b]));
                match key {
                    Key::Ph => e.ph = v,
                    Key::Cat => {
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
            Key::Pid | Key::Tid | Key::Ts | Key::Dur => {
                let (n, after) = step!(number(sl, i));
                match key {
                    Key::Pid | Key::Tid if matches!(n, Num::Ns(_)) => return Fast::Fallback,
                    Key::Pid => e.pid = n,
                    Key::Tid => e.tid = n,
                    Key::Ts => e.ts = n,
                    _ => e.dur = n,
                }
                i = after;
            }
            Key::Args => {
                let cat = has_cat.then(|| e.cat.as_slice());
                let name = has_name.then(|| e.name.as_slice());
                if super::raw::args_needed(cat, name) {
                    let a = e.args.insert(Args::default());
                    i = step!(args(sl, i, a));
                } else {
                    i = step!(skip_value(sl, i));
                }
            }
            Key::Other => i = step!(skip_value(sl, i)),
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

    /// The reference skip: a byte-at-a-time state machine.
    fn skip_reference(sl: &[u8], i: usize) -> Option<usize> {
        let (mut depth, mut in_string, mut j) = (0usize, false, i);
        while j < sl.len() {
            match (in_string, sl[j]) {
                (true, b'\\') => j += 1,
                (_, b'"') => in_string = !in_string,
                (false, b'{' | b'[') => depth += 1,
                (false, b'}' | b']') => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(j + 1);
                    }
                }
                _ => {}
            }
            j += 1;
        }
        None
    }

    #[test]
    fn containers_are_skipped_as_the_reference_does() {
        let mut g = Lcg(11);
        for round in 0..20_000 {
            // A nested value with strings (escapes, brackets inside them),
            // numbers and non-ASCII bytes, then text after it.
            let mut text = Vec::new();
            let mut stack = Vec::new();
            let open = if g.next().is_multiple_of(2) {
                b'['
            } else {
                b'{'
            };
            text.push(open);
            stack.push(open);
            while !stack.is_empty() {
                match g.next() % 9 {
                    0 | 1 if stack.len() < 6 => {
                        let o = if g.next().is_multiple_of(2) {
                            b'['
                        } else {
                            b'{'
                        };
                        text.push(o);
                        stack.push(o);
                    }
                    2 | 3 => {
                        let o = stack.pop().unwrap();
                        text.push(if o == b'[' { b']' } else { b'}' });
                    }
                    4 | 5 => {
                        text.push(b'"');
                        for _ in 0..g.next() % 40 {
                            match g.next() % 12 {
                                0 => text.extend_from_slice(b"\\\""),
                                1 => text.extend_from_slice(b"\\\\"),
                                2 => text.push(b"[]{}"[(g.next() % 4) as usize]),
                                3 => text.push(0xc3),
                                _ => text.push(b'a' + (g.next() % 26) as u8),
                            }
                        }
                        text.push(b'"');
                    }
                    _ => {
                        let n = 1 + (g.next() % 9) as usize;
                        text.extend_from_slice(g.digits(n).as_bytes());
                    }
                }
                if g.next().is_multiple_of(3) {
                    text.push(b',');
                }
            }
            text.extend_from_slice(b",\"x\":1}");
            let from = 0;
            let want = skip_reference(&text, from);
            assert!(want.is_some());
            assert_eq!(
                skip_container(&text, from),
                want,
                "round {round}: {}",
                String::from_utf8_lossy(&text)
            );
            // Cut anywhere inside: incomplete, never a wrong end.
            let cut = (g.next() as usize) % want.unwrap();
            assert_eq!(
                skip_container(&text[..cut], from),
                None,
                "round {round} cut {cut}"
            );
        }
    }

    #[test]
    fn scalars_end_where_the_reference_says() {
        for (text, want) in [
            (&b"12345,"[..], Ok(Some(5))),
            (b"1234567890123456789012}", Ok(Some(22))),
            (b"true]", Ok(Some(4))),
            (b"null \n", Ok(Some(4))),
            (b"-1.5e3\t", Ok(Some(6))),
            (b"12345", Ok(None)),
            (b"1234567890123456789012", Ok(None)),
            (b"12:", Err(())),
            (b"12\"", Err(())),
            (b"12\xc3,", Err(())),
            (b"12\x01,", Err(())),
        ] {
            assert_eq!(
                skip_value(text, 0),
                want,
                "{}",
                String::from_utf8_lossy(text)
            );
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
            // Eight bytes past the number or not: both readers.
            let padded = format!("{text}12345678");
            let got = number(text.as_bytes(), 0);
            assert_eq!(got, number(padded.as_bytes(), 0), "{text}");
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
