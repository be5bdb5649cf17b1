//! Stage 7 of [`super::diagnose`]: the report, and what its plots and
//! flame graphs are drawn from (SysOM-AI Fig. 5–7).

use std::collections::BTreeMap;

use whyslow_model::diagnosis::{CollectiveGroup, DiagnoseReport, GpuDiff, LossyHost, OsDiffRow};
use whyslow_model::stack::StackProfile;

use super::{CpuLayer, Evidence, Judged, LateRanks, Periods};
use crate::job::{peer_pair, rank_row, FlamePair, HostView, LateGroup, ProfileKind};
use crate::stragglers::{GroupLateness, Straggler};

/// Stage 7a: the report.
#[allow(clippy::too_many_arguments)]
pub(super) fn report_of(
    ev: &Evidence<'_>,
    periods: &Periods,
    cpu: CpuLayer,
    late: &LateRanks,
    os_rows: Vec<OsDiffRow>,
    network_rows: Vec<LossyHost>,
    gpu_rows: Vec<GpuDiff>,
    judged: Judged,
    all_lateness: &[GroupLateness],
    notes: Vec<String>,
) -> DiagnoseReport {
    DiagnoseReport {
        stragglers: late.stragglers.clone(),
        layer: judged.layer.as_str().to_string(),
        cpu_diff: judged
            .host_rows
            .into_iter()
            .chain(cpu.flags.into_iter().filter_map(rank_row))
            .collect(),
        offcpu_diff: judged.offcpu_rows,
        os_diff: os_rows,
        network_diff: network_rows,
        gpu_diff: gpu_rows,
        regressions: cpu.regressions,
        origin_unix_ns: periods.t0,
        baseline: periods.baseline,
        window: periods.window,
        profiles: ev.profiles.len(),
        os_samples: ev.os_samples.len(),
        collective_groups: all_lateness
            .iter()
            .map(|g| collective_group(g, periods))
            .collect(),
        groups: cpu.summaries,
        notes,
        hang: ev.hang.clone(),
    }
}

/// A group's instances, period and each rank's mean lateness.
fn collective_group(g: &GroupLateness, periods: &Periods) -> CollectiveGroup {
    let n = g.instances.len().max(1) as f64;
    let span = g.instances.last().map(|x| x.0).unwrap_or(0.0)
        - g.instances.first().map(|x| x.0).unwrap_or(0.0);
    CollectiveGroup {
        group: g.group.clone(),
        instances: g.instances.len(),
        period_us: span / 1e3 / (n - 1.0).max(1.0),
        mean_late_us: g
            .ranks
            .iter()
            .enumerate()
            .map(|(k, &r)| {
                let mean = g.instances.iter().map(|x| x.1[k]).sum::<f64>() / n;
                (periods.world(&g.group, r), mean)
            })
            .collect(),
    }
}

/// The groups with a late rank, for the entry-time plot (Fig. 5).
pub(super) fn late_groups(all_lateness: &[GroupLateness], found: &[Straggler]) -> Vec<LateGroup> {
    all_lateness
        .iter()
        .filter(|g| found.iter().any(|s| s.group == g.group))
        .map(|g| LateGroup {
            flagged: found
                .iter()
                .filter(|s| s.group == g.group)
                .map(|s| s.rank)
                .collect(),
            lateness: g.clone(),
        })
        .collect()
}

/// Each group's window against its baseline (Fig. 7).
pub(super) fn group_diffs(
    groups: &BTreeMap<String, Vec<&StackProfile>>,
    periods: &Periods,
) -> Vec<FlamePair> {
    let (window, baseline) = (periods.window, periods.baseline);
    groups
        .iter()
        .map(|(g, ps)| {
            let merge = |r: (f64, f64)| {
                StackProfile::merged(ps.iter().copied().filter(|p| periods.within(p, r)))
            };
            FlamePair {
                title: format!(
                    "group {g}: {:.0}..{:.0} s against the baseline {:.0}..{:.0} s",
                    window.0, window.1, baseline.0, baseline.1
                ),
                group: Some(g.clone()),
                base: merge(baseline),
                test: merge(window),
            }
        })
        .collect()
}

/// The job's window against its baseline per kind of profile it has: for
/// CPU the verdict's group (the first with a regression), else the one
/// group, else every rank; off-CPU and host profiles over the whole job.
pub(super) fn job_diffs(
    ev: &Evidence<'_>,
    periods: &Periods,
    group_diffs: &[FlamePair],
    regressed: Option<&str>,
) -> Vec<(ProfileKind, FlamePair)> {
    let (window, baseline) = (periods.window, periods.baseline);
    let pair = |what: &str, group: Option<String>, ps: &[&StackProfile]| FlamePair {
        title: format!(
            "{what}: {:.0}..{:.0} s against the baseline {:.0}..{:.0} s",
            window.0, window.1, baseline.0, baseline.1
        ),
        group,
        base: StackProfile::merged(ps.iter().copied().filter(|p| periods.within(p, baseline))),
        test: StackProfile::merged(ps.iter().copied().filter(|p| periods.within(p, window))),
    };
    let mut out = Vec::new();
    let cpu = match regressed {
        Some(g) => group_diffs
            .iter()
            .find(|p| p.group.as_deref() == Some(g))
            .cloned(),
        None => None,
    }
    .or_else(|| match group_diffs {
        [one] => Some(one.clone()),
        _ => None,
    })
    .or_else(|| (!ev.profiles.is_empty()).then(|| pair("every rank", None, &ev.profiles)));
    if let Some(cpu) = cpu {
        out.push((ProfileKind::Cpu, cpu));
    }
    if !ev.offcpu_profiles.is_empty() {
        let p = pair("blocked time, every rank", None, &ev.offcpu_profiles);
        out.push((ProfileKind::OffCpu, p));
    }
    if !ev.host_profiles.is_empty() {
        let p = pair("every host", None, &ev.host_profiles);
        out.push((ProfileKind::Host, p));
    }
    out
}

/// Stage 7b: the differential flame graphs: each late rank against a peer
/// (CPU, blocked time, its host's processes), then the groups' window
/// against baseline (at most 4 of each).
pub(super) fn pictures(
    ev: &Evidence<'_>,
    periods: &Periods,
    late: &LateRanks,
    host_views: &[Option<HostView>],
    diffs: &[FlamePair],
) -> Vec<FlamePair> {
    let mut flames = Vec::new();
    let window_rank: Vec<&StackProfile> = ev
        .profiles
        .iter()
        .copied()
        .filter(|p| periods.in_window(p))
        .collect();
    let window_blocked: Vec<&StackProfile> = ev
        .offcpu_profiles
        .iter()
        .copied()
        .filter(|p| periods.in_window(p))
        .collect();
    for (s, view) in late.late.iter().zip(host_views).take(4) {
        let me = s.rank.to_string();
        flames.extend(peer_pair(&window_rank, "rank", &me, |peer| {
            format!("late rank {me} against rank {peer}")
        }));
        flames.extend(peer_pair(&window_blocked, "rank", &me, |peer| {
            format!("late rank {me} against rank {peer}: time blocked off the CPU")
        }));
        if let Some(view) = view {
            let hosts: Vec<&StackProfile> = ev
                .host_profiles
                .iter()
                .copied()
                .filter(|p| {
                    periods.in_window(p)
                        && p.labels
                            .get("host")
                            .is_some_and(|h| view.shares.contains_key(h))
                })
                .collect();
            flames.extend(peer_pair(&hosts, "host", &view.host, |peer| {
                format!(
                    "late rank {me}'s host {} against host {peer}: all their processes",
                    view.host
                )
            }));
        }
    }
    flames.extend(
        diffs
            .iter()
            .filter(|d| d.base.total() > 0 && d.test.total() > 0)
            .take(4)
            .cloned(),
    );
    flames
}
