//! Uploads: fingerprints of ranks (PerfTracker §4.2), stack profiles of
//! node agents (SysOM-AI §3.3–§3.4), batches of collective records, OS
//! readings, flow analyses and hang reports, and symbol files. Each is
//! authenticated and named at the edge ([`crate::edge`]), parsed whole
//! before anything is kept, archived as it came when an object store is
//! configured, then stored once per batch (a retry is answered 200, not
//! stored twice).

use std::path::Path;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use serde_json::json;

use crate::edge::{ApiPath, BatchId, JobName, SessionId, Tenant};
use crate::error::{blocking, ApiError, ApiResult};
use crate::{symbols, AppState, BatchKind, ProfileMeta, StoreError, TenantId};

/// Largest decompressed profile accepted (an agent's period is well under
/// a megabyte; a gzip bomb stops here).
pub const MAX_PROFILE_DECOMPRESSED: u64 = 64 << 20;

/// Most a flow analysis may hold: jobs.
const MAX_FLOW_JOBS: usize = 1000;

/// Most culprits plus waiting ranks a hang report may hold.
const MAX_HANG_RANKS: usize = 1 << 20;

/// An upload's answer: 201 when stored, 200 when the batch was stored
/// before (a retry).
type Stored = (StatusCode, Json<serde_json::Value>);

fn stored_status(stored: bool) -> StatusCode {
    if stored {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
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
    let key = format!(
        "raw/t{}/{job}/{kind}/{}/{name}",
        t.0,
        whyslow_model::time::utc_date(crate::serve::now_unix_s())
    );
    let len = bytes.len() as u64;
    blocking(move || {
        raw.put(&key, bytes.to_vec()).map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the raw-upload archive failed: {e}"),
            )
        })
    })
    .await?;
    let m = &state.metrics;
    m.raw_archived.inc();
    m.raw_archived_bytes.inc_by(len);
    Ok(())
}

/// `POST /api/v1/jobs/{job}/sessions/{session}/fingerprints`.
pub async fn post_fingerprint(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath((job, session)): ApiPath<(JobName, SessionId)>,
    body: Bytes,
) -> ApiResult<Stored> {
    let fp = whyslow_ingest::parse_fingerprint(&body, Path::new("request body"))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let worker = fp.worker;
    let text = serde_json::to_string(&fp).map_err(ApiError::internal)?;
    let len = text.len() as u64;
    let name = format!("{session}/worker-{worker}.json");
    archive(&state, t, &job, "fingerprints", &name, body).await?;
    let world = fp.job.as_ref().and_then(|j| j.world_size);
    let identity = fp.job.clone();
    let (st, j, s) = (state.clone(), job.clone(), session.clone());
    blocking(move || {
        st.store.put_fingerprint(t, &j, &s, worker, &text)?;
        let have = st
            .store
            .sessions(t, &j)?
            .into_iter()
            .find(|x| x.session == *s)
            .map_or(0, |x| x.fingerprints);
        if whyslow_pipeline::stored::session_is_complete(world, have) {
            if let Ok(report) =
                whyslow_pipeline::stored::session_report(&st.store.fingerprints(t, &j, &s)?)
            {
                st.metrics.jobs.report(t.0, &j, &report);
            }
        }
        Ok(())
    })
    .await?;
    state.identities.saw(t, &job, identity);
    let m = &state.metrics;
    m.fingerprints.inc();
    m.fingerprint_bytes.inc_by(len);
    Ok((
        StatusCode::CREATED,
        Json(json!({ "job": job.as_str(), "session": session.as_str(), "worker": worker })),
    ))
}

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

/// `POST /api/v1/jobs/{job}/profiles/{batch}`: one pprof profile.
pub async fn post_profile(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath((job, batch)): ApiPath<(JobName, BatchId)>,
    body: Bytes,
) -> ApiResult<Stored> {
    if body.is_empty() {
        return Err(ApiError::bad_request(
            "empty body: expected a pprof profile (gzip or raw protobuf)",
        ));
    }
    // Checked as a whole, not built: the flame graphs decode it later.
    let (summary, inflated) =
        whyslow_stack_output::pprof_summary_inflated(&body, MAX_PROFILE_DECOMPRESSED)
            .map_err(|e| ApiError::bad_request(format!("not a pprof profile: {e}")))?;
    let meta = summary_meta(&batch, &summary);
    let name = format!("{batch}.pb");
    archive(&state, t, &job, "profiles", &name, body.clone()).await?;
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
        m.profiles.inc();
        m.profile_bytes.inc_by(body.len() as u64);
        m.profile_samples.inc_by(meta.samples);
    } else {
        m.profile_duplicates.inc();
    }
    Ok((
        stored_status(stored),
        Json(
            json!({ "job": job.as_str(), "batch": batch.as_str(), "kind": meta.kind, "stored": stored }),
        ),
    ))
}

/// Parses a batch of collective records (JSON lines); the first bad line
/// is the error, with its number.
pub fn parse_collectives(
    text: &str,
) -> Result<Vec<whyslow_model::collective::CollectiveRecord>, String> {
    whyslow_codec::parse_jsonl(text, "a collective record")
}

/// Parses a batch of OS signal readings (JSON lines of
/// `whyslow_model::os::OsSample`); the first bad line is the error.
pub fn parse_os_samples(text: &str) -> Result<Vec<whyslow_model::os::OsSample>, String> {
    whyslow_codec::parse_jsonl(text, "an OS signal reading")
}

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

/// How one kind of text batch is filed.
struct TextBatch {
    /// The archive's folder (`raw/t<tenant>/<job>/<kind>/`).
    kind: &'static str,
    /// The archived file's extension.
    ext: &'static str,
    store_as: BatchKind,
}

/// A text batch that parsed: the answer's summary and how many items it
/// adds to its counter.
struct Parsed {
    summary: serde_json::Value,
    items: u64,
}

/// A batch of text (collective records, a flow analysis, …) for a job:
/// UTF-8, parsed by `parse` before anything is kept, archived, then stored
/// once per batch.
async fn post_text_batch(
    (t, state): (TenantId, Arc<AppState>),
    (job, batch): (JobName, BatchId),
    body: Bytes,
    how: TextBatch,
    parse: impl FnOnce(&str) -> Result<Parsed, String>,
) -> ApiResult<Stored> {
    let text = String::from_utf8(body.to_vec())
        .map_err(|_| ApiError::bad_request("the body is not UTF-8"))?;
    let parsed = parse(&text).map_err(ApiError::bad_request)?;
    let name = format!("{batch}.{}", how.ext);
    archive(&state, t, &job, how.kind, &name, body).await?;
    let (st, j, b) = (state.clone(), job.clone(), batch.clone());
    let kind = how.store_as;
    let stored = blocking(move || Ok(st.store.put_batch(t, &j, kind, &b, &text)?)).await?;
    if stored {
        counter_of(&state, how.store_as).inc_by(parsed.items);
    }
    let mut answer = parsed.summary;
    if let Some(o) = answer.as_object_mut() {
        o.insert("job".into(), json!(job.as_str()));
        o.insert("batch".into(), json!(batch.as_str()));
        o.insert("stored".into(), json!(stored));
    }
    Ok((stored_status(stored), Json(answer)))
}

fn counter_of(state: &AppState, kind: BatchKind) -> &prometheus_client::metrics::counter::Counter {
    let m = &state.metrics;
    match kind {
        BatchKind::Collectives => &m.collective_records,
        BatchKind::OsSamples => &m.os_readings,
        BatchKind::Hangs => &m.hang_reports,
        BatchKind::Flows => &m.flow_analyses,
    }
}

/// `POST /api/v1/jobs/{job}/collectives/{batch}`: JSON lines of collective
/// records (SysOM-AI §3.2).
pub async fn post_collectives(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(names): ApiPath<(JobName, BatchId)>,
    body: Bytes,
) -> ApiResult<Stored> {
    let how = TextBatch {
        kind: "collectives",
        ext: "jsonl",
        store_as: BatchKind::Collectives,
    };
    post_text_batch((t, state), names, body, how, |text| {
        let n = parse_collectives(text)?.len();
        if n == 0 {
            return Err("no collective record in the body".to_string());
        }
        Ok(Parsed {
            summary: json!({ "records": n }),
            items: n as u64,
        })
    })
    .await
}

/// `POST /api/v1/jobs/{job}/os/{batch}`: JSON lines of OS readings.
pub async fn post_os_samples(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(names): ApiPath<(JobName, BatchId)>,
    body: Bytes,
) -> ApiResult<Stored> {
    let how = TextBatch {
        kind: "os",
        ext: "jsonl",
        store_as: BatchKind::OsSamples,
    };
    post_text_batch((t, state), names, body, how, |text| {
        let n = parse_os_samples(text)?.len();
        if n == 0 {
            return Err("no OS signal reading in the body".to_string());
        }
        Ok(Parsed {
            summary: json!({ "readings": n }),
            items: n as u64,
        })
    })
    .await
}

/// `POST /api/v1/jobs/{job}/flows/{batch}`: one flow analysis (LLMPrism).
pub async fn post_flows(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(names): ApiPath<(JobName, BatchId)>,
    body: Bytes,
) -> ApiResult<Stored> {
    let how = TextBatch {
        kind: "flows",
        ext: "json",
        store_as: BatchKind::Flows,
    };
    post_text_batch((t, state), names, body, how, |text| {
        let r = parse_flow_report(text)?;
        Ok(Parsed {
            summary: json!({ "jobs": r.jobs.len(), "findings": r.findings.len() }),
            items: 1,
        })
    })
    .await
}

/// `POST /api/v1/jobs/{job}/hangs/{batch}`: one hang report; once stored,
/// the job's hang gauge follows it (the alert rules read it).
pub async fn post_hang(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(names): ApiPath<(JobName, BatchId)>,
    body: Bytes,
) -> ApiResult<Stored> {
    let job = names.0.clone();
    let mut report = None;
    let how = TextBatch {
        kind: "hangs",
        ext: "json",
        store_as: BatchKind::Hangs,
    };
    let answer = post_text_batch((t, state.clone()), names, body, how, |text| {
        let r = parse_hang_report(text)?;
        let culprits: Vec<u32> = r.culprits.iter().map(|c| c.rank).collect();
        let summary = json!({ "hang": r.hang, "culprits": culprits });
        report = Some(r);
        Ok(Parsed { summary, items: 1 })
    })
    .await?;
    if let Some(r) = report {
        state.metrics.jobs.hang_report(t.0, &job, &r);
    }
    Ok(answer)
}

/// The symbol store, or 404 saying how to turn it on.
pub(crate) fn symbol_store(state: &AppState) -> ApiResult<&symbols::SymbolStore> {
    state.symbols.as_ref().ok_or_else(|| {
        ApiError::not_found(
            "this server keeps no symbols (start it with --data, --symbols DIR or --object-store URL)",
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

/// `PUT /api/v1/symbols/{build_id}/parts/{part}?of=N`: one part of an ELF
/// file; the file is indexed when its last part arrives.
pub async fn put_symbol_part(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath((build_id, part)): ApiPath<(String, u32)>,
    Query(q): Query<PartQuery>,
    body: Bytes,
) -> ApiResult<Stored> {
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
            state.metrics.symbol_files.inc();
            (
                StatusCode::CREATED,
                Json(json!({ "complete": true, "symbols": symbols })),
            )
        }
    })
}
