"""Sources whose files are ORC or Avro (Spark 3.5 + Iceberg 1.10 with `write.format.default` = orc / avro — data
files and delete files alike): the peer workload (appends, copy-on-write and merge-on-read updates, position deletes
in the table's format, v3 deletion vectors, compaction, an added column, partitions) is read by `cdc changes` equal
to Spark's time-travel difference at every snapshot, and replicated by `cdc sync` step by step into Parquet targets
that Spark reads equal to the source; a table whose format changes mid-history (Parquet → ORC → Avro) too."""
from collections import Counter

import pytest

from conftest import cdc_changes, run_cdc, spark_table, target_section, write_config
from spark_workloads import CAT, create, table_props, workload
from test_spark_changelog import actual_changes, expected_changes, lineage as changelog_lineage, norm, row_key, spark_rows
from test_spark_sync import assert_replica, cols_at, lineage

# name: (format, format version, write mode, partitioned)
FORMAT_TABLES = {
    "orc_mor_v2": ("orc", 2, "merge-on-read", False),
    "orc_cow_v3": ("orc", 3, "copy-on-write", False),
    "orc_part_v2": ("orc", 2, "merge-on-read", True),
    "avro_mor_v2": ("avro", 2, "merge-on-read", False),
    "avro_mor_v3": ("avro", 3, "merge-on-read", False),
    "avro_part_cow_v2": ("avro", 2, "copy-on-write", True),
}


@pytest.fixture(scope="module")
def format_tables(spark):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    for name, (fmt, version, mode, partitioned) in FORMAT_TABLES.items():
        create(spark, f"{CAT}.db.{name}", version, mode, True, partitioned, fmt)
    return FORMAT_TABLES


def file_formats(spark, t):
    return {r.file_format for r in spark.sql(f"SELECT file_format FROM {t}.all_files").collect()}


@pytest.mark.parametrize("name", list(FORMAT_TABLES))
def test_changes_of_every_snapshot_match_spark(spark, format_tables, warehouse, tmp_path, name):
    fmt = format_tables[name][0]
    t = f"{CAT}.db.{name}"
    assert fmt.upper() in file_formats(spark, t), "the workload must really write that format"
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse)
    cols = [f.name for f in spark.table(t).schema.fields]
    for sid, parent, op in changelog_lineage(spark, t):
        expected = expected_changes(spark_rows(spark, t, parent, cols), spark_rows(spark, t, sid, cols), True)
        args = ["--to-snapshot", str(sid)] + (["--from-snapshot", str(parent)] if parent else [])
        got = actual_changes(cdc_changes(cfg, *args), cols)
        assert got == expected, f"{name} snapshot {sid} ({op}): missing {expected - got}, unexpected {got - expected}"


@pytest.mark.parametrize("name,kind,mode", [("orc_mor_v2", "hadoop", "equality"), ("orc_part_v2", "rest", "position"),
                                            ("avro_mor_v3", "sql", "equality"), ("avro_part_cow_v2", "hadoop", "position")])
def test_sync_step_by_step_into_parquet(spark, format_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind, mode):
    src = f"{CAT}.db.{name}"
    section, tgt = target_section(kind, f"fmt_{kind}.{name}", warehouse, rest_catalog, sql_target, f'delete_mode = "{mode}"')
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    for sid in lineage(spark, src):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)
    if kind != "sql":
        assert file_formats(spark, tgt) <= {"PARQUET", "PUFFIN"}, "targets stay Parquet"


def test_a_table_whose_format_changes_mid_history(spark, warehouse, rest_catalog, sql_target, tmp_path):
    t = f"{CAT}.db.fmt_mixed"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    stmts = workload(t, 2, "merge-on-read", True, False)
    # Parquet first, ORC from the UPDATE on, Avro from the MERGE on
    stmts.insert(4, f"ALTER TABLE {t} SET TBLPROPERTIES ('write.format.default'='orc')")
    stmts.insert(7, f"ALTER TABLE {t} SET TBLPROPERTIES ('write.format.default'='avro')")
    for s in stmts:
        spark.sql(s)
    assert {"PARQUET", "ORC", "AVRO"} <= file_formats(spark, t)
    section, tgt = target_section("hadoop", "fmt_mixed.t", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), "db.fmt_mixed", warehouse, target=section)
    cols = [f.name for f in spark.table(t).schema.fields]
    for sid, parent, op in changelog_lineage(spark, t):
        expected = expected_changes(spark_rows(spark, t, parent, cols), spark_rows(spark, t, sid, cols), True)
        args = ["--to-snapshot", str(sid)] + (["--from-snapshot", str(parent)] if parent else [])
        assert actual_changes(cdc_changes(cfg, *args), cols) == expected, f"snapshot {sid} ({op})"
    for sid in lineage(spark, t):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_replica(spark, t, tgt, cols_at(spark, t, sid), sid)


@pytest.mark.parametrize("fmt", ["parquet", "orc"])
def test_migrated_files_without_field_ids_are_read_through_the_name_mapping(spark, warehouse, rest_catalog, sql_target, tmp_path, fmt):
    """A table migrated from plain files (Spark's `add_files`, as from a Hive table): its first files carry no field
    ids and Iceberg gives the table a name mapping. A column renamed afterwards still resolves in those files by its
    old name (the mapping's alias), which matching by the current name would read as null; updates and deletes of
    migrated rows and new Iceberg files come after. `cdc changes` equals Spark at every snapshot and `cdc sync`
    replicates it."""
    raw = tmp_path / f"raw_{fmt}"
    rows = [(i, f"name-{i}", i * 1.5, ["a", "b"][i % 2]) for i in range(40)]
    spark.createDataFrame(rows, "id bigint, name string, amount double, cat string").repartition(2).write.format(fmt).save(str(raw))
    name = f"migrated_{fmt}"
    t = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id bigint NOT NULL, name string, amount double, cat string) USING iceberg "
              f"TBLPROPERTIES ({table_props(2, 'merge-on-read')})")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.sql(f"CALL {CAT}.system.add_files(table => 'db.{name}', source_table => '`{fmt}`.`{raw}`')")
    props = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {t}").collect()}
    assert "schema.name-mapping.default" in props, "add_files gives the table a name mapping"
    spark.sql(f"ALTER TABLE {t} RENAME COLUMN name TO customer")
    spark.sql(f"UPDATE {t} SET amount = amount + 100 WHERE id % 5 = 0")
    spark.sql(f"DELETE FROM {t} WHERE id IN (1, 2)")
    spark.sql(f"INSERT INTO {t} VALUES (100, 'new', 1.0, 'z')")
    spark.sql(f"UPDATE {t} SET customer = concat(customer, '-u') WHERE id IN (3, 100)")
    section, tgt = target_section("hadoop", f"migrated_rep.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    cols = [f.name for f in spark.table(t).schema.fields]

    def at(sid):  # Spark reads a snapshot under that snapshot's schema: `customer` was `name` before the rename
        if sid is None:
            return Counter()
        df = spark.sql(f"SELECT * FROM {t} VERSION AS OF {sid}").withColumnRenamed("name", "customer")
        return Counter(row_key({k: norm(v) for k, v in r.asDict().items()}, cols) for r in df.collect())

    for sid, parent, op in changelog_lineage(spark, t):
        expected = expected_changes(at(parent), at(sid), True)
        args = ["--to-snapshot", str(sid)] + (["--from-snapshot", str(parent)] if parent else [])
        renamed = [{("customer" if k == "name" else k): v for k, v in r.items()} for r in cdc_changes(cfg, *args)]
        got = actual_changes(renamed, cols)
        assert got == expected, f"snapshot {sid} ({op}): missing {expected - got}, unexpected {got - expected}"
    for sid in lineage(spark, t):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_replica(spark, t, tgt, cols_at(spark, t, sid), sid)
    assert sum(1 for r in spark_table(spark, tgt).collect() if r.customer is None) == 0, "no name read as null"


@pytest.mark.parametrize("fmt", ["avro", "orc"])
def test_nested_types_in_orc_and_avro(spark, warehouse, rest_catalog, sql_target, tmp_path, fmt):
    """Maps with non-string keys (Avro stores them as arrays of key/value records), maps with string keys, lists of
    structs and nested structs, in ORC and Avro data and delete files: changes equal to Spark at every snapshot, the
    replica exact."""
    name = f"nested_{fmt}"
    t = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id bigint NOT NULL, by_int map<int, string>, by_name map<string, int>, "
              f"items array<struct<sku: string, qty: int>>, addr struct<city: string, geo: struct<lat: double, lon: double>>) "
              f"USING iceberg TBLPROPERTIES ({table_props(2, 'merge-on-read', fmt)})")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    values = ", ".join(
        f"({i}, map({i}, 'v{i}', {i + 100}, 'w{i}'), map('k{i}', {i}), array(named_struct('sku', 's{i}', 'qty', {i})), "
        f"named_struct('city', 'c{i}', 'geo', named_struct('lat', {i}.5, 'lon', -{i}.25)))" for i in range(12))
    spark.sql(f"INSERT INTO {t} VALUES {values}")
    spark.sql(f"UPDATE {t} SET by_int = map_concat(by_int, map(-1, 'added')), items = array() WHERE id % 3 = 0")
    spark.sql(f"DELETE FROM {t} WHERE id IN (4, 5)")
    spark.sql(f"UPDATE {t} SET addr = named_struct('city', 'moved', 'geo', named_struct('lat', 0.0, 'lon', 0.0)), by_name = NULL WHERE id = 7")
    assert fmt.upper() in file_formats(spark, t)
    section, tgt = target_section("hadoop", f"nested_rep.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    cols = [f.name for f in spark.table(t).schema.fields]

    def canon(v):  # Spark's nested values, hashable
        if isinstance(v, dict):
            return tuple(sorted((k, canon(x)) for k, x in v.items()))
        if isinstance(v, list):
            return tuple(canon(x) for x in v)
        return v

    def at(sid):
        if sid is None:
            return Counter()
        return Counter(tuple((c, canon(r.asDict(recursive=True)[c])) for c in cols) for r in spark.sql(f"SELECT * FROM {t} VERSION AS OF {sid}").collect())

    for sid, parent, op in changelog_lineage(spark, t):
        # which keys change how: from Spark's two reads (the values themselves are compared on the replica below)
        expected = Counter((kind, dict(row)["id"]) for kind, row in expected_changes(at(parent), at(sid), True).elements())
        args = ["--to-snapshot", str(sid)] + (["--from-snapshot", str(parent)] if parent else [])
        got = Counter((r["_change_type"], r["id"]) for r in cdc_changes(cfg, *args))
        assert got == expected, f"snapshot {sid} ({op}): missing {expected - got}, unexpected {got - expected}"
    for sid in lineage(spark, t):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        want = Counter(repr(sorted(r.asDict(recursive=True).items())) for r in spark.sql(f"SELECT * FROM {t} VERSION AS OF {sid}").collect())
        got = Counter(repr(sorted(r.asDict(recursive=True).items())) for r in spark_table(spark, tgt).collect())
        assert got == want, f"after {sid}: missing {want - got}, extra {got - want}"
