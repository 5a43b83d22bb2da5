#!/usr/bin/env bash
# What the external processor costs beside CheckAndReserve + Commit
# (docs/benchmarks.md, "The external processor"): a `ctxbudget serve` on a
# free port, driven the same way twice — `--api budget` (the gateway sends
# the prompt's count; then its text, `--prompt-as-text`, for the service to
# count) and `--api ext_proc` (Envoy sends the body: the
# service reads it, counts the prompt's text, reads the streamed answer for
# its usage) — every call allowed (config/bench-ext-proc.toml). Prints the
# service's CPU per call from /proc, beside the bench's own table.
#
#   scripts/bench-ext-proc.sh [SECONDS] [STORE]   # default: 10 s, memory; STORE: redis
#
# Needs a built binary (BIN, default target/release/ctxbudget); redis-server for STORE=redis.
set -euo pipefail
secs=${1:-10}
store=${2:-memory}
bin=${BIN:-target/release/ctxbudget}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
flags=()
if [ "$store" = redis ]; then
  rport=$(free_port)
  redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
  pids+=($!)
  until redis-cli -p "$rport" ping >/dev/null 2>&1; do sleep 0.1; done
  flags=(--redis-url "redis://127.0.0.1:$rport/0")
fi
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
workload=(--tenants 50 --users 20 --prompt-median ${PROMPT:-500} --long-share 0 --max-output 500
  --refund-share 0.02 --upstream-ms 0 --concurrency ${CONCURRENCY:-32} --warmup 0s --no-progress)
for run in budget budget_text ext_proc; do
  api=${run%_text}
  extra=()
  [ "$run" = budget_text ] && extra=(--prompt-as-text)
  port=$(free_port)
  RUST_LOG=warn "$bin" serve --config config/bench-ext-proc.toml --listen "127.0.0.1:$port" "${flags[@]}" &
  server=$!
  pids+=("$server")
  sleep 2
  [ "$store" = redis ] && redis-cli -p "$rport" flushall >/dev/null
  out=$(mktemp)
  before=$(cpu "$server")
  "$bin" bench --target "http://127.0.0.1:$port" --config config/bench-ext-proc.toml --api "$api" \
    --tier-mix open:1 "${workload[@]}" "${extra[@]}" --duration "${secs}s" --json "$out" | tail -12
  after=$(cpu "$server")
  kill "$server"; wait "$server" 2>/dev/null || true
  python3 - "$out" "$before" "$after" "$ticks" "$run" "$secs" <<'PY'
import json, sys
report, before, after, ticks, api, secs = sys.argv[1], *map(float, sys.argv[2:5]), sys.argv[5], float(sys.argv[6])
phase = json.load(open(report))["phases"][-1]
calls = {r["rpc"]: r["count"] for r in phase["rpcs"]}
settled = calls.get("Commit", 0) + calls.get("Refund", 0)
cpu = (after - before) / ticks
print(f"{api}: {settled} calls settled; service CPU {cpu:.2f} s = "
      f"{cpu / max(settled, 1) * 1e6:.0f} µs per call (reserve + settle)")
PY
done
