"""``python -m whyslow …`` (and the ``whyslow`` command the wheel installs):
the whyslow command line, run in this process by the compiled extension.

* ``python -m whyslow analyze TRACES/`` (and ``summarize``, ``localize``,
  ``flows``, ``sample``, ``agent``): exactly the ``whyslow`` binary; see
  ``python -m whyslow --help``.
* ``python -m whyslow analyze --dask local:4|tcp://HOST:8786 SOURCES…``:
  ``summarize`` fanned out on Dask, over local paths or any fsspec URL
  (``s3://…``), localization here (``whyslow.distributed``).
* ``python -m whyslow trigger [--report-dir DIR] [--job ID]``: asks a running
  job for a synchronized profiling window now, by creating
  ``$WHYSLOW_REPORT_DIR/<job id>/TRIGGER`` (every rank polls for it every
  WHYSLOW_POLL_S seconds; the first to see it removes it). ``kill -USR2 <pid>``
  of any worker does the same.
"""

import argparse
import os
import sys
from typing import List, Optional


def trigger(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m whyslow trigger")
    ap.add_argument("--report-dir", default=os.environ.get("WHYSLOW_REPORT_DIR", "./whyslow-reports"))
    ap.add_argument("--job", default=os.environ.get("WHYSLOW_JOB_ID") or os.environ.get("TORCHELASTIC_RUN_ID") or "local")
    a = ap.parse_args(argv)
    d = os.path.join(a.report_dir, a.job)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "TRIGGER")
    with open(path, "w") as f:
        f.write("requested\n")
    print("whyslow: requested a profiling window: %s" % path)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "trigger":
        return trigger(args[1:])
    if args and args[0] == "analyze" and any(a == "--dask" or a.startswith("--dask=") for a in args):
        from .distributed import main as distributed_main
        return distributed_main(args)
    try:
        from ._whyslow import cli_main
    except ImportError as e:  # a source tree without the compiled extension
        print("whyslow: the compiled extension is missing (%s); install the package "
              "(pip install .) or use the cargo-built binary" % e, file=sys.stderr)
        return 1
    sys.stdout.flush()
    code = cli_main(args)
    if args in ([], ["-h"], ["--help"], ["help"]):
        print("\nAlso: python -m whyslow trigger [--report-dir DIR] [--job ID]   "
              "(ask a running job for a profiling window now)\n"
              "      python -m whyslow analyze --dask local:N|tcp://HOST:8786 SOURCES…   "
              "(summarize on Dask, from paths or s3:// URLs; localize here)")
    return code


def _main_quiet_on_closed_pipe() -> int:
    """``whyslow --help | head``: a reader that stops early is not an error
    (as in the Rust binary): no traceback."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at nothing first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(_main_quiet_on_closed_pipe())
