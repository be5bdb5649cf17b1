"""Hangs in a live job (issue 27): torchrun, 4 CPU ranks, gloo, 2 dp x 2
tp (hang_train.py) with `import whyslow`. After the §4.1 stall the online
package gathers every rank's stacks and Flight Recorder dump through the
job's store and writes hang-report.json; the culprit must be the injected
rank, for the injected reason, with the injected function on its stack,
well within a minute of the stall threshold. Healthy and slow jobs write
no hang report."""

import glob
import json
import os

import pytest

from conftest import needs_torch
import hang_cases


def _live(tmp_path, name):
    folder, out, secs = hang_cases.run_case(name, str(tmp_path / name))
    return folder, out


@needs_torch
@pytest.mark.parametrize("case", ["sleep", "gil", "exit", "mismatch"])
def test_a_live_hang_names_its_culprit(tmp_path, case):
    folder, out = _live(tmp_path, case)
    report_path = os.path.join(folder or "", "hang-report.json")
    assert folder and os.path.exists(report_path), out[-4000:]
    report = json.load(open(report_path))
    ok, why = hang_cases.judge(report, hang_cases.CASES[case]["truth"])
    assert ok, "%s: %s\n%s" % (case, why, open(os.path.join(folder, "hang-report.txt")).read())
    # The report is on disk well before any collective timeout: within a
    # minute of the stall threshold (the gather waits at most
    # WHYSLOW_HANG_GATHER_S for ranks that cannot answer).
    t = json.load(open(os.path.join(folder, "timing.json")))
    assert (t["report_at_ns"] - t["threshold_at_ns"]) / 1e9 < 60, t
    assert "whyslow: hang report" in out, out[-3000:]


@needs_torch
@pytest.mark.parametrize("case", ["healthy", "slow"])
def test_healthy_and_slow_jobs_write_no_hang_report(tmp_path, case):
    folder, out = _live(tmp_path, case)
    reports = str(tmp_path / case / "reports")
    assert not glob.glob(os.path.join(reports, "*", "hang-*")), out[-3000:]
    assert "blocked" not in out, out[-3000:]
    # Their mid-run dumps, read as a hang would be, name nobody.
    dumps = str(tmp_path / case / "dumps")
    from whyslow import _whyslow

    report = json.loads(_whyslow.hang_report(dumps, 4)[0])
    assert not report["hang"] and not report["culprits"], report["verdict"]
