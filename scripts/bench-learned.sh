#!/usr/bin/env bash
# The learned output bench (docs/benchmarks.md, "Learned output"): a burst of
# agent calls (15–45 s upstream, completions 5–25% of max_output_tokens, 15%
# on average) against one tenant's 60,000 tokens a minute, once with the
# tier holding every call's whole max_output_tokens and once holding the
# learned output — each from a full bucket, on a fresh Redis, the learned
# tier's completions taught first by a short run of quick calls.
#
#   scripts/bench-learned.sh [SECONDS] [RATE]   # default: 60 s at 20 calls/s
#
# OVERRUN sets the learned tier's output_overrun (default: the file's, 1.0).
# Needs redis-server and a built binary (BIN, default target/release/ctxbudget).
set -euo pipefail
secs=${1:-60}
rate=${2:-20}
bin=${BIN:-target/release/ctxbudget}
config=config/bench-learned.toml
if [ -n "${OVERRUN:-}" ]; then
  config=$(mktemp --suffix .toml)
  sed "s/output_overrun = [0-9.]*/output_overrun = $OVERRUN/" config/bench-learned.toml >"$config"
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
redis_pid=$!
trap 'kill "$redis_pid"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
url="redis://127.0.0.1:$port/0"
workload=(--tenants 1 --users 20 --zipf 0 --prompt-median ${PROMPT:-200} --long-share 0
  --max-output 2000 --output-min-share 0.05 --output-max-share 0.25 --refund-share 0 --no-progress)
for tier in max learned; do
  redis-cli -p "$port" flushall >/dev/null
  # Teach: 40 quick calls; their Commits leave the tier's completions.
  "$bin" bench --direct "$url" --config "$config" --tier-mix "$tier:1" "${workload[@]}" \
    --upstream-ms 100 --rate 4 --warmup 0s --duration 10s >/dev/null
  # A full bucket again: every key but the completions goes.
  redis-cli -p "$port" --scan | grep -v '^ctxb:o:' | while read -r key; do
    redis-cli -p "$port" del "$key" >/dev/null
  done
  echo "== $tier"
  "$bin" bench --direct "$url" --config "$config" --tier-mix "$tier:1" "${workload[@]}" \
    --upstream-ms 30000 --rate "$rate" --warmup 0s --duration "${secs}s"
done
