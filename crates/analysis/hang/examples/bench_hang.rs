//! Time to name a hang's culprit at cluster scale (issue 27):
//! `cargo run --release -p whyslow-hang --example bench_hang -- 16384`.
//!
//! N ranks with Flight Recorder state as torch keeps it (the last 200
//! collectives of each rank): tensor-parallel groups of 8, data-parallel
//! groups across them, the world group; one rank never issues step 51's
//! tensor-parallel all-gather, its 7 tp peers wait there, and every other
//! rank waits in its dp all-reduce or the world all-reduce behind them.

use std::time::Instant;

use whyslow_hang::{analyze, HangConfig};
use whyslow_model::hang::{
    CollectiveState, GroupInfo, HangEvidence, RankEvidence, RecordedCollective, StackFrame,
};

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4096);
    let tp = 8u32;
    let culprit = n / 2 + 3;
    let s = 1_000_000_000u64;
    let t0 = Instant::now();
    let mut ranks = Vec::with_capacity(n as usize);
    for r in 0..n {
        let tp_name = format!("tp{}", r / tp);
        let dp_name = format!("dp{}", r % tp);
        let groups = vec![
            GroupInfo {
                name: "0".into(),
                desc: "default_pg".into(),
                ranks: None,
            },
            GroupInfo {
                name: tp_name.clone(),
                desc: "tp".into(),
                ranks: Some((r / tp * tp..r / tp * tp + tp).collect()),
            },
            GroupInfo {
                name: dp_name.clone(),
                desc: "dp".into(),
                ranks: Some((0..n / tp).map(|k| k * tp + r % tp).collect()),
            },
        ];
        let mut cs = Vec::new();
        let c = |g: &str, seq: u64, line: u32, state| RecordedCollective {
            group: g.to_string(),
            seq,
            p2p: false,
            op: "all_reduce".into(),
            input_sizes: vec![vec![1024]],
            output_sizes: vec![vec![1024]],
            dtypes: vec![],
            state,
            created_ns: Some(seq * s + line as u64),
            frames: vec![StackFrame {
                function: "train".into(),
                file: "/job/train.py".into(),
                line,
            }],
            peer: None,
        };
        // Steps 18..=50 done (3 collectives each: ~100 entries kept).
        for step in 18..=50u64 {
            cs.push(c(&tp_name, step, 10, CollectiveState::Completed));
            cs.push(c(&dp_name, step, 20, CollectiveState::Completed));
            cs.push(c("0", step, 30, CollectiveState::Completed));
        }
        if r != culprit {
            if r / tp == culprit / tp {
                cs.push(c(&tp_name, 51, 10, CollectiveState::Scheduled));
            } else {
                cs.push(c(&tp_name, 51, 10, CollectiveState::Completed));
                cs.push(c(&dp_name, 51, 20, CollectiveState::Scheduled));
            }
        }
        ranks.push(RankEvidence {
            rank: r,
            groups,
            collectives: cs,
            dumped_at_ns: Some(200 * s),
            ..Default::default()
        });
    }
    let ev = HangEvidence {
        ranks,
        ..Default::default()
    };
    let built = t0.elapsed();
    let t1 = Instant::now();
    let report = analyze(&ev, &HangConfig::default());
    let took = t1.elapsed();
    let named: Vec<u32> = report.culprits.iter().map(|c| c.rank).collect();
    println!(
        "{n} ranks: culprits {named:?} (truth [{culprit}]), {} waiting; analysis {:.1} ms (evidence built in {:.1} ms)",
        report.waiting.len(),
        took.as_secs_f64() * 1e3,
        built.as_secs_f64() * 1e3
    );
    assert_eq!(named, vec![culprit]);
}
