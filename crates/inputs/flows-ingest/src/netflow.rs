//! IPFIX (RFC 7011) and NetFlow v9 (RFC 3954) decoding with the `netflow_parser`
//! crate, an encoder for tests and benchmarks, and the UDP collector.
//!
//! * Templates are kept **per exporter** (`AutoScopedParser`: IPFIX by exporter address
//!   and observation domain, v9 by exporter address and source id).
//! * **Data before its template** is buffered (`netflow_parser`'s pending-flow cache,
//!   up to 256 template ids × 1024 sets per exporter) and decoded when the template
//!   arrives.
//! * Out-of-order records need nothing special: the analysis sorts by time.
//! * Every record is attributed to its exporter: `switches = ["<exporter ip>"]`, or
//!   `"<exporter ip>/<domain>"` when the observation domain / source id is not 0
//!   (map exporter names to switch names in the topology file).
//! * Times: flowStart/End{Seconds,Milliseconds,Microseconds,Nanoseconds} are absolute;
//!   flowStart/EndSysUpTime (IPFIX) are relative to the exporter's
//!   systemInitTimeMilliseconds (from an options record, when the exporter sends one;
//!   otherwise the flow is assumed to end at the message's export time), and v9
//!   FIRST/LAST_SWITCHED are relative to the header's sysUpTime/unix_secs.
//! * **Packet reports** (PSAMP, RFC 5476/5477: a dataLinkFrameSection or
//!   ipHeaderPacketSection with an observationTime*, as `softflowd -v psamp`
//!   exports every packet it sees) are decoded from the frame itself (addresses,
//!   ports, on-wire payload length) and assembled into **flowlets** per exporter
//!   and 5-tuple ([`crate::pcap::FlowletAssembler`]): message-level flows like the
//!   RoCE flows LLMPrism analyses (§II-B), which a flow exporter's idle timeout
//!   (≥ 1 s) cannot give for long-lived TCP connections such as gloo's.
//! * **Fast path**: data sets of templates already known are decoded straight from
//!   the bytes (module `fast`), with the same results as `netflow_parser`
//!   (tests/fast_decode.rs); everything else goes through `netflow_parser`.
//! * Bad input never panics and never stops the collector: a malformed message is
//!   counted as an error and skipped.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use netflow_parser::variable_versions::field_value::FieldValue;
use netflow_parser::variable_versions::ipfix::lookup::{IANAIPFixField, IPFixField};
use netflow_parser::variable_versions::ipfix::FlowSetBody as IpfixBody;
use netflow_parser::variable_versions::v9::lookup::V9Field;
use netflow_parser::variable_versions::v9::FlowSetBody as V9Body;
use netflow_parser::{AutoScopedParser, NetflowPacket, NetflowParser, PendingFlowsConfig};
use whyslow_model::flow::{FlowRecord, SwitchPath};

use crate::pcap::{FlowletAssembler, DEFAULT_IDLE_GAP_US};

mod fast;
use crate::FlowIngestError;

/// Receive buffer asked for by [`collect_udp`].
pub const RECV_BUFFER_BYTES: usize = 32 << 20;

/// How long after a flowlet's idle gap (by the collector's clock) it is handed over:
/// room for exporter clocks and export delays.
pub const FLOWLET_FLUSH_SLACK_US: u64 = 2_000_000;

/// Seconds between the NTP epoch (1900) and the Unix epoch.
const NTP_UNIX_OFFSET_S: u64 = 2_208_988_800;

/// Counters of a decoder or collector.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeStats {
    /// Datagrams / messages handed to the decoder.
    pub packets: u64,
    /// Flow records produced.
    pub records: u64,
    /// Messages (or parts) that failed to parse and were skipped.
    pub errors: u64,
    /// Data records skipped because they lacked addresses.
    pub skipped: u64,
    /// Packet reports (PSAMP) decoded into flowlets.
    pub packet_reports: u64,
    /// Packet reports skipped for want of an observation time: the message's
    /// export time (whole seconds, after the exporter's buffering) would put
    /// the packet up to a second away from where it was seen.
    pub untimed_packet_reports: u64,
}

/// Stateful IPFIX / NetFlow v9 decoder (templates per exporter).
pub struct FlowDecoder {
    parser: AutoScopedParser,
    init_ms: HashMap<(IpAddr, u32), u64>,
    /// Each exporter's (and observation domain's) path, shared by its records.
    names: HashMap<(IpAddr, u32), SwitchPath>,
    flowlets: FlowletAssembler,
    /// The fast path for data sets of known templates (see [`fast`]); `None`
    /// when turned off.
    fast: Option<fast::FastPath>,
    /// Counters so far.
    pub stats: DecodeStats,
}

impl Default for FlowDecoder {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Default)]
struct Rec {
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    sport: Option<u16>,
    dport: Option<u16>,
    proto: Option<u8>,
    bytes: u64,
    start_us: Option<u64>,
    end_us: Option<u64>,
    start_up_ms: Option<u64>,
    end_up_ms: Option<u64>,
    dur_us: Option<u64>,
    /// A packet report's observation time and frame (or IP packet) section.
    observed_us: Option<u64>,
    frame: Option<(bool, Vec<u8>)>,
}

fn ntp_us(v: &FieldValue) -> Option<u64> {
    match v {
        FieldValue::Duration(d) => {
            let d = d.as_duration();
            let s = d.as_secs().checked_sub(NTP_UNIX_OFFSET_S)?;
            Some(
                s.saturating_mul(1_000_000)
                    .saturating_add(d.subsec_micros() as u64),
            )
        }
        _ => None,
    }
}

fn ip(v: &FieldValue) -> Option<IpAddr> {
    match v {
        FieldValue::Ip4Addr(a) => Some(IpAddr::V4(*a)),
        FieldValue::Ip6Addr(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

impl FlowDecoder {
    /// A decoder with per-exporter template caches and pending-data buffering;
    /// packet reports become flowlets ended by [`DEFAULT_IDLE_GAP_US`] of idle.
    pub fn new() -> Self {
        Self::with_flowlet_gap(DEFAULT_IDLE_GAP_US)
    }

    /// Like [`FlowDecoder::new`], with the idle gap (µs) that ends a flowlet of
    /// packet reports.
    pub fn with_flowlet_gap(idle_gap_us: u64) -> Self {
        let builder = NetflowParser::builder().with_pending_flows(PendingFlowsConfig::default());
        let parser = AutoScopedParser::try_with_builder(builder).unwrap_or_default();
        FlowDecoder {
            parser,
            init_ms: HashMap::new(),
            names: HashMap::new(),
            flowlets: FlowletAssembler::new(idle_gap_us),
            fast: Some(fast::FastPath::default()),
            stats: DecodeStats::default(),
        }
    }

    /// Datagrams decoded by the fast path (data sets of known templates read
    /// without `netflow_parser`; see the `fast` module), out of `stats.packets`.
    pub fn fast_datagrams(&self) -> u64 {
        self.fast.as_ref().map_or(0, |f| f.datagrams)
    }

    /// A decoder that hands every datagram to `netflow_parser` (no fast path):
    /// the reference the fast path is tested against, and a way out should a
    /// capture ever decode differently.
    pub fn reference() -> Self {
        FlowDecoder {
            fast: None,
            ..Self::new()
        }
    }

    /// Closes the flowlets of packet reports idle since before `now_us` (µs since
    /// the epoch), appending them to `out`; returns how many.
    pub fn expire(&mut self, now_us: u64, out: &mut Vec<FlowRecord>) -> usize {
        let before = out.len();
        self.flowlets.expire(now_us, out);
        let n = out.len() - before;
        self.stats.records += n as u64;
        n
    }

    /// Closes every open flowlet (end of input), appending them to `out`.
    pub fn finish(&mut self, out: &mut Vec<FlowRecord>) -> usize {
        let before = out.len();
        self.flowlets.finish(out);
        let n = out.len() - before;
        self.stats.records += n as u64;
        n
    }

    fn name(&mut self, exporter: IpAddr, domain: u32) -> SwitchPath {
        self.names
            .entry((exporter, domain))
            .or_insert_with(|| {
                SwitchPath::one(if domain == 0 {
                    exporter.to_string()
                } else {
                    format!("{exporter}/{domain}")
                })
            })
            .clone()
    }

    /// Decode one datagram (or a buffer of concatenated messages) from `source`,
    /// appending flow records to `out`. Returns the number of records appended.
    pub fn decode(&mut self, source: SocketAddr, data: &[u8], out: &mut Vec<FlowRecord>) -> usize {
        self.stats.packets += 1;
        let before = out.len();
        let fast_done = match self.fast.take() {
            Some(mut f) => {
                let done = f.decode(self, source, data, out);
                f.datagrams += u64::from(done);
                self.fast = Some(f);
                done
            }
            None => false,
        };
        if !fast_done {
            self.decode_with_parser(source, data, out);
        }
        let n = out.len() - before;
        self.stats.records += n as u64;
        n
    }

    /// The general path: `netflow_parser` decodes the datagram (templates,
    /// options, packet reports, anything unusual); the fast path learns the
    /// templates it installed.
    fn decode_with_parser(&mut self, source: SocketAddr, data: &[u8], out: &mut Vec<FlowRecord>) {
        let result = self.parser.parse_from_source(source, data);
        if result.error.is_some() {
            self.stats.errors += 1;
        }
        if let Some(f) = &mut self.fast {
            f.learn(source, data, &result);
        }
        let exporter = source.ip();
        for packet in result.packets {
            match packet {
                NetflowPacket::IPFix(p) => self.decode_ipfix(exporter, &p, out),
                NetflowPacket::V9(p) => self.decode_v9(exporter, &p, out),
                _ => {}
            }
        }
    }

    /// An IPFIX message: exporters' start times from options data, flow
    /// records and packet reports from data sets.
    fn decode_ipfix(
        &mut self,
        exporter: IpAddr,
        p: &netflow_parser::variable_versions::ipfix::IPFix,
        out: &mut Vec<FlowRecord>,
    ) {
        let domain = p.header.observation_domain_id;
        let export_ms = p.header.export_time as u64 * 1000;
        let name = self.name(exporter, domain);
        for fs in &p.flowsets {
            match &fs.body {
                IpfixBody::OptionsData(od) => {
                    for rec in &od.fields {
                        for (f, v) in rec {
                            if matches!(
                                f,
                                IPFixField::IANA(IANAIPFixField::SystemInitTimeMilliseconds)
                            ) {
                                if let Some(ms) = v.as_u64() {
                                    self.init_ms.insert((exporter, domain), ms);
                                }
                            }
                        }
                    }
                }
                IpfixBody::Data(d) => {
                    for rec in &d.fields {
                        let mut r = Rec::default();
                        for (f, v) in rec {
                            if let IPFixField::IANA(f) = f {
                                ipfix_field(&mut r, f, v);
                            }
                        }
                        if r.frame.is_some() {
                            self.packet_report(&r, &name, out);
                            continue;
                        }
                        self.push_ipfix(r, exporter, domain, export_ms, &name, out);
                    }
                }
                _ => {}
            }
        }
    }

    /// A NetFlow v9 message's flow records (times from the exporter's
    /// uptime).
    fn decode_v9(
        &mut self,
        exporter: IpAddr,
        p: &netflow_parser::variable_versions::v9::V9,
        out: &mut Vec<FlowRecord>,
    ) {
        let domain = p.header.source_id;
        let now_ms = p.header.unix_secs as u64 * 1000;
        let base = now_ms.saturating_sub(p.header.sys_up_time as u64);
        let name = self.name(exporter, domain);
        for fs in &p.flowsets {
            if let V9Body::Data(d) = &fs.body {
                for rec in &d.fields {
                    let mut r = Rec::default();
                    for (f, v) in rec {
                        v9_field(&mut r, f, v, base);
                    }
                    self.push(r, now_ms * 1000, &name, out);
                }
            }
        }
    }

    /// A packet report (a sampled frame or IP header with its observation
    /// time), cut into flowlets.
    fn packet_report(&mut self, r: &Rec, name: &[String], out: &mut Vec<FlowRecord>) {
        let Some((ethernet, bytes)) = &r.frame else {
            return;
        };
        let Some(ts) = r.observed_us else {
            self.stats.untimed_packet_reports += 1;
            return;
        };
        let p = if *ethernet {
            crate::pcap::ethernet_frame(bytes, ts)
        } else {
            crate::pcap::ip_packet(bytes, ts)
        };
        match p {
            Some(p) => {
                self.stats.packet_reports += 1;
                self.flowlets
                    .push(&p, name.first().map_or("", String::as_str), out);
            }
            None => self.stats.skipped += 1,
        }
    }

    /// An IPFIX flow record: system-uptime times made absolute, then [`Self::push`].
    fn push_ipfix(
        &mut self,
        mut r: Rec,
        exporter: IpAddr,
        domain: u32,
        export_ms: u64,
        name: &SwitchPath,
        out: &mut Vec<FlowRecord>,
    ) {
        if r.start_us.is_none() {
            if let Some(s) = r.start_up_ms {
                let base = match self.init_ms.get(&(exporter, domain)) {
                    Some(&b) => b,
                    None => export_ms.saturating_sub(r.end_up_ms.unwrap_or(s)),
                };
                r.start_us = Some(base.saturating_add(s).saturating_mul(1000));
                r.end_us = r
                    .end_up_ms
                    .map(|e| base.saturating_add(e).saturating_mul(1000));
            }
        }
        self.push(r, export_ms * 1000, name, out);
    }

    fn push(&mut self, r: Rec, fallback_us: u64, name: &SwitchPath, out: &mut Vec<FlowRecord>) {
        let (Some(src), Some(dst)) = (r.src, r.dst) else {
            self.stats.skipped += 1;
            return;
        };
        let start = r.start_us.unwrap_or(fallback_us);
        let dur = match (r.dur_us, r.end_us) {
            (Some(d), _) => d,
            (None, Some(e)) => e.saturating_sub(start),
            (None, None) => 0,
        };
        out.push(FlowRecord {
            start_us: start,
            dur_us: dur,
            src,
            dst,
            bytes: r.bytes,
            src_port: r.sport,
            dst_port: r.dport,
            proto: r.proto,
            switches: name.clone(),
        });
    }
}

/// Receive IPFIX / NetFlow v9 datagrams on `listen` until `stop` is set (checked at
/// least every 200 ms), handing every decoded record to `sink`. Malformed datagrams
/// are counted and skipped; only failing to bind the socket is an error. Flowlets of
/// packet reports end after `flowlet_gap_us` of idle; they are handed over
/// [`FLOWLET_FLUSH_SLACK_US`] after that (by this machine's clock) and at the end.
pub fn collect_udp(
    listen: SocketAddr,
    stop: &AtomicBool,
    flowlet_gap_us: u64,
    mut sink: impl FnMut(FlowRecord),
) -> Result<DecodeStats, FlowIngestError> {
    let sock = UdpSocket::bind(listen).map_err(|e| FlowIngestError::Io {
        path: listen.to_string(),
        source: e,
    })?;
    // Packet reports come one datagram per packet: a default-sized buffer drops
    // bursts (best effort: the kernel caps it at net.core.rmem_max).
    let _ = socket2::SockRef::from(&sock).set_recv_buffer_size(RECV_BUFFER_BYTES);
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .map_err(|e| FlowIngestError::Io {
            path: listen.to_string(),
            source: e,
        })?;
    let mut dec = FlowDecoder::with_flowlet_gap(flowlet_gap_us);
    let mut buf = vec![0u8; 65_536];
    let mut out = Vec::new();
    let mut expired_at = std::time::Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if expired_at.elapsed() >= Duration::from_millis(200) {
            expired_at = std::time::Instant::now();
            let now_us = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64);
            dec.expire(now_us.saturating_sub(FLOWLET_FLUSH_SLACK_US), &mut out);
            for r in out.drain(..) {
                sink(r);
            }
        }
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => {
                out.clear();
                dec.decode(from, &buf[..n], &mut out);
                for r in out.drain(..) {
                    sink(r);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => {
                // Transient socket errors (e.g. ICMP port unreachable on some systems).
                dec.stats.errors += 1;
            }
        }
    }
    out.clear();
    dec.finish(&mut out);
    for r in out.drain(..) {
        sink(r);
    }
    Ok(dec.stats)
}

/// IPFIX message encoder (template + data sets) used by tests, benchmarks and the
/// fuzz corpus; also handy to write IPFIX files from other sources.
pub mod encode {
    use std::net::IpAddr;

    use whyslow_model::flow::FlowRecord;

    /// Template id used for IPv4 records.
    pub const TEMPLATE_V4: u16 = 256;

    /// (IE number, length) of the IPv4 template: sourceIPv4Address,
    /// destinationIPv4Address, sourceTransportPort, destinationTransportPort,
    /// protocolIdentifier, octetDeltaCount, flowStartMicroseconds, flowEndMicroseconds.
    pub const FIELDS_V4: [(u16, u16); 8] = [
        (8, 4),
        (12, 4),
        (7, 2),
        (11, 2),
        (4, 1),
        (1, 8),
        (154, 8),
        (155, 8),
    ];

    fn header(buf: &mut Vec<u8>, export_time: u32, seq: u32, domain: u32) {
        buf.extend_from_slice(&10u16.to_be_bytes());
        buf.extend_from_slice(&0u16.to_be_bytes()); // length, patched
        buf.extend_from_slice(&export_time.to_be_bytes());
        buf.extend_from_slice(&seq.to_be_bytes());
        buf.extend_from_slice(&domain.to_be_bytes());
    }

    fn finish(buf: &mut [u8]) {
        let len = buf.len() as u16;
        buf[2..4].copy_from_slice(&len.to_be_bytes());
    }

    /// One IPFIX message holding only the IPv4 template set.
    pub fn template_message(export_time: u32, domain: u32) -> Vec<u8> {
        let mut b = Vec::new();
        header(&mut b, export_time, 0, domain);
        let set_len = 4 + 4 + 4 * FIELDS_V4.len();
        b.extend_from_slice(&2u16.to_be_bytes());
        b.extend_from_slice(&(set_len as u16).to_be_bytes());
        b.extend_from_slice(&TEMPLATE_V4.to_be_bytes());
        b.extend_from_slice(&(FIELDS_V4.len() as u16).to_be_bytes());
        for (id, len) in FIELDS_V4 {
            b.extend_from_slice(&id.to_be_bytes());
            b.extend_from_slice(&len.to_be_bytes());
        }
        finish(&mut b);
        b
    }

    /// `us` (µs since the Unix epoch) as an IPFIX dateTimeMicroseconds (NTP format).
    pub fn ntp(us: u64) -> [u8; 8] {
        let s = us / 1_000_000 + 2_208_988_800;
        // Round up so that decoding (which truncates) gives back the microsecond.
        let frac = ((us % 1_000_000) << 32).div_ceil(1_000_000);
        let mut o = [0u8; 8];
        o[..4].copy_from_slice(&(s as u32).to_be_bytes());
        o[4..].copy_from_slice(&(frac as u32).to_be_bytes());
        o
    }

    /// IPFIX data messages for `records` (IPv4 only; others are skipped), at most
    /// `per_message` records each.
    pub fn data_messages(
        records: &[FlowRecord],
        per_message: usize,
        export_time: u32,
        domain: u32,
    ) -> Vec<Vec<u8>> {
        let mut msgs = Vec::new();
        let v4: Vec<&FlowRecord> = records
            .iter()
            .filter(|r| matches!((r.src, r.dst), (IpAddr::V4(_), IpAddr::V4(_))))
            .collect();
        for (k, chunk) in v4.chunks(per_message.max(1)).enumerate() {
            let mut b = Vec::with_capacity(20 + chunk.len() * 37);
            header(&mut b, export_time, (k * per_message) as u32, domain);
            let set_len = 4 + chunk.len() * 37;
            b.extend_from_slice(&TEMPLATE_V4.to_be_bytes());
            b.extend_from_slice(&(set_len as u16).to_be_bytes());
            for r in chunk {
                if let (IpAddr::V4(s), IpAddr::V4(d)) = (r.src, r.dst) {
                    b.extend_from_slice(&s.octets());
                    b.extend_from_slice(&d.octets());
                }
                b.extend_from_slice(&r.src_port.unwrap_or(0).to_be_bytes());
                b.extend_from_slice(&r.dst_port.unwrap_or(0).to_be_bytes());
                b.push(r.proto.unwrap_or(0));
                b.extend_from_slice(&r.bytes.to_be_bytes());
                b.extend_from_slice(&ntp(r.start_us));
                b.extend_from_slice(&ntp(r.end_us()));
            }
            finish(&mut b);
            msgs.push(b);
        }
        msgs
    }

    /// A NetFlow v9 packet with a template flowset (id 256) and one data flowset for
    /// `records` (IPv4; times in ms relative to `sys_up_ms` at `unix_secs`).
    pub fn v9_packet(
        records: &[FlowRecord],
        unix_secs: u32,
        sys_up_ms: u32,
        source_id: u32,
        with_template: bool,
    ) -> Vec<u8> {
        const F: [(u16, u16); 8] = [
            (8, 4),
            (12, 4),
            (7, 2),
            (11, 2),
            (4, 1),
            (1, 4),
            (22, 4),
            (21, 4),
        ];
        let base_ms = (unix_secs as u64 * 1000).saturating_sub(sys_up_ms as u64);
        let mut b = Vec::new();
        let count = records.len() as u16 + u16::from(with_template);
        b.extend_from_slice(&9u16.to_be_bytes());
        b.extend_from_slice(&count.to_be_bytes());
        b.extend_from_slice(&sys_up_ms.to_be_bytes());
        b.extend_from_slice(&unix_secs.to_be_bytes());
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&source_id.to_be_bytes());
        if with_template {
            b.extend_from_slice(&0u16.to_be_bytes());
            b.extend_from_slice(&((4 + 4 + 4 * F.len()) as u16).to_be_bytes());
            b.extend_from_slice(&256u16.to_be_bytes());
            b.extend_from_slice(&(F.len() as u16).to_be_bytes());
            for (id, len) in F {
                b.extend_from_slice(&id.to_be_bytes());
                b.extend_from_slice(&len.to_be_bytes());
            }
        }
        if !records.is_empty() {
            let rec_len = 25;
            let body = records.len() * rec_len;
            let pad = (4 - (4 + body) % 4) % 4;
            b.extend_from_slice(&256u16.to_be_bytes());
            b.extend_from_slice(&((4 + body + pad) as u16).to_be_bytes());
            for r in records {
                let (IpAddr::V4(s), IpAddr::V4(d)) = (r.src, r.dst) else {
                    continue;
                };
                b.extend_from_slice(&s.octets());
                b.extend_from_slice(&d.octets());
                b.extend_from_slice(&r.src_port.unwrap_or(0).to_be_bytes());
                b.extend_from_slice(&r.dst_port.unwrap_or(0).to_be_bytes());
                b.push(r.proto.unwrap_or(0));
                b.extend_from_slice(&(r.bytes.min(u32::MAX as u64) as u32).to_be_bytes());
                let rel = |us: u64| ((us / 1000).saturating_sub(base_ms)) as u32;
                b.extend_from_slice(&rel(r.start_us).to_be_bytes());
                b.extend_from_slice(&rel(r.end_us()).to_be_bytes());
            }
            b.extend(std::iter::repeat_n(0u8, pad));
        }
        b
    }
}

/// One IPFIX field of a data record into `r`.
fn ipfix_field(r: &mut Rec, f: &IANAIPFixField, v: &FieldValue) {
    use IANAIPFixField as F;
    match f {
        F::SourceIpv4address | F::SourceIpv6address => r.src = ip(v),
        F::DestinationIpv4address | F::DestinationIpv6address => r.dst = ip(v),
        F::SourceTransportPort => r.sport = v.as_u16(),
        F::DestinationTransportPort => r.dport = v.as_u16(),
        F::ProtocolIdentifier => r.proto = v.as_u8(),
        F::OctetDeltaCount | F::OctetTotalCount => r.bytes = r.bytes.max(v.as_u64().unwrap_or(0)),
        F::FlowStartMicroseconds | F::FlowStartNanoseconds => r.start_us = ntp_us(v),
        F::FlowEndMicroseconds | F::FlowEndNanoseconds => r.end_us = ntp_us(v),
        F::FlowStartMilliseconds | F::FlowStartSeconds => {
            r.start_us = v.as_u64().map(|ms| ms.saturating_mul(1000))
        }
        F::FlowEndMilliseconds | F::FlowEndSeconds => {
            r.end_us = v.as_u64().map(|ms| ms.saturating_mul(1000))
        }
        F::FlowStartSysUpTime => r.start_up_ms = v.as_u64(),
        F::FlowEndSysUpTime => r.end_up_ms = v.as_u64(),
        F::FlowDurationMilliseconds => r.dur_us = v.as_u64().map(|x| x.saturating_mul(1000)),
        F::FlowDurationMicroseconds => r.dur_us = v.as_u64(),
        F::ObservationTimeMicroseconds | F::ObservationTimeNanoseconds => r.observed_us = ntp_us(v),
        F::ObservationTimeMilliseconds | F::ObservationTimeSeconds => {
            let scale = if matches!(f, F::ObservationTimeSeconds) {
                1_000_000
            } else {
                1000
            };
            r.observed_us = v.as_u64().map(|x| x.saturating_mul(scale))
        }
        F::DataLinkFrameSection | F::IpHeaderPacketSection => {
            if let FieldValue::Vec(b) = v {
                r.frame = Some((matches!(f, F::DataLinkFrameSection), b.clone()));
            }
        }
        _ => {}
    }
}

/// One NetFlow v9 field of a data record into `r` (`base`: the exporter's
/// boot time, ms since the epoch).
fn v9_field(r: &mut Rec, f: &V9Field, v: &FieldValue, base: u64) {
    match f {
        V9Field::Ipv4SrcAddr | V9Field::Ipv6SrcAddr => r.src = ip(v),
        V9Field::Ipv4DstAddr | V9Field::Ipv6DstAddr => r.dst = ip(v),
        V9Field::L4SrcPort => r.sport = v.as_u16(),
        V9Field::L4DstPort => r.dport = v.as_u16(),
        V9Field::Protocol => r.proto = v.as_u8(),
        V9Field::InBytes => r.bytes = r.bytes.max(v.as_u64().unwrap_or(0)),
        V9Field::FirstSwitched => {
            r.start_us = v
                .as_u64()
                .map(|ms| base.saturating_add(ms).saturating_mul(1000))
        }
        V9Field::LastSwitched => {
            r.end_us = v
                .as_u64()
                .map(|ms| base.saturating_add(ms).saturating_mul(1000))
        }
        _ => {}
    }
}
