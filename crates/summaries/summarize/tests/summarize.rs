//! Fingerprints P = (β, μ, σ) (PerfTracker §4.2, Eq. 1–5) from plain data.

mod common;

use std::collections::BTreeMap;

use common::{Builder, Rng};
use whyslow_model::{
    FunctionKind, Resource, SampleSeries, UtilizationSource, FINGERPRINT_FORMAT,
    FINGERPRINT_VERSION,
};
use whyslow_summarize::{summarize, SummarizeOptions};

use FunctionKind::*;

fn all() -> SummarizeOptions {
    SummarizeOptions {
        beta_floor: 0.0,
        ..SummarizeOptions::default()
    }
}

/// Samples every `step` ns from `t0`, with values from `f(t)`.
fn sampled(t0: i64, t1: i64, step: i64, f: impl Fn(i64) -> f32) -> SampleSeries {
    let ts: Vec<i64> = (t0..t1).step_by(step as usize).collect();
    let values = ts.iter().map(|&t| f(t)).collect();
    SampleSeries { ts_ns: ts, values }
}

/// PerfTracker §4.2, Figure 10 / Eq. 4: a collective that arrives early waits
/// idle (with sporadic noise) before transferring; Algorithm 1 cuts the idle
/// prefix, so μ is the transfer's utilization, well above the naive average.
#[test]
fn perftracker_4_2_mu_ignores_idle_prefix_of_comm() {
    let mut b = Builder::new((0, 10_000));
    let ar = b.f(Comm, "ncclAllReduce");
    b.x(ar, 0, 10_000, 20);
    // 10 kHz-like sampling every 100 ns: idle for 6000 ns except two blips,
    // then 0.8 ± 0.1 for 4000 ns.
    let s = sampled(0, 10_000, 100, |t| match t {
        1000 | 3000 => 0.05,
        t if t < 6000 => 0.0,
        t if (t / 100) % 2 == 0 => 0.9,
        _ => 0.7,
    });
    let naive = s.values.iter().map(|&v| v as f64).sum::<f64>() / s.values.len() as f64;
    let samples = BTreeMap::from([(Resource::Nvlink, s)]);
    let fp = summarize(&b.trace, &samples, &all());
    let p = &fp.functions[0];
    assert_eq!(p.util_source, UtilizationSource::Samples);
    assert!((p.mu - 0.8).abs() < 1e-6, "μ = {}", p.mu);
    assert!((p.sigma - 0.1).abs() < 1e-6, "σ = {}", p.sigma);
    assert!(naive < 0.35 && p.mu > 2.0 * naive);
    assert_eq!(fp.utilization_source, UtilizationSource::Samples);
}

/// Eq. 4 / 5: executions are weighted by |L(e)|, not by their own duration.
#[test]
fn perftracker_4_2_mu_sigma_weighted_by_critical_duration() {
    let mut b = Builder::new((0, 3000));
    let k = b.f(GpuKernel, "gemm");
    b.x(k, 0, 1000, 7); // L = 10 samples at 0.5
    b.x(k, 1000, 3000, 7); // mostly idle; L = 5 samples alternating 1.0/0.8
    let s = sampled(0, 3000, 100, |t| match t {
        t if t < 1000 => 0.5,
        t if (2000..2500).contains(&t) => {
            if (t / 100) % 2 == 0 {
                1.0
            } else {
                0.8
            }
        }
        _ => 0.0,
    });
    let fp = summarize(&b.trace, &BTreeMap::from([(Resource::Sm, s)]), &all());
    let p = &fp.functions[0];
    // L(e2) = samples 2000..2400 = [1.0, 0.8, 1.0, 0.8, 1.0]: mean 0.92, std 0.09798
    let mean2 = 0.92;
    let std2 = (3.0 * 0.08f64.powi(2) + 2.0 * 0.12f64.powi(2)) / 5.0;
    let want_mu = (10.0 * 0.5 + 5.0 * mean2) / 15.0;
    let want_sigma = (10.0 * 0.0 + 5.0 * std2.sqrt()) / 15.0;
    assert!((p.mu - want_mu).abs() < 1e-6, "{} vs {want_mu}", p.mu);
    assert!(
        (p.sigma - want_sigma).abs() < 1e-6,
        "{} vs {want_sigma}",
        p.sigma
    );
    assert_eq!(p.calls, 2);
    assert_eq!(p.total_us, 3.0);
}

/// β (Eq. 2) per function, Σβ ≤ 1, sorted by β, floor and max_functions.
#[test]
fn perftracker_4_2_beta_sums_to_at_most_one_and_is_sorted() {
    let mut rng = Rng(5);
    for _ in 0..200 {
        let mut b = Builder::new((0, 10_000));
        let fns = [
            b.f(GpuKernel, "a"),
            b.f(GpuKernel, "b"),
            b.f(Comm, "c"),
            b.f(Memory, "m"),
            b.f(Python, "main"),
            b.f(CpuOp, "op"),
        ];
        for _ in 0..200 {
            let f = fns[rng.below(6) as usize];
            let s = rng.below(11_000) as i64 - 500;
            b.x(f, s, s + rng.below(800) as i64, rng.below(3) as u32);
        }
        let fp = summarize(&b.trace, &BTreeMap::new(), &all());
        let sum: f64 = fp.functions.iter().map(|p| p.beta).sum();
        assert!(sum <= 1.0 + 1e-9, "Σβ = {sum}");
        assert!(fp.functions.windows(2).all(|w| w[0].beta >= w[1].beta));
        for p in &fp.functions {
            assert!((0.0..=1.0).contains(&p.beta));
            assert!((p.critical_us - p.beta * fp.window_us).abs() < 1e-6);
            assert!(p.critical_us <= p.total_us + 1e-9);
        }
    }
}

#[test]
fn beta_floor_and_max_functions() {
    let mut b = Builder::new((0, 1_000_000));
    for i in 0..10 {
        let f = b.f(GpuKernel, &format!("k{i}"));
        // k_i runs 100·(i+1) ns alone: β = 1e-4·(i+1)
        b.x(f, i * 10_000, i * 10_000 + 100 * (i + 1), 7);
    }
    let fp = summarize(&b.trace, &BTreeMap::new(), &SummarizeOptions::default());
    // default floor 0.001 keeps k9 (β = 0.001) only
    let names: Vec<&str> = fp.functions.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["k9"]);
    let fp = summarize(
        &b.trace,
        &BTreeMap::new(),
        &SummarizeOptions {
            beta_floor: 0.0,
            max_functions: 3,
            steps: None,
        },
    );
    let names: Vec<&str> = fp.functions.iter().map(|p| p.name.as_str()).collect();
    // The 3 with the highest β, then up to 3 more by run time; the rest are
    // named (hashed) as omitted, each below total_floor.
    assert_eq!(names, ["k9", "k8", "k7", "k6", "k5", "k4"]);
    assert!(fp.warnings.iter().any(|w| w.contains("max_functions")));
    assert_eq!(fp.omitted.len(), 4);
    assert!((fp.total_floor - 4e-4).abs() < 1e-9, "{}", fp.total_floor);
}

/// The steps window clips executions: β, calls and total time cover only the
/// steps asked for.
#[test]
fn steps_window_clips_executions() {
    let mut b = Builder::new((0, 1000));
    b.trace.steps = vec![(1, 0, 400), (2, 400, 800), (3, 800, 1000)];
    let k = b.f(GpuKernel, "k");
    let c = b.f(Comm, "c");
    b.x(k, 100, 300, 7); // step 1 only: outside
    b.x(k, 350, 500, 7); // straddles: 100 ns inside
    b.x(c, 600, 900, 20); // 200 ns inside
    let opts = SummarizeOptions {
        steps: Some((2, 2)),
        ..all()
    };
    let fp = summarize(&b.trace, &BTreeMap::new(), &opts);
    assert_eq!(fp.window_start_us, 0.4);
    assert_eq!(fp.window_us, 0.4);
    let pk = fp.functions.iter().find(|p| p.name == "k").unwrap();
    let pc = fp.functions.iter().find(|p| p.name == "c").unwrap();
    assert_eq!((pk.calls, pk.total_us, pk.beta), (1, 0.1, 0.25));
    assert_eq!((pc.calls, pc.total_us, pc.beta), (1, 0.2, 0.5));
    assert!(fp.warnings.is_empty(), "{:?}", fp.warnings);

    // Steps not in the trace: the whole span, with a warning.
    let opts = SummarizeOptions {
        steps: Some((8, 9)),
        ..all()
    };
    let fp = summarize(&b.trace, &BTreeMap::new(), &opts);
    assert_eq!(fp.window_us, 1.0);
    assert!(fp.warnings.iter().any(|w| w.contains("not in the trace")));
}

/// Trace fallback: no sample series → duration-weighted mean and std of the
/// executions' own utilization; NaN = unknown.
#[test]
fn trace_utilization_fallback() {
    let mut b = Builder::new((0, 1000));
    let k = b.f(GpuKernel, "k");
    let c = b.f(Comm, "c");
    b.xu(k, 0, 300, 7, 0.2);
    b.xu(k, 300, 400, 7, 0.6);
    b.xu(k, 400, 500, 7, f32::NAN);
    b.xu(c, 500, 600, 20, f32::NAN);
    let fp = summarize(&b.trace, &BTreeMap::new(), &all());
    let pk = fp.functions.iter().find(|p| p.name == "k").unwrap();
    let mu = (300.0 * 0.2 + 100.0 * 0.6) / 400.0;
    let var = (300.0 * 0.04 + 100.0 * 0.36) / 400.0 - mu * mu;
    assert_eq!(pk.util_source, UtilizationSource::Trace);
    assert!((pk.mu - mu).abs() < 1e-6);
    assert!((pk.sigma - f64::sqrt(var)).abs() < 1e-6);
    let pc = fp.functions.iter().find(|p| p.name == "c").unwrap();
    assert_eq!(pc.util_source, UtilizationSource::None);
    assert_eq!((pc.mu, pc.sigma), (0.0, 0.0));
    assert_eq!(fp.utilization_source, UtilizationSource::Trace);

    // A series exists but the kernels are shorter than the sampling period:
    // still the trace fallback.
    let s = SampleSeries {
        ts_ns: vec![350, 950],
        values: vec![0.9, 0.9],
    };
    let fp = summarize(&b.trace, &BTreeMap::from([(Resource::Sm, s)]), &all());
    let pk = fp.functions.iter().find(|p| p.name == "k").unwrap();
    assert_eq!(pk.util_source, UtilizationSource::Samples); // sample at 350 is inside
    assert!((pk.mu - 0.9).abs() < 1e-6);
    let s = SampleSeries {
        ts_ns: vec![950],
        values: vec![0.9],
    };
    let fp = summarize(&b.trace, &BTreeMap::from([(Resource::Sm, s)]), &all());
    let pk = fp.functions.iter().find(|p| p.name == "k").unwrap();
    assert_eq!(pk.util_source, UtilizationSource::Trace);
}

/// No panics on degenerate input; warnings say why the fingerprint is empty.
#[test]
fn degenerate_inputs() {
    let b = Builder::new((0, 0));
    let fp = summarize(&b.trace, &BTreeMap::new(), &SummarizeOptions::default());
    assert!(fp.functions.is_empty());
    assert_eq!(fp.window_us, 0.0);
    assert!(!fp.warnings.is_empty());
    assert_eq!(fp.format, FINGERPRINT_FORMAT);
    assert_eq!(fp.version, FINGERPRINT_VERSION);

    let mut b = Builder::new((100, 200));
    b.trace.warnings.push("from ingest".into());
    let k = b.f(GpuKernel, "k");
    b.x(k, 300, 400, 7);
    let fp = summarize(&b.trace, &BTreeMap::new(), &all());
    assert_eq!(fp.warnings[0], "from ingest");
    assert!(fp.warnings.iter().any(|w| w == "window has no executions"));

    // NaN floor, garbage samples (NaN, unsorted, length mismatch).
    let mut b = Builder::new((0, 1000));
    let k = b.f(GpuKernel, "k");
    b.xu(k, 0, 1000, 7, f32::INFINITY);
    let s = SampleSeries {
        ts_ns: vec![500, 100, 300, 900],
        values: vec![f32::NAN, 2.0, -1.0],
    };
    let opts = SummarizeOptions {
        beta_floor: f64::NAN,
        max_functions: 0,
        steps: Some((3, 1)),
    };
    let fp = summarize(
        &b.trace,
        &BTreeMap::from([(Resource::Sm, s.clone())]),
        &opts,
    );
    assert!(fp.functions.is_empty());
    let fp = summarize(&b.trace, &BTreeMap::from([(Resource::Sm, s)]), &all());
    let p = &fp.functions[0];
    assert_eq!(p.util_source, UtilizationSource::Samples);
    assert_eq!(p.mu, 1.0); // only the sample at 100 (2.0 → clamped to 1) is non-zero
    assert!(fp.warnings.iter().any(|w| w.contains("not ascending")));
}

/// Metadata is copied from the trace.
#[test]
fn metadata() {
    let mut b = Builder::new((2_000, 12_000));
    b.trace.meta.rank = 7;
    b.trace.meta.group = Some("stage-1".into());
    b.trace.device = Some("NVIDIA H100".into());
    let k = b.f(GpuKernel, "k");
    b.x(k, 2_000, 12_000, 7);
    let fp = summarize(&b.trace, &BTreeMap::new(), &SummarizeOptions::default());
    assert_eq!(fp.worker, 7);
    assert_eq!(fp.host.as_deref(), Some("node-0"));
    assert_eq!(fp.group.as_deref(), Some("stage-1"));
    assert_eq!(fp.device.as_deref(), Some("NVIDIA H100"));
    assert_eq!(fp.source, "rank-0.json");
    assert_eq!((fp.window_start_us, fp.window_us), (2.0, 10.0));
    assert_eq!(fp.functions[0].beta, 1.0);
}

/// PerfTracker §4.2 / Figure 11b: 20 functions with 1000-character Python
/// stacks fit in 30 KB of JSON.
#[test]
fn perftracker_4_2_fingerprint_with_long_stacks_is_under_30kb() {
    let mut b = Builder::new((0, 20_000_000_000));
    let frame = "site-packages/torch/nn/modules/module.py(1527): _call_impl;";
    for i in 0..20 {
        let mut stack = format!("train.py({i}): main;");
        while stack.len() < 1000 {
            stack.push_str(frame);
        }
        stack.truncate(1000);
        let f = b.f(Python, &stack);
        b.xu(
            f,
            i * 1_000_000_000,
            i * 1_000_000_000 + 333_333_333,
            1,
            0.123_456,
        );
    }
    let fp = summarize(&b.trace, &BTreeMap::new(), &SummarizeOptions::default());
    assert_eq!(fp.functions.len(), 20);
    let json = serde_json::to_string(&fp).unwrap();
    assert!(json.len() <= 30 * 1024, "{} bytes", json.len());
    let back: whyslow_model::Fingerprint = serde_json::from_str(&json).unwrap();
    assert_eq!(back, fp);
}
