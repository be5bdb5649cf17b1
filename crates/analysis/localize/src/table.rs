//! A compact columnar form of many workers' fingerprints, for localization
//! at the scale of a million workers (PerfTracker §4.3 compares every
//! worker's pattern P_{f,w} = (β, μ, σ) of every function f; §5 runs it on
//! thousands of GPUs).
//!
//! A [`Fingerprint`] owns its function names (one `String` per pattern) and
//! fields the localizer never reads: a million workers × 20 functions take
//! about 3.2 GB that way. A [`FingerprintTable`] names each function once
//! (kind, name and resource in a function table) and holds one dense column
//! per function and value (β, μ, σ, critical and total µs as `f32`, and a
//! flag byte): 21 bytes a (worker, function) slot, ~0.44 GB for 20 million.
//! Columns are laid out function by function, which is how §4.3 reads them
//! (one function across all workers at a time). A slot a worker never fills
//! is never written, so a function that few workers ran costs little
//! resident memory; still, the table suits jobs whose workers run mostly the
//! same functions (data-parallel training), not thousands of functions each
//! on a few workers.
//!
//! [`crate::localize_table`] reads it with the same algorithm as
//! [`crate::localize`] reads fingerprints: a table built from fingerprints
//! whose values are `f32`-exact gives the same report.

use std::collections::HashMap;

use whyslow_model::{Fingerprint, FunctionKind, Resource, UtilizationSource};

/// Errors of building a [`FingerprintTable`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
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

/// Many workers' fingerprints in dense columns: a function table, per-worker
/// fields, and per (function, worker) slot the pattern's values (see the
/// module docs). Make it with [`FingerprintTable::new`] for a number of
/// workers, fill it with [`FingerprintTable::push_worker`] (or convert
/// fingerprints with [`FingerprintTable::from_fingerprints`]) and localize
/// it with [`crate::localize_table`].
#[derive(Debug, Clone, Default)]
pub struct FingerprintTable {
    pub(crate) functions: Vec<TableFunction>,
    /// Slots per function column (the most workers).
    pub(crate) capacity: usize,
    /// Hosts, groups and sources, each distinct string once.
    strings: Vec<String>,
    string_ids: HashMap<String, u32>,
    last_string: [u32; 3],
    // Per worker.
    pub(crate) rank: Vec<u32>,
    host: Vec<u32>,
    group: Vec<u32>,
    source: Vec<u32>,
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
    // Per slot, function-major: slot = function × capacity + worker.
    pub(crate) flags: Vec<u8>,
    pub(crate) beta: Vec<f32>,
    pub(crate) mu: Vec<f32>,
    pub(crate) sigma: Vec<f32>,
    pub(crate) critical_us: Vec<f32>,
    pub(crate) total_us: Vec<f32>,
}

/// No string (host or group unknown).
const NONE: u32 = u32::MAX;

impl FingerprintTable {
    /// An empty table over `functions` (patterns name them by index) with
    /// room for `workers` workers. The columns are allocated zeroed, so
    /// slots take resident memory only once written.
    pub fn new(functions: Vec<TableFunction>, workers: usize) -> Result<Self, TableError> {
        let mut seen: HashMap<(FunctionKind, &str), ()> = HashMap::new();
        for f in &functions {
            if seen.insert((f.kind, f.name.as_str()), ()).is_some() {
                return Err(TableError::DuplicateFunction {
                    kind: f.kind,
                    name: f.name.clone(),
                });
            }
        }
        let slots = workers
            .checked_mul(functions.len())
            .filter(|&s| s.checked_mul(4).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or(TableError::TooLarge {
                workers,
                functions: functions.len(),
            })?;
        Ok(Self {
            present: vec![0; functions.len()],
            functions,
            capacity: workers,
            last_string: [NONE; 3],
            rank: Vec::with_capacity(workers),
            host: Vec::with_capacity(workers),
            group: Vec::with_capacity(workers),
            source: Vec::with_capacity(workers),
            utilization_source: Vec::with_capacity(workers),
            window_us: Vec::with_capacity(workers),
            total_floor: Vec::with_capacity(workers),
            omitted_end: Vec::with_capacity(workers),
            flags: vec![0; slots],
            beta: vec![0.0; slots],
            mu: vec![0.0; slots],
            sigma: vec![0.0; slots],
            critical_us: vec![0.0; slots],
            total_us: vec![0.0; slots],
            ..Self::default()
        })
    }

    /// The function table.
    pub fn functions(&self) -> &[TableFunction] {
        &self.functions
    }

    /// Number of workers (fingerprints) pushed.
    pub fn workers(&self) -> usize {
        self.rank.len()
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
        if row >= self.capacity {
            return Err(TableError::Full {
                capacity: self.capacity,
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
        let source = self.intern(Some(worker.source), 2);
        self.rank.push(worker.worker);
        self.host.push(host);
        self.group.push(group);
        self.source.push(source);
        self.utilization_source.push(worker.utilization_source);
        self.window_us.push(worker.window_us);
        self.total_floor.push(worker.total_floor);
        self.omitted.extend_from_slice(worker.omitted);
        self.omitted_end.push(self.omitted.len());
        let mut dropped = 0u32;
        for p in patterns {
            let f = p.function as usize;
            let slot = f * self.capacity + row;
            if self.flags[slot] & PRESENT != 0 {
                dropped += 1;
                continue;
            }
            self.flags[slot] = PRESENT | util_code(p.util_source);
            self.beta[slot] = p.beta;
            self.mu[slot] = p.mu;
            self.sigma[slot] = p.sigma;
            self.critical_us[slot] = p.critical_us;
            self.total_us[slot] = p.total_us;
            self.present[f] += 1;
        }
        if dropped > 0 {
            self.duplicates.push((row as u32, dropped));
        }
        Ok(())
    }

    /// The table of `fps`, functions in order of first appearance (one per
    /// kind and name, with the resource of its first pattern), values
    /// rounded to `f32`.
    pub fn from_fingerprints(fps: &[Fingerprint]) -> Result<Self, TableError> {
        let mut ids: HashMap<(FunctionKind, &str), u32> = HashMap::new();
        let mut functions = Vec::new();
        for p in fps.iter().flat_map(|fp| &fp.functions) {
            ids.entry((p.kind, p.name.as_str())).or_insert_with(|| {
                functions.push(TableFunction {
                    kind: p.kind,
                    name: p.name.clone(),
                    resource: p.resource,
                });
                (functions.len() - 1) as u32
            });
        }
        let mut t = Self::new(functions, fps.len())?;
        let mut patterns = Vec::new();
        for fp in fps {
            patterns.clear();
            patterns.extend(fp.functions.iter().map(|p| TablePattern {
                function: ids[&(p.kind, p.name.as_str())],
                beta: p.beta as f32,
                mu: p.mu as f32,
                sigma: p.sigma as f32,
                util_source: p.util_source,
                critical_us: p.critical_us as f32,
                total_us: p.total_us as f32,
            }));
            t.push_worker(
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
            )?;
        }
        Ok(t)
    }

    /// The id of a string, added when new. `slot` (0: host, 1: group, 2:
    /// source) remembers the last id of each field: consecutive workers
    /// usually share their host, group and source. Ids past `u32::MAX - 1`
    /// strings read as unknown.
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

    pub(crate) fn source_id(&self, i: usize) -> u32 {
        self.source[i]
    }

    /// Worker `i`'s omitted hashes.
    pub(crate) fn omitted_of(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.omitted_end[i - 1] };
        &self.omitted[start..self.omitted_end[i]]
    }
}
