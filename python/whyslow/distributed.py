"""``whyslow analyze`` over a cluster's traces, on Dask (issue 31).

    whyslow analyze --dask local:4 traces/                 # 4 worker processes here
    whyslow analyze --dask tcp://scheduler:8786 s3://bucket/job-17/traces/
    python -m whyslow.distributed analyze --dask local:4 file:///data/job/

PerfTracker §4.2-4.3 and EROICA split the work the same way: each trace is
summarized where it is read (a fingerprint of a few tens of KB out of a trace
of hundreds of MB), and only the fingerprints travel to one place, where the
localizer compares the workers. Here each Dask task reads one trace (and its
``.samples.csv``) from any fsspec URL — a local path, ``file://``, ``s3://``
with s3fs installed — and runs the same Rust summarizer as the online package
(``_whyslow.summarize_trace``); the client gathers the fingerprints and runs
the same analysis as ``whyslow analyze`` (``_whyslow.analyze_paths``), so the
report is the one a single process makes of the same traces.

Why Dask: Nsight Systems' multi-report recipes run on it, it is pure Python
on top of what a PyTorch user has, and clusters already run it (dask-jobqueue
on Slurm, dask-kubernetes); Ray would do the same with a heavier runtime.

A trace that cannot be read or summarized is left out with one line naming
it; the others are analyzed. Needs ``pip install "dask[distributed]"``
(and ``s3fs`` for ``s3://``).
"""

import argparse
import json
import os
import posixpath
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: File names the analysis reads as profiler traces (Kineto JSON, gzipped or not).
TRACE_SUFFIXES = (".json", ".json.gz")
#: Files under a trace folder that are not traces.
NOT_TRACES = ("report.json", "session.json", "gpu-check.json")


def _fs(url: str, storage_options: Optional[Dict[str, Any]] = None) -> Tuple[Any, str]:
    import fsspec

    return fsspec.core.url_to_fs(url, **(storage_options or {}))


def _stem(name: str) -> Optional[str]:
    for suf in (".json.gz", ".json"):
        if name.endswith(suf):
            return name[: -len(suf)]
    return None


def discover(sources: Sequence[str], storage_options: Optional[Dict[str, Any]] = None
             ) -> List[Tuple[str, Optional[str]]]:
    """(trace URL, samples URL or None) for every trace under ``sources``
    (files or folders, any fsspec URL), in name order."""
    out: List[Tuple[str, Optional[str]]] = []
    for src in sources:
        fs, root = _fs(src, storage_options)
        proto = src.split("://", 1)[0] + "://" if "://" in src else ""
        files = sorted(fs.find(root)) if fs.isdir(root) else [root]
        names = set(files)
        for f in files:
            base = posixpath.basename(f)
            stem = _stem(base)
            if stem is None or base in NOT_TRACES or ".fingerprint." in base:
                continue
            samples = None
            for ext in (".samples.csv", ".samples.csv.gz"):
                cand = posixpath.join(posixpath.dirname(f), stem + ext)
                if cand in names:
                    samples = proto + cand if proto else cand
            out.append((proto + f if proto else f, samples))
    return out


def summarize_one(trace: str, samples: Optional[str],
                  storage_options: Optional[Dict[str, Any]] = None) -> Tuple[str, str]:
    """One Dask task: the fingerprint (JSON) of one trace, read where it is
    (a local file in place, any other URL copied to a temporary folder
    first). Returns (the trace's file name, the fingerprint)."""
    from . import _whyslow

    fs, path = _fs(trace, storage_options)
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    tmp = None
    try:
        if local:
            tpath = path
            spath = _fs(samples, storage_options)[1] if samples else None
        else:
            tmp = tempfile.mkdtemp(prefix="whyslow-task-")
            tpath = os.path.join(tmp, posixpath.basename(path))
            fs.get(path, tpath)
            spath = None
            if samples:
                sfs, sp = _fs(samples, storage_options)
                spath = os.path.join(tmp, posixpath.basename(sp))
                sfs.get(sp, spath)
        fp = _whyslow.summarize_trace(tpath, None, samples_path=spath)
        return posixpath.basename(path), fp
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _client(spec: str) -> Any:
    from distributed import Client, LocalCluster

    if spec.startswith("local"):
        n = int(spec.split(":", 1)[1]) if ":" in spec else (os.cpu_count() or 1)
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                               dashboard_address=None)
        return Client(cluster)
    return Client(spec)


def analyze(sources: Sequence[str], dask: str = "local", *, world_size: Optional[int] = None,
            storage_options: Optional[Dict[str, Any]] = None, client: Any = None,
            log: Any = None) -> Tuple[str, Dict[str, Any]]:
    """Summarizes every trace under ``sources`` on Dask and localizes the
    fingerprints here: (the report as JSON, {"traces", "summarized",
    "skipped": [(trace, why)], "summarize_s", "localize_s", "workers"})."""
    from . import _whyslow

    log = log or (lambda msg: print(msg, file=sys.stderr))
    found = discover(sources, storage_options)
    if not found:
        raise ValueError("no trace (*.json, *.json.gz) under %s" % ", ".join(sources))
    own = client is None
    client = client or _client(dask)
    stats: Dict[str, Any] = {"traces": len(found), "skipped": []}
    tmp = tempfile.mkdtemp(prefix="whyslow-fingerprints-")
    try:
        stats["workers"] = len(client.scheduler_info().get("workers", {}))
        t0 = time.monotonic()
        futures = [client.submit(summarize_one, t, s, storage_options, pure=False) for t, s in found]
        written = 0
        for (trace, _), fut in zip(found, futures):
            try:
                name, fp = fut.result()
            except Exception as e:  # one bad trace never stops the others
                stats["skipped"].append((trace, str(e)))
                log("whyslow: %s: left out: %s" % (trace, e))
                continue
            # Fingerprints by position: two sources may hold the same names.
            with open(os.path.join(tmp, "%06d-%s.fingerprint.json" % (written, _stem(name))), "w") as f:
                f.write(fp)
            written += 1
        stats["summarized"] = written
        stats["summarize_s"] = time.monotonic() - t0
        if not written:
            raise ValueError("no trace could be summarized (%d left out)" % len(stats["skipped"]))
        t1 = time.monotonic()
        report = _whyslow.analyze_paths([tmp], world_size=world_size, source_roots=[os.getcwd()])
        stats["localize_s"] = time.monotonic() - t1
        return report, stats
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if own:
            cluster = getattr(client, "cluster", None)
            client.close()
            if cluster is not None:
                cluster.close()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="whyslow analyze --dask",
        description="whyslow analyze with summarize fanned out on Dask; localization here.")
    ap.add_argument("command", choices=["analyze"])
    ap.add_argument("sources", nargs="+", help="trace files or folders: paths, file://, s3://, any fsspec URL")
    ap.add_argument("--dask", default="local", metavar="ADDR",
                    help="a scheduler (tcp://host:8786) or local[:N] worker processes here (default: one per core)")
    ap.add_argument("--world-size", type=int, default=None)
    ap.add_argument("--format", choices=["table", "json"], default="table")
    ap.add_argument("--json", default="", help="also write the report here")
    ap.add_argument("--html", default="", help="also write the HTML report here")
    ap.add_argument("--storage-options", default="", help="JSON given to fsspec (credentials, endpoint_url)")
    a = ap.parse_args(argv)
    from . import _whyslow

    opts = json.loads(a.storage_options) if a.storage_options else None
    try:
        report, stats = analyze(a.sources, a.dask, world_size=a.world_size, storage_options=opts)
    except (ValueError, OSError, ImportError) as e:
        print("whyslow: %s" % e, file=sys.stderr)
        return 1
    print("whyslow: %d trace(s) summarized on %d Dask worker(s) in %.1f s, %d left out; localized in %.2f s"
          % (stats["summarized"], stats["workers"], stats["summarize_s"], len(stats["skipped"]),
             stats["localize_s"]), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            f.write(report)
    if a.html:
        with open(a.html, "w") as f:
            f.write(_whyslow.report_html(report))
    print(report if a.format == "json" else _whyslow.report_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
