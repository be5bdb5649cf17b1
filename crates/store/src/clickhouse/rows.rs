//! The rows: ids (tenants by name, frames by digest, stacks by their
//! frames' digests, with the digest memo) and the structs written and
//! read in ClickHouse's binary row format (`RowBinary`).

use clickhouse::Row;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use whyslow_model::stack::Frame;

/// A tenant's id: from its name, so every server computes the same one
/// without a shared counter.
pub(super) fn tenant_id(name: &str) -> i64 {
    let d = Sha256::digest(name.as_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    (u64::from_le_bytes(b) >> 1) as i64
}

/// A frame's digest: SHA-256 of its fields, each length-prefixed (stable
/// across servers and versions; computed once per distinct frame of a
/// profile).
#[cfg(test)]
fn frame_digest(f: &Frame) -> [u64; 2] {
    frame_ref_digest(&whyslow_codec::FrameRef {
        kind: f.kind,
        name: f.name.as_deref(),
        module: f.module.as_deref(),
        build_id: f.build_id.as_deref(),
        offset: f.offset,
        line: f.line,
    })
}

/// [`frame_digest`] of a frame borrowed from an upload.
fn frame_ref_digest(f: &whyslow_codec::FrameRef<'_>) -> [u64; 2] {
    let mut h = Sha256::new();
    let field = |h: &mut Sha256, s: Option<&str>| match s {
        Some(s) => {
            h.update((s.len() as u64 + 1).to_le_bytes());
            h.update(s.as_bytes());
        }
        None => h.update(0u64.to_le_bytes()),
    };
    h.update([f.kind as u8]);
    field(&mut h, f.name);
    field(&mut h, f.module);
    field(&mut h, f.build_id);
    h.update(f.offset.to_le_bytes());
    h.update(f.line.map_or(0, |l| u64::from(l) + 1).to_le_bytes());
    let d = h.finalize();
    let word = |i: usize| u64::from_le_bytes(d[i..i + 8].try_into().unwrap_or([0; 8]));
    [word(0), word(8)]
}

/// Frames' digests remembered by content: a host's agents send the same
/// frames period after period, and SHA-256 per frame was a tenth of an
/// upload's CPU.
#[derive(Default)]
pub(super) struct DigestMemo {
    /// Fx hash of the content → the frames with that hash and their digest.
    by_hash: FxHashMap<u64, Vec<(Frame, [u64; 2])>>,
    len: usize,
}

/// Most frames a [`DigestMemo`] holds (then it starts over): ≈ 15 MB.
const MEMO_FRAMES: usize = 1 << 16;

impl DigestMemo {
    fn digest(&mut self, f: &whyslow_codec::FrameRef<'_>) -> [u64; 2] {
        use std::hash::{Hash, Hasher};
        let mut h = rustc_hash::FxHasher::default();
        (f.kind as u8, f.name, f.module, f.build_id, f.offset, f.line).hash(&mut h);
        let key = h.finish();
        let same = |m: &Frame| {
            m.kind == f.kind
                && m.name.as_deref() == f.name
                && m.module.as_deref() == f.module
                && m.build_id.as_deref() == f.build_id
                && m.offset == f.offset
                && m.line == f.line
        };
        if let Some(d) = self
            .by_hash
            .get(&key)
            .and_then(|v| v.iter().find(|(m, _)| same(m)))
        {
            return d.1;
        }
        let d = frame_ref_digest(f);
        if self.len >= MEMO_FRAMES {
            self.by_hash.clear();
            self.len = 0;
        }
        self.by_hash.entry(key).or_default().push((f.to_frame(), d));
        self.len += 1;
        d
    }
}

/// The id of each pprof sample's stack: each frame digested once, a
/// stack's id folding its frames' digests.
pub(super) fn view_stack_ids(v: &whyslow_codec::PprofView<'_>, memo: &mut DigestMemo) -> Vec<u64> {
    let digests: Vec<[u64; 2]> = v.frames.iter().map(|f| memo.digest(f)).collect();
    (0..v.stacks.len())
        .map(|i| stack_id(v.stack(i).iter().map(|&f| digests[f as usize])))
        .collect()
}

/// A stack's id from its frames' digests, root first: every server
/// computes the same one without a shared counter. Each step folds a
/// 128-bit product (as wyhash does), so order matters and equal frames at
/// different depths differ.
fn stack_id(digests: impl IntoIterator<Item = [u64; 2]>) -> u64 {
    let fold = |a: u64, b: u64| {
        let m = u128::from(a) * u128::from(b);
        (m as u64) ^ ((m >> 64) as u64)
    };
    let mut h: u64 = 0x243f_6a88_85a3_08d3;
    for (depth, [a, b]) in digests.into_iter().enumerate() {
        h = fold(h ^ a, b ^ 0x9e37_79b9_7f4a_7c15 ^ depth as u64);
    }
    fold(h, 0xbf58_476d_1ce4_e5b9)
}

#[derive(Row, Serialize)]
pub(super) struct TenantRow<'a> {
    pub(super) name: &'a str,
    pub(super) id: i64,
}

#[derive(Row, Serialize)]
pub(super) struct TokenRow<'a> {
    pub(super) hash: &'a str,
    pub(super) tenant: i64,
    pub(super) created_ns: u64,
}

#[derive(Row, Serialize)]
pub(super) struct FingerprintRow<'a> {
    pub(super) tenant: i64,
    pub(super) job: &'a str,
    pub(super) session: &'a str,
    pub(super) worker: u32,
    pub(super) json: &'a str,
    pub(super) uploaded_ns: u64,
}

#[derive(Row, Serialize)]
pub(super) struct BatchRow<'a> {
    pub(super) tenant: i64,
    pub(super) job: &'a str,
    pub(super) batch: &'a str,
    pub(super) body: &'a str,
    pub(super) uploaded_ns: u64,
}

/// One uploaded profile (its samples are in `samples`).
#[derive(Row, Serialize, Deserialize)]
pub(super) struct ProfileRow {
    pub(super) tenant: i64,
    pub(super) job: String,
    pub(super) kind: String,
    pub(super) batch: String,
    pub(super) rank: Option<String>,
    pub(super) host: Option<String>,
    pub(super) start_unix_ns: i64,
    /// The period's start as the profile itself says.
    pub(super) period_start_ns: u64,
    pub(super) duration_ns: u64,
    pub(super) hz: f64,
    pub(super) samples: u64,
    /// The profile's labels as JSON.
    pub(super) labels: String,
    pub(super) uploaded_ns: u64,
}

/// Borrowed from its profile's row: a profile's hundreds of samples share
/// its names (owned copies were most of an upload's allocations).
#[derive(Row, Serialize)]
pub(super) struct SampleRow<'a> {
    pub(super) tenant: i64,
    pub(super) job: &'a str,
    pub(super) kind: &'a str,
    pub(super) host: &'a str,
    pub(super) rank: &'a str,
    pub(super) start_unix_ns: i64,
    pub(super) batch: &'a str,
    pub(super) stack_id: u64,
    pub(super) value: u64,
    pub(super) uploaded_ns: u64,
}

#[derive(Row, Serialize)]
pub(super) struct StackRow {
    pub(super) tenant: i64,
    pub(super) stack_id: u64,
    pub(super) frames: String,
    pub(super) functions: Vec<String>,
    pub(super) seen_ns: u64,
}

#[derive(Row, Deserialize)]
pub(super) struct SeenBatch {
    pub(super) tenant: i64,
    pub(super) batch: String,
}

#[derive(Row, Deserialize)]
pub(super) struct StackFrames {
    pub(super) stack_id: u64,
    pub(super) frames: String,
}

#[derive(Row, Deserialize)]
pub(super) struct BatchSample {
    pub(super) batch: String,
    pub(super) stack_id: u64,
    pub(super) value: u64,
}

#[derive(Row, Deserialize)]
pub(super) struct StackSum {
    pub(super) stack_id: u64,
    pub(super) value: u64,
}

#[derive(Row, Deserialize)]
pub(super) struct FunctionRow {
    pub(super) function: String,
    pub(super) self_samples: u64,
    pub(super) total_samples: u64,
}

#[derive(Row, Deserialize)]
pub(super) struct Totals {
    pub(super) samples: u64,
    pub(super) profiles: u64,
}

#[derive(Row, Deserialize)]
pub(super) struct JobRow {
    pub(super) job: String,
    pub(super) sessions: u64,
    pub(super) fingerprints: u64,
    pub(super) profiles: u64,
    pub(super) updated: i64,
}

#[derive(Row, Deserialize)]
pub(super) struct SessionRow {
    pub(super) session: String,
    pub(super) n: u64,
    pub(super) updated: i64,
}

#[derive(Row, Deserialize)]
pub(super) struct Text {
    pub(super) body: String,
}

#[derive(Row, Deserialize)]
pub(super) struct Count {
    pub(super) n: u64,
}

#[derive(Row, Deserialize)]
pub(super) struct Id {
    pub(super) tenant: i64,
}

/// The columns of [`ProfileRow`], in order.
pub(super) const PROFILE_COLUMNS: &str = "tenant, job, kind, batch, rank, host, start_unix_ns, period_start_ns, duration_ns, hz, samples, labels, uploaded_ns";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uploads_read_without_building_them_get_the_built_profiles_stack_ids() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for f in [
            "tests/fixtures/profiles/host-all-10s.pb.gz",
            "tests/fixtures/diagnose/noisy-neighbour/agent/h0/wstb19083/h0-rank0-pid19263-1795714544.pb.gz",
        ] {
            let bytes = std::fs::read(root.join(f)).unwrap();
            let built = whyslow_codec::from_pprof(&bytes).unwrap();
            let digests: Vec<[u64; 2]> = built.frames.iter().map(frame_digest).collect();
            let mut want: FxHashMap<u64, u64> = FxHashMap::default();
            for s in &built.stacks {
                let id = stack_id(s.frames.iter().map(|&i| digests[i as usize]));
                *want.entry(id).or_default() += s.count;
            }
            let got = whyslow_codec::visit_pprof_limited(
                &bytes,
                whyslow_codec::MAX_PPROF_DECOMPRESSED,
                |v| {
                    let mut got: FxHashMap<u64, u64> = FxHashMap::default();
                    let mut memo = DigestMemo::default();
                    for (&(_, _, c), id) in v.stacks.iter().zip(view_stack_ids(v, &mut memo)) {
                        *got.entry(id).or_default() += c;
                    }
                    // Remembered digests are the computed ones.
                    let again = view_stack_ids(v, &mut memo);
                    assert_eq!(again, view_stack_ids(v, &mut DigestMemo::default()));
                    assert!(memo.len > 0 && memo.len <= v.frames.len());
                    got
                },
            )
            .unwrap();
            assert!(want.len() > 10, "{f}: {} stacks", want.len());
            assert_eq!(got, want, "{f}");
        }
    }

    #[test]
    fn ids_are_stable_and_tell_names_apart() {
        assert_eq!(tenant_id("team-a"), tenant_id("team-a"));
        assert!(tenant_id("team-a") >= 0 && tenant_id("team-a") != tenant_id("team-b"));
        let (a, b) = (
            frame_digest(&Frame::label("a")),
            frame_digest(&Frame::label("b")),
        );
        assert_eq!(stack_id([a, b]), stack_id([a, b]));
        assert_ne!(stack_id([a, b]), stack_id([b, a]));
        assert_ne!(stack_id([a]), stack_id([a, a]));
        assert_ne!(frame_digest(&Frame::label("ab")), {
            let mut f = Frame::label("a");
            f.module = Some("b".into());
            frame_digest(&f)
        });
    }
}
