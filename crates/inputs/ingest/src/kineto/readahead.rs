//! Decompression beside parsing: a gzip trace's inflate (a fifth of the
//! whole `summarize` process on a large trace) runs in its own thread, a
//! few chunks ahead of the parser, when the machine has a second core. The
//! bytes, their order, and where a read error falls in them are those of
//! the inner reader: the parser cannot tell the difference, only the wall
//! clock can.

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Bytes a chunk holds.
const CHUNK: usize = 256 << 10;
/// Chunks read ahead: memory stays bounded at about `AHEAD × CHUNK`.
const AHEAD: usize = 8;

/// Whether to read ahead in a thread: with more than one core to run it.
pub(crate) fn worth_it() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() > 1)
}

/// Runs `parse` over the bytes of `inner`, read by a second thread into a
/// bounded queue of chunks. The reader stops when `parse` returns (its end
/// of the queue is dropped) or at the end of `inner`.
pub(crate) fn with_read_ahead<R, T>(inner: R, parse: impl FnOnce(&mut ChunkReader) -> T) -> T
where
    R: Read + Send,
{
    let (tx, rx) = sync_channel(AHEAD);
    std::thread::scope(|scope| {
        scope.spawn(move || produce(inner, tx));
        let mut reader = ChunkReader {
            rx,
            chunk: Vec::new(),
            pos: 0,
        };
        let out = parse(&mut reader);
        // Drop the receiving end first, so a reader blocked on a full
        // queue wakes up and stops.
        drop(reader);
        out
    })
}

/// The reading thread: chunks in order, a read error after the bytes read
/// before it, then nothing.
fn produce<R: Read>(mut inner: R, tx: SyncSender<io::Result<Vec<u8>>>) {
    loop {
        let mut chunk = Vec::with_capacity(CHUNK);
        match (&mut inner).take(CHUNK as u64).read_to_end(&mut chunk) {
            Ok(0) => return,
            Ok(_) => {
                if tx.send(Ok(chunk)).is_err() {
                    return;
                }
            }
            Err(e) => {
                if !chunk.is_empty() && tx.send(Ok(chunk)).is_err() {
                    return;
                }
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}

/// The parser's side: a [`Read`] over the queued chunks.
pub(crate) struct ChunkReader {
    rx: Receiver<io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(Ok(chunk)) => {
                    self.chunk = chunk;
                    self.pos = 0;
                }
                Ok(Err(e)) => return Err(e),
                // The reader is done: end of input.
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.chunk.len() - self.pos);
        out[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that yields `data` in uneven pieces, then fails.
    struct Flaky {
        data: Vec<u8>,
        pos: usize,
        fail: bool,
    }

    impl Read for Flaky {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.pos == self.data.len() {
                return if self.fail {
                    Err(io::Error::new(io::ErrorKind::InvalidData, "corrupt"))
                } else {
                    Ok(0)
                };
            }
            let n = out.len().min(7919).min(self.data.len() - self.pos);
            out[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    #[test]
    fn the_parser_reads_the_same_bytes_and_the_error_after_them() {
        for len in [0usize, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 12345] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            for fail in [false, true] {
                let inner = Flaky {
                    data: data.clone(),
                    pos: 0,
                    fail,
                };
                let (got, err) = with_read_ahead(inner, |r| {
                    let mut got = Vec::new();
                    let err = r.read_to_end(&mut got).err();
                    (got, err)
                });
                assert_eq!(got, data, "{len}");
                assert_eq!(err.is_some(), fail, "{len}");
            }
        }
    }

    #[test]
    fn a_parser_that_stops_early_stops_the_reader() {
        let inner = io::repeat(b'x').take(64 * CHUNK as u64);
        let first = with_read_ahead(inner, |r| {
            let mut b = [0u8; 10];
            r.read_exact(&mut b).map(|_| b)
        });
        assert_eq!(first.unwrap(), [b'x'; 10]);
    }
}
