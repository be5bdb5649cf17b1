//! The scale-out store: ClickHouse used as a column store (issue 31), the
//! way continuous profilers keep profiles (Pyroscope, Parca; Coroot in
//! ClickHouse): a stack dictionary and one row per (profile, stack), so
//! flame graphs, baselines and the cross-job function query are
//! `GROUP BY`s that ClickHouse runs, not blobs the server fetches and
//! decodes. The same [`Store`] as the embedded one, checked by the same
//! [`crate::conformance`] suite (`whyslow server check-store`).
//!
//! Tables (`MergeTree` family, sorted by tenant first, so every query reads
//! one tenant's range; isolation is in every `WHERE`, as in SQLite):
//!
//! | table | engine, sort key | what |
//! |---|---|---|
//! | `tokens` | ReplacingMergeTree, `hash` | SHA-256 of each token → tenant |
//! | `tenants` | ReplacingMergeTree, `name` | tenant names and ids |
//! | `fingerprints` | ReplacingMergeTree(`uploaded_ns`), `(tenant, job, session, worker)` | one worker's fingerprint JSON per session; a re-upload replaces it |
//! | `profiles` | ReplacingMergeTree, `(tenant, job, kind, batch)` | one row per uploaded profile: rank, host, period, rate, labels |
//! | `samples` | ReplacingMergeTree, `(tenant, kind, job, start_unix_ns, batch, stack_id)`, partitioned by day | one row per stack of a profile: its samples |
//! | `stacks` | ReplacingMergeTree(`seen_ns`), `(tenant, stack_id)` | the stack dictionary: frames (JSON) and the functions the cross-job query groups by |
//! | `collectives`, `os_samples`, `flows`, `hangs` | ReplacingMergeTree, `(tenant, job, batch)` | uploaded text batches |
//!
//! Rows go in through the official `clickhouse` client in ClickHouse's
//! binary row format (`RowBinary`); values in queries are bound by the
//! client, never pasted into SQL text. Data rows carry a TTL
//! (`--retention-days`); a stack's `seen_ns` is renewed at least daily
//! while profiles use it. Reads use `FINAL`, so a retried batch (even two
//! racing) is never counted twice before ClickHouse merges parts.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clickhouse::{Client, Row};
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use whyslow_model::stack::{Frame, StackProfile, StackProfileBuilder};

use crate::{
    check_name, new_token, stack_functions, token_hash, BatchKind, FunctionQuery, FunctionSamples,
    FunctionSums, FunctionTable, JobSummary, Order, ProfileMeta, SessionSummary, Store, StoreError,
    StoredProfile, TenantId,
};

/// How to reach ClickHouse.
#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    /// HTTP endpoint, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// Database (created if missing).
    pub database: String,
    /// User, if any.
    pub user: Option<String>,
    /// Password, if any.
    pub password: Option<String>,
    /// Days fingerprints and profiles are kept.
    pub retention_days: u32,
}

/// Most stack ids remembered as already in the dictionary (then the memo
/// starts over: a stack is written again at worst).
const KNOWN_STACKS: usize = 1 << 20;

/// The ClickHouse store.
pub struct ClickHouseStore {
    cfg: ClickHouseConfig,
    client: Client,
    /// The client is async; the [`Store`] is called from blocking threads.
    rt: Option<tokio::runtime::Runtime>,
    /// (tenant, stack id) → the day (Unix s / 86400) it was last written,
    /// so a profile writes only the stacks the dictionary lacks, and
    /// renews a used stack's TTL once a day.
    known: Mutex<FxHashMap<(i64, u64), i64>>,
    /// Frames' digests by content.
    digests: Mutex<DigestMemo>,
    commits: GroupCommit,
}

impl Drop for ClickHouseStore {
    fn drop(&mut self) {
        // Dropped from async code (the server's shutdown): no blocking.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// A tenant's id: from its name, so every server computes the same one
/// without a shared counter.
fn tenant_id(name: &str) -> i64 {
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
struct DigestMemo {
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
fn view_stack_ids(v: &whyslow_codec::PprofView<'_>, memo: &mut DigestMemo) -> Vec<u64> {
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
struct TenantRow<'a> {
    name: &'a str,
    id: i64,
}

#[derive(Row, Serialize)]
struct TokenRow<'a> {
    hash: &'a str,
    tenant: i64,
    created_ns: u64,
}

#[derive(Row, Serialize)]
struct FingerprintRow<'a> {
    tenant: i64,
    job: &'a str,
    session: &'a str,
    worker: u32,
    json: &'a str,
    uploaded_ns: u64,
}

#[derive(Row, Serialize)]
struct BatchRow<'a> {
    tenant: i64,
    job: &'a str,
    batch: &'a str,
    body: &'a str,
    uploaded_ns: u64,
}

/// One uploaded profile (its samples are in `samples`).
#[derive(Row, Serialize, Deserialize)]
struct ProfileRow {
    tenant: i64,
    job: String,
    kind: String,
    batch: String,
    rank: Option<String>,
    host: Option<String>,
    start_unix_ns: i64,
    /// The period's start as the profile itself says.
    period_start_ns: u64,
    duration_ns: u64,
    hz: f64,
    samples: u64,
    /// The profile's labels as JSON.
    labels: String,
    uploaded_ns: u64,
}

/// Borrowed from its profile's row: a profile's hundreds of samples share
/// its names (owned copies were most of an upload's allocations).
#[derive(Row, Serialize)]
struct SampleRow<'a> {
    tenant: i64,
    job: &'a str,
    kind: &'a str,
    host: &'a str,
    rank: &'a str,
    start_unix_ns: i64,
    batch: &'a str,
    stack_id: u64,
    value: u64,
    uploaded_ns: u64,
}

#[derive(Row, Serialize)]
struct StackRow {
    tenant: i64,
    stack_id: u64,
    frames: String,
    functions: Vec<String>,
    seen_ns: u64,
}

#[derive(Row, Deserialize)]
struct SeenBatch {
    tenant: i64,
    batch: String,
}

/// One profile's rows, waiting for a group commit.
struct PendingProfile {
    seq: u64,
    stacks: Vec<StackRow>,
    /// (stack id, value): [`SampleRow`]s once written.
    samples: Vec<(u64, u64)>,
    profile: ProfileRow,
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
struct GroupCommit {
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

#[derive(Row, Deserialize)]
struct StackFrames {
    stack_id: u64,
    frames: String,
}

#[derive(Row, Deserialize)]
struct BatchSample {
    batch: String,
    stack_id: u64,
    value: u64,
}

#[derive(Row, Deserialize)]
struct StackSum {
    stack_id: u64,
    value: u64,
}

#[derive(Row, Deserialize)]
struct FunctionRow {
    function: String,
    self_samples: u64,
    total_samples: u64,
}

#[derive(Row, Deserialize)]
struct Totals {
    samples: u64,
    profiles: u64,
}

#[derive(Row, Deserialize)]
struct JobRow {
    job: String,
    sessions: u64,
    fingerprints: u64,
    profiles: u64,
    updated: i64,
}

#[derive(Row, Deserialize)]
struct SessionRow {
    session: String,
    n: u64,
    updated: i64,
}

#[derive(Row, Deserialize)]
struct Text {
    body: String,
}

#[derive(Row, Deserialize)]
struct Count {
    n: u64,
}

#[derive(Row, Deserialize)]
struct Id {
    tenant: i64,
}

/// The columns of [`ProfileRow`], in order.
const PROFILE_COLUMNS: &str = "tenant, job, kind, batch, rank, host, start_unix_ns, period_start_ns, duration_ns, hz, samples, labels, uploaded_ns";

impl ClickHouseStore {
    /// Connects and creates the database and tables if missing.
    pub fn open(cfg: ClickHouseConfig) -> Result<Self, StoreError> {
        check_name("database", &cfg.database)?;
        if cfg.database.contains(['.', ':', '@', '-']) {
            return Err(StoreError::BadName(format!(
                "database {:?}: expected letters, digits and _",
                cfg.database
            )));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("whyslow-clickhouse")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Config(format!("ClickHouse client runtime: {e}")))?;
        let mut client = Client::default()
            .with_url(cfg.url.trim_end_matches('/'))
            // Plain RowBinary both ways: no schema round trip per insert.
            .with_validation(false)
            .with_compression(clickhouse::Compression::None);
        if let Some(u) = &cfg.user {
            client = client.with_user(u);
        }
        if let Some(p) = &cfg.password {
            client = client.with_password(p);
        }
        let s = ClickHouseStore {
            cfg,
            client,
            rt: Some(rt),
            known: Mutex::new(FxHashMap::default()),
            digests: Mutex::new(DigestMemo::default()),
            commits: GroupCommit::default(),
        };
        s.create_tables()?;
        Ok(s)
    }

    fn create_tables(&self) -> Result<(), StoreError> {
        let db = &self.cfg.database;
        let days = self.cfg.retention_days.max(1);
        let ttl = format!("TTL toDateTime(intDiv(uploaded_ns, 1000000000)) + INTERVAL {days} DAY");
        let mut ddl = vec![
            format!("CREATE DATABASE IF NOT EXISTS {db}"),
            format!(
                "CREATE TABLE IF NOT EXISTS {db}.tenants (name String, id Int64)
                 ENGINE = ReplacingMergeTree ORDER BY name"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {db}.tokens (hash String, tenant Int64, created_ns UInt64)
                 ENGINE = ReplacingMergeTree ORDER BY hash"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {db}.fingerprints (
                     tenant Int64, job String, session String, worker UInt32,
                     json String CODEC(ZSTD(3)), uploaded_ns UInt64)
                 ENGINE = ReplacingMergeTree(uploaded_ns) ORDER BY (tenant, job, session, worker) {ttl}"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {db}.profiles (
                     tenant Int64, job String, kind LowCardinality(String), batch String,
                     rank Nullable(String), host Nullable(String), start_unix_ns Int64,
                     period_start_ns UInt64, duration_ns UInt64, hz Float64, samples UInt64,
                     labels String CODEC(ZSTD(3)), uploaded_ns UInt64)
                 ENGINE = ReplacingMergeTree ORDER BY (tenant, job, kind, batch) {ttl}"
            ),
            // One row per (profile, stack); by day of the profile's start,
            // so a time range reads its days only.
            format!(
                "CREATE TABLE IF NOT EXISTS {db}.samples (
                     tenant Int64, job LowCardinality(String), kind LowCardinality(String),
                     host LowCardinality(String), rank LowCardinality(String),
                     start_unix_ns Int64 CODEC(Delta, ZSTD(1)), batch String,
                     stack_id UInt64, value UInt64 CODEC(T64, ZSTD(1)), uploaded_ns UInt64)
                 ENGINE = ReplacingMergeTree
                 PARTITION BY toYYYYMMDD(toDateTime(intDiv(greatest(start_unix_ns, 0), 1000000000)))
                 ORDER BY (tenant, kind, job, start_unix_ns, batch, stack_id) {ttl}"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {db}.stacks (
                     tenant Int64, stack_id UInt64, frames String CODEC(ZSTD(3)),
                     functions Array(String) CODEC(ZSTD(3)), seen_ns UInt64)
                 ENGINE = ReplacingMergeTree(seen_ns) ORDER BY (tenant, stack_id)
                 TTL toDateTime(intDiv(seen_ns, 1000000000)) + INTERVAL {days} DAY"
            ),
        ];
        for kind in BatchKind::ALL {
            ddl.push(format!(
                "CREATE TABLE IF NOT EXISTS {db}.{} (
                     tenant Int64, job String, batch String, body String CODEC(ZSTD(3)),
                     uploaded_ns UInt64)
                 ENGINE = ReplacingMergeTree ORDER BY (tenant, job, batch) {ttl}",
                kind.table()
            ));
        }
        for sql in ddl {
            self.run(&sql, || self.client.query(&sql).execute())?;
        }
        Ok(())
    }

    /// Runs one request to ClickHouse to its end. A connection refused or
    /// reset (a restarting server, a full listen backlog) is retried: every
    /// request here is idempotent (DDL with IF NOT EXISTS; inserts into
    /// ReplacingMergeTree tables read with FINAL). An answer is not.
    fn run<T: Send, F: Future<Output = clickhouse::error::Result<T>>>(
        &self,
        what: &str,
        mut request: impl FnMut() -> F + Send,
    ) -> Result<T, StoreError> {
        let rt = self
            .rt
            .as_ref()
            .expect("the runtime lives as long as the store");
        // Called from a caller's runtime (the server's blocking threads, an
        // async test), blocking on another runtime needs leave: in place on
        // a multi-threaded runtime, else from a thread of its own.
        let flavor = tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor());
        let mut once = || match flavor {
            Err(_) => rt.block_on(request()),
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| rt.block_on(request()))
            }
            Ok(_) => std::thread::scope(|s| {
                s.spawn(|| rt.block_on(request()))
                    .join()
                    .unwrap_or_else(|_| {
                        Err(clickhouse::error::Error::Custom(
                            "the request panicked".into(),
                        ))
                    })
            }),
        };
        let mut attempt = 0;
        loop {
            match once() {
                Ok(v) => return Ok(v),
                Err(clickhouse::error::Error::Network(_)) if attempt < 3 => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(50 << attempt));
                }
                Err(e) => {
                    let first: String = what
                        .split_whitespace()
                        .take(6)
                        .collect::<Vec<_>>()
                        .join(" ");
                    return Err(StoreError::Backend(format!(
                        "ClickHouse at {} ({first} …): {e}",
                        self.cfg.url
                    )));
                }
            }
        }
    }

    /// Inserts `rows` into `table` in one request.
    fn insert<T>(&self, table: &str, rows: &[T::Value<'_>]) -> Result<(), StoreError>
    where
        T: clickhouse::RowWrite,
        for<'a> T::Value<'a>: Sync,
    {
        if rows.is_empty() {
            return Ok(());
        }
        let full = format!("{}.{table}", self.cfg.database);
        self.run(&format!("INSERT INTO {full}"), || async {
            let mut ins = self.client.insert_unescaped::<T>(&full).await?;
            for r in rows {
                ins.write(r).await?;
            }
            ins.end().await
        })
    }

    /// Queues one profile's rows and answers once a group commit wrote
    /// them ([`GroupCommit`]).
    fn commit(&self, mut p: PendingProfile) -> Result<bool, StoreError> {
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

    /// Drops this store's database (for `check-store`'s scratch database).
    pub fn drop_database(&self) -> Result<(), StoreError> {
        let sql = format!("DROP DATABASE IF EXISTS {}", self.cfg.database);
        self.run(&sql, || self.client.query(&sql).execute())
    }

    /// Whether the tenant stored `batch` in `table` before.
    fn seen(&self, table: &str, tenant: TenantId, batch: &str) -> Result<bool, StoreError> {
        let sql = format!(
            "SELECT count() AS n FROM {}.{table} WHERE tenant = ? AND batch = ?",
            self.cfg.database
        );
        let n: Vec<Count> = self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(tenant.0)
                .bind(batch)
                .fetch_all()
        })?;
        Ok(n.first().is_some_and(|c| c.n > 0))
    }

    /// The profile rows of a job and kind from one end, `limit` of them.
    fn profile_rows(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
        order: Order,
    ) -> Result<Vec<ProfileRow>, StoreError> {
        let dir = match order {
            Order::NewestFirst => "DESC",
            Order::OldestFirst => "ASC",
        };
        let sql = format!(
            "SELECT {PROFILE_COLUMNS} FROM {}.profiles FINAL
             WHERE tenant = ? AND job = ? AND kind = ?
             ORDER BY start_unix_ns {dir}, batch {dir} LIMIT ?",
            self.cfg.database
        );
        self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(tenant.0)
                .bind(job)
                .bind(kind)
                .bind(limit as u64)
                .fetch_all()
        })
    }

    /// The frames of the stacks that `samples_where` selects (a condition
    /// on `samples` with its bound values), by stack id.
    fn stack_frames(
        &self,
        tenant: TenantId,
        samples_where: &str,
        bind: impl Fn(clickhouse::query::Query) -> clickhouse::query::Query + Sync,
    ) -> Result<HashMap<u64, Vec<Frame>>, StoreError> {
        let db = &self.cfg.database;
        let sql = format!(
            "SELECT stack_id, any(frames) AS frames FROM {db}.stacks
             WHERE tenant = ? AND stack_id IN (SELECT stack_id FROM {db}.samples WHERE {samples_where})
             GROUP BY stack_id"
        );
        let rows: Vec<StackFrames> = self.run(&sql, || {
            bind(self.client.query(&sql).bind(tenant.0)).fetch_all()
        })?;
        let mut out = HashMap::with_capacity(rows.len());
        for r in rows {
            let frames: Vec<Frame> = serde_json::from_str(&r.frames).map_err(|e| {
                StoreError::Backend(format!(
                    "ClickHouse at {}: stack {:#x} holds frames that are not JSON: {e}",
                    self.cfg.url, r.stack_id
                ))
            })?;
            out.insert(r.stack_id, frames);
        }
        Ok(out)
    }

    /// A profile from (stack id, samples) pairs and the dictionary.
    fn build(
        stacks: impl IntoIterator<Item = (u64, u64)>,
        frames: &HashMap<u64, Vec<Frame>>,
        (hz, start, duration): (f64, u64, u64),
    ) -> StackProfile {
        let mut b = StackProfileBuilder::new();
        for (id, value) in stacks {
            // A stack expired from the dictionary before its samples: left out.
            let Some(fs) = frames.get(&id) else { continue };
            let ids = fs.iter().map(|f| b.frame(f.clone())).collect();
            b.add(ids, value);
        }
        b.finish(hz, start, duration)
    }

    /// Summed samples per stack of the job's profiles of `kind` in `batches`
    /// (or, with `batches` empty, those that began in `range`), merged.
    fn sum_profiles(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        batches: &[String],
        range: (i64, i64),
    ) -> Result<Vec<StackSum>, StoreError> {
        let sql = format!(
            "SELECT stack_id, sum(value) AS value FROM {}.samples FINAL WHERE {JOB_SAMPLES}
             GROUP BY stack_id",
            self.cfg.database
        );
        self.run(&sql, || {
            bind_job_samples(self.client.query(&sql), tenant, kind, job, batches, range).fetch_all()
        })
    }

    /// The frames of the stacks of [`Self::sum_profiles`]'s selection.
    fn frames_of(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        batches: &[String],
        range: (i64, i64),
    ) -> Result<HashMap<u64, Vec<Frame>>, StoreError> {
        self.stack_frames(tenant, JOB_SAMPLES, |q| {
            bind_job_samples(q, tenant, kind, job, batches, range)
        })
    }

    /// Per-function sums of the tenant's profiles of `q.kind` that began
    /// in `range`: a GROUP BY over `samples` joined with the dictionary.
    fn function_sums(
        &self,
        tenant: TenantId,
        q: &FunctionQuery,
        range: (i64, i64),
    ) -> Result<FunctionSums, StoreError> {
        let db = &self.cfg.database;
        let cond = "tenant = ? AND kind = ? AND start_unix_ns >= ? AND start_unix_ns < ?
                    AND (empty(?) OR has(?, job))";
        let bind = |q0: clickhouse::query::Query| {
            q0.bind(tenant.0)
                .bind(&q.kind)
                .bind(range.0)
                .bind(range.1)
                .bind(&q.jobs)
                .bind(&q.jobs)
        };
        // Self: the stack's last function; total: once per stack.
        let sql = format!(
            "SELECT fn AS function, sum(if(fn = leaf, v, 0)) AS self_samples, sum(v) AS total_samples
             FROM (
                 SELECT a.v AS v, d.functions AS fns, d.functions[-1] AS leaf
                 FROM (SELECT stack_id, sum(value) AS v FROM {db}.samples FINAL WHERE {cond}
                       GROUP BY stack_id) AS a
                 INNER JOIN (SELECT stack_id, any(functions) AS functions FROM {db}.stacks
                             WHERE tenant = ? GROUP BY stack_id) AS d
                 ON a.stack_id = d.stack_id)
             ARRAY JOIN arrayDistinct(fns) AS fn
             GROUP BY fn"
        );
        let rows: Vec<FunctionRow> = self.run(&sql, || {
            bind(self.client.query(&sql)).bind(tenant.0).fetch_all()
        })?;
        let totals_sql = format!(
            "SELECT
                 toUInt64(ifNull((SELECT sum(value) FROM {db}.samples FINAL WHERE {cond}), 0)) AS samples,
                 toUInt64(ifNull((SELECT count() FROM {db}.profiles FINAL WHERE {cond}), 0)) AS profiles"
        );
        let totals: Vec<Totals> = self.run(&totals_sql, || {
            bind(bind(self.client.query(&totals_sql))).fetch_all()
        })?;
        let t = totals.first();
        Ok(FunctionSums {
            samples: t.map_or(0, |t| t.samples),
            profiles: t.map_or(0, |t| t.profiles),
            by_function: rows
                .into_iter()
                .map(|r| {
                    (
                        r.function,
                        FunctionSamples {
                            self_samples: r.self_samples,
                            total_samples: r.total_samples,
                        },
                    )
                })
                .collect(),
        })
    }
}

impl Store for ClickHouseStore {
    fn create_token(&self, tenant: &str) -> Result<String, StoreError> {
        check_name("tenant", tenant)?;
        let token = new_token()?;
        let id = tenant_id(tenant);
        self.insert::<TenantRow>("tenants", &[TenantRow { name: tenant, id }])?;
        let hash = token_hash(&token);
        self.insert::<TokenRow>(
            "tokens",
            &[TokenRow {
                hash: &hash,
                tenant: id,
                created_ns: now_ns(),
            }],
        )?;
        Ok(token)
    }

    fn tenant_of_token(&self, token: &str) -> Result<Option<TenantId>, StoreError> {
        let sql = format!(
            "SELECT tenant FROM {}.tokens FINAL WHERE hash = ? LIMIT 1",
            self.cfg.database
        );
        let hash = token_hash(token);
        let rows: Vec<Id> = self.run(&sql, || self.client.query(&sql).bind(&hash).fetch_all())?;
        Ok(rows.first().map(|r| TenantId(r.tenant)))
    }

    fn put_fingerprint(
        &self,
        tenant: TenantId,
        job: &str,
        session: &str,
        worker: u32,
        json: &str,
    ) -> Result<(), StoreError> {
        check_name("job", job)?;
        check_name("session", session)?;
        self.insert::<FingerprintRow>(
            "fingerprints",
            &[FingerprintRow {
                tenant: tenant.0,
                job,
                session,
                worker,
                json,
                uploaded_ns: now_ns(),
            }],
        )
    }

    fn fingerprints(
        &self,
        tenant: TenantId,
        job: &str,
        session: &str,
    ) -> Result<Vec<String>, StoreError> {
        let sql = format!(
            "SELECT json AS body FROM {}.fingerprints FINAL
             WHERE tenant = ? AND job = ? AND session = ? ORDER BY worker",
            self.cfg.database
        );
        let rows: Vec<Text> = self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(tenant.0)
                .bind(job)
                .bind(session)
                .fetch_all()
        })?;
        Ok(rows.into_iter().map(|r| r.body).collect())
    }

    fn jobs(&self, tenant: TenantId) -> Result<Vec<JobSummary>, StoreError> {
        let db = &self.cfg.database;
        let sql = format!(
            "SELECT job, sum(sessions) AS sessions, sum(fingerprints) AS fingerprints,
                    sum(profiles) AS profiles, max(updated) AS updated FROM (
                 SELECT job, toUInt64(uniqExact(session)) AS sessions, count() AS fingerprints,
                        toUInt64(0) AS profiles, toInt64(max(intDiv(uploaded_ns, 1000000000))) AS updated
                 FROM {db}.fingerprints FINAL WHERE tenant = ? GROUP BY job
                 UNION ALL
                 SELECT job, toUInt64(0), toUInt64(0), count(),
                        toInt64(max(intDiv(uploaded_ns, 1000000000)))
                 FROM {db}.profiles FINAL WHERE tenant = ? GROUP BY job
                 UNION ALL
                 SELECT job, toUInt64(0), toUInt64(0), toUInt64(0),
                        toInt64(max(intDiv(uploaded_ns, 1000000000)))
                 FROM (SELECT job, uploaded_ns FROM {db}.collectives WHERE tenant = ?
                       UNION ALL SELECT job, uploaded_ns FROM {db}.os_samples WHERE tenant = ?
                       UNION ALL SELECT job, uploaded_ns FROM {db}.flows WHERE tenant = ?
                       UNION ALL SELECT job, uploaded_ns FROM {db}.hangs WHERE tenant = ?)
                 GROUP BY job)
             GROUP BY job ORDER BY job"
        );
        let rows: Vec<JobRow> = self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(tenant.0)
                .bind(tenant.0)
                .bind(tenant.0)
                .bind(tenant.0)
                .bind(tenant.0)
                .bind(tenant.0)
                .fetch_all()
        })?;
        Ok(rows
            .into_iter()
            .map(|r| JobSummary {
                job: r.job,
                sessions: r.sessions,
                fingerprints: r.fingerprints,
                profiles: r.profiles,
                updated_unix_s: r.updated,
            })
            .collect())
    }

    fn has_job(&self, tenant: TenantId, job: &str) -> Result<bool, StoreError> {
        let db = &self.cfg.database;
        let tables = ["fingerprints", "profiles"]
            .into_iter()
            .chain(BatchKind::ALL.iter().map(|k| k.table()));
        let sql = format!(
            "SELECT count() AS n FROM ({} LIMIT 1)",
            tables
                .map(|t| format!("SELECT 1 FROM {db}.{t} WHERE tenant = ? AND job = ?"))
                .collect::<Vec<_>>()
                .join(" UNION ALL ")
        );
        let rows: Vec<Count> = self.run(&sql, || {
            let mut q = self.client.query(&sql);
            for _ in 0..2 + BatchKind::ALL.len() {
                q = q.bind(tenant.0).bind(job);
            }
            q.fetch_all()
        })?;
        Ok(rows.first().is_some_and(|c| c.n > 0))
    }

    fn sessions(&self, tenant: TenantId, job: &str) -> Result<Vec<SessionSummary>, StoreError> {
        let sql = format!(
            "SELECT session, count() AS n, toInt64(max(intDiv(uploaded_ns, 1000000000))) AS updated
             FROM {}.fingerprints FINAL WHERE tenant = ? AND job = ?
             GROUP BY session ORDER BY updated DESC, session",
            self.cfg.database
        );
        let rows: Vec<SessionRow> = self.run(&sql, || {
            self.client.query(&sql).bind(tenant.0).bind(job).fetch_all()
        })?;
        Ok(rows
            .into_iter()
            .map(|r| SessionSummary {
                session: r.session,
                fingerprints: r.n,
                updated_unix_s: r.updated,
            })
            .collect())
    }

    fn files_profiles_as_rows(&self) -> bool {
        true
    }

    fn put_profile(
        &self,
        tenant: TenantId,
        job: &str,
        meta: &ProfileMeta,
        pprof: &[u8],
    ) -> Result<bool, StoreError> {
        check_name("job", job)?;
        check_name("batch", &meta.batch)?;
        let now = now_ns();
        let today = (now / 86_400_000_000_000) as i64;
        // Read without building the profile: frames borrow the upload's
        // strings; only stacks new to the dictionary are made owned.
        let read = whyslow_codec::visit_pprof_limited(
            pprof,
            whyslow_codec::MAX_PPROF_DECOMPRESSED,
            |v| -> Result<_, StoreError> {
                let mut stacks: Vec<StackRow> = Vec::new();
                let mut samples: FxHashMap<u64, u64> = FxHashMap::default();
                let ids = {
                    let mut memo = self.digests.lock().unwrap_or_else(|e| e.into_inner());
                    view_stack_ids(v, &mut memo)
                };
                let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
                if known.len() > KNOWN_STACKS {
                    known.clear();
                }
                for (i, (&(_, _, count), &id)) in v.stacks.iter().zip(&ids).enumerate() {
                    let c = samples.entry(id).or_default();
                    *c = c.saturating_add(count);
                    // Written at most once a day per stack (its TTL renewed);
                    // forgotten again if the commit fails.
                    if known.get(&(tenant.0, id)) == Some(&today) {
                        continue;
                    }
                    known.insert((tenant.0, id), today);
                    let frames: Vec<Frame> = v
                        .stack(i)
                        .iter()
                        .map(|&f| v.frames[f as usize].to_frame())
                        .collect();
                    let json = serde_json::to_string(&frames)
                        .map_err(|e| StoreError::Backend(format!("a stack as JSON: {e}")))?;
                    stacks.push(StackRow {
                        tenant: tenant.0,
                        stack_id: id,
                        functions: stack_functions(frames.iter()),
                        frames: json,
                        seen_ns: now,
                    });
                }
                let labels = serde_json::to_string(&v.labels)
                    .map_err(|e| StoreError::Backend(format!("labels as JSON: {e}")))?;
                Ok((
                    stacks,
                    samples,
                    labels,
                    v.start_unix_ns,
                    v.duration_ns,
                    v.hz,
                ))
            },
        )
        .map_err(|e| StoreError::BadName(format!("not a pprof profile: {e}")))?;
        let (stacks, samples, labels, period_start_ns, duration_ns, hz) = read?;
        let samples: Vec<(u64, u64)> = samples.into_iter().collect();
        let profile = ProfileRow {
            tenant: tenant.0,
            job: job.to_string(),
            kind: meta.kind.clone(),
            batch: meta.batch.clone(),
            rank: meta.rank.clone(),
            host: meta.host.clone(),
            start_unix_ns: meta.start_unix_ns,
            period_start_ns,
            duration_ns,
            hz,
            samples: meta.samples,
            labels,
            uploaded_ns: now,
        };
        self.commit(PendingProfile {
            seq: 0,
            stacks,
            samples,
            profile,
        })
    }

    fn put_batch(
        &self,
        tenant: TenantId,
        job: &str,
        kind: BatchKind,
        batch: &str,
        body: &str,
    ) -> Result<bool, StoreError> {
        check_name("job", job)?;
        check_name("batch", batch)?;
        if self.seen(kind.table(), tenant, batch)? {
            return Ok(false);
        }
        self.insert::<BatchRow>(
            kind.table(),
            &[BatchRow {
                tenant: tenant.0,
                job,
                batch,
                body,
                uploaded_ns: now_ns(),
            }],
        )?;
        Ok(true)
    }

    fn batches(
        &self,
        tenant: TenantId,
        job: &str,
        kind: BatchKind,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let sql = format!(
            "SELECT body FROM {}.{} FINAL WHERE tenant = ? AND job = ?
             ORDER BY uploaded_ns DESC, batch DESC LIMIT ?",
            self.cfg.database,
            kind.table()
        );
        let rows: Vec<Text> = self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(tenant.0)
                .bind(job)
                .bind(limit as u64)
                .fetch_all()
        })?;
        Ok(rows.into_iter().map(|r| r.body).collect())
    }

    fn hour_profile(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        hour_unix_s: i64,
    ) -> Result<Option<StackProfile>, StoreError> {
        let hour = hour_unix_s.div_euclid(3600) * 3600;
        let from = hour.saturating_mul(1_000_000_000);
        let range = (from, from.saturating_add(3_600_000_000_000));
        let sums = self.sum_profiles(tenant, job, kind, &[], range)?;
        if sums.is_empty() {
            return Ok(None);
        }
        let frames = self.frames_of(tenant, job, kind, &[], range)?;
        Ok(Some(Self::build(
            sums.into_iter().map(|s| (s.stack_id, s.value)),
            &frames,
            (0.0, from as u64, 3_600_000_000_000),
        )))
    }

    fn profile_count(&self, tenant: TenantId, job: &str, kind: &str) -> Result<u64, StoreError> {
        let sql = format!(
            "SELECT count() AS n FROM {}.profiles FINAL WHERE tenant = ? AND job = ? AND kind = ?",
            self.cfg.database
        );
        let rows: Vec<Count> = self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(tenant.0)
                .bind(job)
                .bind(kind)
                .fetch_all()
        })?;
        Ok(rows.first().map_or(0, |c| c.n))
    }

    fn profiles_in_order(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
        order: Order,
    ) -> Result<Vec<StoredProfile>, StoreError> {
        let metas = self.profile_rows(tenant, job, kind, limit, order)?;
        if metas.is_empty() {
            return Ok(Vec::new());
        }
        let batches: Vec<String> = metas.iter().map(|m| m.batch.clone()).collect();
        let range = profile_range(&metas);
        let sql = format!(
            "SELECT batch, stack_id, value FROM {}.samples FINAL
             WHERE tenant = ? AND kind = ? AND job = ? AND start_unix_ns >= ? AND start_unix_ns < ?
               AND has(?, batch)",
            self.cfg.database
        );
        let rows: Vec<BatchSample> = self.run(&sql, || {
            self.client
                .query(&sql)
                .bind(tenant.0)
                .bind(kind)
                .bind(job)
                .bind(range.0)
                .bind(range.1)
                .bind(&batches)
                .fetch_all()
        })?;
        let frames = self.frames_of(tenant, job, kind, &batches, range)?;
        let mut by_batch: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
        for r in &rows {
            by_batch
                .entry(r.batch.as_str())
                .or_default()
                .push((r.stack_id, r.value));
        }
        Ok(metas
            .iter()
            .map(|m| {
                let mut stacks = by_batch.remove(m.batch.as_str()).unwrap_or_default();
                stacks.sort_unstable();
                let mut p = Self::build(stacks, &frames, (m.hz, m.period_start_ns, m.duration_ns));
                p.labels = serde_json::from_str(&m.labels).unwrap_or_default();
                StoredProfile::Decoded(p)
            })
            .collect())
    }

    fn merged_profiles(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
        order: Order,
    ) -> Result<Option<(StackProfile, usize)>, StoreError> {
        let metas = self.profile_rows(tenant, job, kind, limit, order)?;
        if metas.is_empty() {
            return Ok(None);
        }
        let batches: Vec<String> = metas.iter().map(|m| m.batch.clone()).collect();
        let range = profile_range(&metas);
        let sums = self.sum_profiles(tenant, job, kind, &batches, range)?;
        let frames = self.frames_of(tenant, job, kind, &batches, range)?;
        let start = metas.iter().map(|m| m.period_start_ns).min();
        let duration = metas.iter().map(|m| m.duration_ns).max();
        let hz = metas.last().map_or(0.0, |m| m.hz);
        let mut ids: Vec<(u64, u64)> = sums.into_iter().map(|s| (s.stack_id, s.value)).collect();
        ids.sort_unstable();
        Ok(Some((
            Self::build(
                ids,
                &frames,
                (hz, start.unwrap_or(0), duration.unwrap_or(0)),
            ),
            metas.len(),
        )))
    }

    fn functions(&self, tenant: TenantId, q: &FunctionQuery) -> Result<FunctionTable, StoreError> {
        for j in &q.jobs {
            check_name("job", j)?;
        }
        let now = self.function_sums(tenant, q, q.range)?;
        let base = q
            .baseline
            .map(|r| self.function_sums(tenant, q, r))
            .transpose()?;
        Ok(FunctionTable::from_sums(&now, base.as_ref(), q.limit))
    }
}

/// The samples of a job's profiles of one kind that began in a range, of
/// some batches (none given: all); bound by [`bind_job_samples`].
const JOB_SAMPLES: &str = "tenant = ? AND kind = ? AND job = ? AND start_unix_ns >= ?
     AND start_unix_ns < ? AND (empty(?) OR has(?, batch))";

/// Binds [`JOB_SAMPLES`]'s values, in its order.
fn bind_job_samples(
    q: clickhouse::query::Query,
    tenant: TenantId,
    kind: &str,
    job: &str,
    batches: &[String],
    (from, to): (i64, i64),
) -> clickhouse::query::Query {
    q.bind(tenant.0)
        .bind(kind)
        .bind(job)
        .bind(from)
        .bind(to)
        .bind(batches)
        .bind(batches)
}

/// The start times `[first, last]` of `metas` as a half-open range (the
/// samples' sort key narrows the read to it).
fn profile_range(metas: &[ProfileRow]) -> (i64, i64) {
    let lo = metas.iter().map(|m| m.start_unix_ns).min().unwrap_or(0);
    let hi = metas.iter().map(|m| m.start_unix_ns).max().unwrap_or(0);
    (lo, hi.saturating_add(1))
}

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

    /// The conformance suite against a live server (`WHYSLOW_CLICKHOUSE_URL`,
    /// e.g. the chdb stand-in of tests/python/chdb_http.py; the Python
    /// suite runs it there through `whyslow server check-store`).
    #[test]
    fn passes_the_conformance_checks_when_a_server_is_given() {
        let Ok(url) = std::env::var("WHYSLOW_CLICKHOUSE_URL") else {
            whyslow_testkit::skip(
                "needs WHYSLOW_CLICKHOUSE_URL (tests/python/test_server_clickhouse.py runs it against the chdb stand-in)",
            );
            return;
        };
        let s = ClickHouseStore::open(ClickHouseConfig {
            url,
            database: format!("whyslow_unit_{}", std::process::id()),
            user: None,
            password: None,
            retention_days: 30,
        })
        .unwrap();
        let r = crate::conformance(&s);
        s.drop_database().unwrap();
        r.unwrap();
    }

    #[test]
    fn a_database_name_must_be_plain() {
        let cfg = ClickHouseConfig {
            url: "http://127.0.0.1:1".into(),
            database: "a-b".into(),
            user: None,
            password: None,
            retention_days: 30,
        };
        assert!(matches!(
            ClickHouseStore::open(cfg),
            Err(StoreError::BadName(_))
        ));
    }
}
