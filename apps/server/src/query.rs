//! Answers about a tenant's jobs: the list, a session's report (PerfTracker
//! §4.3) and its fix (EROICA's first step), the cross-layer diagnosis and
//! stragglers (SysOM-AI §3.1), the latest hang report and flow analysis,
//! and symbol files. Every judgment is the pipeline's
//! ([`whyslow_pipeline::stored`]): the same call the command line makes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use crate::edge::{ApiPath, JobName, SessionId, Tenant};
use crate::error::{blocking, ApiError, ApiResult};
use crate::ingest::{parse_flow_report, parse_hang_report, symbol_store};
use crate::{AppState, BatchKind, JobSummary, Store, StoreError, TenantId, PROFILE_KINDS};
use whyslow_pipeline::stored::{MAX_COLLECTIVE_BATCHES, MAX_DIAGNOSIS_PROFILES};

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

/// What the scheduler calls each job, as its latest fingerprint said:
/// kept when a fingerprint arrives, so the jobs list is one store query,
/// not two more per job (a job not seen since the server started is read
/// from the store once).
#[derive(Debug, Default)]
pub struct JobIdentities(Mutex<HashMap<(i64, String), Option<whyslow_model::JobIdentity>>>);

impl JobIdentities {
    /// Most jobs remembered (emptied when full: the store answers again).
    pub const MAX: usize = 100_000;

    /// A fingerprint of `job` said this (one that says nothing does not
    /// forget what its job's other ranks said).
    pub fn saw(&self, t: TenantId, job: &str, id: Option<whyslow_model::JobIdentity>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MAX {
            map.clear();
        }
        let known = map.entry((t.0, job.to_string())).or_default();
        if id.is_some() {
            *known = id;
        }
    }

    fn get(&self, t: TenantId, job: &str) -> Option<Option<whyslow_model::JobIdentity>> {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(t.0, job.to_string())).cloned()
    }
}

/// The tenant's jobs, each with the scheduler's name and labels where its
/// ranks gave them (`GET /api/v1/jobs`, the UI's list).
pub fn jobs_with_identity(
    state: &AppState,
    t: TenantId,
) -> Result<Vec<(JobSummary, Option<whyslow_model::JobIdentity>)>, StoreError> {
    let store = state.store.as_ref();
    store
        .jobs(t)?
        .into_iter()
        .map(|j| {
            let id = match state.identities.get(t, &j.job) {
                Some(id) => id,
                None => {
                    let id = job_identity(store, t, &j.job)?;
                    state.identities.saw(t, &j.job, id.clone());
                    id
                }
            };
            Ok((j, id))
        })
        .collect()
}

/// `GET /api/v1/jobs`.
pub async fn list_jobs(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
) -> ApiResult<Json<Vec<serde_json::Value>>> {
    let st = state.clone();
    let jobs = blocking(move || Ok(jobs_with_identity(&st, t)?)).await?;
    let rows = jobs
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

/// Judges a session's stored fingerprints: the pipeline's
/// [`session_report`](whyslow_pipeline::stored::session_report), the same
/// call `whyslow localize` makes.
pub fn report_of(
    fingerprints: &[String],
) -> Result<whyslow_model::Report, whyslow_pipeline::Refusal> {
    whyslow_pipeline::stored::session_report(fingerprints)
}

/// A session's stored fingerprints, or 404.
fn session_fingerprints(
    store: &dyn Store,
    t: TenantId,
    job: &str,
    session: &str,
) -> ApiResult<Vec<String>> {
    let fps = store.fingerprints(t, job, session)?;
    if fps.is_empty() {
        return Err(ApiError::not_found(format!(
            "no job {job:?} session {session:?}"
        )));
    }
    Ok(fps)
}

/// `GET /api/v1/jobs/{job}/sessions/{session}/report`.
pub async fn get_report(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath((job, session)): ApiPath<(JobName, SessionId)>,
) -> ApiResult<impl IntoResponse> {
    let st = state.clone();
    let body = blocking(move || {
        let fps = session_fingerprints(st.store.as_ref(), t, &job, &session)?;
        // Evidence that cannot be judged as one job is the client's
        // to fix: 409 with the pipeline's reason.
        let mut report =
            report_of(&fps).map_err(|e| ApiError::new(StatusCode::CONFLICT, e.to_string()))?;
        st.metrics.jobs.report(t.0, &job, &report);
        if let Some(f) = &st.fix {
            f.recall(t, &job, &session, &mut report);
        }
        Ok(whyslow_report::render_json(&report))
    })
    .await?;
    state.metrics.count_report();
    Ok(([(header::CONTENT_TYPE, "application/json")], body))
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
) -> ApiResult<whyslow_model::Report> {
    let Some(setting) = &state.fix else {
        return Err(ApiError::not_found(
            "this server asks no model for fixes: start it with --suggest-fix and WHYSLOW_LLM_URL",
        ));
    };
    let fps = session_fingerprints(state.store.as_ref(), t, job, session)?;
    let report = report_of(&fps).map_err(|e| ApiError::new(StatusCode::CONFLICT, e.to_string()))?;
    Ok(setting.ask(t, job, session, report))
}

/// `POST /api/v1/jobs/{job}/sessions/{session}/fix`.
pub async fn post_fix(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath((job, session)): ApiPath<(JobName, SessionId)>,
) -> ApiResult<impl IntoResponse> {
    let st = state.clone();
    let body = blocking(move || {
        session_fix(&st, t, &job, &session).map(|r| whyslow_report::render_json(&r))
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body))
}

/// What the store holds of a job for the cross-layer diagnosis: its latest
/// profiles of every kind, collective records, OS readings and its latest
/// session's fingerprints, read by the pipeline
/// ([`whyslow_pipeline::stored::diagnosis_evidence`]) as `whyslow diagnose`
/// reads a spool.
pub fn diagnosis_evidence(
    store: &dyn Store,
    tenant: TenantId,
    job: &str,
) -> Result<whyslow_model::diagnosis::DiagnoseEvidence, StoreError> {
    let (mut profiles, mut undecodable) = (Vec::new(), 0);
    for kind in PROFILE_KINDS {
        for p in store.profiles(tenant, job, kind, MAX_DIAGNOSIS_PROFILES)? {
            match p.into_profile(whyslow_stack_output::MAX_PPROF_DECOMPRESSED) {
                Some(p) => profiles.push(p),
                None => undecodable += 1,
            }
        }
    }
    let collectives = store.batches(tenant, job, BatchKind::Collectives, MAX_COLLECTIVE_BATCHES)?;
    let readings = store.batches(tenant, job, BatchKind::OsSamples, MAX_DIAGNOSIS_PROFILES)?;
    let fingerprints = match store.sessions(tenant, job)?.first() {
        Some(latest) => store.fingerprints(tenant, job, &latest.session)?,
        None => Vec::new(),
    };
    Ok(whyslow_pipeline::stored::diagnosis_evidence(
        whyslow_pipeline::stored::StoredRows {
            profiles,
            undecodable_profiles: undecodable,
            collective_batches: &collectives,
            os_batches: &readings,
            fingerprints: &fingerprints,
        },
    ))
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

/// `GET /api/v1/jobs/{job}/diagnosis`.
pub async fn get_diagnosis(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(job): ApiPath<JobName>,
    Query(q): Query<DiagnosisQuery>,
) -> ApiResult<impl IntoResponse> {
    let cfg = q.config().map_err(ApiError::bad_request)?;
    let (st, j) = (state.clone(), job.clone());
    let d = blocking(move || Ok(diagnosis_of(st.store.as_ref(), t, &j, &cfg)?)).await?;
    let d = d.map_err(|e| ApiError::not_found(format!("job {:?}: {e}", job.as_str())))?;
    state.metrics.jobs.diagnosis(t.0, &job, &d.report);
    let body = serde_json::to_string_pretty(&d.report).map_err(ApiError::internal)?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body + "\n"))
}

/// The job's latest batch of `kind`, parsed, or 404 naming `what`.
async fn latest_batch<T: Send + 'static>(
    (t, state): (TenantId, &Arc<AppState>),
    job: &JobName,
    (what, kind): (&str, BatchKind),
    parse: fn(&str) -> Result<T, String>,
) -> ApiResult<T> {
    let (st, j) = (state.clone(), job.clone());
    let mut latest = blocking(move || Ok(st.store.batches(t, &j, kind, 1)?)).await?;
    let Some(text) = latest.pop() else {
        return Err(ApiError::not_found(format!(
            "no {what} of job {:?}",
            job.as_str()
        )));
    };
    parse(&text).map_err(ApiError::internal)
}

/// `GET /api/v1/jobs/{job}/hang`: the latest hang report.
pub async fn get_hang(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(job): ApiPath<JobName>,
) -> ApiResult<Json<whyslow_model::hang::HangReport>> {
    let what = ("hang report", BatchKind::Hangs);
    latest_batch((t, &state), &job, what, parse_hang_report)
        .await
        .map(Json)
}

/// `GET /api/v1/jobs/{job}/flows`: the latest flow analysis.
pub async fn get_flows(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(job): ApiPath<JobName>,
) -> ApiResult<Json<whyslow_model::flow::FlowReport>> {
    let what = ("flow analysis", BatchKind::Flows);
    latest_batch((t, &state), &job, what, parse_flow_report)
        .await
        .map(Json)
}

/// `GET /api/v1/jobs/{job}/flows.perfetto.json`: the latest flow analysis
/// as a Perfetto trace.
pub async fn get_flows_perfetto(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(job): ApiPath<JobName>,
) -> ApiResult<impl IntoResponse> {
    let what = ("flow analysis", BatchKind::Flows);
    let report = latest_batch((t, &state), &job, what, parse_flow_report).await?;
    Ok((
        [(header::CONTENT_TYPE, "application/json")],
        whyslow_report::flows::to_perfetto_trace(&report),
    ))
}

/// `GET /api/v1/jobs/{job}/stragglers`: SysOM-AI §3.1's slow ranks over
/// the job's latest collective records.
pub async fn get_stragglers(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(job): ApiPath<JobName>,
) -> ApiResult<Json<serde_json::Value>> {
    let (st, j) = (state.clone(), job.clone());
    let batches = blocking(move || {
        Ok(st
            .store
            .batches(t, &j, BatchKind::Collectives, MAX_COLLECTIVE_BATCHES)?)
    })
    .await?;
    if batches.is_empty() {
        return Err(ApiError::not_found(format!(
            "no collective records of job {:?}",
            job.as_str()
        )));
    }
    let found = whyslow_pipeline::stored::stragglers(&batches);
    let groups: Vec<_> = found
        .groups
        .iter()
        .map(|g| json!({"group": g.group, "ranks": g.ranks, "instances": g.instances.len()}))
        .collect();
    Ok(Json(json!({
        "job": job.as_str(),
        "records": found.records,
        "groups": groups,
        "stragglers": found.stragglers,
    })))
}

/// `GET /api/v1/symbols/{build_id}`: how many symbols a file has.
pub async fn get_symbols(
    Tenant(t): Tenant,
    State(state): State<Arc<AppState>>,
    ApiPath(build_id): ApiPath<String>,
) -> ApiResult<Json<serde_json::Value>> {
    let st = state.clone();
    let id = build_id.clone();
    let n = blocking(move || Ok(symbol_store(&st)?.symbols(t, &id)?)).await?;
    match n {
        Some(n) => Ok(Json(json!({ "build_id": build_id, "symbols": n }))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no symbols for Build-ID {build_id}"),
        )),
    }
}
