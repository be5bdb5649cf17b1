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

mod commit;
mod queries;
mod rows;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use clickhouse::Client;
use rustc_hash::FxHashMap;
use whyslow_model::stack::{Frame, StackProfile};

use crate::{
    check_name, new_token, stack_functions, token_hash, BatchKind, FunctionQuery, FunctionTable,
    JobSummary, Order, ProfileMeta, SessionSummary, Store, StoreError, StoredProfile, TenantId,
};

use commit::{GroupCommit, PendingProfile};
use queries::profile_range;
use rows::{
    tenant_id, view_stack_ids, BatchRow, BatchSample, Count, DigestMemo, FingerprintRow, Id,
    JobRow, ProfileRow, SessionRow, StackRow, TenantRow, Text, TokenRow,
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

    /// Drops this store's database (for `check-store`'s scratch database).
    pub fn drop_database(&self) -> Result<(), StoreError> {
        let sql = format!("DROP DATABASE IF EXISTS {}", self.cfg.database);
        self.run(&sql, || self.client.query(&sql).execute())
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

#[cfg(test)]
mod tests {
    use super::*;

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
