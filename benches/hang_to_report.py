#!/usr/bin/env python3
"""Time from a hang to its report on disk (issue 27: under 60 s after the
§4.1 detector's threshold, long before a collective timeout).

Runs the injected hangs of tests/python/hang_cases.py (torchrun, 4 CPU
ranks, gloo, `import whyslow` with its defaults)
and reads each report's timing.json: when the stall threshold passed on the
reporting rank (its last iteration event + max(5 x mean iteration, 1 s)),
when the watchdog saw it, and when hang-report.json was written.

  .venv/bin/python benches/hang_to_report.py [--gather-s 20] [--cases sleep gil exit mismatch]
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
import hang_cases  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gather-s", type=float, default=20.0, help="WHYSLOW_HANG_GATHER_S (the default: 20)")
    ap.add_argument("--grace-s", type=float, default=10.0, help="WHYSLOW_HANG_GRACE_S (the default: 10)")
    ap.add_argument("--cases", nargs="*", default=["sleep", "gil", "exit", "mismatch"])
    a = ap.parse_args()
    hang_cases.ENV["WHYSLOW_HANG_GATHER_S"] = str(a.gather_s)
    hang_cases.ENV["WHYSLOW_HANG_GRACE_S"] = str(a.grace_s)
    print("case       culprit right  threshold->detected  threshold->report")
    for name in a.cases:
        with tempfile.TemporaryDirectory() as work:
            folder, log, secs = hang_cases.run_case(name, work, timeout=a.gather_s + 90)
            if not folder or not os.path.exists(os.path.join(folder, "timing.json")):
                print("%-10s no report (%.0f s)" % (name, secs))
                continue
            t = json.load(open(os.path.join(folder, "timing.json")))
            report = json.load(open(os.path.join(folder, "hang-report.json")))
            ok, _ = hang_cases.judge(report, hang_cases.CASES[name]["truth"])
            print("%-10s %-13s %8.2f s            %8.2f s" % (
                name, "yes" if ok else "NO",
                (t["detected_at_ns"] - t["threshold_at_ns"]) / 1e9,
                (t["report_at_ns"] - t["threshold_at_ns"]) / 1e9), flush=True)


if __name__ == "__main__":
    main()
