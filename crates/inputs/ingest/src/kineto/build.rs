//! Classification of Kineto events into whyslow's five function kinds, and
//! assembly of a [`WorkerTrace`]. The rules are documented on
//! [`crate::kineto`].

use whyslow_model::{
    Execution, FunctionId, FunctionKind, FunctionTable, Resource, WorkerTrace, UNKNOWN_UTIL,
};

use super::raw::{Args, Bytes, DeviceProp, DistributedInfo, FxMap, Num, RawEvent};
use crate::peaks;

/// How the raw `trace_util` stored during streaming becomes a utilization.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Norm {
    /// Already in [0, 1] (occupancy) or NaN.
    Ready,
    /// Bandwidth in GB/s: divide by the peak of the function's resource.
    Bandwidth,
}

#[derive(Debug)]
struct LocalFn {
    kind: FunctionKind,
    name: u32,
    resource: Resource,
    norm: Norm,
}

/// Per-name facts, computed once per distinct name.
#[derive(Debug, Clone, Copy)]
struct NameClass {
    /// A kernel with this name is a collective (NCCL/RCCL).
    comm_kernel: bool,
    /// Class of a CPU-side event with this name.
    cpu: CpuClass,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum CpuClass {
    Op,
    Comm { gloo: bool },
    Memory(Resource),
    Step(u64),
}

#[derive(Debug, Default)]
struct Lane {
    gpu: bool,
    /// Total duration of Python, CPU-op, comm and memory executions (nested ones count again).
    busy_ns: i128,
    step_ns: i128,
}

/// Python events, compactly: their executions live in `Builder::execs` (with
/// the frame's name index as a placeholder function) and only the links are
/// kept here, 13 bytes per event plus the id map.
#[derive(Debug, Default)]
struct PyLinks {
    /// Index in `execs` of each Python event.
    exec: Vec<u32>,
    /// `Python parent id`, valid where `has_parent`.
    parent: Vec<u64>,
    has_parent: Vec<bool>,
    /// (`Python id`, index in these vectors); sorted in `finish` (ids are
    /// usually increasing already), a sorted vector being smaller and faster
    /// than a hash map at millions of events.
    ids: Vec<(u64, u32)>,
}

impl PyLinks {
    /// Index of the last event with `id`; `ids` must be sorted. `near` is a
    /// position in `ids` to search from (a child's own position: its parent
    /// is usually a little before it), widening exponentially.
    fn find(&self, id: u64, near: usize) -> Option<u32> {
        let ids = &self.ids;
        let near = near.min(ids.len());
        // Bracket [lo, hi) with ids[lo - 1] <= id < ids[hi] around `near`.
        let (mut lo, mut hi);
        if near > 0 && ids[near - 1].0 > id {
            hi = near - 1;
            let mut step = 1;
            lo = hi.saturating_sub(step);
            while lo > 0 && ids[lo].0 > id {
                hi = lo;
                step *= 2;
                lo = lo.saturating_sub(step);
            }
        } else {
            lo = near;
            let mut step = 1;
            hi = (lo + step).min(ids.len());
            while hi < ids.len() && ids[hi].0 <= id {
                lo = hi;
                step *= 2;
                hi = (hi + step).min(ids.len());
            }
        }
        let end = lo + ids[lo..hi].partition_point(|x| x.0 <= id);
        match end.checked_sub(1).map(|i| self.ids[i]) {
            Some((found, k)) if found == id => Some(k),
            _ => None,
        }
    }
}

/// A collective's process group, as far as the event tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct GroupKey {
    ranks: Option<Vec<u32>>,
    pg_name: Option<Vec<u8>>,
    size: Option<u32>,
    gloo: bool,
}

/// Counters behind the warnings.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counts {
    pub events: u64,
    pub complete: u64,
    pub no_dur: u64,
    pub bad_ts: u64,
    pub begin_end: u64,
    pub malformed: u64,
    pub first_malformed: Option<u64>,
}

/// Streaming state: everything needed to finish a [`WorkerTrace`].
#[derive(Default)]
pub(crate) struct Builder {
    name_ix: FxMap<Box<[u8]>, u32>,
    names: Vec<Box<str>>,
    classes: Vec<NameClass>,
    fn_ix: FxMap<(FunctionKind, u32), u32>,
    fns: Vec<LocalFn>,
    execs: Vec<Execution>,
    lane_ix: FxMap<(bool, u64, u64), u32>,
    lanes: Vec<Lane>,
    py: PyLinks,
    steps: Vec<(u64, i64, i64, u32)>,
    group_ix: FxMap<GroupKey, u32>,
    groups: Vec<GroupKey>,
    comm_execs: Vec<(u32, u32)>,
    kernel_devices: FxMap<u64, u64>,
    pub counts: Counts,
    pub rank: Option<u32>,
    pub world_size: Option<u32>,
    /// `distributedInfo.backend`, lower-cased, when not empty.
    pub backend: Option<String>,
    /// `distributedInfo.backend` names gloo (and not NCCL): collectives
    /// without a group of their own go over sockets, i.e. the NIC.
    default_gloo: bool,
    pg_config: Vec<(Vec<u8>, Option<Vec<u32>>, bool)>,
    devices: Vec<(Option<u64>, String)>,
    pub display_time_unit: Option<String>,
    /// The trace's top-level `baseTimeNanoseconds`.
    pub base_time_ns: Option<i64>,
}

fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.len() >= needle.len()
        && hay
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}

/// CPU-side host memory operations: allocation, freeing, pinning (PerfTracker
/// §4.2 "memory operations"). Device allocations are governed by DRAM, host
/// (pinned) ones by PCIe.
const HOST_MEMORY_OPS: &[(&str, Resource)] = &[
    ("cudaMallocHost", Resource::Pcie),
    ("cudaHostAlloc", Resource::Pcie),
    ("cudaHostRegister", Resource::Pcie),
    ("cudaHostUnregister", Resource::Pcie),
    ("cudaFreeHost", Resource::Pcie),
    ("cudaMalloc", Resource::Dram),
    ("cudaFree", Resource::Dram),
    ("cuMemHostAlloc", Resource::Pcie),
    ("cuMemHostRegister", Resource::Pcie),
    ("cuMemHostUnregister", Resource::Pcie),
    ("cuMemFreeHost", Resource::Pcie),
    ("cuMemAllocHost", Resource::Pcie),
    ("cuMemAlloc", Resource::Dram),
    ("cuMemFree", Resource::Dram),
    ("hipHostMalloc", Resource::Pcie),
    ("hipHostFree", Resource::Pcie),
    ("hipHostRegister", Resource::Pcie),
    ("hipHostUnregister", Resource::Pcie),
    ("hipMallocHost", Resource::Pcie),
    ("hipFreeHost", Resource::Pcie),
    ("hipMalloc", Resource::Dram),
    ("hipFree", Resource::Dram),
    ("aten::pin_memory", Resource::Pcie),
    ("aten::_pin_memory", Resource::Pcie),
];

/// Name prefixes of CPU-side communication operations.
const COMM_PREFIXES: &[&str] = &[
    "nccl:",
    "rccl:",
    "gloo:",
    "mpi:",
    "ucc:",
    "c10d::",
    "c10d_functional::",
    "_c10d_functional::",
    "ProcessGroupNCCL::",
    "ProcessGroupGloo::",
];

/// Whether a CPU-side event of this name is a communication op (its `args`
/// then carry the process group).
pub(crate) fn is_comm_op_name(name: &[u8]) -> bool {
    name == b"record_param_comms" || COMM_PREFIXES.iter().any(|p| name.starts_with(p.as_bytes()))
}

fn classify_name(name: &str) -> NameClass {
    let comm_kernel =
        contains_ci(name.as_bytes(), b"nccl") || contains_ci(name.as_bytes(), b"rccl");
    let cpu = if let Some(rest) = name.strip_prefix("ProfilerStep#") {
        match rest.trim().parse::<u64>() {
            Ok(n) => CpuClass::Step(n),
            Err(_) => CpuClass::Op,
        }
    } else if name == "record_param_comms" || COMM_PREFIXES.iter().any(|p| name.starts_with(p)) {
        CpuClass::Comm {
            gloo: name.starts_with("gloo:") || name.starts_with("ProcessGroupGloo"),
        }
    } else if let Some((_, r)) = HOST_MEMORY_OPS.iter().find(|(p, _)| {
        name.strip_prefix(p).is_some_and(|rest| {
            rest.is_empty() || rest.starts_with('_') || rest.starts_with("Async")
        })
    }) {
        CpuClass::Memory(*r)
    } else {
        CpuClass::Op
    };
    NameClass { comm_kernel, cpu }
}

/// Resource of a device memcpy by its name ("Memcpy HtoD (Pinned -> Device)").
fn memcpy_resource(name: &str) -> Resource {
    if name.contains("PtoP") || name.contains("Peer") {
        Resource::Nvlink
    } else if name.contains("DtoD") || name.contains("Device -> Device") {
        Resource::Dram
    } else {
        Resource::Pcie
    }
}

fn clamp01(v: f64) -> f32 {
    if v.is_finite() {
        v.clamp(0.0, 1.0) as f32
    } else {
        UNKNOWN_UTIL
    }
}

impl Builder {
    fn name(&mut self, raw: &[u8]) -> u32 {
        if let Some(&i) = self.name_ix.get(raw) {
            return i;
        }
        let i = self.names.len() as u32;
        let s: Box<str> = strip_addresses(&String::from_utf8_lossy(raw)).into();
        self.classes.push(classify_name(&s));
        self.names.push(s);
        self.name_ix.insert(raw.into(), i);
        i
    }

    fn func(&mut self, kind: FunctionKind, name: u32, resource: Resource, norm: Norm) -> u32 {
        let next = self.fns.len() as u32;
        let id = *self.fn_ix.entry((kind, name)).or_insert(next);
        if id == next {
            self.fns.push(LocalFn {
                kind,
                name,
                resource,
                norm,
            });
        }
        id
    }

    fn lane(&mut self, gpu: bool, a: u64, b: u64) -> u32 {
        let next = self.lanes.len() as u32;
        let id = *self.lane_ix.entry((gpu, a, b)).or_insert(next);
        if id == next {
            self.lanes.push(Lane {
                gpu,
                ..Lane::default()
            });
        }
        id
    }

    fn group(&mut self, args: Option<&Args<'_>>, gloo: bool) -> u32 {
        let key = match args {
            Some(a) => GroupKey {
                ranks: a.pg_ranks.0.clone(),
                pg_name: (!a.pg_name.as_slice().is_empty()).then(|| a.pg_name.as_slice().to_vec()),
                size: a
                    .group_size
                    .f64()
                    .map(|v| v.clamp(0.0, u32::MAX as f64) as u32),
                gloo,
            },
            None => GroupKey {
                gloo,
                ..GroupKey::default()
            },
        };
        if let Some(&g) = self.group_ix.get(&key) {
            return g;
        }
        let g = self.groups.len() as u32;
        self.groups.push(key.clone());
        self.group_ix.insert(key, g);
        g
    }

    fn exec(&mut self, f: u32, start: i64, end: i64, lane: u32, util: f32) -> u32 {
        let i = self.execs.len() as u32;
        self.execs.push(Execution {
            function: FunctionId(f),
            start_ns: start,
            end_ns: end,
            thread: lane,
            trace_util: util,
        });
        i
    }

    /// Records a malformed (skipped) event at `offset`.
    pub(crate) fn malformed(&mut self, offset: u64) {
        self.counts.malformed += 1;
        self.counts.first_malformed.get_or_insert(offset);
    }

    /// Classifies one trace event (PerfTracker §4.2's five classes).
    pub(crate) fn push(&mut self, ev: &RawEvent<'_>) {
        self.counts.events += 1;
        match ev.ph.as_slice() {
            b"X" => {}
            b"B" | b"E" => {
                self.counts.begin_end += 1;
                return;
            }
            _ => return,
        }
        self.counts.complete += 1;
        let Some(start) = ev.ts.us_to_ns() else {
            self.counts.bad_ts += 1;
            return;
        };
        let dur = match ev.dur {
            Num::Missing => {
                self.counts.no_dur += 1;
                return;
            }
            d => match d.us_to_ns() {
                Some(d) if d >= 0 => d,
                _ => {
                    self.counts.bad_ts += 1;
                    return;
                }
            },
        };
        let end = start.saturating_add(dur);
        let args = ev.args.as_ref();
        let pid = ev.pid.key().unwrap_or(0);
        let tid = ev.tid.key().unwrap_or(0);
        let gpu_lane = |b: &mut Builder| {
            let dev = args.and_then(|a| a.device.key()).unwrap_or(pid);
            let stream = args.and_then(|a| a.stream.key()).unwrap_or(tid);
            (b.lane(true, dev, stream), dev)
        };
        match ev.cat.as_slice() {
            b"kernel" => {
                let name = self.name(ev.name.as_slice());
                let (lane, dev) = gpu_lane(self);
                *self.kernel_devices.entry(dev).or_insert(0) += 1;
                if self.classes[name as usize].comm_kernel {
                    let util = args
                        .and_then(|a| busbw_gbps(a, &self.names[name as usize], dur))
                        .map_or(UNKNOWN_UTIL, |v| v as f32);
                    // Resource decided in `finish` from the group; Nic until then.
                    let f = self.func(FunctionKind::Comm, name, Resource::Nic, Norm::Bandwidth);
                    let e = self.exec(f, start, end, lane, util);
                    let g = self.group(args, false);
                    self.comm_execs.push((e, g));
                } else {
                    let util = args
                        .and_then(|a| a.occupancy.f64())
                        .map_or(UNKNOWN_UTIL, |v| clamp01(v / 100.0));
                    let f = self.func(FunctionKind::GpuKernel, name, Resource::Sm, Norm::Ready);
                    self.exec(f, start, end, lane, util);
                }
            }
            cat @ (b"gpu_memcpy" | b"gpu_memset") => {
                let name = self.name(ev.name.as_slice());
                let (lane, _) = gpu_lane(self);
                let resource = if cat == b"gpu_memset" {
                    Resource::Dram
                } else {
                    memcpy_resource(&self.names[name as usize])
                };
                let util = args
                    .and_then(|a| a.bandwidth.f64())
                    .map_or(UNKNOWN_UTIL, |v| v as f32);
                let f = self.func(FunctionKind::Memory, name, resource, Norm::Bandwidth);
                self.exec(f, start, end, lane, util);
            }
            b"python_function" => {
                let frame = self.name(ev.name.as_slice());
                let lane = self.lane(false, pid, tid);
                self.lanes[lane as usize].busy_ns += i128::from(dur);
                let id = args.and_then(|a| a.py_id.key());
                let parent = args
                    .and_then(|a| a.py_parent.key())
                    .filter(|p| Some(*p) != id);
                // Placeholder function: the frame's name index, replaced in `finish`.
                let e = self.exec(frame, start, end, lane, UNKNOWN_UTIL);
                let k = self.py.exec.len() as u32;
                self.py.exec.push(e);
                self.py.parent.push(parent.unwrap_or(0));
                self.py.has_parent.push(parent.is_some());
                if let Some(id) = id {
                    self.py.ids.push((id, k));
                }
            }
            // Duplicates of kernels, profiler bookkeeping, sync markers, flows.
            b"gpu_user_annotation"
            | b"overhead"
            | b"Trace"
            | b"cuda_sync"
            | b"cpu_instant_event"
            | b"ac2g"
            | b"fwdbwd"
            | b"async_cpu_to_gpu" => {}
            _ => {
                // CPU side: cpu_op, cuda_runtime, cuda_driver, user_annotation, unknown.
                let name = self.name(ev.name.as_slice());
                let lane = self.lane(false, pid, tid);
                match self.classes[name as usize].cpu {
                    CpuClass::Step(n) => {
                        self.lanes[lane as usize].step_ns += i128::from(dur);
                        self.steps.push((n, start, end, lane));
                    }
                    CpuClass::Comm { gloo } => {
                        self.lanes[lane as usize].busy_ns += i128::from(dur);
                        let f = self.func(FunctionKind::Comm, name, Resource::Nic, Norm::Ready);
                        let e = self.exec(f, start, end, lane, UNKNOWN_UTIL);
                        let g = self.group(args, gloo);
                        self.comm_execs.push((e, g));
                    }
                    CpuClass::Memory(r) => {
                        self.lanes[lane as usize].busy_ns += i128::from(dur);
                        let f = self.func(FunctionKind::Memory, name, r, Norm::Ready);
                        self.exec(f, start, end, lane, UNKNOWN_UTIL);
                    }
                    CpuClass::Op => {
                        self.lanes[lane as usize].busy_ns += i128::from(dur);
                        let f = self.func(FunctionKind::CpuOp, name, Resource::Cpu, Norm::Ready);
                        self.exec(f, start, end, lane, UNKNOWN_UTIL);
                    }
                }
            }
        }
    }

    /// Takes in `distributedInfo`.
    pub(crate) fn distributed_info(&mut self, d: DistributedInfo<'_>) {
        self.rank = d
            .rank
            .f64()
            .filter(|r| *r >= 0.0 && *r <= u32::MAX as f64)
            .map(|r| r as u32);
        self.world_size = d
            .world_size
            .f64()
            .filter(|r| *r >= 0.0 && *r <= u32::MAX as f64)
            .map(|r| r as u32);
        let backend = d.backend.as_slice();
        let name = String::from_utf8_lossy(backend).trim().to_ascii_lowercase();
        self.backend = (!name.is_empty()).then_some(name);
        self.default_gloo = contains_ci(backend, b"gloo") && !contains_ci(backend, b"nccl");
        for pg in d.pg_config.unwrap_or_default() {
            let bc = pg.backend_config.as_slice();
            let gloo = contains_ci(bc, b"gloo") && !contains_ci(bc, b"nccl");
            self.pg_config
                .push((pg.pg_name.as_slice().to_vec(), pg.ranks.0, gloo));
        }
    }

    /// Takes in `deviceProperties`.
    pub(crate) fn device_properties(&mut self, d: Vec<DeviceProp<'_>>) {
        for p in d {
            let name = String::from_utf8_lossy(p.name.as_slice())
                .trim()
                .to_string();
            if !name.is_empty() {
                self.devices.push((p.id.key(), name));
            }
        }
    }

    /// Takes in `displayTimeUnit`.
    pub(crate) fn display_time_unit(&mut self, b: Bytes<'_>) {
        self.display_time_unit = Some(String::from_utf8_lossy(b.as_slice()).into_owned());
    }

    fn group_resource(&self, g: &GroupKey) -> Resource {
        let mut gloo = g.gloo;
        let mut ranks = g.ranks.as_deref();
        if let Some(name) = &g.pg_name {
            if let Some((_, r, pg_gloo)) = self.pg_config.iter().find(|(n, _, _)| n == name) {
                gloo |= *pg_gloo;
                if ranks.is_none() {
                    ranks = r.as_deref();
                }
            }
        }
        if gloo || (self.default_gloo && g.pg_name.is_none() && ranks.is_none()) {
            return Resource::Nic;
        }
        if let Some(r) = ranks {
            // Intra-host when all ranks share one 8-GPU host block.
            let host = |x: u32| x / 8;
            return match r.first() {
                Some(&f) if r.iter().any(|&x| host(x) != host(f)) => Resource::Nic,
                _ => Resource::Nvlink,
            };
        }
        match (self.world_size, g.size) {
            (Some(w), _) if w <= 8 => Resource::Nvlink,
            (_, Some(s)) if s <= 1 => Resource::Nvlink,
            _ => Resource::Nic,
        }
    }

    fn device_name(&self) -> Option<String> {
        let top = self
            .kernel_devices
            .iter()
            .max_by_key(|(d, n)| (**n, std::cmp::Reverse(**d)))
            .map(|(d, _)| *d);
        top.and_then(|t| self.devices.iter().find(|(id, _)| *id == Some(t)))
            .or_else(|| self.devices.first())
            .map(|(_, n)| n.clone())
    }

    /// Assembles the trace into `t` (which carries the worker's identity).
    pub(crate) fn finish(mut self, t: &mut WorkerTrace) {
        let device = self.device_name();
        // Communication resources: majority vote of the groups each function ran in.
        let mut votes: FxMap<u32, (u64, u64)> = FxMap::default();
        let group_res: Vec<Resource> = self.groups.iter().map(|g| self.group_resource(g)).collect();
        for &(e, g) in &self.comm_execs {
            let f = self.execs[e as usize].function.0;
            let v = votes.entry(f).or_insert((0, 0));
            if group_res[g as usize] == Resource::Nvlink {
                v.0 += 1;
            } else {
                v.1 += 1;
            }
        }
        for (f, (nvlink, nic)) in votes {
            self.fns[f as usize].resource = if nvlink > nic {
                Resource::Nvlink
            } else {
                Resource::Nic
            };
        }
        let mut table = FunctionTable::new();
        let mut map = Vec::with_capacity(self.fns.len());
        let mut scale = Vec::with_capacity(self.fns.len());
        for f in &self.fns {
            map.push(table.intern(f.kind, &self.names[f.name as usize], f.resource));
            scale.push(match f.norm {
                Norm::Ready => None,
                Norm::Bandwidth => peaks::peak_gbps(f.resource, device.as_deref()),
            });
        }
        let mut span: Option<(i64, i64)> = None;
        let mut widen = |s: i64, e: i64| {
            span = Some(span.map_or((s, e), |(a, b)| (a.min(s), b.max(e))));
        };
        let mut py = std::mem::take(&mut self.py);
        if !py.ids.windows(2).all(|w| w[0] <= w[1]) {
            py.ids.sort_unstable();
        }
        let mut is_py = vec![false; self.execs.len()];
        for &e in &py.exec {
            is_py[e as usize] = true;
        }
        for (e, py_exec) in self.execs.iter_mut().zip(is_py) {
            if py_exec {
                widen(e.start_ns, e.end_ns);
                continue;
            }
            let local = e.function.0 as usize;
            e.function = map[local];
            if let Some(peak) = scale[local] {
                e.trace_util = clamp01(f64::from(e.trace_util) / peak);
            }
            widen(e.start_ns, e.end_ns);
        }
        // Python: rebuild every call stack from the id → parent id links, which
        // may point forward in the file (PerfTracker §4.2: same function only
        // if the entire call stack is identical).
        let stacks = resolve_stacks(&py, &self.execs);
        let mut stack_names: Vec<String> = Vec::with_capacity(stacks.list.len());
        let mut stack_fn: Vec<FunctionId> = Vec::with_capacity(stacks.list.len());
        for &(parent, frame) in &stacks.list {
            let frame = &self.names[frame as usize];
            let s = match parent {
                Some(p) => format!("{};{}", stack_names[p as usize], frame),
                None => frame.to_string(),
            };
            stack_fn.push(table.intern(FunctionKind::Python, &s, Resource::Cpu));
            stack_names.push(s);
        }
        drop(stack_names);
        // Lanes whose Python roots are all `threading.py(..): _bootstrap` are
        // helper threads, never the training thread.
        let mut roots: Vec<(bool, bool)> = vec![(false, false); self.lanes.len()]; // (any root, any non-bootstrap root)
        for (k, &s) in stacks.of.iter().enumerate() {
            let e = &mut self.execs[py.exec[k] as usize];
            if stacks.list[s as usize].0.is_none() {
                let frame = &self.names[e.function.0 as usize];
                let boot = frame.contains("threading.py") && frame.ends_with("_bootstrap");
                let r = &mut roots[e.thread as usize];
                r.0 = true;
                r.1 |= !boot;
            }
            e.function = stack_fn[s as usize];
        }
        drop(py);
        // Training thread: among CPU lanes that are not helper threads, the one
        // with the most ProfilerStep time, else the busiest.
        let candidates = self
            .lanes
            .iter()
            .enumerate()
            .filter(|(i, l)| !l.gpu && (!roots[*i].0 || roots[*i].1));
        t.training_thread = candidates
            .max_by_key(|(i, l)| (l.step_ns, l.busy_ns, std::cmp::Reverse(*i)))
            .filter(|(_, l)| l.step_ns > 0 || l.busy_ns > 0)
            .map(|(i, _)| i as u32);
        self.steps.sort_by_key(|s| (s.1, s.0));
        for &(_, s, e, _) in &self.steps {
            widen(s, e);
        }
        t.steps = self.steps.iter().map(|&(n, s, e, _)| (n, s, e)).collect();
        t.span = span.unwrap_or((0, 0));
        t.functions = table;
        t.executions = std::mem::take(&mut self.execs);
        t.device = device;
        let c = &self.counts;
        if c.no_dur > 0 {
            t.warnings.push(format!(
                "{} complete (X) events without a duration were skipped",
                c.no_dur
            ));
        }
        if c.bad_ts > 0 {
            t.warnings.push(format!(
                "{} events with a missing or unusable timestamp or duration were skipped",
                c.bad_ts
            ));
        }
        if c.begin_end > 0 {
            t.warnings.push(format!(
                "{} begin/end (B/E) events were ignored: whyslow reads complete (X) events",
                c.begin_end
            ));
        }
        if c.malformed > 0 {
            t.warnings.push(format!(
                "{} malformed events were skipped (first at byte offset {})",
                c.malformed,
                c.first_malformed.unwrap_or(0)
            ));
        }
        let unresolved = stacks.missing_parents;
        if unresolved > 0 {
            t.warnings.push(format!(
                "{unresolved} Python events name a parent id absent from the trace; their stacks start there"
            ));
        }
    }
}

/// NCCL bus bandwidth (GB/s) of a collective kernel from its args, if they
/// carry the message size.
fn busbw_gbps(a: &Args<'_>, kernel: &str, dur_ns: i64) -> Option<f64> {
    if dur_ns <= 0 {
        return None;
    }
    let nelems = match (a.in_nelems.f64(), a.out_nelems.f64()) {
        (Some(i), Some(o)) => i.max(o),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => return None,
    };
    let size = peaks::dtype_size(&String::from_utf8_lossy(a.dtype.as_slice()))?;
    let n = a
        .group_size
        .f64()
        .or_else(|| a.pg_ranks.0.as_ref().map(|r| r.len() as f64))
        .unwrap_or(1.0);
    let coll = String::from_utf8_lossy(a.collective.as_slice());
    let coll = if coll.is_empty() { kernel.into() } else { coll };
    let gbps = nelems * size / dur_ns as f64 * peaks::busbw_factor(&coll, n);
    gbps.is_finite().then_some(gbps)
}

struct Stacks {
    /// Distinct stacks as (parent stack, innermost frame name), parents first.
    list: Vec<(Option<u32>, u32)>,
    /// Stack of each Python event.
    of: Vec<u32>,
    missing_parents: u64,
}

fn resolve_stacks(py: &PyLinks, execs: &[Execution]) -> Stacks {
    const UNSET: u32 = u32::MAX;
    const BUSY: u32 = u32::MAX - 1;
    let n = py.exec.len();
    let frame_of = |k: u32| execs[py.exec[k as usize] as usize].function.0;
    let mut of = vec![UNSET; n];
    let mut ix: FxMap<(u32, u32), u32> = FxMap::default();
    let mut list: Vec<(Option<u32>, u32)> = Vec::new();
    let mut missing = 0u64;
    let mut chain: Vec<u32> = Vec::new();
    for i in 0..n {
        if of[i] != UNSET {
            continue;
        }
        // Walk up to a resolved ancestor or a root.
        chain.clear();
        let mut cur = i as u32;
        let mut base: Option<u32> = None;
        loop {
            chain.push(cur);
            of[cur as usize] = BUSY;
            let parent = if py.has_parent[cur as usize] {
                match py.find(py.parent[cur as usize], cur as usize) {
                    Some(j) => Some(j),
                    None => {
                        missing += 1;
                        None
                    }
                }
            } else {
                None
            };
            match parent {
                Some(j) if of[j as usize] == UNSET => cur = j,
                Some(j) if of[j as usize] != BUSY => {
                    base = Some(of[j as usize]);
                    break;
                }
                _ => break, // root, or a cycle (broken here)
            }
        }
        // Unwind from the outermost frame.
        let mut parent_stack = base;
        for &c in chain.iter().rev() {
            let frame = frame_of(c);
            let key = (parent_stack.unwrap_or(UNSET), frame);
            let next = list.len() as u32;
            let s = *ix.entry(key).or_insert(next);
            if s == next {
                list.push((parent_stack, frame));
            }
            of[c as usize] = s;
            parent_stack = Some(s);
        }
    }
    Stacks {
        list,
        of,
        missing_parents: missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_matches_brute_force() {
        let mut seed = 0x2545f4914f6cdd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for n in [0usize, 1, 2, 5, 64, 1000] {
            let mut ids: Vec<(u64, u32)> = (0..n).map(|k| (next() % 50, k as u32)).collect();
            ids.sort_unstable();
            let links = PyLinks {
                ids: ids.clone(),
                ..PyLinks::default()
            };
            for _ in 0..500 {
                let id = next() % 60;
                let near = (next() % (n as u64 + 3)) as usize;
                let want = ids.iter().rev().find(|x| x.0 == id).map(|x| x.1);
                assert_eq!(links.find(id, near), want, "n={n} id={id} near={near}");
            }
        }
    }
}

/// Removes object addresses (`<built-in method run_backward of … object at
/// 0x7f3a…>`) from a name: they differ per process, and a function must have
/// the same identity on every worker (PerfTracker §4.2 compares functions
/// across workers by name and call stack).
fn strip_addresses(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(" at 0x") {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find(" at 0x") {
        out.push_str(&rest[..i]);
        let after = &rest[i + " at 0x".len()..];
        let hex = after
            .find(|c: char| !c.is_ascii_hexdigit())
            .unwrap_or(after.len());
        rest = &after[hex..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod strip_tests {
    use super::strip_addresses;

    #[test]
    fn object_addresses_are_removed_so_ranks_agree() {
        assert_eq!(
            strip_addresses(
                "<built-in method run_backward of torch._C._EngineBase object at 0x7f3a12bc>"
            ),
            "<built-in method run_backward of torch._C._EngineBase object>"
        );
        assert_eq!(strip_addresses("aten::mm"), "aten::mm");
        assert_eq!(strip_addresses("x at 0x"), "x");
    }
}
