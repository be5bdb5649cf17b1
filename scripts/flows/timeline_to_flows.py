#!/usr/bin/env python3
"""Render per-rank training timelines of a real job as network flow records.

Input: the per-rank op timeline of a Megatron-style job as published in
ByteDance-Seed/StragglerAnalysis (Apache-2.0): either its Perfetto file
``data/timeline-<job>.json.gz`` (``ph: X`` events, ``pid`` = DP rank, thread
name ``"PP rank <s>, TP rank 0, <lane>"``, ``args.step``, ``args.seq_id``;
communication ops there already show only their transfer part), or the
excerpt this script writes from it (``excerpt``: CSV, optionally .gz, columns
``dp,stage,step,op,seq,ts_us,dur_us``).

Output (``flows``): whyslow's flow CSV
``start_us,src,dst,bytes,dur_us,switches,src_port,dst_port,proto``, sorted by
start, one row per flow, and optionally a topology JSON (``--topology``) and
the per-rank truth (``--truth``).

Usage::

    timeline_to_flows.py excerpt timeline-AR.json.gz -o ops.csv.gz
    timeline_to_flows.py flows ops.csv.gz --dp 4 --pp 4 -o flows.csv \\
        [--topology topology.json] [--truth truth.json] [--rebase] [--base-us N]
    whyslow flows analyze flows.csv --topology topology.json --format json

Assumptions (none of them is in the data; they only shape bytes and addresses):

- One worker per (DP rank d, stage s); tensor parallelism stays inside a
  machine (NVLink), so only TP rank 0's timing is used and TP traffic is not
  rendered. Global rank r = s * dp + d; its address is 10.<job>.<s>.<d + 1>
  (``--job-octet``, default 50), one machine per address, all machines on
  one leaf switch ``leaf0`` (no switch column in the CSV).
- DP (ZeRO / Megatron distributed optimizer): each ``grads-reduce-scatter``
  and ``params-all-gather`` op of a worker becomes a ring: worker d sends to
  (d + 1) mod dp, in dp - 1 rounds that split the op's [ts, ts + dur]
  equally; in each round one flow per gradient bucket, back to back, each
  lasting its share of the round by bytes. Buckets are 40/30/20/10 % of the
  stage's parameter bytes (``--buckets``; ``--param-bytes``, default 2 GiB of
  bf16 parameters per stage); an all-gather chunk carries bucket / dp bytes,
  a reduce-scatter chunk ``--rs-factor`` (default 2: fp32 gradients) times
  that. So a DP pair sees several distinct sizes per step, a PP pair one.
- PP (1F1B): each ``forward-send`` of stage s goes to stage s + 1, each
  ``backward-send`` of stage s to stage s - 1, same DP rank, as one flow over
  the op's [ts, ts + dur] carrying ``--pp-bytes`` (default 32 MiB of
  activations). Receives are the peer's side of the same transfer and are
  not rendered again. The optimizer and layernorm all-reduce (TP group) are
  not network flows here; the embedding all-reduce (first <-> last stage,
  same DP rank) is one flow each way over its op when ``--embedding-bytes``
  is given (port 43000 + r -> 29700).
- Ports: DP flows 41000 + r → 29500, PP flows 42000 + r → 29600; TCP (6).
- Times: the timeline's µs (the dataset's timeline lays its sampled, not
  consecutive, steps one after the other with a few seconds between them;
  ``--restack-gap-us G`` lays them back to back G µs apart instead, one
  shift per step so every step's per-rank timing stays as recorded), plus
  ``--base-us`` (default 0); ``--rebase`` first shifts them so
  that the earliest flow starts at exactly 0 (the capture's first instant).
  Durations are at least 1 µs.
- Truth per rank: the true steps are the job's steps in the timeline (every
  worker runs every one); a step ends at the end of the worker's last DP flow
  of that step (its reduce-scatter here). ``steps_true`` is their number,
  ``step_ends_us`` their ends, ``mean_period_us`` the mean interval between
  consecutive ends (over steps_true - 1 intervals).
"""

import argparse
import csv
import gzip
import io
import json
import re
import sys
from collections import defaultdict

OPS = ("params-all-gather", "grads-reduce-scatter", "forward-send", "backward-send",
       "embedding-grads-all-reduce")
DP_OPS = ("params-all-gather", "grads-reduce-scatter")
BUCKET_SHARES = (0.4, 0.3, 0.2, 0.1)


def _open_text(path, mode="rt"):
    if path == "-":
        return sys.stdin if "r" in mode else sys.stdout
    if path.endswith(".gz"):
        return gzip.open(path, mode, newline="")
    return open(path, mode, newline="")


def read_perfetto(path):
    """Ops (dp, stage, step, op, seq, ts_us, dur_us) from a Perfetto timeline."""
    with _open_text(path) as f:
        events = json.load(f)
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    lane = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            m = re.match(r"PP rank (\d+), TP rank (\d+), (.*)", e["args"]["name"])
            if m:
                lane[(e["pid"], e["tid"])] = (int(m.group(1)), int(m.group(2)))
    ops = []
    for e in events:
        if e.get("ph") != "X" or e.get("name") not in OPS:
            continue
        stage, tp = lane[(e["pid"], e["tid"])]
        if tp != 0:
            continue
        a = e.get("args", {})
        ops.append((int(e["pid"]), stage, int(a["step"]), e["name"], int(a.get("seq_id", 0)),
                    float(e["ts"]), float(e["dur"])))
    return ops


def read_excerpt(path):
    ops = []
    with _open_text(path) as f:
        for row in csv.DictReader(f):
            ops.append((int(row["dp"]), int(row["stage"]), int(row["step"]), row["op"],
                        int(row["seq"]), float(row["ts_us"]), float(row["dur_us"])))
    return ops


def read_ops(path):
    name = path[:-3] if path.endswith(".gz") else path
    return read_perfetto(path) if name.endswith(".json") else read_excerpt(path)


def cmd_excerpt(args):
    ops = sorted(read_ops(args.timeline), key=lambda o: (o[5], o[0], o[1]))
    with _open_text(args.output, "wt") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["dp", "stage", "step", "op", "seq", "ts_us", "dur_us"])
        for dp, stage, step, op, seq, ts, dur in ops:
            w.writerow([dp, stage, step, op, seq, f"{ts:.1f}", f"{dur:.1f}"])
    print(f"{len(ops)} ops -> {args.output}", file=sys.stderr)


def render(ops, dp, pp, job_octet, param_bytes, pp_bytes, shares=BUCKET_SHARES, rs_factor=2.0,
           embedding_bytes=0):
    """Flows (start_us float, src, dst, bytes, dur_us float, sport, dport) and
    each worker's step ends {(d, s): {step: end_us}}."""
    def addr(d, s):
        return f"10.{job_octet}.{s}.{d + 1}"

    flows = []
    ends = defaultdict(dict)
    for d, s, step, op, _seq, ts, dur in ops:
        r = s * dp + d
        if op in DP_OPS:
            if dp < 2:
                continue
            factor = rs_factor if op == "grads-reduce-scatter" else 1.0
            buckets = [int(param_bytes * factor * sh / dp) for sh in shares]
            total = sum(buckets)
            rounds = dp - 1
            round_us = dur / rounds
            peer = addr((d + 1) % dp, s)
            t = ts
            for _ in range(rounds):
                for b in buckets:
                    bd = round_us * b / total
                    flows.append((t, addr(d, s), peer, b, bd, 41000 + r, 29500))
                    t += bd
            prev = ends[(d, s)].get(step, 0.0)
            ends[(d, s)][step] = max(prev, ts + dur)
        elif op == "embedding-grads-all-reduce" and embedding_bytes and pp > 1:
            peer = pp - 1 if s == 0 else 0
            flows.append((ts, addr(d, s), addr(d, peer), embedding_bytes, dur, 43000 + r, 29700))
        elif op == "forward-send" and s + 1 < pp:
            flows.append((ts, addr(d, s), addr(d, s + 1), pp_bytes, dur, 42000 + r, 29600))
        elif op == "backward-send" and s > 0:
            flows.append((ts, addr(d, s), addr(d, s - 1), pp_bytes, dur, 42000 + r, 29600))
    flows.sort(key=lambda f: (f[0], f[1], f[2]))
    return flows, ends, addr


def restack(ops, gap_us):
    """Lay the steps back to back in timeline order: each step's ops shifted
    together so that its earliest op starts ``gap_us`` after the latest end of
    the step before (one shift per step, as the dataset's own timeline does)."""
    span = {}
    for o in ops:
        lo, hi = span.get(o[2], (float("inf"), float("-inf")))
        span[o[2]] = (min(lo, o[5]), max(hi, o[5] + o[6]))
    shift, t = {}, 0.0
    for step in sorted(span, key=lambda k: span[k][0]):
        lo, hi = span[step]
        shift[step] = t - lo
        t += hi - lo + gap_us
    return [o[:5] + (o[5] + shift[o[2]], o[6]) for o in ops]


def cmd_flows(args):
    ops = read_ops(args.timeline)
    if args.restack_gap_us is not None:
        ops = restack(ops, args.restack_gap_us)
    shares = tuple(float(x) for x in args.buckets.split(","))
    flows, ends, addr = render(ops, args.dp, args.pp, args.job_octet, args.param_bytes,
                               args.pp_bytes, shares, args.rs_factor, args.embedding_bytes)
    shift = args.base_us - (flows[0][0] if args.rebase and flows else 0.0)
    with _open_text(args.output, "wt") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["start_us", "src", "dst", "bytes", "dur_us", "switches", "src_port",
                    "dst_port", "proto"])
        for t, src, dst, b, dur, sp, dp_ in flows:
            w.writerow([int(round(t + shift)), src, dst, b, max(1, int(round(dur))), "", sp,
                        dp_, 6])
    print(f"{len(flows)} flows -> {args.output}", file=sys.stderr)
    if args.topology:
        machines = []
        for s in range(args.pp):
            for d in range(args.dp):
                machines.append({"name": f"r{s * args.dp + d}", "addresses": [addr(d, s)],
                                 "switch": "leaf0"})
        with open(args.topology, "w") as f:
            json.dump({"machines": machines}, f, indent=1)
    if args.truth:
        ranks = {}
        for (d, s), by_step in sorted(ends.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            e = sorted(v + shift for v in by_step.values())
            period = (e[-1] - e[0]) / (len(e) - 1) if len(e) > 1 else None
            ranks[addr(d, s)] = {
                "rank": s * args.dp + d, "dp_rank": d, "stage": s,
                "steps_true": len(e), "mean_period_us": period,
                "step_ends_us": [int(round(x)) for x in e],
            }
        with open(args.truth, "w") as f:
            json.dump({"dp": args.dp, "pp": args.pp, "ranks": ranks}, f, indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("excerpt", help="keep the DP and PP send ops of a timeline as CSV")
    e.add_argument("timeline")
    e.add_argument("-o", "--output", required=True)
    fl = sub.add_parser("flows", help="render flow records (whyslow's CSV)")
    fl.add_argument("timeline", help="Perfetto timeline (.json[.gz]) or excerpt (.csv[.gz])")
    fl.add_argument("--dp", type=int, required=True)
    fl.add_argument("--pp", type=int, required=True)
    fl.add_argument("-o", "--output", required=True)
    fl.add_argument("--topology")
    fl.add_argument("--truth")
    fl.add_argument("--job-octet", type=int, default=50)
    fl.add_argument("--param-bytes", type=int, default=2 << 30)
    fl.add_argument("--pp-bytes", type=int, default=32 << 20)
    fl.add_argument("--buckets", default=",".join(str(x) for x in BUCKET_SHARES),
                    help="bucket shares of the stage's parameters (comma-separated)")
    fl.add_argument("--rs-factor", type=float, default=2.0,
                    help="reduce-scatter chunk bytes / all-gather chunk bytes")
    fl.add_argument("--restack-gap-us", type=float,
                    help="lay the steps back to back, this idle time apart (the dataset's"
                         " timeline leaves its own gaps between the sampled steps)")
    fl.add_argument("--embedding-bytes", type=int, default=0,
                    help="render embedding-grads-all-reduce (first <-> last stage) with"
                         " this many bytes per direction (default 0: not rendered)")
    fl.add_argument("--base-us", type=int, default=0)
    fl.add_argument("--rebase", action="store_true",
                    help="shift times so that the first flow starts at --base-us")
    args = p.parse_args(argv)
    {"excerpt": cmd_excerpt, "flows": cmd_flows}[args.cmd](args)


if __name__ == "__main__":
    main()
