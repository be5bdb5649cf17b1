//! The scale-out store: ClickHouse over its HTTP interface (issue 14). The
//! same [`Store`] as the embedded SQLite one, checked by the same
//! conformance suite ([`crate::store::conformance`], `whyslow server
//! check-store`).
//!
//! Tables (`MergeTree` family, sorted by tenant first, so every query reads
//! one tenant's range; isolation is in every `WHERE`, as in SQLite):
//!
//! | table | engine, sort key | what |
//! |---|---|---|
//! | `tokens` | ReplacingMergeTree, `hash` | SHA-256 of each token → tenant |
//! | `tenants` | ReplacingMergeTree, `name` | tenant names and ids |
//! | `fingerprints` | ReplacingMergeTree(`uploaded_ns`), `(tenant, job, session, worker)` | one worker's fingerprint JSON per session; a re-upload replaces it; ZSTD |
//! | `profiles` | ReplacingMergeTree, `(tenant, job, kind, batch)` | the agents' pprof bytes, one row per batch id (a retry is merged away even when two race); ZSTD |
//!
//! Data rows carry a TTL (`--retention-days`). Reads use `FINAL`, so a
//! replaced fingerprint or a retried batch is never counted twice before
//! ClickHouse merges parts. Statements are plain SQL with escaped literals
//! (names are checked by [`check_name`] first), sent as the body of a POST,
//! results read as `JSONEachRow`.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use whyslow_model::stack::{Frame, StackProfile, StackProfileBuilder};

use crate::{
    check_name, merge_stored, new_token, token_hash, BatchKind, JobSummary, Order, ProfileMeta,
    SessionSummary, Store, StoreError, StoredProfile, TenantId,
};

/// How to reach ClickHouse.
#[derive(Debug, Clone)]
pub struct ClickHouseConfig {
    /// HTTP endpoint, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// Database (created if missing).
    pub database: String,
    /// User (`X-ClickHouse-User`), if any.
    pub user: Option<String>,
    /// Password (`X-ClickHouse-Key`), if any.
    pub password: Option<String>,
    /// Days fingerprints and profiles are kept.
    pub retention_days: u32,
}

/// The ClickHouse store.
pub struct ClickHouseStore {
    cfg: ClickHouseConfig,
    agent: ureq::Agent,
}

/// A string as a ClickHouse literal.
fn lit(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\0' => out.push_str("\\0"),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

fn unhex(s: &str) -> Result<Vec<u8>, StoreError> {
    let bad = || StoreError::Backend("ClickHouse returned a profile that is not hex".into());
    if !s.len().is_multiple_of(2) {
        return Err(bad());
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| bad()))
        .collect()
}

/// A number from JSONEachRow (64-bit integers may come quoted).
fn num(v: &Value) -> i64 {
    match v {
        Value::Number(n) => n.as_i64().unwrap_or(0),
        Value::String(s) => s.parse().unwrap_or(0),
        _ => 0,
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
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
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .http_status_as_error(false)
            .build()
            .into();
        let s = ClickHouseStore { cfg, agent };
        let db = &s.cfg.database;
        let ttl = format!(
            "TTL toDateTime(intDiv(uploaded_ns, 1000000000)) + INTERVAL {} DAY",
            s.cfg.retention_days.max(1)
        );
        s.exec(&format!("CREATE DATABASE IF NOT EXISTS {db}"))?;
        s.exec(&format!(
            "CREATE TABLE IF NOT EXISTS {db}.tenants (name String, id Int64)
             ENGINE = ReplacingMergeTree ORDER BY name"
        ))?;
        s.exec(&format!(
            "CREATE TABLE IF NOT EXISTS {db}.tokens (hash String, tenant Int64, created_ns UInt64)
             ENGINE = ReplacingMergeTree ORDER BY hash"
        ))?;
        s.exec(&format!(
            "CREATE TABLE IF NOT EXISTS {db}.fingerprints (
                 tenant Int64, job String, session String, worker UInt32,
                 json String CODEC(ZSTD(3)), uploaded_ns UInt64)
             ENGINE = ReplacingMergeTree(uploaded_ns) ORDER BY (tenant, job, session, worker) {ttl}"
        ))?;
        s.exec(&format!(
            "CREATE TABLE IF NOT EXISTS {db}.profiles (
                 tenant Int64, job String, kind LowCardinality(String), batch String,
                 rank Nullable(String), host Nullable(String), start_unix_ns Int64,
                 samples UInt64, pprof String CODEC(ZSTD(3)), uploaded_ns UInt64)
             ENGINE = ReplacingMergeTree ORDER BY (tenant, job, kind, batch) {ttl}"
        ))?;
        // Hourly rollups (SysOM-AI §3.4's historical baselines): per job,
        // kind and hour, one row per stack with its samples, recomputed
        // from the deduplicated profiles (so a retried batch never counts
        // twice) once the hour is over, and again when late profiles arrive.
        s.exec(&format!(
            "CREATE TABLE IF NOT EXISTS {db}.profile_rollups (
                 tenant Int64, job String, kind LowCardinality(String), hour Int64,
                 stack String CODEC(ZSTD(3)), samples UInt64, profiles UInt64, computed_ns UInt64)
             ENGINE = ReplacingMergeTree(computed_ns) ORDER BY (tenant, job, kind, hour, stack)
             TTL toDateTime(hour) + INTERVAL {} DAY",
            s.cfg.retention_days.max(1)
        ))?;
        s.exec(&format!(
            "CREATE TABLE IF NOT EXISTS {db}.collectives (
                 tenant Int64, job String, batch String, body String CODEC(ZSTD(3)),
                 uploaded_ns UInt64)
             ENGINE = ReplacingMergeTree ORDER BY (tenant, job, batch) {ttl}"
        ))?;
        s.exec(&format!(
            "CREATE TABLE IF NOT EXISTS {db}.os_samples (
                 tenant Int64, job String, batch String, body String CODEC(ZSTD(3)),
                 uploaded_ns UInt64)
             ENGINE = ReplacingMergeTree ORDER BY (tenant, job, batch) {ttl}"
        ))?;
        for table in ["flows", "hangs"] {
            s.exec(&format!(
                "CREATE TABLE IF NOT EXISTS {db}.{table} (
                     tenant Int64, job String, batch String, body String CODEC(ZSTD(3)),
                     uploaded_ns UInt64)
                 ENGINE = ReplacingMergeTree ORDER BY (tenant, job, batch) {ttl}"
            ))?;
        }
        Ok(s)
    }

    /// Profiles of `kind` of the job that began in `hour` (Unix s).
    fn hour_count(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        hour: i64,
    ) -> Result<u64, StoreError> {
        let rows = self.rows(&self.hour_query("count() AS n", tenant, job, kind, hour))?;
        Ok(rows.first().map(|r| num(&r["n"])).unwrap_or(0) as u64)
    }

    fn hour_profiles(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        hour: i64,
    ) -> Result<Vec<StoredProfile>, StoreError> {
        let rows = self.rows(&self.hour_query("hex(pprof) AS p", tenant, job, kind, hour))?;
        rows.iter()
            .map(|r| unhex(r["p"].as_str().unwrap_or("")).map(StoredProfile::Pprof))
            .collect()
    }

    /// `SELECT columns` over the profiles of one job and kind that started in
    /// the hour beginning at `hour` (Unix seconds).
    fn hour_query(
        &self,
        columns: &str,
        tenant: TenantId,
        job: &str,
        kind: &str,
        hour: i64,
    ) -> String {
        format!(
            "SELECT {columns} FROM {}.profiles FINAL
             WHERE tenant = {} AND job = {} AND kind = {}
               AND start_unix_ns >= {} AND start_unix_ns < {}",
            self.cfg.database,
            tenant.0,
            lit(job),
            lit(kind),
            hour * 1_000_000_000,
            (hour + 3600) * 1_000_000_000
        )
    }

    /// Rolls up the hours of the last two days that ended before
    /// `before_unix_s` whose rollup is missing or counts other profiles than
    /// the hour has now (late arrivals), at most 16 per call; returns
    /// (0, hours rolled up).
    pub fn roll_up(&self, before_unix_s: i64) -> Result<(u64, u64), StoreError> {
        let db = &self.cfg.database;
        let last_hour = before_unix_s.div_euclid(3600) * 3600 - 3600;
        let first_hour = last_hour - 47 * 3600;
        let key = |r: &Value| {
            (
                num(&r["tenant"]),
                text(&r["job"]),
                text(&r["kind"]),
                num(&r["hour"]),
            )
        };
        let have: HashMap<(i64, String, String, i64), i64> = self
            .rows(&format!(
                "SELECT tenant, job, kind, hour, max(profiles) AS n FROM {db}.profile_rollups FINAL
                 WHERE hour >= {first_hour} GROUP BY tenant, job, kind, hour"
            ))?
            .iter()
            .map(|r| (key(r), num(&r["n"])))
            .collect();
        let due: Vec<((i64, String, String, i64), i64)> = self
            .rows(&format!(
                "SELECT tenant, job, kind, intDiv(start_unix_ns, 3600000000000) * 3600 AS hour,
                        count() AS n
                 FROM {db}.profiles FINAL
                 WHERE start_unix_ns >= {} AND start_unix_ns < {}
                 GROUP BY tenant, job, kind, hour ORDER BY hour",
                first_hour * 1_000_000_000,
                (last_hour + 3600) * 1_000_000_000
            ))?
            .iter()
            .map(|r| (key(r), num(&r["n"])))
            .filter(|(k, n)| have.get(k) != Some(n))
            .take(16)
            .collect();
        let mut rolled = 0u64;
        for ((tenant, job, kind, hour), n) in due {
            let profiles = self.hour_profiles(TenantId(tenant), &job, &kind, hour)?;
            let Some(p) = merge_stored(profiles) else {
                continue;
            };
            let computed = now_ns();
            let mut lines = String::new();
            for st in &p.stacks {
                let frames: Vec<&Frame> = st
                    .frames
                    .iter()
                    .filter_map(|&i| p.frames.get(i as usize))
                    .collect();
                let row = serde_json::json!({
                    "tenant": tenant, "job": job, "kind": kind, "hour": hour,
                    "stack": serde_json::to_string(&frames).unwrap_or_default(),
                    "samples": st.count, "profiles": n, "computed_ns": computed,
                });
                lines.push_str(&row.to_string());
                lines.push('\n');
            }
            self.exec(&format!(
                "INSERT INTO {db}.profile_rollups
                 SELECT * FROM format(JSONEachRow,
                     'tenant Int64, job String, kind String, hour Int64, stack String, samples UInt64, profiles UInt64, computed_ns UInt64',
                     {})",
                lit(&lines)
            ))?;
            rolled += 1;
        }
        Ok((0, rolled))
    }

    /// Drops this store's database (for `check-store`'s scratch database).
    pub fn drop_database(&self) -> Result<(), StoreError> {
        self.exec(&format!("DROP DATABASE IF EXISTS {}", self.cfg.database))
    }

    fn post(&self, sql: &str) -> Result<String, StoreError> {
        let url = format!(
            "{}/?output_format_json_quote_64bit_integers=0",
            self.cfg.url.trim_end_matches('/')
        );
        // A connection refused or reset (a restarting server, a full
        // listen backlog) is retried: every statement here is idempotent
        // (DDL with IF NOT EXISTS; inserts into ReplacingMergeTree tables
        // read with FINAL). An answer, whatever its status, is not.
        let mut attempt = 0;
        let mut resp = loop {
            let mut req = self.agent.post(&url);
            if let Some(u) = &self.cfg.user {
                req = req.header("X-ClickHouse-User", u);
            }
            if let Some(p) = &self.cfg.password {
                req = req.header("X-ClickHouse-Key", p);
            }
            match req.send(sql.as_bytes()) {
                Ok(r) => break r,
                Err(ureq::Error::Io(_) | ureq::Error::ConnectionFailed) if attempt < 3 => {
                    attempt += 1;
                    std::thread::sleep(std::time::Duration::from_millis(50 << attempt));
                }
                Err(e) => {
                    return Err(StoreError::Backend(format!(
                        "ClickHouse at {}: {e}",
                        self.cfg.url
                    )))
                }
            }
        };
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .with_config()
            .limit(1 << 30)
            .read_to_string()
            .map_err(|e| StoreError::Backend(format!("ClickHouse at {}: {e}", self.cfg.url)))?;
        if status != 200 {
            let first = body
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(300)
                .collect::<String>();
            return Err(StoreError::Backend(format!(
                "ClickHouse at {} answered {status}: {first}",
                self.cfg.url
            )));
        }
        Ok(body)
    }

    fn exec(&self, sql: &str) -> Result<(), StoreError> {
        self.post(sql).map(|_| ())
    }

    fn rows(&self, sql: &str) -> Result<Vec<Value>, StoreError> {
        let body = self.post(&format!("{sql} FORMAT JSONEachRow"))?;
        body.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l).map_err(|e| {
                    StoreError::Backend(format!("ClickHouse returned a row that is not JSON: {e}"))
                })
            })
            .collect()
    }

    /// Stores a text batch of a job in `table` (collectives, flows) once:
    /// `false` when the tenant stored that batch before.
    fn put_blob(
        &self,
        table: &str,
        tenant: TenantId,
        job: &str,
        batch: &str,
        body: &str,
    ) -> Result<bool, StoreError> {
        check_name("job", job)?;
        check_name("batch", batch)?;
        let db = &self.cfg.database;
        let seen = self.rows(&format!(
            "SELECT 1 AS x FROM {db}.{table} WHERE tenant = {} AND batch = {} LIMIT 1",
            tenant.0,
            lit(batch)
        ))?;
        if !seen.is_empty() {
            return Ok(false);
        }
        self.exec(&format!(
            "INSERT INTO {db}.{table} (tenant, job, batch, body, uploaded_ns) VALUES ({}, {}, {}, {}, {})",
            tenant.0,
            lit(job),
            lit(batch),
            lit(body),
            now_ns()
        ))?;
        Ok(true)
    }

    /// The job's latest `limit` batches in `table`, newest first.
    fn blobs(
        &self,
        table: &str,
        tenant: TenantId,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let rows = self.rows(&format!(
            "SELECT body FROM {}.{table} FINAL WHERE tenant = {} AND job = {}
             ORDER BY uploaded_ns DESC, batch DESC LIMIT {limit}",
            self.cfg.database,
            tenant.0,
            lit(job)
        ))?;
        Ok(rows.iter().map(|r| text(&r["body"])).collect())
    }
}

impl Store for ClickHouseStore {
    fn create_token(&self, tenant: &str) -> Result<String, StoreError> {
        check_name("tenant", tenant)?;
        let token = new_token()?;
        let db = &self.cfg.database;
        let id = tenant_id(tenant);
        self.exec(&format!(
            "INSERT INTO {db}.tenants (name, id) VALUES ({}, {id})",
            lit(tenant)
        ))?;
        self.exec(&format!(
            "INSERT INTO {db}.tokens (hash, tenant, created_ns) VALUES ({}, {id}, {})",
            lit(&token_hash(&token)),
            now_ns()
        ))?;
        Ok(token)
    }

    fn tenant_of_token(&self, token: &str) -> Result<Option<TenantId>, StoreError> {
        let rows = self.rows(&format!(
            "SELECT tenant FROM {}.tokens FINAL WHERE hash = {} LIMIT 1",
            self.cfg.database,
            lit(&token_hash(token))
        ))?;
        Ok(rows.first().map(|r| TenantId(num(&r["tenant"]))))
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
        self.exec(&format!(
            "INSERT INTO {}.fingerprints (tenant, job, session, worker, json, uploaded_ns)
             VALUES ({}, {}, {}, {worker}, {}, {})",
            self.cfg.database,
            tenant.0,
            lit(job),
            lit(session),
            lit(json),
            now_ns()
        ))
    }

    fn fingerprints(
        &self,
        tenant: TenantId,
        job: &str,
        session: &str,
    ) -> Result<Vec<String>, StoreError> {
        let rows = self.rows(&format!(
            "SELECT json FROM {}.fingerprints FINAL
             WHERE tenant = {} AND job = {} AND session = {} ORDER BY worker",
            self.cfg.database,
            tenant.0,
            lit(job),
            lit(session)
        ))?;
        Ok(rows.iter().map(|r| text(&r["json"])).collect())
    }

    fn jobs(&self, tenant: TenantId) -> Result<Vec<JobSummary>, StoreError> {
        let db = &self.cfg.database;
        let t = tenant.0;
        let rows = self.rows(&format!(
            "SELECT job, sum(sessions) AS sessions, sum(fingerprints) AS fingerprints,
                    sum(profiles) AS profiles, max(updated) AS updated FROM (
                 SELECT job, uniqExact(session) AS sessions, count() AS fingerprints,
                        toUInt64(0) AS profiles, max(intDiv(uploaded_ns, 1000000000)) AS updated
                 FROM {db}.fingerprints FINAL WHERE tenant = {t} GROUP BY job
                 UNION ALL
                 SELECT job, toUInt64(0), toUInt64(0), count(), max(intDiv(uploaded_ns, 1000000000))
                 FROM {db}.profiles FINAL WHERE tenant = {t} GROUP BY job)
             GROUP BY job ORDER BY job"
        ))?;
        Ok(rows
            .iter()
            .map(|r| JobSummary {
                job: text(&r["job"]),
                sessions: num(&r["sessions"]) as u64,
                fingerprints: num(&r["fingerprints"]) as u64,
                profiles: num(&r["profiles"]) as u64,
                updated_unix_s: num(&r["updated"]),
            })
            .collect())
    }

    fn has_job(&self, tenant: TenantId, job: &str) -> Result<bool, StoreError> {
        let db = &self.cfg.database;
        let (t, j) = (tenant.0, lit(job));
        let rows = self.rows(&format!(
            "SELECT 1 AS x FROM {db}.fingerprints WHERE tenant = {t} AND job = {j}
             UNION ALL SELECT 1 FROM {db}.profiles WHERE tenant = {t} AND job = {j}
             UNION ALL SELECT 1 FROM {db}.collectives WHERE tenant = {t} AND job = {j}
             UNION ALL SELECT 1 FROM {db}.os_samples WHERE tenant = {t} AND job = {j}
             UNION ALL SELECT 1 FROM {db}.flows WHERE tenant = {t} AND job = {j}
             UNION ALL SELECT 1 FROM {db}.hangs WHERE tenant = {t} AND job = {j} LIMIT 1"
        ))?;
        Ok(!rows.is_empty())
    }

    fn sessions(&self, tenant: TenantId, job: &str) -> Result<Vec<SessionSummary>, StoreError> {
        let rows = self.rows(&format!(
            "SELECT session, count() AS n, max(intDiv(uploaded_ns, 1000000000)) AS updated
             FROM {}.fingerprints FINAL WHERE tenant = {} AND job = {}
             GROUP BY session ORDER BY updated DESC, session",
            self.cfg.database,
            tenant.0,
            lit(job)
        ))?;
        Ok(rows
            .iter()
            .map(|r| SessionSummary {
                session: text(&r["session"]),
                fingerprints: num(&r["n"]) as u64,
                updated_unix_s: num(&r["updated"]),
            })
            .collect())
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
        let db = &self.cfg.database;
        // A retry finds its batch; two copies racing are merged by the sort
        // key (FINAL), so neither case counts twice.
        let seen = self.rows(&format!(
            "SELECT 1 AS x FROM {db}.profiles WHERE tenant = {} AND batch = {} LIMIT 1",
            tenant.0,
            lit(&meta.batch)
        ))?;
        if !seen.is_empty() {
            return Ok(false);
        }
        let opt = |v: &Option<String>| v.as_deref().map(lit).unwrap_or_else(|| "NULL".into());
        self.exec(&format!(
            "INSERT INTO {db}.profiles
                 (tenant, job, kind, batch, rank, host, start_unix_ns, samples, pprof, uploaded_ns)
             SELECT {}, {}, {}, {}, {}, {}, {}, {}, unhex({}), {}",
            tenant.0,
            lit(job),
            lit(&meta.kind),
            lit(&meta.batch),
            opt(&meta.rank),
            opt(&meta.host),
            meta.start_unix_ns,
            meta.samples,
            lit(&hex(pprof)),
            now_ns()
        ))?;
        Ok(true)
    }

    fn put_batch(
        &self,
        tenant: TenantId,
        job: &str,
        kind: BatchKind,
        batch: &str,
        body: &str,
    ) -> Result<bool, StoreError> {
        self.put_blob(kind.table(), tenant, job, batch, body)
    }

    fn batches(
        &self,
        tenant: TenantId,
        job: &str,
        kind: BatchKind,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.blobs(kind.table(), tenant, job, limit)
    }

    fn hour_profile(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        hour_unix_s: i64,
    ) -> Result<Option<StackProfile>, StoreError> {
        let hour = hour_unix_s.div_euclid(3600) * 3600;
        let now = self.hour_count(tenant, job, kind, hour)?;
        if now == 0 {
            return Ok(None);
        }
        let db = &self.cfg.database;
        let rows = self.rows(&format!(
            "SELECT stack, samples, profiles FROM {db}.profile_rollups FINAL
             WHERE tenant = {} AND job = {} AND kind = {} AND hour = {hour}",
            tenant.0,
            lit(job),
            lit(kind)
        ))?;
        // A rollup made before late profiles arrived is stale: the raw
        // profiles answer until the next pass redoes it.
        if !rows.is_empty() && rows.iter().all(|r| num(&r["profiles"]) as u64 == now) {
            let mut b = StackProfileBuilder::new();
            for r in &rows {
                let Ok(frames) =
                    serde_json::from_str::<Vec<Frame>>(r["stack"].as_str().unwrap_or(""))
                else {
                    continue;
                };
                let ids = frames.into_iter().map(|f| b.frame(f)).collect();
                b.add(ids, num(&r["samples"]) as u64);
            }
            return Ok(Some(b.finish(
                0.0,
                hour as u64 * 1_000_000_000,
                3_600_000_000_000,
            )));
        }
        Ok(merge_stored(self.hour_profiles(tenant, job, kind, hour)?))
    }

    fn compact(&self, before_unix_s: i64) -> Result<(u64, u64), StoreError> {
        self.roll_up(before_unix_s)
    }

    fn profile_count(&self, tenant: TenantId, job: &str, kind: &str) -> Result<u64, StoreError> {
        let rows = self.rows(&format!(
            "SELECT count() AS n FROM {}.profiles FINAL
             WHERE tenant = {} AND job = {} AND kind = {}",
            self.cfg.database,
            tenant.0,
            lit(job),
            lit(kind)
        ))?;
        Ok(rows.first().map(|r| num(&r["n"])).unwrap_or(0) as u64)
    }

    fn profiles_in_order(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
        order: Order,
    ) -> Result<Vec<StoredProfile>, StoreError> {
        let dir = match order {
            Order::NewestFirst => "DESC",
            Order::OldestFirst => "ASC",
        };
        let rows = self.rows(&format!(
            "SELECT hex(pprof) AS p FROM {}.profiles FINAL
             WHERE tenant = {} AND job = {} AND kind = {}
             ORDER BY start_unix_ns {dir}, batch {dir} LIMIT {limit}",
            self.cfg.database,
            tenant.0,
            lit(job),
            lit(kind)
        ))?;
        rows.iter()
            .map(|r| unhex(r["p"].as_str().unwrap_or("")).map(StoredProfile::Pprof))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_escape_quotes_backslashes_and_nul() {
        assert_eq!(lit("a'b\\c\0"), "'a\\'b\\\\c\\0'");
        assert_eq!(lit("{\"k\": \"v\"}"), "'{\"k\": \"v\"}'");
    }

    #[test]
    fn hex_round_trips_and_numbers_come_quoted_or_not() {
        let b = vec![0u8, 1, 0xab, 0xff];
        assert_eq!(unhex(&hex(&b)).unwrap(), b);
        assert!(unhex("abc").is_err() && unhex("zz").is_err());
        assert_eq!(num(&serde_json::json!("42")), 42);
        assert_eq!(num(&serde_json::json!(42)), 42);
        assert_eq!(tenant_id("team-a"), tenant_id("team-a"));
        assert!(tenant_id("team-a") >= 0 && tenant_id("team-a") != tenant_id("team-b"));
    }

    /// The hourly rollups are rows in ClickHouse, and answer for the hour
    /// (against a server only: `WHYSLOW_CLICKHOUSE_URL`, e.g. the chdb shim
    /// of tests/python/chdb_http.py; the Python suite runs the conformance
    /// checks there).
    #[test]
    fn hourly_rollups_are_written_and_read_back_when_a_server_is_given() {
        let Ok(url) = std::env::var("WHYSLOW_CLICKHOUSE_URL") else {
            whyslow_testkit::skip("set WHYSLOW_CLICKHOUSE_URL to a ClickHouse HTTP endpoint");
            return;
        };
        let s = ClickHouseStore::open(ClickHouseConfig {
            url,
            database: format!("whyslow_rollup_test_{}", std::process::id()),
            user: None,
            password: None,
            retention_days: 30,
        })
        .unwrap();
        let t = TenantId(7);
        let now = (now_ns() / 1_000_000_000) as i64;
        let hour = (now / 3600 - 5) * 3600;
        for (i, leaf) in ["a", "b", "a"].iter().enumerate() {
            let mut b = StackProfileBuilder::new();
            let ids = vec![b.frame(Frame::label("main")), b.frame(Frame::label(*leaf))];
            b.add(ids, 4);
            let start = (hour + 60 * i as i64) as u64 * 1_000_000_000;
            let meta = ProfileMeta {
                batch: format!("b{i}"),
                kind: "cpu".into(),
                rank: None,
                host: None,
                start_unix_ns: start as i64,
                samples: 4,
            };
            let bytes = whyslow_stack_output::to_pprof(&b.finish(99.0, start, 1_000_000_000));
            assert!(s.put_profile(t, "j", &meta, &bytes).unwrap());
        }
        // Not before the hour is over.
        assert_eq!(s.roll_up(hour + 3599).unwrap(), (0, 0));
        assert_eq!(s.roll_up(hour + 3600).unwrap(), (0, 1));
        let rows = s
            .rows(&format!(
                "SELECT stack, samples FROM {}.profile_rollups FINAL ORDER BY samples",
                s.cfg.database
            ))
            .unwrap();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!((num(&rows[0]["samples"]), num(&rows[1]["samples"])), (4, 8));
        assert!(rows[1]["stack"].as_str().unwrap().contains("\"a\""));
        assert_eq!(
            s.hour_profile(t, "j", "cpu", hour)
                .unwrap()
                .unwrap()
                .total(),
            12
        );
        assert_eq!(s.roll_up(now).unwrap(), (0, 0));
        s.drop_database().unwrap();
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
