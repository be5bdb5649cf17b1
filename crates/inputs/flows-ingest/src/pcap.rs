//! Classic pcap input (little/big endian, µs/ns timestamps; link types Ethernet,
//! Linux cooked v1/v2, raw IP, BSD null): either a capture of IPFIX / NetFlow v9
//! export traffic (decoded like the collector would), or a capture of the training
//! traffic itself, turned into **flowlets**: per 5-tuple, payload-carrying packets
//! separated by at most `idle_gap_us` form one flow (a message of a long-lived TCP
//! connection such as gloo's). Pure ACKs (no payload) are ignored. pcapng is not
//! supported (convert with `tcpdump -r in.pcapng -w out.pcap`).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use whyslow_model::flow::FlowRecord;

use crate::netflow::FlowDecoder;

/// Default idle gap that ends a flowlet, µs.
pub const DEFAULT_IDLE_GAP_US: u64 = 1_000;

/// True when `head` starts with a classic pcap magic number.
pub fn is_pcap(head: &[u8]) -> bool {
    head.len() >= 4
        && matches!(
            [head[0], head[1], head[2], head[3]],
            [0xd4, 0xc3, 0xb2, 0xa1]
                | [0xa1, 0xb2, 0xc3, 0xd4]
                | [0x4d, 0x3c, 0xb2, 0xa1]
                | [0xa1, 0xb2, 0x3c, 0x4d]
        )
}

/// One transport packet of a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// Capture time, µs since the Unix epoch.
    pub ts_us: u64,
    /// Source address and port.
    pub src: SocketAddr,
    /// Destination address and port.
    pub dst: SocketAddr,
    /// IP protocol (6 TCP, 17 UDP).
    pub proto: u8,
    /// Transport payload (possibly truncated by the snap length).
    pub payload: &'a [u8],
    /// Payload length on the wire.
    pub payload_len: usize,
}

/// Parse a classic pcap into transport packets (other packets are skipped). Errors
/// only for a bad global header; a truncated last record ends the capture.
pub fn packets(data: &[u8]) -> Result<Vec<Packet<'_>>, String> {
    if data.len() < 24 || !is_pcap(data) {
        return Err("expected a classic pcap global header".into());
    }
    let le = data[0] == 0xd4 || data[0] == 0x4d;
    let nanos = data[0] == 0x4d || data[3] == 0x4d;
    let u32_at = |b: &[u8], o: usize| -> u32 {
        let a = [b[o], b[o + 1], b[o + 2], b[o + 3]];
        if le {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let link = u32_at(data, 20);
    let mut out = Vec::new();
    let mut off = 24;
    while off + 16 <= data.len() {
        let sec = u32_at(data, off) as u64;
        let frac = u32_at(data, off + 4) as u64;
        let incl = u32_at(data, off + 8) as usize;
        off += 16;
        if incl > data.len() - off {
            break;
        }
        let frame = &data[off..off + incl];
        off += incl;
        let ts_us = sec * 1_000_000 + if nanos { frac / 1000 } else { frac };
        let ip = match link {
            1 => ether_payload(frame),
            113 => frame
                .get(16..)
                .map(|p| (u16::from_be_bytes([frame[14], frame[15]]), p)),
            276 => frame
                .get(20..)
                .map(|p| (u16::from_be_bytes([frame[0], frame[1]]), p)),
            101 | 228 | 229 => frame
                .first()
                .map(|&b| (if b >> 4 == 6 { 0x86dd } else { 0x0800 }, frame)),
            0 => frame.get(4..).map(|p| {
                (
                    if p.first().is_some_and(|&b| b >> 4 == 6) {
                        0x86dd
                    } else {
                        0x0800
                    },
                    p,
                )
            }),
            _ => None,
        };
        if let Some((ethertype, ip)) = ip {
            if let Some(p) = transport(ethertype, ip, ts_us) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

fn ether_payload(f: &[u8]) -> Option<(u16, &[u8])> {
    let mut t = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    let mut off = 14;
    while t == 0x8100 || t == 0x88a8 {
        t = u16::from_be_bytes([*f.get(off + 2)?, *f.get(off + 3)?]);
        off += 4;
    }
    Some((t, f.get(off..)?))
}

fn transport(ethertype: u16, ip: &[u8], ts_us: u64) -> Option<Packet<'_>> {
    let (src, dst, proto, l4, l4_len) = match ethertype {
        0x0800 => {
            if ip.len() < 20 {
                return None;
            }
            let ihl = ((*ip.first()? & 0x0f) as usize) * 4;
            let total = u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]) as usize;
            let frag = u16::from_be_bytes([*ip.get(6)?, *ip.get(7)?]) & 0x1fff;
            if ihl < 20 || frag != 0 {
                return None;
            }
            let s = Ipv4Addr::new(*ip.get(12)?, ip[13], ip[14], ip[15]);
            let d = Ipv4Addr::new(*ip.get(16)?, ip[17], ip[18], ip[19]);
            (
                IpAddr::V4(s),
                IpAddr::V4(d),
                ip[9],
                ip.get(ihl..)?,
                total.checked_sub(ihl)?,
            )
        }
        0x86dd => {
            let s: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let d: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            let plen = u16::from_be_bytes([*ip.get(4)?, *ip.get(5)?]) as usize;
            (
                IpAddr::V6(Ipv6Addr::from(s)),
                IpAddr::V6(Ipv6Addr::from(d)),
                *ip.get(6)?,
                ip.get(40..)?,
                plen,
            )
        }
        _ => return None,
    };
    let (sp, dp, hdr) = match proto {
        17 => (
            u16::from_be_bytes([*l4.first()?, *l4.get(1)?]),
            u16::from_be_bytes([*l4.get(2)?, *l4.get(3)?]),
            8,
        ),
        6 => {
            let doff = ((*l4.get(12)? >> 4) as usize) * 4;
            (
                u16::from_be_bytes([l4[0], l4[1]]),
                u16::from_be_bytes([l4[2], l4[3]]),
                doff.max(20),
            )
        }
        _ => return None,
    };
    let payload = l4.get(hdr.min(l4.len())..).unwrap_or(&[]);
    Some(Packet {
        ts_us,
        src: SocketAddr::new(src, sp),
        dst: SocketAddr::new(dst, dp),
        proto,
        payload,
        payload_len: l4_len.saturating_sub(hdr),
    })
}

/// Read a pcap: if most UDP datagrams are IPFIX / NetFlow v9 (version 10 or 9 in the
/// first two bytes), decode them per exporter (the datagram's source); otherwise
/// build flowlets with `idle_gap_us`.
pub fn read_pcap_bytes(data: &[u8], idle_gap_us: u64) -> Result<Vec<FlowRecord>, String> {
    let pkts = packets(data)?;
    let udp: Vec<&Packet> = pkts.iter().filter(|p| p.proto == 17).collect();
    let export = udp
        .iter()
        .filter(|p| p.payload.len() >= 20 && p.payload[0] == 0 && matches!(p.payload[1], 9 | 10))
        .count();
    if export > 0 && export * 2 >= udp.len() && export * 2 >= pkts.len() {
        let mut dec = FlowDecoder::new();
        let mut out = Vec::new();
        for p in udp {
            dec.decode(p.src, p.payload, &mut out);
        }
        return Ok(out);
    }
    Ok(flowlets(&pkts, idle_gap_us, None))
}

/// Flowlets of `pkts` (see the module docs); `capture_point` names the switch/bridge
/// where the capture was taken (put into `switches`).
pub fn flowlets(
    pkts: &[Packet<'_>],
    idle_gap_us: u64,
    capture_point: Option<&str>,
) -> Vec<FlowRecord> {
    struct Open {
        start: u64,
        last: u64,
        bytes: u64,
    }
    let mut open: HashMap<(SocketAddr, SocketAddr, u8), Open> = HashMap::new();
    let mut out = Vec::new();
    let sw: Vec<String> = capture_point
        .map(|s| vec![s.to_string()])
        .unwrap_or_default();
    let emit = |k: &(SocketAddr, SocketAddr, u8), o: &Open, out: &mut Vec<FlowRecord>| {
        out.push(FlowRecord {
            start_us: o.start,
            dur_us: o.last - o.start,
            src: k.0.ip(),
            dst: k.1.ip(),
            bytes: o.bytes,
            src_port: Some(k.0.port()),
            dst_port: Some(k.1.port()),
            proto: Some(k.2),
            switches: sw.clone(),
        });
    };
    let mut sorted: Vec<&Packet> = pkts.iter().filter(|p| p.payload_len > 0).collect();
    sorted.sort_by_key(|p| p.ts_us);
    for p in sorted {
        let k = (p.src, p.dst, p.proto);
        match open.get_mut(&k) {
            Some(o) if p.ts_us.saturating_sub(o.last) <= idle_gap_us => {
                o.last = o.last.max(p.ts_us);
                o.bytes += p.payload_len as u64;
            }
            Some(o) => {
                emit(&k, o, &mut out);
                *o = Open {
                    start: p.ts_us,
                    last: p.ts_us,
                    bytes: p.payload_len as u64,
                };
            }
            None => {
                open.insert(
                    k,
                    Open {
                        start: p.ts_us,
                        last: p.ts_us,
                        bytes: p.payload_len as u64,
                    },
                );
            }
        }
    }
    for (k, o) in &open {
        emit(k, o, &mut out);
    }
    out.sort_by_key(|r| r.start_us);
    out
}

/// Read a pcap file of training traffic as flowlets.
pub fn read_pcap_flowlets(
    path: &std::path::Path,
    idle_gap_us: u64,
    capture_point: Option<&str>,
) -> Result<Vec<FlowRecord>, crate::FlowIngestError> {
    let data = std::fs::read(path).map_err(|e| crate::FlowIngestError::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    let pkts = packets(&data).map_err(|msg| crate::FlowIngestError::Format {
        path: path.display().to_string(),
        msg,
    })?;
    Ok(flowlets(&pkts, idle_gap_us, capture_point))
}

/// Write a classic pcap (Ethernet, µs) of UDP or TCP packets: used by tests and to
/// build fuzz seeds. Each item: (time µs, src, dst, proto 6|17, payload).
pub fn write_pcap(packets: &[(u64, SocketAddr, SocketAddr, u8, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&[0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0]);
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&65_535u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for (ts, s, d, proto, payload) in packets {
        let (IpAddr::V4(si), IpAddr::V4(di)) = (s.ip(), d.ip()) else {
            continue;
        };
        let l4h = if *proto == 6 { 20 } else { 8 };
        let total = 20 + l4h + payload.len();
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(&[
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0,
            0,
            64,
            *proto,
            0,
            0,
        ]);
        f.extend_from_slice(&si.octets());
        f.extend_from_slice(&di.octets());
        f.extend_from_slice(&s.port().to_be_bytes());
        f.extend_from_slice(&d.port().to_be_bytes());
        if *proto == 6 {
            f.extend_from_slice(&[0; 8]);
            f.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        } else {
            f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        f.extend_from_slice(payload);
        b.extend_from_slice(&((ts / 1_000_000) as u32).to_le_bytes());
        b.extend_from_slice(&((ts % 1_000_000) as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(&f);
    }
    b
}
