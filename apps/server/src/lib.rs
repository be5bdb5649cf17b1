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
//! - `GET /api/v1/jobs` — `[{"job", "sessions", "fingerprints", "updated_unix_s"}]`;
//! - `GET /api/v1/jobs/{job}/sessions/{session}/report` — the report;
//! - `GET /healthz`, `GET /metrics` (Prometheus text) need no token.
//!
//! The web UI ([`ui`]) lives under `/ui/`: jobs, sessions, reports.
//!
//! Not built yet: the UI's flame graphs, stragglers and flow timelines, profiles/collectives/flows ingest, symbols,
//! the ClickHouse and object-storage backends, TLS, local buffering on the
//! clients.

pub mod store;
pub mod ui;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

pub use store::{SqliteStore, Store, StoreError, TenantId};

/// Largest request body accepted (one fingerprint is kilobytes to a few MB).
pub const MAX_BODY: usize = 32 << 20;

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
        ] {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
            ));
        }
        s
    }
}

/// Shared state of the handlers.
pub struct AppState {
    /// The store.
    pub store: Box<dyn Store>,
    /// Counters.
    pub metrics: Metrics,
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
        match e {
            StoreError::BadName(m) => ApiError(StatusCode::BAD_REQUEST, m),
            other => ApiError(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
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

async fn tenant(state: &Arc<AppState>, headers: &HeaderMap) -> ApiResult<TenantId> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty() && t.len() <= 256)
        .ok_or_else(|| ApiError(StatusCode::UNAUTHORIZED, "missing bearer token".into()))?;
    let st = state.clone();
    blocking(move || Ok(st.store.tenant_of_token(&token)?))
        .await?
        .ok_or_else(|| ApiError(StatusCode::UNAUTHORIZED, "unknown token".into()))
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
        let (st, j, s) = (state.clone(), job.clone(), session.clone());
        blocking(move || Ok(st.store.put_fingerprint(t, &j, &s, worker, &text)?)).await?;
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

async fn list_jobs(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let r = async {
        let t = tenant(&state, &headers).await?;
        let st = state.clone();
        Ok(Json(blocking(move || Ok(st.store.jobs(t)?)).await?))
    }
    .await;
    count(&state, &r);
    r.into_response()
}

/// Localizes over the session's fingerprints as `whyslow localize` does
/// (workers without events in their window are left out with a warning).
pub fn report_of(fingerprints: &[String]) -> Result<whyslow_model::Report, String> {
    let mut fps = Vec::with_capacity(fingerprints.len());
    let mut warnings = Vec::new();
    for (i, text) in fingerprints.iter().enumerate() {
        match whyslow_ingest::parse_fingerprint(text.as_bytes(), Path::new("stored fingerprint")) {
            Ok(fp) if fp.window_us > 0.0 && !fp.functions.is_empty() => fps.push(fp),
            Ok(fp) => warnings.push(format!(
                "rank {}: no events in its profiling window; left out",
                fp.worker
            )),
            Err(e) => warnings.push(format!("stored fingerprint {i}: {e}; left out")),
        }
    }
    let total = fingerprints.len();
    let mut report =
        whyslow_localize::localize(&fps, &whyslow_localize::LocalizeConfig::default(), None);
    if fps.is_empty() {
        report.could_not_judge(format!(
            "none of the {total} worker(s) uploaded had events in its profiling window"
        ));
    }
    report.warnings.extend(warnings);
    Ok(report)
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
            let report =
                report_of(&fps).map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e))?;
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

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

/// The service's routes over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .route("/api/v1/jobs", get(list_jobs))
        .route(
            "/api/v1/jobs/{job}/sessions/{session}/fingerprints",
            post(post_fingerprint),
        )
        .route(
            "/api/v1/jobs/{job}/sessions/{session}/report",
            get(get_report),
        )
        .merge(ui::routes())
        .fallback(|| async { ApiError(StatusCode::NOT_FOUND, "no such route".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Serves `router` on `listen` until SIGINT/SIGTERM; `on_bound` gets the
/// bound address (port 0 picks a free one).
pub async fn serve(
    state: Arc<AppState>,
    listen: SocketAddr,
    on_bound: impl FnOnce(SocketAddr),
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    on_bound(listener.local_addr()?);
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
            }
        })
        .await
}
