//! Ingestion: CSV, IPFIX, NetFlow v9, pcap, the UDP collector, and the never-panic
//! corpus of malformed inputs.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use whyslow_flows::{analyze, FlowConfig, FlowRecord, PairType};
use whyslow_flows_ingest::netflow::encode;
use whyslow_flows_ingest::{
    pcap, read_csv, read_flow_file, read_netflow_bytes, write_csv, FlowDecoder, FlowIngestError,
};
use whyslow_testkit::flows::{generate, SynthCluster, SynthJob};

fn small() -> whyslow_testkit::flows::Synth {
    generate(&SynthCluster {
        jobs: vec![
            SynthJob {
                dp: 4,
                pp: 1,
                tp: 1,
                steps: 12,
                ..Default::default()
            },
            SynthJob {
                dp: 2,
                pp: 2,
                tp: 1,
                steps: 12,
                ..Default::default()
            },
        ],
        machines_per_leaf: 2,
        ..Default::default()
    })
}

fn pairs(r: &whyslow_flows::FlowReport) -> BTreeMap<(IpAddr, IpAddr), PairType> {
    r.pairs
        .iter()
        .map(|p| ((p.src.parse().unwrap(), p.dst.parse().unwrap()), p.kind))
        .collect()
}

fn src(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

#[test]
fn csv_round_trip_and_analysis() {
    let s = small();
    let mut buf = Vec::new();
    write_csv(&s.records, &mut buf).unwrap();
    let back = read_csv(&buf[..], "mem.csv").unwrap();
    assert_eq!(back, s.records);
    let r = analyze(&back, Some(&s.topology), &FlowConfig::default());
    assert_eq!(pairs(&r), s.truth.pairs);
    // Minimal columns in another order, extra column, blank optional cells.
    let csv = "dur_us,bytes,dst,src,start_us,extra,switches\n10,100,10.0.0.2,10.0.0.1,5,x,\n20,200,::2,::1,6,y,a; b\n";
    let r = read_csv(csv.as_bytes(), "m.csv").unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(r[1].switches, vec!["a", "b"]);
    assert_eq!(r[0].src_port, None);
}

#[test]
fn csv_errors_name_the_line() {
    let cases = [
        (
            "start_us,src,dst,bytes\n1,10.0.0.1,10.0.0.2,5\n",
            1,
            "dur_us",
        ),
        (
            "start_us,src,dst,bytes,dur_us\n1,10.0.0.1,10.0.0.2,5,1\n2,nope,10.0.0.2,5,1\n",
            3,
            "IP address",
        ),
        (
            "start_us,src,dst,bytes,dur_us\n-1,10.0.0.1,10.0.0.2,5,1\n",
            2,
            "non-negative",
        ),
        (
            "start_us,src,dst,bytes,dur_us,src_port\n1,10.0.0.1,10.0.0.2,5,1,70000\n",
            2,
            "port",
        ),
        (
            "start_us,src,dst,bytes,dur_us\n1,10.0.0.1\n",
            2,
            "IP address",
        ),
    ];
    for (text, line, what) in cases {
        match read_csv(text.as_bytes(), "t.csv") {
            Err(FlowIngestError::Csv { line: l, msg, .. }) => {
                assert_eq!(l, line, "{text:?}: {msg}");
                assert!(msg.contains(what), "{text:?}: {msg}");
            }
            other => panic!("{text:?}: {other:?}"),
        }
    }
}

#[test]
fn ipfix_round_trip_with_late_template_and_per_exporter_templates() {
    let s = small();
    let recs: Vec<FlowRecord> = s.records.iter().take(500).cloned().collect();
    let msgs = encode::data_messages(&recs, 30, 1_700_000_000, 0);
    let mut dec = FlowDecoder::new();
    let mut out = Vec::new();
    // Data before the template: buffered, then decoded when the template arrives.
    dec.decode(src("192.0.2.1:4739"), &msgs[0], &mut out);
    assert!(out.is_empty());
    // Exporter B's template must not decode A's data.
    dec.decode(
        src("192.0.2.2:4739"),
        &encode::template_message(1_700_000_000, 0),
        &mut out,
    );
    assert!(out.is_empty());
    dec.decode(
        src("192.0.2.1:4739"),
        &encode::template_message(1_700_000_000, 0),
        &mut out,
    );
    assert_eq!(
        out.len(),
        30,
        "buffered data decoded once the template arrived"
    );
    // The rest, in reverse order (out-of-order messages are fine).
    for m in msgs[1..].iter().rev() {
        dec.decode(src("192.0.2.1:4739"), m, &mut out);
    }
    assert_eq!(out.len(), recs.len());
    out.sort_by_key(|r| (r.start_us, r.src, r.dst, r.bytes));
    let mut want = recs.clone();
    want.sort_by_key(|r| (r.start_us, r.src, r.dst, r.bytes));
    for (a, b) in out.iter().zip(&want) {
        assert_eq!(
            (a.start_us, a.dur_us, a.src, a.dst, a.bytes),
            (b.start_us, b.dur_us, b.src, b.dst, b.bytes)
        );
        assert_eq!(
            (a.src_port, a.dst_port, a.proto),
            (b.src_port, b.dst_port, b.proto)
        );
        assert_eq!(a.switches, vec!["192.0.2.1"]);
    }
    // Observation domain in the exporter name.
    let mut o2 = Vec::new();
    let mut d2 = FlowDecoder::new();
    d2.decode(src("192.0.2.9:1"), &encode::template_message(1, 7), &mut o2);
    d2.decode(
        src("192.0.2.9:1"),
        &encode::data_messages(&recs[..1], 1, 1, 7)[0],
        &mut o2,
    );
    assert_eq!(o2[0].switches, vec!["192.0.2.9/7"]);
}

#[test]
fn netflow_v9_decodes() {
    let s = small();
    let recs: Vec<FlowRecord> = s.records.iter().take(20).cloned().collect();
    let unix = (recs[19].start_us / 1_000_000 + 5) as u32;
    let pkt = encode::v9_packet(&recs, unix, 3_600_000, 3, true);
    let mut out = Vec::new();
    FlowDecoder::new().decode(src("192.0.2.5:2055"), &pkt, &mut out);
    assert_eq!(out.len(), 20);
    for (a, b) in out.iter().zip(&recs) {
        assert_eq!((a.src, a.dst, a.bytes), (b.src, b.dst, b.bytes));
        // v9 times are milliseconds.
        assert_eq!(a.start_us / 1000, b.start_us / 1000);
        assert_eq!(a.switches, vec!["192.0.2.5/3"]);
    }
    // Data before template for v9 too.
    let mut dec = FlowDecoder::new();
    let mut out = Vec::new();
    dec.decode(
        src("192.0.2.5:2055"),
        &encode::v9_packet(&recs[..5], unix, 3_600_000, 0, false),
        &mut out,
    );
    assert!(out.is_empty());
    dec.decode(
        src("192.0.2.5:2055"),
        &encode::v9_packet(&[], unix, 3_600_000, 0, true),
        &mut out,
    );
    assert_eq!(out.len(), 5);
}

#[test]
fn files_ipfix_gz_csv_pcap() {
    let s = small();
    let dir = std::env::temp_dir().join(format!("whyslow-flows-ingest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Raw IPFIX file with a corrupt message in the middle.
    let mut raw = encode::template_message(1_700_000_000, 0);
    let msgs = encode::data_messages(&s.records, 40, 1_700_000_000, 0);
    for (i, m) in msgs.iter().enumerate() {
        if i == 3 {
            let mut bad = m.clone();
            bad[18..20].copy_from_slice(&0xffffu16.to_be_bytes()); // set longer than its message
            raw.extend_from_slice(&bad);
        } else {
            raw.extend_from_slice(m);
        }
    }
    std::fs::write(dir.join("cap.ipfix"), &raw).unwrap();
    let got = read_flow_file(&dir.join("cap.ipfix")).unwrap();
    assert_eq!(got.len(), s.records.len() - 40);
    let (_, stats) = read_netflow_bytes(&raw);
    assert!(stats.packets as usize >= msgs.len());
    // Gzipped CSV.
    let mut csv = Vec::new();
    write_csv(&s.records, &mut csv).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &csv).unwrap();
    std::fs::write(dir.join("flows.csv.gz"), gz.finish().unwrap()).unwrap();
    assert_eq!(
        read_flow_file(&dir.join("flows.csv.gz")).unwrap(),
        s.records
    );
    // pcap of the export traffic from two exporters.
    let mut pk = Vec::new();
    let t0 = 1_700_000_000_000_000u64;
    pk.push((
        t0,
        src("192.0.2.1:5000"),
        src("127.0.0.1:4739"),
        17u8,
        encode::template_message(1_700_000_000, 0),
    ));
    for (i, m) in msgs.iter().enumerate() {
        pk.push((
            t0 + i as u64,
            src("192.0.2.1:5000"),
            src("127.0.0.1:4739"),
            17,
            m.clone(),
        ));
    }
    std::fs::write(dir.join("export.pcap"), pcap::write_pcap(&pk)).unwrap();
    assert_eq!(
        read_flow_file(&dir.join("export.pcap")).unwrap().len(),
        s.records.len()
    );
    // Unknown content.
    std::fs::write(dir.join("x.dat"), b"\x01\x02\x03").unwrap();
    assert!(read_flow_file(&dir.join("x.dat")).is_err());
    assert!(read_flow_file(&dir.join("missing.csv")).is_err());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn pcap_flowlets_split_a_long_connection_into_messages() {
    // One TCP connection carrying 5 messages of 10 packets (10 µs apart), 50 ms apart,
    // plus pure ACKs in the other direction.
    let a = src("10.0.0.1:40000");
    let b = src("10.0.0.2:29500");
    let mut pk = Vec::new();
    for m in 0..5u64 {
        for p in 0..10u64 {
            let t = 1_000_000 + m * 50_000 + p * 10;
            pk.push((t, a, b, 6u8, vec![0u8; 1000]));
            pk.push((t + 5, b, a, 6u8, vec![]));
        }
    }
    let data = pcap::write_pcap(&pk);
    let got = pcap::read_pcap_bytes(&data, pcap::DEFAULT_IDLE_GAP_US).unwrap();
    assert_eq!(got.len(), 5, "{got:?}");
    assert!(got
        .iter()
        .all(|f| f.bytes == 10_000 && f.dur_us == 90 && f.src == a.ip()));
}

#[test]
fn collector_survives_garbage() {
    let port = {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.local_addr().unwrap().port()
    };
    let listen: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let handle = std::thread::spawn(move || {
        let mut got = Vec::new();
        let stats =
            whyslow_flows_ingest::collect_udp(listen, &stop2, 1000, |r| got.push(r)).unwrap();
        (got, stats)
    });
    std::thread::sleep(Duration::from_millis(200));
    let s = small();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let garbage_tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let msgs = encode::data_messages(&s.records[..100], 25, 1_700_000_000, 0);
    // Garbage first (from another exporter), then data before template, then template.
    for g in corpus() {
        garbage_tx.send_to(&g, listen).unwrap();
    }
    for m in &msgs {
        tx.send_to(m, listen).unwrap();
    }
    tx.send_to(&encode::template_message(1_700_000_000, 0), listen)
        .unwrap();
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let (got, stats) = handle.join().unwrap();
    let key = |r: &FlowRecord| (r.start_us, r.src, r.dst, r.bytes);
    let got_keys: std::collections::HashSet<_> = got.iter().map(key).collect();
    assert!(
        s.records[..100].iter().all(|r| got_keys.contains(&key(r))),
        "{stats:?}"
    );
    assert!(stats.errors > 0, "{stats:?}");
}

/// Malformed inputs: truncations, bad lengths, bad versions, random bytes.
fn corpus() -> Vec<Vec<u8>> {
    let s = small();
    let tpl = encode::template_message(1, 0);
    let data = encode::data_messages(&s.records[..10], 10, 1, 0).remove(0);
    let v9 = encode::v9_packet(&s.records[..5], 1_700_000_000, 1000, 0, true);
    let mut c: Vec<Vec<u8>> = vec![
        vec![],
        vec![0],
        vec![0, 10],
        vec![0, 9, 0, 0],
        vec![0xff; 100],
    ];
    for m in [&tpl, &data, &v9] {
        for cut in [1, 4, 15, 16, 17, 19, 20, 23, 24, m.len() / 2, m.len() - 1] {
            c.push(m[..cut.min(m.len())].to_vec());
        }
        for pos in 0..m.len().min(40) {
            let mut x = m.to_vec();
            x[pos] ^= 0xff;
            c.push(x);
        }
    }
    // Template with a zero-length field count and with absurd field lengths.
    let mut t = tpl.clone();
    t[22..24].copy_from_slice(&0u16.to_be_bytes());
    c.push(t);
    let mut t = tpl.clone();
    t[26..28].copy_from_slice(&0xffffu16.to_be_bytes());
    c.push(t);
    let mut seed = 5u64;
    for n in [7usize, 64, 300, 1500] {
        let mut x = vec![0u8; n];
        for b in &mut x {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            *b = (seed >> 56) as u8;
        }
        if n > 2 {
            x[0] = 0;
            x[1] = if n % 2 == 0 { 10 } else { 9 };
        }
        c.push(x);
    }
    c
}

#[test]
fn malformed_corpus_never_panics() {
    let mut corpus = corpus();
    // Inputs that once crashed (found by the fuzz target), in tests/corpus/.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    for e in std::fs::read_dir(dir).unwrap() {
        corpus.push(std::fs::read(e.unwrap().path()).unwrap());
    }
    let mut dec = FlowDecoder::new();
    let mut out = Vec::new();
    for g in &corpus {
        let (recs, _) = read_netflow_bytes(g);
        let _ = analyze(&recs, None, &FlowConfig::default());
        dec.decode(src("192.0.2.1:1"), g, &mut out);
        let _ = read_netflow_bytes(g);
        let _ = pcap::read_pcap_bytes(g, 1000);
        let _ = read_csv(&g[..], "g.csv");
        let _ = whyslow_flows_ingest::sniff_kind("x", g);
    }
    // Garbage pcaps.
    let good = pcap::write_pcap(&[(1, src("10.0.0.1:1"), src("10.0.0.2:2"), 6, vec![1, 2, 3])]);
    for cut in 0..good.len() {
        let _ = pcap::read_pcap_bytes(&good[..cut], 1000);
    }
    for pos in 0..good.len() {
        let mut x = good.clone();
        x[pos] ^= 0xff;
        let _ = pcap::read_pcap_bytes(&x, 1000);
    }
    // CSV garbage.
    for text in [
        "",
        "\n\n",
        "start_us\n",
        "start_us,src,dst,bytes,dur_us\n\"unterminated",
        "\u{feff}a,b\n1,2",
        "start_us,src,dst,bytes,dur_us\n1,1.2.3.4,::1,99999999999999999999999,1\n",
    ] {
        let _ = read_csv(text.as_bytes(), "g.csv");
    }
    // The decoder still works afterwards.
    let mut out = Vec::new();
    let mut dec = FlowDecoder::new();
    dec.decode(
        src("192.0.2.1:1"),
        &encode::template_message(1, 0),
        &mut out,
    );
    dec.decode(
        src("192.0.2.1:1"),
        &encode::data_messages(&small().records[..3], 3, 1, 0)[0],
        &mut out,
    );
    assert_eq!(out.len(), 3);
}

#[test]
fn per_switch_ipfix_end_to_end() {
    // Every switch on a flow's path exports it: decode, merge, analyze.
    let s = small();
    let mut by_switch: BTreeMap<String, Vec<FlowRecord>> = BTreeMap::new();
    for r in &s.records {
        for sw in &r.switches {
            by_switch.entry(sw.clone()).or_default().push(r.clone());
        }
    }
    let mut topo = s.topology.clone();
    let mut dec = FlowDecoder::new();
    let mut out = Vec::new();
    for (i, (sw, recs)) in by_switch.iter().enumerate() {
        let exporter: SocketAddr = format!("192.0.2.{}:4739", i + 1).parse().unwrap();
        topo.exporters.insert(exporter.ip().to_string(), sw.clone());
        dec.decode(
            exporter,
            &encode::template_message(1_700_000_000, 0),
            &mut out,
        );
        for m in encode::data_messages(recs, 50, 1_700_000_000, 0) {
            dec.decode(exporter, &m, &mut out);
        }
    }
    let r = analyze(&out, Some(&topo), &FlowConfig::default());
    assert_eq!(r.flows, s.records.len());
    assert_eq!(pairs(&r), s.truth.pairs);
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
}

/// A real capture (tests/fixtures/README.md): two gloo ranks in a network
/// namespace all-reducing a 1 MiB f32 tensor 8 times, taken by tcpdump with
/// a 128-byte snap length (classic pcap) and the same packets rewritten as
/// pcapng by scapy (an independent writer).
#[test]
fn a_real_gloo_capture_reads_the_same_as_pcap_and_pcapng() {
    let dir =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/pcap");
    let classic = dir.join("gloo-allreduce-2rank.pcap.gz");
    let ng = dir.join("gloo-allreduce-2rank.pcapng.gz");
    assert!(
        classic.is_file() && ng.is_file(),
        "fixture missing in {}",
        dir.display()
    );
    let unzip = |p: &std::path::Path| {
        let mut out = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap()),
            &mut out,
        )
        .unwrap();
        out
    };
    let (a, b) = (unzip(&classic), unzip(&ng));
    assert!(pcap::is_pcap(&a) && pcap::is_pcapng(&b));
    // Cut anywhere or corrupted, neither format panics; a cut keeps the
    // packets before it.
    for data in [&a, &b] {
        let full = pcap::packets(data).unwrap().len();
        for cut in (0..6000).chain((data.len() - 600..data.len()).step_by(7)) {
            if let Ok(p) = pcap::packets(&data[..cut]) {
                assert!(p.len() <= full);
            }
        }
        let mut bad = data[..20_000].to_vec();
        for i in (0..bad.len()).step_by(97) {
            bad[i] ^= 0x5a;
            let _ = pcap::packets(&bad);
        }
    }
    let (pa, pb) = (pcap::packets(&a).unwrap(), pcap::packets(&b).unwrap());
    assert!(pa.len() > 10_000, "{} packets", pa.len());
    assert_eq!(pa.len(), pb.len());
    for (x, y) in pa.iter().zip(&pb) {
        assert_eq!(
            (x.ts_us, x.src, x.dst, x.proto, x.payload_len),
            (y.ts_us, y.src, y.dst, y.proto, y.payload_len)
        );
        assert!(x.payload.len() <= 128, "the snap length truncates payloads");
    }
    // Each rank sends half the tensor twice per all-reduce (reduce-scatter,
    // all-gather): 8 × 1 MiB each way, read from the IP lengths although
    // only 128 bytes of each packet were kept.
    let flows = read_flow_file(&ng).unwrap();
    assert_eq!(flows, read_flow_file(&classic).unwrap());
    let mut per_direction: BTreeMap<(IpAddr, u16, u16), u64> = BTreeMap::new();
    for f in &flows {
        *per_direction
            .entry((f.src, f.src_port.unwrap(), f.dst_port.unwrap()))
            .or_default() += f.bytes;
    }
    let mut heavy: Vec<u64> = per_direction
        .values()
        .copied()
        .filter(|&b| b > 1 << 20)
        .collect();
    heavy.sort_unstable();
    assert_eq!(heavy.len(), 2, "{per_direction:?}");
    for bytes in heavy {
        let mib = bytes as f64 / (1 << 20) as f64;
        assert!((8.0..8.5).contains(&mib), "{mib:.3} MiB one way");
    }
}

#[test]
fn csv_times_may_be_decimal_and_in_any_unit() {
    let read = |text: &str| read_csv(text.as_bytes(), "t.csv");
    // Issue 11's row: fractional µs, as derived from a production trace.
    let got =
        read("start_us,src,dst,bytes,dur_us\n0.0,10.1.3.3,10.1.3.4,76474100,25267.33\n").unwrap();
    assert_eq!(
        (got[0].start_us, got[0].dur_us, got[0].bytes),
        (0, 25267, 76_474_100)
    );
    let got = read("start_us,src,dst,bytes,dur_us\n12.5,10.0.0.1,10.0.0.2,1.5e3,0.49\n").unwrap();
    assert_eq!(
        (got[0].start_us, got[0].dur_us, got[0].bytes),
        (13, 0, 1500)
    );
    // Nanoseconds (exact on a 2026 epoch time), milliseconds, seconds.
    let got =
        read("start_ns,src,dst,bytes,dur_ns\n1795405903137220499,10.0.0.1,10.0.0.2,10,2500\n")
            .unwrap();
    assert_eq!((got[0].start_us, got[0].dur_us), (1_795_405_903_137_220, 3));
    let got =
        read("dur_ms,start_s,src,dst,bytes\n2.25,1795405903.5,10.0.0.1,10.0.0.2,10\n").unwrap();
    assert_eq!(
        (got[0].start_us, got[0].dur_us),
        (1_795_405_903_500_000, 2250)
    );
    // Negative, non-finite, too large, or not numbers: the line is named.
    for bad in ["-1", "nan", "inf", "1e30", "12:00"] {
        let e = read(&format!(
            "start_us,src,dst,bytes,dur_us\n{bad},10.0.0.1,10.0.0.2,10,1\n"
        ))
        .unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("t.csv: line 2") && msg.contains("non-negative number"),
            "{bad}: {msg}"
        );
    }
    let e = read("start_min,src,dst,bytes,dur_us\n1,10.0.0.1,10.0.0.2,10,1\n").unwrap_err();
    assert!(
        e.to_string()
            .contains("missing column `start_us` (or `start_ns`"),
        "{e}"
    );
}

/// Format detection on random and truncated files of every supported kind
/// (issue 29): nothing panics; random bytes under any name give an error or
/// no record, never flows, so `whyslow flows analyze` says "could not
/// judge" instead of "no findings"; a truncated file gives at most the
/// records of the whole one.
#[test]
fn random_and_truncated_files_of_every_kind_never_read_as_flows() {
    use std::path::Path;
    use whyslow_flows_ingest::read_flow_bytes;

    let s = small();
    let mut csv = Vec::new();
    write_csv(&s.records, &mut csv).unwrap();
    let gz = |b: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut e, b).unwrap();
        e.finish().unwrap()
    };
    let mut ipfix = encode::template_message(1_700_000_000, 0);
    for m in encode::data_messages(&s.records, 40, 1_700_000_000, 0) {
        ipfix.extend_from_slice(&m);
    }
    let v9 = encode::v9_packet(&s.records[..30], 1_700_000_000, 1000, 0, true);
    let fixture = |name: &str| {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../tests/fixtures/pcap")
            .join(name);
        let mut out = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap()),
            &mut out,
        )
        .unwrap();
        out
    };
    let kinds: Vec<(&str, Vec<u8>)> = vec![
        ("flows.csv", csv.clone()),
        ("flows.csv.gz", gz(&csv)),
        ("cap.ipfix", ipfix),
        ("cap.nf", v9),
        ("cap.pcap", fixture("gloo-allreduce-2rank.pcap.gz")),
        ("cap.pcapng", fixture("gloo-allreduce-2rank.pcapng.gz")),
    ];
    let names = [
        "x.csv",
        "x.csv.gz",
        "x.parquet",
        "x.pcap",
        "x.pcapng",
        "x.ipfix",
        "x.nf",
        "x.v9",
        "x.netflow",
        "x.bin",
        "x",
        "rand.bin",
    ];
    for (name, good) in &kinds {
        let whole = read_flow_bytes(Path::new(name), good.clone())
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .len();
        assert!(whole > 0, "{name}");
        let step = (good.len() / 60).max(1);
        for cut in (0..good.len()).step_by(step) {
            // Under its own name and under every other one.
            for n in std::iter::once(*name).chain(names) {
                if let Ok(r) = read_flow_bytes(Path::new(n), good[..cut].to_vec()) {
                    assert!(r.len() <= whole, "{name} cut at {cut} as {n}: {}", r.len());
                }
            }
        }
    }
    let mut seed = 29u64;
    for size in [1usize, 3, 16, 512, 4096, 100_000] {
        for _ in 0..4 {
            let bytes: Vec<u8> = (0..size)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 56) as u8
                })
                .collect();
            for n in names {
                match read_flow_bytes(Path::new(n), bytes.clone()) {
                    Ok(r) => {
                        let report = analyze(&r, None, &FlowConfig::default());
                        assert!(
                            report.could_not_judge.is_some(),
                            "{size} random bytes as {n}: {} records judged",
                            r.len()
                        );
                    }
                    Err(e) => assert!(e.to_string().contains(n), "{e}"),
                }
            }
        }
    }
}
