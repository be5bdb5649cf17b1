"""Injected hangs in a real torchrun job (tests/python/hang_train.py: 4 CPU
ranks, gloo, 2 dp x 2 tp), their truth, and how each is run. Used by
test_hang.py (live, with the online package) and by
scripts/make-hang-fixtures (recorded into tests/fixtures/hang/ and the
accuracy table of docs/accuracy.md).

Truth per case: the culprit ranks and, for each, the reason and the
groups (by description) whose members wait for it; `"hang": False` for
cases that must stay silent.
"""

import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "hang_train.py")

CASES = {
    "sleep": {
        "args": ["--hang", "sleep", "--hang-rank", "2"],
        "truth": {"hang": True, "culprits": {2: {"reason": "never_reached", "groups": ["tp", "dp"],
                                                "function": "stalled_data_loader"}}},
        "about": "rank 2 sleeps in Python (stalled_data_loader) before its step",
    },
    "gil": {
        "args": ["--hang", "gil", "--hang-rank", "1"],
        "truth": {"hang": True, "culprits": {1: {"reason": "unresponsive", "groups": ["tp", "dp"],
                                                "function": None}}},
        "about": "rank 1 holds the GIL in native code (libc sleep through ctypes.PyDLL)",
    },
    "exit": {
        "args": ["--hang", "exit", "--hang-rank", "3"],
        "truth": {"hang": True, "culprits": {3: {"reason": "exited", "groups": ["tp", "dp"],
                                                "function": None}}},
        "about": "rank 3's process exits (status 0: torchrun waits for the others)",
    },
    "mismatch": {
        "args": ["--hang", "mismatch", "--hang-rank", "2"],
        "truth": {"hang": True, "culprits": {2: {"reason": "mismatch", "groups": ["dp"],
                                                "function": None}}},
        "about": "rank 2 skips one dp all-reduce (skip_gradient_sync): its collectives no longer pair",
    },
    "slow": {
        "args": ["--hang", "slow", "--hang-rank", "2", "--slow-ms", "150", "--dump-after-s", "6",
                 "--steps", "200", "--hang-at", "20"],
        "truth": {"hang": False, "culprits": {}},
        "about": "not a hang: rank 2 sleeps 150 ms every step; every rank dumps mid-run",
    },
    "healthy": {
        "args": ["--hang", "none", "--dump-after-s", "2", "--steps", "1200"],
        "truth": {"hang": False, "culprits": {}},
        "about": "not a hang: a healthy job; every rank dumps mid-run",
    },
    "pp-sleep": {
        "args": ["--layout", "pp", "--hang", "sleep", "--hang-rank", "3"],
        "truth": {"hang": True, "culprits": {3: {"reason": "never_reached", "groups": ["dp", "pp"],
                                                "function": "stalled_data_loader"}}},
        "about": "2 pipeline stages x 2 dp: rank 3 (stage 1) sleeps in Python before its step; "
                 "its stage-0 peer waits in recv, that peer's dp partner in the all-reduce",
    },
    "pp-gil": {
        "args": ["--layout", "pp", "--hang", "gil", "--hang-rank", "1"],
        "truth": {"hang": True, "culprits": {1: {"reason": "unresponsive", "groups": ["dp", "pp"],
                                                "function": None}}},
        "about": "2 pipeline stages x 2 dp: rank 1 (stage 0) holds the GIL in native code before "
                 "its send; its stage-1 peer waits in recv",
    },
}

ENV = {
    "WHYSLOW_THRESHOLD": "1.0",  # no slowdown windows: hangs only
    "WHYSLOW_SAMPLE_HZ": "0",
    "WHYSLOW_HANG_GATHER_S": "8",
    "WHYSLOW_HANG_GRACE_S": "3",
    "WHYSLOW_LOG_LEVEL": "INFO",
    "OMP_NUM_THREADS": "1",
}


def _children(pid):
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                kids.append(int(d))
    return kids


def kill_tree(p):
    """Kills torchrun, its ranks and what they forked (a hung rank never
    ends by itself)."""
    todo, seen = [p.pid], []
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo.extend(_children(pid))
    for pid in reversed(seen):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    p.wait()


def run_case(name, workdir, python=sys.executable, timeout=90):
    """Runs one case; returns (folder with the ranks' evidence, run log,
    seconds). A hanging case is stopped once its hang report is written
    (or at `timeout`)."""
    case = CASES[name]
    os.makedirs(workdir, exist_ok=True)
    reports = os.path.join(workdir, "reports")
    dumps = os.path.join(workdir, "dumps")
    env = dict(os.environ)
    env.update(ENV)
    env["WHYSLOW_REPORT_DIR"] = reports
    env["HANG_DUMP_DIR"] = dumps
    env.pop("WHYSLOW_DISABLE", None)
    cmd = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", TRAIN] + case["args"]
    log_path = os.path.join(workdir, "run.log")
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        p = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        folder = None
        while time.monotonic() - t0 < timeout:
            if p.poll() is not None:
                break
            done = glob.glob(os.path.join(reports, "*", "hang-*", "hang-report.json"))
            if done:
                folder = os.path.dirname(done[0])
                time.sleep(0.5)
                break
            time.sleep(0.25)
        kill_tree(p)
    if folder is None:
        found = glob.glob(os.path.join(reports, "*", "hang-*"))
        folder = found[0] if found else (dumps if os.path.isdir(dumps) else None)
    with open(log_path) as f:
        out = f.read()
    return folder, out, time.monotonic() - t0


def record(name, folder, dest):
    """Keeps a case's evidence (dumps and stack files, not the report) in
    `dest`, with its truth."""
    if os.path.exists(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    for f in sorted(os.listdir(folder)):
        if f.startswith("fr_trace_rank_") or f.startswith("stacks-rank"):
            shutil.copy(os.path.join(folder, f), os.path.join(dest, f))
    with open(os.path.join(dest, "truth.json"), "w") as f:
        json.dump({"case": name, "about": CASES[name]["about"], "args": CASES[name]["args"],
                   **{k: v for k, v in CASES[name]["truth"].items() if k != "culprits"},
                   "culprits": {str(k): v for k, v in CASES[name]["truth"]["culprits"].items()}},
                  f, indent=1)


def judge(report, truth):
    """(right?, why): the culprits named against the truth (ranks, reason,
    a group whose members wait for it, the injected function on the stack)."""
    if not truth["hang"]:
        ok = not report["culprits"] and not report["hang"]
        return ok, "silent" if ok else "named %s" % [c["rank"] for c in report["culprits"]]
    named = {c["rank"]: c for c in report["culprits"]}
    want = {int(k): v for k, v in truth["culprits"].items()}
    if set(named) != set(want):
        return False, "culprits %s, want %s" % (sorted(named), sorted(want))
    for r, t in want.items():
        c = named[r]
        if c["reason"] != t["reason"]:
            return False, "rank %d: reason %s, want %s" % (r, c["reason"], t["reason"])
        if c["group_desc"] not in t["groups"]:
            return False, "rank %d: group %s, want one of %s" % (r, c["group_desc"], t["groups"])
        fn = t.get("function")
        if fn:
            frames = (c.get("stack") or {}).get("frames") or []
            if not any(f["function"] == fn for f in frames):
                return False, "rank %d: no %s on its stack" % (r, fn)
    return True, "right"
