//! Lenient serde types for one Kineto trace event. Every field accepts any
//! JSON type without failing the event: a value of an unexpected type reads
//! as "missing". Strings that whyslow keeps (names) are read as raw bytes so
//! that invalid UTF-8 never fails an event (it is replaced lossily later).

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// A string field as raw bytes, borrowed from the input when it has no escapes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Bytes<'a>(pub Cow<'a, [u8]>);

impl Bytes<'_> {
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.0
    }
}

struct BytesVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for BytesVisitor<'a> {
    type Value = Bytes<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_bytes<E: de::Error>(self, v: &'de [u8]) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Borrowed(v)))
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Owned(v.to_vec())))
    }
    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Owned(v)))
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Borrowed(v.as_bytes())))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Owned(v.as_bytes().to_vec())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Owned(v.into_bytes())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Owned(v.to_string().into_bytes())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Owned(v.to_string().into_bytes())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(Bytes(Cow::Owned(v.to_string().into_bytes())))
    }
    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<Self::Value, E> {
        Ok(Bytes::default())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Bytes::default())
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Bytes::default())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Bytes::default())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Bytes::default())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Bytes<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // serde_json hands strings to `deserialize_bytes` without UTF-8 validation.
        d.deserialize_bytes(BytesVisitor(std::marker::PhantomData))
    }
}

/// A number as JSON gave it (or parsed from a string), or missing.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) enum Num {
    #[default]
    Missing,
    I(i64),
    U(u64),
    F(f64),
    /// A decimal µs value already converted exactly to ns (fast path).
    Ns(i64),
}

impl Num {
    /// As f64 (NaN-free: `None` when missing or not finite).
    pub(crate) fn f64(self) -> Option<f64> {
        let v = match self {
            Num::Missing => return None,
            Num::I(v) => v as f64,
            Num::U(v) => v as f64,
            Num::F(v) => v,
            Num::Ns(v) => v as f64 / 1000.0,
        };
        v.is_finite().then_some(v)
    }

    /// A microsecond value converted to integer nanoseconds. Integers are
    /// exact; floats are multiplied by 1000 and rounded (exact to the
    /// nanosecond while |ts| < 2^53 ns ≈ 104 days, within f64's ulp beyond).
    pub(crate) fn us_to_ns(self) -> Option<i64> {
        match self {
            Num::Missing => None,
            Num::I(v) => v.checked_mul(1000),
            Num::U(v) => i64::try_from(v).ok()?.checked_mul(1000),
            Num::Ns(v) => Some(v),
            Num::F(v) => {
                let ns = (v * 1000.0).round();
                // Inclusive range check keeps the cast in range.
                (ns.is_finite() && ns > -9.0e18 && ns < 9.0e18).then_some(ns as i64)
            }
        }
    }

    /// As an identity key (pids, tids, Python ids): any number or string.
    pub(crate) fn key(self) -> Option<u64> {
        match self {
            Num::Missing => None,
            Num::I(v) => Some(v as u64),
            Num::U(v) => Some(v),
            Num::Ns(v) if v % 1000 == 0 => Some((v / 1000) as u64),
            Num::Ns(v) => Some((v as f64 / 1000.0).to_bits()),
            Num::F(v) => {
                if v.fract() == 0.0 && v >= i64::MIN as f64 && v < u64::MAX as f64 {
                    if v < 0.0 {
                        Some((v as i64) as u64)
                    } else {
                        Some(v as u64)
                    }
                } else {
                    Some(v.to_bits())
                }
            }
        }
    }

    fn from_str(s: &str) -> Num {
        let s = s.trim();
        if let Ok(v) = s.parse::<i64>() {
            Num::I(v)
        } else if let Ok(v) = s.parse::<u64>() {
            Num::U(v)
        } else if let Ok(v) = s.parse::<f64>() {
            Num::F(v)
        } else if s.is_empty() {
            Num::Missing
        } else {
            // A non-numeric string id ("Spans", "PyTorch Profiler"): hash it
            // into the upper half of u64 so that it rarely meets a number.
            Num::U(fx_hash(s.as_bytes()) | (1 << 63))
        }
    }
}

struct NumVisitor;

impl<'de> Visitor<'de> for NumVisitor {
    type Value = Num;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a number")
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Num, E> {
        Ok(Num::U(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Num, E> {
        Ok(Num::I(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Num, E> {
        Ok(Num::F(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Num, E> {
        Ok(Num::from_str(v))
    }
    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<Num, E> {
        Ok(Num::Missing)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Num, E> {
        Ok(Num::Missing)
    }
    fn visit_none<E: de::Error>(self) -> Result<Num, E> {
        Ok(Num::Missing)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Num, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Num::Missing)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Num, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Num::Missing)
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor)
    }
}

/// A list of ranks: a JSON array of numbers, or a string like `"[0, 1, 2]"`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Ranks(pub Option<Vec<u32>>);

/// At most this many ranks are kept per list (enough to tell intra-host groups).
const MAX_RANKS: usize = 1 << 16;

pub(crate) fn parse_rank_list(s: &[u8]) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let mut cur: Option<u64> = None;
    for &b in s {
        if b.is_ascii_digit() {
            let d = u64::from(b - b'0');
            cur = Some(cur.unwrap_or(0).saturating_mul(10).saturating_add(d));
        } else if let Some(v) = cur.take() {
            if out.len() < MAX_RANKS {
                out.push(u32::try_from(v).unwrap_or(u32::MAX));
            }
        }
    }
    if let Some(v) = cur {
        if out.len() < MAX_RANKS {
            out.push(u32::try_from(v).unwrap_or(u32::MAX));
        }
    }
    (!out.is_empty()).then_some(out)
}

struct RanksVisitor;

impl<'de> Visitor<'de> for RanksVisitor {
    type Value = Ranks;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of ranks")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Ranks, E> {
        Ok(Ranks(parse_rank_list(v.as_bytes())))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Ranks, A::Error> {
        let mut out = Vec::new();
        while let Some(n) = seq.next_element::<Num>()? {
            if let Some(v) = n.f64() {
                if out.len() < MAX_RANKS && v >= 0.0 && v <= u32::MAX as f64 {
                    out.push(v as u32);
                }
            }
        }
        Ok(Ranks((!out.is_empty()).then_some(out)))
    }
    fn visit_u64<E: de::Error>(self, _v: u64) -> Result<Ranks, E> {
        Ok(Ranks(None))
    }
    fn visit_i64<E: de::Error>(self, _v: i64) -> Result<Ranks, E> {
        Ok(Ranks(None))
    }
    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<Ranks, E> {
        Ok(Ranks(None))
    }
    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<Ranks, E> {
        Ok(Ranks(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Ranks, E> {
        Ok(Ranks(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ranks, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Ranks(None))
    }
}

impl<'de> Deserialize<'de> for Ranks {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RanksVisitor)
    }
}

/// The `args` of an event: only the keys whyslow reads; the rest is skipped.
#[derive(Debug, Default)]
pub(crate) struct Args<'a> {
    pub occupancy: Num,
    pub bandwidth: Num,
    pub py_id: Num,
    pub py_parent: Num,
    pub collective: Bytes<'a>,
    pub in_nelems: Num,
    pub out_nelems: Num,
    pub group_size: Num,
    pub dtype: Bytes<'a>,
    pub pg_ranks: Ranks,
    pub pg_name: Bytes<'a>,
    pub device: Num,
    pub stream: Num,
}

/// A map key as raw bytes (no UTF-8 validation, no allocation when unescaped).
struct Key<'a>(Bytes<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for Key<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_bytes(BytesVisitor(std::marker::PhantomData))
            .map(Key)
    }
}

struct ArgsVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ArgsVisitor<'a> {
    type Value = Args<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an args object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Args<'a>, A::Error> {
        let mut a = Args::default();
        while let Some(Key(k)) = map.next_key::<Key>()? {
            match k.as_slice() {
                b"est. achieved occupancy %" => a.occupancy = map.next_value()?,
                b"memory bandwidth (GB/s)" => a.bandwidth = map.next_value()?,
                b"Python id" => a.py_id = map.next_value()?,
                b"Python parent id" => a.py_parent = map.next_value()?,
                b"Collective name" => a.collective = map.next_value()?,
                b"In msg nelems" => a.in_nelems = map.next_value()?,
                b"Out msg nelems" => a.out_nelems = map.next_value()?,
                b"Group size" => a.group_size = map.next_value()?,
                b"dtype" => a.dtype = map.next_value()?,
                b"Process Group Ranks" => a.pg_ranks = map.next_value()?,
                b"Process Group Name" => a.pg_name = map.next_value()?,
                b"device" => a.device = map.next_value()?,
                b"stream" => a.stream = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(a)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Args<'a>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Args::default())
    }
    fn visit_str<E: de::Error>(self, _v: &str) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }
    fn visit_u64<E: de::Error>(self, _v: u64) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }
    fn visit_i64<E: de::Error>(self, _v: i64) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }
    fn visit_f64<E: de::Error>(self, _v: f64) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }
    fn visit_bool<E: de::Error>(self, _v: bool) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Args<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ArgsVisitor(std::marker::PhantomData))
    }
}

/// One element of `traceEvents`.
#[derive(Debug, Default)]
pub(crate) struct RawEvent<'a> {
    pub ph: Bytes<'a>,
    pub cat: Bytes<'a>,
    pub name: Bytes<'a>,
    pub pid: Num,
    pub tid: Num,
    pub ts: Num,
    pub dur: Num,
    pub args: Option<Args<'a>>,
}

/// Whether an event's `args` matter, once `cat` and `name` are known: GPU
/// events (occupancy, bandwidth, collective sizes, device/stream), Python
/// events (ids) and CPU-side collectives (process group). Everything else
/// (most CPU ops, with their large `Input Dims`…) skips `args` unparsed.
pub(crate) fn args_needed(cat: Option<&[u8]>, name: Option<&[u8]>) -> bool {
    match cat {
        None => true,
        Some(b"kernel" | b"gpu_memcpy" | b"gpu_memset" | b"python_function") => true,
        Some(_) => match name {
            None => true,
            Some(n) => super::build::is_comm_op_name(n),
        },
    }
}

struct EventVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for EventVisitor<'a> {
    type Value = RawEvent<'a>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a trace event object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEvent<'a>, A::Error> {
        let mut e = RawEvent::default();
        let (mut has_cat, mut has_name) = (false, false);
        while let Some(Key(k)) = map.next_key::<Key>()? {
            match k.as_slice() {
                b"ph" => e.ph = map.next_value()?,
                b"cat" => {
                    e.cat = map.next_value()?;
                    has_cat = true;
                }
                b"name" => {
                    e.name = map.next_value()?;
                    has_name = true;
                }
                b"pid" => e.pid = map.next_value()?,
                b"tid" => e.tid = map.next_value()?,
                b"ts" => e.ts = map.next_value()?,
                b"dur" => e.dur = map.next_value()?,
                b"args" => {
                    let cat = has_cat.then(|| e.cat.as_slice());
                    let name = has_name.then(|| e.name.as_slice());
                    if args_needed(cat, name) {
                        e.args = Some(map.next_value()?);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(e)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawEvent<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EventVisitor(std::marker::PhantomData))
    }
}

/// One process group of `distributedInfo.pg_config`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct PgConfig<'a> {
    #[serde(borrow)]
    pub pg_name: Bytes<'a>,
    #[serde(borrow)]
    pub backend_config: Bytes<'a>,
    pub pg_size: Num,
    pub ranks: Ranks,
}

/// The trace's `distributedInfo`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct DistributedInfo<'a> {
    #[serde(borrow)]
    pub backend: Bytes<'a>,
    pub rank: Num,
    pub world_size: Num,
    #[serde(borrow)]
    pub pg_config: Option<Vec<PgConfig<'a>>>,
}

/// One element of `deviceProperties`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub(crate) struct DeviceProp<'a> {
    pub id: Num,
    #[serde(borrow)]
    pub name: Bytes<'a>,
}

/// FxHash (rustc's hasher): fast, non-cryptographic.
pub(crate) fn fx_hash(bytes: &[u8]) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    std::hash::Hasher::write(&mut h, bytes);
    std::hash::Hasher::finish(&h)
}

/// BuildHasher for rustc's FxHash (fast, non-cryptographic) in the hot loop's interning maps.
pub(crate) type FxBuild = rustc_hash::FxBuildHasher;
/// A HashMap with FxHash.
pub(crate) type FxMap<K, V> = std::collections::HashMap<K, V, FxBuild>;
