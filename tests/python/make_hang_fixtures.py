"""Records the injected hangs of hang_cases.py into tests/fixtures/hang/
and regenerates the hang accuracy table of docs/accuracy.md: per case, the
culprits whyslow names (`whyslow hang --format json`) and those PyTorch's
own Flight Recorder analyzer names (`python -m
torch.distributed.flight_recorder.fr_trace`, in the same run), against the
truth. Run through scripts/make-hang-fixtures.

torch's analyzer reads each group's members from the dump's `pg_config`,
which gloo process groups leave empty; it is run on the dumps as recorded
and, to give it its best chance, on copies whose `pg_config` is filled in
from the groups whyslow's stack files list. Its verdict is taken as the
ranks it reports missing from a collective or mismatched.
"""

import argparse
import glob
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile

import hang_cases

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BEGIN = "<!-- hang-accuracy:begin (scripts/make-hang-fixtures) -->"
END = "<!-- hang-accuracy:end -->"


def whyslow_verdict(binary, folder):
    out = subprocess.run([binary, "hang", folder, "--format", "json"], capture_output=True, text=True,
                         timeout=120)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1:] or ["failed"]
    return json.loads(out.stdout), None


def torch_verdict(folder, repaired):
    """(ranks named, note) from torch's analyzer; ranks None when it fails."""
    with tempfile.TemporaryDirectory() as tmp:
        groups = {}
        for f in glob.glob(os.path.join(folder, "stacks-rank*.json")):
            for g in json.load(open(f)).get("groups", []):
                groups[g["name"]] = {"name": g["name"], "desc": g["desc"], "ranks": str(g["ranks"])}
        dumps = sorted(glob.glob(os.path.join(folder, "fr_trace_rank_*")))
        if not dumps:
            return None, "no dumps"
        for f in dumps:
            with open(f, "rb") as fh:
                d = pickle.load(fh)  # our own recorded fixtures, not foreign files
            if repaired:
                d["pg_config"] = groups
            with open(os.path.join(tmp, os.path.basename(f)), "wb") as fh:
                pickle.dump(d, fh)
        cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", tmp, "-p", "fr_trace_rank_"]
        if len(dumps) < 4:
            cmd.append("--allow-incomplete-ranks")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        text = out.stdout + out.stderr
        if out.returncode != 0:
            last = [l for l in text.strip().splitlines() if l.strip()][-1:] or ["failed"]
            return None, "fails: %s" % last[0][:90]
        named = set()
        for m in re.finditer(r"missing ranks: \{([0-9, ]*)\}", text):
            named |= {int(x) for x in m.group(1).split(",") if x.strip()}
        for m in re.finditer(r"(?:mismatch|Mismatch)[^\n]*rank[s]? ?\{?([0-9, ]+)", text):
            named |= {int(x) for x in m.group(1).split(",") if x.strip()}
        missed = set()
        for m in re.finditer(r"missed FR dumps from ranks \(\{([0-9, ]*)\}\)", text):
            missed |= {int(x) for x in m.group(1).split(",") if x.strip()}
        return named, ("cannot decide: no dumps from %s" % ",".join(map(str, sorted(missed)))) if missed else ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures", "hang"))
    ap.add_argument("--doc", default=os.path.join(ROOT, "docs", "accuracy.md"))
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "debug", "whyslow"))
    ap.add_argument("--cases", nargs="*", default=list(hang_cases.CASES))
    ap.add_argument("--reuse", action="store_true", help="judge the recorded fixtures, run no job")
    a = ap.parse_args()
    import torch

    rows = []
    # Cases recorded elsewhere (the 4-host testbed, as root) are judged as
    # recorded.
    others = sorted(d for d in os.listdir(a.out)
                    if d not in hang_cases.CASES and os.path.exists(os.path.join(a.out, d, "truth.json")))
    for name in list(a.cases) + others:
        dest = os.path.join(a.out, name)
        if not a.reuse and name in hang_cases.CASES:
            with tempfile.TemporaryDirectory() as work:
                folder, log, secs = hang_cases.run_case(name, work)
                if folder is None:
                    sys.exit("%s: the job left no evidence; its log:\n%s" % (name, log[-3000:]))
                hang_cases.record(name, folder, dest)
                print("%s: recorded in %.0f s" % (name, secs), flush=True)
        truth = json.load(open(os.path.join(dest, "truth.json")))
        report, err = whyslow_verdict(a.binary, dest)
        if report is None:
            ours = "error: %s" % err
            ok = False
        else:
            ok, why = hang_cases.judge(report, truth)
            ours = ", ".join("%d %s in %s" % (c["rank"], c["reason"], c["group_desc"] or "?")
                             for c in report["culprits"]) or "no hang"
            if not ok:
                ours += " (%s)" % why
        want = sorted(int(k) for k in truth["culprits"])
        theirs = []
        for repaired in (False, True):
            named, note = torch_verdict(dest, repaired)
            if named is None:
                theirs.append(note)
            else:
                right = sorted(named) == want
                theirs.append("%s (%s)%s" % (
                    ", ".join(map(str, sorted(named))) or "nothing",
                    "right" if right else "wrong",
                    "; " + note if note else ""))
        rows.append((name, truth.get("about", ""), ", ".join(map(str, want)) or "none (no hang)",
                     ("**right**: " if ok else "**wrong**: ") + ours, theirs[0], theirs[1]))
        print(rows[-1], flush=True)

    table = [BEGIN, "",
             "Injected hangs in a real torchrun job (4 CPU ranks, gloo, 2 dp x 2 tp; torch %s), "
             "recorded in `tests/fixtures/hang/`; regenerate with `scripts/make-hang-fixtures` "
             "(`--reuse` judges the recorded files without running jobs)." % torch.__version__, "",
             "| case | injected | culprits (truth) | whyslow hang | torch fr_trace, as dumped | "
             "torch fr_trace, pg_config filled in |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        table.append("| " + " | ".join(x.replace("|", "/") for x in r) + " |")
    table += ["", END]
    text = open(a.doc).read() if os.path.exists(a.doc) else "# Accuracy\n"
    block = "\n".join(table)
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n## Hangs: the culprit named (issue 27)\n\n" + block + "\n"
    open(a.doc, "w").write(text)
    bad = [r[0] for r in rows if not r[3].startswith("**right**")]
    if bad:
        sys.exit("whyslow named the wrong culprits in: %s" % ", ".join(bad))


if __name__ == "__main__":
    main()
