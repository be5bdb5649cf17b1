#!/usr/bin/env python3
"""Time from fault to verdict (issue 13): how soon after a rank starts
slowing its group does `whyslow diagnose` over the agent's spool name it,
and the layer with its code path?

A 3-rank gloo job (examples/train.py, 30 ms of simulated accelerator time
per iteration) runs beside `whyslow agent --trace-collectives` with
`--period` s profiles. From iteration `--fault-at`, rank 2 does `--fault-ms`
ms of extra Python work per iteration (the slow-rank fault; its onset time
is printed by the rank). Then the spool is replayed: `whyslow diagnose
--until T` judges only what the agent had written by T, for T every
`--step` s from the fault on. Reported: the first T from which the late
rank is named (and stays named), and the first from which the layer is
`cpu` with the injected function first in the CPU diff.

Run as root (uprobes, perf events):
  cargo build --release -p whyslow
  .venv/bin/python benches/fault_to_verdict.py --whyslow target/release/whyslow
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def diagnose(exe, spool, until=None):
    cmd = [exe, "diagnose", spool, "--format", "json"]
    if until is not None:
        cmd += ["--until", "%.3f" % until]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--whyslow", default="target/release/whyslow")
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--fault-at", type=int, default=150)
    ap.add_argument("--fault-ms", type=float, default=25.0)
    ap.add_argument("--period", type=float, default=2.0, help="the agent's profile period, s")
    ap.add_argument("--step", type=float, default=0.5)
    args = ap.parse_args()
    exe = os.path.abspath(args.whyslow)
    tmp = tempfile.mkdtemp(prefix="whyslow-f2v-")
    reg, spool = os.path.join(tmp, "agent"), os.path.join(tmp, "spool")
    os.makedirs(reg)
    alog = open(os.path.join(tmp, "agent.log"), "w")
    agent = subprocess.Popen([exe, "agent", "--samples-dir", reg, "--profile-spool", spool,
                              "--profile-period", "%g" % args.period, "--trace-collectives",
                              "--log-format", "json"], stdout=alog, stderr=subprocess.STDOUT)
    env = dict(os.environ, WHYSLOW_AGENT_DIR=reg, WHYSLOW_THRESHOLD="100",
               OMP_NUM_THREADS="1")
    try:
        run = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
             os.path.join(ROOT, "examples", "train.py"), "--iters", str(args.iters),
             "--fault", "slow-rank", "--fault-rank", "2", "--fault-at", str(args.fault_at),
             "--fault-ms", "%g" % args.fault_ms, "--sim-compute-ms", "30", "--log-every", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=600)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
        alog.close()
    text = run.stdout.decode(errors="replace")
    m = re.search(r"fault slow-rank onset at iteration \d+, time ([0-9.]+) \(rank 2\)", text)
    if run.returncode != 0 or not m:
        sys.exit("the job failed or printed no fault onset:\n" + text[-3000:])
    fault_unix = float(m.group(1))
    full = diagnose(exe, spool)
    if full is None:
        sys.exit("diagnose failed on " + spool)
    origin = full["origin_unix_ns"] / 1e9
    fault = fault_unix - origin
    end = max(full["window"][1], fault)
    named = layered = None
    t = fault
    history = []
    while t <= end + args.step:
        rep = diagnose(exe, spool, until=t)
        late = rep is not None and [s["rank"] for s in rep["stragglers"]] == ["2"]
        layer_ok = late and rep["layer"] == "cpu" and rep["cpu_diff"] and \
            "injected_slow_rank_work" in rep["cpu_diff"][0]["function"]
        history.append((round(t - fault, 2), late, bool(layer_ok)))
        named = (named if late else None) or (t if late else None)
        layered = (layered if layer_ok else None) or (t if layer_ok else None)
        t += args.step
    print("job: 3 ranks, fault at %.2f s after the agent's first data; spool %s" % (fault, spool))
    print("seconds after the fault / rank 2 named / layer cpu with the injected function first:")
    for h in history:
        print("  %6.2f  %-5s  %s" % h)
    print("RESULT: rank named %s s after the fault; layer and path %s s after (agent period %g s)" % (
        "never" if named is None else "%.1f" % (named - fault),
        "never" if layered is None else "%.1f" % (layered - fault), args.period))


if __name__ == "__main__":
    main()
