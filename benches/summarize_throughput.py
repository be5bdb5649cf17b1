#!/usr/bin/env python3
"""Whole-process trace summarization throughput (issue 48): events per
CPU-second of `whyslow summarize TRACE -o OUT` (decompression, parse,
critical path, fingerprint, output: user + system CPU of the process, as a
user pays it), per real trace, and HolisticTraceAnalysis's load of the same
file in the same run.

Each shipped trace (tests/fixtures/kineto/single: most from other projects,
see tests/fixtures/README.md) is expanded to about --events events by
repeating its traceEvents, each copy shifted past the previous one (its
ProfilerStep numbers too), so that process start-up does not hide the
per-event cost; written gzipped (level 1) and plain.

    benches/summarize_throughput.py [--events 900000] [--hta PYTHON] [--runs 3] [TRACE…]

--hta names a Python with holistictraceanalysis (e.g. .venv-peers/bin/python)."""
import argparse
import glob
import gzip
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def expand(src, n_events, out_dir):
    with gzip.open(src, "rt") as f:
        trace = json.load(f)
    evs = trace.get("traceEvents", [])
    timed = [e for e in evs if isinstance(e.get("ts"), (int, float))]
    if not timed:
        return None
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in timed)
    span = (t1 - t0) * 1.01 + 1
    copies = max(1, round(n_events / max(1, len(evs))))
    steps = [int(m.group(1)) for e in evs for m in [re.match(r"ProfilerStep#(\d+)", str(e.get("name", "")))] if m]
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    # Each copy gets its own ids, as a longer real trace has: Python ids and
    # their parents' (stacks are rebuilt from them), the CPU-GPU correlation
    # and external ids, and flow events' ids. Copies sharing ids would send
    # every child's parent lookup to the last copy: a cost no real trace has.
    def ids_max(key, in_args=True):
        vals = [(e.get("args") or {}).get(key) if in_args else e.get(key) for e in evs]
        return max([v for v in vals if isinstance(v, int)] + [0]) + 1
    shift_args = {k: ids_max(k) for k in ("Python id", "Python parent id", "External id", "correlation",
                                         "Record function id", "Ev Idx")}
    py_span = max(shift_args["Python id"], shift_args["Python parent id"])
    shift_args["Python id"] = shift_args["Python parent id"] = py_span
    ev_id_span = ids_max("id", in_args=False)
    out = []
    for k in range(copies):
        for e in evs:
            if k == 0 or "ts" not in e or not isinstance(e.get("ts"), (int, float)):
                if k == 0:
                    out.append(e)
                continue
            c = dict(e)
            c["ts"] = e["ts"] + k * span
            if isinstance(c.get("id"), int):
                c["id"] = c["id"] + k * ev_id_span
            a = c.get("args")
            if isinstance(a, dict) and any(key in a for key in shift_args):
                a = dict(a)
                for key, width in shift_args.items():
                    if isinstance(a.get(key), int):
                        a[key] = a[key] + k * width
                c["args"] = a
            name = str(c.get("name", ""))
            if step_span and name.startswith("ProfilerStep#"):
                c["name"] = "ProfilerStep#%d" % (int(name.split("#")[1]) + k * step_span)
            out.append(c)
    trace["traceEvents"] = out
    base = os.path.join(out_dir, os.path.basename(src).split(".")[0])
    with open(base + ".json", "w") as f:
        json.dump(trace, f)
    with gzip.open(base + ".json.gz", "wt", compresslevel=1) as f:
        json.dump(trace, f)
    return base, len(out), copies


def timed(cmd, cwd=None):
    """(wall s, user+sys CPU s) of one run of cmd; raises with the last
    line of its stderr when it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError((p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1][:120])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*")
    ap.add_argument("--events", type=int, default=900_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--hta", default="", help="a Python with holistictraceanalysis")
    ap.add_argument("--whyslow", default=os.environ.get("WHYSLOW_BIN", os.path.join(ROOT, "target/release/whyslow")))
    a = ap.parse_args()
    traces = a.traces or sorted(glob.glob(os.path.join(ROOT, "tests/fixtures/kineto/single/*.json.gz")))
    print("| trace | events (copies) | form | whyslow wall s | whyslow CPU s | M events / CPU-s | HTA load s | HTA / whyslow wall |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for src in traces:
            made = expand(src, a.events, tmp)
            if made is None:
                continue
            base, n, copies = made
            for form in (".json.gz", ".json"):
                path = base + form
                runs = [timed([a.whyslow, "summarize", path, "-o", os.path.join(tmp, "fp.json")])
                        for _ in range(a.runs)]
                wall = min(r[0] for r in runs)
                cpu = min(r[1] for r in runs)
                hta = ""
                ratio = ""
                if a.hta and form == ".json.gz":
                    d = os.path.join(tmp, "hta")
                    os.makedirs(d, exist_ok=True)
                    link = os.path.join(d, "rank-0.json.gz")
                    if os.path.exists(link):
                        os.remove(link)
                    os.symlink(path, link)
                    try:
                        # (From its own directory: a stray module in the
                        # caller's working directory shadows the stdlib.)
                        h = timed([a.hta, "-c", "from hta.trace_analysis import TraceAnalysis; "
                                   "t = TraceAnalysis(trace_dir=%r); assert len(t.t.traces)" % d], cwd=d)
                        hta = "%.2f" % h[0]
                        ratio = "%.0f×" % (h[0] / wall)
                    except RuntimeError as e:
                        hta = "failed: " + str(e).replace("|", "/")
                print("| %s | %d (%d) | %s | %.3f | %.3f | %.2f | %s | %s |" % (
                    os.path.basename(src), n, copies, form[1:], wall, cpu, n / cpu / 1e6, hta, ratio),
                    flush=True)


if __name__ == "__main__":
    main()
