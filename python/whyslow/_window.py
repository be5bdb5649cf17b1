"""One profiling window on one rank (PerfTracker §4.2): torch.profiler over
whole iterations, started and stopped in the main thread at an iteration
boundary, with the utilization sampler (in-process, or the privileged
``whyslow agent``) beside it. No profiler state may stay behind (§5)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Dict, List, Optional

from . import _faults, _whyslow
from ._config import Config

log = logging.getLogger("whyslow")


def _record_always(step: int) -> "Any":
    """torch.profiler schedule: record every step (see ``ProfileWindow.start``)."""
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


def _rss_mb() -> float:
    """This process's resident memory, MB (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


class ProfileWindow:
    """The window of session record ``session`` on ``rank``, from iteration
    ``start_step`` at ``t0`` (ns)."""

    def __init__(self, cfg: Config, session: Dict[str, Any], rank: int, start_step: int,
                 t0: int) -> None:
        self.cfg = cfg
        self.session = session
        self.rank = rank
        self.start_step = start_step
        self.t0 = t0
        self.prof: Any = None
        self.sampler: Any = None
        self._sys_profile_before = sys.getprofile()
        # torch.profiler keeps every event of the window, with its stack, in
        # memory: a long window of a slowed job once grew a rank to 5.7 GB
        # (OOM-killed). The window ends early past WHYSLOW_WINDOW_MAX_MB.
        self.rss0_mb = _rss_mb()
        self.ended_for_memory: Optional[float] = None

    def start(self) -> None:
        """Starts the profiler (raises on failure, nothing left running) and
        the sampler (failures only log)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        cuda = self.cfg.cuda
        if cuda == "1" or (cuda == "auto" and torch.cuda.is_available()):
            acts.append(ProfilerActivity.CUDA)
        _faults.point("profiler_start", self.rank)
        # A schedule that always records makes the profiler mark each
        # iteration (ProfilerStep#N, N = the training loop's step), so the
        # window is whole iterations and the report can plot them.
        prof = profile(activities=acts, with_stack=True, record_shapes=False,
                       schedule=_record_always)
        if hasattr(prof, "step_num"):
            prof.step_num = self.start_step
        prof.start()
        self.prof = prof
        self.sampler = self._start_sampler()

    def tick(self, steps: int, t: int) -> bool:
        """One iteration ended; True when the window is over (``iters``
        iterations or ``window_s`` seconds, whichever comes first: ranks run
        in lockstep, so they end within an iteration of each other)."""
        s = self.session
        limit_ns = s["window_s"] * 1e9 if s.get("window_s") else float("inf")
        if steps - self.start_step >= s["iters"] or (t - self.t0) >= limit_ns:
            return True
        cap = self.cfg.window_max_mb
        if cap and cap > 0 and (steps - self.start_step) % 4 == 0:
            grown = _rss_mb() - self.rss0_mb
            if grown > cap:
                self.ended_for_memory = grown
                log.warning("whyslow: rank %d: profiling window ended after %d iterations: memory "
                            "grew by %.0f MB (WHYSLOW_WINDOW_MAX_MB=%g)", self.rank,
                            steps - self.start_step, grown, cap)
                return True
        self.prof.step()
        return False

    def finish(self, trace: str) -> Any:
        """Stops sampler and profiler and exports the trace to ``trace``;
        returns the stopped sampler (its samples are written later) or None."""
        sampler = self._stop_sampler()
        prof = self.prof
        self.prof = None
        try:
            prof.stop()
            os.makedirs(os.path.dirname(trace), exist_ok=True)
            prof.export_chrome_trace(trace)
        finally:
            del prof
            self._restore_profile_hooks()
        return sampler

    def abort(self) -> None:
        """Stops everything, quietly (whyslow is being disabled)."""
        self._stop_sampler()
        prof = self.prof
        self.prof = None
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass

    def _restore_profile_hooks(self) -> None:
        before = self._sys_profile_before
        if sys.getprofile() is not before:
            sys.setprofile(before)
            threading.setprofile(before)  # type: ignore[arg-type]
        try:
            import torch.autograd.profiler as ap

            if ap._is_profiler_enabled:  # pragma: no cover - defensive
                log.warning("whyslow: profiler still enabled after stop")
        except Exception:
            pass

    def _sample_ifaces(self) -> List[str]:
        """WHYSLOW_SAMPLE_IFACES as a list (``name`` or ``name:mbit``)."""
        return [i.strip() for i in str(self.cfg.sample_ifaces).split(",") if i.strip()]

    def _start_sampler(self) -> Optional[Any]:
        """Utilization sampling over the window (issue 4); failures only log."""
        hz = self.cfg.sample_hz
        if self.cfg.agent_dir:
            # The privileged `whyslow agent` samples us (docs/agent.md).
            try:
                from ._agent import AgentWindow

                s = self.session
                return AgentWindow(
                    self.cfg.agent_dir, self.rank, os.getpid(),
                    threading.main_thread().native_id, float(hz) if hz and hz > 0 else 1000.0,
                    self._sample_ifaces(),
                    float(s.get("window_s") or 0.0), s.get("session"),
                )
            except Exception as e:
                log.warning("whyslow: sampling request to the agent failed, continuing without samples: %s", e)
                return None
        if not hz or hz <= 0:
            return None
        try:
            _faults.point("sampler_start", self.rank)
            return _whyslow.Sampler.start(
                float(hz),
                pid=os.getpid(),
                tid=threading.main_thread().native_id,
                interfaces=self._sample_ifaces(),
            )
        except Exception as e:
            log.warning("whyslow: utilization sampler not started, continuing without samples: %s", e)
            return None

    def _stop_sampler(self) -> Any:
        sampler = self.sampler
        self.sampler = None
        if sampler is None:
            return None
        try:
            sampler.stop()  # AgentWindow: writes the stop file
            return sampler
        except Exception as e:
            log.warning("whyslow: utilization sampler failed, continuing without samples: %s", e)
            return None
