#!/usr/bin/env python3
"""Cost of PyTorch's Flight Recorder, which `import whyslow` turns on
(TORCH_FR_BUFFER_SIZE=2000 unless the user set it; issue 27).

The recorder is read once, when a process group is made, so it cannot be
toggled inside one job: 2-rank gloo jobs (one thread each) all-reduce a
small tensor `--iters` times (the worst case: the recorder's fixed cost per
collective, including capturing the Python frames, against the cheapest
collective), alternately without and with the recorder, `--pairs` times
(ABAB: drift on a noisy machine cancels). Reported per collective: wall
time and the ranks' CPU time (user + system, from the kernel's counters),
off and on, and their differences.

  .venv/bin/python benches/flight_recorder_cost.py
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

WORKER = r"""
import json, os, sys, time, resource, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=2)
x = torch.ones(int(sys.argv[3]))
n = int(sys.argv[4])
for _ in range(200):
    dist.all_reduce(x)
dist.barrier()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(n):
    dist.all_reduce(x)
t1, r1 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(json.dumps({"wall_s": t1 - t0, "cpu_s": cpu}), flush=True)
dist.destroy_process_group()
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def job(fr_entries, elems, iters):
    env = dict(os.environ)
    env["TORCH_FR_BUFFER_SIZE"] = str(fr_entries)
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(WORKER)
    url = "tcp://127.0.0.1:%d" % free_port()
    procs = [subprocess.Popen([sys.executable, f.name, url, str(r), str(elems), str(iters)],
                              stdout=subprocess.PIPE, env=env, text=True) for r in range(2)]
    outs = [json.loads(p.communicate(timeout=600)[0].strip().splitlines()[-1]) for p in procs]
    os.unlink(f.name)
    return (max(o["wall_s"] for o in outs) / iters, sum(o["cpu_s"] for o in outs) / 2 / iters)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--iters", type=int, default=5000)
    ap.add_argument("--elems", type=int, default=256)
    ap.add_argument("--entries", type=int, default=2000)
    a = ap.parse_args()
    import torch

    off, on = [], []
    for i in range(a.pairs):
        off.append(job(0, a.elems, a.iters))
        on.append(job(a.entries, a.elems, a.iters))
        print("pair %d: off %.1f us wall %.1f us cpu; on %.1f us wall %.1f us cpu" % (
            i, off[-1][0] * 1e6, off[-1][1] * 1e6, on[-1][0] * 1e6, on[-1][1] * 1e6), flush=True)
    med = lambda xs, k: statistics.median(x[k] for x in xs) * 1e6
    dw = [b[0] - a_[0] for a_, b in zip(off, on)]
    dc = [b[1] - a_[1] for a_, b in zip(off, on)]
    print("torch %s, %d x %d all-reduces of %d floats, 2 gloo ranks" % (
        torch.__version__, a.pairs, a.iters, a.elems))
    print("per collective, median: off %.1f us wall / %.1f us CPU; on %.1f us wall / %.1f us CPU" % (
        med(off, 0), med(off, 1), med(on, 0), med(on, 1)))
    print("recorder's cost per collective: %.1f us wall (pairs %s), %.1f us CPU per rank (pairs %s)" % (
        statistics.median(dw) * 1e6, " ".join("%.1f" % (x * 1e6) for x in dw),
        statistics.median(dc) * 1e6, " ".join("%.1f" % (x * 1e6) for x in dc)))


if __name__ == "__main__":
    main()
