#!/usr/bin/env python3
"""Replay one real single-rank PyTorch profiler (Kineto) trace as N ranks,
with jitter and, optionally, one injected fault (the cases of
docs/accuracy.md).

Timeline model (per rank; nothing ever moves earlier than in the real trace):

* Leaf events (GPU kernels / memcpys / memsets, CPU events with nothing nested
  inside) get an independent duration factor f ~ U[1-j, 1+j] (blocking
  calls excepted: their length is their wait).
* CPU lanes (one per pid/tid): time a leaf gains is inserted at its end, so
  everything after it on that lane starts later and its parents stretch; a
  leaf that gets shorter just ends earlier. Inserted Python stacks are gaps
  on the training thread (the thread of the ProfilerStep annotations) that
  shift every CPU lane. Blocking calls (...Synchronize) return only when the
  GPU work they waited for is done, taken as all GPU work (any stream, which
  stands in for cross-stream event waits) that had ended when the call
  returned: if some of it now ends later (beyond the idle slack between its
  end and the call's start), the call stretches by that much and its lane
  shifts (the CPU runs ahead asynchronously until it syncs).
* GPU streams: an event starts at max(its original start + the shift of its
  launch call's lane, the new end of the previous event on its stream) and
  lasts its own duration (jittered, slowed, plus any collective wait): the
  GPU follows its launches and its queue; a CPU stall idles it once the
  queue is drained, a slower kernel delays the ones queued behind it.
* Synchronous collectives: NCCL kernels are matched across ranks by order
  (k-th NCCL kernel of the base trace). The transfer of collective k starts
  on every rank when the last rank arrives: rank r's kernel k is lengthened
  by max_r' start(r', k) - start(r, k), which delays what is queued behind it
  and, through blocking calls, its CPU. A rank that is late (slow GPU, GC
  pause, slow link in its previous collective) makes its peers wait in
  their next collective.

Output: one file per rank, rank-<r>.json, with distributedInfo.rank = r and
world_size = N, laid out like Kineto writes it (one event a line); only
complete ("X") and metadata ("M") events are kept (flow, instant and
gpu_user_annotation events dropped), timestamps rebased to start at 1 s,
bulky CPU-op argument lists (input shapes/types) dropped. The trace is
cropped to whole ProfilerSteps.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import zlib
from dataclasses import dataclass, field

import numpy as np

try:  # orjson parses the multi-MB fixtures ~5x faster; stdlib json works too.
    import orjson

    def _loads(b: bytes):
        return orjson.loads(b)
except ImportError:  # pragma: no cover
    orjson = None

    def _loads(b: bytes):
        return json.loads(b)


GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
DROP_CATS = {"gpu_user_annotation", "Trace", "overhead", "cuda_sync", "cpu_instant_event"}
DROP_ARGS = {
    "Input Dims", "Input type", "Input Strides", "Concrete Inputs", "Trace name",
    "Trace iteration", "Module Hierarchy", "Profiler Event Index", "Ev Idx",
    "Sequence number", "Fwd thread id", "Call stack", "Input Strides",
}
GEMM_RE = re.compile(r"gemm|cutlass|cublas|xmma|ampere_|volta_|turing_|sm80_|sm90_|sm100_|nvjet", re.I)
STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
T_BASE = 1_000_000.0  # rebased traces start at 1 s (µs), keeping ns precision in f64


def is_nccl(name: str) -> bool:
    n = name.lower()
    return "nccl" in n or "rccl" in n


def is_blocking_cpu(name: str) -> bool:
    """CPU calls that wait for the GPU: they stretch when the GPU is late."""
    return "Synchronize" in name or name in ("cudaMemcpy", "cudaMemcpy2D", "hipMemcpy")


def _seed(*parts) -> np.random.Generator:
    ints = []
    for p in parts:
        if isinstance(p, str):
            ints.append(zlib.crc32(p.encode()))
        elif isinstance(p, float):
            ints.append(int(round(p * 1_000_000)))
        else:
            ints.append(int(p))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(ints)))


@dataclass
class Base:
    """A real trace, cropped to whole ProfilerSteps, as arrays + a text template."""

    name: str
    path: str
    n: int
    ts: np.ndarray  # rebased µs
    dur: np.ndarray
    names: list  # per event
    cats: list
    gpu: np.ndarray  # bool: rigid GPU event
    leaf: np.ndarray  # bool: gets a jitter factor
    elastic: np.ndarray  # bool: end follows the time map (CPU parents, blocking calls)
    blocking: np.ndarray  # bool: CPU call that waits for the GPU (…Synchronize)
    lane: np.ndarray  # CPU lane index per event, -1 for GPU events
    train_lane_id: int
    nccl: np.ndarray  # bool: NCCL/RCCL kernel
    coll_order: np.ndarray  # event indices of NCCL kernels by start
    steps: list  # (event index, step number)
    train_lane: tuple  # (pid, tid) of the ProfilerStep annotations
    py_frames: list  # (ts, end, python id) of Python frames on the training lane
    template: str  # the whole file with %d rank/world and %.3f ts/dur slots
    extra_slot: str = "@@EXTRA@@"
    header: dict = field(default_factory=dict)
    prefix: str = ""  # file text before the events, with "%d" slots for rank and world size
    static: list = field(default_factory=list)  # event text between the ts/dur numbers
    tail: str = ""
    gpu_ends: np.ndarray = None  # sorted original ends of GPU events
    gpu_end_order: np.ndarray = None  # GPU event indices in that order
    launch: np.ndarray = None  # per GPU event: index of its launch call, -1 if none
    stream_order: list = None  # per GPU stream: event indices by start


def load_base(path: str, steps: int = 2, name: str | None = None) -> Base:
    """Loads `path` and crops it to `steps` whole ProfilerSteps (skipping the
    first step when the trace has more than `steps`)."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = _loads(raw)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    xs = [e for e in events if e.get("ph") == "X" and "dur" in e and e.get("cat") not in DROP_CATS]
    meta = [e for e in events if e.get("ph") == "M"]
    step_evs = sorted(
        (e for e in xs if STEP_RE.match(str(e.get("name", "")))), key=lambda e: float(e["ts"])
    )
    if not step_evs:
        raise ValueError(f"{path}: no ProfilerStep annotations")
    first = 1 if len(step_evs) > steps else 0
    chosen = step_evs[first : first + steps]
    w0 = float(chosen[0]["ts"])
    w1 = max(float(e["ts"]) + float(e["dur"]) for e in chosen)
    train_lane = (chosen[0].get("pid"), chosen[0].get("tid"))
    kept = []
    for e in xs:
        t = float(e["ts"])
        d = float(e["dur"])
        if w0 <= t < w1:
            kept.append(e)
        elif t < w0 and t + d >= w1 and e.get("cat") not in GPU_CATS:
            kept.append(e)  # an enclosing frame (e.g. the training loop)
    # Renumber steps if the trace repeats a step number (h100-qwen does).
    seen = set()
    for e in sorted((e for e in kept if STEP_RE.match(str(e.get("name", "")))), key=lambda e: float(e["ts"])):
        m = STEP_RE.match(e["name"])
        k = int(m.group(1))
        while k in seen:
            k += 1
        seen.add(k)
        if k != int(m.group(1)):
            e["name"] = f"ProfilerStep#{k}"
    n = len(kept)
    ts = np.array([float(e["ts"]) for e in kept])
    dur = np.array([float(e["dur"]) for e in kept])
    t0 = ts.min()
    ts = ts - t0 + T_BASE
    names = [str(e.get("name", "")) for e in kept]
    cats = [str(e.get("cat", "")) for e in kept]
    gpu = np.array([c in GPU_CATS for c in cats])
    nccl = np.array([g and c == "kernel" and is_nccl(nm) for g, c, nm in zip(gpu, cats, names)])
    # CPU leaves: per (pid, tid), no event starts inside them.
    leaf = gpu.copy()
    lanes: dict = {}
    for i, e in enumerate(kept):
        if not gpu[i]:
            lanes.setdefault((e.get("pid"), e.get("tid")), []).append(i)
    for idx in lanes.values():
        idx = np.array(idx)
        order = idx[np.lexsort((-dur[idx], ts[idx]))]
        s = ts[order]
        en = s + dur[order]
        nxt = np.append(s[1:], np.inf)
        # A parent is followed (in start order) by an event starting before its end.
        is_leaf = ~(nxt < en)
        leaf[order] = is_leaf
    lane = np.full(n, -1, dtype=np.int64)  # CPU lane (pid, tid) index; -1 for GPU events
    for li, idx in enumerate(lanes.values()):
        lane[np.array(idx)] = li
    blocking = np.array([(not g) and is_blocking_cpu(nm) for g, nm in zip(gpu, names)])
    elastic = (~gpu) & ((~leaf) | blocking)
    coll = np.flatnonzero(nccl)
    coll_order = coll[np.argsort(ts[coll], kind="stable")]
    step_list = []
    for i, nm in enumerate(names):
        m = STEP_RE.match(nm)
        if m and (kept[i].get("pid"), kept[i].get("tid")) == train_lane:
            step_list.append((i, int(m.group(1))))
    step_list.sort(key=lambda x: ts[x[0]])
    py_frames = []
    for i, e in enumerate(kept):
        if cats[i] == "python_function" and (e.get("pid"), e.get("tid")) == train_lane:
            pid = (e.get("args") or {}).get("Python id")
            if pid is not None:
                py_frames.append((ts[i], ts[i] + dur[i], pid))
    # Text template: one %.3f slot for ts and one for dur per event.
    parts = []
    for e in kept:
        rest = {k: v for k, v in e.items() if k not in ("ts", "dur")}
        if "args" in rest and isinstance(rest["args"], dict):
            a = {k: v for k, v in rest["args"].items() if k not in DROP_ARGS}
            if a:
                rest["args"] = a
            else:
                del rest["args"]
        body = json.dumps(rest, separators=(",", ":"), ensure_ascii=False)
        parts.append('{"ts":%.3f,"dur":%.3f,' + body[1:].replace("%", "%%") if len(body) > 2 else '{"ts":%.3f,"dur":%.3f}')
    meta_txt = [json.dumps(m, separators=(",", ":"), ensure_ascii=False).replace("%", "%%") for m in meta]
    header = {}
    if isinstance(doc, dict):
        if "schemaVersion" in doc:
            header["schemaVersion"] = doc["schemaVersion"]
        if "deviceProperties" in doc:
            header["deviceProperties"] = doc["deviceProperties"]
        di = doc.get("distributedInfo") or {}
        backend = di.get("backend", "nccl")
    else:
        backend = "nccl"
    head = json.dumps(header, separators=(",", ":"))[1:-1].replace("%", "%%")
    if head:
        head += ","
    # Laid out like Kineto writes it (one event a line, `"rank": N` with a
    # space: HTA finds the rank with the regex '"rank":\s+(\d+)' line by line).
    template = (
        "{\n" + (head.replace("%%", "%%") + "\n" if head else "")
        + '  "distributedInfo": {"backend": "' + backend + '", "rank": %d, "world_size": %d},\n'
        + '  "traceEvents": [\n' + ",\n".join(meta_txt + parts) + "@@EXTRA@@\n]}\n"
    )
    gpu_idx = np.flatnonzero(gpu)
    gpu_end_order = gpu_idx[np.argsort((ts + dur)[gpu_idx], kind="stable")]
    gpu_ends = (ts + dur)[gpu_end_order]
    # Each GPU event's launch (the CPU runtime call with the same correlation id).
    corr = {}
    for i, e in enumerate(kept):
        if not gpu[i] and cats[i] in ("cuda_runtime", "cuda_driver"):
            c = (e.get("args") or {}).get("correlation")
            if c is not None:
                corr[c] = i
    launch = np.full(n, -1, dtype=np.int64)
    for i in gpu_idx:
        c = (kept[i].get("args") or {}).get("correlation")
        if c is not None and c in corr:
            launch[i] = corr[c]
    streams = {}
    for i in gpu_idx:
        e = kept[i]
        streams.setdefault((e.get("pid"), e.get("tid")), []).append(i)
    stream_order = [np.array(sorted(v, key=lambda i: (ts[i], i))) for v in streams.values()]
    head_txt, tail_txt = template.split("@@EXTRA@@")
    # For the fast path: the static text between the numbers (2 per event).
    body_start = head_txt.index('"traceEvents": [')
    prefix = head_txt[:body_start]  # holds the %d rank / world slots
    events_txt = head_txt[body_start:].replace("%%", "%")
    static = events_txt.split("%.3f")
    return Base(
        name=name or os.path.basename(path).split(".")[0],
        path=path, n=n, ts=ts, dur=dur, names=names, cats=cats, gpu=gpu, leaf=leaf,
        elastic=elastic, blocking=blocking, lane=lane, train_lane_id=int(lane[step_list[0][0]]) if step_list else 0,
        nccl=nccl, coll_order=coll_order, steps=step_list,
        train_lane=train_lane, py_frames=py_frames, template=template, header=header,
        prefix=prefix, static=static, tail=tail_txt, gpu_ends=gpu_ends, gpu_end_order=gpu_end_order,
        launch=launch, stream_order=stream_order,
    )


# ---------------------------------------------------------------- faults ----


@dataclass
class RankFault:
    """What is injected on one rank."""

    slow: np.ndarray | None = None  # per-event duration factor (1 = unchanged), applied to leaves
    stacks: list = field(default_factory=list)  # (frames, share of step) inserted at each step start


@dataclass
class Injection:
    case: str
    title: str
    workers: list  # injected ranks (sorted)
    targets: list  # function names that count as "the injected function"
    target_class: str  # human label, e.g. "GPU compute kernels", or the function name
    per_rank: dict  # rank -> RankFault
    note: str = ""
    gpu_class: bool = False  # any non-NCCL GPU kernel counts (GPU throttling)


DATA_LOADER = [
    "train.py(88): <module>",
    "train.py(61): train_epoch",
    "torch/utils/data/dataloader.py(631): __next__",
    "torch/utils/data/dataloader.py(1329): _next_data",
    "multiprocessing/connection.py(414): _recv",
    "socket.py(705): recv_into",
]
CPU_FORWARD = [
    "train.py(88): <module>",
    "train.py(64): train_step",
    "torch/nn/modules/module.py(1501): _call_impl",
    "model.py(120): forward",
]
GC_COLLECT = [
    "train.py(88): <module>",
    "train.py(70): train_step",
    "<built-in method collect of module object at 0x7f3a2c1b5e40>",
]
SOCKET_RECV = [
    "train.py(88): <module>",
    "train.py(75): train_step",
    "metrics/remote_store.py(212): fetch",
    "<method 'recv' of '_socket.socket' objects>",
]

CASES = {
    "gpu-throttle": "GPU throttling: all compute kernels 1.5x on 1/8 of workers",
    "nvlink-down": "NVLink down -> PCIe: NCCL kernels (and P2P copies) 3x on 1/8 of workers",
    "dataloader": "slow data loader recv_into on all workers (25% of step)",
    "cpu-forward": "CPU-bound Python forward on all workers (30% of step)",
    "gc": "Python gc.collect on 3/16 of workers (20% of step), peers wait",
    "socket-recv": "slow socket recv on all workers (20% of step)",
    "ring-allreduce": "allreduce kernels 3x on one worker (ring), peers wait",
    "gemm": "busiest GEMM kernel 3x on 4 workers",
}


def applicable(base: Base, case: str) -> str | None:
    """None when the case applies to this trace, else why not."""
    if case in ("gpu-throttle",) and not (base.gpu & ~base.nccl).any():
        return "no GPU kernels"
    if case == "nvlink-down" and not base.nccl.any():
        return "no NCCL kernels"
    if case == "ring-allreduce" and not any(base.nccl[i] and "allreduce" in base.names[i].lower() for i in range(base.n)):
        return "no allreduce kernels"
    if case == "gemm" and not any(base.gpu[i] and GEMM_RE.search(base.names[i]) and not base.nccl[i] for i in range(base.n)):
        return "no GEMM kernels"
    if case in ("dataloader", "cpu-forward", "gc", "socket-recv") and not base.steps:
        return "no ProfilerSteps"
    return None


def _pick(rng, world: int, k: int) -> list:
    k = max(1, min(world, k))
    return sorted(int(x) for x in rng.choice(world, size=k, replace=False))


def busiest_gemm(base: Base) -> str:
    tot: dict = {}
    for i in range(base.n):
        nm = base.names[i]
        if base.gpu[i] and base.cats[i] == "kernel" and not base.nccl[i] and GEMM_RE.search(nm):
            tot[nm] = tot.get(nm, 0.0) + base.dur[i]
    return max(sorted(tot), key=lambda k: tot[k])


def make_injection(base: Base, case: str, world: int, seed: int) -> Injection:
    rng = _seed(seed, base.name, world, case, "workers")
    everyone = list(range(world))
    if case == "gpu-throttle":
        ws = _pick(rng, world, world // 8)
        f = np.where(base.gpu & ~base.nccl & np.array([c == "kernel" for c in base.cats]), 1.5, 1.0)
        targets = sorted({base.names[i] for i in range(base.n) if base.cats[i] == "kernel" and not base.nccl[i]})
        return Injection(case, CASES[case], ws, targets, "any GPU compute kernel",
                         {r: RankFault(slow=f) for r in ws}, gpu_class=True)
    if case == "nvlink-down":
        ws = _pick(rng, world, world // 8)
        p2p = np.array([c == "gpu_memcpy" and ("PtoP" in nm or "Peer" in nm) for c, nm in zip(base.cats, base.names)])
        sel = base.nccl | p2p
        f = np.where(sel, 3.0, 1.0)
        targets = sorted({base.names[i] for i in np.flatnonzero(sel)})
        return Injection(case, CASES[case], ws, targets, "NCCL kernels / P2P copies",
                         {r: RankFault(slow=f) for r in ws})
    if case == "ring-allreduce":
        ws = _pick(rng, world, 1)
        sel = base.nccl & np.array(["allreduce" in nm.lower() for nm in base.names])
        f = np.where(sel, 3.0, 1.0)
        targets = sorted({base.names[i] for i in np.flatnonzero(sel)})
        return Injection(case, CASES[case], ws, targets, "NCCL AllReduce kernel",
                         {r: RankFault(slow=f) for r in ws})
    if case == "gemm":
        ws = _pick(rng, world, 4)
        g = busiest_gemm(base)
        f = np.where(np.array([nm == g for nm in base.names]) & base.gpu, 3.0, 1.0)
        return Injection(case, CASES[case], ws, [g], g, {r: RankFault(slow=f) for r in ws})
    if case == "dataloader":
        return Injection(case, CASES[case], everyone, [DATA_LOADER[-1]], DATA_LOADER[-1],
                         {r: RankFault(stacks=[(DATA_LOADER, 0.25)]) for r in everyone})
    if case == "cpu-forward":
        return Injection(case, CASES[case], everyone, [CPU_FORWARD[-1]], CPU_FORWARD[-1],
                         {r: RankFault(stacks=[(CPU_FORWARD, 0.30)]) for r in everyone})
    if case == "socket-recv":
        return Injection(case, CASES[case], everyone, [SOCKET_RECV[-1]], SOCKET_RECV[-1],
                         {r: RankFault(stacks=[(SOCKET_RECV, 0.20)]) for r in everyone})
    if case == "gc":
        ws = _pick(rng, world, max(1, round(world * 3 / 16)))
        return Injection(case, CASES[case], ws, [GC_COLLECT[-1]], GC_COLLECT[-1],
                         {r: RankFault(stacks=[(GC_COLLECT, 0.20)]) for r in ws})
    if case == "clean":
        return Injection(case, "clean (jitter only)", [], [], "", {})
    raise ValueError(f"unknown case {case}")


# ------------------------------------------------------------- the replay --


class _Cum:
    """Sum of the amounts inserted at points <= t (or < t)."""

    def __init__(self, p, x):
        p = np.asarray(p, dtype=float)
        x = np.asarray(x, dtype=float)
        o = np.argsort(p, kind="stable")
        self.p = p[o]
        self.c = np.concatenate([[0.0], np.cumsum(x[o])])

    def __call__(self, t, inclusive=True):
        return self.c[np.searchsorted(self.p, t, side="right" if inclusive else "left")]


class _Rank:
    """One rank's jitter, slowdowns and inserted gaps, and its schedule.

    * A CPU lane (pid, tid) is shifted by the extra time of its own leaves
      (inserted at their ends), by the Python gaps (on every lane), and at its
      blocking calls (…Synchronize) by however far the GPU work the call waited
      for is now late (after any idle slack the GPU had before the call).
      CPU parents stretch with what is inserted inside them.
    * A GPU event starts at max(its original start + its launch call's shift,
      the new end of the previous event on its stream), and lasts its own
      (jittered, slowed, waiting) duration: the GPU follows its launches and
      its queue, and a CPU stall only idles it once the queue is drained.
    Nothing moves earlier than in the real trace.
    """

    def __init__(self, base: Base, rank: int, jitter: float, seed: int, fault: RankFault | None):
        rng = _seed(seed, base.name, jitter, rank, "jitter")
        f = rng.uniform(1.0 - jitter, 1.0 + jitter, base.n)
        f = np.where(base.leaf & ~base.blocking, f, 1.0)  # a blocking call's length is its wait
        if fault is not None and fault.slow is not None:
            f = f * np.where(base.leaf, fault.slow, 1.0)
        self.base = base
        self.new_dur = base.dur * f  # for leaves; parents follow the map
        extra = self.new_dur - base.dur
        cpu_pos = (extra > 0) & ~base.gpu
        end = base.ts + base.dur
        self.c_p, self.c_x, self.c_lane = end[cpu_pos], extra[cpu_pos], base.lane[cpu_pos]
        # Python stacks: a gap at each step start (1 ns after it, so the step encloses it).
        self.gaps = []  # (p, g, frames, parent python id)
        if fault is not None:
            for frames, share in fault.stacks:
                for si, _num in base.steps:
                    d = base.dur[si]
                    g = d * share / (1.0 - share)
                    p = base.ts[si] + 0.001
                    parent = None
                    for (a0, b0, pid) in base.py_frames:  # innermost enclosing real frame
                        if a0 <= p < b0:
                            parent = pid
                    self.gaps.append((p, g, frames, parent))
        self.gap = _Cum([x[0] for x in self.gaps], [x[1] for x in self.gaps])

    def schedule(self, own_gpu_extra=None):
        """Returns (lane_shift functions by lane, GPU start/end arrays (full
        length, GPU entries valid)). own_gpu_extra: extra duration per event
        (collective waits)."""
        base = self.base
        own = self.new_dur if own_gpu_extra is None else self.new_dur + own_gpu_extra
        gap = self.gap
        lanes = [int(L) for L in np.unique(base.lane[base.lane >= 0])]
        cl = {L: _Cum(self.c_p[self.c_lane == L], self.c_x[self.c_lane == L]) for L in lanes}
        catch = {L: ([], []) for L in lanes}

        def lane_fn(L):
            c = _Cum(*catch[L])

            def f(t, gaps_inclusive=True):
                return cl[L](t) + c(t) + gap(t, gaps_inclusive)

            return f

        launch = base.launch
        has_launch = launch >= 0

        def gpu_schedule():
            fns = {L: lane_fn(L) for L in lanes}
            lsh = np.zeros(base.n)
            li = np.flatnonzero(has_launch)
            if len(li):
                lts = base.ts[launch[li]]
                ll = base.lane[launch[li]]
                for L in lanes:
                    m = ll == L
                    if m.any():
                        lsh[li[m]] = fns[L](lts[m])
            nl = np.flatnonzero(base.gpu & ~has_launch)
            if len(nl):  # no launch in the trace: follows the Python gaps only
                lsh[nl] = gap(base.ts[nl])
            s_new = np.zeros(base.n)
            e_new = np.zeros(base.n)
            for idx in base.stream_order:
                a = base.ts[idx] + lsh[idx]
                d = own[idx]
                O = np.concatenate([[0.0], np.cumsum(d)[:-1]])
                x = np.maximum.accumulate(a - O) + O  # x_i = max(a_i, x_{i-1} + d_{i-1})
                s_new[idx] = x
                e_new[idx] = x + d
            return s_new, e_new

        # Blocking calls in time order; each may catch its lane up with the GPU.
        bl = np.flatnonzero(base.blocking)
        bl = bl[np.argsort(base.ts[bl] + base.dur[bl], kind="stable")]
        s_new, e_new = gpu_schedule()
        for i in bl:
            L = int(base.lane[i])
            sb, e = base.ts[i], base.ts[i] + base.dur[i]
            k = np.searchsorted(base.gpu_ends, e, side="right")
            if k == 0:
                continue
            # The call waits for the GPU work that had finished when it returned,
            # on any stream (standing in for cross-stream event waits): each of
            # those events is now late by its new end - old end, less the idle
            # slack between its old end and the call's start.
            eg = base.gpu_ends[:k]
            late = e_new[base.gpu_end_order[:k]] - eg
            need = float(np.max(np.minimum(0.0, eg - sb) + late))
            now = cl[L](e) + gap(e, False) + sum(catch[L][1])
            behind = need - now
            if behind > 1e-9:
                catch[L][0].append(e)
                catch[L][1].append(behind)
                s_new, e_new = gpu_schedule()
        return {L: lane_fn(L) for L in lanes}, s_new, e_new


def _events_text(base: Base, vals: np.ndarray) -> str:
    """The events with their numbers filled in (orjson's float writer is ~3x
    faster than %-formatting; both give the shortest text of the rounded value)."""
    if orjson is not None:
        nums = orjson.dumps(vals, option=orjson.OPT_SERIALIZE_NUMPY)[1:-1].decode().split(",")
    else:  # pragma: no cover
        nums = [repr(float(v)) for v in vals]
    out = [None] * (len(base.static) + len(nums))
    out[0::2] = base.static
    out[1::2] = nums
    return "".join(out)


def replay(base: Base, world: int, jitter: float, seed: int, inj: Injection, out_dir: str,
           want_records: bool = False) -> dict:
    """Writes rank-<r>.json for r in 0..world-1 into out_dir. Returns a dict with
    the injection and, if want_records, per-rank arrays (name index, start, dur)
    of GPU kernels and ProfilerSteps for the NVRx baseline."""
    os.makedirs(out_dir, exist_ok=True)
    coll = base.coll_order
    K = len(coll)
    c_start0 = base.ts[coll]
    c_end0 = base.ts[coll] + base.dur[coll]
    # Pass 1: every rank's arrival at each collective, before waits.
    arrive = np.zeros((world, K))
    ranks = {}
    for r in range(world):
        rk = _Rank(base, r, jitter, seed, inj.per_rank.get(r))
        if K:
            _, s_g, _ = rk.schedule()
            arrive[r] = s_g[coll]
        ranks[r] = rk if world <= 64 else None  # rebuilt in pass 3 when large (memory)
    # Pass 2: waits. Collective k starts for everyone when the last rank arrives;
    # a wait lengthens rank r's kernel k and shifts its later events.
    waits = np.zeros((world, K))
    if K:
        # D[:, k] = waits of collectives ending at or before collective k starts.
        end_order = np.argsort(c_end0, kind="stable")
        for k in range(K):
            done = end_order[c_end0[end_order] <= c_start0[k]]
            d = waits[:, done].sum(axis=1) if len(done) else 0.0
            t = arrive[:, k] + d
            waits[:, k] = t.max() - t
    # Pass 3: final timeline per rank, written out.
    records = {}
    kgroups: dict = {}
    sgroups: dict = {}
    if want_records:  # what nvrx_baseline.timings_from_trace would read back
        for i, (c, nm) in enumerate(zip(base.cats, base.names)):
            if c == "kernel":
                kgroups.setdefault(nm, []).append(i)
            elif c == "user_annotation":
                sgroups.setdefault("ProfilerStep" if STEP_RE.match(nm) else nm, []).append(i)
    gpu_idx = np.flatnonzero(base.gpu)
    lane_idx = {int(L): np.flatnonzero(base.lane == L) for L in np.unique(base.lane[base.lane >= 0])}
    for r in range(world):
        rk = ranks.get(r) or _Rank(base, r, jitter, seed, inj.per_rank.get(r))
        wx = np.zeros(base.n)
        if K:
            wx[coll] = waits[r]
        lane_maps, s_g, e_g = rk.schedule(wx)
        own = rk.new_dur + wx
        s_new = np.empty(base.n)
        e_new = np.empty(base.n)
        s_new[gpu_idx] = s_g[gpu_idx]
        e_new[gpu_idx] = e_g[gpu_idx]
        shorten = np.minimum(rk.new_dur - base.dur, 0.0)
        for L, idx in lane_idx.items():
            sh = lane_maps[L]
            st = base.ts[idx]
            en = st + base.dur[idx]
            s_new[idx] = st + sh(st)
            rigid = base.leaf[idx] & ~base.elastic[idx]
            el_end = en + sh(en, False) + np.where(base.leaf[idx], shorten[idx], 0.0)
            e_new[idx] = np.where(rigid, s_new[idx] + own[idx], el_end)
        d_new = np.maximum(e_new - s_new, 0.0)
        extra = []
        pid_counter = 900_000_000
        tl = lane_maps.get(base.train_lane_id)
        for (p, g, frames, parent) in rk.gaps:
            start = p + (tl(np.array([p]), False)[0] if tl else 0.0)  # where the gap begins after earlier shifts
            parent_id = parent
            for depth, fr in enumerate(frames):
                pid_counter += 1
                ev = {
                    "ph": "X", "cat": "python_function", "name": fr,
                    "pid": base.train_lane[0], "tid": base.train_lane[1],
                    # each frame 1 µs inside its caller at both ends
                    "ts": round(start + depth * 1.0, 3), "dur": round(g - 2 * depth * 1.0, 3),
                    "args": {"Python id": pid_counter, "Python thread": 0},
                }
                if parent_id is not None:
                    ev["args"]["Python parent id"] = parent_id
                parent_id = pid_counter
                extra.append(json.dumps(ev, separators=(",", ":")))
        vals = np.empty(2 * base.n)
        # The file's precision is the ns: round start and end (not the duration),
        # so events that touched or nested still do; no negative zeros.
        s_r = np.round(s_new, 3)
        vals[0::2] = s_r
        vals[1::2] = np.maximum(np.round(s_new + d_new, 3) - s_r, 0.0)
        vals = np.round(vals, 3) + 0.0
        with open(os.path.join(out_dir, f"rank-{r}.json"), "w") as f:
            f.write(base.prefix % (r, world))
            f.write(_events_text(base, vals))
            if extra:
                f.write(",\n" + ",\n".join(extra))
            f.write(base.tail)
        if want_records:
            # Durations as written (rounded to the ns like the file).
            dr = vals[1::2]
            records[r] = ({k: dr[v] for k, v in kgroups.items()}, {k: dr[v] for k, v in sgroups.items()})
    return {"injection": inj, "records": records}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a real single-rank Kineto trace (.json or .json.gz)")
    ap.add_argument("out", help="output directory (rank-<r>.json files)")
    ap.add_argument("--workers", type=int, default=16)
    ap.add_argument("--jitter", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="whole ProfilerSteps to keep")
    ap.add_argument("--case", default="clean", choices=["clean"] + list(CASES))
    a = ap.parse_args(argv)
    base = load_base(a.trace, a.steps)
    why = applicable(base, a.case) if a.case != "clean" else None
    if why:
        print(f"case {a.case} does not apply to {a.trace}: {why}", file=sys.stderr)
        return 2
    inj = make_injection(base, a.case, a.workers, a.seed)
    replay(base, a.workers, a.jitter, a.seed, inj, a.out)
    print(json.dumps({"case": inj.case, "workers": inj.workers, "function": inj.target_class}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
