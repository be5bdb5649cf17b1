"""The in-process part of whyslow: hooks, detector, synchronized profiling,
summarization off the critical path, collection and localization on rank 0.

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

import json
import logging
import os
import shutil
import signal as _signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

from . import _whyslow
from ._config import Config

log = logging.getLogger("whyslow")
_now = time.perf_counter_ns


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def _record_always(step: int) -> "Any":
    """torch.profiler schedule: record every step (see ``_start_profile``)."""
    from torch.profiler import ProfilerAction

    return ProfilerAction.RECORD


class _Disabled(Exception):
    pass


def session_record(session: int, target: int, iters: int, window_s: float, reason: str,
                   proposer: int, world_size: int) -> Dict[str, Any]:
    """The session record ranks agree on through the store
    (``whyslow_model::wire::SessionRecord``: the same fields, checked by
    Rust when read back, see ``read_session``)."""
    return {
        "session": int(session),
        "target": int(target),
        "iters": int(iters),
        "window_s": float(window_s),
        "stamp": time.strftime("%Y%m%d-%H%M%S"),
        "reason": str(reason),
        "proposer": int(proposer),
        "world_size": int(world_size),
    }


def read_session(raw: Any) -> Dict[str, Any]:
    """A session record from the store, parsed and checked by whyslow's Rust
    side (``SessionRecord::from_json``); ValueError names a bad field."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return json.loads(_whyslow.parse_wire("session", text))


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
        self.ns = "whyslow/%s" % cfg.job_id
        self.steps = 0  # step boundaries seen (optimizer steps + whyslow.step())
        self.next_poll = 0
        self.session = 0  # sessions seen (the next one is session + 1)
        self.pending: Optional[Dict[str, Any]] = None  # agreed, not started
        self.prof: Any = None
        self.sampler: Any = None  # _whyslow.Sampler during a window
        self.prof_info: Optional[Dict[str, Any]] = None
        self.want: Optional[str] = None  # reason to propose a session
        self.signal_flag = False
        self.store: Any = None
        self.store_checked = False
        self.threads: List[threading.Thread] = []
        self.stats: Dict[str, Any] = {
            "triggers": 0,
            "sessions": 0,
            "polls": 0,
            "poll_ns": 0,
            "blocked": 0,
            "reports": [],
            "profile_s": [],
        }
        self._dl_orig: Any = None
        self._opt_handle: Any = None
        self._stop = threading.Event()
        self._watchdog: Optional[threading.Thread] = None

    # ------------------------------------------------------------------ setup

    def install(self) -> None:
        """Installs the hooks when torch is importable; ``whyslow.step()``
        works without them."""
        try:
            import torch  # noqa: F401
            from torch.utils.data import dataloader as _dl

            base = _dl._BaseDataLoaderIter
            orig = base.__next__
            tracker = self

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
        if self.cfg.signal and threading.current_thread() is threading.main_thread():
            try:
                sig = getattr(_signal, "SIGUSR2", None)
                if sig is not None and _signal.getsignal(sig) in (_signal.SIG_DFL, None):
                    _signal.signal(sig, self._on_signal)
            except Exception:  # pragma: no cover - platform specific
                pass
        self._watchdog = threading.Thread(
            target=self._watch, name="whyslow-watchdog", daemon=True
        )
        self._watchdog.start()

    def uninstall(self) -> None:
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
            self._stop_profiler_quietly()
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
            if self.prof is not None:
                self._profile_tick(t)
            elif self.pending is not None and self.steps >= self.pending["target"]:
                self._start_profile(t)
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
            if self._dl_orig is not None or self._opt_handle is not None:
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
        if self.pending is not None or self.prof is not None or self.want:
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

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signal_flag = True

    def _watch(self) -> None:
        """Watchdog thread: §4.1 (2) blocked detection, once a second."""
        while not self._stop.wait(1.0):
            try:
                if self.pending is not None or self.prof is not None:
                    continue  # our own window stalls ranks on purpose
                b = self.det.check_blocked(_now())
                if b is not None:
                    self._report_blocked(*b)
            except Exception as e:
                self.disable("the watchdog", e)
                return

    def _report_blocked(self, idle_ns: int, mean_ns: float) -> None:
        self.stats["blocked"] += 1
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

    def _get_store(self) -> Any:
        """The job's default store when a process group exists, else None."""
        if self.store is not None:
            return self.store
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                from torch.distributed import distributed_c10d as c10d

                self.store = c10d._get_default_store()
                self.world_size = dist.get_world_size()
                self.rank = dist.get_rank()
        except ImportError:
            pass
        return self.store

    def _key(self, *parts: Any) -> str:
        return "/".join([self.ns] + [str(p) for p in parts])

    def _poll(self, t: int) -> None:
        t0 = _now()
        # On-demand triggers: SIGUSR2, or the TRIGGER file.
        if self.signal_flag:
            self.signal_flag = False
            self.want = self.want or "on-demand (SIGUSR2 on rank %d)" % self.rank
        elif self.pending is None and self.prof is None and os.path.exists(self.trigger_file):
            try:
                os.remove(self.trigger_file)
                self.want = self.want or "on-demand (%s)" % self.trigger_file
            except FileNotFoundError:
                pass  # another rank took it
        store = self._get_store()
        if store is not None:
            _test_fault("store", self.rank)
        if self.pending is None and self.prof is None:
            nxt = self.session + 1
            if store is not None and store.check([self._key("s%d" % nxt, "session")]):
                self._accept(read_session(store.get(self._key("s%d" % nxt, "session"))))
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
        store = self._get_store()
        if store is not None:
            key = self._key("s%d" % nxt, "session")
            proposal = read_session(store.compare_set(key, "", json.dumps(proposal)))
        self.want = None
        self._accept(proposal)

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

    # ------------------------------------------------------------ profiling

    def _session_dir(self, s: Dict[str, Any]) -> str:
        return os.path.join(self.job_dir, s["stamp"] + "-s%d" % s["session"])

    def _start_profile(self, t: int) -> None:
        s = self.pending
        assert s is not None
        self.pending = None
        import torch
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU]
        use_cuda = self.cfg.cuda == "1" or (self.cfg.cuda == "auto" and torch.cuda.is_available())
        if use_cuda:
            acts.append(ProfilerActivity.CUDA)
        self.det.pause()
        self.prof_info = {
            "session": s,
            "start_step": self.steps,
            "t0": t,
            "sys_profile_before": sys.getprofile(),
        }
        try:
            _test_fault("profiler_start", self.rank)
            # A schedule that always records makes the profiler mark each
            # iteration (ProfilerStep#N, N = the training loop's step), so
            # the window is whole iterations and the report can plot them.
            prof = profile(activities=acts, with_stack=True, record_shapes=False,
                           schedule=_record_always)
            if hasattr(prof, "step_num"):
                prof.step_num = self.steps
            prof.start()
        except BaseException:
            self.det.resume(_now())
            self.prof_info = None
            raise
        self.prof = prof
        self._start_sampler()

    def _sample_ifaces(self) -> List[str]:
        """WHYSLOW_SAMPLE_IFACES as a list (``name`` or ``name:mbit``)."""
        return [i.strip() for i in str(self.cfg.sample_ifaces).split(",") if i.strip()]

    def _start_sampler(self) -> None:
        """Utilization sampling over the window (issue 4); failures only log."""
        self.sampler = None
        hz = self.cfg.sample_hz
        if self.cfg.agent_dir:
            # The privileged `whyslow agent` samples us (docs/agent.md).
            try:
                from ._agent import AgentWindow

                s = (self.prof_info or {}).get("session") or {}
                self.sampler = AgentWindow(
                    self.cfg.agent_dir, self.rank, os.getpid(),
                    threading.main_thread().native_id, float(hz) if hz and hz > 0 else 1000.0,
                    self._sample_ifaces(),
                    float(s.get("window_s") or 0.0), s.get("session"),
                )
            except Exception as e:
                self.sampler = None
                log.warning("whyslow: sampling request to the agent failed, continuing without samples: %s", e)
            return
        if not hz or hz <= 0:
            return
        try:
            _test_fault("sampler_start", self.rank)
            ifaces = self._sample_ifaces()
            self.sampler = _whyslow.Sampler.start(
                float(hz),
                pid=os.getpid(),
                tid=threading.main_thread().native_id,
                interfaces=ifaces,
            )
        except Exception as e:
            self.sampler = None
            log.warning("whyslow: utilization sampler not started, continuing without samples: %s", e)

    def _stop_sampler(self) -> Any:
        """Stops the window's sampler; returns it (to write later) or None."""
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

    def _profile_tick(self, t: int) -> None:
        info = self.prof_info
        assert info is not None
        done = self.steps - info["start_step"]
        s = info["session"]
        # The window ends after `iters` iterations or `window_s` seconds,
        # whichever comes first (ranks run in lockstep, so they end within
        # an iteration of each other).
        limit_ns = s["window_s"] * 1e9 if s.get("window_s") else float("inf")
        if done >= s["iters"] or (t - info["t0"]) >= limit_ns:
            self._stop_profile()
        else:
            self.prof.step()

    def _stop_profile(self) -> None:
        info = self.prof_info
        prof = self.prof
        self.prof = None
        self.prof_info = None
        assert info is not None
        s = info["session"]
        t_stop = _now()
        sdir = self._session_dir(s)
        tdir = os.path.join(sdir, "traces")
        trace = os.path.join(tdir, "rank-%d.json" % self.rank)
        sampler = self._stop_sampler()
        try:
            prof.stop()
            os.makedirs(tdir, exist_ok=True)
            prof.export_chrome_trace(trace)
        finally:
            del prof
            self._cleanup_profiler_state(info)
            self.det.resume(_now())
        t_done = _now()
        self.stats["sessions"] += 1
        self.stats["profile_s"].append(
            {
                "window_s": (t_stop - info["t0"]) / 1e9,
                "export_s": (t_done - t_stop) / 1e9,
                "iters": self.steps - info["start_step"],
            }
        )
        th = threading.Thread(
            target=self._after_window,
            args=(s, sdir, trace, sampler),
            name="whyslow-summarize",
            daemon=True,
        )
        th.start()
        self.threads.append(th)

    def _cleanup_profiler_state(self, info: Dict[str, Any]) -> None:
        """PerfTracker §5 / EROICA: no profiler state may stay behind."""
        before = info.get("sys_profile_before")
        if sys.getprofile() is not before:
            sys.setprofile(before)
            threading.setprofile(before)  # type: ignore[arg-type]
        try:
            import torch.autograd.profiler as ap

            if ap._is_profiler_enabled:  # pragma: no cover - defensive
                log.warning("whyslow: profiler still enabled after stop")
        except Exception:
            pass

    def _stop_profiler_quietly(self) -> None:
        self._stop_sampler()
        prof = self.prof
        self.prof = None
        self.prof_info = None
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass

    # ------------------------------------------------------------ background

    def _write_samples(self, sampler: Any, trace: str) -> Optional[str]:
        """Writes the window's samples next to the trace, on the trace's time
        origin (newer Kineto: ``ts`` relative to ``baseTimeNanoseconds``,
        which whyslow-ingest keeps; older: Unix epoch). None on failure."""
        path = os.path.join(os.path.dirname(trace), "rank-%d.samples.csv" % self.rank)
        try:
            _test_fault("sampler_write", self.rank)
            base = _whyslow.kineto_base_ns(trace) or 0
            if hasattr(sampler, "collect"):  # an AgentWindow: the agent's samples
                info = sampler.collect(path, base)
                if not info.get("rows"):
                    raise RuntimeError("agent recorded nothing: %s" % "; ".join(info.get("notes") or []))
                return path
            info = sampler.write(path, worker=self.rank, base_ns=base)
            log.debug("whyslow: samples %s: %s", path, info)
            if not info.get("series"):
                notes = "; ".join(info.get("notes") or [])
                log.warning("whyslow: the utilization sampler recorded nothing (%s)", notes)
                return None
            return path
        except Exception as e:
            log.warning("whyslow: utilization samples not written, continuing without: %s", e)
            return None

    def _after_window(
        self, s: Dict[str, Any], sdir: str, trace: str, sampler: Any = None
    ) -> None:
        """Background thread: summarize, publish, (rank 0) collect and localize."""
        try:
            fp_dir = os.path.join(sdir, "fingerprints")
            os.makedirs(fp_dir, exist_ok=True)
            samples = self._write_samples(sampler, trace) if sampler is not None else None
            fp_out = os.path.join(fp_dir, "rank-%d.json" % self.rank)
            fp_json = None
            if samples is not None:
                try:
                    fp_json = _whyslow.summarize_trace(
                        trace, fp_out, rank=self.rank, host=self.host, samples_path=samples
                    )
                except Exception as e:
                    log.warning("whyslow: summarizing with samples failed, without them: %s", e)
            if fp_json is None:
                fp_json = _whyslow.summarize_trace(
                    trace,
                    fp_out,
                    rank=self.rank,
                    host=self.host,
                )
            if not self.cfg.keep_traces:
                try:
                    os.remove(trace)
                    sp = os.path.join(os.path.dirname(trace), "rank-%d.samples.csv" % self.rank)
                    if os.path.exists(sp):
                        os.remove(sp)
                    os.rmdir(os.path.dirname(trace))
                except OSError:
                    pass
            _test_fault("after_summarize", self.rank)
            store = self.store
            if store is not None:
                store.set(self._key("s%d" % s["session"], "fp", self.rank), fp_json)
            if self.rank == 0:
                self._collect(s, sdir, fp_json)
        except Exception as e:
            self.disable("the background summarizer", e)

    def _collect(self, s: Dict[str, Any], sdir: str, own: str) -> None:
        store = self.store
        world = int(s.get("world_size") or self.world_size)
        fps: Dict[int, str] = {0: own}
        t_start = time.monotonic()
        deadline = t_start + self.cfg.collect_timeout_s
        if store is not None:
            missing = set(range(1, world))
            while missing and time.monotonic() < deadline and not self._stop.is_set():
                for r in sorted(missing):
                    key = self._key("s%d" % s["session"], "fp", r)
                    if store.check([key]):
                        fps[r] = store.get(key).decode()
                        missing.discard(r)
                if missing:
                    time.sleep(0.2)
        missing_ranks = sorted(set(range(world)) - set(fps))
        warnings = []
        if missing_ranks:
            warnings.append(
                "ranks %s delivered no fingerprint within %.0f s; analyzed the other %d"
                % (missing_ranks, self.cfg.collect_timeout_s, len(fps))
            )
        config_toml = None
        if self.cfg.localize_config:
            with open(self.cfg.localize_config) as f:
                config_toml = f.read()
        table = _whyslow.localize_fingerprints(
            [fps[r] for r in sorted(fps)],
            sdir,
            world_size=world,
            config_toml=config_toml,
            source_roots=[os.getcwd()],
            warnings=warnings,
            iterations=self.det.history(),
        )
        with open(os.path.join(sdir, "session.json"), "w") as f:
            json.dump(
                dict(s, collected=sorted(fps), missing=missing_ranks,
                     collect_s=time.monotonic() - t_start),
                f,
                indent=1,
            )
        self.stats["reports"].append(sdir)
        log.warning(
            "whyslow: report for session %d (%s) in %s%s\n%s",
            s["session"],
            s["reason"],
            sdir,
            "; missing ranks %s" % missing_ranks if missing_ranks else "",
            table,
        )

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for background work (at exit), at most ``timeout`` seconds."""
        deadline = time.monotonic() + (self.cfg.exit_wait_s if timeout is None else timeout)
        for th in list(self.threads):
            th.join(max(0.0, deadline - time.monotonic()))

    def shutdown(self) -> None:
        try:
            if self.prof is not None and self.enabled:
                # The job ended inside a window: keep what was profiled.
                try:
                    self._stop_profile()
                except Exception as e:
                    self.disable("the final window", e)
            elif self.prof is not None:
                self._stop_profiler_quietly()
            self.wait()
        except Exception:
            pass
        self._stop.set()


def _test_fault(where: str, rank: int) -> None:
    """Failure injection for whyslow's own tests (WHYSLOW_TEST_FAULT)."""
    spec = os.environ.get("WHYSLOW_TEST_FAULT", "")
    if spec == "die_rank0_" + where and rank == 0:
        os._exit(17)
    if spec in ("raise_" + where, "raise_%s_rank%d" % (where, rank)):
        raise RuntimeError("injected test fault at " + where)
