"""History edge cases on Spark-written tables: rolled-back history, expired snapshots, and key validation."""
from collections import Counter

from conftest import cdc_changes, run_cdc, write_config
from spark_workloads import CAT

EXIT_RANGE, EXIT_EXPIRED, EXIT_SCHEMA = 5, 6, 7


def snapshot_ids(spark, t):
    return [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at").collect()]


def test_rollback_expiry_and_bad_keys(spark, warehouse, tmp_path):
    t = f"{CAT}.db.history"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING, f DOUBLE) USING iceberg TBLPROPERTIES ('format-version'='2', 'write.update.mode'='merge-on-read')")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a', 1.0), (2, 'b', 2.0)")
    spark.sql(f"INSERT INTO {t} VALUES (3, 'c', 3.0)")
    s1, s2 = snapshot_ids(spark, t)
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.history', {s1})")
    spark.sql(f"INSERT INTO {t} VALUES (4, 'd', 4.0)")
    spark.sql(f"UPDATE {t} SET v = 'A' WHERE id = 1")
    s3, s4 = [s for s in snapshot_ids(spark, t) if s not in (s1, s2)]
    cfg = write_config(str(tmp_path / "cdc.toml"), "db.history", warehouse, 'key_columns = ["id"]')

    # s2 was rolled back: it is not an ancestor of the current snapshot. The changes from it are the state
    # difference of the two snapshots, as Spark's reads of them differ
    rows = cdc_changes(cfg, "--from-snapshot", str(s2))
    at_s2 = Counter(tuple(r) for r in spark.sql(f"SELECT id, v FROM {t} VERSION AS OF {s2}").collect())
    at_head = Counter(tuple(r) for r in spark.sql(f"SELECT id, v FROM {t}").collect())
    removed = Counter((r["id"], r["v"]) for r in rows if r["_change_type"] in ("DELETE", "UPDATE_BEFORE"))
    added = Counter((r["id"], r["v"]) for r in rows if r["_change_type"] in ("INSERT", "UPDATE_AFTER"))
    assert (removed, added) == (at_s2 - at_head, at_head - at_s2), rows
    assert {r["_change_type"] for r in rows} == {"DELETE", "INSERT", "UPDATE_BEFORE", "UPDATE_AFTER"}, rows
    # a range given the wrong way round along the main branch is still refused
    p = run_cdc("changes", "--config", cfg, "--from-snapshot", str(s4), "--to-snapshot", str(s1), check=False)
    assert p.returncode == EXIT_RANGE and "swap" in p.stderr, p.stderr
    # the main lineage skips the rolled-back snapshot
    lineage = [int(line.split()[0]) for line in run_cdc("snapshots", "--config", cfg).stdout.splitlines()[1:]]
    assert lineage == [s1, s3, s4]

    # a float key is refused, a missing one too
    for keys, needle in (('["f"]', "float"), ('["nope"]', "nope")):
        bad = write_config(str(tmp_path / f"bad{needle}.toml"), "db.history", warehouse, f"key_columns = {keys}")
        p = run_cdc("changes", "--config", bad, check=False)
        assert p.returncode == EXIT_SCHEMA and needle in p.stderr, p.stderr

    # expire everything before s4: s1 and s3 are gone; merge-on-read kept the files s4 needs, so its changes are
    # still exact although its parent is expired
    before = Counter(tuple(r) for r in spark.sql(f"SELECT * FROM {t} VERSION AS OF {s3}").collect())
    after = Counter(tuple(r) for r in spark.sql(f"SELECT * FROM {t} VERSION AS OF {s4}").collect())
    spark.sql(f"CALL {CAT}.system.expire_snapshots(table => 'db.history', older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    assert snapshot_ids(spark, t) == [s4]
    p = run_cdc("changes", "--config", cfg, "--from-snapshot", str(s1), check=False)
    assert p.returncode == EXIT_EXPIRED and "expired" in p.stderr, p.stderr
    rows = cdc_changes(cfg)
    got = Counter((r["_change_type"], r["id"], r["v"]) for r in rows)
    removed, added = before - after, after - before
    assert got == Counter({("UPDATE_BEFORE", 1, "a"): 1, ("UPDATE_AFTER", 1, "A"): 1})
    assert {r[0] for r in removed} == {1} and {r[0] for r in added} == {1}


def test_expired_parent_whose_files_are_gone_is_a_clear_error(spark, warehouse, tmp_path):
    t = f"{CAT}.db.history_cow"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"UPDATE {t} SET v = 'A' WHERE id = 1")  # copy-on-write: removes the first data file
    s2 = snapshot_ids(spark, t)[-1]
    spark.sql(f"CALL {CAT}.system.expire_snapshots(table => 'db.history_cow', older_than => TIMESTAMP '2999-01-01 00:00:00', retain_last => 1)")
    cfg = write_config(str(tmp_path / "cdc.toml"), "db.history_cow", warehouse, 'key_columns = ["id"]')
    p = run_cdc("changes", "--config", cfg, check=False)
    assert p.returncode == EXIT_EXPIRED, p.stderr
    assert f"--from-snapshot {s2}" in p.stderr and "expired" in p.stderr
    assert p.stdout == ""
