"""The fix-evaluation harness (issue 28, scripts/eval-fix) on two of its
cases with the stand-in that answers each case's known fix: the harness
records traces, whyslow names the cause, the patch applies and the rerun
is faster. The gaps are wide (about 3x and 40x on this machine), so load
cannot turn them around."""

import json
import os
import subprocess
import sys

from conftest import needs_torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")


@needs_torch
def test_known_fixes_are_scored_right_and_faster():
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "scripts", "eval-fix"), "--reference",
         "--cases", "gc_step,cpu_preprocess", "--port", "29657"],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stderr.splitlines() if line.startswith("{")]
    assert [r["case"] for r in rows] == ["gc_step", "cpu_preprocess"], out.stderr[-2000:]
    for r in rows:
        assert not r.get("error"), r
        assert r["cause"] and r["applies"], r
        assert r["after_ms"] < 0.8 * r["before_ms"], r
    assert "2/2 causes named, 2/2 patches apply" in out.stdout, out.stdout
