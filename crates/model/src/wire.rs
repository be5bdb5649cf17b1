//! Files and records that whyslow's processes exchange, typed once: the
//! agent protocol of `docs/agent.md` (a training rank asks a privileged
//! `whyslow agent` to sample it during a profiling window), and the session
//! record ranks agree on through the job's store (PerfTracker §4.1: every
//! worker profiles the same iterations). The Rust agent reads and writes
//! these structs; the Python package writes the request and reads the done
//! record with the same field names, and a test round-trips what each side
//! writes through the other (`tests/python/test_unit.py`).

use serde::{Deserialize, Deserializer, Serialize};

/// A wire file that does not parse: the field (as a JSON path) and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct WireError {
    /// Where in the document (`pid`, `interfaces[1]`, or `.` for the whole).
    pub path: String,
    /// What was wrong there.
    pub message: String,
}

fn parse<T: for<'de> Deserialize<'de>>(text: &str) -> Result<T, WireError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| WireError {
        path: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

/// `null` reads as the field's default, like an absent field.
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn rate_or_default<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(DEFAULT_RATE_HZ))
}

fn default_rate() -> f64 {
    DEFAULT_RATE_HZ
}

/// An id given as a string or as a number reads as a string.
fn id_as_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(s)) => Some(s),
        Some(other) => Some(other.to_string()),
    })
}

/// Sampling rate when a request names none, Hz.
pub const DEFAULT_RATE_HZ: f64 = 1000.0;

/// `rank-<r>.request.json`: a rank asks the agent to sample it. Unknown
/// fields are ignored and `null` is the same as an absent field, so older and
/// newer ranks and agents understand each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRequest {
    /// The training process.
    pub pid: i32,
    /// Its training (main) thread; the process when absent.
    #[serde(default)]
    pub tid: Option<i32>,
    /// The rank, when it differs from the file name's.
    #[serde(default)]
    pub rank: Option<u32>,
    /// Sampling rate, Hz (1–10,000).
    #[serde(default = "default_rate", deserialize_with = "rate_or_default")]
    pub rate_hz: f64,
    /// NICs to sample, `eth0` or `veth0:1000` (capacity in Mbit/s).
    #[serde(default, deserialize_with = "null_as_default")]
    pub interfaces: Vec<String>,
    /// Subtracted from the samples' timestamps (the trace's time origin), ns.
    #[serde(default, deserialize_with = "null_as_default")]
    pub time_base_ns: i64,
    /// Stop by this Unix time even without a stop file.
    #[serde(default)]
    pub until_unix_s: Option<f64>,
    /// The rank's window id, echoed in the done record.
    #[serde(default, deserialize_with = "id_as_string")]
    pub id: Option<String>,
    /// GPU to sample with NVML, when any.
    #[serde(default)]
    pub gpu_index: Option<u32>,
    /// `/proc/PID/stat` start time of the process: with the pid it
    /// identifies the process (pids are reused).
    #[serde(default)]
    pub proc_start_ticks: Option<u64>,
}

impl AgentRequest {
    /// Parses a request file's text.
    pub fn from_json(text: &str) -> Result<Self, WireError> {
        parse(text)
    }
}

/// `rank-<r>.done`: the agent finished a window and wrote its samples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentDone {
    /// The request's id.
    #[serde(default, deserialize_with = "id_as_string")]
    pub id: Option<String>,
    /// The rank (file name).
    pub rank: u32,
    /// The sampled process.
    pub pid: i32,
    /// Why the window ended (`stop file`, `deadline`, `process exited`, …).
    pub reason: String,
    /// The samples file's name, in the same directory.
    pub samples: Option<String>,
    /// The extra (GPU, frequency) samples file's name.
    pub extra: Option<String>,
    /// The time base the samples were shifted by, ns (from the request).
    #[serde(default)]
    pub time_base_ns: i64,
    /// Resources with at least one sample.
    #[serde(default)]
    pub series: Vec<String>,
    /// Sampler ticks.
    #[serde(default)]
    pub ticks: u64,
    /// Ticks that came late.
    #[serde(default)]
    pub overruns: u64,
    /// Achieved sampling rate, Hz.
    #[serde(default)]
    pub achieved_hz: f64,
    /// Window length, s.
    #[serde(default)]
    pub elapsed_s: f64,
    /// The sampler's own CPU use, fraction of one core.
    #[serde(default)]
    pub sampler_cpu_fraction: f64,
    /// What could not be sampled, and why.
    #[serde(default)]
    pub notes: Vec<String>,
}

impl AgentDone {
    /// Parses a done record's text.
    pub fn from_json(text: &str) -> Result<Self, WireError> {
        parse(text)
    }
}

/// What an agent says of itself in its registration directory
/// (`agent.json`, written when it starts): where its spool is, so that rank
/// 0 of a job can run the cross-layer diagnosis over it for its report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// The agent's process id.
    pub pid: u32,
    /// Its profile spool (`--profile-spool`), absolute; none without one.
    #[serde(default)]
    pub spool: Option<String>,
}

impl AgentInfo {
    /// The file name in the registration directory.
    pub const FILE: &'static str = "agent.json";

    /// Parses an agent's `agent.json`.
    pub fn from_json(text: &str) -> Result<Self, WireError> {
        parse(text)
    }
}

/// A profiling session the ranks agree on (the job's `torch.distributed`
/// store, key `…/s<N>/session`; written as `session.json` next to the
/// report with what was collected): the first proposal for session N wins
/// (compare-and-set), and every rank profiles `iters` iterations from step
/// `target`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Session number, 1, 2, … within the job.
    pub session: u64,
    /// The step (optimizer steps and `whyslow.step()` calls) at which every
    /// rank starts profiling.
    pub target: u64,
    /// Iterations in the window.
    pub iters: u64,
    /// The window's wall-clock cap, seconds (0: none, `iters` alone).
    #[serde(default, deserialize_with = "null_as_default")]
    pub window_s: f64,
    /// Local time of the proposal, `YYYYMMDD-HHMMSS` (the session folder's prefix).
    pub stamp: String,
    /// Why: the detector's slowdown, a signal, a trigger file.
    #[serde(default, deserialize_with = "null_as_default")]
    pub reason: String,
    /// The rank that proposed it.
    pub proposer: u32,
    /// The job's world size when proposed.
    pub world_size: u32,
}

impl SessionRecord {
    /// Parses a session record, checking what a rank relies on: a window of
    /// at least one iteration, a stamp fit for a folder name, a proposer
    /// inside the world.
    pub fn from_json(text: &str) -> Result<Self, WireError> {
        let s: SessionRecord = parse(text)?;
        let bad = |path: &str, message: String| WireError {
            path: path.into(),
            message,
        };
        if s.iters == 0 {
            return Err(bad("iters", "a window needs at least one iteration".into()));
        }
        if !s.window_s.is_finite() || s.window_s < 0.0 {
            return Err(bad("window_s", format!("{} is not a duration", s.window_s)));
        }
        if s.stamp.is_empty() || !s.stamp.chars().all(|c| c.is_ascii_digit() || c == '-') {
            return Err(bad(
                "stamp",
                format!("{:?} is not YYYYMMDD-HHMMSS", s.stamp),
            ));
        }
        if s.world_size == 0 || s.proposer >= s.world_size {
            return Err(bad(
                "proposer",
                format!("rank {} outside a world of {}", s.proposer, s.world_size),
            ));
        }
        Ok(s)
    }
}

/// A training process registered with the node agent for always-on CPU
/// profiling (SysOM-AI §3.3): `proc-<pid>.json` in the agent's directory
/// (`WHYSLOW_AGENT_DIR`), written by `import whyslow` and removed at exit.
/// The labels travel with every profile of the process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessRegistration {
    /// The process.
    pub pid: i32,
    /// Field 22 of `/proc/<pid>/stat` when registered: a recycled pid is
    /// not mistaken for the registered process.
    #[serde(default)]
    pub proc_start_ticks: Option<u64>,
    /// Global rank.
    #[serde(default)]
    pub rank: Option<u32>,
    /// Rank on this node.
    #[serde(default)]
    pub local_rank: Option<u32>,
    /// World size.
    #[serde(default)]
    pub world_size: Option<u32>,
    /// Job id (`WHYSLOW_JOB_ID`, torchrun's run id, …).
    #[serde(default, deserialize_with = "null_as_default")]
    pub job: String,
    /// Host name as the process sees it.
    #[serde(default, deserialize_with = "null_as_default")]
    pub host: String,
    /// Communication group, when known.
    #[serde(default)]
    pub group: Option<String>,
    /// What the scheduler calls the job (Slurm's job name, the Kubernetes
    /// Job's), as the rank's fingerprints carry it (issue 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// The scheduler's labels of the job and the rank (`slurm.job_id`,
    /// `k8s.namespace`, `k8s.pod`, …): at most [`MAX_SCHEDULER_LABELS`],
    /// each value at most [`MAX_LABEL_VALUE`] bytes.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub scheduler: std::collections::BTreeMap<String, String>,
}

/// The most scheduler labels a registration may carry (profiles' label
/// cardinality stays bounded).
pub const MAX_SCHEDULER_LABELS: usize = 16;
/// The longest scheduler label value, in bytes.
pub const MAX_LABEL_VALUE: usize = 200;

impl ProcessRegistration {
    /// Parses a registration; the pid must be positive and the job id fit
    /// for a folder name.
    pub fn from_json(text: &str) -> Result<Self, WireError> {
        let r: ProcessRegistration = parse(text)?;
        if r.pid <= 0 {
            return Err(WireError {
                path: "pid".into(),
                message: format!("{} is not a process id", r.pid),
            });
        }
        if r.job.contains('/') || r.job.contains('\0') || r.job == ".." {
            return Err(WireError {
                path: "job".into(),
                message: format!("{:?} cannot name a folder", r.job),
            });
        }
        if r.scheduler.len() > MAX_SCHEDULER_LABELS {
            return Err(WireError {
                path: "scheduler".into(),
                message: format!(
                    "{} labels, at most {MAX_SCHEDULER_LABELS}",
                    r.scheduler.len()
                ),
            });
        }
        let long = |v: &str| v.len() > MAX_LABEL_VALUE;
        if let Some((k, _)) = r.scheduler.iter().find(|(k, v)| long(k) || long(v)) {
            return Err(WireError {
                path: format!("scheduler.{k}"),
                message: format!("longer than {MAX_LABEL_VALUE} bytes"),
            });
        }
        if r.job_name.as_deref().is_some_and(long) {
            return Err(WireError {
                path: "job_name".into(),
                message: format!("longer than {MAX_LABEL_VALUE} bytes"),
            });
        }
        Ok(r)
    }

    /// The profile labels of the process.
    pub fn labels(&self) -> std::collections::BTreeMap<String, String> {
        let mut l = std::collections::BTreeMap::new();
        l.insert("pid".to_string(), self.pid.to_string());
        if !self.job.is_empty() {
            l.insert("job".to_string(), self.job.clone());
        }
        if !self.host.is_empty() {
            l.insert("host".to_string(), self.host.clone());
        }
        if let Some(r) = self.rank {
            l.insert("rank".to_string(), r.to_string());
        }
        if let Some(r) = self.local_rank {
            l.insert("local_rank".to_string(), r.to_string());
        }
        if let Some(g) = &self.group {
            l.insert("group".to_string(), g.clone());
        }
        if let Some(n) = &self.job_name {
            l.insert("job_name".to_string(), n.clone());
        }
        for (k, v) in &self.scheduler {
            l.entry(k.clone()).or_insert_with(|| v.clone());
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_labels_profiles_with_the_schedulers_identity() {
        let r = ProcessRegistration::from_json(
            r#"{"pid": 42, "rank": 3, "job": "run-1", "host": "n1", "job_name": "llama-pretrain",
                "scheduler": {"slurm.job_id": "8812", "slurm.job_name": "llama-pretrain",
                              "k8s.namespace": "ml", "pid": "not this"}}"#,
        )
        .unwrap();
        let l = r.labels();
        assert_eq!(l["job_name"], "llama-pretrain");
        assert_eq!(l["slurm.job_id"], "8812");
        assert_eq!(l["k8s.namespace"], "ml");
        // The agent's own labels win over a scheduler label of that name.
        assert_eq!(l["pid"], "42");
        // Bounded: too many labels or too long a value is refused.
        let many: Vec<String> = (0..17).map(|i| format!(r#""l{i}": "v""#)).collect();
        let e = ProcessRegistration::from_json(&format!(
            r#"{{"pid": 1, "scheduler": {{{}}}}}"#,
            many.join(",")
        ))
        .unwrap_err();
        assert_eq!(e.path, "scheduler");
        let long = "x".repeat(201);
        let e = ProcessRegistration::from_json(&format!(
            r#"{{"pid": 1, "scheduler": {{"k8s.pod": "{long}"}}}}"#
        ))
        .unwrap_err();
        assert_eq!(e.path, "scheduler.k8s.pod");
        // Old registrations (no identity) still parse.
        let old = ProcessRegistration::from_json(r#"{"pid": 5, "job": "j"}"#).unwrap();
        assert!(old.job_name.is_none() && old.scheduler.is_empty());
    }

    #[test]
    fn requests_tolerate_nulls_unknown_fields_and_numeric_ids() {
        let r = AgentRequest::from_json(
            r#"{"pid": 5, "until_unix_s": null, "rate_hz": null, "interfaces": null, "future_field": 1}"#,
        )
        .unwrap();
        assert_eq!(r.rate_hz, DEFAULT_RATE_HZ);
        assert!(r.interfaces.is_empty() && r.until_unix_s.is_none() && r.tid.is_none());
        let r = AgentRequest::from_json(r#"{"pid": 7, "id": 3}"#).unwrap();
        assert_eq!(r.id.as_deref(), Some("3"));
        // What the agent writes back, it reads back.
        let again = AgentRequest::from_json(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
    }

    #[test]
    fn session_records_round_trip_and_are_checked() {
        let text = r#"{"session": 2, "target": 130, "iters": 60, "window_s": 0.0,
            "stamp": "20261123-044500", "reason": "slowdown +80 %", "proposer": 3,
            "world_size": 4, "collected": [0, 1, 2, 3]}"#;
        let s = SessionRecord::from_json(text).unwrap();
        assert_eq!((s.session, s.target, s.iters, s.proposer), (2, 130, 60, 3));
        let again = SessionRecord::from_json(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(again, s);
        for (edit, path) in [
            (("iters", "0"), "iters"),
            (("stamp", "\"../x\""), "stamp"),
            (("proposer", "4"), "proposer"),
            (("window_s", "-1"), "window_s"),
            (("target", "\"soon\""), "target"),
        ] {
            let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
            v[edit.0] = serde_json::from_str(edit.1).unwrap();
            let e = SessionRecord::from_json(&v.to_string()).unwrap_err();
            assert_eq!(e.path, path, "{e}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        for (bad, path) in [
            (r#"{}"#, "."),
            (r#"[]"#, "."),
            (r#"{"pid": "x"}"#, "pid"),
            (r#"{"pid": 1, "tid": 1e20}"#, "tid"),
            (r#"{"pid": 1, "interfaces": ["a", 2]}"#, "interfaces[1]"),
            (r#"{"pid": 1, "proc_start_ticks": -1}"#, "proc_start_ticks"),
        ] {
            let e = AgentRequest::from_json(bad).unwrap_err();
            assert_eq!(e.path, path, "{bad}: {e}");
        }
        assert!(AgentRequest::from_json("not json").is_err());
    }
}
