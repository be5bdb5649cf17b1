"""examples/train.py with one whyslow failure injected (test_safety.py).

WHYSLOW_TEST_FAULT names the failure: ``raise_<point>`` (every rank),
``raise_<point>_rank<r>`` (one rank) or ``die_rank0_<point>`` (rank 0 exits
with status 17); the points are ``whyslow._faults.POINTS``. The hook goes in
through the runtime's test seam, so the shipped package reads no test
setting."""

import os
import re
import runpy
import sys

from whyslow import _faults

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "..", "examples", "train.py")
SPEC = os.environ.get("WHYSLOW_TEST_FAULT", "")


def _inject(where, rank):
    if SPEC == "die_rank0_" + where and rank == 0:
        os._exit(17)
    if SPEC in ("raise_" + where, "raise_%s_rank%d" % (where, rank)):
        raise RuntimeError("injected test fault at " + where)


if SPEC:
    m = re.fullmatch(r"(?:die_rank0_|raise_)(\w+?)(?:_rank\d+)?", SPEC)
    point = m.group(1) if m else None
    if point not in _faults.POINTS:
        sys.exit("faulty_train.py: unknown fault point in WHYSLOW_TEST_FAULT=%r" % SPEC)
    _faults.set_hook(_inject)
sys.argv[0] = TRAIN
runpy.run_path(TRAIN, run_name="__main__")
