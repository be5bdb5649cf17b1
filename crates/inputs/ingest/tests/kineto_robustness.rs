//! The Kineto reader on drifted, broken and hostile inputs: never a panic,
//! errors that say where, bounded memory.

mod common;

use std::io::{Read, Write};

use common::{count, fixtures};
use whyslow_ingest::{
    read_kineto, read_kineto_from_reader, read_kineto_from_reader_with, ErrorKind, Location,
    ReadOptions,
};
use whyslow_model::{FunctionKind::*, RankSource};

fn read(s: &str) -> Result<whyslow_model::WorkerTrace, whyslow_ingest::IngestError> {
    read_kineto_from_reader(s.as_bytes(), "test-rank-7.json")
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn drifted_formats() {
    let t = read(
        r#"{"traceEvents":[
        {"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":1000,"dur":5,"args":{"device":0,"stream":7,"est. achieved occupancy %":50}},
        {"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":1010.123,"dur":2.5,"args":{"device":0,"stream":7}},
        {"ph":"X","cat":"cpu_op","name":"aten::mm","pid":1,"tid":1,"ts":999,"dur":20},
        {"ph":"X","cat":"cpu_op","name":"no duration","pid":1,"tid":1,"ts":999},
        {"ph":"B","name":"begin","pid":1,"tid":1,"ts":1},
        {"ph":"E","pid":1,"tid":1,"ts":2},
        {"ph":"s","cat":"ac2g","id":18446744073709551615,"pid":1,"tid":1,"ts":1000},
        {"ph":"f","cat":"async_cpu_to_gpu","id":"0xdeadbeef","pid":1,"tid":1,"ts":1000,"bp":"e"},
        {"ph":"i","name":"instant","pid":"","tid":"","ts":1.5,"s":"g"},
        {"ph":"M","name":"thread_name","pid":1,"tid":1,"args":{"name":"main"}},
        {"ph":"C","name":"counter","pid":1,"ts":5,"args":{"v":1}},
        {"ph":"X","cat":"user_annotation","name":"ProfilerStep#3","pid":1,"tid":1,"ts":990,"dur":100}
        ],
        "displayTimeUnit":"ns",
        "distributedInfo":{"rank":5,"world_size":16}}"#,
    )
    .unwrap();
    assert_eq!(t.meta.rank, 5);
    assert_eq!(t.meta.rank_source, RankSource::Trace);
    assert_eq!(count(&t, GpuKernel), 2);
    assert_eq!(count(&t, CpuOp), 1);
    assert_eq!(t.steps, vec![(3, 990_000, 1_090_000)]);
    let k: Vec<_> = t
        .executions
        .iter()
        .filter(|e| t.functions.get(e.function).kind == GpuKernel)
        .collect();
    assert_eq!(k[0].start_ns, 1_000_000);
    assert_eq!(k[0].trace_util, 0.5);
    assert_eq!((k[1].start_ns, k[1].end_ns), (1_010_123, 1_012_623));
    assert!(k[1].trace_util.is_nan());
    // GPU and CPU lanes are distinct even with equal pid/tid numbers.
    assert_ne!(
        k[0].thread,
        t.executions
            .iter()
            .find(|e| t.functions.get(e.function).kind == CpuOp)
            .unwrap()
            .thread
    );
    assert!(t.warnings.iter().any(|w| w.contains("without a duration")));
    assert!(t.warnings.iter().any(|w| w.contains("B/E")));
}

#[test]
fn python_ids_of_any_shape_and_forward_parents() {
    let t = read(
        r#"{"traceEvents":[
        {"ph":"X","cat":"python_function","name":"leaf","pid":1,"tid":1,"ts":2,"dur":1,"args":{"Python id":"18446744073709551615","Python parent id":18446744073709551614}},
        {"ph":"X","cat":"python_function","name":"mid","pid":1,"tid":1,"ts":1,"dur":3,"args":{"Python id":18446744073709551614,"Python parent id":1.0}},
        {"ph":"X","cat":"python_function","name":"root","pid":1,"tid":1,"ts":0,"dur":5,"args":{"Python id":1,"Python parent id":null}},
        {"ph":"X","cat":"python_function","name":"cyc","pid":1,"tid":1,"ts":0,"dur":5,"args":{"Python id":9,"Python parent id":9}}
        ]}"#,
    )
    .unwrap();
    let mut names: Vec<_> = t.functions.iter().map(|(_, f)| f.name.clone()).collect();
    names.sort();
    assert_eq!(names, vec!["cyc", "root", "root;mid", "root;mid;leaf"]);
    assert_eq!(t.meta.rank, 7); // from the name "test-rank-7.json"
    assert_eq!(t.meta.rank_source, RankSource::FileName);
}

#[test]
fn invalid_utf8_names_are_replaced() {
    let mut s = br#"{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"bad"#.to_vec();
    s.extend_from_slice(&[0xff, 0xfe]);
    s.extend_from_slice(br#"name","pid":1,"tid":1,"ts":1,"dur":1,"args":{"x":"#);
    s.extend_from_slice(&[b'"', 0xc3, b'"']);
    s.extend_from_slice(br#"}}]}"#);
    let t = read_kineto_from_reader(&s[..], "x.json").unwrap();
    assert_eq!(t.executions.len(), 1);
    assert_eq!(
        t.functions.get(t.executions[0].function).name,
        "bad\u{fffd}\u{fffd}name"
    );
}

#[test]
fn malformed_event_skipped_unless_strict() {
    let s = r#"{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1},
        {"ph":"X","name":"b","ts":tru,"dur":1},
        {"ph":"X","cat":"cpu_op","name":"c","pid":1,"tid":1,"ts":3,"dur":1}]}"#;
    let t = read(s).unwrap();
    assert_eq!(t.executions.len(), 2);
    assert!(t.warnings.iter().any(|w| w.contains("malformed")));
    let e = read_kineto_from_reader_with(s.as_bytes(), "x.json", &ReadOptions { strict: true })
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Syntax);
}

/// A gloo job's collectives run over sockets: a 4-rank job (one rank per
/// host in whyslow's testbed) must not be taken for an intra-host NVLink job
/// just because its world is small (PerfTracker §4.2: inter-host collectives
/// are governed by the NIC).
#[test]
fn gloo_backend_collectives_use_the_nic() {
    let trace = |backend: &str| {
        format!(
            r#"{{"distributedInfo":{{"backend":"{backend}","rank":1,"world_size":4}},
            "traceEvents":[{{"ph":"X","cat":"cpu_op","name":"c10d::allreduce_","pid":1,"tid":1,"ts":1,"dur":5}}]}}"#
        )
    };
    let resource = |backend: &str| {
        let t = read(&trace(backend)).unwrap();
        t.functions.get(t.executions[0].function).resource
    };
    assert_eq!(resource("gloo"), whyslow_model::Resource::Nic);
    assert_eq!(resource("nccl"), whyslow_model::Resource::Nvlink);
}

#[test]
fn metadata_after_events_and_bare_array() {
    let t = read(r#"{"traceEvents":[{"ph":"X","cat":"kernel","name":"ncclKernel_AllReduce","pid":0,"tid":1,"ts":1,"dur":1,"args":{"Process Group Name":"3"}}],
        "deviceProperties":[{"id":0,"name":"NVIDIA H100 80GB HBM3"}],
        "distributedInfo":{"rank":9,"world_size":64,"pg_config":[{"pg_name":"3","ranks":[8,9,10,11]}]}}"#)
        .unwrap();
    assert_eq!(t.meta.rank, 9);
    assert_eq!(t.device.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    let f = t.functions.get(t.executions[0].function);
    assert_eq!(
        (f.kind, f.resource),
        (Comm, whyslow_model::Resource::Nvlink)
    );
    let t =
        read(r#"[{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1}]"#).unwrap();
    assert_eq!(t.executions.len(), 1);
}

#[test]
fn errors_say_where() {
    let e = read("").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Content);
    assert!(
        e.to_string()
            .starts_with("test-rank-7.json: byte offset 0: empty file"),
        "{e}"
    );
    let e = read("hello world").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Syntax);
    assert!(e.to_string().contains("not JSON"), "{e}");
    let e = read(r#"{"schemaVersion": 1, "other": [1,2,{"a":"}"}]}"#).unwrap_err();
    assert!(e.to_string().contains("traceEvents"), "{e}");
    let e = read(r#"{"traceEvents": [{"ph":"X"}, ]}"#).unwrap_err();
    assert_eq!(e.location, Location::ByteOffset(29));
    assert_eq!(e.to_string().lines().count(), 1);
    // Unreadable file.
    let e = read_kineto(std::path::Path::new("/nonexistent/rank-0.json")).unwrap_err();
    assert_eq!((e.kind, e.location), (ErrorKind::Io, Location::File));
}

#[test]
fn truncated_gzip() {
    let full = br#"{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1},{"ph":"X","cat":"cpu_op","name":"b","pid":1,"tid":1,"ts":2,"dur":1}]}"#;
    let z = gz(full);
    assert_eq!(
        read_kineto_from_reader(&z[..], "a.json.gz")
            .unwrap()
            .executions
            .len(),
        2
    );
    // Cut the compressed stream: with events read, kept with a warning; strict: error.
    let cut = &z[..z.len() - 12];
    let t = read_kineto_from_reader(cut, "a.json.gz").unwrap();
    assert!(
        t.warnings.iter().any(|w| w.contains("truncated")),
        "{:?}",
        t.warnings
    );
    let e =
        read_kineto_from_reader_with(cut, "a.json.gz", &ReadOptions { strict: true }).unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::Compression | ErrorKind::Truncated),
        "{e}"
    );
    let e = read_kineto_from_reader(&z[..20], "a.json.gz").unwrap_err();
    println!("{e}");
}

/// A gzip file is inflated in a second thread (`readahead`): whole, cut
/// mid-stream or corrupted, a file reads exactly as the same bytes from a
/// reader do: the same events, warnings and errors, at the same offsets.
#[test]
fn a_gzip_file_reads_as_its_bytes_do_whatever_the_damage() {
    let mut body = String::from(r#"{"traceEvents":["#);
    for i in 0..40_000 {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&format!(
            r#"{{"ph":"X","cat":"cpu_op","name":"op{}","pid":1,"tid":1,"ts":{},"dur":1}}"#,
            i % 97,
            i * 2
        ));
    }
    body.push_str("]}");
    let z = gz(body.as_bytes());
    let mut corrupt = z.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0x55;
    let dir = whyslow_testkit::temp_dir("readahead");
    for (name, bytes) in [
        ("whole", z.clone()),
        ("cut", z[..z.len() * 2 / 3].to_vec()),
        ("corrupt", corrupt),
    ] {
        let path = dir.path().join(format!("{name}.json.gz"));
        std::fs::write(&path, &bytes).unwrap();
        let shown = path.display().to_string();
        for strict in [false, true] {
            let opts = ReadOptions { strict };
            let from_file = whyslow_ingest::read_kineto_with(&path, &opts);
            let from_bytes = read_kineto_from_reader_with(&bytes[..], &shown, &opts);
            match (from_file, from_bytes) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a.executions.len(), b.executions.len(), "{name}");
                    assert_eq!(a.warnings, b.warnings, "{name}");
                }
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{name}"),
                (a, b) => panic!("{name} strict={strict}: file {a:?} but bytes {b:?}"),
            }
        }
    }
}

/// A reader yielding `prefix`, then `n` filler bytes, then `suffix`, without
/// holding them.
struct Synth {
    prefix: Vec<u8>,
    n: u64,
    fill: u8,
    suffix: Vec<u8>,
    pos: u64,
}

impl Read for Synth {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let p = self.prefix.len() as u64;
        let total = p + self.n + self.suffix.len() as u64;
        if self.pos >= total {
            return Ok(0);
        }
        let mut k = 0;
        while k < buf.len() && self.pos < total {
            if self.pos < p {
                buf[k] = self.prefix[self.pos as usize];
            } else if self.pos < p + self.n {
                let m = ((p + self.n - self.pos) as usize).min(buf.len() - k);
                buf[k..k + m].fill(self.fill);
                k += m;
                self.pos += m as u64;
                continue;
            } else {
                buf[k] = self.suffix[(self.pos - p - self.n) as usize];
            }
            k += 1;
            self.pos += 1;
        }
        Ok(k)
    }
}

#[test]
fn two_gigabyte_single_line_in_bounded_memory() {
    // A 2 GiB string under an unknown key is skipped without holding it.
    let r = Synth {
        prefix: br#"{"junk":""#.to_vec(),
        n: 2 << 30,
        fill: b'a',
        suffix: br#"","traceEvents":[{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1}]}"#.to_vec(),
        pos: 0,
    };
    let t = read_kineto_from_reader(r, "big.json").unwrap();
    assert_eq!(t.executions.len(), 1);
    // A 2 GiB event is refused once it passes the per-value limit.
    let r = Synth {
        prefix: br#"{"traceEvents":[{"name":""#.to_vec(),
        n: 2 << 30,
        fill: b'a',
        suffix: br#""}]}"#.to_vec(),
        pos: 0,
    };
    let e = read_kineto_from_reader(r, "big.json").unwrap_err();
    assert_eq!(e.kind, ErrorKind::TooLarge, "{e}");
}

/// Deterministic xorshift.
fn rng(seed: &mut u64) -> u64 {
    *seed ^= *seed << 13;
    *seed ^= *seed >> 7;
    *seed ^= *seed << 17;
    *seed
}

#[test]
fn no_panic_on_truncated_mutated_and_random_bytes() {
    let mut corpus: Vec<Vec<u8>> = vec![
        br#"{"traceEvents":[{"ph":"X","cat":"kernel","name":"ncclKernel","pid":0,"tid":1,"ts":1,"dur":1,"args":{"In msg nelems":1e400,"dtype":"Float","Group size":-3,"Process Group Ranks":"[99999999999, -1]"}}]}"#.to_vec(),
        br#"{"traceEvents":[{"ph":"X","cat":"python_function","name":"a","ts":-9e300,"dur":1e300,"args":{"Python id":[1],"Python parent id":{"a":1}}}]}"#.to_vec(),
    ];
    if let Some(dir) = fixtures() {
        for f in [
            "single/cpu-only-gloo-rank34of300.pt.trace.json.gz",
            "single/mi250-rocm.json.gz",
        ] {
            let mut raw = Vec::new();
            flate2::read::MultiGzDecoder::new(
                std::fs::File::open(dir.join("kineto").join(f)).unwrap(),
            )
            .read_to_end(&mut raw)
            .unwrap();
            corpus.push(raw);
        }
    }
    let mut seed = 0x9e3779b97f4a7c15u64;
    let mut inputs: Vec<Vec<u8>> = Vec::new();
    for c in &corpus {
        for k in 0..40 {
            let cut = (c.len() * k) / 40;
            inputs.push(c[..cut].to_vec());
        }
        for _ in 0..150 {
            let mut m = c.clone();
            for _ in 0..(1 + rng(&mut seed) % 8) {
                let i = (rng(&mut seed) as usize) % m.len().max(1);
                if i < m.len() {
                    m[i] = b"{}[]\",:\\0123456789.eE-+ \xff\x00tfn"[(rng(&mut seed) % 28) as usize];
                }
            }
            inputs.push(gz(&m));
            inputs.push(m);
        }
        let z = gz(c);
        for k in 0..20 {
            let mut m = z.clone();
            let i = (rng(&mut seed) as usize) % m.len();
            m[i] ^= 1 << (k % 8);
            inputs.push(m);
        }
    }
    for n in [0usize, 1, 2, 10, 100, 1000, 10000] {
        let mut r = vec![0u8; n];
        for b in &mut r {
            *b = rng(&mut seed) as u8;
        }
        inputs.push(r.clone());
        r.insert(0, b'{');
        inputs.push(r.clone());
        if n >= 2 {
            r[0] = 0x1f;
            r[1] = 0x8b;
            inputs.push(r);
        }
    }
    let (mut ok, mut err) = (0, 0);
    for i in &inputs {
        match read_kineto_from_reader(&i[..], "fuzz.json") {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.to_string().lines().count(), 1);
                err += 1
            }
        }
    }
    println!("{} inputs: {ok} read, {err} errors", inputs.len());
}
