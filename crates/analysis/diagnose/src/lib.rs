//! Cross-layer diagnosis over the CPU stack profiles the node agents write
//! (SysOM-AI §3.1), pure: profiles in, verdicts out.
//!
//! * **CPU waterline** ([`waterline`]): per communication group, each
//!   function's CPU share on every rank; a rank whose share of a function
//!   exceeds the group's μ + kσ (k = 2) is flagged, with the function and the
//!   path to it: the CPU layer of the cross-rank differential diagnosis.
//! * **Slow-rank detection** ([`stragglers::slow_ranks`]): from collective
//!   records, the rank that enters its group's collectives late (clocks
//!   aligned on the collectives' near-simultaneous exits).
//! * **Network** ([`network::lossy_hosts`]): hosts whose TCP segments are
//!   retransmitted over a floor (not in the paper, which leaves network
//!   causes to "additional network-layer instrumentation", §7).
//! * **Temporal baseline** ([`regressions`]): when all ranks slowed alike,
//!   the group's profile now against its own healthy past; a function whose
//!   CPU share rose by more than δ (0.5 percentage points) is a degradation
//!   candidate.
//!
//! Shares are *inclusive*: the fraction of a profile's samples whose stack
//! holds the function anywhere (a flame graph's width). A function is named
//! by what it is, not where the sample was in it: Python frames without
//! their line, native and kernel frames by symbol (or module + offset).
//!
//! Two deviations from the paper keep small groups and short windows honest,
//! both documented where they apply: the waterline's μ and σ leave the tested
//! rank out (with it, one outlier among n ≤ 5 ranks can never exceed μ + 2σ),
//! and a share change must also be statistically clear (a two-proportion z
//! ≥ [`Config::min_z`]), since δ = 0.5 pp is within sampling noise for a few
//! thousand samples.
#![deny(missing_docs)]

pub mod gpu;
pub mod job;
pub mod layer;
pub mod network;
mod stages;
pub mod stragglers;

use std::collections::{BTreeMap, HashMap};

pub use job::{
    diagnose, judge_network, link_rank, parse_range, DiagnoseConfig, DiagnoseError, Diagnosis,
    FlamePair, LateGroup, ProfileKind,
};
use serde::{Deserialize, Serialize};
pub use whyslow_model::diagnosis::{DiagnoseEvidence, DiagnoseReport, Regression};
use whyslow_model::stack::{Frame, FrameKind, StackProfile};

/// Thresholds. `Default` gives the paper's values (k = 2, δ = 0.5 %).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    /// k of the waterline's μ + kσ.
    pub k: f64,
    /// δ: least rise of a function's share (fraction, 0.005 = 0.5 pp) for a
    /// regression, and least excess over the group's mean for a waterline
    /// flag.
    pub delta: f64,
    /// Least two-proportion z of a share difference (not in the paper).
    pub min_z: f64,
    /// Least samples a profile needs to be judged.
    pub min_samples: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            k: 2.0,
            delta: 0.005,
            min_z: 4.0,
            min_samples: 50,
        }
    }
}

/// CPython's bytecode loop: in a stitched stack it stands for the Python
/// frames that replaced it; where it is left (a sample whose Python stack
/// was read too late, or a frame-pointer-only host profile) it says only
/// "some Python code", and how often that happens depends on the profiler's
/// timing, not the rank.
const INTERPRETER_LOOP: &str = "_PyEval_EvalFrameDefault";

/// The identity of a function in a frame (see the module docs); `None` for
/// labels (thread and process names) and the interpreter's loop.
pub fn function_of(f: &Frame) -> Option<String> {
    if f.name.as_deref() == Some(INTERPRETER_LOOP) {
        return None;
    }
    match f.kind {
        FrameKind::Label => None,
        FrameKind::Python => Some(match (&f.name, &f.module) {
            (Some(n), Some(m)) => format!("{n} ({m})"),
            (Some(n), None) => n.clone(),
            (None, _) => "[python]".to_string(),
        }),
        _ => Some(match (&f.name, &f.module) {
            (Some(n), _) => n.clone(),
            // An address in no file (`[stack]`, `[anon]`, `[unknown]`: a
            // frame-pointer walk gone astray, JIT code) is the same
            // "function" wherever it lies: its offset differs per process.
            (None, Some(m)) if m.starts_with('[') && m != "[kernel]" => m.clone(),
            (None, None) if f.kind != FrameKind::Kernel => "[unknown]".to_string(),
            (None, _) => Frame {
                line: None,
                ..f.clone()
            }
            .display(),
        }),
    }
}

/// Inclusive function shares of one or more profiles taken together.
#[derive(Debug, Clone, Default)]
pub struct Shares {
    /// Samples.
    pub total: u64,
    /// Samples whose stack holds the function.
    pub samples: HashMap<String, u64>,
    /// The heaviest stack through the function, within the root (process,
    /// or thread) with the most samples through it: its functions root
    /// first, up to the function, and that stack's samples. Per root first:
    /// a process whose samples spread over many full stacks (an
    /// interpreter's, unwound completely) is still the one that ran the
    /// function most.
    pub hottest: HashMap<String, (Vec<String>, u64)>,
}

impl Shares {
    /// Shares of `profiles` together.
    pub fn of<'a>(profiles: impl IntoIterator<Item = &'a StackProfile>) -> Shares {
        Shares::of_with(profiles, None)
    }

    /// Shares of node-wide profiles together, where each stack's root label
    /// (its process, `comm [pid]`) counts as a function too, named by
    /// `process` from that label: what else ran on a host is first of all
    /// which process it was.
    pub fn of_processes<'a>(
        profiles: impl IntoIterator<Item = &'a StackProfile>,
        process: &dyn Fn(&str) -> String,
    ) -> Shares {
        Shares::of_with(profiles, Some(process))
    }

    fn of_with<'a>(
        profiles: impl IntoIterator<Item = &'a StackProfile>,
        process: Option<&dyn Fn(&str) -> String>,
    ) -> Shares {
        let mut s = Shares::default();
        // Function → root → (samples through it, heaviest path, its count).
        type ByRoot = HashMap<String, (u64, Vec<String>, u64)>;
        let mut by_root: HashMap<String, ByRoot> = HashMap::new();
        for p in profiles {
            let names: Vec<Option<String>> = p.frames.iter().map(function_of).collect();
            let roots: Vec<Option<String>> = p
                .frames
                .iter()
                .map(|f| match (process, f.kind, &f.name) {
                    (Some(name), FrameKind::Label, Some(label)) => Some(name(label)),
                    _ => None,
                })
                .collect();
            for st in &p.stacks {
                s.total += st.count;
                let root = st
                    .frames
                    .first()
                    .and_then(|&i| roots.get(i as usize).and_then(Option::as_ref));
                let path: Vec<&String> = root
                    .into_iter()
                    .chain(
                        st.frames
                            .iter()
                            .filter_map(|&i| names.get(i as usize).and_then(Option::as_ref)),
                    )
                    .collect();
                let Some(&first) = path.first() else {
                    continue;
                };
                let mut seen: Vec<&String> = Vec::with_capacity(path.len());
                for (depth, f) in path.iter().enumerate() {
                    if seen.contains(f) {
                        continue; // recursion counts once
                    }
                    seen.push(f);
                    *s.samples.entry((*f).clone()).or_insert(0) += st.count;
                    let roots = by_root.entry((*f).clone()).or_default();
                    let e = match roots.get_mut(first) {
                        Some(e) => e,
                        None => roots.entry(first.clone()).or_default(),
                    };
                    e.0 += st.count;
                    if st.count > e.2 {
                        e.1 = path[..=depth].iter().map(|x| (*x).clone()).collect();
                        e.2 = st.count;
                    }
                }
            }
        }
        for (f, roots) in by_root {
            if let Some((_, (_, path, n))) = roots
                .into_iter()
                .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(&a.0)))
            {
                s.hottest.insert(f, (path, n));
            }
        }
        s
    }

    /// The function's share of the samples (0 when there are none).
    pub fn share(&self, function: &str) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.samples.get(function).copied().unwrap_or(0) as f64 / self.total as f64
    }
}

/// Two-proportion z of `a` of `n` against `b` of `m`.
fn z(a: u64, n: u64, b: u64, m: u64) -> f64 {
    if n == 0 || m == 0 {
        return 0.0;
    }
    let (p1, p2) = (a as f64 / n as f64, b as f64 / m as f64);
    let p = (a + b) as f64 / (n + m) as f64;
    let se = (p * (1.0 - p) * (1.0 / n as f64 + 1.0 / m as f64)).sqrt();
    if se == 0.0 {
        0.0
    } else {
        (p1 - p2) / se
    }
}

/// Temporal baseline (SysOM-AI §3.1): functions whose share of `after` rose
/// by more than δ over `before`, clearly beyond sampling noise; the largest
/// rise first. A new hot path's callers and callees rise with it, by at most
/// as much, so the first entry is where the new time enters.
pub fn regressions(group: &str, before: &Shares, after: &Shares, cfg: &Config) -> Vec<Regression> {
    if before.total < cfg.min_samples || after.total < cfg.min_samples {
        return Vec::new();
    }
    let mut out: Vec<Regression> = after
        .samples
        .iter()
        .filter_map(|(f, &a)| {
            let b = before.samples.get(f).copied().unwrap_or(0);
            let (pb, pa) = (before.share(f), after.share(f));
            (pa - pb > cfg.delta && z(a, after.total, b, before.total) >= cfg.min_z).then(|| {
                Regression {
                    group: group.to_string(),
                    function: f.clone(),
                    stack: after.hottest[f].0.join(";"),
                    before_share: pb,
                    after_share: pa,
                }
            })
        })
        .collect();
    // Largest rise first, a function that was already there after a callee
    // that explains at least half its rise (`_start` and `main` rose because
    // `log_tensor_stats` is new under them); a new function (its share grew
    // 4-fold or more) stays where its rise puts it, before its own callees
    // of equal rise: a new Python function spends most of its time in a
    // native callee (`pow`), and the function is what a user looks for.
    most_specific_first(
        &mut out,
        (0.5, f64::INFINITY),
        |r| r.after_share >= 4.0 * r.before_share,
        |r| (&r.group, "", &r.stack, r.after_share - r.before_share),
    );
    out
}

/// A rank whose share of a function is above its group's waterline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaterlineFlag {
    /// Communication group (or job).
    pub group: String,
    /// The rank.
    pub rank: String,
    /// The function.
    pub function: String,
    /// Its heaviest path on the rank, root first, `;`-joined.
    pub stack: String,
    /// The rank's share.
    pub share: f64,
    /// The other ranks' mean share (μ without this rank).
    pub peer_share: f64,
    /// μ + kσ over the other ranks.
    pub threshold: f64,
}

/// CPU waterline (SysOM-AI §3.1) of one group: `ranks` maps a rank to its
/// shares over the window. A rank is flagged for a function whose share
/// exceeds μ + kσ of the other ranks' shares and μ + δ, clearly beyond
/// sampling noise against the peers' pooled samples. At least 3 ranks.
/// Flags come largest excess first.
///
/// A rank is judged with at least `min_samples` samples; a peer counts in
/// μ and σ with a fifth of that (the z test against the peers' pooled
/// samples weighs how few they are): the peers of a straggler wait for it
/// off the CPU, so in a job whose ranks mostly wait for an accelerator they
/// are the ranks with the fewest samples (15-43 in 4 s beside a straggler's
/// 96-192 in the 3-rank tests).
pub fn waterline(
    group: &str,
    ranks: &BTreeMap<String, Shares>,
    cfg: &Config,
) -> Vec<WaterlineFlag> {
    let judged: Vec<(&String, &Shares)> = ranks
        .iter()
        .filter(|(_, s)| s.total >= (cfg.min_samples / 5).max(1))
        .collect();
    if judged.len() < 3 {
        return Vec::new();
    }
    let mut functions: Vec<&String> = judged.iter().flat_map(|(_, s)| s.samples.keys()).collect();
    functions.sort();
    functions.dedup();
    let mut out = Vec::new();
    for f in functions {
        let shares: Vec<f64> = judged.iter().map(|(_, s)| s.share(f)).collect();
        for (i, (rank, s)) in judged.iter().enumerate() {
            let others: Vec<f64> = shares
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &v)| v)
                .collect();
            let n = others.len() as f64;
            let mu = others.iter().sum::<f64>() / n;
            let sigma = (others.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / n).sqrt();
            let threshold = mu + cfg.k * sigma;
            let share = shares[i];
            if s.total < cfg.min_samples || share <= threshold || share - mu <= cfg.delta {
                continue;
            }
            let (peer_hits, peer_total) = judged
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .fold((0u64, 0u64), |(h, t), (_, (_, p))| {
                    (h + p.samples.get(f).copied().unwrap_or(0), t + p.total)
                });
            let hits = s.samples.get(f).copied().unwrap_or(0);
            if z(hits, s.total, peer_hits, peer_total) < cfg.min_z {
                continue;
            }
            out.push(WaterlineFlag {
                group: group.to_string(),
                rank: (*rank).clone(),
                function: f.clone(),
                stack: s.hottest[f].0.join(";"),
                share,
                peer_share: mu,
                threshold,
            });
        }
    }
    most_specific_first(
        &mut out,
        (0.5, f64::INFINITY),
        |_| false,
        |f| (&f.group, &f.rank, &f.stack, f.share - f.peer_share),
    );
    out
}

/// Orders items largest excess first, except that a function is listed
/// after a callee of it in the same list (same group and rank, its stack a
/// longer path through it) whose excess is at least `lo` and below `hi`
/// times its own: `main` is above the waterline, or rose since the
/// baseline, *because of* `injected_work` under it, and the callee is what a
/// user must read first. Of equal excesses, the caller first. Items for
/// which `kept` holds are never moved back. `key` gives (group, rank,
/// stack, excess).
fn most_specific_first<T: Clone>(
    items: &mut [T],
    (lo, hi): (f64, f64),
    kept: impl Fn(&T) -> bool,
    key: impl Fn(&T) -> (&str, &str, &str, f64),
) {
    let explained: Vec<bool> = items
        .iter()
        .map(|a| {
            if kept(a) {
                return false;
            }
            let (ga, ra, sa, ea) = key(a);
            let prefix = format!("{sa};");
            items.iter().any(|b| {
                let (gb, rb, sb, eb) = key(b);
                gb == ga && rb == ra && sb.starts_with(&prefix) && eb >= lo * ea && eb < hi * ea
            })
        })
        .collect();
    let depth = |s: &str| s.matches(';').count();
    let mut keyed: Vec<(bool, T)> = explained.into_iter().zip(items.iter().cloned()).collect();
    keyed.sort_by(|(xa, a), (xb, b)| {
        let (ka, kb) = (key(a), key(b));
        xa.cmp(xb)
            .then_with(|| kb.3.total_cmp(&ka.3))
            .then_with(|| depth(ka.2).cmp(&depth(kb.2)))
            .then_with(|| ka.2.cmp(kb.2))
    });
    for (slot, (_, item)) in items.iter_mut().zip(keyed) {
        *slot = item;
    }
}
