"""One profiling window on one rank (PerfTracker §4.2): torch.profiler over
whole iterations, started and stopped in the main thread at an iteration
boundary, with the utilization sampler (in-process, or the privileged
``whyslow agent``) beside it. No profiler state may stay behind (§5)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
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


#: Longest wait for the process's other threads to go idle before the
#: profiler starts or stops (see :func:`_wait_for_idle_threads`).
IDLE_WAIT_S = 0.2


def _runnable_threads() -> List[int]:
    """The threads of this process other than the caller that are running or
    runnable (state R in /proc/self/task/*/stat); [] where /proc cannot tell."""
    me = threading.get_native_id()
    busy = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return busy
    for tid in tids:
        try:
            if int(tid) == me:
                continue
            with open("/proc/self/task/%s/stat" % tid) as f:
                stat = f.read()
            state = stat[stat.rindex(")") + 2:].split(" ", 1)[0]
        except (OSError, ValueError):
            continue  # the thread ended
        if state == "R":
            busy.append(int(tid))
    return busy


def _wait_for_idle_threads(max_wait_s: float = IDLE_WAIT_S) -> int:
    """Waits (≤ ``max_wait_s``) until no other thread of the process is
    running; returns how many 1 ms waits it took.

    torch.profiler's Python tracer (``with_stack=True``) sets the profile
    function of every Python thread state when it starts and stops, walking
    the interpreter's thread list without its head lock. A native thread that
    creates a thread state at that moment is linked into the list before it
    is initialized, and the tracer dereferences it: SIGSEGV. Gloo's worker
    threads do exactly that right after a collective: freeing a finished
    work's captured thread-local state takes the GIL through pybind11, which
    creates a thread state for the thread (seen in a core dump of a rank
    killed at its window's start: the main thread in
    ``PythonTracer::setprofileAllThreads``, a ``ProcessGroupGloo::runLoop``
    thread in ``PyThreadState_New``). The window starts and ends in the
    training thread's optimizer-step hook, just after backward's all-reduces
    completed, so those threads are often still at it. While the training
    thread is in the hook it issues no collective, so once gloo's threads are
    idle they stay idle until the profiler has started or stopped."""
    deadline = time.monotonic() + max_wait_s
    waits = 0
    while _runnable_threads() and time.monotonic() < deadline:
        time.sleep(0.001)
        waits += 1
    return waits


def _start_network(rank: int) -> Any:
    """Starts reading this rank's network (TCP counters of its namespace,
    its own connections' tcp_info); None, with one log line, where it
    cannot: the window goes on without it."""
    try:
        from . import _whyslow

        return _whyslow.NetWatch()
    except Exception as e:
        log.info("whyslow: rank %d: no network evidence this window: %s", rank, e)
        return None


def _stop_network(net: Any, rank: int) -> Optional[str]:
    if net is None:
        return None
    try:
        return net.sample()
    except Exception as e:
        log.info("whyslow: rank %d: no network evidence this window: %s", rank, e)
        return None


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
        # The rank's TCP counters and connections over the window (the
        # network layer without an agent; issue 29), as JSON at the end.
        self.net: Any = None
        self.network: Optional[str] = None

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
        # The sampler's and the network watch's start stays outside the
        # trace, or the report names it: on an H100 the network watch's
        # start came as 2.3 % of a 1 s window on every rank.
        self.sampler = self._start_sampler()
        self.net = _start_network(self.rank)
        try:
            _wait_for_idle_threads()
            prof.start()
        except BaseException:
            self._stop_sampler()
            _stop_network(self.net, self.rank)
            self.net = None
            raise
        self.prof = prof

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
        # The sampler stops within a tick (~1 ms) and the network's last
        # reading takes a few: cheap enough inside the trace, and the
        # samples then end with it (prof.stop() takes seconds to process).
        sampler = self._stop_sampler()
        self.network = _stop_network(self.net, self.rank)
        self.net = None
        prof = self.prof
        self.prof = None
        try:
            _wait_for_idle_threads()
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
                _wait_for_idle_threads()
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
