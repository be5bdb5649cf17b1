//! The network layer: hosts that lose TCP segments.
//!
//! SysOM-AI §7 leaves network problems unexplained: "identified as slow
//! collectives but not root-caused without additional network-layer
//! instrumentation". A lossy link does not make one rank late (§3.1's
//! slow-rank detection): every rank of a ring waits on it alike, and its
//! NIC does not stand out in throughput either. What it leaves is in the
//! TCP counters of the hosts at both ends of the lossy path: the sender
//! resends each lost segment (`RetransSegs`), and the receiver queues the
//! segments that arrive after a lost one out of order (`TCPOFOQueue`). The
//! agent reads both for each process's network namespace
//! (`whyslow_model::os`), and a host whose share of either is over a floor
//! is named, with its side of the loss.
//!
//! The counters are per host (per network namespace), not per connection
//! or link: loss between a sender and a receiver shows on both, whichever
//! end's link drops it, and loss both ways on one link shows on the host
//! and on each peer it talks to. Each finding says how it stands against
//! the other hosts.

use serde::{Deserialize, Serialize};

pub use whyslow_model::diagnosis::{LossSide, LossyHost};

/// Thresholds of the network layer (not in the paper).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkConfig {
    /// Least share of a host's sent segments that it sent again, percent.
    /// Healthy data-centre TCP retransmits well under 0.1 % (0.09-0.18 % on
    /// the testbed's shaped links); 1 % loss cuts a flow's throughput
    /// several-fold.
    pub min_retrans_pct: f64,
    /// Least share of a host's received segments that arrived out of
    /// order, percent: each lost segment puts the segments behind it out of
    /// order (49 % at 2 % loss on the testbed; 0.13-0.33 % healthy), and
    /// single-path networks hardly reorder otherwise.
    pub min_out_of_order_pct: f64,
    /// Least segments a host sent (or received) per second in the window
    /// for that side's share to be judged: a few segments give a noisy
    /// share.
    pub min_segs_per_s: f64,
    /// A named host "stands out" when its share is this multiple of the
    /// median of the other hosts' shares.
    pub min_ratio: f64,
}

impl Default for NetworkConfig {
    fn default() -> Self {
        NetworkConfig {
            min_retrans_pct: 1.0,
            min_out_of_order_pct: 5.0,
            min_segs_per_s: 50.0,
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
    /// Segments sent again per second.
    pub retrans_segs_per_s: f64,
    /// Segments received per second.
    pub in_segs_per_s: f64,
    /// Segments queued out of order per second.
    pub out_of_order_per_s: f64,
}

impl HostTcp {
    /// Segments sent again per 100 sent; `None` below the least traffic.
    fn retrans_pct(&self, cfg: &NetworkConfig) -> Option<f64> {
        share(self.retrans_segs_per_s, self.out_segs_per_s, cfg)
    }

    /// Segments out of order per 100 received; `None` below the least
    /// traffic.
    fn out_of_order_pct(&self, cfg: &NetworkConfig) -> Option<f64> {
        share(self.out_of_order_per_s, self.in_segs_per_s, cfg)
    }
}

fn share(part: f64, whole: f64, cfg: &NetworkConfig) -> Option<f64> {
    (whole.is_finite() && part.is_finite() && whole >= cfg.min_segs_per_s && part >= 0.0)
        .then(|| 100.0 * part / whole)
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

/// Each host's share on one side, and the others' median.
fn sides(
    hosts: &[HostTcp],
    pct: impl Fn(&HostTcp) -> Option<f64>,
    floor: f64,
) -> Vec<Option<LossSide>> {
    let all: Vec<Option<f64>> = hosts.iter().map(&pct).collect();
    all.iter()
        .enumerate()
        .map(|(i, p)| {
            let p = (*p)?;
            let others = all
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .filter_map(|(_, q)| *q)
                .collect();
            Some(LossSide {
                pct: p,
                peers_pct: median(others),
                over_floor: p >= floor,
            })
        })
        .collect()
}

/// The hosts that resend or receive out of order over the floors, the
/// largest share first. A side with too little traffic is neither judged
/// nor a peer.
pub fn lossy_hosts(hosts: &[HostTcp], cfg: &NetworkConfig) -> Vec<LossyHost> {
    let resent = sides(hosts, |h| h.retrans_pct(cfg), cfg.min_retrans_pct);
    let ofo = sides(hosts, |h| h.out_of_order_pct(cfg), cfg.min_out_of_order_pct);
    let mut out: Vec<LossyHost> = hosts
        .iter()
        .zip(resent.into_iter().zip(ofo))
        .filter_map(|(h, (resent, out_of_order))| {
            let over = |s: &Option<LossSide>| s.as_ref().is_some_and(|s| s.over_floor);
            let side = match (over(&resent), over(&out_of_order)) {
                (true, true) => "both",
                (true, false) => "sends",
                (false, true) => "receives",
                (false, false) => return None,
            };
            // One side far above its peers' is enough: the receiving end
            // of a lossy link also resends somewhat more (its ACKs are lost
            // too), as do its peers, but it alone gets half its segments
            // out of order (testbed, 2 % loss on one host: 51 % against
            // 0.6-0.8 %, resends 1.8 % against 1.2-2.3 %).
            let stands_out = [&resent, &out_of_order]
                .into_iter()
                .flatten()
                .filter(|s| s.over_floor)
                .any(|s| s.peers_pct.is_none_or(|m| s.pct >= cfg.min_ratio * m));
            Some(LossyHost {
                host: h.host.clone(),
                ranks: h.ranks.clone(),
                resent,
                out_of_order,
                side: side.to_string(),
                out_segs_per_s: h.out_segs_per_s,
                in_segs_per_s: h.in_segs_per_s,
                stands_out,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        b.worst_pct()
            .total_cmp(&a.worst_pct())
            .then(a.host.cmp(&b.host))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host sending and receiving `segs`/s, resending `re` % of them and
    /// receiving `ofo` % out of order.
    fn host(name: &str, rank: u32, segs: f64, re: f64, ofo: f64) -> HostTcp {
        HostTcp {
            host: name.into(),
            ranks: vec![rank],
            out_segs_per_s: segs,
            retrans_segs_per_s: segs * re / 100.0,
            in_segs_per_s: segs,
            out_of_order_per_s: segs * ofo / 100.0,
        }
    }

    /// Healthy hosts: a few resent or reordered segments (0-0.1 %) at any
    /// traffic.
    fn healthy(n: usize, seed: u64) -> Vec<HostTcp> {
        (0..n)
            .map(|i| {
                let segs = 2_000.0 + 37_000.0 * (((seed + i as u64) * 7919) % 13) as f64;
                let re = 0.1 * (((seed + 3 * i as u64) * 104_729) % 11) as f64 / 10.0;
                let ofo = 0.1 * (((seed + 5 * i as u64) * 15_485_863) % 11) as f64 / 10.0;
                host(&format!("h{i}"), i as u32, segs, re, ofo)
            })
            .collect()
    }

    fn names(found: &[LossyHost]) -> Vec<(&str, &str)> {
        found
            .iter()
            .map(|f| (f.host.as_str(), f.side.as_str()))
            .collect()
    }

    #[test]
    fn the_receiving_end_stands_out_even_when_everyone_resends_a_little() {
        // The testbed on 2026-11-26, 2 % loss on h1's link: every host of
        // the ring resends 1-2 % (over the floor), h1 alone receives half
        // its segments out of order.
        let hosts = vec![
            host("h0", 0, 20_000.0, 0.6, 0.6),
            host("h1", 1, 20_000.0, 1.76, 51.1),
            host("h2", 2, 20_000.0, 2.27, 0.78),
            host("h3", 3, 20_000.0, 1.17, 0.57),
        ];
        let found = lossy_hosts(&hosts, &NetworkConfig::default());
        assert_eq!(found[0].host, "h1");
        assert_eq!(found[0].side, "both");
        assert!(found[0].stands_out);
        for f in &found[1..] {
            assert_eq!(f.side, "sends", "{f:?}");
            assert!(!f.stands_out, "{f:?}");
        }
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
    fn both_ends_of_a_lossy_path_are_named_by_their_side() {
        // A ring where host k+1 sends to host k. Loss into host k: its
        // sender resends, host k receives out of order. Loss both ways on
        // k's link: host k also resends and the host it sends to receives
        // out of order.
        for n in 2..9 {
            for k in 0..n {
                for loss in [1.2, 2.0, 10.0] {
                    for both_ways in [false, true] {
                        let mut hs = healthy(n, (n * k) as u64);
                        let sender = (k + 1) % n;
                        let receiver = (k + n - 1) % n;
                        hs[sender].retrans_segs_per_s = hs[sender].out_segs_per_s * loss / 100.0;
                        hs[k].out_of_order_per_s = hs[k].in_segs_per_s * 10.0 * loss / 100.0;
                        if both_ways {
                            hs[k].retrans_segs_per_s = hs[k].out_segs_per_s * loss / 100.0;
                            hs[receiver].out_of_order_per_s =
                                hs[receiver].in_segs_per_s * 10.0 * loss / 100.0;
                        }
                        let found = lossy_hosts(&hs, &NetworkConfig::default());
                        let got = names(&found);
                        let me = hs[k].host.as_str();
                        let expect_k = if both_ways { "both" } else { "receives" };
                        assert!(got.contains(&(me, expect_k)), "{n} {k} {got:?}");
                        if n > 2 {
                            let s = hs[sender].host.as_str();
                            assert!(got.contains(&(s, "sends")), "{got:?}");
                            assert_eq!(found.len(), if both_ways { 3 } else { 2 }, "{got:?}");
                        }
                        // Against 4 or more hosts, each named one stands
                        // out from the median of the others.
                        if n > 4 {
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
            .map(|i| host(&format!("h{i}"), i, 10_000.0, 2.5 + 0.1 * i as f64, 0.0))
            .collect();
        let found = lossy_hosts(&hs, &NetworkConfig::default());
        assert_eq!(found.len(), 4);
        assert!(found.iter().all(|f| !f.stands_out), "{found:?}");
        assert_eq!(
            (found[0].host.as_str(), found[0].side.as_str()),
            ("h3", "sends")
        );
    }

    #[test]
    fn hosts_that_sent_little_are_not_judged() {
        // 3 of 10 segments again is no evidence; nor a host with no rate.
        let hs = vec![
            host("a", 0, 10.0, 30.0, 30.0),
            host("b", 1, 5_000.0, 0.02, 0.0),
            host("c", 2, f64::NAN, 10.0, 10.0),
        ];
        assert!(lossy_hosts(&hs, &NetworkConfig::default()).is_empty());
        assert!(lossy_hosts(&[], &NetworkConfig::default()).is_empty());
        // One host alone: named on the floor, standing out by default.
        let one = lossy_hosts(
            &[host("a", 0, 1_000.0, 3.0, 0.0)],
            &NetworkConfig::default(),
        );
        assert_eq!(one.len(), 1);
        assert!(one[0].stands_out);
        assert_eq!(one[0].resent.as_ref().unwrap().peers_pct, None);
    }
}
