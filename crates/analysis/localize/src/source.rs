//! What the localizer reads of its input, whatever its representation: a
//! slice of [`Fingerprint`]s (what the CLI, the server, the agent and the
//! Python package hold) or a [`FingerprintTable`] (the compact columnar form
//! for very large jobs). The algorithm of PerfTracker §4.3 is written once,
//! against this trait; each representation only says how it is read.

use std::collections::BTreeSet;

use whyslow_model::{Fingerprint, FunctionKind, Resource, UtilizationSource};

use crate::columns::{GroupColumns, Interner};
use crate::table::{util_of, FingerprintTable};
use crate::LocalizeConfig;

/// One function pattern P_{f,w} (PerfTracker §4.2–4.3) as the localizer
/// reads it, values widened to f64.
#[derive(Clone, Copy)]
pub(crate) struct Pat<'s> {
    pub kind: FunctionKind,
    pub name: &'s str,
    pub resource: Resource,
    pub beta: f64,
    pub mu: f64,
    pub sigma: f64,
    pub util_source: UtilizationSource,
    pub critical_us: f64,
    pub total_us: f64,
}

/// Read access to the workers' fingerprints: worker `i` is the i-th
/// fingerprint of the input (duplicate ranks and all). A pattern is named by
/// its fingerprint and a handle that only the source interprets (the
/// pattern's position in a fingerprint; a table's function index).
pub(crate) trait Source {
    /// Number of fingerprints.
    fn count(&self) -> usize;
    /// Global rank of fingerprint `i`'s worker.
    fn rank(&self, i: usize) -> u32;
    /// Its host, when known.
    fn host(&self, i: usize) -> Option<&str>;
    /// Its comparison group, when known.
    fn group(&self, i: usize) -> Option<&str>;
    /// The file it was read from (for warnings).
    fn source_name(&self, i: usize) -> &str;
    /// Where its utilization came from overall.
    fn utilization_source(&self, i: usize) -> UtilizationSource;
    /// Its window length |T|, µs.
    fn window_us(&self, i: usize) -> f64;
    /// Its `total_floor` ([`Fingerprint::total_floor`]).
    fn total_floor(&self, i: usize) -> f64;
    /// Its omitted function hashes, ascending ([`Fingerprint::omitted`]).
    fn omitted(&self, i: usize) -> &[u32];
    /// Fingerprint `i`'s pattern with handle `h`.
    fn pattern(&self, i: usize, h: u32) -> Pat<'_>;
    /// Every pattern of fingerprint `i`, in its order.
    fn patterns_of<'s>(&'s self, i: usize, f: impl FnMut(Pat<'s>));
    /// Every pattern of every fingerprint of function kind `kind` (any when
    /// `None`) governed by `resource` (any when `None`): `f(i, pattern)`,
    /// the patterns of one fingerprint in its order (fingerprints may
    /// interleave).
    fn for_each_pattern<'s>(
        &'s self,
        kind: Option<FunctionKind>,
        resource: Option<Resource>,
        f: impl FnMut(usize, Pat<'s>),
    );
    /// Does any fingerprint have a pattern of one of `kinds`?
    fn has_kind(&self, kinds: &[FunctionKind]) -> bool;
    /// The group's columns: per function (kind + name, interned in
    /// `interner`; buckets in order of first appearance over the members),
    /// the (member index, handle) of each member that has it, by member.
    /// A function listed twice by a fingerprint: the first pattern counts,
    /// the others are added to `duplicates`.
    fn index_group<'s>(
        &'s self,
        members: &[u32],
        interner: &mut Interner<'s>,
        cfg: &LocalizeConfig,
        duplicates: &mut u64,
    ) -> GroupColumns;
    /// Number of distinct hosts among fingerprints `kept`.
    fn count_hosts(&self, kept: &[u32]) -> usize {
        kept.iter()
            .filter_map(|&i| self.host(i as usize))
            .collect::<BTreeSet<&str>>()
            .len()
    }
}

fn pat_of(q: &whyslow_model::FunctionPattern) -> Pat<'_> {
    Pat {
        kind: q.kind,
        name: &q.name,
        resource: q.resource,
        beta: q.beta,
        mu: q.mu,
        sigma: q.sigma,
        util_source: q.util_source,
        critical_us: q.critical_us,
        total_us: q.total_us,
    }
}

/// Builds a group's columns from `(member, function id)` pairs in member
/// order, visited twice by `visit` (two counting passes; 8 bytes an entry).
fn columns_from(
    n_ids: usize,
    duplicates: &mut u64,
    mut visit: impl FnMut(&mut dyn FnMut(u32, u32, u32)),
) -> GroupColumns {
    let mut local_of: Vec<u32> = vec![u32::MAX; n_ids];
    let mut touched: Vec<u32> = Vec::new();
    let mut counts: Vec<usize> = Vec::new();
    let mut last_member: Vec<u32> = Vec::new();
    visit(&mut |mi, fid, _h| {
        let fid = fid as usize;
        if fid >= local_of.len() {
            local_of.resize(fid + 1, u32::MAX);
        }
        let mut lb = local_of[fid];
        if lb == u32::MAX {
            lb = touched.len() as u32;
            local_of[fid] = lb;
            touched.push(fid as u32);
            counts.push(0);
            last_member.push(u32::MAX);
        }
        let lb = lb as usize;
        if last_member[lb] == mi {
            *duplicates += 1;
        } else {
            last_member[lb] = mi;
            counts[lb] += 1;
        }
    });
    let mut offsets = Vec::with_capacity(counts.len() + 1);
    let mut acc = 0usize;
    offsets.push(0);
    for &c in &counts {
        acc += c;
        offsets.push(acc);
    }
    let mut cur: Vec<usize> = offsets[..offsets.len() - 1].to_vec();
    let mut member = vec![0u32; acc];
    let mut handle = vec![0u32; acc];
    last_member.iter_mut().for_each(|m| *m = u32::MAX);
    visit(&mut |mi, fid, h| {
        let lb = local_of[fid as usize] as usize;
        if last_member[lb] == mi {
            return;
        }
        last_member[lb] = mi;
        let slot = cur[lb];
        cur[lb] += 1;
        member[slot] = mi;
        handle[slot] = h;
    });
    GroupColumns {
        offsets,
        fids: touched,
        member,
        handle,
    }
}

impl Source for [Fingerprint] {
    fn count(&self) -> usize {
        self.len()
    }
    fn rank(&self, i: usize) -> u32 {
        self[i].worker
    }
    fn host(&self, i: usize) -> Option<&str> {
        self[i].host.as_deref()
    }
    fn group(&self, i: usize) -> Option<&str> {
        self[i].group.as_deref()
    }
    fn source_name(&self, i: usize) -> &str {
        &self[i].source
    }
    fn utilization_source(&self, i: usize) -> UtilizationSource {
        self[i].utilization_source
    }
    fn window_us(&self, i: usize) -> f64 {
        self[i].window_us
    }
    fn total_floor(&self, i: usize) -> f64 {
        self[i].total_floor
    }
    fn omitted(&self, i: usize) -> &[u32] {
        &self[i].omitted
    }
    fn pattern(&self, i: usize, h: u32) -> Pat<'_> {
        pat_of(&self[i].functions[h as usize])
    }
    fn patterns_of<'s>(&'s self, i: usize, mut f: impl FnMut(Pat<'s>)) {
        self[i].functions.iter().for_each(|q| f(pat_of(q)));
    }
    fn for_each_pattern<'s>(
        &'s self,
        kind: Option<FunctionKind>,
        resource: Option<Resource>,
        mut f: impl FnMut(usize, Pat<'s>),
    ) {
        for (i, fp) in self.iter().enumerate() {
            for q in &fp.functions {
                if kind.is_none_or(|k| k == q.kind) && resource.is_none_or(|r| r == q.resource) {
                    f(i, pat_of(q));
                }
            }
        }
    }
    fn has_kind(&self, kinds: &[FunctionKind]) -> bool {
        self.iter()
            .any(|fp| fp.functions.iter().any(|p| kinds.contains(&p.kind)))
    }
    fn index_group<'s>(
        &'s self,
        members: &[u32],
        interner: &mut Interner<'s>,
        cfg: &LocalizeConfig,
        duplicates: &mut u64,
    ) -> GroupColumns {
        // Workers usually list functions in the same order: the function
        // seen at this position on the previous worker is tried first.
        let mut pos_cache: Vec<u32> = Vec::new();
        let n_ids = interner.names.len();
        columns_from(n_ids, duplicates, |emit| {
            for (mi, &fi) in members.iter().enumerate() {
                for (pi, p) in self[fi as usize].functions.iter().enumerate() {
                    let cached = pos_cache.get(pi).copied().filter(|&id| {
                        let id = id as usize;
                        interner.kinds.get(id) == Some(&p.kind)
                            && interner.names.get(id).is_some_and(|n| *n == p.name)
                    });
                    let fid = match cached {
                        Some(id) => id,
                        None => {
                            let id = interner.intern(p.kind, p.name.as_str(), cfg);
                            if pi < pos_cache.len() {
                                pos_cache[pi] = id;
                            } else {
                                pos_cache.resize(pi, u32::MAX);
                                pos_cache.push(id);
                            }
                            id
                        }
                    };
                    emit(mi as u32, fid, pi as u32);
                }
            }
        })
    }
}

impl Source for FingerprintTable {
    fn count(&self) -> usize {
        self.workers()
    }
    fn rank(&self, i: usize) -> u32 {
        self.rank[i]
    }
    fn host(&self, i: usize) -> Option<&str> {
        self.string(self.host_id(i))
    }
    fn group(&self, i: usize) -> Option<&str> {
        self.string(self.group_id(i))
    }
    fn source_name(&self, i: usize) -> &str {
        self.source(i)
    }
    fn utilization_source(&self, i: usize) -> UtilizationSource {
        self.utilization_source[i]
    }
    fn window_us(&self, i: usize) -> f64 {
        self.window_us[i]
    }
    fn total_floor(&self, i: usize) -> f64 {
        self.total_floor[i]
    }
    fn omitted(&self, i: usize) -> &[u32] {
        self.omitted_of(i)
    }
    fn pattern(&self, i: usize, h: u32) -> Pat<'_> {
        let col = &self.columns[h as usize];
        let k = i - col.start;
        let f = &self.functions[h as usize];
        Pat {
            kind: f.kind,
            name: &f.name,
            resource: f.resource,
            beta: f64::from(col.beta[k]),
            mu: f64::from(col.mu[k]),
            sigma: f64::from(col.sigma[k]),
            util_source: util_of(col.flags[k]),
            critical_us: f64::from(col.critical_us[k]),
            total_us: f64::from(col.total_us[k]),
        }
    }
    fn patterns_of<'s>(&'s self, i: usize, mut f: impl FnMut(Pat<'s>)) {
        for (h, col) in self.columns.iter().enumerate() {
            if col.flag(i) != 0 {
                f(self.pattern(i, h as u32));
            }
        }
    }
    fn for_each_pattern<'s>(
        &'s self,
        kind: Option<FunctionKind>,
        resource: Option<Resource>,
        mut f: impl FnMut(usize, Pat<'s>),
    ) {
        for (h, func) in self.functions.iter().enumerate() {
            if self.present[h] == 0
                || kind.is_some_and(|k| k != func.kind)
                || resource.is_some_and(|r| r != func.resource)
            {
                continue;
            }
            let col = &self.columns[h];
            for (k, &flag) in col.flags.iter().enumerate() {
                if flag != 0 {
                    f(col.start + k, self.pattern(col.start + k, h as u32));
                }
            }
        }
    }
    fn has_kind(&self, kinds: &[FunctionKind]) -> bool {
        self.functions
            .iter()
            .zip(&self.present)
            .any(|(f, &n)| n > 0 && kinds.contains(&f.kind))
    }
    fn index_group<'s>(
        &'s self,
        members: &[u32],
        interner: &mut Interner<'s>,
        cfg: &LocalizeConfig,
        duplicates: &mut u64,
    ) -> GroupColumns {
        if !self.duplicates.is_empty() {
            let mut member = vec![false; self.workers()];
            members.iter().for_each(|&fi| member[fi as usize] = true);
            for &(row, n) in &self.duplicates {
                if member[row as usize] {
                    *duplicates += u64::from(n);
                }
            }
        }
        // Functions in order of first appearance over the members, then
        // function order (a worker's patterns are in function order).
        let mut first: Vec<(usize, usize)> = Vec::new();
        for h in 0..self.functions.len() {
            if self.present[h] == 0 {
                continue;
            }
            let col = &self.columns[h];
            if let Some(mi) = members.iter().position(|&fi| col.flag(fi as usize) != 0) {
                first.push((mi, h));
            }
        }
        first.sort_unstable();
        let ids: Vec<u32> = first
            .iter()
            .map(|&(_, h)| {
                let f = &self.functions[h];
                interner.intern(f.kind, &f.name, cfg)
            })
            .collect();
        let n_ids = interner.names.len();
        columns_from(n_ids, duplicates, |emit| {
            for (&(_, h), &id) in first.iter().zip(&ids) {
                let col = &self.columns[h];
                for (mi, &fi) in members.iter().enumerate() {
                    if col.flag(fi as usize) != 0 {
                        emit(mi as u32, id, h as u32);
                    }
                }
            }
        })
    }
    fn count_hosts(&self, kept: &[u32]) -> usize {
        let mut seen = vec![false; self.strings_len()];
        let mut n = 0;
        for &i in kept {
            if let Some(s) = seen.get_mut(self.host_id(i as usize) as usize) {
                n += usize::from(!*s);
                *s = true;
            }
        }
        n
    }
}
