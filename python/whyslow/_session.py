"""How ranks agree on a profiling window (PerfTracker §4.1: every rank
profiles the same iterations): session records proposed and read through the
job's store (torch.distributed's default TCPStore), first proposal wins, and
the fingerprints each rank publishes for rank 0 to collect. Every wait has a
deadline."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Dict, Iterable, Optional

from . import _whyslow


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


class JobStore:
    """The job's store under ``whyslow/<job id>/``; ``store`` is None until a
    process group exists (then ``rank`` and ``world_size`` are the group's)."""

    def __init__(self, job_id: str) -> None:
        self.ns = "whyslow/%s" % job_id
        self.store: Any = None
        self.rank: Optional[int] = None
        self.world_size: Optional[int] = None

    def connect(self) -> Any:
        """The default store when a process group is initialized, else None."""
        if self.store is not None:
            return self.store
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                from torch.distributed import distributed_c10d as c10d

                self.store = c10d._get_default_store()
                self.world_size = dist.get_world_size()
                self.rank = dist.get_rank()
                # Where this rank runs, so that a peer on the same host can
                # tell a rank that exited from one that cannot answer.
                self.store.set(self.key("pid", self.rank), "%s %d" % (os.uname().nodename, os.getpid()))
        except ImportError:
            pass
        return self.store

    def key(self, *parts: Any) -> str:
        return "/".join([self.ns] + [str(p) for p in parts])

    def published(self, session: int) -> Optional[Dict[str, Any]]:
        """Session ``session``'s record if some rank proposed it."""
        store = self.store
        key = self.key("s%d" % session, "session")
        if store is not None and store.check([key]):
            return read_session(store.get(key))
        return None

    def propose(self, record: Dict[str, Any]) -> Dict[str, Any]:
        """Proposes ``record``; returns the record that won (ours or an
        earlier proposal for the same session number)."""
        if self.store is None:
            return record
        key = self.key("s%d" % record["session"], "session")
        return read_session(self.store.compare_set(key, "", json.dumps(record)))

    def publish_fingerprint(self, session: int, rank: int, fingerprint: str) -> None:
        if self.store is not None:
            self.store.set(self.key("s%d" % session, "fp", rank), fingerprint)

    def gather_fingerprints(self, session: int, ranks: Iterable[int], deadline: float,
                            stop: threading.Event) -> Dict[int, str]:
        """The fingerprints of ``ranks`` published before ``deadline``
        (``time.monotonic()``) or until ``stop`` is set."""
        found: Dict[int, str] = {}
        store = self.store
        if store is None:
            return found
        missing = set(ranks)
        while missing and time.monotonic() < deadline and not stop.is_set():
            for r in sorted(missing):
                key = self.key("s%d" % session, "fp", r)
                if store.check([key]):
                    found[r] = store.get(key).decode()
                    missing.discard(r)
            if missing:
                time.sleep(0.2)
        return found
