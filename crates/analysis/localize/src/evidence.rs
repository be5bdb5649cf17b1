//! The noise guard's evidence off the critical path (crate docs, "Noise";
//! not in the papers): each worker's run time in a function as a share of
//! its window, and μ, σ, compared with the peers' medians.

use crate::columns::{BucketValues, Ctx, GroupColumns};
use crate::source::Source;
use crate::stats::{clean, median};
use crate::LocalizeConfig;

/// What a (group, function) bucket says off the critical path: each
/// worker's run time in the function as a share of its window, and μ, σ.
pub(crate) struct Evidence<'x> {
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
pub(crate) struct PeerMedians {
    share: f64,
    beta: f64,
    mu: Option<f64>,
    sigma: Option<f64>,
}

impl<'x> Evidence<'x> {
    pub(crate) fn new<S: Source + ?Sized>(
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
    pub(crate) fn peers(&self, candidates: &[usize], g: usize) -> PeerMedians {
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
    pub(crate) fn corroborated(&self, i: usize, peers: &PeerMedians, cfg: &LocalizeConfig) -> bool {
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
