#!/usr/bin/env bash
# The binary to ship: a release build with its debug info split off into `cdc.debug` (gdb, addr2line and Rust's
# own backtraces find it through the binary's .gnu_debuglink, in the same directory or under /usr/lib/debug), the
# binary stripped to what runs; beside it the shell completions and the man page. Prints the sizes.
#   scripts/dist.sh [OUT_DIR]        (default: target/dist)
set -euo pipefail
cd "$(dirname "$0")/.."
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
out="${1:-$target_dir/dist}"
start=$(date +%s)
cargo build --release --locked --bin cdc >&2
built=$(( $(date +%s) - start ))
mkdir -p "$out/completions"
cp "$target_dir/release/cdc" "$out/cdc.full"
objcopy --only-keep-debug "$out/cdc.full" "$out/cdc.debug"
objcopy --strip-debug --add-gnu-debuglink="$out/cdc.debug" "$out/cdc.full" "$out/cdc"
rm "$out/cdc.full"
for sh in bash zsh fish; do "$out/cdc" completions "$sh" > "$out/completions/cdc.$sh"; done
"$out/cdc" man > "$out/cdc.1"
"$out/cdc" --version >&2
mb() { echo "$(( $(stat -c %s "$1") / 1000000 )) MB"; }
echo "dist: $out/cdc $(mb "$out/cdc"), $out/cdc.debug $(mb "$out/cdc.debug") (release build ${built}s)" >&2
