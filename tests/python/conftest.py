"""Helpers for whyslow's Python tests: run examples/train.py under torchrun."""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "examples", "train.py")
# train.py with one whyslow failure injected through the runtime's test seam
FAULTY_TRAIN = os.path.join(ROOT, "tests", "python", "faulty_train.py")

# Settings for this 2-core CI machine, where 4 ranks share 2 cores. Healthy
# CPU-bound runs drifted by +50 % in CI (25 -> 37.5 ms, the mean of 30
# iterations) and by more than +100 % while builds shared the machine, so
# the e2e jobs wait 25 ms per iteration for a simulated accelerator
# (SIM_COMPUTE, examples/train.py --sim-compute-ms: the ranks are then not
# CPU-bound, as on a GPU host), and the threshold is a doubling of the
# iteration time; the injected faults slow the job by 150-300 %. N = 30,
# 3 s windows, a short lead.
SIM_COMPUTE = ["--sim-compute-ms", "25"]
TEST_ENV = {
    "WHYSLOW_WINDOW_S": "3",
    "WHYSLOW_N": "30",
    "WHYSLOW_THRESHOLD": "1.0",
    "WHYSLOW_POLL_S": "0.25",
    "WHYSLOW_LEAD_S": "1",
    "WHYSLOW_COLLECT_TIMEOUT_S": "60",
    "WHYSLOW_LOG_LEVEL": "INFO",
    "OMP_NUM_THREADS": "1",
    # 4 ranks share 2 cores: their CPU availability differs for reasons
    # outside the job, so no utilization sampling here (the default is 1 kHz;
    # test_sampling, test_agent and the testbed turn it on).
    "WHYSLOW_SAMPLE_HZ": "0",
}


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


needs_torch = pytest.mark.skipif(not have_torch(), reason="torch is not installed")


class Run:
    def __init__(self, proc, out, report_root, wall):
        self.rc = proc.returncode
        self.out = out
        self.report_root = report_root
        self.wall = wall

    def sessions(self):
        return sorted(glob.glob(os.path.join(self.report_root, "*", "*-s*")))

    def reports(self):
        out = []
        for s in self.sessions():
            p = os.path.join(s, "report.json")
            if os.path.exists(p):
                with open(p) as f:
                    out.append((s, json.load(f)))
        return out


def torchrun(tmp_path, args, nproc=4, env=None, timeout=240, launcher=None, script=TRAIN):
    report_root = str(tmp_path / "reports")
    e = dict(os.environ)
    e.update(TEST_ENV)
    e["WHYSLOW_REPORT_DIR"] = report_root
    e.pop("WHYSLOW_DISABLE", None)
    # A rank that dies of a signal (a SIGSEGV in a native library) prints
    # every thread's Python stack into run.log, so the failure names where.
    e.setdefault("PYTHONFAULTHANDLER", "1")
    if env:
        e.update(env)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), script] + list(args)
    if launcher:
        cmd = launcher + cmd
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=str(tmp_path), env=e, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=timeout)
    out = p.stdout.decode(errors="replace")
    with open(str(tmp_path / "run.log"), "w") as f:
        f.write(out)
    return Run(p, out, report_root, time.monotonic() - t0)


def finding_for(report, name):
    return [f for f in report["findings"] if name in f["function"]]


def whyslow_server_cmd(*args):
    """The `whyslow` binary (cargo-built) running `args`: the server and the
    node agent are not in the wheel (the package links only what runs inside
    a training job), so tests of the server use the binary; fails when it is
    not built (`cargo build -p whyslow`; ./scripts/test builds it)."""
    cands = [os.environ.get("WHYSLOW_BIN", "")]
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
    cands += [os.path.join(target, "release", "whyslow"), os.path.join(target, "debug", "whyslow")]
    for c in cands:
        if c and os.access(c, os.X_OK):
            return [c] + list(args)
    pytest.fail("no whyslow binary with the server (build it: cargo build -p whyslow)")


def pytest_runtest_logreport(report):
    """Every skipped test, with its reason, into $WHYSLOW_SKIP_LOG (set by
    ./scripts/test, whose summary counts and lists them with the Rust ones)."""
    path = os.environ.get("WHYSLOW_SKIP_LOG")
    if not path or not report.skipped:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    with open(path, "a") as f:
        f.write("%s\t%s\n" % (report.nodeid, str(reason).replace("\n", " ")))
