#!/usr/bin/env bash
# Starts the Apache Iceberg REST catalog server (the server behind the apache/iceberg-rest-fixture image, from the
# Maven artifact org.apache.iceberg:iceberg-open-api) as a plain process on 127.0.0.1.
#   scripts/rest-catalog.sh start DIR   -> prints the catalog URI; state (port, pid, log, sqlite db, warehouse) in DIR
#   scripts/rest-catalog.sh stop DIR
# Other catalog properties come from CATALOG_* variables (drop CATALOG_, `__` -> `-`, `_` -> `.`), e.g. the warehouse
# on the GCS emulator: CATALOG_WAREHOUSE=gs://bucket/wh CATALOG_IO__IMPL=org.apache.iceberg.gcp.gcs.GCSFileIO
# CATALOG_GCS_SERVICE_HOST=http://127.0.0.1:P CATALOG_GCS_NO__AUTH=true.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$here/.peers}"
cmd="${1:?start|stop}"; dir="${2:?state directory}"
mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
case "$cmd" in
start)
  jar=$(ls "$PEERS_DIR"/rest/iceberg-open-api-*.jar 2>/dev/null | head -n1)
  [ -n "$jar" ] || { echo "rest-catalog: no iceberg-open-api jar in $PEERS_DIR/rest; run scripts/setup-peers.sh" >&2; exit 1; }
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  mkdir -p "$dir/wh"
  CATALOG_URI="jdbc:sqlite:$dir/catalog.db" CATALOG_WAREHOUSE="${CATALOG_WAREHOUSE:-file://$dir/wh}" CATALOG_REST_PORT="$port" \
  CATALOG_JDBC_STRICT__MODE=true \
    nohup java -Xmx512m -cp "$jar" org.apache.iceberg.rest.RESTCatalogServer >"$dir/server.log" 2>&1 &
  echo $! >"$dir/pid"; echo "$port" >"$dir/port"
  for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$port/v1/config" >/dev/null 2>&1; then echo "http://127.0.0.1:$port"; exit 0; fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/server.log" >&2; echo "rest-catalog: server died" >&2; exit 1; }
    sleep 0.5
  done
  cat "$dir/server.log" >&2; echo "rest-catalog: not up after 60s" >&2; exit 1 ;;
stop)
  [ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null || true ;;
*) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
