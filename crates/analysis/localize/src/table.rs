//! A compact columnar form of many workers' fingerprints, for localization
//! at the scale of a million workers (PerfTracker §4.3 compares every
//! worker's pattern P_{f,w} = (β, μ, σ) of every function f; §5 runs it on
//! thousands of GPUs).
//!
//! A [`Fingerprint`] owns its function names (one `String` per pattern) and
//! fields the localizer never reads: a million workers × 20 functions take
//! about 3.5 GB that way. A [`FingerprintTable`] names each function once
//! (kind, name and resource in a function table) and holds one dense column
//! per function and value (β, μ, σ, critical and total µs as `f32`, and a
//! flag byte): 21 bytes a (worker, function) slot, ~0.42 GB for 20 million.
//! Columns are kept function by function, which is how §4.3 reads them
//! (one function across all workers at a time). A function's column spans
//! the workers from the first that has it to the last: a function that only
//! the last workers ran costs nothing before them, one that a few workers
//! far apart ran costs a slot for every worker in between. The table suits
//! jobs whose workers run mostly the same functions (data-parallel
//! training), not thousands of functions each on a few workers.
//!
//! The table grows as fingerprints arrive ([`FingerprintTable::push_fingerprint`]:
//! a door can stream each fingerprint into it as it parses it and drop the
//! fingerprint), or is made for a known set of functions and workers
//! ([`FingerprintTable::new`]).
//!
//! [`crate::localize_table`] reads it with the same algorithm as
//! [`crate::localize`] reads fingerprints: a table built from fingerprints
//! whose values are `f32`-exact gives the same report; otherwise values
//! differ by `f32` rounding (a relative 6e-8), which moves a finding only
//! where a value lies that close to a threshold.

use std::collections::HashMap;

use whyslow_model::{Fingerprint, FunctionKind, Resource, UtilizationSource};

/// Errors of building a [`FingerprintTable`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum TableError {
    /// A pattern names a function index past the function table.
    #[error(
        "pattern of worker {worker} names function {index}, but the table has {len} functions"
    )]
    UnknownFunction {
        /// The worker's rank.
        worker: u32,
        /// The function index given.
        index: u32,
        /// The number of functions in the table.
        len: usize,
    },
    /// Two functions of the table have the same kind and name.
    #[error("function {name:?} ({kind:?}) is listed twice in the function table")]
    DuplicateFunction {
        /// Its kind.
        kind: FunctionKind,
        /// Its name.
        name: String,
    },
    /// More workers pushed than the table was made for.
    #[error("the table was made for {capacity} workers")]
    Full {
        /// Its number of worker slots.
        capacity: usize,
    },
    /// The table would have more slots than memory can address.
    #[error("{workers} workers × {functions} functions is too large a table")]
    TooLarge {
        /// Workers asked for.
        workers: usize,
        /// Functions in the table.
        functions: usize,
    },
}

/// One function of the table: its identity (kind + name, as in
/// [`whyslow_model::FunctionPattern`]) and the resource that governs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableFunction {
    /// Its class.
    pub kind: FunctionKind,
    /// Its name (for Python the whole stack, outermost first, `;`-joined).
    pub name: String,
    /// The resource that governs it.
    pub resource: Resource,
}

/// What the localizer reads of one worker's fingerprint besides its
/// patterns (the fields of [`Fingerprint`] of the same names).
#[derive(Debug, Clone, Copy)]
pub struct TableWorker<'x> {
    /// Global rank of the worker.
    pub worker: u32,
    /// Host, when known.
    pub host: Option<&'x str>,
    /// Group of workers expected to behave alike, when known.
    pub group: Option<&'x str>,
    /// The trace or events file summarized (named in warnings).
    pub source: &'x str,
    /// Where utilization came from overall.
    pub utilization_source: UtilizationSource,
    /// Window length |T|, µs.
    pub window_us: f64,
    /// Every function left out ran for less than this share of the window.
    pub total_floor: f64,
    /// Hashes of functions left out that ran a notable share, ascending.
    pub omitted: &'x [u32],
}

/// One function pattern of a worker, values as `f32` (the localizer's
/// Δ rule compares them in `f32` anyway).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TablePattern {
    /// Index of the function in the table's function list.
    pub function: u32,
    /// β: fraction of the window on the critical path (Eq. 2).
    pub beta: f32,
    /// μ: mean utilization over critical durations (Eq. 4).
    pub mu: f32,
    /// σ: std of utilization over critical durations (Eq. 5).
    pub sigma: f32,
    /// Where μ and σ came from.
    pub util_source: UtilizationSource,
    /// Time on the critical path, µs.
    pub critical_us: f32,
    /// Total execution time in the window, µs.
    pub total_us: f32,
}

/// Flag byte of a slot: present, and its utilization source.
const PRESENT: u8 = 0x80;

fn util_code(u: UtilizationSource) -> u8 {
    match u {
        UtilizationSource::Samples => 0,
        UtilizationSource::Trace => 1,
        UtilizationSource::None => 2,
    }
}

pub(crate) fn util_of(flag: u8) -> UtilizationSource {
    match flag & 3 {
        0 => UtilizationSource::Samples,
        1 => UtilizationSource::Trace,
        _ => UtilizationSource::None,
    }
}

/// One function's values, dense over the workers `start..start + len`
/// (a slot without the function has flag 0).
#[derive(Debug, Clone, Default)]
pub(crate) struct Column {
    /// The first worker (row) the column covers.
    pub(crate) start: usize,
    pub(crate) flags: Vec<u8>,
    pub(crate) beta: Vec<f32>,
    pub(crate) mu: Vec<f32>,
    pub(crate) sigma: Vec<f32>,
    pub(crate) critical_us: Vec<f32>,
    pub(crate) total_us: Vec<f32>,
}

impl Column {
    /// The slot of worker `row`, when the column covers it.
    pub(crate) fn index(&self, row: usize) -> Option<usize> {
        row.checked_sub(self.start)
            .filter(|&k| k < self.flags.len())
    }

    /// Worker `row`'s flag byte (0: no pattern).
    pub(crate) fn flag(&self, row: usize) -> u8 {
        self.index(row).map_or(0, |k| self.flags[k])
    }

    /// The value columns (β, μ, σ, critical and total µs), which grow
    /// together.
    fn value_columns(&mut self) -> [&mut Vec<f32>; 5] {
        [
            &mut self.beta,
            &mut self.mu,
            &mut self.sigma,
            &mut self.critical_us,
            &mut self.total_us,
        ]
    }

    /// Room for `n` more slots, so that a column whose size is known
    /// grows in one allocation.
    fn reserve(&mut self, n: usize) {
        self.flags.reserve(n);
        for v in self.value_columns() {
            v.reserve(n);
        }
    }

    /// Writes worker `row`'s pattern (rows come in ascending order); false
    /// when the row already has one (the first is kept).
    fn write(&mut self, row: usize, p: &TablePattern, reserve: usize) -> bool {
        if self.flags.is_empty() {
            self.start = row;
            self.reserve(reserve);
        }
        let k = row - self.start;
        if k < self.flags.len() {
            return false;
        }
        if k > self.flags.len() {
            // Workers between without the function: empty slots.
            self.flags.resize(k, 0);
            for v in self.value_columns() {
                v.resize(k, 0.0);
            }
        }
        self.flags.push(PRESENT | util_code(p.util_source));
        self.beta.push(p.beta);
        self.mu.push(p.mu);
        self.sigma.push(p.sigma);
        self.critical_us.push(p.critical_us);
        self.total_us.push(p.total_us);
        true
    }
}

/// Many workers' fingerprints in dense columns: a function table, per-worker
/// fields, and per (function, worker) slot the pattern's values (see the
/// module docs). Make it empty ([`FingerprintTable::default`]) and stream
/// fingerprints into it with [`FingerprintTable::push_fingerprint`], or
/// make it for known functions with [`FingerprintTable::new`] and fill it
/// with [`FingerprintTable::push_worker`] (or convert fingerprints with
/// [`FingerprintTable::from_fingerprints`]); localize it with
/// [`crate::localize_table`].
#[derive(Debug, Clone)]
pub struct FingerprintTable {
    pub(crate) functions: Vec<TableFunction>,
    /// Function indexes by name (with their kinds).
    function_ids: HashMap<String, Vec<(FunctionKind, u32)>>,
    /// The function of each pattern position of the last fingerprint
    /// pushed: workers usually list their functions in the same order.
    last_ids: Vec<u32>,
    /// Most workers ([`FingerprintTable::new`]; unbounded otherwise).
    limit: usize,
    /// Slots a column reserves when it starts (the workers expected).
    expected: usize,
    /// Hosts and groups, each distinct string once.
    strings: Vec<String>,
    string_ids: HashMap<String, u32>,
    last_string: [u32; 2],
    /// Sources, one after the other; `source_end[i]` ends worker i's.
    sources: String,
    source_end: Vec<usize>,
    // Per worker.
    pub(crate) rank: Vec<u32>,
    host: Vec<u32>,
    group: Vec<u32>,
    pub(crate) utilization_source: Vec<UtilizationSource>,
    pub(crate) window_us: Vec<f64>,
    pub(crate) total_floor: Vec<f64>,
    omitted_end: Vec<usize>,
    omitted: Vec<u32>,
    /// Workers that listed a function twice (the first pattern is kept),
    /// with how many patterns were dropped; ascending.
    pub(crate) duplicates: Vec<(u32, u32)>,
    /// Per function: workers that have it.
    pub(crate) present: Vec<usize>,
    /// Per function: its values.
    pub(crate) columns: Vec<Column>,
    /// Scratch for [`FingerprintTable::push_fingerprint`].
    scratch: Vec<TablePattern>,
}

/// No string (host or group unknown).
const NONE: u32 = u32::MAX;

impl Default for FingerprintTable {
    /// An empty table without functions that grows as workers are pushed.
    fn default() -> Self {
        Self {
            functions: Vec::new(),
            function_ids: HashMap::new(),
            last_ids: Vec::new(),
            limit: usize::MAX,
            expected: 0,
            strings: Vec::new(),
            string_ids: HashMap::new(),
            last_string: [NONE; 2],
            sources: String::new(),
            source_end: Vec::new(),
            rank: Vec::new(),
            host: Vec::new(),
            group: Vec::new(),
            utilization_source: Vec::new(),
            window_us: Vec::new(),
            total_floor: Vec::new(),
            omitted_end: Vec::new(),
            omitted: Vec::new(),
            duplicates: Vec::new(),
            present: Vec::new(),
            columns: Vec::new(),
            scratch: Vec::new(),
        }
    }
}

impl FingerprintTable {
    /// An empty table over `functions` (patterns name them by index) with
    /// room for `workers` workers, and no more.
    pub fn new(functions: Vec<TableFunction>, workers: usize) -> Result<Self, TableError> {
        workers
            .checked_mul(functions.len())
            .filter(|&s| s.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or(TableError::TooLarge {
                workers,
                functions: functions.len(),
            })?;
        let mut t = Self::with_capacity(workers);
        t.limit = workers;
        for f in functions {
            t.add_function(f)?;
        }
        Ok(t)
    }

    /// An empty growable table that expects about `workers` workers: each
    /// column reserves that many slots when it starts, so that a known
    /// number of fingerprints fills the table without reallocating.
    pub fn with_capacity(workers: usize) -> Self {
        let mut t = Self {
            expected: workers,
            ..Self::default()
        };
        t.rank.reserve(workers);
        t.host.reserve(workers);
        t.group.reserve(workers);
        t.source_end.reserve(workers);
        t.utilization_source.reserve(workers);
        t.window_us.reserve(workers);
        t.total_floor.reserve(workers);
        t.omitted_end.reserve(workers);
        t
    }

    /// Adds a function to the function table; its index.
    pub fn add_function(&mut self, f: TableFunction) -> Result<u32, TableError> {
        if self.function_index(f.kind, &f.name).is_some() {
            return Err(TableError::DuplicateFunction {
                kind: f.kind,
                name: f.name,
            });
        }
        let id = self.functions.len() as u32;
        self.function_ids
            .entry(f.name.clone())
            .or_default()
            .push((f.kind, id));
        self.functions.push(f);
        self.present.push(0);
        self.columns.push(Column::default());
        Ok(id)
    }

    /// The function table.
    pub fn functions(&self) -> &[TableFunction] {
        &self.functions
    }

    /// The index of the function of `kind` named `name`, when the table
    /// has it.
    pub fn function_index(&self, kind: FunctionKind, name: &str) -> Option<u32> {
        self.function_ids
            .get(name)?
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|&(_, id)| id)
    }

    /// Number of workers (fingerprints) pushed.
    pub fn workers(&self) -> usize {
        self.rank.len()
    }

    /// Worker `i`'s rank (workers in the order pushed).
    pub fn rank(&self, i: usize) -> u32 {
        self.rank[i]
    }

    /// Worker `i`'s host, when known.
    pub fn host(&self, i: usize) -> Option<&str> {
        self.string(self.host[i])
    }

    /// The file worker `i`'s fingerprint came from.
    pub fn source(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.source_end[i - 1] };
        &self.sources[start..self.source_end[i]]
    }

    /// Worker `i`'s pattern of function `function`, when it has one.
    pub fn pattern_of(&self, i: usize, function: u32) -> Option<TablePattern> {
        let col = self.columns.get(function as usize)?;
        let k = col.index(i).filter(|&k| col.flags[k] != 0)?;
        Some(TablePattern {
            function,
            beta: col.beta[k],
            mu: col.mu[k],
            sigma: col.sigma[k],
            util_source: util_of(col.flags[k]),
            critical_us: col.critical_us[k],
            total_us: col.total_us[k],
        })
    }

    /// Appends one worker's fingerprint: its fields and its patterns. A
    /// function listed twice: the first pattern is kept (the localizer
    /// warns, as it does for fingerprints). Nothing is appended on error.
    pub fn push_worker(
        &mut self,
        worker: &TableWorker<'_>,
        patterns: &[TablePattern],
    ) -> Result<(), TableError> {
        let row = self.rank.len();
        if row >= self.limit {
            return Err(TableError::Full {
                capacity: self.limit,
            });
        }
        if row >= u32::MAX as usize {
            return Err(TableError::TooLarge {
                workers: row + 1,
                functions: self.functions.len(),
            });
        }
        if let Some(p) = patterns
            .iter()
            .find(|p| p.function as usize >= self.functions.len())
        {
            return Err(TableError::UnknownFunction {
                worker: worker.worker,
                index: p.function,
                len: self.functions.len(),
            });
        }
        let host = self.intern(worker.host, 0);
        let group = self.intern(worker.group, 1);
        self.sources.push_str(worker.source);
        self.source_end.push(self.sources.len());
        self.rank.push(worker.worker);
        self.host.push(host);
        self.group.push(group);
        self.utilization_source.push(worker.utilization_source);
        self.window_us.push(worker.window_us);
        self.total_floor.push(worker.total_floor);
        self.omitted.extend_from_slice(worker.omitted);
        self.omitted_end.push(self.omitted.len());
        let reserve = self.expected.saturating_sub(row);
        let mut dropped = 0u32;
        for p in patterns {
            let f = p.function as usize;
            if self.columns[f].write(row, p, reserve) {
                self.present[f] += 1;
            } else {
                dropped += 1;
            }
        }
        if dropped > 0 {
            self.duplicates.push((row as u32, dropped));
        }
        Ok(())
    }

    /// Appends one fingerprint, its values rounded to `f32`; a function
    /// the table does not have yet is added (with the resource of this
    /// pattern). The fingerprint can be dropped afterwards.
    pub fn push_fingerprint(&mut self, fp: &Fingerprint) -> Result<(), TableError> {
        let mut patterns = std::mem::take(&mut self.scratch);
        patterns.clear();
        for (pi, p) in fp.functions.iter().enumerate() {
            let cached = self.last_ids.get(pi).copied().filter(|&id| {
                let f = &self.functions[id as usize];
                f.kind == p.kind && f.name == p.name
            });
            let function = match cached.or_else(|| self.function_index(p.kind, &p.name)) {
                Some(id) => id,
                None => match self.add_function(TableFunction {
                    kind: p.kind,
                    name: p.name.clone(),
                    resource: p.resource,
                }) {
                    Ok(id) => id,
                    Err(e) => {
                        self.scratch = patterns;
                        return Err(e);
                    }
                },
            };
            if pi < self.last_ids.len() {
                self.last_ids[pi] = function;
            } else {
                self.last_ids.push(function);
            }
            patterns.push(TablePattern {
                function,
                beta: p.beta as f32,
                mu: p.mu as f32,
                sigma: p.sigma as f32,
                util_source: p.util_source,
                critical_us: p.critical_us as f32,
                total_us: p.total_us as f32,
            });
        }
        let r = self.push_worker(
            &TableWorker {
                worker: fp.worker,
                host: fp.host.as_deref(),
                group: fp.group.as_deref(),
                source: &fp.source,
                utilization_source: fp.utilization_source,
                window_us: fp.window_us,
                total_floor: fp.total_floor,
                omitted: &fp.omitted,
            },
            &patterns,
        );
        self.scratch = patterns;
        r
    }

    /// The table of `fps`, functions in order of first appearance (one per
    /// kind and name, with the resource of its first pattern), values
    /// rounded to `f32`.
    pub fn from_fingerprints(fps: &[Fingerprint]) -> Result<Self, TableError> {
        let mut t = Self::with_capacity(fps.len());
        for fp in fps {
            t.push_fingerprint(fp)?;
        }
        Ok(t)
    }

    /// The id of a host (`slot` 0) or group (1), added when new; the last
    /// id of each is remembered, as consecutive workers usually share
    /// them. Ids past `u32::MAX - 1` strings read as unknown.
    fn intern(&mut self, s: Option<&str>, slot: usize) -> u32 {
        let Some(s) = s else { return NONE };
        let last = self.last_string[slot];
        if self.string(last) == Some(s) {
            return last;
        }
        let id = match self.string_ids.get(s) {
            Some(&id) => id,
            None => {
                let id = u32::try_from(self.strings.len()).unwrap_or(NONE);
                if id == NONE {
                    return NONE;
                }
                self.strings.push(s.to_string());
                self.string_ids.insert(s.to_string(), id);
                id
            }
        };
        self.last_string[slot] = id;
        id
    }

    pub(crate) fn string(&self, id: u32) -> Option<&str> {
        self.strings.get(id as usize).map(String::as_str)
    }

    pub(crate) fn strings_len(&self) -> usize {
        self.strings.len()
    }

    pub(crate) fn host_id(&self, i: usize) -> u32 {
        self.host[i]
    }

    pub(crate) fn group_id(&self, i: usize) -> u32 {
        self.group[i]
    }

    /// Worker `i`'s omitted hashes.
    pub(crate) fn omitted_of(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.omitted_end[i - 1] };
        &self.omitted[start..self.omitted_end[i]]
    }
}
