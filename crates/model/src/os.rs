//! Operating-system signals of a training process (SysOM-AI §3.1, the OS
//! layer of the differential diagnosis): what the scheduler and the
//! interrupts of its CPUs did to it over one period. The node agent writes
//! one [`OsSample`] per process and period (`*.os.jsonl` in its spool);
//! `whyslow diagnose` compares a late rank's signals with its peers'.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Run-queue delay: ms per second that the process's threads were runnable
/// but waited for a CPU (`/proc/PID/task/*/schedstat`, field 2).
pub const RUNQUEUE_DELAY: &str = "runqueue_delay_ms_per_s";
/// CPU time: ms per second the process's threads ran.
pub const CPU_TIME: &str = "cpu_ms_per_s";
/// Involuntary context switches per second (preempted).
pub const INVOLUNTARY_SWITCHES: &str = "involuntary_switches_per_s";
/// Voluntary context switches per second (blocked or yielded).
pub const VOLUNTARY_SWITCHES: &str = "voluntary_switches_per_s";
/// CPU migrations per second (`se.nr_migrations`).
pub const MIGRATIONS: &str = "migrations_per_s";
/// NUMA pages migrated per second (`numa_pages_migrated`; 0 without
/// automatic NUMA balancing).
pub const NUMA_PAGES_MIGRATED: &str = "numa_pages_migrated_per_s";
/// Hardware interrupts per second per CPU the process ran on
/// (`/proc/interrupts`).
pub const INTERRUPTS: &str = "interrupts_per_cpu_s";
/// Prefix of the softirq signals: `softirq_NET_RX_per_cpu_s`, … per second
/// per CPU the process ran on (`/proc/softirqs`).
pub const SOFTIRQ_PREFIX: &str = "softirq_";

/// TCP segments sent per second by the process's network namespace
/// (`OutSegs` of `/proc/PID/net/snmp`). The counters of a namespace are
/// shared by all its processes: on a host without per-job namespaces, the
/// host's.
pub const TCP_OUT_SEGS: &str = "tcp_out_segs_per_s";
/// TCP segments retransmitted per second by the process's network
/// namespace (`RetransSegs` of `/proc/PID/net/snmp`): lost packets, on the
/// host's own link or further along its paths.
pub const TCP_RETRANS_SEGS: &str = "tcp_retrans_segs_per_s";
/// TCP segments received per second by the process's network namespace
/// (`InSegs` of `/proc/PID/net/snmp`).
pub const TCP_IN_SEGS: &str = "tcp_in_segs_per_s";
/// TCP segments per second that arrived out of order and were queued
/// (`TCPOFOQueue` of `/proc/PID/net/netstat`): the receiving side of loss,
/// the segments after a lost one.
pub const TCP_OUT_OF_ORDER: &str = "tcp_ofo_queued_per_s";

/// The name of the signal of softirq `kind` (`NET_RX`, `TIMER`, …).
pub fn softirq_signal(kind: &str) -> String {
    format!("{SOFTIRQ_PREFIX}{kind}_per_cpu_s")
}

/// One process's OS signals over one period.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OsSample {
    /// Job of the process (its registration), empty if unknown.
    #[serde(default)]
    pub job: String,
    /// Host name.
    #[serde(default)]
    pub host: String,
    /// World rank, when the process registered one.
    #[serde(default)]
    pub rank: Option<u32>,
    /// Process id.
    pub pid: i32,
    /// Start of the period, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Length of the period, ns.
    pub duration_ns: u64,
    /// CPUs the process's threads ran on during the period (where each
    /// thread that used CPU last ran).
    #[serde(default)]
    pub cpus: Vec<u32>,
    /// Inode of the process's network namespace (`/proc/PID/ns/net`): the
    /// TCP signals of processes with the same one are the same counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<u64>,
    /// Signal name (the constants of this module) → value.
    pub signals: BTreeMap<String, f64>,
    /// The process's TCP connections that carried data in the period, from
    /// the kernel's socket diagnostics (`tcp_info`, as `ss -ti` reads it):
    /// what a slow link leaves when it loses nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<TcpConnection>,
}

/// One TCP connection of a process over one period (rates per second of
/// the period; RTTs as the kernel last saw them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TcpConnection {
    /// This end, `ip:port`.
    pub local: String,
    /// The other end, `ip:port`.
    pub remote: String,
    /// Bytes the peer acknowledged per second (this end sending).
    pub sent_bytes_per_s: f64,
    /// Bytes received per second.
    pub received_bytes_per_s: f64,
    /// Milliseconds per second with data in flight (`tcpi_busy_time`):
    /// bytes sent over busy time is the rate the path gave while this end
    /// had something to send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_ms_per_s: Option<f64>,
    /// Of the busy time, ms per second limited by the receiver's window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rwnd_limited_ms_per_s: Option<f64>,
    /// Of the busy time, ms per second limited by the send buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sndbuf_limited_ms_per_s: Option<f64>,
    /// Segments retransmitted per second.
    pub retrans_per_s: f64,
    /// Smoothed RTT at the end of the period, µs.
    pub rtt_us: f64,
    /// Lowest RTT the connection has seen, µs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rtt_us: Option<f64>,
    /// The kernel's latest delivery-rate sample, bytes per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_rate_bytes_per_s: Option<f64>,
}

impl TcpConnection {
    /// Bytes per second the path delivered while this end had data in
    /// flight: the connection's throughput with idle time taken out (a
    /// collective sends in bursts). `None` without busy time.
    pub fn sending_rate(&self) -> Option<f64> {
        let busy = self.busy_ms_per_s?;
        (busy > 0.0).then(|| self.sent_bytes_per_s / (busy / 1000.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_tolerates_missing_optional_fields() {
        let mut signals = BTreeMap::new();
        signals.insert(RUNQUEUE_DELAY.to_string(), 12.5);
        signals.insert(softirq_signal("NET_RX"), 800.0);
        let s = OsSample {
            job: "j".into(),
            host: "h".into(),
            rank: Some(3),
            pid: 42,
            start_unix_ns: 1,
            duration_ns: 1_000_000_000,
            cpus: vec![0, 1],
            netns: Some(4026531833),
            signals,
            connections: Vec::new(),
        };
        let text = serde_json::to_string(&s).unwrap();
        assert!(text.contains("softirq_NET_RX_per_cpu_s"));
        assert_eq!(serde_json::from_str::<OsSample>(&text).unwrap(), s);
        let bare: OsSample =
            serde_json::from_str(r#"{"pid":1,"start_unix_ns":5,"duration_ns":9,"signals":{}}"#)
                .unwrap();
        assert_eq!((bare.rank, bare.cpus.len(), bare.netns), (None, 0, None));
    }
}
