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

With `--engine ebpf` the in-kernel sampler runs instead, at each of
`--rates` (percent of ticks that take a stack, SysOM-AI Table 2's sampling
rate); its program's own run time comes from the kernel's BPF statistics
(`--bpf-stats`) and is charged to the interrupted worker, so it is part of
the measured slowdown; the userspace cost (draining and symbolizing) is the
`whyslow` process's rusage.

Run as root (perf events, BPF):
  cargo build --release -p whyslow
  .venv/bin/python benches/profile_overhead.py --whyslow target/release/whyslow --hz 99
  .venv/bin/python benches/profile_overhead.py --engine ebpf --rates 1,10,20,40,80,100 --pairs 6 [--unwind hybrid|dwarf|fp]
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
    ap.add_argument("--engine", choices=["perf", "ebpf"], default="perf")
    ap.add_argument("--rates", default="100", help="eBPF: sampling rates in percent, comma-separated")
    ap.add_argument("--unwind", default="hybrid", choices=["hybrid", "dwarf", "fp"],
                    help="eBPF: how user stacks are walked in the kernel")
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
    rates_pct = [float(r) for r in a.rates.split(",")] if a.engine == "ebpf" else [None]
    for rate in rates_pct:
        measure(a, w, read_for, rate)
    w.kill()


def measure(a, w, read_for, rate):
    diffs, on_all, off_all, cpu_per_sample, bpf_us = [], [], [], [], []
    out = tempfile.mkdtemp(prefix="whyslow-ovh-")
    for i in range(a.pairs):
        off = read_for(a.on)
        cmd = [a.whyslow, "profile", "--pid", str(w.pid), "--hz", str(a.hz),
               "--duration", str(a.on), "-o", os.path.join(out, "p%d.folded" % i)]
        if rate is not None:
            cmd += ["--engine", "ebpf", "--sampling-rate", str(rate), "--bpf-stats", "--unwind", a.unwind]
        p = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        on = read_for(a.on)
        _, status, ru = os.wait4(p.pid, 0)
        err = p.stderr.read()
        samples = [int(x.split()[1]) for x in err.splitlines() if " samples of " in x]
        samples += [int(x.split()[2]) for x in err.splitlines() if x.startswith("whyslow: eBPF: ")]
        for x in err.splitlines():
            if x.startswith("whyslow: eBPF program: "):
                f = x.split()
                runs, kernel_ms = int(f[3]), float(f[5])
                bpf_us.append((1e3 * kernel_ms / max(runs, 1), kernel_ms / (1e3 * a.on)))
        if samples and samples[0] > 0:
            cpu_per_sample.append((ru.ru_utime + ru.ru_stime) / samples[0])
        # drop the first reading of each window (straddles the switch)
        on_m, off_m = statistics.mean(on[1:]), statistics.mean(off[1:])
        on_all.append(on_m)
        off_all.append(off_m)
        diffs.append((off_m - on_m) / off_m)
    m = statistics.mean(diffs)
    ci = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5
    print("worker iterations/s: off %.1f, on %.1f (means of %d windows of %.0f s)"
          % (statistics.mean(off_all), statistics.mean(on_all), len(diffs), a.on))
    what = "%d Hz" % a.hz if rate is None else "%d Hz, eBPF (%s), %g %% of ticks" % (a.hz, a.unwind, rate)
    print("slowdown with the profiler at %s: %+.2f %% ± %.2f %% (95 %% CI), per-pair sd %.2f %%"
          % (what, 100 * m, 100 * ci, 100 * statistics.stdev(diffs)))
    if bpf_us:
        per_run = statistics.median(u for u, _ in bpf_us)
        share = statistics.median(c for _, c in bpf_us)
        print("eBPF program: %.2f µs per run (every tick of every CPU, filtered and skipped ones included), "
              "%.3f %% of one core in all (median of %d windows)" % (per_run, 100 * share, len(bpf_us)))
    if cpu_per_sample:
        c = statistics.median(cpu_per_sample)
        frac = 1.0 if rate is None else rate / 100
        print("profiler process CPU per sample: %.0f µs (median of %d runs, start included) → %.2f %% of one core at %d Hz × %g %% per busy thread"
              % (1e6 * c, len(cpu_per_sample), 100 * c * a.hz * frac, a.hz, 100 * frac))


if __name__ == "__main__":
    main()
