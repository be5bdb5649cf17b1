//! Storage behind one trait, tenant-scoped in every method (isolation lives
//! here, not only in the handlers): tenants and their hashed tokens, and the
//! fingerprints each job's workers uploaded per session. The embedded
//! default is SQLite in `DATA/whyslow.db` (WAL, one writer).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use sha2::{Digest, Sha256};

/// Storage errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
    /// The data directory could not be used.
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    /// A name that cannot be a tenant, job or session.
    #[error("{0}")]
    BadName(String),
    /// The scale-out backend (ClickHouse) failed or could not be reached.
    #[error("{0}")]
    Backend(String),
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
    /// Stores one uploaded stack profile (pprof bytes as uploaded) of a
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
    ) -> Result<Vec<Vec<u8>>, StoreError>;
    /// Stores one batch of collective records (JSON lines of
    /// `whyslow_model::collective::CollectiveRecord`, as the agents write
    /// them) of a job; `false` when the batch was stored before.
    fn put_collectives(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        jsonl: &str,
    ) -> Result<bool, StoreError>;
    /// The job's most recent `limit` batches of collective records, newest
    /// first.
    fn collectives(
        &self,
        tenant: TenantId,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError>;
    /// Stores one flow analysis of a job (the JSON of `whyslow flows
    /// analyze --format json`: LLMPrism's jobs, steps, timelines and
    /// findings); `false` when the batch was stored before.
    fn put_flows(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        json: &str,
    ) -> Result<bool, StoreError>;
    /// The job's most recent `limit` flow analyses, newest first.
    fn flows(&self, tenant: TenantId, job: &str, limit: usize) -> Result<Vec<String>, StoreError>;
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

pub(crate) fn token_hash(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The embedded store: SQLite.
pub struct SqliteStore {
    db: Mutex<Connection>,
}

impl SqliteStore {
    /// Opens (creating) `DATA/whyslow.db`.
    pub fn open(data: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(data).map_err(|e| StoreError::Io(data.display().to_string(), e))?;
        let db = Connection::open(data.join("whyslow.db"))?;
        db.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA busy_timeout=5000;
             CREATE TABLE IF NOT EXISTS tenants (
                 id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE);
             CREATE TABLE IF NOT EXISTS tokens (
                 hash TEXT PRIMARY KEY, tenant INTEGER NOT NULL REFERENCES tenants(id),
                 created_unix_s INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS fingerprints (
                 tenant INTEGER NOT NULL, job TEXT NOT NULL, session TEXT NOT NULL,
                 worker INTEGER NOT NULL, json TEXT NOT NULL, uploaded_unix_s INTEGER NOT NULL,
                 PRIMARY KEY (tenant, job, session, worker));
             CREATE TABLE IF NOT EXISTS profiles (
                 tenant INTEGER NOT NULL, job TEXT NOT NULL, batch TEXT NOT NULL,
                 kind TEXT NOT NULL, rank TEXT, host TEXT, start_unix_ns INTEGER NOT NULL,
                 samples INTEGER NOT NULL, pprof BLOB NOT NULL, uploaded_unix_s INTEGER NOT NULL,
                 PRIMARY KEY (tenant, batch));
             CREATE INDEX IF NOT EXISTS profiles_by_job ON profiles (tenant, job, kind, start_unix_ns);
             CREATE TABLE IF NOT EXISTS collectives (
                 tenant INTEGER NOT NULL, job TEXT NOT NULL, batch TEXT NOT NULL,
                 body TEXT NOT NULL, uploaded_unix_s INTEGER NOT NULL, seq INTEGER NOT NULL,
                 PRIMARY KEY (tenant, batch));
             CREATE INDEX IF NOT EXISTS collectives_by_job ON collectives (tenant, job, seq);
             CREATE TABLE IF NOT EXISTS flows (
                 tenant INTEGER NOT NULL, job TEXT NOT NULL, batch TEXT NOT NULL,
                 body TEXT NOT NULL, uploaded_unix_s INTEGER NOT NULL, seq INTEGER NOT NULL,
                 PRIMARY KEY (tenant, batch));
             CREATE INDEX IF NOT EXISTS flows_by_job ON flows (tenant, job, seq);",
        )?;
        Ok(SqliteStore { db: Mutex::new(db) })
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (its own
        // transactions); keep serving.
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores a text batch of a job in `table` (collectives, flows) once:
    /// `false` when the tenant stored that batch before. `seq` keeps the
    /// arrival order, so "newest" does not depend on the clock's resolution.
    fn put_batch(
        &self,
        table: &str,
        tenant: TenantId,
        job: &str,
        batch: &str,
        body: &str,
    ) -> Result<bool, StoreError> {
        check_name("job", job)?;
        check_name("batch", batch)?;
        let n = self.db().execute(
            &format!(
                "INSERT OR IGNORE INTO {table} (tenant, job, batch, body, uploaded_unix_s, seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, (SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}))"
            ),
            params![tenant.0, job, batch, body, now_unix()],
        )?;
        Ok(n == 1)
    }

    /// The job's latest `limit` batches in `table`, newest first.
    fn batches(
        &self,
        table: &str,
        tenant: TenantId,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let db = self.db();
        let mut st = db.prepare_cached(&format!(
            "SELECT body FROM {table} WHERE tenant = ?1 AND job = ?2 ORDER BY seq DESC LIMIT ?3"
        ))?;
        let rows = st.query_map(params![tenant.0, job, limit as i64], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

impl Store for SqliteStore {
    fn create_token(&self, tenant: &str) -> Result<String, StoreError> {
        check_name("tenant", tenant)?;
        let token = new_token()?;
        let db = self.db();
        db.execute(
            "INSERT OR IGNORE INTO tenants (name) VALUES (?1)",
            params![tenant],
        )?;
        let id: i64 = db.query_row(
            "SELECT id FROM tenants WHERE name = ?1",
            params![tenant],
            |r| r.get(0),
        )?;
        db.execute(
            "INSERT INTO tokens (hash, tenant, created_unix_s) VALUES (?1, ?2, ?3)",
            params![token_hash(&token), id, now_unix()],
        )?;
        Ok(token)
    }

    fn tenant_of_token(&self, token: &str) -> Result<Option<TenantId>, StoreError> {
        Ok(self
            .db()
            .query_row(
                "SELECT tenant FROM tokens WHERE hash = ?1",
                params![token_hash(token)],
                |r| r.get(0),
            )
            .optional()?
            .map(TenantId))
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
        self.db().execute(
            "INSERT OR REPLACE INTO fingerprints (tenant, job, session, worker, json, uploaded_unix_s)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![tenant.0, job, session, worker, json, now_unix()],
        )?;
        Ok(())
    }

    fn fingerprints(
        &self,
        tenant: TenantId,
        job: &str,
        session: &str,
    ) -> Result<Vec<String>, StoreError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT json FROM fingerprints WHERE tenant = ?1 AND job = ?2 AND session = ?3
             ORDER BY worker",
        )?;
        let rows = st.query_map(params![tenant.0, job, session], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn jobs(&self, tenant: TenantId) -> Result<Vec<JobSummary>, StoreError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT job, SUM(sessions), SUM(fingerprints), SUM(profiles), MAX(updated) FROM (
                 SELECT job, COUNT(DISTINCT session) AS sessions, COUNT(*) AS fingerprints,
                        0 AS profiles, MAX(uploaded_unix_s) AS updated
                 FROM fingerprints WHERE tenant = ?1 GROUP BY job
                 UNION ALL
                 SELECT job, 0, 0, COUNT(*), MAX(uploaded_unix_s)
                 FROM profiles WHERE tenant = ?1 GROUP BY job)
             GROUP BY job ORDER BY job",
        )?;
        let rows = st.query_map(params![tenant.0], |r| {
            Ok(JobSummary {
                job: r.get(0)?,
                sessions: r.get::<_, i64>(1)? as u64,
                fingerprints: r.get::<_, i64>(2)? as u64,
                profiles: r.get::<_, i64>(3)? as u64,
                updated_unix_s: r.get(4)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn has_job(&self, tenant: TenantId, job: &str) -> Result<bool, StoreError> {
        let db = self.db();
        for table in ["fingerprints", "profiles", "collectives", "flows"] {
            let found = db
                .query_row(
                    &format!("SELECT 1 FROM {table} WHERE tenant = ?1 AND job = ?2 LIMIT 1"),
                    params![tenant.0, job],
                    |_| Ok(()),
                )
                .optional()?;
            if found.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
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
        let n = self.db().execute(
            "INSERT OR IGNORE INTO profiles
                 (tenant, job, batch, kind, rank, host, start_unix_ns, samples, pprof, uploaded_unix_s)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            params![
                tenant.0,
                job,
                meta.batch,
                meta.kind,
                meta.rank,
                meta.host,
                meta.start_unix_ns,
                meta.samples as i64,
                pprof,
                now_unix()
            ],
        )?;
        Ok(n == 1)
    }

    fn profiles(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT pprof FROM profiles WHERE tenant = ?1 AND job = ?2 AND kind = ?3
             ORDER BY start_unix_ns DESC LIMIT ?4",
        )?;
        let rows = st.query_map(params![tenant.0, job, kind, limit as i64], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn put_collectives(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        jsonl: &str,
    ) -> Result<bool, StoreError> {
        self.put_batch("collectives", tenant, job, batch, jsonl)
    }

    fn collectives(
        &self,
        tenant: TenantId,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.batches("collectives", tenant, job, limit)
    }

    fn put_flows(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        json: &str,
    ) -> Result<bool, StoreError> {
        self.put_batch("flows", tenant, job, batch, json)
    }

    fn flows(&self, tenant: TenantId, job: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        self.batches("flows", tenant, job, limit)
    }

    fn expire(&self, before_unix_s: i64) -> Result<u64, StoreError> {
        let db = self.db();
        let mut n = 0;
        for table in ["fingerprints", "profiles", "collectives", "flows"] {
            n += db.execute(
                &format!("DELETE FROM {table} WHERE uploaded_unix_s < ?1"),
                params![before_unix_s],
            )? as u64;
        }
        Ok(n)
    }

    fn sessions(&self, tenant: TenantId, job: &str) -> Result<Vec<SessionSummary>, StoreError> {
        let db = self.db();
        let mut st = db.prepare_cached(
            "SELECT session, COUNT(*), MAX(uploaded_unix_s)
             FROM fingerprints WHERE tenant = ?1 AND job = ?2
             GROUP BY session ORDER BY MAX(uploaded_unix_s) DESC, session",
        )?;
        let rows = st.query_map(params![tenant.0, job], |r| {
            Ok(SessionSummary {
                session: r.get(0)?,
                fingerprints: r.get::<_, i64>(1)? as u64,
                updated_unix_s: r.get(2)?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// The conformance checks every backend must pass (run by the tests on
/// SQLite and by `whyslow server check-store` on any backend), on a fresh,
/// empty store: the first failure, named by its check.
pub fn conformance(s: &dyn Store) -> Result<(), String> {
    macro_rules! check {
        ($cond:expr) => {
            if !$cond {
                return Err(format!("conformance check failed: {}", stringify!($cond)));
            }
        };
    }
    macro_rules! ok {
        ($e:expr) => {
            $e.map_err(|e| format!("conformance: {}: {e}", stringify!($e)))?
        };
    }
    let ta = ok!(s.create_token("team-a"));
    let ta2 = ok!(s.create_token("team-a"));
    let tb = ok!(s.create_token("team-b"));
    check!(ta != ta2);
    let a = ok!(s.tenant_of_token(&ta)).ok_or("conformance: a new token has no tenant")?;
    check!(ok!(s.tenant_of_token(&ta2)) == Some(a));
    let b = ok!(s.tenant_of_token(&tb)).ok_or("conformance: a new token has no tenant")?;
    check!(a != b);
    check!(ok!(s.tenant_of_token("wsk_nope")).is_none());
    ok!(s.put_fingerprint(a, "job1", "s1", 1, "{\"w\":1}"));
    ok!(s.put_fingerprint(a, "job1", "s1", 0, "{\"w\":0}"));
    ok!(s.put_fingerprint(a, "job1", "s1", 1, "{\"w\":1,\"again\":'yes'}"));
    check!(ok!(s.fingerprints(a, "job1", "s1")) == vec!["{\"w\":0}", "{\"w\":1,\"again\":'yes'}"]);
    // Tenant b sees nothing of tenant a's, even by name.
    check!(ok!(s.fingerprints(b, "job1", "s1")).is_empty());
    check!(!ok!(s.has_job(b, "job1")));
    check!(ok!(s.jobs(b)).is_empty());
    let jobs = ok!(s.jobs(a));
    check!(jobs.len() == 1);
    check!((jobs[0].sessions, jobs[0].fingerprints) == (1, 2));
    ok!(s.put_fingerprint(a, "job1", "s2", 0, "{\"w\":0}"));
    let sessions = ok!(s.sessions(a, "job1"));
    let mut names: Vec<_> = sessions
        .iter()
        .map(|x| (x.session.as_str(), x.fingerprints))
        .collect();
    names.sort();
    check!(names == vec![("s1", 2), ("s2", 1)]);
    check!(ok!(s.sessions(b, "job1")).is_empty());
    check!(ok!(s.sessions(a, "no-such-job")).is_empty());
    // Profiles: a batch is stored once; newest first; per tenant; any bytes.
    let meta = |batch: &str, t: i64| ProfileMeta {
        batch: batch.into(),
        kind: "cpu".into(),
        rank: Some("0".into()),
        host: Some("h0".into()),
        start_unix_ns: t,
        samples: 10,
    };
    let binary: Vec<u8> = (0..=255u8).collect();
    check!(ok!(s.put_profile(a, "job2", &meta("b1", 1), &binary)));
    check!(ok!(s.put_profile(a, "job2", &meta("b2", 2), b"two")));
    check!(!ok!(s.put_profile(a, "job2", &meta("b1", 1), &binary)));
    check!(ok!(s.profiles(a, "job2", "cpu", 10)) == vec![b"two".to_vec(), binary.clone()]);
    check!(ok!(s.profiles(a, "job2", "cpu", 1)).len() == 1);
    check!(ok!(s.profiles(a, "job2", "offcpu", 10)).is_empty());
    check!(ok!(s.profiles(b, "job2", "cpu", 10)).is_empty());
    check!(ok!(s.has_job(a, "job2")) && !ok!(s.has_job(b, "job2")));
    let jobs = ok!(s.jobs(a));
    let job2 = jobs
        .iter()
        .find(|j| j.job == "job2")
        .ok_or("conformance: job2 is not listed")?;
    check!((job2.sessions, job2.fingerprints, job2.profiles) == (0, 0, 2));
    check!(s.put_profile(a, "job2", &meta("../x", 3), b"x").is_err());
    // Collective records: a batch once, newest first, per tenant.
    check!(ok!(s.put_collectives(a, "job3", "c1", "{\"r\":1}\n")));
    check!(ok!(s.put_collectives(a, "job3", "c2", "{\"r\":2}\n")));
    check!(!ok!(s.put_collectives(a, "job3", "c1", "{\"r\":1}\n")));
    check!(ok!(s.collectives(a, "job3", 10)) == vec!["{\"r\":2}\n", "{\"r\":1}\n"]);
    check!(ok!(s.collectives(a, "job3", 1)).len() == 1);
    check!(ok!(s.collectives(b, "job3", 10)).is_empty());
    check!(ok!(s.has_job(a, "job3")) && !ok!(s.has_job(b, "job3")));
    check!(s.put_collectives(a, "job3", "../c", "{}").is_err());
    // Flow analyses: the same rules.
    check!(ok!(s.put_flows(a, "job4", "f1", "{\"n\":1}")));
    check!(ok!(s.put_flows(a, "job4", "f2", "{\"n\":2}")));
    check!(!ok!(s.put_flows(a, "job4", "f1", "{\"n\":1}")));
    check!(ok!(s.flows(a, "job4", 10)) == vec!["{\"n\":2}", "{\"n\":1}"]);
    check!(ok!(s.flows(a, "job4", 1)).len() == 1);
    check!(ok!(s.flows(b, "job4", 10)).is_empty());
    check!(ok!(s.has_job(a, "job4")) && !ok!(s.has_job(b, "job4")));
    check!(s.put_flows(a, "job4", "../f", "{}").is_err());
    for bad in ["", "../x", ".hidden", "a/b", "a'b", &"x".repeat(201)] {
        check!(s.put_fingerprint(a, bad, "s1", 0, "{}").is_err());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_store_passes_the_conformance_checks_and_keeps_data_across_opens() {
        let d = std::env::temp_dir().join(format!("whyslow-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let s = SqliteStore::open(&d).unwrap();
        conformance(&s).unwrap();
        let t = s.create_token("team-c").unwrap();
        drop(s);
        let s = SqliteStore::open(&d).unwrap();
        assert!(s.tenant_of_token(&t).unwrap().is_some());
        // Retention: nothing is older than an hour ago; everything is older
        // than a minute from now; tokens stay.
        assert_eq!(s.expire(now_unix() - 3600).unwrap(), 0);
        let a = s.tenant_of_token(&t).unwrap().unwrap();
        s.put_fingerprint(a, "old", "s1", 0, "{}").unwrap();
        assert!(s.expire(now_unix() + 60).unwrap() >= 1);
        assert!(s.jobs(a).unwrap().is_empty());
        assert!(s.tenant_of_token(&t).unwrap().is_some());
        let _ = std::fs::remove_dir_all(&d);
    }
}
