"""Zero-code launcher: ``whyslow-run torchrun --nproc-per-node 4 train.py`` or
``python -m whyslow.run torchrun … train.py``.

Runs the command with ``whyslow/_boot`` prepended to PYTHONPATH; its
``sitecustomize`` imports whyslow in every Python process the command starts,
and whyslow activates itself in the torchrun workers (processes with RANK,
WORLD_SIZE and LOCAL_RANK set). An existing ``sitecustomize`` still runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional

USAGE = "usage: whyslow-run COMMAND [ARGS...]   e.g. whyslow-run torchrun --nproc-per-node 4 train.py"


def boot_dir() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    env = dict(os.environ)
    pp = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = boot_dir() + (os.pathsep + pp if pp else "")
    env.setdefault("WHYSLOW_AUTO", "1")
    try:
        return subprocess.call(args, env=env)
    except FileNotFoundError:
        print("whyslow-run: command not found: %s" % args[0], file=sys.stderr)
        return 127
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
