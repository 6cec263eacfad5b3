"""Sync benchmark: `cdc sync` against the way a Spark user does the same job, in one run.

Source: a copy-on-write Iceberg table written by Spark 3.5 + Iceberg 1.10 with N rows (default 1M), then one MERGE
that updates 10 % and deletes 2 % of the rows (copy-on-write: every data file is rewritten).
Both targets start as a copy of the first snapshot; then, measured:
  - cdc:   `cdc sync` (release build) → merge-on-read commit (data files + equality deletes); measured with wait4
  - Spark: create_changelog_view(compute_updates) over the range + MERGE INTO the target (local[2], JVM already up)
Both targets are then compared row for row. Prints a Markdown table for README.md.

    .peers/venv/bin/python benches/sync_vs_spark.py [--rows N]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
import spark_workloads  # noqa: E402

CAT = spark_workloads.CAT


def dir_size(path):
    total, files = 0, 0
    for dp, _, fs in os.walk(path):
        for f in fs:
            if f.endswith(".parquet") or f.endswith(".puffin"):
                total += os.path.getsize(os.path.join(dp, f))
                files += 1
    return total, files


def jvm_stats(spark):
    """CPU seconds and peak RSS (MB) of the Spark JVM (driver = executor in local mode)."""
    pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(parts[11]) + int(parts[12])) / ticks
    hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return cpu, hwm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cdc", default=os.path.join(ROOT, "target", "release", "cdc"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="print the warehouse and stop before the measured runs")
    args = ap.parse_args()
    n = args.rows
    wh = tempfile.mkdtemp(prefix="cdc-bench-")
    spark = spark_workloads.spark_session(wh)
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    src = f"{CAT}.db.orders"
    spark.sql(
        f"CREATE TABLE {src} (id BIGINT NOT NULL, customer STRING, amount DECIMAL(12,2), updated_at TIMESTAMP, quantity INT, status STRING) "
        "USING iceberg TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='copy-on-write', 'write.update.mode'='copy-on-write', 'write.delete.mode'='copy-on-write')"
    )
    spark.sql(f"ALTER TABLE {src} SET IDENTIFIER FIELDS id")
    spark.range(n).selectExpr(
        "id", "concat('customer-', lpad(cast(id % 100000 as string), 8, '0')) as customer",
        "cast((id * 37 % 10000000) / 100 as decimal(12,2)) as amount",
        "timestamp_micros(1700000000000000 + id * 1000) as updated_at", "cast(id % 97 as int) as quantity",
        "element_at(array('new','paid','shipped','done'), cast(id % 4 as int) + 1) as status",
    ).repartition(4).writeTo(src).append()
    s1 = spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()[-1].snapshot_id
    spark.sql(
        f"MERGE INTO {src} t USING (SELECT id, id % 50 = 1 AS del FROM range({n}) WHERE id % 10 = 0 OR id % 50 = 1) s ON t.id = s.id "
        "WHEN MATCHED AND s.del THEN DELETE WHEN MATCHED THEN UPDATE SET t.amount = t.amount + 1, t.status = 'changed'"
    )
    s2 = spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()[-1].snapshot_id
    src_bytes, src_files = dir_size(os.path.join(wh, "db", "orders", "data"))
    changed = spark.sql(f"SELECT count(*) FROM {src} VERSION AS OF {s1}").collect()[0][0] - spark.sql(f"SELECT count(*) FROM {src} VERSION AS OF {s1} WHERE id % 10 <> 0 AND id % 50 <> 1").collect()[0][0]

    # --- cdc: bootstrap at s1 (not measured), then the measured incremental sync
    cfg = os.path.join(wh, "cdc.toml")
    with open(cfg, "w") as f:
        f.write(f'[source]\ntable = "db.orders"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
                f'[target]\ntable = "cdc_target.orders"\n[target.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
                f'[engine]\nread_concurrency = 2\n')
    subprocess.run([args.cdc, "sync", "--config", cfg, "--to-snapshot", str(s1)], check=True, capture_output=True)
    if args.keep:
        print(f"kept {wh}: run `{args.cdc} sync --config {cfg}`")
        return
    # five measured runs, each from the same starting point (the target's metadata restored in between)
    import shutil
    meta = os.path.join(wh, "cdc_target", "orders", "metadata")
    shutil.copytree(meta, meta + ".start")
    time.sleep(2)  # let the JVM settle after the MERGE
    runs = []
    for i in range(args.runs):
        shutil.rmtree(meta)
        shutil.copytree(meta + ".start", meta)
        t0 = time.time()
        proc = subprocess.Popen([args.cdc, "sync", "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.time() - t0
        assert os.waitstatus_to_exitcode(status) == 0, proc.stderr.read()
        runs.append((wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024))
        commit_line = [l for l in proc.stderr.read().splitlines() if "-> target snapshot" in l][-1]
    runs.sort()
    cdc_wall, cdc_cpu, _ = runs[len(runs) // 2]
    cdc_p95 = runs[-1][0]
    cdc_rss = max(r[2] for r in runs)

    # --- Spark: the same job as a Spark user writes it
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.spark_target")
    spark.sql(f"CREATE TABLE {CAT}.spark_target.orders USING iceberg TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read') AS SELECT * FROM {src} VERSION AS OF {s1}")
    cpu0, _ = jvm_stats(spark)
    t0 = time.time()
    spark.sql(
        f"CALL {CAT}.system.create_changelog_view(table => 'db.orders', options => map('start-snapshot-id', '{s1}', 'end-snapshot-id', '{s2}'), "
        "changelog_view => 'orders_changes', compute_updates => true, identifier_columns => array('id'))"
    )
    spark.sql(
        f"MERGE INTO {CAT}.spark_target.orders t USING (SELECT * FROM orders_changes WHERE _change_type IN ('DELETE', 'UPDATE_AFTER', 'INSERT')) c "
        "ON t.id = c.id WHEN MATCHED AND c._change_type = 'DELETE' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET t.customer = c.customer, t.amount = c.amount, t.updated_at = c.updated_at, t.quantity = c.quantity, t.status = c.status "
        "WHEN NOT MATCHED AND c._change_type <> 'DELETE' THEN INSERT (id, customer, amount, updated_at, quantity, status) VALUES (c.id, c.customer, c.amount, c.updated_at, c.quantity, c.status)"
    )
    spark_wall = time.time() - t0
    cpu1, spark_rss = jvm_stats(spark)
    spark_cpu = cpu1 - cpu0

    # both targets equal the source
    cols = "id, customer, amount, updated_at, quantity, status"
    diff_cdc = spark.sql(f"SELECT {cols} FROM {src} EXCEPT ALL SELECT {cols} FROM {CAT}.cdc_target.orders").count() + spark.sql(f"SELECT {cols} FROM {CAT}.cdc_target.orders EXCEPT ALL SELECT {cols} FROM {src}").count()
    diff_spark = spark.sql(f"SELECT {cols} FROM {src} EXCEPT ALL SELECT {cols} FROM {CAT}.spark_target.orders").count()
    assert diff_cdc == 0 and diff_spark == 0, (diff_cdc, diff_spark)

    gb = src_bytes / 1e9
    print(f"\nWorkload: {n} rows ({src_bytes / 1e6:.1f} MB in {src_files} Parquet files after the MERGE), one copy-on-write MERGE updating {n // 10} and deleting {n // 50} rows ({changed} changed keys); both targets verified equal to the source.\n")
    print("| run | wall s (p50 / max) | rows/s (source rows) | changed rows/s | CPU s | CPU s per GB | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    print(f"| `cdc sync` ({args.runs} runs) | {cdc_wall:.2f} / {cdc_p95:.2f} | {n / cdc_wall:.0f} | {changed / cdc_wall:.0f} | {cdc_cpu:.2f} | {cdc_cpu / gb:.1f} | {cdc_rss:.0f} |")
    print(f"| Spark changelog view + MERGE INTO (local[2], warm JVM, 1 run) | {spark_wall:.2f} | {n / spark_wall:.0f} | {changed / spark_wall:.0f} | {spark_cpu:.2f} | {spark_cpu / gb:.1f} | {spark_rss:.0f} (JVM) |")
    print(f"\n`cdc sync` is {spark_wall / cdc_wall:.1f}x Spark's throughput. Its commit: {commit_line.split(': ', 1)[1]}")
    spark.stop()


if __name__ == "__main__":
    main()
