//! Slow-rank detection (SysOM-AI §3.1, §3.2) from collective records.
//!
//! 1. **Instances.** A group's records are matched into collective instances
//!    by (op, sequence number) when every record has one; otherwise by
//!    overlap in time (§3.2: the calls of one instance overlap on all ranks),
//!    greedily: a record joins the oldest open instance of its op that lacks
//!    its rank and whose common interval it overlaps.
//! 2. **Clocks.** Ranks' clocks differ. Barrier semantics give the reference:
//!    no rank leaves a collective before the last one entered, so the ranks'
//!    exits of one instance are near-simultaneous. Each rank's offset is the
//!    median, over instances, of its exit minus the instance's median exit;
//!    entries are shifted by it.
//! 3. **Lateness.** A rank's lateness in an instance is its aligned entry
//!    minus the earliest aligned entry. Over the last `window` complete
//!    instances (W = 100), a rank whose mean lateness exceeds the other
//!    ranks' μ + kσ (k = 2) and μ + `min_late_us` is a straggler.
//!
//! As in the CPU waterline, μ and σ leave the tested rank out: with it, one
//! straggler among n ≤ 5 ranks could never exceed μ + 2σ.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use whyslow_model::collective::CollectiveRecord;

/// Thresholds of [`slow_ranks`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StragglerConfig {
    /// k of μ + kσ. Paper: 2.
    pub k: f64,
    /// W: the most recent complete instances judged. Paper: 100.
    pub window: usize,
    /// Least mean lateness above the other ranks' mean, µs (not in the
    /// paper: microseconds of jitter are no straggler).
    pub min_late_us: f64,
    /// Least complete instances in the window to judge a group.
    pub min_instances: usize,
}

impl Default for StragglerConfig {
    fn default() -> Self {
        StragglerConfig {
            k: 2.0,
            window: 100,
            min_late_us: 1000.0,
            min_instances: 5,
        }
    }
}

/// A rank that enters its group's collectives late.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    /// Communication group.
    pub group: String,
    /// Rank in the group.
    pub rank: u32,
    /// Mean lateness over the window, µs.
    pub late_us: f64,
    /// The other ranks' mean lateness, µs.
    pub peers_late_us: f64,
    /// μ + kσ of the other ranks, µs.
    pub threshold_us: f64,
    /// Complete instances judged.
    pub instances: usize,
}

/// One collective instance: the index of each rank's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    /// Group.
    pub group: String,
    /// Operation.
    pub op: String,
    /// Record index (into the input) per rank.
    pub records: BTreeMap<u32, usize>,
}

/// Matches records into instances (see the module docs), per group in order
/// of their first entry.
pub fn instances(records: &[CollectiveRecord]) -> Vec<Instance> {
    let mut by_group: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        by_group.entry(r.group.as_str()).or_default().push(i);
    }
    let mut out = Vec::new();
    for (group, mut idx) in by_group {
        idx.sort_by_key(|&i| (records[i].entry_ns, records[i].rank));
        if idx.iter().all(|&i| records[i].seq.is_some()) {
            let mut keyed: BTreeMap<(&str, u64), Instance> = BTreeMap::new();
            let mut order: Vec<(&str, u64)> = Vec::new();
            for &i in &idx {
                let r = &records[i];
                let key = (r.op.as_str(), r.seq.unwrap_or(0));
                let inst = keyed.entry(key).or_insert_with(|| {
                    order.push(key);
                    Instance {
                        group: group.to_string(),
                        op: r.op.clone(),
                        records: BTreeMap::new(),
                    }
                });
                inst.records.entry(r.rank).or_insert(i);
            }
            out.extend(order.into_iter().filter_map(|k| keyed.remove(&k)));
            continue;
        }
        // By overlap: open instances with their common interval.
        struct Open {
            inst: Instance,
            lo: u64,
            hi: u64,
        }
        let mut open: Vec<Open> = Vec::new();
        let mut done: Vec<Instance> = Vec::new();
        for &i in &idx {
            let r = &records[i];
            let (a, b) = (r.entry_ns, r.exit_ns.max(r.entry_ns));
            // An instance whose common interval ended before this entry can
            // take no more records.
            let (still, over): (Vec<Open>, Vec<Open>) = open.into_iter().partition(|o| o.hi >= a);
            done.extend(over.into_iter().map(|o| o.inst));
            open = still;
            match open.iter_mut().find(|o| {
                o.inst.op == r.op && !o.inst.records.contains_key(&r.rank) && a <= o.hi && o.lo <= b
            }) {
                Some(o) => {
                    o.lo = o.lo.max(a);
                    o.hi = o.hi.min(b);
                    o.inst.records.insert(r.rank, i);
                }
                None => open.push(Open {
                    inst: Instance {
                        group: group.to_string(),
                        op: r.op.clone(),
                        records: BTreeMap::from([(r.rank, i)]),
                    },
                    lo: a,
                    hi: b,
                }),
            }
        }
        done.extend(open.into_iter().map(|o| o.inst));
        done.sort_by_key(|inst| {
            inst.records
                .values()
                .map(|&i| records[i].entry_ns)
                .min()
                .unwrap_or(0)
        });
        out.extend(done);
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Per group, the ranks whose mean lateness into the last `cfg.window`
/// complete instances is above the others' (see the module docs).
pub fn slow_ranks(records: &[CollectiveRecord], cfg: &StragglerConfig) -> Vec<Straggler> {
    let all = instances(records);
    let mut by_group: BTreeMap<&str, Vec<&Instance>> = BTreeMap::new();
    for inst in &all {
        by_group.entry(inst.group.as_str()).or_default().push(inst);
    }
    let mut out = Vec::new();
    for (group, insts) in by_group {
        let ranks: Vec<u32> = {
            let mut r: Vec<u32> = insts
                .iter()
                .flat_map(|i| i.records.keys().copied())
                .collect();
            r.sort_unstable();
            r.dedup();
            r
        };
        if ranks.len() < 3 {
            continue;
        }
        let complete: Vec<&Instance> = insts
            .iter()
            .copied()
            .filter(|i| i.records.len() == ranks.len())
            .collect();
        let recent = &complete[complete.len().saturating_sub(cfg.window)..];
        if recent.len() < cfg.min_instances {
            continue;
        }
        // Clock offsets from the near-simultaneous exits.
        let mut dev: HashMap<u32, Vec<f64>> = HashMap::new();
        for inst in recent {
            let mut exits: Vec<f64> = inst
                .records
                .values()
                .map(|&i| records[i].exit_ns as f64)
                .collect();
            let m = median(&mut exits);
            for (&rank, &i) in &inst.records {
                dev.entry(rank)
                    .or_default()
                    .push(records[i].exit_ns as f64 - m);
            }
        }
        let offset: HashMap<u32, f64> = dev
            .into_iter()
            .map(|(r, mut v)| (r, median(&mut v)))
            .collect();
        let mut late: HashMap<u32, f64> = HashMap::new();
        for inst in recent {
            let aligned: Vec<(u32, f64)> = inst
                .records
                .iter()
                .map(|(&rank, &i)| (rank, records[i].entry_ns as f64 - offset[&rank]))
                .collect();
            let first = aligned.iter().map(|x| x.1).fold(f64::INFINITY, f64::min);
            for (rank, t) in aligned {
                *late.entry(rank).or_insert(0.0) += (t - first) / 1e3;
            }
        }
        let n = recent.len() as f64;
        let mean: Vec<(u32, f64)> = ranks.iter().map(|r| (*r, late[r] / n)).collect();
        for (i, &(rank, l)) in mean.iter().enumerate() {
            let others: Vec<f64> = mean
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, x)| x.1)
                .collect();
            let m = others.iter().sum::<f64>() / others.len() as f64;
            let sd =
                (others.iter().map(|v| (v - m).powi(2)).sum::<f64>() / others.len() as f64).sqrt();
            let threshold = m + cfg.k * sd;
            if l > threshold && l - m > cfg.min_late_us {
                out.push(Straggler {
                    group: group.to_string(),
                    rank,
                    late_us: l,
                    peers_late_us: m,
                    threshold_us: threshold,
                    instances: recent.len(),
                });
            }
        }
    }
    out
}
