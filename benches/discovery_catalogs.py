"""Discovery on the catalog servers at scale (issue 53): one listing of every table of a lake on the Iceberg REST
catalog server, a Hive Metastore and the Glue Data Catalog (moto's server), with the catalog calls it takes.

Each catalog gets `--tables` Iceberg tables spread over `--namespaces` namespaces (made through its own API, in
parallel: REST `POST …/tables`, Hive `create_table` records with `table_type = ICEBERG`, Glue `CreateTable`), then
`cdc check --matches-only` of a service file with one `**` pipeline on it runs `--runs` times; its
`catalog …: N tables listed in C calls, T ms` line is what a first discovery costs (the listing alone, measured
inside `cdc`; the process start and connect are left out). Then one `cdc run` whose pattern matches nothing lists
the catalog every second: `cdc_discovery_catalog_calls_total` and `cdc_discovery_duration_seconds_total` per
listing after the first are what a running service pays each `discover_interval` (a Hive listing asks only for the
objects of tables it has not seen). The sqlite and hadoop figures are the service bench's
(`cargo bench --bench service -- --discover`). Prints a Markdown table for README.md ("Replicating a whole lake").

    .peers/venv/bin/python benches/discovery_catalogs.py [--cdc target/release/cdc] [--tables 5000] [--namespaces 50]
        [--runs 5] [--only rest,hive,glue]
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
from conftest import free_port  # noqa: E402

SCHEMA = {"type": "struct", "schema-id": 0, "fields": [{"id": 1, "name": "id", "required": True, "type": "long"}]}


def names(tables, namespaces):
    """(namespace, table) for every table, spread evenly."""
    return [(f"ns{i % namespaces:03d}", f"t{i:05d}") for i in range(tables)]


def in_parallel(f, items, workers=8):
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for _ in pool.map(f, items):
            pass


def post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req) as r:
        r.read()


def fill_rest(uri, tables, namespaces):
    for ns in sorted({ns for ns, _ in tables}):
        post(f"{uri}/v1/namespaces", {"namespace": [ns], "properties": {}})
    in_parallel(lambda nt: post(f"{uri}/v1/namespaces/{nt[0]}/tables", {"name": nt[1], "schema": SCHEMA}), tables)
    return f'type = "rest"\nuri = "{uri}"\n'


def hive_client(uri):
    from thrift.protocol import TBinaryProtocol
    from thrift.transport import TSocket, TTransport
    from hive_metastore.ThriftHiveMetastore import Client
    host, port = uri.removeprefix("thrift://").split(":")
    transport = TTransport.TBufferedTransport(TSocket.TSocket(host, int(port)))
    transport.open()
    return Client(TBinaryProtocol.TBinaryProtocol(transport)), transport


def fill_hive(uri, tables, state):
    from hive_metastore.ttypes import Database, FieldSchema, SerDeInfo, StorageDescriptor, Table
    client, transport = hive_client(uri)
    for ns in sorted({ns for ns, _ in tables}):
        client.create_database(Database(name=ns, description="", locationUri=f"file://{state}/wh/{ns}.db", parameters={}))
    transport.close()

    def create(chunk):
        c, t = hive_client(uri)
        for ns, name in chunk:
            sd = StorageDescriptor(cols=[FieldSchema("id", "bigint", "")], location=f"file://{state}/wh/{ns}.db/{name}",
                                   inputFormat="org.apache.hadoop.mapred.FileInputFormat", outputFormat="org.apache.hadoop.mapred.FileOutputFormat",
                                   serdeInfo=SerDeInfo(serializationLib="org.apache.hadoop.hive.serde2.lazy.LazySimpleSerDe", parameters={}),
                                   compressed=False, numBuckets=-1, bucketCols=[], sortCols=[], parameters={})
            c.create_table(Table(tableName=name, dbName=ns, owner="bench", createTime=0, lastAccessTime=0, retention=0, sd=sd,
                                 partitionKeys=[], tableType="EXTERNAL_TABLE",
                                 parameters={"table_type": "ICEBERG", "metadata_location": f"file://{state}/none.metadata.json", "EXTERNAL": "TRUE"}))
        t.close()
    chunks = [tables[i::8] for i in range(8)]
    in_parallel(create, chunks)
    return f'type = "hive"\nuri = "{uri}"\n'


def fill_glue(endpoint, tables):
    import boto3
    glue = boto3.client("glue", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench", aws_secret_access_key="bench")
    for ns in sorted({ns for ns, _ in tables}):
        glue.create_database(DatabaseInput={"Name": ns})
    in_parallel(lambda nt: glue.create_table(DatabaseName=nt[0], TableInput={
        "Name": nt[1], "TableType": "EXTERNAL_TABLE", "Parameters": {"table_type": "ICEBERG", "metadata_location": "s3://none/x.metadata.json"}}), tables)
    return (f'type = "glue"\nregion = "us-east-1"\nendpoint = "{endpoint}"\nwarehouse = "s3://none/wh"\n'
            '"access-key-id" = "bench"\n"secret-access-key" = "bench"\n')


LINE = re.compile(r"catalog lake: (\d+) tables listed in (\d+) calls, ([\d.]+) ms")


def measure(cdc, section, work, runs):
    svc = os.path.join(work, "lake.toml")
    with open(svc, "w") as f:
        f.write(f'[catalogs.lake]\n{section}\n[[pipelines]]\nname = "all"\nsource = {{ catalog = "lake", tables = ["**"] }}\n'
                f'[[pipelines.sinks]]\ntype = "jsonl"\npath = "{work}/out/{{namespace}}.{{table}}.jsonl"\n')
    got = []
    for _ in range(runs):
        p = subprocess.run([cdc, "check", "--matches-only", "--config", svc], capture_output=True, text=True)
        m = LINE.search(p.stdout)
        if p.returncode != 0 or not m:
            raise RuntimeError(f"cdc check failed: {p.stdout}\n{p.stderr}")
        got.append((int(m[1]), int(m[2]), float(m[3])))
    return got[0][0], got[0][1], statistics.median(g[2] for g in got), min(g[2] for g in got)


def metric(body, name, labels=""):
    """The sum of the samples of `name` whose labels contain `labels`."""
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name) and (line[len(name)] in " {") and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def steady(cdc, section, work, runs):
    """A discovery at every second inside one `cdc run` (the listings after the first: what a running service pays
    each `discover_interval`, with what earlier listings learnt): (calls, ms) per listing, averaged over `runs`."""
    port = free_port()
    svc = os.path.join(work, "steady.toml")
    with open(svc, "w") as f:
        f.write(f'[service]\ndiscover_interval = "1s"\nmetrics_address = "127.0.0.1:{port}"\n\n[catalogs.lake]\n{section}\n'
                # a pattern no table matches: the catalog is listed at every discovery, no loop starts
                '[[pipelines]]\nname = "none"\nsource = { catalog = "lake", tables = ["no_such_namespace.*"] }\n'
                f'[[pipelines.sinks]]\ntype = "jsonl"\npath = "{work}/out/{{namespace}}.{{table}}.jsonl"\n')
    p = subprocess.Popen([cdc, "run", "--config", svc], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def read():
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                return None
            return (metric(body, "cdc_discovery_lists_total", 'kind="ok"'), metric(body, "cdc_discovery_catalog_calls_total"),
                    metric(body, "cdc_discovery_duration_seconds_total"))
        deadline = time.time() + 600
        first = None
        while time.time() < deadline:
            m = read()
            if m and m[0] >= 2 and first is None:
                first = m  # the start's listing and the task's first, done: from here on the steady ones
            if first and m and m[0] >= first[0] + runs:
                lists = m[0] - first[0]
                return (m[1] - first[1]) / lists, 1000 * (m[2] - first[2]) / lists
            time.sleep(0.2)
        raise RuntimeError("the service did not list the catalog in time")
    finally:
        p.terminate()
        p.wait(30)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cdc", default=os.path.join(ROOT, "target", "release", "cdc"))
    ap.add_argument("--tables", type=int, default=5000)
    ap.add_argument("--namespaces", type=int, default=50)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default="rest,hive,glue")
    a = ap.parse_args()
    tables = names(a.tables, a.namespaces)
    work = tempfile.mkdtemp(prefix="cdc-discovery-")
    rows = []
    for kind in a.only.split(","):
        state = os.path.join(work, kind)
        os.makedirs(state)
        t0 = time.time()
        if kind == "rest":
            script = os.path.join(ROOT, "scripts", "rest-catalog.sh")
            uri = subprocess.run(["bash", script, "start", state], capture_output=True, text=True, check=True).stdout.strip()
            try:
                section = fill_rest(uri, tables, a.namespaces)
                made = time.time() - t0
                result = measure(a.cdc, section, state, a.runs) + steady(a.cdc, section, state, a.runs)
            finally:
                subprocess.run(["bash", script, "stop", state])
        elif kind == "hive":
            script = os.path.join(ROOT, "scripts", "hive-metastore.sh")
            uri = subprocess.run(["bash", script, "start", state], capture_output=True, text=True, check=True).stdout.strip()
            try:
                section = fill_hive(uri, tables, state)
                made = time.time() - t0
                result = measure(a.cdc, section, state, a.runs) + steady(a.cdc, section, state, a.runs)
            finally:
                subprocess.run(["bash", script, "stop", state])
        elif kind == "glue":
            port = free_port()
            peers = os.environ.get("PEERS_DIR", os.path.join(ROOT, ".peers"))
            moto = subprocess.Popen([os.path.join(peers, "venv", "bin", "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                endpoint = f"http://127.0.0.1:{port}"
                for _ in range(100):
                    try:
                        urllib.request.urlopen(endpoint + "/moto-api/")
                        break
                    except OSError:
                        time.sleep(0.2)
                section = fill_glue(endpoint, tables)
                made = time.time() - t0
                result = measure(a.cdc, section, state, a.runs) + steady(a.cdc, section, state, a.runs)
            finally:
                moto.terminate()
                moto.wait(10)
        else:
            raise SystemExit(f"unknown catalog {kind}")
        listed, calls, median_ms, best_ms, steady_calls, steady_ms = result
        print(f"{kind}: {listed} tables listed in {calls} calls, median {median_ms:.1f} ms (best {best_ms:.1f}); "
              f"in a running service {steady_calls:.0f} calls, {steady_ms:.1f} ms a listing; made in {made:.0f} s", file=sys.stderr)
        rows.append((kind, listed, calls, median_ms, best_ms, steady_calls, steady_ms))
    print(f"\n{a.tables} tables in {a.namespaces} namespaces, {a.runs} runs each\n")
    print("| catalog | tables listed | first listing: calls | ms (median of `cdc check`) | best, ms | a running service's listing: calls | ms (mean) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, listed, calls, median_ms, best_ms, steady_calls, steady_ms in rows:
        print(f"| {kind} | {listed} | {calls} | {median_ms:.1f} | {best_ms:.1f} | {steady_calls:.0f} | {steady_ms:.1f} |")


if __name__ == "__main__":
    main()
