//! The group commit of profiles: uploads queue their rows, one of them
//! writes the group, every one learns its outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::rows::{ProfileRow, SampleRow, SeenBatch, StackRow};
use super::ClickHouseStore;
use crate::StoreError;

/// One profile's rows, waiting for a group commit.
pub(super) struct PendingProfile {
    pub(super) seq: u64,
    pub(super) stacks: Vec<StackRow>,
    /// (stack id, value): [`SampleRow`]s once written.
    pub(super) samples: Vec<(u64, u64)>,
    pub(super) profile: ProfileRow,
}

/// Group commit of profiles (issue 31: ingest at the speed of the data):
/// an upload queues its rows; the upload that finds no commit running
/// writes everything queued so far — one duplicate check and three
/// inserts for all of them — and every upload answers once its rows are
/// written (or not). When a commit ends and uploads wait, the first of
/// them is woken to write the next group (one wake-up, not a herd). Under
/// load, groups grow with the uploads that arrived during the previous
/// commit; alone, an upload commits at once.
#[derive(Default)]
pub(super) struct GroupCommit {
    state: Mutex<CommitState>,
}

#[derive(Default)]
struct CommitState {
    next_seq: u64,
    queue: Vec<(PendingProfile, Arc<Slot>)>,
    committing: bool,
}

/// Where one waiting upload learns its outcome, or that it leads the
/// next commit.
#[derive(Default)]
struct Slot {
    state: Mutex<SlotState>,
    ready: std::sync::Condvar,
}

#[derive(Default)]
enum SlotState {
    #[default]
    Waiting,
    /// Write the queued group.
    Lead,
    /// Stored (true), a retry (false), or why not.
    Done(Result<bool, String>),
}

impl Slot {
    fn set(&self, s: SlotState) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s;
        self.ready.notify_one();
    }
}

impl ClickHouseStore {
    /// Queues one profile's rows and answers once a group commit wrote
    /// them ([`GroupCommit`]).
    pub(super) fn commit(&self, mut p: PendingProfile) -> Result<bool, StoreError> {
        let g = &self.commits;
        let slot = Arc::new(Slot::default());
        let lead = {
            let mut st = g.state.lock().unwrap_or_else(|e| e.into_inner());
            st.next_seq += 1;
            p.seq = st.next_seq;
            st.queue.push((p, slot.clone()));
            !std::mem::replace(&mut st.committing, true)
        };
        if lead {
            self.lead_commit();
        }
        loop {
            let mut state = slot.state.lock().unwrap_or_else(|e| e.into_inner());
            while matches!(*state, SlotState::Waiting) {
                state = slot.ready.wait(state).unwrap_or_else(|e| e.into_inner());
            }
            match std::mem::take(&mut *state) {
                SlotState::Done(r) => return r.map_err(StoreError::Backend),
                SlotState::Lead => {
                    drop(state);
                    self.lead_commit();
                }
                SlotState::Waiting => {}
            }
        }
    }

    /// Writes the queued group (this thread holds `committing`), answers
    /// its uploads, then hands `committing` to the first upload queued
    /// meanwhile, or lets it go.
    fn lead_commit(&self) {
        let g = &self.commits;
        let group = std::mem::take(&mut g.state.lock().unwrap_or_else(|e| e.into_inner()).queue);
        let (profiles, slots): (Vec<_>, Vec<_>) = group.into_iter().unzip();
        let by_seq: HashMap<u64, Arc<Slot>> = profiles.iter().map(|p| p.seq).zip(slots).collect();
        let mut results: HashMap<u64, Result<bool, String>> =
            self.write_group(profiles).into_iter().collect();
        // Every upload of the group is answered, whatever happened.
        for (seq, slot) in by_seq {
            let r = results
                .remove(&seq)
                .unwrap_or_else(|| Err("the group commit gave no answer".into()));
            slot.set(SlotState::Done(r));
        }
        let mut st = g.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.queue.first() {
            Some((_, next)) => next.set(SlotState::Lead),
            None => st.committing = false,
        }
    }

    /// Writes a group of queued profiles: one check for batches stored
    /// before (a retry: `false`, as is a second copy in the same group),
    /// then stacks, samples and profile rows in one insert each — stacks
    /// first and profiles last, so a reader that finds a profile finds all
    /// it needs, and a failed commit is redone whole by the retries (the
    /// same rows, merged by the sort keys).
    fn write_group(&self, group: Vec<PendingProfile>) -> Vec<(u64, Result<bool, String>)> {
        let keys: Vec<(i64, String)> = group
            .iter()
            .map(|p| (p.profile.tenant, p.profile.batch.clone()))
            .collect();
        // The sort key's prefix (tenant, job, kind) narrows the read. (`IN`,
        // not `has`: `has` compares tuples of literals without converting
        // their types, so (5, 'b') never equals an (Int64, String).)
        let mut prefix: Vec<(i64, String, String)> = group
            .iter()
            .map(|p| {
                (
                    p.profile.tenant,
                    p.profile.job.clone(),
                    p.profile.kind.clone(),
                )
            })
            .collect();
        prefix.sort();
        prefix.dedup();
        let sql = format!(
            "SELECT tenant, batch FROM {}.profiles
             WHERE (tenant, job, kind) IN ? AND (tenant, batch) IN ?",
            self.cfg.database
        );
        let seen: Result<Vec<SeenBatch>, StoreError> = self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(&prefix)
                .bind(&keys)
                .fetch_all()
        });
        let seen: std::collections::HashSet<(i64, String)> = match seen {
            Ok(rows) => rows.into_iter().map(|r| (r.tenant, r.batch)).collect(),
            Err(e) => {
                self.forget_stacks(&group);
                let e = e.to_string();
                return group.into_iter().map(|p| (p.seq, Err(e.clone()))).collect();
            }
        };
        let mut taken = std::collections::HashSet::new();
        let mut results = Vec::with_capacity(group.len());
        let (mut stacks, mut sample_sets, mut profiles) = (Vec::new(), Vec::new(), Vec::new());
        let mut new_seqs = Vec::new();
        let mut stack_ids = std::collections::HashSet::new();
        for p in group {
            let key = (p.profile.tenant, p.profile.batch.clone());
            if seen.contains(&key) || !taken.insert(key) {
                results.push((p.seq, Ok(false)));
                continue;
            }
            new_seqs.push(p.seq);
            stacks.extend(
                p.stacks
                    .into_iter()
                    .filter(|s| stack_ids.insert((s.tenant, s.stack_id))),
            );
            sample_sets.push(p.samples);
            profiles.push(p.profile);
        }
        let samples: Vec<SampleRow> = profiles
            .iter()
            .zip(&sample_sets)
            .flat_map(|(p, set)| {
                set.iter().map(move |&(stack_id, value)| SampleRow {
                    tenant: p.tenant,
                    job: &p.job,
                    kind: &p.kind,
                    host: p.host.as_deref().unwrap_or_default(),
                    rank: p.rank.as_deref().unwrap_or_default(),
                    start_unix_ns: p.start_unix_ns,
                    batch: &p.batch,
                    stack_id,
                    value,
                    uploaded_ns: p.uploaded_ns,
                })
            })
            .collect();
        let written = self
            .insert::<StackRow>("stacks", &stacks)
            .and_then(|()| self.insert::<SampleRow>("samples", &samples))
            .and_then(|()| self.insert::<ProfileRow>("profiles", &profiles));
        match written {
            Ok(()) => results.extend(new_seqs.into_iter().map(|s| (s, Ok(true)))),
            Err(e) => {
                let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
                for s in &stacks {
                    known.remove(&(s.tenant, s.stack_id));
                }
                let e = e.to_string();
                results.extend(new_seqs.into_iter().map(|s| (s, Err(e.clone()))));
            }
        }
        results
    }

    /// Forgets that the group's stacks are in the dictionary (its commit
    /// failed: the next profile that uses them writes them).
    fn forget_stacks(&self, group: &[PendingProfile]) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        for s in group.iter().flat_map(|p| &p.stacks) {
            known.remove(&(s.tenant, s.stack_id));
        }
    }
}
