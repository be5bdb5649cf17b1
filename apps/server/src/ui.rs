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

use axum::extract::{Form, Path as UrlPath, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;

use crate::store::{self, TenantId};
use crate::AppState;
use whyslow_report::status::{self, Health};

/// The cookie that holds the signed-in tenant's token.
const COOKIE: &str = "whyslow_token";

/// How long a sign-in lasts, seconds (a week).
const SIGN_IN_MAX_AGE_S: u64 = 7 * 24 * 3600;

fn page(title: &str, body: &str) -> Html<String> {
    // One layout for every page (whyslow_report::layout): the server's
    // pages and the command line's reports look alike.
    use whyslow_report::layout::{self, NavLink};
    Html(layout::page(
        title,
        Some("/ui/"),
        &[
            NavLink::new("/ui/", "Jobs"),
            NavLink::new("/ui/logout", "Sign out"),
        ],
        whyslow_report::hang::HANG_CSS,
        layout::trusted(body),
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

fn esc(s: &str) -> String {
    whyslow_report::escape_html(s)
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a Unix time (civil-from-days, Hinnant).
fn utc(unix_s: i64) -> String {
    whyslow_model::time::utc_seconds(unix_s)
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim().to_string())
        .filter(|t| !t.is_empty() && t.len() <= 256)
}

/// The signed-in tenant, or the response that sends the browser to sign in
/// (and back to `here` after).
async fn signed_in(
    state: &Arc<AppState>,
    headers: &HeaderMap,
    here: &str,
) -> Result<TenantId, Response> {
    let to_login = || Redirect::to(&format!("/ui/login?next={here}")).into_response();
    let Some(token) = cookie_token(headers) else {
        return Err(to_login());
    };
    let st = state.clone();
    match tokio::task::spawn_blocking(move || st.store.tenant_of_token(&token)).await {
        Ok(Ok(Some(t))) => Ok(t),
        Ok(Ok(None)) => Err(to_login()),
        Ok(Err(e)) => Err(server_error(&e.to_string())),
        Err(e) => Err(server_error(&e.to_string())),
    }
}

fn server_error(msg: &str) -> Response {
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        page(
            "Server error",
            &format!("<p class=\"error\">{}</p>", esc(msg)),
        ),
    )
        .into_response()
}

fn not_found(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        page(
            "Not found",
            &format!("<p>{}</p><p><a href=\"/ui/\">Your jobs</a></p>", esc(what)),
        ),
    )
        .into_response()
}

/// Where to go after signing in: a UI page of this server only (never
/// another site: no open redirect).
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with("/ui/")
                && !n.contains('\\')
                && n.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            n.to_string()
        }
        _ => "/ui/".to_string(),
    }
}

#[derive(Deserialize)]
struct NextQuery {
    next: Option<String>,
}

async fn login_page(Query(q): Query<NextQuery>) -> Html<String> {
    login_form(&safe_next(q.next.as_deref()), None)
}

fn login_form(next: &str, error: Option<&str>) -> Html<String> {
    let error = error
        .map(|e| format!("<p class=\"error\">{}</p>", esc(e)))
        .unwrap_or_default();
    page(
        "Sign in",
        &format!(
            "{error}<form id=\"login\" method=\"post\" action=\"/ui/login\">\
             <p><label>API token of your tenant<br>\
             <input type=\"password\" name=\"token\" size=\"60\" autocomplete=\"off\" required></label></p>\
             <input type=\"hidden\" name=\"next\" value=\"{}\">\
             <p><button type=\"submit\">Sign in</button></p></form>\
             <p class=\"muted\">A token comes from <code>whyslow server token create --data DIR --tenant NAME</code>.</p>\
             <script>(function(){{var m=location.hash.match(/^#token=([^&]+)/);\
             if(!m)return;history.replaceState(null,'',location.pathname+location.search);\
             var f=document.getElementById('login');f.token.value=decodeURIComponent(m[1]);f.submit();}})();</script>",
            esc(next)
        ),
    )
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
    next: Option<String>,
}

async fn login_post(State(state): State<Arc<AppState>>, Form(f): Form<LoginForm>) -> Response {
    state.metrics.requests.inc();
    let next = safe_next(f.next.as_deref());
    let token = f.token.trim().to_string();
    if token.is_empty() || token.len() > 256 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        state.metrics.unauthorized.inc();
        return (
            StatusCode::UNAUTHORIZED,
            login_form(&next, Some("That is not a token.")),
        )
            .into_response();
    }
    let st = state.clone();
    let t = token.clone();
    match tokio::task::spawn_blocking(move || st.store.tenant_of_token(&t)).await {
        Ok(Ok(Some(_))) => (
            StatusCode::SEE_OTHER,
            [
                (
                    header::SET_COOKIE,
                    // Kept across browser restarts for a week (a session
                    // cookie died with the browser); signing out clears it.
                    format!(
                        "{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={SIGN_IN_MAX_AGE_S}"
                    ),
                ),
                (header::LOCATION, next),
            ],
        )
            .into_response(),
        Ok(Ok(None)) => {
            state.metrics.unauthorized.inc();
            (
                StatusCode::UNAUTHORIZED,
                login_form(&next, Some("Unknown token.")),
            )
                .into_response()
        }
        Ok(Err(e)) => server_error(&e.to_string()),
        Err(e) => server_error(&e.to_string()),
    }
}

async fn logout() -> Response {
    (
        StatusCode::SEE_OTHER,
        [
            (
                header::SET_COOKIE,
                format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0"),
            ),
            (header::LOCATION, "/ui/login".to_string()),
        ],
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
    state.metrics.requests.inc();
    let t = match signed_in(&state, &headers, "/ui/").await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let st = state.clone();
    let jobs = match tokio::task::spawn_blocking(move || {
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
        Ok(Ok(j)) => j,
        Ok(Err(e)) => return server_error(&e.to_string()),
        Err(e) => return server_error(&e.to_string()),
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
        "<p>No job has uploaded yet. Ranks upload when <code>WHYSLOW_SERVER</code> and \
         <code>WHYSLOW_TOKEN</code> are set in the training job's environment.</p>"
            .to_string()
    } else {
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
        maud::html! {
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
        .into_string()
    };
    let body = body + &functions_section(&functions);
    page("Jobs", &body).into_response()
}

/// The top functions across the tenant's jobs over the last hour, against
/// the hour before (`GET /api/v1/functions`'s defaults).
fn functions_section(t: &Result<whyslow_store::FunctionTable, String>) -> String {
    let t = match t {
        Err(e) => return format!("<p class=\"muted\">Functions across jobs: {}</p>", esc(e)),
        Ok(t) if t.samples == 0 => return String::new(),
        Ok(t) => t,
    };
    let pct = |x: f64| format!("{:.1} %", 100.0 * x);
    let rows: String = t
        .functions
        .iter()
        .map(|f| {
            let change = match f.self_share_change {
                Some(c) if c > 0.005 => {
                    format!("<span style=\"color:#c62828\">+{:.1} pp</span>", 100.0 * c)
                }
                Some(c) if c < -0.005 => {
                    format!("<span style=\"color:#1565c0\">{:.1} pp</span>", 100.0 * c)
                }
                Some(c) => format!("{:+.1} pp", 100.0 * c),
                None => String::new(),
            };
            format!(
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{change}</td></tr>",
                esc(&f.function),
                pct(f.self_share),
                pct(f.total_share)
            )
        })
        .collect();
    format!(
        "<h2>Functions across your jobs</h2><p class=\"muted\">CPU profiles of the last hour: {} samples in {} profiles, against the hour before ({} samples). \
         <code>GET /api/v1/functions</code> asks the same for any range, kind and jobs.</p>\
         <table><tr><th>function</th><th>self</th><th>total</th><th>self, change</th></tr>{rows}</table>",
        t.samples,
        t.profiles,
        t.base_samples.unwrap_or(0)
    )
}

/// The job's stragglers (SysOM-AI §3.1) and the per-rank entry-time plot
/// of each group (Fig. 5), from its uploaded collective records.
/// The job's cross-layer diagnosis (SysOM-AI §3.1), as `whyslow diagnose`
/// gives it over the same data: the verdict (late ranks, the layer, the
/// CPU/off-CPU/OS/network/GPU diffs, the regressions) and the entry-time
/// plot of each group with a late rank; the flame graphs on their own page.
fn diagnosis_section(job: &str, d: &whyslow_diagnose::Diagnosis) -> String {
    let r = &d.report;
    // The same words as `whyslow diagnose --html` (whyslow_report).
    let verdict = status::diagnosis_status(r).line;
    let measure = whyslow_report::diagnose::deciding_measure(r)
        .map(|m| format!(" — {}", esc(&m)))
        .unwrap_or_default();
    let mut out = format!(
        "<h2>Cross-layer diagnosis</h2><p class=\"muted\">From the node agents' profiles, \
         collective records and OS signals (SysOM-AI §3.1); the same verdict as \
         <code>whyslow diagnose</code> and <code>GET /api/v1/jobs/{j}/diagnosis</code>. \
         <a href=\"/ui/jobs/{j}/diagnosis.html\">The whole report, with its flame graphs</a>.</p>\
         <p><b>{}</b> Layer: <b>{}</b>{measure}.</p>\
         <details><summary>Every row and note</summary><pre>{}</pre></details>",
        esc(&verdict),
        esc(&r.layer),
        esc(&whyslow_stack_output::diagnosis_table(r)),
        j = esc(job),
    );
    for g in d.late_groups.iter().take(8) {
        let plot = whyslow_report::diagnose::EntryPlot::from_instances(
            &g.lateness.group,
            &g.lateness.ranks,
            &g.lateness.instances,
            &g.flagged,
        );
        out.push_str(&format!(
            "<h3>group {}: entry into collectives, per rank</h3>{}",
            esc(&g.lateness.group),
            plot.svg()
        ));
    }
    out
}

/// `/ui/jobs/{job}/diagnosis.html`: the whole diagnosis page (the verdict,
/// the entry-time plots, the differential flame graphs), as `whyslow
/// diagnose --html` writes it.
async fn diagnosis_page(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    Query(q): Query<crate::DiagnosisQuery>,
    headers: HeaderMap,
) -> Response {
    state.metrics.requests.inc();
    if store::check_name("job", &job).is_err() {
        return not_found("No such job.");
    }
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
            .map(|d| d.map(|d| whyslow_stack_output::diagnosis_html(&format!("job {j}"), &d)))
    })
    .await;
    match found {
        Ok(Ok(Ok(page))) => Html(page).into_response(),
        Ok(Ok(Err(e))) => not_found(&format!("Job {job:?}: {e}")),
        Ok(Err(e)) => server_error(&e.to_string()),
        Err(e) => server_error(&e.to_string()),
    }
}

async fn job_page(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    state.metrics.requests.inc();
    if store::check_name("job", &job).is_err() {
        return not_found("No such job.");
    }
    let t = match signed_in(&state, &headers, &format!("/ui/jobs/{job}")).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (st, j) = (state.clone(), job.clone());
    let found = tokio::task::spawn_blocking(move || -> Result<_, crate::StoreError> {
        let sessions = st.store.sessions(t, &j)?;
        let mut kinds = Vec::new();
        for k in crate::PROFILE_KINDS {
            let n = st.store.profile_count(t, &j, k)?;
            if n > 0 {
                kinds.push((k, n));
            }
        }
        let diagnosis = crate::diagnosis_of(st.store.as_ref(), t, &j, &Default::default())?.ok();
        let report = latest_report(st.store.as_ref(), t, &j);
        let flows = st
            .store
            .batches(t, &j, whyslow_store::BatchKind::Flows, 1)?;
        let hangs = st
            .store
            .batches(t, &j, whyslow_store::BatchKind::Hangs, 1)?;
        Ok((sessions, kinds, diagnosis, flows, hangs, report))
    })
    .await;
    let (sessions, kinds, diagnosis, flows, hangs, report) = match found {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => return server_error(&e.to_string()),
        Err(e) => return server_error(&e.to_string()),
    };
    if sessions.is_empty()
        && kinds.is_empty()
        && diagnosis.is_none()
        && flows.is_empty()
        && hangs.is_empty()
    {
        return not_found(&format!("No job {job:?}."));
    }
    let mut body = String::new();
    let hang = hangs.first().and_then(|h| crate::parse_hang_report(h).ok());
    // The verdict first (issue 46): what is slow, where and why, from every
    // kind of evidence the job has, worst first.
    let mut parts = Vec::new();
    if let Some(r) = &hang {
        parts.push(status::hang_status(r));
        state.metrics.jobs.hang_report(t.0, &job, r);
    }
    if let Some(d) = &diagnosis {
        parts.push(status::diagnosis_status(&d.report));
        state.metrics.jobs.diagnosis(t.0, &job, &d.report);
    }
    if let Some(r) = &report {
        parts.push(status::report_status(r));
        state.metrics.jobs.report(t.0, &job, r);
    }
    if let Some(f) = flows.first().and_then(|f| crate::parse_flow_report(f).ok()) {
        parts.push(status::flows_status(&f));
        state.metrics.jobs.flows(t.0, &job, &f);
    }
    let (health, lines) = status::job_status(&parts);
    let lines: String = if lines.is_empty() {
        "<p>Nothing judged yet: no session, diagnosis, hang report or flow analysis.</p>".into()
    } else {
        lines.iter().map(|l| format!("<p>{}</p>", esc(l))).collect()
    };
    body.push_str(&format!(
        "<section class=\"verdict {h}\" aria-label=\"verdict\"><span class=\"badge {h}\">{h}</span>{lines}</section>",
        h = health.as_str()
    ));
    // A hang first: the job is stopped, nothing else matters as much.
    if let Some(r) = &hang {
        body.push_str(&hang_section(r));
    }
    if let Some(d) = &diagnosis {
        body.push_str(&diagnosis_section(&job, d));
    }
    if let Some(text) = flows.first() {
        body.push_str(&flows_section(&job, text));
    }
    if sessions.is_empty() {
        body.push_str("<p class=\"muted\">No fingerprints uploaded (no profiling window of the ranks yet).</p>");
    } else {
        let rows: String = sessions
            .iter()
            .map(|s| {
                format!(
                    "<tr><td><a href=\"/ui/jobs/{j}/sessions/{s}\">{s}</a></td><td>{}</td><td>{}</td></tr>",
                    s.fingerprints,
                    utc(s.updated_unix_s),
                    j = esc(&job),
                    s = esc(&s.session),
                )
            })
            .collect();
        body.push_str(&format!(
            "<h2>Sessions</h2><p class=\"muted\">Each session is one profiling window of all ranks.</p>\
             <table><tr><th>session</th><th>worker fingerprints</th><th>last upload</th></tr>{rows}</table>"
        ));
    }
    for (k, n) in kinds {
        let what = match k {
            "cpu" => "CPU stacks of the ranks (the node agents' profiles)",
            "offcpu" => "Time the ranks spent blocked off the CPU, by the stack that blocked",
            _ => "Every process on the job's hosts",
        };
        body.push_str(&format!(
            "<h2>{what}</h2><p class=\"muted\">Latest {max} profiles merged; click a frame to zoom. \
             <a href=\"/ui/jobs/{j}/flamegraph.svg?kind={k}\">Open alone</a>.</p>\
             <object type=\"image/svg+xml\" data=\"/ui/jobs/{j}/flamegraph.svg?kind={k}\" \
             style=\"width:100%;min-height:30em\"></object>",
            max = crate::MAX_FLAME_PROFILES,
            j = esc(&job),
        ));
        if n >= 2 {
            let each = (n / 2).min(crate::MAX_FLAME_PROFILES as u64);
            body.push_str(&format!(
                "<h3>What changed since the job began</h3><p class=\"muted\">The latest {each} profiles \
                 against the job's first {each} (a temporal baseline, SysOM-AI Fig. 6–7): frames wider \
                 now are red, narrower blue. \
                 <a href=\"/ui/jobs/{j}/diff.svg?kind={k}\">Open alone</a>; against another job: \
                 <code>?base_job=JOB</code>.</p>\
                 <object type=\"image/svg+xml\" data=\"/ui/jobs/{j}/diff.svg?kind={k}\" \
                 style=\"width:100%;min-height:30em\"></object>",
                j = esc(&job),
            ));
        }
    }
    page(&format!("Job {job}"), &body).into_response()
}

/// The job's latest flow analysis (LLMPrism): its table (jobs, steps,
/// pair types, findings), the per-switch DP bandwidth plot (Fig. 5) and the
/// per-rank timelines as a Perfetto file (Fig. 4).
fn hang_section(r: &whyslow_model::hang::HangReport) -> String {
    format!(
        "<h2>Hang</h2><p class=\"muted\">The latest hang report of this job: after a stall \
         (no iteration for 5× the mean, PerfTracker §4.1) every rank's stacks and Flight \
         Recorder dump, and the ranks the others wait for (<code>whyslow hang</code>).</p>{}",
        whyslow_report::hang::hang_html_body(r)
    )
}

/// The job's latest flow analysis (LLMPrism): its findings first, with
/// dates, then the jobs and their steps, the per-switch DP bandwidth plot
/// (Fig. 5) and the per-rank timelines as a Perfetto file (Fig. 4).
fn flows_section(job: &str, text: &str) -> String {
    let report = match crate::parse_flow_report(text) {
        Ok(r) => r,
        Err(e) => {
            return format!(
                "<h2>Flows</h2><p>The stored flow analysis cannot be read: {}</p>",
                esc(&e)
            )
        }
    };
    format!(
        "<h2>Flows</h2><p class=\"muted\">The latest flow analysis uploaded for this job \
         (<code>whyslow flows analyze --format json</code>, LLMPrism): the training jobs and \
         their ranks found in the switches' flow records, their steps, and the switches or links \
         that slow them. <a href=\"/ui/jobs/{j}/flows.perfetto.json\" download>Per-rank \
         timelines</a> (open in <a href=\"https://ui.perfetto.dev\">ui.perfetto.dev</a>).</p>{body}",
        j = esc(job),
        body = whyslow_report::flows::render_html_body(&report).into_string(),
    )
}

async fn flows_perfetto(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    headers: HeaderMap,
) -> Response {
    state.metrics.requests.inc();
    if store::check_name("job", &job).is_err() {
        return not_found("No such job.");
    }
    let t = match signed_in(&state, &headers, &format!("/ui/jobs/{job}")).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (st, j) = (state.clone(), job.clone());
    let flows = match tokio::task::spawn_blocking(move || {
        st.store.batches(t, &j, whyslow_store::BatchKind::Flows, 1)
    })
    .await
    {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return server_error(&e.to_string()),
        Err(e) => return server_error(&e.to_string()),
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
    UrlPath(job): UrlPath<String>,
    Query(q): Query<crate::DiffQuery>,
    headers: HeaderMap,
) -> Response {
    state.metrics.requests.inc();
    if store::check_name("job", &job).is_err() {
        return not_found("No such job.");
    }
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
            page("Bad request", &esc(&e.message)),
        )
            .into_response(),
        Ok(Err(e)) => server_error(&e.message),
        Err(e) => server_error(&e.to_string()),
    }
}

async fn flamegraph(
    State(state): State<Arc<AppState>>,
    UrlPath(job): UrlPath<String>,
    Query(q): Query<crate::FlameQuery>,
    headers: HeaderMap,
) -> Response {
    state.metrics.requests.inc();
    if store::check_name("job", &job).is_err() {
        return not_found("No such job.");
    }
    let (kind, limit) = match q.checked() {
        Ok(x) => x,
        Err(e) => return (StatusCode::BAD_REQUEST, page("Bad request", &esc(&e))).into_response(),
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
    UrlPath((job, session)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    state.metrics.requests.inc();
    if store::check_name("job", &job).is_err() || store::check_name("session", &session).is_err() {
        return not_found("No such session.");
    }
    let here = format!("/ui/jobs/{job}/sessions/{session}");
    let t = match signed_in(&state, &headers, &here).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let (st, j, s) = (state.clone(), job.clone(), session.clone());
    let fps = match tokio::task::spawn_blocking(move || st.store.fingerprints(t, &j, &s)).await {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return server_error(&e.to_string()),
        Err(e) => return server_error(&e.to_string()),
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
                    &format!(
                        "<p class=\"error\">{}</p><p><a href=\"/ui/jobs/{}\">Job {}</a></p>",
                        esc(&refusal.to_string()),
                        esc(&job),
                        esc(&job)
                    ),
                ),
            )
                .into_response()
        }
        Err(e) => return server_error(&e.to_string()),
    };
    state.metrics.reports.inc();
    let html = whyslow_report::render_html(&report);
    // The report is a whole page; the UI's bar goes on top of it.
    // The fix button: only where the operator configured a model; it posts
    // (the cookie is SameSite=Strict, so another site cannot press it).
    let ask = match &state.fix {
        Some(f) if !report.findings.is_empty() => format!(
            "<form method=\"post\" action=\"{here}/fix\" style=\"display:inline;float:right;margin:0\">\
             <button type=\"submit\" title=\"sends the findings{code} to {base}\">{label} {model}</button></form>",
            here = esc(&here),
            code = if f.source_roots.is_empty() { "" } else { " and their code" },
            base = esc(&f.endpoint.base),
            label = if report.fix.is_some() || report.fix_error.is_some() {
                "Ask again:"
            } else {
                "Propose a fix with"
            },
            model = esc(&f.endpoint.model),
        ),
        _ => String::new(),
    };
    let bar = format!(
        "<nav style=\"background:#24292f;padding:.6em 1.2em;font-family:system-ui,sans-serif\">{ask}\
         <a style=\"color:#fff;text-decoration:none\" href=\"/ui/\">whyslow</a>\
         <span style=\"color:#bbb\"> › <a style=\"color:#bbb\" href=\"/ui/jobs/{j}\">job {j}</a> › session {s}</span></nav>",
        j = esc(&job),
        s = esc(&session)
    );
    let html = match html.find("<body>") {
        Some(i) => format!("{}{bar}{}", &html[..i + 6], &html[i + 6..]),
        None => format!("{bar}{html}"),
    };
    Html(html).into_response()
}

/// The fix button's target: asks (the same call as the API's
/// `POST …/fix`), then shows the session page with the answer.
async fn session_fix(
    State(state): State<Arc<AppState>>,
    UrlPath((job, session)): UrlPath<(String, String)>,
    headers: HeaderMap,
) -> Response {
    state.metrics.requests.inc();
    if store::check_name("job", &job).is_err() || store::check_name("session", &session).is_err() {
        return not_found("No such session.");
    }
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
                &format!(
                    "<p class=\"error\">{}</p><p><a href=\"{}\">Back to the session</a></p>",
                    esc(&why),
                    esc(&here)
                ),
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
