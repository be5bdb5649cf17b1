//! The network layer: hosts that retransmit TCP segments.
//!
//! SysOM-AI §7 leaves network problems unexplained: "identified as slow
//! collectives but not root-caused without additional network-layer
//! instrumentation". A lossy link does not make one rank late (§3.1's
//! slow-rank detection): every rank of a ring waits on it alike, and its
//! NIC does not stand out in throughput either. What it leaves is
//! retransmissions: each lost segment is sent again by the host that sent
//! it. So the agent reads each process's network namespace's TCP counters
//! (`whyslow_model::os::TCP_RETRANS_SEGS`, `TCP_OUT_SEGS`), and a host
//! whose retransmitted share of its segments is over a floor is named.
//!
//! The counters are per host (per network namespace), not per connection:
//! when a link drops packets both ways, the host on it and the peers that
//! send to it retransmit, and these counters cannot say which link of
//! theirs it is. Each finding says how it stands against the other hosts.

use serde::{Deserialize, Serialize};

/// Thresholds of the network layer (not in the paper).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkConfig {
    /// Least share of a host's segments retransmitted, percent. Healthy
    /// data-centre TCP retransmits well under 0.1 %; 1 % loss cuts a
    /// flow's throughput several-fold.
    pub min_retrans_pct: f64,
    /// Least segments a host sent per second in the window for its share
    /// to be judged (a few segments give a noisy share).
    pub min_out_segs_per_s: f64,
    /// A named host "stands out" when its share is this multiple of the
    /// median of the other hosts' shares.
    pub min_ratio: f64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            min_retrans_pct: 0.5,
            min_out_segs_per_s: 50.0,
            min_ratio: 3.0,
        }
    }
}

/// One host's TCP counters over the window: the mean rates of one network
/// namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostTcp {
    /// How the host is named in the report (host name, and the namespace
    /// where one host name holds several).
    pub host: String,
    /// World ranks whose processes are in the namespace.
    pub ranks: Vec<u32>,
    /// Segments sent per second.
    pub out_segs_per_s: f64,
    /// Segments retransmitted per second.
    pub retrans_segs_per_s: f64,
}

impl HostTcp {
    /// Retransmitted segments per 100 sent.
    pub fn retrans_pct(&self) -> f64 {
        100.0 * self.retrans_segs_per_s / self.out_segs_per_s.max(1e-9)
    }
}

/// A host that retransmits (`network_diff` of the JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LossyHost {
    /// The host, as in [`HostTcp::host`].
    pub host: String,
    /// Its world ranks.
    pub ranks: Vec<u32>,
    /// Its retransmitted segments per 100 sent.
    pub retrans_pct: f64,
    /// Its segments sent per second.
    pub out_segs_per_s: f64,
    /// The median share of the other judged hosts, percent (`None`
    /// without another).
    pub peers_retrans_pct: Option<f64>,
    /// Whether its share is at least [`NetworkConfig::min_ratio`] times its
    /// peers' median (or it has no peer): `false` when the loss is
    /// everywhere.
    pub stands_out: bool,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The hosts whose retransmitted share is over the floor, the largest
/// first. Hosts that sent too little are neither named nor peers.
pub fn lossy_hosts(hosts: &[HostTcp], cfg: &NetworkConfig) -> Vec<LossyHost> {
    let judged: Vec<&HostTcp> = hosts
        .iter()
        .filter(|h| {
            h.out_segs_per_s >= cfg.min_out_segs_per_s
                && h.out_segs_per_s.is_finite()
                && h.retrans_segs_per_s.is_finite()
        })
        .collect();
    let mut out: Vec<LossyHost> = judged
        .iter()
        .enumerate()
        .filter(|(_, h)| h.retrans_pct() >= cfg.min_retrans_pct)
        .map(|(i, h)| {
            let peers = median(
                judged
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, p)| p.retrans_pct())
                    .collect(),
            );
            let pct = h.retrans_pct();
            LossyHost {
                host: h.host.clone(),
                ranks: h.ranks.clone(),
                retrans_pct: pct,
                out_segs_per_s: h.out_segs_per_s,
                peers_retrans_pct: peers,
                stands_out: peers.is_none_or(|m| pct >= cfg.min_ratio * m),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.retrans_pct
            .total_cmp(&a.retrans_pct)
            .then(a.host.cmp(&b.host))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, rank: u32, out: f64, re: f64) -> HostTcp {
        HostTcp {
            host: name.into(),
            ranks: vec![rank],
            out_segs_per_s: out,
            retrans_segs_per_s: re,
        }
    }

    /// Healthy hosts: a few retransmissions (0-0.1 %) at any traffic.
    fn healthy(n: usize, seed: u64) -> Vec<HostTcp> {
        (0..n)
            .map(|i| {
                let out = 2_000.0 + 37_000.0 * (((seed + i as u64) * 7919) % 13) as f64;
                let frac = 0.001 * (((seed + 3 * i as u64) * 104_729) % 11) as f64 / 10.0;
                host(&format!("h{i}"), i as u32, out, out * frac)
            })
            .collect()
    }

    #[test]
    fn healthy_hosts_are_not_named() {
        for n in 1..9 {
            for seed in 0..20 {
                let hs = healthy(n, seed);
                assert!(
                    lossy_hosts(&hs, &NetworkConfig::default()).is_empty(),
                    "{hs:?}"
                );
            }
        }
    }

    #[test]
    fn the_host_that_drops_packets_is_named_and_stands_out() {
        // Loss on host k's link, out of it: host k resends 0.5-10 % of its
        // segments; with loss into it as well, the peer that sends to it in
        // the ring resends as much (its counters cannot tell the link).
        for n in 2..9 {
            for k in 0..n {
                for loss in [0.6, 2.0, 10.0] {
                    for both_ways in [false, true] {
                        let mut hs = healthy(n, (n * k) as u64);
                        let out = hs[k].out_segs_per_s;
                        hs[k].retrans_segs_per_s = out * loss / 100.0;
                        let sender = (k + n - 1) % n;
                        if both_ways && n > 2 {
                            let o = hs[sender].out_segs_per_s;
                            hs[sender].retrans_segs_per_s = o * loss / 100.0;
                        }
                        let found = lossy_hosts(&hs, &NetworkConfig::default());
                        let names: Vec<&str> = found.iter().map(|f| f.host.as_str()).collect();
                        assert!(names.contains(&hs[k].host.as_str()), "{found:?}");
                        let expect = if both_ways && n > 2 { 2 } else { 1 };
                        assert_eq!(found.len(), expect, "{found:?}");
                        // With 4 or more hosts, 2 lossy ones still stand
                        // out from the median of the others.
                        if n > 3 || !both_ways {
                            assert!(found.iter().all(|f| f.stands_out), "{found:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn loss_everywhere_is_named_but_no_host_stands_out() {
        let hs: Vec<HostTcp> = (0..4)
            .map(|i| host(&format!("h{i}"), i, 10_000.0, 150.0 + 10.0 * i as f64))
            .collect();
        let found = lossy_hosts(&hs, &NetworkConfig::default());
        assert_eq!(found.len(), 4);
        assert!(found.iter().all(|f| !f.stands_out), "{found:?}");
        assert_eq!(found[0].host, "h3");
    }

    #[test]
    fn hosts_that_sent_little_are_not_judged() {
        // 3 of 10 segments again is no evidence; nor a host with no rate.
        let hs = vec![
            host("a", 0, 10.0, 3.0),
            host("b", 1, 5_000.0, 1.0),
            host("c", 2, f64::NAN, 1.0),
        ];
        assert!(lossy_hosts(&hs, &NetworkConfig::default()).is_empty());
        assert!(lossy_hosts(&[], &NetworkConfig::default()).is_empty());
        // One host alone: named on the floor, standing out by default.
        let one = lossy_hosts(&[host("a", 0, 1_000.0, 20.0)], &NetworkConfig::default());
        assert_eq!(one.len(), 1);
        assert!(one[0].stands_out && one[0].peers_retrans_pct.is_none());
    }
}
