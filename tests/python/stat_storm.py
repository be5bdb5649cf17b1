"""A neighbour that keeps the kernel's path walk busy: THREADS threads
(default 4) stat and open files at the end of a 24-deep directory chain, and
stat names that do not exist there, until killed. os.stat and os.open release
the GIL, so the threads spend their time in the kernel (path lookup, dentry
cache) rather than in the interpreter. Used by the testbed's exec fault."""
import os
import sys
import tempfile
import threading

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 4


def storm(base, k):
    leaf = os.path.join(base, "f")
    missing = [os.path.join(base, "missing-%d-%d" % (k, i)) for i in range(64)]
    while True:
        for m in missing:
            try:
                os.stat(m)
            except FileNotFoundError:
                pass
            os.stat(leaf)
            os.close(os.open(leaf, os.O_RDONLY))


def main():
    root = tempfile.mkdtemp(prefix="stat-storm-")
    base = os.path.join(root, *("d%02d" % i for i in range(24)))
    os.makedirs(base)
    open(os.path.join(base, "f"), "w").close()
    print("stat storm: %d threads under %s" % (THREADS, root), flush=True)
    for k in range(THREADS):
        threading.Thread(target=storm, args=(base, k), daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main()
