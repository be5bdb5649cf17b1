//! What the server concluded of each job, as gauges on `/metrics` (issue
//! 30: alerts where people already look): findings in the job's latest
//! report, straggler ranks in its latest diagnosis, a hang, and the
//! iteration-time slowdown at the onset (PerfTracker §4.1). Label
//! cardinality is bounded: the [`MAX_JOB_SERIES`] jobs concluded most
//! recently, none older than [`JOB_SERIES_TTL`].

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder,
};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use whyslow_model::diagnosis::DiagnoseReport;
use whyslow_model::flow::FlowReport;
use whyslow_model::hang::HangReport;
use whyslow_model::Report;
use whyslow_report::status::{self, Health, StatusLine};

/// Jobs exported at most.
pub const MAX_JOB_SERIES: usize = 200;

/// A job's gauges go when nothing was concluded of it for this long.
pub const JOB_SERIES_TTL: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, Clone)]
struct Verdict {
    findings: Option<u64>,
    stragglers: Option<u64>,
    hang: Option<bool>,
    slowdown: Option<f64>,
    /// What the latest report, diagnosis, hang report and flow analysis
    /// say, in words (whyslow_report::status): the jobs list's status column.
    said: [Option<StatusLine>; 4],
    at: Instant,
}

/// The latest conclusions per (tenant, job).
#[derive(Debug, Default)]
pub struct JobVerdicts {
    jobs: Mutex<BTreeMap<(i64, String), Verdict>>,
}

/// The gauges: name, help.
const GAUGES: [(&str, &str); 4] = [
    (
        "whyslow_job_findings",
        "findings in the job's latest report (abnormal function executions)",
    ),
    (
        "whyslow_job_straggler_ranks",
        "ranks late into their collectives in the job's latest diagnosis",
    ),
    (
        "whyslow_job_hang",
        "1 when the job's latest hang report says it hangs",
    ),
    (
        "whyslow_job_slowdown_ratio",
        "iteration time after the onset over before it, in the job's latest report",
    ),
];

impl JobVerdicts {
    fn update(&self, tenant: i64, job: &str, f: impl FnOnce(&mut Verdict)) {
        let Ok(mut jobs) = self.jobs.lock() else {
            return;
        };
        let now = Instant::now();
        let v = jobs.entry((tenant, job.to_string())).or_insert(Verdict {
            findings: None,
            stragglers: None,
            hang: None,
            slowdown: None,
            said: [None, None, None, None],
            at: now,
        });
        v.at = now;
        f(v);
        jobs.retain(|_, v| now.duration_since(v.at) < JOB_SERIES_TTL);
        if jobs.len() > MAX_JOB_SERIES {
            let mut ages: Vec<Instant> = jobs.values().map(|v| v.at).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() - MAX_JOB_SERIES];
            jobs.retain(|_, v| v.at >= cut);
        }
    }

    /// A session's report of the job was computed.
    pub fn report(&self, tenant: i64, job: &str, r: &Report) {
        let slowdown = r
            .iterations
            .as_ref()
            .and_then(|i| i.onset.as_ref())
            .filter(|o| o.before_ms > 0.0)
            .map(|o| o.after_ms / o.before_ms);
        self.update(tenant, job, |v| {
            v.findings = Some(r.findings.len() as u64);
            v.slowdown = slowdown.or(Some(1.0));
            v.said[0] = Some(status::report_status(r));
        });
    }

    /// The job's diagnosis was computed.
    pub fn diagnosis(&self, tenant: i64, job: &str, d: &DiagnoseReport) {
        self.update(tenant, job, |v| {
            v.stragglers = Some(d.stragglers.len() as u64);
            v.said[1] = Some(status::diagnosis_status(d));
        });
    }

    /// A hang report of the job arrived.
    pub fn hang(&self, tenant: i64, job: &str, hangs: bool) {
        self.update(tenant, job, |v| v.hang = Some(hangs));
    }

    /// A hang report of the job arrived, with what it says.
    pub fn hang_report(&self, tenant: i64, job: &str, r: &HangReport) {
        self.update(tenant, job, |v| {
            v.hang = Some(r.hang);
            v.said[2] = Some(status::hang_status(r));
        });
    }

    /// A flow analysis of the job was read.
    pub fn flows(&self, tenant: i64, job: &str, f: &FlowReport) {
        self.update(tenant, job, |v| v.said[3] = Some(status::flows_status(f)));
    }

    /// What was concluded of the job, worst first; `None` when nothing
    /// was (or it was forgotten: [`MAX_JOB_SERIES`], [`JOB_SERIES_TTL`]).
    pub fn status(&self, tenant: i64, job: &str) -> Option<(Health, Vec<String>)> {
        let jobs = self.jobs.lock().ok()?;
        let v = jobs.get(&(tenant, job.to_string()))?;
        let parts: Vec<StatusLine> = v.said.iter().flatten().cloned().collect();
        (!parts.is_empty()).then(|| status::job_status(&parts))
    }

    /// Whether a session's report of the job is among what was concluded.
    pub fn has_report(&self, tenant: i64, job: &str) -> bool {
        self.jobs
            .lock()
            .map(|j| {
                j.get(&(tenant, job.to_string()))
                    .is_some_and(|v| v.said[0].is_some())
            })
            .unwrap_or(false)
    }

    /// Registers the gauges, one series per job concluded of (their HELP
    /// and TYPE even without a job, so rules and dashboards can be checked
    /// against them).
    pub fn register(&self, registry: &mut Registry) {
        let jobs = self.jobs.lock().map(|j| j.clone()).unwrap_or_default();
        registry.register_collector(Box::new(JobGauges(jobs)));
    }
}

/// The gauges of a snapshot of the verdicts, encoded as a collector: a
/// registered family without series would leave out its HELP.
#[derive(Debug)]
struct JobGauges(BTreeMap<(i64, String), Verdict>);

impl Collector for JobGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (i, (name, help)) in GAUGES.iter().enumerate() {
            let family = Family::<JobLabels, Gauge<f64, AtomicU64>>::default();
            for ((tenant, job), v) in &self.0 {
                let value = match i {
                    0 => v.findings.map(|n| n as f64),
                    1 => v.stragglers.map(|n| n as f64),
                    2 => v.hang.map(|h| f64::from(u8::from(h))),
                    _ => v.slowdown,
                };
                if let Some(x) = value {
                    let labels = JobLabels {
                        tenant: *tenant,
                        job: Escaped(job.clone()),
                    };
                    family.get_or_create(&labels).set(x);
                }
            }
            let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
            family.encode(metric)?;
        }
        Ok(())
    }
}

/// A job's series: its tenant and name.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    tenant: i64,
    job: Escaped,
}

/// A label value escaped as the text formats want (`\\`, `\"`, `\n`):
/// prometheus-client writes label values as given
/// (prometheus/client_rust#151). Job names are checked at the edge and
/// cannot hold these characters today; the series stays parseable if that
/// ever changes.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Escaped(String);

impl EncodeLabelValue for Escaped {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_are_bounded_and_render() {
        let v = JobVerdicts::default();
        v.hang(1, "j\"1\\\n", true);
        v.update(1, "j2", |x| x.stragglers = Some(0));
        let mut registry = Registry::default();
        v.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(r#"whyslow_job_hang{tenant="1",job="j\"1\\\n"} 1.0"#),
            "{text}"
        );
        assert!(
            text.contains("whyslow_job_straggler_ranks{tenant=\"1\",job=\"j2\"} 0.0"),
            "{text}"
        );
        assert!(text.contains("# TYPE whyslow_job_findings gauge"));
        for i in 0..(MAX_JOB_SERIES + 50) {
            v.hang(2, &format!("many-{i}"), false);
        }
        let n = v.jobs.lock().unwrap().len();
        assert!(n <= MAX_JOB_SERIES, "{n}");
    }
}
