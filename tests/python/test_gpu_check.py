"""scripts/gpu-check's CPU dry run (issue 33): on a machine without a CUDA
device it says so, and the checks' plumbing still runs (each check `skip`
with its reason, figures from the CPU)."""

import json
import os
import subprocess
import sys

import pytest

from conftest import needs_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = needs_torch


def test_dry_run_detects_no_gpu_and_runs_the_sampler(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the dry run is for machines without one")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("WHYSLOW_DISABLE", None)
    p = subprocess.run([os.path.join(ROOT, "scripts", "gpu-check"), "--only", "env,nvml", "--out", str(out)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=240)
    log = p.stdout.decode(errors="replace")
    assert p.returncode == 0, log
    assert log.startswith("DRY RUN: "), log
    s = json.loads((out / "gpu-check.json").read_text())
    assert s["dry_run"] and "torch sees no CUDA device" in s["device"]
    checks = {c["name"]: c for c in s["checks"]}
    assert checks["env"]["status"] == "pass", checks["env"]
    nvml = checks["nvml"]
    assert nvml["status"] == "skip" and "no GPU" in nvml["detail"], nvml
    # The sampler ran at its rate and said why it had no GPU.
    assert nvml["figures"]["busy"]["achieved_hz"] > 500, nvml
    assert nvml["figures"]["busy"]["gpu"].startswith("not available"), nvml
    assert (out / "gpu-check.txt").read_text().startswith("whyslow gpu-check: ")
    assert (out / "artifacts.tar.gz").exists()
