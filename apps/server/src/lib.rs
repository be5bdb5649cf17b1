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
//! - `GET /healthz`, `GET /metrics` (OpenMetrics text) and
//!   `GET /api/v1/openapi.json` (this API's OpenAPI 3 description,
//!   `api/openapi.json`) need no token.
//!
//! The web UI ([`ui`]) lives under `/ui/`: jobs, sessions, reports.
//!
//! By role: [`edge`] checks the token and names once, as extractors;
//! [`ingest`] takes uploads; [`query`] and [`profiles`] answer; [`metrics`]
//! counts; [`serve`] runs it; every error is an [`ApiError`].
//!
//! Storage (the `whyslow-store` crate): [`store`] (SQLite embedded, or
//! [`clickhouse`] as a column store) for what is queried; [`objects`] (a local directory, or S3-compatible storage) for
//! symbol files and, when configured, an archive of every raw upload.

pub use whyslow_store as store;
pub use whyslow_store::{clickhouse, objects, segments, symbols};

pub mod edge;
pub mod error;
pub mod fix;
pub mod ingest;
pub mod metrics;
pub mod profiles;
pub mod query;
pub mod serve;
pub mod ui;
pub mod verdicts;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

pub use clickhouse::{ClickHouseConfig, ClickHouseStore};
pub use edge::{BatchId, JobName, SessionId, Tenant, TokenCache};
pub use error::{ApiError, ApiResult};
pub use ingest::{
    parse_collectives, parse_flow_report, parse_hang_report, parse_os_samples, profile_meta,
    summary_meta, PartQuery, MAX_PROFILE_DECOMPRESSED,
};
pub use metrics::Metrics;
pub use profiles::{
    diff_flamegraph, job_flamegraph, DiffQuery, FlameQuery, FunctionsParams, MAX_FLAME_PROFILES,
    PROFILE_KINDS,
};
pub use query::{
    diagnosis_evidence, diagnosis_of, job_identity, jobs_with_identity, report_of, session_fix,
    DiagnosisQuery, JobIdentities,
};
pub use serve::{serve, Config, ConfigError, FixConfig, StoreChoice, Tls};
pub use store::{
    conformance, BatchKind, JobSummary, Order, ProfileMeta, SqliteStore, Store, StoreError,
    TenantId,
};
pub use whyslow_pipeline::stored::{MAX_COLLECTIVE_BATCHES, MAX_DIAGNOSIS_PROFILES};

/// Largest request body accepted (one fingerprint is kilobytes to a few MB).
pub const MAX_BODY: usize = 32 << 20;

/// The API's OpenAPI 3 description (`GET /api/v1/openapi.json`).
pub const OPENAPI: &str = include_str!("../api/openapi.json");

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
    /// What the scheduler calls each job, as its fingerprints said.
    pub identities: query::JobIdentities,
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
    let mut out = ApiError::new(
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
        .route("/metrics", get(metrics::metrics))
        .route(
            "/api/v1/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], OPENAPI) }),
        )
        .route("/api/v1/jobs", get(query::list_jobs))
        .route("/api/v1/functions", get(profiles::get_functions))
        .route(
            "/api/v1/jobs/{job}/sessions/{session}/fingerprints",
            post(ingest::post_fingerprint),
        )
        .route(
            "/api/v1/jobs/{job}/sessions/{session}/report",
            get(query::get_report),
        )
        .route(
            "/api/v1/jobs/{job}/sessions/{session}/fix",
            post(query::post_fix),
        )
        .route(
            "/api/v1/jobs/{job}/profiles/{batch}",
            post(ingest::post_profile),
        )
        .route(
            "/api/v1/jobs/{job}/flamegraph.svg",
            get(profiles::get_flamegraph),
        )
        .route(
            "/api/v1/jobs/{job}/diff.svg",
            get(profiles::get_diff_flamegraph),
        )
        .route(
            "/api/v1/jobs/{job}/collectives/{batch}",
            post(ingest::post_collectives),
        )
        .route("/api/v1/jobs/{job}/stragglers", get(query::get_stragglers))
        .route("/api/v1/jobs/{job}/diagnosis", get(query::get_diagnosis))
        .route(
            "/api/v1/jobs/{job}/os/{batch}",
            post(ingest::post_os_samples),
        )
        .route("/api/v1/jobs/{job}/flows/{batch}", post(ingest::post_flows))
        .route("/api/v1/jobs/{job}/flows", get(query::get_flows))
        .route("/api/v1/jobs/{job}/hangs/{batch}", post(ingest::post_hang))
        .route("/api/v1/jobs/{job}/hang", get(query::get_hang))
        .route(
            "/api/v1/jobs/{job}/flows.perfetto.json",
            get(query::get_flows_perfetto),
        )
        .route("/api/v1/symbols/{build_id}", get(query::get_symbols))
        .route(
            "/api/v1/symbols/{build_id}/parts/{part}",
            axum::routing::put(ingest::put_symbol_part)
                .layer(DefaultBodyLimit::max(symbols::MAX_PART_BYTES)),
        )
        .merge(ui::routes())
        .fallback(|| async { ApiError::not_found("no such route") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(upload_slot))
        .layer(axum::middleware::from_fn(json_errors))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::count_requests,
        ))
        .with_state(state)
}
