//! A borrowing decoder of `profile.proto`'s wire format for the paths that
//! only read a profile (a server's ingest check and its store's rows).
//!
//! prost decodes every sample and location into a struct of its own with
//! vectors inside; at a server's ingest rate those allocations were about a
//! third of its CPU (issue 31). Here the repeated fields of all samples and
//! locations go into four shared pools, the strings stay slices of the
//! input, and the accepted wire format is prost's: fields in any order,
//! packed or unpacked repeated scalars, unknown fields (groups included)
//! skipped, the last of a repeated scalar field winning, a message field met
//! twice merged. The tests compare the two decoders on the shipped profiles
//! and on mutations of them.

use std::ops::Range;

use prost::DecodeError;

use super::proto::{Function, Label, Line, Mapping, ValueType};

/// A location, its lines a range of [`Flat::lines`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FlatLocation {
    pub id: u64,
    pub mapping_id: u64,
    pub address: u64,
    lines: Range<usize>,
}

/// A sample, its repeated fields ranges of the pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FlatSample {
    location_ids: Range<usize>,
    values: Range<usize>,
    labels: Range<usize>,
}

/// A `Profile` message, read.
#[derive(Debug, Default)]
pub(super) struct Flat<'a> {
    pub sample_type: Vec<ValueType>,
    pub sample: Vec<FlatSample>,
    pub mapping: Vec<Mapping>,
    pub location: Vec<FlatLocation>,
    pub function: Vec<Function>,
    pub string_table: Vec<&'a [u8]>,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    pub period_type: Option<ValueType>,
    pub period: i64,
    pub comment: Vec<i64>,
    pub default_sample_type: i64,
    lines: Vec<Line>,
    location_ids: Vec<u64>,
    values: Vec<i64>,
    labels: Vec<Label>,
}

impl<'a> Flat<'a> {
    /// Decodes a `Profile` message (inflated).
    pub fn decode(buf: &'a [u8]) -> Result<Flat<'a>, DecodeError> {
        let mut p = Flat::default();
        let mut c = Cursor { buf, pos: 0 };
        while !c.done() {
            let (tag, wt) = c.key()?;
            match tag {
                1 => {
                    let mut t = ValueType::default();
                    value_type(c.message(wt)?, &mut t)?;
                    p.sample_type.push(t);
                }
                2 => {
                    let body = c.message(wt)?;
                    let s = p.read_sample(body)?;
                    p.sample.push(s);
                }
                3 => p.mapping.push(mapping(c.message(wt)?)?),
                4 => {
                    let body = c.message(wt)?;
                    let l = p.read_location(body)?;
                    p.location.push(l);
                }
                5 => p.function.push(function(c.message(wt)?)?),
                6 => p.string_table.push(c.message(wt)?),
                7 | 8 => {
                    c.int64(wt)?; // drop_frames, keep_frames: unused
                }
                9 => p.time_nanos = c.int64(wt)?,
                10 => p.duration_nanos = c.int64(wt)?,
                11 => value_type(
                    c.message(wt)?,
                    p.period_type.get_or_insert_with(Default::default),
                )?,
                12 => p.period = c.int64(wt)?,
                13 => c.repeated(wt, |v| p.comment.push(v as i64))?,
                14 => p.default_sample_type = c.int64(wt)?,
                _ => c.skip(tag, wt, 0)?,
            }
        }
        Ok(p)
    }

    fn read_sample(&mut self, body: &[u8]) -> Result<FlatSample, DecodeError> {
        let (l0, v0, b0) = (
            self.location_ids.len(),
            self.values.len(),
            self.labels.len(),
        );
        let mut c = Cursor { buf: body, pos: 0 };
        // A sample's repeated fields may interleave; only its own elements
        // are pushed while it is read, so each pool's range is contiguous.
        while !c.done() {
            let (tag, wt) = c.key()?;
            match tag {
                1 => c.repeated(wt, |v| self.location_ids.push(v))?,
                2 => c.repeated(wt, |v| self.values.push(v as i64))?,
                3 => self.labels.push(label(c.message(wt)?)?),
                _ => c.skip(tag, wt, 0)?,
            }
        }
        Ok(FlatSample {
            location_ids: l0..self.location_ids.len(),
            values: v0..self.values.len(),
            labels: b0..self.labels.len(),
        })
    }

    fn read_location(&mut self, body: &[u8]) -> Result<FlatLocation, DecodeError> {
        let first = self.lines.len();
        let mut loc = FlatLocation {
            id: 0,
            mapping_id: 0,
            address: 0,
            lines: 0..0,
        };
        let mut c = Cursor { buf: body, pos: 0 };
        while !c.done() {
            let (tag, wt) = c.key()?;
            match tag {
                1 => loc.id = c.uint64(wt)?,
                2 => loc.mapping_id = c.uint64(wt)?,
                3 => loc.address = c.uint64(wt)?,
                4 => self.lines.push(line(c.message(wt)?)?),
                5 => {
                    c.uint64(wt)?; // is_folded: unused
                }
                _ => c.skip(tag, wt, 0)?,
            }
        }
        loc.lines = first..self.lines.len();
        Ok(loc)
    }

    /// The lines of `l`, as written (leaf-most first).
    pub fn lines(&self, l: &FlatLocation) -> &[Line] {
        &self.lines[l.lines.clone()]
    }

    /// The location ids of `s`, leaf first.
    pub fn location_ids(&self, s: &FlatSample) -> &[u64] {
        &self.location_ids[s.location_ids.clone()]
    }

    /// The values of `s`.
    pub fn values(&self, s: &FlatSample) -> &[i64] {
        &self.values[s.values.clone()]
    }

    /// The labels of `s`.
    pub fn labels(&self, s: &FlatSample) -> &[Label] {
        &self.labels[s.labels.clone()]
    }
}

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

/// prost's limit on nested groups and messages.
const RECURSION_LIMIT: u32 = 100;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn underflow() -> DecodeError {
    DecodeError::new("buffer underflow")
}

fn wrong_wire_type(got: u8, want: u8) -> DecodeError {
    DecodeError::new(format!("invalid wire type: {got} (expected {want})"))
}

impl<'a> Cursor<'a> {
    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut v = 0u64;
        for k in 0..10 {
            let b = *self.buf.get(self.pos).ok_or_else(underflow)?;
            self.pos += 1;
            // The tenth byte holds bit 63 only.
            if k == 9 && b > 1 {
                return Err(DecodeError::new("invalid varint"));
            }
            v |= u64::from(b & 0x7f) << (7 * k);
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(DecodeError::new("invalid varint"))
    }

    fn key(&mut self) -> Result<(u32, u8), DecodeError> {
        let k = self.varint()?;
        if k > u64::from(u32::MAX) {
            return Err(DecodeError::new(format!("invalid key value: {k}")));
        }
        let wt = (k & 7) as u8;
        if wt > FIXED32 {
            return Err(DecodeError::new(format!("invalid wire type value: {wt}")));
        }
        let tag = (k >> 3) as u32;
        if tag == 0 {
            return Err(DecodeError::new("invalid tag value: 0"));
        }
        Ok((tag, wt))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let end = end.ok_or_else(underflow)?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// A length-delimited field's bytes.
    fn message(&mut self, wt: u8) -> Result<&'a [u8], DecodeError> {
        if wt != LEN {
            return Err(wrong_wire_type(wt, LEN));
        }
        let n = self.varint()?;
        self.take(usize::try_from(n).map_err(|_| underflow())?)
    }

    fn uint64(&mut self, wt: u8) -> Result<u64, DecodeError> {
        if wt != VARINT {
            return Err(wrong_wire_type(wt, VARINT));
        }
        self.varint()
    }

    fn int64(&mut self, wt: u8) -> Result<i64, DecodeError> {
        self.uint64(wt).map(|v| v as i64)
    }

    /// A repeated varint field, packed or not.
    fn repeated(&mut self, wt: u8, mut push: impl FnMut(u64)) -> Result<(), DecodeError> {
        match wt {
            VARINT => push(self.varint()?),
            LEN => {
                let mut packed = Cursor {
                    buf: self.message(LEN)?,
                    pos: 0,
                };
                while !packed.done() {
                    push(packed.varint()?);
                }
            }
            _ => return Err(wrong_wire_type(wt, LEN)),
        }
        Ok(())
    }

    /// Skips an unknown field (a group to its end).
    fn skip(&mut self, tag: u32, wt: u8, depth: u32) -> Result<(), DecodeError> {
        match wt {
            VARINT => {
                self.varint()?;
            }
            FIXED64 => {
                self.take(8)?;
            }
            LEN => {
                self.message(LEN)?;
            }
            FIXED32 => {
                self.take(4)?;
            }
            START_GROUP => {
                if depth >= RECURSION_LIMIT {
                    return Err(DecodeError::new("recursion limit reached"));
                }
                loop {
                    let (t, w) = self.key()?;
                    if w == END_GROUP {
                        if t != tag {
                            return Err(DecodeError::new("unexpected end group tag"));
                        }
                        break;
                    }
                    self.skip(t, w, depth + 1)?;
                }
            }
            _ => return Err(DecodeError::new("unexpected end group tag")),
        }
        Ok(())
    }
}

/// Reads the fields of a small message with `f(cursor, tag, wire type)`,
/// which returns false for a field it does not know (skipped).
fn fields(
    buf: &[u8],
    mut f: impl FnMut(&mut Cursor<'_>, u32, u8) -> Result<bool, DecodeError>,
) -> Result<(), DecodeError> {
    let mut c = Cursor { buf, pos: 0 };
    while !c.done() {
        let (tag, wt) = c.key()?;
        if !f(&mut c, tag, wt)? {
            c.skip(tag, wt, 0)?;
        }
    }
    Ok(())
}

/// Merges a `ValueType` into `t` (a field met twice is merged, as prost does).
fn value_type(buf: &[u8], t: &mut ValueType) -> Result<(), DecodeError> {
    fields(buf, |c, tag, wt| {
        match tag {
            1 => t.r#type = c.int64(wt)?,
            2 => t.unit = c.int64(wt)?,
            _ => return Ok(false),
        }
        Ok(true)
    })
}

fn label(buf: &[u8]) -> Result<Label, DecodeError> {
    let mut l = Label::default();
    fields(buf, |c, tag, wt| {
        match tag {
            1 => l.key = c.int64(wt)?,
            2 => l.str = c.int64(wt)?,
            3 => l.num = c.int64(wt)?,
            4 => l.num_unit = c.int64(wt)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(l)
}

fn line(buf: &[u8]) -> Result<Line, DecodeError> {
    let mut l = Line::default();
    fields(buf, |c, tag, wt| {
        match tag {
            1 => l.function_id = c.uint64(wt)?,
            2 => l.line = c.int64(wt)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(l)
}

fn function(buf: &[u8]) -> Result<Function, DecodeError> {
    let mut f = Function::default();
    fields(buf, |c, tag, wt| {
        match tag {
            1 => f.id = c.uint64(wt)?,
            2 => f.name = c.int64(wt)?,
            3 => f.system_name = c.int64(wt)?,
            4 => f.filename = c.int64(wt)?,
            5 => f.start_line = c.int64(wt)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(f)
}

fn mapping(buf: &[u8]) -> Result<Mapping, DecodeError> {
    let mut m = Mapping::default();
    fields(buf, |c, tag, wt| {
        match tag {
            1 => m.id = c.uint64(wt)?,
            2 => m.memory_start = c.uint64(wt)?,
            3 => m.memory_limit = c.uint64(wt)?,
            4 => m.file_offset = c.uint64(wt)?,
            5 => m.filename = c.int64(wt)?,
            6 => m.build_id = c.int64(wt)?,
            7 => m.has_functions = c.uint64(wt)? != 0,
            8 => m.has_filenames = c.uint64(wt)? != 0,
            9 => m.has_line_numbers = c.uint64(wt)? != 0,
            10 => m.has_inline_frames = c.uint64(wt)? != 0,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::super::proto;
    use super::*;
    use prost::Message;

    /// The flat decode as prost's `Profile` (strings as bytes).
    fn as_prost(f: &Flat<'_>) -> proto::ProfileRaw {
        proto::ProfileRaw {
            sample_type: f.sample_type.clone(),
            sample: f
                .sample
                .iter()
                .map(|s| proto::Sample {
                    location_id: f.location_ids(s).to_vec(),
                    value: f.values(s).to_vec(),
                    label: f.labels(s).to_vec(),
                })
                .collect(),
            mapping: f.mapping.clone(),
            location: f
                .location
                .iter()
                .map(|l| proto::Location {
                    id: l.id,
                    mapping_id: l.mapping_id,
                    address: l.address,
                    line: f.lines(l).to_vec(),
                    is_folded: false,
                })
                .collect(),
            function: f.function.clone(),
            string_table: f
                .string_table
                .iter()
                .map(|s| bytes::Bytes::copy_from_slice(s))
                .collect(),
            drop_frames: 0,
            keep_frames: 0,
            time_nanos: f.time_nanos,
            duration_nanos: f.duration_nanos,
            period_type: f.period_type.clone(),
            period: f.period,
            comment: f.comment.clone(),
            default_sample_type: f.default_sample_type,
        }
    }

    /// prost's decode with the fields the flat decode leaves out cleared.
    fn prost_decode(buf: &[u8]) -> Result<proto::ProfileRaw, DecodeError> {
        let mut p = proto::ProfileRaw::decode(buf)?;
        p.drop_frames = 0;
        p.keep_frames = 0;
        for l in &mut p.location {
            l.is_folded = false;
        }
        Ok(p)
    }

    fn shipped_profiles() -> Vec<Vec<u8>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        let mut out = Vec::new();
        let mut stack = vec![dir];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.to_string_lossy().ends_with(".pb.gz") && out.len() < 40 {
                    let gz = std::fs::read(&p).unwrap();
                    let mut raw = Vec::new();
                    std::io::Read::read_to_end(
                        &mut flate2::read::GzDecoder::new(&gz[..]),
                        &mut raw,
                    )
                    .unwrap();
                    out.push(raw);
                }
            }
        }
        out
    }

    #[test]
    fn shipped_profiles_decode_as_prost_decodes_them() {
        let profiles = shipped_profiles();
        assert!(
            profiles.len() >= 5,
            "only {} profiles found",
            profiles.len()
        );
        for raw in &profiles {
            let flat = Flat::decode(raw).unwrap();
            assert_eq!(as_prost(&flat), prost_decode(raw).unwrap());
        }
    }

    /// Unpacked repeated fields, fields out of order, a message field met
    /// twice, unknown fields of every wire type (a nested group too).
    #[test]
    fn the_wire_formats_prost_accepts_are_accepted_alike() {
        fn key(tag: u32, wt: u8) -> Vec<u8> {
            varint(u64::from(tag) << 3 | u64::from(wt))
        }
        fn varint(mut v: u64) -> Vec<u8> {
            let mut out = Vec::new();
            loop {
                if v < 0x80 {
                    out.push(v as u8);
                    return out;
                }
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
        }
        fn len(tag: u32, body: &[u8]) -> Vec<u8> {
            let mut out = key(tag, LEN);
            out.extend(varint(body.len() as u64));
            out.extend_from_slice(body);
            out
        }
        let mut sample = Vec::new();
        sample.extend(key(1, VARINT));
        sample.extend(varint(7));
        sample.extend(key(2, VARINT));
        sample.extend(varint(u64::MAX)); // -1
        sample.extend(len(1, &[8, 9]));
        sample.extend(key(99, FIXED64));
        sample.extend([0; 8]);
        let mut p = Vec::new();
        p.extend(len(6, b""));
        p.extend(len(2, &sample));
        p.extend(len(11, &[8, 1]));
        p.extend(key(50, START_GROUP));
        p.extend(key(51, START_GROUP));
        p.extend(key(51, END_GROUP));
        p.extend(key(52, FIXED32));
        p.extend([0; 4]);
        p.extend(key(50, END_GROUP));
        p.extend(len(11, &[16, 2]));
        p.extend(key(13, VARINT));
        p.extend(varint(3));
        p.extend(len(13, &[4, 5]));
        p.extend(len(6, b"x"));
        let flat = Flat::decode(&p).unwrap();
        assert_eq!(flat.location_ids(&flat.sample[0]), [7, 8, 9]);
        assert_eq!(flat.values(&flat.sample[0]), [-1]);
        assert_eq!(flat.comment, [3, 4, 5]);
        assert_eq!(flat.period_type, Some(ValueType { r#type: 1, unit: 2 }));
        assert_eq!(as_prost(&flat), prost_decode(&p).unwrap());
    }

    /// Mutated profiles: never a panic; where both decoders accept, the same
    /// profile; where prost rejects, so does this one.
    #[test]
    fn mutations_decode_as_prost_decodes_them() {
        let profiles = shipped_profiles();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut both_ok, mut both_err) = (0, 0);
        for round in 0..3000 {
            let mut raw = profiles[round % profiles.len()].clone();
            if raw.is_empty() {
                continue;
            }
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % raw.len();
                match next() % 3 {
                    0 => raw[at] = next() as u8,
                    1 => raw.truncate(at),
                    _ => raw.insert(at, next() as u8),
                }
                if raw.is_empty() {
                    break;
                }
            }
            match (Flat::decode(&raw), prost_decode(&raw)) {
                (Ok(flat), Ok(p)) => {
                    assert_eq!(as_prost(&flat), p, "round {round}");
                    both_ok += 1;
                }
                (Err(_), Err(_)) => both_err += 1,
                (Ok(_), Err(e)) => panic!("round {round}: prost rejects ({e}), flat accepts"),
                // prost checks `string` fields as it reads them; the table
                // is checked as UTF-8 after the flat decode, by its caller.
                (Err(e), Ok(_)) => panic!("round {round}: flat rejects ({e}), prost accepts"),
            }
        }
        assert!(both_ok > 100 && both_err > 100, "{both_ok} / {both_err}");
    }
}
