//! Fingerprint files: one worker's [`Fingerprint`] as compact JSON.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use whyslow_model::{Fingerprint, FINGERPRINT_FORMAT, FINGERPRINT_VERSION};

use crate::error::{ErrorKind, IngestError, Location};
use crate::open::open;

fn json_err(path: &Path, e: &serde_json::Error, what: &str) -> IngestError {
    let mut m = e.to_string();
    if let Some(i) = m.rfind(" at line ") {
        m.truncate(i);
    }
    let kind = if e.is_eof() {
        ErrorKind::Truncated
    } else if e.is_data() {
        ErrorKind::Content
    } else {
        ErrorKind::Syntax
    };
    let loc = if e.line() > 0 {
        Location::Line(e.line() as u64)
    } else {
        Location::File
    };
    IngestError::new(path, loc, kind, format!("{what}: {m}"))
}

/// Parses a fingerprint from JSON bytes; `path` names it in errors.
pub fn parse_fingerprint(bytes: &[u8], path: &Path) -> Result<Fingerprint, IngestError> {
    let v: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| json_err(path, &e, "expected a whyslow fingerprint (JSON)"))?;
    let format = v.get("format").and_then(|f| f.as_str());
    if format != Some(FINGERPRINT_FORMAT) {
        return Err(IngestError::new(
            path,
            Location::File,
            ErrorKind::Content,
            format!(
                "format is {}: expected \"{FINGERPRINT_FORMAT}\"",
                format.map_or("missing".to_string(), |f| format!("{f:?}"))
            ),
        ));
    }
    match v.get("version").and_then(|x| x.as_u64()) {
        Some(n) if n <= u64::from(FINGERPRINT_VERSION) => {}
        Some(n) => {
            return Err(IngestError::new(
                path,
                Location::File,
                ErrorKind::Content,
                format!(
                    "fingerprint version {n} is newer than this whyslow reads (≤ {FINGERPRINT_VERSION}): upgrade whyslow"
                ),
            ))
        }
        None => {
            return Err(IngestError::new(
                path,
                Location::File,
                ErrorKind::Content,
                "missing or invalid \"version\": expected a non-negative integer",
            ))
        }
    }
    serde_json::from_value(v).map_err(|e| json_err(path, &e, "invalid fingerprint"))
}

/// Reads a fingerprint file (plain or gzip JSON).
pub fn read_fingerprint(path: &Path) -> Result<Fingerprint, IngestError> {
    let (mut r, _) = open(path)?;
    let mut bytes = Vec::new();
    r.read_to_end(&mut bytes)
        .map_err(|e| IngestError::io(path, "cannot read", &e))?;
    parse_fingerprint(&bytes, path)
}

/// Writes `fp` to `path` as compact JSON.
pub fn write_fingerprint(path: &Path, fp: &Fingerprint) -> Result<(), IngestError> {
    let f = File::create(path).map_err(|e| IngestError::io(path, "cannot create", &e))?;
    let mut w = BufWriter::new(f);
    serde_json::to_writer(&mut w, fp).map_err(|e| {
        IngestError::new(
            path,
            Location::File,
            ErrorKind::Io,
            format!("cannot write: {e}"),
        )
    })?;
    w.write_all(b"\n")
        .and_then(|_| w.flush())
        .map_err(|e| IngestError::io(path, "cannot write", &e))
}
