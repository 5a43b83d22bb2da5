#!/usr/bin/env bash
# A local Redis Cluster for trying ctxbudget on one: three masters and three
# replicas on 127.0.0.1, ports BASE..BASE+5 (the cluster bus adds 10000, so
# BASE must be at most 55530), data under $DIR (default /tmp/ctxbudget-cluster).
#
#   scripts/redis-cluster.sh start [BASE]   # prints the --redis-cluster-nodes value
#   scripts/redis-cluster.sh stop  [BASE]
set -euo pipefail
cmd=${1:-start}
base=${2:-7000}
dir=${DIR:-/tmp/ctxbudget-cluster}
ports=$(seq "$base" $((base + 5)))
if (( base + 5 + 10000 > 65535 )); then
  echo "BASE must be at most 55530 (the cluster bus listens on port + 10000)" >&2
  exit 2
fi
case "$cmd" in
  start)
    for p in $ports; do
      mkdir -p "$dir/$p"
      redis-server --port "$p" --bind 127.0.0.1 --dir "$dir/$p" --daemonize yes \
        --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" \
        --save "" --appendonly no --cluster-enabled yes \
        --cluster-config-file "nodes-$p.conf" --cluster-node-timeout 2000
    done
    for p in $ports; do
      until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.1; done
    done
    nodes=$(for p in $ports; do printf '127.0.0.1:%s ' "$p"; done)
    # shellcheck disable=SC2086
    redis-cli --cluster create $nodes --cluster-replicas 1 --cluster-yes >/dev/null
    until redis-cli -p "$base" cluster info | grep -q cluster_state:ok; do sleep 0.2; done
    for p in $ports; do printf 'redis://127.0.0.1:%s,' "$p"; done | sed 's/,$/\n/'
    ;;
  stop)
    for p in $ports; do
      if [[ -f "$dir/$p/redis.pid" ]]; then kill "$(cat "$dir/$p/redis.pid")" || true; fi
    done
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start|stop [BASE]" >&2
    exit 2
    ;;
esac
