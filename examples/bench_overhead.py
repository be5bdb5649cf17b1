"""Overhead of whyslow outside profiling windows, single process (no torchrun).

    python examples/bench_overhead.py --iters 3000 --rounds 5
    python examples/bench_overhead.py --interleave --blocks 200 --block-iters 40
    python examples/bench_overhead.py --interleave --device cuda --hidden 4096

Rounds (default): alternates fresh processes without whyslow and with whyslow
active (hooks, detector, polling; automatic windows off with max_per_hour=0)
and prints the median iteration time of each round and the hook cost per event.
On a shared machine, round-to-round drift is far larger than 0.5 %.

``--interleave``: one process, whyslow active, its two hooks (DataLoader
``__next__`` and the optimizer post-step hook, the only whyslow code on the
training thread outside windows) switched on and off every ``--block-iters``
iterations in ABBA order, so that slow drifts of the machine cancel out. Each
adjacent (on, off) pair gives one relative difference of mean iteration time;
the result is their mean with a 95 % confidence interval. ``--control`` runs
the same with whyslow disabled in the "on" blocks (hooks installed, doing
nothing): the noise floor. On the shared 2-core VM the pairs scatter by
12-14 %, so 200 pairs resolve about +-2 % (BENCHMARKS.md).
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


INTERLEAVE = r"""
import sys, time, json, math
blocks = int(sys.argv[1]); per = int(sys.argv[2]); control = sys.argv[3] == "1"
dev = sys.argv[4]; hidden = int(sys.argv[5])
import whyslow
tr = whyslow.init(max_per_hour=0, signal=False)
if control:
    tr.enabled = False  # hooks installed, whyslow does nothing: measures the noise floor
import torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import dataloader as _dl
from torch.optim import optimizer as _optim
torch.set_num_threads(1)
torch.manual_seed(0)
hooks = tr.hooks
hooked_next = _dl._BaseDataLoaderIter.__next__
post_hook = _optim._global_optimizer_post_hooks[hooks._opt_handle.id]

def set_hooks(on):
    if on and hooks._opt_handle is None:
        _dl._BaseDataLoaderIter.__next__ = hooked_next
        hooks._dl_orig = hooked_next.__whyslow_orig__
        hooks._opt_handle = _optim.register_optimizer_step_post_hook(post_hook)
        tr.det.resume(time.perf_counter_ns())  # the off block is not an iteration
    elif not on and hooks._opt_handle is not None:
        hooks.uninstall()
        tr.det.pause()

model = nn.Sequential(nn.Linear(256, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                      nn.Linear(hidden, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ds = TensorDataset(torch.randn(32 * 64, 256), torch.randint(0, 10, (32 * 64,)))
loader = DataLoader(ds, batch_size=32, shuffle=True, drop_last=True)
sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)

def batches():
    while True:
        for b in loader:
            yield b

src = batches()
def run_block(n):
    t0 = time.perf_counter()
    for _ in range(n):
        x, y = next(src)
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    sync()  # a block ends when its GPU work does
    return (time.perf_counter() - t0) / n

set_hooks(False); run_block(300)  # warm-up
diffs = []; on_ms = []; off_ms = []
for b in range(blocks):
    order = (True, False) if b % 2 == 0 else (False, True)  # ABBA
    m = {}
    for on in order:
        set_hooks(on); m[on] = run_block(per)
    on_ms.append(m[True]); off_ms.append(m[False])
    diffs.append(m[True] / m[False] - 1.0)
set_hooks(True)
n = len(diffs); mean = sum(diffs) / n
sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
diffs.sort()
print("RESULT " + json.dumps({
    "pairs": n, "iters_per_block": per, "device": dev, "hidden": hidden, "mean_diff": mean, "ci95": 1.96 * sd / math.sqrt(n),
    "median_diff": diffs[n // 2], "pair_sd": sd,
    "on_ms": 1e3 * sum(on_ms) / n, "off_ms": 1e3 * sum(off_ms) / n,
    "steps_seen": tr.steps, "phase": tr.det.phase, "sessions": tr.stats["sessions"]}))
"""


def interleave(blocks, per, control=False, device="cpu", hidden=512):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("RANK", None)
    p = subprocess.run([sys.executable, "-c", INTERLEAVE, str(blocks), str(per), "1" if control else "0",
                        device, str(hidden)], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    for line in p.stdout.decode().splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            print(("control (whyslow disabled, hooks installed): " if control else "")
                  + "interleaved: %d (on, off) pairs of %d iterations; mean iteration on %.4f ms, off %.4f ms"
                  % (r["pairs"], r["iters_per_block"], r["on_ms"], r["off_ms"]))
            print("overhead %+.3f%% +- %.3f%% (95%% CI), median pair %+.3f%%, pair-to-pair sd %.2f%%; "
                  "detector saw %d steps, phase %s, sessions %d"
                  % (100 * r["mean_diff"], 100 * r["ci95"], 100 * r["median_diff"], 100 * r["pair_sd"],
                     r["steps_seen"], r["phase"], r["sessions"]))
            return r
    raise RuntimeError(p.stdout.decode()[-2000:])


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
    ap.add_argument("--interleave", action="store_true",
                    help="one process, hooks switched on/off in ABBA blocks")
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--block-iters", type=int, default=40)
    ap.add_argument("--device", default="cpu", help="--interleave: where the model runs (cpu, cuda)")
    ap.add_argument("--hidden", type=int, default=512, help="--interleave: hidden width")
    ap.add_argument("--json", default="", help="--interleave: also write the result here")
    ap.add_argument("--control", action="store_true",
                    help="with --interleave: whyslow disabled in the 'on' blocks (noise floor)")
    a = ap.parse_args()
    if a.interleave:
        r = interleave(a.blocks, a.block_iters, a.control, a.device, a.hidden)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(r, f)
        return
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
