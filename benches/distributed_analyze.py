"""`whyslow analyze --dask` against the single-process analysis (issue 31):
the recorded H100 run replayed as N ranks (tests/fixtures/gpu/replay.py),
the same report required, wall time with 1, 2 and 4 Dask worker processes.

    python benches/distributed_analyze.py --ranks 128 1024 --workers 1 2 4
"""

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "fixtures", "gpu"))


def findings(report):
    return [(f["function"], f["workers"], f["reason"]) for f in json.loads(report)["findings"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[128])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    a = ap.parse_args()
    from replay import replay
    from distributed import Client, LocalCluster

    from whyslow import _whyslow, distributed as wd

    for n in a.ranks:
        with tempfile.TemporaryDirectory() as d:
            replay(d, n)
            mb = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) / 1e6
            t0 = time.monotonic()
            single = _whyslow.analyze_paths([d], source_roots=[d])
            t_single = time.monotonic() - t0
            print("%d ranks (%.0f MB gzipped): single process %.2f s" % (n, mb, t_single), flush=True)
            for w in a.workers:
                with LocalCluster(n_workers=w, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as c, Client(c) as client:
                    t0 = time.monotonic()
                    report, st = wd.analyze(["file://" + d], client=client)
                    t = time.monotonic() - t0
                same = findings(report) == findings(single)
                print("  dask, %d worker(s): %.2f s (summarize %.2f s, localize %.2f s), same report: %s"
                      % (w, t, st["summarize_s"], st["localize_s"], same), flush=True)


if __name__ == "__main__":
    main()
