"""`cdc sync` from Spark-written sources into hadoop, sqlite and REST-catalog targets; every target is read back by
Spark (an independent reader that applies equality deletes, position deletes and deletion vectors) and must equal
the source at the synced snapshot, row for row, with no duplicate keys."""
import json
import os
import random
import re
import signal
import subprocess
import time
from collections import Counter

import pytest

from conftest import CDC, run_cdc, spark_table, sqlite_metadata_location, target_section, write_config
from spark_workloads import CAT, TABLES


def rows_of(spark, table, cols, version=None):
    q = f"SELECT {', '.join(cols)} FROM {table}" + (f" VERSION AS OF {version}" if version else "")
    return Counter(tuple(r) for r in spark.sql(q).collect())


def target_rows(spark, target, cols):
    return Counter(tuple(r) for r in spark_table(spark, target).select(*cols).collect())


def assert_replica(spark, source, target, cols, version=None):
    want, got = rows_of(spark, source, cols, version), target_rows(spark, target, cols)
    assert got == want, f"missing {want - got}, extra {got - want}"
    keys = Counter(r[0] for r in got.elements())
    assert max(keys.values(), default=1) == 1, "duplicate keys in the target"


def lineage(spark, t):
    return [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at").collect()]


def source_cols(spark, t):
    return [f.name for f in spark.table(t).schema.fields]


def cols_at(spark, t, version):
    return [f.name for f in spark.sql(f"SELECT * FROM {t} VERSION AS OF {version}").schema.fields]


# (source, target catalog, target format version): all three catalogs, both delete encodings
STEP_CASES = [
    ("cow_v2", "hadoop", 2),
    ("mor_v2", "sql", 2),
    ("mor_v3", "rest", 3),
    ("part_v2", "rest", 2),
    ("cow_v3", "sql", 3),
    ("part_cow_v3", "hadoop", 3),
]


@pytest.mark.parametrize("name,kind,version", STEP_CASES)
def test_sync_step_by_step(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind, version):
    src = f"{CAT}.db.{name}"
    section, tgt = target_section(kind, f"step_{kind}.{name}", warehouse, rest_catalog, sql_target, f"format_version = {version}")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    for i, sid in enumerate(lineage(spark, src)):
        p = run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid), "--json")
        assert p.returncode == 0
        if i == 0:
            assert '"bootstrap": true' in p.stdout
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)
    # idempotent: nothing left to apply
    p = run_cdc("sync", "--config", cfg, "--json")
    assert '"source_snapshots_applied": 0' in p.stdout
    # progress lives in the target's snapshot summaries
    summaries = target_summaries(tmp_path, kind, f"step_{kind}.{name}", warehouse, rest_catalog, sql_target)
    assert summaries[-1]["cdc.source-snapshot-id"] == str(lineage(spark, src)[-1])
    assert all("cdc.source-table-uuid" in s for s in summaries)


@pytest.mark.parametrize("version", [2, 3])
@pytest.mark.parametrize("name", [n for n, (_, _, keyed, _) in TABLES.items() if keyed])
def test_sync_in_one_go_with_multi_snapshot_commits(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, name, version):
    """Bootstrap at the first snapshot, then every other snapshot in commits of 4: rows written and rewritten inside
    one commit are deleted by position (v2 position-delete files, v3 deletion vectors)."""
    src = f"{CAT}.db.{name}"
    section, tgt = target_section("hadoop", f"go_v{version}.{name}", warehouse, rest_catalog, sql_target, f"format_version = {version}\nsnapshots_per_commit = 4")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    snaps = lineage(spark, src)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    run_cdc("sync", "--config", cfg)
    assert_replica(spark, src, tgt, source_cols(spark, src))
    deletes = spark.sql(f"SELECT content, file_format FROM {tgt}.all_delete_files").collect()
    assert any(r.content == 2 for r in deletes), "equality deletes expected"
    positional = [r for r in deletes if r.content == 1]
    assert positional, "rows rewritten within one commit must be deleted by position"
    assert {r.file_format for r in positional} == ({"PUFFIN"} if version == 3 else {"PARQUET"})


def test_sync_into_many_partitions_with_a_small_budget(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path):
    """Every commit touches 100 partitions and a 1 MiB budget keeps 64 files open per writer: files are closed early
    (memory stays bounded however many partitions a commit touches) and the replica is still exact, also for rows
    written and rewritten within one commit (deleted by position in files closed before)."""
    t = f"{CAT}.db.many_parts"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING, n INT) USING iceberg PARTITIONED BY (bucket(100, id)) "
              "TBLPROPERTIES ('format-version'='2', 'write.update.mode'='merge-on-read', 'write.delete.mode'='merge-on-read')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    rows = lambda lo, hi: spark.range(lo, hi).selectExpr("id", "concat('v', id) as v", "cast(id % 7 as int) as n")  # noqa: E731
    rows(0, 20000).writeTo(t).append()
    rows(20000, 24000).writeTo(t).append()
    spark.sql(f"UPDATE {t} SET n = n + 100 WHERE id % 5 = 0")
    spark.sql(f"DELETE FROM {t} WHERE id % 50 = 1")
    spark.sql(f"UPDATE {t} SET n = n + 1000 WHERE id % 10 = 0")
    snaps = lineage(spark, t)
    section, tgt = target_section("hadoop", "many_parts.t", warehouse, rest_catalog, sql_target, "snapshots_per_commit = 4")
    cfg = write_config(str(tmp_path / "cdc.toml"), "db.many_parts", warehouse, f'[engine]\nmemory_budget = "1MiB"\nspill_dir = "{tmp_path}"', target=section)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    p = run_cdc("sync", "--config", cfg, "--json")
    summary = json.loads(p.stdout)
    assert summary["source_snapshots_applied"] == len(snaps) - 1
    assert summary["files_closed_early"] > 0, summary
    assert_replica(spark, t, tgt, ["id", "v", "n"])
    positional = spark.sql(f"SELECT count(*) AS c FROM {tgt}.all_delete_files WHERE content = 1").collect()[0].c
    assert positional > 0, "rows rewritten within one commit must be deleted by position"


@pytest.mark.parametrize("aligned", [True, False], ids=["partitioned-by-key", "partitioned-by-other-column"])
def test_copy_on_write_rewrites_netted_by_partition_when_the_key_decides_it(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, aligned):
    """Copy-on-write UPDATE/DELETE/MERGE over 30k rows, a 1 MiB budget (carry-over in parts, netting spilled) and
    commits of several snapshots. Partitioned by bucket(4, id), every row of a key is in one partition: each
    partition's changes are netted alone and written as it finishes (the debug log says so). Partitioned by `cat`,
    which the first UPDATE changes, rows move between partitions — an update's two rows are in different groups — so
    the snapshot must be netted as a whole, and is. Either way Spark reads an exact replica."""
    t = f"{CAT}.db.cow_groups_{'key' if aligned else 'other'}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    part = "bucket(4, id)" if aligned else "cat"
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, cat STRING, v STRING, n INT) USING iceberg PARTITIONED BY ({part}) "
              "TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write', 'write.delete.mode'='copy-on-write', "
              "'write.merge.mode'='copy-on-write')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.range(0, 30000).selectExpr("id", "concat('c', id % 4) as cat", "concat('v', id) as v", "cast(id % 7 as int) as n").writeTo(t).append()
    spark.sql(f"UPDATE {t} SET v = concat(v, '-u'), cat = 'c9' WHERE id % 10 = 0")  # a new partition for a tenth of the rows
    spark.sql(f"DELETE FROM {t} WHERE id % 50 = 1")
    spark.sql(f"MERGE INTO {t} t USING (SELECT id, IF(id < 30000, 'm', 'new') AS tag FROM range(29900, 30100)) s ON t.id = s.id "
              "WHEN MATCHED THEN UPDATE SET t.v = s.tag, t.cat = 'c1' "
              "WHEN NOT MATCHED THEN INSERT (id, cat, v, n) VALUES (s.id, 'c2', s.tag, 0)")
    spark.sql(f"UPDATE {t} SET n = n + 1000 WHERE id % 20 = 0")  # rows this commit already rewrote, rewritten again
    snaps = lineage(spark, t)
    section, tgt = target_section("sql", f"cow_groups.{'key' if aligned else 'other'}", warehouse, rest_catalog, sql_target, "snapshots_per_commit = 2")
    cfg = write_config(str(tmp_path / "cdc.toml"), t.split(".", 1)[1], warehouse, f'[engine]\nmemory_budget = "1MiB"\nspill_dir = "{tmp_path}"', target=section)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    p = run_cdc("sync", "--config", cfg, "--json", "--log", "iceberg_cdc=debug")
    summary = json.loads(p.stdout)
    assert summary["source_snapshots_applied"] == len(snaps) - 1, summary
    # inserts: ids 30000-30099, and 29901 and 29951, which the DELETE removed and the MERGE brings back
    assert summary["updates"] >= 3000 + 200 and summary["deletes"] == 600 and summary["inserts"] == 102, summary
    assert summary["spilled_bytes"] > 0, summary
    # groups in parts take turns with the carry-over share, handing it on once their resident parts are matched
    assert "solo=true" in p.stderr, p.stderr[-3000:]
    by_group = p.stderr.count("netting by partition group")
    assert by_group == (len(snaps) - 1 if aligned else 0), p.stderr[-3000:]
    # either way, the removed rows are carried with only what the applier reads of them
    assert "slim=true" in p.stderr and "slim=false" not in p.stderr, p.stderr[-3000:]
    assert_replica(spark, t, tgt, ["id", "cat", "v", "n"])


@pytest.mark.parametrize("part,budget", [("bucket(4, id)", "256MiB"), ("bucket(4, id)", "1MiB"), ("", "1MiB")],
                         ids=["by-key-in-memory", "by-key-in-parts", "unpartitioned"])
def test_slim_removed_rows_still_delete_in_their_partition_and_update_to_any_value(spark, spark_tables, warehouse, rest_catalog, sql_target,
                                                                                    tmp_path, part, budget):
    """A copy-on-write rewrite synced into Iceberg carries its removed rows with only the columns the applier reads of
    them — key, equality columns, the target's partition sources (debug log: `slim=true`) — the others as
    placeholders (zero values: '' and 0 here). The target is created by hand, partitioned by `cat` only, which the
    source does not partition by, and an UPDATE moves rows to another `cat`: their equality deletes must land in the
    old partition, so `cat` must be carried. Another UPDATE sets rows to the very values of the placeholders ('' and
    0), or a nullable column to null, and must still apply as updates. Netted by partition group (in memory and in
    parts) and netted whole (unpartitioned: one group), Spark reads an exact replica."""
    name = f"cow_slim_{'key' if part else 'none'}_{budget.lower()}"
    t = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, cat STRING, v STRING, n INT NOT NULL) USING iceberg "
              + (f"PARTITIONED BY ({part}) " if part else "")
              + "TBLPROPERTIES ('format-version'='2', 'write.update.mode'='copy-on-write', 'write.delete.mode'='copy-on-write', "
              "'write.merge.mode'='copy-on-write')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.range(0, 20000).selectExpr("id", "concat('c', id % 4) as cat", "concat('v', id) as v", "cast(id % 7 + 1 as int) as n").writeTo(t).append()
    spark.sql(f"UPDATE {t} SET v = IF(id % 20 = 0, '', NULL), n = 0 WHERE id % 10 = 0")
    spark.sql(f"UPDATE {t} SET cat = 'moved' WHERE id % 7 = 0")
    spark.sql(f"DELETE FROM {t} WHERE id % 13 = 0")
    snaps = lineage(spark, t)
    section, tgt = target_section("hadoop", f"cow_slim.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, f'[engine]\nmemory_budget = "{budget}"\nspill_dir = "{tmp_path}"',
                       target=section)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {tgt.rsplit('.', 1)[0]}")
    spark.sql(f"DROP TABLE IF EXISTS {tgt}")
    # one spec (with several, the applier's equality deletes are global and need no partition values)
    spark.sql(f"CREATE TABLE {tgt} (id BIGINT NOT NULL, cat STRING, v STRING, n INT NOT NULL) USING iceberg PARTITIONED BY (cat) "
              "TBLPROPERTIES ('format-version'='2')")
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    p = run_cdc("sync", "--config", cfg, "--json", "--log", "iceberg_cdc=debug")
    summary = json.loads(p.stdout)
    moved = sum(1 for i in range(20000) if i % 7 == 0)
    deleted = sum(1 for i in range(20000) if i % 13 == 0)
    assert (summary["updates"], summary["deletes"], summary["inserts"]) == (2000 + moved, deleted, 0), summary
    assert "slim=true" in p.stderr and "slim=false" not in p.stderr, p.stderr[-3000:]
    assert ("netting by partition group" in p.stderr) == bool(part), p.stderr[-3000:]
    if part and budget == "1MiB":
        assert "solo=true" in p.stderr, p.stderr[-3000:]
    assert_replica(spark, t, tgt, ["id", "cat", "v", "n"])


@pytest.mark.parametrize("partitioned", [False, True], ids=["global", "by-partition"])
def test_merge_on_read_deletes_with_a_small_budget(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, partitioned):
    """A merge-on-read MERGE on a v3 table (deletion vectors) of 200k rows, several times a 1 MiB budget: `cdc
    changes` spills, reads the same files once, prints what the unconstrained run prints and exactly what Spark's
    time travel says changed; `cdc sync` within the same budget makes an exact replica."""
    name = "mor_big_p" if partitioned else "mor_big"
    t = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    part = "PARTITIONED BY (bucket(4, id)) " if partitioned else ""
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING, n INT) USING iceberg {part}TBLPROPERTIES ('format-version'='3', "
              "'write.merge.mode'='merge-on-read', 'write.update.mode'='merge-on-read', 'write.delete.mode'='merge-on-read')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.range(200000).selectExpr("id", "concat('v', id) as v", "cast(id % 7 as int) as n").repartition(4).writeTo(t).append()
    spark.sql(f"MERGE INTO {t} x USING (SELECT id FROM range(210000) WHERE id % 10 = 0 OR id % 50 = 1 OR id >= 200000) s ON x.id = s.id "
              "WHEN MATCHED AND x.id % 50 = 1 THEN DELETE WHEN MATCHED THEN UPDATE SET x.n = x.n + 100 "
              "WHEN NOT MATCHED THEN INSERT (id, v, n) VALUES (s.id, concat('new', s.id), 0)")
    s1, s2 = lineage(spark, t)
    assert spark.sql(f"SELECT count(*) AS c FROM {t}.delete_files WHERE file_format = 'PUFFIN'").collect()[0].c > 0, "deletion vectors expected"

    engine = f'[engine]\nmemory_budget = "1MiB"\nspill_dir = "{tmp_path}"'
    small = write_config(str(tmp_path / "small.toml"), f"db.{name}", warehouse, engine)
    big = write_config(str(tmp_path / "big.toml"), f"db.{name}", warehouse)
    p = run_cdc("changes", "--config", small, "--from-snapshot", str(s1))
    q = run_cdc("changes", "--config", big, "--from-snapshot", str(s1))
    files = lambda err: int(err.split(" files /")[0].rsplit(" ", 1)[1])  # noqa: E731
    spilled = lambda err: float(err.split(" MB spilled")[0].rsplit(" ", 1)[1])  # noqa: E731
    assert files(p.stderr) == files(q.stderr), (p.stderr, q.stderr)
    assert spilled(p.stderr) > 0 and spilled(q.stderr) == 0, (p.stderr, q.stderr)
    assert p.stdout == q.stdout
    got = Counter((r["_change_type"], r["id"], r["v"], r["n"]) for r in map(json.loads, p.stdout.splitlines()))
    before = {r.id: (r.v, r.n) for r in spark.sql(f"SELECT * FROM {t} VERSION AS OF {s1}").collect()}
    after = {r.id: (r.v, r.n) for r in spark.sql(f"SELECT * FROM {t} VERSION AS OF {s2}").collect()}
    want = Counter()
    for k in before.keys() | after.keys():
        if k not in after:
            want[("DELETE", k, *before[k])] += 1
        elif k not in before:
            want[("INSERT", k, *after[k])] += 1
        elif before[k] != after[k]:
            want[("UPDATE_BEFORE", k, *before[k])] += 1
            want[("UPDATE_AFTER", k, *after[k])] += 1
    assert got == want, (got - want, want - got)
    assert (sum(1 for c in got if c[0] == "DELETE"), sum(1 for c in got if c[0] == "INSERT")) == (4000, 10000)

    section, tgt = target_section("hadoop", f"mor_big.{name}", warehouse, rest_catalog, sql_target, "format_version = 3")
    cfg = write_config(str(tmp_path / "sync.toml"), f"db.{name}", warehouse, engine, target=section)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(s1))
    summary = json.loads(run_cdc("sync", "--config", cfg, "--json").stdout)
    assert summary["spilled_bytes"] > 0 and summary["updates"] == 20000, summary
    assert_replica(spark, t, tgt, ["id", "v", "n"])


def test_a_rewrite_of_millions_of_rows_in_one_group_runs_in_the_least_budget(spark, spark_tables, warehouse, tmp_path):
    """A copy-on-write UPDATE of an unpartitioned table of 2.5 M rows at the 1 MiB minimum budget: one carry-over
    group ~250 times larger than what it may hold. Before, its per-row bitmaps alone outgrew the share and planning
    counted parts up to the row count; now it matches in parts (~19 bytes a row of a part, whatever the group's size)
    and `cdc changes` reports exactly the updated rows, every file read once, and leaves no spill file behind. It
    warns, naming the least budget that matches the group in one pass; that budget does, 16 MiB less does not."""
    t = f"{CAT}.db.cow_one_group"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, n INT) USING iceberg TBLPROPERTIES ('format-version'='2', "
              "'write.update.mode'='copy-on-write')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.range(2_500_000).selectExpr("id", "cast(id % 7 as int) as n").coalesce(2).writeTo(t).append()
    spark.sql(f"UPDATE {t} SET n = n + 100 WHERE id % 1000 = 3")
    s1, s2 = lineage(spark, t)
    spill = tmp_path / "spill"
    spill.mkdir()
    small = write_config(str(tmp_path / "small.toml"), "db.cow_one_group", warehouse, f'[engine]\nmemory_budget = "1MiB"\nspill_dir = "{spill}"')
    q = run_cdc("changes", "--config", small, "--from-snapshot", str(s1), "--log", "iceberg_cdc=debug")
    rows = [json.loads(line) for line in q.stdout.splitlines()]
    assert Counter(r["_change_type"] for r in rows) == {"UPDATE_BEFORE": 2500, "UPDATE_AFTER": 2500}, q.stderr[-2000:]
    after = {r["id"]: r["n"] for r in rows if r["_change_type"] == "UPDATE_AFTER"}
    assert after == {i: i % 7 + 100 for i in range(3, 2_500_000, 1000)}
    parts = re.search(r"carry-over group done .*parts=(\d+)", q.stderr)
    assert parts and int(parts.group(1)) > 100, q.stderr[-2000:]
    files = int(q.stderr.split(" files /")[0].rsplit(" ", 1)[1])
    # the files the UPDATE removed and added, each read once (Spark may write fewer files than it removes)
    summary = spark.sql(f"SELECT summary FROM {t}.snapshots WHERE snapshot_id = {s2}").collect()[0].summary
    assert files == int(summary["deleted-data-files"]) + int(summary["added-data-files"]), (summary, q.stderr[-500:])
    assert not os.listdir(spill), os.listdir(spill)
    # the warning names the least budget that matches the group in one pass: there it does, 16 MiB below it does not
    hint = re.search(r'too large to match in memory.*engine.memory_budget = "(\d+)MiB"', q.stderr)
    assert hint, q.stderr[-2000:]
    mib = int(hint.group(1))
    for budget, one_pass in ((mib, True), (mib - 16, False)):
        cfg = write_config(str(tmp_path / f"b{budget}.toml"), "db.cow_one_group", warehouse, f'[engine]\nmemory_budget = "{budget}MiB"')
        p = run_cdc("changes", "--config", cfg, "--from-snapshot", str(s1), "--log", "iceberg_cdc=debug")
        assert sorted(p.stdout.splitlines()) == sorted(q.stdout.splitlines()), budget
        parts = int(re.search(r"carry-over group done .*parts=(\d+)", p.stderr).group(1))
        assert (parts == 1) == one_pass and ("too large to match in memory" not in p.stderr) == one_pass, (budget, p.stderr[-1500:])


def kill_syncs_at_random(cfg, snaps, trials, rng, max_sleep):
    """`trials` runs of `cdc sync --config cfg`, the n-th to snapshot n // 3 of `snaps`, each SIGKILLed after a random
    0..`max_sleep` s when still running; returns how many were killed."""
    kills = 0
    for trial in range(trials):
        to = snaps[min(len(snaps) - 1, trial // 3)]
        proc = subprocess.Popen([CDC, "sync", "--config", cfg, "--to-snapshot", str(to)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.0, max_sleep))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    return kills


def test_sync_survives_sigkill_at_random_moments(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path):
    rng = random.Random(7)
    for kind, name in (("sql", "mor_v3"), ("hadoop", "part_v2")):
        src = f"{CAT}.db.{name}"
        section, tgt = target_section(kind, f"crash_{kind}.{name}", warehouse, rest_catalog, sql_target, "snapshots_per_commit = 2")
        cfg = write_config(str(tmp_path / f"{kind}.toml"), f"db.{name}", warehouse, target=section)
        kills = kill_syncs_at_random(cfg, lineage(spark, src), 25, rng, 0.06)
        assert kills > 5, "the trials must really interrupt syncs"
        p = run_cdc("sync", "--config", cfg)
        assert p.returncode == 0
        assert_replica(spark, src, tgt, source_cols(spark, src))


def test_sync_retries_after_another_writer_commits(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path):
    """cdc pauses between planning and committing (test hook); Spark commits to the target meanwhile; the sync
    must reload, retry, and end correct — keeping the other writer's row."""
    name = "mor_v2"
    src = f"{CAT}.db.{name}"
    section, tgt = target_section("rest", f"conflict.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    assert_sync_survives_a_concurrent_commit(spark, cfg, src, tgt, tmp_path)


def assert_sync_survives_a_concurrent_commit(spark, cfg, src, tgt, tmp_path):
    """Bootstraps `tgt` from `src`'s first snapshot, then runs `cdc sync` paused between planning and committing
    (test hook) while Spark commits a row to the target: the sync must see the target moved, reload, retry, and end
    equal to the source plus the other writer's row."""
    snaps = lineage(spark, src)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    pause = tmp_path / "pause"
    pause.mkdir()
    env = dict(os.environ, CDC_TEST_PAUSE_BEFORE_COMMIT=str(pause))
    proc = subprocess.Popen([CDC, "sync", "--config", cfg], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (pause / "paused").exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert (pause / "paused").exists(), proc.communicate()[1]
        # the target has the schema of the snapshot it was bootstrapped from (no `note` yet)
        spark.sql(f"INSERT INTO {tgt} (id, name, amount, ts, cat) VALUES (9999, 'other-writer', 1.00, TIMESTAMP '2024-01-01 00:00:00', 'o')")
    finally:
        (pause / "resume").touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "retrying" in err or "conflict" in err.lower(), err
    cols = source_cols(spark, src)
    got, want = target_rows(spark, tgt, cols), rows_of(spark, src, cols)
    extra = got - want
    assert got - extra == want and len(extra) == 1 and next(iter(extra))[0] == 9999, f"{want - got} / {extra}"


def target_summaries(tmp_path, kind, table, warehouse, rest_uri, sql_dir):
    """Snapshot summaries of a target, oldest first, through `cdc snapshots --json` on that catalog."""
    import json

    if kind == "hadoop":
        cat = f'type = "hadoop"\nwarehouse = "{warehouse}"'
    elif kind == "sql":
        cat = f'type = "sql"\nwarehouse = "{sql_dir}"'
    else:
        cat = f'type = "rest"\nuri = "{rest_uri}"'
    cfg = tmp_path / "target-as-source.toml"
    cfg.write_text(f'[source]\ntable = "{table}"\n[source.catalog]\n{cat}\n')
    out = run_cdc("snapshots", "--config", str(cfg), "--json").stdout
    return [json.loads(line)["summary"] for line in out.splitlines() if line.strip()]


@pytest.mark.parametrize("kind", ["rest", "sql", "hadoop"])
def test_concurrent_appliers_apply_every_range_once(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, kind):
    """2..4 `cdc sync` processes started together on one target, each to another end snapshot, fresh and existing
    targets: afterwards Spark reads the target equal to the source at the recorded progress, each key once, and the
    recorded progress never decreases along the target's history."""
    name = "mor_v2"
    src = f"{CAT}.db.{name}"
    snaps = lineage(spark, src)
    seq = {r.snapshot_id: i for i, r in enumerate(spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect())}
    for trial in range(4):
        table = f"race_{kind}_{trial}.{name}"
        section, tgt = target_section(kind, table, warehouse, rest_catalog, sql_target, 'commit_retries = 50\nretry_backoff = "20ms"')
        cfg = write_config(str(tmp_path / f"{trial}.toml"), f"db.{name}", warehouse, target=section)
        if trial % 2:
            run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[1]))
        n = 2 + trial % 3
        ends = [snaps[-1 - (k * 2) % 5] for k in range(n)]
        procs = [subprocess.Popen([CDC, "sync", "--config", cfg, "--to-snapshot", str(e)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in ends]
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, f"trial {trial}: {err}"
        summaries = target_summaries(tmp_path, kind, table, warehouse, rest_catalog, sql_target)
        progress = [int(s["cdc.source-snapshot-id"]) for s in summaries if "cdc.source-snapshot-id" in s]
        order = [seq[p] for p in progress]
        assert order == sorted(set(order)), f"trial {trial}: progress repeated or went backwards: {order}"
        at = progress[-1]
        assert at == max(ends, key=lambda e: seq[e]), f"trial {trial}: ends at {at}"
        assert_replica(spark, src, tgt, cols_at(spark, src, at), at)


def spark_maintenance(spark, tgt, version, expire=True):
    """What a table owner runs on a replica: compaction (equality and position deletes applied), position-delete
    compaction (v2), manifest rewrite, and (with `expire`) expiry of every snapshot but the newest."""
    cat, ns, name = tgt.split(".")
    t = f"{ns}.{name}"
    spark.sql(f"CALL {cat}.system.rewrite_data_files(table => '{t}', "
              "options => map('min-input-files','1','rewrite-all','true','delete-file-threshold','1'))")
    if version == 2:
        spark.sql(f"CALL {cat}.system.rewrite_position_delete_files(table => '{t}', options => map('rewrite-all','true'))")
    spark.sql(f"CALL {cat}.system.rewrite_manifests('{t}')")
    if not expire:
        return
    until = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + 1))
    spark.sql(f"CALL {cat}.system.expire_snapshots(table => '{t}', older_than => TIMESTAMP '{until}', retain_last => 1)")
    spark.sql(f"REFRESH TABLE {tgt}")
    assert len(lineage(spark, tgt)) == 1, "expire_snapshots kept more than one snapshot"


@pytest.mark.parametrize("name,kind,version,ours", [("part_v2", "rest", 2, True), ("mor_v3", "hadoop", 3, False)])
def test_replication_continues_after_the_owners_maintenance(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind,
                                                             version, ours):
    """Between every two syncs Spark compacts the target (data files, position deletes, manifests) and expires every
    snapshot but the newest — which takes every snapshot summary that recorded progress. Replication continues
    exactly: after each step the target equals the source at the synced snapshot, each key once (nothing applied
    twice, nothing skipped). With `ours`, cdc's own expiry runs too, at its most aggressive (every snapshot but the
    head, after every commit): it expires Spark's compaction snapshots and deletes the files they replaced, and Spark
    still reads every file the target references."""
    src = f"{CAT}.db.{name}"
    extra = f"format_version = {version}" + ('\nsnapshot_retention = "0s"\nretain_snapshots = 1' if ours else "")
    section, tgt = target_section(kind, f"maint_{kind}.{name}", warehouse, rest_catalog, sql_target, extra)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    snaps = lineage(spark, src)
    for i, sid in enumerate(snaps):
        p = run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid), "--json", check=False)
        assert p.returncode == 0, f"step {i} after maintenance: {p.stderr}"
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)
        spark_maintenance(spark, tgt, version, expire=not ours)
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)
    p = run_cdc("sync", "--config", cfg, "--json")
    assert '"source_snapshots_applied": 0' in p.stdout, p.stdout
    if ours:
        # cdc's expiry deleted the files Spark's compactions replaced, and only those: the data folder holds exactly
        # what the remaining snapshots reference
        def local(p):
            return "/" + (p[len("file:"):] if p.startswith("file:") else p).lstrip("/")
        location = [r for r in spark.sql(f"DESCRIBE TABLE EXTENDED {tgt}").collect() if r[0] == "Location"][0][1]
        on_disk = {os.path.join(d, f) for d, _, fs in os.walk(local(location) + "/data") for f in fs if not f.startswith(".")}
        referenced = {local(r[0]) for r in spark.sql(f"SELECT file_path FROM {tgt}.all_files").collect()}
        assert on_disk == referenced, f"left behind: {sorted(on_disk - referenced)[:3]}, missing: {sorted(referenced - on_disk)[:3]}"
        assert len(lineage(spark, tgt)) <= 3, lineage(spark, tgt)


@pytest.mark.parametrize("name,kind,version", [("part_v2", "rest", 2), ("mor_v3", "hadoop", 3)])
def test_merged_manifests_read_the_same_in_spark(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind, version):
    """The owner sets Java's `commit.manifest.min-count-to-merge` low on the target; cdc honors it: its commits merge
    the small manifests (entries kept with their sequence numbers). Spark reads the target equal to the source after
    every commit, the current snapshot keeps fewer manifests per content than the threshold, and the snapshot
    summaries record the merges. On v3, row lineage survives the merges: a row no commit since rewrote keeps the
    `_row_id` and `_last_updated_sequence_number` Spark read before (a merge that dropped the inherited first row ids
    would renumber them)."""
    src = f"{CAT}.db.{name}"
    section, tgt = target_section(kind, f"merge_{kind}.{name}", warehouse, rest_catalog, sql_target, f"format_version = {version}")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    snaps = lineage(spark, src)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    spark.sql(f"ALTER TABLE {tgt} SET TBLPROPERTIES ('commit.manifest.min-count-to-merge'='3')")
    rows = RowLineage(spark, tgt, cols_at(spark, src, snaps[0])[0]) if version == 3 else None
    for sid in snaps[1:]:
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        spark.sql(f"REFRESH TABLE {tgt}")
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)
        if rows:
            rows.check()
    counts = {r[0]: r[1] for r in spark.sql(f"SELECT content, count(*) FROM {tgt}.manifests GROUP BY content").collect()}
    assert counts.get(1, 0) < 3, counts
    assert counts.get(0, 0) < 3, counts
    if rows:
        assert rows.kept > 0, "no row outlived a commit: the lineage check checked nothing"
    replaced = [r[0] for r in spark.sql(f"SELECT summary['manifests-replaced'] FROM {tgt}.snapshots").collect() if r[0]]
    assert replaced, "no commit merged manifests"


class RowLineage:
    """Row lineage of a v3 target as Spark reads it: key → (row, (`_row_id`, `_last_updated_sequence_number`)).
    `check()` after each step: every row has a distinct `_row_id`, and a row whose values the step left as they were
    (the applier did not write it: changes that leave a row equal are carry-overs, never applied) kept both lineage
    values — a manifest merge or compaction that lost them would renumber the rows it moved."""

    def __init__(self, spark, tgt, key):
        self.spark, self.tgt, self.key, self.kept = spark, tgt, key, 0
        self.rows = self.read()

    def read(self):
        df = self.spark.sql(f"SELECT *, _row_id, _last_updated_sequence_number FROM {self.tgt}")
        out = {}
        for r in df.collect():
            d = r.asDict()
            lineage = (d.pop("_row_id"), d.pop("_last_updated_sequence_number"))
            assert None not in lineage, f"a row without lineage: {r}"
            out[d[self.key]] = (tuple(sorted(d.items())), lineage)
        return out

    def check(self):
        self.spark.sql(f"REFRESH TABLE {self.tgt}")
        now = self.read()
        assert len({lin[0] for _, lin in now.values()}) == len(now), "two rows share a _row_id"
        untouched = [k for k, (row, _) in now.items() if k in self.rows and self.rows[k][0] == row]
        changed = {k: (self.rows[k][1], now[k][1]) for k in untouched if self.rows[k][1] != now[k][1]}
        assert not changed, f"row lineage changed (before, after): {changed}"
        self.kept += len(untouched)
        self.rows = now


def operations_and_delete_files(spark, tgt):
    """The operations of a target's snapshots and the delete files its head keeps live: by Spark's metadata tables,
    or for an iceberg-rust sqlite catalog (no Spark catalog) by its current metadata file and manifest list as Spark
    reads them."""
    if tgt.startswith("sqlite:"):
        parts = tgt[len("sqlite:"):].split(".")
        location = sqlite_metadata_location(".".join(parts[:-2]), ".".join(parts[-2:]))
        with open(location.removeprefix("file:")) as f:
            meta = json.load(f)
        deletes = spark.read.format("iceberg").load(location + "#delete_files").count()
        return [s["summary"]["operation"] for s in meta["snapshots"]], deletes
    spark.sql(f"REFRESH TABLE {tgt}")
    ops = [r[0] for r in spark.sql(f"SELECT operation FROM {tgt}.snapshots").collect()]
    return ops, spark.sql(f"SELECT count(*) FROM {tgt}.delete_files").collect()[0][0]


def pyiceberg_keys(kind, table, warehouse, rest_uri, sql_dir):
    """(id, name) of every row of a target as pyiceberg 0.12 reads it (through the REST catalog, or from the
    current metadata file)."""
    from pyiceberg.table import StaticTable

    if kind == "rest":
        from pyiceberg.catalog.rest import RestCatalog

        t = RestCatalog("r", uri=rest_uri).load_table(table)
    elif kind == "sql":
        t = StaticTable.from_metadata(sqlite_metadata_location(sql_dir, table))
    else:
        meta = os.path.join(warehouse, *table.split("."), "metadata")
        latest = max((f for f in os.listdir(meta) if f.endswith(".metadata.json")), key=lambda f: int(f.split(".")[0].lstrip("v")))
        t = StaticTable.from_metadata(os.path.join(meta, latest))
    return sorted((r["id"], r["name"]) for r in t.scan().to_arrow().to_pylist())


@pytest.mark.parametrize(
    "name,kind,version", [("part_v2", "rest", 2), ("mor_v2", "sql", 2), ("cow_v2", "hadoop", 2), ("mor_v3", "hadoop", 3), ("part_cow_v3", "rest", 3)]
)
def test_compacted_target_reads_the_same_in_spark(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind, version):
    """Compaction after commits, with thresholds of 2 files: cdc follows the source commit by commit and compacts
    the target between commits (`replace` snapshots that rewrite data files with their deletes applied and drop the
    delete files). Spark reads the target equal to the source after every commit; `replace` snapshots are in its
    history; then `cdc maintain` compacts whatever deletes are left, so Spark finds no delete file at all, the
    target still reads equal, and pyiceberg 0.12 reads a v2 target too (the same rows as Spark); a last sync after
    it resumes and changes nothing. On v3 targets (deletion vectors) every rewrite keeps row lineage: a row keeps the
    `_row_id` and `_last_updated_sequence_number` Spark read before, through every compaction."""
    src = f"{CAT}.db.{name}"
    extra = f"format_version = {version}\ncompact_delete_files = 2\ncompact_small_files = 2"
    section, tgt = target_section(kind, f"compact_{kind}.{name}", warehouse, rest_catalog, sql_target, extra)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    snaps = lineage(spark, src)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    rows = RowLineage(spark, tgt, cols_at(spark, src, snaps[0])[0]) if version == 3 else None
    for sid in snaps[1:]:
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)
        if rows:
            rows.check()
    ops, _ = operations_and_delete_files(spark, tgt)
    assert "replace" in ops, ops
    run_cdc("maintain", "--config", cfg)
    ops, deletes = operations_and_delete_files(spark, tgt)
    assert deletes == 0, f"{deletes} delete files left after cdc maintain"
    assert_replica(spark, src, tgt, cols_at(spark, src, snaps[-1]), snaps[-1])
    if rows:
        rows.check()
        assert rows.kept > 0, "no row outlived a step: the lineage check checked nothing"
    else:
        # without equality deletes pyiceberg (which refuses them) reads the target, and reads it equal
        want = sorted((r[0], r[1]) for r in spark_table(spark, tgt).select("id", "name").collect())
        assert pyiceberg_keys(kind, f"compact_{kind}.{name}", warehouse, rest_catalog, sql_target) == want
    out = json.loads(run_cdc("sync", "--json", "--config", cfg).stdout)
    assert out["source_snapshots_applied"] == 0 and not out["target_snapshot_ids"], out
    assert operations_and_delete_files(spark, tgt)[0] == ops, "the sync after maintenance committed again"
