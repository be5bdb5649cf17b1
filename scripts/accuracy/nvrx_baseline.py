#!/usr/bin/env python3
"""NVRx-style straggler scores computed from Kineto traces.

Re-implements the scoring of NVIDIA Resiliency Extension's straggler detector
(nvidia_resiliency_ext.straggler, `ReportGenerator` / `Report.identify_stragglers`,
as described in its usage guide and API docs) on per-rank timings taken from
PyTorch profiler traces instead of its in-process CUPTI/section timers. The
package itself needs torch and a GPU at run time, so it is not imported.

* Per rank and per kernel name / section: the median duration.
* Relative score = reference / rank median, reference = the minimum over
  ranks of the per-rank medians ("workload min": the best-performing rank).
* GPU score of a rank = average of its per-kernel relative scores weighted
  by the rank's total time in each kernel (count x mean); kernels not run on
  every rank are skipped; NCCL kernels are skipped (NVRx filters them out:
  their duration is mostly waiting for peers).
* Sections: NVRx times user-marked code sections on the CPU (wall clock).
  From a trace we take each user annotation (`user_annotation` events, e.g.
  "## forward ##") as a section, and all `ProfilerStep#N` as one section
  "ProfilerStep". As the brief for this harness asks, each (non-NCCL) GPU
  kernel name is also scored as its own section, so the baseline can name a
  kernel, which NVRx's single GPU score cannot.
* A rank is a straggler for a score when the score < threshold (run.py uses
  0.7; the default of `Report.identify_stragglers` is 0.75).

Verdicts: one finding per (section or "<GPU>", set of ranks below the
threshold).

Usage: nvrx_baseline.py DIR [--threshold 0.75] prints the findings as JSON.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
from collections import defaultdict

import numpy as np

try:
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover
    _loads = json.loads

THRESHOLD = 0.75
GPU = "<GPU>"  # the aggregated GPU score
STEP = "ProfilerStep"
_STEP_RE = re.compile(r"^ProfilerStep#\d+$")


def _is_nccl(name: str) -> bool:
    n = name.lower()
    return "nccl" in n or "rccl" in n


def timings_from_trace(path: str):
    """(kernels: name -> [dur µs], sections: name -> [dur µs]) of one rank's trace."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = _loads(raw)
    evs = doc["traceEvents"] if isinstance(doc, dict) else doc
    kernels, sections = defaultdict(list), defaultdict(list)
    for e in evs:
        if e.get("ph") != "X":
            continue
        cat, name = e.get("cat"), str(e.get("name", ""))
        if cat == "kernel":
            kernels[name].append(float(e["dur"]))
        elif cat == "user_annotation":
            sections[STEP if _STEP_RE.match(name) else name].append(float(e["dur"]))
    rank = (doc.get("distributedInfo") or {}).get("rank") if isinstance(doc, dict) else None
    return rank, kernels, sections


def _medians(per_rank, ranks, which, skip=lambda k: False):
    """rank -> name -> median duration; names with the same number of
    executions on every rank are done in one numpy call."""
    out = {r: {} for r in ranks}
    names = sorted({k for r in ranks for k, v in per_rank[r][which].items() if len(v) and not skip(k)})
    for k in names:
        vs = [per_rank[r][which].get(k) for r in ranks]
        lens = {len(v) if v is not None else 0 for v in vs}
        if len(lens) == 1 and 0 not in lens:
            m = np.median(np.asarray(vs, dtype=float), axis=1)
            for r, x in zip(ranks, m):
                out[r][k] = float(x)
        else:
            for r, v in zip(ranks, vs):
                if v is not None and len(v):
                    out[r][k] = float(np.median(v))
    return out


def findings(per_rank: dict, threshold: float = THRESHOLD, per_kernel_sections: bool = True):
    """per_rank: rank -> (kernels: name -> [durs], sections: name -> [durs]).
    Returns [{"function", "kind", "workers", "min_score"}], deterministic order."""
    ranks = sorted(per_rank)
    if len(ranks) < 2:
        return []
    med_k = _medians(per_rank, ranks, 0, skip=_is_nccl)
    tot_k = {r: {k: float(np.sum(v)) for k, v in per_rank[r][0].items() if len(v) and not _is_nccl(k)} for r in ranks}
    med_s = _medians(per_rank, ranks, 1)
    common_k = set.intersection(*(set(med_k[r]) for r in ranks))
    common_s = set.intersection(*(set(med_s[r]) for r in ranks))
    ref_k = {k: min(med_k[r][k] for r in ranks) for k in common_k}
    ref_s = {s: min(med_s[r][s] for r in ranks) for s in common_s}
    out = []
    # Aggregated GPU score (NVRx's gpu_relative_perf_scores).
    gpu_score = {}
    for r in ranks:
        num = den = 0.0
        for k in common_k:
            if med_k[r][k] <= 0:
                continue
            w = tot_k[r][k]
            num += (ref_k[k] / med_k[r][k]) * w
            den += w
        gpu_score[r] = num / den if den > 0 else float("nan")
    slow = [r for r in ranks if gpu_score[r] < threshold]
    if slow:
        out.append({"function": GPU, "kind": "gpu_score", "workers": slow,
                    "min_score": round(min(gpu_score[r] for r in slow), 3)})
    # Sections (NVRx section_relative_perf_scores).
    def section(name, meds, ref, kind):
        sc = {r: (ref / meds[r][name]) if meds[r][name] > 0 else 1.0 for r in ranks}
        slow = [r for r in ranks if sc[r] < threshold]
        if slow:
            out.append({"function": name, "kind": kind, "workers": slow,
                        "min_score": round(min(sc[r] for r in slow), 3)})

    for s in sorted(common_s):
        section(s, med_s, ref_s[s], "section")
    if per_kernel_sections:
        for k in sorted(common_k):
            section(k, med_k, ref_k[k], "kernel")
    return out


def findings_from_dir(d: str, threshold: float = THRESHOLD):
    per_rank = {}
    for i, f in enumerate(sorted(os.listdir(d))):
        if not re.search(r"\.json(\.gz)?$", f):
            continue
        rank, kernels, sections = timings_from_trace(os.path.join(d, f))
        m = re.search(r"rank-?(\d+)", f)
        per_rank[rank if rank is not None else int(m.group(1)) if m else i] = (kernels, sections)
    return findings(per_rank, threshold)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="NVRx-style straggler scores from Kineto traces")
    ap.add_argument("dir")
    ap.add_argument("--threshold", type=float, default=THRESHOLD)
    a = ap.parse_args(argv)
    print(json.dumps(findings_from_dir(a.dir, a.threshold), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
