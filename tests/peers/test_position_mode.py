"""`delete_mode = "position"`: replicas with no equality-delete file, which every engine reads. Spark-written sources of
every kind (copy-on-write, position deletes, deletion vectors, partitioned) and a source with equality deletes are
replicated into v2 (position-delete files) and v3 (deletion vectors) targets on hadoop, sqlite and REST catalogs;
after every step Spark and pyiceberg 0.12 both read the target equal to the source, and no snapshot of the target
lists an equality-delete file. Rows that moved (cdc's own compaction, Spark's `rewrite_data_files`, an update in
an earlier commit) are deleted where they are now; SIGKILL and concurrent appliers leave the replica exact."""
import random
import subprocess

import pytest

from conftest import CDC, run_cdc, spark_table, sqlite_metadata_location, target_section, write_config
from spark_workloads import CAT
from test_spark_sync import assert_replica, cols_at, kill_syncs_at_random, lineage, pyiceberg_keys, source_cols, spark_maintenance, target_summaries

POSITION = 'delete_mode = "position"'


def metadata_table(spark, tgt, which):
    """A metadata table of a target (`delete_files`, `all_delete_files`, ...), also of a sqlite-catalog target (read
    by its current metadata file: Spark has no catalog for it)."""
    if tgt.startswith("sqlite:"):
        parts = tgt[len("sqlite:"):].split(".")
        return spark.read.format("iceberg").load(sqlite_metadata_location(".".join(parts[:-2]), ".".join(parts[-2:])) + "#" + which)
    spark.sql(f"REFRESH TABLE {tgt}")
    return spark.table(f"{tgt}.{which}")


def delete_contents(spark, tgt):
    """Content codes of every delete file any snapshot of the target lists (1 position, 2 equality)."""
    return [r.content for r in metadata_table(spark, tgt, "all_delete_files").select("content").collect()]


def assert_read_everywhere(spark, src, tgt, kind, table, warehouse, rest_catalog, sql_target, version=None):
    """Spark reads the target equal to the source (at `version`); pyiceberg reads the same rows; no equality delete."""
    assert_replica(spark, src, tgt, cols_at(spark, src, version) if version else source_cols(spark, src), version)
    want = sorted((r[0], r[1]) for r in spark_table(spark, tgt).select("id", "name").collect())
    assert pyiceberg_keys(kind, table, warehouse, rest_catalog, sql_target) == want, "pyiceberg reads other rows than Spark"
    contents = delete_contents(spark, tgt)
    assert 2 not in contents, "an equality-delete file in a position-mode target"
    return contents


# (source, target catalog, target format version, compact): every source kind, both delete encodings, all catalogs
CASES = [
    ("cow_v2", "hadoop", 2, False),
    ("mor_v2", "sql", 3, True),
    ("mor_v3", "rest", 2, True),
    ("part_v2", "rest", 3, False),
    ("cow_v3", "sql", 2, True),
    ("part_cow_v3", "hadoop", 3, True),
]


@pytest.mark.parametrize("name,kind,version,compact", CASES)
def test_position_mode_step_by_step(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind, version, compact):
    """Snapshot by snapshot; with `compact`, cdc compacts after every 2 delete files, so rows keep moving between
    files and later deletes must find them where they are now."""
    src = f"{CAT}.db.{name}"
    table = f"pos_{kind}.{name}"
    extra = f"{POSITION}\nformat_version = {version}\n" + ("compact_delete_files = 2\ncompact_small_files = 2" if compact else "compact = false")
    section, tgt = target_section(kind, table, warehouse, rest_catalog, sql_target, extra)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    positional = 0
    for sid in lineage(spark, src):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        positional = len(assert_read_everywhere(spark, src, tgt, kind, table, warehouse, rest_catalog, sql_target, sid))
    assert positional > 0 or compact, "the source deletes and updates rows: the target must delete by position"
    if version == 3:
        formats = {r.file_format for r in metadata_table(spark, tgt, "delete_files").select("file_format").collect()}
        assert formats <= {"PUFFIN"}, formats


def test_a_source_with_equality_deletes(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path):
    """A Flink-like source: an equality-mode replica (equality deletes on every commit) is itself the source of a
    position-mode replica, followed snapshot by snapshot into a v3 target."""
    name = "mor_v2"
    src = f"{CAT}.db.{name}"
    eq_section, eq_tgt = target_section("hadoop", f"eqsrc.{name}", warehouse, rest_catalog, sql_target, "compact = false")
    eq_cfg = write_config(str(tmp_path / "eq.toml"), f"db.{name}", warehouse, target=eq_section)
    run_cdc("sync", "--config", eq_cfg, "--to-snapshot", str(lineage(spark, src)[0]))
    run_cdc("sync", "--config", eq_cfg)
    assert 2 in delete_contents(spark, eq_tgt), "the intermediate replica must hold equality deletes"
    section, tgt = target_section("sql", f"from_eq.{name}", warehouse, rest_catalog, sql_target, f"{POSITION}\nformat_version = 3")
    cfg = write_config(str(tmp_path / "pos.toml"), f"eqsrc.{name}", warehouse, target=section)
    for sid in lineage(spark, eq_tgt):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_replica(spark, eq_tgt, tgt, cols_at(spark, eq_tgt, sid), sid)
    assert_read_everywhere(spark, src, tgt, "sql", f"from_eq.{name}", warehouse, rest_catalog, sql_target)


@pytest.mark.parametrize("name,kind,version", [("part_v2", "rest", 2), ("mor_v3", "hadoop", 3)])
def test_sparks_rewrite_between_syncs(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path, name, kind, version):
    """Spark rewrites every data file of the target (deletes applied, position deletes compacted, manifests
    rewritten) between every two syncs: every row moved, and the next sync deletes rows at their new positions."""
    src = f"{CAT}.db.{name}"
    table = f"pos_owner_{kind}.{name}"
    section, tgt = target_section(kind, table, warehouse, rest_catalog, sql_target, f"{POSITION}\nformat_version = {version}\ncompact = false")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    for i, sid in enumerate(lineage(spark, src)):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_read_everywhere(spark, src, tgt, kind, table, warehouse, rest_catalog, sql_target, sid)
        if i % 2 == 0:
            spark_maintenance(spark, tgt, version, expire=False)


def test_position_mode_survives_sigkill(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path):
    rng = random.Random(11)
    name = "mor_v3"
    src = f"{CAT}.db.{name}"
    table = f"pos_crash.{name}"
    section, tgt = target_section("sql", table, warehouse, rest_catalog, sql_target, f"{POSITION}\nformat_version = 3\nsnapshots_per_commit = 2")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    kills = kill_syncs_at_random(cfg, lineage(spark, src), 30, rng, 0.05)
    assert kills > 5, "the trials must really interrupt syncs"
    run_cdc("sync", "--config", cfg)
    assert_read_everywhere(spark, src, tgt, "sql", table, warehouse, rest_catalog, sql_target)


def test_concurrent_position_appliers_apply_every_range_once(spark, spark_tables, warehouse, rest_catalog, sql_target, tmp_path):
    """3 `cdc sync` processes on one REST target, each to another end: positions found in a head that moved are never
    committed (the applier plans again), every range is applied once, and the replica is exact."""
    name = "mor_v2"
    src = f"{CAT}.db.{name}"
    snaps = lineage(spark, src)
    seq = {s: i for i, s in enumerate(snaps)}
    table = f"pos_race.{name}"
    section, tgt = target_section("rest", table, warehouse, rest_catalog, sql_target, f'{POSITION}\ncommit_retries = 50\nretry_backoff = "20ms"')
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[1]))
    ends = [snaps[-1], snaps[-3], snaps[-5]]
    procs = [subprocess.Popen([CDC, "sync", "--config", cfg, "--to-snapshot", str(e)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for e in ends]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    progress = [int(s["cdc.source-snapshot-id"]) for s in target_summaries(tmp_path, "rest", table, warehouse, rest_catalog, sql_target)
                if "cdc.source-snapshot-id" in s]
    order = [seq[p] for p in progress]
    assert order == sorted(set(order)), f"progress repeated or went backwards: {order}"
    assert progress[-1] == snaps[-1]
    assert_read_everywhere(spark, src, tgt, "rest", table, warehouse, rest_catalog, sql_target)
