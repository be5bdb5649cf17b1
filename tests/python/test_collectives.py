"""Collective tracing and slow-rank detection on a real gloo job (issue 13,
SysOM-AI §3.2): `whyslow agent --trace-collectives` puts uprobes on gloo's
collectives in the ranks' libtorch_cpu.so; `whyslow diagnose` aligns the
ranks' entries into their DDP all-reduces and names the rank that enters
late. A healthy run names nobody. Needs root for eBPF (skips with the reason
otherwise; WHYSLOW_REQUIRE_BPF=1 makes that a failure, as in CI)."""

import glob
import json
import os
import signal
import subprocess

import pytest

from conftest import needs_torch, torchrun
from test_agent import whyslow_bin

pytestmark = needs_torch


def _bpf_or_skip():
    if os.geteuid() != 0:
        if os.environ.get("WHYSLOW_REQUIRE_BPF") == "1":
            pytest.fail("WHYSLOW_REQUIRE_BPF=1 but not root: uprobes need root")
        pytest.skip("eBPF uprobes need root")


def _traced_run(tmp_path, train_args, env=None):
    """Runs examples/train.py on 3 ranks beside a tracing agent."""
    exe = whyslow_bin()
    if exe is None:
        pytest.fail("no whyslow binary (build it: cargo build -p whyslow)")
    d, spool = tmp_path / "agent", tmp_path / "spool"
    d.mkdir()
    log_path = str(tmp_path / "agent.log")
    log = open(log_path, "w")
    # 2 s periods: diagnose leaves out a period reaching into a rank's
    # start-up or shutdown, and the jobs here train for 10-15 s.
    agent = subprocess.Popen([exe, "agent", "--samples-dir", str(d), "--profile-spool", str(spool),
                              "--profile-period", "2", "--trace-collectives", "--profile-offcpu",
                              "--log-format", "json"],
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        run = torchrun(tmp_path, train_args, nproc=3, timeout=300,
                       env=dict({"WHYSLOW_AGENT_DIR": str(d)}, **(env or {})))
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        log.close()
    with open(log_path) as f:
        alog = f.read()
    assert run.rc == 0, run.out[-3000:]
    traced = [json.loads(l) for l in alog.splitlines()
              if l.startswith("{") and '"collectives_traced"' in l]
    # gloo's functions in every rank (PyPI's CUDA wheels map libnccl too: the
    # agent traces NCCL's calls there as well, none made in a CPU job).
    gloo = {e["fields"]["pid"] for e in traced if "libnccl" not in e["fields"]["library"]}
    assert len(gloo) == 3, "the agent traced gloo in %d of 3 ranks:\n%s" % (len(gloo), alog[-4000:])
    files = glob.glob(str(spool / "**" / "*.collectives.jsonl"), recursive=True)
    records = [json.loads(l) for f in files for l in open(f) if l.strip()]
    html = tmp_path / "diagnose.html"
    out = subprocess.run([exe, "diagnose", str(spool), "--format", "json", "--html", str(html)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    report = json.loads(out.stdout)
    report["html"] = html.read_text()
    report["online_reports"] = run.reports()
    return records, report, alog


def test_the_late_rank_is_named_from_its_gloo_collectives(tmp_path):
    _bpf_or_skip()
    # Each iteration waits 30 ms as for an accelerator (a GPU job's ranks do
    # not compete for CPU; here 3 ranks share 2 cores). Rank 2 does 25 ms of
    # extra Python work before each backward pass from iteration 80: its DDP
    # buckets reach gloo late, every iteration.
    # The online detector (30 % slower) sees it too: after 80 healthy
    # iterations, its report carries the agent's cross-layer diagnosis.
    records, report, alog = _traced_run(
        tmp_path, ["--iters", "250", "--fault", "slow-rank", "--fault-rank", "2",
                   "--fault-at", "80", "--fault-ms", "25", "--log-every", "0",
                   "--sim-compute-ms", "30"], env={"WHYSLOW_THRESHOLD": "0.3"})
    show = json.dumps({k: v for k, v in report.items() if k not in ("html", "online_reports")},
                      indent=1)[:4000]
    # Every rank's all-reduces, with their sizes, in one group named alike.
    ranks = {r["rank"] for r in records if r["op"] == "allreduce"}
    assert ranks == {0, 1, 2}, alog[-3000:]
    groups = {r["group"] for r in records}
    assert len(groups) == 1, groups
    assert all(r["global_rank"] == r["rank"] for r in records)
    assert any(r["bytes"] > 0 for r in records)
    # PyTorch's collective tags number the calls alike on every rank, however
    # late the agent attached to each: most iterations' all-reduces (2 DDP
    # buckets or more each) are seen on all three ranks under one tag.
    tags = [{r["seq"] for r in records if r["rank"] == k and r["op"] == "allreduce"}
            for k in range(3)]
    assert None not in set.union(*tags), "an all-reduce without its tag"
    assert len(tags[0] & tags[1] & tags[2]) >= 200, [len(t) for t in tags]
    names = [(s["group"], s["rank"]) for s in report["stragglers"]]
    assert names == [(groups.pop(), 2)], show
    late_ms = report["stragglers"][0]["late_us"] / 1e3
    assert 10 < late_ms < 40, show
    # Which layer: its own code (the CPU waterline), the injected function
    # first; the agent's OS readings were there for the OS layer.
    assert report["layer"] == "cpu", show
    assert report["cpu_diff"][0]["rank"] == 2, show
    assert "injected_slow_rank_work" in report["cpu_diff"][0]["function"], show
    assert report["os_samples"] > 0, show
    # The page: the entry-time plot with rank 2 flagged, the flame graphs.
    assert "rank 2 (flagged)" in report["html"]
    assert "late rank 2 against rank" in report["html"]
    # The online package's report (the detector saw iterations slow down)
    # carries the cross-layer sections over the agent's spool as it stood
    # then, with a link to its page.
    online = report["online_reports"]
    assert online, "no online report: " + show
    sdir, first = online[0]
    cross = first.get("cross_layer")
    assert cross is not None and {"stragglers", "layer", "cpu_diff", "os_diff", "regressions"} <= set(cross), sorted(first)
    assert os.path.exists(os.path.join(sdir, "diagnose.html"))
    assert 'href="diagnose.html"' in open(os.path.join(sdir, "report.html")).read()


def test_a_rank_blocked_on_slow_reads_is_seen_off_the_cpu(tmp_path):
    _bpf_or_skip()
    # Rank 2 reads each batch from slow storage from iteration 20: blocked
    # in read(2) for 25 ms (train.py's injected_slow_read: a pipe a storage
    # thread answers late). It uses no more CPU than its peers; its CPU
    # profile cannot show the wait, its off-CPU profile does.
    records, report, alog = _traced_run(
        tmp_path, ["--iters", "200", "--fault", "slow-read", "--fault-rank", "2",
                   "--fault-at", "20", "--fault-ms", "25", "--log-every", "0",
                   "--sim-compute-ms", "30"])
    show = json.dumps({k: v for k, v in report.items() if k not in ("html", "online_reports")},
                      indent=1)[:5000]
    assert [s["rank"] for s in report["stragglers"]] == [2], show
    blocked = report["offcpu_diff"]
    assert blocked and all(d["rank"] == 2 for d in blocked), show
    assert any("pipe_read" in d["stack"] for d in blocked[:8]), show
    assert report["layer"] in ("os", "cpu"), show


def test_a_healthy_gloo_job_has_no_late_rank(tmp_path):
    """The same job without the fault: nobody is named."""
    _bpf_or_skip()
    records, report, alog = _traced_run(tmp_path, ["--iters", "200", "--log-every", "0",
                                                   "--sim-compute-ms", "30"])
    assert {r["rank"] for r in records} == {0, 1, 2}, alog[-3000:]
    show = json.dumps({k: v for k, v in report.items() if k not in ("html", "online_reports")},
                      indent=1)[:4000]
    assert report["stragglers"] == [], show
    assert report["layer"] == "none", show
    assert report["os_samples"] > 0, show
