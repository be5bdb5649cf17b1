"""``python -m whyslow trigger [--report-dir DIR] [--job ID]``: asks a running
job for a synchronized profiling window now, by creating
``$WHYSLOW_REPORT_DIR/<job id>/TRIGGER`` (every rank polls for it every
WHYSLOW_POLL_S seconds; the first to see it removes it). ``kill -USR2 <pid>``
of any worker does the same."""

import argparse
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m whyslow")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trigger", help="ask a running job for a profiling window now")
    t.add_argument("--report-dir", default=os.environ.get("WHYSLOW_REPORT_DIR", "./whyslow-reports"))
    t.add_argument("--job", default=os.environ.get("WHYSLOW_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or "local")
    a = ap.parse_args()
    d = os.path.join(a.report_dir, a.job)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "TRIGGER")
    with open(path, "w") as f:
        f.write("requested\n")
    print("whyslow: requested a profiling window: %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
