"""After a window, off the training thread (PerfTracker §4.2-§4.3): each
rank writes its samples, summarizes its trace into a fingerprint and
publishes it; rank 0 collects the fingerprints (bounded wait: a rank that
delivers none is named missing) and localizes. The Rust calls release the
GIL."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from . import _faults, _whyslow
from ._config import Config
from ._session import JobStore

log = logging.getLogger("whyslow")


def write_samples(sampler: Any, trace: str, rank: int) -> Optional[str]:
    """Writes the window's samples next to the trace, on the trace's time
    origin (newer Kineto: ``ts`` relative to ``baseTimeNanoseconds``, which
    whyslow-ingest keeps; older: Unix epoch). None on failure."""
    path = os.path.join(os.path.dirname(trace), "rank-%d.samples.csv" % rank)
    try:
        _faults.point("sampler_write", rank)
        base = _whyslow.kineto_base_ns(trace) or 0
        if hasattr(sampler, "collect"):  # an AgentWindow: the agent's samples
            info = sampler.collect(path, base)
            if not info.get("rows"):
                raise RuntimeError("agent recorded nothing: %s" % "; ".join(info.get("notes") or []))
            return path
        info = sampler.write(path, worker=rank, base_ns=base)
        log.debug("whyslow: samples %s: %s", path, info)
        if not info.get("series"):
            notes = "; ".join(info.get("notes") or [])
            log.warning("whyslow: the utilization sampler recorded nothing (%s)", notes)
            return None
        return path
    except Exception as e:
        log.warning("whyslow: utilization samples not written, continuing without: %s", e)
        return None


def summarize(cfg: Config, rank: int, host: str, trace: str, sampler: Any,
              fp_dir: str) -> str:
    """The rank's fingerprint (JSON text, also written to ``fp_dir``); with
    samples when they could be written and read, else without."""
    os.makedirs(fp_dir, exist_ok=True)
    samples = write_samples(sampler, trace, rank) if sampler is not None else None
    fp_out = os.path.join(fp_dir, "rank-%d.json" % rank)
    fp_json = None
    if samples is not None:
        try:
            fp_json = _whyslow.summarize_trace(trace, fp_out, rank=rank, host=host,
                                               samples_path=samples)
        except Exception as e:
            log.warning("whyslow: summarizing with samples failed, without them: %s", e)
    if fp_json is None:
        fp_json = _whyslow.summarize_trace(trace, fp_out, rank=rank, host=host)
    if not cfg.keep_traces:
        try:
            os.remove(trace)
            sp = os.path.join(os.path.dirname(trace), "rank-%d.samples.csv" % rank)
            if os.path.exists(sp):
                os.remove(sp)
            os.rmdir(os.path.dirname(trace))
        except OSError:
            pass
    return fp_json


def upload(cfg: Config, session_dir: str, fingerprint: str, rank: int) -> bool:
    """Uploads one fingerprint to ``whyslow server`` (docs/server.md); the
    session is the window's folder name, the same on every rank. Bounded
    (10 s); a failure logs one line and returns False."""
    import urllib.error
    import urllib.parse
    import urllib.request

    job = urllib.parse.quote(cfg.job_id, safe="")
    session = urllib.parse.quote(os.path.basename(session_dir.rstrip("/")), safe="")
    url = "%s/api/v1/jobs/%s/sessions/%s/fingerprints" % (cfg.server.rstrip("/"), job, session)
    req = urllib.request.Request(url, data=fingerprint.encode(), method="POST", headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer %s" % cfg.token,
    })
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
        return True
    except (urllib.error.URLError, OSError, ValueError) as e:
        detail = ""
        if isinstance(e, urllib.error.HTTPError):
            try:
                detail = ": " + e.read().decode(errors="replace")[:200]
            except Exception:
                pass
        log.warning("whyslow: rank %d: fingerprint not uploaded to %s: %s%s", rank, cfg.server, e, detail)
        return False


def collect_and_localize(cfg: Config, store: JobStore, s: Dict[str, Any], sdir: str,
                         own: str, world: int, stop: threading.Event,
                         iterations: List[Any]) -> List[int]:
    """Rank 0: gathers the other ranks' fingerprints, writes the report and
    ``session.json`` into ``sdir`` and logs the findings; returns the ranks
    that delivered none."""
    t_start = time.monotonic()
    fps: Dict[int, str] = {0: own}
    fps.update(store.gather_fingerprints(s["session"], range(1, world),
                                         t_start + cfg.collect_timeout_s, stop))
    missing = sorted(set(range(world)) - set(fps))
    warnings = []
    if missing:
        warnings.append(
            "ranks %s delivered no fingerprint within %.0f s; analyzed the other %d"
            % (missing, cfg.collect_timeout_s, len(fps))
        )
    config_toml = None
    if cfg.localize_config:
        with open(cfg.localize_config) as f:
            config_toml = f.read()
    table = _whyslow.localize_fingerprints(
        [fps[r] for r in sorted(fps)],
        sdir,
        world_size=world,
        config_toml=config_toml,
        source_roots=[os.getcwd()],
        warnings=warnings,
        iterations=iterations,
    )
    with open(os.path.join(sdir, "session.json"), "w") as f:
        json.dump(dict(s, collected=sorted(fps), missing=missing,
                       collect_s=time.monotonic() - t_start), f, indent=1)
    log.warning(
        "whyslow: report for session %d (%s) in %s%s\n%s",
        s["session"],
        s["reason"],
        sdir,
        "; missing ranks %s" % missing if missing else "",
        table,
    )
    return missing
