//! whyslow's localizer: which function, on which workers, is abnormal
//! (PerfTracker §4.3, Eq. 6–11). Pure: no I/O.
//!
//! For every comparison group (workers with the same [`Fingerprint::group`];
//! all workers when no group is known) and every function (kind + name) that
//! appears in any fingerprint of the group, each worker's pattern
//! P_{f,w} = (β, μ, σ) is judged two ways:
//!
//! * **Distance from expectation** D_{f,w} (Eq. 6–7): the Manhattan distance
//!   from P_{f,w} to the expected box R_f of [`LocalizeConfig::expected`].
//! * **Differential distance** Δ_{f,w} (Eq. 8–10): patterns are max-normalized
//!   per dimension over the group's workers, and Δ_{f,w} is the fraction of N =
//!   min(`max_peers`, |W|) sampled peers at normalized Manhattan distance ≥ δ.
//!
//! A worker is abnormal for f iff β > `beta_min` ∧ (D > 0 ∨ Δ > M + k·MAD)
//! (Eq. 11), M and MAD being the median and median absolute deviation of Δ
//! over the group's workers. A worker without the function has P = (0, 0, 0).
//!
//! # Choices where the paper is silent
//!
//! * **Isolated workers in small groups.** When the whole group is compared
//!   (|W| ≤ `max_peers`), a worker at distance ≥ δ from every other one is a
//!   peer outlier too, if fewer than half the workers are
//!   ([`LocalizeConfig::flag_isolated`]): with 4 workers one half-affected
//!   neighbour makes M + k·MAD unreachable. Where Δ is that coarse (k/(2|W|)
//!   above `min_margin`: up to 8 workers by default), a worker at distance
//!   ≥ δ from the group's *typical* pattern (the per-dimension median of its
//!   normalized patterns) is one too, under the same minority condition: in
//!   a testbed run the slow link's upstream neighbour was itself ≥ δ from
//!   every worker, so "isolated" named no one, while the median, which a
//!   minority does not move, still set the slow worker apart.
//! * **Sampling.** W_N is drawn once per (group, function), without
//!   replacement, from the group's workers in rank order, with a SplitMix64
//!   generator seeded by [`LocalizeConfig::seed`] and a stable (FNV-1a) hash
//!   of the group and function names: the same fingerprints and seed give the
//!   same report whatever the input order. When N = |W| every worker is a
//!   peer (a worker's distance to itself is 0, so it never counts).
//! * **Small groups.** The Δ rule needs at least `min_peer_workers` (3)
//!   workers in the group; smaller groups are judged by D only (a warning says so).
//! * **Margin.** A peer outlier needs Δ > M + max(k·MAD, `min_margin`)
//!   (default 0.3). With M = MAD = 0 (the usual case in a healthy job) Eq. 11
//!   would flag a worker that merely differs from one sampled peer, e.g. a
//!   worker at the edge of ±10% jitter. A real outlier set that is a fraction
//!   p of the group has Δ ≈ 1 − p against M ≈ p, so the margin keeps outlier
//!   sets up to p ≈ 0.35 detectable; larger sets are two populations (use
//!   groups). `min_margin = 0` gives Eq. 11 exactly.
//! * **Near-zero values.** Values below `zero_floor` (1e-9) count as 0, and a
//!   dimension whose maximum is 0 stays 0 after normalization.
//! * **Normalization floor.** Eq. 8 divides by max(max_w, `norm_floor`)
//!   (default 0.01): all of β, μ, σ live in [0, 1], and a dimension whose
//!   largest value is below 1% carries only noise (f32 rounding of occupancy,
//!   jitter), which plain max-normalization would blow up to 1.0.
//! * **Invalid values.** NaN, infinite or negative β/μ/σ are read as 0 (warned).
//! * **Duplicate ranks.** The first fingerprint of a rank (in input order) is
//!   kept, the others are dropped with a warning. A function listed twice in
//!   one fingerprint: the first pattern is used (warned).
//! * **Noise** ([`LocalizeConfig::corroborate`], default on).
//!   Under mere timing noise (each event ±2–5 %), functions at the edge of
//!   the critical path flip on and off it: β 1.3 % on some workers and 0 on
//!   the others, which Eq. 8 max-normalizes into the largest distance and
//!   Eq. 7 reads as "unexpected" (Python's R_f ends at 1 %). Replayed as 16
//!   and 128 workers, the 12 real fixture traces gave up to 15 such findings
//!   per job. whyslow therefore (1) judges a range violation (D > 0) as a
//!   problem of the whole group only when most of its workers have it, and
//!   reports it on all of them; on a minority it is a candidate like a peer
//!   outlier; (2) keeps a candidate on part of a group only when the
//!   evidence holds *off* the critical path, where noise does not flip:
//!   the worker ran the function for at least `min_effect` (1 %) of its
//!   window more than its peers' median and at least `min_ratio` (1.25×)
//!   as long, with more of it on the critical path than they; or it ran
//!   starved of its resource (μ at or below the peers', and either
//!   `min_util_diff` (0.1) below or σ that far from theirs: a slow link is
//!   low and steady) and, at the peers' μ, would have saved `min_effect`
//!   of its window. A healthy 4-host testbed run on a loaded 2-core CI
//!   machine flagged `aten::mm` on one worker (μ 0.60 vs. 0.51, σ 0.20 vs.
//!   0.09) and a backward frame on another (β 1.03 % vs. 0.5 %, μ 0.14 vs.
//!   0.28) before the direction and the effect were required: sampled
//!   utilization on a contended host swings both ways, more of a resource
//!   does not slow a function, and half a percent is not worth a person's time.
//!   Fingerprints list functions that ran off the critical path too, and
//!   name (by hash) those left out, so a missing function is known not to
//!   have run ([`whyslow_model::Fingerprint::omitted`]). Measured
//!   (`cargo test --release -p whyslow --test noise -- --nocapture`): no
//!   partial-worker finding on any clean replay (12 traces × 16/128 workers
//!   × ±2/±5 % × two noise models); of 58 injected faults the paper's rule
//!   names 50, the guard the same 50 plus 3 GPU throttlings (below), with
//!   stray findings beside the fault in 21 of them for the paper's rule and
//!   in none with the guard.
//! * **Every kernel a little slower** (with the noise guard; not in the
//!   papers): a minority of workers whose GPU compute kernels together run
//!   `min_ratio` times as long as their peers', spread over most of the GPU
//!   time, is one finding, `all GPU compute kernels` (GPU throttling,
//!   PerfTracker Table 4; see the `broad` module).
//! * **The cause first** (not in the papers). [`Finding::explains`] is the
//!   share of the iteration a finding accounts for (on part of a group: its
//!   β over the peers'; on the whole group: β above R_f). A collective in
//!   which the other workers spend at least `min_effect` more of their
//!   window than the workers of a finding on part of the group (waiting for
//!   them), and other functions flagged on exactly those workers, are folded
//!   under that finding as [`Finding::consequences`]; a collective that is
//!   flagged on the cause's own workers, or above its range even there,
//!   stays a finding. Findings are ordered by `explains`.
//! * **Findings.** The flagged workers of one (group, function) form one
//!   [`Finding`]. Its reason is `unexpected` when only D > 0 held on the flagged
//!   workers, `peer_outlier` when only the Δ rule held, `both` when each held
//!   on at least one of them. [`Stat::value`] is the median over the flagged
//!   workers, [`Stat::peers`] the median over the group's other workers
//!   (β and critical time: counting those without the function as 0; μ and σ:
//!   only those with critical time in it, as μ/σ are undefined elsewhere;
//!   [`Stat::peer_count`] says how many). [`Finding::resource_mu`] compares
//!   the function's resource over all critical-path work of the flagged
//!   workers with the peers' (a contended host CPU slows every CPU function).
//!   Resource and utilization source are the most common among the flagged
//!   patterns. `points` holds every worker of the group up to `max_points`:
//!   all flagged ones first (evenly thinned if they alone exceed it), then an
//!   evenly spaced sample of the others, in rank order. Without the noise
//!   guard, findings are sorted by median flagged β × number of flagged
//!   workers, descending.
//!
//! # Default expected ranges R_f
//!
//! | kind | β | μ | σ | source |
//! |---|---|---|---|---|
//! | gpu_kernel | [0, 1] | [0, 1] | [0, 1] | PerfTracker §4.3 (never unexpected) |
//! | comm | [0, 0.3] | [0, 1] | [0, 1] | PerfTracker §4.3 |
//! | python | [0, 0.01] | [0, 1] | [0, 1] | PerfTracker §4.3 |
//! | memory | [0, 0.3] | [0, 1] | [0, 1] | whyslow: copies/allocation, like communication, move data and should overlap compute; a job spending >30% of its critical path in them is transfer-bound (raise it for CPU-offloading jobs) |
//! | cpu_op | [0, 0.05] | [0, 1] | [0, 1] | whyslow: CPU ops should not bottleneck a GPU job, but kernel-launch overhead legitimately puts a few percent of CPU ops on the critical path of healthy jobs, so 5% rather than Python's 1%. CPU-only jobs, where everything is a CPU op, override it |
//!
//! # Configuration file (TOML)
//!
//! Every key is optional; a key left out keeps its default. Unknown keys are
//! errors.
//!
//! ```
//! let cfg = whyslow_localize::LocalizeConfig::from_toml_str(r#"
//! delta = 0.4            # δ, Eq. 10
//! k = 5.0                # k, Eq. 11
//! max_peers = 100        # N = min(max_peers, |W|), Eq. 9
//! beta_min = 0.01        # β threshold, Eq. 11
//! seed = 42              # peer sampling seed
//! min_margin = 0.3       # Δ > M + max(k·MAD, min_margin)
//! min_peer_workers = 3   # smallest group for the Δ rule
//! flag_isolated = true   # small groups: far from every worker, or from the typical one ⇒ outlier
//! max_points = 5000      # plot points kept per finding
//! zero_floor = 1e-9      # values below are 0 for Δ
//! norm_floor = 0.01      # Eq. 8 divides by at least this
//! corroborate = true     # noise guard (false + min_margin = 0 + flag_isolated = false: the paper)
//! min_effect = 0.01      # extra run time, share of the window
//! min_ratio = 1.25       # run time vs. the peers' median
//! min_util_diff = 0.1    # or μ/σ this far from the peers'
//!
//! [expected.cpu_op]      # R_f per kind: gpu_kernel, memory, comm, python, cpu_op
//! beta = [0.0, 1.0]      # e.g. a CPU-only job
//!
//! [expected.comm]
//! beta = [0.0, 0.5]
//! mu = [0.0, 1.0]
//! sigma = [0.0, 1.0]
//!
//! [[override]]           # per function: first match (name substring, optional kind) wins
//! contains = "SendRecv"
//! kind = "comm"
//! beta = [0.0, 0.6]      # dimensions left out keep the kind's range
//! "#).unwrap();
//! assert_eq!(cfg.seed, 42);
//! assert_eq!(cfg.expected.cpu_op.beta, (0.0, 1.0));
//! ```
#![deny(missing_docs)]

mod broad;
mod cause;
mod columns;
mod config;
mod evidence;
mod finding;
mod groups;
mod hint;
mod rule;
mod source;
mod stats;
mod table;

use std::collections::HashMap;

use cause::{by_weight, cause_first};
use columns::{Ctx, Interner, Scratch};
pub use config::{ExpectedRange, ExpectedRanges, LocalizeConfig, RangeOverride};
use groups::{comparison_groups, first_per_rank, missing_ranks, utilization_and_hosts};
pub use hint::{hint, Job};
use rule::analyze_bucket;
use source::Source;
pub use table::{FingerprintTable, TableError, TableFunction, TablePattern, TableWorker};
#[cfg(doc)]
use whyslow_model::{Finding, Stat};
use whyslow_model::{Fingerprint, FunctionKind, Report, Verdict, REPORT_VERSION};

/// Errors of the localizer's configuration.
#[derive(Debug, thiserror::Error)]
pub enum LocalizeError {
    /// The configuration is not valid TOML or has unknown keys / wrong types.
    #[error("invalid localize configuration: {0}")]
    Toml(String),
    /// A value is out of range.
    #[error("invalid localize configuration: {0}")]
    Invalid(String),
}

/// Localizes abnormal (function, workers) in a job from its workers'
/// fingerprints (PerfTracker §4.3, Eq. 6–11; see the crate docs for the rules).
///
/// `world_size`, when known, defines the expected ranks 0..world_size;
/// otherwise 0..=max rank seen. Never panics; problems go to
/// [`Report::warnings`].
pub fn localize(fps: &[Fingerprint], cfg: &LocalizeConfig, world_size: Option<u32>) -> Report {
    localize_source(fps, cfg, world_size)
}

/// [`localize`] for fingerprints held as a [`FingerprintTable`], the compact
/// form for jobs of up to millions of workers: the same algorithm and the
/// same report as [`localize`] on the fingerprints the table holds (with
/// its values, which are `f32`).
pub fn localize_table(
    table: &FingerprintTable,
    cfg: &LocalizeConfig,
    world_size: Option<u32>,
) -> Report {
    localize_source(table, cfg, world_size)
}

/// PerfTracker §4.3 over any input representation ([`Source`]).
fn localize_source<S: Source + ?Sized>(
    fps: &S,
    cfg: &LocalizeConfig,
    world_size: Option<u32>,
) -> Report {
    let mut warnings: Vec<String> = Vec::new();
    let kept = first_per_rank(fps, &mut warnings);
    let missing = missing_ranks(fps, &kept, world_size, &mut warnings);
    let (utilization_source, hosts) = utilization_and_hosts(fps, &kept);
    let groups = comparison_groups(fps, &kept, cfg, &mut warnings);

    let mut ctx = Ctx {
        src: fps,
        cfg,
        resource_acc: Default::default(),
        interner: Interner {
            map: HashMap::default(),
            names: Vec::new(),
            kinds: Vec::new(),
            ranges: Vec::new(),
        },
        duplicate_functions: 0,
        job: Job {
            gpus: fps.has_kind(&[FunctionKind::GpuKernel, FunctionKind::Memory]),
        },
    };
    let mut scratch = Scratch::default();
    let mut findings = Vec::new();
    let gpu_times = if cfg.corroborate {
        broad::gpu_times(fps)
    } else {
        Vec::new()
    };
    for (gname, members) in &groups {
        let cols = fps.index_group(
            members,
            &mut ctx.interner,
            cfg,
            &mut ctx.duplicate_functions,
        );
        for bucket in 0..cols.fids.len() {
            findings.extend(analyze_bucket(
                &ctx,
                members,
                *gname,
                &cols,
                bucket,
                &mut scratch,
            ));
        }
        if cfg.corroborate {
            findings.extend(broad::broad_gpu_slowdowns(
                fps, &gpu_times, members, *gname, cfg,
            ));
        }
    }
    if scratch.invalid_values > 0 {
        warnings.push(format!(
            "{} NaN, infinite or negative β/μ/σ value(s) read as 0",
            scratch.invalid_values
        ));
    }
    if ctx.duplicate_functions > 0 {
        warnings.push(format!(
            "{} function(s) listed twice in one fingerprint: the first pattern was used",
            ctx.duplicate_functions
        ));
    }

    let findings = if cfg.corroborate {
        cause_first(findings, cfg)
    } else {
        findings.sort_by(by_weight);
        findings
    };

    let verdict = if findings.is_empty() {
        Verdict::NoAnomaly
    } else {
        Verdict::Anomalies
    };
    Report {
        version: REPORT_VERSION,
        workers: kept.len(),
        missing_workers: missing,
        findings,
        utilization_source,
        hosts,
        warnings,
        verdict,
        not_judged: Vec::new(),
        iterations: None,
        cross_layer: None,
        network: Vec::new(),
        fix: None,
        fix_error: None,
    }
}

#[cfg(test)]
mod tests;
