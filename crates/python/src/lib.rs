//! `whyslow._whyslow`: the Python binding of whyslow.
//!
//! Exposes the online detector and trigger policy (`whyslow-online`) and two
//! entry points over the analysis library: `summarize_trace` (Kineto trace →
//! fingerprint, via `whyslow-ingest` and `whyslow-summarize`) and
//! `localize_fingerprints` (fingerprints → report, via `whyslow-localize` and
//! `whyslow-report`). The heavy calls release the GIL so that a background
//! Python thread can run them while training goes on.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;

use whyslow_model::Fingerprint;
use whyslow_online::{
    Baseline, Degradation, Detector, DetectorConfig, Event, Phase, TriggerPolicy,
};

/// No iteration completed by this event.
const NOTHING: i32 = 0;
/// The event completed an iteration.
const ITERATION: i32 = 1;
/// The event completed an iteration and the job is slowed down (§4.1 (1)).
const SLOWDOWN: i32 = 2;

/// The PerfTracker §4.1 iteration and degradation detector.
#[pyclass(name = "Detector", module = "whyslow._whyslow")]
struct PyDetector {
    inner: Detector,
    last_slowdown: Option<(f64, f64)>,
}

impl PyDetector {
    fn feed(&mut self, e: Event, t_ns: i64) -> i32 {
        match self.inner.on_event(e, t_ns) {
            None => NOTHING,
            Some(it) => match it.slowdown {
                Some(Degradation::Slowdown {
                    mean_ns,
                    baseline_ns,
                }) => {
                    self.last_slowdown = Some((mean_ns, baseline_ns));
                    SLOWDOWN
                }
                _ => ITERATION,
            },
        }
    }
}

#[pymethods]
impl PyDetector {
    #[new]
    #[pyo3(signature = (m=10, n=50, threshold=0.05, block_factor=5.0, k=200, recent=None, baseline="rolling_mean", block_min_s=0.0))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        m: usize,
        n: usize,
        threshold: f64,
        block_factor: f64,
        k: usize,
        recent: Option<usize>,
        baseline: &str,
        block_min_s: f64,
    ) -> PyResult<Self> {
        let baseline: Baseline = baseline
            .parse()
            .map_err(|e: whyslow_online::ConfigError| PyValueError::new_err(e.to_string()))?;
        let cfg = DetectorConfig {
            m,
            n,
            threshold,
            block_factor,
            k,
            recent: recent.unwrap_or(10 * n),
            baseline,
            block_min_ns: (block_min_s.max(0.0) * 1e9) as i64,
            ..DetectorConfig::default()
        };
        let inner = Detector::new(cfg).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyDetector {
            inner,
            last_slowdown: None,
        })
    }

    /// Feeds a `next` event at `t_ns`; returns 0 (nothing), 1 (an iteration
    /// completed) or 2 (an iteration completed and the job is slowed down).
    fn next(&mut self, t_ns: i64) -> i32 {
        self.feed(Event::Next, t_ns)
    }

    /// Feeds a `step` event at `t_ns`; same return codes as `next`.
    fn step(&mut self, t_ns: i64) -> i32 {
        self.feed(Event::Step, t_ns)
    }

    /// `(idle_ns, mean_ns)` when blocked (§4.1 (2)), once per stall; else None.
    fn check_blocked(&mut self, now_ns: i64) -> Option<(i64, f64)> {
        match self.inner.check_blocked(now_ns) {
            Some(Degradation::Blocked { idle_ns, mean_ns }) => Some((idle_ns, mean_ns)),
            _ => None,
        }
    }

    /// Ignore events (during a profiling window).
    fn pause(&mut self) {
        self.inner.pause();
    }

    /// Take events again from `now_ns`.
    fn resume(&mut self, now_ns: i64) {
        self.inner.resume(now_ns);
    }

    /// Back to iteration detection, statistics dropped.
    fn reset(&mut self) {
        self.inner.reset();
        self.last_slowdown = None;
    }

    /// Drop iteration statistics, keep the iteration sequence.
    fn clear_statistics(&mut self) {
        self.inner.clear_statistics();
    }

    /// `"detecting"` or `"monitoring"`.
    #[getter]
    fn phase(&self) -> &'static str {
        match self.inner.phase() {
            Phase::Detecting => "detecting",
            Phase::Monitoring => "monitoring",
        }
    }

    /// The training iteration sequence (`["next", "step", …]`), once detected.
    #[getter]
    fn pattern(&self) -> Option<Vec<&'static str>> {
        self.inner
            .pattern()
            .map(|p| p.iter().map(|e| e.as_str()).collect())
    }

    /// Iterations matched so far.
    #[getter]
    fn iterations(&self) -> u64 {
        self.inner.iterations()
    }

    /// Events received so far.
    #[getter]
    fn events(&self) -> u64 {
        self.inner.events()
    }

    /// Times the detector went back to iteration detection.
    #[getter]
    fn redetections(&self) -> u64 {
        self.inner.redetections()
    }

    /// Mean of the last N iterations, ns.
    #[getter]
    fn mean_ns(&self) -> Option<f64> {
        self.inner.mean_ns()
    }

    /// The recent shortest, ns.
    #[getter]
    fn baseline_ns(&self) -> Option<f64> {
        self.inner.baseline_ns()
    }

    /// Duration of the last iteration, ns.
    #[getter]
    fn last_duration_ns(&self) -> Option<i64> {
        self.inner.last_duration_ns()
    }

    /// `(mean_ns, baseline_ns)` of the last reported slowdown.
    #[getter]
    fn last_slowdown(&self) -> Option<(f64, f64)> {
        self.last_slowdown
    }

    /// Whether events are ignored.
    #[getter]
    fn paused(&self) -> bool {
        self.inner.is_paused()
    }

    fn __repr__(&self) -> String {
        let c = self.inner.config();
        format!(
            "Detector(m={}, n={}, threshold={}, block_factor={}, k={}, recent={}, baseline={:?}, phase={:?}, iterations={})",
            c.m,
            c.n,
            c.threshold,
            c.block_factor,
            c.k,
            c.recent,
            c.baseline.as_str(),
            self.phase(),
            self.inner.iterations()
        )
    }
}

/// Cooldown and hourly cap on profiling windows.
#[pyclass(name = "TriggerPolicy", module = "whyslow._whyslow")]
struct PyTriggerPolicy {
    inner: TriggerPolicy,
}

#[pymethods]
impl PyTriggerPolicy {
    #[new]
    #[pyo3(signature = (cooldown_s=300.0, max_per_hour=6))]
    fn new(cooldown_s: f64, max_per_hour: u32) -> PyResult<Self> {
        if !cooldown_s.is_finite() {
            return Err(PyValueError::new_err("cooldown_s must be finite"));
        }
        let inner = TriggerPolicy::new((cooldown_s * 1e9) as i64, max_per_hour)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyTriggerPolicy { inner })
    }

    /// None when a window may start at `now_ns`, else why not.
    fn check(&self, now_ns: i64) -> Option<String> {
        self.inner.check(now_ns).err().map(|r| r.to_string())
    }

    /// Notes that a window started at `now_ns`.
    fn record(&mut self, now_ns: i64) {
        self.inner.record(now_ns)
    }

    /// `check`, and `record` when allowed.
    fn try_acquire(&mut self, now_ns: i64) -> Option<String> {
        self.inner.try_acquire(now_ns).err().map(|r| r.to_string())
    }

    /// Windows in the hour before `now_ns`.
    fn in_last_hour(&self, now_ns: i64) -> usize {
        self.inner.in_last_hour(now_ns)
    }
}

fn summarize_impl(
    trace_path: &Path,
    out_path: Option<&Path>,
    rank: Option<u32>,
    host: Option<String>,
    group: Option<String>,
    opts: &whyslow_summarize::SummarizeOptions,
) -> Result<String, String> {
    let mut trace = whyslow_ingest::read_kineto(trace_path).map_err(|e| e.to_string())?;
    if let Some(r) = rank {
        if trace.meta.rank != r {
            trace.meta.rank = r;
            trace.meta.rank_source = whyslow_model::RankSource::Trace;
        }
    }
    if host.is_some() {
        trace.meta.host = host;
    }
    if group.is_some() {
        trace.meta.group = group;
    }
    let fp = whyslow_summarize::summarize(&trace, &BTreeMap::new(), opts);
    if let Some(out) = out_path {
        whyslow_ingest::write_fingerprint(out, &fp).map_err(|e| e.to_string())?;
    }
    serde_json::to_string(&fp).map_err(|e| e.to_string())
}

/// Reads a Kineto (Chrome) trace, summarizes it into the worker's fingerprint
/// and returns the fingerprint as JSON; also writes it to `out_path` when
/// given. `rank` overrides the rank the trace declares. Releases the GIL.
#[pyfunction]
#[pyo3(signature = (trace_path, out_path=None, rank=None, host=None, group=None, max_functions=100, beta_floor=0.001))]
#[allow(clippy::too_many_arguments)]
fn summarize_trace(
    py: Python<'_>,
    trace_path: PathBuf,
    out_path: Option<PathBuf>,
    rank: Option<u32>,
    host: Option<String>,
    group: Option<String>,
    max_functions: usize,
    beta_floor: f64,
) -> PyResult<String> {
    let opts = whyslow_summarize::SummarizeOptions {
        max_functions,
        beta_floor,
        ..Default::default()
    };
    py.allow_threads(|| summarize_impl(&trace_path, out_path.as_deref(), rank, host, group, &opts))
        .map_err(PyValueError::new_err)
}

fn load_fingerprint(s: &str) -> Result<Fingerprint, String> {
    if s.trim_start().starts_with('{') {
        serde_json::from_str(s).map_err(|e| format!("fingerprint JSON: {e}"))
    } else {
        whyslow_ingest::read_fingerprint(Path::new(s)).map_err(|e| e.to_string())
    }
}

/// Localizes over fingerprints (file paths or JSON strings), writes
/// `report.json` and `report.html` into `report_dir` (created if needed) and
/// returns the findings table as text. `config_toml` is a localize
/// configuration (see `whyslow analyze --config`); `source_roots` lets
/// Python findings carry a source excerpt. Releases the GIL.
#[pyfunction]
#[pyo3(signature = (fingerprints, report_dir, world_size=None, config_toml=None, source_roots=None, warnings=None))]
fn localize_fingerprints(
    py: Python<'_>,
    fingerprints: Vec<String>,
    report_dir: PathBuf,
    world_size: Option<u32>,
    config_toml: Option<String>,
    source_roots: Option<Vec<PathBuf>>,
    warnings: Option<Vec<String>>,
) -> PyResult<String> {
    let cfg = match config_toml {
        Some(t) => whyslow_localize::LocalizeConfig::from_toml_str(&t)
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
        None => whyslow_localize::LocalizeConfig::default(),
    };
    py.allow_threads(|| -> PyResult<String> {
        let mut fps = Vec::with_capacity(fingerprints.len());
        for s in &fingerprints {
            fps.push(load_fingerprint(s).map_err(PyValueError::new_err)?);
        }
        let mut report = whyslow_localize::localize(&fps, &cfg, world_size);
        if let Some(w) = warnings {
            report.warnings.extend(w);
        }
        if let Some(roots) = source_roots {
            whyslow_report::attach_source_excerpts(&mut report, &roots);
        }
        std::fs::create_dir_all(&report_dir)
            .map_err(|e| PyOSError::new_err(format!("{}: {e}", report_dir.display())))?;
        let write = |name: &str, body: String| -> PyResult<()> {
            let p = report_dir.join(name);
            std::fs::write(&p, body)
                .map_err(|e| PyOSError::new_err(format!("{}: {e}", p.display())))
        };
        write("report.json", whyslow_report::render_json(&report))?;
        write("report.html", whyslow_report::render_html(&report))?;
        Ok(whyslow_report::render_table(&report, false))
    })
}

/// The native module.
#[pymodule]
fn _whyslow(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDetector>()?;
    m.add_class::<PyTriggerPolicy>()?;
    m.add_function(wrap_pyfunction!(summarize_trace, m)?)?;
    m.add_function(wrap_pyfunction!(localize_fingerprints, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("NOTHING", NOTHING)?;
    m.add("ITERATION", ITERATION)?;
    m.add("SLOWDOWN", SLOWDOWN)?;
    Ok(())
}
