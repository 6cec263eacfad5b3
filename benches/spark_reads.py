"""Spark reading the targets of the long-run bench, against a freshly compacted copy of each, in one run.

`cargo bench --bench maintenance -- ... --keep DIR` leaves its targets in `DIR/target-<mode>` (hadoop warehouses,
table `replica.orders`). For each, in one Spark session (Iceberg 1.10.1, local[2]): `SELECT count(*)` and a point
lookup (`WHERE id = <a key the bench updated>`), each the median wall of `--runs` after one warm-up; then the same on
a copy written by Spark (`CREATE TABLE ... AS SELECT`: one snapshot, no delete file, files as Spark sizes them — what
`rewrite_data_files` + `expire_snapshots` would leave). The two must hold the same rows. Prints a Markdown table for
README.md ("Target health over a long run").

    .peers/venv/bin/python benches/spark_reads.py DIR [--runs 5]
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "peers"))
import spark_workloads  # noqa: E402


def timed(spark, sql, runs):
    """Median wall seconds of `runs` executions of `sql` after one warm-up, and its result."""
    result = spark.sql(sql).collect()
    walls = []
    for _ in range(runs):
        t0 = time.time()
        spark.sql(sql).collect()
        walls.append(time.time() - t0)
    return statistics.median(walls), result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    modes = sorted(d[len("target-"):] for d in os.listdir(a.dir) if d.startswith("target-"))
    if not modes:
        sys.exit(f"no target-<mode> warehouse under {a.dir}: run the maintenance bench with --keep {a.dir}")
    catalogs = {f"t_{m.replace('-', '_')}": {"type": "hadoop", "warehouse": os.path.join(a.dir, f"target-{m}")} for m in modes}
    spark = spark_workloads.spark_session(os.path.join(a.dir, "spark-wh"), extra_catalogs=catalogs, driver_memory="2g")
    print("| target | Spark `count(*)` s | point lookup s | on a compacted copy: `count(*)` s | point lookup s | ratio (count / lookup) |")
    print("|---|---:|---:|---:|---:|---:|")
    for m, cat in zip(modes, catalogs):
        t = f"{cat}.replica.orders"
        files = spark.sql(f"SELECT count(*) FROM {t}.files").collect()[0][0]
        count_s, count = timed(spark, f"SELECT count(*) FROM {t}", a.runs)
        lookup_s, row = timed(spark, f"SELECT * FROM {t} WHERE id = 3", a.runs)
        spark.sql(f"DROP TABLE IF EXISTS {t}_copy")
        spark.sql(f"CREATE TABLE {t}_copy USING iceberg AS SELECT * FROM {t}")
        ccount_s, ccount = timed(spark, f"SELECT count(*) FROM {t}_copy", a.runs)
        clookup_s, crow = timed(spark, f"SELECT * FROM {t}_copy WHERE id = 3", a.runs)
        assert count == ccount and sorted(map(tuple, row)) == sorted(map(tuple, crow)), f"{t}: the copy differs"
        spark.sql(f"DROP TABLE {t}_copy PURGE")
        print(f"| {m} ({count[0][0]} rows, {files} data and delete files) | {count_s:.3f} | {lookup_s:.3f} | {ccount_s:.3f} | {clookup_s:.3f} | "
              f"{count_s / ccount_s:.2f} / {lookup_s / clookup_s:.2f} |")
    spark.stop()


if __name__ == "__main__":
    main()
