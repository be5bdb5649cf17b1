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
mod config;
mod hint;
mod source;
mod table;

use std::cell::OnceCell;
use std::collections::{BTreeSet, HashMap};
use whyslow_model::rng::SplitMix64;

pub use config::{ExpectedRange, ExpectedRanges, LocalizeConfig, RangeOverride};
pub use hint::{hint, Job};
use source::Source;
pub use table::{FingerprintTable, TableError, TableFunction, TablePattern, TableWorker};
use whyslow_model::{
    Consequence, Finding, Fingerprint, FunctionKind, Reason, Relation, Report, Resource, Stat,
    UtilizationSource, Verdict, WorkerPoint, REPORT_VERSION,
};

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

/// Most warnings of one kind listed individually; the rest are counted.
const MAX_LISTED_WARNINGS: usize = 10;
/// Most missing ranks listed in a report.
const MAX_MISSING_LISTED: usize = 1 << 22;

// ---------------------------------------------------------------- hashing / rng

/// FxHash (rustc's): fast, non-cryptographic, for interning names.
type FxBuild = rustc_hash::FxBuildHasher;

/// FNV-1a: a stable hash (same on every platform and version) for seeds.
fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// N distinct indices of 0..n, ascending (Floyd's algorithm).
fn sample_indices(n: usize, count: usize, rng: &mut SplitMix64, out: &mut Vec<u32>) {
    out.clear();
    if count >= n {
        out.extend(0..n as u32);
        return;
    }
    for j in (n - count)..n {
        let t = rng.below_incl(j) as u32;
        match out.binary_search(&t) {
            Ok(_) => {
                // t already chosen: take j (never chosen before, as j grows).
                let pos = out.binary_search(&(j as u32)).unwrap_or_else(|p| p);
                out.insert(pos, j as u32);
            }
            Err(pos) => out.insert(pos, t),
        }
    }
}

// ---------------------------------------------------------------- statistics

/// Median (mean of the two middle values for even counts); 0 when empty.
fn median(v: &mut [f64]) -> f64 {
    whyslow_model::stats::median(v).unwrap_or(0.0)
}

/// The k-th smallest (0-based) value of a histogram of small integers.
fn hist_kth(hist: &[u64], k: u64) -> usize {
    let mut acc = 0u64;
    for (v, &c) in hist.iter().enumerate() {
        acc += c;
        if acc > k {
            return v;
        }
    }
    hist.len().saturating_sub(1)
}

/// Median and MAD of Δ (Eq. 11) from the histogram of peer-difference counts
/// (Δ = count / N), in units of Δ.
fn median_mad(hist: &[u64], total: u64, n_peers: usize, dev_hist: &mut Vec<u64>) -> (f64, f64) {
    if total == 0 || n_peers == 0 {
        return (0.0, 0.0);
    }
    // Median in half-count units (an integer): c_lo + c_hi.
    let lo = hist_kth(hist, (total - 1) / 2);
    let hi = hist_kth(hist, total / 2);
    let med2 = (lo + hi) as i64;
    dev_hist.clear();
    dev_hist.resize(2 * n_peers + 1, 0);
    for (c, &cnt) in hist.iter().enumerate() {
        if cnt > 0 {
            let d = (2 * c as i64 - med2).unsigned_abs() as usize;
            if let Some(slot) = dev_hist.get_mut(d) {
                *slot += cnt;
            }
        }
    }
    let dlo = hist_kth(dev_hist, (total - 1) / 2);
    let dhi = hist_kth(dev_hist, total / 2);
    let scale = 2.0 * n_peers as f64;
    (med2 as f64 / scale, (dlo + dhi) as f64 / 2.0 / scale)
}

// ---------------------------------------------------------------- interning

struct Interner<'a> {
    map: HashMap<(FunctionKind, &'a str), u32, FxBuild>,
    names: Vec<&'a str>,
    kinds: Vec<FunctionKind>,
    ranges: Vec<ExpectedRange>,
}

impl<'a> Interner<'a> {
    fn intern(&mut self, kind: FunctionKind, name: &'a str, cfg: &LocalizeConfig) -> u32 {
        if let Some(&id) = self.map.get(&(kind, name)) {
            return id;
        }
        let id = self.names.len() as u32;
        self.map.insert((kind, name), id);
        self.names.push(name);
        self.kinds.push(kind);
        self.ranges.push(cfg.range_for(kind, name));
        id
    }
}

// ---------------------------------------------------------------- localize

/// Flag bits per (function, worker) entry.
const CANDIDATE: u8 = 1; // β > beta_min
const OUTSIDE: u8 = 2; // D > 0

/// Columnar index of one comparison group: per function bucket (`fids`:
/// interned function ids), its entries `offsets[b]..offsets[b + 1]`, each a
/// member index and the pattern's handle in the input, sorted by member
/// index. The values are read per bucket, when it is analyzed
/// ([`BucketValues`]): 8 bytes an entry however many functions the group has.
struct GroupColumns {
    offsets: Vec<usize>,
    fids: Vec<u32>,
    member: Vec<u32>,
    handle: Vec<u32>,
}

/// One bucket's values, read once from the input: Δ's (β, μ, σ) as f32
/// (sanitized, then max-normalized in place), flags, and the values as the
/// noise guard and the findings read them ([`clean`]ed f64: β, μ, σ,
/// critical µs; has utilization).
#[derive(Default)]
struct BucketValues {
    beta: Vec<f32>,
    mu: Vec<f32>,
    sigma: Vec<f32>,
    flags: Vec<u8>,
    vals: Vec<([f64; 4], bool)>,
    total_us: Vec<f64>,
}

struct Ctx<'a, 'c, S: Source + ?Sized> {
    src: &'a S,
    cfg: &'c LocalizeConfig,
    /// Per [`Resource::ALL`] entry, filled when a finding first needs it:
    /// per fingerprint Σ critical µs × μ and Σ critical µs over its
    /// functions with measured utilization of that resource, for
    /// [`Finding::resource_mu`].
    resource_acc: [OnceCell<Vec<(f64, f64)>>; Resource::ALL.len()],
    interner: Interner<'a>,
    duplicate_functions: u64,
    job: Job,
}

fn sanitize(x: f64, floor: f64, invalid: &mut u64) -> f32 {
    if !x.is_finite() || x < 0.0 {
        *invalid += 1;
        0.0
    } else if x < floor {
        0.0
    } else {
        x as f32
    }
}

impl<S: Source + ?Sized> Ctx<'_, '_, S> {
    /// Σ critical µs × μ and Σ critical µs per fingerprint over its
    /// functions with measured utilization of resource `r` (an index of
    /// [`Resource::ALL`]).
    fn resource_acc(&self, r: usize) -> &[(f64, f64)] {
        self.resource_acc[r].get_or_init(|| {
            let resource = Resource::ALL[r];
            let mut acc = vec![(0f64, 0f64); self.src.count()];
            self.src.for_each_pattern(None, Some(resource), |i, p| {
                let w = clean(p.critical_us);
                if p.util_source == UtilizationSource::None || w <= 0.0 {
                    return;
                }
                acc[i].0 += w * clean(p.mu);
                acc[i].1 += w;
            });
            acc
        })
    }

    /// Reads bucket `lo..hi` of `cols` (function `fid`) into `out`,
    /// counting invalid values.
    fn read_bucket(
        &self,
        members: &[u32],
        cols: &GroupColumns,
        (lo, hi): (usize, usize),
        fid: usize,
        out: &mut BucketValues,
        invalid: &mut u64,
    ) {
        let cfg = self.cfg;
        let floor = cfg.zero_floor;
        let range = &self.interner.ranges[fid];
        out.beta.clear();
        out.mu.clear();
        out.sigma.clear();
        out.flags.clear();
        out.vals.clear();
        out.total_us.clear();
        for e in lo..hi {
            let fi = members[cols.member[e] as usize] as usize;
            let p = self.src.pattern(fi, cols.handle[e]);
            out.beta.push(sanitize(p.beta, floor, invalid));
            out.mu.push(sanitize(p.mu, floor, invalid));
            out.sigma.push(sanitize(p.sigma, floor, invalid));
            let (rb, rm, rs) = (clean(p.beta), clean(p.mu), clean(p.sigma));
            let mut fl = 0u8;
            if rb > cfg.beta_min {
                fl |= CANDIDATE;
                if range.distance(rb, rm, rs) > 0.0 {
                    fl |= OUTSIDE;
                }
            }
            out.flags.push(fl);
            out.vals.push((
                [rb, rm, rs, clean(p.critical_us)],
                p.util_source != UtilizationSource::None,
            ));
            out.total_us.push(clean(p.total_us));
        }
    }
}

/// A value as localization reads it: non-finite or negative → 0.
fn clean(x: f64) -> f64 {
    if x.is_finite() && x >= 0.0 {
        x
    } else {
        0.0
    }
}

/// Bresenham selection: is item `t` of `total` among the `keep` evenly spaced ones?
fn keep_evenly(t: usize, keep: usize, total: usize) -> bool {
    if keep >= total {
        return true;
    }
    let (t, keep, total) = (t as u128, keep as u128, total as u128);
    ((t + 1) * keep) / total > (t * keep) / total
}

/// whyslow's rule for small groups compared in full (crate docs, "Isolated
/// workers"): a worker at normalized distance ≥ `delta` from the group's
/// typical pattern, the per-dimension median over all its workers (absent
/// workers count as 0), is far from its peers, if fewer than half of the
/// group are. Unlike Δ, one half-affected neighbour cannot hide it: a
/// minority does not move the median. Sets `far[i]` for the flagged present
/// workers; O(g log g).
fn far_from_typical(
    dims: [&[f32]; 3],
    g: usize,
    delta: f64,
    column: &mut Vec<f64>,
    far: &mut Vec<bool>,
) {
    let n = dims[0].len();
    far.clear();
    if g < 3 || n == 0 {
        return;
    }
    let mut typical = [0f64; 3];
    for (col, t) in dims.iter().zip(typical.iter_mut()) {
        column.clear();
        column.extend(col.iter().map(|&x| x as f64));
        column.resize(g, 0.0); // absent workers
        *t = median(column);
    }
    let distance = |p: [f32; 3]| -> f64 { (0..3).map(|d| (p[d] as f64 - typical[d]).abs()).sum() };
    let away = |p: [f32; 3]| distance(p) >= delta - 1e-9;
    far.extend((0..n).map(|i| away([dims[0][i], dims[1][i], dims[2][i]])));
    let absent = if n < g && away([0.0; 3]) { g - n } else { 0 };
    // When half the workers or more are δ away from it, nothing is typical.
    if 2 * (far.iter().filter(|&&f| f).count() + absent) >= g {
        far.iter_mut().for_each(|f| *f = false);
    }
}

#[derive(Default)]
struct Scratch {
    sample: Vec<u32>,
    sb: Vec<f32>,
    sm: Vec<f32>,
    ss: Vec<f32>,
    counts: Vec<u32>,
    hist: Vec<u64>,
    dev_hist: Vec<u64>,
    /// Per present worker: far from the group's typical pattern?
    far: Vec<bool>,
    column: Vec<f64>,
    /// The bucket being analyzed.
    values: BucketValues,
    /// Per group member, for the noise guard ([`Evidence`]).
    share: Vec<f64>,
    entry_of: Vec<u32>,
    /// NaN, infinite or negative β/μ/σ read so far.
    invalid_values: u64,
}

/// Analyzes one (group, function) bucket; returns its findings (none; one;
/// or, with the noise guard, one on the whole group and one on part of it).
fn analyze_bucket<S: Source + ?Sized>(
    ctx: &Ctx<'_, '_, S>,
    members: &[u32],
    group: Option<&str>,
    cols: &GroupColumns,
    bucket: usize,
    scratch: &mut Scratch,
) -> Vec<Finding> {
    let (lo, hi) = (cols.offsets[bucket], cols.offsets[bucket + 1]);
    let fid = cols.fids[bucket] as usize;
    let mut values = std::mem::take(&mut scratch.values);
    ctx.read_bucket(
        members,
        cols,
        (lo, hi),
        fid,
        &mut values,
        &mut scratch.invalid_values,
    );
    let findings = analyze_values(
        ctx,
        members,
        group,
        cols,
        (lo, hi, fid),
        &mut values,
        scratch,
    );
    scratch.values = values;
    findings
}

/// [`analyze_bucket`] once the bucket's values are read.
fn analyze_values<S: Source + ?Sized>(
    ctx: &Ctx<'_, '_, S>,
    members: &[u32],
    group: Option<&str>,
    cols: &GroupColumns,
    (lo, hi, fid): (usize, usize, usize),
    values: &mut BucketValues,
    scratch: &mut Scratch,
) -> Vec<Finding> {
    let cfg = ctx.cfg;
    if !values.flags.iter().any(|&f| f & CANDIDATE != 0) {
        return Vec::new(); // Eq. 11 needs β > beta_min somewhere.
    }
    let kind = ctx.interner.kinds[fid];
    let name = ctx.interner.names[fid];
    let g = members.len();
    let n = hi - lo;
    let mem = &cols.member[lo..hi];

    // Δ rule (Eq. 8–11), only for groups large enough.
    let peer_ok = g >= cfg.min_peer_workers.max(1);
    let n_peers = cfg.max_peers.min(g).max(1);
    scratch.counts.clear();
    scratch.far.clear();
    // A count of far peers at or above `isolated_from` flags a worker as
    // isolated.
    let (threshold, isolated_from) = if peer_ok {
        peer_rule(
            cfg,
            group,
            (kind, name),
            mem,
            (g, n, n_peers),
            values,
            scratch,
        )
    } else {
        (f64::INFINITY, usize::MAX)
    };
    let flags = &values.flags[..];

    let bucket = Bucket {
        ctx,
        members,
        group,
        cols,
        values: &values.vals,
        lo,
        hi,
        kind,
        name,
    };
    // Eq. 11.
    let is_peer_outlier = |i: usize| {
        peer_ok
            && ((scratch.counts[i] as f64 / n_peers as f64) > threshold + 1e-12
                || scratch.counts[i] as usize >= isolated_from
                || scratch.far.get(i).copied().unwrap_or(false))
    };
    if !cfg.corroborate {
        let mut flagged: Vec<usize> = Vec::new();
        let (mut any_outside, mut any_peer) = (false, false);
        for (i, &f) in flags.iter().enumerate() {
            if f & CANDIDATE == 0 {
                continue;
            }
            let outside = f & OUTSIDE != 0;
            let peer = is_peer_outlier(i);
            if outside || peer {
                flagged.push(i);
                any_outside |= outside;
                any_peer |= peer;
            }
        }
        if flagged.is_empty() {
            return Vec::new();
        }
        let reason = reason_of(any_outside, any_peer);
        return vec![build_finding(&bucket, &flagged, reason)];
    }

    // With the noise guard (crate docs, "Noise"): a range violation on most
    // of the group's workers is a problem of the whole group …
    let outside = flags
        .iter()
        .filter(|&&f| f & CANDIDATE != 0 && f & OUTSIDE != 0)
        .count();
    let common = 2 * outside > g;
    let evidence = Evidence::new(
        ctx,
        members,
        cols,
        (lo, hi),
        fid,
        values,
        (&mut scratch.share, &mut scratch.entry_of),
    );
    let mut findings = Vec::new();
    if common {
        let all: Vec<usize> = (0..n).collect();
        findings.push(build_finding(&bucket, &all, Reason::Unexpected));
    }
    // … and a finding on part of it must be borne out off the critical path.
    let candidates: Vec<usize> = (0..n)
        .filter(|&i| {
            flags[i] & CANDIDATE != 0
                && ((!common && flags[i] & OUTSIDE != 0) || is_peer_outlier(i))
        })
        .collect();
    if candidates.is_empty() || (common && candidates.len() == n && n == g) {
        return findings;
    }
    let peers = evidence.peers(&candidates, g);
    let flagged: Vec<usize> = candidates
        .into_iter()
        .filter(|&i| evidence.corroborated(i, &peers, cfg))
        .collect();
    if flagged.is_empty() {
        return findings;
    }
    let any_outside = !common && flagged.iter().any(|&i| flags[i] & OUTSIDE != 0);
    let any_peer = flagged.iter().any(|&i| is_peer_outlier(i));
    let reason = reason_of(any_outside, any_peer);
    findings.push(build_finding(&bucket, &flagged, reason));
    findings
}

/// The Δ rule's threshold and the isolation count for one bucket
/// (PerfTracker §4.3, Eq. 8–10): β, μ, σ max-normalized across the group
/// (Eq. 8, in place), a sample W_N of peers drawn once per (group,
/// function), each worker's count of peers at L1 distance ≥ δ into
/// `scratch.counts` (Eq. 9–10; workers without the function once, as
/// (0, 0, 0)), and the threshold M + k·MAD of those counts (Eq. 11's right
/// side). Also marks workers far from the group's typical pattern in small
/// groups (`scratch.far`). Returns (threshold, isolated_from): a count of
/// far peers at or above `isolated_from` flags a worker as isolated.
fn peer_rule(
    cfg: &LocalizeConfig,
    group: Option<&str>,
    (kind, name): (FunctionKind, &str),
    mem: &[u32],
    (g, n, n_peers): (usize, usize, usize),
    values: &mut BucketValues,
    scratch: &mut Scratch,
) -> (f64, usize) {
    // Eq. 8: max normalization (absent workers contribute 0).
    let b = &mut values.beta[..];
    let m = &mut values.mu[..];
    let s = &mut values.sigma[..];
    for dim in [&mut *b, &mut *m, &mut *s] {
        let mx = dim.iter().copied().fold(0f32, f32::max);
        if mx > 0.0 && (mx as f64) >= cfg.zero_floor {
            // Dividing by at least `norm_floor` keeps differences that are
            // tiny in absolute terms (σ of 1e-4 vs 0) from becoming 1.0.
            let inv = 1.0 / mx.max(cfg.norm_floor as f32);
            dim.iter_mut().for_each(|x| *x *= inv);
        } else {
            dim.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    // W_N, sampled once per (group, function).
    let mut seed = fnv1a(
        0xcbf2_9ce4_8422_2325 ^ cfg.seed,
        group.unwrap_or("").as_bytes(),
    );
    seed = fnv1a(seed, &[0xff, kind.priority()]);
    seed = fnv1a(seed, name.as_bytes());
    let mut rng = SplitMix64(seed);
    sample_indices(g, n_peers, &mut rng, &mut scratch.sample);
    scratch.sb.clear();
    scratch.sm.clear();
    scratch.ss.clear();
    for &wi in &scratch.sample {
        match mem.binary_search(&wi) {
            Ok(i) => {
                scratch.sb.push(b[i]);
                scratch.sm.push(m[i]);
                scratch.ss.push(s[i]);
            }
            Err(_) => {
                scratch.sb.push(0.0);
                scratch.sm.push(0.0);
                scratch.ss.push(0.0);
            }
        }
    }
    let delta = cfg.delta as f32;
    let (sb, sm, ss) = (&scratch.sb[..], &scratch.sm[..], &scratch.ss[..]);
    // Exact shortcut (whyslow, not in the paper): the peers lie within
    // `radius` of their centroid c (L1, in f64), so a worker at
    // distance d from c is within d + radius of every peer and at least
    // d − radius from each. Clear of δ either way by a margin far above
    // f32 rounding (a few 1e-7 relative), every comparison below would
    // come out the same: count none or all without comparing. In a
    // healthy job the workers cluster well inside δ, so most workers
    // cost O(1) instead of O(N).
    let np = sb.len().max(1) as f64;
    let centre = [sb, sm, ss].map(|d| d.iter().map(|&v| f64::from(v)).sum::<f64>() / np);
    let to_centre = |x: f32, y: f32, z: f32| -> f64 {
        (f64::from(x) - centre[0]).abs()
            + (f64::from(y) - centre[1]).abs()
            + (f64::from(z) - centre[2]).abs()
    };
    let radius = (0..sb.len())
        .map(|j| to_centre(sb[j], sm[j], ss[j]))
        .fold(0f64, f64::max);
    let delta64 = f64::from(delta);
    let count_far = |x: f32, y: f32, z: f32| -> u32 {
        let d = to_centre(x, y, z);
        if (d + radius) * (1.0 + 1e-6) + 1e-9 < delta64 {
            return 0;
        }
        if (d - radius) * (1.0 - 1e-6) - 1e-9 >= delta64 {
            return sb.len() as u32;
        }
        let mut c = 0u32;
        for ((&pb, &pm), &ps) in sb.iter().zip(sm).zip(ss) {
            let d = (x - pb).abs() + (y - pm).abs() + (z - ps).abs();
            c += u32::from(d >= delta);
        }
        c
    };
    // Eq. 9–10 for every worker having the function …
    for i in 0..n {
        scratch.counts.push(count_far(b[i], m[i], s[i]));
    }
    // … and once for all workers without it (pattern (0,0,0)).
    scratch.hist.clear();
    scratch.hist.resize(n_peers + 1, 0);
    for &c in &scratch.counts {
        scratch.hist[(c as usize).min(n_peers)] += 1;
    }
    let c0 = if n < g {
        let c0 = count_far(0.0, 0.0, 0.0) as usize;
        scratch.hist[c0.min(n_peers)] += (g - n) as u64;
        Some(c0)
    } else {
        None
    };
    let (med, mad) = median_mad(&scratch.hist, g as u64, n_peers, &mut scratch.dev_hist);
    let threshold = med + (cfg.k * mad).max(cfg.min_margin);
    let mut isolated_from = usize::MAX;
    // Isolated workers: with every worker compared with every other, one
    // at distance ≥ δ from all of them (self excluded) is unlike its
    // peers whatever M and MAD say, as long as such workers are few.
    // Δ moves in steps of 1/|W|: in a small group a single half-affected
    // worker lifts M + k·MAD by ≥ k/(2|W|), past the margin, and Eq. 11
    // can no longer be met (4 workers: 0.625 vs 0.3).
    let coarse = cfg.k / (2.0 * g as f64) > cfg.min_margin;
    if cfg.flag_isolated && n_peers >= g {
        let is_isolated = |c: usize| c + 1 >= g;
        let absent = c0.map_or(0, |c| if is_isolated(c) { g - n } else { 0 });
        let present = scratch
            .counts
            .iter()
            .filter(|&&c| is_isolated(c as usize))
            .count();
        if 2 * (present + absent) < g {
            isolated_from = g - 1;
        }
        if coarse {
            far_from_typical(
                [&*b, &*m, &*s],
                g,
                cfg.delta,
                &mut scratch.column,
                &mut scratch.far,
            );
        }
    }
    (threshold, isolated_from)
}

/// The reason of a finding whose workers are outside the expected range
/// (D > 0), peer outliers (Δ), or both.
fn reason_of(outside: bool, peer: bool) -> Reason {
    match (outside, peer) {
        (true, true) => Reason::Both,
        (true, false) => Reason::Unexpected,
        _ => Reason::PeerOutlier,
    }
}

/// One (group, function) bucket, as its findings are built: the group's
/// members, its columns (entries `lo..hi` are the function's), their values
/// (`values[i]` is entry `lo + i`'s), the function.
struct Bucket<'x, 'a, 'c, S: Source + ?Sized> {
    ctx: &'x Ctx<'a, 'c, S>,
    members: &'x [u32],
    group: Option<&'x str>,
    cols: &'x GroupColumns,
    values: &'x [([f64; 4], bool)],
    lo: usize,
    hi: usize,
    kind: FunctionKind,
    name: &'x str,
}

impl<S: Source + ?Sized> Bucket<'_, '_, '_, S> {
    /// The group member index of each of the bucket's entries (sorted).
    fn mem(&self) -> &[u32] {
        &self.cols.member[self.lo..self.hi]
    }

    /// (β, μ, σ, critical µs) of entry `i`, as read with the bucket.
    fn vals(&self, i: usize) -> [f64; 4] {
        self.values[i].0
    }

    /// Entry `i`'s own pattern, from its fingerprint.
    fn pattern(&self, i: usize) -> source::Pat<'_> {
        let fp = self.members[self.mem()[i] as usize] as usize;
        self.ctx.src.pattern(fp, self.cols.handle[self.lo + i])
    }
}

/// What a (group, function) bucket says off the critical path: each
/// worker's run time in the function as a share of its window, and μ, σ.
struct Evidence<'x> {
    /// Per group member: run-time share (absent: the fingerprint's
    /// `total_floor`, an upper bound), and the entry index when present
    /// (`u32::MAX` when absent).
    share: &'x [f64],
    entry_of: &'x [u32],
    /// Per entry: ([β, μ, σ, critical µs], has utilization), and its member.
    vals: &'x [([f64; 4], bool)],
    member_of: &'x [u32],
}

/// The peers' medians that a candidate is compared with.
struct PeerMedians {
    share: f64,
    beta: f64,
    mu: Option<f64>,
    sigma: Option<f64>,
}

impl<'x> Evidence<'x> {
    fn new<S: Source + ?Sized>(
        ctx: &Ctx<'_, '_, S>,
        members: &[u32],
        cols: &'x GroupColumns,
        (lo, hi): (usize, usize),
        fid: usize,
        values: &'x BucketValues,
        (share, entry_of): (&'x mut Vec<f64>, &'x mut Vec<u32>),
    ) -> Self {
        let src = ctx.src;
        let hash = whyslow_model::function_hash(ctx.interner.kinds[fid], ctx.interner.names[fid]);
        // A worker without the function ran it for at most its fingerprint's
        // `total_floor` when it lists the function as omitted, else ~never.
        share.clear();
        share.extend(members.iter().map(|&fi| {
            let fi = fi as usize;
            if src.omitted(fi).binary_search(&hash).is_ok() {
                clean(src.total_floor(fi)).min(1.0)
            } else {
                0.0
            }
        }));
        entry_of.clear();
        entry_of.resize(members.len(), u32::MAX);
        let member_of = &cols.member[lo..hi];
        for (i, &mi) in member_of.iter().enumerate() {
            let mi = mi as usize;
            let window = clean(src.window_us(members[mi] as usize));
            share[mi] = if window > 0.0 {
                values.total_us[i] / window
            } else {
                0.0
            };
            entry_of[mi] = i as u32;
        }
        Evidence {
            share,
            entry_of,
            vals: &values.vals,
            member_of,
        }
    }

    /// The entry of member `mi`, when it has the function.
    fn entry(&self, mi: usize) -> Option<usize> {
        let e = self.entry_of[mi];
        (e != u32::MAX).then_some(e as usize)
    }

    /// Medians over the group's workers that are not `candidates`.
    fn peers(&self, candidates: &[usize], g: usize) -> PeerMedians {
        let mut is_candidate = vec![false; g];
        for &i in candidates {
            is_candidate[self.member_of[i] as usize] = true;
        }
        let mut share: Vec<f64> = (0..g)
            .filter(|&mi| !is_candidate[mi])
            .map(|mi| self.share[mi])
            .collect();
        let mut beta: Vec<f64> = (0..g)
            .filter(|&mi| !is_candidate[mi])
            .map(|mi| self.entry(mi).map_or(0.0, |i| self.vals[i].0[0]))
            .collect();
        let (mut mu, mut sigma) = (Vec::new(), Vec::new());
        for mi in (0..g).filter(|&mi| !is_candidate[mi]) {
            if let Some(i) = self.entry(mi) {
                let (v, util) = self.vals[i];
                if v[3] > 0.0 && util {
                    mu.push(v[1]);
                    sigma.push(v[2]);
                }
            }
        }
        let util = !mu.is_empty();
        PeerMedians {
            share: median(&mut share),
            beta: median(&mut beta),
            mu: util.then(|| median(&mut mu)),
            sigma: util.then(|| median(&mut sigma)),
        }
    }

    /// Does entry `i` slow its worker down by at least `min_effect` of its
    /// window, with evidence off the critical path? Either it ran the
    /// function longer (by `min_effect` of its window and `min_ratio` times
    /// the peers' median) with more of it on the critical path (β) than the
    /// peers; or it ran starved of the function's resource
    /// (μ at or below the peers', and `min_util_diff` below them or its σ
    /// that far from theirs: PerfTracker Fig. 5, a slow link is low and
    /// steady) and β·(1 − μ/μ_peers), the time it would save at the peers'
    /// utilization, or its β excess reaches `min_effect`. A function that
    /// got *more* of its resource than its peers was not slowed by a lack
    /// of it: sampled utilization on a contended host swings both ways.
    fn corroborated(&self, i: usize, peers: &PeerMedians, cfg: &LocalizeConfig) -> bool {
        let ([beta, mu, sigma, _], util) = self.vals[i];
        let excess = beta - peers.beta;
        let x = self.share[self.member_of[i] as usize];
        let longer =
            excess > 0.0 && x - peers.share >= cfg.min_effect && x >= cfg.min_ratio * peers.share;
        let starved = util
            && peers.mu.is_some_and(|m| {
                let lower = mu <= m
                    && (mu <= m - cfg.min_util_diff
                        || peers
                            .sigma
                            .is_some_and(|s| (sigma - s).abs() >= cfg.min_util_diff));
                let saved = if m > 0.0 { beta * (1.0 - mu / m) } else { 0.0 };
                lower && excess.max(saved) >= cfg.min_effect
            });
        longer || starved
    }
}

fn build_finding<S: Source + ?Sized>(
    bucket: &Bucket<'_, '_, '_, S>,
    flagged: &[usize],
    reason: Reason,
) -> Finding {
    let Bucket {
        ctx,
        members,
        group,
        cols,
        values,
        lo,
        hi,
        kind,
        name,
    } = *bucket;
    let src = ctx.src;
    let g = members.len();
    let n = hi - lo;
    let mem = &cols.member[lo..hi];
    let handle = &cols.handle[lo..hi];
    let fp_of = |i: usize| members[mem[i] as usize] as usize;
    let pattern = |i: usize| src.pattern(fp_of(i), handle[i]);
    let mut is_flagged = vec![false; n];
    for &i in flagged {
        is_flagged[i] = true;
    }

    let workers: Vec<u32> = flagged.iter().map(|&i| src.rank(fp_of(i))).collect();
    let hosts: Vec<String> = flagged
        .iter()
        .filter_map(|&i| src.host(fp_of(i)))
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .map(str::to_string)
        .collect();

    // (β, μ, σ, critical µs) of every entry, as read with the bucket.
    let vals = |i: usize| values[i].0;
    let others_absent = g - n;
    // `on_path_only`: μ and σ exist only where the function has critical
    // time; a peer without it is not a peer at 0 % utilization.
    let stat = |d: usize, on_path_only: bool| -> Stat {
        let mut fv: Vec<f64> = flagged.iter().map(|&i| vals(i)[d]).collect();
        let mut ov: Vec<f64> = Vec::with_capacity(g - flagged.len());
        ov.extend(
            (0..n)
                .filter(|&i| !is_flagged[i] && (!on_path_only || vals(i)[3] > 0.0))
                .map(|i| vals(i)[d]),
        );
        if !on_path_only {
            ov.resize(ov.len() + others_absent, 0.0);
        }
        Stat {
            value: median(&mut fv),
            peers: median(&mut ov),
            peer_count: Some(u32::try_from(ov.len()).unwrap_or(u32::MAX)),
        }
    };
    let beta = stat(0, false);
    let mu = stat(1, true);
    let sigma = stat(2, true);
    let critical_us = stat(3, false);

    // Most common resource / utilization source among the flagged patterns.
    let mut res_count = [0usize; Resource::ALL.len()];
    let mut src_count = [0usize; 3];
    for &i in flagged {
        let p = pattern(i);
        if let Some(r) = Resource::ALL.iter().position(|r| *r == p.resource) {
            res_count[r] += 1;
        }
        src_count[match p.util_source {
            UtilizationSource::Samples => 0,
            UtilizationSource::Trace => 1,
            UtilizationSource::None => 2,
        }] += 1;
    }
    let argmax = |c: &[usize]| {
        c.iter()
            .enumerate()
            .fold(
                (0, 0),
                |best, (i, &v)| if v > best.1 { (i, v) } else { best },
            )
            .0
    };
    let resource = Resource::ALL[argmax(&res_count)];
    let util_source = [
        UtilizationSource::Samples,
        UtilizationSource::Trace,
        UtilizationSource::None,
    ][argmax(&src_count)];
    // The resource over the rest of each worker's critical-path work: this
    // function's own share is left out, so that a function that is slow by
    // itself does not make its worker look starved.
    let resource_mu = (util_source != UtilizationSource::None)
        .then(|| resource_mu(bucket, &is_flagged, resource))
        .flatten();

    let points = finding_points(bucket, flagged.len(), &is_flagged);

    let mut finding = Finding {
        function: name.to_string(),
        kind,
        workers,
        reason,
        beta,
        mu,
        sigma,
        resource,
        util_source,
        group: group.map(str::to_string),
        group_workers: g,
        hosts,
        critical_us,
        resource_mu,
        hint: None,
        source_excerpt: None,
        points,
        explains: 0.0,
        consequences: Vec::new(),
    };
    finding.hint = hint(&finding, &ctx.job);
    finding
}

/// The resource over the rest of each worker's critical-path work, flagged
/// workers against the others (a finding's `resource_mu`): this
/// function's own share is left out, so that a function that is slow by
/// itself does not make its worker look starved. `None` without both sides.
fn resource_mu<S: Source + ?Sized>(
    bucket: &Bucket<'_, '_, '_, S>,
    is_flagged: &[bool],
    resource: Resource,
) -> Option<Stat> {
    let (ctx, members) = (bucket.ctx, bucket.members);
    let n = bucket.hi - bucket.lo;
    let mem = bucket.mem();
    let vals = |i: usize| bucket.vals(i);
    let r = Resource::ALL
        .iter()
        .position(|x| *x == resource)
        .unwrap_or(0);
    let (mut fv, mut ov) = (Vec::new(), Vec::new());
    let mut e = 0usize;
    let acc = ctx.resource_acc(r);
    for (mi, &fi) in members.iter().enumerate() {
        let (mut sum, mut weight) = acc[fi as usize];
        let mut flag = false;
        if e < n && mem[e] as usize == mi {
            let p = bucket.pattern(e);
            if p.resource == resource && p.util_source != UtilizationSource::None {
                sum -= vals(e)[3] * vals(e)[1];
                weight -= vals(e)[3];
            }
            flag = is_flagged[e];
            e += 1;
        }
        // Below 1 µs of other work there is nothing to compare (and
        // the subtraction only leaves rounding).
        if weight < 1.0 {
            continue;
        }
        let v = (sum / weight).clamp(0.0, 1.0);
        if flag {
            fv.push(v);
        } else {
            ov.push(v);
        }
    }
    (!fv.is_empty() && !ov.is_empty()).then(|| Stat {
        value: median(&mut fv),
        peers: median(&mut ov),
        peer_count: Some(u32::try_from(ov.len()).unwrap_or(u32::MAX)),
    })
}

/// A finding's plotted points: all flagged workers (thinned evenly past
/// `max_points`), then an even sample of the rest; absent workers at
/// (0, 0, 0).
fn finding_points<S: Source + ?Sized>(
    bucket: &Bucket<'_, '_, '_, S>,
    nf: usize,
    is_flagged: &[bool],
) -> Vec<WorkerPoint> {
    let (ctx, members) = (bucket.ctx, bucket.members);
    let src = ctx.src;
    let n = bucket.hi - bucket.lo;
    let mem = bucket.mem();
    let vals = |i: usize| bucket.vals(i);
    let g = members.len();
    let cap = ctx.cfg.max_points;
    let keep_flagged = nf.min(cap);
    let keep_others = (cap - keep_flagged).min(g - nf);
    let mut points = Vec::with_capacity(keep_flagged + keep_others);
    let (mut e, mut tf, mut to) = (0usize, 0usize, 0usize);
    for (mi, &fi) in members.iter().enumerate() {
        let worker = src.rank(fi as usize);
        let present = e < n && mem[e] as usize == mi;
        let (point, flag) = if present {
            let v = vals(e);
            let f = is_flagged[e];
            e += 1;
            ((v[0], v[1], v[2]), f)
        } else {
            ((0.0, 0.0, 0.0), false)
        };
        let keep = if flag {
            tf += 1;
            keep_evenly(tf - 1, keep_flagged, nf)
        } else {
            to += 1;
            keep_evenly(to - 1, keep_others, g - nf)
        };
        if keep {
            points.push(WorkerPoint {
                worker,
                beta: point.0,
                mu: point.1,
                sigma: point.2,
                flagged: flag,
            });
        }
    }

    points
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
/// Fingerprints in rank order, the first of each rank (input order); a
/// warning per dropped duplicate.
fn first_per_rank<S: Source + ?Sized>(fps: &S, warnings: &mut Vec<String>) -> Vec<u32> {
    let n = fps.count();
    let mut order: Vec<u32> = (0..n as u32).collect();
    // Inputs usually come in rank order: then there is nothing to sort.
    if !(1..n).all(|i| fps.rank(i - 1) <= fps.rank(i)) {
        order.sort_unstable_by_key(|&i| (fps.rank(i as usize), i));
    }
    let mut kept: Vec<u32> = Vec::with_capacity(order.len());
    let mut dups = 0usize;
    for i in order {
        let rank = fps.rank(i as usize);
        if let Some(&last) = kept.last() {
            if fps.rank(last as usize) == rank {
                dups += 1;
                if dups <= MAX_LISTED_WARNINGS {
                    warnings.push(format!(
                        "duplicate fingerprint for worker {} ({}): kept the first one ({})",
                        rank,
                        fps.source_name(i as usize),
                        fps.source_name(last as usize)
                    ));
                }
                continue;
            }
        }
        kept.push(i);
    }
    if dups > MAX_LISTED_WARNINGS {
        warnings.push(format!(
            "… and {} more duplicate fingerprints dropped",
            dups - MAX_LISTED_WARNINGS
        ));
    }

    kept
}

/// Ranks below the world size (or the largest rank seen) without a
/// fingerprint, the first [`MAX_MISSING_LISTED`] of them.
fn missing_ranks<S: Source + ?Sized>(
    fps: &S,
    kept: &[u32],
    world_size: Option<u32>,
    warnings: &mut Vec<String>,
) -> Vec<u32> {
    let expected_end: u64 = match world_size {
        Some(ws) => u64::from(ws),
        None => kept
            .last()
            .map(|&i| u64::from(fps.rank(i as usize)) + 1)
            .unwrap_or(0),
    };
    let mut missing = Vec::new();
    let mut n_missing = 0u64;
    {
        let mut next = 0u64;
        let mut push_range = |from: u64, to: u64, missing: &mut Vec<u32>| {
            n_missing += to.saturating_sub(from);
            let mut r = from;
            while r < to && missing.len() < MAX_MISSING_LISTED {
                missing.push(r as u32);
                r += 1;
            }
        };
        for &i in kept {
            let r = u64::from(fps.rank(i as usize));
            if r >= expected_end {
                break;
            }
            push_range(next, r, &mut missing);
            next = r + 1;
        }
        push_range(next, expected_end, &mut missing);
    }
    if n_missing > missing.len() as u64 {
        warnings.push(format!(
            "{} missing ranks; only the first {} are listed",
            n_missing,
            missing.len()
        ));
    }
    if let Some(ws) = world_size {
        let outside = kept.iter().filter(|&&i| fps.rank(i as usize) >= ws).count();
        if outside > 0 {
            warnings.push(format!(
                "{outside} fingerprint(s) have a rank >= the world size {ws}"
            ));
        }
    }

    missing
}

/// The job's utilization source (`samples`, `trace`, `none`, `mixed`) and
/// its number of hosts, when known.
fn utilization_and_hosts<S: Source + ?Sized>(fps: &S, kept: &[u32]) -> (String, Option<usize>) {
    let (mut s_samples, mut s_trace, mut s_none) = (false, false, false);
    for &i in kept {
        match fps.utilization_source(i as usize) {
            UtilizationSource::Samples => s_samples = true,
            UtilizationSource::Trace => s_trace = true,
            UtilizationSource::None => s_none = true,
        }
    }
    let hosts = fps.count_hosts(kept);
    let utilization_source = match (s_samples, s_trace, s_none) {
        (true, false, false) => "samples",
        (false, true, false) => "trace",
        (false, false, _) => "none",
        _ => "mixed",
    }
    .to_string();

    (utilization_source, (hosts > 0).then_some(hosts))
}

/// Comparison groups, by name (None first), members in rank order; warns
/// about ungrouped workers beside groups and groups too small for Δ.
fn comparison_groups<'a, S: Source + ?Sized>(
    fps: &'a S,
    kept: &[u32],
    cfg: &LocalizeConfig,
    warnings: &mut Vec<String>,
) -> Vec<(Option<&'a str>, Vec<u32>)> {
    let mut group_index: HashMap<Option<&str>, usize> = HashMap::new();
    let mut groups: Vec<(Option<&str>, Vec<u32>)> = Vec::new();
    for &i in kept {
        let gname = fps.group(i as usize);
        let gi = *group_index.entry(gname).or_insert_with(|| {
            groups.push((gname, Vec::new()));
            groups.len() - 1
        });
        groups[gi].1.push(i);
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    if groups.len() > 1 {
        if let Some((None, m)) = groups.first() {
            warnings.push(format!(
                "{} worker(s) have no group while others do: they are compared among themselves",
                m.len()
            ));
        }
    }
    let mut small = 0usize;
    for (gname, m) in &groups {
        if m.len() < cfg.min_peer_workers {
            small += 1;
            if small <= MAX_LISTED_WARNINGS {
                warnings.push(format!(
                    "{} has {} worker(s): too few to compare with peers (Δ rule needs {}), only expected ranges apply",
                    gname.map_or_else(|| "the job".to_string(), |g| format!("group {g:?}")),
                    m.len(),
                    cfg.min_peer_workers
                ));
            }
        }
    }

    groups
}

/// The cause first (whyslow, not in the papers): each finding's share of the
/// iteration ([`Finding::explains`]); a collective in which the other
/// workers wait for the workers of a finding on part of the group, and other
/// functions slower on exactly those workers, are folded under that finding
/// as [`Finding::consequences`]; then the findings are ordered by what they
/// explain.
fn cause_first(mut findings: Vec<Finding>, cfg: &LocalizeConfig) -> Vec<Finding> {
    let partial = |f: &Finding| f.group_workers > 0 && f.workers.len() < f.group_workers;
    for f in &mut findings {
        f.explains = if partial(f) {
            (f.beta.value - f.beta.peers).max(0.0)
        } else {
            (f.beta.value - cfg.range_for(f.kind, &f.function).beta.1).max(0.0)
        };
    }
    // Causes: findings on part of a group that are not themselves waiting.
    let mut order: Vec<usize> = (0..findings.len()).collect();
    order.sort_by(|&a, &b| {
        findings[b]
            .explains
            .total_cmp(&findings[a].explains)
            .then_with(|| findings[a].function.cmp(&findings[b].function))
    });
    let mut folded = vec![false; findings.len()];
    let mut rescored: Vec<(usize, f64)> = Vec::new();
    for &c in &order {
        if folded[c] || !partial(&findings[c]) || findings[c].kind == FunctionKind::Comm {
            continue;
        }
        let mut consequences = Vec::new();
        for &o in &order {
            if o == c || folded[o] || findings[o].group != findings[c].group {
                continue;
            }
            let (cause, other) = (&findings[c], &findings[o]);
            let relation = if other.kind == FunctionKind::Comm {
                // Waiting: the others spend more of their window in the
                // collective than the cause's workers do.
                let (on, off) = split_points(other, &cause.workers);
                let (mut on, mut off) = (on, off);
                let (b_on, b_off) = (median(&mut on), median(&mut off));
                // Not folded: a collective flagged on the cause's own
                // workers, or one above its expected range even there; one
                // whose plot points do not include the cause's workers (no
                // evidence either way); and one flagged on other workers that
                // do not themselves spend more of their window in it than the
                // cause's workers (a slow link of their own, not waiting).
                let own = partial(other) && other.workers.iter().any(|w| cause.workers.contains(w));
                let range_max = cfg.range_for(other.kind, &other.function).beta.1;
                let beyond = b_on > range_max;
                let waits = !partial(other) || other.beta.value - b_on >= cfg.min_effect;
                // Flagged on other workers *starved* in it (μ or σ that far
                // below their peers': low and steady, PerfTracker Fig. 5):
                // a slow link of their own, not a wait for the cause.
                let starved_itself = partial(other)
                    && other.util_source != UtilizationSource::None
                    && other.mu.has_peers()
                    && (other.mu.value <= other.mu.peers - cfg.min_util_diff
                        || other.sigma.value <= other.sigma.peers - cfg.min_util_diff);
                let waiting_on_cause = !own
                    && !starved_itself
                    && waits
                    && !on.is_empty()
                    && !off.is_empty()
                    && b_off - b_on >= cfg.min_effect;
                if waiting_on_cause && beyond {
                    // Above its range even on the cause's workers: the
                    // collective stays a finding of its own, but what it
                    // explains is only that excess; the rest is waiting.
                    rescored.push((o, (b_on - range_max).max(0.0)));
                }
                (waiting_on_cause && !beyond).then(|| {
                    let waiting: Vec<u32> = other
                        .points
                        .iter()
                        .filter(|p| !cause.workers.contains(&p.worker))
                        .map(|p| p.worker)
                        .collect();
                    (Relation::WaitsFor, waiting, b_off, b_on)
                })
            } else if partial(other) && other.workers == cause.workers {
                Some((
                    Relation::AlsoSlower,
                    other.workers.clone(),
                    other.beta.value,
                    other.beta.peers,
                ))
            } else {
                None
            };
            let Some((relation, workers, value, peers)) = relation else {
                continue;
            };
            consequences.push(Consequence {
                function: other.function.clone(),
                kind: other.kind,
                relation,
                workers,
                beta: Stat {
                    value,
                    peers,
                    peer_count: None,
                },
            });
            folded[o] = true;
        }
        findings[c].consequences = consequences;
    }
    for (o, explains) in rescored {
        findings[o].explains = findings[o].explains.min(explains);
    }
    let mut kept: Vec<Finding> = findings
        .into_iter()
        .zip(folded)
        .filter_map(|(f, folded)| (!folded).then_some(f))
        .collect();
    kept.sort_by(|a, b| {
        b.explains
            .total_cmp(&a.explains)
            .then_with(|| by_weight(a, b))
    });
    kept
}

/// Median flagged β × flagged workers, descending; then function and group
/// names, so that the order does not depend on the input's.
fn by_weight(a: &Finding, b: &Finding) -> std::cmp::Ordering {
    let ka = a.beta.value * a.workers.len() as f64;
    let kb = b.beta.value * b.workers.len() as f64;
    kb.total_cmp(&ka)
        .then_with(|| a.function.cmp(&b.function))
        .then_with(|| a.group.cmp(&b.group))
}

/// β of a finding's plotted workers on `workers` and on the others.
fn split_points(f: &Finding, workers: &[u32]) -> (Vec<f64>, Vec<f64>) {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for p in &f.points {
        if workers.contains(&p.worker) {
            on.push(p.beta);
        } else {
            off.push(p.beta);
        }
    }
    (on, off)
}

#[cfg(test)]
mod tests;
