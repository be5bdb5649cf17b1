#!/usr/bin/env python3
"""Accuracy of whyslow vs HTA and an NVRx-style baseline on injected problems
in real traces. Regenerates docs/accuracy.md.

    python3 scripts/accuracy/run.py --out docs/accuracy.md            # full run
    python3 scripts/accuracy/run.py --scales 16 --cases gemm,dataloader \
        --traces a100-nccl-rank0of2 --out /tmp/quick.md                # quick run

The script re-executes itself inside a virtual environment with
HolisticTraceAnalysis, numpy and orjson (created with pip on first use at
--venv, default .venv-accuracy in the repository root, git-ignored). It needs
the whyslow binary (default target/release/whyslow; build it with
`cargo build --release -p whyslow --locked`).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIX = os.path.join(ROOT, "tests", "fixtures", "kineto")
PIP_PACKAGES = ["HolisticTraceAnalysis==0.5.0", "numpy", "orjson"]

# Real traces the cases are replayed from (tests/fixtures/README.md): GPU
# traces with ProfilerSteps and NCCL collectives, so that every case applies.
TRACES = {
    "a100-nccl-rank0of2": os.path.join(FIX, "single", "a100-nccl-rank0of2.json.gz"),
    "a100-rank3of8": os.path.join(FIX, "single", "a100-rank3of8.json.gz"),
    "v100-rank1of2": os.path.join(FIX, "single", "v100-rank1of2.json.gz"),
    "hta-128rank-r0": os.path.join(FIX, "hta-sampled-128rank", "rank-0.json.gz"),
    "h100-qwen-0.5b": os.path.join(FIX, "single", "h100-qwen-0.5b.json.gz"),
    "v100-ns-resolution": os.path.join(FIX, "single", "v100-ns-resolution.pt.trace.json.gz"),
}
DEFAULT_TRACES = ["a100-nccl-rank0of2", "a100-rank3of8", "v100-rank1of2"]
TOOLS = ["whyslow", "hta-straggler", "hta-diff", "nvrx"]


def ensure_venv(venv: str) -> None:
    """Re-exec under the venv's python (creating it if needed)."""
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    if not os.path.exists(py):
        print(f"creating {venv} (pip install {' '.join(PIP_PACKAGES)})", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call([py, "-m", "pip", "install", "-q"] + PIP_PACKAGES)
    os.execv(py, [py] + sys.argv)


# ---------------------------------------------------------------- scoring ---


_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


def _norm(name: str) -> str:
    """A Python builtin's object address is not part of its identity
    (whyslow drops it: `<built-in method collect of module object>`)."""
    return _ADDR.sub("", name)


def matches(f: dict, inj) -> bool:
    """Does finding f name the injected function (or class)?"""
    name = _norm(f["function"])
    if inj.gpu_class:
        if name == "<GPU>":  # NVRx's aggregated GPU score
            return True
        if f.get("kind") == "gpu_kernel":
            return True
        return name in inj.targets_set
    if name in inj.targets_set:
        return True
    # whyslow names a Python function by its whole stack, outermost first.
    return ";" in name and name.rsplit(";", 1)[1] in inj.targets_set


def score(findings: list, inj, clean_findings: list | None, world: int) -> dict:
    """named right / named wrong / missed (fault sets); false alarms (clean sets)."""
    key = lambda f: (f["function"], tuple(f["workers"]))
    if inj.case == "clean":
        fa = [f for f in findings if 0 < len(f["workers"]) < world]
        return {"false_alarms": len(fa), "n": len(findings),
                "detail": [_short(f) for f in fa][:4]}
    base = {key(f) for f in (clean_findings or [])}
    right = [f for f in findings if matches(f, inj) and list(f["workers"]) == inj.workers]
    wrong = [f for f in findings if f not in right and key(f) not in base]
    return {"right": bool(right), "wrong": len(wrong), "n": len(findings),
            "detail": [_short(f) for f in wrong][:4]}


def _short(f):
    w = f["workers"]
    ws = f"{len(w)} workers" if len(w) > 6 else ",".join(map(str, w))
    name = f["function"].split(";")[-1]
    return f"{name[:70]} @ [{ws}]"


# ------------------------------------------------------------------ tools ---


def run_whyslow(binary: str, d: str) -> tuple[list, float]:
    t = time.perf_counter()
    p = subprocess.run([binary, "analyze", d, "--format", "json", "--no-color"],
                       capture_output=True, text=True)
    el = time.perf_counter() - t
    if p.returncode not in (0, 3):
        raise RuntimeError(f"whyslow failed ({p.returncode}): {p.stderr[-500:]}")
    rep = json.loads(p.stdout)
    return [{"function": f["function"], "kind": f["kind"], "workers": sorted(f["workers"])}
            for f in rep["findings"]], el


# -------------------------------------------------------------------- run ---


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "accuracy.md"))
    ap.add_argument("--raw", default=None, help="also write all results as JSON here")
    ap.add_argument("--traces", default=",".join(DEFAULT_TRACES), help=f"comma list of {sorted(TRACES)}")
    ap.add_argument("--scales", default="16,128,1024")
    ap.add_argument("--cases", default="all")
    ap.add_argument("--jitter", default="0.05", help="comma list, e.g. 0.02,0.05")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2, help="whole ProfilerSteps kept per trace")
    ap.add_argument("--steps-large", type=int, default=1,
                    help="whole ProfilerSteps kept at >= 1000 workers (keeps the 1,024-worker sets ~2.5 GB)")
    ap.add_argument("--hta-max-workers", type=int, default=16,
                    help="run HTA only up to this many workers (it parses ~1 s per rank)")
    ap.add_argument("--nvrx-threshold", type=float, default=0.7,
                    help="straggler when a relative score is below this (0.7; NVRx's identify_stragglers defaults to 0.75)")
    ap.add_argument("--whyslow", default=os.path.join(ROOT, "target", "release", "whyslow"))
    ap.add_argument("--workdir", default="/tmp/whyslow-accuracy")
    ap.add_argument("--venv", default=os.path.join(ROOT, ".venv-accuracy"))
    ap.add_argument("--from-raw", default=None,
                    help="only re-render --out from a --raw file of an earlier run (its settings are used)")
    a = ap.parse_args()
    ensure_venv(a.venv)
    if a.from_raw:
        with open(a.from_raw) as f:
            raw = json.load(f)
        for k, v in raw.get("settings", {}).items():
            setattr(a, k, v)
        if not getattr(a, "whyslow_id", None):
            copy = os.path.join(a.workdir, "whyslow")
            a.whyslow_id = _whyslow_id(copy if os.path.exists(copy) else a.whyslow)
        if not getattr(a, "cmd", None):
            a.cmd = "python3 scripts/accuracy/run.py --out docs/accuracy.md"
        md = render(raw["rows"], a, a.traces.split(","), [int(x) for x in a.scales.split(",")],
                    [float(x) for x in a.jitter.split(",")],
                    list(_case_names()) if a.cases == "all" else a.cases.split(","), raw["timing_s"], raw["total_s"])
        with open(a.out, "w") as f:
            f.write(md)
        return 0

    sys.path.insert(0, HERE)
    import replay
    import nvrx_baseline
    import hta_peer

    cases = list(replay.CASES) if a.cases == "all" else a.cases.split(",")
    traces = a.traces.split(",")
    scales = [int(x) for x in a.scales.split(",")]
    jitters = [float(x) for x in a.jitter.split(",")]
    if not os.access(a.whyslow, os.X_OK):
        sys.exit(f"no whyslow binary at {a.whyslow}: cargo build --release -p whyslow --locked")
    # A private copy: a rebuild during the run must not mix two versions.
    os.makedirs(a.workdir, exist_ok=True)
    binary = os.path.join(a.workdir, "whyslow")
    shutil.copy2(a.whyslow, binary)
    a.whyslow_id = _whyslow_id(binary)
    t_start = time.time()
    rows = []
    timing = {"generate": 0.0, "whyslow": 0.0, "hta_parse": 0.0, "hta": 0.0, "nvrx": 0.0}
    hta_rate = {}  # trace -> measured HTA parse s/rank
    for tname in traces:
        bases = {}
        for world in scales:
            st = a.steps_large if world >= 1000 else a.steps
            if st not in bases:
                bases[st] = replay.load_base(TRACES[tname], st, tname)
            base = bases[st]
            for j in jitters:
                wd = os.path.join(a.workdir, f"{tname}-{world}-{j}")
                shutil.rmtree(wd, ignore_errors=True)
                run_hta = world <= a.hta_max_workers
                good = None
                if run_hta:
                    # HTA-diff's known-good run: an independent clean replay.
                    gdir = os.path.join(wd, "good")
                    t = time.perf_counter()
                    replay.replay(base, world, j, a.seed + 1000, replay.make_injection(base, "clean", world, a.seed), gdir)
                    timing["generate"] += time.perf_counter() - t
                    t = time.perf_counter()
                    good = hta_peer.load(gdir)
                    el = time.perf_counter() - t
                    timing["hta_parse"] += el
                    hta_rate.setdefault(tname, el / world)
                clean_findings = {}
                for case in ["clean"] + cases:
                    why = replay.applicable(base, case) if case != "clean" else None
                    row = {"trace": tname, "workers": world, "jitter": j, "case": case, "tools": {}}
                    if why:
                        row["not_applicable"] = why
                        rows.append(row)
                        continue
                    inj = replay.make_injection(base, case, world, a.seed)
                    inj.targets_set = {_norm(t) for t in inj.targets}
                    row["injected_workers"] = inj.workers if len(inj.workers) < world else "all"
                    row["target"] = inj.target_class
                    d = os.path.join(wd, case)
                    t = time.perf_counter()
                    res = replay.replay(base, world, j, a.seed, inj, d, want_records=True)
                    timing["generate"] += time.perf_counter() - t
                    # whyslow
                    f_ws, el = run_whyslow(binary, d)
                    timing["whyslow"] += el
                    # NVRx-style baseline (same numbers as in the files, see replay.replay)
                    t = time.perf_counter()
                    f_nv = nvrx_baseline.findings(res["records"], a.nvrx_threshold)
                    timing["nvrx"] += time.perf_counter() - t
                    found = {"whyslow": f_ws, "nvrx": f_nv}
                    steps = [float(sum(v[1].get("ProfilerStep", []))) for v in res["records"].values()]
                    row["step_us"] = sum(steps) / max(1, len(steps))  # mean over ranks of the profiled steps
                    if run_hta:
                        t = time.perf_counter()
                        try:
                            ta = hta_peer.load(d)
                        except Exception as e:  # noqa: BLE001
                            ta = None
                            found["hta-straggler"] = found["hta-diff"] = f"error: HTA parse: {e}"[:200]
                        timing["hta_parse"] += time.perf_counter() - t
                        if ta is not None:
                            t = time.perf_counter()
                            k = len(inj.workers) if 0 < len(inj.workers) < world else 2
                            try:
                                found["hta-straggler"] = hta_peer.straggler_findings(ta, k)
                            except Exception as e:  # noqa: BLE001
                                found["hta-straggler"] = f"error: {type(e).__name__}: {e}"[:200]
                            try:
                                found["hta-diff"] = hta_peer.diff_findings(good, ta)
                            except Exception as e:  # noqa: BLE001
                                found["hta-diff"] = f"error: {type(e).__name__}: {e}"[:200]
                            timing["hta"] += time.perf_counter() - t
                            del ta
                    else:
                        rate = hta_rate.get(tname)
                        msg = (f"not run ({tname}, {world} ranks: HTA parsed {rate:.2f} s/rank at "
                               f"{min(scales)} ranks -> ~{rate * world / 60:.0f} min per set, plus its good run)"
                               if rate else f"not run ({world} ranks > --hta-max-workers {a.hta_max_workers})")
                        found["hta-straggler"] = found["hta-diff"] = msg
                    for tool, fs in found.items():
                        if isinstance(fs, str):
                            row["tools"][tool] = {"status": fs}
                            continue
                        if case == "clean":
                            clean_findings[tool] = fs
                        row["tools"][tool] = score(fs, inj, clean_findings.get(tool), world)
                    rows.append(row)
                    shutil.rmtree(d, ignore_errors=True)
                    print(f"[{time.time() - t_start:6.0f}s] {tname} N={world} j={j} {case}: "
                          + "; ".join(f"{k}={_cell(v)}" for k, v in row["tools"].items()), file=sys.stderr)
                shutil.rmtree(wd, ignore_errors=True)
    total = time.time() - t_start
    if a.raw:
        settings = {k: getattr(a, k) for k in ("traces", "scales", "cases", "jitter", "seed", "steps", "steps_large",
                                                "hta_max_workers", "nvrx_threshold", "whyslow_id")}
        settings["cmd"] = _cmd()
        settings["date"] = datetime.date.today().isoformat()
        with open(a.raw, "w") as f:
            json.dump({"rows": rows, "timing_s": timing, "total_s": total, "settings": settings}, f, indent=1)
    md = render(rows, a, traces, scales, jitters, cases, timing, total)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write(md)
    print(f"wrote {a.out} in {total:.0f} s", file=sys.stderr)
    return 0


# ----------------------------------------------------------------- render ---


def _cell(v: dict) -> str:
    if "status" in v:
        s = v["status"]
        return "not run" if s.startswith("not run") else "error"
    if "false_alarms" in v:
        return f"{v['false_alarms']} FA"
    return ("right" if v["right"] else "missed") + (f" +{v['wrong']} wrong" if v["wrong"] else "")


def _whyslow_id(binary: str) -> str:
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    git = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h %cs"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"],
                           capture_output=True, text=True).stdout.strip()
    built = datetime.datetime.fromtimestamp(os.path.getmtime(binary)).strftime("%Y-%m-%d %H:%M")
    return (f"{version or 'whyslow'} (binary of {built}; HEAD {git}"
            + (", uncommitted changes under crates/" if dirty else "") + ")")


def _cmd() -> str:
    return " ".join(["python3 scripts/accuracy/run.py"] + sys.argv[1:])


def _case_names():
    sys.path.insert(0, HERE)
    import replay

    return replay.CASES


def _version(pkg: str) -> str:
    try:
        from importlib.metadata import version

        return version(pkg)
    except Exception:  # noqa: BLE001
        return "?"


def render(rows, a, traces, scales, jitters, cases, timing, total) -> str:
    import replay

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    cmd = re.sub(r" --raw \S+", "", getattr(a, "cmd", None) or _cmd())
    out = []
    w = out.append
    w("# Accuracy: whyslow vs HTA vs an NVRx-style baseline on injected problems\n")
    w("Generated by `scripts/accuracy/run.py`; do not edit by hand. Regenerate with\n")
    w("```\npython3 scripts/accuracy/run.py --out docs/accuracy.md\n```\n")
    w(f"This file: `{cmd}`  \n")
    w(f"Date: {getattr(a, 'date', None) or datetime.date.today().isoformat()}. Machine: {platform.machine()}, {cpu or 'unknown CPU'}, "
      f"{os.cpu_count()} cores (shared). Run time: {total / 60:.1f} min (generate {timing['generate']:.0f} s, "
      f"whyslow {timing['whyslow']:.0f} s, HTA parse {timing['hta_parse']:.0f} s + analyses {timing['hta']:.0f} s, "
      f"NVRx-style {timing['nvrx']:.0f} s). Seed {a.seed}; everything below the timings is deterministic for a seed "
      f"and a whyslow binary.  \nwhyslow: {a.whyslow_id}. HTA: HolisticTraceAnalysis "
      f"{_version('HolisticTraceAnalysis')} (pandas {_version('pandas')}).\n")
    w(METHOD.format(steps=a.steps, steps_large=a.steps_large, thr=a.nvrx_threshold, hta_max=a.hta_max_workers))
    w("\n## Cases\n")
    w("| case | injected | on which workers |\n|---|---|---|")
    who = {"gpu-throttle": "1/8 of workers (2 of 16)", "nvlink-down": "1/8 of workers (2 of 16)",
           "dataloader": "all", "cpu-forward": "all", "gc": "3/16 of workers",
           "socket-recv": "all", "ring-allreduce": "1 worker", "gemm": "4 workers"}
    for c in cases:
        w(f"| {c} | {replay.CASES[c]} | {who.get(c, '')} |")
    w("")
    for j in jitters:
        w(f"\n## Summary, jitter ±{j * 100:.0f} %\n")
        w("Fault cases: traces where the tool named the injected function on exactly the injected workers "
          "(named right / traces run), then the total of other findings (named wrong). "
          "Clean: findings on a subset of workers (false alarms), summed over traces.\n")
        for world in scales:
            w(f"\n### {world} workers\n")
            w("| case | " + " | ".join(TOOLS) + " |\n|---|" + "---|" * len(TOOLS))
            for c in ["clean"] + cases:
                rs = [r for r in rows if r["case"] == c and r["workers"] == world and r["jitter"] == j
                      and "not_applicable" not in r]
                cells = []
                for tool in TOOLS:
                    vs = [r["tools"].get(tool) for r in rs if r["tools"].get(tool)]
                    ran = [v for v in vs if "status" not in v]
                    if not vs:
                        cells.append("–")
                        continue
                    if not ran:
                        cells.append("not run" if all(v["status"].startswith("not run") for v in vs) else "error")
                        continue
                    errs = len(vs) - len(ran)
                    suffix = f", {errs} error" if errs else ""
                    if c == "clean":
                        cells.append(f"{sum(v['false_alarms'] for v in ran)} FA / {len(ran)}{suffix}")
                    else:
                        right = sum(v["right"] for v in ran)
                        wrong = sum(v["wrong"] for v in ran)
                        cells.append(f"{right}/{len(vs)} right, {wrong} wrong{suffix}")
                w(f"| {c} | " + " | ".join(cells) + " |")
    w("\n## Per trace\n")
    w("`right` / `missed`, `+n wrong`; clean rows: `n FA` (false alarms). Up to 4 of the wrong findings are listed "
      "under the tables. *Step time vs clean*: mean over ranks of the profiled ProfilerSteps' total, against the "
      "clean set (how much the fault slows the job at all; a GPU slowdown on a CPU-bound trace may cost nothing).\n")
    notes = []
    for j in jitters:
        for world in scales:
            w(f"\n### {world} workers, jitter ±{j * 100:.0f} %\n")
            w("| trace | case | injected workers | step time vs clean | " + " | ".join(TOOLS)
              + " |\n|---|---|---|---|" + "---|" * len(TOOLS))
            not_run = set()
            clean_step = {r["trace"]: r.get("step_us") for r in rows
                          if r["workers"] == world and r["jitter"] == j and r["case"] == "clean"}
            for r in rows:
                if r["workers"] != world or r["jitter"] != j:
                    continue
                if "not_applicable" in r:
                    w(f"| {r['trace']} | {r['case']} | n/a ({r['not_applicable']}) | |" + " |" * len(TOOLS))
                    continue
                iw = r.get("injected_workers")
                iw = "all" if iw == "all" else ("–" if not iw else (",".join(map(str, iw)) if len(iw) <= 8 else f"{len(iw)} workers"))
                cells = []
                for tool in TOOLS:
                    v = r["tools"].get(tool)
                    if v is None:
                        cells.append("–")
                        continue
                    c = _cell(v)
                    if "status" in v and v["status"].startswith("not run"):
                        not_run.add(f"HTA {v['status']}.")
                    elif "status" in v or v.get("detail"):
                        notes.append(f"{r['trace']} {r['case']} {world}w j{j} {tool}: "
                                     + (v["status"] if "status" in v else "; ".join(v["detail"])))
                        c += f" [{len(notes)}]"
                    cells.append(c)
                cs, st = clean_step.get(r["trace"]), r.get("step_us")
                slow = "–" if r["case"] == "clean" or not cs or st is None else f"{(st / cs - 1) * 100:+.0f} %"
                w(f"| {r['trace']} | {r['case']} | {iw} | {slow} | " + " | ".join(cells) + " |")
            for x in sorted(not_run):
                w(f"\n{x}")
    if notes:
        w("\n### Notes\n")
        for i, n in enumerate(notes, 1):
            w(f"{i}. {n.replace('|', '/')}")
    return "\n".join(out) + "\n"


METHOD = """
## How it is measured

**Inputs.** Real single-rank PyTorch profiler traces from `tests/fixtures/kineto` (see
`tests/fixtures/README.md`), each cropped to {steps} whole ProfilerSteps ({steps_large} at 1,024 workers, to
keep a set at ~2.5 GB of JSON; the first step is skipped when there are more) and replayed as N ranks by
`scripts/accuracy/replay.py` (its docstring has the full model). Every leaf event's duration gets an
independent factor uniform in [1-j, 1+j]. On a CPU thread, time an event gains shifts what follows on that
thread and stretches its parents; a GPU event starts when both its launch call and the previous event on its
stream allow, and keeps its own duration; a blocking call (`...Synchronize`) stretches until the GPU work it
waited for is done (all GPU work, any stream, that had ended when it returned: this stands in for cross-stream
event waits, so a late NCCL kernel delays the next sync and what follows). Collectives are synchronous: the k-th NCCL kernel starts its transfer on every rank when
the last rank arrives, so each rank's kernel is lengthened by how late the last rank is (peers wait). Faults
are injected on this timeline, so a slow worker's window really is longer and its peers wait for it. The
ring-allreduce case is modelled the same way: the slow worker's AllReduce kernels are 3x longer, and the
peers wait that long in their next collective (in a real ring they would also wait inside the same
AllReduce; with traces alone the kernel durations of that worker differ, its arrival time does not).
Python cases insert a nested `python_function` stack (with `Python id`/`Python parent id`, each frame 1 µs
inside its caller) at the start of every step on the training thread; the GPU idles once its queue is
drained. Each (trace, scale, jitter) also gets a clean set (jitter only) with the same seed, so a fault set
differs from its clean set only by the fault.

**Matching rules.**
* *Named right*: some finding names the injected function, on exactly the injected workers (all ranks
  for the all-worker cases). The injected function is: gemm: the busiest GEMM kernel's exact name;
  ring-allreduce: an NCCL AllReduce kernel name; nvlink-down: any NCCL kernel (or peer-to-peer copy)
  name; gpu-throttle: any GPU compute (non-NCCL) kernel, whyslow's `all GPU compute kernels` or NVRx's
  aggregated GPU score; Python cases:
  the injected leaf frame (`socket.py(705): recv_into`, `model.py(120): forward`, `<built-in method
  collect ...>`, `<method 'recv' of '_socket.socket' objects>`); whyslow names a Python function by its
  whole stack, which must end with that frame.
* *Named wrong*: every other finding, except those identical (same function, same workers) to a finding
  of the same tool on the matching clean set (those are the real trace's own problems, or false alarms
  already counted on the clean row). Several findings that all match (e.g. several kernels on the
  throttled workers) are all right.
* *Missed*: no finding is right.
* *Clean sets*: false alarms = findings on a strict subset of the workers (a finding on all workers is a
  problem of the real trace itself, not a worker being singled out).

**Tools.**
* *whyslow*: `target/release/whyslow analyze DIR --format json`, every entry of `findings[]`
  (`function`, `workers`).
* *hta-straggler* (HolisticTraceAnalysis 0.5.0, same input as whyslow):
  `TraceAnalysis.get_potential_stragglers(num_candidates=k)` gives the ranks, with k = the number of
  injected workers on subset cases (an oracle hint in HTA's favour; HTA has no threshold and always
  returns k ranks) and HTA's default k = 2 on clean and all-worker sets; the function is the top op of
  `TraceDiff.compare_traces` between the lowest non-flagged rank and the first flagged rank (rule below).
* *hta-diff* (needs a known-good run, which whyslow does not): for each rank r,
  `TraceDiff.compare_traces(good run rank r, tested run rank r)`, top op by the rule below; ranks with
  the same top op form one finding. The good run is an independent clean replay (other seed).
  Top op: among ops other than `ProfilerStep#N` whose total duration grew by at least 1 % of the control
  rank's step time, the largest relative growth (absent from the control: infinite), ties to the smaller
  total (innermost frame), then name. HTA drops the last profiled step, as it does by default. HTA
  parses about 1 s per rank here, so it runs up to {hta_max} workers (`--hta-max-workers`); larger
  scales say "not run" with the measured rate.
* *nvrx*: `scripts/accuracy/nvrx_baseline.py`, NVIDIA Resiliency Extension's straggler scores
  re-implemented from its documentation/source (`ReportGenerator`): per rank and per kernel / section
  the median duration; relative score = min over ranks of the medians / this rank's median; GPU score =
  those kernel scores weighted by the rank's time in each kernel, NCCL kernels skipped (as NVRx does);
  sections = user annotations (`ProfilerStep#N` pooled as one) and, as an extension, each non-NCCL
  kernel; straggler when score < {thr} (the published threshold 0.7; NVRx's `identify_stragglers`
  defaults to 0.75). One finding per (section, ranks).
"""


if __name__ == "__main__":
    sys.exit(main())
