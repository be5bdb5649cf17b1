//! Signing in to the web UI: the tenant's API token, entered once on
//! `/ui/login` (or passed in the link's fragment) and kept in an `HttpOnly`,
//! `SameSite=Strict` cookie scoped to `/ui`, and the check every page makes.

use std::sync::Arc;

use axum::extract::{Form, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use maud::{html, PreEscaped};
use serde::Deserialize;

use super::{page, server_error};
use crate::store::TenantId;
use crate::AppState;

/// The cookie that holds the signed-in tenant's token.
const COOKIE: &str = "whyslow_token";

/// How long a sign-in lasts, seconds (a week).
const SIGN_IN_MAX_AGE_S: u64 = 7 * 24 * 3600;

pub(super) fn cookie_token(headers: &HeaderMap) -> Option<String> {
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
pub(super) async fn signed_in(
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

/// Where to go after signing in: a UI page of this server only (never
/// another site: no open redirect).
pub(super) fn safe_next(next: Option<&str>) -> String {
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
pub(super) struct NextQuery {
    next: Option<String>,
}

pub(super) async fn login_page(Query(q): Query<NextQuery>) -> Html<String> {
    login_form(&safe_next(q.next.as_deref()), None)
}

/// Signs in from a link (`/ui/login#token=…`): the token from the
/// fragment, which browsers never send to a server, into the form.
const LOGIN_SCRIPT: &str = "(function(){var m=location.hash.match(/^#token=([^&]+)/);\
if(!m)return;history.replaceState(null,'',location.pathname+location.search);\
var f=document.getElementById('login');f.token.value=decodeURIComponent(m[1]);f.submit();})();";

pub(super) fn login_form(next: &str, error: Option<&str>) -> Html<String> {
    page(
        "Sign in",
        html! {
            @if let Some(e) = error {
                p.error { (e) }
            }
            form id="login" method="post" action="/ui/login" {
                p {
                    label {
                        "API token of your tenant" br;
                        input type="password" name="token" size="60" autocomplete="off" required;
                    }
                }
                input type="hidden" name="next" value=(next);
                p { button type="submit" { "Sign in" } }
            }
            p.muted {
                "A token comes from "
                code { "whyslow server token create --data DIR --tenant NAME" }
                "."
            }
            script { (PreEscaped(LOGIN_SCRIPT)) }
        },
    )
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    token: String,
    next: Option<String>,
}

pub(super) async fn login_post(
    State(state): State<Arc<AppState>>,
    Form(f): Form<LoginForm>,
) -> Response {
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

pub(super) async fn logout() -> Response {
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
