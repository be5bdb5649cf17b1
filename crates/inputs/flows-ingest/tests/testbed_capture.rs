//! A real capture: two training jobs on whyslow's testbed (6 network
//! namespaces behind 2 leaves and a spine), every switch's traffic exported
//! by softflowd as IPFIX packet reports and assembled by `whyslow flows
//! collect` (tests/fixtures/README.md has the command). The jobs wrote their
//! own ground truth (stage, DP group, pipeline peers, each optimizer step's
//! wall-clock end). LLMPrism §IV-A to §IV-D on traffic nobody synthesized:
//! jobs and pair types exact, step periods within the paper's 0.3 %, a
//! healthy run without findings, and a throttled leaf–spine link named by the
//! stretch of the flows that cross it (`whyslow_flows::hops`) and nothing else.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;
use whyslow_flows::{analyze, FindingLevel, FlowConfig, PairType};
use whyslow_flows_ingest::{read_flow_file, read_topology};

/// One capture and what its analysis must say.
struct Capture {
    name: &'static str,
    records: usize,
    /// The switch and link findings' subjects, in order. Step findings must
    /// each be a step the jobs themselves timed as slow.
    findings: &'static [&'static str],
}

/// `testbed-two-jobs`: the run of BENCHMARKS.md; `testbed-store-traffic`: a
/// CI run (busy core beside it) where rank 3 sent the rendezvous store on
/// host 0 one message over 1 KiB, a pair that is neither DP nor PP;
/// `testbed-slow-uplink-*`: the same jobs with the leaf0 ↔ spine link
/// throttled (both directions) 5 s after training started (at 50 Mbit/s
/// rank 3 then took 582 ms for a step of ≈ 440: a slow step, rightly flagged).
const CAPTURES: [Capture; 4] = [
    Capture {
        name: "testbed-two-jobs",
        records: 5005,
        findings: &[],
    },
    Capture {
        name: "testbed-store-traffic",
        records: 4113,
        findings: &[],
    },
    Capture {
        name: "testbed-slow-uplink-50mbit",
        records: 4283,
        findings: &["link leaf0<->spine"],
    },
    Capture {
        name: "testbed-slow-uplink-150mbit",
        records: 4121,
        findings: &["link leaf0<->spine"],
    },
];

fn capture(name: &str) -> PathBuf {
    let dir = whyslow_testkit::fixtures().join("flows").join(name);
    assert!(dir.is_dir(), "fixture missing: {}", dir.display());
    dir
}

/// Host h<i> has address 10.99.0.<i+1>.
fn addr(rank: &Value) -> String {
    let host = rank["host"].as_str().expect("host");
    format!("10.99.0.{}", host[1..].parse::<u32>().expect("h<i>") + 1)
}

struct Truth {
    members: Vec<Vec<String>>,
    pairs: BTreeMap<(String, String), PairType>,
    /// Median step time of each job's ranks, µs, keyed by its sorted members.
    periods: BTreeMap<Vec<String>, f64>,
    /// Steps (start, end in µs) some rank took ≥ 15 % longer than its median.
    slow_steps: Vec<(u64, u64)>,
}

fn truth(name: &str) -> Truth {
    let mut t = Truth {
        members: Vec::new(),
        pairs: BTreeMap::new(),
        periods: BTreeMap::new(),
        slow_steps: Vec::new(),
    };
    for job in ["truth-a", "truth-b"] {
        let dir = capture(name).join(job);
        let mut ranks: Vec<Value> = std::fs::read_dir(&dir)
            .expect("truth dir")
            .map(|e| {
                let p = e.expect("entry").path();
                serde_json::from_slice(&std::fs::read(&p).expect("read")).expect("json")
            })
            .collect();
        ranks.sort_by_key(|r| r["rank"].as_u64());
        let mut members: Vec<String> = ranks.iter().map(addr).collect();
        members.sort();
        let mut steps = Vec::new();
        for r in &ranks {
            let ends: Vec<f64> = r["step_end_unix_s"]
                .as_array()
                .expect("step ends")
                .iter()
                .map(|v| v.as_f64().expect("seconds"))
                .collect();
            let own: Vec<f64> = ends.windows(2).map(|w| (w[1] - w[0]) * 1e6).collect();
            let mut sorted = own.clone();
            sorted.sort_by(f64::total_cmp);
            let median = sorted[sorted.len() / 2];
            for (w, d) in ends.windows(2).zip(&own) {
                if *d >= 1.15 * median {
                    t.slow_steps
                        .push(((w[0] * 1e6) as u64, (w[1] * 1e6) as u64));
                }
            }
            steps.extend(own);
            for (kind, key) in [(PairType::Dp, "dp_group"), (PairType::Pp, "pp_peers")] {
                for q in r[key].as_array().expect("peers") {
                    let q = q.as_u64().expect("rank");
                    if q != r["rank"].as_u64().expect("rank") {
                        let (a, b) = (addr(r), addr(&ranks[q as usize]));
                        t.pairs.insert((a.clone().min(b.clone()), a.max(b)), kind);
                    }
                }
            }
        }
        steps.sort_by(f64::total_cmp);
        t.periods.insert(members.clone(), steps[steps.len() / 2]);
        t.members.push(members);
    }
    t
}

#[test]
fn two_real_jobs_from_real_switch_exports() {
    for c in &CAPTURES {
        check(c);
    }
}

fn check(c: &Capture) {
    let (name, count) = (c.name, c.records);
    let records = read_flow_file(&capture(name).join("flows.csv.gz")).expect("capture");
    assert_eq!(records.len(), count, "{name}");
    let topo = read_topology(&capture(name).join("topology.json")).expect("topology");
    let report = analyze(&records, Some(&topo), &FlowConfig::default());
    let t = truth(name);

    let mut jobs: Vec<Vec<String>> = report
        .jobs
        .iter()
        .map(|j| {
            let mut m: Vec<String> = j.members.iter().map(|a| a.to_string()).collect();
            m.sort();
            m
        })
        .collect();
    jobs.sort();
    let mut want = t.members.clone();
    want.sort();
    assert_eq!(jobs, want, "{name}");

    let pairs: BTreeMap<(String, String), PairType> = report
        .pairs
        .iter()
        .map(|p| {
            let (a, b) = (p.src.to_string(), p.dst.to_string());
            ((a.clone().min(b.clone()), a.max(b)), p.kind)
        })
        .collect();
    assert_eq!(pairs, t.pairs, "{name}");

    for j in &report.jobs {
        let mut m: Vec<String> = j.members.iter().map(|a| a.to_string()).collect();
        m.sort();
        let want = t.periods[&m];
        let got = j.step_us.expect("a step period");
        let err = (got - want).abs() / want;
        assert!(
            err <= 0.003,
            "{name}: job {m:?}: step period {got} µs vs {want} µs ({:.3} %)",
            100.0 * err
        );
    }
    let (steps, others): (Vec<_>, Vec<_>) = report
        .findings
        .iter()
        .partition(|f| f.level == FindingLevel::Step);
    let subjects: Vec<&str> = others.iter().map(|f| f.subject.as_str()).collect();
    assert_eq!(subjects, c.findings, "{name}: {:#?}", report.findings);
    for f in steps {
        let (from, to) = (
            f.start_us.expect("a step finding says when"),
            f.end_us.expect("a step finding says until when"),
        );
        assert!(
            t.slow_steps.iter().any(|&(a, b)| a < to && from < b),
            "{name}: no rank timed a slow step from {from} to {to} us: {f:#?}"
        );
    }
    // Hops measured on every capture: healthy ones at ×1, the throttled link
    // stretched in both directions.
    assert_eq!(report.hops.len(), 4, "{name}");
    for h in &report.hops {
        let throttled = !c.findings.is_empty() && (h.from == "leaf0" || h.to == "leaf0");
        let worst = h.stretch.max(h.peak_stretch);
        if throttled {
            assert!(worst >= 1.3, "{name}: {h:?}");
        } else {
            assert!(worst < 1.1, "{name}: {h:?}");
        }
    }
}

/// The same capture written by pyarrow 26 (zstd, `dur_us` as double) reads
/// as the same records.
#[cfg(feature = "parquet")]
#[test]
fn parquet_from_pyarrow_reads_as_the_csv() {
    let dir = capture("testbed-two-jobs");
    let csv = read_flow_file(&dir.join("flows.csv.gz")).expect("csv");
    let pq = read_flow_file(&dir.join("flows.parquet")).expect("parquet");
    assert_eq!(pq, csv);
}
