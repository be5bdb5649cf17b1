//! The embedded store: SQLite in `DATA/whyslow.db` (WAL, one writer) for
//! metadata and recent uploads; profiles move to columnar segments
//! ([`crate::segments`]) once they are a few minutes old.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use crate::{
    check_name, merge_stored, new_token, now_unix, random_hex, token_hash, BatchKind,
    FunctionQuery, FunctionSums, FunctionTable, JobSummary, Order, ProfileMeta, SessionSummary,
    Store, StoreError, StoredProfile, TenantId,
};

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
                    match whyslow_codec::from_pprof_limited(
                        &pprof,
                        whyslow_codec::MAX_PPROF_DECOMPRESSED,
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
            .prepare_cached("SELECT tenant FROM tokens WHERE hash = ?1")?
            .query_row(params![token_hash(token)], |r| r.get(0))
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
                 FROM profiles WHERE tenant = ?1 GROUP BY job
                 UNION ALL
                 SELECT job, 0, 0, 0, MAX(uploaded_unix_s) FROM (
                     SELECT job, uploaded_unix_s FROM collectives WHERE tenant = ?1
                     UNION ALL SELECT job, uploaded_unix_s FROM os_samples WHERE tenant = ?1
                     UNION ALL SELECT job, uploaded_unix_s FROM flows WHERE tenant = ?1
                     UNION ALL SELECT job, uploaded_unix_s FROM hangs WHERE tenant = ?1)
                 GROUP BY job)
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
        // Cached: parsing the statement was a tenth of an upload's SQLite time.
        let db = self.db();
        let n = db
            .prepare_cached(
                "INSERT OR IGNORE INTO profiles
                 (tenant, job, batch, kind, rank, host, start_unix_ns, samples, pprof, uploaded_unix_s)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )?
            .execute(params![
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

    fn functions(&self, tenant: TenantId, q: &FunctionQuery) -> Result<FunctionTable, StoreError> {
        for j in &q.jobs {
            check_name("job", j)?;
        }
        let sums = |(from, to): (i64, i64)| -> Result<FunctionSums, StoreError> {
            let rows: Vec<(String, Vec<u8>, Option<String>)> = {
                let db = self.db();
                let mut st = db.prepare_cached(
                    "SELECT job, batch, pprof, segment FROM profiles
                     WHERE tenant = ?1 AND kind = ?2 AND start_unix_ns >= ?3 AND start_unix_ns < ?4",
                )?;
                let rows = st.query_map(params![tenant.0, q.kind, from, to], |r| {
                    Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?)))
                })?;
                rows.filter(|r| {
                    r.as_ref()
                        .map(|(job, _)| q.jobs.is_empty() || q.jobs.contains(job))
                        .unwrap_or(true)
                })
                .map(|r| r.map(|(_, row)| row))
                .collect::<Result<_, _>>()?
            };
            Ok(crate::fold_decoded(
                self.stored(rows),
                |sums: &mut FunctionSums, p| sums.add_profile(p),
                |a, b| a.absorb(b),
            ))
        };
        let now = sums(q.range)?;
        let base = q.baseline.map(sums).transpose()?;
        Ok(FunctionTable::from_sums(&now, base.as_ref(), q.limit))
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
        let table = kind.table();
        // `seq` keeps the arrival order, so "newest" does not depend on the
        // clock's resolution.
        let n = self.db().execute(
            &format!(
                "INSERT OR IGNORE INTO {table} (tenant, job, batch, body, uploaded_unix_s, seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, (SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}))"
            ),
            params![tenant.0, job, batch, body, now_unix()],
        )?;
        Ok(n == 1)
    }

    fn batches(
        &self,
        tenant: TenantId,
        job: &str,
        kind: BatchKind,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let db = self.db();
        let mut st = db.prepare_cached(&format!(
            "SELECT body FROM {} WHERE tenant = ?1 AND job = ?2 ORDER BY seq DESC LIMIT ?3",
            kind.table()
        ))?;
        let rows = st.query_map(params![tenant.0, job, limit as i64], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance;

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
            let bytes = whyslow_codec::to_pprof(p);
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
        let again = whyslow_codec::to_pprof(&profiles[0]);
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
            let p = whyslow_codec::to_pprof(&a_profile(0, start, job));
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
