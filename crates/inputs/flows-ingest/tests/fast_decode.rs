//! The fast path of `FlowDecoder` (IPFIX data sets of known templates decoded
//! without `netflow_parser`) must give exactly what `netflow_parser` gives:
//! same records, same counters, datagram by datagram. Checked on the real
//! testbed captures (`tests/fixtures/flows`, re-exported as IPFIX under
//! several templates, softflowd's included) and on deterministic mutations of
//! those exports: byte flips, truncations, template changes and withdrawals,
//! concatenated and re-scoped datagrams.

use std::net::{IpAddr, SocketAddr};

use whyslow_flows_ingest::netflow::encode;
use whyslow_flows_ingest::{read_flow_file, FlowDecoder};
use whyslow_model::flow::FlowRecord;

const CAPTURES: [&str; 4] = [
    "testbed-two-jobs",
    "testbed-store-traffic",
    "testbed-slow-uplink-50mbit",
    "testbed-slow-uplink-150mbit",
];

fn capture(name: &str) -> Vec<FlowRecord> {
    let path = whyslow_testkit::fixtures()
        .join("flows")
        .join(name)
        .join("flows.csv.gz");
    read_flow_file(&path).expect("capture")
}

/// Deterministic xorshift.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

mod common;

use common::ipfix_message as message;

fn template_set(id: u16, fields: &[(u16, u16)]) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&id.to_be_bytes());
    t.extend_from_slice(&(fields.len() as u16).to_be_bytes());
    for (f, l) in fields {
        t.extend_from_slice(&f.to_be_bytes());
        t.extend_from_slice(&l.to_be_bytes());
    }
    t
}

/// Value of element `id` (length `len`) for `r`; uptime fields relative to `boot_ms`.
fn field(r: &FlowRecord, id: u16, len: u16, boot_ms: u64, out: &mut Vec<u8>) {
    let num = |v: u64, out: &mut Vec<u8>| {
        let b = v.to_be_bytes();
        out.extend_from_slice(&b[8 - len as usize..]);
    };
    let ntp_ns = |us: u64| {
        let s = us / 1_000_000 + 2_208_988_800;
        let frac = ((us % 1_000_000 * 1000) << 32).div_ceil(1_000_000_000);
        (s << 32) | frac
    };
    match id {
        8 | 12 => {
            let a = if id == 8 { r.src } else { r.dst };
            match a {
                IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
                IpAddr::V6(_) => out.extend_from_slice(&[0; 4]),
            }
        }
        7 => num(r.src_port.unwrap_or(0) as u64, out),
        11 => num(r.dst_port.unwrap_or(0) as u64, out),
        4 => num(r.proto.unwrap_or(0) as u64, out),
        1 | 85 => num(r.bytes, out),
        2 => num(r.bytes / 1400 + 1, out),
        154 => out.extend_from_slice(&encode::ntp(r.start_us)),
        155 => out.extend_from_slice(&encode::ntp(r.end_us())),
        156 => num(ntp_ns(r.start_us), out),
        157 => num(ntp_ns(r.end_us()), out),
        152 => num(r.start_us / 1000, out),
        153 => num(r.end_us() / 1000, out),
        150 => num(r.start_us / 1_000_000, out),
        151 => num(r.end_us() / 1_000_000, out),
        22 => num((r.start_us / 1000).saturating_sub(boot_ms), out),
        21 => num((r.end_us() / 1000).saturating_sub(boot_ms), out),
        161 => num(r.dur_us / 1000, out),
        162 => num(r.dur_us, out),
        160 => num(boot_ms, out),
        _ => num(0x1b, out),
    }
}

/// A softflowd-like export of `records`: template (and, with uptime times, an
/// options template + record with systemInitTimeMilliseconds) every 20
/// messages, `per` records a message.
fn export(records: &[FlowRecord], fields: &[(u16, u16)], tid: u16, per: usize) -> Vec<Vec<u8>> {
    let boot_ms = records.iter().map(|r| r.start_us / 1000).min().unwrap_or(0) - 5000;
    let uptime = fields.iter().any(|f| f.0 == 22);
    let mut msgs = Vec::new();
    for (k, chunk) in records.chunks(per).enumerate() {
        let export = (chunk[0].start_us / 1_000_000) as u32 + 2;
        let mut sets = Vec::new();
        if k % 20 == 0 {
            sets.push((2, template_set(tid, fields)));
            if uptime {
                // Options template 300: scope observationDomainId, systemInitTimeMilliseconds.
                let mut o = Vec::new();
                o.extend_from_slice(&300u16.to_be_bytes());
                o.extend_from_slice(&2u16.to_be_bytes());
                o.extend_from_slice(&1u16.to_be_bytes());
                o.extend_from_slice(&[0, 149, 0, 4, 0, 160, 0, 8]);
                sets.push((3, o));
                let mut d = vec![0, 0, 0, 0];
                d.extend_from_slice(&boot_ms.to_be_bytes());
                sets.push((300, d));
            }
        }
        let mut body = Vec::new();
        for r in chunk {
            for &(id, len) in fields {
                field(r, id, len, boot_ms, &mut body);
            }
        }
        sets.push((tid, body));
        msgs.push(message(export, 0, &sets));
    }
    msgs
}

/// Templates: the benchmark's, softflowd's (`-v 10`, uptime times, with
/// interfaces/ToS/flags/packets), and the absolute-time variants.
fn templates() -> Vec<(u16, Vec<(u16, u16)>)> {
    let base = [(8, 4), (12, 4), (7, 2), (11, 2), (4, 1)];
    let with = |extra: &[(u16, u16)]| base.iter().chain(extra).copied().collect::<Vec<_>>();
    vec![
        (256, encode::FIELDS_V4.to_vec()),
        (
            1024,
            with(&[
                (10, 4),
                (14, 4),
                (5, 1),
                (1, 4),
                (2, 4),
                (22, 4),
                (21, 4),
                (60, 1),
            ]),
        ),
        (1025, with(&[(1, 8), (2, 8), (156, 8), (157, 8)])),
        (1026, with(&[(85, 8), (152, 8), (161, 4)])),
        (1027, with(&[(1, 4), (150, 4), (162, 4), (58, 2)])),
        (1028, with(&[(1, 4), (150, 4), (151, 4), (6, 1)])), // tcpControlBits: general path
    ]
}

/// Feeds `dgrams` to a fast and a reference decoder; both must agree after each.
fn check(dgrams: &[(SocketAddr, Vec<u8>)]) -> (usize, u64, u64) {
    let mut fast = FlowDecoder::new();
    let mut slow = FlowDecoder::reference();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for (i, (src, d)) in dgrams.iter().enumerate() {
        let na = fast.decode(*src, d, &mut a);
        let nb = slow.decode(*src, d, &mut b);
        assert_eq!(na, nb, "datagram {i}: record count");
        assert_eq!(fast.stats, slow.stats, "datagram {i}: counters");
    }
    fast.finish(&mut a);
    slow.finish(&mut b);
    assert_eq!(a, b, "records");
    assert_eq!(fast.stats, slow.stats);
    assert_eq!(slow.fast_datagrams(), 0);
    (a.len(), fast.stats.errors, fast.fast_datagrams())
}

fn streams() -> Vec<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for name in CAPTURES {
        let recs = capture(name);
        let mut m = vec![encode::template_message(1_700_000_000, 0)];
        m.extend(encode::data_messages(&recs, 36, 1_700_000_000, 0));
        out.push(m);
        for (tid, fields) in templates() {
            out.push(export(&recs, &fields, tid, 30));
        }
    }
    out
}

#[test]
fn fast_path_equals_netflow_parser_on_real_captures() {
    let src: SocketAddr = "10.0.0.1:4739".parse().unwrap();
    let mut fast = 0;
    for msgs in streams() {
        let d: Vec<_> = msgs.into_iter().map(|m| (src, m)).collect();
        let (n, errors, f) = check(&d);
        assert!(n > 4000, "{n} records");
        assert_eq!(errors, 0);
        fast += f;
    }
    // All but the template-bearing messages and the tcpControlBits template.
    assert!(fast > 2500, "{fast} datagrams on the fast path");
}

fn mutate(rng: &mut Rng, msgs: &[Vec<u8>]) -> Vec<(SocketAddr, Vec<u8>)> {
    let srcs: [SocketAddr; 2] = [
        "10.0.0.1:4739".parse().unwrap(),
        "10.0.0.2:9995".parse().unwrap(),
    ];
    let mut out: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
    let mut i = 0;
    while i < msgs.len() {
        let mut m = msgs[i].clone();
        let mut src = srcs[0];
        match rng.below(40) {
            0 => {
                let at = rng.below(m.len());
                m[at] ^= 1 << rng.below(8);
            }
            1 => m.truncate(rng.below(m.len())),
            2 => {
                // Rewrite a u16 (lengths, ids, template fields) near the front.
                let at = rng.below(m.len().min(80).saturating_sub(1));
                let v = [0u16, 1, 2, 3, 4, 8, 16, 255, 256, 1024, 65535][rng.below(11)];
                m[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
            3 => {
                // Withdraw a template (or all), alone or before the data.
                let id = [256u16, 1024, 1025, 300, 2][rng.below(5)];
                let w = message(
                    1_700_000_000,
                    0,
                    &[(2, [id.to_be_bytes(), [0, 0]].concat())],
                );
                out.push((src, w));
            }
            4 if i + 1 < msgs.len() => {
                // Two messages in one datagram (maybe with trailing junk).
                m.extend_from_slice(&msgs[i + 1]);
                if rng.below(2) == 0 {
                    m.extend_from_slice(&[0, 10, 0]);
                }
                i += 1;
            }
            5 => src = srcs[1],
            6 => m[12..16].copy_from_slice(&7u32.to_be_bytes()),
            7 => {
                // Redefine template 256 with other lengths / elements.
                let f = [(8u16, 4u16), (12, 4), (7, 4), (1, 2), (154, 4), (155, 8)];
                let k = rng.below(f.len()) + 1;
                out.push((
                    src,
                    message(1_700_000_000, 0, &[(2, template_set(256, &f[..k]))]),
                ));
            }
            8 => m.extend_from_slice(&[0; 3]),
            _ => {}
        }
        out.push((src, m));
        i += 1;
    }
    out
}

#[test]
fn fast_path_equals_netflow_parser_on_mutated_exports() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let all = streams();
    let (mut errors, mut fast) = (0, 0);
    for round in 0..6 {
        for msgs in &all {
            // A third of each stream keeps the test quick.
            let k = msgs.len() / 3;
            let part = &msgs[(round % 3 * k).min(msgs.len() - 1)..];
            let d = mutate(&mut rng, &part[..k.min(part.len())]);
            let (_, e, f) = check(&d);
            errors += e;
            fast += f;
        }
    }
    assert!(errors > 0, "mutations reached the parser's error paths");
    assert!(fast > 1500, "{fast} datagrams on the fast path");
}
