#!/usr/bin/env bash
# Apache Kafka 4.1 in KRaft mode (one broker+controller) from Maven Central jars, as a plain process on 127.0.0.1.
#   scripts/kafka.sh install            -> resolves the jars into $PEERS_DIR/kafka/lib (once)
#   scripts/kafka.sh start DIR [PORT]   -> prints bootstrap servers (127.0.0.1:PORT); state (pid, log, data) in DIR
#   scripts/kafka.sh stop DIR           -> SIGTERM, waits for the broker to exit
#   scripts/kafka.sh kill DIR           -> SIGKILL (tests of a broker crash)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$here/.peers}"
KAFKA_VERSION="${KAFKA_VERSION:-4.1.1}"
lib="$PEERS_DIR/kafka/lib"
cmd="${1:?install|start|stop|kill}"
case "$cmd" in
install)
  if [ -s "$PEERS_DIR/kafka/.installed-$KAFKA_VERSION" ]; then exit 0; fi
  mkdir -p "$PEERS_DIR/kafka"
  cat >"$PEERS_DIR/kafka/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdc.peers</groupId><artifactId>kafka-peer</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-json</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-file</artifactId><version>$KAFKA_VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>2.24.3</version></dependency>
  </dependencies>
</project>
POM
  echo "kafka: resolving kafka_2.13:$KAFKA_VERSION + connect jars" >&2
  (cd "$PEERS_DIR/kafka" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=lib >&2)
  echo "$KAFKA_VERSION" >"$PEERS_DIR/kafka/.installed-$KAFKA_VERSION" ;;
start)
  dir="${2:?state directory}"; mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
  [ -d "$lib" ] || { echo "kafka: no jars in $lib; run scripts/setup-peers.sh" >&2; exit 1; }
  port="${3:-}"
  if [ -z "$port" ]; then
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  fi
  cport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  if [ ! -f "$dir/server.properties" ]; then
    cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=3
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
PROPS
    # a random cluster id (16 bytes, url-safe base64); one that starts with "-" would parse as an option (1 in 64)
    cluster=$(python3 -c 'import base64,uuid
while True:
    c = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22]
    if not c.startswith("-"):
        print(c); break')
    java -cp "$lib/*" kafka.tools.StorageTool format -t "$cluster" -c "$dir/server.properties" --ignore-formatted >"$dir/format.log" 2>&1 ||
      { cat "$dir/format.log" >&2; echo "kafka: formatting the storage failed" >&2; exit 1; }
  fi
  port=$(sed -n 's/^listeners=PLAINTEXT:\/\/127.0.0.1:\([0-9]*\),.*/\1/p' "$dir/server.properties")
  nohup java -Xmx768m -cp "$lib/*" kafka.Kafka "$dir/server.properties" >"$dir/server.log" 2>&1 &
  echo $! >"$dir/pid"
  for _ in $(seq 1 120); do
    # clients retry until the broker has finished starting; an open listener is enough
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "127.0.0.1:$port"; exit 0
    fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { tail -50 "$dir/server.log" >&2; echo "kafka: broker died" >&2; exit 1; }
    sleep 0.5
  done
  tail -50 "$dir/server.log" >&2; echo "kafka: not up after 60s" >&2; exit 1 ;;
stop|kill)
  dir="${2:?state directory}"
  [ -f "$dir/pid" ] || exit 0
  pid=$(cat "$dir/pid")
  if [ "$cmd" = kill ]; then kill -9 "$pid" 2>/dev/null || true; else kill "$pid" 2>/dev/null || true; fi
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true ;;
*) echo "usage: $0 install|start DIR [PORT]|stop DIR|kill DIR" >&2; exit 2 ;;
esac
