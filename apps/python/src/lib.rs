//! `whyslow._whyslow`: the Python binding of whyslow.
//!
//! Exposes the online detector and trigger policy (`whyslow-online`) and two
//! entry points over the analysis library: `summarize_trace` (Kineto trace →
//! fingerprint, via `whyslow-ingest` and `whyslow-summarize`) and
//! `localize_fingerprints` (fingerprints → report, via `whyslow-localize` and
//! `whyslow-report`), and the utilization `Sampler` (`whyslow-sampler`) that
//! runs during a profiling window. The heavy and blocking calls release the
//! GIL so that a background Python thread can run them while training goes on.
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
    /// `step` events seen (the training loop's optimizer steps).
    steps: u64,
    /// (step, duration in ms) of the last [`HISTORY`] iterations, for the
    /// report's iteration-time plot.
    history: std::collections::VecDeque<(u64, f32)>,
}

/// Iterations kept in [`PyDetector::history`] (16 KB).
const HISTORY: usize = 2048;

impl PyDetector {
    fn feed(&mut self, e: Event, t_ns: i64) -> i32 {
        if e == Event::Step {
            self.steps += 1;
        }
        match self.inner.on_event(e, t_ns) {
            None => NOTHING,
            Some(it) => {
                if self.history.len() == HISTORY {
                    self.history.pop_front();
                }
                self.history
                    .push_back((self.steps, (it.duration_ns as f64 / 1e6) as f32));
                self.classify(it)
            }
        }
    }

    fn classify(&mut self, it: whyslow_online::Iteration) -> i32 {
        match it.slowdown {
            Some(Degradation::Slowdown {
                mean_ns,
                baseline_ns,
            }) => {
                self.last_slowdown = Some((mean_ns, baseline_ns));
                SLOWDOWN
            }
            _ => ITERATION,
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
            steps: 0,
            history: std::collections::VecDeque::with_capacity(HISTORY),
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

    /// The last iterations as `(step, duration_ms)`, oldest first; `step`
    /// counts `step` events from the detector's creation (the training
    /// loop's optimizer steps).
    fn history(&self) -> Vec<(u64, f32)> {
        self.history.iter().copied().collect()
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

#[allow(clippy::too_many_arguments)] // the binding's keyword arguments
fn summarize_impl(
    trace_path: &Path,
    out_path: Option<&Path>,
    rank: Option<u32>,
    host: Option<String>,
    group: Option<String>,
    samples_path: Option<&Path>,
    job: Option<String>,
    opts: &whyslow_summarize::SummarizeOptions,
) -> Result<String, String> {
    let samples = match samples_path {
        Some(p) => {
            whyslow_ingest::read_samples(p)
                .map_err(|e| e.to_string())?
                .series
        }
        None => BTreeMap::new(),
    };
    let mut trace = whyslow_ingest::read_worker_trace(trace_path).map_err(|e| e.to_string())?;
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
    let mut fp = whyslow_summarize::summarize(&trace, &samples, opts);
    if job.is_some() {
        // The job's id as the launcher names it: what tells two jobs apart
        // even on the same hardware (fingerprint version 2).
        fp.job = whyslow_model::JobIdentity {
            id: job,
            ..fp.job.unwrap_or_default()
        }
        .known();
    }
    if let Some(out) = out_path {
        whyslow_ingest::write_fingerprint(out, &fp).map_err(|e| e.to_string())?;
    }
    serde_json::to_string(&fp).map_err(|e| e.to_string())
}

/// Reads one worker's trace (Kineto/Chrome JSON, or a generic events file of
/// one worker), summarizes it into the worker's fingerprint
/// and returns the fingerprint as JSON; also writes it to `out_path` when
/// given. `rank` overrides the rank the trace declares. `samples_path` is a
/// whyslow samples file of this worker (e.g. written by
/// `Sampler.write`) on the trace's time origin; its utilization then
/// gives the fingerprint's μ/σ; `job` is the job's id (the fingerprint's
/// `job.id`). Releases the GIL.
#[pyfunction]
#[pyo3(signature = (trace_path, out_path=None, rank=None, host=None, group=None, max_functions=100, beta_floor=0.001, samples_path=None, job=None))]
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
    samples_path: Option<PathBuf>,
    job: Option<String>,
) -> PyResult<String> {
    let opts = whyslow_summarize::SummarizeOptions {
        max_functions,
        beta_floor,
        ..Default::default()
    };
    py.allow_threads(|| {
        summarize_impl(
            &trace_path,
            out_path.as_deref(),
            rank,
            host,
            group,
            samples_path.as_deref(),
            job,
            &opts,
        )
    })
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
/// Python findings carry a source excerpt; `iterations` is the detector's
/// history as `(step, ms)` pairs ([`PyDetector::history`]), plotted with its
/// onset. Releases the GIL.
#[pyfunction]
#[pyo3(signature = (fingerprints, report_dir, world_size=None, config_toml=None, source_roots=None, warnings=None, iterations=None, cross_layer=None))]
#[allow(clippy::too_many_arguments)] // Python keyword arguments
fn localize_fingerprints(
    py: Python<'_>,
    fingerprints: Vec<String>,
    report_dir: PathBuf,
    world_size: Option<u32>,
    config_toml: Option<String>,
    source_roots: Option<Vec<PathBuf>>,
    warnings: Option<Vec<String>>,
    iterations: Option<Vec<(u64, f64)>>,
    cross_layer: Option<String>,
) -> PyResult<String> {
    let cross_layer: Option<whyslow_model::diagnosis::DiagnoseReport> = cross_layer
        .map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(|e| PyValueError::new_err(format!("cross_layer: not a diagnosis: {e}")))?;
    let cfg = match config_toml {
        Some(t) => whyslow_localize::LocalizeConfig::from_toml_str(&t)
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
        None => whyslow_localize::LocalizeConfig::default(),
    };
    py.allow_threads(|| -> PyResult<String> {
        // Each fingerprint into the job's compact form as it is parsed.
        let mut fps = whyslow_pipeline::JobFingerprints::with_capacity(fingerprints.len());
        for s in &fingerprints {
            fps.push(load_fingerprint(s).map_err(PyValueError::new_err)?);
        }
        // The job pipeline: the same policy as `whyslow localize` and the
        // server (one job, empty windows, world size, excerpts, onset).
        let evidence = whyslow_pipeline::JobEvidence {
            fingerprints: fps,
            iterations: iterations.and_then(whyslow_pipeline::iterations_from_history),
            warnings: warnings.unwrap_or_default(),
            cross_layer,
        };
        let policy = whyslow_pipeline::JobPolicy {
            localize: cfg,
            world_size,
            strict: false,
            source_roots,
        };
        let report = whyslow_pipeline::analyze_job(evidence, &policy)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        std::fs::create_dir_all(&report_dir)
            .map_err(|e| PyOSError::new_err(format!("{}: {e}", report_dir.display())))?;
        let write = |name: &str, body: String| -> PyResult<()> {
            let p = report_dir.join(name);
            std::fs::write(&p, body)
                .map_err(|e| PyOSError::new_err(format!("{}: {e}", p.display())))
        };
        write("report.json", whyslow_report::render_json(&report))?;
        let opts = whyslow_report::HtmlOptions {
            diagnosis_file: report
                .cross_layer
                .as_ref()
                .map(|_| "diagnose.html".to_string()),
            ..Default::default()
        };
        write(
            "report.html",
            whyslow_report::render_html_with(&report, &opts),
        )?;
        Ok(whyslow_report::render_table(&report, false))
    })
}

/// Analyzes a job's files (traces, samples, fingerprints; files or folders)
/// through the job pipeline, as `whyslow analyze` does, and returns the
/// report as JSON. Raises ValueError when the inputs cannot be judged
/// (nothing readable, two jobs, a refusal under `strict`). Releases the GIL.
#[pyfunction]
#[pyo3(signature = (paths, world_size=None, strict=false, source_roots=None, config_toml=None, steps=None))]
fn analyze_paths(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    world_size: Option<u32>,
    strict: bool,
    source_roots: Option<Vec<PathBuf>>,
    config_toml: Option<String>,
    steps: Option<(u64, u64)>,
) -> PyResult<String> {
    let localize = match config_toml {
        Some(t) => whyslow_localize::LocalizeConfig::from_toml_str(&t)
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
        None => whyslow_localize::LocalizeConfig::default(),
    };
    let policy = whyslow_pipeline::JobPolicy {
        localize,
        world_size,
        strict,
        source_roots,
    };
    let opts = whyslow_pipeline::InputOptions {
        steps,
        keep_traces: false,
    };
    py.allow_threads(|| {
        let done = whyslow_pipeline::analyze_inputs(&paths, &policy, &opts, &|_| {})
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(whyslow_report::render_json(&done.report))
    })
}

/// The cross-layer diagnosis (SysOM-AI §3.1) over a node agent's spool
/// (`spool`: what `whyslow agent --profile-spool` writes), with the ranks'
/// fingerprints (files or folders; fingerprints or profiler traces) for the
/// GPU layer: the same call as `whyslow diagnose` and the server's
/// `/diagnosis`. Returns the report as JSON; writes the HTML page (entry
/// plots, flame graphs) to `html_path` when given. `baseline`/`window`
/// are `(a, b)` seconds since the earliest profile. Raises ValueError when
/// there is nothing to diagnose. Releases the GIL.
#[pyfunction]
#[pyo3(signature = (spool, fingerprints=None, html_path=None, baseline=None, window=None, until=None))]
fn diagnose_spool(
    py: Python<'_>,
    spool: PathBuf,
    fingerprints: Option<Vec<PathBuf>>,
    html_path: Option<PathBuf>,
    baseline: Option<(f64, f64)>,
    window: Option<(f64, f64)>,
    until: Option<f64>,
) -> PyResult<String> {
    py.allow_threads(|| {
        let mut evidence = whyslow_spool::read_spool(&spool)
            .map_err(|e| PyOSError::new_err(e.to_string()))?
            .evidence;
        if let Some(paths) = fingerprints.filter(|p| !p.is_empty()) {
            let fps = whyslow_pipeline::read_fingerprints(&paths, &mut evidence.notes)
                .map_err(|e| PyOSError::new_err(e.to_string()))?;
            evidence.fingerprints = Some(fps);
        }
        let cfg = whyslow_diagnose::DiagnoseConfig {
            baseline,
            window,
            until,
        };
        let d = whyslow_diagnose::diagnose(&evidence, &cfg)
            .map_err(|e| PyValueError::new_err(format!("{}: {e}", spool.display())))?;
        if let Some(p) = html_path {
            let page = whyslow_stack_output::diagnosis_html(
                &format!("whyslow diagnose {}", spool.display()),
                &d,
            );
            std::fs::write(&p, page)
                .map_err(|e| PyOSError::new_err(format!("{}: {e}", p.display())))?;
        }
        serde_json::to_string(&d.report).map_err(|e| PyValueError::new_err(e.to_string()))
    })
}

/// A hang's verdict from what the ranks left in `folder` (Flight Recorder
/// dumps, stack files, collective records): `(report JSON, terminal text)`,
/// the same call as `whyslow hang`. Writes the HTML page to `html_path`
/// when given. Releases the GIL.
#[pyfunction]
#[pyo3(signature = (folder, world_size=None, min_wait_s=None, html_path=None))]
fn hang_report(
    py: Python<'_>,
    folder: PathBuf,
    world_size: Option<u32>,
    min_wait_s: Option<f64>,
    html_path: Option<PathBuf>,
) -> PyResult<(String, String)> {
    py.allow_threads(|| {
        let cfg = whyslow_hang::HangConfig {
            min_wait_s,
            world_size,
        };
        // ValueError exactly where `whyslow hang` exits 1.
        let r = whyslow_pipeline::analyze_hang_dir(&folder, &cfg)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        if let Some(p) = html_path {
            let page =
                whyslow_report::hang::hang_html(&format!("whyslow hang {}", folder.display()), &r);
            std::fs::write(&p, page)
                .map_err(|e| PyOSError::new_err(format!("{}: {e}", p.display())))?;
        }
        let json =
            serde_json::to_string_pretty(&r).map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok((json, whyslow_report::hang::hang_table(&r)))
    })
}

/// The diagnosis report (JSON, as [`diagnose_spool`] returns it) as text
/// for the terminal.
#[pyfunction]
fn diagnosis_table(report_json: &str) -> PyResult<String> {
    let r: whyslow_model::diagnosis::DiagnoseReport = serde_json::from_str(report_json)
        .map_err(|e| PyValueError::new_err(format!("not a diagnosis: {e}")))?;
    Ok(whyslow_stack_output::diagnosis_table(&r))
}

/// A job report (JSON, `report.json`) as the terminal table of `whyslow
/// analyze`.
#[pyfunction]
fn report_table(report_json: &str) -> PyResult<String> {
    let r: whyslow_model::Report = serde_json::from_str(report_json)
        .map_err(|e| PyValueError::new_err(format!("not a whyslow report: {e}")))?;
    Ok(whyslow_report::render_table(&r, false))
}

/// The chat-completions request for a fix (EROICA's first step) from a
/// report (JSON) and the code under `source_roots`: `(body JSON, bytes of
/// code in it)`, exactly what `whyslow analyze --suggest-fix` sends.
#[pyfunction]
#[pyo3(signature = (report_json, source_roots, model, max_code_bytes=whyslow_fix::DEFAULT_MAX_CODE_BYTES, max_tokens=whyslow_fix::DEFAULT_MAX_TOKENS))]
fn fix_request(
    report_json: &str,
    source_roots: Vec<PathBuf>,
    model: &str,
    max_code_bytes: usize,
    max_tokens: u32,
) -> PyResult<(String, usize)> {
    let r: whyslow_model::Report = serde_json::from_str(report_json)
        .map_err(|e| PyValueError::new_err(format!("not a whyslow report: {e}")))?;
    let code = whyslow_ingest::source::code_contexts(&r, &source_roots);
    let opts = whyslow_fix::FixOptions {
        model: model.to_string(),
        max_code_bytes,
        max_tokens,
    };
    let (body, bytes) = whyslow_fix::request(&r, &code, &opts);
    Ok((
        serde_json::to_string_pretty(&body).unwrap_or_default(),
        bytes,
    ))
}

/// Puts a model's answer (its HTTP body; or `error`, why there was none)
/// into the report (JSON): `fix` with the patch checked against the files
/// under `source_roots`, or `fix_error`. Returns `(report JSON, patch or
/// None)`: the same call as the command line's.
#[pyfunction]
#[pyo3(signature = (report_json, model, code_bytes, source_roots, answer=None, error=None, seconds=None))]
fn fix_answer(
    report_json: &str,
    model: &str,
    code_bytes: usize,
    source_roots: Vec<PathBuf>,
    answer: Option<&str>,
    error: Option<&str>,
    seconds: Option<f64>,
) -> PyResult<(String, Option<String>)> {
    let mut r: whyslow_model::Report = serde_json::from_str(report_json)
        .map_err(|e| PyValueError::new_err(format!("not a whyslow report: {e}")))?;
    let got = match (answer, error) {
        (Some(a), _) => Ok(a),
        (None, e) => Err(e.unwrap_or("no answer").to_string()),
    };
    let patch = whyslow_fix::apply_answer(&mut r, model, code_bytes, got, &|p: &str| {
        whyslow_ingest::source::read_source_file(&source_roots, p)
    });
    if let Some(f) = &mut r.fix {
        f.seconds = seconds;
    }
    Ok((whyslow_report::render_json(&r), patch))
}

/// A job report (JSON, `report.json`) as the HTML page `whyslow analyze
/// --html` writes, for notebooks.
#[pyfunction]
fn report_html(report_json: &str) -> PyResult<String> {
    let r: whyslow_model::Report = serde_json::from_str(report_json)
        .map_err(|e| PyValueError::new_err(format!("not a whyslow report: {e}")))?;
    Ok(whyslow_report::render_html(&r))
}

/// Parses `name` or `name:mbit` (capacity in Mbit/s, for virtual links).
fn parse_interface(s: &str) -> PyResult<whyslow_sampler::NetInterface> {
    s.parse()
        .map_err(|e: whyslow_sampler::InterfaceSpecError| PyValueError::new_err(e.to_string()))
}

/// Returns the `baseTimeNanoseconds` of a Kineto trace (plain or gzip JSON) (newer
/// PyTorch writes event `ts` relative to it), or None when it has none (its
/// `ts` are then Unix-epoch µs). Releases the GIL.
#[pyfunction]
fn kineto_base_ns(py: Python<'_>, trace_path: PathBuf) -> PyResult<Option<i64>> {
    py.allow_threads(|| whyslow_ingest::read_kineto_base_time_ns(&trace_path))
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Hardware utilization sampler (`whyslow-sampler`) running in a thread of
/// this process: CPU of the training thread (and the process's other
/// threads), NIC throughput of the given interfaces, the GPU through NVML
/// when built with it. Timestamps are Unix-epoch; `write` shifts
/// them onto a trace's origin.
/// This process's network over a profiling window (issue 29): its
/// namespace's TCP counters and its own connections' `tcp_info` (socket
/// diagnostics of its own namespace: no privilege), read at the window's
/// start and end, as the node agent reads them. `sample()` gives the OS
/// sample JSON (`whyslow_model::os::OsSample`) the fingerprint carries as
/// `network`.
#[pyclass(name = "NetWatch", module = "whyslow._whyslow")]
struct PyNetWatch {
    inner: whyslow_sampler::os::OsSignals,
}

#[pymethods]
impl PyNetWatch {
    /// Starts watching this process (reads its first counters).
    #[new]
    fn new() -> PyResult<Self> {
        whyslow_sampler::os::OsSignals::open(std::process::id() as i32)
            .map(|inner| PyNetWatch { inner })
            .ok_or_else(|| PyOSError::new_err("/proc/self cannot be read"))
    }

    /// The signals and connections since the last read, as JSON; `None`
    /// when they cannot be read.
    fn sample(&mut self, py: Python<'_>) -> PyResult<Option<String>> {
        let inner = &mut self.inner;
        let s = py.allow_threads(|| inner.sample());
        s.map(|s| serde_json::to_string(&s).map_err(|e| PyValueError::new_err(e.to_string())))
            .transpose()
    }
}

#[pyclass(name = "Sampler", module = "whyslow._whyslow")]
struct PySampler {
    inner: Option<whyslow_sampler::Sampler>,
    samples: Option<whyslow_sampler::Samples>,
}

#[pymethods]
impl PySampler {
    /// Starts sampling `pid` (default: this process) at `rate_hz`; `tid` is
    /// the training thread (default: found by the sampler); `interfaces` are
    /// `"name"` or `"name:mbit"`.
    #[staticmethod]
    #[pyo3(signature = (rate_hz, pid=None, tid=None, interfaces=None))]
    fn start(
        py: Python<'_>,
        rate_hz: f64,
        pid: Option<i32>,
        tid: Option<i32>,
        interfaces: Option<Vec<String>>,
    ) -> PyResult<Self> {
        let interfaces = interfaces
            .unwrap_or_default()
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| parse_interface(s))
            .collect::<PyResult<Vec<_>>>()?;
        let cfg = whyslow_sampler::SamplerConfig {
            rate_hz,
            pid,
            training_tid: tid,
            interfaces,
            time_base: whyslow_sampler::TimeBase::UnixEpoch,
            ..Default::default()
        };
        let inner = py
            .allow_threads(|| whyslow_sampler::Sampler::start(cfg))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PySampler {
            inner: Some(inner),
            samples: None,
        })
    }

    /// Stops sampling (joins the sampler thread; returns within ~10 ms) and
    /// keeps the samples for `write`. Idempotent. Releases the GIL.
    fn stop(&mut self, py: Python<'_>) -> PyResult<()> {
        if let Some(s) = self.inner.take() {
            let samples = py
                .allow_threads(|| s.stop())
                .map_err(|e| PyOSError::new_err(e.to_string()))?;
            self.samples = Some(samples);
        }
        Ok(())
    }

    /// Writes the samples file at `path` (column `worker` when given) with
    /// timestamps relative to `base_ns` (a trace's `baseTimeNanoseconds`; 0:
    /// Unix epoch) and returns `{"ticks", "overruns", "achieved_hz",
    /// "sampler_cpu_fraction", "elapsed_s", "series", "notes", "gpu"}`. Stops first
    /// if still running. Releases the GIL.
    #[pyo3(signature = (path, worker=None, base_ns=0))]
    fn write(
        &mut self,
        py: Python<'_>,
        path: PathBuf,
        worker: Option<u32>,
        base_ns: i64,
    ) -> PyResult<PyObject> {
        self.stop(py)?;
        let samples = self
            .samples
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("sampler has no samples"))?;
        let mut series = samples.series.clone();
        py.allow_threads(|| {
            whyslow_sampler::rebase(series.values_mut(), base_ns);
            whyslow_sampler::write_samples_csv(&path, worker, &series)
        })
        .map_err(|e| PyOSError::new_err(e.to_string()))?;
        let st = samples.stats;
        let d = pyo3::types::PyDict::new(py);
        d.set_item("ticks", st.ticks)?;
        d.set_item("overruns", st.overruns)?;
        d.set_item("achieved_hz", st.achieved_hz())?;
        d.set_item("sampler_cpu_fraction", st.sampler_cpu_fraction())?;
        d.set_item("elapsed_s", st.elapsed_ns as f64 / 1e9)?;
        let names: Vec<&str> = series
            .iter()
            .filter(|(_, s)| !s.ts_ns.is_empty())
            .map(|(r, _)| r.as_str())
            .collect();
        d.set_item("series", names)?;
        d.set_item("notes", samples.notes.clone())?;
        // GPU sampling: the device's name, or why not (no NVML, no device).
        let gpu = match &samples.gpu {
            whyslow_sampler::GpuStatus::NotRequested => "not requested".to_string(),
            whyslow_sampler::GpuStatus::NotAvailable(why) => format!("not available: {why}"),
            whyslow_sampler::GpuStatus::Sampling { name, notes } => {
                format!("{name} ({})", notes.join("; "))
            }
        };
        d.set_item("gpu", gpu)?;
        Ok(d.into_any().unbind())
    }

    /// Whether the sampler thread is running.
    #[getter]
    fn running(&self) -> bool {
        self.inner.is_some()
    }
}

/// The native module.
/// Runs the `whyslow` command line (`args` without the program name:
/// `["analyze", "traces/"]`) in this process and returns its exit code, as
/// the `whyslow` binary would: the report on stdout, warnings and errors on
/// stderr. Releases the GIL. Backs `python -m whyslow analyze …` and the
/// wheel's `whyslow` command.
#[pyfunction]
fn cli_main(py: Python<'_>, args: Vec<String>) -> i32 {
    py.allow_threads(|| {
        i32::from(whyslow::run(
            std::iter::once("whyslow".to_string()).chain(args),
        ))
    })
}

/// Parses a wire record as whyslow's Rust side does (`kind`: `"request"`
/// or `"done"` of the agent protocol, `"session"` for the session record
/// ranks agree on; `whyslow_model::wire`) and returns it as Rust would write
/// it; raises ValueError naming the bad field. The Python side checks with
/// it what it writes and reads.
#[pyfunction]
fn parse_wire(kind: &str, text: &str) -> PyResult<String> {
    use whyslow_model::wire::{
        AgentDone, AgentInfo, AgentRequest, ProcessRegistration, SessionRecord,
    };
    let bad = |e: whyslow_model::wire::WireError| PyValueError::new_err(e.to_string());
    let out = match kind {
        "request" => serde_json::to_string(&AgentRequest::from_json(text).map_err(bad)?),
        "done" => serde_json::to_string(&AgentDone::from_json(text).map_err(bad)?),
        "session" => serde_json::to_string(&SessionRecord::from_json(text).map_err(bad)?),
        "register" => serde_json::to_string(&ProcessRegistration::from_json(text).map_err(bad)?),
        "agent" => serde_json::to_string(&AgentInfo::from_json(text).map_err(bad)?),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown wire kind {other:?}"
            )))
        }
    };
    out.map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Copies a samples file (`resource,ts_us,value[,worker]`) from `src` to
/// `dst` with `shift_ns` subtracted from every timestamp
/// (`whyslow_sampler::rebase`): the agent samples on the Unix epoch, the rank
/// moves them onto its trace's origin. Returns the number of samples.
/// Releases the GIL.
#[pyfunction]
fn rebase_samples_file(
    py: Python<'_>,
    src: PathBuf,
    dst: PathBuf,
    shift_ns: i64,
) -> PyResult<usize> {
    py.allow_threads(|| {
        let mut s =
            whyslow_ingest::read_samples(&src).map_err(|e| PyValueError::new_err(e.to_string()))?;
        whyslow_sampler::rebase(s.series.values_mut(), shift_ns);
        whyslow_sampler::write_samples_csv(&dst, s.worker, &s.series)
            .map_err(|e| PyOSError::new_err(format!("{}: {e}", dst.display())))?;
        Ok(s.series.values().map(|v| v.ts_ns.len()).sum())
    })
}

#[pymodule]
fn _whyslow(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyDetector>()?;
    m.add_class::<PyTriggerPolicy>()?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(summarize_trace, m)?)?;
    m.add_function(wrap_pyfunction!(localize_fingerprints, m)?)?;
    m.add_function(wrap_pyfunction!(diagnose_spool, m)?)?;
    m.add_function(wrap_pyfunction!(analyze_paths, m)?)?;
    m.add_function(wrap_pyfunction!(diagnosis_table, m)?)?;
    m.add_function(wrap_pyfunction!(report_html, m)?)?;
    m.add_function(wrap_pyfunction!(report_table, m)?)?;
    m.add_function(wrap_pyfunction!(kineto_base_ns, m)?)?;
    m.add_function(wrap_pyfunction!(parse_wire, m)?)?;
    m.add_function(wrap_pyfunction!(hang_report, m)?)?;
    m.add_function(wrap_pyfunction!(fix_request, m)?)?;
    m.add_function(wrap_pyfunction!(fix_answer, m)?)?;
    m.add_function(wrap_pyfunction!(rebase_samples_file, m)?)?;
    m.add_class::<PySampler>()?;
    m.add_class::<PyNetWatch>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("NOTHING", NOTHING)?;
    m.add("ITERATION", ITERATION)?;
    m.add("SLOWDOWN", SLOWDOWN)?;
    Ok(())
}
