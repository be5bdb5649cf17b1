"""The training side of the ``whyslow agent`` file protocol (docs/agent.md).

With ``WHYSLOW_AGENT_DIR`` set, a rank does not sample itself: at window
start it writes ``rank-<r>.request.json`` (tmp + rename) into the directory
it shares with the privileged agent (PerfTracker §5: an unprivileged
training container and a privileged monitor sharing a Kubernetes emptyDir),
at window end ``rank-<r>.stop``, and after the trace is exported it waits a
bounded time for ``rank-<r>.done`` and copies ``rank-<r>.samples.csv`` next
to the trace on the trace's time origin. Every failure raises; the runtime
logs one line and continues without samples.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, List, Optional

from . import _whyslow

#: Longest wait for the agent's ``.done`` (or ``.error``) after the stop file.
WAIT_S = 5.0
_OUTPUTS = (".stop", ".done", ".error", ".samples.csv", ".sampler-extra.csv")


def _proc_start_ticks() -> Optional[int]:
    """Field 22 of /proc/self/stat: lets the agent check the pid is ours."""
    try:
        with open("/proc/self/stat") as f:
            s = f.read()
        return int(s[s.rindex(")") + 1:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _put(path: str, text: str) -> None:
    tmp = os.path.join(os.path.dirname(path), ".%s.%d.tmp" % (os.path.basename(path), os.getpid()))
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def registration_path(agent_dir: str, pid: int) -> str:
    return os.path.join(agent_dir, "proc-%d.json" % pid)


def register(agent_dir: str, rank: int, local_rank: int, world_size: int, job: str,
             host: str) -> str:
    """Registers this process with the node agent for always-on CPU
    profiling (``whyslow_model::wire::ProcessRegistration``, checked by
    Rust before it is written); returns the file, removed by
    :func:`unregister` at exit."""
    rec = {
        "pid": os.getpid(),
        "proc_start_ticks": _proc_start_ticks(),
        "rank": rank,
        "local_rank": local_rank,
        "world_size": world_size,
        "job": job,
        "host": host,
    }
    # The scheduler's name and labels for the job (issue 30): the agent
    # labels this rank's profiles with them.
    try:
        from ._collect import scheduler_identity
        name, labels = scheduler_identity()
        if name:
            rec["job_name"] = name[:200]
        if labels:
            rec["scheduler"] = dict(sorted(labels.items())[:16])
    except Exception:  # the identity is a label, never a reason not to register
        pass
    text = _whyslow.parse_wire("register", json.dumps(rec))
    path = registration_path(agent_dir, os.getpid())
    _put(path, text)
    return path


def unregister(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class AgentWindow:
    """One profiling window served by the agent."""

    def __init__(self, agent_dir: str, rank: int, pid: int, tid: int, rate_hz: float,
                 interfaces: List[str], window_s: float, session: Any) -> None:
        self.dir = agent_dir
        self.rank = rank
        self.id = "%d-%d-%s-%d" % (pid, rank, session, time.time_ns())
        self.prefix = os.path.join(agent_dir, "rank-%d" % rank)
        for suffix in _OUTPUTS:  # a previous window's files
            try:
                os.remove(self.prefix + suffix)
            except FileNotFoundError:
                pass
        until = time.time() + (window_s if window_s and window_s > 0 else 600.0) + 60.0
        req: Dict[str, Any] = {
            "pid": pid,
            "tid": tid,
            "rank": rank,
            "rate_hz": rate_hz,
            "interfaces": interfaces,
            "time_base_ns": 0,
            "until_unix_s": until,
            "id": self.id,
            "proc_start_ticks": _proc_start_ticks(),
        }
        _put(self.prefix + ".request.json", json.dumps(req))

    def stop(self) -> None:
        _put(self.prefix + ".stop", "")

    def collect(self, out_path: str, base_ns: int) -> Dict[str, Any]:
        """Waits (≤ WAIT_S) for the agent, then writes its samples to
        ``out_path`` with timestamps relative to ``base_ns`` (a trace's
        ``baseTimeNanoseconds``; the agent samples on the Unix epoch).
        Returns the ``.done`` JSON; raises on error or timeout."""
        deadline = time.monotonic() + WAIT_S
        done = None
        while True:
            if os.path.exists(self.prefix + ".error"):
                with open(self.prefix + ".error") as f:
                    raise RuntimeError("agent: " + f.read().strip())
            try:
                with open(self.prefix + ".done") as f:
                    d = json.load(f)
                if d.get("id") == self.id:
                    done = d
                    break
            except (FileNotFoundError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise TimeoutError("no %s.done from the agent within %.0f s" % (self.prefix, WAIT_S))
            time.sleep(0.05)
        src = os.path.join(self.dir, done.get("samples") or "rank-%d.samples.csv" % self.rank)
        shift_ns = base_ns - int(done.get("time_base_ns") or 0)
        rows = _whyslow.rebase_samples_file(src, out_path, shift_ns)
        done["rows"] = rows
        return done
