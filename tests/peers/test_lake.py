"""Replicating a lake by table patterns (issue 53): `cdc run` with one pattern pipeline per source catalog — the
Iceberg REST catalog server (paginated list calls per namespace) and Spark's hadoop warehouse (a directory walk) —
while Spark creates, writes and drops tables. Every matched table's replica, read back by Spark, equals its source;
excluded and unmatched tables are not replicated; a table Spark creates while the service runs is found at the next
discovery; a dropped one stops its loop and keeps its replica (or, with `on_drop = "drop"`, its replica goes after the grace);
a renamed one keeps its replica, renamed with it."""
import subprocess
import signal
import uuid
from collections import Counter

from conftest import CDC, run_cdc, wait_until
from spark_workloads import CAT


def rows(spark, name):
    spark.sql(f"REFRESH TABLE {name}")
    return Counter(tuple(r) for r in spark.table(name).collect())


def same(spark, src, dst, secs=90):
    """Whether Spark reads `dst` equal to `src` within `secs`."""
    return wait_until(lambda: rows(spark, dst) == rows(spark, src), secs)


def first_snapshot(spark, name):
    """The id of `name`'s oldest snapshot: a replica renamed and gone on keeps it, a copy from scratch does not."""
    spark.sql(f"REFRESH TABLE {name}")
    return spark.sql(f"SELECT snapshot_id FROM {name}.snapshots ORDER BY committed_at LIMIT 1").collect()[0][0]


def make(spark, name, n, partitioned_by=""):
    """A merge-on-read v2 table keyed by `id` with `n` rows (`partitioned_by`: e.g. "bucket(4, id)")."""
    part = f"PARTITIONED BY ({partitioned_by}) " if partitioned_by else ""
    spark.sql(f"CREATE TABLE {name} (id BIGINT NOT NULL, v STRING) USING iceberg {part}TBLPROPERTIES ('format-version'='2', "
              "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read')")
    spark.sql(f"ALTER TABLE {name} SET IDENTIFIER FIELDS id")
    spark.sql(f"INSERT INTO {name} VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(n)))


def test_pattern_pipelines_follow_tables_spark_creates_and_drops(spark, warehouse, rest_catalog, tmp_path):
    tag = uuid.uuid4().hex[:6]
    rest_ns, lake_ns = f"lake_{tag}", f"wh_{tag}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS rest_cat.{rest_ns}")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS rest_cat.{rest_ns}.inner")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.{lake_ns}")
    for name, n in [(f"rest_cat.{rest_ns}.orders", 30), (f"rest_cat.{rest_ns}.tmp_scratch", 3), (f"rest_cat.{rest_ns}.inner.deep", 7),
                    (f"{CAT}.{lake_ns}.events", 20), (f"{CAT}.{lake_ns}.audit", 5)]:
        make(spark, name, n)
    replica = tmp_path / "replica"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    svc = tmp_path / "service.toml"
    svc.write_text(
        f'[service]\npoll_interval = "500ms"\ndiscover_interval = "2s"\nmetrics_address = "off"\n\n'
        f'[catalogs.rest]\ntype = "rest"\nuri = "{rest_catalog}"\n\n'
        f'[catalogs.wh]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n\n'
        # the replicas land in Spark's hadoop warehouse, under their own namespaces, so Spark reads them back
        f'[[pipelines]]\nname = "rest"\nsource = {{ catalog = "rest", tables = ["{rest_ns}.**"], exclude = ["{rest_ns}.tmp_*"] }}\n'
        f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "wh"\ntable = "r_{{namespace}}.{{table}}"\n\n'
        f'[[pipelines]]\nname = "wh"\nsource = {{ catalog = "wh", tables = ["{lake_ns}.e*"] }}\n'
        f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "wh"\ntable = "h_{{namespace}}.{{table}}"\n'
    )
    checked = run_cdc("check", "--config", str(svc), check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"match rest: 2 tables: {rest_ns}.inner.deep, {rest_ns}.orders" in checked.stdout, checked.stdout
    assert f"match wh: 1 tables: {lake_ns}.events" in checked.stdout, checked.stdout

    log_path = tmp_path / "svc.log"
    with open(log_path, "w") as log:
        p = subprocess.Popen([CDC, "run", "--config", str(svc)], stdout=log, stderr=subprocess.STDOUT)
        try:
            assert same(spark, f"rest_cat.{rest_ns}.orders", f"{CAT}.r_{rest_ns}.orders"), log_path.read_text()[-3000:]
            assert same(spark, f"rest_cat.{rest_ns}.inner.deep", f"{CAT}.r_{rest_ns}.inner.deep"), log_path.read_text()[-3000:]
            assert same(spark, f"{CAT}.{lake_ns}.events", f"{CAT}.h_{lake_ns}.events"), log_path.read_text()[-3000:]
            spark.sql(f"UPDATE rest_cat.{rest_ns}.orders SET v = 'changed' WHERE id < 5")
            spark.sql(f"DELETE FROM {CAT}.{lake_ns}.events WHERE id >= 15")
            assert same(spark, f"rest_cat.{rest_ns}.orders", f"{CAT}.r_{rest_ns}.orders"), log_path.read_text()[-3000:]
            assert same(spark, f"{CAT}.{lake_ns}.events", f"{CAT}.h_{lake_ns}.events"), log_path.read_text()[-3000:]
            # created while the service runs: found at the next discovery
            make(spark, f"rest_cat.{rest_ns}.returns", 12)
            make(spark, f"{CAT}.{lake_ns}.errors", 4)
            assert same(spark, f"rest_cat.{rest_ns}.returns", f"{CAT}.r_{rest_ns}.returns"), log_path.read_text()[-3000:]
            assert same(spark, f"{CAT}.{lake_ns}.errors", f"{CAT}.h_{lake_ns}.errors"), log_path.read_text()[-3000:]
            # dropped: its loop stops, its replica stays
            spark.sql(f"DROP TABLE rest_cat.{rest_ns}.inner.deep")
            assert wait_until(lambda: f"{rest_ns}.inner.deep" in log_path.read_text() and "no longer matched" in log_path.read_text(), 30), \
                log_path.read_text()[-3000:]
            assert rows(spark, f"{CAT}.r_{rest_ns}.inner.deep") == Counter((i, f"v{i}") for i in range(7))
        finally:
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
    text = log_path.read_text()
    assert rc == 0, text[-3000:]
    assert "tmp_scratch" not in text and "audit" not in text, "excluded and unmatched tables are never followed"
    assert sorted(r.tableName for r in spark.sql(f"SHOW TABLES IN {CAT}.r_{rest_ns}").collect()) == ["orders", "returns"]
    assert sorted(r.tableName for r in spark.sql(f"SHOW TABLES IN {CAT}.h_{lake_ns}").collect()) == ["errors", "events"]


def test_a_renamed_table_keeps_its_replica_and_a_dropped_ones_goes(spark, rest_catalog, tmp_path):
    """Spark renames a partitioned table and drops another while the service runs (`on_drop = "drop"`), replicas in
    the REST catalog: the renamed table's replica is renamed with it and goes on from its progress (its first snapshot
    stays), read back by Spark equal to its source; the dropped table's replica leaves the catalog after the grace."""
    ns = f"ren_{uuid.uuid4().hex[:6]}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS rest_cat.{ns}")
    make(spark, f"rest_cat.{ns}.orders", 40, "bucket(4, id)")
    make(spark, f"rest_cat.{ns}.items", 10)
    svc = tmp_path / "service.toml"
    svc.write_text(
        f'[service]\npoll_interval = "500ms"\ndiscover_interval = "1s"\nmetrics_address = "off"\n\n'
        f'[catalogs.rest]\ntype = "rest"\nuri = "{rest_catalog}"\n\n'
        f'[[pipelines]]\nname = "lake"\nsource = {{ catalog = "rest", tables = ["{ns}.*"], on_drop = "drop", drop_grace = "2s" }}\n'
        f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "rest"\ntable = "r_{{namespace}}.{{table}}"\n'
    )

    def replicas():
        return sorted(r.tableName for r in spark.sql(f"SHOW TABLES IN rest_cat.r_{ns}").collect())

    log_path = tmp_path / "svc.log"
    with open(log_path, "w") as log:
        p = subprocess.Popen([CDC, "run", "--config", str(svc)], stdout=log, stderr=subprocess.STDOUT)
        try:
            assert same(spark, f"rest_cat.{ns}.orders", f"rest_cat.r_{ns}.orders"), log_path.read_text()[-3000:]
            assert same(spark, f"rest_cat.{ns}.items", f"rest_cat.r_{ns}.items"), log_path.read_text()[-3000:]
            first = first_snapshot(spark, f"rest_cat.r_{ns}.orders")
            spark.sql(f"ALTER TABLE rest_cat.{ns}.orders RENAME TO {ns}.orders_v2")  # the new name is within the catalog
            spark.sql(f"UPDATE rest_cat.{ns}.orders_v2 SET v = 'after' WHERE id < 5")
            assert same(spark, f"rest_cat.{ns}.orders_v2", f"rest_cat.r_{ns}.orders_v2"), log_path.read_text()[-3000:]
            assert first_snapshot(spark, f"rest_cat.r_{ns}.orders_v2") == first, "renamed and gone on, not copied from scratch"
            assert "its destination renamed with it" in log_path.read_text()
            spark.sql(f"DROP TABLE rest_cat.{ns}.items")
            assert wait_until(lambda: replicas() == ["orders_v2"], 60), (replicas(), log_path.read_text()[-3000:])
            assert "its destination was dropped" in log_path.read_text()
            spark.sql(f"DELETE FROM rest_cat.{ns}.orders_v2 WHERE id >= 30")
            assert same(spark, f"rest_cat.{ns}.orders_v2", f"rest_cat.r_{ns}.orders_v2"), log_path.read_text()[-3000:]
        finally:
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
    assert rc == 0, log_path.read_text()[-3000:]
