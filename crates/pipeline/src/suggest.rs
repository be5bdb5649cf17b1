//! Asking a model for a fix (EROICA's first step, "first try AI auto-fix"):
//! one request to an OpenAI-compatible chat-completions API, opt-in. Called
//! the same way by `whyslow analyze|localize --suggest-fix` and by the
//! server's session page. The request, the answer's meaning and the patch
//! check are `whyslow_fix`'s (the online package makes the same calls from
//! Python); this module reads the settings and the files, and sends.
//!
//! Settings: `WHYSLOW_LLM_URL` (a base URL, e.g. `http://127.0.0.1:8080/v1`;
//! the request goes to `{base}/chat/completions`), `WHYSLOW_LLM_MODEL`,
//! `WHYSLOW_LLM_API_KEY` or `WHYSLOW_LLM_API_KEY_FILE`. The key goes only in
//! the `Authorization` header: never in a log line, an error, the report or
//! the request body.

use std::path::PathBuf;
use std::time::Duration;

use whyslow_model::Report;

/// The bound on the answer by default, tokens (`--llm-max-tokens`).
pub use whyslow_fix::DEFAULT_MAX_TOKENS;

/// How to ask: what `--suggest-fix` (or the server's setting) says.
pub struct SuggestArgs<'a> {
    /// `--dry-run`: print the request body, send nothing.
    pub dry_run: bool,
    /// Seconds for the whole exchange.
    pub timeout_s: f64,
    /// `--source-root` (else the working directory).
    pub roots: &'a [PathBuf],
    /// Bytes of code at most.
    pub max_code_bytes: usize,
    /// Tokens of the answer at most (`--llm-max-tokens`).
    pub max_tokens: u32,
}

/// Where to ask: the model's base URL, its name and the key (kept out of
/// `Debug` so it cannot reach a log).
#[derive(Clone)]
pub struct Endpoint {
    /// Base URL without a trailing slash; requests go to
    /// `{base}/chat/completions`.
    pub base: String,
    /// The model's name as the endpoint knows it.
    pub model: String,
    key: Option<String>,
}

impl Endpoint {
    /// An endpoint at `base` (a trailing slash is dropped) for `model`,
    /// with an optional API key.
    pub fn new(base: &str, model: &str, key: Option<String>) -> Self {
        Endpoint {
            base: base.trim().trim_end_matches('/').to_string(),
            model: model.to_string(),
            key,
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("base", &self.base)
            .field("model", &self.model)
            .field("key", &self.key.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// The endpoint from `WHYSLOW_LLM_URL`, `WHYSLOW_LLM_MODEL` and
/// `WHYSLOW_LLM_API_KEY` (or `WHYSLOW_LLM_API_KEY_FILE`); the error is one
/// line that names what is missing.
pub fn endpoint_from_env() -> Result<Endpoint, String> {
    let base = std::env::var("WHYSLOW_LLM_URL")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .ok_or(
            "WHYSLOW_LLM_URL is not set (the model's base URL, e.g. http://127.0.0.1:8080/v1)",
        )?;
    let model = std::env::var("WHYSLOW_LLM_MODEL").unwrap_or_else(|_| "default".into());
    let key = match std::env::var("WHYSLOW_LLM_API_KEY") {
        Ok(k) if !k.trim().is_empty() => Some(k.trim().to_string()),
        _ => match std::env::var("WHYSLOW_LLM_API_KEY_FILE") {
            Ok(f) if !f.is_empty() => Some(
                std::fs::read_to_string(&f)
                    .map_err(|e| format!("WHYSLOW_LLM_API_KEY_FILE {f}: {e}"))?
                    .trim()
                    .to_string(),
            ),
            _ => None,
        },
    };
    Ok(Endpoint {
        base: base.trim().trim_end_matches('/').to_string(),
        model,
        key,
    })
}

/// The outcome: print the body and stop (`--dry-run`), or the report with
/// `fix` or `fix_error` set, and the patch to write.
pub enum Outcome {
    /// `--dry-run`: the exact body that would be sent.
    DryRun(String),
    /// Asked (or failed to): the report carries the answer.
    Asked(Option<String>),
}

/// Asks for a fix at the endpoint the environment names; failures land in
/// `report.fix_error`, never in an error.
pub fn suggest(report: &mut Report, args: &SuggestArgs) -> Outcome {
    suggest_at(report, args, endpoint_from_env())
}

/// Asks `endpoint` for a fix (the server reads its endpoint once, at start).
pub fn suggest_at(
    report: &mut Report,
    args: &SuggestArgs,
    endpoint: Result<Endpoint, String>,
) -> Outcome {
    let roots: Vec<PathBuf> = if args.roots.is_empty() {
        vec![PathBuf::from(".")]
    } else {
        args.roots.to_vec()
    };
    let ep = endpoint;
    let model = ep.as_ref().map(|e| e.model.clone()).unwrap_or_else(|_| {
        std::env::var("WHYSLOW_LLM_MODEL").unwrap_or_else(|_| "default".into())
    });
    let code = whyslow_ingest::source::code_contexts(report, &roots);
    let opts = whyslow_fix::FixOptions {
        model: model.clone(),
        max_code_bytes: args.max_code_bytes,
        max_tokens: args.max_tokens,
    };
    let (body, code_bytes) = whyslow_fix::request(report, &code, &opts);
    let text = serde_json::to_string_pretty(&body).unwrap_or_default();
    if args.dry_run {
        return Outcome::DryRun(text);
    }
    let ep = match ep {
        Ok(e) => e,
        Err(why) => {
            report.fix_error = Some(why);
            return Outcome::Asked(None);
        }
    };
    let started = std::time::Instant::now();
    let sent = send(&ep, &text, args.timeout_s).map_err(|e| {
        if e.to_lowercase().contains("timeout") || e.to_lowercase().contains("timed out") {
            format!(
                "{e}: no answer within {:.0} s (--llm-timeout); a local CPU model writes tens of \
                 tokens a second: raise --llm-timeout or lower --llm-max-tokens ({})",
                args.timeout_s, args.max_tokens
            )
        } else {
            e
        }
    });
    let seconds = started.elapsed().as_secs_f64();
    let answer = match &sent {
        Ok(a) => Ok(a.as_str()),
        Err(e) => Err(e.clone()),
    };
    let patch = whyslow_fix::apply_answer(report, &model, code_bytes, answer, &|path: &str| {
        whyslow_ingest::source::read_source_file(&roots, path)
    });
    if let (Some(e), true) = (&report.fix_error, sent.is_ok()) {
        report.fix_error = Some(format!("{}/chat/completions: {e}", ep.base));
    }
    if let Some(f) = &mut report.fix {
        f.seconds = Some((seconds * 100.0).round() / 100.0);
    }
    Outcome::Asked(patch)
}

#[cfg(feature = "llm")]
fn send(ep: &Endpoint, body: &str, timeout_s: f64) -> Result<String, String> {
    let url = format!("{}/chat/completions", ep.base);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs_f64(timeout_s.max(0.1))))
        .http_status_as_error(false)
        .build()
        .into();
    let mut req = agent.post(&url).header("Content-Type", "application/json");
    if let Some(k) = &ep.key {
        req = req.header("Authorization", &format!("Bearer {k}"));
    }
    // Errors name the URL (no key in it) and never the request.
    let mut resp = req
        .send(body)
        .map_err(|e| format!("{url}: {}", one_line(&e.to_string())))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(8 << 20)
        .read_to_string()
        .map_err(|e| format!("{url}: reading the answer: {}", one_line(&e.to_string())))?;
    if !(200..300).contains(&status) {
        let detail = whyslow_fix::parse_answer(&text)
            .err()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        return Err(format!("{url}: HTTP {status}{detail}"));
    }
    Ok(text)
}

#[cfg(not(feature = "llm"))]
fn send(ep: &Endpoint, _: &str, _: f64) -> Result<String, String> {
    let _ = (Duration::ZERO, &ep.key);
    Err(one_line(
        "this build of whyslow has no HTTP client: use the whyslow binary, or the Python package's whyslow.suggest_fix",
    ))
}

fn one_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().to_string()
}
