//! The iteration and degradation detector of PerfTracker §4.1.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;

use crate::ConfigError;

/// One observed call in the training loop (PerfTracker §4.1 "Indicators of
/// iteration time").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// `data_loader.next()`: the DataLoader iterator's `__next__` was called.
    Next,
    /// `optimizer.step()` returned.
    Step,
}

impl Event {
    /// `"next"` or `"step"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Next => "next",
            Event::Step => "step",
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What "the recent shortest iteration time" of §4.1 is compared against.
///
/// The paper says: degradation when "the average duration of the recent N
/// iterations exceeds the recent shortest iteration time by more than 5%".
/// Read literally (the single fastest iteration), any job whose iterations
/// jitter by more than 5 % around their mean would be "degraded" all the time:
/// the mean of 50 noisy iterations is always more than 5 % above the fastest
/// one. The default therefore takes the shortest *N-iteration mean* seen over
/// the recent window, which is the same quantity as the one it is compared
/// with and so is insensitive to jitter; the literal reading is kept as an
/// option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Baseline {
    /// The minimum, over the last `recent` iterations, of the mean of N
    /// consecutive iterations (the default).
    #[default]
    RollingMean,
    /// The minimum single iteration duration over the last `recent`
    /// iterations (the literal reading of §4.1).
    ShortestIteration,
}

impl Baseline {
    /// `"rolling_mean"` or `"shortest_iteration"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Baseline::RollingMean => "rolling_mean",
            Baseline::ShortestIteration => "shortest_iteration",
        }
    }
}

impl FromStr for Baseline {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "rolling_mean" => Ok(Baseline::RollingMean),
            "shortest_iteration" => Ok(Baseline::ShortestIteration),
            other => Err(ConfigError::UnknownBaseline(other.to_string())),
        }
    }
}

/// Parameters of the detector. [`Default`] gives the paper's values.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectorConfig {
    /// M: identical consecutive sequences that define the iteration (10).
    pub m: usize,
    /// N: iterations averaged for the slowdown test (50).
    pub n: usize,
    /// Relative excess over the recent shortest that counts as a slowdown (0.05).
    pub threshold: f64,
    /// Blocked when the time since the last event is ≥ this × the mean
    /// iteration (5.0).
    pub block_factor: f64,
    /// Never report a stall shorter than this, ns (default 0: the paper's
    /// rule alone). A deployment guard for jobs with very short iterations,
    /// where 5 × the mean is within OS scheduling noise.
    pub block_min_ns: i64,
    /// K: consecutive events without a complete match after which iteration
    /// detection starts over (200).
    pub k: usize,
    /// "Recent", in iterations: the shortest is taken over the last `recent`
    /// iterations (a sliding window). Default 10 × N = 500. A slowdown that
    /// lasts longer than this becomes the new normal.
    pub recent: usize,
    /// What the mean is compared with; see [`Baseline`].
    pub baseline: Baseline,
    /// Longest iteration sequence looked for, in `next…step` units (a unit is
    /// one or more `next` followed by one or more `step`). Default 8.
    pub max_units: usize,
    /// Longest unit, in events; longer runs of one event kind are not
    /// iteration candidates (default 256).
    pub max_unit_events: usize,
}

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            m: 10,
            n: 50,
            threshold: 0.05,
            block_factor: 5.0,
            block_min_ns: 0,
            k: 200,
            recent: 500,
            baseline: Baseline::RollingMean,
            max_units: 8,
            max_unit_events: 256,
        }
    }
}

impl DetectorConfig {
    /// Checks that every value is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let min = |name: &'static str, value: usize, min: usize| {
            if value < min {
                Err(ConfigError::TooSmall { name, min, value })
            } else {
                Ok(())
            }
        };
        min("m", self.m, 2)?;
        min("n", self.n, 1)?;
        min("k", self.k, 1)?;
        min("recent", self.recent, self.n.max(1))?;
        min("max_units", self.max_units, 1)?;
        min("max_unit_events", self.max_unit_events, 2)?;
        if !(self.threshold.is_finite() && self.threshold >= 0.0) {
            return Err(ConfigError::OutOfRange {
                name: "threshold",
                range: "≥ 0",
                value: self.threshold,
            });
        }
        if !(self.block_factor.is_finite() && self.block_factor > 0.0) {
            return Err(ConfigError::OutOfRange {
                name: "block_factor",
                range: "> 0",
                value: self.block_factor,
            });
        }
        Ok(())
    }
}

/// Which phase of §4.1 (Figure 8) the detector is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Looking for M identical sequences.
    Detecting,
    /// Matching events against the known iteration sequence.
    Monitoring,
}

/// A degradation, as §4.1 defines the two situations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Degradation {
    /// Situation (1): the mean of the last N iterations exceeds the recent
    /// shortest by more than the threshold.
    Slowdown {
        /// Mean of the last N iterations, ns.
        mean_ns: f64,
        /// The recent shortest (see [`Baseline`]), ns.
        baseline_ns: f64,
    },
    /// Situation (2): no event for at least `block_factor` × the mean iteration.
    Blocked {
        /// Time since the last event, ns.
        idle_ns: i64,
        /// Mean iteration duration it was compared with, ns.
        mean_ns: f64,
    },
}

impl Degradation {
    /// Slowdown: mean / baseline; blocked: idle / mean.
    pub fn ratio(&self) -> f64 {
        match *self {
            Degradation::Slowdown {
                mean_ns,
                baseline_ns,
            } => {
                if baseline_ns > 0.0 {
                    mean_ns / baseline_ns
                } else {
                    f64::INFINITY
                }
            }
            Degradation::Blocked { idle_ns, mean_ns } => {
                if mean_ns > 0.0 {
                    idle_ns as f64 / mean_ns
                } else {
                    f64::INFINITY
                }
            }
        }
    }
}

/// One matched training iteration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Iteration {
    /// 0-based count of iterations matched since the detector was created.
    pub index: u64,
    /// From its first `next` to its last `step`, ns.
    pub duration_ns: i64,
    /// Set when, with this iteration, the mean of the last N exceeds the
    /// recent shortest by more than the threshold. The detector is
    /// level-triggered: this is set on every iteration while the condition
    /// holds; [`crate::TriggerPolicy`] decides what to do with it.
    pub slowdown: Option<Degradation>,
}

/// A `next…step` unit: `nexts` × next followed by `steps` × step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Unit {
    nexts: u32,
    steps: u32,
}

/// Sliding-window minimum over (index, value) pairs: a monotonic deque,
/// amortized O(1) per push.
#[derive(Debug, Clone, Default)]
struct WindowMin {
    q: VecDeque<(u64, f64)>,
}

impl WindowMin {
    fn push(&mut self, index: u64, value: f64, window: usize) {
        while let Some(&(_, v)) = self.q.back() {
            if v >= value {
                self.q.pop_back();
            } else {
                break;
            }
        }
        self.q.push_back((index, value));
        let oldest = index.saturating_sub(window as u64 - 1);
        while let Some(&(i, _)) = self.q.front() {
            if i < oldest {
                self.q.pop_front();
            } else {
                break;
            }
        }
    }

    fn min(&self) -> Option<f64> {
        self.q.front().map(|&(_, v)| v)
    }

    fn clear(&mut self) {
        self.q.clear();
    }
}

/// The iteration and degradation detector (PerfTracker §4.1, Figure 8).
///
/// Feed it every `next` and `step` with [`Detector::on_event`], and call
/// [`Detector::check_blocked`] from time to time (for example once a second
/// from a watchdog thread), since a blocked job sends no events.
#[derive(Debug, Clone)]
pub struct Detector {
    cfg: DetectorConfig,
    phase: Phase,
    paused: bool,
    events: u64,
    last_event_ns: Option<i64>,

    // --- iteration detection ---
    /// The unit being built, if any.
    cur: Option<Unit>,
    /// Whether the unit being built grew beyond `max_unit_events`.
    cur_invalid: bool,
    /// The last `m * max_units` finished units (None = invalid unit).
    units: VecDeque<Option<Unit>>,

    // --- monitoring ---
    pattern: Vec<Event>,
    /// KMP failure function of `pattern`.
    fail: Vec<usize>,
    /// Length of the currently matched prefix of `pattern`.
    pos: usize,
    /// Timestamps of the last `pattern.len()` events (ring).
    ts: Vec<i64>,
    /// Events since the last complete match (or since monitoring started).
    since_match: usize,
    blocked_latched: bool,

    // --- iteration statistics ---
    iterations: u64,
    last: VecDeque<i64>,
    last_sum: i128,
    last_duration_ns: Option<i64>,
    baseline: WindowMin,
    redetections: u64,
}

impl Detector {
    /// A detector with `cfg`, checked with [`DetectorConfig::validate`].
    pub fn new(cfg: DetectorConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let units = VecDeque::with_capacity(cfg.m * cfg.max_units + 1);
        let last = VecDeque::with_capacity(cfg.n + 1);
        Ok(Detector {
            cfg,
            phase: Phase::Detecting,
            paused: false,
            events: 0,
            last_event_ns: None,
            cur: None,
            cur_invalid: false,
            units,
            pattern: Vec::new(),
            fail: Vec::new(),
            pos: 0,
            ts: Vec::new(),
            since_match: 0,
            blocked_latched: false,
            iterations: 0,
            last,
            last_sum: 0,
            last_duration_ns: None,
            baseline: WindowMin::default(),
            redetections: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DetectorConfig {
        &self.cfg
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The training iteration sequence, once detected.
    pub fn pattern(&self) -> Option<&[Event]> {
        match self.phase {
            Phase::Monitoring => Some(&self.pattern),
            Phase::Detecting => None,
        }
    }

    /// Iterations matched so far.
    pub fn iterations(&self) -> u64 {
        self.iterations
    }

    /// Events received so far (paused ones excluded).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// How many times the detector went back from monitoring to detection.
    pub fn redetections(&self) -> u64 {
        self.redetections
    }

    /// Duration of the last matched iteration, ns.
    pub fn last_duration_ns(&self) -> Option<i64> {
        self.last_duration_ns
    }

    /// Mean of the last (up to) N iterations, ns.
    pub fn mean_ns(&self) -> Option<f64> {
        if self.last.is_empty() {
            None
        } else {
            Some(self.last_sum as f64 / self.last.len() as f64)
        }
    }

    /// The recent shortest the mean is compared with, ns (None until N
    /// iterations were matched for [`Baseline::RollingMean`]).
    pub fn baseline_ns(&self) -> Option<f64> {
        self.baseline.min()
    }

    /// Whether events are being ignored (see [`Detector::pause`]).
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Ignore events from now on, for instance while a profiling window
    /// slows the job on purpose.
    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// Take events again from `now_ns` on. The partial match in progress is
    /// dropped and the blocked clock restarts at `now_ns`; the iteration
    /// statistics and the recent shortest are kept.
    pub fn resume(&mut self, now_ns: i64) {
        self.paused = false;
        self.pos = 0;
        self.since_match = 0;
        self.cur = None;
        self.cur_invalid = false;
        self.last_event_ns = Some(now_ns);
        self.blocked_latched = false;
    }

    /// Forget everything: back to iteration detection with no statistics.
    pub fn reset(&mut self) {
        let cfg = self.cfg.clone();
        let redetections = self.redetections;
        *self = Detector::new(cfg).expect("config was validated");
        self.redetections = redetections;
    }

    /// Feeds one event at `t_ns` (a monotonic clock, ns). Returns the
    /// iteration that this event completed, if it completed one.
    ///
    /// Cost: O(1) amortized. In monitoring, one KMP transition and, on a
    /// completed iteration, a ring-buffer update and a monotonic-deque push.
    /// In detection, on each finished `next…step` unit, at most
    /// `m × max_units²` comparisons (a constant).
    pub fn on_event(&mut self, event: Event, t_ns: i64) -> Option<Iteration> {
        if self.paused {
            return None;
        }
        self.events += 1;
        self.last_event_ns = Some(t_ns);
        self.blocked_latched = false;
        match self.phase {
            Phase::Detecting => {
                self.detect(event, t_ns);
                None
            }
            Phase::Monitoring => self.monitor(event, t_ns),
        }
    }

    /// Situation (2) of §4.1: `Some(Blocked)` when the iteration sequence is
    /// known, at least one iteration was matched, and `now_ns` is at least
    /// `block_factor` × the mean iteration (and at least `block_min_ns`)
    /// after the last event. Reported
    /// once per stall: the next event re-arms it.
    pub fn check_blocked(&mut self, now_ns: i64) -> Option<Degradation> {
        if self.paused || self.phase != Phase::Monitoring || self.blocked_latched {
            return None;
        }
        let mean = self.mean_ns()?;
        let last = self.last_event_ns?;
        let idle = now_ns - last;
        if idle as f64 >= self.cfg.block_factor * mean && idle >= self.cfg.block_min_ns {
            self.blocked_latched = true;
            Some(Degradation::Blocked {
                idle_ns: idle,
                mean_ns: mean,
            })
        } else {
            None
        }
    }

    // ----- iteration detection -----

    fn detect(&mut self, event: Event, t_ns: i64) {
        match event {
            Event::Next => {
                if let Some(u) = self.cur {
                    if u.steps > 0 {
                        // A step→next boundary closes the unit.
                        let closed = if self.cur_invalid { None } else { Some(u) };
                        self.push_unit(closed);
                        self.cur = Some(Unit { nexts: 1, steps: 0 });
                        self.cur_invalid = false;
                        if let Some(p) = self.find_period() {
                            self.start_monitoring(p, t_ns);
                        }
                        return;
                    }
                    self.grow(|u| u.nexts += 1);
                } else {
                    self.cur = Some(Unit { nexts: 1, steps: 0 });
                    self.cur_invalid = false;
                }
            }
            Event::Step => {
                // A step before any next belongs to no sequence.
                if self.cur.is_some() {
                    self.grow(|u| u.steps += 1);
                }
            }
        }
    }

    fn grow(&mut self, f: impl FnOnce(&mut Unit)) {
        if let Some(u) = self.cur.as_mut() {
            f(u);
            if (u.nexts + u.steps) as usize > self.cfg.max_unit_events {
                self.cur_invalid = true;
                // Saturate so the counters cannot overflow.
                u.nexts = u.nexts.min(self.cfg.max_unit_events as u32);
                u.steps = u.steps.min(self.cfg.max_unit_events as u32);
            }
        }
    }

    fn push_unit(&mut self, u: Option<Unit>) {
        if self.units.len() == self.cfg.m * self.cfg.max_units {
            self.units.pop_front();
        }
        self.units.push_back(u);
    }

    /// The smallest p (in units) such that the last M·p units are M repeats
    /// of the same p units, all valid.
    fn find_period(&self) -> Option<usize> {
        let len = self.units.len();
        'p: for p in 1..=self.cfg.max_units {
            let need = self.cfg.m * p;
            if need > len {
                return None;
            }
            let base = len - need;
            for i in 0..need {
                let u = self.units[base + i]?;
                if i >= p && Some(u) != self.units[base + i - p] {
                    continue 'p;
                }
            }
            // Periods are tried shortest first, so `p` is primitive.
            return Some(p);
        }
        None
    }

    fn start_monitoring(&mut self, p: usize, t_ns: i64) {
        let len = self.units.len();
        let mut pattern = Vec::new();
        for u in self.units.range(len - p..).flatten() {
            pattern.resize(pattern.len() + u.nexts as usize, Event::Next);
            pattern.resize(pattern.len() + u.steps as usize, Event::Step);
        }
        self.fail = kmp_failure(&pattern);
        self.ts = vec![0; pattern.len()];
        self.pattern = pattern;
        self.phase = Phase::Monitoring;
        self.units.clear();
        self.cur = None;
        self.cur_invalid = false;
        self.pos = 0;
        self.since_match = 0;
        // The `next` that closed the last unit starts the first monitored
        // iteration.
        self.monitor(Event::Next, t_ns);
    }

    // ----- monitoring -----

    fn monitor(&mut self, event: Event, t_ns: i64) -> Option<Iteration> {
        let l = self.pattern.len();
        let slot = (self.events % l as u64) as usize;
        self.ts[slot] = t_ns;
        self.since_match += 1;
        // KMP transition.
        while self.pos > 0 && self.pattern[self.pos] != event {
            self.pos = self.fail[self.pos - 1];
        }
        if self.pattern[self.pos] == event {
            self.pos += 1;
        }
        if self.pos == l {
            // The match started l-1 events ago: the oldest slot of the ring.
            let start = self.ts[(slot + 1) % l];
            // Iterations do not overlap: the next one starts from scratch.
            self.pos = 0;
            self.since_match = 0;
            return Some(self.record(t_ns - start));
        }
        if self.since_match >= self.cfg.k {
            // §4.1: back to iteration detection after K unmatched events.
            self.phase = Phase::Detecting;
            self.redetections += 1;
            self.pattern.clear();
            self.fail.clear();
            self.pos = 0;
            self.since_match = 0;
            self.units.clear();
            self.cur = None;
            if event == Event::Next {
                self.cur = Some(Unit { nexts: 1, steps: 0 });
            }
        }
        None
    }

    fn record(&mut self, dur: i64) -> Iteration {
        let dur = dur.max(0);
        let index = self.iterations;
        self.iterations += 1;
        self.last_duration_ns = Some(dur);
        self.last.push_back(dur);
        self.last_sum += dur as i128;
        if self.last.len() > self.cfg.n {
            if let Some(old) = self.last.pop_front() {
                self.last_sum -= old as i128;
            }
        }
        if self.cfg.baseline == Baseline::ShortestIteration {
            self.baseline.push(index, dur as f64, self.cfg.recent);
        }
        let mut slowdown = None;
        if self.last.len() == self.cfg.n {
            let mean = self.last_sum as f64 / self.cfg.n as f64;
            if self.cfg.baseline == Baseline::RollingMean {
                self.baseline.push(index, mean, self.cfg.recent);
            }
            if let Some(b) = self.baseline.min() {
                if mean > (1.0 + self.cfg.threshold) * b {
                    slowdown = Some(Degradation::Slowdown {
                        mean_ns: mean,
                        baseline_ns: b,
                    });
                }
            }
        }
        Iteration {
            index,
            duration_ns: dur,
            slowdown,
        }
    }

    /// Drops the iteration statistics (means and the recent shortest) but
    /// keeps the iteration sequence.
    pub fn clear_statistics(&mut self) {
        self.last.clear();
        self.last_sum = 0;
        self.baseline.clear();
        self.last_duration_ns = None;
    }
}

fn kmp_failure(p: &[Event]) -> Vec<usize> {
    let mut f = vec![0; p.len()];
    let mut k = 0;
    for i in 1..p.len() {
        while k > 0 && p[i] != p[k] {
            k = f[k - 1];
        }
        if p[i] == p[k] {
            k += 1;
        }
        f[i] = k;
    }
    f
}
