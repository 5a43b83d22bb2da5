#!/usr/bin/env bash
# Fuzzes request validation and key encoding (fuzz/fuzz_targets/) with
# libFuzzer for a bounded time: FUZZ_SECONDS (default 60). Installs cargo-fuzz
# when missing; needs the nightly toolchain (rustup toolchain install nightly).
# A crash leaves its input under fuzz/artifacts/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
target="${FUZZ_TARGET:-request_validation}"

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "cargo fuzz needs a nightly toolchain: rustup toolchain install nightly" >&2
  exit 1
fi

corpus="fuzz/corpus/$target"
mkdir -p "$corpus"
cp -n fuzz/seeds/"$target"/* "$corpus"/ 2>/dev/null || true

# -rss_limit_mb: an input that makes validation allocate without bound fails.
cargo +nightly fuzz run "$target" "$corpus" -- \
  -max_total_time="$seconds" -rss_limit_mb=1024 -max_len=65536 -print_final_stats=1
