//! Throughput of the streamed Kineto reader on one thread.
//!
//! Builds a large uncompressed trace by repeating a fixture's `traceEvents`
//! (each copy shifted in time) and times `read_kineto` on it.
//!
//! ```text
//! cargo run --release -p whyslow-ingest --example bench_kineto -- \
//!     [FIXTURE.json(.gz)] [TARGET_BYTES] [OUT.json]
//! ```
//! Defaults: the `a100-nccl-rank0of2` fixture, 1.1 GB, `/tmp/whyslow-bench-kineto.json`
//! (reused when it already exists with the target size or more).
//! Peak RSS: run the built binary under `/usr/bin/time -v`.

use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let fixture = args.next().map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../tests/fixtures/kineto/single/a100-nccl-rank0of2.json.gz")
    });
    let target: u64 = args
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_100_000_000);
    let out = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/whyslow-bench-kineto.json"));

    let have = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    // A `.gz` OUT is taken as is (make it with `gzip -k` from a built file).
    let gz = out.extension().is_some_and(|e| e == "gz");
    if gz && have == 0 {
        eprintln!("{} does not exist", out.display());
        std::process::exit(1);
    }
    if !gz && have < target {
        build(&fixture, target, &out);
    } else {
        eprintln!("reusing {} ({} bytes)", out.display(), have);
    }
    let bytes = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    // Throughput is per decompressed byte: for a `.gz`, the plain file's size.
    let json_bytes = if gz {
        std::fs::metadata(out.with_extension("")).map_or(bytes, |m| m.len())
    } else {
        bytes
    };

    let c0 = thread_cpu_ns();
    let t0 = Instant::now();
    let trace = match whyslow_ingest::read_kineto(&out) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    };
    let secs = t0.elapsed().as_secs_f64();
    let cpu = (thread_cpu_ns() - c0) as f64 / 1e9;
    // Count the events in the file: every copy has the fixture's event count.
    let events = count_events(&out);
    println!(
        "file {} bytes ({} bytes of JSON), {} events, {} executions, {} functions",
        bytes,
        json_bytes,
        events,
        trace.executions.len(),
        trace.functions.len()
    );
    println!(
        "read_kineto: {:.2} s, {:.2} M events/s, {:.0} MB/s",
        secs,
        events as f64 / secs / 1e6,
        json_bytes as f64 / secs / 1e6
    );
    if cpu > 0.0 {
        println!(
            "  on-CPU time of the reading thread: {:.2} s -> {:.2} M events/s, {:.0} MB/s per core",
            cpu,
            events as f64 / cpu / 1e6,
            json_bytes as f64 / cpu / 1e6
        );
    }
}

/// CPU time of this thread, ns (Linux `/proc/thread-self/schedstat`; 0 elsewhere).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Events in the generated file (stored next to it by `build`).
fn count_events(out: &std::path::Path) -> u64 {
    let plain = if out.extension().is_some_and(|e| e == "gz") {
        out.with_extension("")
    } else {
        out.to_path_buf()
    };
    std::fs::read_to_string(plain.with_extension("events"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn build(fixture: &std::path::Path, target: u64, out: &std::path::Path) {
    eprintln!("building {} from {}", out.display(), fixture.display());
    let mut raw = Vec::new();
    let f = std::fs::File::open(fixture).expect("open fixture");
    let mut gz = flate2::read::MultiGzDecoder::new(f);
    if gz.read_to_end(&mut raw).is_err() {
        raw = std::fs::read(fixture).expect("read fixture");
    }
    let v: serde_json::Value = serde_json::from_slice(&raw).expect("fixture JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents").clone();
    let mut lo = f64::MAX;
    let mut hi = f64::MIN;
    // Each event as (ts, the rest of its JSON object without ts); Python
    // events are kept whole so that each copy gets its own Python ids.
    let mut parts: Vec<(f64, String, Option<serde_json::Value>)> = Vec::with_capacity(events.len());
    for mut e in events {
        let py = e.get("args").and_then(|a| a.get("Python id")).is_some();
        let ts = e.get("ts").and_then(|t| t.as_f64());
        if let Some(obj) = e.as_object_mut() {
            obj.remove("ts");
        }
        let s = serde_json::to_string(&e).expect("serialize");
        if let Some(ts) = ts {
            lo = lo.min(ts);
            hi = hi.max(ts + e.get("dur").and_then(|d| d.as_f64()).unwrap_or(0.0));
        }
        parts.push((ts.unwrap_or(f64::NAN), s, py.then_some(e)));
    }
    let period = (hi - lo).max(1.0) * 1.01;
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(out).expect("create"));
    let mut meta = v.clone();
    if let Some(o) = meta.as_object_mut() {
        o.remove("traceEvents");
    }
    let meta = serde_json::to_string(&meta).expect("meta");
    // `{"traceEvents":[ ... ], <other top-level keys>}`
    write!(w, "{{\"traceEvents\":[").unwrap();
    let mut written: u64 = 0;
    let mut n: u64 = 0;
    let mut copy = 0u64;
    let mut first = true;
    while written < target {
        let shift = copy as f64 * period;
        for (ts, rest, py) in &parts {
            let sep = if first { "" } else { ",\n" };
            first = false;
            let shifted: String;
            let rest = match py {
                Some(e) => {
                    let mut e = e.clone();
                    for k in ["Python id", "Python parent id"] {
                        if let Some(v) = e["args"].get_mut(k) {
                            if let Some(id) = v.as_u64() {
                                *v = serde_json::Value::from(id + copy * 1_000_000_000);
                            }
                        }
                    }
                    shifted = serde_json::to_string(&e).expect("serialize");
                    &shifted
                }
                None => rest,
            };
            let line = if ts.is_nan() {
                format!("{sep}{rest}")
            } else if rest == "{}" {
                format!("{sep}{{\"ts\":{:.3}}}", ts + shift)
            } else {
                format!("{sep}{{\"ts\":{:.3},{}", ts + shift, &rest[1..])
            };
            w.write_all(line.as_bytes()).unwrap();
            written += line.len() as u64;
            n += 1;
        }
        copy += 1;
    }
    if meta == "{}" {
        write!(w, "]}}").unwrap();
    } else {
        write!(w, "],{}", &meta[1..]).unwrap();
    }
    w.flush().unwrap();
    std::fs::write(out.with_extension("events"), n.to_string()).unwrap();
    eprintln!("wrote {written} bytes, {n} events, {copy} copies");
}
