"""Overhead of whyslow outside profiling windows, single process (no torchrun).

    python examples/bench_overhead.py --iters 3000 --rounds 5

Alternates rounds without whyslow and with whyslow active (hooks, detector,
polling; automatic windows off with max_per_hour=0), in fresh processes, and
prints the median iteration time of each round and the hook cost per event.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CHILD = r"""
import os, sys, time, json
mode = sys.argv[1]; iters = int(sys.argv[2])
if mode == "on":
    import whyslow
    whyslow.init(max_per_hour=0, signal=False)
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ds = TensorDataset(torch.randn(32 * 64, 256), torch.randint(0, 10, (32 * 64,)))
loader = DataLoader(ds, batch_size=32, shuffle=True, drop_last=True)
times = []
it = 0
t = time.perf_counter()
while it < iters:
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
        now = time.perf_counter(); times.append(now - t); t = now
        it += 1
        if it >= iters: break
times = times[200:]  # warm-up
times.sort()
out = {"median_ms": 1e3 * times[len(times)//2], "mean_ms": 1e3 * sum(times)/len(times)}
if mode == "on":
    tr = whyslow.tracker()
    out["polls"] = tr.stats["polls"]; out["poll_us"] = tr.stats["poll_ns"] / 1e3 / max(1, tr.stats["polls"])
    out["phase"] = tr.det.phase; out["sessions"] = tr.stats["sessions"]
    # Hook cost per iteration (one next + one step), measured in isolation.
    n = 100000; t0 = time.perf_counter_ns()
    for _ in range(n):
        tr.on_next(time.perf_counter_ns()); tr.on_step()
    out["hook_ns_per_iteration"] = (time.perf_counter_ns() - t0) / n
print("RESULT " + json.dumps(out))
"""


def run(mode, iters):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    p = subprocess.run([sys.executable, "-c", CHILD, mode, str(iters)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in p.stdout.decode().splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(p.stdout.decode()[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    off, on = [], []
    for r in range(a.rounds):
        o = run("off", a.iters); w = run("on", a.iters)
        off.append(o["median_ms"]); on.append(w["median_ms"])
        print("round %d: off %.4f ms  on %.4f ms  (%+.2f%%)  hook %.0f ns/iter, poll %.1f us x %d, phase %s, sessions %d"
              % (r, o["median_ms"], w["median_ms"], 100 * (w["median_ms"] / o["median_ms"] - 1),
                 w["hook_ns_per_iteration"], w["poll_us"], w["polls"], w["phase"], w["sessions"]), flush=True)
    mo, mw = statistics.median(off), statistics.median(on)
    print("median of round medians: off %.4f ms, on %.4f ms, overhead %+.2f%%; round-to-round spread off %.2f%%, on %.2f%%"
          % (mo, mw, 100 * (mw / mo - 1), 100 * (max(off) - min(off)) / mo, 100 * (max(on) - min(on)) / mw))


if __name__ == "__main__":
    main()
