//! What the localizer holds while it works (PerfTracker §4.3): the interned
//! functions, a comparison group's columnar index, one bucket's values read
//! from the input, the analysis context and the reused scratch space.

use std::cell::OnceCell;
use std::collections::HashMap;

use whyslow_model::{FunctionKind, Resource, UtilizationSource};

use crate::hint::Job;
use crate::source::Source;
use crate::stats::{clean, FxBuild};
use crate::{ExpectedRange, LocalizeConfig};
#[cfg(doc)]
use {crate::evidence::Evidence, whyslow_model::Finding};

pub(crate) struct Interner<'a> {
    pub(crate) map: HashMap<(FunctionKind, &'a str), u32, FxBuild>,
    pub(crate) names: Vec<&'a str>,
    pub(crate) kinds: Vec<FunctionKind>,
    pub(crate) ranges: Vec<ExpectedRange>,
}

impl<'a> Interner<'a> {
    pub(crate) fn intern(
        &mut self,
        kind: FunctionKind,
        name: &'a str,
        cfg: &LocalizeConfig,
    ) -> u32 {
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

/// Flag bits per (function, worker) entry.
pub(crate) const CANDIDATE: u8 = 1; // β > beta_min
pub(crate) const OUTSIDE: u8 = 2; // D > 0

/// Columnar index of one comparison group: per function bucket (`fids`:
/// interned function ids), its entries `offsets[b]..offsets[b + 1]`, each a
/// member index and the pattern's handle in the input, sorted by member
/// index. The values are read per bucket, when it is analyzed
/// ([`BucketValues`]): 8 bytes an entry however many functions the group has.
pub(crate) struct GroupColumns {
    pub(crate) offsets: Vec<usize>,
    pub(crate) fids: Vec<u32>,
    pub(crate) member: Vec<u32>,
    pub(crate) handle: Vec<u32>,
}

/// One bucket's values, read once from the input: Δ's (β, μ, σ) as f32
/// (sanitized, then max-normalized in place), flags, and the values as the
/// noise guard and the findings read them ([`clean`]ed f64: β, μ, σ,
/// critical µs; has utilization).
#[derive(Default)]
pub(crate) struct BucketValues {
    pub(crate) beta: Vec<f32>,
    pub(crate) mu: Vec<f32>,
    pub(crate) sigma: Vec<f32>,
    pub(crate) flags: Vec<u8>,
    pub(crate) vals: Vec<([f64; 4], bool)>,
    pub(crate) total_us: Vec<f64>,
}

pub(crate) struct Ctx<'a, 'c, S: Source + ?Sized> {
    pub(crate) src: &'a S,
    pub(crate) cfg: &'c LocalizeConfig,
    /// Per [`Resource::ALL`] entry, filled when a finding first needs it:
    /// per fingerprint Σ critical µs × μ and Σ critical µs over its
    /// functions with measured utilization of that resource, for
    /// [`Finding::resource_mu`].
    pub(crate) resource_acc: [OnceCell<Vec<(f64, f64)>>; Resource::ALL.len()],
    pub(crate) interner: Interner<'a>,
    pub(crate) duplicate_functions: u64,
    pub(crate) job: Job,
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
    pub(crate) fn resource_acc(&self, r: usize) -> &[(f64, f64)] {
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
    pub(crate) fn read_bucket(
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

#[derive(Default)]
pub(crate) struct Scratch {
    pub(crate) sample: Vec<u32>,
    pub(crate) sb: Vec<f32>,
    pub(crate) sm: Vec<f32>,
    pub(crate) ss: Vec<f32>,
    pub(crate) counts: Vec<u32>,
    pub(crate) hist: Vec<u64>,
    pub(crate) dev_hist: Vec<u64>,
    /// Per present worker: far from the group's typical pattern?
    pub(crate) far: Vec<bool>,
    pub(crate) column: Vec<f64>,
    /// The bucket being analyzed.
    pub(crate) values: BucketValues,
    /// Per group member, for the noise guard ([`Evidence`]).
    pub(crate) share: Vec<f64>,
    pub(crate) entry_of: Vec<u32>,
    /// NaN, infinite or negative β/μ/σ read so far.
    pub(crate) invalid_values: u64,
}
