//! The agent's events, typed (vector's internal events, on `tracing`): each
//! is logged and counted in one place, [`AgentEvent::emit`]. With
//! `--log-format json` every event is one JSON line on stderr whose
//! `fields.event` names it, which tests and supervisors wait on.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::{error, info, warn};

/// Something the agent did or ran into.
#[derive(Debug)]
pub(crate) enum AgentEvent<'a> {
    /// Serving `dir`.
    Watching { dir: &'a Path, pause_file: &'a Path },
    /// A file left by an earlier agent was removed at startup.
    StaleRemoved { name: String },
    /// A rank's request could not be served (its error file, written
    /// before this event, says why).
    RequestFailed { rank: u32, reason: &'a str },
    /// The rank's error file itself could not be written.
    ErrorFileFailed { rank: u32, error: String },
    /// A sampling window began.
    WindowStarted {
        rank: u32,
        pid: i32,
        tid: i32,
        rate_hz: f64,
        request: Option<&'a str>,
    },
    /// A window's samples and done marker were written.
    WindowDone {
        rank: u32,
        ticks: u64,
        achieved_hz: f64,
        reason: &'a str,
    },
    /// A pause/resume hook ran and succeeded.
    HookRan { hook: &'a str, seconds: f64 },
    /// A pause/resume hook did not succeed.
    HookFailed { hook: &'a str, problem: String },
    /// The pause file could not be written or removed.
    PauseFileFailed { problem: String },
    /// The agent stops (SIGINT/SIGTERM/SIGHUP, or an error).
    Stopped,
    /// Always-on profiling of a registered process began.
    ProfileStarted {
        pid: i32,
        rank: Option<u32>,
        job: &'a str,
    },
    /// One period's profile was written to the spool.
    ProfileWritten {
        pid: i32,
        rank: Option<u32>,
        samples: u64,
        path: &'a Path,
    },
    /// A registered process could not be profiled (the reason says why).
    ProfileFailed { pid: i32, reason: String },
    /// A collector failed unexpectedly (a bug: it panicked); it stops, the
    /// rest of the agent goes on.
    CollectorFailed {
        collector: &'static str,
        reason: String,
    },
    /// gloo's collectives of a registered process are traced.
    CollectivesTraced {
        pid: i32,
        rank: Option<u32>,
        functions: usize,
        library: &'a Path,
    },
    /// Collectives are not traced (for one process, or at all with pid 0).
    CollectivesFailed { pid: i32, reason: String },
    /// Profiles of the spool reached `whyslow server` (new ones and retries
    /// it had already stored).
    Uploaded {
        server: &'a str,
        profiles: usize,
        duplicates: usize,
    },
    /// The server could not be reached or refused (logged once per outage;
    /// the spool keeps the profiles and they go when it is back).
    UploadFailed { server: &'a str, reason: String },
    /// The agent's own CPU or memory crossed its cap (`what`), or came back
    /// under it; `action` is what the profilers do now.
    Capped {
        what: &'static str,
        value: f64,
        cap: f64,
        action: &'static str,
    },
    /// Symbol files of the profiled modules went to `whyslow server`
    /// (`--upload-symbols`), or were not sent (`skipped` says why).
    SymbolsUploaded {
        server: &'a str,
        sent: &'a [(String, std::path::PathBuf)],
        had: usize,
        skipped: &'a [String],
    },
}

const KINDS: usize = 20;
static COUNTS: [AtomicU64; KINDS] = [const { AtomicU64::new(0) }; KINDS];

impl AgentEvent<'_> {
    /// The event's name (`fields.event` in JSON logs).
    pub(crate) fn name(&self) -> &'static str {
        NAMES[self.index()]
    }

    fn index(&self) -> usize {
        match self {
            AgentEvent::Watching { .. } => 0,
            AgentEvent::StaleRemoved { .. } => 1,
            AgentEvent::RequestFailed { .. } => 2,
            AgentEvent::ErrorFileFailed { .. } => 3,
            AgentEvent::WindowStarted { .. } => 4,
            AgentEvent::WindowDone { .. } => 5,
            AgentEvent::HookFailed { .. } => 6,
            AgentEvent::PauseFileFailed { .. } => 7,
            AgentEvent::Stopped => 8,
            AgentEvent::ProfileStarted { .. } => 9,
            AgentEvent::ProfileWritten { .. } => 10,
            AgentEvent::ProfileFailed { .. } => 11,
            AgentEvent::HookRan { .. } => 12,
            AgentEvent::CollectivesTraced { .. } => 13,
            AgentEvent::CollectivesFailed { .. } => 14,
            AgentEvent::Uploaded { .. } => 15,
            AgentEvent::UploadFailed { .. } => 16,
            AgentEvent::Capped { .. } => 17,
            AgentEvent::SymbolsUploaded { .. } => 18,
            AgentEvent::CollectorFailed { .. } => 19,
        }
    }

    /// Counts the event and logs it (one line, with its fields).
    pub(crate) fn emit(self) {
        COUNTS[self.index()].fetch_add(1, Ordering::Relaxed);
        let event = self.name();
        match self {
            e @ (AgentEvent::CollectivesFailed { .. }
            | AgentEvent::CollectivesTraced { .. }
            | AgentEvent::CollectorFailed { .. }
            | AgentEvent::ProfileFailed { .. }
            | AgentEvent::ProfileStarted { .. }
            | AgentEvent::ProfileWritten { .. }) => e.log_profile(event),
            e @ (AgentEvent::Capped { .. }
            | AgentEvent::SymbolsUploaded { .. }
            | AgentEvent::UploadFailed { .. }
            | AgentEvent::Uploaded { .. }) => e.log_service(event),
            e => e.log_window(event),
        }
    }

    /// Sampling windows, hooks, the pause file and the agent's start and stop.
    fn log_window(self, event: &'static str) {
        match self {
            AgentEvent::Watching { dir, pause_file } => info!(
                event,
                dir = %dir.display(),
                pause_file = %pause_file.display(),
                "watching {} (pause file {})",
                dir.display(),
                pause_file.display()
            ),
            AgentEvent::StaleRemoved { name } => {
                info!(event, name = %name, "removing stale {name}")
            }
            AgentEvent::RequestFailed { rank, reason } => {
                warn!(event, rank, reason, "rank {rank}: {reason}")
            }
            AgentEvent::ErrorFileFailed { rank, error } => error!(
                event,
                rank,
                error = %error,
                "rank {rank}: cannot write its error file: {error}"
            ),
            AgentEvent::WindowStarted {
                rank,
                pid,
                tid,
                rate_hz,
                request,
            } => info!(
                event,
                rank,
                pid,
                tid,
                rate_hz,
                request = request.unwrap_or(""),
                "rank {rank}: sampling pid {pid} (tid {tid}) at {rate_hz} Hz{}",
                request
                    .map(|i| format!(", request {i}"))
                    .unwrap_or_default()
            ),
            AgentEvent::WindowDone {
                rank,
                ticks,
                achieved_hz,
                reason,
            } => info!(
                event,
                rank,
                ticks,
                achieved_hz,
                reason,
                "rank {rank}: {ticks} ticks at {achieved_hz:.0} Hz ({reason})"
            ),
            AgentEvent::HookRan { hook, seconds } => {
                info!(event, hook, seconds, "{hook} hook ran ({seconds:.2} s)")
            }
            AgentEvent::HookFailed { hook, problem } => {
                warn!(event, hook, problem = %problem, "{hook} hook: {problem}")
            }
            AgentEvent::PauseFileFailed { problem } => {
                warn!(event, problem = %problem, "pause file: {problem}")
            }
            AgentEvent::Stopped => {
                let c = counts();
                info!(
                    event,
                    windows = c[5],
                    failed = c[2],
                    "stopped after {} window(s), {} failed request(s)",
                    c[5],
                    c[2]
                )
            }
            _ => {}
        }
    }

    /// Profiles and collective tracing of ranks, and a collector's failure.
    fn log_profile(self, event: &'static str) {
        match self {
            AgentEvent::ProfileStarted { pid, rank, job } => info!(
                event,
                pid,
                rank = rank.map(i64::from).unwrap_or(-1),
                job,
                "profiling pid {pid} (rank {}, job {job:?})",
                rank.map(|r| r.to_string()).unwrap_or_else(|| "?".into())
            ),
            AgentEvent::ProfileWritten {
                pid,
                rank,
                samples,
                path,
            } => info!(
                event,
                pid,
                rank = rank.map(i64::from).unwrap_or(-1),
                samples,
                path = %path.display(),
                "pid {pid}: {samples} samples -> {}",
                path.display()
            ),
            AgentEvent::ProfileFailed { pid, reason } => {
                warn!(event, pid, reason = %reason, "pid {pid}: not profiled: {reason}")
            }
            AgentEvent::CollectorFailed { collector, reason } => error!(
                event,
                collector,
                reason = %reason,
                "{collector}: stopped after an internal error (the rest goes on): {reason}"
            ),
            AgentEvent::CollectivesTraced {
                pid,
                rank,
                functions,
                library,
            } => info!(
                event,
                pid,
                rank = rank.map(i64::from).unwrap_or(-1),
                functions,
                library = %library.display(),
                "pid {pid}: tracing {functions} collective functions in {}",
                library.display()
            ),
            AgentEvent::CollectivesFailed { pid, reason } => {
                warn!(event, pid, reason = %reason, "pid {pid}: collectives not traced: {reason}")
            }
            _ => {}
        }
    }

    /// Uploads to the server, symbols, and the agent's own caps.
    fn log_service(self, event: &'static str) {
        match self {
            AgentEvent::Uploaded {
                server,
                profiles,
                duplicates,
            } => info!(
                event,
                server,
                profiles,
                duplicates,
                "uploaded {profiles} profile(s) to {server} ({duplicates} it already had)"
            ),
            AgentEvent::UploadFailed { server, reason } => warn!(
                event,
                server,
                reason = %reason,
                "cannot upload to {server}: {reason} (profiles stay in the spool and go when it answers)"
            ),
            AgentEvent::Capped {
                what,
                value,
                cap,
                action,
            } => warn!(
                event,
                what,
                value,
                cap,
                action,
                "the agent's own {what} is {value:.1} (cap {cap}): {action}"
            ),
            AgentEvent::SymbolsUploaded {
                server,
                sent,
                had,
                skipped,
            } => {
                let files: Vec<String> = sent
                    .iter()
                    .map(|(id, f)| format!("{id} from {}", f.display()))
                    .collect();
                info!(
                    event,
                    server,
                    sent = sent.len(),
                    had,
                    skipped = skipped.len(),
                    "symbols to {server}: sent {} ({}), {had} it had, {} not sent ({})",
                    sent.len(),
                    files.join(", "),
                    skipped.len(),
                    skipped.join("; ")
                )
            }
            _ => {}
        }
    }
}

const NAMES: [&str; KINDS] = [
    "watching",
    "stale_removed",
    "request_failed",
    "error_file_failed",
    "window_started",
    "window_done",
    "hook_failed",
    "pause_file_failed",
    "stopped",
    "profile_started",
    "profile_written",
    "profile_failed",
    "hook_ran",
    "collectives_traced",
    "collectives_failed",
    "uploaded",
    "upload_failed",
    "capped",
    "symbols_uploaded",
    "collector_failed",
];

/// How many of each event so far, in [`AgentEvent`] order.
pub(crate) fn counts() -> [u64; KINDS] {
    std::array::from_fn(|i| COUNTS[i].load(Ordering::Relaxed))
}

/// Sends the agent's events to stderr: `text` (one line each, for people)
/// or `json` (one object each, for programs).
pub(crate) fn init_logging(json: bool) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(false);
    // A second init (tests in one process) keeps the first subscriber.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_is_counted_under_its_own_name() {
        let before = counts();
        AgentEvent::StaleRemoved { name: "x".into() }.emit();
        AgentEvent::Stopped.emit();
        let after = counts();
        assert_eq!(after[1] - before[1], 1);
        assert_eq!(after[8] - before[8], 1);
        assert_eq!(AgentEvent::Stopped.name(), "stopped");
        let mut names = NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KINDS);
    }
}
