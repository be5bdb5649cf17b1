//! The web UI, served by the same binary with nothing to build (issue 14
//! item 5, first part): the tenant's jobs; a job's sessions and the flame
//! graphs of the node agents' profiles of it (CPU, off-CPU, whole hosts;
//! SysOM-AI §3.3); a session's report as `whyslow analyze --html` draws it
//! (the verdict, EROICA's findings table, the β/μ/σ scatter plots and CDFs
//! of PerfTracker Fig. 13 and 15), localized here over the fingerprints the
//! ranks uploaded.
//!
//! Sign-in is the tenant's API token, entered once on `/ui/login` and kept in
//! an `HttpOnly`, `SameSite=Strict` cookie scoped to `/ui` (the `/api` routes
//! keep taking only the `Authorization` header, so a cookie never authorizes
//! a write). `/ui/login#token=…` signs in from a link: the page's script
//! reads the token from the fragment, which browsers never send to a server
//! (it stays out of access logs), and submits the form.

use std::sync::Arc;

use axum::extract::{FromRequestParts, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use maud::{html, Markup, PreEscaped};

use crate::edge::{JobName, SessionId};
use crate::store::TenantId;
use crate::AppState;
use whyslow_report::layout::{self, Nav, NavLink};
use whyslow_report::status::{self, Health};

mod signin;
use signin::{login_page, login_post, logout, signed_in};

/// The bar of every UI page: the jobs, then `links`, then signing out.
fn nav(links: Vec<NavLink>) -> Nav {
    let mut all = vec![NavLink::new("/ui/", "Jobs")];
    all.extend(links);
    all.push(NavLink::new("/ui/logout", "Sign out"));
    Nav {
        home: Some("/ui/".to_string()),
        links: all,
        actions: None,
    }
}

/// The bar's link back to a job's page.
fn job_link(job: &str) -> NavLink {
    NavLink::new(format!("/ui/jobs/{job}"), format!("Job {job}"))
}

fn page(title: &str, body: Markup) -> Html<String> {
    // One layout for every page (whyslow_report::layout): the server's
    // pages and the command line's reports look alike.
    Html(layout::page_in(
        &nav(Vec::new()),
        title,
        whyslow_report::hang::HANG_CSS,
        body,
    ))
}

/// A query value as a URL wants it.
fn url_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time (civil-from-days, Hinnant).
fn utc(unix_s: i64) -> String {
    whyslow_model::time::utc_seconds(unix_s)
}

fn server_error(msg: &str) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        page("Server error", html! { p.error { (msg) } }),
    )
        .into_response()
}

/// Runs store work off the async threads; a failure (or a panic there) is
/// the error page.
async fn off_thread<T, E>(
    work: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Response>
where
    T: Send + 'static,
    E: std::fmt::Display + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(x)) => Ok(x),
        Ok(Err(e)) => Err(server_error(&e.to_string())),
        Err(e) => Err(server_error(&e.to_string())),
    }
}

/// A page's path, its names checked as the API checks them ([`JobName`],
/// [`SessionId`]) once, here; a bad one is this UI's "not found" page,
/// saying which name and why.
struct Page<T>(T);

impl<T, S> FromRequestParts<S> for Page<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match crate::edge::ApiPath::<T>::from_request_parts(parts, state).await {
            Ok(crate::edge::ApiPath(v)) => Ok(Page(v)),
            Err(e) => Err(not_found(&format!("No such page: {}.", e.message))),
        }
    }
}

fn not_found(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        page(
            "Not found",
            html! { p { (what) } p { a href="/ui/" { "Your jobs" } } },
        ),
    )
        .into_response()
}

/// The jobs list's order and filter (`/ui/?sort=status&q=llama`).
#[derive(Deserialize, Default)]
struct JobsQuery {
    /// `status` (worst first, the default), `name` or `updated`.
    sort: Option<String>,
    /// Shown only: jobs whose id, name or a label contains this.
    q: Option<String>,
}

/// Jobs whose status is computed on a view of the list when nothing was
/// concluded of them yet (their latest session's report), at most.
const STATUS_PER_VIEW: usize = 8;

/// The latest session's report of a job, when it has a session.
fn latest_report(
    store: &dyn whyslow_store::Store,
    t: TenantId,
    job: &str,
) -> Option<whyslow_model::Report> {
    let sessions = store.sessions(t, job).ok()?;
    let latest = sessions.iter().max_by_key(|s| s.updated_unix_s)?;
    let fps = store.fingerprints(t, job, &latest.session).ok()?;
    crate::report_of(&fps).ok()
}

async fn jobs_page(
    State(state): State<Arc<AppState>>,
    Query(query): Query<JobsQuery>,
    headers: HeaderMap,
) -> Response {
    let t = match signed_in(&state, &headers, "/ui/").await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let st = state.clone();
    let jobs = match off_thread(move || {
        let jobs = crate::jobs_with_identity(&st, t)?;
        // A job nothing was concluded of yet gets its latest session judged
        // now (a few per view: the rest on the next one).
        let mut judged = 0;
        for (j, _) in &jobs {
            if judged < STATUS_PER_VIEW
                && j.sessions > 0
                && !st.metrics.jobs.has_report(t.0, &j.job)
            {
                judged += 1;
                if let Some(r) = latest_report(st.store.as_ref(), t, &j.job) {
                    st.metrics.jobs.report(t.0, &j.job, &r);
                }
            }
        }
        Ok::<_, crate::StoreError>(jobs)
    })
    .await
    {
        Ok(j) => j,
        Err(page) => return page,
    };
    // The cross-job view a cluster's SRE opens first: which functions take
    // the CPU across the tenant's jobs now, and which grew.
    let st = state.clone();
    let functions = tokio::task::spawn_blocking(move || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let q = crate::FunctionsParams {
            limit: Some(15),
            ..Default::default()
        }
        .query(now)
        .map_err(|e| e.to_string())?;
        st.store.functions(t, &q).map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    let body = if jobs.is_empty() {
        html! {
            p {
                "No job has uploaded yet. Ranks upload when " code { "WHYSLOW_SERVER" } " and "
                code { "WHYSLOW_TOKEN" } " are set in the training job's environment."
            }
        }
    } else {
        jobs_table(&state, t, &jobs, &query)
    };
    page("Jobs", html! { (body) (functions_section(&functions)) }).into_response()
}

/// A job and what the scheduler says of it.
type JobRow = (
    whyslow_store::JobSummary,
    Option<whyslow_model::JobIdentity>,
);

/// The jobs list: the filter, then one row per job shown (its name, its
/// status, the scheduler's labels, its sessions, its last upload).
fn jobs_table(state: &AppState, t: TenantId, jobs: &[JobRow], query: &JobsQuery) -> Markup {
    // The name people know the job by first, the run id beside it, and
    // what the scheduler says of it; its status (the verdict) beside.
    let needle = query.q.as_deref().unwrap_or("").to_lowercase();
    let mut shown_jobs: Vec<_> = jobs
        .iter()
        .filter(|(j, id)| {
            needle.is_empty()
                || j.job.to_lowercase().contains(&needle)
                || id.as_ref().is_some_and(|i| {
                    i.name
                        .as_deref()
                        .unwrap_or("")
                        .to_lowercase()
                        .contains(&needle)
                        || i.labels
                            .iter()
                            .any(|(k, v)| format!("{k}={v}").to_lowercase().contains(&needle))
                })
        })
        .map(|(j, id)| (j, id, state.metrics.jobs.status(t.0, &j.job)))
        .collect();
    match query.sort.as_deref() {
        Some("name") => shown_jobs.sort_by(|a, b| a.0.job.cmp(&b.0.job)),
        Some("updated") => shown_jobs.sort_by_key(|x| std::cmp::Reverse(x.0.updated_unix_s)),
        _ => shown_jobs.sort_by_key(|x| {
            (
                x.2.as_ref().map_or(Health::Unknown, |s| s.0),
                std::cmp::Reverse(x.0.updated_unix_s),
            )
        }),
    }
    let sort_href = |key: &str| match query.q.as_deref() {
        Some(q) => format!("/ui/?sort={key}&q={}", url_escape(q)),
        None => format!("/ui/?sort={key}"),
    };
    html! {
        form.filter method="get" action="/ui/" {
            label { "Filter by name or label " input name="q" value=(query.q.as_deref().unwrap_or("")); }
            " "
            button { "Filter" }
        }
        table.jobs {
            tr {
                th { a href=(sort_href("name")) { "job" } }
                th { a href=(sort_href("status")) { "status" } }
                th { "scheduler" }
                th { "sessions" }
                th { a href=(sort_href("updated")) { "last upload" } }
            }
            @for (j, id, status) in &shown_jobs {
                @let (health, said) = match status {
                    Some((h, lines)) => (*h, lines.first().cloned().unwrap_or_default()),
                    None => (Health::Unknown, "not judged yet".to_string()),
                };
                tr {
                    td {
                        a href={ "/ui/jobs/" (j.job) } {
                            @match id.as_ref().and_then(|i| i.name.as_deref()) {
                                Some(n) => { b { (n) } " " span.muted { (j.job) } },
                                None => (j.job),
                            }
                        }
                    }
                    td { span.badge.(health.as_str()) { (health.as_str()) } " " (said) }
                    td {
                        @if let Some(i) = id {
                            @for (k, v) in &i.labels { code { (k) "=" (v) } " " }
                        }
                    }
                    td { (j.sessions) }
                    td { (utc(j.updated_unix_s)) }
                }
            }
        }
    }
}

/// The top functions across the tenant's jobs over the last hour, against
/// the hour before (`GET /api/v1/functions`'s defaults).
fn functions_section(t: &Result<whyslow_store::FunctionTable, String>) -> Markup {
    let t = match t {
        Err(e) => return html! { p.muted { "Functions across jobs: " (e) } },
        Ok(t) if t.samples == 0 => return html! {},
        Ok(t) => t,
    };
    let pct = |x: f64| format!("{:.1} %", 100.0 * x);
    html! {
        h2 { "Functions across your jobs" }
        p.muted {
            "CPU profiles of the last hour: " (t.samples) " samples in " (t.profiles)
            " profiles, against the hour before (" (t.base_samples.unwrap_or(0)) " samples). "
            code { "GET /api/v1/functions" } " asks the same for any range, kind and jobs."
        }
        table {
            tr { th { "function" } th { "self" } th { "total" } th { "self, change" } }
            @for f in &t.functions {
                tr {
                    td { code { (f.function) } }
                    td { (pct(f.self_share)) }
                    td { (pct(f.total_share)) }
                    td { (share_change(f.self_share_change)) }
                }
            }
        }
    }
}

/// A function's change of self share, in points: growth red, shrinking
/// blue.
fn share_change(change: Option<f64>) -> Markup {
    match change {
        Some(c) if c > 0.005 => {
            html! { span style="color:#c62828" { (format!("+{:.1} pp", 100.0 * c)) } }
        }
        Some(c) if c < -0.005 => {
            html! { span style="color:#1565c0" { (format!("{:.1} pp", 100.0 * c)) } }
        }
        Some(c) => html! { (format!("{:+.1} pp", 100.0 * c)) },
        None => html! {},
    }
}

/// The entry-time plot (SysOM-AI Fig. 5) of each group with a late rank.
fn entry_plots(d: &whyslow_diagnose::Diagnosis) -> Vec<whyslow_report::diagnose::EntryPlot> {
    d.late_groups
        .iter()
        .map(|g| {
            whyslow_report::diagnose::EntryPlot::from_instances(
                &g.lateness.group,
                &g.lateness.ranks,
                &g.lateness.instances,
                &g.flagged,
            )
        })
        .collect()
}

/// The job's cross-layer diagnosis (SysOM-AI §3.1), as `whyslow diagnose`
/// gives it over the same data: the verdict (late ranks, the layer, the
/// CPU/off-CPU/OS/network/GPU diffs, the regressions) and the entry-time
/// plot (Fig. 5) of each group with a late rank; the flame graphs on their
/// own page.
fn diagnosis_section(job: &str, d: &whyslow_diagnose::Diagnosis) -> Markup {
    let r = &d.report;
    // The same words as `whyslow diagnose --html` (whyslow_report).
    let verdict = status::diagnosis_status(r).line;
    let measure = whyslow_report::diagnose::deciding_measure(r);
    let plots = entry_plots(d);
    html! {
        h2 { "Cross-layer diagnosis" }
        p.muted {
            "From the node agents' profiles, collective records and OS signals (SysOM-AI §3.1); \
             the same verdict as " code { "whyslow diagnose" } " and "
            code { "GET /api/v1/jobs/" (job) "/diagnosis" } ". "
            a href={ "/ui/jobs/" (job) "/diagnosis.html" } { "The whole report, with its flame graphs" }
            "."
        }
        p {
            b { (verdict) } " Layer: " b { (r.layer) }
            @if let Some(m) = &measure { " — " (m) }
            "."
        }
        details {
            summary { "Every row and note" }
            pre { (whyslow_stack_output::diagnosis_table(r)) }
        }
        @for p in plots.iter().take(8) {
            h3 { "group " (p.group) ": entry into collectives, per rank" }
            (PreEscaped(p.svg()))
        }
    }
}

/// The diagnosis page of `job`: `whyslow diagnose --html`'s page
/// (whyslow_stack_output::diagnosis_html), its bar linking back to the job.
fn diagnosis_html(job: &str, d: &whyslow_diagnose::Diagnosis) -> String {
    let flames: Vec<_> = d
        .flames
        .iter()
        .map(whyslow_stack_output::diff_flamegraph)
        .collect();
    whyslow_report::diagnose::render_diagnose_page(
        &nav(vec![job_link(job)]),
        &format!("job {job}"),
        &d.report,
        &whyslow_stack_output::diagnosis_table(&d.report),
        &entry_plots(d),
        &flames,
    )
}

/// `/ui/jobs/{job}/diagnosis.html`: the whole diagnosis page (the verdict,
/// the entry-time plots, the differential flame graphs), as `whyslow
/// diagnose --html` writes it.
async fn diagnosis_page(
    State(state): State<Arc<AppState>>,
    Page(job): Page<JobName>,
    Query(q): Query<crate::DiagnosisQuery>,
    headers: HeaderMap,
) -> Response {
    let t = match signed_in(&state, &headers, &format!("/ui/jobs/{job}/diagnosis.html")).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let cfg = match q.config() {
        Ok(c) => c,
        Err(e) => return not_found(&e),
    };
    let (st, j) = (state.clone(), job.clone());
    let found = tokio::task::spawn_blocking(move || {
        crate::diagnosis_of(st.store.as_ref(), t, &j, &cfg)
            .map(|d| d.map(|d| diagnosis_html(&j, &d)))
    })
    .await;
    match found {
        Ok(Ok(Ok(page))) => Html(page).into_response(),
        Ok(Ok(Err(e))) => not_found(&format!("Job {job:?}: {e}")),
        Ok(Err(e)) => server_error(&e.to_string()),
        Err(e) => server_error(&e.to_string()),
    }
}

/// What a job's page shows: its sessions, its profiles by kind (and how
/// many), its diagnosis, its latest flow analysis and hang report (as
/// uploaded) and its latest session's report.
struct JobEvidence {
    sessions: Vec<whyslow_store::SessionSummary>,
    kinds: Vec<(&'static str, u64)>,
    diagnosis: Option<whyslow_diagnose::Diagnosis>,
    flows: Vec<String>,
    hangs: Vec<String>,
    report: Option<whyslow_model::Report>,
}

fn job_evidence(
    state: &AppState,
    t: TenantId,
    job: &str,
) -> Result<JobEvidence, crate::StoreError> {
    let store = state.store.as_ref();
    let sessions = store.sessions(t, job)?;
    let mut kinds = Vec::new();
    for k in crate::PROFILE_KINDS {
        let n = store.profile_count(t, job, k)?;
        if n > 0 {
            kinds.push((k, n));
        }
    }
    Ok(JobEvidence {
        sessions,
        kinds,
        diagnosis: crate::diagnosis_of(store, t, job, &Default::default())?.ok(),
        flows: store.batches(t, job, whyslow_store::BatchKind::Flows, 1)?,
        hangs: store.batches(t, job, whyslow_store::BatchKind::Hangs, 1)?,
        report: latest_report(store, t, job),
    })
}

async fn job_page(
    State(state): State<Arc<AppState>>,
    Page(job): Page<JobName>,
    headers: HeaderMap,
) -> Response {
    let t = match signed_in(&state, &headers, &format!("/ui/jobs/{job}")).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (st, j) = (state.clone(), job.clone());
    let e = match off_thread(move || job_evidence(&st, t, &j)).await {
        Ok(x) => x,
        Err(page) => return page,
    };
    if e.sessions.is_empty()
        && e.kinds.is_empty()
        && e.diagnosis.is_none()
        && e.flows.is_empty()
        && e.hangs.is_empty()
    {
        return not_found(&format!("No job {job:?}."));
    }
    let hang = e
        .hangs
        .first()
        .and_then(|h| crate::parse_hang_report(h).ok());
    // The verdict first (issue 46): what is slow, where and why, from every
    // kind of evidence the job has, worst first.
    let mut parts = Vec::new();
    if let Some(r) = &hang {
        parts.push(status::hang_status(r));
        state.metrics.jobs.hang_report(t.0, &job, r);
    }
    if let Some(d) = &e.diagnosis {
        parts.push(status::diagnosis_status(&d.report));
        state.metrics.jobs.diagnosis(t.0, &job, &d.report);
    }
    if let Some(r) = &e.report {
        parts.push(status::report_status(r));
        state.metrics.jobs.report(t.0, &job, r);
    }
    if let Some(f) = e
        .flows
        .first()
        .and_then(|f| crate::parse_flow_report(f).ok())
    {
        parts.push(status::flows_status(&f));
        state.metrics.jobs.flows(t.0, &job, &f);
    }
    let (health, lines) = status::job_status(&parts);
    let body = html! {
        (job_verdict(health, &lines))
        // A hang first: the job is stopped, nothing else matters as much.
        @if let Some(r) = &hang { (hang_section(r)) }
        @if let Some(d) = &e.diagnosis { (diagnosis_section(&job, d)) }
        @if let Some(text) = e.flows.first() { (flows_section(&job, text)) }
        (sessions_section(&job, &e.sessions))
        @for (k, n) in &e.kinds { (profiles_section(&job, k, *n)) }
    };
    page(&format!("Job {job}"), body).into_response()
}

/// The job's verdict card: its health and what each kind of evidence says.
fn job_verdict(health: Health, lines: &[String]) -> Markup {
    let h = health.as_str();
    html! {
        section.verdict.(h) aria-label="verdict" {
            span.badge.(h) { (h) }
            @if lines.is_empty() {
                p { "Nothing judged yet: no session, diagnosis, hang report or flow analysis." }
            }
            @for l in lines { p { (l) } }
        }
    }
}

/// The job's sessions: one profiling window of all ranks each.
fn sessions_section(job: &str, sessions: &[whyslow_store::SessionSummary]) -> Markup {
    if sessions.is_empty() {
        return html! {
            p.muted { "No fingerprints uploaded (no profiling window of the ranks yet)." }
        };
    }
    html! {
        h2 { "Sessions" }
        p.muted { "Each session is one profiling window of all ranks." }
        table {
            tr { th { "session" } th { "worker fingerprints" } th { "last upload" } }
            @for s in sessions {
                tr {
                    td { a href={ "/ui/jobs/" (job) "/sessions/" (s.session) } { (s.session) } }
                    td { (s.fingerprints) }
                    td { (utc(s.updated_unix_s)) }
                }
            }
        }
    }
}

/// The flame graph of the job's `n` profiles of `kind` (the latest merged),
/// and, with two or more, what changed since the job ran well (the diagnosis's window against its baseline).
fn profiles_section(job: &str, kind: &str, n: u64) -> Markup {
    let what = match kind {
        "cpu" => "CPU stacks of the ranks (the node agents' profiles)",
        "offcpu" => "Time the ranks spent blocked off the CPU, by the stack that blocked",
        _ => "Every process on the job's hosts",
    };
    let flame = format!("/ui/jobs/{job}/flamegraph.svg?kind={kind}");
    let diff = format!("/ui/jobs/{job}/diff.svg?kind={kind}");
    html! {
        h2 { (what) }
        p.muted {
            "Latest " (crate::MAX_FLAME_PROFILES) " profiles merged; click a frame to zoom. "
            a href=(flame) { "Open alone" } "."
        }
        object type="image/svg+xml" data=(flame) style="width:100%;min-height:30em" {}
        @if n >= 2 {
            h3 { "What changed since the job ran well" }
            p.muted {
                "The diagnosis's window against its baseline, the periods its verdict compared \
                 (a temporal baseline, SysOM-AI Fig. 6–7): frames wider now are red, narrower blue. "
                a href=(diff) { "Open alone" } "; against another job: " code { "?base_job=JOB" } "."
            }
            object type="image/svg+xml" data=(diff) style="width:100%;min-height:30em" {}
        }
    }
}

/// The job's latest hang report: after a stall, the ranks the others wait
/// for, what each did, the waits-for graph (`whyslow hang`'s page).
fn hang_section(r: &whyslow_model::hang::HangReport) -> Markup {
    html! {
        h2 { "Hang" }
        p.muted {
            "The latest hang report of this job: after a stall (no iteration for 5× the mean, \
             PerfTracker §4.1) every rank's stacks and Flight Recorder dump, and the ranks the \
             others wait for (" code { "whyslow hang" } ")."
        }
        (whyslow_report::hang::hang_html_markup(r))
    }
}

/// The job's latest flow analysis (LLMPrism): its findings first, with
/// dates, then the jobs and their steps, the per-switch DP bandwidth plot
/// (Fig. 5) and the per-rank timelines as a Perfetto file (Fig. 4).
fn flows_section(job: &str, text: &str) -> Markup {
    let report = match crate::parse_flow_report(text) {
        Ok(r) => r,
        Err(e) => {
            return html! {
                h2 { "Flows" }
                p { "The stored flow analysis cannot be read: " (e) }
            }
        }
    };
    html! {
        h2 { "Flows" }
        p.muted {
            "The latest flow analysis uploaded for this job ("
            code { "whyslow flows analyze --format json" }
            ", LLMPrism): the training jobs and their ranks found in the switches' flow records, \
             their steps, and the switches or links that slow them. "
            a href={ "/ui/jobs/" (job) "/flows.perfetto.json" } download { "Per-rank timelines" }
            " (open in " a href="https://ui.perfetto.dev" { "ui.perfetto.dev" } ")."
        }
        (whyslow_report::flows::render_html_body(&report))
    }
}

async fn flows_perfetto(
    State(state): State<Arc<AppState>>,
    Page(job): Page<JobName>,
    headers: HeaderMap,
) -> Response {
    let t = match signed_in(&state, &headers, &format!("/ui/jobs/{job}")).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (st, j) = (state.clone(), job.clone());
    let flows =
        match off_thread(move || st.store.batches(t, &j, whyslow_store::BatchKind::Flows, 1)).await
        {
            Ok(x) => x,
            Err(page) => return page,
        };
    let Some(report) = flows.first().and_then(|f| crate::parse_flow_report(f).ok()) else {
        return not_found(&format!("No flow analysis of job {job:?}."));
    };
    (
        [(header::CONTENT_TYPE, "application/json")],
        whyslow_report::flows::to_perfetto_trace(&report),
    )
        .into_response()
}

async fn diff_flamegraph(
    State(state): State<Arc<AppState>>,
    Page(job): Page<JobName>,
    Query(q): Query<crate::DiffQuery>,
    headers: HeaderMap,
) -> Response {
    let t = match signed_in(&state, &headers, &format!("/ui/jobs/{job}")).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let st = state.clone();
    match tokio::task::spawn_blocking(move || crate::diff_flamegraph(&st, t, &job, &q)).await {
        Ok(Ok(svg)) => ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response(),
        Ok(Err(e)) if e.status == StatusCode::NOT_FOUND => not_found(&e.message),
        Ok(Err(e)) if e.status == StatusCode::BAD_REQUEST => (
            StatusCode::BAD_REQUEST,
            page("Bad request", html! { p { (e.message) } }),
        )
            .into_response(),
        Ok(Err(e)) => server_error(&e.message),
        Err(e) => server_error(&e.to_string()),
    }
}

async fn flamegraph(
    State(state): State<Arc<AppState>>,
    Page(job): Page<JobName>,
    Query(q): Query<crate::FlameQuery>,
    headers: HeaderMap,
) -> Response {
    let (kind, limit) = match q.checked() {
        Ok(x) => x,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                page("Bad request", html! { p { (e) } }),
            )
                .into_response()
        }
    };
    let t = match signed_in(&state, &headers, &format!("/ui/jobs/{job}")).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (st, j, k) = (state.clone(), job.clone(), kind.to_string());
    let svg =
        match tokio::task::spawn_blocking(move || crate::job_flamegraph(&st, t, &j, &k, limit))
            .await
        {
            Ok(Ok(Some(svg))) => svg,
            Ok(Ok(None)) => return not_found(&format!("No {kind} profiles of job {job:?}.")),
            Ok(Err(e)) => return server_error(&e.to_string()),
            Err(e) => return server_error(&e.to_string()),
        };
    ([(header::CONTENT_TYPE, "image/svg+xml")], svg).into_response()
}

async fn session_page(
    State(state): State<Arc<AppState>>,
    Page((job, session)): Page<(JobName, SessionId)>,
    headers: HeaderMap,
) -> Response {
    let here = format!("/ui/jobs/{job}/sessions/{session}");
    let t = match signed_in(&state, &headers, &here).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (st, j, s) = (state.clone(), job.clone(), session.clone());
    let fps = match off_thread(move || st.store.fingerprints(t, &j, &s)).await {
        Ok(x) => x,
        Err(page) => return page,
    };
    if fps.is_empty() {
        return not_found(&format!("No job {job:?} session {session:?}."));
    }
    let report = match tokio::task::spawn_blocking(move || crate::report_of(&fps)).await {
        Ok(Ok(mut r)) => {
            if let Some(f) = &state.fix {
                f.recall(t, &job, &session, &mut r);
            }
            r
        }
        Ok(Err(refusal)) => {
            return (
                StatusCode::CONFLICT,
                page(
                    "Not judged",
                    html! {
                        p.error { (refusal) }
                        p { a href={ "/ui/jobs/" (job) } { "Job " (job) } }
                    },
                ),
            )
                .into_response()
        }
        Err(e) => return server_error(&e.to_string()),
    };
    state.metrics.reports.inc();
    // The report as `whyslow analyze --html` draws it, under the UI's bar:
    // the jobs, this job, this session, and the fix button.
    let mut bar = nav(vec![
        NavLink::new(format!("/ui/jobs/{job}"), format!("job {job}")),
        NavLink::new(here.clone(), format!("session {session}")),
    ]);
    bar.actions = fix_button(state.fix.as_ref(), &report, &here);
    let opts = whyslow_report::HtmlOptions::default();
    Html(whyslow_report::render_html_in(&bar, &report, &opts)).into_response()
}

/// The fix button: only where the operator configured a model and there
/// is a finding to fix; it posts (the cookie is SameSite=Strict, so another
/// site cannot press it).
fn fix_button(
    fix: Option<&crate::fix::FixSetting>,
    report: &whyslow_model::Report,
    here: &str,
) -> Option<Markup> {
    let f = fix.filter(|_| !report.findings.is_empty())?;
    let code = if f.source_roots.is_empty() {
        ""
    } else {
        " and their code"
    };
    let label = if report.fix.is_some() || report.fix_error.is_some() {
        "Ask again:"
    } else {
        "Propose a fix with"
    };
    Some(html! {
        form method="post" action={ (here) "/fix" } {
            button type="submit" title={ "sends the findings" (code) " to " (f.endpoint.base) } {
                (label) " " (f.endpoint.model)
            }
        }
    })
}

/// The fix button's target: asks (the same call as the API's
/// `POST …/fix`), then shows the session page with the answer.
async fn session_fix(
    State(state): State<Arc<AppState>>,
    Page((job, session)): Page<(JobName, SessionId)>,
    headers: HeaderMap,
) -> Response {
    let here = format!("/ui/jobs/{job}/sessions/{session}");
    let t = match signed_in(&state, &headers, &here).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let st = state.clone();
    let (j, s) = (job.clone(), session.clone());
    match tokio::task::spawn_blocking(move || crate::session_fix(&st, t, &j, &s)).await {
        Ok(Ok(_)) => Redirect::to(&here).into_response(),
        Ok(Err(crate::ApiError {
            status: code,
            message: why,
        })) => (
            code,
            page(
                "No fix",
                html! {
                    p.error { (why) }
                    p { a href=(here) { "Back to the session" } }
                },
            ),
        )
            .into_response(),
        Err(e) => server_error(&e.to_string()),
    }
}

/// The UI's routes (under `/ui`; `/` leads there).
pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui/") }))
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(jobs_page))
        .route("/ui/login", get(login_page).post(login_post))
        .route("/ui/logout", get(logout))
        .route("/ui/jobs/{job}", get(job_page))
        .route("/ui/jobs/{job}/flamegraph.svg", get(flamegraph))
        .route("/ui/jobs/{job}/diff.svg", get(diff_flamegraph))
        .route("/ui/jobs/{job}/flows.perfetto.json", get(flows_perfetto))
        .route("/ui/jobs/{job}/sessions/{session}", get(session_page))
        .route("/ui/jobs/{job}/sessions/{session}/fix", post(session_fix))
        .route("/ui/jobs/{job}/diagnosis.html", get(diagnosis_page))
}

#[cfg(test)]
mod tests {
    use super::signin::{cookie_token, login_form, safe_next};
    use super::*;

    #[test]
    fn dates_and_redirect_targets() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_795_585_816), "2026-11-25 05:50:16 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(safe_next(Some("/ui/jobs/a")), "/ui/jobs/a");
        for bad in [
            "https://evil.example/",
            "//evil.example/ui/",
            "/api/v1/jobs",
            "/ui/\r\nX: y",
            "/ui/\u{fc}",
            "/ui/a b",
            "/ui/\\evil",
        ] {
            assert_eq!(safe_next(Some(bad)), "/ui/", "{bad:?}");
        }
        assert_eq!(safe_next(None), "/ui/");
    }

    #[test]
    fn pages_escape_what_they_show() {
        let Html(login) = login_form("/ui/jobs/a\"><b>", Some("<bad> & token"));
        assert!(
            login.contains(r#"value="/ui/jobs/a&quot;&gt;&lt;b&gt;""#),
            "{login}"
        );
        assert!(login.contains(r#"<p class="error">&lt;bad&gt; &amp; token</p>"#));
        assert!(login.contains("<form id=\"login\" method=\"post\" action=\"/ui/login\">"));
        assert!(login.contains("decodeURIComponent(m[1]);f.submit();})();</script>"));
        assert!(login.contains(r#"<a href="/ui/logout">Sign out</a>"#));

        let v = job_verdict(Health::Slow, &["rank 2 <b>slow</b>".to_string()]).into_string();
        assert!(v.starts_with(
            r#"<section class="verdict slow" aria-label="verdict"><span class="badge slow">slow</span>"#
        ));
        assert!(v.contains("<p>rank 2 &lt;b&gt;slow&lt;/b&gt;</p>"), "{v}");
        let none = job_verdict(Health::Unknown, &[]).into_string();
        assert!(none.contains("Nothing judged yet"), "{none}");

        let table = whyslow_store::FunctionTable {
            samples: 10,
            profiles: 2,
            base_samples: Some(5),
            base_profiles: Some(1),
            functions: Vec::new(),
        };
        let f = functions_section(&Ok(table)).into_string();
        assert!(
            f.contains("<h2>Functions across your jobs</h2>")
                && f.contains("10 samples in 2 profiles")
        );
        let err = functions_section(&Err("<x>".into())).into_string();
        assert_eq!(
            err,
            r#"<p class="muted">Functions across jobs: &lt;x&gt;</p>"#
        );
        assert!(share_change(Some(0.5))
            .into_string()
            .contains(">+50.0 pp</span>"));
        assert!(share_change(Some(-0.5))
            .into_string()
            .contains(">-50.0 pp</span>"));
        assert_eq!(share_change(Some(0.001)).into_string(), "+0.1 pp");
    }

    #[test]
    fn a_job_s_sections_link_its_pages() {
        let p = profiles_section("j1", "offcpu", 4).into_string();
        assert!(
            p.contains(r#"data="/ui/jobs/j1/flamegraph.svg?kind=offcpu""#),
            "{p}"
        );
        assert!(p.contains(r#"<a href="/ui/jobs/j1/diff.svg?kind=offcpu">Open alone</a>"#));
        assert!(p.contains("The diagnosis's window against its baseline"));
        assert!(!profiles_section("j1", "cpu", 1)
            .into_string()
            .contains("What changed"));
        let s = sessions_section("j1", &[]).into_string();
        assert!(s.contains("No fingerprints uploaded"));
        let f = flows_section("j1", "not json").into_string();
        assert!(
            f.starts_with("<h2>Flows</h2><p>The stored flow analysis cannot be read: "),
            "{f}"
        );
        // The diagnosis page's bar leads back to its job.
        let bar = nav(vec![job_link("j1")]);
        let labels: Vec<_> = bar
            .links
            .iter()
            .map(|l| (l.href.as_str(), l.label.as_str()))
            .collect();
        assert_eq!(
            labels,
            [
                ("/ui/", "Jobs"),
                ("/ui/jobs/j1", "Job j1"),
                ("/ui/logout", "Sign out")
            ]
        );
    }

    #[test]
    fn the_token_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "a=1; whyslow_token=wsk_abc ; b=2".parse().unwrap(),
        );
        assert_eq!(cookie_token(&h).as_deref(), Some("wsk_abc"));
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, "whyslow_token=".parse().unwrap());
        assert_eq!(cookie_token(&h), None);
        assert_eq!(cookie_token(&HeaderMap::new()), None);
    }
}
