//! Training timeline reconstruction (LLMPrism §IV-C).
//!
//! Each training step ends with a segment of DP collective traffic. For every rank
//! (address), BOCD on the intervals between the starts of its DP flows splits them into
//! bursts ([`crate::steps::divide`]); the end of the last DP flow of a burst
//! is the end of a training step, and a step spans from one such end to the next. PP
//! and DP flows of the rank form its event timeline (Fig. 4); the gaps between events
//! approximate computation.
//!
//! Extensions (not in the paper):
//! - a rank without any DP traffic (a pure pipeline job) falls back to bursts of all
//!   its flows, so it still gets steps;
//! - a step may hold several DP bursts (ZeRO: reduce-scatter, optimizer, then
//!   all-gather; a gap between them is as clear to BOCD as the compute gap between
//!   steps). [`crate::steps::bursts_per_step`] finds how many from the regularity of the burst
//!   ends: with k bursts per step, the ends of every k-th burst are evenly spaced
//!   while consecutive ones alternate short and long. A step then ends with each
//!   burst followed by idle time of the step-ending kind
//!   ([`crate::steps::step_ending_bursts`]), not with every k-th burst: a step
//!   whose phases came as one burst would shift the count for the rest of the run.
//! - a last step whose DP traffic the capture cut short (clearly fewer flows or
//!   bytes than the other steps) is dropped ([`drop_cut_last_step`]).
//! - a step whose DP phases BOCD split only now and then (a gap between them close
//!   to its threshold) would show as one short step beside one shorter than the
//!   others: [`join_split_bursts`] joins a burst to the next when their ends are
//!   less than 30 % of the median step apart (no real step is that much shorter
//!   than the others: they all do the same work).
//! - the division itself is [`crate::steps::divide`]: BOCD where its steps are
//!   regular, else the coarsest regular level of idle gaps (a DDP job's buckets
//!   leave gaps through the backward that BOCD cannot tell from step gaps; one
//!   flow per phase gives BOCD nothing to learn from).

use crate::bocd::BocdConfig;
use crate::classify::Classified;
use crate::jobs::Jobs;
use crate::steps::{bursts_per_step, divide, regular_levels, step_ending_bursts};
use crate::{FlowIndex, PairType, Step, TimelineEvent};

/// Reconstructed timeline of one rank.
#[derive(Debug, Clone, Default)]
pub struct RankTimeline {
    /// Address id.
    pub id: u32,
    /// Job index.
    pub job: usize,
    /// DP bursts: (first DP flow start, last DP flow end), one per step end.
    pub bursts: Vec<(u64, u64)>,
    /// Complete steps (between consecutive burst ends).
    pub steps: Vec<Step>,
    /// Flow record indices of each burst.
    pub burst_flows: Vec<Vec<u32>>,
    /// All events of the rank, sorted by start.
    pub events: Vec<TimelineEvent>,
}

/// Timelines of all ranks, sorted by address.
#[derive(Debug, Clone, Default)]
pub struct RankTimelines {
    /// One per address with flows.
    pub ranks: Vec<RankTimeline>,
    /// Rank index of each address id.
    pub rank_of: Vec<usize>,
}

/// Rebuild every rank's steps and events.
pub fn reconstruct(
    index: &FlowIndex<'_>,
    jobs: &Jobs,
    cls: &Classified,
    cfg: &BocdConfig,
) -> RankTimelines {
    let n = index.addrs.len();
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.sort_by_key(|&id| index.addrs[id as usize]);
    let mut rank_of = vec![0usize; n];
    for (r, &id) in order.iter().enumerate() {
        rank_of[id as usize] = r;
    }
    // The pairs of each address, in pair order; their flows are read pair by
    // pair (in time order within a pair), not record by record.
    let mut pairs_of: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (p, &(a, b)) in index.pairs.iter().enumerate() {
        pairs_of[a as usize].push(p as u32);
        pairs_of[b as usize].push(p as u32);
    }
    let mut ranks = Vec::with_capacity(n);
    let mut divided: Vec<RankFlows> = Vec::with_capacity(n);
    for &id in &order {
        let flows = rank_flows(index, cls, &pairs_of[id as usize]);
        let cps = divide(&flows.spans, cfg);
        let (bursts, burst_flows) = steps_at(index, &flows, &cps, true);
        divided.push(flows);
        let steps = steps_between(&bursts);
        let me = index.addrs[id as usize];
        let mut events: Vec<TimelineEvent> = Vec::new();
        for &p in &pairs_of[id as usize] {
            let (pa, pb) = index.pairs[p as usize];
            let peer = rank_of[if pa == id { pb } else { pa } as usize] as u32;
            let kind = cls.kind[p as usize];
            events.extend(index.pair_flows[p as usize].iter().map(|&i| {
                let r = index.rec(i);
                TimelineEvent {
                    start_us: r.start_us,
                    dur_us: r.dur_us,
                    kind,
                    send: r.src == me,
                    peer,
                    bytes: r.bytes,
                }
            }));
        }
        // Stable: flows starting together stay in pair order.
        events.sort_by_key(|e| e.start_us);
        ranks.push(RankTimeline {
            id,
            job: jobs.job_of[id as usize],
            bursts,
            steps,
            burst_flows,
            events,
        });
    }
    agree_with_the_job(index, &divided, &mut ranks);
    RankTimelines { ranks, rank_of }
}

/// A rank's DP flows (all its flows when it has no DP pair), sorted by start
/// (stable: flows starting together stay in pair order).
struct RankFlows {
    /// `(start, end)` µs of each flow.
    spans: Vec<(u64, u64)>,
    /// Flow record index of each flow.
    list: Vec<u32>,
}

/// The flows whose bursts end a rank's steps (§IV-C: its DP flows), read pair
/// by pair from `mine`, the rank's pairs.
fn rank_flows(index: &FlowIndex<'_>, cls: &Classified, mine: &[u32]) -> RankFlows {
    let has_dp = mine.iter().any(|&p| cls.kind[p as usize] == PairType::Dp);
    let mut keyed: Vec<(u64, u64, u32)> = Vec::new();
    for &p in mine {
        if has_dp && cls.kind[p as usize] != PairType::Dp {
            continue;
        }
        let spans = &index.pair_spans[p as usize];
        keyed.extend(
            index.pair_flows[p as usize]
                .iter()
                .zip(spans)
                .map(|(&i, &(s, e))| (s, e, i)),
        );
    }
    keyed.sort_by_key(|k| k.0);
    RankFlows {
        spans: keyed.iter().map(|k| (k.0, k.1)).collect(),
        list: keyed.iter().map(|k| k.2).collect(),
    }
}

/// One burst per step from the burst starts `cps` of `flows`: bursts cut at
/// `cps`, grouped k per step when `group` ([`bursts_per_step`],
/// [`step_ending_bursts`]), split bursts joined and a last step the capture cut
/// dropped.
fn steps_at(
    index: &FlowIndex<'_>,
    flows: &RankFlows,
    cps: &[usize],
    group: bool,
) -> (Vec<(u64, u64)>, Vec<Vec<u32>>) {
    let mut bursts = Vec::with_capacity(cps.len() + 1);
    let mut burst_flows: Vec<Vec<u32>> = Vec::with_capacity(cps.len() + 1);
    let mut prev = 0;
    for &cp in cps.iter().chain(std::iter::once(&flows.list.len())) {
        if cp > prev {
            let times = &flows.spans[prev..cp];
            let s = times.iter().map(|t| t.0).min().unwrap_or(0);
            let e = times.iter().map(|t| t.1).max().unwrap_or(0);
            bursts.push((s, e));
            burst_flows.push(flows.list[prev..cp].to_vec());
        }
        prev = cp;
    }
    let (k, phase) = if group {
        bursts_per_step(&bursts)
    } else {
        (1, 0)
    };
    if k > 1 {
        let ends = step_ending_bursts(&bursts, k, phase);
        (bursts, burst_flows) = merge_bursts(&bursts, burst_flows, &ends);
    }
    (bursts, burst_flows) = join_split_bursts(bursts, burst_flows);
    drop_cut_last_step(index, &mut bursts, &mut burst_flows);
    (bursts, burst_flows)
}

/// Steps between consecutive burst ends.
fn steps_between(bursts: &[(u64, u64)]) -> Vec<Step> {
    bursts
        .windows(2)
        .map(|w| Step {
            start_us: w[0].1,
            end_us: w[1].1,
        })
        .collect()
}

/// Median step duration (µs) of `steps`, or `None` with fewer than 3.
fn median_step(steps: &[Step]) -> Option<f64> {
    if steps.len() < 3 {
        return None;
    }
    let mut d: Vec<f64> = steps
        .iter()
        .map(|s| (s.end_us - s.start_us) as f64)
        .collect();
    d.sort_by(f64::total_cmp);
    Some(d[d.len() / 2])
}

/// How far (×) a rank's median step may lie from its job's before its division
/// is taken again at the job's period.
pub const MAX_PERIOD_DISAGREEMENT: f64 = 1.25;

/// Ranks of one job train in lockstep (§IV-C: every rank ends a step with the
/// job's DP traffic), so they share one step period. A rank whose median step
/// lies more than [`MAX_PERIOD_DISAGREEMENT`]× from the median of its job's
/// ranks (a division at every other step is as regular as the right one; a
/// straggler's short idle gaps can hide its step gaps among the rest) is
/// divided again at the level of idle gaps ([`regular_levels`]), with or
/// without grouping its bursts, whose steps come closest to the job's period,
/// if one comes within 1.15×. Needs 3 ranks with
/// steps in the job, so the majority is clear.
fn agree_with_the_job(index: &FlowIndex<'_>, flows: &[RankFlows], ranks: &mut [RankTimeline]) {
    let n_jobs = ranks.iter().map(|r| r.job + 1).max().unwrap_or(0);
    for job in 0..n_jobs {
        let mut medians: Vec<f64> = ranks
            .iter()
            .filter(|r| r.job == job)
            .filter_map(|r| median_step(&r.steps))
            .collect();
        if medians.len() < 3 {
            continue;
        }
        medians.sort_by(f64::total_cmp);
        let period = medians[medians.len() / 2];
        for (rank, flows) in ranks.iter_mut().zip(flows).filter(|(r, _)| r.job == job) {
            let off = median_step(&rank.steps).map_or(f64::INFINITY, |m| (m / period).ln().abs());
            if off <= MAX_PERIOD_DISAGREEMENT.ln() {
                continue;
            }
            // Each level with its bursts grouped into steps and not: seen
            // from one rank, reduce-scatter, optimizer, all-gather, compute
            // (two bursts a step) is every other step of a rank whose compute
            // gaps alternate.
            let best = regular_levels(&flows.spans)
                .into_iter()
                .flat_map(|cps| [true, false].map(|g| steps_at(index, flows, &cps, g)))
                .filter_map(|(b, f)| {
                    let m = median_step(&steps_between(&b))?;
                    Some(((m / period).ln().abs(), b, f))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((d, bursts, burst_flows)) = best {
                if d < off && d <= 1.15f64.ln() {
                    rank.steps = steps_between(&bursts);
                    rank.bursts = bursts;
                    rank.burst_flows = burst_flows;
                }
            }
        }
    }
}

/// Joins bursts into one per step: a step's bursts end with each burst that
/// `ends` marks ([`step_ending_bursts`]; the bursts after the last marked one
/// form the last group).
fn merge_bursts(
    bursts: &[(u64, u64)],
    flows: Vec<Vec<u32>>,
    ends: &[bool],
) -> (Vec<(u64, u64)>, Vec<Vec<u32>>) {
    let mut out = Vec::with_capacity(bursts.len() / 2 + 1);
    let mut out_flows = Vec::with_capacity(bursts.len() / 2 + 1);
    let mut cur: Option<(u64, u64)> = None;
    let mut cur_flows: Vec<u32> = Vec::new();
    for ((b, f), &end) in bursts.iter().zip(flows).zip(ends) {
        cur = Some(match cur {
            None => *b,
            Some((s, e)) => (s.min(b.0), e.max(b.1)),
        });
        cur_flows.extend(f);
        if end {
            out.push(cur.take().unwrap_or(*b));
            out_flows.push(std::mem::take(&mut cur_flows));
        }
    }
    if let Some(c) = cur {
        out.push(c);
        out_flows.push(cur_flows);
    }
    (out, out_flows)
}

/// Drops the last burst group when it holds clearly fewer DP flows (5 %) or
/// bytes (25 %: ring chunk sizes may vary) than the rank's other steps
/// ([`short_of_the_others`]): the capture ended
/// inside that step's DP traffic (after the reduce-scatter and before the
/// all-gather, or mid-ring), so its end is not the step's end (§IV-C takes the
/// end of a step's DP traffic as the step's end; a cut one makes the last step
/// 10–20 % short). Every step runs the same collectives, so their flows and
/// bytes barely vary. The first group stays: a capture that starts mid-step
/// still sees that step's end.
fn drop_cut_last_step(
    index: &FlowIndex<'_>,
    bursts: &mut Vec<(u64, u64)>,
    flows: &mut Vec<Vec<u32>>,
) {
    let n = flows.len();
    if n < 5 {
        return;
    }
    let count = |f: &Vec<u32>| f.len() as f64;
    let bytes = |f: &Vec<u32>| f.iter().map(|&i| index.rec(i).bytes as f64).sum::<f64>();
    let inner = &flows[1..n - 1];
    let last = &flows[n - 1];
    if short_of_the_others(count(last), inner.iter().map(count).collect(), 0.05)
        || short_of_the_others(bytes(last), inner.iter().map(bytes).collect(), 0.25)
    {
        bursts.pop();
        flows.pop();
    }
}

/// Whether `x` lies below the median of `v` by more than 3 median absolute
/// deviations and more than `share` of the median.
fn short_of_the_others(x: f64, mut v: Vec<f64>, share: f64) -> bool {
    if v.is_empty() {
        return false;
    }
    v.sort_by(f64::total_cmp);
    let med = v[v.len() / 2];
    let mut dev: Vec<f64> = v.iter().map(|y| (y - med).abs()).collect();
    dev.sort_by(f64::total_cmp);
    let mad = dev[dev.len() / 2];
    x < med - (3.0 * mad).max(share * med)
}

/// Joins each burst whose end is followed by the next burst's end within 30 % of
/// the median interval between burst ends (the step ends with the later one).
fn join_split_bursts(
    bursts: Vec<(u64, u64)>,
    flows: Vec<Vec<u32>>,
) -> (Vec<(u64, u64)>, Vec<Vec<u32>>) {
    if bursts.len() < 4 {
        return (bursts, flows);
    }
    let mut d: Vec<u64> = bursts.windows(2).map(|w| w[1].1 - w[0].1).collect();
    d.sort_unstable();
    let short = d[d.len() / 2] as f64 * 0.3;
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(bursts.len());
    let mut out_flows: Vec<Vec<u32>> = Vec::with_capacity(bursts.len());
    let n = bursts.len();
    let mut pending: Option<((u64, u64), Vec<u32>)> = None;
    for (i, (b, f)) in bursts.iter().zip(flows).enumerate() {
        let (mut cur, mut cur_flows) = (*b, f);
        if let Some((p, mut pf)) = pending.take() {
            cur = (p.0.min(cur.0), p.1.max(cur.1));
            pf.extend(cur_flows);
            cur_flows = pf;
        }
        if i + 1 < n && ((bursts[i + 1].1 - b.1) as f64) < short {
            pending = Some((cur, cur_flows));
        } else {
            out.push(cur);
            out_flows.push(cur_flows);
        }
    }
    (out, out_flows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use whyslow_model::flow::FlowRecord;

    /// `steps` steps of one burst of six 2 ms flows 1 ms apart; the idle gap
    /// after step k is `gap_ms(k)`.
    fn rank_records(rank: u8, steps: usize, gap_ms: impl Fn(usize) -> u64) -> Vec<FlowRecord> {
        let (me, peer) = (
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, rank)),
            IpAddr::V4(Ipv4Addr::new(10, 0, 1, rank)),
        );
        let mut t = 1_000_000u64;
        let mut out = Vec::new();
        for k in 0..steps {
            for _ in 0..6 {
                out.push(FlowRecord::new(t, me, peer, 1 << 20, 2_000));
                t += 3_000;
            }
            t += gap_ms(k) * 1_000;
        }
        out
    }

    #[test]
    fn a_rank_divided_at_every_other_step_takes_its_jobs_period() {
        // Three ranks with a 400 ms compute gap; the fourth's gaps alternate
        // 400 and 150 ms, so its own division is every other step (as regular
        // as the right one), and its job's period sets it right (§IV-C).
        let steps = 40;
        let mut records = Vec::new();
        for rank in 1..=3u8 {
            records.extend(rank_records(rank, steps, |_| 400));
        }
        records.extend(rank_records(
            4,
            steps,
            |k| if k % 2 == 0 { 400 } else { 150 },
        ));
        let index = FlowIndex::build(&records);
        let cfg = BocdConfig::default();
        let mut flows = Vec::new();
        let mut ranks = Vec::new();
        for (p, (spans, list)) in index.pair_spans.iter().zip(&index.pair_flows).enumerate() {
            let f = RankFlows {
                spans: spans.clone(),
                list: list.clone(),
            };
            let (bursts, burst_flows) = steps_at(&index, &f, &divide(&f.spans, &cfg), true);
            ranks.push(RankTimeline {
                id: p as u32,
                steps: steps_between(&bursts),
                bursts,
                burst_flows,
                ..Default::default()
            });
            flows.push(f);
        }
        let counts =
            |ranks: &[RankTimeline]| ranks.iter().map(|r| r.steps.len()).collect::<Vec<_>>();
        assert_eq!(
            counts(&ranks),
            [39, 39, 39, 19],
            "the straggler's own division halves"
        );
        agree_with_the_job(&index, &flows, &mut ranks);
        assert_eq!(counts(&ranks), [39, 39, 39, 39]);
        // A healthy job is left as it was.
        let before = counts(&ranks[..3]);
        agree_with_the_job(&index, &flows[..3], &mut ranks[..3]);
        assert_eq!(counts(&ranks[..3]), before);
    }
}
