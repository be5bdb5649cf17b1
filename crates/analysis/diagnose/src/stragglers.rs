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
//!    ranks' μ + kσ (k = 2), μ + `min_late_us`, and μ + `min_late_fraction`
//!    (10 %) of the group's time per collective (the window's span over its
//!    instances), and whose excess is consistent, is a straggler. The last
//!    three are ours: with few ranks the peers' σ is near 0 and some rank
//!    always comes a little late; a delay of under a millisecond is not a
//!    straggler worth a user's attention; and on a busy host every rank now
//!    and then enters milliseconds late (descheduled), so a mean can rise on
//!    a few such instances. Consistent: the rank's excess over its peers'
//!    mean, instance by instance, has a mean at least `min_t` (4) standard
//!    errors above zero (a paired t statistic; 4 rather than 2 because the
//!    bucketed all-reduces of one iteration are not independent).
//!
//!    The 10 % floor is measured, not chosen: on an oversubscribed host a
//!    healthy rank that shares its core with a busy neighbour is late
//!    *consistently*, so neither σ nor t rejects it. Healthy runs on this
//!    2-core VM with a busy core beside them: a 3-rank gloo job had rank 2
//!    1.32 ms above its peers at 22 ms per collective (6.0 %); a 4-host
//!    testbed job with 4 agents had rank 1 1.75 ms above at 25.9 ms
//!    (6.8 %, t = 4.07); an earlier one 1.08 ms (t = 2.7). Every injected
//!    fault on the testbed (noisy neighbour, file-lookup storm, softirq
//!    storm, slow reads, extra work: 8.8-26.9 ms) was ≥ 30 % of its group's
//!    time per collective. A straggler that costs its job under a tenth of
//!    each collective is left to the CPU and OS layers' diffs; lower
//!    `min_late_fraction` where hosts are dedicated. Measured on a healthy
//!    3-rank gloo job on 2 cores (tests/python/test_collectives.py): ranks
//!    0.69-0.80 ms behind the first at 19 ms per collective; with rank 2
//!    doing 25 ms of extra work: 25.6 ms against 0.63-0.66 ms.
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
    /// Least mean lateness above the other ranks' mean, as a fraction of
    /// the group's time per collective (not in the paper; 10 %: see the
    /// module docs for the healthy runs that set it).
    pub min_late_fraction: f64,
    /// Least complete instances in the window to judge a group.
    pub min_instances: usize,
    /// Least paired t statistic of the rank's excess over its peers (not in
    /// the paper: see the module docs).
    pub min_t: f64,
}

impl Default for StragglerConfig {
    fn default() -> Self {
        StragglerConfig {
            k: 2.0,
            window: 100,
            min_late_us: 1000.0,
            min_late_fraction: 0.10,
            min_instances: 5,
            min_t: 4.0,
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
    /// How consistent the excess is: its mean over its standard error,
    /// instance by instance (a paired t statistic).
    pub t: f64,
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
        // Records with a sequence number match by it; the others (a source
        // that numbers only some operations) by overlap.
        let (numbered, idx): (Vec<usize>, Vec<usize>) =
            idx.into_iter().partition(|&i| records[i].seq.is_some());
        let mut done: Vec<Instance> = Vec::new();
        {
            let mut keyed: BTreeMap<(&str, u64), Instance> = BTreeMap::new();
            let mut order: Vec<(&str, u64)> = Vec::new();
            for &i in &numbered {
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
            done.extend(order.into_iter().filter_map(|k| keyed.remove(&k)));
        }
        // By overlap: open instances with their common interval.
        struct Open {
            inst: Instance,
            lo: u64,
            hi: u64,
        }
        let mut open: Vec<Open> = Vec::new();
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
    whyslow_model::stats::median(v).unwrap_or(0.0)
}

/// One group's aligned entries over its recent complete instances: what
/// [`slow_ranks`] judges and the per-rank entry-time plot (SysOM-AI Fig. 5)
/// shows.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupLateness {
    /// Communication group.
    pub group: String,
    /// Its ranks, ascending.
    pub ranks: Vec<u32>,
    /// Per instance, in order: its earliest aligned entry (ns on the clock
    /// of the group's median rank) and each rank's lateness behind it, µs,
    /// in the order of `ranks`.
    pub instances: Vec<(f64, Vec<f64>)>,
    /// Instances of the group, complete or not, from the first to the last
    /// of `instances` (more than `instances.len()` when records were lost):
    /// the time per collective is the span over these.
    pub spanned: usize,
}

/// Per group of at least 3 ranks with at least `cfg.min_instances`
/// complete instances, the lateness of every rank in the last `cfg.window`
/// of them, clocks aligned on the near-simultaneous exits.
pub fn lateness(records: &[CollectiveRecord], cfg: &StragglerConfig) -> Vec<GroupLateness> {
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
        let complete: Vec<(usize, &Instance)> = insts
            .iter()
            .copied()
            .enumerate()
            .filter(|(_, i)| i.records.len() == ranks.len())
            .collect();
        let recent = &complete[complete.len().saturating_sub(cfg.window)..];
        if recent.len() < cfg.min_instances {
            continue;
        }
        let spanned = recent[recent.len() - 1].0 - recent[0].0 + 1;
        let recent: Vec<&Instance> = recent.iter().map(|(_, i)| *i).collect();
        // Clock offsets from the near-simultaneous exits.
        let mut dev: HashMap<u32, Vec<f64>> = HashMap::new();
        for inst in &recent {
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
        let rows = recent
            .iter()
            .map(|inst| {
                let aligned: Vec<f64> = ranks
                    .iter()
                    .map(|r| records[inst.records[r]].entry_ns as f64 - offset[r])
                    .collect();
                let first = aligned.iter().copied().fold(f64::INFINITY, f64::min);
                (first, aligned.iter().map(|t| (t - first) / 1e3).collect())
            })
            .collect();
        out.push(GroupLateness {
            group: group.to_string(),
            ranks,
            instances: rows,
            spanned,
        });
    }
    out
}

/// Per group, the ranks whose mean lateness into the last `cfg.window`
/// complete instances is above the others' (see the module docs).
pub fn slow_ranks(records: &[CollectiveRecord], cfg: &StragglerConfig) -> Vec<Straggler> {
    let mut out = Vec::new();
    for g in lateness(records, cfg) {
        let n = g.instances.len() as f64;
        let (lo, hi) = g
            .instances
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(x.0), b.max(x.0))
            });
        // Over every instance in the span: records lost from some make
        // fewer complete ones, not longer collectives.
        let per_instance_us = (hi - lo) / 1e3 / (g.spanned as f64 - 1.0).max(1.0);
        let min_excess = cfg.min_late_us.max(cfg.min_late_fraction * per_instance_us);
        let mean: Vec<f64> = (0..g.ranks.len())
            .map(|k| g.instances.iter().map(|x| x.1[k]).sum::<f64>() / n)
            .collect();
        for (i, (&rank, &l)) in g.ranks.iter().zip(&mean).enumerate() {
            let others: Vec<f64> = mean
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &x)| x)
                .collect();
            let m = others.iter().sum::<f64>() / others.len() as f64;
            let sd =
                (others.iter().map(|v| (v - m).powi(2)).sum::<f64>() / others.len() as f64).sqrt();
            let threshold = m + cfg.k * sd;
            let t = paired_t(&g.instances, i);
            if l > threshold && l - m > min_excess && t >= cfg.min_t {
                out.push(Straggler {
                    group: g.group.clone(),
                    rank,
                    late_us: l,
                    peers_late_us: m,
                    threshold_us: threshold,
                    instances: g.instances.len(),
                    t,
                });
            }
        }
    }
    out
}

/// The paired t statistic of rank `k`'s lateness minus its peers' mean
/// lateness over `instances` (`f64::MAX` when every difference is the same
/// and positive).
fn paired_t(instances: &[(f64, Vec<f64>)], k: usize) -> f64 {
    let d: Vec<f64> = instances
        .iter()
        .map(|(_, l)| {
            let peers = (l.iter().sum::<f64>() - l[k]) / (l.len() - 1).max(1) as f64;
            l[k] - peers
        })
        .collect();
    let n = d.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mean = d.iter().sum::<f64>() / n;
    let var = d.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let se = (var / n).sqrt();
    if se > 0.0 {
        mean / se
    } else if mean > 0.0 {
        f64::MAX
    } else {
        0.0
    }
}

/// Per group, the mean time between the starts of consecutive instances
/// whose start (earliest entry, on the records' clock) lies in `[from, to)`
/// ns; `None` for groups with fewer than `min_instances` there. The
/// iteration-time proxy of the temporal baseline: SysOM-AI §3.1 compares
/// against history only when iteration time rose on all ranks.
pub fn instance_periods(
    records: &[CollectiveRecord],
    from: u64,
    to: u64,
    min_instances: usize,
) -> BTreeMap<String, Option<f64>> {
    let mut starts: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for inst in instances(records) {
        let v = starts.entry(inst.group.clone()).or_default();
        if let Some(t) = inst.records.values().map(|&i| records[i].entry_ns).min() {
            if (from..to).contains(&t) {
                v.push(t);
            }
        }
    }
    starts
        .into_iter()
        .map(|(g, mut v)| {
            v.sort_unstable();
            let p = (v.len() >= min_instances.max(2))
                .then(|| (v[v.len() - 1] - v[0]) as f64 / (v.len() - 1) as f64);
            (g, p)
        })
        .collect()
}
