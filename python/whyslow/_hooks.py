"""Where whyslow sees the training loop (PerfTracker §4.1): the DataLoader
iterator's ``__next__`` (an iteration begins) and the optimizer step
post-hook (it ends), plus SIGUSR2 for on-demand windows. Each hook costs one
``perf_counter_ns`` and one call; the callbacks never raise (the tracker
guards them)."""

from __future__ import annotations

import logging
import signal as _signal
import threading
import time
from typing import Any

log = logging.getLogger("whyslow")
_now = time.perf_counter_ns


class Hooks:
    """Installs and removes the hooks of ``target`` (the tracker): while
    ``target.enabled``, ``target.on_next(t_ns)`` runs when a batch is fetched
    and ``target.on_step()`` after each optimizer step; ``target.on_signal()``
    on SIGUSR2. (An attribute read, not a callback, on the hot path.)"""

    def __init__(self, target: Any) -> None:
        self._target = target
        self._dl_orig: Any = None
        self._opt_handle: Any = None

    @property
    def installed(self) -> bool:
        return self._dl_orig is not None or self._opt_handle is not None

    def install(self, signal: bool) -> None:
        """Installs the torch hooks when torch is importable (``whyslow.step()``
        works without them) and, from the main thread, the SIGUSR2 handler
        when the signal has none."""
        try:
            import torch  # noqa: F401
            from torch.utils.data import dataloader as _dl

            base = _dl._BaseDataLoaderIter
            orig = base.__next__
            tracker = self._target

            def __next__(self: Any) -> Any:  # whyslow DataLoader hook
                t = _now()
                r = orig(self)
                if tracker.enabled:
                    tracker.on_next(t)
                return r

            __next__.__whyslow_orig__ = orig  # type: ignore[attr-defined]
            base.__next__ = __next__
            self._dl_orig = orig

            from torch.optim.optimizer import register_optimizer_step_post_hook

            def _post_step(optimizer: Any, args: Any, kwargs: Any) -> None:
                if tracker.enabled:
                    tracker.on_step()

            self._opt_handle = register_optimizer_step_post_hook(_post_step)
        except ImportError:
            log.debug("whyslow: torch not importable; only whyslow.step() feeds the detector")
        if signal and threading.current_thread() is threading.main_thread():
            try:
                sig = getattr(_signal, "SIGUSR2", None)
                if sig is not None and _signal.getsignal(sig) in (_signal.SIG_DFL, None):
                    target = self._target
                    _signal.signal(sig, lambda signum, frame: target.on_signal())
            except Exception:  # pragma: no cover - platform specific
                pass

    def uninstall(self) -> None:
        """Restores the DataLoader and removes the optimizer hook; never raises."""
        try:
            if self._dl_orig is not None:
                from torch.utils.data import dataloader as _dl

                _dl._BaseDataLoaderIter.__next__ = self._dl_orig
                self._dl_orig = None
            if self._opt_handle is not None:
                self._opt_handle.remove()
                self._opt_handle = None
        except Exception:
            pass
