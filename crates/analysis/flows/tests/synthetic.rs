//! End-to-end checks of the LLMPrism pipeline on synthetic DP/PP traffic with ground
//! truth (jobs, pair types, step ends, findings).

use std::net::IpAddr;

use whyslow_flows::{analyze, FindingLevel, FlowConfig, FlowReport, SwitchPath};
use whyslow_testkit::flows::{generate, Fault, Synth, SynthCluster, SynthJob};

fn two_jobs() -> SynthCluster {
    SynthCluster {
        jobs: vec![
            // DP only, 4 replicas, 2 NICs per machine.
            SynthJob {
                dp: 4,
                pp: 1,
                tp: 2,
                steps: 25,
                ..Default::default()
            },
            // PP 3 stages × DP 2, 2 NICs per machine.
            SynthJob {
                dp: 2,
                pp: 3,
                tp: 2,
                steps: 25,
                microbatches: 4,
                ..Default::default()
            },
        ],
        machines_per_leaf: 2,
        jitter: 0.03,
        ..Default::default()
    }
}

fn check_structure(s: &Synth, r: &FlowReport) {
    if let Err(e) = s.truth.check_structure(r) {
        panic!("{e}");
    }
}

/// Mean relative error of reconstructed step durations vs. truth.
fn step_error(s: &Synth, r: &FlowReport) -> f64 {
    let mut errs = Vec::new();
    for rank in &r.ranks {
        let a: IpAddr = rank.address.parse().unwrap();
        let ends = &s.truth.step_ends[&a];
        let truth: Vec<u64> = ends.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            rank.steps.len() + 1 >= truth.len(),
            "{a}: {} steps, truth {}",
            rank.steps.len(),
            truth.len()
        );
        for (st, &t) in rank.steps.iter().zip(&truth) {
            errs.push((st.dur_us() as f64 - t as f64).abs() / t as f64);
        }
    }
    errs.iter().sum::<f64>() / errs.len() as f64
}

#[test]
fn healthy_cluster_is_recognized_and_quiet() {
    let s = generate(&two_jobs());
    let r = analyze(&s.records, Some(&s.topology), &FlowConfig::default());
    check_structure(&s, &r);
    let err = step_error(&s, &r);
    assert!(err < 0.003, "mean step error {err}");
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    // DP groups: job 0 has 2 lanes, job 1 has 3 stages × 2 lanes.
    let mut groups: Vec<usize> = r.jobs.iter().map(|j| j.dp_groups.len()).collect();
    groups.sort();
    assert_eq!(groups, vec![2, 6]);
}

#[test]
fn without_topology_each_lane_is_its_own_job() {
    let s = generate(&two_jobs());
    let r = analyze(&s.records, None, &FlowConfig::default());
    assert_eq!(r.jobs.len(), 4);
}

#[test]
fn noisy_pp_flows_and_short_windows_still_classify() {
    let mut c = two_jobs();
    c.noise = 0.01;
    c.jobs[1].steps = 8;
    c.jobs[0].steps = 8;
    let s = generate(&c);
    let r = analyze(&s.records, Some(&s.topology), &FlowConfig::default());
    check_structure(&s, &r);
}

#[test]
fn slow_step_is_flagged() {
    let mut c = two_jobs();
    c.faults = vec![Fault::SlowStep {
        job: 1,
        step: 12,
        factor: 1.8,
    }];
    let s = generate(&c);
    let r = analyze(&s.records, Some(&s.topology), &FlowConfig::default());
    let steps: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.level == FindingLevel::Step)
        .collect();
    assert_eq!(steps.len(), 1, "{:#?}", r.findings);
    assert_eq!(steps[0].job, Some(1));
    assert!(
        r.findings.iter().all(|f| f.level == FindingLevel::Step),
        "{:#?}",
        r.findings
    );
}

#[test]
fn slow_dp_group_is_flagged() {
    let mut c = two_jobs();
    c.faults = vec![Fault::SlowDpGroup {
        job: 1,
        stage: 2,
        lane: 1,
        factor: 3.0,
    }];
    let s = generate(&c);
    let r = analyze(&s.records, Some(&s.topology), &FlowConfig::default());
    let groups: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.level == FindingLevel::Group)
        .collect();
    assert_eq!(groups.len(), 1, "{:#?}", r.findings);
    // The group of stage 2, lane 1: machines d*3+2 → 10.1.3.2 and 10.1.6.2.
    assert!(
        groups[0].subject.contains("10.1.3.2") && groups[0].subject.contains("10.1.6.2"),
        "{}",
        groups[0].subject
    );
    assert!(
        r.findings.iter().all(|f| f.level != FindingLevel::Switch),
        "{:#?}",
        r.findings
    );
}

#[test]
fn throttled_switch_is_flagged() {
    let mut c = two_jobs();
    c.machines_per_leaf = 1;
    c.faults = vec![Fault::ThrottledSwitch {
        name: "leaf3".into(),
        factor: 3.0,
    }];
    let s = generate(&c);
    let r = analyze(&s.records, Some(&s.topology), &FlowConfig::default());
    let sw: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.level == FindingLevel::Switch)
        .collect();
    // The switch and its uplink (every flow through leaf3 also crosses leaf3<->spine).
    let subjects: Vec<&str> = sw.iter().map(|f| f.subject.as_str()).collect();
    assert_eq!(
        subjects,
        vec!["switch leaf3", "link leaf3<->spine"],
        "{:#?}",
        r.findings
    );
}

#[test]
fn concurrent_dp_flow_limit() {
    let s = generate(&two_jobs());
    let cfg = FlowConfig {
        max_concurrent_dp_flows: Some(2),
        ..Default::default()
    };
    let r = analyze(&s.records, Some(&s.topology), &cfg);
    assert!(r
        .findings
        .iter()
        .any(|f| f.level == FindingLevel::Switch && f.reason.contains("concurrent")));
}

#[test]
fn per_switch_reports_are_merged() {
    let s = generate(&two_jobs());
    // Split every flow into one report per switch, slightly shifted in time.
    let mut split = Vec::new();
    for r in &s.records {
        for (i, sw) in r.switches.iter().enumerate() {
            let mut x = r.clone();
            x.start_us += i as u64 * 3;
            x.switches = SwitchPath::one(sw.clone());
            split.push(x);
        }
    }
    split.reverse();
    let r = analyze(&split, Some(&s.topology), &FlowConfig::default());
    assert_eq!(r.flows, s.records.len());
    assert_eq!(r.merged_duplicates, split.len() - s.records.len());
    check_structure(&s, &r);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

#[test]
fn json_contract() {
    let s = generate(&two_jobs());
    let r = analyze(&s.records, Some(&s.topology), &FlowConfig::default());
    let v: serde_json::Value = serde_json::to_value(&r).unwrap();
    assert!(v["jobs"][0]["members"][0].is_string());
    assert!(v["pairs"][0]["src"].is_string() && v["pairs"][0]["dst"].is_string());
    assert!(["dp", "pp"].contains(&v["pairs"][0]["type"].as_str().unwrap()));
    assert!(v["ranks"][0]["address"].is_string());
    assert!(
        v["ranks"][0]["steps"][0]["start_us"].is_u64()
            && v["ranks"][0]["steps"][0]["end_us"].is_u64()
    );
    assert!(v["findings"].is_array());
    // Round trip.
    let back: FlowReport = serde_json::from_value(v).unwrap();
    assert_eq!(back.pairs, r.pairs);
    // Perfetto trace is valid JSON with events.
    let t: serde_json::Value =
        serde_json::from_str(&whyslow_report::flows::to_perfetto_trace(&r)).unwrap();
    assert!(t["traceEvents"].as_array().unwrap().len() > 100);
    let table = whyslow_report::flows::render_table(&r);
    assert!(table.contains("job 0") && table.contains("no findings"));
    let series = whyslow_report::flows::switch_bandwidth_series(&r);
    assert!(!series.is_empty() && series.iter().all(|x| !x.points.is_empty()));
}

#[test]
fn empty_and_degenerate_input() {
    let r = analyze(&[], None, &FlowConfig::default());
    assert!(r.jobs.is_empty() && r.pairs.is_empty() && r.findings.is_empty());
    let a: IpAddr = "10.0.0.1".parse().unwrap();
    let recs = vec![
        whyslow_flows::FlowRecord::new(0, a, a, 5, 0),
        whyslow_flows::FlowRecord::new(
            u64::MAX,
            a,
            "10.0.0.2".parse().unwrap(),
            u64::MAX,
            u64::MAX,
        ),
    ];
    let r = analyze(&recs, None, &FlowConfig::default());
    assert_eq!(r.jobs.len(), 1);
    let _ = whyslow_report::flows::to_perfetto_trace(&r);
    let _ = whyslow_report::flows::render_table(&r);
}
