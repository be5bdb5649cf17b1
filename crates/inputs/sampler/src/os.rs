//! A process's OS signals read from `/proc` (SysOM-AI §3.1, the OS layer):
//! scheduler run-queue delay, context switches and migrations of its
//! threads, the interrupts and softirqs of the CPUs they ran on, and the TCP
//! segments its network namespace sent and retransmitted. The
//! parsers are pure; [`OsSignals`] keeps the counters between two reads and
//! turns their differences into an [`OsSample`] of rates.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use whyslow_model::os::{
    softirq_signal, OsSample, CPU_TIME, INTERRUPTS, INVOLUNTARY_SWITCHES, MIGRATIONS,
    NUMA_PAGES_MIGRATED, RUNQUEUE_DELAY, TCP_IN_SEGS, TCP_OUT_OF_ORDER, TCP_OUT_SEGS,
    TCP_RETRANS_SEGS, VOLUNTARY_SWITCHES,
};

/// `/proc/PID/task/TID/schedstat`: (ns on CPU, ns waiting on a run queue,
/// time slices).
pub fn parse_schedstat(text: &str) -> Option<(u64, u64, u64)> {
    let mut it = text.split_ascii_whitespace().map(|w| w.parse::<u64>().ok());
    Some((it.next()??, it.next()??, it.next()??))
}

/// `voluntary_ctxt_switches` and `nonvoluntary_ctxt_switches` of a
/// `/proc/PID/task/TID/status`.
pub fn parse_ctxt_switches(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim_start_matches(':').trim().parse::<u64>().ok())
    };
    Some((
        field("voluntary_ctxt_switches")?,
        field("nonvoluntary_ctxt_switches")?,
    ))
}

/// A `key : value` of `/proc/PID/task/TID/sched` (`se.nr_migrations`,
/// `numa_pages_migrated`), `None` where the kernel does not print it.
pub fn parse_sched_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().parse::<f64>().ok().map(|x| x as u64))?
    })
}

/// Field `name` of table `table` (`Tcp:`, `TcpExt:`) in the format of
/// `/proc/PID/net/snmp` and `netstat`: a line of names, then one of values.
fn proc_net_field(text: &str, table: &str, name: &str) -> Option<u64> {
    let mut rows = text.lines().filter_map(|l| l.strip_prefix(table));
    let names = rows.next()?;
    let values: Vec<&str> = rows.next()?.split_ascii_whitespace().collect();
    let k = names.split_ascii_whitespace().position(|n| n == name)?;
    values.get(k)?.parse().ok()
}

/// A network namespace's TCP counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TcpCounters {
    /// Segments sent (`Tcp: OutSegs`).
    pub out_segs: u64,
    /// Segments sent again (`Tcp: RetransSegs`).
    pub retrans_segs: u64,
    /// Segments received (`Tcp: InSegs`).
    pub in_segs: u64,
    /// Segments queued out of order (`TcpExt: TCPOFOQueue`); 0 where the
    /// kernel does not print it.
    pub ofo_queued: u64,
}

/// The counters of a `/proc/PID/net/snmp` and its `netstat` (which may be
/// empty); `None` without the `Tcp:` table.
pub fn parse_tcp_counters(snmp: &str, netstat: &str) -> Option<TcpCounters> {
    Some(TcpCounters {
        out_segs: proc_net_field(snmp, "Tcp:", "OutSegs")?,
        retrans_segs: proc_net_field(snmp, "Tcp:", "RetransSegs")?,
        in_segs: proc_net_field(snmp, "Tcp:", "InSegs")?,
        ofo_queued: proc_net_field(netstat, "TcpExt:", "TCPOFOQueue").unwrap_or(0),
    })
}

/// The inode of a `/proc/PID/ns/net` link's target (`net:[4026531833]`).
pub fn parse_netns_link(target: &str) -> Option<u64> {
    target
        .strip_prefix("net:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// The CPU columns of a `/proc/softirqs` or `/proc/interrupts` header
/// (`CPU0 CPU1 …`); 0 for anything else.
fn cpu_columns(header: &str) -> usize {
    let words: Vec<&str> = header.split_ascii_whitespace().collect();
    if words.iter().all(|w| w.starts_with("CPU")) {
        words.len()
    } else {
        0
    }
}

/// The CPU count of a per-CPU table (`/proc/softirqs`, `/proc/interrupts`)
/// and its rows that have one count per CPU: (label, counts).
fn per_cpu_rows(text: &str) -> (usize, Vec<(&str, Vec<u64>)>) {
    let mut lines = text.lines();
    let ncpu = lines.next().map(cpu_columns).unwrap_or(0);
    let rows = lines
        .filter_map(|l| {
            let (label, rest) = l.split_once(':')?;
            let counts: Vec<u64> = rest
                .split_ascii_whitespace()
                .take(ncpu)
                .map_while(|w| w.parse().ok())
                .collect();
            (ncpu > 0 && counts.len() == ncpu).then(|| (label.trim(), counts))
        })
        .collect();
    (ncpu, rows)
}

/// `/proc/softirqs`: softirq kind → count per CPU.
pub fn parse_softirqs(text: &str) -> BTreeMap<String, Vec<u64>> {
    per_cpu_rows(text)
        .1
        .into_iter()
        .map(|(kind, counts)| (kind.to_string(), counts))
        .collect()
}

/// `/proc/interrupts`: hardware interrupts per CPU, summed over every line
/// that has one count per CPU (device IRQs and the architecture's own:
/// local timer, rescheduling and call-function IPIs, …; `ERR`/`MIS` have one
/// count in all and are left out).
pub fn parse_interrupts(text: &str) -> Vec<u64> {
    let (ncpu, rows) = per_cpu_rows(text);
    let mut sum = vec![0u64; ncpu];
    for (_, counts) in rows {
        for (s, c) in sum.iter_mut().zip(counts) {
            *s += c;
        }
    }
    sum
}

/// One thread's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct ThreadCounters {
    run_ns: u64,
    wait_ns: u64,
    voluntary: u64,
    involuntary: u64,
    migrations: u64,
    numa_pages: u64,
    cpu: Option<u32>,
}

fn read_thread(task: &Path) -> Option<ThreadCounters> {
    let (run_ns, wait_ns, _) = parse_schedstat(&fs::read_to_string(task.join("schedstat")).ok()?)?;
    let (voluntary, involuntary) =
        parse_ctxt_switches(&fs::read_to_string(task.join("status")).ok()?)?;
    let sched = fs::read_to_string(task.join("sched")).unwrap_or_default();
    let stat = fs::read_to_string(task.join("stat")).unwrap_or_default();
    Some(ThreadCounters {
        run_ns,
        wait_ns,
        voluntary,
        involuntary,
        migrations: parse_sched_field(&sched, "se.nr_migrations").unwrap_or(0),
        numa_pages: parse_sched_field(&sched, "numa_pages_migrated").unwrap_or(0),
        cpu: crate::cpufreq::parse_stat_processor(&stat),
    })
}

/// The state of one process's signals between reads.
#[derive(Debug)]
pub struct OsSignals {
    pid: i32,
    proc_root: PathBuf,
    threads: HashMap<i32, ThreadCounters>,
    softirqs: BTreeMap<String, Vec<u64>>,
    interrupts: Vec<u64>,
    /// The TCP counters of the process's network namespace.
    tcp: Option<TcpCounters>,
    netns: Option<u64>,
    at_unix_ns: u64,
    /// Socket diagnostics in the process's namespace (`None`: not
    /// readable, e.g. another namespace without CAP_SYS_ADMIN).
    diag: Option<crate::tcp_diag::DiagSocket>,
    /// Each of its connections' counters at the last read, by inode.
    conns: HashMap<u32, crate::tcp_diag::TcpInfo>,
}

impl OsSignals {
    /// Starts watching `pid` (reads its first counters); `None` if it is gone
    /// or `/proc` cannot be read.
    pub fn open(pid: i32) -> Option<OsSignals> {
        Self::open_at(Path::new("/proc"), pid)
    }

    /// As [`OsSignals::open`], reading a `/proc` at `proc_root` (tests).
    pub fn open_at(proc_root: &Path, pid: i32) -> Option<OsSignals> {
        let mut s = OsSignals {
            pid,
            proc_root: proc_root.to_path_buf(),
            threads: HashMap::new(),
            softirqs: BTreeMap::new(),
            interrupts: Vec::new(),
            tcp: None,
            netns: None,
            at_unix_ns: 0,
            diag: None,
            conns: HashMap::new(),
        };
        let (threads, softirqs, interrupts) = s.read()?;
        (s.threads, s.softirqs, s.interrupts) = (threads, softirqs, interrupts);
        (s.tcp, s.netns) = s.read_net();
        s.diag = crate::tcp_diag::DiagSocket::of_process(proc_root, pid).ok();
        s.conns = s
            .read_conns()
            .into_iter()
            .map(|c| (c.inode, c.info))
            .collect();
        s.at_unix_ns = now_unix_ns();
        Some(s)
    }

    #[allow(clippy::type_complexity)]
    fn read(
        &self,
    ) -> Option<(
        HashMap<i32, ThreadCounters>,
        BTreeMap<String, Vec<u64>>,
        Vec<u64>,
    )> {
        let tasks = self.proc_root.join(self.pid.to_string()).join("task");
        let mut threads = HashMap::new();
        for e in fs::read_dir(&tasks).ok()?.flatten() {
            let Some(tid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(c) = read_thread(&e.path()) {
                threads.insert(tid, c);
            }
        }
        if threads.is_empty() {
            return None;
        }
        let softirqs = parse_softirqs(
            &fs::read_to_string(self.proc_root.join("softirqs")).unwrap_or_default(),
        );
        let interrupts = parse_interrupts(
            &fs::read_to_string(self.proc_root.join("interrupts")).unwrap_or_default(),
        );
        Some((threads, softirqs, interrupts))
    }

    /// The TCP counters and the inode of the process's network namespace,
    /// each `None` where it cannot be read.
    fn read_net(&self) -> (Option<TcpCounters>, Option<u64>) {
        let dir = self.proc_root.join(self.pid.to_string());
        let netstat = fs::read_to_string(dir.join("net/netstat")).unwrap_or_default();
        let tcp = fs::read_to_string(dir.join("net/snmp"))
            .ok()
            .and_then(|t| parse_tcp_counters(&t, &netstat));
        let netns = fs::read_link(dir.join("ns/net"))
            .ok()
            .and_then(|t| parse_netns_link(t.to_str()?));
        (tcp, netns)
    }

    /// The process's own established TCP connections, now.
    fn read_conns(&mut self) -> Vec<crate::tcp_diag::TcpSocket> {
        let Some(diag) = self.diag.as_mut() else {
            return Vec::new();
        };
        let mine = crate::tcp_diag::socket_inodes(&self.proc_root, self.pid);
        match crate::tcp_diag::established_shared(diag, self.netns) {
            Ok(all) => all
                .iter()
                .filter(|s| mine.contains(&s.inode))
                .cloned()
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The signals since the last read (rates per second), and the counters
    /// kept for the next; `None` when the process is gone. Threads born in
    /// the period count from zero, threads that ended are left out.
    pub fn sample(&mut self) -> Option<OsSample> {
        let (threads, softirqs, interrupts) = self.read()?;
        let (tcp, netns) = self.read_net();
        let now = now_unix_ns();
        let dur_ns = now.saturating_sub(self.at_unix_ns).max(1);
        let secs = dur_ns as f64 / 1e9;
        let mut sum = ThreadCounters::default();
        let mut cpus = BTreeSet::new();
        for (tid, c) in &threads {
            let old = self.threads.get(tid).copied().unwrap_or_default();
            let d = |a: u64, b: u64| a.saturating_sub(b);
            let ran = d(c.run_ns, old.run_ns);
            sum.run_ns += ran;
            sum.wait_ns += d(c.wait_ns, old.wait_ns);
            sum.voluntary += d(c.voluntary, old.voluntary);
            sum.involuntary += d(c.involuntary, old.involuntary);
            sum.migrations += d(c.migrations, old.migrations);
            sum.numa_pages += d(c.numa_pages, old.numa_pages);
            if ran > 0 {
                cpus.extend(c.cpu);
            }
        }
        let mut signals = BTreeMap::new();
        signals.insert(RUNQUEUE_DELAY.to_string(), sum.wait_ns as f64 / 1e6 / secs);
        signals.insert(CPU_TIME.to_string(), sum.run_ns as f64 / 1e6 / secs);
        signals.insert(VOLUNTARY_SWITCHES.to_string(), sum.voluntary as f64 / secs);
        signals.insert(
            INVOLUNTARY_SWITCHES.to_string(),
            sum.involuntary as f64 / secs,
        );
        signals.insert(MIGRATIONS.to_string(), sum.migrations as f64 / secs);
        signals.insert(
            NUMA_PAGES_MIGRATED.to_string(),
            sum.numa_pages as f64 / secs,
        );
        let per_cpu = |new: &[u64], old: &[u64]| -> Option<f64> {
            if cpus.is_empty() || new.len() != old.len() {
                return None;
            }
            let total: u64 = cpus
                .iter()
                .filter_map(|&c| Some(new.get(c as usize)?.saturating_sub(*old.get(c as usize)?)))
                .sum();
            Some(total as f64 / cpus.len() as f64 / secs)
        };
        if let Some(v) = per_cpu(&interrupts, &self.interrupts) {
            signals.insert(INTERRUPTS.to_string(), v);
        }
        for (kind, counts) in &softirqs {
            if let Some(v) = self.softirqs.get(kind).and_then(|o| per_cpu(counts, o)) {
                signals.insert(softirq_signal(kind), v);
            }
        }
        // A namespace the process moved into since the last read has other
        // counters: no difference then.
        if let (Some(new), Some(old)) = (tcp, self.tcp) {
            let rate = |a: u64, b: u64| a.checked_sub(b).map(|d| d as f64 / secs);
            if let (true, Some(out), Some(re), Some(inn), Some(ofo)) = (
                netns == self.netns,
                rate(new.out_segs, old.out_segs),
                rate(new.retrans_segs, old.retrans_segs),
                rate(new.in_segs, old.in_segs),
                rate(new.ofo_queued, old.ofo_queued),
            ) {
                signals.insert(TCP_OUT_SEGS.to_string(), out);
                signals.insert(TCP_RETRANS_SEGS.to_string(), re);
                signals.insert(TCP_IN_SEGS.to_string(), inn);
                signals.insert(TCP_OUT_OF_ORDER.to_string(), ofo);
            }
        }
        // Connections that moved data in the period, against their last
        // counters (a connection opened in the period counts from zero).
        let now_conns = self.read_conns();
        let mut connections = Vec::new();
        for c in &now_conns {
            let old = self.conns.get(&c.inode).copied().unwrap_or_default();
            let d = |a: Option<u64>, b: Option<u64>| Some(a?.saturating_sub(b.unwrap_or(0)));
            let per_s = |v: u64| v as f64 / secs;
            let ms_per_s =
                |a: Option<u64>, b: Option<u64>| d(a, b).map(|us| us as f64 / 1e3 / secs);
            let sent = d(c.info.bytes_acked, old.bytes_acked).unwrap_or(0);
            let received = d(c.info.bytes_received, old.bytes_received).unwrap_or(0);
            if sent == 0 && received == 0 {
                continue;
            }
            connections.push(whyslow_model::os::TcpConnection {
                local: c.local.to_string(),
                remote: c.remote.to_string(),
                sent_bytes_per_s: per_s(sent),
                received_bytes_per_s: per_s(received),
                busy_ms_per_s: ms_per_s(c.info.busy_time_us, old.busy_time_us),
                rwnd_limited_ms_per_s: ms_per_s(c.info.rwnd_limited_us, old.rwnd_limited_us),
                sndbuf_limited_ms_per_s: ms_per_s(c.info.sndbuf_limited_us, old.sndbuf_limited_us),
                retrans_per_s: per_s(c.info.total_retrans.saturating_sub(old.total_retrans) as u64),
                rtt_us: c.info.rtt_us as f64,
                min_rtt_us: c.info.min_rtt_us.map(f64::from),
                delivery_rate_bytes_per_s: c.info.delivery_rate.map(|v| v as f64),
            });
        }
        self.conns = now_conns.into_iter().map(|c| (c.inode, c.info)).collect();
        let sample = OsSample {
            job: String::new(),
            host: String::new(),
            rank: None,
            pid: self.pid,
            start_unix_ns: self.at_unix_ns,
            duration_ns: dur_ns,
            cpus: cpus.into_iter().collect(),
            netns,
            signals,
            connections,
        };
        (self.threads, self.softirqs, self.interrupts) = (threads, softirqs, interrupts);
        (self.tcp, self.netns) = (tcp, netns);
        self.at_unix_ns = now;
        Some(sample)
    }
}

fn now_unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOFTIRQS: &str = "                    CPU0       CPU1       \n          HI:          0          0\n       TIMER:      14409      15808\n      NET_RX:        100        7\n";
    const INTERRUPTS_TEXT: &str = "           CPU0       CPU1       \n 24:          1          0  IO-APIC   5-edge      ACPI:Ged\nLOC:        500        300   Local timer interrupts\nERR:          0\nMIS:          0\n";

    #[test]
    fn parses_the_proc_formats() {
        assert_eq!(
            parse_schedstat("84915 3521137 2\n"),
            Some((84915, 3521137, 2))
        );
        assert_eq!(parse_schedstat("84915 x"), None);
        let status =
            "Name:\tpython\nvoluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(parse_ctxt_switches(status), Some((12, 3)));
        assert_eq!(parse_ctxt_switches("Name: x\n"), None);
        let sched = "se.nr_migrations                             :                   17\nnuma_pages_migrated                          :                    0\n";
        assert_eq!(parse_sched_field(sched, "se.nr_migrations"), Some(17));
        assert_eq!(parse_sched_field(sched, "numa_pages_migrated"), Some(0));
        assert_eq!(parse_sched_field(sched, "absent"), None);
        let s = parse_softirqs(SOFTIRQS);
        assert_eq!(s["NET_RX"], vec![100, 7]);
        assert_eq!(s["TIMER"], vec![14409, 15808]);
        assert_eq!(parse_interrupts(INTERRUPTS_TEXT), vec![501, 300]);
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm RtoMin InSegs OutSegs RetransSegs InErrs\nTcp: 1 200 9 112196468 85574 0\nUdp: InDatagrams\nUdp: 5\n";
        let netstat = "TcpExt: SyncookiesSent TCPOFOQueue TCPOFODrop\nTcpExt: 0 26633 0\nIpExt: InNoRoutes\nIpExt: 0\n";
        let c = TcpCounters {
            out_segs: 112196468,
            retrans_segs: 85574,
            in_segs: 9,
            ofo_queued: 26633,
        };
        assert_eq!(parse_tcp_counters(snmp, netstat), Some(c));
        // Without netstat (or TCPOFOQueue): no out-of-order count.
        assert_eq!(
            parse_tcp_counters(snmp, ""),
            Some(TcpCounters { ofo_queued: 0, ..c })
        );
        assert_eq!(parse_tcp_counters("Tcp: OutSegs\nTcp: x\n", ""), None);
        assert_eq!(
            parse_tcp_counters("Udp: InDatagrams\nUdp: 5\n", netstat),
            None
        );
        assert_eq!(parse_netns_link("net:[4026531833]"), Some(4026531833));
        assert_eq!(parse_netns_link("mnt:[4026531833]"), None);
        assert!(parse_softirqs("").is_empty());
        assert!(parse_interrupts("garbage").is_empty());
    }

    /// A fake /proc: one process of two threads, and the CPU counters.
    fn write_proc(root: &Path, wait: [u64; 2], net_rx: [u64; 2], tcp: (u64, u64)) {
        fs::create_dir_all(root.join("10/net")).unwrap();
        fs::write(
            root.join("10/net/snmp"),
            format!(
                "Tcp: InSegs OutSegs RetransSegs\nTcp: 7 {} {}\n",
                tcp.0, tcp.1
            ),
        )
        .unwrap();
        fs::write(
            root.join("10/net/netstat"),
            format!("TcpExt: TCPOFOQueue\nTcpExt: {}\n", tcp.1 / 2),
        )
        .unwrap();
        for (k, tid) in [10, 11].iter().enumerate() {
            let t = root.join("10/task").join(tid.to_string());
            fs::create_dir_all(&t).unwrap();
            fs::write(
                t.join("schedstat"),
                format!("{} {} 5\n", 1000 * wait[k], wait[k]),
            )
            .unwrap();
            fs::write(
                t.join("status"),
                format!(
                    "voluntary_ctxt_switches:\t{}\nnonvoluntary_ctxt_switches:\t{}\n",
                    wait[k], 1
                ),
            )
            .unwrap();
            let stat = format!(
                "{tid} (py thon) S {}",
                "0 ".repeat(35) + &k.to_string() + " 0 0"
            );
            fs::write(t.join("stat"), stat).unwrap();
        }
        fs::write(
            root.join("softirqs"),
            format!("       CPU0 CPU1\n NET_RX: {} {}\n", net_rx[0], net_rx[1]),
        )
        .unwrap();
        fs::write(root.join("interrupts"), INTERRUPTS_TEXT).unwrap();
    }

    #[test]
    fn rates_are_differences_over_the_period() {
        let dir = std::env::temp_dir().join(format!("whyslow-os-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        write_proc(&dir, [1_000_000, 0], [0, 0], (1_000, 10));
        let mut s = OsSignals::open_at(&dir, 10).unwrap();
        write_proc(&dir, [51_000_000, 0], [400, 20], (21_000, 410));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let x = s.sample().unwrap();
        let secs = x.duration_ns as f64 / 1e9;
        // 50 ms of waiting on thread 10 over the period.
        assert!(
            (x.signals[RUNQUEUE_DELAY] - 50.0 / secs).abs() < 1e-6,
            "{x:?}"
        );
        // Only thread 10 ran (on CPU 0): NET_RX of CPU 0 alone.
        assert_eq!(x.cpus, vec![0]);
        assert!((x.signals[&softirq_signal("NET_RX")] - 400.0 / secs).abs() < 1e-6);
        assert_eq!(x.signals[INTERRUPTS], 0.0);
        // The namespace's TCP counters: 20,000 segments sent, 400 of them
        // again. No ns/net link here: the namespace is unknown, and the
        // same unknown one as before.
        assert!((x.signals[TCP_OUT_SEGS] - 20_000.0 / secs).abs() < 1e-6);
        assert!((x.signals[TCP_RETRANS_SEGS] - 400.0 / secs).abs() < 1e-6);
        assert!((x.signals[TCP_OUT_OF_ORDER] - 200.0 / secs).abs() < 1e-6);
        assert_eq!(x.signals[TCP_IN_SEGS], 0.0);
        assert_eq!(x.netns, None);
        // A counter that went back (another namespace) gives no rate.
        write_proc(&dir, [51_000_000, 0], [400, 20], (5, 0));
        let y = s.sample().unwrap();
        assert!(!y.signals.contains_key(TCP_OUT_SEGS), "{y:?}");
        fs::remove_dir_all(dir.join("10")).unwrap();
        assert!(
            s.sample().is_none(),
            "a process that is gone gives no sample"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn reads_this_process() {
        let mut s = OsSignals::open(std::process::id() as i32).unwrap();
        let t = std::time::Instant::now();
        while t.elapsed().as_millis() < 50 {
            std::hint::black_box(0);
        }
        let x = s.sample().unwrap();
        assert!(x.signals[CPU_TIME] > 0.0, "{x:?}");
        assert!(!x.cpus.is_empty());
        // Every Linux with /proc/PID/net has them (0 segments or more).
        assert!(x.netns.is_some(), "{x:?}");
        assert!(x.signals[TCP_OUT_SEGS] >= 0.0, "{x:?}");
    }
}
