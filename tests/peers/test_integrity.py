"""Files that do not match their metadata (issue 50), on tables Spark wrote and damaged here the way a broken writer
or a damaged lake would: a decimal column stored as text, a data file without its required key column, an
equality-delete file without its equality column, flipped bytes inside a checksummed Parquet page. Each is refused
with exit code 8 naming the file (and the column), nothing is committed to the target, and once the damage is
undone a retry ends equal to the source as Spark reads it."""
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import run_cdc, target_section, write_config
from spark_workloads import CAT, rows, table_props
from test_spark_sync import rows_of, target_rows

EXIT_DATA = 8
COLS = ["id", "name", "amount", "ts", "cat"]
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fixtures", "damaged")


def local(path):
    return path[len("file:"):] if path.startswith("file:") else path


def make_source(spark, name, partitioned=False, fmt=None):
    t = f"{CAT}.db.{name}"
    part = "PARTITIONED BY (bucket(2, id))" if partitioned else ""
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT NOT NULL, name STRING, amount DECIMAL(10,2), ts TIMESTAMP, cat STRING) USING iceberg {part} "
        f"TBLPROPERTIES ({table_props(2, 'merge-on-read', fmt)})"
    )
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.sql(f"INSERT INTO {t} VALUES {rows(0, 200)}")
    spark.sql(f"UPDATE {t} SET amount = amount + 1 WHERE id % 10 = 0")
    return t


def damaged_source(spark, warehouse, rest_catalog, sql_target, tmp_path, name, partitioned=False, fmt=None):
    """A fresh Spark source `db.<name>` (files in `fmt`, default Parquet), its hadoop target `dmg.<name>` (Spark
    name) and the config syncing them."""
    src = make_source(spark, name, partitioned, fmt)
    section, tgt = target_section("hadoop", f"dmg.{name}", warehouse, rest_catalog, sql_target)
    return src, tgt, write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)


def data_files(spark, t):
    spark.sql(f"REFRESH TABLE {t}")
    return [local(r.file_path) for r in spark.sql(f"SELECT file_path FROM {t}.data_files ORDER BY file_path").collect()]


def rewrite_parquet(path, change):
    """Rewrites the Parquet file at `path` with `change(table) -> table`, field ids kept where columns stay; the
    original goes to `path + '.orig'` (and a copy to the corpus)."""
    shutil.copy(path, path + ".orig")
    table = pq.read_table(path)
    pq.write_table(change(table), path)


def with_id(field, fid):
    return field.with_metadata({b"PARQUET:field_id": str(fid).encode()})


def restore(path):
    shutil.move(path + ".orig", path)


def keep(path, name):
    """With CDC_KEEP_CORPUS=1, refreshes the damaged file in the corpus (fixtures/damaged) the unit tests read."""
    if os.environ.get("CDC_KEEP_CORPUS") != "1":
        return
    os.makedirs(CORPUS, exist_ok=True)
    shutil.copy(path, os.path.join(CORPUS, name))


def sync_refused(cfg, path, needle, target_files_before):
    p = run_cdc("sync", "--config", cfg, check=False)
    assert p.returncode == EXIT_DATA, p.stderr
    assert os.path.basename(path) in p.stderr and needle in p.stderr, p.stderr
    return p


def refused(cfg, victim, column):
    """`cdc changes` and `cdc sync` both refuse the damaged `victim`: exit 8 naming it and `column`, no row out."""
    p = run_cdc("changes", "--config", cfg, check=False)
    assert p.returncode == EXIT_DATA and os.path.basename(victim) in p.stderr and column in p.stderr, p.stderr
    assert p.stdout == "", "no row of a refused file is emitted"
    sync_refused(cfg, victim, column, [])
    return p


def target_files(warehouse, table):
    root = os.path.join(warehouse, *table.split("."))
    out = []
    for d, _, fs in os.walk(root):
        out += [os.path.join(d, f) for f in fs if f.endswith((".parquet", ".avro", ".puffin", ".tmp"))]
    return sorted(out)


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_column_of_another_type_is_refused_never_read_as_nulls(spark, warehouse, rest_catalog, sql_target, tmp_path, partitioned):
    name = f"dmg_type_{int(partitioned)}"
    src, tgt, cfg = damaged_source(spark, warehouse, rest_catalog, sql_target, tmp_path, name, partitioned)
    victim = data_files(spark, src)[0]

    def amount_as_text(t):
        i = t.schema.get_field_index("amount")
        field = with_id(pa.field("amount", pa.string()), t.schema.field(i).metadata[b"PARQUET:field_id"].decode())
        return t.set_column(i, field, pa.array([None if v is None else str(v) for v in t.column(i).to_pylist()], pa.string()))

    rewrite_parquet(victim, amount_as_text)
    keep(victim, "decimal_as_text.parquet")
    p = run_cdc("changes", "--config", cfg, check=False)
    assert p.returncode == EXIT_DATA and os.path.basename(victim) in p.stderr, p.stderr
    assert "`amount`" in p.stderr and "decimal" in p.stderr.lower() and "utf8" in p.stderr.lower(), p.stderr
    assert p.stdout == "", "no row of a refused file is emitted"
    assert target_files(warehouse, f"dmg.{name}") == []
    sync_refused(cfg, victim, "`amount`", [])
    assert target_files(warehouse, f"dmg.{name}") == [] or all("metadata" in f for f in target_files(warehouse, f"dmg.{name}")), \
        "nothing of the refused commit is left behind"
    restore(victim)
    run_cdc("sync", "--config", cfg)
    assert target_rows(spark, tgt, COLS) == rows_of(spark, src, COLS)


def test_a_data_file_without_its_required_key_column_is_refused(spark, warehouse, rest_catalog, sql_target, tmp_path):
    name = "dmg_nokey"
    src, tgt, cfg = damaged_source(spark, warehouse, rest_catalog, sql_target, tmp_path, name)
    victim = data_files(spark, src)[0]
    rewrite_parquet(victim, lambda t: t.drop(["id"]))
    keep(victim, "required_column_missing.parquet")
    refused(cfg, victim, "`id`")
    restore(victim)
    run_cdc("sync", "--config", cfg)
    assert target_rows(spark, tgt, COLS) == rows_of(spark, src, COLS)


def test_an_equality_delete_file_without_its_equality_column_is_refused(spark, warehouse, rest_catalog, sql_target, tmp_path):
    """Equality deletes as a writer like Flink leaves them: here those of a `cdc` target (read as a source)."""
    name = "dmg_eq"
    src, tgt, cfg = damaged_source(spark, warehouse, rest_catalog, sql_target, tmp_path, name)
    run_cdc("sync", "--config", cfg)
    spark.sql(f"DELETE FROM {src} WHERE id < 30")
    run_cdc("sync", "--config", cfg)
    # the target, read as a source: its equality deletes decide which rows are live
    tcfg = str(tmp_path / "target-as-source.toml")
    with open(tcfg, "w") as f:
        f.write(f'[source]\ntable = "dmg.{name}"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n')
    good = run_cdc("changes", "--config", tcfg).stdout
    spark.sql(f"REFRESH TABLE {tgt}")
    eq = [local(r.file_path) for r in spark.sql(f"SELECT file_path, content FROM {tgt}.delete_files").collect() if r.content == 2]
    assert eq, "equality deletes expected in the target"
    victim = eq[-1]

    def without_key(t):
        return pa.table({"other": pa.array([1] * t.num_rows, pa.int64())})

    rewrite_parquet(victim, without_key)
    keep(victim, "equality_column_missing.parquet")
    p = run_cdc("changes", "--config", tcfg, check=False)
    assert p.returncode == EXIT_DATA and os.path.basename(victim) in p.stderr and "`id`" in p.stderr, p.stderr
    restore(victim)
    assert run_cdc("changes", "--config", tcfg).stdout == good


def test_flipped_bytes_in_a_checksummed_page_are_refused(spark, warehouse, rest_catalog, sql_target, tmp_path):
    name = "dmg_crc"
    src, tgt, cfg = damaged_source(spark, warehouse, rest_catalog, sql_target, tmp_path, name)
    victim = data_files(spark, src)[0]
    meta = pq.ParquetFile(victim).metadata
    name_col = [i for i in range(meta.num_columns) if meta.schema.column(i).name == "name"][0]
    chunk = meta.row_group(0).column(name_col)
    start, size = chunk.data_page_offset, chunk.total_compressed_size
    shutil.copy(victim, victim + ".orig")
    with open(victim, "r+b") as f:
        # 64 bytes in the second half of the column's data page: past its header, inside the checksummed bytes
        at = start + max(size // 2, 40)
        f.seek(at)
        data = bytearray(f.read(64))
        f.seek(at)
        f.write(bytes(b ^ 0x5A for b in data))
    keep(victim, "page_checksum_mismatch.parquet")
    with pytest.raises(Exception):
        pq.read_table(victim, page_checksum_verification=True)  # pyarrow agrees the file is damaged
    p = run_cdc("changes", "--config", cfg, check=False)
    assert p.returncode == EXIT_DATA and os.path.basename(victim) in p.stderr, p.stderr
    assert "checksum" in p.stderr.lower() or "crc" in p.stderr.lower(), p.stderr
    sync_refused(cfg, victim, "", [])
    restore(victim)
    run_cdc("sync", "--config", cfg)
    assert target_rows(spark, tgt, COLS) == rows_of(spark, src, COLS)


def copy_of_file_from(spark, src, victim, name, amount_type, ddl_change, select):
    """Writes, with Spark, a file of `src`'s format holding the rows of `victim` under a damaged schema — a table
    `db.<name>` with `src`'s columns in `src`'s order (so the same field ids), `amount` of `amount_type`, then
    `ddl_change`, filled by `select` over `victim`'s rows — and puts it in `victim`'s place (the original kept)."""
    wrong = f"{CAT}.db.{name}"
    fmt = spark.sql(f"SHOW TBLPROPERTIES {src} ('write.format.default')").collect()[0].value
    spark.sql(f"DROP TABLE IF EXISTS {wrong}")
    spark.sql(
        f"CREATE TABLE {wrong} (id BIGINT, name STRING, amount {amount_type}, ts TIMESTAMP, cat STRING) USING iceberg "
        f"TBLPROPERTIES ({table_props(2, 'merge-on-read', fmt)})"
    )
    for stmt in ddl_change(wrong):
        spark.sql(stmt)
    spark.sql(f"INSERT INTO {wrong} SELECT {select} FROM {src} WHERE _file LIKE '%{os.path.basename(victim)}'")
    written = data_files(spark, wrong)
    assert len(written) == 1, written
    shutil.copy(victim, victim + ".orig")
    shutil.copy(written[0], victim)


@pytest.mark.parametrize("fmt,partitioned", [("orc", False), ("avro", True)])
def test_orc_and_avro_files_that_do_not_match_their_table_are_refused(spark, warehouse, rest_catalog, sql_target, tmp_path, fmt, partitioned):
    """The same rules for Iceberg's other file formats, on files Spark wrote with field ids: a decimal column stored as
    text under its own field id (a type change Iceberg does not allow), then a file without the required key column."""
    name = f"dmg_{fmt}"
    src, tgt, cfg = damaged_source(spark, warehouse, rest_catalog, sql_target, tmp_path, name, partitioned, fmt)
    victim = [f for f in data_files(spark, src) if f.endswith("." + fmt)][0]

    copy_of_file_from(spark, src, victim, f"{name}_as_text", "STRING", lambda t: [], "id, name, CAST(amount AS STRING), ts, cat")
    p = refused(cfg, victim, "`amount`")
    assert "decimal" in p.stderr.lower(), p.stderr
    assert all("metadata" in f for f in target_files(warehouse, f"dmg.{name}")), "nothing of the refused commit is left behind"
    restore(victim)

    copy_of_file_from(spark, src, victim, f"{name}_no_key", "DECIMAL(10,2)", lambda t: [f"ALTER TABLE {t} DROP COLUMN id"],
                      "name, amount, ts, cat")
    refused(cfg, victim, "`id`")
    restore(victim)
    run_cdc("sync", "--config", cfg)
    assert target_rows(spark, tgt, COLS) == rows_of(spark, src, COLS)
