"""A program of known shape for the stack profiler's tests (issue 12):

* thread `compress`: a Python function calling zlib.compress in a loop
  (→ the zlib extension module → libz's deflate);
* thread `stat`: os.stat over many deep paths (→ the kernel's path lookup).

Each thread names itself (prctl PR_SET_NAME) so samples can be told apart.
Prints `ready` once both run; runs until killed (or 60 s).
"""

import ctypes
import os
import sys
import tempfile
import threading
import time
import zlib

PR_SET_NAME = 15
libc = ctypes.CDLL(None, use_errno=True)


def name_thread(name):
    libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0)


def compress_forever(data):
    name_thread("compress")
    while True:
        zlib.compress(data, 9)


def stat_forever(paths):
    name_thread("stat")
    while True:
        for p in paths:
            os.stat(p)


def main():
    root = tempfile.mkdtemp(prefix="whyslow-shape-")
    deep = os.path.join(root, *["d%02d" % i for i in range(64)])
    os.makedirs(deep)
    paths = []
    for i in range(64):
        p = os.path.join(deep, "f%02d" % i)
        open(p, "w").close()
        paths.append(p)
    # Incompressible-ish data keeps deflate busy (level 9 searches hard).
    data = bytes((i * 7919 + (i >> 3) * 104729) & 0xFF for i in range(1 << 20))
    for target, arg in ((compress_forever, data), (stat_forever, paths)):
        threading.Thread(target=target, args=(arg,), daemon=True).start()
    time.sleep(0.3)
    print("ready", flush=True)
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 60.0)


if __name__ == "__main__":
    main()
