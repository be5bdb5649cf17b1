//! Stack profiles as answers (SysOM-AI §3.4, Fig. 6–7): a job's flame
//! graph, its differential flame graph against a baseline, and the
//! tenant's top functions over a time range, merged and symbolized by the
//! store.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use crate::edge::{ApiPath, JobName, Tenant};
use crate::error::{blocking, ApiError, ApiResult};
use crate::{store, AppState, Order, StoreError, TenantId};

/// `YYYY-MM-DD HH:00` (UTC) of a Unix time.
fn utc_hour(unix_s: i64) -> String {
    format!(
        "{} {:02}:00",
        whyslow_model::time::utc_date(unix_s),
        unix_s.rem_euclid(86_400) / 3600
    )
}

/// The kinds of stack profile the service keeps apart.
pub const PROFILE_KINDS: [&str; 3] = ["cpu", "offcpu", "host"];

/// Most profiles one flame graph merges.
pub const MAX_FLAME_PROFILES: usize = 1000;

/// The flame graph (SVG) of a job's latest `limit` profiles of `kind`,
/// merged by the store (ClickHouse sums samples per stack itself), frames
/// that came without a name symbolized from the tenant's uploaded symbols
/// (SysOM-AI §3.4); `None` when the job has no such profiles. The API and
/// the web UI both draw it here.
pub fn job_flamegraph(
    state: &AppState,
    tenant: TenantId,
    job: &str,
    kind: &str,
    limit: usize,
) -> Result<Option<String>, StoreError> {
    let Some((mut merged, n)) =
        state
            .store
            .merged_profiles(tenant, job, kind, limit, Order::NewestFirst)?
    else {
        return Ok(None);
    };
    if let Some(s) = &state.symbols {
        s.symbolize(tenant, &mut merged);
    }
    Ok(Some(whyslow_stack_output::to_flamegraph_svg(
        &merged,
        &whyslow_stack_output::FlameOptions {
            title: format!("job {job}: {kind}, latest {n} profiles"),
            ..Default::default()
        },
    )))
}

/// The job's `limit` profiles of `kind` from one end, merged by the store
/// and symbolized, with how many there were.
fn merged_side(
    state: &AppState,
    tenant: TenantId,
    job: &str,
    kind: &str,
    limit: usize,
    order: Order,
) -> Result<Option<(whyslow_model::stack::StackProfile, usize)>, StoreError> {
    let merged = state
        .store
        .merged_profiles(tenant, job, kind, limit, order)?;
    Ok(merged.map(|(mut p, n)| {
        if let Some(s) = &state.symbols {
            s.symbolize(tenant, &mut p);
        }
        (p, n)
    }))
}

/// `?kind=&limit=&base_job=` of the differential flame graph routes.
#[derive(Debug, serde::Deserialize)]
pub struct DiffQuery {
    /// `cpu` (default), `offcpu` or `host`.
    pub kind: Option<String>,
    /// With `base_job` or `base_hour`: the job's latest profiles merged
    /// (and `base_job`'s) (default and most: [`MAX_FLAME_PROFILES`]).
    pub limit: Option<usize>,
    /// Compare with this job's latest profiles instead of the diagnosis's
    /// baseline of the job.
    pub base_job: Option<String>,
    /// Compare with the profiles (of `base_job`, else of the job) that began
    /// in the hour starting at this Unix time (rounded down to the hour):
    /// on ClickHouse one hourly rollup.
    pub base_hour: Option<i64>,
}

/// The differential flame graph (SysOM-AI Fig. 6–7) of a job's profiles
/// of `kind`: by default what changed since the job ran well — the
/// diagnosis's judged window against its temporal baseline, the periods
/// its verdict compared ([`whyslow_diagnose::Diagnosis::what_changed`],
/// the same picture as `whyslow diagnose --diff-svg`); with `base_job`,
/// the job's latest `limit` against that job's latest `limit`; with
/// `base_hour`, against one hour of the job (or of `base_job`). Frames
/// wider now are red, narrower blue, paths only in one side marked.
/// Errors: 400 for a bad question, 404 without profiles to compare.
pub fn diff_flamegraph(
    state: &AppState,
    tenant: TenantId,
    job: &str,
    q: &DiffQuery,
) -> ApiResult<String> {
    let bad = |e: String| ApiError::bad_request(e);
    let (kind, limit) = FlameQuery {
        kind: q.kind.clone(),
        limit: q.limit,
    }
    .checked()
    .map(|(k, l)| (k.to_string(), l))
    .map_err(bad)?;
    store::check_name("job", job).map_err(|e| bad(e.to_string()))?;
    let internal = |e: StoreError| ApiError::internal(e);
    if let Some(h) = q.base_hour {
        // The stores keep nanoseconds in an i64: later than 2262 is no time.
        const MAX_UNIX_S: i64 = i64::MAX / 1_000_000_000;
        if !(0..=MAX_UNIX_S).contains(&h) {
            return Err(bad(format!(
                "base_hour {h}: expected a Unix time in seconds, 0..={MAX_UNIX_S}"
            )));
        }
        let hour = h.div_euclid(3600) * 3600;
        let other = q.base_job.as_deref().unwrap_or(job);
        store::check_name("job", other).map_err(|e| bad(e.to_string()))?;
        let base = state
            .store
            .hour_profile(tenant, other, &kind, hour)
            .map_err(internal)?
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "no {kind} profiles of job {other:?} began in the hour from {hour} (Unix s)"
                ))
            })?;
        let Some((new, n)) =
            merged_side(state, tenant, job, &kind, limit, Order::NewestFirst).map_err(internal)?
        else {
            return Err(ApiError::not_found(format!(
                "no {kind} profiles of job {job:?}"
            )));
        };
        let title = format!(
            "job {job}: {kind}, latest {n} profiles against job {other}'s hour from {} UTC (red: wider now, blue: narrower)",
            utc_hour(hour)
        );
        let mut base = base;
        if let Some(store) = &state.symbols {
            store.symbolize(tenant, &mut base);
        }
        return Ok(whyslow_stack_output::to_diff_flamegraph_svg(
            &base,
            &new,
            &whyslow_stack_output::FlameOptions {
                title,
                ..Default::default()
            },
        ));
    }
    let Some(other) = q.base_job.as_deref() else {
        return what_changed(state, tenant, job, &kind);
    };
    store::check_name("job", other).map_err(|e| bad(e.to_string()))?;
    let side = |j: &str| {
        merged_side(state, tenant, j, &kind, limit, Order::NewestFirst)
            .map_err(internal)?
            .ok_or_else(|| ApiError::not_found(format!("no {kind} profiles of job {j:?}")))
    };
    let (new, n_new) = side(job)?;
    let (base, n_base) = side(other)?;
    let title = format!(
        "job {job}: {kind}, latest {n_new} profiles against job {other}'s latest {n_base} (red: wider in {job}, blue: narrower)"
    );
    Ok(whyslow_stack_output::to_diff_flamegraph_svg(
        &base,
        &new,
        &whyslow_stack_output::FlameOptions {
            title,
            ..Default::default()
        },
    ))
}

/// The job's own baseline: the diagnosis's window against its baseline
/// over what the store holds, symbolized.
fn what_changed(state: &AppState, tenant: TenantId, job: &str, kind: &str) -> ApiResult<String> {
    let k = whyslow_diagnose::ProfileKind::from_name(kind)
        .ok_or_else(|| ApiError::bad_request(format!("kind {kind:?}: not a profile kind")))?;
    let d = crate::diagnosis_of(state.store.as_ref(), tenant, job, &Default::default())
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::not_found(format!("job {job:?}: {e}")))?;
    let no_profiles = || ApiError::not_found(format!("no {kind} profiles of job {job:?}"));
    let pair = d.what_changed(k).ok_or_else(no_profiles)?;
    if pair.base.stacks.is_empty() && pair.test.stacks.is_empty() {
        return Err(ApiError::not_found(format!(
            "no {kind} profiles of job {job:?} lie in its baseline or its window ({})",
            pair.title
        )));
    }
    let mut pair = pair.clone();
    if let Some(s) = &state.symbols {
        s.symbolize(tenant, &mut pair.base);
        s.symbolize(tenant, &mut pair.test);
    }
    pair.title = format!(
        "job {job}: {kind}, {} (seconds since its first profile; red: wider now, blue: narrower)",
        pair.title
    );
    Ok(whyslow_stack_output::diff_flamegraph(&pair).svg)
}

/// `?kind=&limit=` of the flame graph routes.
#[derive(Debug, serde::Deserialize)]
pub struct FlameQuery {
    /// `cpu` (default), `offcpu` or `host`.
    pub kind: Option<String>,
    /// Latest profiles to merge (default and most: [`MAX_FLAME_PROFILES`]).
    pub limit: Option<usize>,
}

impl FlameQuery {
    /// The kind and limit asked for, or why not.
    pub fn checked(&self) -> Result<(&str, usize), String> {
        let kind = self.kind.as_deref().unwrap_or("cpu");
        if !PROFILE_KINDS.contains(&kind) {
            return Err(format!(
                "kind must be one of {PROFILE_KINDS:?}, not {kind:?}"
            ));
        }
        let limit = self.limit.unwrap_or(MAX_FLAME_PROFILES);
        if !(1..=MAX_FLAME_PROFILES).contains(&limit) {
            return Err(format!(
                "limit must be 1..={MAX_FLAME_PROFILES}, not {limit}"
            ));
        }
        Ok((kind, limit))
    }
}

/// `?kind=&jobs=&from=&to=&base_from=&base_to=&baseline=&limit=` of
/// `GET /api/v1/functions`: times are Unix seconds.
#[derive(Debug, Default, serde::Deserialize)]
pub struct FunctionsParams {
    /// `cpu` (default), `offcpu` or `host`.
    pub kind: Option<String>,
    /// Comma-separated jobs (default: all of the tenant's jobs).
    pub jobs: Option<String>,
    /// Start of the range (default: `to` minus one hour).
    pub from: Option<i64>,
    /// End of the range, exclusive (default: now).
    pub to: Option<i64>,
    /// Start of the baseline range (default: the range's length before
    /// `from`).
    pub base_from: Option<i64>,
    /// End of the baseline range (default: `base_from` plus the range's
    /// length).
    pub base_to: Option<i64>,
    /// `none`: no baseline.
    pub baseline: Option<String>,
    /// Most functions (default 50, at most 10,000).
    pub limit: Option<usize>,
}

impl FunctionsParams {
    /// The store's question, or why not (`now_s`: the default end).
    pub fn query(&self, now_s: i64) -> Result<store::FunctionQuery, String> {
        const MAX_UNIX_S: i64 = i64::MAX / 1_000_000_000;
        let kind = self.kind.as_deref().unwrap_or("cpu");
        if !PROFILE_KINDS.contains(&kind) {
            return Err(format!(
                "kind must be one of {PROFILE_KINDS:?}, not {kind:?}"
            ));
        }
        let to = self.to.unwrap_or(now_s);
        let from = self.from.unwrap_or(to.saturating_sub(3600));
        let within = |name: &str, v: i64| {
            if (0..=MAX_UNIX_S).contains(&v) {
                Ok(v)
            } else {
                Err(format!(
                    "{name} {v}: expected a Unix time in seconds, 0..={MAX_UNIX_S}"
                ))
            }
        };
        let (from, to) = (within("from", from)?, within("to", to)?);
        if from >= to {
            return Err(format!("from ({from}) must be before to ({to})"));
        }
        let baseline = match self.baseline.as_deref() {
            Some("none") => None,
            Some(other) => {
                return Err(format!(
                    "baseline must be \"none\" or absent, not {other:?}"
                ))
            }
            None => {
                let len = to - from;
                // A given base_from must be a time; the default (the
                // range's length before `from`) stops at the epoch.
                let bf = match self.base_from {
                    Some(v) => within("base_from", v)?,
                    None => from.saturating_sub(len).max(0),
                };
                let bt = within("base_to", self.base_to.unwrap_or(bf.saturating_add(len)))?;
                if bf >= bt {
                    return Err(format!("base_from ({bf}) must be before base_to ({bt})"));
                }
                Some((bf * 1_000_000_000, bt * 1_000_000_000))
            }
        };
        let limit = self.limit.unwrap_or(50);
        if !(1..=10_000).contains(&limit) {
            return Err(format!("limit must be 1..=10000, not {limit}"));
        }
        let jobs: Vec<String> = self
            .jobs
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(str::trim)
            .filter(|j| !j.is_empty())
            .map(str::to_string)
            .collect();
        for j in &jobs {
            store::check_name("job", j).map_err(|e| e.to_string())?;
        }
        Ok(store::FunctionQuery {
            kind: kind.to_string(),
            jobs,
            range: (from * 1_000_000_000, to * 1_000_000_000),
            baseline,
            limit,
        })
    }
}

/// `GET /api/v1/jobs/{job}/diff.svg`.
pub async fn get_diff_flamegraph(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(job): ApiPath<JobName>,
    Query(q): Query<DiffQuery>,
) -> ApiResult<impl IntoResponse> {
    let st = state.clone();
    let svg = blocking(move || diff_flamegraph(&st, t, &job, &q)).await?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg))
}

/// `GET /api/v1/jobs/{job}/flamegraph.svg`.
pub async fn get_flamegraph(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(job): ApiPath<JobName>,
    Query(q): Query<FlameQuery>,
) -> ApiResult<impl IntoResponse> {
    let (kind, limit) = q.checked().map_err(ApiError::bad_request)?;
    let (st, k) = (state.clone(), kind.to_string());
    let svg = blocking(move || {
        job_flamegraph(&st, t, &job, &k, limit)?.ok_or_else(|| {
            ApiError::not_found(format!("no {k} profiles of job {:?}", job.as_str()))
        })
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg))
}

/// `GET /api/v1/functions`: the tenant's top functions by share over a
/// time range, across its jobs, with the change against a baseline range —
/// answered by the store (a GROUP BY on ClickHouse).
pub async fn get_functions(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    Query(p): Query<FunctionsParams>,
) -> ApiResult<Json<serde_json::Value>> {
    let q = p
        .query(crate::serve::now_unix_s())
        .map_err(ApiError::bad_request)?;
    let (st, q2) = (state.clone(), q.clone());
    let table = blocking(move || Ok(st.store.functions(t, &q2)?)).await?;
    let mut v = serde_json::to_value(&table).map_err(ApiError::internal)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), json!(q.kind));
        o.insert("jobs".into(), json!(q.jobs));
        o.insert("from_unix_s".into(), json!(q.range.0 / 1_000_000_000));
        o.insert("to_unix_s".into(), json!(q.range.1 / 1_000_000_000));
        if let Some((bf, bt)) = q.baseline {
            o.insert("base_from_unix_s".into(), json!(bf / 1_000_000_000));
            o.insert("base_to_unix_s".into(), json!(bt / 1_000_000_000));
        }
    }
    Ok(Json(v))
}
