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
from typing import Any, Dict, List, Optional, Tuple

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
                                               samples_path=samples, job=cfg.job_id or None)
        except Exception as e:
            log.warning("whyslow: summarizing with samples failed, without them: %s", e)
    if fp_json is None:
        fp_json = _whyslow.summarize_trace(trace, fp_out, rank=rank, host=host,
                                           job=cfg.job_id or None)
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


#: Uploads kept while the server is away (SysOM-AI §7): at most this many
#: files, none older than this; the oldest go first when over.
PENDING_MAX_FILES = 256
PENDING_MAX_AGE_S = 3600.0


def _pending_dir(cfg: Config) -> str:
    import urllib.parse

    return os.path.join(cfg.report_dir, urllib.parse.quote(cfg.job_id, safe=""), ".upload-pending")


def _post(cfg: Config, job: str, session: str, fingerprint: str) -> Tuple[bool, bool, str]:
    """One POST; (done, worth retrying later, why not)."""
    import urllib.parse

    url = "%s/api/v1/jobs/%s/sessions/%s/fingerprints" % (
        cfg.server.rstrip("/"), urllib.parse.quote(job, safe=""), urllib.parse.quote(session, safe=""))
    return _post_url(cfg, url, fingerprint)


def upload_hang(cfg: Config, report_json: str, batch: str) -> None:
    """Uploads a hang report (``/api/v1/jobs/<job>/hangs/<batch>``); raises
    RuntimeError naming why it was not stored."""
    import urllib.parse

    url = "%s/api/v1/jobs/%s/hangs/%s" % (
        cfg.server.rstrip("/"), urllib.parse.quote(cfg.job_id, safe=""), urllib.parse.quote(batch, safe=""))
    done, _, why = _post_url(cfg, url, report_json)
    if not done:
        raise RuntimeError("%s: %s" % (cfg.server, why))


def _post_url(cfg: Config, url: str, body: str) -> Tuple[bool, bool, str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body.encode(), method="POST", headers={
        "Content-Type": "application/json",
        "Authorization": "Bearer %s" % cfg.token,
    })
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            r.read()
        return True, False, ""
    except urllib.error.HTTPError as e:
        try:
            detail = ": " + e.read().decode(errors="replace")[:200]
        except Exception:
            detail = ""
        # The server answered: 5xx may pass, a refusal (401, 400, 413) will not.
        return False, e.code >= 500, "%s%s" % (e, detail)
    except (urllib.error.URLError, OSError, ValueError) as e:
        return False, True, str(e)


def _pending(cfg: Config) -> List[str]:
    """Kept uploads, oldest first, after dropping what is over the bounds."""
    d = _pending_dir(cfg)
    try:
        names = [os.path.join(d, n) for n in os.listdir(d) if n.endswith(".json")]
    except OSError:
        return []
    files = []
    for f in names:
        try:
            files.append((os.path.getmtime(f), f))
        except OSError:
            pass
    files.sort()
    now = time.time()
    keep = []
    dropped = 0
    for i, (mtime, f) in enumerate(files):
        if now - mtime > PENDING_MAX_AGE_S or len(files) - i > PENDING_MAX_FILES:
            try:
                os.remove(f)
                dropped += 1
            except OSError:
                pass
        else:
            keep.append(f)
    if dropped:
        log.warning("whyslow: dropped %d fingerprint upload(s) kept over %.0f s or beyond %d files",
                    dropped, PENDING_MAX_AGE_S, PENDING_MAX_FILES)
    return keep


def _replay(cfg: Config, rank: int) -> None:
    """Sends the kept uploads, oldest first; stops at the first that still
    cannot go (the server is still away)."""
    for f in _pending(cfg):
        try:
            with open(f) as fh:
                rec = json.load(fh)
            job, session, fp = rec["job"], rec["session"], rec["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError):
            try:
                os.remove(f)
            except OSError:
                pass
            continue
        done, retry, _ = _post(cfg, job, session, fp)
        if not done and retry:
            return
        try:
            os.remove(f)
        except OSError:
            pass
        if done:
            log.info("whyslow: rank %d: sent a fingerprint kept while the server was away (%s)", rank, session)


def upload(cfg: Config, session_dir: str, fingerprint: str, rank: int) -> bool:
    """Uploads one fingerprint to ``whyslow server`` (docs/server.md); the
    session is the window's folder name, the same on every rank. Bounded
    (10 s per request). While the server is away (no answer, or 5xx) the
    fingerprint is kept on local disk (``REPORT_DIR/<job>/.upload-pending``,
    at most PENDING_MAX_FILES files and PENDING_MAX_AGE_S seconds) and sent,
    oldest first, before the next window's; a refusal (4xx) is not kept. A
    failure logs one line and returns False."""
    session = os.path.basename(session_dir.rstrip("/"))
    _replay(cfg, rank)
    done, retry, why = _post(cfg, cfg.job_id, session, fingerprint)
    if done:
        return True
    kept = ""
    if retry:
        d = _pending_dir(cfg)
        try:
            os.makedirs(d, exist_ok=True)
            path = os.path.join(d, "%s-rank%d.json" % (session, rank))
            tmp = path + ".tmp"
            with open(tmp, "w") as fh:
                json.dump({"job": cfg.job_id, "session": session, "rank": rank, "fingerprint": fingerprint}, fh)
            os.replace(tmp, path)
            _pending(cfg)
            kept = "; kept in %s for the next window" % d
        except OSError as e:
            kept = "; could not keep it (%s)" % e
    log.warning("whyslow: rank %d: fingerprint not uploaded to %s: %s%s", rank, cfg.server, why, kept)
    return False


#: Scheduler environment → the label whyslow gives it (issue 30: the job's
#: real identity). Kubernetes pods get K8S_JOB_NAME / POD_NAME /
#: POD_NAMESPACE from the downward API (deploy/kubernetes/example-training-job.yaml).
_SCHEDULER_LABELS = (
    ("slurm.job_id", "SLURM_JOB_ID"),
    ("slurm.job_name", "SLURM_JOB_NAME"),
    ("slurm.step_id", "SLURM_STEP_ID"),
    ("slurm.nodelist", "SLURM_JOB_NODELIST"),
    ("slurm.partition", "SLURM_JOB_PARTITION"),
    ("k8s.namespace", "POD_NAMESPACE"),
    ("k8s.pod", "POD_NAME"),
    ("k8s.job", "K8S_JOB_NAME"),
    ("torch.run_id", "TORCHELASTIC_RUN_ID"),
)


def scheduler_identity(env: Optional[Dict[str, str]] = None) -> Tuple[Optional[str], Dict[str, str]]:
    """What the scheduler calls this job: a name for people (Slurm's job
    name, the Kubernetes Job's) and labels, from the rank's environment."""
    env = os.environ if env is None else env
    labels = {}
    for label, var in _SCHEDULER_LABELS:
        value = (env.get(var) or "").strip()
        if value:
            labels[label] = value[:200]
    name = labels.get("slurm.job_name") or labels.get("k8s.job")
    return name, labels


def annotate(fp_json: str, network: Optional[str], host: str, path: Optional[str] = None,
             env: Optional[Dict[str, str]] = None) -> str:
    """The fingerprint with what the rank knows beyond its trace: its
    network over the window (an OS sample: TCP counters and connections,
    judged by the job pipeline as `whyslow diagnose` judges an agent's;
    issue 29) and the scheduler's name and labels for the job (issue 30).
    Rewritten at ``path`` too, so the file on disk is what was published."""
    fp = json.loads(fp_json)
    if network:
        sample = json.loads(network)
        sample["host"] = sample.get("host") or host
        sample["rank"] = fp.get("worker")
        fp["network"] = sample
    name, labels = scheduler_identity(env)
    if name or labels:
        job = dict(fp.get("job") or {})
        if name:
            job["name"] = name
        job["labels"] = dict(job.get("labels") or {}, **labels)
        fp["job"] = job
    out = json.dumps(fp)
    if path:
        with open(path, "w") as f:
            f.write(out)
    return out


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
    diagnosis = cross_layer(cfg, sdir)
    table = _whyslow.localize_fingerprints(
        [fps[r] for r in sorted(fps)],
        sdir,
        world_size=world,
        config_toml=config_toml,
        source_roots=[os.getcwd()],
        warnings=warnings,
        iterations=iterations,
        cross_layer=diagnosis,
    )
    with open(os.path.join(sdir, "session.json"), "w") as f:
        json.dump(dict(s, collected=sorted(fps), missing=missing,
                       collect_s=time.monotonic() - t_start), f, indent=1)
    if cfg.suggest_fix:
        # EROICA's first step, opt-in, off the training path (this is rank
        # 0's background thread); a failure is one log line.
        try:
            from ._fix import suggest_fix_for_session

            suggest_fix_for_session(sdir, [os.getcwd()], log)
        except Exception as e:
            log.warning("whyslow: no fix proposal: %s", e)
    cross = cross_layer_summary(diagnosis, sdir) if diagnosis else None
    log.warning(
        "whyslow: report for session %d (%s) in %s%s\n%s%s",
        s["session"],
        s["reason"],
        sdir,
        "; missing ranks %s" % missing if missing else "",
        table,
        "\n" + cross if cross else "",
    )
    return missing


def cross_layer(cfg: Config, sdir: str) -> Optional[str]:
    """With an agent (``WHYSLOW_AGENT_DIR``) that names its profile spool in
    ``agent.json``: the cross-layer diagnosis (SysOM-AI §3.1: late ranks, the
    layer, CPU/off-CPU/OS diffs, the temporal baseline) over the spool as it
    stands, with the session's fingerprints for the GPU layer — the same
    library call as ``whyslow diagnose`` — written as ``diagnose.json`` and
    ``diagnose.html`` in ``sdir``. Returns the diagnosis as JSON (joined into
    ``report.json`` as ``cross_layer``), or None; never raises: the report
    stands without it."""
    if not cfg.agent_dir:
        return None
    try:
        with open(os.path.join(cfg.agent_dir, "agent.json")) as f:
            info = json.loads(_whyslow.parse_wire("agent", f.read()))
    except (OSError, ValueError) as e:
        log.info("whyslow: no cross-layer diagnosis: the agent's agent.json: %s", e)
        return None
    spool = info.get("spool")
    if not spool or not os.path.isdir(spool):
        return None
    try:
        fps = os.path.join(sdir, "fingerprints")
        diag = _whyslow.diagnose_spool(
            spool,
            fingerprints=[fps] if os.path.isdir(fps) else None,  # the GPU layer
            html_path=os.path.join(sdir, "diagnose.html"),
        )
        with open(os.path.join(sdir, "diagnose.json"), "w") as f:
            f.write(diag)
        return diag
    except Exception as e:  # the report stands without it
        log.info("whyslow: no cross-layer diagnosis: %s", e)
        return None


def cross_layer_summary(diagnosis: str, sdir: str) -> str:
    """One paragraph of the diagnosis for the log."""
    diag = json.loads(diagnosis)
    out_html = os.path.join(sdir, "diagnose.html")
    late = ["rank %s of %s (%.1f ms late)" % (x["rank"], x["group"], x["late_us"] / 1e3)
            for x in diag.get("stragglers", [])]
    top = (diag.get("cpu_diff") or diag.get("offcpu_diff") or diag.get("regressions") or [{}])[0]
    first = "; first: %s" % top["function"] if top.get("function") else ""
    lossy = diag.get("network_diff") or []
    if diag.get("layer") == "network" and lossy:
        first = "; first: %s (ranks %s) loses TCP segments (%s)" % (
            lossy[0]["host"], ", ".join(str(r) for r in lossy[0]["ranks"]), lossy[0]["side"])
    return "cross-layer (the node agents): %s; layer %s%s (%s)" % (
        ", ".join(late) if late else "no late rank", diag.get("layer"), first, out_html)
