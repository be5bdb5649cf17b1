//! Where along their path flows slow down: per switch-to-switch hop, the same
//! connections' active time at the upstream and at the downstream switch.
//!
//! LLMPrism's switch-level rule (§IV-D) compares switches' mean DP bandwidth
//! with a k-σ rule. On a small fabric (two leaves and a spine: two links, every
//! cross-leaf flow on both) there is nothing to compare a link with, and the
//! merged path of a flow does not say *where* on it the flow was slowed. When
//! several switches export the same flows, the reports themselves do: a
//! store-and-forward hop passes a connection's packets within microseconds, so
//! the connection is active for as long at the next switch as at this one; behind
//! a throttled, congested or faulty link the same bytes arrive paced and stay
//! active much longer. The ratio of the two active times is the hop's *stretch*
//! (1 on a healthy hop, whatever the traffic), and a link whose stretch in either
//! direction reaches [`FlowConfig::min_hop_stretch`] is a finding.
//!
//! Active time is the sum of a connection's flowlet durations at one switch, so
//! the idle time between messages counts at neither end. A connection counts on
//! a hop only when both switches reported at least [`COMPLETE_SHARE`] of its
//! bytes (a switch that lost reports would look faster). The hop's direction
//! comes from the topology's switch path between the two addresses; without a
//! topology, from the order in which the switches first saw the connection.
//!
//! Measured on the testbed (two leaves, a spine, softflowd on each, two jobs):
//! healthy hops 1.00–1.02; the leaf0↔spine link throttled to 50 Mbit/s for the
//! last 80 % of the window, 2.9 and 3.3 (`tests/fixtures/flows/`).

use std::net::IpAddr;

use crate::{FindingLevel, FlowConfig, FlowFinding, FlowRecord, FxHashMap, HopStats, Topology};

/// Share of a connection's bytes (of the most any switch reported for it) that a
/// switch must have reported for the connection to count on its hops.
pub const COMPLETE_SHARE: f64 = 0.9;

/// Fewest flowlets (upstream and downstream together) a hop needs before its
/// stretch is judged.
pub const MIN_HOP_FLOWLETS: usize = 20;

/// Least downstream active time a hop needs before its stretch is judged, µs.
pub const MIN_HOP_ACTIVE_US: u64 = 50_000;

type Key = (IpAddr, IpAddr, Option<u16>, Option<u16>, Option<u8>);

/// Width of the time bins a hop's stretch is followed in, µs.
pub const BIN_US: u64 = 2_000_000;

/// Bins (consecutive) over which a hop's peak stretch is measured: a slowdown
/// that lasts this long is judged even when the whole window dilutes it.
pub const PEAK_BINS: u64 = 3;

#[derive(Default, Clone)]
struct Seen {
    bytes: u64,
    active_us: u64,
    flowlets: usize,
    first_us: u64,
    last_end_us: u64,
    /// Bin (by flowlet start) → (active µs, flowlets).
    bins: FxHashMap<u64, (u64, usize)>,
}

/// Per bin: (upstream active, downstream active, flowlets on both).
#[derive(Default)]
struct HopBins(FxHashMap<u64, (u64, u64, usize)>);

/// Per directed hop statistics from per-switch flow reports (records that list
/// exactly one switch; records already merged over several switches are
/// skipped). Flows under `min_flow_bytes` are left out. Sorted by (from, to).
pub fn hop_stats(
    records: &[FlowRecord],
    topology: Option<&Topology>,
    min_flow_bytes: u64,
) -> Vec<HopStats> {
    let mut seen: FxHashMap<Key, Vec<(String, Seen)>> = FxHashMap::default();
    if crate::merge::one_path(records) {
        return Vec::new();
    }
    let t0 = records.iter().map(|r| r.start_us).min().unwrap_or(0);
    for r in records {
        if r.switches.len() != 1 || r.bytes < min_flow_bytes || r.src == r.dst {
            continue;
        }
        let at = seen
            .entry((r.src, r.dst, r.src_port, r.dst_port, r.proto))
            .or_default();
        let sw = &r.switches[0];
        let i = match at.iter().position(|(n, _)| n == sw) {
            Some(i) => i,
            None => {
                at.push((
                    sw.clone(),
                    Seen {
                        first_us: r.start_us,
                        ..Seen::default()
                    },
                ));
                at.len() - 1
            }
        };
        let s = &mut at[i].1;
        s.bytes = s.bytes.saturating_add(r.bytes);
        s.active_us = s.active_us.saturating_add(r.dur_us);
        s.flowlets += 1;
        s.first_us = s.first_us.min(r.start_us);
        s.last_end_us = s.last_end_us.max(r.end_us());
        let b = s.bins.entry((r.start_us - t0) / BIN_US).or_default();
        b.0 = b.0.saturating_add(r.dur_us);
        b.1 += 1;
    }
    let mut hops: FxHashMap<(String, String), (HopStats, HopBins)> = FxHashMap::default();
    for (key, mut at) in seen {
        if at.len() < 2 {
            continue;
        }
        let full = at.iter().map(|(_, s)| s.bytes).max().unwrap_or(0);
        at.retain(|(_, s)| s.bytes as f64 >= COMPLETE_SHARE * full as f64);
        let path: Vec<&(String, Seen)> = match topology.and_then(|t| t.switch_path(&key.0, &key.1))
        {
            Some(names) => names
                .iter()
                .filter_map(|n| at.iter().find(|(m, _)| m == n))
                .collect(),
            None => {
                // Equal first times (coarse timestamps): the later last byte
                // is downstream.
                at.sort_by(|a, b| {
                    (a.1.first_us, a.1.last_end_us, &a.0).cmp(&(
                        b.1.first_us,
                        b.1.last_end_us,
                        &b.0,
                    ))
                });
                at.iter().collect()
            }
        };
        let adjacent = |a: &str, b: &str| match topology.and_then(|t| t.switch_path(&key.0, &key.1))
        {
            Some(names) => names.windows(2).any(|w| w[0] == a && w[1] == b),
            None => true,
        };
        for w in path.windows(2) {
            let ((a, up), (b, down)) = (w[0], w[1]);
            if !adjacent(a, b) {
                continue; // a switch between them lost this connection's reports
            }
            let (h, bins) = hops.entry((a.clone(), b.clone())).or_insert_with(|| {
                let h = HopStats {
                    from: a.clone(),
                    to: b.clone(),
                    connections: 0,
                    upstream_flowlets: 0,
                    downstream_flowlets: 0,
                    bytes: 0,
                    upstream_active_us: 0,
                    downstream_active_us: 0,
                    stretch: 0.0,
                    peak_stretch: 0.0,
                    peak_start_us: 0,
                    peak_end_us: 0,
                };
                (h, HopBins::default())
            });
            for (&k, &(active, n)) in &up.bins {
                let e = bins.0.entry(k).or_default();
                e.0 = e.0.saturating_add(active);
                e.2 += n;
            }
            for (&k, &(active, n)) in &down.bins {
                let e = bins.0.entry(k).or_default();
                e.1 = e.1.saturating_add(active);
                e.2 += n;
            }
            h.connections += 1;
            h.upstream_flowlets += up.flowlets;
            h.downstream_flowlets += down.flowlets;
            h.bytes = h.bytes.saturating_add(up.bytes.max(down.bytes));
            h.upstream_active_us = h.upstream_active_us.saturating_add(up.active_us);
            h.downstream_active_us = h.downstream_active_us.saturating_add(down.active_us);
        }
    }
    let mut out: Vec<HopStats> = hops
        .into_values()
        .map(|(mut h, bins)| {
            h.stretch = ratio(h.downstream_active_us, h.upstream_active_us);
            // The peak: the most stretched PEAK_BINS consecutive bins that
            // hold enough traffic to judge.
            let (Some(&first), Some(&last)) = (bins.0.keys().min(), bins.0.keys().max()) else {
                return h;
            };
            for start in first..=last.saturating_sub(PEAK_BINS - 1).max(first) {
                let (mut up, mut down, mut n) = (0u64, 0u64, 0usize);
                for k in start..start + PEAK_BINS {
                    if let Some(&(u, d, c)) = bins.0.get(&k) {
                        up = up.saturating_add(u);
                        down = down.saturating_add(d);
                        n += c;
                    }
                }
                let s = ratio(down, up);
                if n >= MIN_HOP_FLOWLETS && down >= MIN_HOP_ACTIVE_US / 4 && s > h.peak_stretch {
                    h.peak_stretch = s;
                    h.peak_start_us = t0 + start * BIN_US;
                    h.peak_end_us = t0 + (start + PEAK_BINS) * BIN_US;
                }
            }
            h
        })
        .collect();
    out.sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
    out
}

/// Whether a hop carried enough traffic for its stretch to be judged
/// ([`MIN_HOP_FLOWLETS`], [`MIN_HOP_ACTIVE_US`]).
pub fn judged(h: &HopStats) -> bool {
    h.upstream_flowlets + h.downstream_flowlets >= MIN_HOP_FLOWLETS
        && h.downstream_active_us >= MIN_HOP_ACTIVE_US
}

/// One finding per link (both directions together) whose stretch reaches
/// `cfg.min_hop_stretch` in a direction with enough evidence ([`judged`]).
pub fn hop_findings(hops: &[HopStats], cfg: &FlowConfig) -> Vec<FlowFinding> {
    let limit = cfg.min_hop_stretch;
    if !(limit.is_finite() && limit > 1.0) {
        return Vec::new();
    }
    let mut links: Vec<(String, Vec<&HopStats>)> = Vec::new();
    let worst = |h: &HopStats| h.stretch.max(h.peak_stretch);
    for h in hops.iter().filter(|h| judged(h) && worst(h) >= limit) {
        let name = if h.from <= h.to {
            format!("{}<->{}", h.from, h.to)
        } else {
            format!("{}<->{}", h.to, h.from)
        };
        match links.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(h),
            None => links.push((name, vec![h])),
        }
    }
    links
        .into_iter()
        .map(|(name, dirs)| {
            let worst_hop = dirs
                .iter()
                .copied()
                .max_by(|a, b| worst(a).total_cmp(&worst(b)))
                .expect("a link has a direction");
            let each: Vec<String> = dirs
                .iter()
                .map(|h| {
                    let peak = if h.peak_stretch > h.stretch {
                        format!(
                            ", ×{:.2} {}",
                            h.peak_stretch,
                            whyslow_model::time::utc_span(h.peak_start_us, h.peak_end_us)
                        )
                    } else {
                        String::new()
                    };
                    format!(
                        "{} → {}: ×{:.2} over the window{peak} ({:.3} → {:.3} Gb/s while active, {} connection{}, {:.1} MB)",
                        h.from,
                        h.to,
                        h.stretch,
                        gbps(h.bytes, h.upstream_active_us),
                        gbps(h.bytes, h.downstream_active_us),
                        h.connections,
                        if h.connections == 1 { "" } else { "s" },
                        h.bytes as f64 / 1e6
                    )
                })
                .collect();
            FlowFinding {
                level: FindingLevel::Switch,
                subject: format!("link {name}"),
                reason: format!(
                    "flows take longer to pass the next switch than the one before this link \
                     ({}; a healthy hop stays at ×1, the limit is ×{limit}): the link is throttled, \
                     congested or faulty",
                    each.join("; ")
                ),
                job: None,
                value: worst(worst_hop),
                threshold: limit,
                start_us: (worst_hop.peak_stretch > worst_hop.stretch).then_some(worst_hop.peak_start_us),
                end_us: (worst_hop.peak_stretch > worst_hop.stretch).then_some(worst_hop.peak_end_us),
            }
        })
        .collect()
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn gbps(bytes: u64, us: u64) -> f64 {
    if us == 0 {
        0.0
    } else {
        bytes as f64 * 8.0 / us as f64 / 1e3
    }
}
