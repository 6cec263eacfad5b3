"""Source tables whose files are not Parquet (Spark 3.5 + Iceberg 1.10 with `write.format.default` = orc / avro):
`cdc` names the file's format and what to do, never calls the file corrupt, exits 8 and writes nothing."""
import os

import pytest

from conftest import run_cdc, target_section, write_config
from spark_workloads import CAT


@pytest.mark.parametrize("fmt", ["orc", "avro"])
def test_a_table_in_another_format_is_named_not_called_corrupt(spark, warehouse, rest_catalog, sql_target, tmp_path, fmt):
    name = f"fmt_{fmt}"
    t = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT NOT NULL, name STRING) USING iceberg "
        f"TBLPROPERTIES ('format-version'='2', 'write.format.default'='{fmt}', 'write.delete.mode'='merge-on-read')"
    )
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    spark.sql(f"DELETE FROM {t} WHERE id = 1")
    section, _ = target_section("hadoop", f"fmt.{name}", warehouse, rest_catalog, sql_target)
    cfg = write_config(str(tmp_path / "cdc.toml"), f"db.{name}", warehouse, target=section)
    for args in (["changes", "--config", cfg], ["sync", "--config", cfg]):
        p = run_cdc(*args, check=False)
        assert p.returncode == 8, (args, p.returncode, p.stderr)
        assert f"is {fmt.upper()}" in p.stderr and "not corrupt" in p.stderr and "Parquet" in p.stderr, p.stderr
        assert "Corrupt footer" not in p.stderr, p.stderr
    # nothing was written: the target has no snapshot
    meta = os.path.join(warehouse, "fmt", name, "metadata")
    assert not os.path.isdir(meta) or not any(f.startswith("snap-") for f in os.listdir(meta))
