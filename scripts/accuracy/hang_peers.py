#!/usr/bin/env python3
"""Which ranks do the two peer hang analyzers blame for a folder of Flight Recorder dumps?

    python3 scripts/accuracy/hang_peers.py DIR [--pattern GLOB]

prints one JSON object:

    {"nvrx":     {"ranks": [...], "error": null | "...", ...},
     "fr_trace": {"ranks": [...], "error": null | "...", "prefix": "...", ...}}

1. NVRx: NVIDIA Resiliency Extension's FR attribution,
   ``nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution.CollectiveAnalyzer``,
   driven as its unit test ``tests/attribution/unit/test_fr.py`` drives it: constructed with
   ``{"fr_path": DIR, "pattern": GLOB, "verbose": False, "health_check": False,
   "llm_analyze": False, ...}``, then ``preprocess_FR_dumps()`` and ``collective_analysis()``
   (with ``llm_analyze`` off the latter returns the table unchanged). ``ranks`` is the set of
   ranks in the "Missing Ranks" column of the table it prints
   (``PGID | Process Group Desc | Op Type | Size | Dtype | Missing Ranks``).

   Where the module comes from (first that works): ``--nvrx-src DIR``; an installed
   ``nvidia_resiliency_ext`` that has ``attribution`` (PyPI's newest reachable here, 0.4.1, does
   not: the package reachable from this machine cannot be used); ``/tmp/nvrx/src``; else it is
   extracted there from the mirror ``/work/.mirror/NVIDIA+nvidia-resiliency-ext/repo``
   (``git archive HEAD src``). No stub is needed: the analyzer's import chain
   (fr_attribution, attribution.base, api_keys, logging_utils, orchestration.config, capture)
   is standard library only; it needs neither torch nor a GPU, and runs on this interpreter.

2. fr_trace: PyTorch's ``python -m torch.distributed.flight_recorder.fr_trace DIR -p PREFIX``
   run as a subprocess with an interpreter that has torch (``--torch-python``, else
   ``$WHYSLOW_TORCH_PYTHON``, else ``.venv-peers/bin/python`` in the repo, else this
   interpreter). ``ranks`` is the union of every ``missing ranks: {...}`` and every
   ``Culprit rank N`` it logs; ``first_ranks`` those of its first report only. When it fails,
   ``error`` is the exception's last line (e.g. ``KeyError: ('2', 3)``) and ``ranks`` is empty.

Only rank dump files (``<prefix><rank>`` with no suffix) are given to either tool: they are
symlinked into a temporary folder, so stacks-rank*.json, truth.json, fault_injection.log and
``*.json`` copies of dumps are ignored. The prefix is detected from the names (``_dump_`` by
NVRx's Megatron runs, ``fr_trace_rank_`` / ``nccl_trace_rank_`` by torch); ``--pattern`` sets
the NVRx glob (default ``<prefix>*``, e.g. ``_dump_*``) and limits the prefix detection to the
names it matches.

The gloo dumps torch 2.15 writes (``_dump_fr_trace()``) hold a placeholder ``pg_config``
(``{'': {'name': '', 'desc': '', 'ranks': '[0, 1]'}}``) instead of the job's groups, so both tools
fail on them with a KeyError on a group name. ``--fill-pg-config`` (off by default) rewrites
copies of the dumps with the groups whyslow recorded in ``stacks-rank*.json``, to see what the
tools say when that table is right. Extra fr_trace flags (e.g. ``--allow-incomplete-ranks``
for folders missing a rank's dump) go through ``--fr-trace-args``.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import fnmatch
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NVRX_MIRROR = Path("/work/.mirror/NVIDIA+nvidia-resiliency-ext/repo")
NVRX_EXTRACT = Path("/tmp/nvrx")
KNOWN_PREFIXES = ("_dump_", "fr_trace_rank_", "nccl_trace_rank_")
DUMP_NAME = re.compile(r"^(.*?)(\d+)$")


def detect_prefix(folder: Path, pattern: str | None = None) -> str:
    counts: Counter[str] = Counter()
    for f in folder.iterdir():
        m = DUMP_NAME.match(f.name)
        if pattern and not fnmatch.fnmatchcase(f.name, pattern):
            continue
        if f.is_file() and m:
            counts[m.group(1)] += 1
    if not counts:
        raise SystemExit(f"hang_peers: no <prefix><rank> dump files in {folder}"
                         + (f" matching {pattern}" if pattern else ""))
    for p in KNOWN_PREFIXES:
        if p in counts:
            return p
    return counts.most_common(1)[0][0]


def stage(folder: Path, prefix: str, into: Path, pg_config: dict | None = None) -> list[int]:
    ranks = []
    for f in sorted(folder.iterdir()):
        m = DUMP_NAME.match(f.name)
        if f.is_file() and m and m.group(1) == prefix:
            if pg_config is None:
                (into / f.name).symlink_to(f.resolve())
            else:
                import pickle

                with open(f, "rb") as fh:
                    d = pickle.load(fh)  # the project's own fixtures (--fill-pg-config)
                d["pg_config"] = pg_config
                with open(into / f.name, "wb") as fh:
                    pickle.dump(d, fh)
            ranks.append(int(m.group(2)))
    return sorted(ranks)


def groups_from_stacks(folder: Path) -> dict:
    """pg_config rebuilt from whyslow's stacks-rank*.json (their "groups" lists)."""
    groups: dict = {}
    for f in sorted(folder.glob("stacks-rank*.json")):
        for g in json.loads(f.read_text()).get("groups", []):
            groups[str(g["name"])] = {"name": str(g["name"]), "desc": g["desc"], "ranks": str(g["ranks"])}
    if not groups:
        raise SystemExit(f"hang_peers: --fill-pg-config: no groups in {folder}/stacks-rank*.json")
    return groups


def one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


# ---------------------------------------------------------------- NVRx


def _nvrx_module(src: str | None):
    """Import fr_attribution; returns (module, where it came from)."""
    name = "nvidia_resiliency_ext.attribution.trace_analyzer.fr_attribution"
    candidates = [src] if src else [None, str(NVRX_EXTRACT / "src")]
    errors = []
    for cand in candidates:
        if cand is None:  # an installed package
            try:
                import importlib

                mod = importlib.import_module(name)
                return mod, os.path.dirname(mod.__file__)
            except Exception as e:  # noqa: BLE001
                errors.append(f"installed: {one_line(e)}")
                for k in [k for k in sys.modules if k.startswith("nvidia_resiliency_ext")]:
                    del sys.modules[k]
                continue
        if not Path(cand, "nvidia_resiliency_ext").is_dir() and cand == str(NVRX_EXTRACT / "src"):
            if NVRX_MIRROR.is_dir():
                NVRX_EXTRACT.mkdir(parents=True, exist_ok=True)
                arch = subprocess.run(
                    ["git", "-C", str(NVRX_MIRROR), "archive", "HEAD", "src"],
                    check=True, capture_output=True,
                ).stdout
                subprocess.run(["tar", "-x", "-C", str(NVRX_EXTRACT)], input=arch, check=True)
        if not Path(cand, "nvidia_resiliency_ext").is_dir():
            errors.append(f"{cand}: no nvidia_resiliency_ext there")
            continue
        sys.path.insert(0, cand)
        try:
            import importlib

            mod = importlib.import_module(name)
            return mod, cand
        except Exception as e:  # noqa: BLE001
            errors.append(f"{cand}: {one_line(e)}")
            sys.path.remove(cand)
    raise ImportError("; ".join(errors))


def parse_missing_ranks_table(text: str) -> list[int]:
    ranks: set[int] = set()
    in_table = False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("PGID") and "Missing Ranks" in s:
            in_table = True
            continue
        if not in_table or "|" not in s:
            continue
        cols = [c.strip() for c in s.split("|")]
        if len(cols) < 6:
            continue
        ranks.update(int(t) for t in re.findall(r"\d+", cols[-1]))
    return sorted(ranks)


def run_nvrx(folder: Path, pattern: str, src: str | None) -> dict:
    out: dict = {"ranks": [], "error": None, "pattern": pattern, "source": None, "table": None}
    t0 = time.monotonic()
    try:
        mod, where = _nvrx_module(src)
        out["source"] = where
    except Exception as e:  # noqa: BLE001
        out["error"] = f"import failed: {one_line(e)}"
        return out
    args = {
        "fr_path": str(folder),
        "pattern": pattern,
        "verbose": False,
        "health_check": False,
        "llm_analyze": False,
        "debug": False,
        "threshold": None,
    }
    noise = io.StringIO()
    loop = asyncio.new_event_loop()
    try:
        with contextlib.redirect_stdout(noise), contextlib.redirect_stderr(noise):
            analyzer = mod.CollectiveAnalyzer(args)
            table = loop.run_until_complete(analyzer.preprocess_FR_dumps())
            table = loop.run_until_complete(analyzer.collective_analysis(table)) or table
        out["table"] = table
        out["ranks"] = parse_missing_ranks_table(table)
    except Exception as e:  # noqa: BLE001
        out["error"] = one_line(e)
    finally:
        loop.close()
    # files it could not read are only reported on stderr; keep them visible
    bad = [l for l in noise.getvalue().splitlines() if l.startswith("Error processing")]
    if bad:
        out["file_errors"] = bad
    out["seconds"] = round(time.monotonic() - t0, 2)
    return out


# ---------------------------------------------------------------- fr_trace


def torch_python(arg: str | None) -> str:
    for cand in (arg, os.environ.get("WHYSLOW_TORCH_PYTHON")):
        if cand:  # named explicitly: used as given, so a wrong one fails visibly
            return shutil.which(cand) or cand
    venv = REPO / ".venv-peers/bin/python"
    return str(venv) if os.access(venv, os.X_OK) else sys.executable


def run_fr_trace(folder: Path, prefix: str, python: str, extra: list[str]) -> dict:
    out: dict = {"ranks": [], "error": None, "prefix": prefix, "first_ranks": [], "reports": 0}
    cmd = [python, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "-p", prefix, *extra]
    out["python"] = python
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800,
                           env={**os.environ, "PYTHONWARNINGS": "ignore"})
    except subprocess.TimeoutExpired:
        out["error"] = "timed out after 1800 s"
        return out
    except OSError as e:
        out["error"] = one_line(e)
        return out
    out["seconds"] = round(time.monotonic() - t0, 2)
    text = p.stdout + "\n" + p.stderr
    ranks: set[int] = set()
    for line in text.splitlines():
        found: set[int] = set()
        m = re.match(r"missing ranks: \{([^}]*)\}", line)
        if m:
            found = {int(x) for x in re.findall(r"\d+", m.group(1))}
        if line.startswith("error msg:"):
            found = {int(x) for x in re.findall(r"Culprit rank (\d+)", line)}
        if found:
            out["reports"] += 1
            if not out["first_ranks"]:
                out["first_ranks"] = sorted(found)
            ranks |= found
    if p.returncode != 0:
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        exc = [l for l in lines if re.match(r"^[\w.]+(Error|Exception|Exit)\b", l)]
        out["error"] = (exc[-1] if exc else (lines[-1] if lines else f"exit status {p.returncode}")).strip()
        out["ranks"], out["first_ranks"] = [], []
        out["partial_ranks_before_failure"] = sorted(ranks)
    else:
        out["ranks"] = sorted(ranks)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--pattern", help="NVRx glob (default: <detected prefix>*)")
    ap.add_argument("--nvrx-src", help="folder holding nvidia_resiliency_ext/ (a checkout's src/)")
    ap.add_argument("--torch-python", help="interpreter that has torch (default: .venv-peers/bin/python)")
    ap.add_argument("--fr-trace-args", default="", help="extra fr_trace arguments, e.g. '--allow-incomplete-ranks'")
    ap.add_argument("--table", action="store_true", help="keep NVRx's printed table in the JSON")
    ap.add_argument("--fill-pg-config", action="store_true",
                    help="replace each dump's pg_config by the groups in stacks-rank*.json (gloo dumps "
                         "from torch 2.15 carry only a placeholder group); off by default")
    a = ap.parse_args()

    folder = a.dir.resolve()
    prefix = detect_prefix(folder, a.pattern)
    pattern = a.pattern or f"{prefix}*"

    with tempfile.TemporaryDirectory(prefix="hang_peers_") as tmp:
        staged = Path(tmp)
        pg = groups_from_stacks(folder) if a.fill_pg_config else None
        dump_ranks = stage(folder, prefix, staged, pg)
        nvrx = run_nvrx(staged, pattern, a.nvrx_src)
        if not a.table:
            nvrx.pop("table", None)
        fr = run_fr_trace(staged, prefix, torch_python(a.torch_python), a.fr_trace_args.split())
    print(json.dumps({"dir": str(a.dir), "dump_ranks": dump_ranks, "pg_config_filled": a.fill_pg_config,
                      "nvrx": nvrx, "fr_trace": fr}))


if __name__ == "__main__":
    main()
