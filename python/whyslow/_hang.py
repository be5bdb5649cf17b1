"""A hang, gathered from every rank (PerfTracker §4.1 detects it; this names
the rank the others wait for).

When the watchdog declares a rank blocked, a side thread of that rank
(never the training thread, which may never come back):

1. reads its own evidence: every thread's stack, the process groups it is
   in and, when PyTorch's Flight Recorder is on, its dump (torch's pickle
   format, kept byte for byte);
2. publishes it in the job's store under ``whyslow/<job>/hang/<id>/rank<r>``
   and writes it under ``<job dir>/hang-<id>/``;
3. the first rank to claim the report waits (bounded) for the others,
   writes what came into the same folder and asks the Rust analysis
   (``whyslow hang``, the same call as the CLI's) for the verdict:
   ``hang-report.json`` and ``hang-report.txt``.

A rank that cannot answer (holding the GIL in native code, exited) is
simply missing: the analysis names it from what its peers wait for.
Any failure here logs one line and leaves training alone.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Dict, List, Optional

log = logging.getLogger("whyslow")

#: The Flight Recorder's default buffer when the user set none: entries
#: per process, a few hundred bytes each (see BENCHMARKS.md for its cost).
FR_DEFAULT_ENTRIES = "2000"


def enable_flight_recorder() -> None:
    """Turns PyTorch's Flight Recorder on unless the user chose a size
    (before the first process group reads it)."""
    if "TORCH_FR_BUFFER_SIZE" not in os.environ and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in os.environ:
        os.environ["TORCH_FR_BUFFER_SIZE"] = FR_DEFAULT_ENTRIES


def thread_stacks() -> List[Dict[str, Any]]:
    """Every thread's stack, innermost frame first."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue  # this gatherer
        frames = [
            {"function": fs.name, "file": fs.filename, "line": fs.lineno or 0}
            for fs in reversed(traceback.extract_stack(frame))
        ]
        name = "main" if ident == main else names.get(ident, str(ident))
        out.append({"thread": name, "frames": frames})
    out.sort(key=lambda t: (t["thread"] != "main", t["thread"]))
    return out


def process_groups() -> List[Dict[str, Any]]:
    """The process groups this rank is in: name, description, members."""
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if not (dist.is_available() and dist.is_initialized()):
            return []
        world = c10d._world
        out = []
        for pg, name in world.pg_names.items():
            ranks = world.pg_group_ranks.get(pg) or {}
            out.append({
                "name": str(name),
                "desc": str(getattr(pg, "group_desc", "") or ""),
                "ranks": sorted(int(r) for r in ranks),
            })
        return out
    except Exception:
        return []


def flight_recorder_dump() -> Optional[bytes]:
    """This process's Flight Recorder dump (torch's pickle), None when torch
    has none."""
    try:
        import torch

        dump = getattr(torch._C._distributed_c10d, "_dump_fr_trace", None)
        if dump is None:
            return None
        data = dump()
        return bytes(data) if data else None
    except Exception as e:
        log.debug("whyslow: no Flight Recorder dump: %s", e)
        return None


def local_evidence(rank: int) -> Dict[str, Any]:
    """This rank's evidence as the ``stacks-rank<r>.json`` document."""
    fr = flight_recorder_dump()
    doc: Dict[str, Any] = {
        "format": "whyslow-hang-rank",
        "version": 1,
        "rank": rank,
        "pid": os.getpid(),
        "host": os.uname().nodename,
        "dumped_at_ns": time.time_ns(),
        "source": "python",
        "threads": thread_stacks(),
        "groups": process_groups(),
        "fr_dump": ("fr_trace_rank_%d" % rank) if fr else None,
    }
    return {"doc": doc, "fr": fr}


def peer_evidence(rank: int, host: str, pid: int) -> Optional[Dict[str, Any]]:
    """What this host's kernel says of a rank on the same host that did not
    answer: gone, or its state and kernel stack (read from /proc, never by
    stopping or tracing it). None for a rank on another host."""
    if host != os.uname().nodename:
        return None
    doc: Dict[str, Any] = {
        "format": "whyslow-hang-rank",
        "version": 1,
        "rank": rank,
        "pid": pid,
        "host": host,
        "dumped_at_ns": time.time_ns(),
        "source": "proc",
        "threads": [],
        "groups": [],
        "fr_dump": None,
    }
    state = ""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        pass
    if not state or state in ("Z", "X"):  # gone, or a zombie not yet reaped
        doc["exited"] = True
        return doc
    frames = []
    try:
        with open("/proc/%d/stack" % pid) as f:  # root only; else wchan
            for line in f:
                parts = line.split()
                if len(parts) >= 2:
                    frames.append({"function": parts[1].split("+")[0], "file": "[kernel]", "line": 0})
    except OSError:
        pass
    if not frames:
        try:
            with open("/proc/%d/wchan" % pid) as f:
                w = f.read().strip()
            if w and w != "0":
                frames.append({"function": w, "file": "[kernel]", "line": 0})
        except OSError:
            pass
    doc["threads"] = [{"thread": "main (kernel, state %s)" % (state or "?"), "frames": frames}]
    return doc


def write_local(folder: str, rank: int, ev: Dict[str, Any]) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "stacks-rank%d.json" % rank), "w") as f:
        json.dump(ev["doc"], f)
    if ev["fr"]:
        with open(os.path.join(folder, "fr_trace_rank_%d" % rank), "wb") as f:
            f.write(ev["fr"])


class HangGatherer:
    """One hang of one rank: publish, and (if this rank claims it) gather
    and report. ``run`` is a thread's body."""

    def __init__(self, cfg: Any, jobstore: Any, rank: int, world_size: int, job_dir: str,
                 detected_at_ns: int, threshold_at_ns: int, stop: threading.Event,
                 still_blocked: Any = None) -> None:
        self.cfg = cfg
        self.jobstore = jobstore
        self.rank = rank
        self.world_size = world_size
        self.job_dir = job_dir
        self.detected_at_ns = detected_at_ns
        self.threshold_at_ns = threshold_at_ns
        self.stop = stop
        self.still_blocked = still_blocked or (lambda: True)
        self.report_path: Optional[str] = None
        self.thread: Optional[threading.Thread] = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as e:  # never harm training
            log.warning("whyslow: the hang report of rank %d failed: %s", self.rank, e)

    def _run(self) -> None:
        # A stall that ends within the grace (a long checkpoint save, the
        # job's last barrier while rank 0 writes its report) or a process
        # that exits is no hang: gather nothing.
        grace = float(getattr(self.cfg, "hang_grace_s", 10.0))
        if self.stop.wait(grace) or not self.still_blocked():
            return
        store = self.jobstore.connect()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        hid = stamp
        if store is not None:
            hid = store.compare_set(self.jobstore.key("hang", "id"), "", stamp).decode()
        folder = os.path.join(self.job_dir, "hang-%s" % hid)
        ev = local_evidence(self.rank)
        write_local(folder, self.rank, ev)
        if store is None:
            self._report(folder)
            return
        payload = dict(ev["doc"])
        if ev["fr"]:
            payload["fr_b64"] = base64.b64encode(ev["fr"]).decode()
        if self.stop.is_set():
            return
        store.set(self.jobstore.key("hang", hid, "rank%d" % self.rank), json.dumps(payload))
        if store.add(self.jobstore.key("hang", hid, "writer"), 1) != 1:
            return
        missing = set(range(self.world_size)) - {self.rank}
        self._gather(store, hid, folder, missing)
        for r in sorted(missing):
            try:
                key = self.jobstore.key("pid", r)
                if store.check([key]):
                    host, pid = store.get(key).decode().rsplit(" ", 1)
                    doc = peer_evidence(r, host, int(pid))
                    if doc is not None:
                        write_local(folder, r, {"doc": doc, "fr": None})
            except Exception as e:
                log.debug("whyslow: no /proc view of rank %d: %s", r, e)
        if missing:
            log.warning("whyslow: no hang evidence from rank(s) %s within the wait (they may hold "
                        "the GIL, be stopped or gone)", ",".join(map(str, sorted(missing))))
        self._report(folder)

    def _gather(self, store: Any, hid: str, folder: str, missing: set) -> None:
        """Waits for the other ranks' evidence, at most ``hang_gather_s``.
        Every rank that can run Python answers within moments of the others
        (their watchdogs see the same stall; the grace is the same), so once
        answers stop coming for ``hang_quiet_s``, the ranks still missing
        cannot answer (holding the GIL in native code, stopped): waiting
        the whole bound for them only delays the report. A missing rank on
        this host whose process is gone is not waited for at all."""
        now = time.monotonic()
        deadline = now + float(getattr(self.cfg, "hang_gather_s", 20.0))
        quiet = float(getattr(self.cfg, "hang_quiet_s", 3.5))
        last_answer = now
        gone: set = set()
        while missing - gone and not self.stop.is_set():
            for r in sorted(missing - gone):
                key = self.jobstore.key("hang", hid, "rank%d" % r)
                if store.check([key]):
                    doc = json.loads(store.get(key).decode())
                    fr = doc.pop("fr_b64", None)
                    write_local(folder, r, {"doc": doc, "fr": base64.b64decode(fr) if fr else None})
                    missing.discard(r)
                    last_answer = time.monotonic()
                elif self._gone(store, r):
                    gone.add(r)  # its /proc view is written after the wait
            now = time.monotonic()
            if not missing - gone or now >= deadline or now - last_answer >= quiet:
                break
            time.sleep(0.2)

    def _gone(self, store: Any, r: int) -> bool:
        """Whether a rank on this host has exited (read from /proc, never by
        stopping or tracing it)."""
        try:
            key = self.jobstore.key("pid", r)
            if not store.check([key]):
                return False
            host, pid = store.get(key).decode().rsplit(" ", 1)
            if host != os.uname().nodename:
                return False
        except (OSError, ValueError):
            return False
        try:
            with open("/proc/%d/stat" % int(pid)) as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True  # no such process
        except (IndexError, ValueError):
            return False
        return state in ("Z", "X")

    def _report(self, folder: str) -> None:
        from . import _whyslow

        world = self.world_size or None
        report_json, table = _whyslow.hang_report(folder, world)
        with open(os.path.join(folder, "hang-report.json"), "w") as f:
            f.write(report_json)
        with open(os.path.join(folder, "hang-report.txt"), "w") as f:
            f.write(table)
        self.report_path = os.path.join(folder, "hang-report.json")
        done = time.time_ns()
        verdict = json.loads(report_json).get("verdict", "")
        log.warning("whyslow: hang report %s (%.1f s after the blocked threshold): %s",
                    self.report_path, (done - self.threshold_at_ns) / 1e9, verdict)
        timing = {
            "threshold_at_ns": self.threshold_at_ns,
            "detected_at_ns": self.detected_at_ns,
            "report_at_ns": done,
        }
        with open(os.path.join(folder, "timing.json"), "w") as f:
            json.dump(timing, f)
        if getattr(self.cfg, "server", None):
            try:
                from . import _collect

                _collect.upload_hang(self.cfg, report_json, os.path.basename(folder))
                log.info("whyslow: hang report uploaded to %s", self.cfg.server)
            except Exception as e:
                log.warning("whyslow: hang report not uploaded: %s", e)
