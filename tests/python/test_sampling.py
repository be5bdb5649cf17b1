"""Utilization sampling in the profiling window (issue 4 items 2-3): with
WHYSLOW_SAMPLE_HZ the sampler runs in each rank during the window, its
samples land next to the trace on the trace's time origin, and the
fingerprints' μ/σ of Python/CPU work come from them."""

import csv
import glob
import json
import os

from conftest import needs_torch, torchrun

pytestmark = needs_torch

# An on-demand window at iteration 30 (see test_safety.py), 2 ranks.
ARGS = ["--iters", "800", "--trigger-at", "30", "--log-every", "0"]


def _trace_span_us(path):
    with open(path) as f:
        t = json.load(f)
    lo, hi = float("inf"), float("-inf")
    for e in t.get("traceEvents", []):
        if e.get("ph") == "X" and "ts" in e:
            ts = float(e["ts"])
            lo = min(lo, ts)
            hi = max(hi, ts + float(e.get("dur", 0)))
    return lo, hi


def test_window_samples_feed_fingerprints(tmp_path):
    run = torchrun(tmp_path, ARGS, nproc=2, timeout=120,
                   env={"WHYSLOW_SAMPLE_HZ": "1000", "WHYSLOW_SAMPLE_IFACES": "lo:1000",
                        "WHYSLOW_KEEP_TRACES": "1"})
    assert run.rc == 0, run.out[-3000:]
    assert "disabled" not in run.out, run.out[-3000:]
    assert "without samples" not in run.out, run.out[-3000:]
    sessions = run.sessions()
    assert len(sessions) == 1, run.out[-3000:]
    s = sessions[0]
    assert os.path.exists(os.path.join(s, "report.json")), run.out[-3000:]
    for r in range(2):
        trace = os.path.join(s, "traces", "rank-%d.json" % r)
        samples = os.path.join(s, "traces", "rank-%d.samples.csv" % r)
        assert os.path.exists(trace) and os.path.exists(samples)
        # Sample timestamps are on the trace's clock: inside its span.
        lo, hi = _trace_span_us(trace)
        with open(samples) as f:
            rows = list(csv.DictReader(f))
        cpu = [float(x["ts_us"]) for x in rows if x["resource"] == "cpu"]
        assert len(cpu) > 500, len(cpu)  # ~3 s at 1 kHz
        assert {x["worker"] for x in rows} == {str(r)}
        inside = sum(lo <= t <= hi for t in cpu) / len(cpu)
        assert inside > 0.9, (inside, lo, hi, min(cpu), max(cpu))
        with open(os.path.join(s, "fingerprints", "rank-%d.json" % r)) as f:
            fp = json.load(f)
        assert fp["utilization_source"] == "samples", fp["utilization_source"]
        cpu_fns = [fn for fn in fp["functions"] if fn["kind"] in ("python", "cpu_op")]
        assert cpu_fns
        from_samples = [fn for fn in cpu_fns if fn["util_source"] == "samples"]
        # Functions shorter than 1 ms can hold no sample; the bulk of the
        # CPU time must be measured.
        assert sum(fn["beta"] for fn in from_samples) >= 0.5 * sum(fn["beta"] for fn in cpu_fns), cpu_fns
        assert all(0.0 <= fn["mu"] <= 1.0 and 0.0 <= fn["sigma"] <= 1.0 for fn in from_samples)
        # The training thread computes during CPU operators: measured busy.
        assert max(fn["mu"] for fn in from_samples) > 0.2, from_samples


def test_sampler_failure_does_not_harm(tmp_path):
    # The sampler cannot start (bad interface spec): one log line per rank,
    # the window and report still happen, trace-based μ/σ.
    run = torchrun(tmp_path, ARGS, nproc=2, timeout=120,
                   env={"WHYSLOW_SAMPLE_HZ": "1000", "WHYSLOW_SAMPLE_IFACES": "eth0:notanumber"})
    assert run.rc == 0, run.out[-3000:]
    assert run.out.count("utilization sampler not started") == 2, run.out[-3000:]
    reps = run.reports()
    assert len(reps) == 1, run.out[-3000:]
    assert glob.glob(os.path.join(run.sessions()[0], "fingerprints", "rank-*.json"))
