//! Renders a synthetic job with PerfTracker Figure 7's three problems (slow
//! data loading on all workers, a slow link on worker 7, GPU throttling on
//! workers 0-3) as a terminal table and an HTML page.
//!
//! ```text
//! cargo run -p whyslow-report --example demo_report -- [out.html]
//! ```
use whyslow_localize::{localize, LocalizeConfig};
use whyslow_model::{
    Fingerprint, FunctionKind, FunctionPattern, Resource, UtilizationSource, FINGERPRINT_FORMAT,
    FINGERPRINT_VERSION,
};

/// ±1 noise, a stream per `seed`.
fn jitter(seed: u64) -> f64 {
    whyslow_model::rng::SplitMix64::new(seed).symmetric()
}

fn pat(
    kind: FunctionKind,
    resource: Resource,
    name: &str,
    b: f64,
    m: f64,
    s: f64,
) -> FunctionPattern {
    FunctionPattern {
        name: name.into(),
        kind,
        resource,
        beta: b,
        mu: m,
        sigma: s,
        util_source: UtilizationSource::Samples,
        calls: 100,
        critical_us: b * 20e6,
        total_us: b * 24e6,
    }
}

fn main() {
    let fps: Vec<Fingerprint> = (0..64u32)
        .map(|w| {
            let j = |i: u64| 1.0 + 0.03 * jitter(u64::from(w) * 100 + i);
            let (mut gb, mut gm) = (0.3 * j(1), 0.95 * j(2));
            if w < 4 {
                gb *= 1.6;
                gm *= 0.35;
            }
            let (mut cm, mut cs) = (0.6 * j(3), 0.3 * j(4));
            if w == 7 {
                cm = 0.37;
                cs = 0.05;
            }
            Fingerprint {
                format: FINGERPRINT_FORMAT.into(),
                version: FINGERPRINT_VERSION,
                worker: w,
                host: Some(format!("node{:02}", w / 8)),
                group: None,
                window_start_us: 0.0,
                window_us: 20e6,
                device: None,
                job: None,
                utilization_source: UtilizationSource::Samples,
                source: format!("rank{w}.json"),
                functions: vec![
                    pat(FunctionKind::GpuKernel, Resource::Sm, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", gb, gm, 0.05 * j(5)),
                    pat(FunctionKind::Comm, Resource::Nic, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 0.2 * j(6), cm, cs),
                    pat(FunctionKind::Python, Resource::Cpu, "train.py(88): <module>;torch/utils/data/dataloader.py(631): __next__;socket.py(704): recv_into", 0.25 * j(7), 0.98, 0.01),
                ],
                total_floor: 0.0,
                kernels: Vec::new(),
        steps: Vec::new(),
                omitted: Vec::new(),
                warnings: vec![],
                network: None,
            }
        })
        .filter(|f| f.worker != 42)
        .collect();
    let report = localize(&fps, &LocalizeConfig::default(), Some(64));
    print!(
        "{}",
        whyslow_report::render_table(
            &report,
            std::io::IsTerminal::is_terminal(&std::io::stdout())
        )
    );
    if let Some(path) = std::env::args().nth(1) {
        if let Err(e) = std::fs::write(&path, whyslow_report::render_html(&report)) {
            eprintln!("{path}: {e}");
        }
    }
}
