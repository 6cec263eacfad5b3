#!/usr/bin/env bash
# Runs every test: unit tests, the CLI tests on local tables, and the peer tests against real Apache Spark + Iceberg.
# Installs what the peers need first (scripts/setup-peers.sh). Fails when anything fails or is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
PEERS_DIR="${PEERS_DIR:-$PWD/.peers}"
export PEERS_DIR
phase() { echo "== $(date -u +%T) $*" >&2; }

# The peers install (downloads, mostly waiting on the network) runs while cargo builds; the peer phase waits for it.
setup_log=$(mktemp)
bash scripts/setup-peers.sh > "$setup_log" 2>&1 &
setup_pid=$!
trap 'kill "$setup_pid" 2>/dev/null || true' EXIT # a failed build does not leave the install running

phase "format + lints"
cargo fmt --check || { echo "cargo fmt --check failed: run cargo fmt" >&2; exit 1; }
cargo clippy --all-targets --locked -- -D warnings || { echo "cargo clippy failed" >&2; exit 1; }
# the slim build (no Kafka, Hive or Glue) must build too
cargo clippy --all-targets --locked --no-default-features -- -D warnings || { echo "cargo clippy --no-default-features failed" >&2; exit 1; }

# A hung test must fail the run, showing where it hung, long before CI's own limit: past the deadline the thread
# stacks of every test process and cdc child still running go to stderr (gdb, where installed), then all of it is
# killed.
with_deadline() {
  local secs=$1; shift
  # a session of its own: the deadline kills the command with everything it started
  setsid "$@" &
  local pid=$!
  (
    sleep "$secs" </dev/null >/dev/null 2>&1 # holds no pipe of CI's open when the dog is called off
    kill -0 "$pid" 2>/dev/null || exit 0
    echo "still running after ${secs}s: $*; thread stacks of the test processes follow" >&2
    for p in $(pgrep -f "$target_dir/debug/(deps/|cdc)"); do
      echo "--- pid $p: $(tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-200)" >&2
      gdb -p "$p" -batch -ex "thread apply all bt" 2>/dev/null | grep -E "^(Thread|#)" | cut -c1-240 >&2 || true
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
  ) &
  local dog=$!
  local rc=0
  wait "$pid" || rc=$?
  kill "$dog" 2>/dev/null || true
  return "$rc"
}

phase "unit + CLI tests"
# built first, so that the deadline covers running the tests only
cargo test --locked --no-run 2>&1 | tail -3 || true
rc=0
with_deadline 900 bash -c 'cargo test --locked > .ci-cargo-test.log 2>&1' || rc=$?
grep -E "^(test result|running|error|failures:|---- )" .ci-cargo-test.log || true
if [ "$rc" -ne 0 ] || grep -qE "test result: FAILED|^error(\[E[0-9]+\])?:" .ci-cargo-test.log || ! grep -q "test result: ok" .ci-cargo-test.log; then
  cat .ci-cargo-test.log >&2; echo "cargo test failed" >&2; exit 1
fi
rm -f .ci-cargo-test.log

phase "peers (waiting for scripts/setup-peers.sh)"
rc=0
wait "$setup_pid" || rc=$?
cat "$setup_log" >&2
rm -f "$setup_log"
if [ "$rc" -ne 0 ]; then echo "scripts/setup-peers.sh failed (rc $rc): see its output above" >&2; exit 1; fi
export CDC_BIN="$target_dir/debug/cdc" TZ=UTC

phase "peer tests (Spark 3.5 + Iceberg 1.10)"
log=$(mktemp)
rc=0
with_deadline 2100 "$PEERS_DIR/venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests/peers "$@" > "$log" 2>&1 || rc=$?
cat "$log"
if [ "$rc" -ne 0 ]; then echo "peer tests failed" >&2; exit "$rc"; fi
# A peer that is missing must fail the run, never skip it.
if grep -qiE "[0-9]+ skipped" "$log"; then echo "peer tests were skipped: treat as failure" >&2; exit 1; fi
phase "all tests passed"
