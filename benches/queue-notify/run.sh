#!/usr/bin/env bash
# Measures how a replica could learn that its waiting call may go
# (docs/benchmarks.md, "Waking a waiting call"): Redis CPU of a grant with
# and without PUBLISH, of writes with keyspace notifications off and on, and
# the delivery latency of a PUBLISH. Needs redis-server 7.0 and Python with
# redis-py (scripts/test.sh's target/venv has it):
#   benches/queue-notify/run.sh [CALLS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
py=${PYTHON:-$root/target/venv/bin/python}
p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no >/dev/null &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.1; done
"$py" "$here/notify.py" "$p" "${1:-20000}"
# What a wait costs: lua/line.lua per operation, as build.rs built it.
line=$(ls -t "$root"/target/*/build/ctxbudget-store-*/out/line.lua 2>/dev/null | head -1)
if [ -n "$line" ]; then
  redis-cli -p "$p" flushall >/dev/null
  "$py" "$here/line.py" "$p" "$line" 3000 48
fi
