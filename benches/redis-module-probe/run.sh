#!/usr/bin/env bash
# Builds the probe and measures it beside the Lua reserve (docs/benchmarks.md,
# "Leaving Lua"). Needs gcc, valgrind, redis-server 7.0, Python with redis-py
# (scripts/test.sh's target/venv has it), a release build of ctxbudget
# (CTXBUDGET, default target/release/ctxbudget) and redismodule.h of Redis 7.0:
#   REDISMODULE_H=path/to/redis-7.0.15/src/redismodule.h benches/redis-module-probe/run.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-$root/target/venv/bin/python}
: "${REDISMODULE_H:?set REDISMODULE_H to redismodule.h of Redis 7.0 (src/ of its source)}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$REDISMODULE_H" "$work/redismodule.h"
gcc -O2 -fPIC -shared -I"$work" -o "$work/probe.so" "$here/probe.c"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up() { until redis-cli -p "$1" ping >/dev/null 2>&1; do sleep 0.2; done; }
# Starts redis-server on a free port under callgrind, counting inside
# function $1 and cutting a dump at every INFO; the rest are its arguments.
# Sets p (the port) and pid.
under_callgrind() {
  local toggle=$1; shift
  p=$(port)
  valgrind --tool=callgrind --toggle-collect="$toggle" --dump-before=infoCommand \
    --callgrind-out-file="$work/cg.out.%p" redis-server --port "$p" --bind 127.0.0.1 --save '' \
    --appendonly no "$@" >/dev/null 2>&1 &
  pid=$!; up "$p"
}
# Every dump's instruction total, in the order the dumps were cut (each INFO
# cuts one; the file without a number is what ran after the last).
totals() {
  local f
  for f in $(cd "$work" && ls cg.out.*.* | sort -t. -k4 -n) $(cd "$work" && ls cg.out.* | grep -v '^cg\.out\.[0-9]*\.'); do
    grep -m1 '^totals:' "$work/$f" | awk '$2 > 0 {print $2}'
  done
}

echo "== the probe's time per call (INFO commandstats), 20 rounds after 10 of warmup"
p=$(port)
redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no --loadmodule "$work/probe.so" >/dev/null &
pid=$!; up "$p"
SETTLE=1 "$py" "$here/drive.py" "$p" 10 >/dev/null
redis-cli -p "$p" config resetstat >/dev/null
SETTLE=1 "$py" "$here/drive.py" "$p" 20 >/dev/null
redis-cli -p "$p" info commandstats | grep ctxb.reserve
kill "$pid"; wait "$pid" 2>/dev/null || true

echo "== the probe's instructions per call (callgrind), 4 rounds of 1,000"
under_callgrind RedisModuleCommandDispatcher --loadmodule "$work/probe.so"
SETTLE=1 "$py" "$here/drive.py" "$p" 4 >/dev/null
kill "$pid"; wait "$pid" 2>/dev/null || true
totals | awk '{printf "%.0f instructions per call\n", $1 / 1000}'
rm -f "$work"/cg.out.*

echo "== an EVALSHA's floor (callgrind): bare, then with a reserve's KEYS and ARGV"
under_callgrind evalShaCommand
"$py" "$here/eval_floor.py" "$p" >/dev/null
kill "$pid"; wait "$pid" 2>/dev/null || true
totals | awk '{printf "%.0f instructions per call\n", $1 / 1000}'
rm -f "$work"/cg.out.*

bin=${CTXBUDGET:-$root/target/release/ctxbudget}
echo "== the Lua reserve and Commit: $bin bench --direct under callgrind, per call"
under_callgrind evalShaCommand
(cd "$root" && "$bin" bench --config config/bench.toml --tier-mix enterprise:1 \
  --direct "redis://127.0.0.1:$p/0" --duration 1s --no-progress >/dev/null 2>&1)
kill "$pid"; wait "$pid" 2>/dev/null || true
# The calibration's last three rounds: a dump of 1,000 CheckAndReserves, one
# of 1,000 Commits (and one of nothing between); earlier dumps warm up.
totals | tail -6 | awk '{printf "%s %.0f instructions per call\n", NR % 2 ? "CheckAndReserve" : "Commit", $1 / 1000}'
