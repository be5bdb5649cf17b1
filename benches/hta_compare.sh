#!/usr/bin/env bash
# whyslow vs. HolisticTraceAnalysis on the same trace directory, in one run.
# Usage: benches/hta_compare.sh TRACE_DIR   (needs: pip install holistictraceanalysis)
set -euo pipefail
dir=$1
bin=${WHYSLOW_BIN:-target/release/whyslow}
# Times a command; a failing command aborts the comparison instead of timing an error.
t() {
  local s e
  s=$(date +%s.%N)
  "$@" >/dev/null 2>/tmp/hta_compare.err || { echo "failed: $*" >&2; cat /tmp/hta_compare.err >&2; exit 1; }
  e=$(date +%s.%N)
  echo "$e - $s" | bc
}
for i in 1 2 3; do
  hta=$(t python3 -c "from hta.trace_analysis import TraceAnalysis; a = TraceAnalysis(trace_dir='$dir'); assert sum(len(d) for d in a.t.traces.values()) > 0")
  ws=$(t "$bin" analyze "$dir" --format json)
  ws1=$(t taskset -c 0 "$bin" analyze "$dir" --format json)
  echo "run $i: HTA load ${hta}s   whyslow analyze ${ws}s (ratio $(echo "$hta / $ws" | bc -l | cut -c1-5)x)   whyslow on one core ${ws1}s (ratio $(echo "$hta / $ws1" | bc -l | cut -c1-5)x)"
done
