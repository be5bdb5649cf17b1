//! Opening files: plain or gzip, detected by magic bytes.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::IngestError;

/// Opens `path` for reading, decompressing gzip (by magic bytes, whatever the
/// name). Returns the reader and whether it is gzip.
pub(crate) fn open(path: &Path) -> Result<(Box<dyn Read + Send>, bool), IngestError> {
    let f = File::open(path).map_err(|e| IngestError::io(path, "cannot open", &e))?;
    let mut br = BufReader::with_capacity(1 << 16, f);
    let head = br
        .fill_buf()
        .map_err(|e| IngestError::io(path, "cannot read", &e))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        Ok((Box::new(MultiGzDecoder::new(br)), true))
    } else {
        Ok((Box::new(br), false))
    }
}

/// File name, lowercase, without a trailing `.gz`.
pub(crate) fn base_name(path: &Path) -> String {
    let n = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    match n.strip_suffix(".gz") {
        Some(s) => s.to_string(),
        None => n,
    }
}
