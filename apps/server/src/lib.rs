//! `whyslow server`: the central service (issue 14). Ranks upload their
//! fingerprints (PerfTracker §4.2's per-worker summaries) per job and
//! session; localization (§4.3) runs here over what arrived, so rank 0 no
//! longer gathers them; reports are served as the JSON of
//! `whyslow analyze --format json`.
//!
//! API (every `/api` route needs `Authorization: Bearer TOKEN`; tokens are
//! per tenant and stored hashed; a tenant sees only its own jobs):
//! - `POST /api/v1/jobs/{job}/sessions/{session}/fingerprints` — one
//!   worker's fingerprint JSON (as `whyslow summarize` writes it); uploading
//!   the same worker again replaces it (retries never double-count);
//! - `GET /api/v1/jobs` — `[{"job", "sessions", "fingerprints", "updated_unix_s", "name"?, "labels"?}]`
//!   (`name` and `labels`: what the scheduler calls the job, from its ranks);
//! - `GET /api/v1/jobs/{job}/sessions/{session}/report` — the report;
//! - `POST /api/v1/jobs/{job}/sessions/{session}/fix` — asks the model the
//!   server was configured with for a fix (EROICA's first step; 404 when
//!   none is); the report comes back with `fix` or `fix_error`, and later
//!   reports of that session carry the answer;
//! - `POST /api/v1/jobs/{job}/profiles/{batch}` — one stack profile of a
//!   node agent (pprof, gzip or not, with the agent's labels), stored once
//!   per batch id (SysOM-AI §3.4: profiles go to the central service);
//! - `GET /api/v1/jobs/{job}/flamegraph.svg?kind=cpu|offcpu|host&limit=N` —
//!   the flame graph of the job's latest N profiles of that kind;
//! - `GET /api/v1/functions?kind=&jobs=&from=&to=&base_from=&base_to=` —
//!   the tenant's top functions by share over a time range across its jobs,
//!   with the change against a baseline range, answered by the store;
//! - `GET /healthz`, `GET /metrics` (Prometheus text) and
//!   `GET /api/v1/openapi.json` (this API's OpenAPI 3 description,
//!   `api/openapi.json`) need no token.
//!
//! The web UI ([`ui`]) lives under `/ui/`: jobs, sessions, reports.
//!
//! Storage (the `whyslow-store` crate): [`store`] (SQLite embedded, or
//! [`clickhouse`] as a column store) for what is queried; [`objects`] (a local directory, or S3-compatible storage) for
//! symbol files and, when configured, an archive of every raw upload.

pub use whyslow_store as store;
pub use whyslow_store::{clickhouse, objects, segments, symbols};

pub mod fix;
pub mod ui;
pub mod verdicts;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

pub use clickhouse::{ClickHouseConfig, ClickHouseStore};
pub use store::{
    conformance, BatchKind, JobSummary, Order, ProfileMeta, SqliteStore, Store, StoreError,
    TenantId,
};

/// Largest request body accepted (one fingerprint is kilobytes to a few MB).
pub const MAX_BODY: usize = 32 << 20;

/// Largest decompressed profile accepted (an agent's period is well under
/// a megabyte; a gzip bomb stops here).
pub const MAX_PROFILE_DECOMPRESSED: u64 = 64 << 20;

/// Counters exported on `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: AtomicU64,
    unauthorized: AtomicU64,
    not_found: AtomicU64,
    bad_requests: AtomicU64,
    server_errors: AtomicU64,
    fingerprints: AtomicU64,
    fingerprint_bytes: AtomicU64,
    reports: AtomicU64,
    profiles: AtomicU64,
    profile_bytes: AtomicU64,
    profile_samples: AtomicU64,
    profile_duplicates: AtomicU64,
    symbol_files: AtomicU64,
    collective_records: AtomicU64,
    os_readings: AtomicU64,
    flow_analyses: AtomicU64,
    hang_reports: AtomicU64,
    raw_archived: AtomicU64,
    raw_archived_bytes: AtomicU64,
    profiles_compacted: AtomicU64,
    compactions: AtomicU64,
    /// What was concluded of each job (per-job gauges).
    pub jobs: verdicts::JobVerdicts,
}

impl Metrics {
    fn render(&self) -> String {
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = String::new();
        for (name, help, v) in [
            (
                "whyslow_server_requests_total",
                "HTTP requests served",
                c(&self.requests),
            ),
            (
                "whyslow_server_unauthorized_total",
                "requests refused for a missing or unknown token",
                c(&self.unauthorized),
            ),
            (
                "whyslow_server_not_found_total",
                "requests for jobs or sessions the tenant does not have",
                c(&self.not_found),
            ),
            (
                "whyslow_server_bad_requests_total",
                "requests with a body or name that could not be used",
                c(&self.bad_requests),
            ),
            (
                "whyslow_server_errors_total",
                "requests that failed inside the server",
                c(&self.server_errors),
            ),
            (
                "whyslow_server_fingerprints_ingested_total",
                "fingerprints stored",
                c(&self.fingerprints),
            ),
            (
                "whyslow_server_fingerprint_bytes_total",
                "bytes of fingerprints stored",
                c(&self.fingerprint_bytes),
            ),
            (
                "whyslow_server_reports_total",
                "reports computed",
                c(&self.reports),
            ),
            (
                "whyslow_server_profiles_ingested_total",
                "stack profiles stored",
                c(&self.profiles),
            ),
            (
                "whyslow_server_profile_bytes_total",
                "bytes of stack profiles stored (as uploaded)",
                c(&self.profile_bytes),
            ),
            (
                "whyslow_server_profile_samples_total",
                "samples in the stack profiles stored",
                c(&self.profile_samples),
            ),
            (
                "whyslow_server_profile_duplicates_total",
                "profile uploads whose batch was stored before (retries)",
                c(&self.profile_duplicates),
            ),
            (
                "whyslow_server_symbol_files_indexed_total",
                "uploaded ELF files indexed for symbols",
                c(&self.symbol_files),
            ),
            (
                "whyslow_server_collective_records_ingested_total",
                "collective records stored (the agents' gloo and NCCL tracers)",
                c(&self.collective_records),
            ),
            (
                "whyslow_server_os_readings_ingested_total",
                "OS signal readings stored (the agents' OS and TCP counters)",
                c(&self.os_readings),
            ),
            (
                "whyslow_server_flow_analyses_ingested_total",
                "flow analyses stored (`whyslow flows analyze --format json`)",
                c(&self.flow_analyses),
            ),
            (
                "whyslow_server_hang_reports_ingested_total",
                "hang reports stored (the online package's, after a stall)",
                c(&self.hang_reports),
            ),
            (
                "whyslow_server_raw_uploads_archived_total",
                "uploads kept as they came in the object store (--object-store)",
                c(&self.raw_archived),
            ),
            (
                "whyslow_server_raw_upload_bytes_archived_total",
                "bytes of uploads kept in the object store",
                c(&self.raw_archived_bytes),
            ),
            (
                "whyslow_server_profiles_compacted_total",
                "stack profiles moved into columnar segments (the embedded store)",
                c(&self.profiles_compacted),
            ),
            (
                "whyslow_server_compactions_total",
                "columnar segments written (the embedded store) or hourly profile rollups computed (ClickHouse)",
                c(&self.compactions),
            ),
        ] {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            ));
        }
        self.jobs.render(&mut s);
        s
    }
}

/// Shared state of the handlers.
pub struct AppState {
    /// Days uploads are kept (the embedded store's retention; ClickHouse
    /// applies its TTL itself).
    pub retention_days: u32,
    /// Seconds after upload when the embedded store moves a profile into a
    /// columnar segment.
    pub compact_after_s: u64,
    /// The store.
    pub store: Box<dyn Store>,
    /// Uploaded symbols (None: symbol upload is off).
    pub symbols: Option<symbols::SymbolStore>,
    /// Where every accepted upload is also kept as it came, for
    /// reprocessing (None: not kept).
    pub raw: Option<Arc<objects::Objects>>,
    /// Counters.
    pub metrics: Metrics,
    /// Fix proposals from a model (None: off, the default).
    pub fix: Option<fix::FixSetting>,
    /// Tokens already looked up.
    pub tokens: TokenCache,
}

/// Bearer tokens the store has answered for, each for [`TokenCache::TTL`]:
/// a lookup was a blocking task and a query on every upload. Only known
/// tokens are kept (an unknown one is asked again), at most
/// [`TokenCache::MAX`] (the cache is emptied when full). Tokens are never
/// revoked today; the time to live bounds how long a revoked one would
/// still work.
#[derive(Debug, Default)]
pub struct TokenCache(std::sync::Mutex<std::collections::HashMap<String, (TenantId, Instant)>>);

impl TokenCache {
    /// How long an answer is used.
    pub const TTL: Duration = Duration::from_secs(60);
    /// Most tokens kept.
    pub const MAX: usize = 10_000;

    fn get(&self, token: &str) -> Option<TenantId> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(token)
            .filter(|(_, at)| at.elapsed() < Self::TTL)
            .map(|(t, _)| *t)
    }

    fn put(&self, token: String, tenant: TenantId) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MAX {
            map.clear();
        }
        map.insert(token, (tenant, Instant::now()));
    }
}

/// An API error: status and a one-line message (JSON `{"error": …}`).
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let code =
            StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let msg = match e {
            StoreError::BadName(m) => m,
            other => other.to_string(),
        };
        ApiError(code, msg)
    }
}

type ApiResult<T> = Result<T, ApiError>;

fn count(state: &AppState, r: &ApiResult<impl Sized>) {
    state.metrics.requests.fetch_add(1, Ordering::Relaxed);
    if let Err(ApiError(code, _)) = r {
        let m = &state.metrics;
        match *code {
            StatusCode::UNAUTHORIZED => &m.unauthorized,
            StatusCode::NOT_FOUND => &m.not_found,
            c if c.is_client_error() => &m.bad_requests,
            _ => &m.server_errors,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

/// `YYYY-MM-DD HH:00` (UTC) of a Unix time.
fn utc_hour(unix_s: i64) -> String {
    format!(
        "{} {:02}:00",
        utc_date(unix_s),
        unix_s.rem_euclid(86_400) / 3600
    )
}

/// Civil date (UTC) of a Unix time, `YYYY-MM-DD`.
fn utc_date(unix_s: i64) -> String {
    whyslow_model::time::utc_date(unix_s)
}

/// Keeps an accepted upload as it came, under
/// `raw/t<tenant>/<job>/<kind>/<YYYY-MM-DD>/<name>`, before it is stored:
/// an acknowledged upload is always in the archive, and a retry rewrites
/// the same object. A failure is a 503 (the client retries).
async fn archive(
    state: &Arc<AppState>,
    t: TenantId,
    job: &str,
    kind: &str,
    name: &str,
    bytes: Bytes,
) -> ApiResult<()> {
    let Some(raw) = state.raw.clone() else {
        return Ok(());
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let key = format!("raw/t{}/{job}/{kind}/{}/{name}", t.0, utc_date(now));
    let len = bytes.len() as u64;
    blocking(move || {
        raw.put(&key, bytes.to_vec()).map_err(|e| {
            ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the raw-upload archive failed: {e}"),
            )
        })
    })
    .await?;
    state.metrics.raw_archived.fetch_add(1, Ordering::Relaxed);
    state
        .metrics
        .raw_archived_bytes
        .fetch_add(len, Ordering::Relaxed);
    Ok(())
}

async fn tenant(state: &Arc<AppState>, headers: &HeaderMap) -> ApiResult<TenantId> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty() && t.len() <= 256)
        .ok_or_else(|| ApiError(StatusCode::UNAUTHORIZED, "missing bearer token".into()))?;
    if let Some(t) = state.tokens.get(&token) {
        return Ok(t);
    }
    let st = state.clone();
    let (t, token) = blocking(move || Ok((st.store.tenant_of_token(&token)?, token))).await?;
    let t = t.ok_or_else(|| ApiError(StatusCode::UNAUTHORIZED, "unknown token".into()))?;
    state.tokens.put(token, t);
    Ok(t)
}

async fn post_fingerprint(
    State(state): State<Arc<AppState>>,
    UrlPath((job, session)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        store::check_name("job", &job)?;
        store::check_name("session", &session)?;
        let fp = whyslow_ingest::parse_fingerprint(&body, Path::new("request body"))
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e.to_string()))?;
        let worker = fp.worker;
        let text = serde_json::to_string(&fp)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let len = text.len() as u64;
        archive(
            &state,
            t,
            &job,
            "fingerprints",
            &format!("{session}/worker-{worker}.json"),
            body,
        )
        .await?;
        let world = fp.job.as_ref().and_then(|j| j.world_size);
        let (st, j, s) = (state.clone(), job.clone(), session.clone());
        blocking(move || {
            st.store.put_fingerprint(t, &j, &s, worker, &text)?;
            // The session's last rank: judge it now, so the job's gauges
            // (and the alerts on them) do not wait for someone to look.
            if let Some(n) = world {
                let have = st
                    .store
                    .sessions(t, &j)?
                    .into_iter()
                    .find(|x| x.session == s)
                    .map_or(0, |x| x.fingerprints);
                if have == u64::from(n) {
                    if let Ok(report) = report_of(&st.store.fingerprints(t, &j, &s)?) {
                        st.metrics.jobs.report(t.0, &j, &report);
                    }
                }
            }
            Ok(())
        })
        .await?;
        state.metrics.fingerprints.fetch_add(1, Ordering::Relaxed);
        state
            .metrics
            .fingerprint_bytes
            .fetch_add(len, Ordering::Relaxed);
        Ok((
            StatusCode::CREATED,
            Json(json!({ "job": job, "session": session, "worker": worker })),
        ))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

/// What the scheduler calls a job (`name`, `labels`: Slurm, Kubernetes,
/// torchrun), as its ranks put it in their fingerprints: read from one
/// fingerprint of its latest session. `None` for a job without one (only
/// profiles, or fingerprints from before the field).
pub fn job_identity(
    store: &dyn Store,
    t: TenantId,
    job: &str,
) -> Result<Option<whyslow_model::JobIdentity>, StoreError> {
    #[derive(Deserialize)]
    struct Head {
        #[serde(default)]
        job: Option<whyslow_model::JobIdentity>,
    }
    let Some(latest) = store.sessions(t, job)?.into_iter().next() else {
        return Ok(None);
    };
    let fps = store.fingerprints(t, job, &latest.session)?;
    Ok(fps
        .iter()
        .find_map(|text| serde_json::from_str::<Head>(text).ok()?.job))
}

/// The tenant's jobs, each with the scheduler's name and labels where its
/// ranks gave them (`GET /api/v1/jobs`, the UI's list).
pub fn jobs_with_identity(
    store: &dyn Store,
    t: TenantId,
) -> Result<Vec<(JobSummary, Option<whyslow_model::JobIdentity>)>, StoreError> {
    store
        .jobs(t)?
        .into_iter()
        .map(|j| {
            let id = job_identity(store, t, &j.job)?;
            Ok((j, id))
        })
        .collect()
}

async fn list_jobs(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        let st = state.clone();
        let jobs = blocking(move || Ok(jobs_with_identity(st.store.as_ref(), t)?)).await?;
        let rows: Vec<serde_json::Value> = jobs
            .into_iter()
            .map(|(j, id)| {
                let mut v = serde_json::to_value(&j).unwrap_or_default();
                if let (Some(obj), Some(id)) = (v.as_object_mut(), id) {
                    if let Some(name) = id.name {
                        obj.insert("name".into(), json!(name));
                    }
                    if !id.labels.is_empty() {
                        obj.insert("labels".into(), json!(id.labels));
                    }
                }
                v
            })
            .collect();
        Ok(Json(rows))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

/// Judges a session's fingerprints through the job pipeline, the same
/// call `whyslow localize` makes (one job, empty windows, world size from
/// the fingerprints; no source excerpts: the server does not read its own
/// files for a client). Stored fingerprints that no longer parse are left
/// out with a warning.
pub fn report_of(
    fingerprints: &[String],
) -> Result<whyslow_model::Report, whyslow_pipeline::Refusal> {
    let mut evidence = whyslow_pipeline::JobEvidence {
        fingerprints: whyslow_pipeline::JobFingerprints::with_capacity(fingerprints.len()),
        ..Default::default()
    };
    // Each fingerprint into the job's compact form as it is parsed.
    for (i, text) in fingerprints.iter().enumerate() {
        match whyslow_ingest::parse_fingerprint(text.as_bytes(), Path::new("stored fingerprint")) {
            Ok(fp) => evidence.fingerprints.push(fp),
            Err(e) => evidence
                .warnings
                .push(format!("stored fingerprint {i}: {e}; left out")),
        }
    }
    whyslow_pipeline::analyze_job(evidence, &whyslow_pipeline::JobPolicy::default())
}

async fn get_report(
    State(state): State<Arc<AppState>>,
    UrlPath((job, session)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        let st = state.clone();
        let body = blocking(move || {
            let fps = st.store.fingerprints(t, &job, &session)?;
            if fps.is_empty() {
                return Err(ApiError(
                    StatusCode::NOT_FOUND,
                    format!("no job {job:?} session {session:?}"),
                ));
            }
            // Evidence that cannot be judged as one job is the client's
            // to fix: 409 with the pipeline's reason.
            let mut report =
                report_of(&fps).map_err(|e| ApiError(StatusCode::CONFLICT, e.to_string()))?;
            st.metrics.jobs.report(t.0, &job, &report);
            if let Some(f) = &st.fix {
                f.recall(t, &job, &session, &mut report);
            }
            Ok(whyslow_report::render_json(&report))
        })
        .await?;
        state.metrics.reports.fetch_add(1, Ordering::Relaxed);
        Ok(([(header::CONTENT_TYPE, "application/json")], body))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

/// A session's report with a model's fix proposal: the same report as
/// [`report_of`], then the same request `whyslow analyze --suggest-fix`
/// sends. Errors: 404 without the setting (the error says so; a 5xx
/// would read as the server failing) or for an unknown session, 409
/// for evidence that cannot be judged. A model that fails is not an error:
/// the report carries `fix_error`.
pub fn session_fix(
    state: &AppState,
    t: TenantId,
    job: &str,
    session: &str,
) -> Result<whyslow_model::Report, (StatusCode, String)> {
    let Some(setting) = &state.fix else {
        return Err((
            StatusCode::NOT_FOUND,
            "this server asks no model for fixes: start it with --suggest-fix and WHYSLOW_LLM_URL"
                .to_string(),
        ));
    };
    let fps = state
        .store
        .fingerprints(t, job, session)
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    if fps.is_empty() {
        return Err((
            StatusCode::NOT_FOUND,
            format!("no job {job:?} session {session:?}"),
        ));
    }
    let report = report_of(&fps).map_err(|e| (StatusCode::CONFLICT, e.to_string()))?;
    Ok(setting.ask(t, job, session, report))
}

async fn post_fix(
    State(state): State<Arc<AppState>>,
    UrlPath((job, session)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        store::check_name("job", &job)?;
        store::check_name("session", &session)?;
        let st = state.clone();
        let body = blocking(move || {
            session_fix(&st, t, &job, &session)
                .map(|r| whyslow_report::render_json(&r))
                .map_err(|(code, why)| ApiError(code, why))
        })
        .await?;
        Ok(([(header::CONTENT_TYPE, "application/json")], body))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

/// The API's OpenAPI 3 description (`GET /api/v1/openapi.json`).
pub const OPENAPI: &str = include_str!("../api/openapi.json");

/// The kinds of stack profile the service keeps apart.
pub const PROFILE_KINDS: [&str; 3] = ["cpu", "offcpu", "host"];

/// Most profiles one flame graph merges.
pub const MAX_FLAME_PROFILES: usize = 1000;

/// What the service records of an uploaded profile: its kind (`offcpu`
/// from the agent's `kind` label, `host` for node-wide profiles, else
/// `cpu`), rank, host, period start and samples.
pub fn profile_meta(batch: &str, p: &whyslow_model::stack::StackProfile) -> ProfileMeta {
    meta_of(batch, &p.labels, p.total(), p.start_unix_ns)
}

/// [`profile_meta`] from a profile's [`PprofSummary`](whyslow_stack_output::PprofSummary),
/// as the ingest reads it.
pub fn summary_meta(batch: &str, p: &whyslow_stack_output::PprofSummary) -> ProfileMeta {
    meta_of(batch, &p.labels, p.samples, p.start_unix_ns)
}

fn meta_of(
    batch: &str,
    labels: &std::collections::BTreeMap<String, String>,
    samples: u64,
    start_unix_ns: u64,
) -> ProfileMeta {
    let kind = if labels.get("kind").map(String::as_str) == Some("offcpu") {
        "offcpu"
    } else if labels.contains_key("scope") {
        "host"
    } else {
        "cpu"
    };
    ProfileMeta {
        batch: batch.to_string(),
        kind: kind.to_string(),
        rank: labels.get("rank").cloned(),
        host: labels.get("host").cloned(),
        start_unix_ns: i64::try_from(start_unix_ns).unwrap_or(i64::MAX),
        samples,
    }
}

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
    /// Profiles on each side (default and most: [`MAX_FLAME_PROFILES`]).
    pub limit: Option<usize>,
    /// Compare with this job's latest profiles instead of the job's own
    /// first ones.
    pub base_job: Option<String>,
    /// Compare with the profiles (of `base_job`, else of the job) that began
    /// in the hour starting at this Unix time (rounded down to the hour):
    /// on ClickHouse one hourly rollup.
    pub base_hour: Option<i64>,
}

/// The differential flame graph (SysOM-AI Fig. 6–7) of a job's latest
/// profiles of `kind` against a baseline: by default the job's own first
/// profiles — a temporal baseline, how it ran at the start — the same
/// number on each side and at most half of the job's profiles each, so the
/// two never overlap; with `base_job`, that job's latest `limit`. Frames
/// wider now are red, narrower blue, paths only in one side marked.
/// Errors: (status, why).
pub fn diff_flamegraph(
    state: &AppState,
    tenant: TenantId,
    job: &str,
    q: &DiffQuery,
) -> Result<String, (StatusCode, String)> {
    let bad = |e: String| (StatusCode::BAD_REQUEST, e);
    let (kind, limit) = FlameQuery {
        kind: q.kind.clone(),
        limit: q.limit,
    }
    .checked()
    .map(|(k, l)| (k.to_string(), l))
    .map_err(bad)?;
    store::check_name("job", job).map_err(|e| bad(e.to_string()))?;
    let internal = |e: StoreError| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
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
                (
                    StatusCode::NOT_FOUND,
                    format!("no {kind} profiles of job {other:?} began in the hour from {hour} (Unix s)"),
                )
            })?;
        let Some((new, n)) =
            merged_side(state, tenant, job, &kind, limit, Order::NewestFirst).map_err(internal)?
        else {
            return Err((
                StatusCode::NOT_FOUND,
                format!("no {kind} profiles of job {job:?}"),
            ));
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
    let (base, new, title) = match q.base_job.as_deref() {
        None => {
            let total = state
                .store
                .profile_count(tenant, job, &kind)
                .map_err(internal)?;
            if total < 2 {
                return Err((
                    StatusCode::NOT_FOUND,
                    format!(
                        "a differential flame graph needs at least 2 {kind} profiles of job {job:?}; it has {total}"
                    ),
                ));
            }
            let n = limit.min((total / 2) as usize);
            let side = |order| {
                merged_side(state, tenant, job, &kind, n, order)
                    .map_err(internal)?
                    .map(|(p, _)| p)
                    .ok_or_else(|| {
                        (
                            StatusCode::NOT_FOUND,
                            format!("no {kind} profiles of job {job:?}"),
                        )
                    })
            };
            let new = side(Order::NewestFirst)?;
            let base = side(Order::OldestFirst)?;
            let title = format!(
                "job {job}: {kind}, latest {n} profiles against its first {n} (red: wider now, blue: narrower)"
            );
            (base, new, title)
        }
        Some(other) => {
            store::check_name("job", other).map_err(|e| bad(e.to_string()))?;
            let side = |j: &str| {
                merged_side(state, tenant, j, &kind, limit, Order::NewestFirst)
                    .map_err(internal)?
                    .ok_or_else(|| {
                        (
                            StatusCode::NOT_FOUND,
                            format!("no {kind} profiles of job {j:?}"),
                        )
                    })
            };
            let (new, n_new) = side(job)?;
            let (base, n_base) = side(other)?;
            let title = format!(
                "job {job}: {kind}, latest {n_new} profiles against job {other}'s latest {n_base} (red: wider in {job}, blue: narrower)"
            );
            (base, new, title)
        }
    };
    Ok(whyslow_stack_output::to_diff_flamegraph_svg(
        &base,
        &new,
        &whyslow_stack_output::FlameOptions {
            title,
            ..Default::default()
        },
    ))
}

async fn get_diff_flamegraph(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    axum::extract::Query(q): axum::extract::Query<DiffQuery>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        let st = state.clone();
        let svg = blocking(move || {
            diff_flamegraph(&st, t, &job, &q).map_err(|(code, e)| ApiError(code, e))
        })
        .await?;
        Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

async fn post_profile(
    State(state): State<Arc<AppState>>,
    UrlPath((job, batch)): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        store::check_name("job", &job)?;
        store::check_name("batch", &batch)?;
        if body.is_empty() {
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                "empty body: expected a pprof profile (gzip or raw protobuf)".into(),
            ));
        }
        // Checked as a whole, not built: the flame graphs decode it later.
        let (summary, inflated) =
            whyslow_stack_output::pprof_summary_inflated(&body, MAX_PROFILE_DECOMPRESSED).map_err(
                |e| ApiError(StatusCode::BAD_REQUEST, format!("not a pprof profile: {e}")),
            )?;
        let meta = summary_meta(&batch, &summary);
        archive(
            &state,
            t,
            &job,
            "profiles",
            &format!("{batch}.pb"),
            body.clone(),
        )
        .await?;
        // A store that files stacks as rows reads the protobuf inflated
        // here, not the upload again.
        let bytes = if state.store.files_profiles_as_rows() {
            inflated
        } else {
            body.clone()
        };
        let (st, j, m) = (state.clone(), job.clone(), meta.clone());
        let stored = blocking(move || Ok(st.store.put_profile(t, &j, &m, &bytes)?)).await?;
        let m = &state.metrics;
        if stored {
            m.profiles.fetch_add(1, Ordering::Relaxed);
            m.profile_bytes
                .fetch_add(body.len() as u64, Ordering::Relaxed);
            m.profile_samples.fetch_add(meta.samples, Ordering::Relaxed);
        } else {
            m.profile_duplicates.fetch_add(1, Ordering::Relaxed);
        }
        Ok((
            if stored {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            Json(json!({ "job": job, "batch": batch, "kind": meta.kind, "stored": stored })),
        ))
    }
    .await;
    count(&state, &r);
    r.into_response()
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

/// `GET /api/v1/functions`: the tenant's top functions by share over a
/// time range, across its jobs, with the change against a baseline range —
/// answered by the store (a GROUP BY on ClickHouse).
async fn get_functions(
    State(state): State<Arc<AppState>>,
    axum::extract::Query(p): axum::extract::Query<FunctionsParams>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let q = p
            .query(now_s)
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
        let st = state.clone();
        let q2 = q.clone();
        let table = blocking(move || Ok(st.store.functions(t, &q2)?)).await?;
        let mut v = serde_json::to_value(&table)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
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
    .await;
    count(&state, &r);
    r.into_response()
}

async fn get_flamegraph(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    axum::extract::Query(q): axum::extract::Query<FlameQuery>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        store::check_name("job", &job)?;
        let (kind, limit) = q
            .checked()
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
        let (st, j, k) = (state.clone(), job.clone(), kind.to_string());
        let svg = blocking(move || {
            job_flamegraph(&st, t, &j, &k, limit)?.ok_or_else(|| {
                ApiError(
                    StatusCode::NOT_FOUND,
                    format!("no {k} profiles of job {j:?}"),
                )
            })
        })
        .await?;
        Ok(([(header::CONTENT_TYPE, "image/svg+xml")], svg))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

/// Batches of collective records a straggler verdict reads (the latest).
pub const MAX_COLLECTIVE_BATCHES: usize = 2000;

/// Parses a batch of JSON lines, each a `T` (`what` names one in the
/// error); the first bad line is the error, with its number.
fn parse_jsonl<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> Result<Vec<T>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(line).map_err(|e| format!("line {}: not {what}: {e}", i + 1))?,
        );
    }
    Ok(out)
}

/// Parses a batch of collective records (JSON lines); the first bad line
/// is the error, with its number.
pub fn parse_collectives(
    text: &str,
) -> Result<Vec<whyslow_model::collective::CollectiveRecord>, String> {
    parse_jsonl(text, "a collective record")
}

/// SysOM-AI §3.1's slow-rank detection over a job's latest collective
/// records: the stragglers, and per group the entry-time plot data.
pub fn stragglers_of(
    batches: &[String],
) -> (
    usize,
    Vec<whyslow_diagnose::stragglers::Straggler>,
    Vec<whyslow_diagnose::stragglers::GroupLateness>,
) {
    let records: Vec<_> = batches
        .iter()
        .filter_map(|b| parse_collectives(b).ok())
        .flatten()
        .collect();
    let cfg = whyslow_diagnose::stragglers::StragglerConfig::default();
    let late = whyslow_diagnose::stragglers::slow_ranks(&records, &cfg);
    let groups = whyslow_diagnose::stragglers::lateness(&records, &cfg);
    (records.len(), late, groups)
}

/// A batch of text (collective records, a flow analysis) for a job:
/// authenticated, named, UTF-8, parsed by `parse` into the summary the
/// answer carries, archived, then stored once per batch as `put`.
async fn post_text_batch<S: serde::Serialize + Send + 'static>(
    state: Arc<AppState>,
    (job, batch): (String, String),
    headers: HeaderMap,
    body: Bytes,
    (kind, ext): (&'static str, &'static str),
    parse: impl FnOnce(&str) -> Result<(S, u64), String>,
    put: BatchKind,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        store::check_name("job", &job)?;
        store::check_name("batch", &batch)?;
        let text = String::from_utf8(body.to_vec())
            .map_err(|_| ApiError(StatusCode::BAD_REQUEST, "the body is not UTF-8".into()))?;
        let (summary, items) = parse(&text).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
        archive(&state, t, &job, kind, &format!("{batch}.{ext}"), body).await?;
        let (st, j, b) = (state.clone(), job.clone(), batch.clone());
        let stored = blocking(move || Ok(st.store.put_batch(t, &j, put, &b, &text)?)).await?;
        if stored {
            let m = &state.metrics;
            match kind {
                "collectives" => &m.collective_records,
                "os" => &m.os_readings,
                "hangs" => &m.hang_reports,
                _ => &m.flow_analyses,
            }
            .fetch_add(items, Ordering::Relaxed);
        }
        let mut answer = serde_json::to_value(summary)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        if let Some(o) = answer.as_object_mut() {
            o.insert("job".into(), json!(job));
            o.insert("batch".into(), json!(batch));
            o.insert("stored".into(), json!(stored));
        }
        Ok((
            if stored {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            },
            Json(answer),
        ))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

async fn post_collectives(
    State(state): State<Arc<AppState>>,
    UrlPath(names): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parse = |text: &str| {
        let n = parse_collectives(text)?.len();
        if n == 0 {
            return Err("no collective record in the body".to_string());
        }
        Ok((json!({ "records": n }), n as u64))
    };
    post_text_batch(
        state,
        names,
        headers,
        body,
        ("collectives", "jsonl"),
        parse,
        BatchKind::Collectives,
    )
    .await
}

/// Parses a batch of OS signal readings (JSON lines of
/// `whyslow_model::os::OsSample`); the first bad line is the error.
pub fn parse_os_samples(text: &str) -> Result<Vec<whyslow_model::os::OsSample>, String> {
    parse_jsonl(text, "an OS signal reading")
}

async fn post_os_samples(
    State(state): State<Arc<AppState>>,
    UrlPath(names): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parse = |text: &str| {
        let n = parse_os_samples(text)?.len();
        if n == 0 {
            return Err("no OS signal reading in the body".to_string());
        }
        Ok((json!({ "readings": n }), n as u64))
    };
    post_text_batch(
        state,
        names,
        headers,
        body,
        ("os", "jsonl"),
        parse,
        BatchKind::OsSamples,
    )
    .await
}

/// Most profiles of each kind, and batches of OS readings, a diagnosis
/// reads (the latest).
pub const MAX_DIAGNOSIS_PROFILES: usize = 5000;

/// What the store holds of a job for the cross-layer diagnosis: its
/// latest profiles of every kind, collective records, OS readings and its
/// latest session's fingerprints (the GPU layer's kernel times). Stored
/// data that no longer parses is left out with a note.
pub fn diagnosis_evidence(
    store: &dyn Store,
    tenant: TenantId,
    job: &str,
) -> Result<whyslow_model::diagnosis::DiagnoseEvidence, StoreError> {
    let mut e = whyslow_model::diagnosis::DiagnoseEvidence::default();
    let mut bad = 0usize;
    for kind in PROFILE_KINDS {
        for p in store.profiles(tenant, job, kind, MAX_DIAGNOSIS_PROFILES)? {
            match p.into_profile(whyslow_stack_output::MAX_PPROF_DECOMPRESSED) {
                Some(p) => e.profiles.push(p),
                None => bad += 1,
            }
        }
    }
    if bad > 0 {
        e.notes
            .push(format!("{bad} stored profile(s) do not decode: left out"));
    }
    let (collectives, readings) = (
        store.batches(tenant, job, BatchKind::Collectives, MAX_COLLECTIVE_BATCHES)?,
        store.batches(tenant, job, BatchKind::OsSamples, MAX_DIAGNOSIS_PROFILES)?,
    );
    let (c, bad_records) = jsonl_values(&collectives);
    let (o, bad_readings) = jsonl_values(&readings);
    (e.collectives, e.os_samples) = (c, o);
    if bad_records + bad_readings > 0 {
        e.notes.push(format!(
            "{bad_records} stored collective record(s) and {bad_readings} OS reading(s) do not parse: left out"
        ));
    }
    if let Some(latest) = store.sessions(tenant, job)?.first() {
        let fps: Vec<whyslow_model::Fingerprint> = store
            .fingerprints(tenant, job, &latest.session)?
            .iter()
            .filter_map(|t| {
                whyslow_ingest::parse_fingerprint(t.as_bytes(), Path::new("stored fingerprint"))
                    .ok()
            })
            .collect();
        if !fps.is_empty() {
            e.fingerprints = Some(fps);
        }
    }
    Ok(e)
}

/// Every line of `batches` that parses as a `T`, and how many did not.
fn jsonl_values<T: serde::de::DeserializeOwned>(batches: &[String]) -> (Vec<T>, usize) {
    let (mut out, mut bad) = (Vec::new(), 0);
    for line in batches.iter().flat_map(|b| b.lines()) {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) => bad += 1,
        }
    }
    (out, bad)
}

/// `?baseline=A..B&window=A..B&until=S` of the diagnosis.
#[derive(Debug, Default, Deserialize)]
pub struct DiagnosisQuery {
    baseline: Option<String>,
    window: Option<String>,
    until: Option<f64>,
}

impl DiagnosisQuery {
    /// As the diagnosis's configuration.
    pub fn config(&self) -> Result<whyslow_diagnose::DiagnoseConfig, String> {
        let range = |s: &Option<String>, what| {
            s.as_deref()
                .map(|s| whyslow_diagnose::parse_range(s, what))
                .transpose()
                .map_err(|e| e.to_string())
        };
        let cfg = whyslow_diagnose::DiagnoseConfig {
            baseline: range(&self.baseline, "baseline")?,
            window: range(&self.window, "window")?,
            until: self.until,
        };
        // A bad `until` is the client's to fix (400), as a bad range is.
        cfg.validate().map_err(|e| e.to_string())?;
        Ok(cfg)
    }
}

/// The job's cross-layer diagnosis over what the store holds (the same
/// call as `whyslow diagnose` over an agent's spool).
pub fn diagnosis_of(
    store: &dyn Store,
    tenant: TenantId,
    job: &str,
    cfg: &whyslow_diagnose::DiagnoseConfig,
) -> Result<Result<whyslow_diagnose::Diagnosis, whyslow_diagnose::DiagnoseError>, StoreError> {
    let evidence = diagnosis_evidence(store, tenant, job)?;
    Ok(whyslow_diagnose::diagnose(&evidence, cfg))
}

async fn get_diagnosis(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    Query(q): Query<DiagnosisQuery>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        store::check_name("job", &job)?;
        let cfg = q
            .config()
            .map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?;
        let (st, j) = (state.clone(), job.clone());
        let d = blocking(move || Ok(diagnosis_of(st.store.as_ref(), t, &j, &cfg)?)).await?;
        let d = d.map_err(|e| ApiError(StatusCode::NOT_FOUND, format!("job {job:?}: {e}")))?;
        state.metrics.jobs.diagnosis(t.0, &job, &d.report);
        let body = serde_json::to_string_pretty(&d.report)
            .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        Ok(([(header::CONTENT_TYPE, "application/json")], body + "\n"))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

/// Most a flow analysis may hold: jobs, and steps per rank.
const MAX_FLOW_JOBS: usize = 1000;

/// Parses a flow analysis as `whyslow flows analyze --format json` writes it.
pub fn parse_flow_report(text: &str) -> Result<whyslow_model::flow::FlowReport, String> {
    let r: whyslow_model::flow::FlowReport = serde_json::from_str(text)
        .map_err(|e| format!("not a flow analysis (`whyslow flows analyze --format json`): {e}"))?;
    if r.jobs.len() > MAX_FLOW_JOBS {
        return Err(format!(
            "{} jobs in one flow analysis: at most {MAX_FLOW_JOBS}",
            r.jobs.len()
        ));
    }
    Ok(r)
}

async fn post_flows(
    State(state): State<Arc<AppState>>,
    UrlPath(names): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let parse = |text: &str| {
        let r = parse_flow_report(text)?;
        Ok((
            json!({ "jobs": r.jobs.len(), "findings": r.findings.len() }),
            1,
        ))
    };
    post_text_batch(
        state,
        names,
        headers,
        body,
        ("flows", "json"),
        parse,
        BatchKind::Flows,
    )
    .await
}

/// Most culprits plus waiting ranks a hang report may hold.
const MAX_HANG_RANKS: usize = 1 << 20;

/// Parses a hang report as `whyslow hang --format json` writes it.
pub fn parse_hang_report(text: &str) -> Result<whyslow_model::hang::HangReport, String> {
    let r: whyslow_model::hang::HangReport = serde_json::from_str(text)
        .map_err(|e| format!("not a hang report (`whyslow hang --format json`): {e}"))?;
    if r.culprits.len() + r.waiting.len() > MAX_HANG_RANKS {
        return Err(format!(
            "{} ranks in one hang report: at most {MAX_HANG_RANKS}",
            r.culprits.len() + r.waiting.len()
        ));
    }
    Ok(r)
}

async fn post_hang(
    State(state): State<Arc<AppState>>,
    UrlPath(names): UrlPath<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let hangs: Arc<std::sync::Mutex<Option<whyslow_model::hang::HangReport>>> = Arc::default();
    let seen = hangs.clone();
    let parse = move |text: &str| {
        let r = parse_hang_report(text)?;
        if let Ok(mut s) = seen.lock() {
            *s = Some(r.clone());
        }
        Ok((
            json!({ "hang": r.hang, "culprits": r.culprits.iter().map(|c| c.rank).collect::<Vec<_>>() }),
            1,
        ))
    };
    let job = names.0.clone();
    let resp = post_text_batch(
        state.clone(),
        names,
        headers.clone(),
        body,
        ("hangs", "json"),
        parse,
        BatchKind::Hangs,
    )
    .await;
    // Stored: the job's hang gauge follows it (the alert rules read it).
    if resp.status().is_success() {
        if let Ok(t) = tenant(&state, &headers).await {
            if let Some(r) = hangs.lock().ok().and_then(|mut h| h.take()) {
                state.metrics.jobs.hang_report(t.0, &job, &r);
            }
        }
    }
    resp
}

async fn get_hang(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let r = latest_batch(
        &state,
        &headers,
        &job,
        "hang report",
        BatchKind::Hangs,
        parse_hang_report,
    )
    .await
    .map(Json);
    count(&state, &r);
    r.into_response()
}

/// The job's latest batch of `fetch`, parsed, or 404 naming
/// `what`.
async fn latest_batch<T: Send + 'static>(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    job: &str,
    what: &str,
    fetch: BatchKind,
    parse: fn(&str) -> Result<T, String>,
) -> ApiResult<T> {
    let t = tenant(state, headers).await?;
    store::check_name("job", job)?;
    let (st, j) = (state.clone(), job.to_string());
    let mut latest = blocking(move || Ok(st.store.batches(t, &j, fetch, 1)?)).await?;
    let Some(text) = latest.pop() else {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no {what} of job {job:?}"),
        ));
    };
    parse(&text).map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e))
}

/// The job's latest flow analysis, or 404.
async fn latest_flows(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    job: &str,
) -> ApiResult<whyslow_model::flow::FlowReport> {
    latest_batch(
        state,
        headers,
        job,
        "flow analysis",
        BatchKind::Flows,
        parse_flow_report,
    )
    .await
}

async fn get_flows(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let r = latest_flows(&state, &headers, &job).await.map(Json);
    count(&state, &r);
    r.into_response()
}

async fn get_flows_perfetto(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let r = latest_flows(&state, &headers, &job).await.map(|report| {
        (
            [(header::CONTENT_TYPE, "application/json")],
            whyslow_report::flows::to_perfetto_trace(&report),
        )
    });
    count(&state, &r);
    r.into_response()
}

async fn get_stragglers(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        store::check_name("job", &job)?;
        let (st, j) = (state.clone(), job.clone());
        let batches = blocking(move || Ok(st.store.batches(t, &j, BatchKind::Collectives, MAX_COLLECTIVE_BATCHES)?)).await?;
        if batches.is_empty() {
            return Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no collective records of job {job:?}"),
            ));
        }
        let (records, late, groups) = stragglers_of(&batches);
        Ok(Json(json!({
            "job": job,
            "records": records,
            "groups": groups.iter().map(|g| json!({"group": g.group, "ranks": g.ranks, "instances": g.instances.len()})).collect::<Vec<_>>(),
            "stragglers": late,
        })))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

fn symbol_store(state: &AppState) -> ApiResult<&symbols::SymbolStore> {
    state.symbols.as_ref().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            "this server keeps no symbols (start it with --data, --symbols DIR or --object-store URL)".into(),
        )
    })
}

/// `?of=N` of a symbol part upload.
#[derive(Debug, serde::Deserialize)]
pub struct PartQuery {
    /// How many parts the file has.
    pub of: u32,
    /// For a separate debug file: the load segments of the program or
    /// library it belongs to (`whyslow_stacks::symindex::format_layout`).
    pub segments: Option<String>,
}

async fn put_symbol_part(
    State(state): State<Arc<AppState>>,
    UrlPath((build_id, part)): UrlPath<(String, u32)>,
    axum::extract::Query(q): axum::extract::Query<PartQuery>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        symbol_store(&state)?;
        let st = state.clone();
        let status = blocking(move || {
            let store = symbol_store(&st)?;
            let layout = q
                .segments
                .as_deref()
                .map(whyslow_stacks::symindex::parse_layout)
                .transpose()
                .map_err(|e| StoreError::BadName(format!("segments: {e}")))?;
            Ok(store.put_part(t, &build_id, part, q.of, &body, layout.as_deref())?)
        })
        .await?;
        Ok(match status {
            symbols::PartStatus::Waiting { received, of } => (
                StatusCode::ACCEPTED,
                Json(json!({ "complete": false, "received": received, "of": of })),
            ),
            symbols::PartStatus::Indexed { symbols } => {
                state.metrics.symbol_files.fetch_add(1, Ordering::Relaxed);
                (
                    StatusCode::CREATED,
                    Json(json!({ "complete": true, "symbols": symbols })),
                )
            }
        })
    }
    .await;
    count(&state, &r);
    r.into_response()
}

async fn get_symbols(
    State(state): State<Arc<AppState>>,
    UrlPath(build_id): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        let st = state.clone();
        let id = build_id.clone();
        let n = blocking(move || Ok(symbol_store(&st)?.symbols(t, &id)?)).await?;
        match n {
            Some(n) => Ok(Json(json!({ "build_id": build_id, "symbols": n }))),
            None => Err(ApiError(
                StatusCode::NOT_FOUND,
                format!("no symbols for Build-ID {build_id}"),
            )),
        }
    }
    .await;
    count(&state, &r);
    r.into_response()
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let st = state.clone();
    let (bytes, files) = tokio::task::spawn_blocking(move || st.store.segment_usage())
        .await
        .unwrap_or_default();
    let mut text = state.metrics.render();
    for (name, help, v) in [
        (
            "whyslow_server_segment_bytes",
            "bytes of the columnar profile segments on disk (the embedded store)",
            bytes,
        ),
        (
            "whyslow_server_segment_files",
            "columnar profile segment files on disk (the embedded store)",
            files,
        ),
    ] {
        text.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}\n"
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

/// Errors that axum's extractors answer by themselves (a query string or
/// path that does not parse, a body over the limit, a wrong content type)
/// come as plain text; under `/api` every error is JSON, `{"error": …}` (the
/// OpenAPI description's `Error`), so scripts parse one shape.
/// Uploads (POST and PUT under `/api/`, fix proposals aside) read,
/// decoded and stored at once, across the process: the rest wait, their bodies unread in their sockets, so the
/// server's memory is bounded by this many uploads of at most [`MAX_BODY`]
/// each (and a profile's inflated [`MAX_PROFILE_DECOMPRESSED`]) whatever
/// the number of agents. 64 keeps the group commit fed (a group holds what
/// arrived during the previous commit).
pub const UPLOADS_IN_FLIGHT: usize = 64;

static UPLOAD_SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(UPLOADS_IN_FLIGHT);

/// Holds one of [`UPLOADS_IN_FLIGHT`] slots while an upload is handled.
async fn upload_slot(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path();
    // A fix proposal may wait on a language model: it takes no upload slot.
    let upload = matches!(
        *req.method(),
        axum::http::Method::POST | axum::http::Method::PUT
    ) && path.starts_with("/api/")
        && !path.ends_with("/fix");
    if !upload {
        return next.run(req).await;
    }
    // The semaphore is never closed: acquiring only waits.
    let _slot = UPLOAD_SLOTS.acquire().await;
    next.run(req).await
}

async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let api = req.uri().path().starts_with("/api/");
    let resp = next.run(req).await;
    let text = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/plain"));
    if !(api && resp.status().is_client_error() && text) {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let mut out = ApiError(
        parts.status,
        String::from_utf8_lossy(&bytes).trim().to_string(),
    )
    .into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// The service's routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route(
            "/api/v1/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .route("/api/v1/jobs", get(list_jobs))
        .route("/api/v1/functions", get(get_functions))
        .route(
            "/api/v1/jobs/{job}/sessions/{session}/fingerprints",
            post(post_fingerprint),
        )
        .route(
            "/api/v1/jobs/{job}/sessions/{session}/report",
            get(get_report),
        )
        .route("/api/v1/jobs/{job}/sessions/{session}/fix", post(post_fix))
        .route("/api/v1/jobs/{job}/profiles/{batch}", post(post_profile))
        .route("/api/v1/jobs/{job}/flamegraph.svg", get(get_flamegraph))
        .route("/api/v1/jobs/{job}/diff.svg", get(get_diff_flamegraph))
        .route(
            "/api/v1/jobs/{job}/collectives/{batch}",
            post(post_collectives),
        )
        .route("/api/v1/jobs/{job}/stragglers", get(get_stragglers))
        .route("/api/v1/jobs/{job}/diagnosis", get(get_diagnosis))
        .route("/api/v1/jobs/{job}/os/{batch}", post(post_os_samples))
        .route("/api/v1/jobs/{job}/flows/{batch}", post(post_flows))
        .route("/api/v1/jobs/{job}/flows", get(get_flows))
        .route("/api/v1/jobs/{job}/hangs/{batch}", post(post_hang))
        .route("/api/v1/jobs/{job}/hang", get(get_hang))
        .route(
            "/api/v1/jobs/{job}/flows.perfetto.json",
            get(get_flows_perfetto),
        )
        .route("/api/v1/symbols/{build_id}", get(get_symbols))
        .route(
            "/api/v1/symbols/{build_id}/parts/{part}",
            axum::routing::put(put_symbol_part)
                .layer(DefaultBodyLimit::max(symbols::MAX_PART_BYTES)),
        )
        .merge(ui::routes())
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(upload_slot))
        .layer(axum::middleware::from_fn(json_errors))
        .with_state(state)
}

fn now_unix_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Serves `router` on `listen` (over TLS with `tls`) until SIGINT/SIGTERM;
/// `on_bound` gets the bound address (port 0 picks a free one).
pub async fn serve(
    state: Arc<AppState>,
    listen: SocketAddr,
    tls: Option<Tls>,
    on_bound: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    // Retention: every hour, uploads older than the retention go.
    let keeper = state.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
        loop {
            tick.tick().await;
            let st = keeper.clone();
            let cutoff = now_unix_s() - i64::from(st.retention_days.max(1)) * 86_400;
            match tokio::task::spawn_blocking(move || st.store.expire(cutoff)).await {
                Ok(Ok(n)) if n > 0 => eprintln!(
                    "whyslow: retention: removed {n} uploads older than {} days",
                    keeper.retention_days
                ),
                Ok(Err(e)) => eprintln!("whyslow: retention failed: {e}"),
                _ => {}
            }
        }
    });
    // Profiles a few minutes old move into columnar segments (the embedded
    // store; recent ones stay rows, so retries of recent batches dedup on
    // them and the newest profiles read without a segment).
    let compactor = state.clone();
    tokio::spawn(async move {
        let every = compactor.compact_after_s.clamp(1, 60);
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(every));
        loop {
            tick.tick().await;
            let st = compactor.clone();
            let before = now_unix_s() - st.compact_after_s as i64;
            match tokio::task::spawn_blocking(move || st.store.compact(before)).await {
                Ok(Ok((moved, written))) => {
                    let m = &compactor.metrics;
                    m.profiles_compacted.fetch_add(moved, Ordering::Relaxed);
                    m.compactions.fetch_add(written, Ordering::Relaxed);
                }
                Ok(Err(e)) => eprintln!("whyslow: compacting profiles failed: {e}"),
                Err(_) => {}
            }
        }
    });
    let stopped = async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
    };
    let Some(tls) = tls else {
        on_bound(listener.local_addr()?);
        return axum::serve(listener, router(state))
            .with_graceful_shutdown(stopped)
            .await;
    };
    // rustls with the ring provider (installed once per process).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&tls.cert, &tls.key)
        .await
        .map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "TLS certificate {} / key {}: {e}",
                    tls.cert.display(),
                    tls.key.display()
                ),
            )
        })?;
    let std_listener = listener.into_std()?;
    on_bound(std_listener.local_addr()?);
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        stopped.await;
        stopper.graceful_shutdown(Some(std::time::Duration::from_secs(10)));
    });
    axum_server::from_tcp_rustls(std_listener, config)
        .handle(handle)
        .serve(router(state).into_make_service())
        .await
}

/// A PEM certificate chain and its private key, for HTTPS.
#[derive(Debug, Clone)]
pub struct Tls {
    /// Certificate chain (PEM).
    pub cert: std::path::PathBuf,
    /// Private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

#[cfg(test)]
mod tests {
    #[test]
    fn archive_dates_are_civil_utc_dates() {
        for (t, d) in [
            (0, "1970-01-01"),
            (951_782_400, "2000-02-29"),
            (1_795_634_709, "2026-11-25"),
            (4_107_542_400, "2100-03-01"),
            (-86_400, "1969-12-31"),
        ] {
            assert_eq!(super::utc_date(t), d, "{t}");
        }
    }
}
