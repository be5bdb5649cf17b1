//! Generic events, samples, fingerprints, discovery and parallel reading.

mod common;

use std::path::{Path, PathBuf};

use whyslow_ingest::*;
use whyslow_model::*;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("whyslow-ingest-{}-{}", name, std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(p: &Path, s: &str) {
    std::fs::write(p, s).unwrap();
}

#[test]
fn generic_csv_and_jsonl() {
    let d = tmpdir("generic");
    let csv = d.join("events.csv");
    write(
        &csv,
        "worker,name,kind,start_us,dur_us,thread,stack,host,group,util\n\
         0,gemm,gpu_kernel,10,5,stream7,,h0,g,0.5\n\
         0,step,python,0,100,main,train.py(1): main;model.py(9): fwd,h0,g,\n\
         1,allreduce,comm,20,30.5,,,h1,,\n\
         0,aten::mm,cpu_op,1,2,main,,,,\n",
    );
    let ts = read_generic(&csv).unwrap();
    assert_eq!(ts.len(), 2);
    let t0 = &ts[0];
    assert_eq!((t0.meta.rank, t0.meta.rank_source), (0, RankSource::Trace));
    assert_eq!(t0.meta.host.as_deref(), Some("h0"));
    assert_eq!(t0.meta.group.as_deref(), Some("g"));
    assert_eq!(t0.executions.len(), 3);
    let py = t0
        .executions
        .iter()
        .find(|e| t0.functions.get(e.function).kind == FunctionKind::Python)
        .unwrap();
    assert_eq!(
        t0.functions.get(py.function).name,
        "train.py(1): main;model.py(9): fwd"
    );
    assert_eq!(t0.training_thread, Some(py.thread));
    let k = t0
        .executions
        .iter()
        .find(|e| t0.functions.get(e.function).kind == FunctionKind::GpuKernel)
        .unwrap();
    assert_eq!((k.start_ns, k.end_ns, k.trace_util), (10_000, 15_000, 0.5));
    assert_eq!(t0.functions.get(k.function).resource, Resource::Sm);
    let c = &ts[1].executions[0];
    assert_eq!(c.end_ns - c.start_ns, 30_500);
    assert_eq!(ts[1].functions.get(c.function).resource, Resource::Nic);

    let jl = d.join("events.jsonl");
    write(
        &jl,
        "{\"worker\":3,\"name\":\"f\",\"kind\":\"python\",\"start_us\":1,\"dur_us\":2}\n\n\
         {\"worker\":\"3\",\"name\":\"memcpy\",\"kind\":\"memory\",\"start_us\":\"4\",\"dur_us\":1,\"util\":1}\n",
    );
    let ts = read_generic(&jl).unwrap();
    assert_eq!(ts.len(), 1);
    assert_eq!(ts[0].meta.rank, 3);
    assert_eq!(ts[0].executions.len(), 2);

    // Errors carry the line.
    write(
        &csv,
        "worker,name,kind,start_us,dur_us\n0,a,cpu_op,1,2\n0,a,gpu,1,2\n",
    );
    let e = read_generic(&csv).unwrap_err();
    assert_eq!(e.location, Location::Line(3), "{e}");
    assert!(e.to_string().contains("unknown function kind"), "{e}");
    write(&csv, "worker,name,start_us,dur_us\n");
    let e = read_generic(&csv).unwrap_err();
    assert!(e.to_string().contains("missing column \"kind\""), "{e}");
    write(&jl, "{\"worker\":0,\"name\":\"a\",\"kind\":\"cpu_op\",\"start_us\":1,\"dur_us\":2,\"util\":2}\n");
    let e = read_generic(&jl).unwrap_err();
    assert_eq!(e.location, Location::Line(1), "{e}");
}

#[test]
fn samples() {
    let d = tmpdir("samples");
    let p = d.join("rank-2.samples.csv");
    write(&p, "resource,ts_us,value\nsm,2,0.5\nsm,1,0.25\nnic,1.5,1\n");
    let s = read_samples(&p).unwrap();
    assert_eq!(s.worker, None);
    assert_eq!(s.series[&Resource::Sm].ts_ns, vec![1000, 2000]);
    assert_eq!(s.series[&Resource::Sm].values, vec![0.25, 0.5]);
    assert_eq!(s.series[&Resource::Nic].values, vec![1.0]);
    write(&p, "resource,ts_us,value,worker\nsm,2,0.5,1\nsm,1,0.25,0\n");
    assert!(read_samples(&p).is_err());
    let all = read_samples_all(&p).unwrap();
    assert_eq!(
        all.iter().map(|w| w.worker).collect::<Vec<_>>(),
        vec![Some(0), Some(1)]
    );
    write(&p, "resource,ts_us,value\nsm,2,0.5\nsm,1,1.5\n");
    let e = read_samples(&p).unwrap_err();
    assert_eq!(e.location, Location::Line(3), "{e}");
    assert!(e.to_string().contains("[0, 1]"), "{e}");
    write(&p, "resource,ts_us,value\ngpu,2,0.5\n");
    assert!(read_samples(&p)
        .unwrap_err()
        .to_string()
        .contains("unknown resource"));
}

fn fingerprint() -> Fingerprint {
    Fingerprint {
        format: FINGERPRINT_FORMAT.into(),
        version: FINGERPRINT_VERSION,
        worker: 4,
        host: Some("h".into()),
        group: None,
        window_start_us: 1.0,
        window_us: 100.0,
        device: None,
        job: None,
        utilization_source: UtilizationSource::Trace,
        source: "x".into(),
        total_floor: 0.0,
        kernels: Vec::new(),
        steps: Vec::new(),
        omitted: Vec::new(),
        functions: vec![FunctionPattern {
            name: "a;b".into(),
            kind: FunctionKind::Python,
            resource: Resource::Cpu,
            beta: 0.5,
            mu: 0.1,
            sigma: 0.0,
            util_source: UtilizationSource::None,
            calls: 3,
            critical_us: 50.0,
            total_us: 60.0,
        }],
        warnings: vec![],
        network: None,
    }
}

#[test]
fn fingerprints_round_trip_and_reject() {
    let d = tmpdir("fp");
    let p = d.join("rank-4.fingerprint.json");
    let fp = fingerprint();
    write_fingerprint(&p, &fp).unwrap();
    let text = std::fs::read_to_string(&p).unwrap();
    assert_eq!(text.trim_end().lines().count(), 1, "compact JSON");
    assert_eq!(read_fingerprint(&p).unwrap(), fp);
    let current = format!("\"version\":{FINGERPRINT_VERSION}");
    assert!(text.contains(&current), "{text}");
    // A version 1 file (before the job identity) still reads.
    write(&p, &text.replace(&current, "\"version\":1"));
    assert_eq!(read_fingerprint(&p).unwrap().job, None);
    // With the job identity it round-trips.
    let mut with_job = fp.clone();
    with_job.job = whyslow_model::JobIdentity {
        id: Some("train-42".into()),
        world_size: Some(8),
        backend: Some("nccl".into()),
        session: None,
        ..Default::default()
    }
    .known();
    write_fingerprint(&p, &with_job).unwrap();
    assert_eq!(read_fingerprint(&p).unwrap(), with_job);
    write(&p, &text.replace(&current, "\"version\":99"));
    let e = read_fingerprint(&p).unwrap_err();
    assert!(e.to_string().contains("newer"), "{e}");
    write(&p, &text.replace("whyslow-fingerprint", "other"));
    let e = read_fingerprint(&p).unwrap_err();
    assert!(
        e.to_string().contains("expected \"whyslow-fingerprint\""),
        "{e}"
    );
    write(&p, "{\"format\":");
    assert!(read_fingerprint(&p).is_err());
}

#[test]
fn discover_and_read_traces() {
    let d = tmpdir("discover");
    std::fs::create_dir_all(d.join("sub/deeper")).unwrap();
    let ev =
        r#"{"traceEvents":[{"ph":"X","cat":"cpu_op","name":"a","pid":1,"tid":1,"ts":1,"dur":1}]}"#;
    write(&d.join("sub/rank_3.pt.trace.json"), ev);
    write(&d.join("sub/deeper/worker.json"), ev);
    write(&d.join("sub/deeper/other.json"), ev);
    write(&d.join("bad.json"), "not json");
    write(&d.join("notes.txt"), "ignored");
    write(
        &d.join("e.csv"),
        "worker,name,kind,start_us,dur_us\n0,a,cpu_op,1,2\n",
    );
    write(&d.join("x.samples.csv"), "resource,ts_us,value\n");
    write_fingerprint(&d.join("w.fingerprint.json"), &fingerprint()).unwrap();
    write_fingerprint(&d.join("plain.json"), &fingerprint()).unwrap();
    let files = discover(std::slice::from_ref(&d)).unwrap();
    let kinds: Vec<String> = files
        .iter()
        .map(|f| {
            format!("{:?}", f).split('(').next().unwrap().to_string()
                + ":"
                + &f.path().file_name().unwrap().to_string_lossy()
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "Kineto:bad.json",
            "Generic:e.csv",
            "Fingerprint:plain.json",
            "Kineto:other.json",
            "Kineto:worker.json",
            "Kineto:rank_3.pt.trace.json",
            "Fingerprint:w.fingerprint.json",
            "Samples:x.samples.csv",
        ]
    );
    assert!(discover(&[d.join("missing")]).is_err());
    let traces: Vec<PathBuf> = files
        .iter()
        .filter(|f| matches!(f, InputFile::Kineto(_) | InputFile::Generic(_)))
        .map(|f| f.path().to_path_buf())
        .collect();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let (ts, errs) = read_traces(&traces, &|n| {
        done.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(done.into_inner(), 5);
    assert_eq!(errs.len(), 1);
    assert!(errs[0].to_string().contains("bad.json"));
    let ranks: Vec<(u32, RankSource)> = ts
        .iter()
        .map(|t| (t.meta.rank, t.meta.rank_source))
        .collect();
    // e.csv worker 0 (trace), rank_3 (file name), the two others file order: 1, 2.
    assert_eq!(
        ranks,
        vec![
            (0, RankSource::Trace),
            (1, RankSource::FileOrder),
            (2, RankSource::FileOrder),
            (3, RankSource::FileName)
        ]
    );
    assert!(ts[1].warnings.iter().any(|w| w.contains("file order")));
}

#[test]
fn rank_from_names() {
    for (n, r) in [
        ("rank-3.json", Some(3)),
        ("x_rank12_y.json.gz", Some(12)),
        ("RANK_4/trace.json", Some(4)),
        ("trace.json", None),
        ("ranked.json", None),
    ] {
        assert_eq!(rank_from_file_name(Path::new(n)), r, "{n}");
    }
}

#[test]
fn one_workers_trace_or_a_clear_error() {
    let d = tmpdir("one-worker");
    let one = d.join("one.csv");
    write(
        &one,
        "worker,name,kind,start_us,dur_us\nnode-a,step,python,0,100\n",
    );
    let t = read_worker_trace(&one).unwrap();
    assert_eq!(
        (t.meta.rank, t.meta.rank_source),
        (0, RankSource::FileOrder)
    );
    assert!(t
        .warnings
        .iter()
        .any(|w| w.contains("\"node-a\" is not an integer rank")));
    let two = d.join("two.csv");
    write(
        &two,
        "worker,name,kind,start_us,dur_us\n0,step,python,0,100\n1,step,python,0,90\n",
    );
    let e = read_worker_trace(&two).unwrap_err().to_string();
    assert!(
        e.contains("two.csv") && e.contains("holds 2 workers"),
        "{e}"
    );
    let samples = d.join("x.samples.csv");
    write(&samples, "resource,ts_us,value\ncpu,0,0.5\n");
    let e = read_worker_trace(&samples).unwrap_err().to_string();
    assert!(
        e.contains("x.samples.csv") && e.contains("not a trace"),
        "{e}"
    );
}
