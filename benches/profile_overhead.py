#!/usr/bin/env python3
"""Overhead of `whyslow profile` on a CPU-bound PyTorch training loop
(issue 12; SysOM-AI Table 2), and its own CPU cost per sample.

A worker process trains a small MLP on one thread and prints, every 0.5 s,
how many iterations it finished. The profiler is attached for `--on` seconds,
then detached for as long, `--pairs` times in ABAB order (drift on this noisy
machine cancels). Reported: the mean relative slowdown of the on-windows
against the neighbouring off-windows with a 95 % interval, and the
profiler's CPU time per sample (user + sys of the `whyslow profile` process,
from wait4's rusage).

Run as root (perf events):
  cargo build --release -p whyslow
  .venv/bin/python benches/profile_overhead.py --whyslow target/release/whyslow --hz 99
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import sys, time, torch
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
n, t0 = 0, time.monotonic()
while True:
    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()
    n += 1
    t = time.monotonic()
    if t - t0 >= 0.5:
        print(t, n, flush=True); n, t0 = 0, t
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--whyslow", default="target/release/whyslow")
    ap.add_argument("--hz", type=int, default=99)
    ap.add_argument("--on", type=float, default=4.0)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--cpu", type=int, default=0, help="core for the worker (the profiler runs elsewhere)")
    a = ap.parse_args()

    w = subprocess.Popen(["taskset", "-c", str(a.cpu), sys.executable, "-c", WORKER],
                         stdout=subprocess.PIPE, text=True)
    rates = []  # (monotonic time, iterations per second)

    def read_for(seconds):
        end = time.monotonic() + seconds
        got = []
        while time.monotonic() < end:
            line = w.stdout.readline()
            t, n = line.split()
            got.append(int(n) / 0.5)
        return got

    read_for(3.0)  # warm-up
    diffs, on_all, off_all, cpu_per_sample = [], [], [], []
    out = tempfile.mkdtemp(prefix="whyslow-ovh-")
    for i in range(a.pairs):
        off = read_for(a.on)
        cmd = [a.whyslow, "profile", "--pid", str(w.pid), "--hz", str(a.hz),
               "--duration", str(a.on), "-o", os.path.join(out, "p%d.folded" % i)]
        p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        on = read_for(a.on)
        _, status, ru = os.wait4(p.pid, 0)
        err = p.stderr.read()
        samples = [int(x.split()[1]) for x in err.splitlines() if " samples of " in x]
        if samples and samples[0] > 0:
            cpu_per_sample.append((ru.ru_utime + ru.ru_stime) / samples[0])
        # drop the first reading of each window (straddles the switch)
        on_m, off_m = statistics.mean(on[1:]), statistics.mean(off[1:])
        on_all.append(on_m)
        off_all.append(off_m)
        diffs.append((off_m - on_m) / off_m)
    w.kill()
    m = statistics.mean(diffs)
    ci = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5
    print("worker iterations/s: off %.1f, on %.1f (means of %d windows of %.0f s)"
          % (statistics.mean(off_all), statistics.mean(on_all), len(diffs), a.on))
    print("slowdown with the profiler at %d Hz: %+.2f %% ± %.2f %% (95 %% CI), per-pair sd %.2f %%"
          % (a.hz, 100 * m, 100 * ci, 100 * statistics.stdev(diffs)))
    if cpu_per_sample:
        c = statistics.median(cpu_per_sample)
        print("profiler CPU per sample: %.0f µs (median of %d runs) → %.2f %% of one core at %d Hz per busy thread"
              % (1e6 * c, len(cpu_per_sample), 100 * c * a.hz, a.hz))


if __name__ == "__main__":
    main()
