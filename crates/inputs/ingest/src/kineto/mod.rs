//! PyTorch profiler (Kineto) traces, `.json` or `.json.gz`, streamed.
//!
//! # Reading
//!
//! Each event goes first through a hand-written scanner for the usual shape
//! (see `fast.rs`: unescaped strings, plain numbers; unneeded values skipped
//! unparsed, `args` read only for GPU, Python and communication events) and
//! otherwise through serde_json into lenient borrowed types (`raw.rs`); both
//! paths give the same result (tested on every fixture).
//!
//! The file is read through a sliding window (a few MiB, growing only to hold
//! one event, at most 64 MiB); gzip is detected by its magic bytes, not the
//! file name, and concatenated gzip members are read as one stream. The
//! top-level object's `traceEvents` array is streamed one event at a time;
//! `distributedInfo`, `deviceProperties` and `displayTimeUnit` are parsed
//! wherever they appear (before or after `traceEvents`); any other top-level
//! value is skipped without being parsed. A bare top-level array of events
//! (the Trace Event Format's "JSON array format") is accepted too.
//!
//! Format drift that is tolerated:
//! - `ts`/`dur` as integers or floats (µs; floats carry ns digits). They are
//!   converted to integer ns: integers exactly; decimals exactly too on the
//!   fast path (digit by digit, rounded half up past the third decimal), and
//!   as `round(v × 1000)` through f64 on the general path (events the fast
//!   path hands over: escapes, exponents, string numbers…), which is exact up
//!   to |ts| ≈ 9·10^12 µs and within f64's ulp beyond (≤ 0.25 µs for
//!   epoch-based timestamps ≈ 1.7·10^15 µs).
//! - `displayTimeUnit` is a display hint only: the `v100-ns-resolution`
//!   fixture says `"ns"` yet its ProfilerStep spans read as ~95 ms only when
//!   `ts`/`dur` are taken as µs (as ns they would be 95 µs steps, and its
//!   `ts` ≈ 1.7·10^15 is the Unix epoch in µs). whyslow always reads µs.
//! - `baseTimeNanoseconds` is not added: executions stay on the trace's own
//!   clock (µs → ns), the clock sample files must use too.
//! - flow events (`ph` `s`/`f`, both `ac2g` and the older `async_cpu_to_gpu`),
//!   metadata (`M`), instants (`i`), counters (`C`) are ignored; `B`/`E`
//!   pairs are ignored with a warning; `X` events without `dur` are skipped
//!   with a warning.
//! - ids (`Python id`, pids, tids) as any JSON number (including beyond i64)
//!   or string; names with invalid UTF-8 are replaced lossily.
//! - a malformed event (wrong types the lenient reader cannot take, bad
//!   escapes, duplicate keys) is skipped with a warning, unless
//!   [`ReadOptions::strict`](crate::ReadOptions).
//! - a file that ends early (truncated gzip, killed job) keeps what was read,
//!   with a warning, unless strict; it is an error when no event was read.
//!
//! # Classification (PerfTracker §4.2)
//!
//! Only complete (`X`) events become [`Execution`](whyslow_model::Execution)s:
//!
//! | `cat` | kind | resource | `trace_util` |
//! |---|---|---|---|
//! | `kernel`, name contains `nccl`/`rccl` (any case) | Comm | NVLink or NIC (below) | bus bandwidth / peak |
//! | `kernel`, otherwise | GpuKernel | SM | `est. achieved occupancy %` / 100, NaN when absent (AMD) |
//! | `gpu_memcpy` | Memory | PCIe (HtoD, DtoH, pinned/pageable), DRAM (DtoD), NVLink (PtoP) | `memory bandwidth (GB/s)` / peak |
//! | `gpu_memset` | Memory | DRAM | bandwidth / HBM peak |
//! | `python_function` | Python | CPU | NaN |
//! | CPU side (`cpu_op`, `cuda_runtime`, `cuda_driver`, `user_annotation`, other) named `ProfilerStep#N` | — (recorded in `WorkerTrace::steps`) | | |
//! | CPU side, named `record_param_comms` or starting `nccl:`, `rccl:`, `gloo:`, `mpi:`, `ucc:`, `c10d::`, `c10d_functional::`, `_c10d_functional::`, `ProcessGroupNCCL::`, `ProcessGroupGloo::` | Comm | as below | NaN |
//! | CPU side, host allocation / pinning (`cudaMalloc*`, `cudaFree*`, `cudaHostAlloc`, `cudaMallocHost`, `cudaHostRegister`, `cuMemAlloc*`, `hipMalloc*`, `hipHostMalloc`, `aten::pin_memory`, `aten::_pin_memory`, …) | Memory | PCIe (host/pinned), DRAM (device) | NaN |
//! | CPU side, anything else | CpuOp | CPU | NaN |
//! | `gpu_user_annotation`, `overhead`, `Trace`, `cuda_sync`, `cpu_instant_event`, flows | skipped (they duplicate kernels or are profiler bookkeeping) | | |
//!
//! Python functions are identified by their whole call stack: the chain of
//! `Python parent id` links (resolved after the whole stream, parents may come
//! later in the file), frames outermost first joined by `;`. A parent id that
//! is not in the trace starts the stack there (with a warning).
//!
//! Communication resource: `gloo` collectives (by name or by the process
//! group's backend) → NIC. Otherwise the group's ranks (the event's `Process
//! Group Ranks`, else `distributedInfo.pg_config` by `Process Group Name`) all
//! within one 8-aligned block of 8 ranks (one 8-GPU host) → NVLink, else NIC;
//! without ranks, `world_size ≤ 8` or a group of one → NVLink, else NIC. A
//! function seen in several groups takes the majority resource.
//! Bus bandwidth = max(in, out msg nelems) × dtype size / duration × the
//! nccl-tests factor of the collective (see [`crate::peaks`]).
//!
//! Lanes (`Execution::thread`): one interned id per CPU (pid, tid) and one per
//! GPU (device, stream), never shared between the two.
//!
//! Training thread: among CPU lanes, excluding those whose Python root frames
//! are all `threading.py(…): _bootstrap` (helper threads), the lane with the
//! most `ProfilerStep#N` time, else the one with the most Python, CPU-op,
//! communication and memory execution time (nested executions count again).

mod block;
mod build;
mod fast;
pub(crate) mod raw;
mod readahead;
mod stream;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use serde::Deserialize;
use whyslow_model::{RankSource, WorkerMeta, WorkerTrace};

use crate::error::{ErrorKind, IngestError, Location};
use crate::{rank_from_file_name, ReadOptions};
use build::Builder;
use raw::{Bytes, DeviceProp, DistributedInfo, RawEvent};
use stream::{show, JsonStream, StreamError};

/// Reads one Kineto trace file (`.json` or gzip-compressed, whatever its
/// name) with default [`ReadOptions`].
pub fn read_kineto(path: &Path) -> Result<WorkerTrace, IngestError> {
    read_kineto_with(path, &ReadOptions::default())
}

/// Reads one Kineto trace file with `opts`.
pub fn read_kineto_with(path: &Path, opts: &ReadOptions) -> Result<WorkerTrace, IngestError> {
    let f = File::open(path).map_err(|e| IngestError::io(path, "cannot open", &e))?;
    let mut br = BufReader::with_capacity(1 << 16, f);
    let head = br
        .fill_buf()
        .map_err(|e| IngestError::io(path, "cannot read", &e))?;
    // A file's gzip is inflated in a second thread while this one parses.
    if head.starts_with(&[0x1f, 0x8b]) && readahead::worth_it() {
        return readahead::with_read_ahead(MultiGzDecoder::new(br), |r| {
            read_stream(r, path, opts, true, true)
        });
    }
    read_kineto_impl(br, path, opts)
}

/// Reads a Kineto trace from any reader (plain or gzip JSON, detected by
/// magic bytes); `name` stands for the file in errors, in
/// `WorkerMeta::source` and for the rank-from-file-name fallback. Never
/// panics, whatever the bytes.
pub fn read_kineto_from_reader<R: Read>(r: R, name: &str) -> Result<WorkerTrace, IngestError> {
    read_kineto_impl(r, Path::new(name), &ReadOptions::default())
}

/// [`read_kineto_from_reader`] with options.
pub fn read_kineto_from_reader_with<R: Read>(
    r: R,
    name: &str,
    opts: &ReadOptions,
) -> Result<WorkerTrace, IngestError> {
    read_kineto_impl(r, Path::new(name), opts)
}

/// The `baseTimeNanoseconds` a Kineto trace (plain or gzip JSON) declares
/// at its top level, if any: newer PyTorch writes event `ts` relative to it,
/// older traces have none and Unix-epoch `ts`. Reads the top level only
/// (`traceEvents` is skipped, not parsed); errors name the file and offset.
pub fn read_kineto_base_time_ns(path: &Path) -> Result<Option<i64>, IngestError> {
    let f = File::open(path).map_err(|e| IngestError::io(path, "cannot open", &e))?;
    let mut br = BufReader::with_capacity(1 << 16, f);
    let head = br
        .fill_buf()
        .map_err(|e| IngestError::io(path, "cannot read", &e))?;
    let gzip = head.starts_with(&[0x1f, 0x8b]);
    let mut b = Builder::default();
    let outcome = if gzip {
        let mut s = JsonStream::new(MultiGzDecoder::new(br));
        drive(&mut s, &mut b, &ReadOptions::default(), false, false)
    } else {
        let mut s = JsonStream::new(br);
        drive(&mut s, &mut b, &ReadOptions::default(), false, false)
    };
    match outcome {
        Ok(_) => Ok(b.base_time_ns),
        Err((e, _)) => Err(stream_error(path, gzip, e)),
    }
}

fn read_kineto_impl<R: Read>(
    r: R,
    path: &Path,
    opts: &ReadOptions,
) -> Result<WorkerTrace, IngestError> {
    let mut br = BufReader::with_capacity(1 << 16, r);
    let head = br
        .fill_buf()
        .map_err(|e| IngestError::io(path, "cannot read", &e))?;
    if head.is_empty() {
        return Err(IngestError::new(
            path,
            Location::ByteOffset(0),
            ErrorKind::Content,
            "empty file: expected a Kineto JSON trace",
        ));
    }
    if head.starts_with(&[0x1f, 0x8b]) {
        read_stream(MultiGzDecoder::new(br), path, opts, true, true)
    } else {
        read_stream(br, path, opts, false, true)
    }
}

/// A stream error as the user sees it: which file, where, what was expected.
fn stream_error(path: &Path, gzip: bool, e: StreamError) -> IngestError {
    match e {
        StreamError::Io { offset, err } => IngestError::new(
            path,
            Location::ByteOffset(offset),
            if gzip {
                ErrorKind::Compression
            } else {
                ErrorKind::Io
            },
            if gzip {
                format!("corrupt or truncated gzip data: {err}")
            } else {
                format!("read error: {err}")
            },
        ),
        StreamError::Syntax { offset, msg } => {
            IngestError::new(path, Location::ByteOffset(offset), ErrorKind::Syntax, msg)
        }
        StreamError::Eof { offset, what } => IngestError::new(
            path,
            Location::ByteOffset(offset),
            ErrorKind::Truncated,
            format!("unexpected end of input: expected {what} (truncated file?)"),
        ),
        StreamError::TooLarge { offset } => IngestError::new(
            path,
            Location::ByteOffset(offset),
            ErrorKind::TooLarge,
            format!(
                "a single JSON value larger than {} MiB: expected trace events of reasonable size",
                stream::MAX_VALUE >> 20
            ),
        ),
    }
}

fn read_stream<R: Read>(
    r: R,
    path: &Path,
    opts: &ReadOptions,
    gzip: bool,
    use_fast: bool,
) -> Result<WorkerTrace, IngestError> {
    let mut s = JsonStream::new(r);
    let mut b = Builder::default();
    let outcome = drive(&mut s, &mut b, opts, use_fast, true);
    let err = |e: StreamError| stream_error(path, gzip, e);
    let mut truncated_warning = None;
    match outcome {
        Ok(Outcome::Done) => {}
        Ok(Outcome::NoTraceEvents) => {
            return Err(IngestError::new(
                path,
                Location::ByteOffset(s.offset()),
                ErrorKind::Content,
                "no \"traceEvents\" array: expected a Kineto (PyTorch profiler) trace",
            ))
        }
        Err((e, in_events)) => {
            let cut = matches!(e, StreamError::Eof { .. } | StreamError::Io { .. });
            if cut && in_events && !opts.strict && b.counts.events > 0 {
                let e = err(e);
                truncated_warning = Some(format!(
                    "trace is truncated ({}); kept the {} events before {}",
                    e.message, b.counts.events, e.location
                ));
            } else {
                return Err(err(e));
            }
        }
    }
    if opts.strict && b.counts.malformed > 0 {
        return Err(IngestError::new(
            path,
            Location::ByteOffset(b.counts.first_malformed.unwrap_or(0)),
            ErrorKind::Syntax,
            "malformed trace event (strict mode)",
        ));
    }
    let source = path.display().to_string();
    let (rank, rank_source) = match b.rank {
        Some(r) => (r, RankSource::Trace),
        None => match rank_from_file_name(path) {
            Some(r) => (r, RankSource::FileName),
            None => (0, RankSource::FileOrder),
        },
    };
    let mut t = WorkerTrace::new(WorkerMeta {
        rank,
        host: None,
        group: None,
        rank_source,
        source,
        world_size: b.world_size,
    });
    t.backend = b.backend.clone();
    match rank_source {
        RankSource::Trace => {}
        RankSource::FileName => t.warnings.push(format!(
            "{}: no distributedInfo.rank; rank {rank} taken from the file name",
            path.display()
        )),
        RankSource::FileOrder => t.warnings.push(format!(
            "{}: no distributedInfo.rank and no rank in the file name; rank guessed from file order",
            path.display()
        )),
    }
    if let Some(w) = truncated_warning {
        t.truncated = true;
        t.warnings.push(w);
    }
    b.finish(&mut t);
    Ok(t)
}

enum Outcome {
    Done,
    NoTraceEvents,
}

/// Parses one value with serde_json from the window; returns it with its length.
fn one<'a, T: Deserialize<'a>>(sl: &'a [u8]) -> Result<(T, usize), serde_json::Error> {
    let mut it = serde_json::Deserializer::from_slice(sl).into_iter::<T>();
    match it.next() {
        Some(Ok(v)) => Ok((v, it.byte_offset())),
        Some(Err(e)) => Err(e),
        None => Err(serde::de::Error::custom("expected a value")),
    }
}

/// The error and whether it happened inside `traceEvents`.
type DriveError = (StreamError, bool);

fn drive<R: Read>(
    s: &mut JsonStream<R>,
    b: &mut Builder,
    opts: &ReadOptions,
    use_fast: bool,
    with_events: bool,
) -> Result<Outcome, DriveError> {
    let outer = |e| (e, false);
    match s.peek().map_err(outer)? {
        Some(b'{') => s.bump(),
        Some(b'[') => {
            events(s, b, opts, use_fast).map_err(|e| (e, true))?;
            return Ok(Outcome::Done);
        }
        Some(c) => {
            return Err(outer(StreamError::Syntax {
                offset: s.offset(),
                msg: format!(
                    "not JSON: expected '{{' opening a Kineto trace, found {}",
                    show(c)
                ),
            }))
        }
        None => {
            return Err(outer(StreamError::Eof {
                offset: s.offset(),
                what: "a JSON object".into(),
            }))
        }
    }
    let mut seen_events = false;
    let mut first = true;
    loop {
        match s.peek().map_err(outer)? {
            Some(b'}') => {
                s.bump();
                break;
            }
            Some(b',') if !first => {
                s.bump();
            }
            Some(_) if first => {}
            Some(c) => {
                return Err(outer(StreamError::Syntax {
                    offset: s.offset(),
                    msg: format!(
                        "expected ',' or '}}' after a top-level value, found {}",
                        show(c)
                    ),
                }))
            }
            None => {
                return Err(outer(StreamError::Eof {
                    offset: s.offset(),
                    what: "'}' closing the trace".into(),
                }))
            }
        }
        first = false;
        if s.peek().map_err(outer)? != Some(b'"') {
            if let Some(c) = s.peek().map_err(outer)? {
                return Err(outer(StreamError::Syntax {
                    offset: s.offset(),
                    msg: format!("expected a key string, found {}", show(c)),
                }));
            }
        }
        let key: Bytes<'static> = s
            .value("a key", |sl| {
                one::<Bytes>(sl).map(|(k, n)| (Bytes(k.0.into_owned().into()), n))
            })
            .map_err(outer)?;
        s.expect(b':', "':' after a key").map_err(outer)?;
        match key.as_slice() {
            b"traceEvents" if !with_events => {
                seen_events = true;
                s.skip_value("traceEvents").map_err(outer)?;
            }
            b"traceEvents" => {
                if s.peek().map_err(outer)? == Some(b'[') {
                    seen_events = true;
                    events(s, b, opts, use_fast).map_err(|e| (e, true))?;
                } else {
                    s.skip_value("traceEvents").map_err(outer)?;
                }
            }
            b"distributedInfo" => {
                s.value("distributedInfo", |sl| {
                    one::<serde_json::Value>(sl).map(|(v, n)| {
                        if let Ok(d) = DistributedInfo::deserialize(&v) {
                            b.distributed_info(d);
                        }
                        ((), n)
                    })
                })
                .map_err(outer)?;
            }
            b"deviceProperties" => {
                s.value("deviceProperties", |sl| {
                    one::<serde_json::Value>(sl).map(|(v, n)| {
                        if let Ok(d) = Vec::<DeviceProp>::deserialize(&v) {
                            b.device_properties(d);
                        }
                        ((), n)
                    })
                })
                .map_err(outer)?;
            }
            b"baseTimeNanoseconds" => {
                s.value("baseTimeNanoseconds", |sl| {
                    one::<serde_json::Value>(sl).map(|(v, n)| {
                        b.base_time_ns = v.as_i64();
                        ((), n)
                    })
                })
                .map_err(outer)?;
            }
            b"displayTimeUnit" => {
                s.value("displayTimeUnit", |sl| {
                    one::<Bytes>(sl).map(|(d, n)| {
                        b.display_time_unit(d);
                        ((), n)
                    })
                })
                .map_err(outer)?;
            }
            _ => s.skip_value("a value").map_err(outer)?,
        }
    }
    Ok(if seen_events {
        Outcome::Done
    } else {
        Outcome::NoTraceEvents
    })
}

/// Streams the `traceEvents` array (the window is at its `[`).
fn events<R: Read>(
    s: &mut JsonStream<R>,
    b: &mut Builder,
    opts: &ReadOptions,
    use_fast: bool,
) -> Result<(), StreamError> {
    s.expect(b'[', "'[' opening traceEvents")?;
    let mut first = true;
    loop {
        match s.peek()? {
            Some(b']') => {
                s.bump();
                return Ok(());
            }
            Some(b',') if !first => s.bump(),
            Some(_) if first => {}
            Some(c) => {
                return Err(StreamError::Syntax {
                    offset: s.offset(),
                    msg: format!(
                        "expected ',' or ']' between trace events, found {}",
                        show(c)
                    ),
                })
            }
            None => {
                return Err(StreamError::Eof {
                    offset: s.offset(),
                    what: "']' closing traceEvents".into(),
                })
            }
        }
        first = false;
        let at = s.offset();
        let done = use_fast
            && s.fast(|sl| {
                let mut ev = RawEvent::default();
                let r = fast::event(sl, &mut ev);
                if let fast::Fast::Done((), _) = r {
                    b.push(&ev);
                }
                r
            })?
            .is_some();
        if done {
            continue;
        }
        let r = s.value("a trace event", |sl| {
            one::<RawEvent>(sl).map(|(ev, n)| {
                b.push(&ev);
                ((), n)
            })
        });
        match r {
            Ok(()) => {}
            Err(StreamError::Syntax { offset, msg }) => {
                // Skip the event if it is at least balanced JSON.
                if opts.strict || s.skip_value("a trace event").is_err() {
                    return Err(StreamError::Syntax { offset, msg });
                }
                b.malformed(at);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Same comparison on any file named by `WHYSLOW_EQ_FILE` (manual check).
    #[test]
    #[ignore = "manual: WHYSLOW_EQ_FILE=trace.json cargo test -- --ignored fast_path"]
    fn fast_path_matches_general_path_on_file() {
        let Some(f) = std::env::var_os("WHYSLOW_EQ_FILE") else {
            whyslow_testkit::skip("set WHYSLOW_EQ_FILE to a trace to compare on");
            return;
        };
        let f = std::path::PathBuf::from(f);
        let read = |fast: bool| {
            let file = File::open(&f).unwrap();
            read_stream(
                BufReader::new(file),
                &f,
                &ReadOptions::default(),
                false,
                fast,
            )
            .unwrap()
        };
        let (a, b) = (read(true), read(false));
        let mut ca = std::collections::BTreeMap::new();
        for e in &a.executions {
            *ca.entry(a.functions.get(e.function).name.clone())
                .or_insert(0i64) += 1;
        }
        for e in &b.executions {
            *ca.entry(b.functions.get(e.function).name.clone())
                .or_insert(0i64) -= 1;
        }
        ca.retain(|_, v| *v != 0);
        println!("{:?} {:?} {:?}", ca, a.warnings, b.warnings);
        assert!(ca.is_empty());
    }

    /// Real events, mutated (structural characters, digits, quotes,
    /// escapes put anywhere): where both paths read an event, they read the
    /// same one (same end, fields alike, times within f64's rounding); the
    /// fast path hands over what it does not find easy, and never panics.
    /// Issue 32: keep the equivalence with the serde path.
    #[test]
    fn fast_path_reads_mutated_events_as_the_serde_path_or_hands_them_over() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/kineto/single");
        let mut events: Vec<String> = Vec::new();
        for name in [
            "b200-eager-rank0of8.json.gz",
            "a100-nccl-rank0of2.json.gz",
            "mi250-rocm.json.gz",
        ] {
            let mut text = String::new();
            MultiGzDecoder::new(File::open(dir.join(name)).unwrap())
                .read_to_string(&mut text)
                .unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            let all = v["traceEvents"].as_array().unwrap();
            // Every kind of event: a stride through the file.
            let stride = (all.len() / 400).max(1);
            events.extend(all.iter().step_by(stride).map(|e| e.to_string()));
        }
        let alphabet = b"{}[]\",:\\0123456789.-eE \nXa";
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut read, mut handed_over, mut lenient) = (0, 0, 0);
        for round in 0..20_000 {
            let mut text = events[round % events.len()].clone().into_bytes();
            for _ in 0..1 + next() % 3 {
                let at = (next() as usize) % text.len();
                let c = alphabet[(next() as usize) % alphabet.len()];
                match next() % 3 {
                    0 => text[at] = c,
                    1 => text.insert(at, c),
                    _ => {
                        text.remove(at);
                    }
                }
                if text.is_empty() {
                    text.push(b'{');
                }
            }
            // The window goes on past the event, as in a file.
            text.extend_from_slice(b",\n{\"ph\":\"X\"}]}");
            let mut fast = RawEvent::default();
            let fast_end = match fast::event(&text, &mut fast) {
                fast::Fast::Done((), n) => n,
                _ => {
                    handed_over += 1;
                    continue;
                }
            };
            let shown = String::from_utf8_lossy(&text).into_owned();
            // Values the fast path skips are only balanced, not checked:
            // a mutation inside one (`[[1],7[]]`) is read past by it and
            // refused by serde. Only events both read are compared.
            let Ok((general, general_end)) = one::<RawEvent>(&text) else {
                lenient += 1;
                continue;
            };
            read += 1;
            assert_eq!(fast_end, general_end, "round {round}: {shown}");
            let text_of = |e: &RawEvent| {
                let a = e.args.as_ref();
                format!(
                    "{:?}{:?}{:?}{:?}{:?}{:?}",
                    (&e.ph, &e.cat, &e.name, e.pid.key(), e.tid.key()),
                    a.map(|a| &a.collective),
                    a.map(|a| &a.dtype),
                    a.map(|a| &a.pg_name),
                    a.map(|a| &a.pg_ranks),
                    e.args.is_some()
                )
            };
            assert_eq!(text_of(&fast), text_of(&general), "round {round}: {shown}");
            // Numbers: the fast path keeps three decimals exactly, serde an f64.
            let nums = |e: &RawEvent| {
                e.args.as_ref().map(|a| {
                    [
                        a.occupancy,
                        a.bandwidth,
                        a.py_id,
                        a.py_parent,
                        a.in_nelems,
                        a.out_nelems,
                        a.group_size,
                        a.device,
                        a.stream,
                    ]
                    .map(|n| n.us_to_ns())
                })
            };
            if let (Some(x), Some(y)) = (nums(&fast), nums(&general)) {
                for (a, b) in x.iter().zip(&y) {
                    match (a, b) {
                        (Some(a), Some(b)) => assert!((a - b).abs() <= 1, "round {round}: {shown}"),
                        _ => assert_eq!(a, b, "round {round}: {shown}"),
                    }
                }
            }
            for (x, y) in [(fast.ts, general.ts), (fast.dur, general.dur)] {
                match (x.us_to_ns(), y.us_to_ns()) {
                    (Some(a), Some(b)) => assert!((a - b).abs() <= 500, "round {round}: {shown}"),
                    (a, b) => assert_eq!(a, b, "round {round}: {shown}"),
                }
            }
        }
        eprintln!(
            "{read} read alike, {handed_over} handed over, {lenient} read past a bad skipped value"
        );
        assert!(
            read > 2_000 && handed_over > 2_000,
            "{read} read, {handed_over} handed over"
        );
    }

    /// The fast path and the general (serde) path read every fixture alike
    /// (timestamps within f64's rounding of the general path).
    #[test]
    fn fast_path_matches_general_path() {
        let dir = std::env::var_os("WHYSLOW_FIXTURES")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures")
            })
            .join("kineto");
        let rd = std::fs::read_dir(dir.join("single"))
            .unwrap_or_else(|e| panic!("fixtures not found at {}: {e}", dir.display()));
        let mut files: Vec<_> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.push(dir.join("hta-sampled-128rank/rank-0.json.gz"));
        for f in files {
            let read = |fast: bool| {
                let file = File::open(&f).unwrap();
                let gz = MultiGzDecoder::new(BufReader::new(file));
                read_stream(gz, &f, &ReadOptions::default(), true, fast).unwrap()
            };
            let (a, b) = (read(true), read(false));
            assert_eq!(a.executions.len(), b.executions.len(), "{}", f.display());
            assert_eq!(a.functions.len(), b.functions.len(), "{}", f.display());
            assert_eq!(a.steps.len(), b.steps.len());
            assert_eq!(a.training_thread, b.training_thread);
            assert_eq!(a.meta, b.meta);
            assert_eq!(a.device, b.device);
            for (x, y) in a.executions.iter().zip(&b.executions) {
                let (fx, fy) = (a.functions.get(x.function), b.functions.get(y.function));
                assert_eq!(fx, fy);
                assert!(
                    (x.start_ns - y.start_ns).abs() <= 250,
                    "{} {x:?} {y:?}",
                    f.display()
                );
                assert!(
                    (x.end_ns - y.end_ns).abs() <= 500,
                    "{} {x:?} {y:?}",
                    f.display()
                );
                assert_eq!(x.thread, y.thread);
                let same = (x.trace_util.is_nan() && y.trace_util.is_nan())
                    || (x.trace_util - y.trace_util).abs() < 1e-3;
                assert!(same, "{} {x:?} {y:?} {}", f.display(), fx.name);
            }
        }
    }
}
