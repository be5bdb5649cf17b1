//! The service's own counters on `/metrics`, beside the per-job gauges of
//! [`crate::verdicts`]: requests by outcome, counted once for every `/api`
//! and `/ui` request by [`count_requests`], and what was ingested. Encoded by
//! `prometheus-client` (OpenMetrics text; names, help and label values
//! escaped by the library, not by hand).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::{verdicts, AppState};

/// Counters exported on `/metrics` (each `NAME_total`).
#[derive(Debug, Default)]
pub struct Metrics {
    pub(crate) requests: Counter,
    pub(crate) unauthorized: Counter,
    pub(crate) not_found: Counter,
    pub(crate) bad_requests: Counter,
    pub(crate) server_errors: Counter,
    pub(crate) fingerprints: Counter,
    pub(crate) fingerprint_bytes: Counter,
    pub(crate) reports: Counter,
    pub(crate) profiles: Counter,
    pub(crate) profile_bytes: Counter,
    pub(crate) profile_samples: Counter,
    pub(crate) profile_duplicates: Counter,
    pub(crate) symbol_files: Counter,
    pub(crate) collective_records: Counter,
    pub(crate) os_readings: Counter,
    pub(crate) flow_analyses: Counter,
    pub(crate) hang_reports: Counter,
    pub(crate) raw_archived: Counter,
    pub(crate) raw_archived_bytes: Counter,
    pub(crate) profiles_compacted: Counter,
    pub(crate) compactions: Counter,
    /// What was concluded of each job (per-job gauges).
    pub jobs: verdicts::JobVerdicts,
}

impl Metrics {
    /// The counters, the embedded store's segment usage (`bytes`, `files`)
    /// and the jobs' gauges, as OpenMetrics text.
    pub fn render(&self, (bytes, files): (u64, u64)) -> String {
        let mut registry = Registry::default();
        // Registered without `_total`: the library adds it to counters.
        for (name, help, counter) in [
            ("whyslow_server_requests", "HTTP requests served", &self.requests),
            ("whyslow_server_unauthorized", "requests refused for a missing or unknown token", &self.unauthorized),
            ("whyslow_server_not_found", "requests for jobs or sessions the tenant does not have", &self.not_found),
            ("whyslow_server_bad_requests", "requests with a body or name that could not be used", &self.bad_requests),
            ("whyslow_server_errors", "requests that failed inside the server", &self.server_errors),
            ("whyslow_server_fingerprints_ingested", "fingerprints stored", &self.fingerprints),
            ("whyslow_server_fingerprint_bytes", "bytes of fingerprints stored", &self.fingerprint_bytes),
            ("whyslow_server_reports", "reports computed", &self.reports),
            ("whyslow_server_profiles_ingested", "stack profiles stored", &self.profiles),
            ("whyslow_server_profile_bytes", "bytes of stack profiles stored (as uploaded)", &self.profile_bytes),
            ("whyslow_server_profile_samples", "samples in the stack profiles stored", &self.profile_samples),
            ("whyslow_server_profile_duplicates", "profile uploads whose batch was stored before (retries)", &self.profile_duplicates),
            ("whyslow_server_symbol_files_indexed", "uploaded ELF files indexed for symbols", &self.symbol_files),
            ("whyslow_server_collective_records_ingested", "collective records stored (the agents' gloo and NCCL tracers)", &self.collective_records),
            ("whyslow_server_os_readings_ingested", "OS signal readings stored (the agents' OS and TCP counters)", &self.os_readings),
            ("whyslow_server_flow_analyses_ingested", "flow analyses stored (`whyslow flows analyze --format json`)", &self.flow_analyses),
            ("whyslow_server_hang_reports_ingested", "hang reports stored (the online package's, after a stall)", &self.hang_reports),
            ("whyslow_server_raw_uploads_archived", "uploads kept as they came in the object store (--object-store)", &self.raw_archived),
            ("whyslow_server_raw_upload_bytes_archived", "bytes of uploads kept in the object store", &self.raw_archived_bytes),
            ("whyslow_server_profiles_compacted", "stack profiles moved into columnar segments (the embedded store)", &self.profiles_compacted),
            ("whyslow_server_compactions", "columnar segments written (the embedded store) or hourly profile rollups computed (ClickHouse)", &self.compactions),
        ] {
            registry.register(name, help, counter.clone());
        }
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
            let gauge: Gauge = Gauge::default();
            gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
            registry.register(name, help, gauge);
        }
        self.jobs.register(&mut registry);
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &registry);
        text
    }
}

/// Counts every `/api` and `/ui` request once, by the status it was
/// answered with (whatever answered it: a handler, an extractor's refusal,
/// the fallback).
pub async fn count_requests(
    State(state): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path();
    let api = path.starts_with("/api/") || path.starts_with("/ui/");
    let resp = next.run(req).await;
    if api {
        state.metrics.count(resp.status());
    }
    resp
}

impl Metrics {
    /// One report computed.
    pub fn count_report(&self) {
        self.reports.inc();
    }

    /// One request answered with `status`.
    pub fn count(&self, status: StatusCode) {
        self.requests.inc();
        let counter = match status {
            StatusCode::UNAUTHORIZED => &self.unauthorized,
            StatusCode::NOT_FOUND => &self.not_found,
            c if c.is_client_error() => &self.bad_requests,
            c if c.is_server_error() => &self.server_errors,
            _ => return,
        };
        counter.inc();
    }
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let st = state.clone();
    let usage = tokio::task::spawn_blocking(move || st.store.segment_usage())
        .await
        .unwrap_or_default();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.render(usage),
    )
}
