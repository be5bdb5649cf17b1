//! One job's fingerprints as the job policy keeps them: compact enough for
//! a million workers (PerfTracker §4.3 compares every worker of a job; §5
//! runs on thousands of GPUs). A door streams each fingerprint in as it
//! reads it ([`JobFingerprints::push`]) and drops it: the patterns go into
//! a columnar [`FingerprintTable`] (21 bytes a worker's function), and of
//! the rest only what the policy reads is kept — the job identities with
//! their ranks, ranks seen twice, empty windows, each fingerprint's
//! warnings as the report words them, the training steps and the network
//! samples.

use std::collections::{BTreeMap, HashSet};

use whyslow_localize::{FingerprintTable, TableError};
use whyslow_model::{Fingerprint, IterationSeries};

use crate::JobKey;

/// A job identity as a fingerprint states it (owned [`JobKey`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct JobId {
    id: Option<String>,
    world_size: Option<u32>,
    device: Option<String>,
    backend: Option<String>,
}

impl JobId {
    fn key(&self) -> JobKey<'_> {
        JobKey {
            id: self.id.as_deref(),
            world_size: self.world_size,
            device: self.device.as_deref(),
            backend: self.backend.as_deref(),
        }
    }
}

/// The inputs that claim one job identity: their ranks in the order
/// received, and the first input.
#[derive(Debug, Clone)]
pub(crate) struct JobMembers {
    pub(crate) ranks: Vec<u32>,
    pub(crate) first: String,
}

/// One job's fingerprints, compact (see the module docs). Fill it with
/// [`JobFingerprints::push`] (or collect fingerprints into it) and hand it
/// to [`crate::analyze_job`] in [`crate::JobEvidence`].
#[derive(Debug, Clone, Default)]
pub struct JobFingerprints {
    /// The workers with events in their window, in the order received.
    pub(crate) table: FingerprintTable,
    /// The others: rank and input, in the order received.
    pub(crate) empty: Vec<(u32, String)>,
    /// Every fingerprint's warnings, `rank N (input): warning`.
    pub(crate) warnings: Vec<String>,
    /// The job identities stated, with their inputs.
    jobs: BTreeMap<JobId, JobMembers>,
    /// The last fingerprint's identity.
    last_job: Option<JobId>,
    /// Ranks received.
    ranks: HashSet<u32>,
    /// The first rank received twice: rank, first input, second input.
    pub(crate) duplicate: Option<(u32, String, String)>,
    /// Each fingerprint's training steps (those that have them).
    pub(crate) steps: Vec<IterationSeries>,
    /// Network samples of the table's workers: (row, sample).
    pub(crate) network: Vec<(usize, whyslow_model::os::OsSample)>,
    /// Fingerprints received.
    count: usize,
    /// Why the table could not take a fingerprint (more than 2³² workers).
    pub(crate) error: Option<TableError>,
}

impl JobFingerprints {
    /// Empty, expecting about `n` fingerprints (the table's columns are
    /// allocated once for that many).
    pub fn with_capacity(n: usize) -> Self {
        Self {
            table: FingerprintTable::with_capacity(n),
            ..Self::default()
        }
    }

    /// Number of fingerprints received.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether none was received.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Takes one worker's fingerprint (PerfTracker §4.2), which can be
    /// dropped afterwards.
    pub fn push(&mut self, fp: Fingerprint) {
        self.push_ref(&fp);
    }

    /// [`JobFingerprints::push`] of a fingerprint the caller keeps.
    pub fn push_ref(&mut self, fp: &Fingerprint) {
        self.count += 1;
        self.warnings.extend(
            fp.warnings
                .iter()
                .map(|w| format!("rank {} ({}): {w}", fp.worker, fp.source)),
        );
        self.note_job(fp);
        if !self.ranks.insert(fp.worker) && self.duplicate.is_none() {
            let first = self.first_input_of(fp.worker).unwrap_or_default();
            self.duplicate = Some((fp.worker, first, fp.source.clone()));
        }
        if !fp.steps.is_empty() {
            self.steps.push(IterationSeries {
                worker: Some(fp.worker),
                steps: fp.steps.iter().map(|s| s.0).collect(),
                ms: fp.steps.iter().map(|s| s.1).collect(),
            });
        }
        // A NaN window is empty too.
        let has_events = fp.window_us > 0.0 && !fp.functions.is_empty();
        if !has_events {
            self.empty.push((fp.worker, fp.source.clone()));
            return;
        }
        let row = self.table.workers();
        match self.table.push_fingerprint(fp) {
            Ok(()) => {
                if let Some(s) = &fp.network {
                    self.network.push((row, s.clone()));
                }
            }
            Err(e) => {
                self.error.get_or_insert(e);
            }
        }
    }

    /// Adds the fingerprint's identity and rank to its job's members.
    fn note_job(&mut self, fp: &Fingerprint) {
        let key = JobKey::of_fingerprint(fp);
        // Consecutive fingerprints are usually of one job: no new key.
        let id = match self.last_job.take() {
            Some(id) if id.key() == key => id,
            _ => JobId {
                id: key.id.map(str::to_string),
                world_size: key.world_size,
                device: key.device.map(str::to_string),
                backend: key.backend.map(str::to_string),
            },
        };
        match self.jobs.get_mut(&id) {
            Some(m) => m.ranks.push(fp.worker),
            None => {
                let members = JobMembers {
                    ranks: vec![fp.worker],
                    first: fp.source.clone(),
                };
                self.jobs.insert(id.clone(), members);
            }
        }
        self.last_job = Some(id);
    }

    /// The input of the first fingerprint received of `rank`.
    fn first_input_of(&self, rank: u32) -> Option<String> {
        let in_table = (0..self.table.workers())
            .find(|&i| self.table.rank(i) == rank)
            .map(|i| self.table.source(i));
        let empty = self.empty.iter().find(|e| e.0 == rank).map(|e| &e.1);
        // Only one of them can hold an earlier fingerprint of the rank
        // when this is the first rank received twice.
        in_table.or(empty.map(String::as_str)).map(str::to_string)
    }

    /// The identities stated, ordered, each with its inputs.
    pub(crate) fn jobs(&self) -> BTreeMap<JobKey<'_>, &JobMembers> {
        self.jobs.iter().map(|(id, m)| (id.key(), m)).collect()
    }
}

impl From<Vec<Fingerprint>> for JobFingerprints {
    fn from(fps: Vec<Fingerprint>) -> Self {
        let mut out = Self::with_capacity(fps.len());
        fps.into_iter().for_each(|fp| out.push(fp));
        out
    }
}

impl FromIterator<Fingerprint> for JobFingerprints {
    fn from_iter<I: IntoIterator<Item = Fingerprint>>(iter: I) -> Self {
        let mut out = Self::default();
        out.extend(iter);
        out
    }
}

impl Extend<Fingerprint> for JobFingerprints {
    fn extend<I: IntoIterator<Item = Fingerprint>>(&mut self, iter: I) {
        iter.into_iter().for_each(|fp| self.push(fp));
    }
}
