#!/usr/bin/env python3
"""Holistic Trace Analysis (HTA, pip HolisticTraceAnalysis) as a peer: how its
analyses are turned into (function, ranks) verdicts.

HTA has two analyses that say which rank / which kernel is slow:

* `TraceAnalysis.get_potential_stragglers(num_candidates=k)`
  (hta/analyzers/straggler.py): per iteration, the k ranks that start the
  "last long" NCCL kernel (names starting `ncclKernel`) latest; ranks are
  ranked by how many iterations they were among those k. It always returns k
  ranks (no threshold) and names no function.
* `TraceDiff.compare_traces(control, test, control_rank, test_rank, ...)`
  (hta/trace_diff.py): per op/kernel name, count and total duration in two
  traces and their differences. It names functions, for one rank pair.

Verdicts built from them (the exact rules the table uses):

`hta-straggler` (only the run under test, the information whyslow gets):
  ranks = get_potential_stragglers(k), k = the number of injected workers
  when the case injects a subset of workers (an oracle hint in HTA's favour),
  else HTA's default k = 2; function = `top_increase` of TraceDiff between
  the lowest-numbered rank not flagged (control) and the first flagged rank
  (test), all profiled iterations. One finding (function, ranks).

`hta-diff` (needs a known-good run, which whyslow does not): for each rank r,
  function = `top_increase` of TraceDiff(good run rank r -> run under test
  rank r); ranks with the same function are one finding. The good run is an
  independent clean replay (other jitter seed) of the same trace and scale.

`top_increase(diff)`: among ops other than ProfilerStep#N whose total
duration grew by at least 1 % of the control rank's ProfilerStep time, the
one with the largest relative growth (test/control - 1; ops absent from the
control rank count as infinite); ties go to the smaller total in the test
rank (the innermost of a nested stack), then the name. None when no op grew
that much.
"""
from __future__ import annotations

import logging
import math
import os
import sys
import time

SIGNIFICANT = 0.01  # share of the control rank's step time


def _quiet():
    logging.disable(logging.INFO)
    for n in ("hta", "root"):
        logging.getLogger(n).setLevel(logging.ERROR)


def load(trace_dir: str):
    """Parses every rank of trace_dir with HTA; returns the TraceAnalysis."""
    _quiet()
    from hta.trace_analysis import TraceAnalysis

    return TraceAnalysis(trace_dir=trace_dir)


def _labeled(ta, label):
    """A trace_diff.LabeledTrace around an already parsed Trace (LabeledTrace's
    constructor would parse the files again)."""
    import pandas as pd
    from hta.trace_diff import LabeledTrace

    lt = LabeledTrace.__new__(LabeledTrace)
    lt.label = label
    lt.t = ta.t
    lt.s_map = pd.Series(lt.t.symbol_table.get_sym_id_map())
    lt.s_tab = pd.Series(lt.t.symbol_table.get_sym_table())
    lt.iteration_df = lt._extract_iterations()
    return lt


def top_increase(control_lt, c_rank: int, test_lt, t_rank: int):
    from hta.trace_diff import TraceDiff

    c_it = control_lt.iterations()
    t_it = test_lt.iterations()
    df = TraceDiff.compare_traces(control_lt, test_lt, c_rank, t_rank, c_it, t_it)
    cl, tl = control_lt.label, test_lt.label
    names = [str(n) for n in df.index]
    is_step = [n.startswith("ProfilerStep") for n in names]
    step_time = float(sum(v for v, s in zip(df[f"{cl}_total_duration"], is_step) if s))
    if step_time <= 0:
        return None
    best = None
    for n, s, c, t, d in zip(names, is_step, df[f"{cl}_total_duration"], df[f"{tl}_total_duration"], df["diff_duration"]):
        if s or d < SIGNIFICANT * step_time:
            continue
        rel = (t / c - 1.0) if c > 0 else math.inf
        key = (-rel, t, n)
        if best is None or key < best[0]:
            best = (key, n)
    return best[1] if best else None


def straggler_findings(ta, k: int):
    ranks = sorted(ta.t.get_all_traces().keys())
    flagged = ta.get_potential_stragglers(num_candidates=k)
    flagged = sorted(int(r) for r in flagged)
    if not flagged:
        return []
    others = [r for r in ranks if r not in flagged]
    func = None
    if others:
        func = top_increase(_labeled(ta, "control"), others[0], _labeled(ta, "test"), flagged[0])
    return [{"function": func or "(no function)", "workers": flagged}]


def diff_findings(ta_good, ta_test):
    good = _labeled(ta_good, "good")
    test = _labeled(ta_test, "test")
    by_func: dict = {}
    g_ranks = set(ta_good.t.get_all_traces().keys())
    for r in sorted(ta_test.t.get_all_traces().keys()):
        if r not in g_ranks:
            continue
        f = top_increase(good, r, test, r)
        if f:
            by_func.setdefault(f, []).append(int(r))
    return [{"function": f, "workers": ws} for f, ws in sorted(by_func.items())]


if __name__ == "__main__":  # quick manual check: hta_peer.py GOOD_DIR TEST_DIR [k]
    import json

    t = time.time()
    g = load(sys.argv[1])
    x = load(sys.argv[2])
    print(f"parse {time.time() - t:.1f}s", file=sys.stderr)
    k = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    print(json.dumps({"straggler": straggler_findings(x, k), "diff": diff_findings(g, x)}, indent=1))
