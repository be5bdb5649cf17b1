#!/usr/bin/env python3
"""Cost of tracing gloo's collectives with eBPF uprobes (issue 13: overhead
of collective tracing per collective).

Gloo ranks (`--ranks`, one process each, one thread) all-reduce a small tensor in a
loop and print every 0.5 s how many all-reduces they finished. `whyslow
collectives --pid A --pid B` is attached for `--on` seconds, then not for as
long, `--pairs` times in ABAB order (drift on a noisy machine cancels).
Reported: the time per all-reduce traced and untraced, their difference
(the probes' cost per collective: an entry and a return uprobe on each rank,
the kernel's breakpoint round trip and our BPF program), and how many records
the tracer wrote.

Run as root (uprobes need it):
  cargo build --release -p whyslow
  .venv/bin/python benches/collective_overhead.py --whyslow target/release/whyslow
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = r"""
import os, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]),
                        world_size=int(sys.argv[4]))
x = torch.ones(int(sys.argv[3]))
n, t0 = 0, time.monotonic()
while True:
    dist.all_reduce(x)
    n += 1
    t = time.monotonic()
    if t - t0 >= 0.5:
        print(f"{t:.6f} {n}", flush=True)
        t0 = t
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--whyslow", default="target/release/whyslow")
    ap.add_argument("--on", type=float, default=4.0, help="seconds per phase")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--elements", type=int, default=1024, help="floats per all-reduce")
    ap.add_argument("--ranks", type=int, default=2,
                    help="gloo ranks (1: no network, the probes' cost stands out)")
    args = ap.parse_args()
    url = "tcp://127.0.0.1:%d" % free_port()
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, url, str(r), str(args.elements),
                                 str(args.ranks)],
                                stdout=subprocess.PIPE, text=True, bufsize=1)
               for r in range(args.ranks)]
    log = []  # (time, count) of rank 0
    try:
        first = workers[0].stdout.readline()  # warmed up: gloo connected
        if not first:
            sys.exit("worker did not start")

        def count_at():
            line = workers[0].stdout.readline().split()
            return float(line[0]), int(line[1])

        phases = []
        out = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
        records = 0
        for _ in range(args.pairs):
            for traced in (True, False):
                tracer = None
                if traced:
                    tracer = subprocess.Popen(
                        [args.whyslow, "collectives", "--duration", str(args.on + 2), "-o", out]
                        + [a for w in workers for a in ("--pid", str(w.pid))],
                        stderr=subprocess.PIPE, text=True)
                    # Attached when it says so (a line per process).
                    for _ in workers:
                        tracer.stderr.readline()
                t0, n0 = count_at()
                deadline = t0 + args.on
                t1, n1 = t0, n0
                while t1 < deadline:
                    t1, n1 = count_at()
                phases.append((traced, (t1 - t0) / max(n1 - n0, 1) * 1e6))
                if tracer:
                    tracer.send_signal(signal.SIGINT)
                    tracer.wait()
                    with open(out) as f:
                        records += sum(1 for _ in f)
        on = [us for t, us in phases if t]
        off = [us for t, us in phases if not t]
        diffs = [a - b for a, b in zip(on, off)]
        print(f"all-reduce of {args.elements} floats, {args.ranks} gloo rank(s), {args.pairs} ABAB pairs of {args.on:.0f} s")
        print(f"untraced: {statistics.median(off):.1f} us per all-reduce (median of phases; {min(off):.1f}-{max(off):.1f})")
        print(f"traced:   {statistics.median(on):.1f} us per all-reduce (median of phases; {min(on):.1f}-{max(on):.1f})")
        print(f"cost of tracing: {statistics.median(diffs):+.1f} us per all-reduce (median of pair differences; "
              f"{min(diffs):+.1f} to {max(diffs):+.1f}); {records} records written")
        os.unlink(out)
    finally:
        for w in workers:
            w.kill()
            w.wait()


if __name__ == "__main__":
    main()
