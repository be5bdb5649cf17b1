#!/usr/bin/env bash
# A starved process's CPU share as its own in-cgroup sampler reads it, against
# its own clock (BENCHMARKS.md, "A starved rank's in-process sampler overstated
# its CPU share"). A spinner busy 20 ms of every 40 ms shares a cgroup v1 CPU
# group capped at half a core (pinned to core 0) with HOGS busy loops;
# `whyslow sample` runs inside the same group at 1 kHz. Prints the spinner's
# own CPU share over its busy phases and the mean of the samples that fall in
# them. Needs root and cgroup v1's cpu controller.
# Usage: benches/starved_sampler.sh [WHYSLOW_BIN] [HOGS]
set -euo pipefail
bin="${1:-target/debug/whyslow}"
hogs="${2:-8}"
cg=/sys/fs/cgroup/cpu/whyslow-starve-$$
[ -d /sys/fs/cgroup/cpu ] || { echo "needs cgroup v1's cpu controller" >&2; exit 2; }
work=$(mktemp -d)
mkdir "$cg"
echo 10000 > "$cg/cpu.cfs_period_us"
echo 5000 > "$cg/cpu.cfs_quota_us"
pids=()
cleanup() {
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rmdir "$cg" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
enter() { echo $BASHPID > "$cg/cgroup.procs"; exec taskset -c 0 "$@"; }
for _ in $(seq "$hogs"); do (enter sh -c 'while :; do :; done') & pids+=($!); done
cat > "$work/spin.py" <<'PY'
import os, sys, time
open(sys.argv[2] + ".pid", "w").write(str(os.getpid()))
end = time.monotonic() + float(sys.argv[1])
busy_wall = busy_cpu = 0.0
with open(sys.argv[2], "w") as log:
    while time.monotonic() < end:
        t0, c0 = time.monotonic(), time.thread_time()
        log.write("B %d\n" % time.clock_gettime_ns(time.CLOCK_REALTIME))
        while time.monotonic() - t0 < 0.02:
            pass
        log.write("E %d\n" % time.clock_gettime_ns(time.CLOCK_REALTIME))
        busy_wall += time.monotonic() - t0
        busy_cpu += time.thread_time() - c0
        time.sleep(0.02)
print("spinner's own clock over its busy phases: %.3f" % (busy_cpu / busy_wall))
PY
(enter python3 "$work/spin.py" 8 "$work/phases.log") & spin=$!
for _ in $(seq 100); do [ -s "$work/phases.log.pid" ] && break; sleep 0.05; done
(enter "$bin" sample --pid "$(cat "$work/phases.log.pid")" --rate 1000 -o "$work/s.samples.csv") 2>"$work/sample.err" &
pids+=($!)
wait "$spin"
sleep 1; cat "$work/sample.err" >&2
python3 - "$work" <<'PY'
import bisect, csv, sys
work = sys.argv[1]
spans, begin = [], None
for kind, t in (line.split() for line in open(work + "/phases.log")):
    if kind == "B":
        begin = int(t) / 1e3
    elif begin is not None:
        spans.append((begin, int(t) / 1e3))
        begin = None
rows = [(float(r["ts_us"]), float(r["value"]))
        for r in csv.DictReader(open(work + "/s.samples.csv")) if r["resource"] == "cpu"]
ts = [t for t, _ in rows]
inside = [rows[i][1] for s, e in spans
          for i in range(bisect.bisect_left(ts, s), bisect.bisect_left(ts, e))]
print("samples %d, in busy phases %d, their mean %.3f"
      % (len(rows), len(inside), sum(inside) / max(1, len(inside))))
PY
