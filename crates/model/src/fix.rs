//! EROICA's first step, "try an AI auto-fix": the code a proposal may
//! change and the proposal a model returned (`whyslow analyze|localize
//! --suggest-fix`, the online package's `WHYSLOW_SUGGEST_FIX=1`). A model's
//! proposal, never applied to the user's files: `fix.applies` says whether
//! `git apply` would take it, and `fix.verified` (with `--verify-fix`)
//! whether the user's command ran faster on a patched scratch copy.

use serde::{Deserialize, Serialize};

/// The code around one finding: its enclosing function in the user's file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CodeContext {
    /// The finding's index in the report.
    pub finding: usize,
    /// The file, relative to the source root it was found under (the path
    /// a patch names), else as the trace named it.
    pub path: String,
    /// The first line of `text`, 1-based.
    pub start_line: u32,
    /// The line the trace points at, 1-based.
    pub line: u32,
    /// The enclosing function's lines.
    pub text: String,
}

/// A model's proposal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fix {
    /// The model asked.
    pub model: String,
    /// Its explanation.
    pub text: String,
    /// The unified diff it proposed, when it proposed one.
    pub patch: Option<String>,
    /// Whether the patch applies to the files under the source root
    /// (unchanged by whyslow); `None` without a patch.
    pub applies: Option<bool>,
    /// The first reason it does not apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applies_error: Option<String>,
    /// Bytes of the user's code that left the machine in the request.
    #[serde(default)]
    pub code_bytes: usize,
    /// Tokens the endpoint counted (its `usage`), when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<FixUsage>,
    /// Seconds the exchange took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
    /// The answer was cut at the bound on its length (`finish_reason`
    /// `length`): the text or the diff may be incomplete.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The rerun that checks the patch (`--verify-fix -- CMD…`), when asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<FixVerification>,
}

/// What a rerun of the user's command said of a patch: the command run
/// `runs` times on a scratch copy of the source root as it is and `runs`
/// times on one with the patch applied, alternating.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FixVerification {
    /// The verdict; only [`VerifyStatus::Faster`] makes the patch a fix.
    pub status: VerifyStatus,
    /// Whether the patched runs were faster (status `faster`).
    pub faster: bool,
    /// Median time before over median time after (> 1: faster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<f64>,
    /// One-sided Mann–Whitney U p-value that the runs before took longer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p_value: Option<f64>,
    /// Runs on each side that completed.
    pub runs: usize,
    /// Seconds of each run before the patch.
    #[serde(default)]
    pub before_s: Vec<f64>,
    /// Seconds of each run after it.
    #[serde(default)]
    pub after_s: Vec<f64>,
    /// Why it is not a fix, in one line (a hunk that does not apply, a run
    /// that failed and its last output line).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The verdict of a rerun.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VerifyStatus {
    /// Faster after the patch: speed-up > 1 at p < 0.05.
    Faster,
    /// Ran, and not (significantly) faster.
    NotFaster,
    /// The model proposed no change.
    NoPatch,
    /// The patch does not apply to the source root.
    DoesNotApply,
    /// The command failed (before or after the patch) or could not start.
    RunFailed,
}

/// Token counts of one exchange, as the endpoint reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixUsage {
    /// Tokens of the request.
    pub prompt_tokens: u64,
    /// Tokens of the answer.
    pub completion_tokens: u64,
}
