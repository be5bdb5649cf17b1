//! Ingestion throughput: IPFIX decoding → flow records → classified DP/PP pairs, on
//! one core, for about a million synthetic flow records (LLMPrism-style DP/PP jobs).
//!
//! Rates are records per second of this thread's CPU time (from
//! `/proc/thread-self/schedstat`; wall time where that is unavailable), so a busy
//! machine does not skew them; pin it to one core with `taskset -c 0`.
//!
//! `cargo run --release -p whyslow-flows-ingest --example flows_bench [-- RECORDS [--per-switch]]`
//!
//! By default the records reach one collector from one exporter, so there are
//! no duplicate reports to merge and no hops to measure. With `--per-switch`,
//! every switch on a flow's path exports its own report (a few µs apart) from
//! its own address, named in the topology, as leaf and spine exporters would:
//! the full analysis then also measures the hops and keeps each flow's entry
//! report. Rates count reports.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use whyslow_flows::{analyze, classify, jobs, FlowConfig, FlowIndex, PairType};
use whyslow_flows_ingest::netflow::encode;
use whyslow_flows_ingest::FlowDecoder;
use whyslow_testkit::flows::{generate, SynthCluster, SynthJob};

/// CPU time of this thread so far (wall time since start where Linux's
/// schedstat is unavailable).
fn cpu_time() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .unwrap_or_else(|| start.elapsed())
}

/// Clock of the phases: CPU time, read at the start.
struct Clock(Duration);

impl Clock {
    fn start() -> Self {
        Clock(cpu_time())
    }

    fn elapsed(&self) -> Duration {
        cpu_time().saturating_sub(self.0)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let want: usize = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let per_switch = args.iter().any(|a| a == "--per-switch");
    // 8-way DP × 4 stages × 4 NICs: ~6.1k flows per step.
    let job = SynthJob {
        dp: 8,
        pp: 4,
        tp: 4,
        microbatches: 4,
        ..Default::default()
    };
    let per_step = 6_144;
    let steps = want.div_ceil(per_step).max(3);
    let t = Clock::start();
    let s = generate(&SynthCluster {
        jobs: vec![SynthJob { steps, ..job }],
        machines_per_leaf: 4,
        jitter: 0.02,
        ..Default::default()
    });
    if per_switch {
        return per_switch_run(s);
    }
    let n = s.records.len();
    // ~1400-byte messages: 36 records of 37 bytes, as an exporter would send.
    let mut msgs = vec![encode::template_message(1_700_000_000, 0)];
    msgs.extend(encode::data_messages(&s.records, 36, 1_700_000_000, 0));
    let bytes: usize = msgs.iter().map(Vec::len).sum();
    eprintln!(
        "generated {n} records in {} IPFIX messages ({} MB) in {:.2?}",
        msgs.len(),
        bytes >> 20,
        t.elapsed()
    );

    let exporter: SocketAddr = "192.0.2.1:4739".parse().unwrap();
    let t0 = Clock::start();
    let mut dec = FlowDecoder::new();
    let mut records = Vec::with_capacity(n);
    for m in &msgs {
        dec.decode(exporter, m, &mut records);
    }
    let t_decode = t0.elapsed();
    let t1 = Clock::start();
    let index = FlowIndex::build(&records);
    let t_index = t1.elapsed();
    let jobs = jobs::recognize(&index, Some(&s.topology));
    let cls = classify::classify(&index, &jobs, &FlowConfig::default().bocd);
    let t_classify = t1.elapsed();
    println!(
        "  of which index (group by pair)  {:.3} s",
        t_index.as_secs_f64()
    );
    let total = t0.elapsed();
    let dp = cls.kind.iter().filter(|k| **k == PairType::Dp).count();
    let correct = index
        .pairs
        .iter()
        .zip(&cls.kind)
        .filter(|(&(a, b), k)| {
            let (x, y) = (index.addrs[a as usize], index.addrs[b as usize]);
            s.truth.pairs.get(&(x.min(y), x.max(y))) == Some(k)
        })
        .count();
    assert_eq!(records.len(), n, "every record decoded");
    println!("records                 {n}");
    println!(
        "decode (IPFIX → records) {:>8.3} s  {:>6.2} M records/s",
        t_decode.as_secs_f64(),
        n as f64 / t_decode.as_secs_f64() / 1e6
    );
    println!(
        "index + jobs + classify  {:>8.3} s  {:>6.2} M records/s",
        t_classify.as_secs_f64(),
        n as f64 / t_classify.as_secs_f64() / 1e6
    );
    println!(
        "decode → classified pairs {:>7.3} s  {:>6.2} M records/s",
        total.as_secs_f64(),
        n as f64 / total.as_secs_f64() / 1e6
    );
    println!(
        "jobs {} pairs {} (dp {dp}), correct {correct}/{}",
        jobs.members.len(),
        cls.kind.len(),
        cls.kind.len()
    );
    let t2 = Clock::start();
    let report = analyze(&records, Some(&s.topology), &FlowConfig::default());
    let t_full = t2.elapsed();
    println!(
        "full analyze (merge, timelines, diagnosis) {:.3} s  {:.2} M records/s, {} findings",
        t_full.as_secs_f64(),
        n as f64 / t_full.as_secs_f64() / 1e6,
        report.findings.len()
    );
    let both = t_decode + t_full;
    println!(
        "decode + full analyze    {:>8.3} s  {:>6.2} M records/s",
        both.as_secs_f64(),
        n as f64 / both.as_secs_f64() / 1e6
    );
}

/// Every switch on a flow's path reports it from its own exporter; the
/// collector gets their messages interleaved.
fn per_switch_run(s: whyslow_testkit::flows::Synth) {
    let names: Vec<String> = s.topology.switches.iter().map(|w| w.name.clone()).collect();
    let exporter_of =
        |k: usize| -> SocketAddr { format!("192.0.2.{}:4739", k + 1).parse().unwrap() };
    let mut switches = s.topology.switches.clone();
    for (k, w) in switches.iter_mut().enumerate() {
        w.exporters = vec![exporter_of(k).ip().to_string()];
    }
    let topology = whyslow_flows::Topology::new(s.topology.machines.clone(), switches)
        .expect("synthetic topology");
    let mut per: Vec<Vec<whyslow_flows::FlowRecord>> = vec![Vec::new(); names.len()];
    for r in &s.records {
        for (hop, sw) in r.switches.iter().enumerate() {
            let k = names
                .iter()
                .position(|n| n == sw)
                .expect("switch of the topology");
            let mut c = r.clone();
            c.start_us += 2 * hop as u64;
            per[k].push(c);
        }
    }
    let n: usize = per.iter().map(Vec::len).sum();
    let streams: Vec<Vec<Vec<u8>>> = per
        .iter()
        .map(|recs| {
            let mut m = vec![encode::template_message(1_700_000_000, 0)];
            m.extend(encode::data_messages(recs, 36, 1_700_000_000, 0));
            m
        })
        .collect();
    // Round-robin over the exporters, as their datagrams would arrive.
    let mut msgs: Vec<(SocketAddr, &[u8])> = Vec::new();
    let longest = streams.iter().map(Vec::len).max().unwrap_or(0);
    for i in 0..longest {
        for (k, st) in streams.iter().enumerate() {
            if let Some(m) = st.get(i) {
                msgs.push((exporter_of(k), m));
            }
        }
    }
    eprintln!(
        "{n} reports of {} flows from {} exporters in {} messages",
        s.records.len(),
        names.len(),
        msgs.len()
    );
    let t0 = Clock::start();
    let mut dec = FlowDecoder::new();
    let mut records = Vec::with_capacity(n);
    for (from, m) in &msgs {
        dec.decode(*from, m, &mut records);
    }
    let t_decode = t0.elapsed();
    assert_eq!(records.len(), n, "every report decoded");
    let t1 = Clock::start();
    let report = analyze(&records, Some(&topology), &FlowConfig::default());
    let t_full = t1.elapsed();
    println!("reports                 {n}");
    println!(
        "decode (IPFIX → records) {:>8.3} s  {:>6.2} M reports/s",
        t_decode.as_secs_f64(),
        n as f64 / t_decode.as_secs_f64() / 1e6
    );
    println!(
        "full analyze (hops, entry reports, timelines, diagnosis) {:.3} s  {:.2} M reports/s, {} flows kept, {} hops, {} findings",
        t_full.as_secs_f64(),
        n as f64 / t_full.as_secs_f64() / 1e6,
        report.flows,
        report.hops.len(),
        report.findings.len()
    );
}
