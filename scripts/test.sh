#!/usr/bin/env bash
# Runs every test: unit tests, the CLI tests on local tables, and the peer tests against real Apache Spark + Iceberg.
# Installs what the peers need first (scripts/setup-peers.sh). Fails when anything fails or is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

echo "== format + lints" >&2
cargo fmt --check || { echo "cargo fmt --check failed: run cargo fmt" >&2; exit 1; }
cargo clippy --all-targets --locked -- -D warnings || { echo "cargo clippy failed" >&2; exit 1; }

echo "== unit + CLI tests" >&2
cargo test --locked 2>&1 | tee .ci-cargo-test.log | grep -E "^(test result|running|error|failures:|---- )" || true
if grep -qE "test result: FAILED|error(\[E[0-9]+\])?:" .ci-cargo-test.log || ! grep -q "test result: ok" .ci-cargo-test.log; then
  cat .ci-cargo-test.log >&2; echo "cargo test failed" >&2; exit 1
fi
rm -f .ci-cargo-test.log

echo "== peers" >&2
bash scripts/setup-peers.sh
PEERS_DIR="${PEERS_DIR:-$PWD/.peers}"
export PEERS_DIR CDC_BIN="$PWD/target/debug/cdc" TZ=UTC

echo "== peer tests (Spark 3.5 + Iceberg 1.10)" >&2
log=$(mktemp)
set +e
"$PEERS_DIR/venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests/peers "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then echo "peer tests failed" >&2; exit "$rc"; fi
# A peer that is missing must fail the run, never skip it.
if grep -qiE "[0-9]+ skipped" "$log"; then echo "peer tests were skipped: treat as failure" >&2; exit 1; fi
echo "all tests passed" >&2
