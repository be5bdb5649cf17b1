//! A pprof profile's summary (labels, sample and stack counts, start),
//! checked as the decoder checks it but without building the profile: what
//! a service files an upload by (SysOM-AI §3.4).

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
#[cfg(doc)]
use whyslow_model::stack::StackProfile;

use super::decode::{count_index, inflate, sample_count, utf8_table};
#[cfg(doc)]
use super::{from_pprof, from_pprof_limited};
use super::{proto, wire, PprofError, THREAD_LABEL};

/// What a service needs to file a profile, read without building it: the
/// labels (its `key=value` comments), the total sample count, the number of
/// pprof samples (stacks) and the period's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PprofSummary {
    /// Labels from the profile's comments, as [`from_pprof`] reads them.
    pub labels: BTreeMap<String, String>,
    /// Sum of the sample counts ([`StackProfile::total`] of the profile).
    pub samples: u64,
    /// pprof samples (stacks as written; equal stacks are not merged).
    pub stacks: usize,
    /// Start of the period, Unix ns.
    pub start_unix_ns: u64,
}

/// Checks a pprof profile as [`from_pprof_limited`] does, accepting and
/// rejecting exactly the same bytes with the same errors, and returns its
/// [`PprofSummary`] without building the profile: no frame is interned and
/// no string copied. A server's ingest runs this on every upload (SysOM-AI
/// §3.4: the central side stores what the agents send, and decodes it when a
/// flame graph is asked for); building the profile was two thirds of its
/// CPU per upload.
pub fn pprof_summary_limited(
    bytes: &[u8],
    max_decompressed: u64,
) -> Result<PprofSummary, PprofError> {
    pprof_summary_inflated(bytes, max_decompressed).map(|(s, _)| s)
}

/// [`pprof_summary_limited`], and the profile's protobuf bytes inflated:
/// a service that reads the profile again right away (a store filing its
/// stacks) hands them on and inflates once.
pub fn pprof_summary_inflated(
    bytes: &[u8],
    max_decompressed: u64,
) -> Result<(PprofSummary, bytes::Bytes), PprofError> {
    let raw = inflate_shared(bytes, max_decompressed)?;
    let summary = summarize_flat(&raw)?;
    Ok((summary, raw))
}

/// [`pprof_summary_inflated`] of the inflated bytes.
fn summarize_flat(raw: &[u8]) -> Result<PprofSummary, PprofError> {
    let p = wire::Flat::decode(raw)?;
    let raw_len = raw.len();
    // Once per string, not per reference (that was a sixth of an upload).
    let strings = utf8_table(&p.string_table)?;
    let s = |index: i64| -> Result<&str, PprofError> {
        if index == 0 {
            return Ok("");
        }
        usize::try_from(index)
            .ok()
            .and_then(|i| strings.get(i).copied())
            .ok_or(PprofError::BadString {
                index,
                len: strings.len(),
            })
    };

    let count_index = count_index(&p.sample_type, p.default_sample_type, s)?;

    // Ids as from_pprof_limited resolves them: the last of equal ids wins.
    // Fx, not SipHash: the ids are the profile's own small integers, and
    // hashing them was a tenth of the check.
    let mappings: FxHashMap<u64, &proto::Mapping> = p.mapping.iter().map(|m| (m.id, m)).collect();
    let functions: FxHashMap<u64, &proto::Function> =
        p.function.iter().map(|f| (f.id, f)).collect();
    // Location id → frames it stands for.
    let mut location_frames: FxHashMap<u64, usize> = FxHashMap::default();
    location_frames.reserve(p.location.len());
    for loc in &p.location {
        if loc.mapping_id != 0 {
            let m = mappings
                .get(&loc.mapping_id)
                .ok_or(PprofError::UnknownMapping {
                    location: loc.id,
                    id: loc.mapping_id,
                })?;
            s(m.filename)?;
            s(m.build_id)?;
        }
        let lines = p.lines(loc);
        for line in lines.iter().rev() {
            let f = functions
                .get(&line.function_id)
                .ok_or(PprofError::UnknownFunction {
                    location: loc.id,
                    id: line.function_id,
                })?;
            s(f.filename)?;
            s(f.name)?;
        }
        location_frames.insert(loc.id, lines.len().max(1));
    }

    let frame_budget = raw_len.saturating_mul(8).saturating_add(1 << 20);
    let (mut frames_seen, mut samples) = (0usize, 0u64);
    for (i, sample) in p.sample.iter().enumerate() {
        let count = sample_count(p.values(sample), i, count_index)?;
        samples = samples.saturating_add(count);
        for l in p.labels(sample) {
            let key = s(l.key)?;
            let thread = match key.strip_prefix(THREAD_LABEL) {
                Some("") => true,
                Some(rest) => rest
                    .strip_prefix('.')
                    .is_some_and(|n| n.parse::<usize>().is_ok()),
                None => false,
            };
            if thread {
                s(l.str)?;
            }
        }
        for id in p.location_ids(sample).iter().rev() {
            let n = location_frames
                .get(id)
                .ok_or(PprofError::UnknownLocation { sample: i, id: *id })?;
            frames_seen = frames_seen.saturating_add(*n);
            if frames_seen > frame_budget {
                return Err(PprofError::TooManyFrames {
                    limit: frame_budget,
                });
            }
        }
    }
    let mut labels = BTreeMap::new();
    for &c in &p.comment {
        if let Some((k, v)) = s(c)?.split_once('=') {
            labels.insert(k.to_string(), v.to_string());
        }
    }
    if let Some(t) = &p.period_type {
        s(t.unit)?;
    }
    Ok(PprofSummary {
        labels,
        samples,
        stacks: p.sample.len(),
        start_unix_ns: u64::try_from(p.time_nanos).unwrap_or(0),
    })
}

/// The profile inflated (within `max_decompressed`) as shared bytes.
fn inflate_shared(bytes: &[u8], max_decompressed: u64) -> Result<bytes::Bytes, PprofError> {
    Ok(match inflate(bytes, max_decompressed)? {
        std::borrow::Cow::Borrowed(b) => bytes::Bytes::copy_from_slice(b),
        std::borrow::Cow::Owned(v) => bytes::Bytes::from(v),
    })
}
