#!/usr/bin/env bash
# The Apache Hive Metastore (standalone, 3.1.3 by default, or 4.x with HIVE_VERSION=4.0.1) with embedded Derby, from
# Maven Central, as a plain process on 127.0.0.1.
#   scripts/hive-metastore.sh install          -> jars into $PEERS_DIR/hive/lib (4.x: $PEERS_DIR/hive4), schema scripts (once)
#   scripts/hive-metastore.sh start DIR        -> prints thrift://127.0.0.1:PORT; state (conf, Derby db, log, pid) in DIR
#   scripts/hive-metastore.sh stop DIR
# 4.x on Derby is what issue 55 is about: Hive 4 compares `expected_parameter_*` in SQL on a CLOB column, which Derby
# refuses; its distribution (bin tarball, with lib/ and the schema scripts) is on Maven Central, Hadoop's jars beside.
# Why 3.1.3 and not 4.x: Spark 3.5 reaches a Metastore through its built-in Hive 2.3.9 client, whose `get_table` the
# 4.x Metastore no longer serves ("Invalid method name"); 3.1 serves both that client and cdc's (`get_table_req`).
# Locks time out after METASTORE_TXN_TIMEOUT (default 30s here, Hive's default is 300s) so that a writer killed
# while holding one (the crash tests) does not stall the next for minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$here/.peers}"
HIVE_VERSION="${HIVE_VERSION:-3.1.3}"
HADOOP_VERSION="${HADOOP_VERSION:-3.1.0}"
home="$PEERS_DIR/hive"
cmd="${1:?install|start|stop}"
if [ "${HIVE_VERSION%%.*}" = "4" ]; then
  home="$PEERS_DIR/hive4"
  HADOOP_VERSION="${HADOOP4_VERSION:-3.3.6}"
  classpath="$home/home/lib/*:$home/hadoop/*"
  schema_tool=org.apache.hadoop.hive.metastore.tools.schematool.MetastoreSchemaTool
else
  classpath="$home/lib/*"
  schema_tool=org.apache.hadoop.hive.metastore.tools.MetastoreSchemaTool
fi
case "$cmd" in
install4)
  if [ -s "$home/.installed-$HIVE_VERSION" ]; then exit 0; fi
  mkdir -p "$home"
  cat >"$home/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdc.peers</groupId><artifactId>hive4-metastore-peer</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-common</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-hdfs</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-mapreduce-client-core</artifactId><version>$HADOOP_VERSION</version></dependency>
  </dependencies>
</project>
POM
  echo "hive-metastore: resolving the Hive $HIVE_VERSION Metastore distribution + hadoop $HADOOP_VERSION jars" >&2
  (cd "$home" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=hadoop >&2)
  (cd "$home" && mvn -q -B dependency:copy -Dartifact="org.apache.hive:hive-standalone-metastore-server:$HIVE_VERSION:tar.gz:bin" -DoutputDirectory=dist >&2)
  rm -rf "$home/home"; mkdir -p "$home/home"
  tar xzf "$home/dist/hive-standalone-metastore-server-$HIVE_VERSION-bin.tar.gz" -C "$home/home" --strip-components=1
  rm -rf "$home/dist"
  # the distribution's own logging and Hadoop's would both bind SLF4J: keep the distribution's
  rm -f "$home"/hadoop/slf4j-reload4j-*.jar "$home"/hadoop/reload4j-*.jar
  test -n "$(ls "$home"/home/scripts/metastore/upgrade/derby/hive-schema-4*.derby.sql)"
  echo "$HIVE_VERSION" >"$home/.installed-$HIVE_VERSION" ;;
install)
  if [ "${HIVE_VERSION%%.*}" = "4" ]; then exec bash "$0" install4; fi
  if [ -s "$home/.installed-$HIVE_VERSION" ]; then exit 0; fi
  mkdir -p "$home"
  cat >"$home/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>cdc.peers</groupId><artifactId>hive-metastore-peer</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.hive</groupId><artifactId>hive-standalone-metastore</artifactId><version>$HIVE_VERSION</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-common</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-hdfs</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-mapreduce-client-core</artifactId><version>$HADOOP_VERSION</version></dependency>
    <dependency><groupId>org.apache.derby</groupId><artifactId>derby</artifactId><version>10.14.2.0</version></dependency>
  </dependencies>
</project>
POM
  echo "hive-metastore: resolving hive-standalone-metastore:$HIVE_VERSION + hadoop $HADOOP_VERSION jars" >&2
  (cd "$home" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=lib >&2)
  # the schema scripts ship only in the binary distribution (also on Maven Central)
  (cd "$home" && mvn -q -B dependency:copy -Dartifact="org.apache.hive:hive-standalone-metastore:$HIVE_VERSION:tar.gz:bin" -DoutputDirectory=dist >&2)
  rm -rf "$home/home"; mkdir -p "$home/home"
  tar xzf "$home/dist/hive-standalone-metastore-$HIVE_VERSION-bin.tar.gz" -C "$home/home" --strip-components=1 --wildcards '*/scripts/metastore/upgrade/derby/*'
  rm -rf "$home/dist"
  test -n "$(ls "$home"/home/scripts/metastore/upgrade/derby/hive-schema-*.derby.sql)"
  echo "$HIVE_VERSION" >"$home/.installed-$HIVE_VERSION" ;;
start)
  dir="${2:?state directory}"; mkdir -p "$dir"; dir="$(cd "$dir" && pwd)"
  [ -s "$home/.installed-$HIVE_VERSION" ] || { echo "hive-metastore: Hive $HIVE_VERSION is not installed in $home; run scripts/setup-peers.sh" >&2; exit 1; }
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  mkdir -p "$dir/conf" "$dir/wh"
  cat >"$dir/conf/metastore-site.xml" <<XML
<configuration>
  <property><name>javax.jdo.option.ConnectionURL</name><value>jdbc:derby:;databaseName=$dir/metastore_db;create=true</value></property>
  <property><name>javax.jdo.option.ConnectionDriverName</name><value>org.apache.derby.jdbc.EmbeddedDriver</value></property>
  <property><name>metastore.warehouse.dir</name><value>file://$dir/wh</value></property>
  <property><name>metastore.thrift.bind.host</name><value>127.0.0.1</value></property>
  <property><name>metastore.thrift.port</name><value>$port</value></property>
  <property><name>metastore.event.db.notification.api.auth</name><value>false</value></property>
  <!-- the defaults name classes of hive-exec, which a standalone Metastore does not have -->
  <property><name>metastore.expression.proxy</name><value>org.apache.hadoop.hive.metastore.DefaultPartitionExpressionProxy</value></property>
  <property><name>metastore.task.threads.always</name><value>org.apache.hadoop.hive.metastore.events.EventCleanerTask</value></property>
  <property><name>metastore.txn.timeout</name><value>${METASTORE_TXN_TIMEOUT:-30s}</value></property>
</configuration>
XML
  if [ ! -d "$dir/metastore_db" ]; then
    METASTORE_HOME="$home/home" java -Dderby.stream.error.file="$dir/derby.log" -cp "$dir/conf:$classpath" $schema_tool \
      -dbType derby -initSchema >"$dir/schema.log" 2>&1 || { cat "$dir/schema.log" >&2; echo "hive-metastore: schema init failed" >&2; exit 1; }
  fi
  nohup java -Xmx512m -Dderby.stream.error.file="$dir/derby.log" -cp "$dir/conf:$classpath" org.apache.hadoop.hive.metastore.HiveMetaStore >"$dir/server.log" 2>&1 &
  echo $! >"$dir/pid"; echo "$port" >"$dir/port"
  for _ in $(seq 1 120); do
    if (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "thrift://127.0.0.1:$port"; exit 0; fi
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { tail -50 "$dir/server.log" >&2; echo "hive-metastore: server died" >&2; exit 1; }
    sleep 0.5
  done
  tail -50 "$dir/server.log" >&2; echo "hive-metastore: not up after 60s" >&2; exit 1 ;;
stop)
  dir="${2:?state directory}"
  [ -f "$dir/pid" ] && kill "$(cat "$dir/pid")" 2>/dev/null || true ;;
*) echo "usage: $0 install|start DIR|stop DIR" >&2; exit 2 ;;
esac
