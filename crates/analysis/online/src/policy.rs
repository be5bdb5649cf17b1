//! Whether a detection may start a profiling window: a cooldown after each
//! window and a cap of windows per hour.

use std::collections::VecDeque;
use std::fmt;

use crate::ConfigError;

const HOUR_NS: i64 = 3_600_000_000_000;

/// Why [`TriggerPolicy::check`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The last window started less than the cooldown ago.
    Cooldown {
        /// Time left, ns.
        remaining_ns: i64,
    },
    /// The cap of windows in the last hour is reached.
    HourlyCap {
        /// The cap.
        cap: u32,
        /// Time until the oldest window in the hour leaves it, ns.
        remaining_ns: i64,
    },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Refusal::Cooldown { remaining_ns } => {
                write!(f, "cooldown: {:.1} s left", remaining_ns as f64 / 1e9)
            }
            Refusal::HourlyCap { cap, remaining_ns } => write!(
                f,
                "{cap} profiles in the last hour: next allowed in {:.0} s",
                remaining_ns as f64 / 1e9
            ),
        }
    }
}

/// Cooldown and hourly cap on profiling windows. Times are ns on a
/// monotonic clock.
#[derive(Debug, Clone)]
pub struct TriggerPolicy {
    cooldown_ns: i64,
    max_per_hour: u32,
    starts: VecDeque<i64>,
}

impl TriggerPolicy {
    /// A policy that allows a window at most every `cooldown_ns` and at most
    /// `max_per_hour` windows in any hour. `max_per_hour` = 0 forbids
    /// automatic windows altogether.
    pub fn new(cooldown_ns: i64, max_per_hour: u32) -> Result<Self, ConfigError> {
        if cooldown_ns < 0 {
            return Err(ConfigError::OutOfRange {
                name: "cooldown",
                range: "≥ 0",
                value: cooldown_ns as f64,
            });
        }
        Ok(TriggerPolicy {
            cooldown_ns,
            max_per_hour,
            starts: VecDeque::new(),
        })
    }

    /// Cooldown, ns.
    pub fn cooldown_ns(&self) -> i64 {
        self.cooldown_ns
    }

    /// Cap per hour.
    pub fn max_per_hour(&self) -> u32 {
        self.max_per_hour
    }

    /// Windows started within the hour before `now_ns`.
    pub fn in_last_hour(&self, now_ns: i64) -> usize {
        self.starts
            .iter()
            .filter(|&&t| now_ns - t < HOUR_NS)
            .count()
    }

    /// Whether a window may start at `now_ns`.
    pub fn check(&self, now_ns: i64) -> Result<(), Refusal> {
        if let Some(&last) = self.starts.back() {
            let since = now_ns - last;
            if since < self.cooldown_ns {
                return Err(Refusal::Cooldown {
                    remaining_ns: self.cooldown_ns - since,
                });
            }
        }
        let recent: Vec<i64> = self
            .starts
            .iter()
            .copied()
            .filter(|&t| now_ns - t < HOUR_NS)
            .collect();
        if recent.len() >= self.max_per_hour as usize {
            let remaining_ns = recent
                .first()
                .map(|&t| HOUR_NS - (now_ns - t))
                .unwrap_or(HOUR_NS);
            return Err(Refusal::HourlyCap {
                cap: self.max_per_hour,
                remaining_ns,
            });
        }
        Ok(())
    }

    /// Notes that a window started at `now_ns` (whoever asked for it).
    pub fn record(&mut self, now_ns: i64) {
        while let Some(&t) = self.starts.front() {
            if now_ns - t >= HOUR_NS {
                self.starts.pop_front();
            } else {
                break;
            }
        }
        self.starts.push_back(now_ns);
    }

    /// [`TriggerPolicy::check`], and [`TriggerPolicy::record`] when allowed.
    pub fn try_acquire(&mut self, now_ns: i64) -> Result<(), Refusal> {
        self.check(now_ns)?;
        self.record(now_ns);
        Ok(())
    }
}
