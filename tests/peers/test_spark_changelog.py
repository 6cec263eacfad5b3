"""`cdc changes` against tables written by Apache Spark + Iceberg, checked with two independent oracles:

1. the difference between the table at the parent and at the snapshot, both read by Spark (`VERSION AS OF`);
2. on copy-on-write tables, Spark's own `create_changelog_view` with `compute_updates`.
"""
import datetime
import decimal
import json
import os
from collections import Counter

import pytest

from conftest import cdc_changes, run_cdc, write_config
from spark_workloads import CAT, TABLES

META = {"_change_type", "_commit_snapshot_id", "_commit_snapshot_sequence_number", "_commit_timestamp", "_change_ordinal"}


def norm(v):
    """Spark values → the Iceberg single-value JSON forms cdc prints."""
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, datetime.datetime):
        return v.strftime("%Y-%m-%dT%H:%M:%S.%f") + "+00:00"
    if isinstance(v, datetime.date):
        return v.isoformat()
    return v


def row_key(d, cols):
    return tuple((c, d.get(c)) for c in cols)


def spark_rows(spark, t, snapshot_id, cols):
    if snapshot_id is None:
        return Counter()
    rows = spark.sql(f"SELECT * FROM {t} VERSION AS OF {snapshot_id}").collect()
    return Counter(row_key({k: norm(v) for k, v in r.asDict().items()}, cols) for r in rows)


def expected_changes(before, after, keyed):
    """Net changes of one snapshot from the two states, the way the changelog defines them."""
    removed, added = before - after, after - before
    out = Counter()
    if not keyed:
        for r, n in removed.items():
            out[("DELETE", r)] += n
        for r, n in added.items():
            out[("INSERT", r)] += n
        return out
    key = lambda r: dict(r)["id"]
    by_key = {}
    for r, n in removed.items():
        by_key.setdefault(key(r), ([], []))[0].extend([r] * n)
    for r, n in added.items():
        by_key.setdefault(key(r), ([], []))[1].extend([r] * n)
    for rs, adds in by_key.values():
        pairs = min(len(rs), len(adds))
        for r in rs[:pairs]:
            out[("UPDATE_BEFORE", r)] += 1
        for a in adds[:pairs]:
            out[("UPDATE_AFTER", a)] += 1
        for r in rs[pairs:]:
            out[("DELETE", r)] += 1
        for a in adds[pairs:]:
            out[("INSERT", a)] += 1
    return out


def actual_changes(rows, cols):
    return Counter((r["_change_type"], row_key(r, cols)) for r in rows)


def lineage(spark, t):
    rows = spark.sql(f"SELECT snapshot_id, parent_id, operation, committed_at FROM {t}.snapshots ORDER BY committed_at").collect()
    return [(r.snapshot_id, r.parent_id, r.operation) for r in rows]


@pytest.mark.parametrize("name", list(TABLES))
def test_every_snapshot_matches_spark_time_travel(spark, spark_tables, warehouse, tmp_path, name):
    version, mode, keyed, _ = TABLES[name]
    t = f"{CAT}.db.{name}"
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse)
    cols = [f.name for f in spark.table(t).schema.fields]  # current schema: older snapshots lack `note` → None
    snaps = lineage(spark, t)
    assert len(snaps) >= 9
    whole = cdc_changes(cfg)
    ordinals = {}
    for sid, parent, op in snaps:
        before, after = spark_rows(spark, t, parent, cols), spark_rows(spark, t, sid, cols)
        expected = expected_changes(before, after, keyed)
        args = ["--to-snapshot", str(sid)] + (["--from-snapshot", str(parent)] if parent else [])
        got_rows = cdc_changes(cfg, *args)
        got = actual_changes(got_rows, cols)
        assert got == expected, f"{name} snapshot {sid} ({op}): missing {expected - got}, unexpected {got - expected}"
        assert all(r["_commit_snapshot_id"] == sid and r["_change_ordinal"] == 0 for r in got_rows)
        if op == "replace":
            assert not got_rows, "compaction must yield no changes"
        # the same snapshot inside the whole-range run
        in_whole = [r for r in whole if r["_commit_snapshot_id"] == sid]
        assert actual_changes(in_whole, cols) == expected, f"{name} snapshot {sid} differs in the whole-range run"
        ordinals[sid] = {r["_change_ordinal"] for r in in_whole}
    # ordinals follow the lineage
    seen = [next(iter(ordinals[s])) for s, _, _ in snaps if ordinals[s]]
    assert seen == sorted(seen) and all(len(v) <= 1 for v in ordinals.values())
    # rows come ordered by ordinal, then key
    order = [(r["_change_ordinal"], r["id"]) for r in whole]
    assert order == sorted(order)
    # seq numbers and timestamps are the snapshot's
    seqs = {r["_commit_snapshot_id"]: r["_commit_snapshot_sequence_number"] for r in whole}
    assert len(set(seqs.values())) == len(seqs)


@pytest.mark.parametrize("name", [n for n, (v, mode, keyed, p) in TABLES.items() if mode == "copy-on-write" and keyed])
def test_copy_on_write_matches_spark_changelog_view(spark, spark_tables, warehouse, tmp_path, name):
    t = f"{CAT}.db.{name}"
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse)
    snaps = lineage(spark, t)
    first, last = snaps[0][0], snaps[-1][0]
    view = f"cl_{name}"
    spark.sql(
        f"CALL {CAT}.system.create_changelog_view(table => 'db.{name}', "
        f"options => map('start-snapshot-id', '{first}', 'end-snapshot-id', '{last}'), "
        f"changelog_view => '{view}', compute_updates => true, identifier_columns => array('id'))"
    )
    rows = spark.sql(f"SELECT * FROM {view}").collect()
    cols = [c for c in spark.table(view).columns if c not in META]
    spark_changes = Counter(
        (r["_change_type"], r["_commit_snapshot_id"], row_key({k: norm(v) for k, v in r.asDict().items()}, cols)) for r in rows
    )
    ours = cdc_changes(cfg, "--from-snapshot", str(first), "--to-snapshot", str(last))
    our_changes = Counter((r["_change_type"], r["_commit_snapshot_id"], row_key(r, cols)) for r in ours)
    assert spark_changes, "the oracle produced no rows"
    assert our_changes == spark_changes, f"missing {spark_changes - our_changes}, unexpected {our_changes - spark_changes}"
    spark_ord = {(r["_commit_snapshot_id"], r["_change_ordinal"]) for r in rows}
    our_ord = {(r["_commit_snapshot_id"], r["_change_ordinal"]) for r in ours}
    assert our_ord == spark_ord, "ordinals differ from Spark's"


def test_parquet_output_matches_jsonl(spark, spark_tables, warehouse, tmp_path):
    cfg = write_config(str(tmp_path / "cdc.toml"), "db.mor_v3", warehouse)
    out = str(tmp_path / "changes.parquet")
    run_cdc("changes", "--config", cfg, "--format", "parquet", "--output", out)
    df = spark.read.parquet(out)
    types = dict(df.dtypes)
    assert types["amount"] == "decimal(10,2)" and types["ts"] == "timestamp" and types["_commit_snapshot_id"] == "bigint"
    assert types["_change_ordinal"] == "int"
    jsonl = cdc_changes(cfg)
    assert df.count() == len(jsonl)
    got = Counter((r["_change_type"], r["id"], norm(r["amount"])) for r in df.collect())
    assert got == Counter((r["_change_type"], r["id"], r["amount"]) for r in jsonl)


@pytest.mark.parametrize("partitioned", [False, True], ids=["global", "by-partition"])
def test_copy_on_write_with_a_small_budget_splits_and_spills(spark, spark_tables, warehouse, tmp_path, partitioned):
    """A copy-on-write MERGE over 60k rows with a 1 MiB budget: carry-over is cancelled in several fingerprint
    parts spilled to local disk — still one read of each file; the result must equal the unconstrained run and
    Spark's changelog view."""
    name = "cow_big_p" if partitioned else "cow_big"
    t = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    part = "PARTITIONED BY (bucket(4, id)) " if partitioned else ""
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING, n INT) USING iceberg {part}TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='copy-on-write')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.range(60000).selectExpr("id", "concat('v', id) as v", "cast(id % 7 as int) as n").repartition(3).writeTo(t).append()
    spark.sql(f"MERGE INTO {t} x USING (SELECT id FROM range(60000) WHERE id % 10 = 0 OR id % 50 = 1) s ON x.id = s.id "
              "WHEN MATCHED AND x.id % 50 = 1 THEN DELETE WHEN MATCHED THEN UPDATE SET x.n = x.n + 100")
    s1, s2 = [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at").collect()]
    small = write_config(str(tmp_path / "small.toml"), f"db.{name}", warehouse, f'[engine]\nmemory_budget = "1MiB"\nspill_dir = "{tmp_path}"')
    big = write_config(str(tmp_path / "big.toml"), f"db.{name}", warehouse)
    p = run_cdc("changes", "--config", small, "--from-snapshot", str(s1))
    q = run_cdc("changes", "--config", big, "--from-snapshot", str(s1))
    files = lambda err: int(err.split(" files /")[0].rsplit(" ", 1)[1])
    spilled = lambda err: float(err.split(" MB spilled")[0].rsplit(" ", 1)[1])
    assert files(p.stderr) == files(q.stderr), (p.stderr, q.stderr)  # each removed and added file read once, whatever the budget
    assert spilled(p.stderr) > 0 and spilled(q.stderr) == 0, (p.stderr, q.stderr)
    assert p.stdout == q.stdout
    rows = [json.loads(line) for line in p.stdout.splitlines()]
    got = Counter((r["_change_type"], r["id"], r["n"]) for r in rows)
    spark.sql(f"CALL {CAT}.system.create_changelog_view(table => 'db.{name}', options => map('start-snapshot-id', '{s1}', 'end-snapshot-id', '{s2}'), "
              f"changelog_view => 'cl_{name}', compute_updates => true, identifier_columns => array('id'))")
    want = Counter((r._change_type, r.id, r.n) for r in spark.sql(f"SELECT * FROM cl_{name}").collect())
    assert got == want, (len(rows), got - want, want - got)
    assert sum(1 for r in rows if r["_change_type"] == "DELETE") == 1200


@pytest.mark.parametrize("version", [2, 3], ids=["position-deletes", "deletion-vectors"])
def test_merge_on_read_deletes_read_only_the_rows_they_delete(spark, spark_tables, warehouse, tmp_path, version):
    """Merge-on-read DELETE and UPDATE of a few rows in a 400k-row file: a snapshot whose only change to the file is
    position deletes (v2) or a deletion vector (v3, including a DV that replaces the file's DV) reads the pages of
    the rows it deletes, not the file (Iceberg writes an offset index) — and its changes equal Spark's time travel."""
    name = f"mor_sparse_v{version}"
    t = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, v STRING, n INT) USING iceberg TBLPROPERTIES ('format-version'='{version}', "
              "'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read', "
              "'write.parquet.page-row-limit'='10000')")
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.range(400000).selectExpr("id", "md5(cast(id as string)) as v", "cast(id % 7 as int) as n").coalesce(1).writeTo(t).append()
    size = spark.sql(f"SELECT file_size_in_bytes FROM {t}.files WHERE content = 0").collect()
    assert len(size) == 1, "the table must start as one data file"
    size = size[0].file_size_in_bytes
    spark.sql(f"DELETE FROM {t} WHERE id IN (5, 6, 390001)")
    spark.sql(f"UPDATE {t} SET n = -1 WHERE id = 200000")
    spark.sql(f"DELETE FROM {t} WHERE id = 7")
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse)
    cols = ["id", "v", "n"]
    snaps = lineage(spark, t)
    assert [op for _, _, op in snaps] == ["append", "delete", "overwrite", "delete"], snaps
    mb_read = lambda err: float(err.split(" MB read")[0].rsplit(" ", 1)[1])
    for sid, parent, op in snaps[1:]:
        p = run_cdc("changes", "--config", cfg, "--from-snapshot", str(parent), "--to-snapshot", str(sid))
        got = actual_changes([json.loads(line) for line in p.stdout.splitlines()], cols)
        want = expected_changes(spark_rows(spark, t, parent, cols), spark_rows(spark, t, sid, cols), True)
        assert got == want, f"snapshot {sid} ({op}): missing {want - got}, unexpected {got - want}"
        # a few pages of the 400k-row file (and the UPDATE's new one-row file), never the whole file
        assert mb_read(p.stderr) * 1e6 < 0.2 * size, (size, p.stderr)
    assert sum(n for (ct, _), n in got.items() if ct == "DELETE") == 1
