"""whyslow: which function, on which workers, slows a distributed PyTorch job, and why.

``import whyslow`` is all a training script needs under ``torchrun``: it reads
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/MASTER_PORT and TORCHELASTIC_RUN_ID,
hooks the DataLoader iterator's ``__next__`` and the optimizer step
(``torch.optim.optimizer.register_optimizer_step_post_hook``), and detects
slowdowns and stalls as PerfTracker §4.1 does. On a slowdown every rank
profiles the same iterations; rank 0 writes ``report.json`` and
``report.html`` into ``$WHYSLOW_REPORT_DIR/<job id>/<timestamp>-s<n>/``.

Offline and in notebooks, :func:`analyze` and :func:`diagnose` run the same
analysis as the ``whyslow`` command line and return typed results
(:class:`Report`, :class:`Diagnosis`: ``to_pandas()``, inline HTML).

Outside torchrun call :func:`init` yourself. Loops that use neither a
DataLoader nor an optimizer call :func:`step` once per iteration. Settings:
see :class:`whyslow._config.Config` (``WHYSLOW_*`` environment variables).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import Any, Optional

from ._config import Config

__all__ = ["init", "step", "trigger", "shutdown", "tracker", "Config", "__version__",
           "analyze", "diagnose", "hang", "suggest_fix", "Report", "Diagnosis", "Hang"]

# The offline analysis (whyslow.analysis), imported when first used: a
# training job that only does `import whyslow` does not load it.
_ANALYSIS = ("analyze", "diagnose", "hang", "suggest_fix", "Report", "Diagnosis", "Hang", "Culprit", "Finding",
             "Straggler")


def __getattr__(name: str) -> Any:
    if name in _ANALYSIS:
        from . import analysis

        return getattr(analysis, name)
    raise AttributeError("module 'whyslow' has no attribute %r" % name)

try:
    from ._whyslow import __version__
except ImportError:  # pragma: no cover - source tree without the extension
    __version__ = "0+unknown"

log = logging.getLogger("whyslow")
_tracker: Optional[Any] = None


def _setup_logging(level: str) -> None:
    if not log.handlers:
        h = logging.StreamHandler(sys.stderr)
        h.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(h)
        log.propagate = False
    log.setLevel(getattr(logging, level.upper(), logging.INFO))


def init(**config: Any) -> Optional[Any]:
    """Activates whyslow in this process (idempotent). Keyword arguments
    override ``WHYSLOW_*`` variables (names as in :class:`Config`, lowercase).
    Returns the tracker, or None when disabled or when activation failed
    (one log line; training is never affected)."""
    global _tracker
    if _tracker is not None:
        return _tracker
    try:
        cfg = Config.from_env(**config)
        _setup_logging(cfg.log_level)
        if cfg.disable:
            return None
        if cfg.flight_recorder:
            from ._hang import enable_flight_recorder

            enable_flight_recorder()
        from ._runtime import Tracker

        t = Tracker(cfg)
        t.install()
        _tracker = t
        atexit.register(t.shutdown)
        log.debug("whyslow: active on rank %d (job %s)", t.rank, cfg.job_id)
        return t
    except Exception as e:  # never harm training
        log.warning("whyslow: not activated: %s: %s", type(e).__name__, e)
        return None


def tracker() -> Optional[Any]:
    """The active tracker, if any."""
    return _tracker


def step() -> None:
    """Marks an iteration boundary, for loops with neither DataLoader nor
    optimizer (call it once per iteration)."""
    t = _tracker
    if t is not None:
        t.on_manual_step()


def trigger(reason: str = "on-demand (whyslow.trigger())") -> None:
    """Asks for a synchronized profiling window now (at the next poll)."""
    t = _tracker
    if t is not None and t.enabled:
        t.want = t.want or reason
        t.next_poll = 0


def shutdown() -> None:
    """Waits (bounded) for background work; called at exit automatically."""
    t = _tracker
    if t is not None:
        t.shutdown()


def _under_torchrun() -> bool:
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return False
    try:  # not in DataLoader workers or other multiprocessing children
        import multiprocessing

        return multiprocessing.parent_process() is None
    except Exception:
        return True


if os.environ.get("WHYSLOW_AUTO", "1").strip().lower() not in ("0", "false", "no", "off") and _under_torchrun():
    init()
