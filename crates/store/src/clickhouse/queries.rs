//! The reads that profiles and functions share: profile rows, stack
//! frames, summed samples, per-function sums, and the job's samples'
//! condition.

use std::collections::HashMap;

use whyslow_model::stack::{Frame, StackProfile, StackProfileBuilder};

use super::rows::{Count, FunctionRow, ProfileRow, StackFrames, StackSum, Totals, PROFILE_COLUMNS};
use super::ClickHouseStore;
use crate::{FunctionQuery, FunctionSamples, FunctionSums, Order, StoreError, TenantId};

impl ClickHouseStore {
    /// Whether the tenant stored `batch` in `table` before.
    pub(super) fn seen(
        &self,
        table: &str,
        tenant: TenantId,
        batch: &str,
    ) -> Result<bool, StoreError> {
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
    pub(super) fn profile_rows(
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
    pub(super) fn build(
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
    pub(super) fn sum_profiles(
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
    pub(super) fn frames_of(
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
    pub(super) fn function_sums(
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
pub(super) fn profile_range(metas: &[ProfileRow]) -> (i64, i64) {
    let lo = metas.iter().map(|m| m.start_unix_ns).min().unwrap_or(0);
    let hi = metas.iter().map(|m| m.start_unix_ns).max().unwrap_or(0);
    (lo, hi.saturating_add(1))
}
