//! The service's own counters on `/metrics` (Prometheus text), beside the
//! per-job gauges of [`crate::verdicts`]: requests by outcome, counted once
//! for every `/api` request by [`count_requests`], and what was ingested.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::{verdicts, AppState};

/// Counters exported on `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) requests: AtomicU64,
    pub(crate) unauthorized: AtomicU64,
    pub(crate) not_found: AtomicU64,
    pub(crate) bad_requests: AtomicU64,
    pub(crate) server_errors: AtomicU64,
    pub(crate) fingerprints: AtomicU64,
    pub(crate) fingerprint_bytes: AtomicU64,
    pub(crate) reports: AtomicU64,
    pub(crate) profiles: AtomicU64,
    pub(crate) profile_bytes: AtomicU64,
    pub(crate) profile_samples: AtomicU64,
    pub(crate) profile_duplicates: AtomicU64,
    pub(crate) symbol_files: AtomicU64,
    pub(crate) collective_records: AtomicU64,
    pub(crate) os_readings: AtomicU64,
    pub(crate) flow_analyses: AtomicU64,
    pub(crate) hang_reports: AtomicU64,
    pub(crate) raw_archived: AtomicU64,
    pub(crate) raw_archived_bytes: AtomicU64,
    pub(crate) profiles_compacted: AtomicU64,
    pub(crate) compactions: AtomicU64,
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

/// Counts every `/api` request once, by the status it was answered with
/// (whatever answered it: a handler, an extractor's refusal, the fallback).
pub async fn count_requests(
    State(state): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let api = req.uri().path().starts_with("/api/");
    let resp = next.run(req).await;
    if api {
        state.metrics.count(resp.status());
    }
    resp
}

impl Metrics {
    /// One report computed.
    pub fn count_report(&self) {
        self.reports.fetch_add(1, Ordering::Relaxed);
    }

    /// One request answered with `status`.
    pub fn count(&self, status: StatusCode) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        let counter = match status {
            StatusCode::UNAUTHORIZED => &self.unauthorized,
            StatusCode::NOT_FOUND => &self.not_found,
            c if c.is_client_error() => &self.bad_requests,
            c if c.is_server_error() => &self.server_errors,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
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
