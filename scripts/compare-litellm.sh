#!/usr/bin/env bash
# LiteLLM's own limiter beside ctxbudget's hook (docs/litellm.md, "Measured"):
# two extra LiteLLM proxies with max_parallel_requests, rpm_limit and
# tpm_limit on the key, the same bursts, the figures printed. A measurement,
# not a test: it asserts nothing, so scripts/test.sh leaves it out. Run
# scripts/test.sh once first (it builds the binary and target/venv).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=target/venv
if [ ! -x "$venv/bin/python" ] || [ ! -x target/debug/ctxbudget ]; then
  echo "compare-litellm.sh: run scripts/test.sh first (target/venv and the binary)" >&2
  exit 1
fi
CTXBUDGET_BIN="$PWD/target/debug/ctxbudget" "$venv/bin/python" -m pytest -q -s -p no:cacheprovider \
  -m comparison clients/python/tests/test_litellm.py
