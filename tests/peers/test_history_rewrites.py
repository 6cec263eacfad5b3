"""A source's history rewritten under its replica (issue 49): rollback, a rollback followed by new commits,
cherry-pick, `set_current_snapshot` to an orphan, CREATE OR REPLACE (same and changed schema), DROP + CREATE, a
DELETE of everything. Spark writes every source; after each step `cdc sync` must bring the target to the source's
state — Spark reads both and compares them row for row — and say what it followed (`history_rewrite` in `--json`,
`cdc.resync` in the target's snapshot summary). With `on_history_rewrite = "stop"` the sync fails with exit 14 and
the target is untouched."""
import json
import random
import signal
import subprocess
import time
from collections import Counter

import pytest

from conftest import CDC, cdc_changes, run_cdc, target_section, write_config
from spark_workloads import CAT, rows, table_props
from test_spark_sync import rows_of, target_rows, target_summaries

EXIT_HISTORY = 14
COLS = ["id", "name", "amount", "ts", "cat"]

# (table, format version, partitioned, keyed, target catalog)
CASES = [
    ("rw_mor_v2", 2, False, True, "hadoop"),
    ("rw_part_v3", 3, True, True, "rest"),
    ("rw_nokey_v2", 2, False, False, "sql"),
]


def snapshots(spark, t):
    return [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at").collect()]


def current(spark, t):
    spark.sql(f"REFRESH TABLE {t}")
    return spark.sql(f"SELECT snapshot_id FROM {t}.history WHERE is_current_ancestor ORDER BY made_current_at DESC LIMIT 1").collect()[0][0]


def create(spark, t, version, partitioned, keyed):
    part = "PARTITIONED BY (bucket(4, id))" if partitioned else ""
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT NOT NULL, name STRING, amount DECIMAL(10,2), ts TIMESTAMP, cat STRING) USING iceberg {part} "
        f"TBLPROPERTIES ({table_props(version, 'merge-on-read')})"
    )
    if keyed:
        spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")


def sync(cfg, *args):
    p = run_cdc("sync", "--config", cfg, "--json", *args)
    return json.loads(p.stdout)


def assert_equal(spark, src, tgt, cols=COLS):
    want, got = rows_of(spark, src, cols), target_rows(spark, tgt, cols)
    assert got == want, f"missing {want - got}, extra {got - want}"


@pytest.mark.parametrize("name,version,partitioned,keyed,kind", CASES)
def test_every_rewrite_of_the_source_history_is_followed(spark, warehouse, rest_catalog, sql_target, tmp_path, name, version, partitioned, keyed, kind):
    src = f"{CAT}.db.{name}"
    create(spark, src, version, partitioned, keyed)
    spark.sql(f"INSERT INTO {src} VALUES {rows(0, 100)}")
    s_insert = current(spark, src)
    spark.sql(f"UPDATE {src} SET name = concat(name, '-u'), amount = amount + 1 WHERE id % 10 = 0")
    s_update = current(spark, src)
    spark.sql(f"DELETE FROM {src} WHERE id IN (1, 2, 3, 4, 5)")
    tname = f"hist_{kind}.{name}"
    # without a key the whole row is the identity: every column an equality column of the target
    whole_row = "" if keyed else '\nequality_columns = ["id", "name", "amount", "ts", "cat"]'
    section, tgt = target_section(kind, tname, warehouse, rest_catalog, sql_target, f"format_version = {version}{whole_row}")
    key = 'key_columns = ["id"]' if keyed else ""
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, key, target=section)
    sync(cfg, "--to-snapshot", str(s_insert))
    s = sync(cfg)
    assert s["history_rewrite"] is None
    assert_equal(spark, src, tgt)
    assert target_rows(spark, tgt, ["id"]) == Counter((i,) for i in range(100) if i not in (1, 2, 3, 4, 5))

    # 1. the owner undoes the DELETE: the five rows come back
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.{name}', {s_update})")
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "rollback" and s["history_rewrite"]["to_snapshot"] == s_update, s
    assert s["history_rewrite"]["undone_snapshots"] == 1
    assert_equal(spark, src, tgt)
    assert len(target_rows(spark, tgt, ["id"])) == 100
    summary = target_summaries(tmp_path, kind, tname, warehouse, rest_catalog, sql_target)[-1]
    assert summary["cdc.resync"] == "rollback" and summary["cdc.source-snapshot-id"] == str(s_update), summary

    # idempotent: nothing more to follow
    s = sync(cfg)
    assert s["history_rewrite"] is None and s["source_snapshots_applied"] == 0

    # 2. new commits, then back to before the UPDATE and another line of history
    spark.sql(f"INSERT INTO {src} VALUES {rows(100, 110)}")
    s_orphan_append = current(spark, src)
    spark.sql(f"UPDATE {src} SET cat = 'x' WHERE id < 20")
    sync(cfg)
    assert_equal(spark, src, tgt)
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.{name}', {s_insert})")
    spark.sql(f"UPDATE {src} SET name = 'other-line' WHERE id % 7 = 0")
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "rewrite" and s["history_rewrite"]["undone_snapshots"] == 3, s
    assert_equal(spark, src, tgt)
    s_other_line = current(spark, src)

    # 3. a cherry-pick of an orphaned append onto an older line, before the replica saw any of it
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.{name}', {s_insert})")
    spark.sql(f"CALL {CAT}.system.cherrypick_snapshot('db.{name}', {s_orphan_append})")
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "rewrite", s
    assert_equal(spark, src, tgt)
    assert len(target_rows(spark, tgt, ["id"])) == 110

    # 4. set_current_snapshot to an orphan (the other line's head)
    spark.sql(f"CALL {CAT}.system.set_current_snapshot('db.{name}', {s_other_line})")
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "rewrite", s
    assert_equal(spark, src, tgt)

    # `cdc changes` between two snapshots on different lines: the state difference, as change rows
    changes = cdc_changes(cfg, "--from-snapshot", str(s_orphan_append), "--to-snapshot", str(s_other_line))
    before, after = rows_of(spark, src, COLS, s_orphan_append), rows_of(spark, src, COLS, s_other_line)
    removed = Counter(r["id"] for r in changes if r["_change_type"] in ("DELETE", "UPDATE_BEFORE"))
    added = Counter(r["id"] for r in changes if r["_change_type"] in ("INSERT", "UPDATE_AFTER"))
    assert removed - added == Counter(r[0] for r in (before - after).elements()) - Counter(r[0] for r in (after - before).elements())
    assert set(added) | set(removed) == {r[0] for r in (before - after) + (after - before)}

    # 5. the policy "stop": exit 14, a message that says how to follow, the target untouched
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.{name}', {s_insert})")
    held = target_rows(spark, tgt, COLS)
    stop_cfg = write_config(str(tmp_path / "stop.toml"), f"db.{name}", warehouse, key + '\non_history_rewrite = "stop"', target=section)
    p = run_cdc("sync", "--config", stop_cfg, check=False)
    assert p.returncode == EXIT_HISTORY, p.stderr
    assert "rollback" in p.stderr and 'on_history_rewrite = "follow"' in p.stderr, p.stderr
    assert target_rows(spark, tgt, COLS) == held
    sync(cfg)
    assert_equal(spark, src, tgt)

    # 6. CREATE OR REPLACE … AS SELECT, same schema: a history that shares nothing with the old one
    spark.sql(f"CREATE OR REPLACE TABLE {src} USING iceberg TBLPROPERTIES ({table_props(version, 'merge-on-read')}) AS SELECT * FROM {src} WHERE id % 2 = 0")
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "replace", s
    assert_equal(spark, src, tgt)

    # 7. … and with a changed schema (a column more, one fewer)
    spark.sql(
        f"CREATE OR REPLACE TABLE {src} USING iceberg TBLPROPERTIES ({table_props(version, 'merge-on-read')}) "
        f"AS SELECT id, name, amount, ts, cat, 'new' AS extra FROM {src} WHERE id < 60"
    )
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "replace", s
    assert_equal(spark, src, tgt, COLS + ["extra"])

    # 8. DROP + CREATE under the same name (a new table uuid), then a DELETE
    spark.sql(f"DROP TABLE {src}")
    create(spark, src, version, partitioned, keyed)
    spark.sql(f"INSERT INTO {src} VALUES {rows(200, 230)}")
    spark.sql(f"DELETE FROM {src} WHERE id > 225")
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "recreate", s
    assert_equal(spark, src, tgt)
    assert target_summaries(tmp_path, kind, tname, warehouse, rest_catalog, sql_target)[-1]["cdc.resync"] == "recreate"

    # 9. a DELETE of everything, then a rollback of it
    before_all = current(spark, src)
    spark.sql(f"DELETE FROM {src}")
    sync(cfg)
    assert len(target_rows(spark, tgt, ["id"])) == 0
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.{name}', {before_all})")
    s = sync(cfg)
    assert s["history_rewrite"]["kind"] == "rollback"
    assert_equal(spark, src, tgt)


def test_a_resync_killed_at_random_moments_ends_exact(spark, warehouse, rest_catalog, sql_target, tmp_path):
    """SIGKILL a sync that follows a rollback of many snapshots at random moments; the next sync finishes it, and
    the target is never left between the two states as far as a reader can tell (each commit is atomic)."""
    name = "rw_kill"
    src = f"{CAT}.db.{name}"
    create(spark, src, 2, True, True)
    spark.sql(f"INSERT INTO {src} VALUES {rows(0, 2000)}")
    s_base = current(spark, src)
    for i in range(6):
        spark.sql(f"UPDATE {src} SET amount = amount + 1, name = concat(name, '-{i}') WHERE id % {i + 2} = 0")
        spark.sql(f"DELETE FROM {src} WHERE id % 97 = {i}")
    section, tgt = target_section("hadoop", f"hist_kill.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, 'key_columns = ["id"]', target=section)
    sync(cfg)
    before, after = rows_of(spark, src, COLS), None
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.{name}', {s_base})")
    after = rows_of(spark, src, COLS)
    rng = random.Random(49)
    for _ in range(4):
        p = subprocess.Popen([CDC, "sync", "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(rng.uniform(0.05, 1.5))
        p.send_signal(signal.SIGKILL)
        p.wait()
        held = target_rows(spark, tgt, COLS)
        assert held in (before, after), "a reader saw the target between two states"
    sync(cfg)
    assert_equal(spark, src, tgt)


def test_a_target_its_owner_rolled_back_resumes_from_what_it_holds(spark, warehouse, rest_catalog, sql_target, tmp_path):
    """The target's owner rolls the replica back (Spark `rollback_to_snapshot` on the target): its progress is what
    its own history now records, so the next sync re-applies what the rollback took, and Spark reads it equal."""
    name = "rw_target_rb"
    src = f"{CAT}.db.{name}"
    create(spark, src, 2, False, True)
    spark.sql(f"INSERT INTO {src} VALUES {rows(0, 60)}")
    section, tgt = target_section("hadoop", f"hist_trb.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, 'key_columns = ["id"]', target=section)
    sync(cfg)
    first_target = snapshots(spark, tgt)[-1]
    spark.sql(f"UPDATE {src} SET name = 'later' WHERE id < 30")
    spark.sql(f"DELETE FROM {src} WHERE id >= 50")
    sync(cfg)
    assert_equal(spark, src, tgt)
    spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('hist_trb.{name}', {first_target})")
    assert target_rows(spark, tgt, COLS) != rows_of(spark, src, COLS), "the owner took the later commits back"
    s = sync(cfg)
    assert s["source_snapshots_applied"] == 2 and s["history_rewrite"] is None, s
    assert_equal(spark, src, tgt)
