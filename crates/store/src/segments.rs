//! Columnar profile segments: how the embedded store keeps stack profiles
//! once they are a few minutes old (issue 14: "profile samples in
//! compressed columnar segments on local disk"; SysOM-AI §3.4 keeps every
//! node's profiles centrally, so their size is what bounds retention).
//!
//! A segment holds many profiles of one job and kind. Frames and stacks are
//! interned once for all of them (a training job's ranks and periods share
//! nearly every stack), and the samples are columns: per profile its batch,
//! time, labels and row count; then one column of stack ids and one of
//! counts for all rows. Integers are LEB128 varints (times as deltas), the
//! columns follow each other, and the whole body is zlib-compressed (its
//! Adler-32 catches a damaged file). Pure encoding: no I/O here.
//!
//! | bytes | what |
//! |---|---|
//! | 5 | magic `WSEG1` |
//! | rest | zlib of: strings, frames, stacks, profiles, rows (each a count, then columns) |

use std::collections::HashMap;
use std::io::{Read, Write};

use whyslow_model::stack::{Frame, FrameKind, StackProfile, StackProfileBuilder};

const MAGIC: &[u8; 5] = b"WSEG1";
/// Most profiles, frames, stacks or rows a segment may claim (a damaged
/// count must not allocate gigabytes).
const MAX_ITEMS: u64 = 1 << 28;

/// A segment that cannot be read: what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("profile segment: {0}")]
pub struct SegmentError(String);

fn bad(what: impl Into<String>) -> SegmentError {
    SegmentError(what.into())
}

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u(&mut self, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return;
            }
            self.0.push(b | 0x80);
        }
    }
    fn opt(&mut self, v: Option<u32>) {
        self.u(v.map_or(0, |v| u64::from(v) + 1));
    }
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u(&mut self) -> Result<u64, SegmentError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.b.get(self.at).ok_or_else(|| bad("cut short"))?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("a number over 64 bits"))
    }
    fn count(&mut self, what: &str) -> Result<usize, SegmentError> {
        let n = self.u()?;
        if n > MAX_ITEMS {
            return Err(bad(format!("{n} {what}: at most {MAX_ITEMS}")));
        }
        Ok(n as usize)
    }
    fn u32(&mut self) -> Result<u32, SegmentError> {
        u32::try_from(self.u()?).map_err(|_| bad("an index over 32 bits"))
    }
    fn bytes(&mut self, n: usize) -> Result<&[u8], SegmentError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let end = end.ok_or_else(|| bad("cut short"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
}

#[derive(Default)]
struct Strings {
    ids: HashMap<String, u32>,
    list: Vec<String>,
}

impl Strings {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.list.len() as u32;
        self.list.push(s.to_string());
        self.ids.insert(s.to_string(), i);
        i
    }
}

fn kind_code(k: FrameKind) -> u64 {
    match k {
        FrameKind::Kernel => 0,
        FrameKind::Native => 1,
        FrameKind::Python => 2,
        FrameKind::Label => 3,
    }
}

/// Encodes `profiles` (batch id, profile) as one segment.
pub fn encode(profiles: &[(String, StackProfile)]) -> Vec<u8> {
    let mut strings = Strings::default();
    let mut frame_ids: HashMap<&Frame, u32> = HashMap::new();
    let mut frames: Vec<&Frame> = Vec::new();
    let mut stack_ids: HashMap<Vec<u32>, u32> = HashMap::new();
    let mut stacks: Vec<Vec<u32>> = Vec::new();
    let mut rows: Vec<(u32, u64)> = Vec::new();
    let mut per_profile: Vec<usize> = Vec::new();
    for (_, p) in profiles {
        let mut n = 0;
        for s in &p.stacks {
            let ids: Vec<u32> = s
                .frames
                .iter()
                .filter_map(|&i| p.frames.get(i as usize))
                .map(|f| {
                    *frame_ids.entry(f).or_insert_with(|| {
                        frames.push(f);
                        frames.len() as u32 - 1
                    })
                })
                .collect();
            let next = stacks.len() as u32;
            let id = *stack_ids.entry(ids.clone()).or_insert_with(|| {
                stacks.push(ids);
                next
            });
            rows.push((id, s.count));
            n += 1;
        }
        per_profile.push(n);
    }
    // Frames: one column per field.
    let mut f = Writer::default();
    f.u(frames.len() as u64);
    for fr in &frames {
        f.u(kind_code(fr.kind));
    }
    for fr in &frames {
        f.opt(fr.name.as_deref().map(|s| strings.id(s)));
    }
    for fr in &frames {
        f.opt(fr.module.as_deref().map(|s| strings.id(s)));
    }
    for fr in &frames {
        f.opt(fr.build_id.as_deref().map(|s| strings.id(s)));
    }
    for fr in &frames {
        f.u(fr.offset);
    }
    for fr in &frames {
        f.opt(fr.line);
    }
    let mut s = Writer::default();
    s.u(stacks.len() as u64);
    for st in &stacks {
        s.u(st.len() as u64);
    }
    for st in &stacks {
        for &id in st {
            s.u(u64::from(id));
        }
    }
    let mut p = Writer::default();
    p.u(profiles.len() as u64);
    let mut last_start = 0u64;
    for ((batch, prof), n) in profiles.iter().zip(&per_profile) {
        p.u(u64::from(strings.id(batch)));
        // Zigzag delta: profiles need not be in time order.
        let d = prof.start_unix_ns.wrapping_sub(last_start) as i64;
        p.u(((d << 1) ^ (d >> 63)) as u64);
        last_start = prof.start_unix_ns;
        p.u(prof.duration_ns);
        p.0.extend_from_slice(&prof.hz.to_le_bytes());
        p.u(prof.labels.len() as u64);
        for (k, v) in &prof.labels {
            p.u(u64::from(strings.id(k)));
            p.u(u64::from(strings.id(v)));
        }
        p.u(*n as u64);
    }
    let mut r = Writer::default();
    r.u(rows.len() as u64);
    for (id, _) in &rows {
        r.u(u64::from(*id));
    }
    for (_, c) in &rows {
        r.u(*c);
    }
    let mut body = Writer::default();
    body.u(strings.list.len() as u64);
    for st in &strings.list {
        body.u(st.len() as u64);
        body.0.extend_from_slice(st.as_bytes());
    }
    for part in [f, s, p, r] {
        body.0.extend_from_slice(&part.0);
    }
    let mut z = flate2::write::ZlibEncoder::new(MAGIC.to_vec(), flate2::Compression::new(6));
    z.write_all(&body.0).expect("writing to memory");
    z.finish().expect("writing to memory")
}

/// Decodes a segment into its profiles (batch id, profile), in the order
/// they were encoded. `max_body`: the most bytes the body may inflate to.
pub fn decode(bytes: &[u8], max_body: u64) -> Result<Vec<(String, StackProfile)>, SegmentError> {
    let z = bytes
        .strip_prefix(&MAGIC[..])
        .ok_or_else(|| bad("not a segment (no WSEG1 magic)"))?;
    let mut body = Vec::new();
    flate2::read::ZlibDecoder::new(z)
        .take(max_body.saturating_add(1))
        .read_to_end(&mut body)
        .map_err(|e| bad(format!("damaged: {e}")))?;
    if body.len() as u64 > max_body {
        return Err(bad(format!("inflates to over {max_body} bytes")));
    }
    let mut r = Reader { b: &body, at: 0 };
    let n = r.count("strings")?;
    let mut strings = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let len = r.count("bytes of a string")?;
        let s = std::str::from_utf8(r.bytes(len)?).map_err(|_| bad("a string is not UTF-8"))?;
        strings.push(s.to_string());
    }
    let required = |i: u64| -> Result<String, SegmentError> {
        usize::try_from(i)
            .ok()
            .and_then(|i| strings.get(i))
            .cloned()
            .ok_or_else(|| bad(format!("string {i} of {}", strings.len())))
    };
    let string = |i: u64| -> Result<Option<String>, SegmentError> {
        match i {
            0 => Ok(None),
            i => required(i - 1).map(Some),
        }
    };
    let nf = r.count("frames")?;
    let col =
        |r: &mut Reader| -> Result<Vec<u64>, SegmentError> { (0..nf).map(|_| r.u()).collect() };
    let kinds = col(&mut r)?;
    let (names, modules, ids, offsets, lines) = (
        col(&mut r)?,
        col(&mut r)?,
        col(&mut r)?,
        col(&mut r)?,
        col(&mut r)?,
    );
    let mut frames = Vec::with_capacity(nf);
    for i in 0..nf {
        frames.push(Frame {
            kind: match kinds[i] {
                0 => FrameKind::Kernel,
                1 => FrameKind::Native,
                2 => FrameKind::Python,
                3 => FrameKind::Label,
                k => return Err(bad(format!("frame kind {k}"))),
            },
            name: string(names[i])?,
            module: string(modules[i])?,
            build_id: string(ids[i])?,
            offset: offsets[i],
            line: match lines[i] {
                0 => None,
                l => Some(u32::try_from(l - 1).map_err(|_| bad("a line over 32 bits"))?),
            },
        });
    }
    let ns = r.count("stacks")?;
    let lens: Vec<usize> = (0..ns)
        .map(|_| r.count("frames of a stack"))
        .collect::<Result<_, _>>()?;
    let mut stacks = Vec::with_capacity(ns);
    for len in lens {
        let ids: Vec<u32> = (0..len).map(|_| r.u32()).collect::<Result<_, _>>()?;
        if let Some(&bad_id) = ids.iter().find(|&&i| i as usize >= nf) {
            return Err(bad(format!("frame {bad_id} of {nf}")));
        }
        stacks.push(ids);
    }
    let np = r.count("profiles")?;
    let mut heads = Vec::with_capacity(np.min(1 << 16));
    let mut start = 0u64;
    for _ in 0..np {
        let batch = required(r.u()?)?;
        let z = r.u()?;
        start = start.wrapping_add((((z >> 1) as i64) ^ -((z & 1) as i64)) as u64);
        let duration = r.u()?;
        let hz = f64::from_le_bytes(r.bytes(8)?.try_into().expect("8 bytes"));
        let nl = r.count("labels")?;
        let mut labels = Vec::with_capacity(nl.min(64));
        for _ in 0..nl {
            let k = required(r.u()?)?;
            let v = required(r.u()?)?;
            labels.push((k, v));
        }
        let rows = r.count("rows of a profile")?;
        heads.push((batch, start, duration, hz, labels, rows));
    }
    let nr = r.count("rows")?;
    if nr != heads.iter().map(|h| h.5).sum::<usize>() {
        return Err(bad("the profiles' row counts do not add up to the rows"));
    }
    let stack_col: Vec<u32> = (0..nr).map(|_| r.u32()).collect::<Result<_, _>>()?;
    let count_col: Vec<u64> = (0..nr).map(|_| r.u()).collect::<Result<_, _>>()?;
    let mut at = 0;
    let mut out = Vec::with_capacity(heads.len());
    for (batch, start, duration, hz, labels, rows) in heads {
        let mut b = StackProfileBuilder::new();
        for i in at..at + rows {
            let st = stacks
                .get(stack_col[i] as usize)
                .ok_or_else(|| bad(format!("stack {} of {ns}", stack_col[i])))?;
            let ids = st
                .iter()
                .map(|&f| b.frame(frames[f as usize].clone()))
                .collect();
            b.add(ids, count_col[i]);
        }
        at += rows;
        for (k, v) in labels {
            b.label(&k, v);
        }
        out.push((batch, b.finish(hz, start, duration)));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: FrameKind, name: Option<&str>, offset: u64) -> Frame {
        Frame {
            kind,
            name: name.map(str::to_string),
            module: Some("/usr/lib/libz.so.1".into()),
            build_id: (kind == FrameKind::Native).then(|| "ab12".to_string()),
            offset,
            line: (kind == FrameKind::Python).then_some(42),
        }
    }

    fn profile(rank: u32, start: u64, stacks: &[(&[Frame], u64)]) -> StackProfile {
        let mut b = StackProfileBuilder::new();
        for (frames, c) in stacks {
            let ids = frames.iter().map(|f| b.frame(f.clone())).collect();
            b.add(ids, *c);
        }
        b.label("rank", rank.to_string());
        b.label("job", "j");
        b.finish(99.0, start, 30_000_000_000)
    }

    #[test]
    fn profiles_come_back_as_they_went_in() {
        let main = Frame::label("main");
        let py = frame(FrameKind::Python, Some("train_step (train.py)"), 0);
        let native = frame(FrameKind::Native, None, 0x1234);
        let kernel = frame(
            FrameKind::Kernel,
            Some("do_syscall_64"),
            0xffff_8000_0000_0000,
        );
        let a: &[Frame] = &[main.clone(), py.clone(), native.clone()];
        let b: &[Frame] = &[main.clone(), py, native, kernel];
        let ps = vec![
            ("n0@a".to_string(), profile(0, 2_000, &[(a, 7), (b, 1)])),
            // Out of time order, an empty one, and the same stacks again.
            ("n1@b".to_string(), profile(1, 1_000, &[(b, 3)])),
            ("n2@c".to_string(), profile(2, 5_000, &[])),
            (
                "n3@d".to_string(),
                profile(3, u64::MAX / 2, &[(a, 1), (b, 2)]),
            ),
        ];
        let bytes = encode(&ps);
        assert_eq!(decode(&bytes, 1 << 20).unwrap(), ps);
        assert!(decode(&encode(&[]), 1 << 20).unwrap().is_empty());
    }

    #[test]
    fn shared_stacks_are_stored_once() {
        let frames: Vec<Frame> = (0..40)
            .map(|i| frame(FrameKind::Native, Some(&format!("fn_{i}")), i))
            .collect();
        let ps: Vec<(String, StackProfile)> = (0..64)
            .map(|r| {
                let stacks: Vec<(&[Frame], u64)> = (1..40)
                    .map(|d| (&frames[..d], u64::from(r) + d as u64))
                    .collect();
                (format!("n@{r}"), profile(r, u64::from(r) * 30, &stacks))
            })
            .collect();
        let one = encode(&ps[..1]).len();
        let all = encode(&ps).len();
        // 64 profiles of the same stacks cost far less than 64 times one.
        assert!(all < 8 * one, "{all} bytes for 64, {one} for one");
        assert_eq!(decode(&encode(&ps), 1 << 24).unwrap(), ps);
    }

    #[test]
    fn damaged_segments_are_refused_with_the_reason() {
        let p = profile(0, 1, &[(&[Frame::label("main")], 1)]);
        let bytes = encode(&[("b".into(), p)]);
        assert!(decode(b"nope", 1 << 20)
            .unwrap_err()
            .to_string()
            .contains("magic"));
        assert!(decode(&bytes[..bytes.len() - 3], 1 << 20).is_err());
        let mut flipped = bytes.clone();
        let last = flipped.len() - 6;
        flipped[last] ^= 0x55;
        assert!(decode(&flipped, 1 << 20).is_err());
        assert!(decode(&bytes, 4)
            .unwrap_err()
            .to_string()
            .contains("over 4 bytes"));
        // Every prefix and random bodies: an error, never a panic.
        for n in 0..bytes.len() {
            let _ = decode(&bytes[..n], 1 << 20);
        }
        let mut seed = 7u64;
        for _ in 0..2000 {
            let body: Vec<u8> = (0..(seed % 64) as usize)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 33) as u8
                })
                .collect();
            let mut z =
                flate2::write::ZlibEncoder::new(MAGIC.to_vec(), flate2::Compression::fast());
            z.write_all(&body).unwrap();
            let _ = decode(&z.finish().unwrap(), 1 << 20);
        }
    }
}
