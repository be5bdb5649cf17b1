//! Parquet flow records (feature `parquet`): the CSV columns by name, read with the
//! `parquet` crate's row API (no arrow).

use bytes::Bytes;
use parquet::file::reader::{FileReader, SerializedFileReader};
use parquet::record::Field;
use whyslow_model::flow::FlowRecord;

use crate::FlowIngestError;

fn as_u64(f: &Field) -> Option<u64> {
    match f {
        Field::Byte(v) => u64::try_from(*v).ok(),
        Field::Short(v) => u64::try_from(*v).ok(),
        Field::Int(v) => u64::try_from(*v).ok(),
        Field::Long(v) => u64::try_from(*v).ok(),
        Field::UByte(v) => Some(*v as u64),
        Field::UShort(v) => Some(*v as u64),
        Field::UInt(v) => Some(*v as u64),
        Field::ULong(v) => Some(*v),
        Field::Float(v) if *v >= 0.0 && v.is_finite() => Some(*v as u64),
        Field::Double(v) if *v >= 0.0 && v.is_finite() => Some(*v as u64),
        Field::Str(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(crate) fn read_parquet(data: Vec<u8>, path: &str) -> Result<Vec<FlowRecord>, FlowIngestError> {
    let err = |msg: String| FlowIngestError::Format {
        path: path.to_string(),
        msg,
    };
    let reader = SerializedFileReader::new(Bytes::from(data))
        .map_err(|e| err(format!("not a readable Parquet file: {e}")))?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| err(format!("cannot read rows: {e}")))?;
    let mut out = Vec::new();
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| err(format!("row {i}: {e}")))?;
        let mut r = FlowRecord::new(
            0,
            std::net::Ipv4Addr::UNSPECIFIED.into(),
            std::net::Ipv4Addr::UNSPECIFIED.into(),
            0,
            0,
        );
        let mut seen = [false; 5];
        for (name, f) in row.get_column_iter() {
            let bad = |what: &str| err(format!("row {i}: expected {what} in column `{name}`"));
            match name.to_ascii_lowercase().as_str() {
                "start_us" => {
                    (r.start_us, seen[0]) =
                        (as_u64(f).ok_or_else(|| bad("an unsigned integer"))?, true)
                }
                "bytes" => {
                    (r.bytes, seen[1]) =
                        (as_u64(f).ok_or_else(|| bad("an unsigned integer"))?, true)
                }
                "dur_us" => {
                    (r.dur_us, seen[2]) =
                        (as_u64(f).ok_or_else(|| bad("an unsigned integer"))?, true)
                }
                "src" | "dst" => {
                    let a = match f {
                        Field::Str(s) => s.trim().parse().ok(),
                        _ => None,
                    }
                    .ok_or_else(|| bad("an IP address string"))?;
                    if name.eq_ignore_ascii_case("src") {
                        (r.src, seen[3]) = (a, true);
                    } else {
                        (r.dst, seen[4]) = (a, true);
                    }
                }
                "switches" => {
                    if let Field::Str(s) = f {
                        r.switches = s
                            .split(';')
                            .map(str::trim)
                            .filter(|x| !x.is_empty())
                            .map(String::from)
                            .collect();
                    }
                }
                "src_port" => r.src_port = as_u64(f).and_then(|v| u16::try_from(v).ok()),
                "dst_port" => r.dst_port = as_u64(f).and_then(|v| u16::try_from(v).ok()),
                "proto" => r.proto = as_u64(f).and_then(|v| u8::try_from(v).ok()),
                _ => {}
            }
        }
        if seen.iter().any(|s| !s) {
            return Err(err(format!(
                "row {i}: missing one of start_us,src,dst,bytes,dur_us"
            )));
        }
        out.push(r);
    }
    Ok(out)
}
