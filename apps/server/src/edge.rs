//! What every API request is checked for once, where it enters: the
//! bearer token, as the tenant it names ([`Tenant`], an extractor), and
//! the job, session and batch names in its path ([`JobName`],
//! [`SessionId`], [`BatchId`], built through serde by [`ApiPath`]). A
//! handler that takes them never sees an unchecked name, and a refusal is
//! the API's one error shape ([`ApiError`]). The tenant is checked first:
//! put [`Tenant`] before [`ApiPath`] in a handler's arguments.

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::path::ErrorKind;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path};
use axum::http::header;
use axum::http::request::Parts;

use crate::error::{blocking, ApiError};
use crate::{store, AppState, TenantId};

/// The tenant whose bearer token (`Authorization: Bearer …`) came with
/// the request; 401 without one or with one the store does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenant(pub TenantId);

impl FromRequestParts<Arc<AppState>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty() && t.len() <= 256)
            .ok_or_else(|| ApiError::unauthorized("missing bearer token"))?;
        if let Some(t) = state.tokens.get(&token) {
            return Ok(Tenant(t));
        }
        let st = state.clone();
        let (t, token) = blocking(move || Ok((st.store.tenant_of_token(&token)?, token))).await?;
        let t = t.ok_or_else(|| ApiError::unauthorized("unknown token"))?;
        state.tokens.put(token, t);
        Ok(Tenant(t))
    }
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

/// A name checked as the store files it (`whyslow_store::check_name`:
/// 1–200 of letters, digits and `-_.:@`, not starting with a dot).
macro_rules! checked_name {
    ($(#[$doc:meta])* $ty:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Deserialize)]
        #[serde(try_from = "String")]
        pub struct $ty(String);

        impl TryFrom<String> for $ty {
            type Error = String;

            fn try_from(s: String) -> Result<Self, String> {
                match store::check_name($what, &s) {
                    Ok(()) => Ok(Self(s)),
                    Err(store::StoreError::BadName(why)) => Err(why),
                    Err(e) => Err(e.to_string()),
                }
            }
        }

        impl Deref for $ty {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl $ty {
            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
    };
}

checked_name!(
    /// A job's name as a tenant uploads it (the path's `{job}`).
    JobName,
    "job"
);
checked_name!(
    /// A session of a job (the path's `{session}`): one run's fingerprints.
    SessionId,
    "session"
);
checked_name!(
    /// An upload's batch id (the path's `{batch}`): a retry sends the same.
    BatchId,
    "batch"
);

/// `axum::extract::Path` whose refusal is an [`ApiError`] with the reason
/// alone (a bad name says which and what is allowed).
#[derive(Debug, Clone)]
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(rejection) => {
                let why = match &rejection {
                    PathRejection::FailedToDeserializePathParams(e) => match e.kind() {
                        ErrorKind::Message(m) => m.clone(),
                        _ => e.body_text(),
                    },
                    other => other.body_text(),
                };
                Err(ApiError::new(rejection.status(), why))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_when_built() {
        assert_eq!(&*JobName::try_from("job-1".to_string()).unwrap(), "job-1");
        let e = JobName::try_from("../x".to_string()).unwrap_err();
        assert!(e.starts_with("job \"../x\""), "{e}");
        assert!(SessionId::try_from(String::new()).is_err());
        assert!(BatchId::try_from(".hidden".to_string()).is_err());
        let parsed: Result<(JobName, SessionId), _> =
            serde_json::from_str::<(JobName, SessionId)>(r#"["j", "s/1"]"#);
        assert!(parsed.unwrap_err().to_string().contains("session \"s/1\""));
    }
}
