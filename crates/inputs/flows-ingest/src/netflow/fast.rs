//! Fast path of [`FlowDecoder`]: IPFIX data sets whose template is already
//! known, decoded straight from the bytes into flow records, without
//! `netflow_parser`'s per-record list of field values (the cost that kept
//! decoding near 4 M records/s; LLMPrism §II-B: flow records are the whole
//! input, so they must be cheap to read at cluster scale).
//!
//! It never guesses. A datagram takes the fast path only when every one of its
//! messages is well formed (lengths consistent, sets tiling each message) and
//! every set is a data set whose template `netflow_parser` holds for the same
//! scope, and whose fields are all among a few fixed-length information
//! elements with a known meaning ([`kind`]). Everything else (templates,
//! options, packet reports, withdrawals, unknown or odd fields, anything
//! malformed) goes to `netflow_parser` as before, and the fast path learns
//! from what it installed:
//!
//! * scopes are `netflow_parser`'s (`AutoScopedParser`: exporter socket
//!   address and the observation domain of the datagram's first message);
//! * a template is learnt from the templates `netflow_parser` returned (it
//!   returns exactly the ones it installed, in order), and forgotten when an
//!   options or v9-style template takes its id;
//! * a withdrawal, a template set it cannot walk, or a parse error forgets
//!   every template of the scope (they come back with the next template
//!   refresh), as do more than [`MAX_TEMPLATE_IDS`] template ids in a scope or
//!   [`MAX_SCOPES`] scopes (below `netflow_parser`'s LRU capacities, so its
//!   caches never evict what the fast path relies on).
//!
//! Per record it does what `netflow_parser` and the general path do: at most
//! 1024 records per set (its `max_records_per_flowset`), trailing bytes
//! shorter than a record ignored, the same time conversions.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use netflow_parser::protocol::ProtocolTypes;
use netflow_parser::variable_versions::ipfix::FlowSetBody as IpfixBody;
use netflow_parser::variable_versions::ipfix::Template;
use netflow_parser::{NetflowPacket, ParseResult};
use whyslow_model::flow::FlowRecord;

use super::{FlowDecoder, Rec, NTP_UNIX_OFFSET_S};

/// Records `netflow_parser` decodes per set at most (its default
/// `max_records_per_flowset`); the rest of a longer set is dropped there too.
const MAX_RECORDS_PER_SET: usize = 1024;

/// Template ids seen in one scope after which the fast path gives up on it
/// (`netflow_parser` keeps 1000 per kind before evicting).
pub(super) const MAX_TEMPLATE_IDS: usize = 256;

/// Scopes after which the fast path turns itself off (`netflow_parser` keeps
/// 10 000 sources before evicting).
pub(super) const MAX_SCOPES: usize = 4096;

/// What a template field means to the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Src4,
    Dst4,
    Src6,
    Dst6,
    SrcPort,
    DstPort,
    Proto,
    /// octetDeltaCount / octetTotalCount (the larger wins).
    Bytes,
    StartNtpMicros,
    EndNtpMicros,
    StartNtpNanos,
    EndNtpNanos,
    StartMillis,
    EndMillis,
    StartSeconds,
    EndSeconds,
    StartUpMillis,
    EndUpMillis,
    DurMillis,
    DurMicros,
    /// A field the records do not use.
    Skip,
}

/// The meaning of IANA element `id` with length `len`, when the fast path
/// decodes it exactly as `netflow_parser` + the general path do.
fn kind(id: u16, len: u16) -> Option<Kind> {
    use Kind::*;
    Some(match (id, len) {
        (8, 4) => Src4,
        (12, 4) => Dst4,
        (27, 16) => Src6,
        (28, 16) => Dst6,
        (7, 2) => SrcPort,
        (11, 2) => DstPort,
        (4, 1) => Proto,
        (1 | 85, 1 | 2 | 4 | 8) => Bytes,
        (154, 8) => StartNtpMicros,
        (155, 8) => EndNtpMicros,
        (156, 8) => StartNtpNanos,
        (157, 8) => EndNtpNanos,
        (152, 4 | 8) => StartMillis,
        (153, 4 | 8) => EndMillis,
        (150, 4 | 8) => StartSeconds,
        (151, 4 | 8) => EndSeconds,
        (22, 4) => StartUpMillis,
        (21, 4) => EndUpMillis,
        (161, 4) => DurMillis,
        (162, 4) => DurMicros,
        // packet counts, interfaces, ToS, IP version, VLAN: unsigned numbers.
        (2 | 86 | 10 | 14, 1 | 2 | 4 | 8) | (5 | 60, 1) | (58, 2) => Skip,
        _ => return None,
    })
}

/// Field layout of a template the fast path decodes.
#[derive(Debug)]
struct Layout {
    /// Record length, bytes (> 0).
    len: usize,
    /// (offset in the record, length, meaning), in template order.
    fields: Vec<(usize, usize, Kind)>,
}

impl Layout {
    fn of(t: &Template) -> Option<Layout> {
        if t.fields.is_empty() || usize::from(t.field_count) != t.fields.len() {
            return None;
        }
        let mut fields = Vec::with_capacity(t.fields.len());
        let mut off = 0;
        for f in &t.fields {
            if f.enterprise_number.is_some() {
                return None;
            }
            let k = kind(f.field_type_number, f.field_length)?;
            let len = usize::from(f.field_length);
            if k != Kind::Skip {
                fields.push((off, len, k));
            }
            off += len;
        }
        Some(Layout { len: off, fields })
    }
}

/// Templates of one scope.
#[derive(Debug, Default)]
struct Scope {
    layouts: HashMap<u16, Arc<Layout>>,
    ids_seen: HashSet<u16>,
    disabled: bool,
}

/// State of the fast path (held by [`FlowDecoder`]).
#[derive(Debug, Default)]
pub(super) struct FastPath {
    scopes: HashMap<(SocketAddr, u32), Scope>,
    /// Every scope key handed to `netflow_parser`: (version, source, domain).
    seen: HashSet<(u16, SocketAddr, u32)>,
    off: bool,
    /// Datagrams decoded here.
    pub(super) datagrams: u64,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn uint(b: &[u8]) -> u64 {
    b.iter().fold(0u64, |a, &x| (a << 8) | u64::from(x))
}

/// `DurationValue::MicrosNtp` / `NanosNtp` → µs since the Unix epoch, as
/// the general path's `ntp_us` computes it.
fn ntp(b: &[u8], nanos: bool) -> Option<u64> {
    let secs = u64::from(be32(b, 0));
    let frac = u64::from(be32(b, 4));
    let sub_us = if nanos {
        ((frac * 1_000_000_000) >> 32) / 1000
    } else {
        (frac * 1_000_000) >> 32
    };
    let s = secs.checked_sub(NTP_UNIX_OFFSET_S)?;
    Some(s.saturating_mul(1_000_000).saturating_add(sub_us))
}

impl FastPath {
    /// Decodes `data` when every part of it qualifies (module docs); returns
    /// false, having done nothing, otherwise.
    pub(super) fn decode(
        &self,
        dec: &mut FlowDecoder,
        source: SocketAddr,
        data: &[u8],
        out: &mut Vec<FlowRecord>,
    ) -> bool {
        if self.off || data.len() < 16 || be16(data, 0) != 10 {
            return false;
        }
        let Some(scope) = self.scopes.get(&(source, be32(data, 12))) else {
            return false;
        };
        if scope.disabled || scope.layouts.is_empty() || !Self::qualifies(scope, data) {
            return false;
        }
        let exporter = source.ip();
        let mut off = 0;
        while off < data.len() {
            let end = off + usize::from(be16(data, off + 2));
            let export_ms = u64::from(be32(data, off + 4)) * 1000;
            let domain = be32(data, off + 12);
            let name = dec.name(exporter, domain);
            let mut s = off + 16;
            while s < end {
                let set_end = s + usize::from(be16(data, s + 2));
                let layout = &scope.layouts[&be16(data, s)];
                let body = &data[s + 4..set_end];
                let n = (body.len() / layout.len).min(MAX_RECORDS_PER_SET);
                for rec in body.chunks_exact(layout.len).take(n) {
                    let r = Self::record(layout, rec);
                    dec.push_ipfix(r, exporter, domain, export_ms, &name, out);
                }
                s = set_end;
            }
            off = end;
        }
        true
    }

    /// Every message well formed and every set a data set of a known layout.
    fn qualifies(scope: &Scope, data: &[u8]) -> bool {
        let mut off = 0;
        while off < data.len() {
            if data.len() - off < 16 || be16(data, off) != 10 {
                return false;
            }
            let len = usize::from(be16(data, off + 2));
            if len < 16 || len > data.len() - off {
                return false;
            }
            let end = off + len;
            let mut s = off + 16;
            while s < end {
                if end - s < 4 {
                    return false;
                }
                let slen = usize::from(be16(data, s + 2));
                if slen < 4 || slen > end - s || !scope.layouts.contains_key(&be16(data, s)) {
                    return false;
                }
                s += slen;
            }
            off = end;
        }
        true
    }

    fn record(layout: &Layout, rec: &[u8]) -> Rec {
        let mut r = Rec::default();
        for &(at, len, k) in &layout.fields {
            let b = &rec[at..at + len];
            match k {
                Kind::Src4 => r.src = Some(IpAddr::V4(Ipv4Addr::from(be32(b, 0)))),
                Kind::Dst4 => r.dst = Some(IpAddr::V4(Ipv4Addr::from(be32(b, 0)))),
                Kind::Src6 => r.src = Some(IpAddr::V6(Ipv6Addr::from(uint128(b)))),
                Kind::Dst6 => r.dst = Some(IpAddr::V6(Ipv6Addr::from(uint128(b)))),
                Kind::SrcPort => r.sport = Some(be16(b, 0)),
                Kind::DstPort => r.dport = Some(be16(b, 0)),
                Kind::Proto => r.proto = Some(u8::from(ProtocolTypes::from(b[0]))),
                Kind::Bytes => r.bytes = r.bytes.max(uint(b)),
                Kind::StartNtpMicros => r.start_us = ntp(b, false),
                Kind::EndNtpMicros => r.end_us = ntp(b, false),
                Kind::StartNtpNanos => r.start_us = ntp(b, true),
                Kind::EndNtpNanos => r.end_us = ntp(b, true),
                Kind::StartMillis => r.start_us = Some(uint(b).saturating_mul(1000)),
                Kind::EndMillis => r.end_us = Some(uint(b).saturating_mul(1000)),
                Kind::StartSeconds => {
                    r.start_us = uint(b).checked_mul(1000).map(|ms| ms.saturating_mul(1000))
                }
                Kind::EndSeconds => {
                    r.end_us = uint(b).checked_mul(1000).map(|ms| ms.saturating_mul(1000))
                }
                Kind::StartUpMillis => r.start_up_ms = Some(uint(b)),
                Kind::EndUpMillis => r.end_up_ms = Some(uint(b)),
                Kind::DurMillis => r.dur_us = Some(uint(b).saturating_mul(1000)),
                Kind::DurMicros => r.dur_us = Some(uint(b)),
                Kind::Skip => {}
            }
        }
        r
    }

    /// Learns from a datagram `netflow_parser` decoded (module docs).
    pub(super) fn learn(&mut self, source: SocketAddr, data: &[u8], result: &ParseResult) {
        if self.off || data.len() < 2 {
            return;
        }
        let version = be16(data, 0);
        let id = if data.len() >= 20 && version == 9 {
            be32(data, 16)
        } else if data.len() >= 16 && version == 10 {
            be32(data, 12)
        } else {
            0
        };
        self.seen.insert((version, source, id));
        if self.seen.len() >= MAX_SCOPES {
            self.off = true;
            self.scopes.clear();
            return;
        }
        if version != 10 || data.len() < 16 {
            return;
        }
        let scope = self.scopes.entry((source, id)).or_default();
        if scope.disabled {
            return;
        }
        let unsure = !scan_template_sets(data, &mut scope.ids_seen);
        if scope.ids_seen.len() > MAX_TEMPLATE_IDS {
            scope.disabled = true;
            scope.layouts.clear();
            return;
        }
        if unsure || result.error.is_some() {
            scope.layouts.clear();
            return;
        }
        for p in &result.packets {
            let NetflowPacket::IPFix(p) = p else { continue };
            for fs in &p.flowsets {
                match &fs.body {
                    IpfixBody::Template(t) => scope.set(t),
                    IpfixBody::Templates(ts) => ts.iter().for_each(|t| scope.set(t)),
                    IpfixBody::OptionsTemplate(t) => scope.forget(t.template_id),
                    IpfixBody::OptionsTemplates(ts) => {
                        ts.iter().for_each(|t| scope.forget(t.template_id))
                    }
                    IpfixBody::V9Template(t) => scope.forget(t.template_id),
                    IpfixBody::V9Templates(ts) => {
                        ts.iter().for_each(|t| scope.forget(t.template_id))
                    }
                    IpfixBody::V9OptionsTemplate(t) => scope.forget(t.template_id),
                    IpfixBody::V9OptionsTemplates(ts) => {
                        ts.iter().for_each(|t| scope.forget(t.template_id))
                    }
                    _ => {}
                }
            }
        }
    }
}

fn uint128(b: &[u8]) -> u128 {
    b.iter().fold(0u128, |a, &x| (a << 8) | u128::from(x))
}

impl Scope {
    fn set(&mut self, t: &Template) {
        match Layout::of(t) {
            Some(l) => {
                self.layouts.insert(t.template_id, Arc::new(l));
            }
            None => self.forget(t.template_id),
        }
    }

    fn forget(&mut self, id: u16) {
        self.layouts.remove(&id);
    }
}

/// Walks the template sets of `data` (every message), adding the template ids
/// they define to `ids`. False when a template set holds a withdrawal, cannot
/// be walked, or the datagram has sets of other reserved ids (v9-style
/// templates inside IPFIX): then nothing learnt from it can be trusted.
fn scan_template_sets(data: &[u8], ids: &mut HashSet<u16>) -> bool {
    let mut off = 0;
    while data.len() - off >= 16 {
        let len = usize::from(be16(data, off + 2));
        if be16(data, off) != 10 || len < 16 || len > data.len() - off {
            // netflow_parser stops here too; what follows was not installed.
            return true;
        }
        let end = off + len;
        let mut s = off + 16;
        while end - s >= 4 {
            let set_id = be16(data, s);
            let slen = usize::from(be16(data, s + 2));
            if slen < 4 || slen > end - s {
                break;
            }
            let body = &data[s + 4..s + slen];
            match set_id {
                2 | 3 if !walk_templates(body, set_id == 3, ids) => return false,
                0 | 1 | 4..=255 => return false,
                _ => {}
            }
            s += slen;
        }
        off = end;
    }
    true
}

/// Walks the records of one (options) template set; false on a withdrawal or
/// a record that does not fit.
fn walk_templates(mut b: &[u8], options: bool, ids: &mut HashSet<u16>) -> bool {
    // Records are at least 4 bytes; shorter trailing bytes are padding.
    while b.len() >= 4 {
        let id = be16(b, 0);
        let count = usize::from(be16(b, 2));
        if count == 0 {
            return false;
        }
        ids.insert(id);
        let mut at = if options { 6 } else { 4 };
        for _ in 0..count {
            if b.len() < at + 4 {
                return false;
            }
            let enterprise = be16(b, at) & 0x8000 != 0;
            at += if enterprise { 8 } else { 4 };
        }
        if b.len() < at {
            return false;
        }
        b = &b[at..];
    }
    true
}
