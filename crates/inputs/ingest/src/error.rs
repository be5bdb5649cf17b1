//! The one error type of the inputs stage.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in a file an [`IngestError`] was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// The file as a whole (cannot be opened, wrong kind of file, …).
    File,
    /// A byte offset in the (decompressed) stream.
    ByteOffset(u64),
    /// A 1-based line of a CSV/JSONL file (the header is line 1).
    Line(u64),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File => f.write_str("file"),
            Location::ByteOffset(n) => write!(f, "byte offset {n}"),
            Location::Line(n) => write!(f, "line {n}"),
        }
    }
}

/// What went wrong, coarsely, so that callers can react without parsing text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be opened or read (permissions, I/O error).
    Io,
    /// The compressed stream is corrupt or ends early.
    Compression,
    /// The data is not the expected syntax (not JSON, bad CSV, …).
    Syntax,
    /// The syntax is fine but the content is not what whyslow expects
    /// (no `traceEvents`, unknown kind, value out of range, …).
    Content,
    /// The file ends before the data does (truncated).
    Truncated,
    /// A single value is larger than the streaming reader accepts.
    TooLarge,
}

/// An input file that whyslow cannot use. Its `Display` is one line:
/// `<path>: <where: file | byte offset N | line N>: <what was expected>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {}: {}", path.display(), location, one_line(message))]
pub struct IngestError {
    /// The offending file.
    pub path: PathBuf,
    /// Where in the file.
    pub location: Location,
    /// Coarse class of the problem.
    pub kind: ErrorKind,
    /// What was expected / found, one line.
    pub message: String,
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

impl IngestError {
    /// A new error.
    pub fn new(
        path: impl Into<PathBuf>,
        location: Location,
        kind: ErrorKind,
        message: impl Into<String>,
    ) -> Self {
        IngestError {
            path: path.into(),
            location,
            kind,
            message: message.into(),
        }
    }

    /// An I/O error on the file as a whole.
    pub(crate) fn io(path: &Path, what: &str, e: &std::io::Error) -> Self {
        IngestError::new(path, Location::File, ErrorKind::Io, format!("{what}: {e}"))
    }
}
