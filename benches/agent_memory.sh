#!/usr/bin/env bash
# The node agent's memory with host-wide profiling (issue 32): four PyTorch
# loops run, `whyslow agent --profile-host` (its default unwinding unless
# more agent arguments are given) profiles the host, and its VmHWM, VmRSS,
# RssAnon and RssFile are printed every 2 s.
#
#   benches/agent_memory.sh WHYSLOW [SECONDS] [AGENT ARGS…]
#   benches/agent_memory.sh target/release/whyslow 40
#   benches/agent_memory.sh target/release/whyslow 40 --profile-unwind fp
set -euo pipefail
bin=$(realpath "${1:?usage: $0 WHYSLOW [SECONDS] [AGENT ARGS…]}")
secs=${2:-30}
shift $(( $# >= 2 ? 2 : 1 ))
py=${PYTHON:-$(dirname "$0")/../.venv/bin/python}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cat > "$work/loop.py" <<'PY'
import sys, time, torch
m = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
opt = torch.optim.SGD(m.parameters(), lr=0.01)
x = torch.randn(32, 256)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    opt.zero_grad(); m(x).sum().backward(); opt.step(); time.sleep(0.002)
PY
for _ in 1 2 3 4; do "$py" "$work/loop.py" $((secs + 15)) & done
sleep 6
mkdir -p "$work/d" "$work/s"
"$bin" agent --samples-dir "$work/d" --profile-spool "$work/s" --profile-host \
  --profile-period 10 "$@" > "$work/agent.log" 2>&1 &
agent=$!
for t in $(seq 2 2 "$secs"); do
  sleep 2
  echo "t=${t}s $(grep -E 'VmHWM|VmRSS|RssAnon|RssFile' /proc/$agent/status | tr -s ' \n' ' ')"
done
kill -INT $agent
wait $agent 2>/dev/null || true
