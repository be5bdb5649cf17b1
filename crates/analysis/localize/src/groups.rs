//! Which workers the localizer compares (PerfTracker §4.3): one fingerprint
//! per rank, the missing ranks, the job's utilization source and hosts, and
//! the comparison groups.

use std::collections::HashMap;

use whyslow_model::UtilizationSource;

use crate::source::Source;
use crate::LocalizeConfig;

/// Most warnings of one kind listed individually; the rest are counted.
const MAX_LISTED_WARNINGS: usize = 10;
/// Most missing ranks listed in a report.
const MAX_MISSING_LISTED: usize = 1 << 22;

/// Fingerprints in rank order, the first of each rank (input order); a
/// warning per dropped duplicate.
pub(crate) fn first_per_rank<S: Source + ?Sized>(fps: &S, warnings: &mut Vec<String>) -> Vec<u32> {
    let n = fps.count();
    let mut order: Vec<u32> = (0..n as u32).collect();
    // Inputs usually come in rank order: then there is nothing to sort.
    if !(1..n).all(|i| fps.rank(i - 1) <= fps.rank(i)) {
        order.sort_unstable_by_key(|&i| (fps.rank(i as usize), i));
    }
    let mut kept: Vec<u32> = Vec::with_capacity(order.len());
    let mut dups = 0usize;
    for i in order {
        let rank = fps.rank(i as usize);
        if let Some(&last) = kept.last() {
            if fps.rank(last as usize) == rank {
                dups += 1;
                if dups <= MAX_LISTED_WARNINGS {
                    warnings.push(format!(
                        "duplicate fingerprint for worker {} ({}): kept the first one ({})",
                        rank,
                        fps.source_name(i as usize),
                        fps.source_name(last as usize)
                    ));
                }
                continue;
            }
        }
        kept.push(i);
    }
    if dups > MAX_LISTED_WARNINGS {
        warnings.push(format!(
            "… and {} more duplicate fingerprints dropped",
            dups - MAX_LISTED_WARNINGS
        ));
    }

    kept
}

/// Ranks below the world size (or the largest rank seen) without a
/// fingerprint, the first [`MAX_MISSING_LISTED`] of them.
pub(crate) fn missing_ranks<S: Source + ?Sized>(
    fps: &S,
    kept: &[u32],
    world_size: Option<u32>,
    warnings: &mut Vec<String>,
) -> Vec<u32> {
    let expected_end: u64 = match world_size {
        Some(ws) => u64::from(ws),
        None => kept
            .last()
            .map(|&i| u64::from(fps.rank(i as usize)) + 1)
            .unwrap_or(0),
    };
    let mut missing = Vec::new();
    let mut n_missing = 0u64;
    {
        let mut next = 0u64;
        let mut push_range = |from: u64, to: u64, missing: &mut Vec<u32>| {
            n_missing += to.saturating_sub(from);
            let mut r = from;
            while r < to && missing.len() < MAX_MISSING_LISTED {
                missing.push(r as u32);
                r += 1;
            }
        };
        for &i in kept {
            let r = u64::from(fps.rank(i as usize));
            if r >= expected_end {
                break;
            }
            push_range(next, r, &mut missing);
            next = r + 1;
        }
        push_range(next, expected_end, &mut missing);
    }
    if n_missing > missing.len() as u64 {
        warnings.push(format!(
            "{} missing ranks; only the first {} are listed",
            n_missing,
            missing.len()
        ));
    }
    if let Some(ws) = world_size {
        let outside = kept.iter().filter(|&&i| fps.rank(i as usize) >= ws).count();
        if outside > 0 {
            warnings.push(format!(
                "{outside} fingerprint(s) have a rank >= the world size {ws}"
            ));
        }
    }

    missing
}

/// The job's utilization source (`samples`, `trace`, `none`, `mixed`) and
/// its number of hosts, when known.
pub(crate) fn utilization_and_hosts<S: Source + ?Sized>(
    fps: &S,
    kept: &[u32],
) -> (String, Option<usize>) {
    let (mut s_samples, mut s_trace, mut s_none) = (false, false, false);
    for &i in kept {
        match fps.utilization_source(i as usize) {
            UtilizationSource::Samples => s_samples = true,
            UtilizationSource::Trace => s_trace = true,
            UtilizationSource::None => s_none = true,
        }
    }
    let hosts = fps.count_hosts(kept);
    let utilization_source = match (s_samples, s_trace, s_none) {
        (true, false, false) => "samples",
        (false, true, false) => "trace",
        (false, false, _) => "none",
        _ => "mixed",
    }
    .to_string();

    (utilization_source, (hosts > 0).then_some(hosts))
}

/// Comparison groups, by name (None first), members in rank order; warns
/// about ungrouped workers beside groups and groups too small for Δ.
pub(crate) fn comparison_groups<'a, S: Source + ?Sized>(
    fps: &'a S,
    kept: &[u32],
    cfg: &LocalizeConfig,
    warnings: &mut Vec<String>,
) -> Vec<(Option<&'a str>, Vec<u32>)> {
    let mut group_index: HashMap<Option<&str>, usize> = HashMap::new();
    let mut groups: Vec<(Option<&str>, Vec<u32>)> = Vec::new();
    for &i in kept {
        let gname = fps.group(i as usize);
        let gi = *group_index.entry(gname).or_insert_with(|| {
            groups.push((gname, Vec::new()));
            groups.len() - 1
        });
        groups[gi].1.push(i);
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    if groups.len() > 1 {
        if let Some((None, m)) = groups.first() {
            warnings.push(format!(
                "{} worker(s) have no group while others do: they are compared among themselves",
                m.len()
            ));
        }
    }
    let mut small = 0usize;
    for (gname, m) in &groups {
        if m.len() < cfg.min_peer_workers {
            small += 1;
            if small <= MAX_LISTED_WARNINGS {
                warnings.push(format!(
                    "{} has {} worker(s): too few to compare with peers (Δ rule needs {}), only expected ranges apply",
                    gname.map_or_else(|| "the job".to_string(), |g| format!("group {g:?}")),
                    m.len(),
                    cfg.min_peer_workers
                ));
            }
        }
    }

    groups
}
