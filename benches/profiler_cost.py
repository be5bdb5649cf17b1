#!/usr/bin/env python3
"""What a profiler costs the program it watches (issue 48, item 3), for
`whyslow profile` (perf and eBPF engines), py-spy and `perf record -g`, in
one run, on a quiet machine and with every core busy.

The target trains a small MLP on one thread and prints its iterations every
0.5 s. Each profiler is attached for --on seconds at 99 Hz, then nothing for
as long, --pairs times (ABAB: drift cancels). Reported per profiler:
  - slowdown: the target's iterations/s in the on-windows against the
    neighbouring off-windows (mean of the pairs, 95 % interval);
  - CPU: the profiler process's user + system CPU seconds per profiled
    second (wait4's rusage; start-up, symbolization and output included;
    for the eBPF engine the in-kernel program runs on the target's ticks and
    shows in the slowdown, not here).
--busy N starts N busy loops (default: one per core) so that no core is
free: a profiler's own CPU then comes out of the target's share.

Run as root:
    python3 benches/profiler_cost.py --whyslow target/release/whyslow \\
        --py-spy .venv-peers/bin/py-spy [--busy 0] [--pairs 5] [--on 6]
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import time, torch
torch.set_num_threads(1)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad(); torch.nn.functional.cross_entropy(m(x), y).backward(); opt.step()
n, t0 = 0, time.monotonic()
while True:
    step()
    n += 1
    t = time.monotonic()
    if t - t0 >= 0.5:
        print(t, n / (t - t0), flush=True); n, t0 = 0, t
"""


def profilers(a, pid, out):
    d = str(int(a.on))  # py-spy takes whole seconds
    w = [a.whyslow, "profile", "--pid", str(pid), "--hz", "99", "--duration", d]
    yield "whyslow profile (perf engine)", w + ["-o", out + "/w-perf.folded"]
    yield "whyslow profile (eBPF engine)", w + ["--engine", "ebpf", "-o", out + "/w-ebpf.folded"]
    if a.py_spy:
        yield "py-spy record", [a.py_spy, "record", "--pid", str(pid), "--rate", "99", "--duration", d,
                                "--format", "raw", "-o", out + "/pyspy.txt"]
    if shutil.which("perf"):
        yield "perf record -g", ["perf", "record", "-q", "-g", "-F", "99", "-p", str(pid),
                                 "-o", out + "/perf.data", "--", "sleep", d]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--whyslow", default="target/release/whyslow")
    ap.add_argument("--py-spy", default=shutil.which("py-spy") or "")
    ap.add_argument("--python", default=sys.executable, help="a Python with torch for the target")
    ap.add_argument("--on", type=int, default=6)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--busy", type=int, default=os.cpu_count(), help="busy loops beside the target")
    a = ap.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    w = subprocess.Popen([a.python, "-c", WORKER], stdout=subprocess.PIPE, text=True)

    def read_for(seconds):
        end, got = time.monotonic() + seconds, []
        while time.monotonic() < end:
            got.append(float(w.stdout.readline().split()[1]))
        return got[1:] or got  # the first straddles the switch

    try:
        read_for(4.0)  # warm-up
        out = tempfile.mkdtemp(prefix="whyslow-cost-")
        print("target: %s; %d busy loop(s) on %d core(s); %d pairs of %.0f s at 99 Hz; %s"
              % ("1-thread MLP training", a.busy, os.cpu_count(), a.pairs, a.on, time.strftime("%Y-%m-%d %H:%M")))
        print("| profiler | target slowdown (95 % CI) | profiler CPU s per profiled s |")
        print("|---|---|---|")
        for name, cmd in profilers(a, w.pid, out):
            diffs, cpu = [], []
            for _ in range(a.pairs):
                off = statistics.mean(read_for(a.on))
                err = open(os.path.join(out, "stderr.txt"), "w+")
                p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
                on = statistics.mean(read_for(a.on))
                _, status, ru = os.wait4(p.pid, 0)
                if status != 0:
                    err.seek(0)
                    why = [l.strip() for l in err.read().splitlines() if l.strip()][:1]
                    print("| %s | failed (status %d: %s) | |" % (name, status, " ".join(why)[:150]), flush=True)
                    break
                cpu.append((ru.ru_utime + ru.ru_stime) / a.on)
                diffs.append((off - on) / off)
            if len(diffs) == a.pairs:
                m = statistics.mean(diffs)
                ci = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
                print("| %s | %+.1f %% ± %.1f %% | %.3f |" % (name, 100 * m, 100 * ci, statistics.median(cpu)),
                      flush=True)
    finally:
        w.kill()
        for b in busy:
            b.kill()


if __name__ == "__main__":
    main()
