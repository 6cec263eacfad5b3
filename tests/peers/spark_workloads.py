"""Writes real Iceberg tables with Apache Spark 3.5 + Iceberg 1.10 (catalog type=hadoop) for the peer tests.

Every workload is a list of SQL statements; each statement that changes the table makes one snapshot. The tables
cover: copy-on-write v2/v3, merge-on-read v2 (position deletes) / v3 (deletion vectors), UPDATE, DELETE, MERGE INTO with
inserts/updates/deletes, re-insert of a deleted key, rewrite_data_files compaction, a table without identifier fields,
a partitioned table (bucket + days) and a column added mid-history.
"""
import os
import sys

CAT = "spark_cat"


def spark_session(warehouse, extra_catalogs=None, driver_memory="1g"):
    os.environ.setdefault("TZ", "UTC")
    from pyspark.sql import SparkSession

    here = os.path.dirname(os.path.abspath(__file__))
    peers = os.environ.get("PEERS_DIR", os.path.join(here, "..", "..", ".peers"))
    jars = [os.path.join(peers, "jars", j) for j in sorted(os.listdir(os.path.join(peers, "jars"))) if j.endswith(".jar")]
    b = SparkSession.builder
    for name, props in (extra_catalogs or {}).items():
        b = b.config(f"spark.sql.catalog.{name}", "org.apache.iceberg.spark.SparkCatalog")
        for k, v in props.items():
            b = b.config(f"spark.sql.catalog.{name}.{k}", v)
    return (
        b.master("local[2]")
        .appName("iceberg-cdc-peer")
        .config("spark.jars", ",".join(jars))
        .config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
        .config(f"spark.sql.catalog.{CAT}", "org.apache.iceberg.spark.SparkCatalog")
        .config(f"spark.sql.catalog.{CAT}.type", "hadoop")
        .config(f"spark.sql.catalog.{CAT}.warehouse", warehouse)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", driver_memory)
        .getOrCreate()
    )


def table_props(version, mode, fmt=None):
    props = {"format-version": str(version)}
    for op in ("delete", "update", "merge"):
        props[f"write.{op}.mode"] = mode
    if fmt:
        # data files, and (by default) position- and equality-delete files too
        props["write.format.default"] = fmt
    return ", ".join(f"'{k}'='{v}'" for k, v in props.items())


def rows(start, end, day0=1):
    vals = []
    for i in range(start, end):
        vals.append(
            f"({i}, 'name-{i}', CAST({i * 10 + 0.25} AS DECIMAL(10,2)), "
            f"TIMESTAMP '2024-01-{(i % 5) + day0:02d} 10:{i % 60:02d}:00', '{['a', 'b', 'c'][i % 3]}')"
        )
    return ", ".join(vals)


def workload(t, version, mode, keyed=True, partitioned=False, fmt=None):
    """Statements for one table; `t` is the full table name; `fmt` the file format (default Parquet)."""
    part = "PARTITIONED BY (bucket(4, id), days(ts))" if partitioned else ""
    stmts = [
        f"CREATE TABLE {t} (id BIGINT NOT NULL, name STRING, amount DECIMAL(10,2), ts TIMESTAMP, cat STRING) "
        f"USING iceberg {part} TBLPROPERTIES ({table_props(version, mode, fmt)})",
    ]
    if keyed:
        stmts.append(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
    stmts += [
        f"INSERT INTO {t} VALUES {rows(0, 20)}",
        f"INSERT INTO {t} VALUES {rows(20, 30)}",
        f"UPDATE {t} SET amount = amount + 1, name = concat(name, '-u') WHERE id % 4 = 0",
        f"DELETE FROM {t} WHERE id IN (3, 7, 21)",
        f"MERGE INTO {t} t USING (SELECT * FROM VALUES (1, 'm1'), (5, 'm5'), (9, 'del'), (40, 'm40'), (41, 'm41') "
        f"AS s(id, tag)) s ON t.id = s.id "
        f"WHEN MATCHED AND s.tag = 'del' THEN DELETE "
        f"WHEN MATCHED THEN UPDATE SET t.name = s.tag "
        f"WHEN NOT MATCHED THEN INSERT (id, name, amount, ts, cat) VALUES (s.id, s.tag, 1.00, TIMESTAMP '2024-01-03 00:00:00', 'z')",
        f"INSERT INTO {t} VALUES (3, 'again-3', 3.30, TIMESTAMP '2024-01-02 03:03:03', 'r')",
        f"CALL {t.split('.', 1)[0]}.system.rewrite_data_files(table => '{t.split('.', 1)[1]}', options => map('min-input-files','1','rewrite-all','true'))",
        f"ALTER TABLE {t} ADD COLUMN note STRING",
        f"UPDATE {t} SET note = 'n', cat = 'q' WHERE id IN (2, 10, 40)",
        f"INSERT INTO {t} VALUES (50, 'fifty', 50.50, TIMESTAMP '2024-01-05 05:05:05', 'b', 'new')",
    ]
    if not keyed:
        # duplicates are legal without identifier fields: a second identical row, then delete one kind
        stmts += [
            f"INSERT INTO {t} VALUES (50, 'fifty', 50.50, TIMESTAMP '2024-01-05 05:05:05', 'b', 'new')",
            f"DELETE FROM {t} WHERE id = 11",
        ]
    return stmts


TABLES = {
    # name: (format version, write mode, keyed, partitioned)
    "cow_v2": (2, "copy-on-write", True, False),
    "cow_v3": (3, "copy-on-write", True, False),
    "mor_v2": (2, "merge-on-read", True, False),
    "mor_v3": (3, "merge-on-read", True, False),
    "nokey_v2": (2, "merge-on-read", False, False),
    "part_v2": (2, "merge-on-read", True, True),
    "part_cow_v3": (3, "copy-on-write", True, True),
}


def create(spark, t, version, mode, keyed=True, partitioned=False, fmt=None):
    """(Re)creates table `t` (any catalog) through Spark with the history of `workload`."""
    spark.sql(f"DROP TABLE IF EXISTS {t}")
    for s in workload(t, version, mode, keyed, partitioned, fmt):
        spark.sql(s)


def build(spark, names):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    for name in names:
        version, mode, keyed, partitioned = TABLES[name]
        create(spark, f"{CAT}.db.{name}", version, mode, keyed, partitioned)


if __name__ == "__main__":
    wh = sys.argv[1]
    names = sys.argv[2:] or list(TABLES)
    s = spark_session(wh)
    build(s, names)
    for n in names:
        print(n, [r.snapshot_id for r in s.sql(f"SELECT snapshot_id FROM {CAT}.db.{n}.snapshots").collect()])
