//! Online detection of training iterations and of performance degradation,
//! as PerfTracker §4.1 specifies, plus the policy that decides whether a
//! detection may start a profiling window.
//!
//! The training process feeds two kinds of [`Event`]s, with timestamps:
//! [`Event::Next`] when the DataLoader iterator's `__next__` is called and
//! [`Event::Step`] after each `optimizer.step()`. The [`Detector`]:
//!
//! 1. **Iteration detection.** Finds the *training iteration sequence*: after
//!    M (= 10) identical consecutive sequences that start with `next` and end
//!    with `step`, that sequence is the iteration (§4.1 "Iteration detection").
//! 2. **Degradation detection.** Matches incoming events against the sequence;
//!    each complete match records one iteration duration, from its first `next`
//!    to its last `step` (§4.1 "Indicators of iteration time"). It reports
//!    [`Degradation::Slowdown`] when the mean of the last N (= 50) iterations
//!    exceeds the recent shortest by more than 5 %, and [`Degradation::Blocked`]
//!    when the time since the last event is at least 5 × the mean iteration.
//! 3. **Re-detection.** After K (= 200) consecutive events without a complete
//!    match it goes back to iteration detection.
//!
//! Every event costs O(1) amortized time and no allocation once the
//! iteration sequence is known; see [`Detector::on_event`].
//!
//! [`TriggerPolicy`] adds what the paper leaves to deployment: a cooldown
//! between profiling windows and a cap of windows per hour, so that a lasting
//! slowdown is not profiled in a loop.
#![deny(missing_docs)]

mod detector;
mod onset;
mod policy;

pub use detector::{Baseline, Degradation, Detector, DetectorConfig, Event, Iteration, Phase};
pub use onset::{find_onset, iteration_times, OnsetConfig, Split, MAX_SERIES};
pub use policy::{Refusal, TriggerPolicy};

/// A configuration value that the detector or the policy cannot work with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A count that must be at least 1 (or 2) is not.
    #[error("{name} must be at least {min}, got {value}")]
    TooSmall {
        /// The parameter.
        name: &'static str,
        /// The smallest accepted value.
        min: usize,
        /// The value given.
        value: usize,
    },
    /// A factor that must be a finite number in a range is not.
    #[error("{name} must be a finite number {range}, got {value}")]
    OutOfRange {
        /// The parameter.
        name: &'static str,
        /// The accepted range, in words.
        range: &'static str,
        /// The value given.
        value: f64,
    },
    /// A baseline name that is not one of the known ones.
    #[error("unknown baseline {0:?}: expected rolling_mean or shortest_iteration")]
    UnknownBaseline(String),
}
