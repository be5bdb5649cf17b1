#!/usr/bin/env python3
"""Frame accuracy of the eBPF engine's user stack walks (SysOM-AI Fig. 3):
frame pointers only, DWARF rows only, hybrid, against a reference unwind.

The workload is the stack profiler's program of known shape
(crates/inputs/stacks/tests/known_shape.py: Python -> the zlib extension ->
libz, and Python -> os.stat -> the kernel) on a CPython built without frame
pointers. The reference is `whyslow profile --engine perf --no-python`:
copied user stacks unwound in userspace with full DWARF CFI (framehop), the
interpreter's frames kept.

Per sample, the user frames are compared innermost first: frame i counts as
right when frames 0..=i are the innermost frames of some reference stack.
Accuracy = right frames / frames of the best-matching reference stacks (a
walk that stops early loses the frames it did not reach). Frames of
stripped code are compared by module (`libz.so.1+0x5f77` -> `libz.so.1`):
the reference and the sample need not stop at the same instruction. These
runs keep the interpreter's frames (`--no-python`).

Python frames (walked in the kernel at the tick, bpf/python.bpf.h): each
eBPF mode runs again with them, and each sample of the two threads is checked
against the program's known Python stack, root first: Thread._bootstrap,
Thread._bootstrap_inner, Thread.run, then compress_forever or stat_forever.
Python frame accuracy = right Python frames (a common prefix from the root) /
expected ones; "exact" = samples whose Python stack is exactly the known one.

    python3 benches/frame_accuracy.py --whyslow target/release/whyslow [--python python3.11] [--seconds 10]
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = os.path.join(HERE, "..", "crates", "inputs", "stacks", "tests", "known_shape.py")


def read_folded(path):
    """{(thread, innermost-first user frames): count}."""
    out = collections.Counter()
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, n = line.rpartition(" ")
            frames = stack.split(";")
            thread, frames = frames[0], frames[1:]
            user = [re.sub(r"\+0x[0-9a-f]+$", "", x) for x in frames if not x.endswith("_[k]")]
            out[(thread, tuple(reversed(user)))] += int(n)
    return out


PY_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")
KNOWN_PYTHON = {
    "compress": ["Thread._bootstrap", "Thread._bootstrap_inner", "Thread.run", "compress_forever"],
    "stat": ["Thread._bootstrap", "Thread._bootstrap_inner", "Thread.run", "stat_forever"],
}


def python_accuracy(path):
    """(right Python frames, expected, exact samples, samples) of the two
    threads' samples in a folded profile, against KNOWN_PYTHON."""
    right = expected = exact = samples = 0
    with open(path) as f:
        for line in f:
            stack, _, n = line.rstrip("\n").rpartition(" ")
            frames = stack.split(";")
            want = KNOWN_PYTHON.get(frames[0])
            if want is None or not n:
                continue
            n = int(n)
            # CPython 3.10 names functions without their class (co_name).
            got = [m.group(1) for m in map(PY_FRAME.match, frames[1:]) if m]
            if got and "." not in "".join(got):
                want = [w.rsplit(".", 1)[-1] for w in want]
            common = 0
            for a, b in zip(got, want):
                if a != b:
                    break
                common += 1
            right += common * n
            expected += max(len(want), len(got)) * n
            exact += n if got == want else 0
            samples += n
    return right, expected, exact, samples


def accuracy(sample, reference):
    refs = collections.defaultdict(list)
    for (thread, frames), _ in reference.items():
        refs[thread].append(frames)
    right = expected = samples = 0
    for (thread, frames), n in sample.items():
        if thread not in refs:
            continue
        best_common, best_len = -1, 0
        for r in refs[thread]:
            common = 0
            for a, b in zip(frames, r):
                if a != b:
                    break
                common += 1
            if common > best_common or (common == best_common and len(r) < best_len):
                best_common, best_len = common, len(r)
        right += best_common * n
        expected += max(best_len, len(frames)) * n
        samples += n
    return right, expected, samples


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--whyslow", default="target/release/whyslow")
    ap.add_argument("--python", default=os.environ.get("PYTHON", "python3"))
    ap.add_argument("--seconds", type=float, default=10.0)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="whyslow-frames-")
    child = subprocess.Popen([a.python, SHAPE, "600"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        runs = [("reference (perf, DWARF in userspace)", ["--engine", "perf", "--no-python"])]
        for mode in ("fp", "dwarf", "hybrid"):
            runs.append((mode, ["--engine", "ebpf", "--unwind", mode, "--no-python"]))
        for mode in ("fp", "dwarf", "hybrid"):
            runs.append((mode + "+python", ["--engine", "ebpf", "--unwind", mode]))
        results = {}
        for name, flags in runs:
            out = os.path.join(tmp, name.split()[0] + ".folded")
            p = subprocess.run(
                [a.whyslow, "profile", "--pid", str(child.pid), "--duration", str(a.seconds), "-o", out] + flags,
                capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit("%s failed: %s" % (name, p.stderr))
            results[name] = python_accuracy(out) if name.endswith("+python") else read_folded(out)
            time.sleep(0.5)
    finally:
        child.kill()
        child.wait()
    ref = results.pop("reference (perf, DWARF in userspace)")
    python = {k[: -len("+python")]: results.pop(k) for k in list(results) if k.endswith("+python")}
    print("| user stack walk | samples | frames per sample | frames right | frame accuracy |")
    print("|---|---|---|---|---|")
    for name, prof in results.items():
        right, expected, samples = accuracy(prof, ref)
        frames = sum(len(f) * n for (_, f), n in prof.items())
        print("| %s | %d | %.1f | %d of %d | **%.1f %%** |" % (
            name, samples, frames / max(samples, 1), right, expected, 100.0 * right / max(expected, 1)))
    rsamples = sum(ref.values())
    rframes = sum(len(f) * n for (_, f), n in ref.items())
    print("| reference | %d | %.1f | | |" % (rsamples, rframes / max(rsamples, 1)))
    print()
    print("| eBPF walk, Python frames on | samples of the two threads | Python frames right | Python frame accuracy | exact Python stacks |")
    print("|---|---|---|---|---|")
    for name, (right, expected, exact, samples) in python.items():
        print("| %s | %d | %d of %d | **%.1f %%** | %.1f %% |" % (
            name, samples, right, expected, 100.0 * right / max(expected, 1), 100.0 * exact / max(samples, 1)))


if __name__ == "__main__":
    main()
