//! Flow inputs for whyslow's black-box diagnosis (`whyslow-flows`): CSV / Parquet flow
//! records, captured IPFIX / NetFlow v9 (raw message files or pcap captures of the
//! export traffic), a UDP collector, pcap flowlets, and the topology file.
//!
//! # File formats
//!
//! **CSV** (`.csv`, `.csv.gz`): a header line, then one flow per line. Required
//! columns `start_us,src,dst,bytes,dur_us` (start in µs since any common epoch,
//! addresses IPv4/IPv6, bytes, duration in µs). The time columns' suffix names
//! their unit: `start_ns`/`dur_ns`, `start_ms`/`dur_ms` or `start_s`/`dur_s`
//! instead of `_us` (each pair on its own). Times and bytes may be integers or
//! decimals (`25267.33`, `1.5e3`; rounded to the nearest µs / byte), never
//! negative. Optional `switches` (the switch path,
//! `;`-separated, e.g. `leaf1;spine;leaf2`), `src_port`, `dst_port`, `proto` (IP
//! protocol number). Column order is free; unknown columns are ignored; empty optional
//! cells are allowed. A malformed row is an error naming its line.
//!
//! **Parquet** (`.parquet`, cargo feature `parquet`, off by default): the same column
//! names; integer columns may be any integer type, addresses and switches strings.
//!
//! **IPFIX / NetFlow v9 captures**: a file of concatenated IPFIX messages or v9
//! packets as received by a collector (`.ipfix`, `.nf`, `.v9`, `.bin`, or sniffed
//! from the first bytes), or a classic pcap or pcapng (`.pcap`, `.pcapng`) of the export traffic (UDP
//! datagrams starting with version 9 or 10). See [`netflow`] for the decoding rules.
//!
//! **pcap of training traffic** (flowlet mode, [`pcap::read_pcap_flowlets`]): when no
//! flow exporter is available, or the transport keeps one long-lived connection per
//! peer (gloo's TCP, NCCL's socket transport), a flow exporter reports one endless
//! flow per connection (split only by its active timeout), which hides the message
//! structure LLMPrism needs. Flowlet mode rebuilds messages from packets: a flowlet
//! is a run of payload-carrying packets of one 5-tuple without an idle gap longer than
//! `idle_gap_us`. Use exporter flows (IPFIX/NetFlow/CSV) for RDMA/RoCE traffic where
//! every message is its own flow (the paper's setting); use flowlets for TCP-based
//! transports when packets can be captured.
//!
//! **Topology** (`.json`): see [`whyslow_model::topology`].
//!
//! Every reader is total: bad input yields an error or skipped records, never a panic.
#![deny(missing_docs)]

pub mod netflow;
#[cfg(feature = "parquet")]
mod parquet_in;
pub mod pcap;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

pub use netflow::{collect_udp, DecodeStats, FlowDecoder};
use whyslow_model::flow::FlowRecord;
use whyslow_model::topology::Topology;

/// Error of the flow readers. Display is one line:
/// `<path>: <where>: <what was expected>`.
#[derive(Debug, thiserror::Error)]
pub enum FlowIngestError {
    /// The file or socket could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File path or socket address.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A CSV problem.
    #[error("{path}: line {line}: {msg}")]
    Csv {
        /// File path.
        path: String,
        /// 1-based line number (the header is line 1).
        line: u64,
        /// What was expected.
        msg: String,
    },
    /// Any other format problem.
    #[error("{path}: {msg}")]
    Format {
        /// File path.
        path: String,
        /// What was expected.
        msg: String,
    },
    /// A bad topology file.
    #[error("{path}: {source}")]
    Topology {
        /// File path.
        path: String,
        /// Cause.
        source: whyslow_model::topology::TopologyError,
    },
}

fn io_err(path: &Path, e: std::io::Error) -> FlowIngestError {
    FlowIngestError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

/// Read a topology file (JSON, see [`whyslow_model::topology`]).
pub fn read_topology(path: &Path) -> Result<Topology, FlowIngestError> {
    let s = std::fs::read_to_string(path).map_err(|e| io_err(path, e))?;
    Topology::from_json_str(&s).map_err(|e| FlowIngestError::Topology {
        path: path.display().to_string(),
        source: e,
    })
}

/// Kind of a flow file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowFileKind {
    /// CSV flow records.
    Csv,
    /// Parquet flow records.
    Parquet,
    /// Concatenated IPFIX messages / NetFlow v9 packets.
    NetflowRaw,
    /// Classic pcap or pcapng (export traffic or, failing that, training traffic as flowlets).
    Pcap,
}

/// Guess the kind from the name (after stripping `.gz`) and the first bytes.
pub fn sniff_kind(name: &str, head: &[u8]) -> Option<FlowFileKind> {
    let lower = name.to_ascii_lowercase();
    let base = lower.strip_suffix(".gz").unwrap_or(&lower);
    if base.ends_with(".csv") {
        return Some(FlowFileKind::Csv);
    }
    if base.ends_with(".parquet") || head.starts_with(b"PAR1") {
        return Some(FlowFileKind::Parquet);
    }
    if base.ends_with(".pcap")
        || base.ends_with(".pcapng")
        || pcap::is_pcap(head)
        || pcap::is_pcapng(head)
    {
        return Some(FlowFileKind::Pcap);
    }
    if [".ipfix", ".nf", ".v9", ".netflow", ".bin"]
        .iter()
        .any(|e| base.ends_with(e))
        || head.starts_with(&[0, 10])
        || head.starts_with(&[0, 9])
    {
        return Some(FlowFileKind::NetflowRaw);
    }
    if head.starts_with(b"start_us") || head.iter().take(200).any(|&b| b == b',') {
        return Some(FlowFileKind::Csv);
    }
    None
}

/// Read flow records from a CSV, Parquet, IPFIX/NetFlow capture or pcap file
/// (optionally gzip-compressed, `.gz`). Corrupt IPFIX/NetFlow messages are skipped
/// (see [`read_netflow_bytes`] for counts); a malformed CSV row is an error.
pub fn read_flow_file(path: &Path) -> Result<Vec<FlowRecord>, FlowIngestError> {
    let raw = std::fs::read(path).map_err(|e| io_err(path, e))?;
    read_flow_bytes(path, raw)
}

/// [`read_flow_file`] on bytes already read: the format from `path`'s name
/// and the bytes themselves, errors naming `path`.
pub fn read_flow_bytes(path: &Path, raw: Vec<u8>) -> Result<Vec<FlowRecord>, FlowIngestError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let data = if name.to_ascii_lowercase().ends_with(".gz") || raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::MultiGzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|e| io_err(path, e))?;
        out
    } else {
        raw
    };
    let p = path.display().to_string();
    match sniff_kind(&name, &data[..data.len().min(512)]) {
        Some(FlowFileKind::Csv) => read_csv(&data[..], &p),
        Some(FlowFileKind::Parquet) => {
            #[cfg(feature = "parquet")]
            {
                parquet_in::read_parquet(data, &p)
            }
            #[cfg(not(feature = "parquet"))]
            {
                Err(FlowIngestError::Format {
                    path: p,
                    msg: "Parquet support not built (cargo feature `parquet`)".into(),
                })
            }
        }
        Some(FlowFileKind::NetflowRaw) => {
            let (records, stats) = read_netflow_bytes(&data);
            // Random bytes "decode" to nothing without complaint; a capture
            // that yields no record and whose messages failed is not one.
            if records.is_empty() && (stats.errors > 0 || !looks_like_netflow(&data)) {
                return Err(FlowIngestError::Format {
                    path: p,
                    msg: format!(
                        "not an IPFIX or NetFlow v9 capture: no flow record decoded ({} of {} \
                         message(s) malformed; it starts {}, where IPFIX starts 00 0a and \
                         NetFlow v9 00 09); tried as IPFIX/NetFlow v9 for its name or first \
                         bytes (the other formats: .csv, .parquet, .pcap, .pcapng)",
                        stats.errors,
                        stats.packets,
                        hex_head(&data)
                    ),
                });
            }
            Ok(records)
        }
        Some(FlowFileKind::Pcap) => pcap::read_pcap_bytes(&data, pcap::DEFAULT_IDLE_GAP_US)
            .map_err(|msg| FlowIngestError::Format { path: p, msg }),
        None => Err(FlowIngestError::Format {
            path: p,
            msg: "expected a .csv, .parquet, .pcap, .pcapng or IPFIX/NetFlow v9 capture file"
                .into(),
        }),
    }
}

/// Whether `data` starts as an IPFIX message (version 10, a plausible
/// length) or a NetFlow v9 packet (version 9) does.
fn looks_like_netflow(data: &[u8]) -> bool {
    match data {
        [0, 10, a, b, ..] => {
            let len = u16::from_be_bytes([*a, *b]) as usize;
            len >= 16 && len <= data.len()
        }
        [0, 9, ..] => true,
        _ => false,
    }
}

/// The first bytes of `data` in hex, for an error line.
fn hex_head(data: &[u8]) -> String {
    if data.is_empty() {
        return "empty".to_string();
    }
    data.iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Decode a buffer of concatenated IPFIX messages and/or NetFlow v9 packets (one
/// anonymous exporter). IPFIX messages are split by their length field, so a corrupt
/// message costs only itself; v9 packets (no length field) are decoded in one go.
pub fn read_netflow_bytes(data: &[u8]) -> (Vec<FlowRecord>, DecodeStats) {
    let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let mut dec = FlowDecoder::new();
    let mut out = Vec::new();
    let mut off = 0;
    while off + 4 <= data.len() {
        let version = u16::from_be_bytes([data[off], data[off + 1]]);
        if version == 10 {
            let len = u16::from_be_bytes([data[off + 2], data[off + 3]]) as usize;
            if len < 16 || off + len > data.len() {
                dec.stats.errors += 1;
                break;
            }
            dec.decode(src, &data[off..off + len], &mut out);
            off += len;
        } else {
            dec.decode(src, &data[off..], &mut out);
            break;
        }
    }
    dec.finish(&mut out);
    (out, dec.stats)
}

struct Cols {
    /// Column and µs per unit of the start time.
    start: (usize, f64),
    src: usize,
    dst: usize,
    bytes: usize,
    dur: (usize, f64),
    switches: Option<usize>,
    sport: Option<usize>,
    dport: Option<usize>,
    proto: Option<usize>,
}

fn parse_num<T: std::str::FromStr>(b: &[u8]) -> Option<T> {
    std::str::from_utf8(b).ok()?.trim().parse().ok()
}

/// A non-negative integer or decimal quantity times `scale`, rounded.
fn parse_quantity(b: &[u8], scale: f64) -> Option<u64> {
    if let Some(v) = parse_num::<u64>(b) {
        // Exact for integers (a ns epoch time has more digits than f64 keeps).
        return if scale >= 1.0 {
            v.checked_mul(scale as u64)
        } else {
            let per = (1.0 / scale).round() as u64;
            Some(v / per + u64::from(v % per >= per.div_ceil(2)))
        };
    }
    let v = parse_num::<f64>(b)? * scale;
    // 2^64 as f64; above it the cast would saturate silently.
    (0.0..18_446_744_073_709_551_616.0)
        .contains(&v)
        .then(|| v.round() as u64)
}

/// Time-column suffixes and their length in µs.
const TIME_UNITS: [(&str, f64); 4] = [("us", 1.0), ("ns", 1e-3), ("ms", 1e3), ("s", 1e6)];

/// Parse CSV flow records (see the crate docs for the columns).
pub fn read_csv<R: Read>(reader: R, path: &str) -> Result<Vec<FlowRecord>, FlowIngestError> {
    let err = |line: u64, msg: String| FlowIngestError::Csv {
        path: path.to_string(),
        line,
        msg,
    };
    let mut rdr = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(BufReader::new(reader));
    let headers = rdr
        .byte_headers()
        .map_err(|e| err(1, format!("cannot read the header: {e}")))?
        .clone();
    let find = |n: &str| {
        headers
            .iter()
            .position(|h| h.eq_ignore_ascii_case(n.as_bytes()))
    };
    let need = |n: &str| {
        find(n).ok_or_else(|| {
            err(
                1,
                format!("missing column `{n}` (need start_us,src,dst,bytes,dur_us)"),
            )
        })
    };
    let time = |base: &str| {
        TIME_UNITS
            .iter()
            .find_map(|&(unit, scale)| find(&format!("{base}_{unit}")).map(|i| (i, scale)))
            .ok_or_else(|| {
                err(
                    1,
                    format!(
                        "missing column `{base}_us` (or `{base}_ns`, `{base}_ms`, `{base}_s`; \
                         need start_us,src,dst,bytes,dur_us)"
                    ),
                )
            })
    };
    let c = Cols {
        start: time("start")?,
        src: need("src")?,
        dst: need("dst")?,
        bytes: need("bytes")?,
        dur: time("dur")?,
        switches: find("switches"),
        sport: find("src_port"),
        dport: find("dst_port"),
        proto: find("proto"),
    };
    let mut out = Vec::new();
    let mut rec = csv::ByteRecord::new();
    loop {
        let line = rdr.position().line();
        match rdr.read_byte_record(&mut rec) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => return Err(err(line, format!("unreadable row: {e}"))),
        }
        if rec.len() == 1 && rec.get(0).is_some_and(|f| f.is_empty()) {
            continue; // blank line
        }
        let get = |i: usize| rec.get(i).unwrap_or(b"");
        let opt = |i: Option<usize>| i.map(get).filter(|s| !s.is_empty());
        let num = |(i, scale): (usize, f64), what: &str| -> Result<u64, FlowIngestError> {
            parse_quantity(get(i), scale).ok_or_else(|| {
                err(
                    line,
                    format!(
                        "expected a non-negative number for {what}, got {:?}",
                        String::from_utf8_lossy(get(i))
                    ),
                )
            })
        };
        let addr = |i: usize, what: &str| -> Result<IpAddr, FlowIngestError> {
            parse_num::<IpAddr>(get(i)).ok_or_else(|| {
                err(
                    line,
                    format!(
                        "expected an IP address for {what}, got {:?}",
                        String::from_utf8_lossy(get(i))
                    ),
                )
            })
        };
        let small = |i: Option<usize>, what: &str| -> Result<Option<u64>, FlowIngestError> {
            match opt(i) {
                None => Ok(None),
                Some(b) => parse_num::<u64>(b)
                    .map(Some)
                    .ok_or_else(|| err(line, format!("expected an integer for {what}"))),
            }
        };
        let port = |i: Option<usize>, what: &str| -> Result<Option<u16>, FlowIngestError> {
            small(i, what)?
                .map(|v| {
                    u16::try_from(v).map_err(|_| err(line, format!("{what} {v} is not a port")))
                })
                .transpose()
        };
        let proto = small(c.proto, "proto")?
            .map(|v| u8::try_from(v).map_err(|_| err(line, format!("proto {v} > 255"))))
            .transpose()?;
        out.push(FlowRecord {
            start_us: num(c.start, "the start time")?,
            src: addr(c.src, "src")?,
            dst: addr(c.dst, "dst")?,
            bytes: num((c.bytes, 1.0), "bytes")?,
            dur_us: num(c.dur, "the duration")?,
            src_port: port(c.sport, "src_port")?,
            dst_port: port(c.dport, "dst_port")?,
            proto,
            switches: opt(c.switches)
                .map(|s| {
                    String::from_utf8_lossy(s)
                        .split(';')
                        .map(|x| x.trim())
                        .filter(|x| !x.is_empty())
                        .map(String::from)
                        .collect()
                })
                .unwrap_or_default(),
        });
    }
    Ok(out)
}

/// Write flow records as CSV with every column (the format [`read_csv`] reads).
pub fn write_csv<W: std::io::Write>(records: &[FlowRecord], w: W) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(w);
    writeln!(
        w,
        "start_us,src,dst,bytes,dur_us,switches,src_port,dst_port,proto"
    )?;
    let o = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_default();
    for r in records {
        writeln!(
            w,
            "{},{},{},{},{},{},{},{},{}",
            r.start_us,
            r.src,
            r.dst,
            r.bytes,
            r.dur_us,
            r.switches.join(";"),
            o(r.src_port.map(u64::from)),
            o(r.dst_port.map(u64::from)),
            o(r.proto.map(u64::from))
        )?;
    }
    w.flush()
}

/// Read flow records from any [`BufRead`] holding CSV (e.g. standard input).
pub fn read_csv_stream<R: BufRead>(r: R) -> Result<Vec<FlowRecord>, FlowIngestError> {
    read_csv(r, "<stdin>")
}
