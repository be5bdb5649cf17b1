//! A (group, function) bucket's flagged workers made into a [`Finding`]
//! (PerfTracker §4.3; crate docs, "Findings"): the medians of the flagged
//! workers and their peers, the resource and utilization source, the
//! resource over the rest of the critical path, and the plotted points.

use std::collections::BTreeSet;

use whyslow_model::{
    Finding, FunctionKind, Reason, Resource, Stat, UtilizationSource, WorkerPoint,
};

use crate::columns::{Ctx, GroupColumns};
use crate::hint::hint;
use crate::source::{self, Source};
use crate::stats::{keep_evenly, median};

/// One (group, function) bucket, as its findings are built: the group's
/// members, its columns (entries `lo..hi` are the function's), their values
/// (`values[i]` is entry `lo + i`'s), the function.
pub(crate) struct Bucket<'x, 'a, 'c, S: Source + ?Sized> {
    pub(crate) ctx: &'x Ctx<'a, 'c, S>,
    pub(crate) members: &'x [u32],
    pub(crate) group: Option<&'x str>,
    pub(crate) cols: &'x GroupColumns,
    pub(crate) values: &'x [([f64; 4], bool)],
    pub(crate) lo: usize,
    pub(crate) hi: usize,
    pub(crate) kind: FunctionKind,
    pub(crate) name: &'x str,
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

pub(crate) fn build_finding<S: Source + ?Sized>(
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
