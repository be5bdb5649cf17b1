//! The OS layer of the differential diagnosis and the verdict across layers
//! (SysOM-AI §3.1): a late rank's OS signals against its peers', then which
//! layer — GPU, CPU, OS — holds the cause.
//!
//! The paper diffs "interrupts, softirqs, scheduler run-queue delay, context
//! switches, NUMA migrations" of the straggler's training CPUs against a
//! healthy peer; here against every peer of the group (μ + kσ of the others,
//! as the waterline does), with two guards of ours: the straggler's value
//! must also be a clear multiple of the peers' mean and above a floor per
//! signal, so that a few more timer interrupts on an idle CPU are no cause.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use whyslow_model::os::{
    OsSample, CPU_TIME, INTERRUPTS, INVOLUNTARY_SWITCHES, MIGRATIONS, NUMA_PAGES_MIGRATED,
    RUNQUEUE_DELAY, SOFTIRQ_PREFIX, VOLUNTARY_SWITCHES,
};

use crate::WaterlineFlag;
pub use whyslow_model::diagnosis::OsDiff;

/// Thresholds of the OS diff.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OsConfig {
    /// k of μ + kσ over the peers. Paper: 2.
    pub k: f64,
    /// Least ratio of the straggler's value to the peers' mean (not in the
    /// paper).
    pub min_ratio: f64,
}

impl Default for OsConfig {
    fn default() -> Self {
        OsConfig {
            k: 2.0,
            min_ratio: 1.5,
        }
    }
}

/// The least excess over the peers' mean that counts, per signal, in the
/// signal's unit: 20 ms/s of run-queue delay is 2 % of a CPU lost to
/// waiting; interrupts and softirqs per CPU-second above the timer's
/// hundreds; `None` for signals that are context, not a cause (CPU time).
pub fn floor(signal: &str) -> Option<f64> {
    match signal {
        RUNQUEUE_DELAY => Some(20.0),
        INVOLUNTARY_SWITCHES => Some(50.0),
        VOLUNTARY_SWITCHES => Some(200.0),
        MIGRATIONS => Some(20.0),
        NUMA_PAGES_MIGRATED => Some(100.0),
        INTERRUPTS => Some(500.0),
        CPU_TIME => None,
        s if s.starts_with(SOFTIRQ_PREFIX) => Some(500.0),
        _ => None,
    }
}

/// The kernel functions that do the work an interrupt signal counts: the
/// softirq handlers by kind (their names across kernels 5.x-6.x), the
/// hardware interrupt entry for `interrupts_per_cpu_s`; empty for other
/// signals. The stacks through them are the OS diff's evidence in the CPU
/// profiles (SysOM-AI §3.1: "the softirq path in the kernel stacks").
pub fn handler_functions(signal: &str) -> &'static [&'static str] {
    if signal == INTERRUPTS {
        return &["__common_interrupt", "common_interrupt", "handle_irq_event"];
    }
    let Some(kind) = signal
        .strip_prefix(SOFTIRQ_PREFIX)
        .and_then(|s| s.strip_suffix("_per_cpu_s"))
    else {
        return &[];
    };
    match kind {
        "HI" => &["tasklet_hi_action"],
        "TIMER" => &["run_timer_softirq"],
        "NET_TX" => &["net_tx_action"],
        "NET_RX" => &["net_rx_action"],
        "BLOCK" => &["blk_done_softirq", "blk_complete_reqs"],
        "IRQ_POLL" => &["irq_poll_softirq"],
        "TASKLET" => &["tasklet_action"],
        "SCHED" => &["run_rebalance_domains", "sched_balance_softirq"],
        "HRTIMER" => &["hrtimer_run_softirq"],
        "RCU" => &["rcu_core_si", "rcu_core"],
        _ => &[],
    }
}

/// Each signal's duration-weighted mean over `samples`.
pub fn mean_signals<'a>(samples: impl IntoIterator<Item = &'a OsSample>) -> BTreeMap<String, f64> {
    let mut sum: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for s in samples {
        let w = s.duration_ns as f64;
        for (k, v) in &s.signals {
            if v.is_finite() {
                let e = sum.entry(k.clone()).or_insert((0.0, 0.0));
                e.0 += v * w;
                e.1 += w;
            }
        }
    }
    sum.into_iter()
        .filter(|(_, (_, w))| *w > 0.0)
        .map(|(k, (v, w))| (k, v / w))
        .collect()
}

/// The signals on which `straggler` stands out from `peers` (each a rank's
/// [`mean_signals`]), largest ratio first. Needs at least one peer; with one,
/// σ is 0 and the ratio and floor decide.
pub fn os_diff(
    straggler: &BTreeMap<String, f64>,
    peers: &[BTreeMap<String, f64>],
    cfg: &OsConfig,
) -> Vec<OsDiff> {
    if peers.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for (signal, &value) in straggler {
        let Some(floor) = floor(signal) else { continue };
        let others: Vec<f64> = peers
            .iter()
            .map(|p| p.get(signal).copied().unwrap_or(0.0))
            .collect();
        let n = others.len() as f64;
        let mu = others.iter().sum::<f64>() / n;
        let sigma = (others.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / n).sqrt();
        let threshold = mu + cfg.k * sigma;
        if value > threshold && value - mu > floor && value > cfg.min_ratio * mu {
            out.push(OsDiff {
                signal: signal.clone(),
                straggler: value,
                peers: mu,
                threshold,
            });
        }
    }
    let ratio = |d: &OsDiff| d.straggler / d.peers.max(1e-9);
    out.sort_by(|a, b| ratio(b).total_cmp(&ratio(a)).then(a.signal.cmp(&b.signal)));
    out
}

/// The layer that holds the cause (`layer` of the JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    /// Accelerator kernels: the late rank's GPU kernels run slower than
    /// its peers' ([`crate::gpu`]).
    Gpu,
    /// The straggler's own code, or a function every rank now spends more in.
    Cpu,
    /// The operating system took the rank's CPUs (interrupts, softirqs,
    /// run-queue delay) or moved it around.
    Os,
    /// The network between ranks.
    Network,
    /// No cause found, or nothing to explain.
    None,
}

impl Layer {
    /// Its name in the JSON contract.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Gpu => "gpu",
            Layer::Cpu => "cpu",
            Layer::Os => "os",
            Layer::Network => "network",
            Layer::None => "none",
        }
    }
}

/// What the network layer ([`crate::network::lossy_hosts`]) found, as the
/// verdict needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkEvidence {
    /// No host retransmits over the floor (or no TCP counters).
    Quiet,
    /// A host retransmits, none of them a late rank's.
    Elsewhere,
    /// A late rank's host retransmits.
    OnLateHost,
}

/// Whether a signal is interrupt work on the rank's CPUs.
fn is_interrupt(signal: &str) -> bool {
    signal == INTERRUPTS || signal.starts_with(SOFTIRQ_PREFIX)
}

/// The verdict across layers, in the paper's order of evidence:
///
/// * a late rank whose GPU kernels run slower than its peers' (device
///   time, which host contention does not stretch): **gpu**;
/// * a late rank whose CPUs serve more interrupts or softirqs than its
///   peers', or that waits longer for a CPU without using more of it (the
///   scheduler gave its time to someone else): **os**;
/// * else a late rank whose host retransmits TCP segments: **network**;
/// * else a late rank with a function above its group's waterline: **cpu**
///   (its own code path);
/// * else a late rank with only other OS signals raised (switches,
///   migrations): **os**;
/// * else a late rank while another host retransmits: **network**;
/// * no late rank, and a host retransmits (a lossy link slows every rank of
///   a ring alike): **network**;
/// * no late rank, but functions above the waterline or risen since the
///   baseline: **cpu**;
/// * otherwise **none** (a late rank unexplained by the layers seen here:
///   the network, or the GPU where its kernel times were not given).
///
/// `straggler_cpu` are the waterline flags of the late ranks only;
/// `straggler_gpu` whether the GPU diff found a late rank's kernels slower.
pub fn verdict(
    late: bool,
    straggler_gpu: bool,
    straggler_cpu: &[WaterlineFlag],
    os: &[OsDiff],
    straggler_cpu_ms: Option<(f64, f64)>,
    any_cpu_finding: bool,
    network: NetworkEvidence,
) -> Layer {
    if late {
        if straggler_gpu {
            return Layer::Gpu;
        }
        let interrupts = os.iter().any(|d| is_interrupt(&d.signal));
        let starved = os.iter().any(|d| d.signal == RUNQUEUE_DELAY)
            && straggler_cpu_ms.is_none_or(|(me, peers)| me <= peers * 1.1);
        if interrupts || starved {
            return Layer::Os;
        }
        if network == NetworkEvidence::OnLateHost {
            return Layer::Network;
        }
        if !straggler_cpu.is_empty() {
            return Layer::Cpu;
        }
        if !os.is_empty() {
            return Layer::Os;
        }
        if network == NetworkEvidence::Elsewhere {
            return Layer::Network;
        }
        return Layer::None;
    }
    if network != NetworkEvidence::Quiet {
        Layer::Network
    } else if any_cpu_finding {
        Layer::Cpu
    } else {
        Layer::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use whyslow_model::os::softirq_signal;
    use NetworkEvidence::{Elsewhere, OnLateHost, Quiet};

    fn signals(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn healthy(seed: u64) -> BTreeMap<String, f64> {
        let j = (seed % 7) as f64 / 7.0;
        signals(&[
            (RUNQUEUE_DELAY, 3.0 + j),
            (CPU_TIME, 600.0 + 40.0 * j),
            (INVOLUNTARY_SWITCHES, 20.0 + 5.0 * j),
            (VOLUNTARY_SWITCHES, 900.0 + 100.0 * j),
            (INTERRUPTS, 300.0 + 20.0 * j),
            (&softirq_signal("NET_RX"), 40.0 + 10.0 * j),
            (&softirq_signal("TIMER"), 250.0 + 10.0 * j),
        ])
    }

    /// Rank 2 above its group's waterline in `extra_work`.
    fn extra_work_flag() -> WaterlineFlag {
        WaterlineFlag {
            group: "g".into(),
            rank: "2".into(),
            function: "extra_work".into(),
            stack: "main;extra_work".into(),
            share: 0.4,
            peer_share: 0.01,
            threshold: 0.02,
        }
    }

    #[test]
    fn interrupt_signals_name_their_handlers() {
        assert_eq!(
            handler_functions(&softirq_signal("NET_RX")),
            &["net_rx_action"]
        );
        assert!(handler_functions(INTERRUPTS).contains(&"handle_irq_event"));
        assert!(handler_functions(RUNQUEUE_DELAY).is_empty());
        assert!(handler_functions(&softirq_signal("NO_SUCH")).is_empty());
    }

    #[test]
    fn a_softirq_flood_on_the_stragglers_cpus_is_the_os_layer() {
        for peers_n in 1..6 {
            for flood in [2_000.0, 20_000.0, 200_000.0] {
                let peers: Vec<_> = (0..peers_n).map(healthy).collect();
                let mut me = healthy(99);
                me.insert(softirq_signal("NET_RX"), flood);
                let d = os_diff(&me, &peers, &OsConfig::default());
                assert_eq!(d.len(), 1, "{d:?}");
                assert_eq!(d[0].signal, "softirq_NET_RX_per_cpu_s");
                assert_eq!(
                    verdict(true, false, &[], &d, Some((600.0, 610.0)), false, Quiet),
                    Layer::Os
                );
            }
        }
    }

    #[test]
    fn healthy_ranks_differ_in_nothing() {
        for me in 0..7 {
            let peers: Vec<_> = (0..4).filter(|&s| s != me).map(healthy).collect();
            assert!(os_diff(&healthy(me), &peers, &OsConfig::default()).is_empty());
        }
        // Twice the peers' timer softirqs on an otherwise quiet CPU is under
        // the floor; CPU time is never a cause.
        let mut me = healthy(1);
        me.insert(softirq_signal("TIMER"), 500.0);
        me.insert(CPU_TIME.into(), 2000.0);
        assert!(os_diff(&me, &[healthy(2), healthy(3)], &OsConfig::default()).is_empty());
        assert!(os_diff(&me, &[], &OsConfig::default()).is_empty());
    }

    #[test]
    fn a_starved_rank_is_os_a_busy_one_is_cpu() {
        let peers: Vec<_> = (0..3).map(healthy).collect();
        let mut starved = healthy(5);
        starved.insert(RUNQUEUE_DELAY.into(), 300.0);
        let d = os_diff(&starved, &peers, &OsConfig::default());
        assert_eq!(d[0].signal, RUNQUEUE_DELAY);
        assert_eq!(
            verdict(true, false, &[], &d, Some((500.0, 620.0)), true, Quiet),
            Layer::Os
        );
        // It waited more because it wanted much more CPU than its peers:
        // its own code, when the waterline names a function.
        let flag = extra_work_flag();
        assert_eq!(
            verdict(
                true,
                false,
                std::slice::from_ref(&flag),
                &d,
                Some((950.0, 600.0)),
                true,
                Quiet
            ),
            Layer::Cpu
        );
        assert_eq!(
            verdict(true, false, &[flag], &[], None, true, Quiet),
            Layer::Cpu
        );
        assert_eq!(
            verdict(true, false, &[], &[], None, true, Quiet),
            Layer::None
        );
        assert_eq!(
            verdict(false, false, &[], &[], None, true, Quiet),
            Layer::Cpu
        );
        assert_eq!(
            verdict(false, false, &[], &[], None, false, Quiet),
            Layer::None
        );
        // Slower GPU kernels on the late rank come first: device time is
        // not stretched by the host, whatever the OS diff says.
        assert_eq!(
            verdict(true, true, &[], &d, Some((500.0, 620.0)), true, Quiet),
            Layer::Gpu
        );
        // Without a late rank a GPU finding names no layer.
        assert_eq!(
            verdict(false, true, &[], &[], None, false, Quiet),
            Layer::None
        );
    }

    #[test]
    fn a_lossy_host_is_the_network_layer_unless_a_nearer_cause_is_seen() {
        // Nobody late: a lossy link slows a ring alike; the network before
        // any regression.
        assert_eq!(
            verdict(false, false, &[], &[], None, true, Elsewhere),
            Layer::Network
        );
        assert_eq!(
            verdict(false, false, &[], &[], None, false, Elsewhere),
            Layer::Network
        );
        // A late rank on the lossy host: the network, unless its GPU or its
        // CPUs' interrupts say otherwise.
        assert_eq!(
            verdict(true, false, &[], &[], None, false, OnLateHost),
            Layer::Network
        );
        assert_eq!(
            verdict(true, true, &[], &[], None, false, OnLateHost),
            Layer::Gpu
        );
        let peers: Vec<_> = (0..3).map(healthy).collect();
        let mut me = healthy(4);
        me.insert(softirq_signal("NET_RX"), 20_000.0);
        let d = os_diff(&me, &peers, &OsConfig::default());
        assert_eq!(
            verdict(true, false, &[], &d, None, false, OnLateHost),
            Layer::Os
        );
        // A late rank elsewhere: its own code first, the network last.
        let flag = extra_work_flag();
        assert_eq!(
            verdict(true, false, &[flag], &[], None, true, Elsewhere),
            Layer::Cpu
        );
        assert_eq!(
            verdict(true, false, &[], &[], None, false, Elsewhere),
            Layer::Network
        );
    }

    #[test]
    fn means_weigh_by_duration_and_skip_nan() {
        let s = |dur: u64, v: f64| OsSample {
            job: String::new(),
            host: String::new(),
            rank: Some(0),
            pid: 1,
            start_unix_ns: 0,
            duration_ns: dur,
            cpus: vec![],
            netns: None,
            signals: signals(&[(RUNQUEUE_DELAY, v)]),
            connections: Vec::new(),
        };
        let m = mean_signals(&[s(1, 10.0), s(3, 20.0), s(5, f64::NAN)]);
        assert!((m[RUNQUEUE_DELAY] - 17.5).abs() < 1e-9);
        assert!(mean_signals(&[]).is_empty());
    }
}
