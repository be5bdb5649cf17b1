//! Performance diagnosis (LLMPrism §IV-D): k-σ rules across steps, DP groups and
//! switches.
//!
//! The k-σ rule flags a value above mean + kσ (k = 3; below mean − kσ for bandwidth).
//! Two documented deviations from the paper keep it meaningful on small samples:
//! the mean and σ are computed *without* the tested value (leave-one-out — with the
//! value included, one outlier among n ≤ 10 can never exceed 3σ since its z-score is
//! at most (n−1)/√n), and σ is floored at `min_rel_sigma` × mean so that near-constant
//! lab data does not flag tiny deviations.
//!
//! * **Cross-step**: each rank's step durations; flagged steps of one job that overlap
//!   in time are reported once, with the number of ranks that agree. Steps slow at a
//!   fixed period (every K ≥ 2 steps, each of them slow: a checkpoint, an evaluation)
//!   are a recurring stall of the job ([`recurring_stall`]), not a finding; the other
//!   steps are tested without them.
//! * **Cross-group**: the mean DP communication time per step (duration of each DP
//!   burst, first/last burst of the window excluded when possible) of each DP group of
//!   a job, compared across the job's DP groups (at least 3 of them: of two, neither
//!   is the odd one, and they are often stages of different size).
//! * **Switch-level**: per switch (and per inter-switch link, from consecutive switches
//!   of flow paths) the byte-weighted mean bandwidth of its DP flows per step window
//!   (the paper's statistic, plotted as Fig. 5) and the 90th percentile of per-flow DP
//!   bandwidth, which is what the k-σ rule (low tail) compares: with multi-switch
//!   paths a throttled switch also lowers the *mean* of every neighbour that carries
//!   some of its flows, while the neighbours' best flows stay fast. Switches and
//!   links with fewer than a tenth of the median DP flow count (or `min_samples`)
//!   are not compared (a path through two leaves and no spine is a lost report,
//!   not a link). Also the maximum
//!   number of concurrent DP flows through a switch against `max_concurrent_dp_flows`.

use crate::classify::Classified;
use crate::jobs::Jobs;
use crate::timeline::RankTimelines;
use crate::{
    FindingLevel, FlowConfig, FlowFinding, FlowIndex, FxHashMap, PairType, RecurringStall,
    SwitchStats, Topology,
};

/// A period in the slow steps of one rank: `Some((every, first))` when some of the
/// flagged indices `slow` (ascending) are evenly spaced by `every` ≥ 2 and every
/// step at that phase, from the first to the last complete one, is slow (above the
/// midpoint between the other steps' median and those steps' median). Of several
/// such periods, the one holding the most steps. A slow step that is not on the
/// period stays out of it (and is tested again without the period's steps); two
/// independent slow steps never make a period, since the steps at the same
/// spacing after them would have to be slow too.
pub fn recurring_stall(durations: &[f64], slow: &[usize]) -> Option<(usize, usize)> {
    let slow = &slow[..slow.len().min(64)];
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let holds = |every: usize, first: usize| -> Option<usize> {
        let on: Vec<usize> = (first..durations.len()).step_by(every).collect();
        let off: Vec<f64> = (0..durations.len())
            .filter(|i| i % every != first)
            .map(|i| durations[i])
            .collect();
        if on.len() < 2 || off.is_empty() {
            return None;
        }
        let cut = 0.5 * (median(on.iter().map(|&i| durations[i]).collect()) + median(off));
        on.iter().all(|&i| durations[i] > cut).then_some(on.len())
    };
    let mut best: Option<(usize, usize, usize)> = None; // (steps, every, first)
    for (x, &a) in slow.iter().enumerate() {
        for &b in &slow[x + 1..] {
            let every = b - a;
            if every < 2 {
                continue;
            }
            let first = a % every;
            if let Some(n) = holds(every, first) {
                let better = match best {
                    None => true,
                    Some((m, e, _)) => n > m || (n == m && every < e),
                };
                if better {
                    best = Some((n, every, first));
                }
            }
        }
    }
    best.map(|(_, every, first)| (every, first))
}

/// Leave-one-out k-σ test. Returns, for each value, `Some(threshold)` when it is an
/// outlier (above mean + kσ when `high`, below mean − kσ otherwise).
pub fn k_sigma_outliers(
    values: &[f64],
    k: f64,
    min_rel_sigma: f64,
    min_samples: usize,
    high: bool,
) -> Vec<Option<f64>> {
    let n = values.len();
    let mut out = vec![None; n];
    if n < min_samples.max(2) {
        return out;
    }
    let sum: f64 = values.iter().sum();
    let sum2: f64 = values.iter().map(|v| v * v).sum();
    let m = (n - 1) as f64;
    for (i, &v) in values.iter().enumerate() {
        let mean = (sum - v) / m;
        let var = ((sum2 - v * v) / m - mean * mean).max(0.0);
        let sigma = var.sqrt().max(min_rel_sigma * mean.abs());
        let thr = if high {
            mean + k * sigma
        } else {
            mean - k * sigma
        };
        let bad = if high { v > thr } else { v < thr };
        if bad && v.is_finite() {
            out[i] = Some(thr);
        }
    }
    out
}

/// What [`switch_stats`] gathers about one switch or link.
struct Acc {
    flows: usize,
    bytes: f64,
    dur: f64,
    starts: Vec<u64>,
    ends: Vec<u64>,
    bins: FxHashMap<u64, (f64, f64)>,
    bws: Vec<f64>,
    link: bool,
}

/// Count DP flow `r` at the switches and links `ids` (bins of width `bin` from `t0`).
fn add_flow(accs: &mut [(String, Acc)], ids: &[usize], r: &crate::FlowRecord, t0: u64, bin: u64) {
    for &k in ids {
        let a = &mut accs[k].1;
        a.flows += 1;
        a.starts.push(r.start_us);
        a.ends.push(r.end_us().max(r.start_us.saturating_add(1)));
        if r.dur_us > 0 {
            a.bytes += r.bytes as f64;
            a.dur += r.dur_us as f64;
            a.bws.push(gbps(r.bytes as f64, r.dur_us as f64));
            let b = a.bins.entry((r.start_us - t0) / bin).or_insert((0.0, 0.0));
            b.0 += r.bytes as f64;
            b.1 += r.dur_us as f64;
        }
    }
}

/// Per-switch DP statistics (input of the switch-level diagnosis and Fig. 5).
///
/// Links are the consecutive switches of merged flow paths; with a topology,
/// only those it links (two leaves on a path without its spine are a report
/// the spine lost, not a link).
pub fn switch_stats(
    index: &FlowIndex<'_>,
    cls: &Classified,
    tl: &RankTimelines,
    topology: Option<&Topology>,
) -> Vec<SwitchStats> {
    // Bin width: median step duration (falls back to 1 s).
    let mut durs: Vec<u64> = tl
        .ranks
        .iter()
        .flat_map(|r| r.steps.iter().map(|s| s.dur_us()))
        .collect();
    let bin = if durs.is_empty() {
        1_000_000
    } else {
        let mid = durs.len() / 2;
        *durs.select_nth_unstable(mid).1
    }
    .max(1);
    let t0 = index.records.iter().map(|r| r.start_us).min().unwrap_or(0);
    // Accumulators by name; each distinct switch path's names (switches, then
    // links) are worked out once, as accumulator indices.
    let mut accs: Vec<(String, Acc)> = Vec::new();
    let mut acc_of: FxHashMap<String, usize> = FxHashMap::default();
    let mut path_accs: FxHashMap<&[String], Vec<usize>> = FxHashMap::default();
    // The last path looked up: a pair's flows mostly share one (the same
    // `SwitchPath`, compared by pointer first).
    let mut last: Option<(&crate::SwitchPath, Vec<usize>)> = None;
    for (p, flows) in index.pair_flows.iter().enumerate() {
        if cls.kind[p] != PairType::Dp {
            continue;
        }
        for &i in flows {
            let r = index.rec(i);
            if let Some((path, ids)) = &last {
                if **path == r.switches {
                    add_flow(&mut accs, ids, r, t0, bin);
                    continue;
                }
            }
            let ids = path_accs.entry(&r.switches[..]).or_insert_with(|| {
                let mut names: Vec<(String, bool)> =
                    r.switches.iter().map(|s| (s.clone(), false)).collect();
                for w in r.switches.windows(2) {
                    if topology.and_then(|t| t.linked(&w[0], &w[1])) == Some(false) {
                        continue;
                    }
                    let (x, y) = if w[0] <= w[1] {
                        (&w[0], &w[1])
                    } else {
                        (&w[1], &w[0])
                    };
                    names.push((format!("{x}<->{y}"), true));
                }
                names
                    .into_iter()
                    .map(|(name, link)| {
                        *acc_of.entry(name.clone()).or_insert_with(|| {
                            accs.push((
                                name,
                                Acc {
                                    flows: 0,
                                    bytes: 0.0,
                                    dur: 0.0,
                                    starts: Vec::new(),
                                    ends: Vec::new(),
                                    bins: FxHashMap::default(),
                                    bws: Vec::new(),
                                    link,
                                },
                            ));
                            accs.len() - 1
                        })
                    })
                    .collect()
            });
            add_flow(&mut accs, ids, r, t0, bin);
            last = Some((&r.switches, ids.clone()));
        }
    }
    let mut out: Vec<SwitchStats> = accs
        .into_iter()
        .map(|(name, mut a)| {
            // Most flows open at once; a flow ending when another starts
            // does not overlap it.
            // Runs of sorted times (one per pair): a merge sort finds them.
            a.starts.sort();
            a.ends.sort();
            let (mut cur, mut max, mut j) = (0usize, 0usize, 0usize);
            for &t in &a.starts {
                while j < a.ends.len() && a.ends[j] <= t {
                    j += 1;
                    cur -= 1;
                }
                cur += 1;
                max = max.max(cur);
            }
            let mut per_step: Vec<(u64, u64, f64)> = a
                .bins
                .iter()
                .map(|(&k, &(by, du))| {
                    let a = t0.saturating_add(k.saturating_mul(bin));
                    (a, a.saturating_add(bin), gbps(by, du))
                })
                .collect();
            per_step.sort_by_key(|x| x.0);
            let p90 = if a.bws.is_empty() {
                0.0
            } else {
                let k = (a.bws.len() * 9 / 10).min(a.bws.len() - 1);
                *a.bws.select_nth_unstable_by(k, |x, y| x.total_cmp(y)).1
            };
            SwitchStats {
                name,
                link: a.link,
                p90_dp_gbps: p90,
                dp_flows: a.flows,
                max_concurrent_dp_flows: max,
                mean_dp_gbps: gbps(a.bytes, a.dur),
                per_step,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn gbps(bytes: f64, dur_us: f64) -> f64 {
    if dur_us > 0.0 {
        bytes * 8.0 / dur_us / 1e3
    } else {
        0.0
    }
}

fn ms(us: f64) -> String {
    format!("{:.3} ms", us / 1e3)
}

/// All findings: cross-step, cross-group, switch-level.
pub fn diagnose(
    index: &FlowIndex<'_>,
    jobs: &Jobs,
    cls: &Classified,
    tl: &RankTimelines,
    switches: &[SwitchStats],
    cfg: &FlowConfig,
) -> (Vec<FlowFinding>, Vec<Vec<RecurringStall>>) {
    let mut findings = Vec::new();
    let mut stalls = vec![Vec::new(); jobs.members.len()];
    for (job, job_stalls) in stalls.iter_mut().enumerate() {
        cross_step(job, tl, cfg, &mut findings, job_stalls);
    }
    cross_group(index, cls, tl, cfg, &mut findings);
    switch_level(switches, cfg, &mut findings);
    (findings, stalls)
}

/// Cross-step (LLMPrism §IV-D): each rank's steps against its own mean +
/// kσ, a recurring stall's steps set apart; the slow steps of a job's ranks
/// that overlap in time are one finding.
fn cross_step(
    job: usize,
    tl: &RankTimelines,
    cfg: &FlowConfig,
    findings: &mut Vec<FlowFinding>,
    job_stalls: &mut Vec<RecurringStall>,
) {
    let k = cfg.k_sigma;
    let ranks: Vec<_> = tl
        .ranks
        .iter()
        .filter(|r| r.job == job && !r.steps.is_empty())
        .collect();
    // (start, end, dur, threshold, step index)
    let mut flagged: Vec<(u64, u64, f64, f64, usize)> = Vec::new();
    let mut mean_sum = 0.0;
    // (every, first) → (ranks, extra time of each)
    let mut periodic: std::collections::BTreeMap<(usize, usize), (usize, Vec<f64>)> =
        Default::default();
    for r in &ranks {
        let mut d: Vec<f64> = r.steps.iter().map(|s| s.dur_us() as f64).collect();
        // A rank's first step is never judged (LLMPrism §IV-D compares
        // steps of a steady run): it holds the job's warm-up when the job
        // starts inside the window (connections, allocations, a first
        // iteration that compilation makes 10-20x a step; a rank that
        // finished it early, 1F1B's last stage, waits for the others
        // inside its step 0 (a CI run: one rank of four, step 0 of 4.1 s
        // against 0.45 s), and when the window starts mid-job it follows
        // whatever came before. It takes the median's place in the
        // statistics and is never flagged. (It was judged only when the
        // job's traffic began over max(2 steps, 1 s) before it: exactly a
        // long first iteration seen whole.)
        let warm_up = d.len() > 1;
        if warm_up {
            let mut rest = d[1..].to_vec();
            rest.sort_by(f64::total_cmp);
            d[0] = rest[rest.len() / 2];
        }
        let mut outliers = k_sigma_outliers(&d, k, cfg.min_rel_sigma, cfg.min_samples, true);
        if warm_up {
            outliers[0] = None;
        }
        let slow: Vec<usize> = (0..d.len()).filter(|&i| outliers[i].is_some()).collect();
        // Without a recurring stall's steps, the rest are tested on their own.
        let (kept, outliers) = match recurring_stall(&d, &slow) {
            Some((every, first)) => {
                let kept: Vec<usize> = (0..d.len()).filter(|i| i % every != first).collect();
                let rest: Vec<f64> = kept.iter().map(|&i| d[i]).collect();
                let mut sorted = rest.clone();
                sorted.sort_by(f64::total_cmp);
                let base = sorted[sorted.len() / 2];
                let e = periodic.entry((every, first)).or_default();
                e.0 += 1;
                e.1.extend((first..d.len()).step_by(every).map(|i| d[i] - base));
                let o = k_sigma_outliers(&rest, k, cfg.min_rel_sigma, cfg.min_samples, true);
                (kept, o)
            }
            None => ((0..d.len()).collect(), outliers),
        };
        let kept_d: Vec<f64> = kept.iter().map(|&i| d[i]).collect();
        mean_sum += kept_d.iter().sum::<f64>() / kept_d.len().max(1) as f64;
        for (j, t) in outliers.into_iter().enumerate() {
            if let Some(thr) = t {
                let i = kept[j];
                flagged.push((r.steps[i].start_us, r.steps[i].end_us, d[i], thr, i));
            }
        }
    }
    for ((every, first_step), (n, mut extra)) in periodic {
        extra.sort_by(f64::total_cmp);
        job_stalls.push(RecurringStall {
            every,
            first_step,
            extra_us: extra[extra.len() / 2],
            ranks: n,
        });
    }
    flagged.sort_by_key(|f| f.0);
    let mut i = 0;
    while i < flagged.len() {
        let mut j = i + 1;
        let mut end = flagged[i].1;
        while j < flagged.len() && flagged[j].0 < end {
            end = end.max(flagged[j].1);
            j += 1;
        }
        let g = &flagged[i..j];
        let dur = g.iter().map(|f| f.2).sum::<f64>() / g.len() as f64;
        let thr = g.iter().map(|f| f.3).sum::<f64>() / g.len() as f64;
        let mean = mean_sum / ranks.len().max(1) as f64;
        findings.push(FlowFinding {
            level: FindingLevel::Step,
            subject: format!("job {job} step {}", g[0].4),
            reason: format!(
                "step {} took {} on {}/{} ranks, above mean {} + {k}σ (threshold {})",
                whyslow_model::time::utc_span(g[0].0, end),
                ms(dur),
                g.len(),
                ranks.len(),
                ms(mean),
                ms(thr)
            ),
            job: Some(job),
            value: dur,
            threshold: thr,
            start_us: Some(g[0].0),
            end_us: Some(end),
        });
        i = j;
    }
}

/// Cross-group (LLMPrism §IV-D): each DP group's communication per step
/// against the other groups' of its job.
fn cross_group(
    index: &FlowIndex<'_>,
    cls: &Classified,
    tl: &RankTimelines,
    cfg: &FlowConfig,
    findings: &mut Vec<FlowFinding>,
) {
    let k = cfg.k_sigma;
    for (job, groups) in cls.dp_groups.iter().enumerate() {
        // With two groups, neither is "the odd one": they are often stages of
        // different size (a pipeline's first stage holds the embedding).
        if groups.len() < cfg.min_samples.max(3) {
            continue;
        }
        let means: Vec<f64> = groups
            .iter()
            .map(|g| {
                let mut sum = 0.0;
                let mut n = 0usize;
                for &id in g {
                    let r = &tl.ranks[tl.rank_of[id as usize]];
                    let b = &r.bursts;
                    let inner = if b.len() >= 3 {
                        &b[1..b.len() - 1]
                    } else {
                        &b[..]
                    };
                    for &(s, e) in inner {
                        sum += e.saturating_sub(s) as f64;
                        n += 1;
                    }
                }
                if n == 0 {
                    0.0
                } else {
                    sum / n as f64
                }
            })
            .collect();
        for (gi, t) in k_sigma_outliers(&means, k, cfg.min_rel_sigma, 2, true)
            .into_iter()
            .enumerate()
        {
            if let Some(thr) = t {
                let others: f64 =
                    (means.iter().sum::<f64>() - means[gi]) / (means.len() - 1) as f64;
                let members: Vec<String> = groups[gi]
                    .iter()
                    .map(|&id| index.addrs[id as usize].to_string())
                    .collect();
                findings.push(FlowFinding {
                    level: FindingLevel::Group,
                    subject: format!("job {job} dp group {gi} [{}]", members.join(", ")),
                    reason: format!(
                        "DP communication takes {} per step, above the other {} groups' mean {} + {k}σ (threshold {})",
                        ms(means[gi]),
                        means.len() - 1,
                        ms(others),
                        ms(thr)
                    ),
                    job: Some(job),
                    value: means[gi],
                    threshold: thr,
                    start_us: None,
                    end_us: None,
                });
            }
        }
    }
}

/// Switch level (LLMPrism §IV-D): each switch's and link's DP bandwidth
/// against the others', and the concurrent DP flows over the limit.
fn switch_level(switches: &[SwitchStats], cfg: &FlowConfig, findings: &mut Vec<FlowFinding>) {
    let k = cfg.k_sigma;
    // Switch-level: compare the 90th percentile of per-flow DP bandwidth (a switch or
    // link that is the bottleneck slows even its best flows; the mean of the paper also
    // drops on the neighbours that share flows with it, see the module docs).
    // Only switches and links that carry a share of the DP traffic are compared:
    // a path seen through two leaves and no spine (a report the spine lost) is
    // a "link" of one or two flows whose bandwidth says nothing.
    let mut counts: Vec<usize> = switches.iter().map(|s| s.dp_flows).collect();
    counts.sort_unstable();
    let enough = counts
        .get(counts.len() / 2)
        .map_or(0, |&m| (m / 10).max(cfg.min_samples));
    let compared: Vec<&SwitchStats> = switches.iter().filter(|s| s.dp_flows >= enough).collect();
    let bw: Vec<f64> = compared.iter().map(|s| s.p90_dp_gbps).collect();
    // Of two, neither is the odd one (as for DP groups): with one other value
    // σ is only the floor and a switch 15 % slower than its one neighbour
    // would be "an outlier".
    for (si, t) in k_sigma_outliers(&bw, k, cfg.min_rel_sigma, cfg.min_samples.max(3), false)
        .into_iter()
        .enumerate()
    {
        if let Some(thr) = t {
            let s = compared[si];
            let others: f64 = (bw.iter().sum::<f64>() - bw[si]) / (bw.len() - 1) as f64;
            if bw[si] > (1.0 - cfg.min_switch_drop) * others {
                continue;
            }
            findings.push(FlowFinding {
                level: FindingLevel::Switch,
                subject: format!("{} {}", if s.link { "link" } else { "switch" }, s.name),
                reason: format!(
                    "90th-percentile DP flow bandwidth {:.2} Gb/s (mean {:.2} Gb/s) over {} DP flows, below the other {} switches/links' mean {:.2} Gb/s − {k}σ (threshold {:.2} Gb/s)",
                    s.p90_dp_gbps,
                    s.mean_dp_gbps,
                    s.dp_flows,
                    bw.len() - 1,
                    others,
                    thr
                ),
                job: None,
                value: s.p90_dp_gbps,
                threshold: thr,
                start_us: None,
                end_us: None,
            });
        }
    }
    if let Some(limit) = cfg.max_concurrent_dp_flows {
        for s in switches {
            if s.max_concurrent_dp_flows > limit {
                findings.push(FlowFinding {
                    level: FindingLevel::Switch,
                    subject: format!("switch {}", s.name),
                    reason: format!(
                        "{} concurrent DP flows, above the limit of {limit}: risk of congestion",
                        s.max_concurrent_dp_flows
                    ),
                    job: None,
                    value: s.max_concurrent_dp_flows as f64,
                    threshold: limit as f64,
                    start_us: None,
                    end_us: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn k_sigma_flags_single_outlier_in_small_sample() {
        let v = [100.0, 101.0, 99.0, 100.5, 180.0];
        let o = k_sigma_outliers(&v, 3.0, 0.05, 3, true);
        assert!(o[4].is_some());
        assert!(o[..4].iter().all(|x| x.is_none()));
        let low = k_sigma_outliers(&[100.0, 98.0, 40.0], 3.0, 0.05, 2, false);
        assert!(low[2].is_some() && low[0].is_none() && low[1].is_none());
        assert!(k_sigma_outliers(&[1.0, 9.0], 3.0, 0.05, 3, true)
            .iter()
            .all(|x| x.is_none()));
    }
}
