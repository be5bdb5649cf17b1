"""Never harm training (issue 3 §7): every whyslow failure logs one line and
disables whyslow; training neither crashes nor hangs."""

import os
import subprocess
import sys
import time

from conftest import FAULTY_TRAIN, needs_torch, torchrun

pytestmark = needs_torch

# An on-demand window at iteration 30 (no need to wait for a slowdown). The
# window starts WHYSLOW_LEAD_S (1 s) later and lasts WHYSLOW_WINDOW_S (3 s):
# 2 ranks run at ~5-10 ms per iteration here, so 800 iterations cover it.
ARGS = ["--iters", "800", "--trigger-at", "30", "--log-every", "0"]


def test_on_demand_trigger_writes_a_report(tmp_path):
    run = torchrun(tmp_path, ARGS, nproc=2)
    assert run.rc == 0, run.out[-3000:]
    reps = run.reports()
    assert len(reps) == 1, run.out[-3000:]
    assert reps[0][1]["workers"] == 2
    assert "disabled" not in run.out


def test_profiler_raises(tmp_path):
    run = torchrun(tmp_path, ARGS, nproc=2, script=FAULTY_TRAIN, env={"WHYSLOW_TEST_FAULT": "raise_profiler_start"})
    assert run.rc == 0, run.out[-3000:]
    assert run.out.count("whyslow: disabled on rank") == 2, run.out[-3000:]
    assert "injected test fault at profiler_start" in run.out
    assert run.reports() == []


def test_store_unreachable(tmp_path):
    run = torchrun(tmp_path, ARGS, nproc=2, script=FAULTY_TRAIN, env={"WHYSLOW_TEST_FAULT": "raise_store"})
    assert run.rc == 0, run.out[-3000:]
    assert run.out.count("whyslow: disabled on rank") == 2, run.out[-3000:]


def test_report_dir_not_writable(tmp_path):
    run = torchrun(tmp_path, ARGS, nproc=2, env={"WHYSLOW_REPORT_DIR": "/proc/whyslow-not-writable"})
    assert run.rc == 0, run.out[-3000:]
    assert "whyslow: disabled on rank" in run.out, run.out[-3000:]


def test_rank0_dies_during_collection(tmp_path):
    # Rank 0 exits right after summarizing, while collecting; the other rank
    # must not hang (torchrun then ends the job with rank 0's failure).
    t0 = time.monotonic()
    run = torchrun(tmp_path, ["--iters", "1500", "--trigger-at", "30", "--log-every", "0"], nproc=2,
                   script=FAULTY_TRAIN, env={"WHYSLOW_TEST_FAULT": "die_rank0_after_summarize"}, timeout=180)
    assert time.monotonic() - t0 < 180
    assert run.rc != 0  # rank 0 died: the job fails, but nothing hangs
    assert run.reports() == []


def test_rank1_late_fingerprint_is_named_missing(tmp_path):
    # Rank 1's background summarizer fails: rank 0 waits the (short) collect
    # timeout, analyzes itself alone and names rank 1 as missing.
    run = torchrun(tmp_path, ARGS, nproc=2, script=FAULTY_TRAIN, env={
        "WHYSLOW_TEST_FAULT": "raise_after_summarize_rank1",
        "WHYSLOW_COLLECT_TIMEOUT_S": "5",
    })
    assert run.rc == 0, run.out[-3000:]
    reps = run.reports()
    assert len(reps) == 1, run.out[-3000:]
    assert reps[0][1]["missing_workers"] == [1]


def test_disable_env(tmp_path):
    run = torchrun(tmp_path, ARGS, nproc=2, env={"WHYSLOW_DISABLE": "1"})
    assert run.rc == 0, run.out[-3000:]
    assert run.sessions() == []


def test_launcher_injects_the_import(tmp_path):
    # The example imports whyslow itself; the launcher must work for scripts
    # that do not: check with a tiny script.
    script = tmp_path / "probe.py"
    script.write_text("import os, sys\nprint('WHYSLOW_LOADED', 'whyslow' in sys.modules, os.environ.get('RANK'))\n")
    env = dict(os.environ)
    p = subprocess.run([sys.executable, "-m", "whyslow.run", sys.executable, str(script)],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode()
    assert p.returncode == 0, out
    assert "WHYSLOW_LOADED True" in out, out
