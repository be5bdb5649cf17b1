"""The privileged sampling sidecar (issue 4 item 2, PerfTracker §5, EROICA):
with WHYSLOW_AGENT_DIR the ranks do not sample themselves; `whyslow agent`
running next to them samples each rank during the window, and the
fingerprints' μ/σ come from its samples."""

import csv
import glob
import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import ROOT, needs_torch, torchrun

pytestmark = needs_torch

# An on-demand window at iteration 30 (as test_sampling.py), 2 ranks.
ARGS = ["--iters", "800", "--trigger-at", "30", "--log-every", "0"]


def whyslow_bin():
    cands = [os.environ.get("WHYSLOW_BIN", "")]
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    cands += [os.path.join(target, "release", "whyslow"), os.path.join(target, "debug", "whyslow"),
              shutil.which("whyslow") or ""]
    for c in cands:
        if c and os.access(c, os.X_OK):
            try:
                out = subprocess.run([c, "agent", "--help"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, timeout=30)
            except OSError:
                continue
            if out.returncode == 0:
                return c
    return None


@pytest.fixture
def agent(tmp_path):
    exe = whyslow_bin()
    if exe is None:
        pytest.skip("no whyslow binary with `agent` (set WHYSLOW_BIN, or "
                    "`cargo build --release -p whyslow`)")
    d = tmp_path / "agent"
    d.mkdir()
    log = open(str(tmp_path / "agent.log"), "w")
    p = subprocess.Popen([exe, "agent", "--samples-dir", str(d), "--poll-ms", "20"],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        yield str(d), p, str(tmp_path / "agent.log")
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        log.close()


def test_agent_samples_feed_fingerprints(tmp_path, agent):
    d, proc, agent_log = agent
    run = torchrun(tmp_path, ARGS, nproc=2, timeout=180,
                   env={"WHYSLOW_AGENT_DIR": d, "WHYSLOW_SAMPLE_HZ": "1000",
                        "WHYSLOW_SAMPLE_IFACES": "lo:1000", "WHYSLOW_KEEP_TRACES": "1"})
    with open(agent_log) as f:
        alog = f.read()
    assert run.rc == 0, run.out[-3000:]
    assert "disabled" not in run.out, run.out[-3000:]
    assert "without samples" not in run.out and "continuing without" not in run.out, \
        run.out[-3000:] + alog[-2000:]
    assert proc.poll() is None, alog
    # The agent served both ranks and let go of the pause file.
    assert not os.path.exists(os.path.join(d, "whyslow.pause")), alog
    for r in range(2):
        with open(os.path.join(d, "rank-%d.done" % r)) as f:
            done = json.load(f)
        assert done["reason"] == "stop file", done
        assert "cpu" in done["series"], done
    reps = run.reports()
    assert len(reps) == 1, run.out[-3000:]
    s, report = reps[0]
    assert report["utilization_source"] == "samples", report["utilization_source"]
    for r in range(2):
        samples = os.path.join(s, "traces", "rank-%d.samples.csv" % r)
        with open(samples) as f:
            rows = list(csv.DictReader(f))
        cpu = [x for x in rows if x["resource"] == "cpu"]
        assert len(cpu) > 300, len(cpu)  # ~3 s at 1 kHz on a busy 2-core box
        assert all(0.0 <= float(x["value"]) <= 1.0 for x in cpu)
        with open(os.path.join(s, "fingerprints", "rank-%d.json" % r)) as f:
            fp = json.load(f)
        assert fp["utilization_source"] == "samples", fp["utilization_source"]
        cpu_fns = [fn for fn in fp["functions"] if fn["kind"] in ("python", "cpu_op")]
        from_samples = [fn for fn in cpu_fns if fn["util_source"] == "samples"]
        assert from_samples, cpu_fns
        assert max(fn["mu"] for fn in from_samples) > 0.2, from_samples
    # The report's findings (if any) carry the samples as their source.
    for f in report["findings"]:
        if f["kind"] in ("python", "cpu_op"):
            assert f["util_source"] in ("samples", "trace"), f


def test_no_agent_does_not_harm(tmp_path):
    # WHYSLOW_AGENT_DIR points at a directory no agent serves: each rank
    # waits a bounded time, logs one line, and the report still happens.
    d = tmp_path / "nobody"
    d.mkdir()
    t0 = time.monotonic()
    run = torchrun(tmp_path, ARGS, nproc=2, timeout=180, env={"WHYSLOW_AGENT_DIR": str(d)})
    assert run.rc == 0, run.out[-3000:]
    assert run.out.count("continuing without") == 2, run.out[-3000:]
    assert "disabled" not in run.out, run.out[-3000:]
    reps = run.reports()
    assert len(reps) == 1, run.out[-3000:]
    assert glob.glob(os.path.join(run.sessions()[0], "fingerprints", "rank-*.json"))
    assert time.monotonic() - t0 < 170
