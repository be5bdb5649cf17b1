//! Storage behind one trait, tenant-scoped in every method (isolation lives
//! here, not only in the handlers): tenants and their hashed tokens, and the
//! fingerprints each job's workers uploaded per session. The embedded
//! default is SQLite in `DATA/whyslow.db` (WAL, one writer).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
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
            StoredProfile::Pprof(b) => {
                whyslow_stack_output::from_pprof_limited(&b, max_decompressed).ok()
            }
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
    /// Stores one batch of OS signal readings (JSON lines of
    /// `whyslow_model::os::OsSample`, as the agents write them, TCP
    /// counters among them) of a job; `false` when stored before.
    fn put_os_samples(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        jsonl: &str,
    ) -> Result<bool, StoreError>;
    /// The job's most recent `limit` batches of OS signal readings, newest
    /// first.
    fn os_samples(
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
    /// Stores one hang report of a job (the JSON of `whyslow hang --format
    /// json`, as the online package uploads it after a stall); `false`
    /// when the batch was stored before.
    fn put_hang(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        json: &str,
    ) -> Result<bool, StoreError>;
    /// The job's most recent `limit` hang reports, newest first.
    fn hangs(&self, tenant: TenantId, job: &str, limit: usize) -> Result<Vec<String>, StoreError>;
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

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// The embedded store: SQLite for metadata and recent uploads; profiles
/// older than a few minutes move to columnar segments under
/// `DATA/segments` ([`SqliteStore::compact`]).
pub struct SqliteStore {
    db: Mutex<Connection>,
    segments: PathBuf,
    /// One compaction or segment clean-up at a time.
    compacting: Mutex<()>,
}

/// Most profiles in one segment.
pub const SEGMENT_PROFILES: usize = 512;
/// The most bytes a segment's body may inflate to when read.
const MAX_SEGMENT_BODY: u64 = 1 << 30;
/// `profiles.segment` of a profile whose pprof does not decode: it stays
/// in SQLite as uploaded.
const KEPT_AS_UPLOADED: &str = "-";

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
             CREATE TABLE IF NOT EXISTS os_samples (
                 tenant INTEGER NOT NULL, job TEXT NOT NULL, batch TEXT NOT NULL,
                 body TEXT NOT NULL, uploaded_unix_s INTEGER NOT NULL, seq INTEGER NOT NULL,
                 PRIMARY KEY (tenant, batch));
             CREATE INDEX IF NOT EXISTS os_samples_by_job ON os_samples (tenant, job, seq);
             CREATE TABLE IF NOT EXISTS flows (
                 tenant INTEGER NOT NULL, job TEXT NOT NULL, batch TEXT NOT NULL,
                 body TEXT NOT NULL, uploaded_unix_s INTEGER NOT NULL, seq INTEGER NOT NULL,
                 PRIMARY KEY (tenant, batch));
             CREATE INDEX IF NOT EXISTS flows_by_job ON flows (tenant, job, seq);
             CREATE TABLE IF NOT EXISTS hangs (
                 tenant INTEGER NOT NULL, job TEXT NOT NULL, batch TEXT NOT NULL,
                 body TEXT NOT NULL, uploaded_unix_s INTEGER NOT NULL, seq INTEGER NOT NULL,
                 PRIMARY KEY (tenant, batch));
             CREATE INDEX IF NOT EXISTS hangs_by_job ON hangs (tenant, job, seq);",
        )?;
        // Where a profile lives once compacted (a path under DATA/segments;
        // NULL: its pprof is in the row). Added to databases made before.
        let has_segment: bool = db
            .prepare("SELECT 1 FROM pragma_table_info('profiles') WHERE name = 'segment'")?
            .exists([])?;
        if !has_segment {
            db.execute_batch("ALTER TABLE profiles ADD COLUMN segment TEXT")?;
        }
        db.execute_batch(
            "CREATE INDEX IF NOT EXISTS profiles_to_compact ON profiles (segment, uploaded_unix_s)",
        )?;
        let store = SqliteStore {
            db: Mutex::new(db),
            segments: data.join("segments"),
            compacting: Mutex::new(()),
        };
        // Segments written by a compaction that did not commit.
        store.remove_unreferenced_segments()?;
        Ok(store)
    }

    /// Moves the profiles uploaded before `before_unix_s` out of their rows
    /// into columnar segments ([`crate::segments`]), per tenant, job and
    /// kind, up to [`SEGMENT_PROFILES`] per segment. Each segment file is
    /// written and synced before the rows point to it, in one transaction,
    /// so a crash at any point loses nothing (a file no row names is removed
    /// at the next start). Returns (profiles moved, segments written).
    pub fn compact_profiles(&self, before_unix_s: i64) -> Result<(u64, u64), StoreError> {
        let _one = self.compacting.lock().unwrap_or_else(|p| p.into_inner());
        let groups: Vec<(i64, String, String)> = {
            let db = self.db();
            let mut st = db.prepare(
                "SELECT DISTINCT tenant, job, kind FROM profiles
                 WHERE segment IS NULL AND uploaded_unix_s < ?1",
            )?;
            let rows = st.query_map(params![before_unix_s], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        let (mut moved, mut written) = (0u64, 0u64);
        for (tenant, job, kind) in groups {
            loop {
                let batch: Vec<(String, Vec<u8>)> = {
                    let db = self.db();
                    let mut st = db.prepare_cached(
                        "SELECT batch, pprof FROM profiles
                         WHERE tenant = ?1 AND job = ?2 AND kind = ?3
                           AND segment IS NULL AND uploaded_unix_s < ?4
                         ORDER BY start_unix_ns LIMIT ?5",
                    )?;
                    let rows = st.query_map(
                        params![tenant, job, kind, before_unix_s, SEGMENT_PROFILES as i64],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?;
                    rows.collect::<Result<_, _>>()?
                };
                if batch.is_empty() {
                    break;
                }
                let (mut good, mut kept) = (Vec::new(), Vec::new());
                for (b, pprof) in batch {
                    match whyslow_stack_output::from_pprof_limited(
                        &pprof,
                        whyslow_stack_output::MAX_PPROF_DECOMPRESSED,
                    ) {
                        Ok(p) => good.push((b, p)),
                        Err(_) => kept.push(b),
                    }
                }
                let file = match good.first() {
                    Some((_, first)) => {
                        let name = format!(
                            "t{tenant}/{job}/{kind}-{}-{}.wseg",
                            first.start_unix_ns,
                            random_hex(4)
                        );
                        self.write_segment(&name, &crate::segments::encode(&good))?;
                        Some(name)
                    }
                    None => None,
                };
                let mut db = self.db();
                let tx = db.transaction()?;
                {
                    let mut up = tx.prepare_cached(
                        "UPDATE profiles SET pprof = x'', segment = ?3 WHERE tenant = ?1 AND batch = ?2",
                    )?;
                    if let Some(f) = &file {
                        for (b, _) in &good {
                            up.execute(params![tenant, b, f])?;
                        }
                    }
                    for b in &kept {
                        tx.execute(
                            "UPDATE profiles SET segment = ?3 WHERE tenant = ?1 AND batch = ?2",
                            params![tenant, b, KEPT_AS_UPLOADED],
                        )?;
                    }
                }
                tx.commit()?;
                moved += good.len() as u64;
                written += u64::from(file.is_some());
            }
        }
        Ok((moved, written))
    }

    /// Rows (batch, pprof, segment) as stored profiles: segments read once
    /// each, outside the database lock; a segment that cannot be read loses
    /// only its own profiles.
    fn stored(&self, rows: Vec<(String, Vec<u8>, Option<String>)>) -> Vec<StoredProfile> {
        let mut segments: HashMap<String, HashMap<String, whyslow_model::stack::StackProfile>> =
            HashMap::new();
        let mut out = Vec::with_capacity(rows.len());
        for (batch, pprof, segment) in rows {
            let Some(seg) = segment.filter(|s| s != KEPT_AS_UPLOADED) else {
                out.push(StoredProfile::Pprof(pprof));
                continue;
            };
            let profiles = segments.entry(seg.clone()).or_insert_with(|| {
                let path = self.segments.join(&seg);
                match std::fs::read(&path)
                    .map_err(|e| e.to_string())
                    .and_then(|b| {
                        crate::segments::decode(&b, MAX_SEGMENT_BODY).map_err(|e| e.to_string())
                    }) {
                    Ok(ps) => ps.into_iter().collect(),
                    Err(e) => {
                        // The other profiles still answer.
                        eprintln!("whyslow: {}: skipped: {e}", path.display());
                        HashMap::new()
                    }
                }
            });
            if let Some(p) = profiles.remove(&batch) {
                out.push(StoredProfile::Decoded(p));
            }
        }
        out
    }

    /// Writes `bytes` to `DATA/segments/<name>` whole: a temporary file,
    /// synced, renamed, and the directory synced.
    fn write_segment(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        use std::io::Write;
        let path = self.segments.join(name);
        let io = |e| StoreError::Io(path.display().to_string(), e);
        let dir = path.parent().expect("a segment name has a directory");
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.write_all(bytes).and_then(|_| f.sync_all()).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e)
        })?;
        std::fs::rename(&tmp, &path).map_err(io)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io)
    }

    /// Removes segment files no row names any more (all their profiles
    /// expired, or a compaction that did not commit); returns how many.
    pub fn remove_unreferenced_segments(&self) -> Result<u64, StoreError> {
        let _one = self.compacting.lock().unwrap_or_else(|p| p.into_inner());
        let named: std::collections::HashSet<String> = {
            let db = self.db();
            let mut st =
                db.prepare("SELECT DISTINCT segment FROM profiles WHERE segment IS NOT NULL")?;
            let rows = st.query_map([], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        let mut removed = 0;
        let mut stack = vec![self.segments.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let rel = p
                    .strip_prefix(&self.segments)
                    .map(|r| r.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if !named.contains(&rel) && std::fs::remove_file(&p).is_ok() {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// The bytes the segments take on disk and how many files they are.
    pub fn segment_files(&self) -> (u64, u64) {
        let (mut bytes, mut files) = (0, 0);
        let mut stack = vec![self.segments.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in rd.flatten() {
                match e.metadata() {
                    Ok(m) if m.is_dir() => stack.push(e.path()),
                    Ok(m) => {
                        bytes += m.len();
                        files += 1;
                    }
                    Err(_) => {}
                }
            }
        }
        (bytes, files)
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
        for table in [
            "fingerprints",
            "profiles",
            "collectives",
            "os_samples",
            "flows",
            "hangs",
        ] {
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

    fn profile_count(&self, tenant: TenantId, job: &str, kind: &str) -> Result<u64, StoreError> {
        let n: i64 = self.db().query_row(
            "SELECT COUNT(*) FROM profiles WHERE tenant = ?1 AND job = ?2 AND kind = ?3",
            params![tenant.0, job, kind],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    fn profiles_in_order(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        limit: usize,
        order: Order,
    ) -> Result<Vec<StoredProfile>, StoreError> {
        let rows: Vec<(String, Vec<u8>, Option<String>)> = {
            let db = self.db();
            let mut st = db.prepare_cached(match order {
                Order::NewestFirst => {
                    "SELECT batch, pprof, segment FROM profiles WHERE tenant = ?1 AND job = ?2 AND kind = ?3
                     ORDER BY start_unix_ns DESC, batch DESC LIMIT ?4"
                }
                Order::OldestFirst => {
                    "SELECT batch, pprof, segment FROM profiles WHERE tenant = ?1 AND job = ?2 AND kind = ?3
                     ORDER BY start_unix_ns, batch LIMIT ?4"
                }
            })?;
            let rows = st.query_map(params![tenant.0, job, kind, limit as i64], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
            rows.collect::<Result<_, _>>()?
        };
        Ok(self.stored(rows))
    }

    fn hour_profile(
        &self,
        tenant: TenantId,
        job: &str,
        kind: &str,
        hour_unix_s: i64,
    ) -> Result<Option<whyslow_model::stack::StackProfile>, StoreError> {
        let from = hour_unix_s.saturating_mul(1_000_000_000);
        let rows: Vec<(String, Vec<u8>, Option<String>)> = {
            let db = self.db();
            let mut st = db.prepare_cached(
                "SELECT batch, pprof, segment FROM profiles WHERE tenant = ?1 AND job = ?2 AND kind = ?3
                   AND start_unix_ns >= ?4 AND start_unix_ns < ?5 ORDER BY start_unix_ns",
            )?;
            let rows = st.query_map(
                params![
                    tenant.0,
                    job,
                    kind,
                    from,
                    from.saturating_add(3_600_000_000_000)
                ],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )?;
            rows.collect::<Result<_, _>>()?
        };
        Ok(merge_stored(self.stored(rows)))
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

    fn put_os_samples(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        jsonl: &str,
    ) -> Result<bool, StoreError> {
        self.put_batch("os_samples", tenant, job, batch, jsonl)
    }

    fn os_samples(
        &self,
        tenant: TenantId,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.batches("os_samples", tenant, job, limit)
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

    fn put_hang(
        &self,
        tenant: TenantId,
        job: &str,
        batch: &str,
        json: &str,
    ) -> Result<bool, StoreError> {
        self.put_batch("hangs", tenant, job, batch, json)
    }

    fn hangs(&self, tenant: TenantId, job: &str, limit: usize) -> Result<Vec<String>, StoreError> {
        self.batches("hangs", tenant, job, limit)
    }

    fn expire(&self, before_unix_s: i64) -> Result<u64, StoreError> {
        let mut n = 0;
        {
            let db = self.db();
            for table in [
                "fingerprints",
                "profiles",
                "collectives",
                "os_samples",
                "flows",
                "hangs",
            ] {
                n += db.execute(
                    &format!("DELETE FROM {table} WHERE uploaded_unix_s < ?1"),
                    params![before_unix_s],
                )? as u64;
            }
        }
        // Segments whose profiles have all gone.
        self.remove_unreferenced_segments()?;
        Ok(n)
    }

    fn compact(&self, before_unix_s: i64) -> Result<(u64, u64), StoreError> {
        self.compact_profiles(before_unix_s)
    }

    fn segment_usage(&self) -> (u64, u64) {
        self.segment_files()
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

/// `profiles` decoded and merged; `None` when none decodes.
pub fn merge_stored(profiles: Vec<StoredProfile>) -> Option<whyslow_model::stack::StackProfile> {
    let decoded: Vec<_> = profiles
        .into_iter()
        .filter_map(|p| p.into_profile(whyslow_stack_output::MAX_PPROF_DECOMPRESSED))
        .collect();
    (!decoded.is_empty()).then(|| whyslow_model::stack::StackProfile::merged(&decoded))
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
    check!(
        ok!(s.profiles(a, "job2", "cpu", 10))
            == vec![
                StoredProfile::Pprof(b"two".to_vec()),
                StoredProfile::Pprof(binary.clone())
            ]
    );
    check!(ok!(s.profiles(a, "job2", "cpu", 1)).len() == 1);
    check!(
        ok!(s.profiles_in_order(a, "job2", "cpu", 1, Order::OldestFirst))
            == vec![StoredProfile::Pprof(binary.clone())]
    );
    check!(ok!(s.profile_count(a, "job2", "cpu")) == 2);
    check!(ok!(s.profile_count(a, "job2", "offcpu")) == 0);
    check!(ok!(s.profile_count(b, "job2", "cpu")) == 0);
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
    // Hour profiles (baselines): the profiles that began in one hour,
    // merged, the same before and after the store's compaction (ClickHouse:
    // its hourly rollup), and a late profile counted once it is there.
    // A few hours ago: stores keep rollups only within their retention.
    let hour = (now_unix() / 3600 - 3) * 3600;
    let work = |at_s: i64, stacks: &[(&str, u64)]| {
        use whyslow_model::stack::{Frame, StackProfileBuilder};
        let mut b = StackProfileBuilder::new();
        for (leaf, n) in stacks {
            let ids = vec![b.frame(Frame::label("main")), b.frame(Frame::label(*leaf))];
            b.add(ids, *n);
        }
        whyslow_stack_output::to_pprof(&b.finish(
            99.0,
            (at_s * 1_000_000_000) as u64,
            1_000_000_000,
        ))
    };
    let at = |s: i64| (hour + s) * 1_000_000_000;
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h1", at(10)),
        &work(hour + 10, &[("a", 3)])
    )));
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h2", at(20)),
        &work(hour + 20, &[("a", 2), ("b", 5)])
    )));
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h0", at(-5)),
        &work(hour - 5, &[("c", 7)])
    )));
    let total = |s: &dyn Store| -> Result<Option<u64>, String> {
        Ok(ok!(s.hour_profile(a, "job-h", "cpu", hour)).map(|p| p.total()))
    };
    check!(total(s)? == Some(10));
    check!(ok!(s.hour_profile(a, "job-h", "cpu", hour + 3600)).is_none());
    check!(ok!(s.hour_profile(a, "job-h", "offcpu", hour)).is_none());
    check!(ok!(s.hour_profile(b, "job-h", "cpu", hour)).is_none());
    // Something long-term was written: a segment, or the hour's rollup.
    check!(ok!(s.compact(now_unix() + 1)).1 >= 1);
    check!(total(s)? == Some(10));
    check!(ok!(s.put_profile(
        a,
        "job-h",
        &meta("h3", at(30)),
        &work(hour + 30, &[("b", 1)])
    )));
    check!(!ok!(s.put_profile(
        a,
        "job-h",
        &meta("h3", at(30)),
        &work(hour + 30, &[("b", 1)])
    )));
    check!(total(s)? == Some(11));
    check!(ok!(s.compact(now_unix() + 1)).1 >= 1);
    check!(total(s)? == Some(11));
    let names = |p: whyslow_model::stack::StackProfile| {
        let mut n: Vec<String> = p.frames.iter().filter_map(|f| f.name.clone()).collect();
        n.sort();
        n
    };
    check!(
        ok!(s.hour_profile(a, "job-h", "cpu", hour)).map(names)
            == Some(vec!["a".into(), "b".into(), "main".into()])
    );
    // Collective records: a batch once, newest first, per tenant.
    check!(ok!(s.put_collectives(a, "job3", "c1", "{\"r\":1}\n")));
    check!(ok!(s.put_collectives(a, "job3", "c2", "{\"r\":2}\n")));
    check!(!ok!(s.put_collectives(a, "job3", "c1", "{\"r\":1}\n")));
    check!(ok!(s.collectives(a, "job3", 10)) == vec!["{\"r\":2}\n", "{\"r\":1}\n"]);
    check!(ok!(s.collectives(a, "job3", 1)).len() == 1);
    check!(ok!(s.collectives(b, "job3", 10)).is_empty());
    check!(ok!(s.has_job(a, "job3")) && !ok!(s.has_job(b, "job3")));
    check!(s.put_collectives(a, "job3", "../c", "{}").is_err());
    check!(ok!(s.put_os_samples(a, "job3", "o1", "{\"o\":1}\n")));
    check!(ok!(s.put_os_samples(a, "job3", "o2", "{\"o\":2}\n")));
    check!(!ok!(s.put_os_samples(a, "job3", "o1", "{\"o\":1}\n")));
    check!(ok!(s.os_samples(a, "job3", 10)) == vec!["{\"o\":2}\n", "{\"o\":1}\n"]);
    check!(ok!(s.os_samples(b, "job3", 10)).is_empty());
    check!(ok!(s.collectives(a, "job3", 10)).len() == 2);
    // Flow analyses: the same rules.
    check!(ok!(s.put_flows(a, "job4", "f1", "{\"n\":1}")));
    check!(ok!(s.put_flows(a, "job4", "f2", "{\"n\":2}")));
    check!(!ok!(s.put_flows(a, "job4", "f1", "{\"n\":1}")));
    check!(ok!(s.flows(a, "job4", 10)) == vec!["{\"n\":2}", "{\"n\":1}"]);
    check!(ok!(s.flows(a, "job4", 1)).len() == 1);
    check!(ok!(s.flows(b, "job4", 10)).is_empty());
    check!(ok!(s.has_job(a, "job4")) && !ok!(s.has_job(b, "job4")));
    check!(s.put_flows(a, "job4", "../f", "{}").is_err());
    // Hang reports: once per batch, newest first, per tenant.
    check!(ok!(s.put_hang(a, "job5", "h1", "{\"n\":1}")));
    check!(ok!(s.put_hang(a, "job5", "h2", "{\"n\":2}")));
    check!(!ok!(s.put_hang(a, "job5", "h1", "{\"n\":1}")));
    check!(ok!(s.hangs(a, "job5", 10)) == vec!["{\"n\":2}", "{\"n\":1}"]);
    check!(ok!(s.hangs(b, "job5", 10)).is_empty());
    check!(ok!(s.has_job(a, "job5")));
    check!(s.put_hang(a, "job5", "../h", "{}").is_err());
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

    fn a_profile(rank: u32, start: u64, leaf: &str) -> whyslow_model::stack::StackProfile {
        use whyslow_model::stack::{Frame, StackProfileBuilder};
        let mut b = StackProfileBuilder::new();
        let ids = [
            Frame::label("main"),
            Frame::label("train_step"),
            Frame::label(leaf),
        ]
        .into_iter()
        .map(|f| b.frame(f))
        .collect();
        b.add(ids, 10 + u64::from(rank));
        b.label("rank", rank.to_string());
        b.finish(99.0, start, 30_000_000_000)
    }

    #[test]
    fn old_profiles_move_into_segments_and_read_back_the_same() {
        let d = std::env::temp_dir().join(format!("whyslow-segments-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let s = SqliteStore::open(&d).unwrap();
        let t = s.create_token("team-s").unwrap();
        let a = s.tenant_of_token(&t).unwrap().unwrap();
        let meta = |batch: &str, start: u64| ProfileMeta {
            batch: batch.into(),
            kind: "cpu".into(),
            rank: None,
            host: None,
            start_unix_ns: start as i64,
            samples: 1,
        };
        let profiles: Vec<_> = (0..5u32)
            .map(|r| a_profile(r, 1_000 + u64::from(r), &format!("leaf_{r}")))
            .collect();
        for (i, p) in profiles.iter().enumerate() {
            let bytes = whyslow_stack_output::to_pprof(p);
            assert!(s
                .put_profile(a, "job", &meta(&format!("b{i}"), p.start_unix_ns), &bytes)
                .unwrap());
        }
        // Bytes that are no pprof (the API refuses them; a store takes them)
        // stay as uploaded; so does everything newer than the cut.
        assert!(s
            .put_profile(a, "job", &meta("junk", 999), b"junk")
            .unwrap());
        let before = s.profiles(a, "job", "cpu", 10).unwrap();
        assert_eq!(s.compact(now_unix() - 3600).unwrap(), (0, 0));
        assert_eq!(s.compact(now_unix() + 1).unwrap(), (5, 1));
        assert_eq!(s.compact(now_unix() + 1).unwrap(), (0, 0));
        let (bytes, files) = s.segment_usage();
        assert!(bytes > 0 && files == 1, "{bytes} {files}");
        let after = s.profiles(a, "job", "cpu", 10).unwrap();
        assert_eq!(after.len(), 6);
        assert_eq!(after.last(), Some(&StoredProfile::Pprof(b"junk".to_vec())));
        // Newest first, each the profile uploaded.
        for (i, got) in after[..5].iter().enumerate() {
            let StoredProfile::Decoded(p) = got else {
                panic!("profile {i} not from a segment: {got:?}");
            };
            // As the pprof read before (pprof keeps the rate as a period).
            assert_eq!(before[i].clone().into_profile(1 << 20).as_ref(), Some(p));
            assert_eq!(p.labels["rank"], (4 - i).to_string());
        }
        // A retry of a compacted batch is still recognised.
        let again = whyslow_stack_output::to_pprof(&profiles[0]);
        assert!(!s.put_profile(a, "job", &meta("b0", 1_000), &again).unwrap());
        assert_eq!(s.jobs(a).unwrap()[0].profiles, 6);
        // Across a restart; a segment no row names is removed at open.
        drop(s);
        let orphan = d.join("segments/t1/job/cpu-1-orphan.wseg");
        std::fs::write(&orphan, b"WSEG1").unwrap();
        let s = SqliteStore::open(&d).unwrap();
        assert!(!orphan.exists());
        assert_eq!(s.profiles(a, "job", "cpu", 2).unwrap().len(), 2);
        // Retention removes the rows, then the segment.
        assert!(s.expire(now_unix() + 60).unwrap() >= 6);
        assert_eq!(s.segment_usage(), (0, 0));
        assert!(s.profiles(a, "job", "cpu", 10).unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_damaged_segment_loses_only_its_own_profiles() {
        let d = std::env::temp_dir().join(format!("whyslow-segbad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let s = SqliteStore::open(&d).unwrap();
        let t = s.create_token("team-s").unwrap();
        let a = s.tenant_of_token(&t).unwrap().unwrap();
        for (job, start) in [("j1", 1u64), ("j2", 2)] {
            let meta = ProfileMeta {
                batch: format!("{job}-b"),
                kind: "cpu".into(),
                rank: None,
                host: None,
                start_unix_ns: start as i64,
                samples: 1,
            };
            let p = whyslow_stack_output::to_pprof(&a_profile(0, start, job));
            s.put_profile(a, job, &meta, &p).unwrap();
        }
        assert_eq!(s.compact(now_unix() + 1).unwrap(), (2, 2));
        let seg = std::fs::read_dir(d.join("segments/t1/j1"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        std::fs::write(seg.path(), b"WSEG1 damaged").unwrap();
        assert!(s.profiles(a, "j1", "cpu", 10).unwrap().is_empty());
        assert_eq!(s.profiles(a, "j2", "cpu", 10).unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(&d);
    }
}
