"""The in-process part of whyslow: the tracker ties the hooks (``_hooks``),
the Rust detector, session agreement (``_session``), profiling windows
(``_window``) and the work after a window (``_collect``) together.

Design rules (issue 3, PerfTracker §4.1/§5, EROICA's production lessons):

* Hooks are cheap: one ``perf_counter_ns`` and one call into the Rust
  detector per event; the store is polled at most every ``poll_s`` seconds,
  with a non-blocking ``check``.
* Profiling starts and stops in the main thread at an iteration boundary
  (the optimizer step post-hook or ``whyslow.step()``), on every rank at the
  same target iteration agreed through the job's store.
* Summarization, collection and localization run in a background thread;
  the Rust calls release the GIL.
* Never harm training: every hook body is guarded; any failure logs one line
  and whyslow disables itself (hooks removed, profiler stopped). Every store
  wait has a deadline.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

from . import _collect, _faults, _hang, _whyslow
from ._config import Config
from ._hooks import Hooks
from ._session import JobStore, session_record
from ._window import ProfileWindow

log = logging.getLogger("whyslow")
_now = time.perf_counter_ns


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


class Tracker:
    """One per process. Created by ``whyslow.init``."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rank = _env_int("RANK", 0)
        self.local_rank = _env_int("LOCAL_RANK", 0)
        self.world_size = _env_int("WORLD_SIZE", 1)
        self.host = socket.gethostname()
        self.enabled = True
        self.det = _whyslow.Detector(
            m=cfg.m,
            n=cfg.n,
            threshold=cfg.threshold,
            block_factor=cfg.block_factor,
            k=cfg.k,
            recent=cfg.recent,
            baseline=cfg.baseline,
            block_min_s=cfg.block_min_s,
        )
        self.policy = _whyslow.TriggerPolicy(cfg.cooldown_s, cfg.max_per_hour)
        self.job_dir = os.path.join(cfg.report_dir, cfg.job_id)
        self.trigger_file = os.path.join(self.job_dir, "TRIGGER")
        self.jobstore = JobStore(cfg.job_id)
        self.hooks = Hooks(self)
        self.steps = 0  # step boundaries seen (optimizer steps + whyslow.step())
        self.next_poll = 0
        self.session = 0  # sessions seen (the next one is session + 1)
        self.pending: Optional[Dict[str, Any]] = None  # agreed, not started
        self.window: Optional[ProfileWindow] = None  # profiling now
        self.want: Optional[str] = None  # reason to propose a session
        self.signal_flag = False
        self.threads: List[threading.Thread] = []
        self.hang: Optional[Any] = None  # the hang gatherer, after a stall
        self.stats: Dict[str, Any] = {
            "triggers": 0,
            "sessions": 0,
            "polls": 0,
            "poll_ns": 0,
            "blocked": 0,
            "reports": [],
            "profile_s": [],
        }
        self._stop = threading.Event()
        # Set at exit: no hang gathering may start or go on (its store and
        # Flight Recorder calls must not race the interpreter's teardown).
        self._ending = threading.Event()
        self._watchdog: Optional[threading.Thread] = None
        self.registration: Optional[str] = None  # proc-<pid>.json in the agent's directory

    # ------------------------------------------------------------------ setup

    def install(self) -> None:
        """Installs the hooks, registers with the node agent (when one is
        configured: its always-on CPU profiles carry this rank's labels) and
        starts the watchdog."""
        self.hooks.install(signal=self.cfg.signal)
        if self.cfg.agent_dir:
            try:
                from ._agent import register

                self.registration = register(self.cfg.agent_dir, self.rank, self.local_rank,
                                             self.world_size, self.cfg.job_id, self.host)
            except Exception as e:  # the agent's profiles lose their labels, nothing else
                log.warning("whyslow: could not register with the agent in %s: %s",
                            self.cfg.agent_dir, e)
        self._watchdog = threading.Thread(
            target=self._watch, name="whyslow-watchdog", daemon=True
        )
        self._watchdog.start()

    def uninstall(self) -> None:
        self.hooks.uninstall()

    def disable(self, where: str, exc: BaseException) -> None:
        """One log line, then whyslow stops doing anything in this process."""
        if not self.enabled:
            return
        self.enabled = False
        log.warning(
            "whyslow: disabled on rank %d after an error in %s: %s: %s",
            self.rank,
            where,
            type(exc).__name__,
            exc,
        )
        self._stop.set()
        if threading.current_thread() is threading.main_thread():
            self._abort_window()
            self.uninstall()

    # ------------------------------------------------------------ hot path

    def on_next(self, t: int) -> None:
        try:
            self.det.next(t)
        except Exception as e:  # never harm training
            self.disable("the DataLoader hook", e)

    def on_step(self) -> None:
        try:
            t = _now()
            self.steps += 1
            if self.steps == 1 and self.cfg.ready_file:
                self._signal_ready()
            if self.det.step(t) == 2:
                self._on_slowdown(t)
            if self.window is not None:
                if self.window.tick(self.steps, t):
                    self._end_window()
            elif self.pending is not None and self.steps >= self.pending["target"]:
                self._start_window(t)
            if t >= self.next_poll:
                self.next_poll = t + int(self.cfg.poll_s * 1e9)
                self._poll(t)
        except Exception as e:  # never harm training
            self.disable("the step hook", e)

    def _signal_ready(self) -> None:
        """Creates ``ready_file`` (the job trains); never raises."""
        try:
            with open(self.cfg.ready_file, "a"):
                pass
        except OSError as e:
            log.warning("whyslow: cannot create the ready file %s: %s", self.cfg.ready_file, e)

    def on_manual_step(self) -> None:
        """``whyslow.step()``: ends one iteration and starts the next."""
        if not self.enabled:
            if self.hooks.installed:
                self.uninstall()
            return
        t = _now()
        try:
            self.det.next(t)
        except Exception as e:
            self.disable("whyslow.step", e)
            return
        self.on_step()

    # ------------------------------------------------------------ detection
    def _on_slowdown(self, t: int) -> None:
        if self.pending is not None or self.window is not None or self.want:
            return
        refusal = self.policy.check(t)
        if refusal is not None:
            return
        mean, base = self.det.last_slowdown
        self.want = "slowdown on rank %d at step %d: mean of last %d iterations %.1f ms > %.1f ms (+%.1f%%)" % (
            self.rank,
            self.steps,
            self.cfg.n,
            mean / 1e6,
            base / 1e6,
            100.0 * (mean / base - 1.0) if base else float("inf"),
        )
        self.stats["triggers"] += 1
        # Propose right away rather than at the next poll.
        self.next_poll = 0

    def on_signal(self) -> None:
        """SIGUSR2: asks for a window at the next poll."""
        self.signal_flag = True

    def _watch(self) -> None:
        """Watchdog thread: §4.1 (2) blocked detection, once a second."""
        while not self._stop.wait(1.0):
            try:
                if self.window is not None:
                    continue  # our own window stalls ranks on purpose
                # (A session proposed and not yet started does not: a hang
                # before its target step is still a hang.)
                b = self.det.check_blocked(_now())
                if b is not None:
                    self._report_blocked(*b)
            except Exception as e:
                self.disable("the watchdog", e)
                return

    def _report_blocked(self, idle_ns: int, mean_ns: float) -> None:
        self.stats["blocked"] += 1
        now = time.time_ns()
        wait_ns = max(self.cfg.block_factor * mean_ns, self.cfg.block_min_s * 1e9)
        steps = self.steps
        gatherer = _hang.HangGatherer(
            self.cfg, self.jobstore, self.rank, self.world_size, self.job_dir,
            detected_at_ns=now, threshold_at_ns=int(now - idle_ns + wait_ns), stop=self._ending,
            still_blocked=lambda: self.steps == steps and self.enabled,
        )
        th = threading.Thread(target=gatherer.run, name="whyslow-hang", daemon=True)
        gatherer.thread = th
        th.start()
        self.hang = gatherer
        frames = sys._current_frames()
        main = threading.main_thread().ident
        lines = []
        for ident, frame in frames.items():
            name = "main" if ident == main else str(ident)
            lines.append("--- thread %s\n%s" % (name, "".join(traceback.format_stack(frame))))
        text = "\n".join(lines)
        path = ""
        try:
            os.makedirs(self.job_dir, exist_ok=True)
            path = os.path.join(
                self.job_dir,
                "blocked-rank%d-%s.txt" % (self.rank, time.strftime("%Y%m%d-%H%M%S")),
            )
            with open(path, "w") as f:
                f.write(text)
        except OSError:
            path = "(not written)"
        where = ""
        if main in frames:
            st = traceback.extract_stack(frames[main])
            if st:
                where = " in %s (%s:%d)" % (st[-1].name, st[-1].filename, st[-1].lineno)
        log.warning(
            "whyslow: rank %d blocked: no iteration event for %.1f s (%.0f× the %.1f ms mean iteration)%s; stacks: %s",
            self.rank,
            idle_ns / 1e9,
            idle_ns / mean_ns if mean_ns else 0,
            mean_ns / 1e6,
            where,
            path,
        )

    # ------------------------------------------------------------ coordination

    def _poll(self, t: int) -> None:
        t0 = _now()
        # On-demand triggers: SIGUSR2, or the TRIGGER file.
        if self.signal_flag:
            self.signal_flag = False
            self.want = self.want or "on-demand (SIGUSR2 on rank %d)" % self.rank
        elif self.pending is None and self.window is None and os.path.exists(self.trigger_file):
            try:
                os.remove(self.trigger_file)
                self.want = self.want or "on-demand (%s)" % self.trigger_file
            except FileNotFoundError:
                pass  # another rank took it
        if self.jobstore.connect() is not None:
            self.rank = self.jobstore.rank if self.jobstore.rank is not None else self.rank
            self.world_size = self.jobstore.world_size or self.world_size
            _faults.point("store", self.rank)
        if self.pending is None and self.window is None:
            nxt = self.session + 1
            published = self.jobstore.published(nxt)
            if published is not None:
                self._accept(published)
            elif self.want:
                self._propose(nxt, t)
        self.stats["polls"] += 1
        self.stats["poll_ns"] += _now() - t0

    def _propose(self, nxt: int, t: int) -> None:
        # The last iteration is the better guess right after a slowdown.
        mean = self.det.mean_ns or 0.0
        slow = max(mean, float(self.det.last_duration_ns or 0))
        lead = max(3, int(self.cfg.lead_s * 1e9 / slow) + 1) if slow > 0 else 10
        if self.cfg.window_iters > 0:
            iters = self.cfg.window_iters
        else:
            iters = max(3, int(self.cfg.window_s * 1e9 / mean) + 1) if mean > 0 else 20
        proposal = session_record(
            session=nxt,
            target=self.steps + lead,
            iters=iters,
            window_s=0.0 if self.cfg.window_iters > 0 else self.cfg.window_s,
            reason=self.want or "",
            proposer=self.rank,
            world_size=self.world_size,
        )
        self.want = None
        self._accept(self.jobstore.propose(proposal))

    def _accept(self, session: Dict[str, Any]) -> None:
        self.session = session["session"]
        self.policy.record(_now())
        # This session answers any detection of ours made before it started.
        self.want = None
        self.pending = session
        if session["target"] <= self.steps:
            log.warning(
                "whyslow: rank %d saw session %d late (step %d > target %d); profiling now",
                self.rank,
                self.session,
                self.steps,
                session["target"],
            )
        if self.rank == 0:
            log.info(
                "whyslow: profiling all ranks from step %d for %d iterations: %s",
                session["target"],
                session["iters"],
                session["reason"],
            )

    # ------------------------------------------------------------ windows

    def _session_dir(self, s: Dict[str, Any]) -> str:
        return os.path.join(self.job_dir, s["stamp"] + "-s%d" % s["session"])

    def _start_window(self, t: int) -> None:
        s = self.pending
        assert s is not None
        self.pending = None
        self.det.pause()
        window = ProfileWindow(self.cfg, s, self.rank, self.steps, t)
        try:
            window.start()
        except BaseException:
            window.abort()
            self.det.resume(_now())
            raise
        self.window = window

    def _end_window(self) -> None:
        window = self.window
        assert window is not None
        self.window = None
        s = window.session
        t_stop = _now()
        sdir = self._session_dir(s)
        trace = os.path.join(sdir, "traces", "rank-%d.json" % self.rank)
        try:
            sampler = window.finish(trace)
        finally:
            self.det.resume(_now())
        t_done = _now()
        self.stats["sessions"] += 1
        self.stats["profile_s"].append(
            {
                "window_s": (t_stop - window.t0) / 1e9,
                "export_s": (t_done - t_stop) / 1e9,
                "iters": self.steps - window.start_step,
            }
        )
        th = threading.Thread(
            target=self._after_window,
            args=(s, sdir, trace, sampler, window.network),
            name="whyslow-summarize",
            daemon=True,
        )
        th.start()
        self.threads.append(th)

    def _abort_window(self) -> None:
        window = self.window
        self.window = None
        if window is not None:
            window.abort()

    # ------------------------------------------------------------ background

    def _after_window(self, s: Dict[str, Any], sdir: str, trace: str, sampler: Any = None,
                      network: Optional[str] = None) -> None:
        """Background thread: summarize, publish, (rank 0) collect and localize."""
        try:
            fp_json = _collect.summarize(self.cfg, self.rank, self.host, trace, sampler,
                                         os.path.join(sdir, "fingerprints"))
            fp_json = _collect.annotate(
                fp_json, network, self.host,
                os.path.join(sdir, "fingerprints", "rank-%d.json" % self.rank))
            _faults.point("after_summarize", self.rank)
            if self.cfg.server:
                _collect.upload(self.cfg, sdir, fp_json, self.rank)
            self.jobstore.publish_fingerprint(s["session"], self.rank, fp_json)
            if self.rank == 0:
                world = int(s.get("world_size") or self.world_size)
                _collect.collect_and_localize(self.cfg, self.jobstore, s, sdir, fp_json, world,
                                              self._stop, self.det.history())
                self.stats["reports"].append(sdir)
        except Exception as e:
            self.disable("the background summarizer", e)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for background work (at exit), at most ``timeout`` seconds."""
        deadline = time.monotonic() + (self.cfg.exit_wait_s if timeout is None else timeout)
        for th in list(self.threads):
            th.join(max(0.0, deadline - time.monotonic()))

    def shutdown(self) -> None:
        # First: a hang gather still waiting stops before the teardown.
        self._ending.set()
        hang = self.hang
        if hang is not None and hang.thread is not None:
            hang.thread.join(3.0)
        try:
            if self.window is not None and self.enabled:
                # The job ended inside a window: keep what was profiled.
                try:
                    self._end_window()
                except Exception as e:
                    self.disable("the final window", e)
            elif self.window is not None:
                self._abort_window()
            self.wait()
        except Exception:
            pass
        if self.registration:
            from ._agent import unregister

            unregister(self.registration)
            self.registration = None
        self._stop.set()
