//! Slow-rank detection (SysOM-AI §3.1) on simulated collectives: ranks whose
//! clocks disagree, entries jittered, every rank leaving an instance when the
//! last one arrived plus the transfer. Varied: group sizes, how late the
//! straggler is and from when, sequence numbers or none (matching by
//! overlap), lost records, two ops in flight, and a busy host's hiccups (a
//! rank now and then descheduled for milliseconds before it enters).
//! Healthy groups stay silent.

use whyslow_diagnose::stragglers::{instances, slow_ranks, StragglerConfig};
use whyslow_model::collective::CollectiveRecord;
use whyslow_model::rng::SplitMix64;

struct Sim {
    ranks: u32,
    instances: usize,
    /// (rank, extra µs, from instance)
    straggler: Option<(u32, f64, usize)>,
    /// Clock offsets are drawn in ±this, µs.
    clock_us: f64,
    seq: bool,
    /// Share of records lost.
    lost: f64,
    /// A second op (a broadcast) right after each allreduce.
    two_ops: bool,
    /// Share of entries delayed by a scheduling hiccup of 2-25 ms (a
    /// 2-core host running 4 ranks and 4 agents: every rank 1.8-3.1 ms
    /// late on average, up to 24 ms at worst).
    hiccups: f64,
    /// Compute between steps, µs (drawn uniformly in this range).
    compute_us: (f64, f64),
}

fn simulate(s: &Sim, seed: u64) -> Vec<CollectiveRecord> {
    let mut rng = SplitMix64::new(seed);
    let offsets: Vec<f64> = (0..s.ranks).map(|_| rng.symmetric() * s.clock_us).collect();
    let mut out = Vec::new();
    let mut t = 1e9_f64; // µs
    let ops: &[&str] = if s.two_ops {
        &["allreduce", "broadcast"]
    } else {
        &["allreduce"]
    };
    for k in 0..s.instances {
        for (o, op) in ops.iter().enumerate() {
            let entries: Vec<f64> = (0..s.ranks)
                .map(|r| {
                    let mut e = t + rng.range(0.0, 300.0);
                    if rng.unit() < s.hiccups {
                        e += rng.range(2_000.0, 25_000.0);
                    }
                    if let Some((sr, extra, from)) = s.straggler {
                        if r == sr && k >= from {
                            e += extra * rng.range(0.8, 1.2);
                        }
                    }
                    e
                })
                .collect();
            let last = entries.iter().cloned().fold(f64::MIN, f64::max);
            let done = last + rng.range(1000.0, 5000.0);
            for r in 0..s.ranks {
                if rng.unit() < s.lost {
                    continue;
                }
                out.push(CollectiveRecord {
                    rank: r,
                    global_rank: Some(r),
                    group: "dp0".into(),
                    op: op.to_string(),
                    seq: s.seq.then_some((k * ops.len() + o) as u64),
                    entry_ns: ((entries[r as usize] + offsets[r as usize]) * 1e3) as u64,
                    exit_ns: ((done + rng.range(0.0, 30.0) + offsets[r as usize]) * 1e3) as u64,
                    bytes: 1 << 20,
                    source: "sim".into(),
                    open: false,
                });
            }
            t = done + rng.range(200.0, 2000.0);
        }
        t += rng.range(s.compute_us.0, s.compute_us.1); // compute until the next step
    }
    out
}

fn base(ranks: u32) -> Sim {
    Sim {
        ranks,
        instances: 150,
        straggler: None,
        clock_us: 50_000.0,
        seq: true,
        lost: 0.0,
        two_ops: false,
        hiccups: 0.0,
        compute_us: (30_000.0, 60_000.0),
    }
}

#[test]
fn the_late_rank_is_found_whatever_the_group_clocks_and_matching() {
    for seed in 0..8 {
        for ranks in [4, 8, 16] {
            // ≥ 14 % of the 50-60 ms per instance (8 ms), up to 70 %.
            for extra in [8_000.0, 15_000.0, 40_000.0] {
                for seq in [true, false] {
                    let sim = Sim {
                        straggler: Some((ranks / 2, extra, 0)),
                        seq,
                        // Without sequence numbers, overlap matching needs
                        // clocks within the collectives' duration (NTP-like).
                        clock_us: if seq { 50_000.0 } else { 200.0 },
                        two_ops: seed % 2 == 1,
                        ..base(ranks)
                    };
                    let got = slow_ranks(&simulate(&sim, seed), &StragglerConfig::default());
                    let named: Vec<u32> = got.iter().map(|s| s.rank).collect();
                    assert_eq!(
                        named,
                        vec![ranks / 2],
                        "seed {seed}, {ranks} ranks, {extra} µs, seq {seq}: {got:#?}"
                    );
                    let s = &got[0];
                    assert!(
                        (s.late_us - s.peers_late_us - extra).abs() < 0.25 * extra,
                        "lateness {} vs peers {} for {extra} µs injected",
                        s.late_us,
                        s.peers_late_us
                    );
                }
            }
        }
    }
}

/// A rank 3 ms late at ~50 ms per collective (6 %) is under the default
/// floor (10 %: what oversubscribed healthy hosts reach; see the module
/// docs), and named once the floor is lowered for dedicated hosts.
#[test]
fn lateness_under_the_relative_floor_is_named_only_with_a_lower_floor() {
    for seed in 0..6 {
        let sim = Sim {
            straggler: Some((2, 3_000.0, 0)),
            ..base(8)
        };
        let records = simulate(&sim, seed);
        assert!(
            slow_ranks(&records, &StragglerConfig::default()).is_empty(),
            "seed {seed}"
        );
        let lower = StragglerConfig {
            min_late_fraction: 0.03,
            ..StragglerConfig::default()
        };
        let named: Vec<u32> = slow_ranks(&records, &lower)
            .iter()
            .map(|s| s.rank)
            .collect();
        assert_eq!(named, vec![2], "seed {seed}");
    }
}

#[test]
fn healthy_groups_have_no_straggler() {
    for seed in 0..30 {
        for ranks in [3, 4, 8, 32] {
            for seq in [true, false] {
                let sim = Sim {
                    seq,
                    clock_us: if seq { 50_000.0 } else { 200.0 },
                    lost: if seed % 3 == 0 { 0.05 } else { 0.0 },
                    two_ops: seed % 2 == 0,
                    ..base(ranks)
                };
                let got = slow_ranks(&simulate(&sim, 100 + seed), &StragglerConfig::default());
                assert!(
                    got.is_empty(),
                    "seed {seed}, {ranks} ranks, seq {seq}: {got:#?}"
                );
            }
        }
    }
}

#[test]
fn only_the_recent_window_counts() {
    // Late from instance 120 of 150, inside the last 100: 30 ms in 30 of
    // them is a mean of 9 ms, above the 10 % floor.
    let late = Sim {
        straggler: Some((1, 30_000.0, 120)),
        ..base(8)
    };
    let got = slow_ranks(&simulate(&late, 7), &StragglerConfig::default());
    assert_eq!(
        got.iter().map(|s| s.rank).collect::<Vec<_>>(),
        vec![1],
        "{got:#?}"
    );
    // Late only in the first 40 instances: healed before the window.
    let healed = Sim {
        instances: 150,
        ..base(8)
    };
    let mut recs = simulate(
        &Sim {
            straggler: Some((1, 10_000.0, 0)),
            instances: 40,
            ..base(8)
        },
        8,
    );
    let t_last = recs.iter().map(|r| r.exit_ns).max().unwrap();
    for mut r in simulate(&healed, 9) {
        r.entry_ns += t_last;
        r.exit_ns += t_last;
        r.seq = r.seq.map(|s| s + 1000);
        recs.push(r);
    }
    assert!(slow_ranks(&recs, &StragglerConfig::default()).is_empty());
}

#[test]
fn lost_records_and_small_groups() {
    // 5 % of records lost: the instances with every rank still decide.
    let sim = Sim {
        straggler: Some((2, 8_000.0, 0)),
        lost: 0.05,
        ..base(8)
    };
    let got = slow_ranks(&simulate(&sim, 3), &StragglerConfig::default());
    assert_eq!(got.iter().map(|s| s.rank).collect::<Vec<_>>(), vec![2]);
    // Two ranks: no group to compare with.
    let two = Sim {
        straggler: Some((1, 8_000.0, 0)),
        ..base(2)
    };
    assert!(slow_ranks(&simulate(&two, 4), &StragglerConfig::default()).is_empty());
    // Matching by overlap puts one record per rank in each instance.
    let recs = simulate(
        &Sim {
            seq: false,
            clock_us: 100.0,
            two_ops: true,
            ..base(4)
        },
        5,
    );
    let insts = instances(&recs);
    assert_eq!(insts.len(), 300);
    assert!(insts.iter().all(|i| i.records.len() == 4));
}

#[test]
fn a_busy_hosts_hiccups_are_no_straggler_and_hide_none() {
    // Every rank now and then descheduled for milliseconds: some rank's
    // mean lateness always rises above its peers' over 100 instances; only
    // a consistent excess is a straggler.
    let mut false_alarms = Vec::new();
    for seed in 0..60 {
        for ranks in [3, 4, 8] {
            let sim = Sim {
                hiccups: 0.2,
                compute_us: (8_000.0, 16_000.0),
                two_ops: seed % 2 == 0,
                ..base(ranks)
            };
            let got = slow_ranks(&simulate(&sim, 500 + seed), &StragglerConfig::default());
            if !got.is_empty() {
                false_alarms.push((seed, ranks, got));
            }
        }
    }
    assert!(false_alarms.is_empty(), "{false_alarms:#?}");
    // A rank 5 ms late in every iteration is still found among the hiccups.
    for seed in 0..10 {
        for ranks in [3, 4, 8] {
            let sim = Sim {
                hiccups: 0.2,
                compute_us: (8_000.0, 16_000.0),
                straggler: Some((ranks - 1, 5_000.0, 0)),
                ..base(ranks)
            };
            let got = slow_ranks(&simulate(&sim, 700 + seed), &StragglerConfig::default());
            assert_eq!(
                got.iter().map(|s| s.rank).collect::<Vec<_>>(),
                vec![ranks - 1],
                "seed {seed}, {ranks} ranks: {got:#?}"
            );
        }
    }
}
