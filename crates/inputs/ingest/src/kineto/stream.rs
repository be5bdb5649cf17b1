//! A bounded-memory JSON stream: a sliding byte window over any reader, from
//! which one JSON value at a time is handed to serde_json (`from_slice`, so
//! strings borrow from the window) or skipped structurally without parsing.
//! Memory is the window: a few MiB, growing only to hold one value, up to
//! [`MAX_VALUE`].

use std::io::{self, Read};

/// Largest single JSON value (one trace event, one metadata block) accepted.
pub(crate) const MAX_VALUE: usize = 64 << 20;
/// Read granularity.
const CHUNK: usize = 1 << 20;

/// Why the stream stopped.
#[derive(Debug)]
pub(crate) enum StreamError {
    /// Reading failed (for gzip: corrupt or truncated compressed data).
    Io { offset: u64, err: io::Error },
    /// Not JSON at `offset`.
    Syntax { offset: u64, msg: String },
    /// Input ended while `what` was expected.
    Eof { offset: u64, what: String },
    /// One value exceeds [`MAX_VALUE`].
    TooLarge { offset: u64 },
}

pub(crate) struct JsonStream<R> {
    r: R,
    buf: Vec<u8>,
    pos: usize,
    /// Stream offset of `buf[0]`.
    base: u64,
    eof: bool,
    /// A read error met after some bytes of the same fill, reported next.
    failed: Option<io::Error>,
}

#[inline]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// Byte offset in `slice` of serde_json's (line, column) position.
fn offset_of(slice: &[u8], line: usize, column: usize) -> usize {
    let mut start = 0;
    if line > 1 {
        let mut seen = 1;
        for (i, &b) in slice.iter().enumerate() {
            if b == b'\n' {
                seen += 1;
                if seen == line {
                    start = i + 1;
                    break;
                }
            }
        }
    }
    (start + column.saturating_sub(1)).min(slice.len())
}

impl<R: Read> JsonStream<R> {
    pub(crate) fn new(r: R) -> Self {
        JsonStream {
            r,
            buf: Vec::with_capacity(CHUNK * 2),
            pos: 0,
            base: 0,
            eof: false,
            failed: None,
        }
    }

    /// Stream offset of the next unread byte.
    pub(crate) fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Reads more input behind the unread bytes. Returns false at end of input.
    fn fill(&mut self) -> Result<bool, StreamError> {
        if self.eof {
            return Ok(false);
        }
        if let Some(err) = self.failed.take() {
            return Err(StreamError::Io {
                offset: self.base + self.buf.len() as u64,
                err,
            });
        }
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.base += self.pos as u64;
            self.pos = 0;
        }
        if self.buf.len() >= MAX_VALUE {
            return Err(StreamError::TooLarge {
                offset: self.offset(),
            });
        }
        let old = self.buf.len();
        // `read_to_end` reads into the spare capacity without zeroing it
        // first (a `resize` here cleared a MiB per read); `take` bounds it.
        match (&mut self.r).take(CHUNK as u64).read_to_end(&mut self.buf) {
            Ok(n) => {
                if n == 0 {
                    self.eof = true;
                }
                Ok(n > 0)
            }
            // Bytes read before the error are input too (a truncated gzip
            // still yields its events): hand them out, fail on the next fill.
            Err(err) if self.buf.len() > old => {
                self.failed = Some(err);
                Ok(true)
            }
            Err(err) => Err(StreamError::Io {
                offset: self.base + old as u64,
                err,
            }),
        }
    }

    /// The next non-whitespace byte, not consumed; `None` at end of input.
    pub(crate) fn peek(&mut self) -> Result<Option<u8>, StreamError> {
        loop {
            while self.pos < self.buf.len() {
                let b = self.buf[self.pos];
                if !is_ws(b) {
                    return Ok(Some(b));
                }
                self.pos += 1;
            }
            if !self.fill()? {
                return Ok(None);
            }
        }
    }

    /// Consumes one byte (after a successful [`peek`](Self::peek)).
    pub(crate) fn bump(&mut self) {
        if self.pos < self.buf.len() {
            self.pos += 1;
        }
    }

    /// Consumes `b` (after whitespace) or fails with "expected `what`".
    pub(crate) fn expect(&mut self, b: u8, what: &str) -> Result<(), StreamError> {
        match self.peek()? {
            Some(c) if c == b => {
                self.bump();
                Ok(())
            }
            Some(c) => Err(StreamError::Syntax {
                offset: self.offset(),
                msg: format!("expected {what}, found {}", show(c)),
            }),
            None => Err(StreamError::Eof {
                offset: self.offset(),
                what: what.to_string(),
            }),
        }
    }

    /// Parses the next JSON value with `f`, which gets the unread bytes and
    /// returns its output and the number of bytes the value took. Retries with
    /// more input when the value runs past the window.
    pub(crate) fn value<O>(
        &mut self,
        what: &str,
        mut f: impl FnMut(&[u8]) -> Result<(O, usize), serde_json::Error>,
    ) -> Result<O, StreamError> {
        let first = match self.peek()? {
            Some(b) => b,
            None => {
                return Err(StreamError::Eof {
                    offset: self.offset(),
                    what: what.to_string(),
                })
            }
        };
        // A scalar that ends exactly at the window's end may continue beyond
        // it: make sure its delimiter (or the end of input) is in the window.
        if !matches!(first, b'{' | b'[' | b'"') {
            let mut from = self.pos;
            loop {
                let rest = &self.buf[from..];
                if rest
                    .iter()
                    .any(|&b| is_ws(b) || matches!(b, b',' | b'}' | b']' | b':'))
                {
                    break;
                }
                let kept = self.buf.len() - self.pos;
                if !self.fill()? {
                    break;
                }
                from = self.pos + kept;
            }
        }
        loop {
            let slice = &self.buf[self.pos..];
            match f(slice) {
                Ok((o, n)) => {
                    self.pos += n.min(slice.len());
                    return Ok(o);
                }
                Err(e) if e.is_eof() => {
                    if !self.fill()? {
                        return Err(StreamError::Eof {
                            offset: self.base + self.buf.len() as u64,
                            what: what.to_string(),
                        });
                    }
                }
                Err(e) => return Err(self.syntax(slice, &e)),
            }
        }
    }

    /// Tries `f` (the fast path) on the unread bytes: `Some` when it parsed a
    /// value, `None` when the general parser must take over (at the same
    /// position). Reads more input while `f` needs it.
    pub(crate) fn fast<O>(
        &mut self,
        mut f: impl FnMut(&[u8]) -> super::fast::Fast<O>,
    ) -> Result<Option<O>, StreamError> {
        use super::fast::Fast;
        loop {
            match f(&self.buf[self.pos..]) {
                Fast::Done(o, n) => {
                    self.pos = (self.pos + n).min(self.buf.len());
                    return Ok(Some(o));
                }
                Fast::Fallback => return Ok(None),
                Fast::Incomplete => {
                    if !self.fill()? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn syntax(&self, slice: &[u8], e: &serde_json::Error) -> StreamError {
        let at = offset_of(slice, e.line(), e.column());
        // serde_json appends " at line L column C"; drop it, offsets are ours.
        let mut msg = e.to_string();
        if let Some(i) = msg.rfind(" at line ") {
            msg.truncate(i);
        }
        StreamError::Syntax {
            offset: self.offset() + at as u64,
            msg,
        }
    }

    /// Skips the next JSON value without parsing it (only strings, escapes and
    /// brackets are tracked), in constant memory whatever its size.
    pub(crate) fn skip_value(&mut self, what: &str) -> Result<(), StreamError> {
        let first = match self.peek()? {
            Some(b) => b,
            None => {
                return Err(StreamError::Eof {
                    offset: self.offset(),
                    what: what.to_string(),
                })
            }
        };
        match first {
            b'{' | b'[' | b'"' => {}
            b',' | b':' | b'}' | b']' => {
                return Err(StreamError::Syntax {
                    offset: self.offset(),
                    msg: format!("expected {what}, found {}", show(first)),
                })
            }
            _ => {
                // A scalar: up to the next delimiter.
                loop {
                    while self.pos < self.buf.len() {
                        let b = self.buf[self.pos];
                        if is_ws(b) || matches!(b, b',' | b'}' | b']' | b':') {
                            return Ok(());
                        }
                        self.pos += 1;
                    }
                    if !self.fill()? {
                        return Ok(());
                    }
                }
            }
        }
        let mut depth: usize = 0;
        let mut in_str = false;
        let mut esc = false;
        loop {
            while self.pos < self.buf.len() {
                if in_str && !esc {
                    // Jump to the next quote or backslash.
                    match memchr::memchr2(b'"', b'\\', &self.buf[self.pos..]) {
                        Some(k) => self.pos += k,
                        None => {
                            self.pos = self.buf.len();
                            break;
                        }
                    }
                }
                let b = self.buf[self.pos];
                self.pos += 1;
                if in_str {
                    if esc {
                        esc = false;
                    } else if b == b'\\' {
                        esc = true;
                    } else if b == b'"' {
                        in_str = false;
                        if depth == 0 {
                            return Ok(());
                        }
                    }
                    continue;
                }
                match b {
                    b'"' => in_str = true,
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        if depth == 0 {
                            self.pos -= 1;
                            return Err(StreamError::Syntax {
                                offset: self.offset(),
                                msg: format!("unbalanced {} in {what}", show(b)),
                            });
                        }
                        depth -= 1;
                        if depth == 0 {
                            return Ok(());
                        }
                    }
                    _ => {}
                }
            }
            if !self.fill()? {
                return Err(StreamError::Eof {
                    offset: self.offset(),
                    what: format!("the end of {what}"),
                });
            }
        }
    }
}

/// A byte for messages.
pub(crate) fn show(b: u8) -> String {
    if b.is_ascii_graphic() {
        format!("'{}'", b as char)
    } else {
        format!("byte 0x{b:02x}")
    }
}
