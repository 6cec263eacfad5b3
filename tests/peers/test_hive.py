"""Tables in a real Hive Metastore (standalone 3.1, Derby; scripts/hive-metastore.sh), written by Spark 3.5 +
Iceberg 1.10 through Iceberg's HiveCatalog (`type = hive`):
- `cdc changes` on a Hive source equals Spark's time-travel difference at every snapshot (merge-on-read v2, v3 with
  deletion vectors, a partitioned ORC table — Hive-era lakes are often ORC);
- `cdc sync` replicates hive -> hive and hive -> REST step by step, both delete modes, read back by Spark;
- `cdc run` follows a Hive source into a Hive target while Spark keeps writing;
- Spark commits to the Hive target between cdc's plan and commit (the retry path), and Spark and cdc commit to one
  Hive table at the same time: no commit is lost (both take the Metastore's table lock);
- a Metastore that is not there, and a table that is not there, are clear errors with their own exit codes."""
import signal
import subprocess
import threading
import uuid
from collections import Counter

import pytest

from conftest import CDC, cdc_changes, free_port, run_cdc, spark_table, target_section, wait_until
from spark_workloads import create, workload
from test_spark_changelog import actual_changes, expected_changes, lineage as changelog_lineage, spark_rows
from test_lake import first_snapshot, make, same
from test_spark_sync import assert_replica, assert_sync_survives_a_concurrent_commit, cols_at, lineage, rows_of, source_cols, target_rows

NS = "hdb"
# name: (format version, write mode, partitioned, file format)
HIVE_TABLES = {
    "mor_v2": (2, "merge-on-read", False, None),
    "mor_v3": (3, "merge-on-read", False, None),
    "part_orc_v2": (2, "merge-on-read", True, "orc"),
}


def hive_source(path, table, uri, extra=""):
    with open(path, "w") as f:
        f.write(f'[source]\ntable = "{table}"\n{extra}\n[source.catalog]\ntype = "hive"\nuri = "{uri}"\n')
    return str(path)


def with_target(path, section):
    with open(path, "a") as f:
        f.write(section)
    return str(path)


@pytest.fixture(scope="module")
def hive_tables(spark):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS hive_cat.{NS}")
    for name, (version, mode, partitioned, fmt) in HIVE_TABLES.items():
        create(spark, f"hive_cat.{NS}.{name}", version, mode, True, partitioned, fmt)
    return HIVE_TABLES


@pytest.mark.parametrize("name", list(HIVE_TABLES))
def test_changes_of_every_snapshot_match_spark(spark, hive_tables, hive_metastore, tmp_path, name):
    t = f"hive_cat.{NS}.{name}"
    cfg = hive_source(tmp_path / "cdc.toml", f"{NS}.{name}", hive_metastore)
    cols = source_cols(spark, t)
    history = changelog_lineage(spark, t)
    assert len(history) >= 8
    for sid, parent, op in history:
        expected = expected_changes(spark_rows(spark, t, parent, cols), spark_rows(spark, t, sid, cols), True)
        args = ["--to-snapshot", str(sid)] + (["--from-snapshot", str(parent)] if parent else [])
        got = actual_changes(cdc_changes(cfg, *args), cols)
        assert got == expected, f"{name} snapshot {sid} ({op}): missing {expected - got}, unexpected {got - expected}"


@pytest.mark.parametrize("name,kind,mode", [("mor_v2", "hive", "equality"), ("part_orc_v2", "hive", "position"),
                                            ("mor_v3", "rest", "equality"), ("part_orc_v2", "rest", "position")])
def test_sync_step_by_step(spark, hive_tables, hive_metastore, warehouse, rest_catalog, sql_target, tmp_path, name, kind, mode):
    src = f"hive_cat.{NS}.{name}"
    section, tgt = target_section(kind, f"hrep_{kind}_{mode}.{name}", warehouse, rest_catalog, sql_target,
                                  f'delete_mode = "{mode}"', hive_uri=hive_metastore)
    cfg = with_target(hive_source(tmp_path / "cdc.toml", f"{NS}.{name}", hive_metastore), section)
    for sid in lineage(spark, src):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)


def test_service_follows_a_hive_source_into_a_hive_target(spark, hive_tables, hive_metastore, warehouse, tmp_path):
    src = f"hive_cat.{NS}.svc_src"
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    for s in workload(src, 2, "merge-on-read", True, True)[:6]:
        spark.sql(s)
    cfg = tmp_path / "service.toml"
    cfg.write_text(
        '[service]\npoll_interval = "1s"\nshutdown_timeout = "20s"\n\n'
        f'[catalogs.hms]\ntype = "hive"\nuri = "{hive_metastore}"\nwarehouse = "file://{warehouse}/hive-wh"\n\n'
        f'[[pipelines]]\nname = "svc"\nsource = {{ catalog = "hms", table = "{NS}.svc_src" }}\n\n'
        '[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "hms"\ntable = "hsvc.svc_src"\n'
    )
    tgt = "hive_cat.hsvc.svc_src"
    check = run_cdc("check", "--config", str(cfg))
    assert "ok    svc" in check.stdout and "target hsvc.svc_src will be created" in check.stdout, check.stdout
    proc = subprocess.Popen([CDC, "run", "--config", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cols = source_cols(spark, src)
        assert wait_until(lambda: target_rows(spark, tgt, cols) == rows_of(spark, src, cols)), "initial copy"
        for s in workload(src, 2, "merge-on-read", True, True)[6:9]:
            spark.sql(s)
        assert wait_until(lambda: target_rows(spark, tgt, cols) == rows_of(spark, src, cols)), "later commits"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err


def test_spark_commits_between_plan_and_commit(spark, hive_tables, hive_metastore, warehouse, rest_catalog, sql_target, tmp_path):
    """cdc pauses between planning and committing (test hook); Spark commits to the Hive target meanwhile; the sync
    must see the Metastore moved, reload, retry, and keep the other writer's row."""
    name = "mor_v2"
    src = f"hive_cat.{NS}.{name}"
    section, tgt = target_section("hive", f"hconflict.{name}", warehouse, rest_catalog, sql_target, hive_uri=hive_metastore)
    cfg = with_target(hive_source(tmp_path / "cdc.toml", f"{NS}.{name}", hive_metastore), section)
    assert_sync_survives_a_concurrent_commit(spark, cfg, src, tgt, tmp_path)


def test_spark_and_cdc_commit_at_once_and_no_commit_is_lost(spark, hive_tables, hive_metastore, warehouse, rest_catalog, sql_target, tmp_path):
    """Spark appends to the Hive target in a loop while cdc syncs the source into it snapshot by snapshot: every
    Spark row and the whole source are there at the end (a lost commit would drop one or the other)."""
    name = "part_orc_v2"
    src = f"hive_cat.{NS}.{name}"
    section, tgt = target_section("hive", f"hrace.{name}", warehouse, rest_catalog, sql_target,
                                  'commit_retries = 50\nretry_backoff = "20ms"', hive_uri=hive_metastore)
    cfg = with_target(hive_source(tmp_path / "cdc.toml", f"{NS}.{name}", hive_metastore), section)
    snaps = lineage(spark, src)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    errors = []

    def spark_writer():
        try:
            for i in range(12):
                # the target's columns grow while cdc follows the source's schema
                known = {"id": str(20000 + i), "name": f"'spark-{i}'", "amount": "1.00", "ts": "TIMESTAMP '2024-01-01 00:00:00'", "cat": "'s'"}
                values = [known.get(c, "NULL") for c in spark.table(tgt).columns]
                spark.sql(f"INSERT INTO {tgt} VALUES ({', '.join(values)})")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(str(e)[:500])

    writer = threading.Thread(target=spark_writer)
    writer.start()
    for sid in snaps[1:]:
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
    writer.join(timeout=600)
    assert not errors, errors
    cols = source_cols(spark, src)
    got, want = target_rows(spark, tgt, cols), rows_of(spark, src, cols)
    spark_rows_in_target = {r for r in got if r[0] >= 20000}
    assert len(spark_rows_in_target) == 12, f"Spark rows lost: {sorted(r[0] for r in spark_rows_in_target)}"
    assert got - Counter(spark_rows_in_target) == want


def test_a_metastore_that_is_not_there_and_a_missing_table_are_clear_errors(hive_metastore, tmp_path):
    down = hive_source(tmp_path / "down.toml", f"{NS}.mor_v2", f"thrift://127.0.0.1:{free_port()}")
    p = run_cdc("changes", "--config", down, check=False)
    assert p.returncode == 9 and "is the Hive Metastore running at thrift://127.0.0.1" in p.stderr, p.stderr
    missing = hive_source(tmp_path / "missing.toml", f"{NS}.no_such_table", hive_metastore)
    p = run_cdc("changes", "--config", missing, check=False)
    assert p.returncode == 4 and "no_such_table" in p.stderr, p.stderr
    nested = hive_source(tmp_path / "nested.toml", "a.b.t", hive_metastore)
    p = run_cdc("changes", "--config", nested, check=False)
    assert p.returncode == 3 and "one level of namespace" in p.stderr, p.stderr


def test_spark_reads_what_cdc_created_in_the_metastore(spark, hive_tables, hive_metastore, warehouse, rest_catalog, sql_target, tmp_path):
    """A target cdc created is a Metastore table Spark lists, with columns Hive tools can show."""
    section, tgt = target_section("hive", "hlisted.mor_v2", warehouse, rest_catalog, sql_target, hive_uri=hive_metastore)
    cfg = with_target(hive_source(tmp_path / "cdc.toml", f"{NS}.mor_v2", hive_metastore), section)
    run_cdc("sync", "--config", cfg)
    assert "mor_v2" in [r.tableName for r in spark.sql("SHOW TABLES IN hive_cat.hlisted").collect()]
    assert spark_table(spark, tgt).count() == spark.table(f"hive_cat.{NS}.mor_v2").count()


HOLD_LOCK = r'''
import sys, time
from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TTransport
from hive_metastore.ThriftHiveMetastore import Client
from hive_metastore.ttypes import LockComponent, LockLevel, LockRequest, LockType
host, port, db, table = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
transport = TTransport.TBufferedTransport(TSocket.TSocket(host, port))
transport.open()
client = Client(TBinaryProtocol.TBinaryProtocol(transport))
component = LockComponent(type=LockType.EXCLUSIVE, level=LockLevel.TABLE, dbname=db, tablename=table)
resp = client.lock(LockRequest(component=[component], user="dead-writer", hostname="ghost-host", agentInfo="killed-writer"))
print(resp.lockid, resp.state, flush=True)
time.sleep(3600)
'''


UNLOCK = r'''
import sys
from thrift.protocol import TBinaryProtocol
from thrift.transport import TSocket, TTransport
from hive_metastore.ThriftHiveMetastore import Client
from hive_metastore.ttypes import UnlockRequest
transport = TTransport.TBufferedTransport(TSocket.TSocket(sys.argv[1], int(sys.argv[2])))
transport.open()
Client(TBinaryProtocol.TBinaryProtocol(transport)).unlock(UnlockRequest(lockid=int(sys.argv[3])))
'''


def test_a_dead_writers_lock_ends_the_commit_within_lock_timeout_naming_its_holder(spark, hive_tables, hive_metastore, warehouse,
                                                                                 rest_catalog, sql_target, tmp_path):
    """A writer killed while it holds the table's Metastore lock: the next commit waits `lock_timeout`, not minutes,
    and fails with exit 9 naming the table, the lock id and its holder; once that lock is freed as the message says
    (by its id), the sync goes through and Spark reads the target equal to the source."""
    import sys
    import time

    name = "mor_v2"
    src = f"hive_cat.{NS}.{name}"
    section, tgt = target_section("hive", f"hlock.{name}", warehouse, rest_catalog, sql_target, hive_uri=hive_metastore)
    cfg = with_target(hive_source(tmp_path / "cdc.toml", f"{NS}.{name}", hive_metastore), section + 'lock_timeout = "4s"\n')
    first = lineage(spark, src)[0]
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(first))
    host, port = hive_metastore[len("thrift://"):].split(":")
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, host, port, "hlock", name], stdout=subprocess.PIPE, text=True)
    lock_id, state = holder.stdout.readline().split()
    assert state == "1", "the writer holds the lock (ACQUIRED)"
    holder.send_signal(signal.SIGKILL)  # dies holding it: no unlock, no heartbeat
    holder.wait()
    started = time.monotonic()
    p = run_cdc("sync", "--config", cfg, check=False)
    took = time.monotonic() - started
    assert p.returncode == 9, p.stderr
    assert took < 4 + 20, f"bounded by lock_timeout (4s), took {took:.1f}s: {p.stderr}"
    for needle in ["hlock.mor_v2", f"lock {lock_id} of dead-writer@ghost-host", "agent killed-writer", "lock_timeout", "held for"]:
        assert needle in p.stderr, f"{needle}: {p.stderr}"
    # freed as the message says (the lock id, through the Metastore's unlock call), the same sync goes through
    subprocess.run([sys.executable, "-c", UNLOCK, host, port, lock_id], check=True)
    run_cdc("sync", "--config", cfg)
    assert_replica(spark, src, tgt, source_cols(spark, src))


def test_a_sync_of_patterns_lists_the_metastore_and_copies_each_match(spark, hive_tables, hive_metastore, tmp_path):
    """Issue 53: `cdc sync` with `tables` patterns on a Hive source lists the Metastore (get_all_databases,
    get_all_tables, get_table_objects_by_name_req) and copies every matching Iceberg table; Spark reads each copy equal
    to its source; `cdc check` of a service pipeline on the same patterns lists the same tables."""
    replica = tmp_path / "dr"
    cfg = tmp_path / "lake.toml"
    cfg.write_text(f'[source]\ntables = ["{NS}.mor_*"]\n[source.catalog]\ntype = "hive"\nuri = "{hive_metastore}"\n\n'
                   f'[target]\ntable = "dr_{{namespace}}.{{table}}"\n[target.catalog]\ntype = "hadoop"\nwarehouse = "{replica}"\n')
    p = run_cdc("sync", "--config", str(cfg), check=False)
    assert p.returncode == 0, p.stderr
    assert f"2 table(s) match: {NS}.mor_v2, {NS}.mor_v3" in p.stderr, p.stderr
    for name in ["mor_v2", "mor_v3"]:
        got = sorted(tuple(r) for r in spark.read.format("iceberg").load(str(replica / f"dr_{NS}" / name)).collect())
        assert got == sorted(tuple(r) for r in spark.table(f"hive_cat.{NS}.{name}").collect()), name
    assert not (replica / f"dr_{NS}" / "part_orc_v2").exists()
    svc = tmp_path / "svc.toml"
    svc.write_text(f'[catalogs.hms]\ntype = "hive"\nuri = "{hive_metastore}"\n[catalogs.dr]\ntype = "hadoop"\nwarehouse = "{replica}"\n\n'
                   f'[[pipelines]]\nname = "hive"\nsource = {{ catalog = "hms", tables = ["{NS}.*"], exclude = ["{NS}.part_*", "{NS}.svc_*"] }}\n'
                   f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "dr"\ntable = "dr_{{namespace}}.{{table}}"\n')
    checked = run_cdc("check", "--config", str(svc), check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"match hive: 2 tables: {NS}.mor_v2, {NS}.mor_v3" in checked.stdout, checked.stdout


def test_a_table_spark_renames_in_the_metastore_keeps_its_replica(spark, hive_metastore, warehouse, tmp_path):
    """Issue 53 on a Hive Metastore: Spark renames a partitioned source table while a pattern pipeline follows it; the
    replica (in the Metastore too) is renamed with it by `alter_table` and goes on from its progress — its first
    snapshot stays — and Spark reads it equal to its source; a table dropped with `on_drop = "drop"` loses its replica
    after the grace (`drop_table`, files kept)."""
    db = f"hren_{uuid.uuid4().hex[:6]}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS hive_cat.{db}")
    make(spark, f"hive_cat.{db}.orders", 20, "bucket(4, id)")
    make(spark, f"hive_cat.{db}.items", 20)
    cfg = tmp_path / "service.toml"
    cfg.write_text(
        '[service]\npoll_interval = "500ms"\ndiscover_interval = "1s"\nmetrics_address = "off"\nshutdown_timeout = "20s"\n\n'
        f'[catalogs.hms]\ntype = "hive"\nuri = "{hive_metastore}"\nwarehouse = "file://{warehouse}/hive-wh"\n\n'
        f'[[pipelines]]\nname = "hive"\nsource = {{ catalog = "hms", tables = ["{db}.*"], on_drop = "drop", drop_grace = "2s" }}\n\n'
        '[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "hms"\ntable = "{namespace}_r.{table}"\n'
    )

    def replicas():
        return sorted(r.tableName for r in spark.sql(f"SHOW TABLES IN hive_cat.{db}_r").collect())

    log_path = tmp_path / "svc.log"
    with open(log_path, "w") as log:
        p = subprocess.Popen([CDC, "run", "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
        try:
            for name in ["orders", "items"]:
                assert same(spark, f"hive_cat.{db}.{name}", f"hive_cat.{db}_r.{name}"), log_path.read_text()[-3000:]
            first = first_snapshot(spark, f"hive_cat.{db}_r.orders")
            spark.sql(f"ALTER TABLE hive_cat.{db}.orders RENAME TO {db}.orders_v2")
            spark.sql(f"UPDATE hive_cat.{db}.orders_v2 SET v = 'after' WHERE id < 5")
            assert same(spark, f"hive_cat.{db}.orders_v2", f"hive_cat.{db}_r.orders_v2"), log_path.read_text()[-3000:]
            assert first_snapshot(spark, f"hive_cat.{db}_r.orders_v2") == first, "renamed and gone on, not copied from scratch"
            spark.sql(f"DROP TABLE hive_cat.{db}.items")
            assert wait_until(lambda: replicas() == ["orders_v2"], 60), (replicas(), log_path.read_text()[-3000:])
        finally:
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
    assert rc == 0, log_path.read_text()[-3000:]
