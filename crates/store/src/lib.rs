//! whyslow's storage (issue 31): one [`Store`] trait, tenant-scoped in
//! every method (isolation lives here, not only in the handlers), and its
//! backends:
//!
//! - [`sqlite::SqliteStore`], the embedded default: SQLite in
//!   `DATA/whyslow.db` with profiles moved to columnar [`segments`];
//! - [`clickhouse::ClickHouseStore`], the scale-out store: ClickHouse used as
//!   a column store (a stack dictionary and one row per sample);
//! - [`objects`] (S3-compatible object storage or a directory) and
//!   [`symbols`] (symbol indexes kept there).
//!
//! Both stores pass one [`conformance`] suite (their tests, and `whyslow
//! server check-store` on a live backend). Errors are one [`StoreError`]
//! that knows the HTTP status a server answers it with, so every door
//! reports a store failure the same way.

pub mod clickhouse;
pub mod objects;
pub mod segments;
pub mod sqlite;
pub mod symbols;

use std::collections::HashMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

pub use sqlite::SqliteStore;

/// Everything a store can fail with, for every backend.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The embedded database failed.
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
    /// A local file or directory could not be used.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// The request itself is wrong: a name that cannot be a tenant, job,
    /// session or batch, a Build-ID, an object key, a part number.
    #[error("{0}")]
    BadName(String),
    /// A location or option that cannot be used (object store URL).
    #[error("{0}")]
    Config(String),
    /// A remote backend (ClickHouse, the object store) failed or could not
    /// be reached: the message with its causes.
    #[error("{0}")]
    Backend(String),
}

impl StoreError {
    /// The HTTP status a server answers this error with: 400 for a request
    /// the store refuses, 503 for a remote backend that failed (the client
    /// may retry), 500 otherwise.
    pub fn http_status(&self) -> u16 {
        match self {
            StoreError::BadName(_) => 400,
            StoreError::Backend(_) => 503,
            StoreError::Db(_) | StoreError::Io(..) | StoreError::Config(_) => 500,
        }
    }
}

/// The kinds of data stored as uploaded batches of text (one batch-put and
/// one read for all of them; each its own table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BatchKind {
    /// JSON lines of `whyslow_model::collective::CollectiveRecord`, as the
    /// agents write them.
    Collectives,
    /// JSON lines of `whyslow_model::os::OsSample` (TCP counters among
    /// them), as the agents write them.
    OsSamples,
    /// One flow analysis: the JSON of `whyslow flows analyze --format json`
    /// (LLMPrism's jobs, steps, timelines and findings).
    Flows,
    /// One hang report: the JSON of `whyslow hang --format json`, as the
    /// online package uploads it after a stall.
    Hangs,
}

impl BatchKind {
    /// Every kind.
    pub const ALL: [BatchKind; 4] = [
        BatchKind::Collectives,
        BatchKind::OsSamples,
        BatchKind::Flows,
        BatchKind::Hangs,
    ];

    /// Its table's name in every backend.
    pub fn table(self) -> &'static str {
        match self {
            BatchKind::Collectives => "collectives",
            BatchKind::OsSamples => "os_samples",
            BatchKind::Flows => "flows",
            BatchKind::Hangs => "hangs",
        }
    }
}

/// A tenant's id (row id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantId(pub i64);

/// One job of a tenant, as `GET /api/v1/jobs` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobSummary {
    /// Job id as uploaded.
    pub job: String,
    /// Sessions with at least one fingerprint.
    pub sessions: u64,
    /// Fingerprints stored (all sessions).
    pub fingerprints: u64,
    /// Stack profiles stored (the node agents').
    pub profiles: u64,
    /// Last upload, Unix seconds.
    pub updated_unix_s: i64,
}

/// What is known of an uploaded profile without reading it again.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProfileMeta {
    /// The uploader's batch id: the same batch again is not stored twice.
    pub batch: String,
    /// `cpu` (samples), `offcpu` (µs blocked) or `host` (every process of a
    /// node).
    pub kind: String,
    /// The rank's label, when the profile is of one rank.
    pub rank: Option<String>,
    /// The host's label.
    pub host: Option<String>,
    /// Start of the profiled period, Unix ns.
    pub start_unix_ns: i64,
    /// Samples (or µs for `offcpu`).
    pub samples: u64,
}

/// Which end of a job's profiles to read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The latest first.
    NewestFirst,
    /// The earliest first (a job's own baseline: how it ran at the start).
    OldestFirst,
}

/// A stored profile as a store hands it back.
#[derive(Debug, Clone, PartialEq)]
pub enum StoredProfile {
    /// The pprof bytes as uploaded.
    Pprof(Vec<u8>),
    /// Read back from a columnar segment ([`crate::segments`]).
    Decoded(whyslow_model::stack::StackProfile),
}

impl StoredProfile {
    /// The profile; `None` for pprof bytes that do not decode within
    /// `max_decompressed` bytes.
    pub fn into_profile(self, max_decompressed: u64) -> Option<whyslow_model::stack::StackProfile> {
        match self {
            StoredProfile::Pprof(b) => whyslow_codec::from_pprof_limited(&b, max_decompressed).ok(),
            StoredProfile::Decoded(p) => Some(p),
        }
    }
}

/// One session of a job, as the web UI lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionSummary {
    /// Session id as uploaded.
    pub session: String,
    /// Workers whose fingerprint is stored.
    pub fingerprints: u64,
    /// Last upload, Unix seconds.
    pub updated_unix_s: i64,
}

/// What a store offers the service: the embedded [`SqliteStore`] and the
/// scale-out [`crate::clickhouse::ClickHouseStore`], both checked by
/// [`conformance`].
pub trait Store: Send + Sync {
    /// Creates `tenant` if needed and a new token for it; returns the token
    /// (only its hash is kept).
    fn create_token(&self, tenant: &str) -> Result<String, StoreError>;
    /// The tenant a bearer token belongs to.
    fn tenant_of_token(&self, token: &str) -> Result<Option<TenantId>, StoreError>;
    /// Stores (or replaces: uploads are idempotent per worker) one worker's
    /// fingerprint JSON.
    fn put_fingerprint(
        &self,
        tenant: TenantId,
        job: &str,
        session: &str,
        worker: u32,
        json: &str,
    ) -> Result<(), StoreError>;
    /// The fingerprints of one session, by worker.
    fn fingerprints(
        &self,
        tenant: TenantId,
        job: &str,
        session: &str,
    ) -> Result<Vec<String>, StoreError>;
    /// The tenant's jobs.
    fn jobs(&self, tenant: TenantId) -> Result<Vec<JobSummary>, StoreError>;
    /// Whether the tenant has this job.
    fn has_job(&self, tenant: TenantId, job: &str) -> Result<bool, StoreError>;
    /// The sessions of one of the tenant's jobs, newest upload first (empty
    /// when the tenant has no such job).
    fn sessions(&self, tenant: TenantId, job: &str) -> Result<Vec<SessionSummary>, StoreError>;
    /// Whether [`Store::put_profile`] reads the profile into rows and keeps
    /// no copy of the upload: the server then hands it the protobuf it
    /// already inflated to check the upload, instead of the gzip bytes.
    fn files_profiles_as_rows(&self) -> bool {
        false
    }
    /// Stores one uploaded stack profile (pprof bytes as uploaded, or their
    /// protobuf inflated where [`Store::files_profiles_as_rows`]) of a
    /// job; `false` when its batch was stored before (a retry, not counted
    /// twice).
    fn put_profile(
        &self,
        tenant: TenantId,
        job: &str,
        meta: &ProfileMeta,
        pprof: &[u8],
    ) -> Result<bool, StoreError>;
    /// The job's most recent `limit` profiles of `kind`, newest first.
    fn profiles(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<StoredProfile>, StoreError> {
        self.profiles_in_order(tenant, job, kind, limit, Order::NewestFirst)
    }
    /// `limit` profiles of `kind` of the job from one end of its history.
    fn profiles_in_order(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
        order: Order,
    ) -> Result<Vec<StoredProfile>, StoreError>;
    /// How many profiles of `kind` the job has.
    fn profile_count(&self, tenant: TenantId, job: &str, kind: &str) -> Result<u64, StoreError>;
    /// The job's profiles of `kind` that began in the hour starting at
    /// `hour_unix_s` (a multiple of 3600), merged; `None` when there are
    /// none. ClickHouse answers from its hourly rollups once they are
    /// complete (a baseline over weeks reads one row per stack and hour);
    /// pprof bytes that do not decode are left out.
    fn hour_profile(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        hour_unix_s: i64,
    ) -> Result<Option<whyslow_model::stack::StackProfile>, StoreError>;
    /// Stores one uploaded batch of `kind` of a job (text as uploaded);
    /// `false` when the tenant stored that batch before (a retry, not
    /// counted twice).
    fn put_batch(
        &self,
        tenant: TenantId,
        job: &str,
        kind: BatchKind,
        batch: &str,
        body: &str,
    ) -> Result<bool, StoreError>;
    /// The job's most recent `limit` batches of `kind`, newest first.
    fn batches(
        &self,
        tenant: TenantId,
        job: &str,
        kind: BatchKind,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;
    /// The job's `limit` profiles of `kind` from one end of its history,
    /// merged (a flame graph's input), and how many there were; `None` when
    /// there are none. ClickHouse sums the samples per stack itself; the
    /// default decodes and merges [`Store::profiles_in_order`].
    fn merged_profiles(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
        order: Order,
    ) -> Result<Option<(whyslow_model::stack::StackProfile, usize)>, StoreError> {
        let ps = self.profiles_in_order(tenant, job, kind, limit, order)?;
        let n = ps.len();
        Ok(merge_stored(ps).map(|p| (p, n)))
    }
    /// The top functions of a tenant's profiles of one kind over a time
    /// range, across its jobs (or some of them), with their change against
    /// a baseline range: what a cluster's SRE asks first ("which functions
    /// grew on this tenant's jobs since yesterday"). Both stores answer it
    /// themselves, with the same [`FunctionSums`] rules.
    fn functions(&self, tenant: TenantId, q: &FunctionQuery) -> Result<FunctionTable, StoreError>;
    /// Moves profiles uploaded before `before_unix_s` into the store's
    /// long-term layout; returns (profiles moved, segments written). The
    /// embedded store writes columnar segments ([`SqliteStore::compact`]);
    /// ClickHouse is columnar already.
    fn compact(&self, before_unix_s: i64) -> Result<(u64, u64), StoreError> {
        let _ = before_unix_s;
        Ok((0, 0))
    }
    /// Bytes and files of the long-term layout on local disk.
    fn segment_usage(&self) -> (u64, u64) {
        (0, 0)
    }
    /// Deletes fingerprints, profiles, collective records and flow analyses
    /// uploaded before `before_unix_s` (retention); returns how many. A store with
    /// its own expiry (ClickHouse's TTL) does nothing here.
    fn expire(&self, before_unix_s: i64) -> Result<u64, StoreError> {
        let _ = before_unix_s;
        Ok(0)
    }
}

/// Checks a job, session or tenant name: 1–200 bytes of letters, digits,
/// `-_.:@`, not starting with a dot.
pub fn check_name(what: &str, s: &str) -> Result<(), StoreError> {
    let ok = !s.is_empty()
        && s.len() <= 200
        && !s.starts_with('.')
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:@".contains(c));
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadName(format!(
            "{what} {s:?}: expected 1-200 characters of letters, digits and -_.:@"
        )))
    }
}

/// A new random token: `wsk_` and 48 hex digits.
pub(crate) fn new_token() -> Result<String, StoreError> {
    let mut raw = [0u8; 24];
    getrandom::fill(&mut raw)
        .map_err(|e| StoreError::Io("getrandom".into(), std::io::Error::other(e.to_string())))?;
    Ok(std::iter::once("wsk_".to_string())
        .chain(raw.iter().map(|b| format!("{b:02x}")))
        .collect())
}

/// `n` random bytes as hex (names that must not collide, as segments').
pub(crate) fn random_hex(n: usize) -> String {
    let mut raw = vec![0u8; n];
    // A failed getrandom leaves zeros: the name then comes from the clock.
    if getrandom::fill(&mut raw).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        raw.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (t >> (8 * (i % 16))) as u8);
    }
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub(crate) fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// `GET /api/v1/functions`: the question a store answers with
/// [`Store::functions`].
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionQuery {
    /// `cpu`, `offcpu` or `host`.
    pub kind: String,
    /// Only these jobs (empty: all of the tenant's jobs).
    pub jobs: Vec<String>,
    /// Profiles that began in `[from, to)`, Unix ns.
    pub range: (i64, i64),
    /// The baseline: profiles that began in this range, Unix ns.
    pub baseline: Option<(i64, i64)>,
    /// Most functions returned (after sorting by self samples).
    pub limit: usize,
}

/// One function's samples over a range: in its own code (the stack's
/// leaf, "self") and anywhere on the stack ("total", once per stack even
/// when it recurses).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FunctionSamples {
    /// Samples whose leaf is the function.
    pub self_samples: u64,
    /// Samples with the function anywhere on the stack.
    pub total_samples: u64,
}

/// Per-function sums of one range, built from decoded profiles (the
/// embedded store) or read from ClickHouse's GROUP BY: one rule for naming
/// a function ([`function_name`]) and for self and total, so both stores
/// answer alike.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FunctionSums {
    /// All samples of the range.
    pub samples: u64,
    /// Profiles read.
    pub profiles: u64,
    /// By function name.
    pub by_function: HashMap<String, FunctionSamples>,
}

/// A frame's function as the cross-job query names it: the symbol (a
/// Python function with its file, no line: one function across its lines),
/// else `module+0xoffset`; `None` for label frames (threads, processes),
/// which are not code.
pub fn function_name(f: &whyslow_model::stack::Frame) -> Option<String> {
    use whyslow_model::stack::FrameKind;
    match (f.kind, &f.name) {
        (FrameKind::Label, _) => None,
        (FrameKind::Python, Some(n)) => Some(match &f.module {
            Some(m) => format!("{n} ({m})"),
            None => n.clone(),
        }),
        _ => Some(f.display()),
    }
}

/// The functions of one stack (root first) as [`function_name`] names
/// them, labels left out: what the ClickHouse store keeps per stack.
pub fn stack_functions<'a>(
    frames: impl IntoIterator<Item = &'a whyslow_model::stack::Frame>,
) -> Vec<String> {
    frames.into_iter().filter_map(function_name).collect()
}

impl FunctionSums {
    /// Adds one stack's functions (root first) with `count` samples.
    pub fn add_stack(&mut self, functions: &[String], count: u64) {
        self.samples += count;
        let Some(leaf) = functions.last() else {
            return;
        };
        self.by_function
            .entry(leaf.clone())
            .or_default()
            .self_samples += count;
        let mut seen: Vec<&String> = Vec::with_capacity(functions.len());
        for f in functions {
            if !seen.contains(&f) {
                seen.push(f);
                self.by_function.entry(f.clone()).or_default().total_samples += count;
            }
        }
    }

    /// Adds another range's sums (gathered in parallel).
    pub fn absorb(&mut self, other: FunctionSums) {
        self.samples += other.samples;
        self.profiles += other.profiles;
        for (f, s) in other.by_function {
            let e = self.by_function.entry(f).or_default();
            e.self_samples += s.self_samples;
            e.total_samples += s.total_samples;
        }
    }

    /// Adds one profile: each of its frames named once, its stacks summed
    /// per function locally, then merged (the same sums as
    /// [`Self::add_stack`] per stack, without a string per frame per stack).
    pub fn add_profile(&mut self, p: &whyslow_model::stack::StackProfile) {
        self.profiles += 1;
        let mut local: rustc_hash::FxHashMap<String, usize> = Default::default();
        let fn_of: Vec<Option<usize>> = p
            .frames
            .iter()
            .map(|f| {
                function_name(f).map(|name| {
                    let n = local.len();
                    *local.entry(name).or_insert(n)
                })
            })
            .collect();
        let mut sums = vec![FunctionSamples::default(); local.len()];
        // Stamp per function: the last stack that counted it in `total`.
        let mut stamp = vec![usize::MAX; local.len()];
        for (si, st) in p.stacks.iter().enumerate() {
            self.samples += st.count;
            let mut leaf = None;
            for &fi in &st.frames {
                let Some(Some(f)) = fn_of.get(fi as usize).copied() else {
                    continue;
                };
                leaf = Some(f);
                if stamp[f] != si {
                    stamp[f] = si;
                    sums[f].total_samples += st.count;
                }
            }
            if let Some(f) = leaf {
                sums[f].self_samples += st.count;
            }
        }
        for (name, i) in local {
            let (s, t) = (sums[i].self_samples, sums[i].total_samples);
            if s == 0 && t == 0 {
                continue;
            }
            let e = self.by_function.entry(name).or_default();
            e.self_samples += s;
            e.total_samples += t;
        }
    }
}

/// One function in the answer to [`Store::functions`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionShare {
    /// The function ([`function_name`]).
    pub function: String,
    /// Samples in its own code.
    pub self_samples: u64,
    /// Samples with it on the stack.
    pub total_samples: u64,
    /// `self_samples` over all samples of the range.
    pub self_share: f64,
    /// `total_samples` over all samples of the range.
    pub total_share: f64,
    /// Its self share in the baseline range (0 when absent there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_self_share: Option<f64>,
    /// `self_share - base_self_share`: positive when it grew.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_share_change: Option<f64>,
}

/// The answer to [`Store::functions`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionTable {
    /// Samples of the range.
    pub samples: u64,
    /// Profiles of the range.
    pub profiles: u64,
    /// Samples of the baseline range, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_samples: Option<u64>,
    /// Profiles of the baseline range, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_profiles: Option<u64>,
    /// The top functions by self samples (ties by name), at most the
    /// query's limit.
    pub functions: Vec<FunctionShare>,
}

impl FunctionTable {
    /// The table of `now` against `base`: shares, change, the top `limit`.
    pub fn from_sums(now: &FunctionSums, base: Option<&FunctionSums>, limit: usize) -> Self {
        let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
        let mut functions: Vec<FunctionShare> = now
            .by_function
            .iter()
            .map(|(f, s)| {
                let self_share = share(s.self_samples, now.samples);
                let base_self = base.map(|b| {
                    share(
                        b.by_function.get(f).map_or(0, |x| x.self_samples),
                        b.samples,
                    )
                });
                FunctionShare {
                    function: f.clone(),
                    self_samples: s.self_samples,
                    total_samples: s.total_samples,
                    self_share,
                    total_share: share(s.total_samples, now.samples),
                    base_self_share: base_self,
                    self_share_change: base_self.map(|b| self_share - b),
                }
            })
            .collect();
        functions.sort_by(|a, b| {
            b.self_samples
                .cmp(&a.self_samples)
                .then(b.total_samples.cmp(&a.total_samples))
                .then_with(|| a.function.cmp(&b.function))
        });
        functions.truncate(limit);
        FunctionTable {
            samples: now.samples,
            profiles: now.profiles,
            base_samples: base.map(|b| b.samples),
            base_profiles: base.map(|b| b.profiles),
            functions,
        }
    }
}

mod conformance;
pub use conformance::conformance;

/// `profiles` decoded and merged; `None` when none decodes. Decoded on
/// every core, one profile at a time per core (never all of them held).
pub fn merge_stored(profiles: Vec<StoredProfile>) -> Option<whyslow_model::stack::StackProfile> {
    let m = fold_decoded(
        profiles,
        |m: &mut whyslow_model::stack::StackProfileMerger, p| m.add(p),
        |a, b| a.absorb(b),
    );
    (m.profiles() > 0).then(|| m.finish())
}

/// Decodes `profiles` on up to every core, folding each decoded profile
/// into a per-core accumulator with `add` (then dropping it), and the
/// accumulators into one with `combine`; profiles that do not decode are
/// left out.
pub fn fold_decoded<A: Default + Send>(
    profiles: Vec<StoredProfile>,
    add: impl Fn(&mut A, &whyslow_model::stack::StackProfile) + Sync,
    combine: impl Fn(&mut A, A),
) -> A {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    let parts = cores.min(profiles.len() / 16).max(1);
    let mut split: Vec<Vec<StoredProfile>> = (0..parts).map(|_| Vec::new()).collect();
    for (i, p) in profiles.into_iter().enumerate() {
        split[i % parts].push(p);
    }
    let one = |part: Vec<StoredProfile>| {
        let mut acc = A::default();
        for p in part {
            if let Some(p) = p.into_profile(whyslow_codec::MAX_PPROF_DECOMPRESSED) {
                add(&mut acc, &p);
            }
        }
        acc
    };
    if parts == 1 {
        return one(split.pop().unwrap_or_default());
    }
    let accs: Vec<A> = std::thread::scope(|sc| {
        let handles: Vec<_> = split
            .into_iter()
            .map(|part| sc.spawn(|| one(part)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let mut it = accs.into_iter();
    let mut total = it.next().unwrap_or_default();
    for a in it {
        combine(&mut total, a);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use whyslow_model::stack::{Frame, FrameKind, StackProfileBuilder};

    /// A profile's sums, per stack through `add_stack` and at once through
    /// `add_profile`, agree — on random profiles with recursion, Python
    /// frames at several lines of one function, unnamed frames and labels.
    #[test]
    fn a_profile_sums_as_its_stacks_do() {
        let mut rng = whyslow_model::rng::SplitMix64::new(7);
        for _ in 0..200 {
            let mut b = StackProfileBuilder::new();
            let pool: Vec<Frame> = (0..12)
                .map(|i| match i % 4 {
                    0 => Frame::label(format!("thread-{i}")),
                    1 => Frame {
                        kind: FrameKind::Python,
                        name: Some(format!("step{}", i % 3)),
                        module: Some("train.py".into()),
                        build_id: None,
                        offset: 0,
                        line: Some(i as u32),
                    },
                    2 => Frame {
                        kind: FrameKind::Native,
                        name: None,
                        module: Some("/lib/libc.so.6".into()),
                        build_id: None,
                        offset: 0x100 * (i as u64 % 3),
                        line: None,
                    },
                    _ => Frame {
                        kind: FrameKind::Native,
                        name: Some(format!("f{}", i % 5)),
                        module: None,
                        build_id: None,
                        offset: 0,
                        line: None,
                    },
                })
                .collect();
            for _ in 0..(1 + rng.next_u64() % 20) {
                let depth = 1 + rng.next_u64() % 8;
                let ids = (0..depth)
                    .map(|_| b.frame(pool[(rng.next_u64() % 12) as usize].clone()))
                    .collect();
                b.add(ids, rng.next_u64() % 50);
            }
            let p = b.finish(99.0, 0, 1);
            let mut per_stack = FunctionSums::default();
            for st in &p.stacks {
                let fns = stack_functions(st.frames.iter().map(|&i| &p.frames[i as usize]));
                per_stack.add_stack(&fns, st.count);
            }
            per_stack.profiles = 1;
            per_stack
                .by_function
                .retain(|_, s| s.self_samples + s.total_samples > 0);
            let mut at_once = FunctionSums::default();
            at_once.add_profile(&p);
            assert_eq!(per_stack, at_once);
        }
    }
}
