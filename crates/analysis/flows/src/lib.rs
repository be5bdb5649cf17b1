//! Black-box diagnosis of distributed training from network flow records,
//! after LLMPrism (Jiang et al., "LLMPrism: Black-box Performance Diagnosis for
//! Production LLM Training Platforms", §IV).
//!
//! The pipeline is pure (no I/O) and runs in four phases, as in the paper's Fig. 2:
//!
//! 1. **Job recognition** (§IV-A, Algorithm 1, [`jobs`]): a disjoint-set over flow
//!    endpoints gives *cross-machine clusters*; clusters whose machine sets (from the
//!    [`Topology`]) have Jaccard similarity 1 are merged into jobs.
//! 2. **Parallelism identification** (§IV-B, Algorithm 2, [`classify`]): per endpoint
//!    pair, the inter-flow intervals are split into training steps by Bayesian Online
//!    Change-point Detection ([`bocd`], Adams & MacKay 2007); a pair whose mode of
//!    distinct flow sizes per step is 1 is pipeline-parallel (PP), otherwise
//!    data-parallel (DP); a depth-first search over the DP graph then refines every pair
//!    inside a DP connected component to DP (transitivity of DP groups).
//! 3. **Timeline reconstruction** (§IV-C, [`timeline`]): per rank (address), BOCD on the
//!    intervals between its DP flows splits them into bursts; the end of each DP burst is
//!    the end of a training step.
//! 4. **Diagnosis** (§IV-D, [`diagnose`]): k-σ rules (k = 3) across steps, across DP
//!    groups and across switches (mean DP bandwidth per switch per step, concurrent DP
//!    flows per switch).
//!
//! The entry point is [`analyze`]; its [`FlowReport`] serializes to the JSON contract of
//! `whyslow flows analyze --format json` (`jobs`, `pairs`, `ranks`, `findings`, plus
//! `switches` and summary fields); the report's types live in `whyslow_model::flow` and
//! its renderings (Perfetto trace of the timelines, LLMPrism Fig. 4; text table;
//! per-switch bandwidth series, Fig. 5) in `whyslow_report::flows`.
#![deny(missing_docs)]

mod assemble;
pub mod bocd;
pub mod classify;
pub mod diagnose;
pub mod hops;
pub mod jobs;
pub mod merge;
pub mod steps;
pub mod timeline;

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

pub use bocd::{Bocd, BocdConfig, CpModel, NormalGammaPrior};
/// The flow vocabulary (records, topology, report) lives in `whyslow-model`,
/// shared with the flow readers; re-exported here for callers of the analysis.
pub use whyslow_model::flow::{
    FindingLevel, FlowFinding, FlowRecord, FlowReport, HopStats, Job, Pair, PairType, Rank,
    RecurringStall, Step, SwitchPath, SwitchStats, TimelineEvent, Timelines, FLOW_REPORT_VERSION,
};
pub use whyslow_model::topology::{self, Topology, TopologyError};

/// Tuning of [`analyze`]. `Default` gives the paper's values where it states them
/// (BOCD threshold 0.95, k = 3) and documented choices elsewhere.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlowConfig {
    /// BOCD settings for step division (§IV-B) and timeline reconstruction (§IV-C).
    pub bocd: BocdConfig,
    /// k of the k-σ rule (§IV-D). Paper: 3.
    pub k_sigma: f64,
    /// Floor on σ as a fraction of the mean of the compared values, so that perfectly
    /// regular synthetic or lab data (σ ≈ 0) does not flag every tiny deviation.
    /// Not in the paper; 0.05 means "at least 5% + 3σ away".
    pub min_rel_sigma: f64,
    /// Merge the same flow reported by several switches (5-tuple + time overlap)
    /// before analysis, see [`merge::merge_switch_reports`].
    pub merge_duplicates: bool,
    /// Concurrent DP flows through one switch above which a switch-level finding is
    /// raised (§IV-D "exceeding concurrent DP communication limits"). `None`: only
    /// report the count.
    pub max_concurrent_dp_flows: Option<usize>,
    /// Minimum number of values (steps, groups, switches) for a k-σ comparison.
    pub min_samples: usize,
    /// Flows smaller than this (bytes) are the transport's control messages
    /// (gloo's send/recv notifications, connection setup) and are left out of the
    /// analysis: they carry no step structure and, counted as flow sizes, would
    /// make every pipeline pair look like data parallelism. Not in the paper
    /// (RoCE flows there are data); 0 keeps everything.
    pub min_flow_bytes: u64,
    /// Pairs with fewer flows than this share of the median pair's are control
    /// traffic too and are left out (a rank talking to the job's rendezvous
    /// store on another host sends a message over 1 KiB now and then; as a
    /// pair it would be typed as pipeline parallelism). Not in the paper; 0
    /// keeps every pair.
    pub min_pair_flow_share: f64,
    /// A switch-to-switch link whose flows stay active this many times longer
    /// at the downstream switch than at the upstream one is a finding
    /// over the window or over its most stretched few seconds ([`hops`]; not
    /// in the paper). Healthy hops measure 1.00–1.02 over the window and at
    /// most 1.10 over any 6 s on the testbed's captures; a link throttled to
    /// 150 Mbit/s behind 1 Gbit/s hosts, 1.3–1.4.
    pub min_hop_stretch: f64,
    /// A switch or link is named for low DP bandwidth only when its
    /// 90th-percentile flow bandwidth is also this fraction below the other
    /// switches' mean (besides k-σ). Not in the paper: on the testbed's
    /// emulated switches a flow's bandwidth is the CPU's, and a loaded
    /// machine made one healthy leaf 33 % slower than the others (6.45 vs
    /// 9.60 Gb/s); a switch throttled 2× is 50 % slower.
    pub min_switch_drop: f64,
}

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            bocd: BocdConfig::default(),
            k_sigma: 3.0,
            min_rel_sigma: 0.05,
            merge_duplicates: true,
            max_concurrent_dp_flows: None,
            min_samples: 3,
            min_flow_bytes: 1024,
            min_pair_flow_share: 0.05,
            min_hop_stretch: 1.2,
            min_switch_drop: 0.4,
        }
    }
}

/// Run the whole LLMPrism pipeline (§IV-A to §IV-D) over flow records.
///
/// `topology` maps addresses to machines (needed to merge the cross-machine clusters
/// of one job, §IV-A) and exporter names to switch names; without it every address is
/// its own machine. Never panics on any input; empty input gives an empty report.
pub fn analyze(
    records: &[FlowRecord],
    topology: Option<&Topology>,
    cfg: &FlowConfig,
) -> FlowReport {
    let renamed;
    let mut records = records;
    if let Some(topo) = topology {
        if !topo.exporters.is_empty() && records.iter().any(|r| !r.switches.is_empty()) {
            // Records share paths (a reader gives one per exporter): rename
            // each distinct path once.
            let mut paths: FxHashMap<SwitchPath, SwitchPath> = FxHashMap::default();
            let mut last: Option<(&SwitchPath, SwitchPath)> = None;
            renamed = records
                .iter()
                .map(|r| {
                    let switches = match &last {
                        // The same shared path as the record before (by pointer).
                        Some((from, to)) if **from == r.switches => to.clone(),
                        _ => {
                            let to = paths
                                .entry(r.switches.clone())
                                .or_insert_with(|| {
                                    r.switches
                                        .iter()
                                        .map(|s| {
                                            topo.exporters.get(s.as_str()).unwrap_or(s).clone()
                                        })
                                        .collect()
                                })
                                .clone();
                            last = Some((&r.switches, to.clone()));
                            to
                        }
                    };
                    FlowRecord {
                        switches,
                        ..r.clone()
                    }
                })
                .collect::<Vec<_>>();
            records = &renamed;
        }
    }
    // Hops are judged on the switches' own reports, before they are merged.
    let hops = hops::hop_stats(records, topology, cfg.min_flow_bytes);
    let merged;
    let mut merged_duplicates = 0;
    if cfg.merge_duplicates && records.iter().any(|r| !r.switches.is_empty()) {
        if let Some(m) = topology
            .and_then(|t| merge::entry_reports(records, t))
            .or_else(|| merge::merge_if_any(records))
        {
            merged = m;
            merged_duplicates = records.len() - merged.len();
            records = &merged;
        }
    }
    let data: Vec<FlowRecord>;
    let mut control_flows = 0;
    if cfg.min_flow_bytes > 0 && records.iter().any(|r| r.bytes < cfg.min_flow_bytes) {
        data = records
            .iter()
            .filter(|r| r.bytes >= cfg.min_flow_bytes)
            .cloned()
            .collect();
        control_flows = records.len() - data.len();
        records = &data;
    }
    let busy: Vec<FlowRecord>;
    if let Some(kept) = drop_sparse_pairs(records, cfg.min_pair_flow_share) {
        control_flows += records.len() - kept.len();
        busy = kept;
        records = &busy;
    }
    let mut report = analyze_merged(records, topology, cfg);
    report.merged_duplicates = merged_duplicates;
    report.control_flows = control_flows;
    // Where hops were measured, they rate the links directly: the k-σ rule
    // over links' bandwidth (which cannot tell a slow link from the healthy
    // one that shares its flows, nor a link from a lost report) gives way.
    if cfg.min_hop_stretch > 1.0 && hops.iter().any(hops::judged) {
        let links: Vec<String> = report
            .switches
            .iter()
            .filter(|s| s.link)
            .map(|s| format!("link {}", s.name))
            .collect();
        report
            .findings
            .retain(|f| f.level != FindingLevel::Switch || !links.contains(&f.subject));
    }
    report.findings.extend(hops::hop_findings(&hops, cfg));
    report.hops = hops;
    report.could_not_judge = could_not_judge(&report);
    report
}

/// Why these flows support no verdict, if they do not: none at all, or no
/// job recognized among them (LLMPrism §IV-A finds jobs from the DP/PP
/// pattern; without one, no step, pair or switch can be judged). "No
/// findings" is only said of traffic that was judged.
fn could_not_judge(report: &FlowReport) -> Option<String> {
    if report.flows == 0 && report.control_flows == 0 {
        Some("no flow records".to_string())
    } else if report.jobs.is_empty() {
        Some(format!(
            "no training job recognized among {} flow records ({} left out as control \
             messages or sparse pairs): too few flows, or not training traffic",
            report.flows + report.control_flows,
            report.control_flows
        ))
    } else {
        None
    }
}

/// `records` without the flows of pairs that carry fewer than `share` of the
/// median pair's flows (see [`FlowConfig::min_pair_flow_share`]); `None` when
/// no pair is that sparse.
fn drop_sparse_pairs(records: &[FlowRecord], share: f64) -> Option<Vec<FlowRecord>> {
    if share.is_nan() || share <= 0.0 {
        return None;
    }
    let key = |r: &FlowRecord| {
        if r.src <= r.dst {
            (r.src, r.dst)
        } else {
            (r.dst, r.src)
        }
    };
    let mut counts: FxHashMap<(IpAddr, IpAddr), usize> = FxHashMap::default();
    for r in records {
        *counts.entry(key(r)).or_insert(0) += 1;
    }
    let mut sorted: Vec<usize> = counts.values().copied().collect();
    sorted.sort_unstable();
    let median = *sorted.get(sorted.len() / 2)?;
    let floor = share * median as f64;
    if (sorted[0] as f64) >= floor {
        return None;
    }
    Some(
        records
            .iter()
            .filter(|r| counts[&key(r)] as f64 >= floor)
            .cloned()
            .collect(),
    )
}

fn analyze_merged(
    records: &[FlowRecord],
    topology: Option<&Topology>,
    cfg: &FlowConfig,
) -> FlowReport {
    let index = FlowIndex::build(records);
    let jobs = jobs::recognize(&index, topology);
    let classified = classify::classify(&index, &jobs, &cfg.bocd);
    let timelines = timeline::reconstruct(&index, &jobs, &classified, &cfg.bocd);
    let switches = diagnose::switch_stats(&index, &classified, &timelines, topology);
    let (findings, stalls) =
        diagnose::diagnose(&index, &jobs, &classified, &timelines, &switches, cfg);
    assemble::assemble(
        &index,
        &jobs,
        &classified,
        timelines,
        switches,
        findings,
        stalls,
    )
}

/// `v` in the order `order` gives (a permutation of its indices).
fn reorder<T: Default>(order: &[usize], mut v: Vec<T>) -> Vec<T> {
    order.iter().map(|&i| std::mem::take(&mut v[i])).collect()
}

/// Fast hasher for integer keys (rustc's FxHash), to keep the pipeline above 1 M flows/s.
pub use rustc_hash::{FxHashMap, FxHasher};

/// Addresses interned to dense ids and flows grouped by unordered pair; shared by all
/// phases.
#[derive(Debug, Clone, Default)]
pub struct FlowIndex<'a> {
    /// The records.
    pub records: &'a [FlowRecord],
    /// Address of each id.
    pub addrs: Vec<IpAddr>,
    /// Id of each address.
    pub ids: FxHashMap<IpAddr, u32>,
    /// Unordered pairs (lower id, higher id), sorted.
    pub pairs: Vec<(u32, u32)>,
    /// Record indices of each pair, sorted by start time.
    pub pair_flows: Vec<Vec<u32>>,
    /// (start, end) of each pair's flows, parallel to `pair_flows`: the
    /// phases that walk a pair's flows in time order read these, not records
    /// scattered over the input.
    pub pair_spans: Vec<Vec<(u64, u64)>>,
    /// Bytes of each pair's flows, parallel to `pair_flows`.
    pub pair_bytes: Vec<Vec<u64>>,
}

impl<'a> FlowIndex<'a> {
    /// Intern addresses and group flows by unordered pair. Self-flows are ignored.
    pub fn build(records: &'a [FlowRecord]) -> Self {
        let mut ids: FxHashMap<IpAddr, u32> = FxHashMap::default();
        let mut addrs = Vec::new();
        let mut pair_ix: FxHashMap<u64, u32> = FxHashMap::default();
        let mut pairs: Vec<(u32, u32)> = Vec::new();
        let mut pair_flows: Vec<Vec<u32>> = Vec::new();
        let mut pair_spans: Vec<Vec<(u64, u64)>> = Vec::new();
        let mut pair_bytes: Vec<Vec<u64>> = Vec::new();
        let mut intern = |a: IpAddr, ids: &mut FxHashMap<IpAddr, u32>| -> u32 {
            *ids.entry(a).or_insert_with(|| {
                addrs.push(a);
                (addrs.len() - 1) as u32
            })
        };
        // One lookup per record: its directed pair's id (the last one is
        // remembered, as records of one pair often come together).
        let mut directed: FxHashMap<(IpAddr, IpAddr), u32> = FxHashMap::default();
        let mut last: Option<((IpAddr, IpAddr), u32)> = None;
        for (i, r) in records.iter().enumerate() {
            if r.src == r.dst {
                continue;
            }
            let ends = (r.src, r.dst);
            let p = match last {
                Some((e, p)) if e == ends => p,
                _ => *directed.entry(ends).or_insert_with(|| {
                    let a = intern(r.src, &mut ids);
                    let b = intern(r.dst, &mut ids);
                    let (lo, hi) = if a < b { (a, b) } else { (b, a) };
                    let key = ((lo as u64) << 32) | hi as u64;
                    *pair_ix.entry(key).or_insert_with(|| {
                        pairs.push((lo, hi));
                        pair_flows.push(Vec::new());
                        pair_spans.push(Vec::new());
                        pair_bytes.push(Vec::new());
                        (pairs.len() - 1) as u32
                    })
                }),
            };
            last = Some((ends, p));
            pair_flows[p as usize].push(i as u32);
            pair_spans[p as usize].push((r.start_us, r.end_us()));
            pair_bytes[p as usize].push(r.bytes);
        }
        for ((f, spans), bytes) in pair_flows
            .iter_mut()
            .zip(&mut pair_spans)
            .zip(&mut pair_bytes)
        {
            if !spans.windows(2).all(|w| w[0].0 <= w[1].0) {
                // Stable, as the records came.
                let mut perm: Vec<usize> = (0..f.len()).collect();
                perm.sort_by_key(|&k| spans[k].0);
                *f = perm.iter().map(|&k| f[k]).collect();
                *spans = perm.iter().map(|&k| spans[k]).collect();
                *bytes = perm.iter().map(|&k| bytes[k]).collect();
            }
        }
        // Deterministic order: by addresses.
        let mut order: Vec<usize> = (0..pairs.len()).collect();
        order.sort_by(|&x, &y| {
            let (a, b) = pairs[x];
            let (c, d) = pairs[y];
            (addrs[a as usize], addrs[b as usize]).cmp(&(addrs[c as usize], addrs[d as usize]))
        });
        let pairs2 = order.iter().map(|&i| pairs[i]).collect();
        FlowIndex {
            records,
            addrs,
            ids,
            pairs: pairs2,
            pair_flows: reorder(&order, pair_flows),
            pair_spans: reorder(&order, pair_spans),
            pair_bytes: reorder(&order, pair_bytes),
        }
    }

    /// The record of index `i`.
    #[inline]
    pub fn rec(&self, i: u32) -> &FlowRecord {
        &self.records[i as usize]
    }
}
