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

/// At an opening quote: the string's content range and the index after it.
/// Escapes → fallback (the general parser unescapes).
#[inline]
fn string(sl: &[u8], i: usize) -> Step<(usize, usize, usize)> {
    if sl.get(i) != Some(&b'"') {
        return Err(());
    }
    match memchr::memchr2(b'"', b'\\', &sl[i + 1..]) {
        Some(k) if sl[i + 1 + k] == b'"' => Ok(Some((i + 1, i + 1 + k, i + 2 + k))),
        Some(_) => Err(()),
        None => Ok(None),
    }
}

/// Skips a string at `i` (an opening quote), escapes included.
#[inline]
fn skip_string(sl: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    loop {
        let k = memchr::memchr2(b'"', b'\\', sl.get(j..)?)?;
        if sl[j + k] == b'"' {
            return Some(j + k + 1);
        }
        j += k + 2;
    }
}

/// Skips any JSON value at `i` structurally.
fn skip_value(sl: &[u8], i: usize) -> Step<usize> {
    match sl.get(i) {
        None => Ok(None),
        Some(b'"') => Ok(skip_string(sl, i)),
        Some(b'{' | b'[') => {
            let mut depth = 0usize;
            let mut j = i;
            while j < sl.len() {
                match sl[j] {
                    b'"' => match skip_string(sl, j) {
                        Some(k) => {
                            j = k;
                            continue;
                        }
                        None => return Ok(None),
                    },
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(Some(j + 1));
                        }
                    }
                    _ => {}
                }
                j += 1;
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
    while j < sl.len() && sl[j].is_ascii_digit() {
        int = int
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(sl[j] - b'0')))
            .ok_or(())?;
        j += 1;
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

/// The `args` object at `i`, reading only the keys whyslow uses.
fn args(sl: &[u8], mut i: usize) -> Step<(Args<'_>, usize)> {
    let mut a = Args::default();
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
            return Ok(Some((a, i + 1)));
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
            b'}' => return Ok(Some((a, i + 1))),
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
                    let (a, after) = step!(args(sl, i));
                    e.args = Some(a);
                    i = after;
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
