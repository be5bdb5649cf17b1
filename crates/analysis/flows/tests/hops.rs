//! Hop stretch (`whyslow_flows::hops`) on a simulated leaf–spine fabric whose
//! switches each report the flowlets they see: healthy hops pass a message's
//! packets unchanged (a few µs later, cut points jittered); a slow hop
//! re-paces them at its rate and coalesces what arrives closer than the
//! flowlet gap. Varied: the throttled link and direction, the slowdown (1.8× to
//! 40×), how bursty senders are, lost reports, with and without a topology,
//! and the seeds. Healthy fabrics, however jittered, must stay silent.

use std::net::IpAddr;

use whyslow_flows::{analyze, hops, FindingLevel, FlowConfig, FlowRecord, SwitchPath, Topology};
use whyslow_model::rng::SplitMix64;
use whyslow_model::topology::{Machine, Switch};

/// Flowlet gap of the exporter side (the testbed's collector uses 5 ms).
const GAP_US: f64 = 5_000.0;

struct Fabric {
    /// Gb/s of each directed switch hop; absent: line rate (no re-pacing).
    slow: Vec<((&'static str, &'static str), f64)>,
    /// Host link rate, Gb/s.
    host_gbps: f64,
    /// Fraction of one switch's reports lost (`(switch, share)`).
    lost: Option<(&'static str, f64)>,
    /// Largest number of bursts a sender splits a message into.
    max_bursts: u64,
    /// Message (of each connection) from which the slow hops are slow.
    slow_from: usize,
}

fn leaf(host: u8) -> &'static str {
    if host < 3 {
        "leaf0"
    } else {
        "leaf1"
    }
}

fn addr(host: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, host + 1])
}

fn topology() -> Topology {
    let machines = (0..6)
        .map(|h| Machine {
            name: format!("h{h}"),
            addresses: vec![addr(h)],
            switch: Some(leaf(h).to_string()),
        })
        .collect();
    let sw = |n: &str, links: &[&str]| Switch {
        name: n.to_string(),
        links: links.iter().map(|s| s.to_string()).collect(),
        exporters: vec![],
    };
    Topology::new(
        machines,
        vec![
            sw("leaf0", &["spine"]),
            sw("leaf1", &["spine"]),
            sw("spine", &[]),
        ],
    )
    .expect("topology")
}

/// Per-switch flowlet reports of `messages` messages on each of 4 connections
/// (two cross-leaf pairs, both directions) and one leaf-local connection.
fn simulate(f: &Fabric, seed: u64, messages: usize) -> Vec<FlowRecord> {
    let mut rng = SplitMix64::new(seed);
    let conns: [(u8, u8); 5] = [(2, 3), (3, 2), (0, 4), (4, 0), (0, 1)];
    let mut out = Vec::new();
    for (ci, &(a, b)) in conns.iter().enumerate() {
        let path: Vec<&str> = if leaf(a) == leaf(b) {
            vec![leaf(a)]
        } else {
            vec![leaf(a), "spine", leaf(b)]
        };
        let mut t = 1_000_000.0 + rng.range(0.0, 50_000.0);
        for m in 0..messages {
            let bytes = rng.range(64e3, 1.5e6);
            // The sender's bursts (TCP windows), each at the host rate,
            // separated by more than the flowlet gap.
            let bursts = 1 + rng.below_incl(f.max_bursts.max(1) as usize - 1);
            let mut frags: Vec<(f64, f64, f64)> = Vec::new(); // (start, dur, bytes)
            let mut s = t;
            for _ in 0..bursts {
                let by = bytes / bursts as f64;
                let dur = by * 8.0 / (f.host_gbps * 1e3) * rng.range(0.9, 1.1);
                frags.push((s, dur, by));
                s += dur + GAP_US * rng.range(1.2, 3.0);
            }
            for (k, sw) in path.iter().enumerate() {
                if k > 0 {
                    let hop = (path[k - 1], *sw);
                    let slow = f.slow.iter().find(|(h, _)| *h == hop && m >= f.slow_from);
                    match slow {
                        Some(&(_, gbps)) => frags = repace(&frags, gbps),
                        None => {
                            // Store and forward: a few µs later, cut points jittered.
                            for fr in &mut frags {
                                fr.0 += rng.range(3.0, 15.0);
                                fr.1 *= rng.range(0.97, 1.03);
                            }
                        }
                    }
                }
                let lost = f
                    .lost
                    .is_some_and(|(n, share)| n == *sw && rng.unit() < share);
                if lost {
                    continue;
                }
                for &(start, dur, by) in &frags {
                    let mut r = FlowRecord::new(
                        start as u64,
                        addr(a),
                        addr(b),
                        by as u64,
                        dur.max(1.0) as u64,
                    );
                    r.src_port = Some(40_000 + ci as u16);
                    r.dst_port = Some(50_000 + ci as u16);
                    r.proto = Some(6);
                    r.switches = SwitchPath::one(*sw);
                    out.push(r);
                }
            }
            t = s + rng.range(30_000.0, 300_000.0);
        }
    }
    out.sort_by_key(|r| r.start_us);
    out
}

/// Fragments re-paced by a link of `gbps`: each leaves no earlier than the
/// previous one has drained (its first packet one packet time later); those
/// closer than the flowlet gap become one.
fn repace(frags: &[(f64, f64, f64)], gbps: f64) -> Vec<(f64, f64, f64)> {
    let mut out: Vec<(f64, f64, f64)> = Vec::new();
    let mut free = f64::MIN;
    let packet_us = 1500.0 * 8.0 / (gbps * 1e3);
    for &(start, _, by) in frags {
        let s = (start + packet_us).max(free);
        let dur = by * 8.0 / (gbps * 1e3);
        free = s + dur;
        match out.last_mut() {
            Some(last) if s - (last.0 + last.1) < GAP_US => {
                last.1 = s + dur - last.0;
                last.2 += by;
            }
            _ => out.push((s, dur, by)),
        }
    }
    out
}

fn link_findings(records: &[FlowRecord], topo: Option<&Topology>) -> Vec<String> {
    let report = analyze(records, topo, &FlowConfig::default());
    report
        .findings
        .iter()
        .filter(|f| f.level == FindingLevel::Switch && f.subject.starts_with("link "))
        .map(|f| f.subject.clone())
        .collect()
}

fn healthy() -> Fabric {
    Fabric {
        slow: vec![],
        host_gbps: 1.0,
        lost: None,
        max_bursts: 4,
        slow_from: 0,
    }
}

#[test]
fn healthy_fabrics_have_no_slow_hop() {
    let topo = topology();
    for seed in 0..12 {
        for max_bursts in [1, 4, 8] {
            let f = Fabric {
                max_bursts,
                ..healthy()
            };
            let recs = simulate(&f, seed, 60);
            for (name, t) in [("with", Some(&topo)), ("without", None)] {
                let hops = hops::hop_stats(&recs, t, 1024);
                assert!(!hops.is_empty(), "seed {seed}: no hop measured");
                for h in &hops {
                    assert!(
                        (0.9..1.1).contains(&h.stretch) && h.peak_stretch < 1.15,
                        "seed {seed}, {max_bursts} bursts, {name} topology: {h:?}"
                    );
                }
                assert_eq!(link_findings(&recs, t), Vec::<String>::new(), "seed {seed}");
            }
        }
    }
}

#[test]
fn a_throttled_link_is_named_in_either_direction_and_at_any_rate() {
    let topo = topology();
    let cases: [(&str, &str, &str); 4] = [
        ("leaf0", "spine", "link leaf0<->spine"),
        ("spine", "leaf0", "link leaf0<->spine"),
        ("leaf1", "spine", "link leaf1<->spine"),
        ("spine", "leaf1", "link leaf1<->spine"),
    ];
    for (seed, &(from, to, want)) in cases.iter().enumerate() {
        for gbps in [0.025, 0.05, 0.15, 0.5, 0.7] {
            for max_bursts in [1, 3, 6] {
                let f = Fabric {
                    slow: vec![((from, to), gbps)],
                    max_bursts,
                    ..healthy()
                };
                let recs = simulate(&f, 100 + seed as u64, 40);
                for t in [Some(&topo), None] {
                    assert_eq!(
                        link_findings(&recs, t),
                        vec![want.to_string()],
                        "{from}->{to} at {gbps} Gb/s, {max_bursts} bursts, topology {}",
                        t.is_some()
                    );
                }
                let hops = hops::hop_stats(&recs, Some(&topo), 1024);
                let slow = hops
                    .iter()
                    .find(|h| h.from == from && h.to == to)
                    .expect("the slow hop is measured");
                assert!(slow.stretch >= 1.2, "{slow:?}");
                // The hop after it passes the already-slow flows unchanged.
                for h in hops.iter().filter(|h| h.from == to) {
                    assert!(h.stretch < 1.1, "after the slow hop: {h:?}");
                }
            }
        }
    }
}

#[test]
fn a_link_that_slows_down_late_in_the_window_is_named() {
    let topo = topology();
    for seed in 0..6 {
        // 100 messages per connection (≈ 20 s), the last 25 throttled to 150 Mb/s.
        let f = Fabric {
            slow: vec![(("leaf1", "spine"), 0.15), (("spine", "leaf1"), 0.15)],
            slow_from: 75,
            ..healthy()
        };
        let recs = simulate(&f, 400 + seed, 100);
        assert_eq!(
            link_findings(&recs, Some(&topo)),
            vec!["link leaf1<->spine".to_string()],
            "seed {seed}"
        );
        let hops = hops::hop_stats(&recs, Some(&topo), 1024);
        let h = hops
            .iter()
            .find(|h| h.from == "leaf1")
            .expect("leaf1 → spine");
        assert!(h.peak_stretch > h.stretch, "{h:?}");
        let last = recs.iter().map(|r| r.start_us).max().unwrap_or(0);
        assert!(
            h.peak_end_us + hops::BIN_US > last,
            "the peak is at the end: {h:?}"
        );
    }
}

#[test]
fn a_switch_that_lost_reports_neither_hides_nor_fakes_a_slow_link() {
    let topo = topology();
    for seed in 0..6 {
        // Healthy, the spine lost a third of its reports: connections it did
        // not see in full are left out, the rest measure ×1.
        let f = Fabric {
            lost: Some(("spine", 0.33)),
            ..healthy()
        };
        assert_eq!(
            link_findings(&simulate(&f, 200 + seed, 60), Some(&topo)),
            Vec::<String>::new(),
            "seed {seed}"
        );
        // Throttled, and leaf1 lost a tenth of its reports.
        let f = Fabric {
            slow: vec![(("leaf0", "spine"), 0.1), (("spine", "leaf0"), 0.1)],
            lost: Some(("leaf1", 0.1)),
            ..healthy()
        };
        assert_eq!(
            link_findings(&simulate(&f, 300 + seed, 60), Some(&topo)),
            vec!["link leaf0<->spine".to_string()],
            "seed {seed}"
        );
    }
}

#[test]
fn a_slightly_slower_link_or_too_little_traffic_is_not_a_finding() {
    let topo = topology();
    // 1 Gb/s hosts behind a 0.9 Gb/s link: ×1.11, under the ×1.2 limit.
    let f = Fabric {
        slow: vec![(("leaf0", "spine"), 0.9)],
        max_bursts: 1,
        ..healthy()
    };
    assert_eq!(
        link_findings(&simulate(&f, 7, 60), Some(&topo)),
        Vec::<String>::new()
    );
    // A 10× slower link seen in two messages per connection: too few flowlets.
    let f = Fabric {
        slow: vec![(("leaf0", "spine"), 0.1)],
        max_bursts: 1,
        ..healthy()
    };
    assert_eq!(
        link_findings(&simulate(&f, 8, 2), Some(&topo)),
        Vec::<String>::new()
    );
    // The limit is a setting: off at 0.
    let cfg = FlowConfig {
        min_hop_stretch: 0.0,
        ..FlowConfig::default()
    };
    let recs = simulate(
        &Fabric {
            slow: vec![(("leaf0", "spine"), 0.05)],
            ..healthy()
        },
        9,
        40,
    );
    assert!(analyze(&recs, Some(&topo), &cfg)
        .findings
        .iter()
        .all(|f| !f.subject.starts_with("link ")));
}
