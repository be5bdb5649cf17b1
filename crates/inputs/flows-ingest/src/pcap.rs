//! Capture input: classic pcap (little/big endian, µs/ns timestamps) and
//! pcapng (any interface's `if_tsresol`/`if_tsoffset`; Enhanced Packet Blocks;
//! Simple Packet Blocks carry no time and are skipped), read with
//! `pcap-parser`; frames decoded with `etherparse` (link types Ethernet with
//! VLAN tags, Linux cooked v1/v2, raw IP, BSD null; snap-length-truncated
//! packets keep their on-wire length). Either a capture of IPFIX / NetFlow
//! v9 export traffic (decoded like the collector would), or a capture of the
//! training traffic itself, turned into **flowlets**: per 5-tuple,
//! payload-carrying packets separated by at most `idle_gap_us` form one flow
//! (a message of a long-lived TCP connection such as gloo's). Pure ACKs (no
//! payload) are ignored. [`FlowletAssembler`] does the same for packets that
//! arrive one by one (IPFIX packet reports from a switch).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use etherparse::{EtherType, LaxNetSlice, LaxSlicedPacket, TransportSlice};
use pcap_parser::pcapng::Block;
use pcap_parser::{LegacyPcapSlice, Linktype, PcapBlockOwned, PcapNGSlice};
use whyslow_model::flow::{FlowRecord, SwitchPath};

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

/// True when `head` starts with a pcapng Section Header Block.
pub fn is_pcapng(head: &[u8]) -> bool {
    head.starts_with(&[0x0a, 0x0d, 0x0d, 0x0a])
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

/// Parse a classic pcap or a pcapng into transport packets (other packets
/// are skipped). Errors only for a bad file header; a truncated or corrupt
/// record ends the capture (the packets before it are kept).
pub fn packets(data: &[u8]) -> Result<Vec<Packet<'_>>, String> {
    let mut out = Vec::new();
    if is_pcap(data) {
        let capture = LegacyPcapSlice::from_slice(data)
            .map_err(|e| format!("bad classic pcap header: {e:?}"))?;
        let link = capture.header.network;
        let nanos = capture.header.is_nanosecond_precision();
        for block in capture {
            let Ok(PcapBlockOwned::Legacy(b)) = block else {
                break;
            };
            let frac = u64::from(b.ts_usec);
            let ts_us = u64::from(b.ts_sec) * 1_000_000 + if nanos { frac / 1000 } else { frac };
            out.extend(frame(link, b.data, ts_us));
        }
    } else if is_pcapng(data) {
        let capture = PcapNGSlice::from_slice(data)
            .map_err(|e| format!("bad pcapng section header: {e:?}"))?;
        // Per interface of the current section: link type, units per second, offset (s).
        let mut interfaces: Vec<(Linktype, u64, i64)> = Vec::new();
        for block in capture {
            let Ok(PcapBlockOwned::NG(b)) = block else {
                break;
            };
            match b {
                Block::SectionHeader(_) => interfaces.clear(),
                Block::InterfaceDescription(idb) => interfaces.push((
                    idb.linktype,
                    idb.ts_resolution().unwrap_or(1_000_000),
                    idb.ts_offset(),
                )),
                Block::EnhancedPacket(epb) => {
                    let Some(&(link, per_s, offset_s)) = interfaces.get(epb.if_id as usize) else {
                        continue;
                    };
                    let units = (u128::from(epb.ts_high) << 32) | u128::from(epb.ts_low);
                    let us = units * 1_000_000 / u128::from(per_s.max(1));
                    let ts_us = (us as i128 + i128::from(offset_s) * 1_000_000).max(0) as u64;
                    let caplen = (epb.caplen as usize).min(epb.data.len());
                    out.extend(frame(link, &epb.data[..caplen], ts_us));
                }
                _ => {}
            }
        }
    } else {
        return Err(
            "expected a classic pcap (magic a1b2c3d4 or a1b23c4d) or a pcapng \
                    (section header 0a0d0d0a)"
                .into(),
        );
    }
    Ok(out)
}

/// Decode one captured frame of link type `link` into its transport packet.
fn frame(link: Linktype, f: &[u8], ts_us: u64) -> Option<Packet<'_>> {
    let sliced = match link {
        Linktype::ETHERNET => LaxSlicedPacket::from_ethernet(f).ok()?,
        // Linux cooked capture v1: protocol (an EtherType) at bytes 14–15.
        Linktype::LINUX_SLL => LaxSlicedPacket::from_ether_type(
            EtherType(u16::from_be_bytes([*f.get(14)?, *f.get(15)?])),
            f.get(16..)?,
        ),
        // v2: protocol at bytes 0–1, 20-byte header.
        Linktype::LINUX_SLL2 => LaxSlicedPacket::from_ether_type(
            EtherType(u16::from_be_bytes([*f.first()?, *f.get(1)?])),
            f.get(20..)?,
        ),
        Linktype::RAW | Linktype::IPV4 | Linktype::IPV6 => LaxSlicedPacket::from_ip(f).ok()?,
        // BSD loopback: a 4-byte address family in host order.
        Linktype::NULL => LaxSlicedPacket::from_ip(f.get(4..)?).ok()?,
        _ => return None,
    };
    // On-wire length of the IP payload (the capture may hold less).
    let (src, dst, ip_payload_len) = match sliced.net.as_ref()? {
        LaxNetSlice::Ipv4(v4) => {
            let h = v4.header();
            if v4.payload().fragmented {
                return None;
            }
            (
                IpAddr::V4(h.source_addr()),
                IpAddr::V4(h.destination_addr()),
                usize::from(h.total_len()).checked_sub(
                    h.slice().len() + v4.extensions().auth.map_or(0, |a| a.slice().len()),
                )?,
            )
        }
        LaxNetSlice::Ipv6(v6) => {
            let h = v6.header();
            if v6.payload().fragmented {
                return None;
            }
            (
                IpAddr::V6(h.source_addr()),
                IpAddr::V6(h.destination_addr()),
                usize::from(h.payload_length()).checked_sub(v6.extensions().slice().len())?,
            )
        }
        _ => return None,
    };
    let (proto, sp, dp, header, payload) = match sliced.transport.as_ref()? {
        TransportSlice::Tcp(t) => (
            6,
            t.source_port(),
            t.destination_port(),
            t.slice().len() - t.payload().len(),
            t.payload(),
        ),
        TransportSlice::Udp(u) => (17, u.source_port(), u.destination_port(), 8, u.payload()),
        _ => return None,
    };
    Some(Packet {
        ts_us,
        src: SocketAddr::new(src, sp),
        dst: SocketAddr::new(dst, dp),
        proto,
        payload,
        payload_len: ip_payload_len.saturating_sub(header),
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
        dec.finish(&mut out);
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
    let mut asm = FlowletAssembler::new(idle_gap_us);
    let mut out = Vec::new();
    let mut sorted: Vec<&Packet> = pkts.iter().collect();
    sorted.sort_by_key(|p| p.ts_us);
    for p in sorted {
        asm.push(p, capture_point.unwrap_or(""), &mut out);
    }
    asm.finish(&mut out);
    out.sort_by_key(|r| r.start_us);
    out
}

/// Builds flowlets from packets that arrive one by one (in time order per
/// 5-tuple and observation point): a packet more than the idle gap after the
/// previous one of its 5-tuple closes the open flowlet. Used for captures and for
/// IPFIX packet reports (PSAMP, RFC 5476), where each exporter is its own
/// observation point.
#[derive(Debug)]
pub struct FlowletAssembler {
    idle_gap_us: u64,
    /// Observation point names; keys hold their index.
    /// Each point's path, shared by its flowlets' records (empty for an unnamed point).
    points: Vec<SwitchPath>,
    open: HashMap<FlowletKey, Open>,
}

type FlowletKey = (u32, SocketAddr, SocketAddr, u8);

#[derive(Debug)]
struct Open {
    start: u64,
    last: u64,
    bytes: u64,
}

impl FlowletAssembler {
    /// An assembler that ends a flowlet after `idle_gap_us` without payload.
    pub fn new(idle_gap_us: u64) -> Self {
        FlowletAssembler {
            idle_gap_us,
            points: Vec::new(),
            open: HashMap::new(),
        }
    }

    /// Flowlets still open.
    pub fn open_flowlets(&self) -> usize {
        self.open.len()
    }

    /// Adds one packet seen at `point` (a switch or exporter name, `""` for
    /// none); a flowlet it closes is appended to `out`. Packets without payload
    /// (pure ACKs) are ignored.
    pub fn push(&mut self, p: &Packet<'_>, point: &str, out: &mut Vec<FlowRecord>) {
        if p.payload_len == 0 {
            return;
        }
        let bytes = p.payload_len as u64;
        let id = match self
            .points
            .iter()
            .position(|x| x.first().map_or(point.is_empty(), |n| n == point))
        {
            Some(i) => i,
            None => {
                self.points.push(if point.is_empty() {
                    SwitchPath::default()
                } else {
                    SwitchPath::one(point)
                });
                self.points.len() - 1
            }
        } as u32;
        let key = (id, p.src, p.dst, p.proto);
        match self.open.get_mut(&key) {
            Some(o) if p.ts_us.saturating_sub(o.last) <= self.idle_gap_us => {
                // A packet reported out of order keeps its bytes in the flowlet
                // but moves its start back only within the idle gap: one stale
                // timestamp must not stretch a flowlet over the compute before it.
                o.last = o.last.max(p.ts_us);
                if p.ts_us.saturating_add(self.idle_gap_us) >= o.start {
                    o.start = o.start.min(p.ts_us);
                }
                o.bytes += bytes;
            }
            Some(o) => {
                out.push(record(&self.points, &key, o));
                *o = Open {
                    start: p.ts_us,
                    last: p.ts_us,
                    bytes,
                };
            }
            None => {
                self.open.insert(
                    key,
                    Open {
                        start: p.ts_us,
                        last: p.ts_us,
                        bytes,
                    },
                );
            }
        }
    }

    /// Closes the flowlets whose last packet is more than the idle gap before
    /// `now_us` (a streaming collector calls this as time passes).
    pub fn expire(&mut self, now_us: u64, out: &mut Vec<FlowRecord>) {
        let gap = self.idle_gap_us;
        let points = &self.points;
        self.open.retain(|k, o| {
            if now_us.saturating_sub(o.last) > gap {
                out.push(record(points, k, o));
                false
            } else {
                true
            }
        });
    }

    /// Closes every open flowlet.
    pub fn finish(&mut self, out: &mut Vec<FlowRecord>) {
        let mut rest: Vec<FlowRecord> = self
            .open
            .iter()
            .map(|(k, o)| record(&self.points, k, o))
            .collect();
        rest.sort_by_key(|r| r.start_us);
        out.extend(rest);
        self.open.clear();
    }
}

fn record(points: &[SwitchPath], k: &FlowletKey, o: &Open) -> FlowRecord {
    FlowRecord {
        start_us: o.start,
        dur_us: o.last - o.start,
        src: k.1.ip(),
        dst: k.2.ip(),
        bytes: o.bytes,
        src_port: Some(k.1.port()),
        dst_port: Some(k.2.port()),
        proto: Some(k.3),
        switches: points[k.0 as usize].clone(),
    }
}

/// Decodes an Ethernet frame (possibly cut short, as in an IPFIX
/// dataLinkFrameSection) observed at `ts_us` into its transport packet.
pub fn ethernet_frame(f: &[u8], ts_us: u64) -> Option<Packet<'_>> {
    frame(Linktype::ETHERNET, f, ts_us)
}

/// Decodes an IP packet (possibly cut short, as in an IPFIX
/// ipHeaderPacketSection) observed at `ts_us` into its transport packet.
pub fn ip_packet(f: &[u8], ts_us: u64) -> Option<Packet<'_>> {
    frame(Linktype::RAW, f, ts_us)
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
