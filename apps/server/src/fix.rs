//! The session page's "ask a model for a fix" (EROICA's first step, a
//! server-side setting): off unless the server was started with one. The
//! request, the call and the patch check are `whyslow_pipeline::suggest`'s,
//! the same as `whyslow analyze --suggest-fix`; this module keeps the
//! setting and the latest answer per session, so a page reload shows it
//! without asking again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;

use whyslow_model::fix::Fix;
use whyslow_model::Report;
use whyslow_pipeline::suggest::{self, Endpoint, Outcome, SuggestArgs};

use crate::TenantId;

/// Sessions whose answers are kept at most (the oldest half goes first).
const MAX_ANSWERS: usize = 4096;

/// A session's latest answer: the fix, or the one line why there is none.
type Answer = (Option<Fix>, Option<String>);

/// (tenant, job, session) -> (when it was asked, on a counter; the answer).
type Answers = HashMap<(i64, String, String), (u64, Answer)>;

/// The server's setting for fix proposals.
pub struct FixSetting {
    /// Where to ask (read once, at start; the key never leaves it but in the
    /// `Authorization` header).
    pub endpoint: Endpoint,
    /// The job's code, where the operator gave the server a checkout
    /// (`--source-root`); without it only the findings are sent.
    pub source_roots: Vec<PathBuf>,
    /// Seconds for one exchange.
    pub timeout_s: f64,
    /// Bytes of code sent at most.
    pub max_code_bytes: usize,
    answers: Mutex<(u64, Answers)>,
}

impl FixSetting {
    /// A setting that asks `endpoint`.
    pub fn new(
        endpoint: Endpoint,
        source_roots: Vec<PathBuf>,
        timeout_s: f64,
        max_code_bytes: usize,
    ) -> Self {
        FixSetting {
            endpoint,
            source_roots,
            timeout_s,
            max_code_bytes,
            answers: Mutex::new((0, HashMap::new())),
        }
    }

    /// Asks for a fix for `report` (a session's), keeps the answer and
    /// returns the report with `fix` or `fix_error` set.
    pub fn ask(&self, t: TenantId, job: &str, session: &str, mut report: Report) -> Report {
        let args = SuggestArgs {
            dry_run: false,
            timeout_s: self.timeout_s,
            roots: &self.source_roots,
            max_code_bytes: self.max_code_bytes,
            max_tokens: suggest::DEFAULT_MAX_TOKENS,
        };
        // Not a dry run: the outcome is always `Asked`; the patch is in
        // `report.fix`.
        let _: Outcome = suggest::suggest_at(&mut report, &args, Ok(self.endpoint.clone()));
        let answer = (report.fix.clone(), report.fix_error.clone());
        if let Ok(mut guard) = self.answers.lock() {
            let (clock, map) = &mut *guard;
            *clock += 1;
            if map.len() >= MAX_ANSWERS {
                let mut ages: Vec<u64> = map.values().map(|(at, _)| *at).collect();
                ages.sort_unstable();
                let cut = ages[ages.len() / 2];
                map.retain(|_, (at, _)| *at > cut);
            }
            map.insert(
                (t.0, job.to_string(), session.to_string()),
                (*clock, answer),
            );
        }
        report
    }

    /// Puts the session's latest answer, if any, into `report`.
    pub fn recall(&self, t: TenantId, job: &str, session: &str, report: &mut Report) {
        let Ok(guard) = self.answers.lock() else {
            return;
        };
        if let Some((_, (fix, error))) = guard.1.get(&(t.0, job.to_string(), session.to_string())) {
            report.fix = fix.clone();
            report.fix_error = error.clone();
        }
    }
}
