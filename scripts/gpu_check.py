#!/usr/bin/env python3
"""The checks of `scripts/gpu-check` (issue 33): whyslow's GPU paths on a real
NVIDIA GPU, each as pass/fail with its figures.

    scripts/gpu-check --build          # here: builds what the device machine runs, into .gpu/
    scripts/gpu-check [--out DIR]      # there: the checks; summary in $OUT (or DIR)
    scripts/gpu-check --dry-run        # any machine: the same plumbing on the CPU

Without a CUDA device (or with --dry-run) it says so and runs each check's
plumbing on the CPU: every check is then `skip` with the reason, and its
figures show that the parts ran. What it writes (at most 8 files, for the
device tool to bring back):

    gpu-check.json   {"device", "dry_run", "started", "seconds", "checks": [{name, status, figures, detail, seconds}]}
    gpu-check.txt    the same, one line per check
    artifacts.tar.gz the recorded inputs (NVML series, traces, collective records, reports, logs)

The checks (PerfTracker §4.2 for NVML's μ/σ, §5 for localization; SysOM-AI
§3.1 for gpu_diff, §3.2 for NCCL's collectives):

    env        which card, driver, torch, CUDA, NCCL, kernel, BTF
    nvml       the sampler at 1 kHz during a CUDA matmul loop and idle: SM busy vs. idle, its rate and CPU cost;
               NVML's own call latencies (pynvml) as the reference
    localize   4 ranks on the one GPU (CUDA compute, gloo collectives) with `import whyslow`; rank 2 launches
               extra kernels from step N: the report names that kernel on {2}, μ/σ from NVML samples, and no
               report names a subset of ranks before the onset
    overhead   the online package's cost on a GPU training loop outside windows, ABAB interleaved, with a
               control run (hooks installed, whyslow disabled) as the noise floor; goal ≤ 0.5 %
    nccl       a world-size-1 NCCL job with NCCL_PROFILER_PLUGIN=libwhyslow_nccl.so: records with GPU times, or
               the reason NCCL gives; the uprobe tracer (`whyslow collectives --pid`) on the same job
    diagnose   4 ranks, rank 2 on a 32× batch (the same kernels, slower per call), node agent tracing the gloo
               collectives: `whyslow diagnose --fingerprints` computes gpu_diff from the real CUDA kernels
"""

import argparse
import csv
import glob
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The bundle of `scripts/gpu-check --build`, unpacked by scripts/gpu-check.
RUN_DIR = os.environ.get("WHYSLOW_GPU_RUN") or os.path.join(ROOT, ".gpu", "run")
TRAIN = os.path.join(ROOT, "examples", "train.py")

# The online package's settings for short jobs (as tests/python/conftest.py).
JOB_ENV = {
    "WHYSLOW_WINDOW_S": "1",
    "WHYSLOW_N": "30",
    "WHYSLOW_THRESHOLD": "1.0",
    "WHYSLOW_POLL_S": "0.25",
    "WHYSLOW_LEAD_S": "1",
    "WHYSLOW_COLLECT_TIMEOUT_S": "60",
    "WHYSLOW_LOG_LEVEL": "INFO",
    "WHYSLOW_SAMPLE_HZ": "1000",
    "WHYSLOW_KEEP_TRACES": "1",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONFAULTHANDLER": "1",
}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def sh(cmd, timeout=30, env=None, cwd=None):
    """(rc, output) of a command; rc None when it could not run or timed out."""
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout,
                           env=env, cwd=cwd)
        return p.returncode, p.stdout.decode(errors="replace")
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode(errors="replace") + "\n[timed out after %ss]" % timeout
    except OSError as e:
        return None, str(e)


class Ctx:
    def __init__(self, out, work, dry_run, python, whyslow, plugin, env):
        self.out, self.work, self.dry_run = out, work, dry_run
        self.python, self.whyslow, self.plugin, self.env = python, whyslow, plugin, env
        self.keep = []  # files for artifacts.tar.gz

    def child_env(self, extra=None):
        e = dict(self.env)
        if extra:
            e.update(extra)
        return e

    def py(self, code, args=(), timeout=60, env=None):
        return sh([self.python, "-c", code] + list(args), timeout=timeout, env=self.child_env(env))


# ---------------------------------------------------------------- env

ENV_PY = r"""
import json, os, platform, sys
out = {"python": sys.version.split()[0], "kernel": platform.release(),
       "btf": os.path.exists("/sys/kernel/btf/vmlinux")}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out["device_name"] = p.name
        out["sms"] = p.multi_processor_count
        out["memory_gib"] = round(p.total_memory / 2**30, 1)
        try:
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:
            out["nccl"] = "unknown: %s" % e
except Exception as e:
    out["torch_error"] = repr(e)
try:
    import whyslow
    from whyslow import _whyslow
    out["whyslow"] = os.path.dirname(whyslow.__file__)
except Exception as e:
    out["whyslow_error"] = repr(e)
print("RESULT " + json.dumps(out))
"""


def result_line(text):
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


def check_env(ctx):
    rc, out = ctx.py(ENV_PY, timeout=90)
    r = result_line(out)
    if r is None:
        return "fail", {}, "environment probe failed: " + out[-1500:]
    rc2, smi = sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit",
                   "--format=csv,noheader"], timeout=20)
    r["nvidia_smi"] = smi.strip() if rc2 == 0 else "not available (%s)" % smi.strip()[:200]
    r["cpus"] = os.cpu_count()
    if "whyslow_error" in r:
        return "fail", r, "the whyslow package does not import: " + r["whyslow_error"]
    return "pass", r, ""


# ---------------------------------------------------------------- nvml

NVML_PY = r"""
import json, os, sys, time, threading
out_dir = sys.argv[1]; secs = float(sys.argv[2])
import torch
from whyslow import _whyslow
cuda = torch.cuda.is_available()
dev = "cuda" if cuda else "cpu"
n = 8192 if cuda else 256
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
b = torch.randn(n, n, device=dev, dtype=a.dtype)
if cuda:
    torch.cuda.synchronize()
res = {}
for phase in ("busy", "idle"):
    s = _whyslow.Sampler.start(1000.0)
    t0 = time.perf_counter(); calls = 0
    while time.perf_counter() - t0 < secs:
        if phase == "busy":
            for _ in range(8):
                c = a @ b
            if cuda:
                torch.cuda.synchronize()
            calls += 8
        else:
            time.sleep(0.05)
    info = s.write(os.path.join(out_dir, "nvml-%s.samples.csv" % phase))
    info["matmuls"] = calls
    info["seconds"] = time.perf_counter() - t0
    res[phase] = info
# NVML's own call latencies: what one tick of the sampler costs at least.
lat = {}
try:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(h),
        "pcie_tx": lambda: pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES),
        "power": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "sm_clock": lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        "temperature": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
    }
    for name, f in calls.items():
        ts = []
        try:
            for _ in range(50):
                t = time.perf_counter_ns(); f(); ts.append(time.perf_counter_ns() - t)
            ts.sort()
            lat[name] = {"median_us": ts[len(ts) // 2] / 1e3, "max_us": ts[-1] / 1e3}
        except Exception as e:
            lat[name] = {"error": repr(e)}
except Exception as e:
    lat["error"] = repr(e)
res["nvml_call_latency"] = lat
print("RESULT " + json.dumps(res))
"""


def read_series(path, resource):
    pts = []
    with open(path) as f:
        for row in csv.DictReader(f):
            if row.get("resource") == resource:
                pts.append((int(float(row["ts_us"])), float(row["value"])))
    pts.sort()
    return pts


def tail_mean(pts, frac=0.6):
    """Mean of the last `frac` of a series: NVML's utilization averages over
    the driver's last 1/6-1 s, so the start of a phase still shows the last."""
    if not pts:
        return None
    vals = [v for _, v in pts[int(len(pts) * (1 - frac)):]]
    return sum(vals) / len(vals)


def check_nvml(ctx):
    d = os.path.join(ctx.work, "nvml")
    os.makedirs(d, exist_ok=True)
    rc, out = ctx.py(NVML_PY, [d, "4"], timeout=120)
    r = result_line(out)
    with open(os.path.join(d, "nvml.log"), "w") as f:
        f.write(out)
    ctx.keep += glob.glob(os.path.join(d, "*"))
    if r is None:
        return "fail", {}, "the sampler run failed: " + out[-1500:]
    figs = {"nvml_call_latency": r.get("nvml_call_latency")}
    for phase in ("busy", "idle"):
        info = r[phase]
        sm = read_series(os.path.join(d, "nvml-%s.samples.csv" % phase), "sm")
        figs[phase] = {
            "achieved_hz": round(info["achieved_hz"], 1),
            "sampler_cpu_pct": round(100 * info["sampler_cpu_fraction"], 2),
            "overruns": info["overruns"], "ticks": info["ticks"],
            "series": info["series"], "sm_points": len(sm),
            "sm_mean_tail": tail_mean(sm), "matmuls": info.get("matmuls"),
            "notes": info["notes"], "gpu": info.get("gpu"),
        }
    busy, idle = figs["busy"], figs["idle"]
    if ctx.dry_run:
        return "skip", figs, "no GPU: the sampler ran at %.0f Hz without the sm series (gpu: %s)" % (
            busy["achieved_hz"], busy["gpu"])
    problems = []
    if busy["sm_mean_tail"] is None or idle["sm_mean_tail"] is None:
        problems.append("no sm series")
    else:
        if busy["sm_mean_tail"] < 0.7:
            problems.append("SM utilization during matmuls %.2f < 0.7" % busy["sm_mean_tail"])
        if idle["sm_mean_tail"] > 0.2:
            problems.append("SM utilization idle %.2f > 0.2" % idle["sm_mean_tail"])
    for phase in ("busy", "idle"):
        if figs[phase]["achieved_hz"] < 900:
            problems.append("%s: achieved %.0f Hz of 1000" % (phase, figs[phase]["achieved_hz"]))
    if problems:
        return "fail", figs, "; ".join(problems)
    return "pass", figs, "SM %.2f during matmuls, %.2f idle; %.0f Hz; sampler thread %.1f %% of a core" % (
        busy["sm_mean_tail"], idle["sm_mean_tail"], busy["achieved_hz"], busy["sampler_cpu_pct"])


# ---------------------------------------------------------------- the 4-rank jobs

def torchrun(ctx, name, args, env=None, timeout=180, nproc=4):
    d = os.path.join(ctx.work, name)
    os.makedirs(d, exist_ok=True)
    e = dict(JOB_ENV)
    e["WHYSLOW_REPORT_DIR"] = os.path.join(d, "reports")
    if env:
        e.update(env)
    cmd = [ctx.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           TRAIN] + list(args)
    t0 = time.monotonic()
    rc, out = sh(cmd, timeout=timeout, env=ctx.child_env(e), cwd=d)
    wall = time.monotonic() - t0
    with open(os.path.join(d, "run.log"), "w") as f:
        f.write(out)
    ctx.keep.append(os.path.join(d, "run.log"))
    keep_tree(ctx, os.path.join(d, "reports"))
    reports = []
    for s in sorted(glob.glob(os.path.join(d, "reports", "*", "*-s*"))):
        p = os.path.join(s, "report.json")
        if os.path.exists(p):
            with open(p) as f:
                reports.append((s, json.load(f)))
    return d, rc, out, wall, reports


def onset_time(out, rank):
    for line in out.splitlines():
        if line.startswith("fault ") and "(rank %d)" % rank in line:
            try:
                return float(line.split("time ")[1].split()[0].rstrip(","))
            except (IndexError, ValueError):
                return None
    return None


def iter_ms(out):
    vals = []
    for line in out.splitlines():
        if line.startswith("iter ") and "ms/iter" in line:
            try:
                vals.append(float(line.split()[-2]))
            except ValueError:
                pass
    return vals


def session_start(sdir):
    """When the session was proposed (session.json's local-time stamp)."""
    try:
        with open(os.path.join(sdir, "session.json")) as f:
            return time.mktime(time.strptime(json.load(f)["stamp"], "%Y%m%d-%H%M%S"))
    except (OSError, ValueError, KeyError):
        return os.path.getmtime(os.path.join(sdir, "report.json"))


def keep_tree(ctx, top):
    for dirpath, _, names in os.walk(top):
        ctx.keep += [os.path.join(dirpath, n) for n in sorted(names)]


def check_localize(ctx):
    cuda_args = ["--kernel-elems", str(1 << 23), "--kernel-calls", "24"] if not ctx.dry_run else [
        "--kernel-elems", str(1 << 18), "--kernel-calls", "8", "--sim-compute-ms", "20"]
    fault_at = 600 if not ctx.dry_run else 100
    iters = fault_at + (500 if not ctx.dry_run else 200)
    d, rc, out, wall, reports = torchrun(
        ctx, "localize", ["--iters", str(iters), "--fault-at", str(fault_at), "--fault", "extra-kernel",
                          "--fault-rank", "2", "--backend", "gloo", "--log-every", "100"] + cuda_args,
        timeout=200 if not ctx.dry_run else 400)
    figs = {"rc": rc, "wall_s": round(wall, 1), "ms_per_iter": iter_ms(out), "sessions": len(reports)}
    if rc != 0:
        return "fail", figs, "the job failed (rc %s): %s" % (rc, out[-1500:])
    onset = onset_time(out, 2)
    figs["onset_unix"] = onset
    found, before, own = None, [], []
    for sdir, rep in reports:
        start = session_start(sdir)
        rows = [{"function": f["function"][-160:], "kind": f.get("kind"), "workers": f["workers"],
                 "resource": f.get("resource"), "util_source": f.get("util_source"),
                 "mu": f.get("mu"), "sigma": f.get("sigma"), "beta": f.get("beta")}
                for f in rep.get("findings", [])]
        figs.setdefault("reports", []).append({"session": os.path.basename(sdir), "start": start,
                                               "workers": rep.get("workers"), "findings": rows[:6]})
        # The session's stamp has whole seconds (and is taken when a rank
        # proposes the window, after the detector saw the slowdown).
        if onset is not None and start < onset - 1.5:
            before += [r for r in rows if 0 < len(r["workers"]) < 4]
        for f, r in zip(rep.get("findings", []), rows):
            name = f["function"]
            if "whyslow/_" in name:
                own.append(r)
            # cub's radix sort kernels: DeviceRadixSort…, …RadixSort… (the
            # name's template arguments run long, so the whole is searched).
            if r["workers"] == [2] and found is None and (
                    "sort" in name.lower() or (ctx.dry_run and "injected_extra_kernels" in name)):
                if ctx.dry_run or r["kind"] == "gpu_kernel":
                    found = dict(r, function=name[:200] + (" …" if len(name) > 200 else ""))
    figs["named"] = found
    figs["whyslow_own_frames"] = own
    if ctx.dry_run:
        return "skip", figs, "no GPU: the CPU job ran; %s" % (
            "the report names %s on {2}" % found["function"] if found else "no finding on {2}")
    problems = []
    if not reports:
        problems.append("no report written")
    if found is None:
        problems.append("no GPU-kernel finding naming the sort on {2}")
    elif found["util_source"] not in ("samples", "Samples"):
        problems.append("the kernel's mu/sigma came from %s, not NVML samples" % found["util_source"])
    if before:
        problems.append("before the onset a report named a subset: %s" % before[:3])
    if own:
        problems.append("the report names whyslow's own frames: %s" % [r["function"][-80:] for r in own])
    if problems:
        return "fail", figs, "; ".join(problems)
    return "pass", figs, "names %s on {2}, μ %.2f from %s" % (
        found["function"][:90], found["mu"]["value"], found["util_source"])


# ---------------------------------------------------------------- overhead

def check_overhead(ctx):
    dev = "cpu" if ctx.dry_run else "cuda"
    blocks, per, hidden = (20, 10, 512) if ctx.dry_run else (150, 40, 4096)
    figs = {"device": dev, "blocks": blocks, "block_iters": per, "hidden": hidden}
    for control in (False, True):
        j = os.path.join(ctx.work, "overhead-%s.json" % ("control" if control else "on"))
        args = [os.path.join(ROOT, "examples", "bench_overhead.py"), "--interleave", "--blocks", str(blocks),
                "--block-iters", str(per), "--device", dev, "--hidden", str(hidden), "--json", j]
        if control:
            args.append("--control")
        rc, out = sh([ctx.python] + args, timeout=150, env=ctx.child_env({"WHYSLOW_SAMPLE_HZ": "1000"}))
        if rc != 0 or not os.path.exists(j):
            return "fail", figs, "bench_overhead failed: " + out[-1500:]
        with open(j) as f:
            r = json.load(f)
        ctx.keep.append(j)
        figs["control" if control else "whyslow"] = {
            "overhead_pct": round(100 * r["mean_diff"], 3), "ci95_pct": round(100 * r["ci95"], 3),
            "pair_sd_pct": round(100 * r["pair_sd"], 2), "on_ms": round(r["on_ms"], 4),
            "off_ms": round(r["off_ms"], 4), "sessions": r["sessions"]}
    w, c = figs["whyslow"], figs["control"]
    detail = "overhead %+.3f %% ± %.3f %% (95 %% CI), noise floor (control) %+.3f %% ± %.3f %%" % (
        w["overhead_pct"], w["ci95_pct"], c["overhead_pct"], c["ci95_pct"])
    if ctx.dry_run:
        return "skip", figs, "no GPU (CPU loop): " + detail
    ok = w["overhead_pct"] <= 0.5 or w["overhead_pct"] - w["ci95_pct"] <= 0.5
    return ("pass" if ok else "fail"), figs, detail + ("" if ok else "; goal ≤ 0.5 %")


# ---------------------------------------------------------------- nccl

NCCL_PY = r"""
import os, sys, time, json
secs = float(sys.argv[1])
import torch, torch.distributed as dist
cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo", init_method="tcp://127.0.0.1:%s" % os.environ["PORT"],
                        rank=0, world_size=1)
dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
t = torch.ones(4 << 20, device=dev)
small = torch.ones(1024, device=dev)
print("READY pid %d" % os.getpid(), flush=True)
time.sleep(float(os.environ.get("WAIT_S", "0")))
n = 0; t0 = time.time()
while time.time() - t0 < secs:
    dist.all_reduce(t); dist.all_reduce(small); dist.broadcast(small, 0)
    out = [torch.empty_like(small)]; dist.all_gather(out, small)
    n += 4
    if cuda:
        torch.cuda.synchronize()
dist.barrier()
dist.destroy_process_group()
print("RESULT " + json.dumps({"collectives": n, "seconds": time.time() - t0}), flush=True)
"""


def read_records(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        recs.append(json.loads(line))
                    except ValueError:
                        pass
    return recs


def summarize_records(recs):
    ops = {}
    for r in recs:
        ops[str(r.get("op"))] = ops.get(str(r.get("op")), 0) + 1
    sample = recs[len(recs) // 2] if recs else None
    return {"records": len(recs), "ops": ops, "sample": sample}


def check_nccl(ctx):
    d = os.path.join(ctx.work, "nccl")
    rec_dir = os.path.join(d, "plugin")
    os.makedirs(rec_dir, exist_ok=True)
    env = {"PORT": str(free_port()), "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,PROFILE",
           "WHYSLOW_NCCL_DIR": rec_dir, "RANK": "0", "WAIT_S": "3"}
    figs = {}
    if ctx.plugin:
        env["NCCL_PROFILER_PLUGIN"] = ctx.plugin
    else:
        figs["plugin"] = "not built (.gpu/libwhyslow_nccl.so missing)"
    log = open(os.path.join(d, "job.log"), "w+")
    p = subprocess.Popen([ctx.python, "-c", NCCL_PY, "8"], stdout=log, stderr=subprocess.STDOUT,
                         env=ctx.child_env(env))
    # The uprobe tracer on the same job, attached while it waits.
    pid = None
    t_end = time.time() + 90
    while time.time() < t_end and p.poll() is None:
        log.flush()
        with open(log.name) as f:
            for line in f:
                if line.startswith("READY pid "):
                    pid = int(line.split()[2])
        if pid:
            break
        time.sleep(0.2)
    tracer = None
    traced = os.path.join(d, "uprobes.collectives.jsonl")
    if pid and ctx.whyslow:
        tlog = open(os.path.join(d, "uprobes.log"), "w")
        tracer = subprocess.Popen([ctx.whyslow, "collectives", "--pid", str(pid), "--duration", "9", "-o", traced],
                                  stdout=tlog, stderr=subprocess.STDOUT)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    if tracer:
        try:
            tracer.wait(timeout=30)
        except subprocess.TimeoutExpired:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(timeout=10)
    log.close()
    with open(log.name) as f:
        out = f.read()
    ctx.keep.append(log.name)
    res = result_line(out)
    figs["job"] = res
    figs["job_rc"] = p.returncode
    plugin_lines = [l.strip()[-220:] for l in out.splitlines()
                    if "rofiler" in l or "whyslow" in l.lower() or "PROFILER" in l]
    figs["nccl_profiler_lines"] = plugin_lines[:12]
    files = glob.glob(os.path.join(rec_dir, "*.collectives.jsonl"))
    ctx.keep += files
    recs = read_records(files)
    figs["plugin_records"] = summarize_records(recs)
    gpu_timed = [r for r in recs if r.get("source") == "nccl-plugin-gpu"]
    figs["plugin_records_gpu_timed"] = len(gpu_timed)
    if os.path.exists(traced):
        ctx.keep.append(traced)
        figs["uprobe_records"] = summarize_records(read_records([traced]))
    if os.path.exists(os.path.join(d, "uprobes.log")):
        ctx.keep.append(os.path.join(d, "uprobes.log"))
        with open(os.path.join(d, "uprobes.log")) as f:
            figs["uprobe_log"] = f.read()[-600:]
    if ctx.dry_run:
        return "skip", figs, "no GPU: the job ran on gloo, NCCL was not loaded (%d plugin records, %s uprobe records)" % (
            len(recs), (figs.get("uprobe_records") or {}).get("records"))
    problems = []
    if res is None:
        problems.append("the NCCL job failed: " + out[-800:])
    # One process per GPU is all one GPU allows: NCCL then loads the plugin
    # and gives it no event (the plugin's line says so), which the issue
    # accepts as "the exact reason".
    silent = [l for l in plugin_lines if "ended without NCCL reporting" in l]
    figs["plugin_reason"] = silent[0] if silent else None
    if not recs and not silent:
        problems.append("no plugin records; NCCL said: %s" % (plugin_lines[-3:] or "nothing about a profiler"))
    elif recs and not gpu_timed:
        problems.append("%d plugin records, none with GPU times (host times only)" % len(recs))
    if not (figs.get("uprobe_records") or {}).get("records"):
        problems.append("no uprobe records: %s" % figs.get("uprobe_log", "tracer not run")[-300:])
    if not problems:
        detail = ("%d plugin records (%d with GPU times)" % (len(recs), len(gpu_timed)) if recs
                  else "no plugin records: " + silent[0]) + "; %d uprobe records" % (
            figs["uprobe_records"]["records"])
        return "pass", figs, detail
    return "fail", figs, "; ".join(problems)


# ---------------------------------------------------------------- diagnose

def check_diagnose(ctx):
    if not ctx.whyslow:
        return "fail", {}, "no whyslow binary (.gpu/whyslow)"
    d = os.path.join(ctx.work, "diagnose")
    reg, spool = os.path.join(d, "agent-reg"), os.path.join(d, "spool")
    os.makedirs(reg, exist_ok=True)
    os.makedirs(spool, exist_ok=True)
    alog = open(os.path.join(d, "agent.log"), "w")
    agent = subprocess.Popen([ctx.whyslow, "agent", "--samples-dir", reg, "--profile-spool", spool,
                              "--profile-period", "2", "--trace-collectives", "--log-format", "json"],
                             stdout=alog, stderr=subprocess.STDOUT)
    time.sleep(1.0)
    args = ["--backend", "gloo", "--fault", "big-batch", "--fault-rank", "2", "--log-every", "100"]
    # An on-demand profile (whyslow.trigger) well after the onset gives the
    # kernels' fingerprints whatever the detector makes of the slowdown.
    if ctx.dry_run:
        args += ["--iters", "450", "--fault-at", "150", "--trigger-at", "300", "--sim-compute-ms", "15",
                 "--batch-scale", "16"]
    else:
        # Wide batches of a narrow model: small gradients for gloo, GPU time
        # that grows with the batch.
        args += ["--iters", "1400", "--fault-at", "600", "--trigger-at", "900", "--batch-scale", "32",
                 "--hidden", "1024", "--batch", "2048"]
    try:
        d2, rc, out, wall, reports = torchrun(ctx, "diagnose/job", args,
                                              env={"WHYSLOW_AGENT_DIR": reg, "WHYSLOW_THRESHOLD": "100"},
                                              timeout=200 if not ctx.dry_run else 400)
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()
        alog.close()
    ctx.keep.append(alog.name)
    figs = {"rc": rc, "wall_s": round(wall, 1), "ms_per_iter": iter_ms(out), "sessions": len(reports)}
    if rc != 0:
        return "fail", figs, "the job failed (rc %s): %s" % (rc, out[-1500:])
    fps = [os.path.join(s, "fingerprints") if os.path.isdir(os.path.join(s, "fingerprints")) else s
           for s, _ in reports]
    cmd = [ctx.whyslow, "diagnose", spool, "--format", "json"]
    if fps:
        cmd += ["--fingerprints"] + fps
    rc2, dout = sh(cmd, timeout=120)
    try:
        rep = json.loads(dout[dout.index("{"):])
    except ValueError:
        return "fail", figs, "diagnose failed (rc %s): %s" % (rc2, dout[-1500:])
    with open(os.path.join(d, "diagnose.json"), "w") as f:
        json.dump(rep, f, indent=1)
    ctx.keep.append(os.path.join(d, "diagnose.json"))
    figs["stragglers"] = [(s.get("rank"), s.get("group")) for s in rep.get("stragglers", [])]
    figs["layer"] = rep.get("layer")
    figs["gpu_diff"] = rep.get("gpu_diff")
    figs["collective_groups"] = len(rep.get("collective_groups", []))
    figs["notes"] = rep.get("notes", [])[:8]
    if ctx.dry_run:
        return "skip", figs, "no GPU: diagnose ran on the CPU job (layer %s, %d collective groups)" % (
            figs["layer"], figs["collective_groups"])
    problems = []
    if not figs["collective_groups"]:
        problems.append("no collective records from the agent")
    gd = rep.get("gpu_diff") or []
    if not gd:
        problems.append("no gpu_diff")
    if problems:
        return "fail", figs, "; ".join(problems)
    return "pass", figs, "stragglers %s, layer %s, gpu_diff %s" % (
        figs["stragglers"], figs["layer"],
        ["rank %s %s ×%.1f" % (g.get("rank"), g.get("pattern"), g.get("overall_ratio", 0)) for g in gd])


# ---------------------------------------------------------------- main

# Each check bounds its own commands' time (sh/torchrun timeouts).
CHECKS = [("env", check_env), ("nvml", check_nvml), ("localize", check_localize),
          ("overhead", check_overhead), ("nccl", check_nccl), ("diagnose", check_diagnose)]


def write_summary(out, summary):
    with open(os.path.join(out, "gpu-check.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    lines = ["whyslow gpu-check: %s%s, %.0f s" % (summary["device"], " (dry run)" if summary["dry_run"] else "",
                                                  summary["seconds"])]
    for c in summary["checks"]:
        lines.append("%-9s %-4s %5.1f s  %s" % (c["name"], c["status"], c["seconds"], c["detail"][:400]))
    with open(os.path.join(out, "gpu-check.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return lines


def pack(out, work, files, limit=15 << 20):
    path = os.path.join(out, "artifacts.tar.gz")
    files = [f for f in dict.fromkeys(files) if os.path.isfile(f)]
    for cap in (64 << 20, 16 << 20, 4 << 20, 1 << 20, 256 << 10):
        with tarfile.open(path, "w:gz") as t:
            for f in files:
                if os.path.getsize(f) <= cap:
                    t.add(f, arcname=os.path.relpath(f, work))
        if os.path.getsize(path) <= limit:
            return
    os.remove(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "gpu-check-out"))
    ap.add_argument("--dry-run", action="store_true", help="run the plumbing on the CPU even with a GPU")
    ap.add_argument("--only", default="", help="comma-separated checks to run (default: all)")
    ap.add_argument("--python", default=sys.executable)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="whyslow-gpu-check-")
    env = dict(os.environ)
    whyslow = next((p for p in (os.path.join(RUN_DIR, "whyslow"), os.environ.get("WHYSLOW_BIN", ""),
                                os.path.join(ROOT, "target", "release", "whyslow"))
                    if p and os.access(p, os.X_OK)), None)
    plugin = next((p for p in (os.path.join(RUN_DIR, "libwhyslow_nccl.so"),
                               os.path.join(ROOT, "target", "release", "libwhyslow_nccl.so"))
                   if os.path.exists(p)), None)
    env["WHYSLOW_BIN"] = whyslow or ""
    rc, probe = sh([a.python, "-c", "import torch; print('CUDA', torch.cuda.is_available())"], timeout=90, env=env)
    has_gpu = "CUDA True" in probe
    dry = a.dry_run or not has_gpu
    rc, smi = sh(["nvidia-smi", "-L"], timeout=20)
    device = smi.strip().splitlines()[0] if rc == 0 and smi.strip() else "no NVIDIA GPU (nvidia-smi: %s)" % (
        smi.strip()[:120] or "absent")
    if not has_gpu:
        device += "; torch sees no CUDA device"
    ctx = Ctx(a.out, work, dry, a.python, whyslow, plugin, env)
    summary = {"device": device, "dry_run": dry, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "whyslow_bin": whyslow, "nccl_plugin": plugin, "seconds": 0.0, "checks": []}
    t_all = time.monotonic()
    only = [s for s in a.only.split(",") if s]
    print(("DRY RUN: " if dry else "") + device, flush=True)
    # Stopped from outside (timeout's SIGTERM): what was measured still
    # gets packed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        for name, fn in CHECKS:
            if only and name not in only:
                continue
            t0 = time.monotonic()
            try:
                status, figs, detail = fn(ctx)
            except Exception:  # one check's failure never stops the others
                import traceback
                status, figs, detail = "fail", {}, "check crashed: " + traceback.format_exc()[-1500:]
            c = {"name": name, "status": status, "figures": figs, "detail": detail,
                 "seconds": round(time.monotonic() - t0, 1)}
            summary["checks"].append(c)
            summary["seconds"] = round(time.monotonic() - t_all, 1)
            lines = write_summary(a.out, summary)
            print(lines[-1], flush=True)
    finally:
        pack(a.out, work, ctx.keep)
        shutil.rmtree(work, ignore_errors=True)
    failed = [c["name"] for c in summary["checks"] if c["status"] == "fail"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
