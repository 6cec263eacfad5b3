"""Schema evolution and every type, with Spark as writer and as independent reader.

A Spark history with each evolution step between data changes (rename, widen int/float/decimal, add top-level and
nested columns, rename a nested field, required -> optional, reorder, drop and re-add under the same name) is
replicated by `cdc sync`, step by step and in one go, into fresh v2 and v3 targets on every catalog. After every step
the target, read by Spark, must equal the source at that snapshot: every column, every value, under the names of
that snapshot's schema. A second table holds every type Spark writes (map, nested struct/list/map, binary,
decimal(38,9), float NaN/+-Inf/-0.0, timestamps with and without zone, strings with NUL and emoji, nulls at every
level) with a composite (string, int) key; its changes must come out identically ordered on every run.
"""
import json
import math
import os
import subprocess

import pytest

from conftest import CDC, cdc_changes, run_cdc, spark_table, target_section, write_config
from spark_workloads import CAT, table_props

EVO = f"{CAT}.db.evo"
TYPES = f"{CAT}.db.types"


def evo_workload(mode, version):
    t = EVO
    return [
        f"CREATE TABLE {t} (id BIGINT NOT NULL, name STRING, qty INT, price FLOAT, amount DECIMAL(10,2), "
        f"info STRUCT<a: INT, b: STRING>, code INT NOT NULL, old STRING) USING iceberg TBLPROPERTIES ({table_props(version, mode)})",
        f"ALTER TABLE {t} SET IDENTIFIER FIELDS id",
        f"INSERT INTO {t} VALUES " + ", ".join(
            f"({i}, 'n{i}', {i * 3}, {i}.5, {i}.25, named_struct('a', {i}, 'b', 'b{i}'), {i}, 'old{i}')" for i in range(10)
        ),
        f"ALTER TABLE {t} RENAME COLUMN name TO full_name",
        f"UPDATE {t} SET full_name = concat(full_name, '-r') WHERE id % 3 = 0",
        f"ALTER TABLE {t} ALTER COLUMN qty TYPE BIGINT",
        f"ALTER TABLE {t} ALTER COLUMN price TYPE DOUBLE",
        f"ALTER TABLE {t} ALTER COLUMN amount TYPE DECIMAL(12,2)",
        f"INSERT INTO {t} VALUES (10, 'ten', 5000000000, 1.0E300, 1234567890.12, named_struct('a', 10, 'b', 'b10'), 10, 'old10')",
        f"ALTER TABLE {t} ADD COLUMN note STRING COMMENT 'added later'",
        f"ALTER TABLE {t} ADD COLUMN info.c DOUBLE",
        f"ALTER TABLE {t} RENAME COLUMN info.b TO bee",
        f"UPDATE {t} SET note = 'noted', info = named_struct('a', info.a, 'bee', info.bee, 'c', 0.5) WHERE id < 4",
        f"ALTER TABLE {t} ALTER COLUMN code DROP NOT NULL",
        f"ALTER TABLE {t} DROP COLUMN old",
        f"ALTER TABLE {t} ADD COLUMN old STRING",
        f"UPDATE {t} SET old = 'fresh' WHERE id IN (1, 2)",
        f"ALTER TABLE {t} ALTER COLUMN note FIRST",
        f"DELETE FROM {t} WHERE id = 5",
        f"INSERT INTO {t} (note, id, full_name, qty, price, amount, info, code, old) VALUES "
        f"('late', 11, 'eleven', 11, 11.0, 11.00, named_struct('a', 11, 'bee', 'x', 'c', 1.5), NULL, 'fresh')",
    ]


def types_workload():
    t = TYPES
    def row(k, n, variant=0):
        m = "map('a', 1, 'b', 2)" if variant == 0 else "map('a', 1, 'b', 3)"
        return (
            f"('{k}', {n}, true, {n}, {n * 1000000000}, float('NaN'), double('-Infinity'), "
            f"CAST('12345678901234567890123456789.123456789' AS DECIMAL(38,9)), DATE '2024-02-29', "
            f"TIMESTAMP '2024-03-01 12:34:56.123456', TIMESTAMP_NTZ '2024-03-01 12:34:56.654321', "
            f"'', X'00FF10', named_struct('x', {n}, 'y', named_struct('z', 'deep')), "
            f"array(named_struct('p', 1, 'q', 'one'), named_struct('p', 2, 'q', NULL)), {m}, "
            f"map('k', array(1, 2, NULL)))"
        )
    return [
        f"CREATE TABLE {t} (k STRING NOT NULL, n INT NOT NULL, b BOOLEAN, i INT, l BIGINT, f FLOAT, d DOUBLE, "
        f"dec DECIMAL(38,9), dt DATE, ts TIMESTAMP, tsn TIMESTAMP_NTZ, s STRING, bin BINARY, "
        f"st STRUCT<x: INT, y: STRUCT<z: STRING>>, arr ARRAY<STRUCT<p: INT, q: STRING>>, m MAP<STRING, INT>, "
        f"mm MAP<STRING, ARRAY<INT>>) USING iceberg TBLPROPERTIES ({table_props(2, 'copy-on-write')})",
        f"ALTER TABLE {t} SET IDENTIFIER FIELDS k, n",
        f"INSERT INTO {t} VALUES {row('a', 1)}, {row('a', 2)}, {row('b', 1)}, {row('b', 2)}, {row('c', 1)}",
        # special values and nulls at every level
        f"INSERT INTO {t} VALUES ('e', 1, NULL, NULL, NULL, float('Infinity'), double('-0.0'), NULL, NULL, NULL, NULL, "
        f"'nul\\u0000 emoji 🦀', X'', named_struct('x', NULL, 'y', NULL), array(NULL), map('z', NULL), map('k', NULL)), "
        f"('f', 1, false, -1, -1, float('-Infinity'), double('NaN'), -0.000000001, DATE '1970-01-01', "
        f"TIMESTAMP '1970-01-01 00:00:00', TIMESTAMP_NTZ '1969-12-31 23:59:59.999999', 'plain', NULL, NULL, NULL, NULL, NULL)",
        # copy-on-write: every row is rewritten, only a nested map value changes in one of them -> one UPDATE
        f"UPDATE {t} SET m = map('a', 1, 'b', 3) WHERE k = 'b' AND n = 2",
        f"UPDATE {t} SET st = named_struct('x', 7, 'y', named_struct('z', 'changed')) WHERE k = 'a' AND n = 1",
        f"DELETE FROM {t} WHERE k = 'c'",
    ]


@pytest.fixture(scope="module")
def evo_tables(spark):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    out = {}
    for mode, version in (("merge-on-read", 2), ("copy-on-write", 3)):
        name = f"evo_{'mor' if mode == 'merge-on-read' else 'cow'}_v{version}"
        spark.sql(f"DROP TABLE IF EXISTS {CAT}.db.{name}")
        for s in evo_workload(mode, version):
            spark.sql(s.replace(EVO, f"{CAT}.db.{name}"))
        out[name] = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {TYPES}")
    for s in types_workload():
        spark.sql(s)
    return out


def canon(v):
    """A hashable, comparable form of a Spark value (maps are dicts, floats may be NaN)."""
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        return ("float", v, math.copysign(1.0, v))
    if isinstance(v, dict):
        return tuple(sorted((canon(k), canon(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(canon(x) for x in v)
    if hasattr(v, "asDict"):
        return tuple((k, canon(x)) for k, x in v.asDict(recursive=False).items())
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    return v


def rows_of(df):
    return sorted((canon(tuple(r)) for r in df.collect()), key=repr)


def lineage(spark, t):
    return [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at").collect()]


def source_at(spark, t, sid):
    return spark.sql(f"SELECT * FROM {t} VERSION AS OF {sid}")


def assert_target_is_source_at(spark, src, tgt, sid):
    want_df = source_at(spark, src, sid)
    cols = want_df.columns
    got_df = spark_table(spark, tgt)
    assert got_df.columns == cols, f"target columns {got_df.columns} != source columns at {sid}: {cols}"
    want, got = rows_of(want_df), rows_of(got_df.select(*cols))
    assert got == want, f"at source snapshot {sid}:\nmissing {[r for r in want if r not in got]}\nextra {[r for r in got if r not in want]}"


CASES = [("evo_mor_v2", "hadoop", 2, "equality"), ("evo_cow_v3", "rest", 3, "equality"), ("evo_mor_v2", "sql", 3, "equality"),
         ("evo_cow_v3", "hadoop", 2, "equality"), ("evo_mor_v2", "rest", 3, "position"), ("evo_cow_v3", "sql", 2, "position")]


@pytest.mark.parametrize("name,kind,version,mode", CASES)
def test_sync_follows_schema_evolution_step_by_step(spark, evo_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind, version, mode):
    """With `delete_mode = "position"` too: keys of rows in files of older schemas (renamed, widened key columns)
    are found by field id and deleted by position."""
    src = evo_tables[name]
    extra = f'format_version = {version}\ndelete_mode = "{mode}"'
    section, tgt = target_section(kind, f"evo_{kind}_v{version}_{mode}.{name}", warehouse, rest_catalog, sql_target, extra)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    for sid in lineage(spark, src):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_target_is_source_at(spark, src, tgt, sid)


@pytest.mark.parametrize("per_commit", [1, 3])
def test_sync_follows_schema_evolution_in_one_go(spark, evo_tables, warehouse, rest_catalog, sql_target, tmp_path, per_commit):
    name = "evo_mor_v2"
    src = evo_tables[name]
    snaps = lineage(spark, src)
    section, tgt = target_section("hadoop", f"evo_go{per_commit}.{name}", warehouse, rest_catalog, sql_target, f"snapshots_per_commit = {per_commit}")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    # bootstrap at the first snapshot (the target gets that snapshot's schema), then everything in one run
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    assert_target_is_source_at(spark, src, tgt, snaps[0])
    run_cdc("sync", "--config", cfg)
    assert_target_is_source_at(spark, src, tgt, snaps[-1])
    # the target's field-id mapping is recorded for restarts and other instances
    props = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {tgt}").collect()}
    assert any(k.startswith("cdc.field-ids.") for k in props), props
    # the re-added `old` is a new column: none of the dropped values came back
    olds = {r.old for r in spark_table(spark, tgt).select("old").collect()}
    assert olds <= {None, "fresh"}, olds


def test_keep_dropped_columns_moves_them_out_of_the_way(spark, evo_tables, warehouse, rest_catalog, sql_target, tmp_path):
    name = "evo_mor_v2"
    src = evo_tables[name]
    section, tgt = target_section("hadoop", f"evo_keep.{name}", warehouse, rest_catalog, sql_target, "keep_dropped_columns = true")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    snaps = lineage(spark, src)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    run_cdc("sync", "--config", cfg)
    df = spark_table(spark, tgt)
    dropped = [c for c in df.columns if c.startswith("old__dropped_")]
    assert len(dropped) == 1, df.columns
    vals = {r[0] for r in df.select(dropped[0]).collect()}
    assert "old4" in vals, vals
    assert {r.old for r in df.select("old").collect()} <= {None, "fresh"}


def test_changes_across_schema_changes_use_the_end_schema(spark, evo_tables, warehouse, tmp_path):
    name = "evo_mor_v2"
    src = evo_tables[name]
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse)
    rows = cdc_changes(cfg)
    end_cols = spark.table(src).columns
    for r in rows:
        assert [c for c in r if not c.startswith("_")] == end_cols, r.keys()
    first = [r for r in rows if r["_change_ordinal"] == 0]
    assert len(first) == 10 and all(r["_change_type"] == "INSERT" for r in first)
    # written before the rename, read under the new name; before the widening, read at the wider type
    r3 = next(r for r in first if r["id"] == 3)
    assert r3["full_name"] == "n3" and r3["qty"] == 9 and r3["amount"] == "3.25", r3
    # the dropped-and-re-added `old` is a new column: null in every row written before
    assert all(r["old"] is None for r in first)
    # the nested rename: info.b is `bee` now (struct keys are field ids in JSON); the added info.c is null
    big = next(r for r in rows if r["id"] == 10)
    assert big["qty"] == 5000000000


def test_every_type_through_changes_and_sync(spark, evo_tables, warehouse, rest_catalog, sql_target, tmp_path):
    cfg = write_config(str(tmp_path / "cdc.toml"), "db.types", warehouse)
    # deterministic: identical bytes on every run, ordered by ordinal, then key in key order (k, then n)
    runs = [run_cdc("changes", "--config", cfg).stdout for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    rows = [json.loads(line) for line in runs[0].splitlines() if line.strip()]
    order = [(r["_change_ordinal"], r["k"], r["n"]) for r in rows]
    assert order == sorted(order), order
    snaps = lineage(spark, TYPES)
    # only a nested map value changed: one UPDATE pair, no carry-over
    upd = [r for r in rows if r["_commit_snapshot_id"] == snaps[2]]
    assert [(r["_change_type"], r["k"], r["n"]) for r in upd] == [("UPDATE_BEFORE", "b", 2), ("UPDATE_AFTER", "b", 2)], upd
    nested = [r for r in rows if r["_commit_snapshot_id"] == snaps[3]]
    assert [r["_change_type"] for r in nested] == ["UPDATE_BEFORE", "UPDATE_AFTER"], nested
    special = {(r["k"], r["n"]): r for r in rows if r["_commit_snapshot_id"] == snaps[1]}
    assert special[("e", 1)]["f"] == "Infinity" and special[("f", 1)]["d"] == "NaN"
    assert special[("e", 1)]["s"] == "nul\u0000 emoji 🦀"
    # parquet output is read back by Spark with the same rows
    out = tmp_path / "types.parquet"
    run_cdc("changes", "--config", cfg, "--format", "parquet", "--output", str(out))
    assert spark.read.parquet(str(out)).count() == len(rows)
    # sync step by step: Spark reads the target back equal to the source at every snapshot
    for kind, version in (("hadoop", 2), ("rest", 3)):
        section, tgt = target_section(kind, f"types_{kind}.types", warehouse, rest_catalog, sql_target, f"format_version = {version}")
        tcfg = write_config(str(tmp_path / f"{kind}.toml"), "db.types", warehouse, target=section)
        for sid in snaps:
            run_cdc("sync", "--config", tcfg, "--to-snapshot", str(sid))
            assert_target_is_source_at(spark, TYPES, tgt, sid)


def test_refused_schema_change_names_the_column_and_writes_nothing(spark, evo_tables, warehouse, rest_catalog, sql_target, tmp_path):
    """A target whose column cannot take the source's type: exit 7, the column and snapshot named, target unchanged."""
    name = "evo_mor_v2"
    src = evo_tables[name]
    section, tgt = target_section("hadoop", f"evo_refuse.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    snaps = lineage(spark, src)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    # someone turns the target's `qty` into a string column by hand: drop and re-add under the same name
    spark.sql(f"ALTER TABLE {tgt} DROP COLUMN qty")
    spark.sql(f"ALTER TABLE {tgt} ADD COLUMN qty STRING")
    before = lineage(spark, tgt)
    p = run_cdc("sync", "--config", cfg, check=False)
    assert p.returncode == 7, p.stderr
    assert "qty" in p.stderr and "nothing was written" in p.stderr, p.stderr
    assert lineage(spark, tgt) == before


def part_workload(t, version):
    return [
        f"CREATE TABLE {t} (id BIGINT NOT NULL, cat STRING, v INT) USING iceberg PARTITIONED BY (bucket(4, id)) "
        f"TBLPROPERTIES ({table_props(version, 'merge-on-read')})",
        f"ALTER TABLE {t} SET IDENTIFIER FIELDS id",
        f"INSERT INTO {t} VALUES " + ", ".join(f"({i}, '{'abc'[i % 3]}', {i})" for i in range(30)),
        f"ALTER TABLE {t} ADD PARTITION FIELD cat",
        # rows of files written under the old spec are updated and deleted under the new one
        f"UPDATE {t} SET v = v + 100 WHERE id % 4 = 0",
        f"DELETE FROM {t} WHERE id % 5 = 1",
        f"INSERT INTO {t} VALUES (100, 'z', 1), (101, 'a', 2)",
        f"ALTER TABLE {t} DROP PARTITION FIELD bucket(4, id)",
        f"UPDATE {t} SET cat = 'moved' WHERE id IN (2, 100)",
    ]


@pytest.mark.parametrize("follow,version,kind,mode", [(True, 2, "hadoop", "equality"), (False, 3, "rest", "equality"), (True, 3, "sql", "equality"),
                                                       (True, 2, "rest", "position"), (True, 3, "hadoop", "position")])
def test_sync_across_partition_spec_evolution(spark, warehouse, rest_catalog, sql_target, tmp_path, follow, version, kind, mode):
    """The source's partition spec evolves twice while rows of old-spec files change, with a sync after every
    statement. The target keeps its own spec or follows the source's (`follow_partition_spec`); either way Spark reads
    it equal to the source after every step, and deletes reach rows of every spec (in position mode: each position
    delete in the spec and partition of the file it deletes from)."""
    name = f"part_evo_v{version}_{kind}_{mode}"
    src = f"{CAT}.db.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    extra = f"format_version = {version}\nfollow_partition_spec = {'true' if follow else 'false'}\ndelete_mode = \"{mode}\""
    section, tgt = target_section(kind, f"pevo_{kind}_{int(follow)}.{name}", warehouse, rest_catalog, sql_target, extra)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    for stmt in part_workload(src, version):
        spark.sql(stmt)
        snaps = lineage(spark, src)
        if snaps:
            run_cdc("sync", "--config", cfg)
            assert_target_is_source_at(spark, src, tgt, snaps[-1])
    if kind != "sql":
        spark.sql(f"REFRESH TABLE {tgt}")
        spec_ids = {r.spec_id for r in spark.sql(f"SELECT DISTINCT spec_id FROM {tgt}.files").collect()}
        assert (len(spec_ids) > 1) == follow, f"follow_partition_spec = {follow}: files in specs {spec_ids}"


def test_a_target_whose_spec_was_changed_by_hand_stays_exact(spark, warehouse, rest_catalog, sql_target, tmp_path):
    """Someone evolves the target's partition spec; later deletes must still reach rows of the old spec's files."""
    name = "part_hand"
    src = f"{CAT}.db.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    stmts = part_workload(src, 2)[:3] + [f"UPDATE {src} SET v = -1 WHERE id < 10", f"DELETE FROM {src} WHERE id >= 20"]
    for s in stmts:
        spark.sql(s)
    snaps = lineage(spark, src)
    section, tgt = target_section("hadoop", f"phand.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[0]))
    spark.sql(f"ALTER TABLE {tgt} ADD PARTITION FIELD cat")
    spark.sql(f"INSERT INTO {tgt} VALUES (500, 'hand', 5)")
    for sid in snaps[1:]:
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
    got = rows_of(spark_table(spark, tgt).where("id < 500"))
    want = rows_of(source_at(spark, src, snaps[-1]))
    assert got == want, f"missing {[r for r in want if r not in got]}, extra {[r for r in got if r not in want]}"


def test_keys_of_every_key_type(spark, warehouse, rest_catalog, sql_target, tmp_path):
    """A composite key of date, decimal(20,4), timestamp, binary and boolean columns (identifier fields may be any
    primitive but float/double): updates and deletes by that key replicate exactly."""
    name = "keytypes"
    src = f"{CAT}.db.{name}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    key = lambda i: (f"DATE '2024-01-{i % 28 + 1:02d}', CAST({i}.0001 AS DECIMAL(20,4)), "
                     f"TIMESTAMP '2024-02-01 00:00:{i % 60:02d}', X'{i:04X}', {str(i % 2 == 0).lower()}")
    stmts = [
        f"CREATE TABLE {src} (d DATE NOT NULL, dec DECIMAL(20,4) NOT NULL, ts TIMESTAMP NOT NULL, b BINARY NOT NULL, "
        f"flag BOOLEAN NOT NULL, v STRING) USING iceberg TBLPROPERTIES ({table_props(2, 'merge-on-read')})",
        f"ALTER TABLE {src} SET IDENTIFIER FIELDS d, dec, ts, b, flag",
        f"INSERT INTO {src} VALUES " + ", ".join(f"({key(i)}, 'v{i}')" for i in range(12)),
        f"UPDATE {src} SET v = 'updated' WHERE dec < 4",
        f"DELETE FROM {src} WHERE b = X'0007'",
        f"INSERT INTO {src} VALUES ({key(40)}, 'new')",
    ]
    for s in stmts:
        spark.sql(s)
    for kind in ("hadoop", "rest"):
        section, tgt = target_section(kind, f"keytypes_{kind}.{name}", warehouse, rest_catalog, sql_target)
        cfg = write_config(str(tmp_path / f"{kind}.toml"), f"db.{name}", warehouse, target=section)
        for sid in lineage(spark, src):
            run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
            assert_target_is_source_at(spark, src, tgt, sid)
