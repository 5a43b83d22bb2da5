#!/usr/bin/env bash
# Runs the whole test suite: formatting, unit tests, and the integration tests,
# which start real redis-server processes on free ports (a local Redis Cluster
# among them); then the Python
# client's tests (pytest) in a virtual environment under target/venv, against
# the binary just built. Installs redis-server with apt-get when it is missing,
# and the Python packages from the registry.
set -euo pipefail
cd "$(dirname "$0")/.."

# --clippy (.ci/run): also run clippy, beside the Rust build.
lint=false
if [ "${1:-}" = "--clippy" ]; then
  lint=true
fi

# Each step's wall time, on stderr, so a slow CI run says where it went.
step_started=$SECONDS
step() {
  echo "test.sh: $1 took $((SECONDS - step_started)) s" >&2
  step_started=$SECONDS
}

# redis-cli (Debian's redis-tools, which redis-server pulls in) forms the
# local Redis Cluster of the cluster tests.
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "test.sh: redis-server or redis-cli not found; installing redis-server with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi
version=$(redis-server --version | sed -n 's/.*v=\([0-9]*\)\..*/\1/p')
if [ "${version:-0}" -lt 7 ]; then
  echo "test.sh: $(redis-server --version) is too old; ctxbudget needs Redis 7.0 or newer" >&2
  exit 1
fi
echo "test.sh: $(redis-server --version)"

cargo fmt --all -- --check
step "setup and cargo fmt"

# Beside the Rust build, which leaves CPU idle while it links: the Python
# environment (target/venv), and with --clippy the lints (in a target
# directory of their own, so neither waits on the other's lock). Both end
# before any test runs.
mkdir -p target
venv=target/venv
python_env() {
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  local pip=("$venv/bin/pip" install --quiet --disable-pip-version-check)
  "${pip[@]}" -e "clients/python[test]"
  # The LiteLLM hook's tests run the real proxy. "litellm[proxy]" resolves to
  # 1.108.x here (the newer proxy extra needs a package the registry lacks);
  # litellm 1.110.2 installed on top of it runs the proxy.
  if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("litellm") != "1.110.2")' 2>/dev/null; then
    "${pip[@]}" "litellm[proxy]"
    "${pip[@]}" "litellm==1.110.2" semver
  fi
}
python_env > target/python-env.log 2>&1 &
python_pid=$!
if $lint; then
  CARGO_TARGET_DIR=target/clippy cargo clippy --all-targets --quiet -- -D warnings \
    > target/clippy.log 2>&1 &
  clippy_pid=$!
fi
# Waits for a background step; its log, and the run ends if it failed.
finish() {
  local pid=$1 log=$2 what=$3 status=0
  wait "$pid" || status=$?
  cat "$log"
  if [ "$status" -ne 0 ]; then
    echo "test.sh: $what failed (exit $status)" >&2
    exit "$status"
  fi
}

if cargo nextest --version >/dev/null 2>&1; then
  # Doc tests first: the run then closes on nextest's summary of every test.
  cargo test --doc
  cargo test --all-targets --no-run --quiet
  step "build (the Python environment and clippy beside it)"
  finish "$python_pid" target/python-env.log "the Python environment's install"
  if $lint; then finish "$clippy_pid" target/clippy.log "cargo clippy --all-targets -- -D warnings"; fi
  step "the rest of the installs and clippy"
  # Three at a time on two cores: most tests wait (on a cluster forming, a
  # lease lapsing), and they must hold on a busy machine anyway.
  cargo nextest run --all-targets --no-fail-fast --test-threads 3
else
  cargo test --all-targets --no-run --quiet
  finish "$python_pid" target/python-env.log "the Python environment's install"
  if $lint; then finish "$clippy_pid" target/clippy.log "cargo clippy --all-targets -- -D warnings"; fi
  cargo test --all-targets --no-fail-fast
fi
step "Rust tests"

# The Python client (clients/python) and the example gateway, against the
# binary the Rust tests built: ruff and mypy --strict over the package, then
# pytest (a comparison with LiteLLM's own limiter is scripts/compare-litellm.sh).
cargo build --quiet
# The client package linted and type-checked strictly (settings in
# clients/python/pyproject.toml; the generated stubs are checked against, not
# linted).
"$venv/bin/ruff" check --no-cache clients/python/src/ctxbudget
"$venv/bin/mypy" --config-file clients/python/pyproject.toml --strict --cache-dir target/mypy-cache clients/python/src/ctxbudget
step "ruff and mypy"
CTXBUDGET_BIN="$PWD/target/debug/ctxbudget" "$venv/bin/python" -m pytest -q -p no:cacheprovider clients/python/tests
step "Python tests"
