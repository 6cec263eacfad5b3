"""Tables on Google Cloud Storage through a BigLake-shaped REST catalog, with Google credentials that expire.

Peers, all real and on 127.0.0.1: the GCS emulator (fake-gcs-server), the Iceberg REST catalog server with its
warehouse on the emulator (Iceberg's GCS FileIO), Apache Spark writing the sources and reading the targets back through
that catalog. Between `cdc` and them sit the checking proxies of `gcp_fake`: the catalog proxy demands a valid Google
token and the `x-goog-user-project` header and vends storage tokens; the storage proxy demands a valid token. Tokens of
the service account expire after TOKEN_TTL seconds and vended ones after STORAGE_TTL, so a missed refresh fails.
"""
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections import Counter

import pytest

import gcp_fake
import object_names
from conftest import CDC, ROOT, run_cdc, wait_until
from spark_workloads import TABLES, workload

PROJECT = "cdc-test"
BUCKET = "cdc-lake"
TOKEN_TTL = 4
STORAGE_TTL = 5
GSCAT = "gcs_cat"


class Gcp:
    """Handles of the running GCS stack."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def env(self):
        env = dict(os.environ)
        env["GOOGLE_APPLICATION_CREDENTIALS"] = self.key_file
        # gcp_auth must never look further than the key file (no metadata server, no gcloud)
        env.pop("GCE_METADATA_HOST", None)
        return env

    def catalog(self, **extra):
        lines = ['type = "biglake"', f'project = "{PROJECT}"', f'warehouse = "gs://{BUCKET}"', f'uri = "{self.catalog_proxy.url}"']
        lines += [f'{json.dumps(k)} = {json.dumps(v)}' for k, v in extra.items()]
        return "\n".join(lines) + "\n"

    def sync(self, cfg, *args):
        """`cdc sync` with this stack's Google credentials."""
        return subprocess.run([CDC, "sync", "--config", cfg, *args], capture_output=True, text=True, env=self.env())

    def objects(self, prefix):
        url = f"{self.gcs_url}/storage/v1/b/{BUCKET}/o?prefix={prefix}&maxResults=100000"
        with urllib.request.urlopen(url) as r:
            return sorted(o["name"] for o in json.load(r).get("items", []))


@pytest.fixture(scope="session")
def gcp(warehouse, spark):
    state = os.path.join(warehouse, "gcp")
    os.makedirs(state, exist_ok=True)
    gcs_script, rest_script = os.path.join(ROOT, "scripts", "fake-gcs.sh"), os.path.join(ROOT, "scripts", "rest-catalog.sh")
    p = subprocess.run(["bash", gcs_script, "start", os.path.join(state, "gcs"), BUCKET], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"GCS emulator did not start: {p.stderr}")
    gcs_url = p.stdout.strip()
    env = dict(os.environ, CATALOG_WAREHOUSE=f"gs://{BUCKET}/wh", CATALOG_IO__IMPL="org.apache.iceberg.gcp.gcs.GCSFileIO",
               CATALOG_GCS_SERVICE_HOST=gcs_url, CATALOG_GCS_NO__AUTH="true", CATALOG_GCS_PROJECT__ID=PROJECT)
    p = subprocess.run(["bash", rest_script, "start", os.path.join(state, "rest")], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"REST catalog server on GCS did not start: {p.stderr}")
    rest_url = p.stdout.strip()
    tokens = gcp_fake.Tokens()
    token_server = gcp_fake.TokenServer(tokens, TOKEN_TTL, PROJECT)
    storage_proxy = gcp_fake.Proxy(int(gcs_url.rsplit(":", 1)[1]), tokens, {"google", "storage"})
    catalog_proxy = gcp_fake.Proxy(int(rest_url.rsplit(":", 1)[1]), tokens, {"google"}, project=PROJECT,
                                   vend=(storage_proxy.url, STORAGE_TTL))
    key_file = token_server.key_file(os.path.join(state, "service-account.json"))
    # Spark talks to the catalog and the emulator directly (its Java GCS client cannot renew a vended token)
    for k, v in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest", ".uri": rest_url,
                 ".io-impl": "org.apache.iceberg.gcp.gcs.GCSFileIO", ".gcs.service.host": gcs_url, ".gcs.no-auth": "true",
                 ".gcs.project-id": PROJECT}.items():
        spark.conf.set(f"spark.sql.catalog.{GSCAT}{k}", v)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {GSCAT}.db")
    yield Gcp(gcs_url=gcs_url, rest_url=rest_url, tokens=tokens, token_server=token_server, storage_proxy=storage_proxy,
              catalog_proxy=catalog_proxy, key_file=key_file)
    for s in (catalog_proxy, storage_proxy, token_server):
        s.stop()
    subprocess.run(["bash", rest_script, "stop", os.path.join(state, "rest")])
    subprocess.run(["bash", gcs_script, "stop", os.path.join(state, "gcs")])


def spark_source(spark, name, kind="mor_v3", statements=None):
    version, mode, keyed, partitioned = TABLES[kind]
    t = f"{GSCAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    for s in (statements or workload(t, version, mode, keyed, partitioned)):
        spark.sql(s)
    return t


def rows(spark, table):
    spark.sql(f"REFRESH TABLE {table}")
    return Counter(tuple(r) for r in spark.table(table).collect())


def rows_if_exists(spark, table):
    """The table's rows, or None while it does not exist yet."""
    try:
        return rows(spark, table)
    except Exception as e:  # noqa: BLE001 (Spark raises AnalysisException subclasses through py4j)
        if "TABLE_OR_VIEW_NOT_FOUND" in str(e) or "not found" in str(e).lower():
            return None
        raise


def assert_same(spark, source, target):
    want, got = rows(spark, source), rows(spark, target)
    assert got == want, f"missing {want - got}, extra {got - want}"
    keys = Counter(r[0] for r in got.elements())
    assert max(keys.values(), default=1) == 1, "duplicate keys in the target"


def config(tmp_path, gcp, source, target, target_extra=""):
    path = tmp_path / "cdc.toml"
    path.write_text(
        f'[source]\ntable = "{source}"\n[source.catalog]\n{gcp.catalog()}\n'
        f'[target]\ntable = "{target}"\n{target_extra}\n[target.catalog]\n{gcp.catalog()}'
    )
    return str(path)


def referenced_files(spark, table):
    spark.sql(f"REFRESH TABLE {table}")
    return {r.file_path for r in spark.sql(f"SELECT file_path FROM {table}.all_files").collect()}


def orphans(spark, gcp, table, ns, name):
    """Objects under the table's data/ folder that no snapshot references."""
    objs = {f"gs://{BUCKET}/{o}" for o in gcp.objects(f"wh/{ns}/{name}/data/")}
    return objs - referenced_files(spark, table)


def test_sync_gs_to_gs_with_expiring_credentials(spark, gcp, tmp_path):
    src = spark_source(spark, "g_mor_v3")
    google0, vended0 = gcp.tokens.count("google"), gcp.catalog_proxy.vended
    cfg = config(tmp_path, gcp, "db.g_mor_v3", "repl.g_mor_v3", "format_version = 3")
    t0 = time.time()
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    assert_same(spark, src, f"{GSCAT}.repl.g_mor_v3")
    assert gcp.tokens.count("google") > google0, "cdc did not use the service account's tokens"
    assert gcp.catalog_proxy.vended > vended0, "cdc did not ask for vended storage credentials"
    assert gcp.storage_proxy.refusals == [], f"storage requests with an invalid token: {gcp.storage_proxy.refusals[:3]}"
    # a second sync finds nothing new, and the target's progress is its own
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    assert_same(spark, src, f"{GSCAT}.repl.g_mor_v3")
    assert orphans(spark, gcp, f"{GSCAT}.repl.g_mor_v3", "repl", "g_mor_v3") == set()
    print(f"sync took {time.time() - t0:.1f}s")


def test_missing_project_header_or_credentials_fail_clearly(spark, gcp, tmp_path):
    spark_source(spark, "g_auth", statements=[f"CREATE TABLE {GSCAT}.db.g_auth (id BIGINT NOT NULL) USING iceberg",
                                               f"INSERT INTO {GSCAT}.db.g_auth VALUES (1)"])
    cfg = tmp_path / "bad.toml"
    # the header is set by the biglake shorthand; a plain rest catalog without it is refused by "BigLake" (403)
    cfg.write_text(f'[source]\ntable = "db.g_auth"\n[source.catalog]\ntype = "rest"\nuri = "{gcp.catalog_proxy.url}"\nauth = "google"\n')
    p = subprocess.run([CDC, "changes", "--config", str(cfg)], capture_output=True, text=True, env=gcp.env())
    assert p.returncode == 12, p.stderr
    assert "403" in p.stderr and "IAM" in p.stderr, p.stderr
    # no credentials at all: a message that says how to provide them, and no metadata-server call
    cfg.write_text(f'[source]\ntable = "db.g_auth"\n[source.catalog]\n{gcp.catalog(**{"google-credentials-file": str(tmp_path / "none.json")})}')
    p = subprocess.run([CDC, "changes", "--config", str(cfg)], capture_output=True, text=True, env=gcp.env())
    assert p.returncode == 12, p.stderr
    assert "none.json" in p.stderr and "google-credentials-file" in p.stderr, p.stderr


def test_service_replicates_across_many_token_expiries(spark, gcp, tmp_path):
    src = spark_source(spark, "g_live", "cow_v2")
    cfg = tmp_path / "service.toml"
    cfg.write_text(
        f'[service]\npoll_interval = "1s"\nmetrics_address = "off"\n\n[catalogs.lake]\n{gcp.catalog()}\n'
        f'[[pipelines]]\nname = "g_live"\nsource = {{ catalog = "lake", table = "db.g_live" }}\n\n'
        f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "lake"\ntable = "repl.g_live"\n'
    )
    google0, vended0 = gcp.tokens.count("google"), gcp.catalog_proxy.vended
    log = open(tmp_path / "service.log", "w")
    svc = subprocess.Popen([CDC, "run", "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT, env=gcp.env())
    try:
        # keep committing for several token lifetimes
        for i in range(6):
            time.sleep(3)
            spark.sql(f"UPDATE {src} SET amount = amount + 1 WHERE id % 3 = {i % 3}")
            spark.sql(f"INSERT INTO {src} VALUES (100 + {i}, 'live-{i}', 1.00, TIMESTAMP '2024-01-01 00:00:00', 'l', 'x')")
        wait_until(lambda: rows(spark, f"{GSCAT}.repl.g_live") == rows(spark, src))
        assert svc.poll() is None, "the service died"
    finally:
        svc.send_signal(signal.SIGTERM)
        rc = svc.wait(60)
        log.close()
    text = open(tmp_path / "service.log").read()
    assert rc == 0, text[-3000:]
    assert_same(spark, src, f"{GSCAT}.repl.g_live")
    google, vended = gcp.tokens.count("google") - google0, gcp.catalog_proxy.vended - vended0
    assert google >= 4, f"only {google} Google tokens over ~20 s of {TOKEN_TTL} s tokens: not renewed"
    assert vended >= 4, f"only {vended} vended credentials"
    assert gcp.storage_proxy.refusals == [], gcp.storage_proxy.refusals[:3]
    assert " ERROR " not in text and '"level":"ERROR"' not in text, text[-3000:]


def test_faults_between_cdc_and_storage_and_catalog(spark, gcp, tmp_path):
    src = spark_source(spark, "g_faults", "mor_v2")
    cfg = config(tmp_path, gcp, "db.g_faults", "repl.g_faults", "snapshots_per_commit = 3\nretry_backoff = \"100ms\"")
    # the first run copies the table at its second snapshot; the faults hit the incremental run after it
    p = gcp.sync(cfg, "--to-snapshot", str(snapshot_ids(spark, src)[1]))
    assert p.returncode == 0, p.stderr
    sp, cp = gcp.storage_proxy, gcp.catalog_proxy
    sp.inject("POST", r"/upload/", "503", 2)          # uploads answered 503: retried by the storage layer
    sp.inject("GET", r"/o/", "drop", 2)               # reads whose connection drops: retried
    sp.inject("POST", r"/upload/", "stall", 1)        # a stalled upload: times out, retried
    cp.inject("POST", r"/tables/g_faults$", "503_after", 1)  # commit applied, answer lost: must not apply twice
    cp.inject("POST", r"/tables/g_faults$", "drop", 1)       # commit never reached the server: applied later
    cp.inject("GET", r"/tables/g_faults", "503", 2)          # loads answered 503: retried
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    assert sp.pending_faults() == 0 and cp.pending_faults() == 0, f"faults never hit: {sp.faults} {cp.faults}"
    assert_same(spark, src, f"{GSCAT}.repl.g_faults")
    assert orphans(spark, gcp, f"{GSCAT}.repl.g_faults", "repl", "g_faults") == set()


def test_a_commit_that_keeps_failing_leaves_nothing_behind(spark, gcp, tmp_path):
    src = spark_source(spark, "g_fail", "cow_v2")
    cfg = config(tmp_path, gcp, "db.g_fail", "repl.g_fail", "commit_retries = 2\nretry_backoff = \"100ms\"")
    p = gcp.sync(cfg, "--to-snapshot", str(snapshot_ids(spark, src)[2]))
    assert p.returncode == 0, p.stderr
    before = snapshot_ids(spark, f"{GSCAT}.repl.g_fail")
    gcp.catalog_proxy.inject("POST", r"/tables/g_fail$", "503", 50)
    p = gcp.sync(cfg)
    gcp.catalog_proxy.faults.clear()
    assert p.returncode == 9, p.stderr
    assert "503" in p.stderr, p.stderr
    assert snapshot_ids(spark, f"{GSCAT}.repl.g_fail") == before, "a failed run changed the target"
    assert orphans(spark, gcp, f"{GSCAT}.repl.g_fail", "repl", "g_fail") == set(), "a failed run left files behind"
    # and the next run completes
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    assert_same(spark, src, f"{GSCAT}.repl.g_fail")


def test_a_commit_that_lands_after_its_gateway_timed_out(spark, gcp, tmp_path):
    """The catalog's gateway answers 504 while the server still applies the commit half a second later — after cdc
    reloaded once and saw nothing. cdc must recognise its own snapshot when it lands (not take it for another writer's
    progress and delete the files it references), apply every change once and leave no orphan."""
    src = spark_source(spark, "g_late", "mor_v2")
    cfg = config(tmp_path, gcp, "db.g_late", "repl.g_late", "retry_backoff = \"1s\"")
    p = gcp.sync(cfg, "--to-snapshot", str(snapshot_ids(spark, src)[1]))
    assert p.returncode == 0, p.stderr
    gcp.catalog_proxy.forward_delay = 0.5  # lands after the reload that follows the 504, before the retry's (>= 1 s)
    gcp.catalog_proxy.inject("POST", r"/tables/g_late$", "504_forward_later", 1)
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    assert gcp.catalog_proxy.pending_faults() == 0, gcp.catalog_proxy.faults
    assert_same(spark, src, f"{GSCAT}.repl.g_late")
    assert orphans(spark, gcp, f"{GSCAT}.repl.g_late", "repl", "g_late") == set()


def test_a_commit_whose_outcome_stays_unknown_keeps_its_files(spark, gcp, tmp_path):
    """Every attempt of a commit ends in a gateway timeout and the run gives up (exit 9) — but the first attempt is
    still on its way and lands seconds later. The files it references must still be there: the table stays readable
    and the next run completes it exactly."""
    src = spark_source(spark, "g_unknown", "cow_v2")
    cfg = config(tmp_path, gcp, "db.g_unknown", "repl.g_unknown", "commit_retries = 2\nretry_backoff = \"200ms\"")
    p = gcp.sync(cfg, "--to-snapshot", str(snapshot_ids(spark, src)[1]))
    assert p.returncode == 0, p.stderr
    tgt = f"{GSCAT}.repl.g_unknown"
    before = snapshot_ids(spark, tgt)
    gcp.catalog_proxy.forward_delay = 4
    gcp.catalog_proxy.inject("POST", r"/tables/g_unknown$", "504_forward_later", 2)
    try:
        p = gcp.sync(cfg)
        assert p.returncode == 9, p.stderr
        assert "commit state unknown" in p.stderr and "504" in p.stderr, p.stderr
        # the first attempt lands; the second requires the head the first replaced and is refused
        assert wait_until(lambda: len(snapshot_ids(spark, tgt)) == len(before) + 1, secs=30), "the delayed commit never landed"
        time.sleep(gcp.catalog_proxy.forward_delay)
        assert len(snapshot_ids(spark, tgt)) == len(before) + 1
    finally:
        gcp.catalog_proxy.faults.clear()
        gcp.catalog_proxy.forward_delay = 0.5
    # every file the landed commit references is still there: reading all rows fails on a missing one
    landed = rows(spark, tgt)
    assert landed and max(Counter(r[0] for r in landed.elements()).values()) == 1
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    assert_same(spark, src, tgt)
    assert orphans(spark, gcp, tgt, "repl", "g_unknown") == set()


def snapshot_ids(spark, t):
    spark.sql(f"REFRESH TABLE {t}")
    return [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at").collect()]


def test_partitioned_object_names_are_the_metadata_paths(spark, gcp, tmp_path):
    """Partition values with `=`, `%`, space, `+`, `#`, `?`, `/`, unicode, null, under every transform: every object
    `cdc sync` and `cdc run` write is stored under exactly the path the target's metadata holds (Spark reads the
    target through GCSFileIO, and the bucket listing matches the metadata name for name); a commit that keeps failing
    deletes what it wrote by those names; and `cdc` reads Spark's partitioned source by its names. The service's
    target is in `delete_mode = "position"`: its position deletes go to the partition of the rows they delete."""
    src = spark_source(spark, "g_names", statements=object_names.workload(f"{GSCAT}.db.g_names", 2))
    bucket = f"gs://{BUCKET}"
    object_names.assert_names_match(set(gcp.objects("wh/db/g_names/")), object_names.referenced(spark, src, bucket), "Spark's source")
    tgt = f"{GSCAT}.repl.g_names"
    cfg = config(tmp_path, gcp, "db.g_names", "repl.g_names", "commit_retries = 2\nretry_backoff = \"100ms\"")
    p = gcp.sync(cfg, "--to-snapshot", str(snapshot_ids(spark, src)[2]))
    assert p.returncode == 0, p.stderr
    # a commit that keeps failing: the files it wrote are deleted, by their names
    gcp.catalog_proxy.inject("POST", r"/tables/g_names$", "503", 50)
    try:
        p = gcp.sync(cfg)
    finally:
        gcp.catalog_proxy.faults.clear()
    assert p.returncode == 9, p.stderr
    object_names.assert_names_match(set(gcp.objects("wh/repl/g_names/")), object_names.referenced(spark, tgt, bucket), "after a failed commit")
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    assert_same(spark, src, tgt)
    names = object_names.referenced(spark, tgt, bucket)
    object_names.assert_names_match(set(gcp.objects("wh/repl/g_names/")), names, "cdc sync's target")
    object_names.assert_partition_dirs(names, "cdc sync's target")
    object_names.assert_named_like_spark(spark, src, tgt)

    # the service writes the same names
    svc_cfg = tmp_path / "service.toml"
    svc_cfg.write_text(
        f'[service]\npoll_interval = "500ms"\nmetrics_address = "off"\n\n[catalogs.lake]\n{gcp.catalog()}\n'
        f'[[pipelines]]\nname = "g_names"\nsource = {{ catalog = "lake", table = "db.g_names" }}\n\n'
        f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "lake"\ntable = "repl.g_names_svc"\ndelete_mode = "position"\n'
    )
    svc_tgt = f"{GSCAT}.repl.g_names_svc"
    log = open(tmp_path / "service.log", "w")
    svc = subprocess.Popen([CDC, "run", "--config", str(svc_cfg)], stdout=log, stderr=subprocess.STDOUT, env=gcp.env())
    try:
        assert wait_until(lambda: rows_if_exists(spark, svc_tgt) == rows(spark, src)), \
            open(tmp_path / "service.log").read()[-3000:]
        spark.sql(f"INSERT INTO {src} VALUES (200, 'new?=/#', 'n n', TIMESTAMP '2024-03-01 01:00:00', TIMESTAMP '2024-03-01 01:30:00')")
        spark.sql(f"DELETE FROM {src} WHERE id = 6")
        assert wait_until(lambda: rows(spark, svc_tgt) == rows(spark, src)), open(tmp_path / "service.log").read()[-3000:]
    finally:
        svc.send_signal(signal.SIGTERM)
        rc = svc.wait(60)
        log.close()
    assert rc == 0, open(tmp_path / "service.log").read()[-3000:]
    names = object_names.referenced(spark, svc_tgt, bucket)
    object_names.assert_names_match(set(gcp.objects("wh/repl/g_names_svc/")), names, "cdc run's target")
    object_names.assert_named_like_spark(spark, src, svc_tgt)


@pytest.mark.parametrize("kind", ["part_v2", "mor_v3"])
def test_maintain_on_gcs_through_biglake_credentials(spark, gcp, tmp_path, kind):
    """`cdc maintain` on a gs:// target reached with vended, expiring credentials: it compacts (v2), rewrites the manifests a sync
    without in-commit merging left, expires snapshots beyond the retention, and deletes an object no snapshot
    references (listed through the same credentials) — and nothing Spark needs: Spark reads the target equal to the
    source after it, and a later sync goes on from the progress it records."""
    name = f"g_maint_{kind}"
    src = spark_source(spark, name, kind)
    tgt = f"{GSCAT}.repl.{name}"
    version = TABLES[kind][0]
    extra = (f"format_version = {version}\nsnapshots_per_commit = 1\nmerge_manifests = false\nexpire_snapshots = false\n"
             'snapshot_retention = "0s"\nretain_snapshots = 2\norphan_grace = "1s"')
    cfg = config(tmp_path, gcp, f"db.{name}", f"repl.{name}", extra)
    first = snapshot_ids(spark, src)[0]
    assert gcp.sync(cfg, "--to-snapshot", str(first)).returncode == 0
    p = gcp.sync(cfg)
    assert p.returncode == 0, p.stderr
    before = spark.sql(f"SELECT count(*) FROM {tgt}.manifests").collect()[0][0]
    orphan = f"wh/repl/{name}/data/orphan-{kind}.parquet"
    req = urllib.request.Request(f"{gcp.gcs_url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={orphan}", data=b"junk", method="POST")
    urllib.request.urlopen(req).read()
    assert orphan in gcp.objects(f"wh/repl/{name}/data/")
    time.sleep(2)
    p = subprocess.run([CDC, "maintain", "--config", cfg, "--json"], capture_output=True, text=True, env=gcp.env())
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)
    assert m["orphans_deleted"] == 1, m
    assert orphan not in gcp.objects(f"wh/repl/{name}/data/")
    assert m["snapshots_expired"] >= 1, m
    spark.sql(f"REFRESH TABLE {tgt}")
    after = spark.sql(f"SELECT count(*) FROM {tgt}.manifests").collect()[0][0]
    assert after < before or before <= 2, (before, after)
    if version == 2:  # compacted: every delete applied and dropped (v3 targets are not compacted: row lineage)
        deletes = spark.sql(f"SELECT count(*) FROM {tgt}.delete_files").collect()[0][0]
        assert m["data_files_rewritten"] > 0 and deletes == 0, (m, deletes)
    assert_same(spark, src, tgt)
    assert orphans(spark, gcp, tgt, "repl", name) == set()
    p = gcp.sync(cfg, "--json")
    assert p.returncode == 0 and '"source_snapshots_applied": 0' in p.stdout, p.stderr
