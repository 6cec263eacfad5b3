"""Shared fixtures of the peer tests: one Spark session (Apache Spark 3.5 + Iceberg 1.10, local[2]) and the tables
it writes, plus a helper that runs the real `cdc` binary."""
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import spark_workloads  # noqa: E402

CDC = os.environ.get("CDC_BIN", os.path.join(ROOT, "target", "debug", "cdc"))


@pytest.fixture(scope="session")
def warehouse():
    d = os.environ.get("CDC_TEST_WAREHOUSE") or tempfile.mkdtemp(prefix="cdc-peer-wh-")
    return d


@contextlib.contextmanager
def script_peer(script, state, what, env=None):
    """A peer started by `scripts/<script> start STATE` (which prints its address): yields the address, stops it."""
    path = os.path.join(ROOT, "scripts", script)
    p = subprocess.run(["bash", path, "start", state], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"{what} did not start: {p.stderr}")
    try:
        yield p.stdout.strip()
    finally:
        subprocess.run(["bash", path, "stop", state])


KAFKA_SCRIPT = os.path.join(ROOT, "scripts", "kafka.sh")


@pytest.fixture(scope="session")
def kafka(warehouse):
    """Apache Kafka 4.1 in KRaft mode (scripts/kafka.sh): its bootstrap servers and state directory."""
    state = os.path.join(warehouse, "kafka")
    p = subprocess.run(["bash", KAFKA_SCRIPT, "start", state], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"Kafka did not start: {p.stderr}")
    yield {"bootstrap": p.stdout.strip(), "state": state}
    subprocess.run(["bash", KAFKA_SCRIPT, "stop", state])


@pytest.fixture(scope="session")
def rest_catalog(warehouse):
    """The Iceberg REST catalog server, started by scripts/rest-catalog.sh on a free 127.0.0.1 port."""
    with script_peer("rest-catalog.sh", os.path.join(warehouse, "rest-server"), "REST catalog server") as uri:
        yield uri


@pytest.fixture(scope="session")
def hive_metastore(warehouse):
    """A Hive Metastore (standalone, Derby), started by scripts/hive-metastore.sh on a free 127.0.0.1 port."""
    with script_peer("hive-metastore.sh", os.path.join(warehouse, "hive-metastore"), "Hive Metastore") as uri:
        yield uri


@pytest.fixture(scope="session")
def hive4_metastore(warehouse):
    """A Hive 4 Metastore on Derby (scripts/hive-metastore.sh with HIVE_VERSION=4.0.1). Spark 3.5's Hive client cannot
    talk to it (Hive 4 dropped `get_table`), so its tables are read back by metadata file (`hive4_metadata_location`)."""
    env = dict(os.environ, HIVE_VERSION=os.environ.get("HIVE4_VERSION", "4.0.1"))
    with script_peer("hive-metastore.sh", os.path.join(warehouse, "hive4-metastore"), "Hive 4 Metastore", env=env) as uri:
        yield uri


def hive_metadata_location(uri, db, table):
    """The `metadata_location` a Metastore (3.1 or 4.x) records for `db.table`, through `get_table_req`."""
    from hive_metastore.ThriftHiveMetastore import Client
    from hive_metastore.ttypes import GetTableRequest
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport

    host, port = uri[len("thrift://"):].split(":")
    transport = TTransport.TBufferedTransport(TSocket.TSocket(host, int(port)))
    transport.open()
    try:
        client = Client(TBinaryProtocol.TBinaryProtocol(transport))
        return client.get_table_req(GetTableRequest(dbName=db, tblName=table)).table.parameters["metadata_location"]
    finally:
        transport.close()


@pytest.fixture(scope="session")
def sql_target(warehouse):
    """Warehouse of the sqlite catalog iceberg-rust writes. Spark reads its tables by metadata file (see
    `spark_table`): Spark's JdbcCatalog on sqlite keeps a read transaction open and would see stale pointers."""
    d = os.path.join(warehouse, "sql-target")
    os.makedirs(d, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def spark(warehouse, rest_catalog, sql_target, hive_metastore):
    catalogs = {
        "rest_cat": {"type": "rest", "uri": rest_catalog},
        # Iceberg's HiveCatalog through Spark's built-in Hive 2.3 client; no table cache: cdc commits meanwhile
        "hive_cat": {"type": "hive", "uri": hive_metastore, "warehouse": f"file://{warehouse}/hive-wh", "cache-enabled": "false"},
    }
    s = spark_workloads.spark_session(warehouse, catalogs)
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def spark_tables(spark):
    spark_workloads.build(spark, list(spark_workloads.TABLES))
    return list(spark_workloads.TABLES)


BUCKET = "cdc-s3"
S3CAT = "s3_cat"
KEYS = {"s3.access-key-id": "cdc-test", "s3.secret-access-key": "cdc-secret", "client.region": "us-east-1"}


@pytest.fixture(scope="session")
def s3(warehouse, spark):
    """moto's server (S3, and Glue for test_glue) with bucket BUCKET, the Iceberg REST catalog server with its
    warehouse on it, and Spark's catalog S3CAT on that server. One per session: test_s3 and test_glue share it."""
    state = os.path.join(warehouse, "s3")
    os.makedirs(state, exist_ok=True)
    peers = os.environ.get("PEERS_DIR", os.path.join(ROOT, ".peers"))
    port = free_port()
    log = open(os.path.join(state, "moto.log"), "w")
    moto = subprocess.Popen([os.path.join(peers, "venv", "bin", "moto_server"), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            urllib.request.urlopen(urllib.request.Request(f"{url}/{BUCKET}", method="PUT"))
            break
        except OSError:
            if moto.poll() is not None:
                raise RuntimeError(f"moto_server died: {open(os.path.join(state, 'moto.log')).read()}")
            time.sleep(0.2)
    else:
        raise RuntimeError("moto_server did not come up")
    env = dict(os.environ, CATALOG_WAREHOUSE=f"s3://{BUCKET}/wh", CATALOG_IO__IMPL="org.apache.iceberg.aws.s3.S3FileIO",
               CATALOG_S3_ENDPOINT=url, CATALOG_S3_PATH__STYLE__ACCESS="true", CATALOG_S3_ACCESS__KEY__ID=KEYS["s3.access-key-id"],
               CATALOG_S3_SECRET__ACCESS__KEY=KEYS["s3.secret-access-key"], CATALOG_CLIENT_REGION="us-east-1", AWS_REGION="us-east-1")
    try:
        with script_peer("rest-catalog.sh", os.path.join(state, "rest"), "REST catalog server on S3", env=env) as rest_url:
            conf = {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest", ".uri": rest_url, ".io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
                    ".s3.endpoint": url, ".s3.path-style-access": "true"}
            conf.update({f".{k}": v for k, v in KEYS.items()})
            for k, v in conf.items():
                spark.conf.set(f"spark.sql.catalog.{S3CAT}{k}", v)
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {S3CAT}.db")
            yield {"endpoint": url, "rest": rest_url}
    finally:
        moto.terminate()
        moto.wait(10)
        log.close()


def free_port():
    """A TCP port free on 127.0.0.1 right now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_until(cond, secs=90):
    """Polls `cond` once a second until it is true (an exception counts as not yet, e.g. a target not created yet);
    returns whether it became true within `secs`."""
    deadline = time.time() + secs
    while time.time() < deadline:
        try:
            if cond():
                return True
        except Exception:  # noqa: BLE001 - not there yet
            pass
        time.sleep(1)
    return False


def write_config(path, table, warehouse, extra="", target=""):
    with open(path, "w") as f:
        f.write(f'[source]\ntable = "{table}"\n{extra}\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n{target}')
    return path


def target_section(kind, table, warehouse, rest_uri, sql_dir, extra="", hive_uri=None):
    """A [target] section and the Spark name of that table (`catalog.namespace.table`)."""
    ns, name = table.split(".")
    if kind == "hive":
        cat, spark_cat = f'type = "hive"\nuri = "{hive_uri}"\nwarehouse = "file://{warehouse}/hive-wh"', "hive_cat"
    elif kind == "hadoop":
        cat, spark_cat = f'type = "hadoop"\nwarehouse = "{warehouse}"', "spark_cat"
    elif kind == "sql":
        cat, spark_cat = f'type = "sql"\nwarehouse = "{sql_dir}"', f"sqlite:{sql_dir}"
    else:
        cat, spark_cat = f'type = "rest"\nuri = "{rest_uri}"', "rest_cat"
    section = f'[target]\ntable = "{table}"\n{extra}\n[target.catalog]\n{cat}\n'
    return section, f"{spark_cat}.{ns}.{name}"


def run_cdc(*args, check=True):
    p = subprocess.run([CDC, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"cdc {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def cdc_changes(config, *args):
    out = run_cdc("changes", "--config", config, *args).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def sqlite_metadata_location(sql_dir, name):
    """Current metadata file of a table in iceberg-rust's sqlite catalog (a short read-only query)."""
    import sqlite3

    ns, table = name.rsplit(".", 1)
    con = sqlite3.connect(f"file:{sql_dir}/catalog.db?mode=ro", uri=True)
    try:
        row = con.execute(
            "SELECT metadata_location FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?", (ns, table)
        ).fetchone()
    finally:
        con.close()
    assert row, f"{name} not in the sqlite catalog"
    return row[0]


def spark_table(spark, name):
    """A DataFrame over a target table: `catalog.ns.table`, or `sqlite:<dir>.ns.table` read by metadata file."""
    if name.startswith("sqlite:"):
        rest = name[len("sqlite:"):]
        parts = rest.split(".")
        sql_dir, tbl = ".".join(parts[:-2]), ".".join(parts[-2:])
        return spark.read.format("iceberg").load(sqlite_metadata_location(sql_dir, tbl))
    spark.sql(f"REFRESH TABLE {name}")
    return spark.table(name)
