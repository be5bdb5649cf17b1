//! The job policy over what a central store holds (SysOM-AI §3.4: agents
//! and ranks upload, the service judges), so that `whyslow server` and its
//! pages decide as `whyslow localize` and `whyslow diagnose` do: the store
//! hands over its rows as they were uploaded, this module reads them
//! leniently (a row that no longer parses is left out and named in the
//! notes, never the rest) and calls the same analyses.

use std::path::Path;

use whyslow_codec::JsonlValues;
use whyslow_model::collective::CollectiveRecord;
use whyslow_model::diagnosis::DiagnoseEvidence;
use whyslow_model::stack::StackProfile;
use whyslow_model::{Fingerprint, Report};

use crate::{analyze_job, JobEvidence, JobFingerprints, JobPolicy, Refusal};

/// Batches of collective records a straggler verdict reads (the latest).
pub const MAX_COLLECTIVE_BATCHES: usize = 2000;

/// Profiles of each kind, and batches of OS readings, a diagnosis reads
/// (the latest).
pub const MAX_DIAGNOSIS_PROFILES: usize = 5000;

/// One session's report from its stored fingerprint texts (PerfTracker
/// §4.3 over one job): the same [`analyze_job`] with the default policy
/// that `whyslow localize` uses, no source excerpts (the server reads no
/// files for a client). Texts that no longer parse are left out with a
/// warning.
pub fn session_report(fingerprints: &[String]) -> Result<Report, Refusal> {
    let mut evidence = JobEvidence {
        fingerprints: JobFingerprints::with_capacity(fingerprints.len()),
        ..Default::default()
    };
    // Each fingerprint into the job's compact form as it is parsed.
    for (i, text) in fingerprints.iter().enumerate() {
        match whyslow_ingest::parse_fingerprint(text.as_bytes(), Path::new("stored fingerprint")) {
            Ok(fp) => evidence.fingerprints.push(fp),
            Err(e) => evidence
                .warnings
                .push(format!("stored fingerprint {i}: {e}; left out")),
        }
    }
    analyze_job(evidence, &JobPolicy::default())
}

/// Whether a session is whole: as many fingerprints stored as the world
/// size its ranks state. The server judges a session at that moment, so a
/// job's gauges (and the alerts on them) do not wait for someone to look.
pub fn session_is_complete(world_size: Option<u32>, stored: u64) -> bool {
    world_size.is_some_and(|n| n > 0 && stored == u64::from(n))
}

/// A job's rows as a store returns them for the cross-layer diagnosis.
#[derive(Debug, Default)]
pub struct StoredRows<'a> {
    /// Its latest profiles of every kind, decoded.
    pub profiles: Vec<StackProfile>,
    /// Stored profiles that no longer decode.
    pub undecodable_profiles: usize,
    /// Its latest batches of collective records (JSON lines).
    pub collective_batches: &'a [String],
    /// Its latest batches of OS readings (JSON lines).
    pub os_batches: &'a [String],
    /// Its latest session's fingerprints (the GPU layer's kernel times).
    pub fingerprints: &'a [String],
}

/// The diagnosis's evidence from a store's rows (SysOM-AI §3.1): what
/// `whyslow diagnose` reads from an agent's spool, read the same lenient
/// way (`whyslow_codec::JsonlValues`), with what was left out in the notes.
pub fn diagnosis_evidence(rows: StoredRows<'_>) -> DiagnoseEvidence {
    let mut e = DiagnoseEvidence {
        profiles: rows.profiles,
        ..Default::default()
    };
    if rows.undecodable_profiles > 0 {
        e.notes.push(format!(
            "{} stored profile(s) do not decode: left out",
            rows.undecodable_profiles
        ));
    }
    let collectives = JsonlValues::of_batches(rows.collective_batches);
    let readings = JsonlValues::of_batches(rows.os_batches);
    if !collectives.bad.is_empty() || !readings.bad.is_empty() {
        e.notes.push(format!(
            "{} stored collective record(s) and {} OS reading(s) do not parse: left out",
            collectives.bad.len(),
            readings.bad.len()
        ));
    }
    (e.collectives, e.os_samples) = (collectives.values, readings.values);
    let fps: Vec<Fingerprint> = rows
        .fingerprints
        .iter()
        .filter_map(|t| {
            whyslow_ingest::parse_fingerprint(t.as_bytes(), Path::new("stored fingerprint")).ok()
        })
        .collect();
    if !fps.is_empty() {
        e.fingerprints = Some(fps);
    }
    e
}

/// SysOM-AI §3.1's slow-rank detection over a job's stored collective
/// batches, read as the diagnosis reads them.
#[derive(Debug, Clone)]
pub struct StoredStragglers {
    /// Records that parsed.
    pub records: usize,
    /// The ranks late into their collectives.
    pub stragglers: Vec<whyslow_diagnose::stragglers::Straggler>,
    /// Per group, the entry-time plot's data.
    pub groups: Vec<whyslow_diagnose::stragglers::GroupLateness>,
}

/// The stragglers of a job's latest collective batches (lines that do not
/// parse are left out, as in [`diagnosis_evidence`]).
pub fn stragglers(batches: &[String]) -> StoredStragglers {
    let records = JsonlValues::<CollectiveRecord>::of_batches(batches).values;
    let cfg = whyslow_diagnose::stragglers::StragglerConfig::default();
    StoredStragglers {
        records: records.len(),
        stragglers: whyslow_diagnose::stragglers::slow_ranks(&records, &cfg),
        groups: whyslow_diagnose::stragglers::lateness(&records, &cfg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_whole_at_its_world_size_and_not_without_one() {
        assert!(session_is_complete(Some(4), 4));
        assert!(!session_is_complete(Some(4), 3));
        assert!(!session_is_complete(None, 4));
        assert!(!session_is_complete(Some(0), 0));
    }

    #[test]
    fn rows_that_do_not_parse_are_named_and_the_rest_kept() {
        let batch = r#"{"pid":1,"start_unix_ns":1,"duration_ns":1,"signals":{"runqueue_delay_ms_per_s":2.5}}
not json
"#
        .to_string();
        let e = diagnosis_evidence(StoredRows {
            undecodable_profiles: 2,
            os_batches: std::slice::from_ref(&batch),
            fingerprints: &["{".to_string()],
            ..Default::default()
        });
        assert_eq!(e.os_samples.len(), 1);
        assert!(e.fingerprints.is_none());
        assert_eq!(e.notes.len(), 2, "{:?}", e.notes);
        assert!(e.notes[0].starts_with("2 stored profile(s)"));
        assert!(e.notes[1].starts_with("0 stored collective record(s) and 1 OS reading(s)"));
        assert_eq!(stragglers(&["x".into()]).records, 0);
        assert_eq!(
            session_report(&["{".into()]).unwrap_err(),
            Refusal::NoEvidence
        );
    }
}
