#!/usr/bin/env python3
"""The hang table of docs/accuracy.md: whyslow, torch's fr_trace and NVRx's
FR attribution side by side on every labelled case (issue 42).

    python3 scripts/accuracy/hang_table.py [--whyslow target/release/whyslow] [--write]

Cases:
* tests/fixtures/hang/nvrx-*: real Megatron dumps on NCCL from NVRx's tests
  (Apache-2.0); truth: the case's fault_injection.log;
* tests/fixtures/hang/<case>: whyslow's own recordings (torchrun, gloo, with
  the online package's stack files); truth: truth.json;
* "<case>, dumps only": the same folders with torch's dumps alone (what a
  user without whyslow's package has), where the culprit may have left no
  dump at all.

The peers run through hang_peers.py (NVRx from its source, fr_trace from a
venv with torch: see hang_peers.md). `--write` replaces the table between
the hang-table markers in docs/accuracy.md.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HANG = ROOT / "tests" / "fixtures" / "hang"
OURS = ["sleep", "gil", "exit", "mismatch", "slow", "healthy", "testbed-sleep", "testbed-gil",
        "pp-sleep", "pp-gil"]
DUMPS_ONLY = ["sleep", "gil", "exit", "mismatch", "testbed-gil", "pp-sleep", "pp-gil", "slow", "healthy"]


def truth(case_dir: Path) -> list[int]:
    log = case_dir / "fault_injection.log"
    if log.exists():
        m = re.search(r"Fault ranks: \[([^\]]*)\]", log.read_text())
        return sorted(int(x) for x in m.group(1).split(",")) if m else []
    t = json.loads((case_dir / "truth.json").read_text())
    return sorted(int(r) for r in t["culprits"]) if t["hang"] else []


def whyslow(binary: str, d: Path) -> tuple[list[int], str]:
    p = subprocess.run([binary, "hang", str(d), "--format", "json"], capture_output=True, text=True)
    if p.returncode != 0:
        return [], "fails: " + p.stderr.strip().splitlines()[-1]
    r = json.loads(p.stdout)
    ranks = []
    for c in r["culprits"]:
        last = c.get("last_rank")
        ranks.extend(range(c["rank"], (last if last is not None else c["rank"]) + 1))
    how = "; ".join(f"{c['rank']} {c['reason']}" for c in r["culprits"])
    return sorted(ranks), how


def peers(d: Path, fill: bool) -> dict:
    args = [sys.executable, str(ROOT / "scripts/accuracy/hang_peers.py"), str(d)]
    if fill:
        args += ["--fill-pg-config", "--fr-trace-args=--allow-incomplete-ranks"]
    p = subprocess.run(args, capture_output=True, text=True)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"nvrx": {"ranks": [], "error": p.stderr.strip()[-200:]},
                "fr_trace": {"ranks": [], "error": p.stderr.strip()[-200:]}}


def cell(ranks: list[int], want: list[int], error: str | None = None, how: str = "") -> str:
    if error:
        return f"fails: {error}"
    shown = ",".join(map(str, ranks)) if ranks else "nothing"
    mark = "**exact**" if ranks == want else "wrong"
    return f"{mark}: {shown}" + (f" ({how})" if how else "")


def row(name: str, d: Path, want: list[int], binary: str, fill: bool) -> str:
    ours, how = whyslow(binary, d)
    ours_cell = how if how.startswith("fails") else cell(ours, want, how=how)
    pr = peers(d, fill)
    nv, fr = pr.get("nvrx", {}), pr.get("fr_trace", {})
    return "| {} | {} | {} | {} | {} |".format(
        name, ",".join(map(str, want)) or "none (no hang)", ours_cell,
        cell(sorted(fr.get("ranks") or []), want, fr.get("error")),
        cell(sorted(nv.get("ranks") or []), want, nv.get("error")))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--whyslow", default=str(ROOT / "target/release/whyslow"))
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    lines = [
        "| case | culprits (truth) | whyslow hang | torch fr_trace | NVRx FR attribution |",
        "|---|---|---|---|---|",
    ]
    for d in sorted(HANG.glob("nvrx-*")):
        lines.append(row(f"{d.name} (NVRx, Megatron, NCCL)", d, truth(d), a.whyslow, False))
    for c in OURS:
        # The peers cannot read gloo's empty pg_config: they get it filled
        # in from whyslow's stack files (their best case).
        lines.append(row(f"{c} (ours, gloo, with stack files; peers: pg_config filled in)",
                         HANG / c, truth(HANG / c), a.whyslow, True))
    for c in DUMPS_ONLY:
        with tempfile.TemporaryDirectory() as t:
            for f in (HANG / c).glob("fr_trace_rank_*"):
                if not f.name.endswith(".json"):
                    shutil.copy(f, t)
            lines.append(row(f"{c}, torch's dumps only", Path(t), truth(HANG / c), a.whyslow, False))
    table = "\n".join(lines)
    print(table)
    if a.write:
        doc = ROOT / "docs/accuracy.md"
        text = doc.read_text()
        begin, end = "<!-- hang-table:begin (scripts/accuracy/hang_table.py) -->", "<!-- hang-table:end -->"
        i, j = text.index(begin) + len(begin), text.index(end)
        doc.write_text(text[:i] + "\n\n" + table + "\n\n" + text[j:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
