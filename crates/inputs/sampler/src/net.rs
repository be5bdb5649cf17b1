//! Per-interface NIC throughput normalized by link capacity (PerfTracker §4.2:
//! inter-host collectives are governed by GPU–NIC throughput).
//!
//! Counters: `/sys/class/net/IF/statistics/{tx,rx}_bytes`, opened once and
//! re-read with `pread(fd, 0)`. Capacity: `/sys/class/net/IF/speed` (Mbit/s)
//! unless configured ([`NetInterface::capacity_mbit`]); virtual links (`lo`,
//! veth, bridges) report no speed (`EINVAL` or -1) and must be configured,
//! otherwise the interface is skipped with a note.
//!
//! Caveat at high rates: drivers refresh these counters on their own schedule
//! (many NICs update hardware stats every ~1 ms or slower, some only on
//! demand), so at 10 kHz consecutive reads can repeat and the series becomes
//! bursty (0 then > 1, clamped). The sampler reports what the counters say.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// One network interface to sample.
#[derive(Debug, Clone, PartialEq)]
pub struct NetInterface {
    /// Interface name (`eth0`, `ib0`, `lo`, …).
    pub name: String,
    /// Link capacity in Mbit/s; `None` reads `/sys/class/net/IF/speed`.
    pub capacity_mbit: Option<f64>,
}

impl NetInterface {
    /// An interface whose capacity is read from sysfs.
    pub fn new(name: impl Into<String>) -> NetInterface {
        NetInterface {
            name: name.into(),
            capacity_mbit: None,
        }
    }

    /// An interface with a configured capacity (virtual links).
    pub fn with_capacity_mbit(name: impl Into<String>, mbit: f64) -> NetInterface {
        NetInterface {
            name: name.into(),
            capacity_mbit: Some(mbit),
        }
    }
}

/// An interface spec that is not `name` or `name:mbit`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("interface {spec:?}: {why} (expected name or name:mbit, e.g. eth0 or veth0:1000)")]
pub struct InterfaceSpecError {
    /// The spec as given.
    pub spec: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl std::str::FromStr for NetInterface {
    type Err = InterfaceSpecError;

    /// `eth0` (capacity from sysfs) or `veth0:1000` (capacity in Mbit/s, for
    /// virtual links, whose sysfs speed is unknown). The one parser of the
    /// `--interface` option, the agent's requests and `WHYSLOW_SAMPLE_IFACES`.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let bad = |why| InterfaceSpecError {
            spec: spec.to_string(),
            why,
        };
        let s = spec.trim();
        let (name, mbit) = match s.split_once(':') {
            None => (s, None),
            Some((name, mbit)) => {
                let mbit: f64 = mbit
                    .trim()
                    .parse()
                    .map_err(|_| bad("the capacity is not a number"))?;
                if !(mbit.is_finite() && mbit > 0.0) {
                    return Err(bad("the capacity must be a positive number of Mbit/s"));
                }
                (name.trim(), Some(mbit))
            }
        };
        if name.is_empty() {
            return Err(bad("no interface name"));
        }
        Ok(NetInterface {
            name: name.to_string(),
            capacity_mbit: mbit,
        })
    }
}

/// Link speed in Mbit/s from sysfs, `None` when unknown (virtual links).
pub fn link_speed_mbit(name: &str) -> Option<f64> {
    let s = std::fs::read_to_string(Path::new("/sys/class/net").join(name).join("speed")).ok()?;
    let v: f64 = s.trim().parse().ok()?;
    (v > 0.0).then_some(v)
}

pub(crate) struct NicCounter {
    pub name: String,
    /// Capacity in bytes per ns.
    bytes_per_ns: f64,
    tx: File,
    rx: File,
    pub last: Option<(u64, u64)>,
}

fn read_u64(f: &File) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

impl NicCounter {
    /// Opens the counters; `Err(note)` explains why the interface is skipped.
    pub fn open(iface: &NetInterface) -> Result<NicCounter, String> {
        let dir = Path::new("/sys/class/net")
            .join(&iface.name)
            .join("statistics");
        let mbit = match iface.capacity_mbit.or_else(|| link_speed_mbit(&iface.name)) {
            Some(m) if m > 0.0 && m.is_finite() => m,
            _ => {
                return Err(format!(
                    "nic {}: link speed unknown (virtual link?): configure its capacity",
                    iface.name
                ))
            }
        };
        let open =
            |f: &str| File::open(dir.join(f)).map_err(|e| format!("nic {}: {f}: {e}", iface.name));
        let mut c = NicCounter {
            name: iface.name.clone(),
            bytes_per_ns: mbit * 1e6 / 8.0 / 1e9,
            tx: open("tx_bytes")?,
            rx: open("rx_bytes")?,
            last: None,
        };
        c.last = c.read();
        Ok(c)
    }

    pub fn read(&self) -> Option<(u64, u64)> {
        Some((read_u64(&self.tx)?, read_u64(&self.rx)?))
    }

    /// (tx, rx) utilization over `dt_ns` since the last call, clamped to [0, 1].
    pub fn sample(&mut self, dt_ns: i64) -> Option<(f32, f32)> {
        let now = self.read()?;
        let prev = self.last.replace(now)?;
        let cap = self.bytes_per_ns * dt_ns.max(1) as f64;
        let u = |a: u64, b: u64| (a.saturating_sub(b) as f64 / cap).clamp(0.0, 1.0) as f32;
        Some((u(now.0, prev.0), u(now.1, prev.1)))
    }
}

#[cfg(test)]
mod spec_tests {
    use super::*;

    #[test]
    fn interface_specs() {
        let nic: NetInterface = "eth0".parse().unwrap();
        assert_eq!((nic.name.as_str(), nic.capacity_mbit), ("eth0", None));
        let nic: NetInterface = " veth0 : 1000 ".parse().unwrap();
        assert_eq!(
            (nic.name.as_str(), nic.capacity_mbit),
            ("veth0", Some(1000.0))
        );
        for bad in [
            "",
            ":",
            ":100",
            "eth0:",
            "eth0:fast",
            "eth0:-5",
            "eth0:0",
            "eth0:inf",
        ] {
            let e = bad.parse::<NetInterface>().unwrap_err();
            assert!(
                e.to_string().contains("expected name or name:mbit"),
                "{bad}: {e}"
            );
        }
    }
}
