//! Assembly of the [`FlowReport`] from the analysis' intermediate results
//! (its renderings are in `whyslow-report`).

use crate::classify::Classified;
use crate::jobs::Jobs;
use crate::timeline::RankTimelines;
use crate::{
    FlowFinding, FlowIndex, FlowReport, Job, Pair, Rank, RecurringStall, SwitchStats, Timelines,
    FLOW_REPORT_VERSION,
};

pub(crate) fn assemble(
    index: &FlowIndex<'_>,
    jobs: &Jobs,
    cls: &Classified,
    tl: RankTimelines,
    switches: Vec<SwitchStats>,
    findings: Vec<FlowFinding>,
    mut stalls: Vec<Vec<RecurringStall>>,
) -> FlowReport {
    let name = |id: u32| index.addrs[id as usize].to_string();
    let step_us = |j: usize| -> Option<f64> {
        let mut d: Vec<f64> = tl
            .ranks
            .iter()
            .filter(|r| r.job == j)
            .flat_map(|r| r.steps.iter().map(|s| s.dur_us() as f64))
            .collect();
        d.sort_by(f64::total_cmp);
        d.get(d.len() / 2).copied()
    };
    let jobs_out: Vec<Job> = (0..jobs.members.len())
        .map(|j| Job {
            id: j,
            members: jobs.members[j].iter().map(|&id| name(id)).collect(),
            machines: jobs.machines[j].clone(),
            clusters: jobs.clusters[j],
            dp_groups: cls.dp_groups[j]
                .iter()
                .map(|g| g.iter().map(|&id| name(id)).collect())
                .collect(),
            step_us: step_us(j),
            recurring_stalls: stalls.get_mut(j).map(std::mem::take).unwrap_or_default(),
        })
        .collect();
    let pairs: Vec<Pair> = index
        .pairs
        .iter()
        .enumerate()
        .map(|(p, &(a, b))| {
            let (a, b) = if index.addrs[a as usize] <= index.addrs[b as usize] {
                (a, b)
            } else {
                (b, a)
            };
            Pair {
                src: name(a),
                dst: name(b),
                kind: cls.kind[p],
                job: jobs.job_of[a as usize],
                flows: index.pair_flows[p].len(),
                steps: cls.steps[p],
                mode_distinct_sizes: cls.mode[p],
                refined: cls.refined[p],
            }
        })
        .collect();
    let ranks: Vec<Rank> = tl
        .ranks
        .iter()
        .map(|r| {
            let mean = if r.steps.is_empty() {
                0.0
            } else {
                r.steps.iter().map(|s| s.dur_us() as f64).sum::<f64>() / r.steps.len() as f64
            };
            Rank {
                address: name(r.id),
                job: r.job,
                dp_group: cls.group_of[r.id as usize],
                steps: r.steps.clone(),
                mean_step_us: mean,
            }
        })
        .collect();
    let events = tl.ranks.into_iter().map(|r| r.events).collect();
    FlowReport {
        version: FLOW_REPORT_VERSION,
        flows: index.records.len(),
        merged_duplicates: 0,
        control_flows: 0,
        window_start_us: index.records.iter().map(|r| r.start_us).min().unwrap_or(0),
        window_end_us: index.records.iter().map(|r| r.end_us()).max().unwrap_or(0),
        jobs: jobs_out,
        pairs,
        ranks,
        findings,
        switches,
        hops: Vec::new(),
        could_not_judge: None,
        timelines: Timelines { events },
    }
}
