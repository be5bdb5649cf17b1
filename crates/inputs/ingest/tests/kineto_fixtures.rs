//! Every shared Kineto fixture loads, with sensible per-kind counts
//! (skipped with a message when the fixtures are absent).

mod common;

use std::path::{Path, PathBuf};

use common::{count, fixtures};
use whyslow_ingest::read_kineto;
use whyslow_model::{FunctionKind::*, RankSource, Resource, WorkerTrace};

fn load(rel: &str) -> Option<WorkerTrace> {
    let dir = fixtures()?;
    let p = dir.join("kineto").join(rel);
    Some(read_kineto(&p).unwrap_or_else(|e| panic!("{e}")))
}

fn walk(d: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.to_string_lossy().ends_with(".gz") || p.to_string_lossy().ends_with(".json") {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn every_fixture_loads() {
    let Some(dir) = fixtures() else { return };
    let files = walk(&dir.join("kineto"));
    assert!(
        files.len() >= 12,
        "expected the 12 Kineto fixtures, found {}",
        files.len()
    );
    for f in files {
        let t = read_kineto(&f).unwrap_or_else(|e| panic!("{e}"));
        println!(
            "{}: rank {} ({:?}) device {:?} gpu {} memory {} comm {} python {} cpu_op {} functions {} steps {} training_thread {:?}",
            f.file_name().unwrap().to_string_lossy(),
            t.meta.rank,
            t.meta.rank_source,
            t.device,
            count(&t, GpuKernel),
            count(&t, Memory),
            count(&t, Comm),
            count(&t, Python),
            count(&t, CpuOp),
            t.functions.len(),
            t.steps.len(),
            t.training_thread,
        );
        assert!(!t.executions.is_empty(), "{}: no executions", f.display());
        assert!(
            t.training_thread.is_some(),
            "{}: no training thread",
            f.display()
        );
        assert!(t.span.0 < t.span.1);
        for e in &t.executions {
            assert!(e.end_ns >= e.start_ns);
            assert!(e.start_ns >= t.span.0 && e.end_ns <= t.span.1);
            assert!(e.trace_util.is_nan() || (0.0..=1.0).contains(&e.trace_util));
            let _ = t.functions.get(e.function);
        }
        for w in t.steps.windows(2) {
            assert!(w[0].1 <= w[1].1);
        }
    }
}

#[test]
fn hta_128_rank_nccl() {
    let Some(t) = load("hta-sampled-128rank/rank-0.json.gz") else {
        return;
    };
    assert_eq!(t.meta.rank, 0);
    assert_eq!(t.meta.rank_source, RankSource::Trace);
    assert_eq!(count(&t, GpuKernel), 1144);
    assert_eq!(count(&t, Memory), 50);
    assert_eq!(count(&t, Comm), 38);
    assert_eq!(count(&t, Python), 0);
    assert_eq!(
        t.steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        vec![551, 552]
    );
    // 128 ranks, no group ranks on the kernels: inter-host.
    for (_, f) in t.functions.iter().filter(|(_, f)| f.kind == Comm) {
        assert_eq!(f.resource, Resource::Nic, "{}", f.name);
    }
    let t1 = load("hta-sampled-128rank/rank-1.json.gz").unwrap();
    assert_eq!(t1.meta.rank, 1);
    // ProfilerStep#551 starts ~192 µs apart on the two ranks (fixture README).
    let d = (t1.steps[0].1 - t.steps[0].1).abs();
    assert!((150_000..250_000).contains(&d), "{d}");
}

#[test]
fn a100_nccl_collectives() {
    let Some(t) = load("single/a100-nccl-rank0of2.json.gz") else {
        return;
    };
    assert_eq!(t.device.as_deref(), Some("NVIDIA A100-PG509-200"));
    assert_eq!(count(&t, GpuKernel), 2679);
    assert_eq!(count(&t, Comm), 90);
    assert_eq!(t.steps.len(), 3);
    let kernels: Vec<_> = t
        .executions
        .iter()
        .filter(|e| {
            let f = t.functions.get(e.function);
            f.kind == Comm && f.name.starts_with("ncclKernel")
        })
        .collect();
    assert_eq!(kernels.len(), 21);
    // Group [0, 1] on one host: NVLink; bus bandwidth known from message sizes.
    for e in &kernels {
        let f = t.functions.get(e.function);
        assert_eq!(f.resource, Resource::Nvlink, "{}", f.name);
        assert!(
            e.trace_util.is_finite() && e.trace_util > 0.0,
            "{}",
            e.trace_util
        );
    }
    // CPU-side collectives are Comm too.
    assert!(t
        .functions
        .iter()
        .any(|(_, f)| f.kind == Comm && f.name == "record_param_comms"));
    assert!(t
        .functions
        .iter()
        .any(|(_, f)| f.kind == Comm && f.name == "c10d::allreduce_"));
    // Kernel occupancy is carried.
    assert!(t
        .executions
        .iter()
        .any(|e| t.functions.get(e.function).kind == GpuKernel && e.trace_util.is_finite()));
}

#[test]
fn gloo_cpu_only() {
    let Some(t) = load("single/cpu-only-gloo-rank34of300.pt.trace.json.gz") else {
        return;
    };
    assert_eq!(t.meta.rank, 34);
    assert_eq!(count(&t, Comm), 10);
    assert_eq!(count(&t, GpuKernel), 0);
    assert_eq!(count(&t, CpuOp), 4);
    assert_eq!(t.steps, vec![(551, t.steps[0].1, t.steps[0].2)]);
    for (_, f) in t.functions.iter().filter(|(_, f)| f.kind == Comm) {
        assert_eq!(f.name, "gloo:all_reduce");
        assert_eq!(f.resource, Resource::Nic);
    }
    // The training thread is the one with ProfilerStep, not the gloo threads.
    let tt = t.training_thread.unwrap();
    let cpu_ops: Vec<_> = t
        .executions
        .iter()
        .filter(|e| t.functions.get(e.function).kind == CpuOp)
        .collect();
    assert!(cpu_ops.iter().all(|e| e.thread == tt));
}

#[test]
fn b200_python_stacks() {
    let Some(t) = load("single/b200-eager-rank0of8.json.gz") else {
        return;
    };
    assert_eq!(t.device.as_deref(), Some("NVIDIA B200"));
    assert_eq!(count(&t, Python), 15230);
    assert_eq!(count(&t, GpuKernel), 767);
    assert_eq!(count(&t, Comm), 4);
    let py: Vec<_> = t
        .functions
        .iter()
        .filter(|(_, f)| f.kind == Python)
        .collect();
    assert!(py.iter().all(|(_, f)| f.resource == Resource::Cpu));
    // Stacks: outermost first, `;`-joined; children extend their parent's stack.
    let deep = py
        .iter()
        .find(|(_, f)| f.name.matches(';').count() >= 3)
        .unwrap();
    assert!(deep
        .1
        .name
        .starts_with("torch/utils/_contextlib.py(117): decorate_context;"));
    let names: std::collections::HashSet<&str> = py.iter().map(|(_, f)| f.name.as_str()).collect();
    let parent = deep.1.name.rsplit_once(';').unwrap().0;
    assert!(names.contains(parent), "parent stack {parent:?} missing");
    assert!(t.warnings.iter().any(|w| w.contains("parent id absent")));
}

#[test]
fn h100_training_thread_skips_bootstrap() {
    let Some(t) = load("single/h100-qwen-0.5b.json.gz") else {
        return;
    };
    assert_eq!(t.meta.rank_source, RankSource::FileOrder);
    assert_eq!(count(&t, Python), 4262);
    let tt = t.training_thread.unwrap();
    // The training thread runs `<string>(1): <module>`, not threading's _bootstrap.
    assert!(t.executions.iter().any(|e| {
        let f = t.functions.get(e.function);
        e.thread == tt && f.kind == Python && f.name == "<string>(1): <module>"
    }));
    assert!(!t.executions.iter().any(|e| {
        let f = t.functions.get(e.function);
        e.thread == tt && f.kind == Python && f.name.starts_with("threading.py")
    }));
}

#[test]
fn amd_kernels_without_occupancy() {
    let Some(t) = load("single/mi250-rocm.json.gz") else {
        return;
    };
    assert_eq!(count(&t, GpuKernel), 14);
    assert_eq!(count(&t, Memory), 2);
    for e in &t.executions {
        if t.functions.get(e.function).kind == GpuKernel {
            assert!(e.trace_util.is_nan());
        }
    }
}

#[test]
fn ns_display_unit_reads_microseconds() {
    let Some(t) = load("single/v100-ns-resolution.pt.trace.json.gz") else {
        return;
    };
    assert_eq!(t.steps.len(), 5);
    // ProfilerStep#102 lasts 72077.474 µs.
    let s = t.steps.iter().find(|s| s.0 == 102).unwrap();
    let d = s.2 - s.1;
    assert!((d - 72_077_474).abs() < 1000, "{d}");
}

#[test]
fn old_format_and_missing_info() {
    let Some(t) = load("single/a100-rank3of8.json.gz") else {
        return;
    };
    assert_eq!(t.meta.rank, 3);
    assert_eq!(count(&t, GpuKernel), 8508);
    let t = load("single/no-distributed-info.json.gz").unwrap();
    assert_eq!(t.meta.rank_source, RankSource::FileOrder);
    assert!(t.warnings.iter().any(|w| w.contains("file order")));
    let t = load("single/v100-rank1of2.json.gz").unwrap();
    assert_eq!(t.meta.rank, 1);
    assert_eq!(t.device.as_deref(), Some("Tesla V100-SXM2-16GB"));
    let memcpy_dtod = t
        .functions
        .iter()
        .find(|(_, f)| f.name.starts_with("Memcpy DtoD"))
        .unwrap();
    assert_eq!(memcpy_dtod.1.resource, Resource::Dram);
    let htod = t
        .functions
        .iter()
        .find(|(_, f)| f.name.starts_with("Memcpy HtoD"))
        .unwrap();
    assert_eq!(htod.1.resource, Resource::Pcie);
}
