"""`whyslow analyze --dask` (issue 31): summarize fanned out over Dask worker
processes, localization in the client — the same report as the single
process makes of the same traces (a replay of the recorded H100 run: the
extra sort kernel on rank 2 of 16)."""

import gzip
import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "gpu"))


def _dask():
    try:
        import distributed  # noqa: F401
    except ImportError:
        why = "dask[distributed] is not installed"
        if os.environ.get("WHYSLOW_REQUIRE_DASK") == "1":
            pytest.fail(why)
        pytest.skip(why)


def _findings(report_json):
    r = json.loads(report_json)
    return [(f["function"], f["workers"], f["reason"], round(f["beta"]["value"], 9),
             round(f["mu"]["value"], 9)) for f in r["findings"]], r


def test_dask_report_is_the_single_process_report(tmp_path):
    _dask()
    from replay import replay
    from distributed import Client, LocalCluster

    from whyslow import _whyslow, distributed as wd

    traces = tmp_path / "traces"
    replay(str(traces), 16)
    single, _ = _findings(_whyslow.analyze_paths([str(traces)], source_roots=[str(tmp_path)]))
    assert any("DeviceRadixSort" in f[0] and f[1] == [2] for f in single), single
    # A damaged trace among them is left out with one line; the rest count.
    with gzip.open(str(traces / "rank-99.json.gz"), "wt") as f:
        f.write('{"traceEvents": [')
    lines = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c, \
            Client(c) as client:
        report, stats = wd.analyze(["file://" + str(traces)], client=client, log=lines.append)
    assert stats["workers"] == 2 and stats["traces"] == 17 and stats["summarized"] == 16, stats
    assert len(lines) == 1 and "rank-99.json.gz" in lines[0], lines
    dist, rep = _findings(report)
    assert dist == single
    assert rep["workers"] == 16


def test_the_whyslow_command_takes_dask(tmp_path):
    _dask()
    from replay import replay
    traces = tmp_path / "t"
    replay(str(traces), 4)
    out = tmp_path / "report.json"
    p = subprocess.run([sys.executable, "-m", "whyslow", "analyze", "--dask", "local:1", str(traces),
                        "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert "summarized on 1 Dask worker" in p.stderr.decode()
    rep = json.loads(out.read_text())
    assert any("DeviceRadixSort" in f["function"] and f["workers"] == [2] for f in rep["findings"])
    # Nothing to read: a clear error, not a traceback.
    p = subprocess.run([sys.executable, "-m", "whyslow", "analyze", "--dask", "local:1", str(tmp_path / "none")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert p.returncode == 1 and p.stderr.decode().startswith("whyslow: "), p.stderr.decode()[-1000:]
