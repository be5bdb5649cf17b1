//! IPFIX packet reports (PSAMP, RFC 5476/5477) as softflowd 1.1 exports them with
//! `-v psamp -A micro`: template (selectionSequenceId 301, observationTimeMicroseconds
//! 324, sectionExportedOctets 410, dataLinkFrameSection 315 of fixed length), one
//! data record per packet. The decoder must rebuild flowlets per exporter and
//! 5-tuple, ignore pure ACKs and count payload bytes from the IP header even when
//! the section is cut short.

use std::net::SocketAddr;

use etherparse::PacketBuilder;
use whyslow_flows_ingest::netflow::encode::ntp;
use whyslow_flows_ingest::FlowDecoder;

const SECTION: usize = 128;

mod common;

fn message(sets: &[(u16, Vec<u8>)]) -> Vec<u8> {
    common::ipfix_message(1_795_000_000, 0, sets)
}

fn template() -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&3072u16.to_be_bytes());
    t.extend_from_slice(&4u16.to_be_bytes());
    for (id, len) in [(301u16, 8u16), (324, 8), (410, 2), (315, SECTION as u16)] {
        t.extend_from_slice(&id.to_be_bytes());
        t.extend_from_slice(&len.to_be_bytes());
    }
    message(&[(2, t)])
}

/// One packet report: a TCP segment a → b with `payload` bytes at `us`.
fn report(seq: u64, us: u64, sport: u16, dport: u16, payload: usize) -> Vec<u8> {
    let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv4([10, 99, 0, 1], [10, 99, 0, 2], 64)
        .tcp(sport, dport, 1, 65535);
    let data = vec![0xabu8; payload];
    let mut frame = Vec::new();
    builder.write(&mut frame, &data).unwrap();
    let exported = frame.len().min(SECTION);
    frame.resize(SECTION, 0); // fixed-length field: cut or padded
    let mut r = Vec::new();
    r.extend_from_slice(&seq.to_be_bytes());
    r.extend_from_slice(&ntp(us));
    r.extend_from_slice(&(exported as u16).to_be_bytes());
    r.extend_from_slice(&frame);
    r
}

#[test]
fn packet_reports_become_flowlets_per_exporter() {
    let leaf: SocketAddr = "10.98.0.1:40000".parse().unwrap();
    let spine: SocketAddr = "10.98.0.3:40001".parse().unwrap();
    let mut dec = FlowDecoder::with_flowlet_gap(5_000);
    let mut out = Vec::new();
    let t0 = 1_795_000_000_000_000u64;
    for exporter in [leaf, spine] {
        dec.decode(exporter, &template(), &mut out);
        let mut seq = 0;
        // Message 1: 10 segments of 1448 B, 100 µs apart; a pure ACK back
        // in the middle is ignored. Message 2 after 50 ms: 3 × 1000 B.
        let mut packets = Vec::new();
        for i in 0..10 {
            packets.push(report(seq, t0 + i * 100, 5000, 6000, 1448));
            seq += 1;
        }
        packets.push(report(seq, t0 + 550, 6000, 5000, 0));
        seq += 1;
        for i in 0..3 {
            packets.push(report(seq, t0 + 50_000 + i * 200, 5000, 6000, 1000));
            seq += 1;
        }
        for p in packets {
            dec.decode(exporter, &message(&[(3072, p)]), &mut out);
        }
    }
    // The first flowlets closed when the second message came (per exporter).
    assert_eq!(out.len(), 2, "{out:?}");
    dec.finish(&mut out);
    assert_eq!(out.len(), 4, "{out:?}");
    assert_eq!(dec.stats.packet_reports, 28);
    let mut seen: Vec<(String, u64, u64, u64)> = out
        .iter()
        .map(|r| (r.switches.join(","), r.start_us - t0, r.dur_us, r.bytes))
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("10.98.0.1".into(), 0, 900, 14_480),
            ("10.98.0.1".into(), 50_000, 400, 3_000),
            ("10.98.0.3".into(), 0, 900, 14_480),
            ("10.98.0.3".into(), 50_000, 400, 3_000),
        ]
    );
    for r in &out {
        assert_eq!(r.src.to_string(), "10.99.0.1");
        assert_eq!(
            (r.src_port, r.dst_port, r.proto),
            (Some(5000), Some(6000), Some(6))
        );
    }
}

#[test]
fn idle_flowlets_expire_and_garbage_sections_are_skipped() {
    let exporter: SocketAddr = "10.98.0.2:40000".parse().unwrap();
    let mut dec = FlowDecoder::with_flowlet_gap(1_000);
    let mut out = Vec::new();
    let t0 = 1_795_000_000_000_000u64;
    dec.decode(exporter, &template(), &mut out);
    dec.decode(
        exporter,
        &message(&[(3072, report(0, t0, 1, 2, 500))]),
        &mut out,
    );
    // A frame section that is not Ethernet/IP: skipped, counted.
    let mut junk = Vec::new();
    junk.extend_from_slice(&1u64.to_be_bytes());
    junk.extend_from_slice(&ntp(t0 + 10));
    junk.extend_from_slice(&(SECTION as u16).to_be_bytes());
    junk.extend_from_slice(&[0xffu8; SECTION]);
    dec.decode(exporter, &message(&[(3072, junk)]), &mut out);
    assert_eq!(dec.stats.skipped, 1);
    assert!(out.is_empty());
    assert_eq!(dec.expire(t0 + 500, &mut out), 0, "still within the gap");
    assert_eq!(dec.expire(t0 + 5_000, &mut out), 1);
    assert_eq!(out[0].bytes, 500);
    assert_eq!(dec.finish(&mut out), 0);
}

#[test]
fn a_stale_timestamp_keeps_its_bytes_without_stretching_the_flowlet() {
    // Seen on the testbed: one report per direction stamped a whole second
    // early stretched a 2 ms bucket over the compute before it (1,003 ms).
    let exporter: SocketAddr = "10.98.0.1:40000".parse().unwrap();
    let mut dec = FlowDecoder::with_flowlet_gap(5_000);
    let mut out = Vec::new();
    let t0 = 1_795_000_001_000_000u64;
    dec.decode(exporter, &template(), &mut out);
    for (seq, at) in [(0u64, t0 + 271_000), (1, t0), (2, t0 + 271_500)] {
        dec.decode(
            exporter,
            &message(&[(3072, report(seq, at, 5000, 6000, 1448))]),
            &mut out,
        );
    }
    dec.finish(&mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        (out[0].start_us - t0, out[0].dur_us, out[0].bytes),
        (271_000, 500, 3 * 1448)
    );
}
