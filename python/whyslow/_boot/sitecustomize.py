"""Imported by Python at start-up when whyslow-run put this directory on
PYTHONPATH: imports whyslow (which activates only in torchrun workers), then
runs any other sitecustomize that this one shadows."""

import importlib.util
import os
import sys

try:
    import whyslow  # noqa: F401
except Exception as e:  # never harm the job
    sys.stderr.write("whyslow: not activated: %s\n" % e)

_here = os.path.dirname(os.path.abspath(__file__))
for _p in sys.path:
    if not _p or os.path.abspath(_p) == _here:
        continue
    _f = os.path.join(_p, "sitecustomize.py")
    if os.path.isfile(_f):
        _spec = importlib.util.spec_from_file_location("_whyslow_chained_sitecustomize", _f)
        if _spec and _spec.loader:
            try:
                _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
            except Exception as e:
                sys.stderr.write("whyslow: chained sitecustomize failed: %s\n" % e)
        break
