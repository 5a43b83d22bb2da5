#!/bin/bash
# What traces cost a decision: ctxbudget's release binary on the sitting's
# configuration (shared/perf/conf/ctxbudget-sitting.toml), driven by the
# sitting's load generator (ctxb-loadgen, shared/perf/build.sh builds it),
# with traces off and with traces on to a collector that is down (nothing
# listens at the endpoint: every export fails and is dropped), alternated.
# Every decision is a root span (the load generator sends no traceparent),
# sampled: the most a replica exports.
#
#   benches/traces/run.sh [ROUNDS] [SECONDS] [MODE]     # 3 rounds of 8 s, cycle
#
# COLLECTOR=http://127.0.0.1:4317 adds a third leg, `up`, exporting to that
# collector (any OTLP/gRPC receiver; clients/python/tests/otlp_receiver.py
# is one). The OTEL_TRACES_SAMPLER variables pass through to the service.
#
# One line per run: decisions/s, p50 and p99 of CheckAndReserve (µs), server CPU.
set -euo pipefail
ROUNDS=${1:-3}; DUR=${2:-8}; MODE=${3:-cycle}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
BIN=${CTXB_BIN:-$ROOT/target/release/ctxbudget}
CL=${CL:-${PERF_WORK:-${TMPDIR:-/tmp}/ctxb-perf}/target-tools/release/ctxb-loadgen}
CONF=${CONF:-$ROOT/../shared/perf/conf/ctxbudget-sitting.toml}
for f in "$BIN" "$CL" "$CONF"; do [ -e "$f" ] || { echo "missing $f (see the header)" >&2; exit 1; }; done
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
cp "$CONF" "$WORK/off.toml"
{ cat "$CONF"; printf '\n[telemetry]\notlp_endpoint = "http://127.0.0.1:%s"\nexport_timeout_ms = 1000\n' "$(free_port)"; } > "$WORK/down.toml"
if [ -n "${COLLECTOR:-}" ]; then
  { cat "$CONF"; printf '\n[telemetry]\notlp_endpoint = "%s"\n' "$COLLECTOR"; } > "$WORK/up.toml"
fi
leg() {
  local name=$1 port metrics out sp
  port=$(free_port); metrics=$(free_port)
  "$BIN" serve --listen "127.0.0.1:$port" --metrics-listen "127.0.0.1:$metrics" --config "$WORK/$name.toml" > "$WORK/$name.log" 2>&1 &
  sp=$!
  for _ in $(seq 200); do "$CL" --addr "127.0.0.1:$port" --mode "$MODE" --check > /dev/null 2>&1 && break; sleep 0.05; done
  out=$("$CL" --addr "127.0.0.1:$port" -c 64 -d "$DUR" --warmup 2 --connections 2 --threads 1 --users 10000 \
    --tenants 100 --tier enterprise --model gpt-4o --prompt-tokens 500 --max-output 200 --mode "$MODE" \
    --watch-pid "server=$sp" 2>&1)
  local dropped
  dropped=$(curl -s "http://127.0.0.1:$metrics/metrics" | awk '/^ctxbudget_trace_spans_dropped_total/ {s += $2} END {print s+0}')
  kill "$sp"; wait "$sp" 2>/dev/null || true
  printf '%-5s %s dps=%s p50_us=%s p99_us=%s cpu_%s spans_dropped=%s\n' "$name" "$MODE" \
    "$(grep -o 'decisions_per_s=[0-9]*' <<<"$out" | cut -d= -f2)" \
    "$(grep 'latency_us reserve' <<<"$out" | grep -o 'p50=[0-9]*' | cut -d= -f2)" \
    "$(grep 'latency_us reserve' <<<"$out" | grep -o 'p99=[0-9]*' | cut -d= -f2)" \
    "$(grep -o 'server=[0-9]*%' <<<"$out" | head -1)" "$dropped"
}
for _ in $(seq "$ROUNDS"); do
  leg off; leg down
  if [ -n "${COLLECTOR:-}" ]; then leg up; fi
done
