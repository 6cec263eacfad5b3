"""`cdc changes` on the same table written as Parquet, ORC and Avro: what reading the other formats costs.

Per format, Spark writes the same N rows (default 1 M; `bucket(8, id)`, merge-on-read v2) with
`write.format.default` set to that format, then one MERGE updating 5 % and deleting 1 % of the rows (position-delete
files in the same format). Measured side by side in one run (release build, CPU and peak RSS by wait4, least CPU of
`--runs`): `cdc changes` of the bootstrap snapshot (every row: a full read) and of the MERGE (the rows the deletes
touch), written as Parquet. The change counts are checked equal across formats. Prints a Markdown table for README.md.

    .peers/venv/bin/python benches/formats.py [--rows 1000000] [--runs 3]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
sys.path.insert(0, HERE)
import spark_workloads  # noqa: E402
from sync_vs_spark import create_orders, measured, orders_rows  # noqa: E402

CAT = spark_workloads.CAT
FORMATS = ("parquet", "orc", "avro")


def one_format(spark, wh, n, fmt, args):
    t = f"{CAT}.db.f_{fmt}"
    create_orders(spark, t, 2, "merge-on-read", buckets=8, fmt=fmt)
    orders_rows(spark, 0, n).writeTo(t).append()
    snap = lambda: spark.sql(f"SELECT snapshot_id FROM {t}.snapshots ORDER BY committed_at").collect()[-1].snapshot_id  # noqa: E731
    s1 = snap()
    spark.sql(
        f"MERGE INTO {t} t USING (SELECT id, id % 100 = 5 AS del FROM range({n}) WHERE id % 100 IN (0, 1, 2, 3, 4, 5)) s ON t.id = s.id "
        "WHEN MATCHED AND s.del THEN DELETE WHEN MATCHED THEN UPDATE SET t.amount = t.amount + 1, t.status = 'changed'"
    )
    s2 = snap()
    data_bytes = sum(r.file_size_in_bytes for r in spark.sql(f"SELECT file_size_in_bytes FROM {t}.files VERSION AS OF {s1}").collect())
    cfg = os.path.join(wh, f"{fmt}.toml")
    with open(cfg, "w") as f:
        f.write(f'[source]\ntable = "db.f_{fmt}"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n')
    out = os.path.join(wh, f"{fmt}.parquet")
    res = {"bytes": data_bytes}
    for label, rng in (("full", ["--to-snapshot", str(s1)]), ("merge", ["--from-snapshot", str(s1), "--to-snapshot", str(s2)])):
        runs = [measured([args.cdc, "changes", "--config", cfg, *rng, "--format", "parquet", "--output", out, "--log", "warn"]) for _ in range(args.runs)]
        best = min(runs, key=lambda r: r[1])
        rows = spark.read.parquet(out).groupBy("_change_type").count().collect()
        res[label] = (best[0], best[1], max(r[2] for r in runs), {r["_change_type"]: r["count"] for r in rows})
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cdc", default=os.path.join(ROOT, "target", "release", "cdc"))
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    wh = tempfile.mkdtemp(prefix="cdc-bench-formats-")
    spark = spark_workloads.spark_session(wh, driver_memory="4g")
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    results = {fmt: one_format(spark, wh, args.rows, fmt, args) for fmt in FORMATS}
    spark.stop()
    shutil.rmtree(wh, ignore_errors=True)
    counts = {fmt: (r["full"][3], r["merge"][3]) for fmt, r in results.items()}
    assert len({json.dumps(c, sort_keys=True) for c in counts.values()}) == 1, f"formats disagree: {counts}"
    print(f"\n{args.rows:,} rows, `bucket(8, id)`; MERGE: 5 % updated, 1 % deleted (position deletes in the table's format); "
          f"least CPU of {args.runs} runs.\n")
    print("| format | data MB | full read: wall s | CPU s | rows/s per CPU s | peak RSS MB | MERGE: wall s | CPU s | peak RSS MB | CPU / Parquet (full, MERGE) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    base = results["parquet"]
    for fmt, r in results.items():
        fw, fc, frss, _ = r["full"]
        mw, mc, mrss, _ = r["merge"]
        print(f"| {fmt} | {r['bytes'] / 1e6:.1f} | {fw:.2f} | {fc:.2f} | {args.rows / fc:,.0f} | {frss:.0f} | {mw:.2f} | {mc:.2f} | {mrss:.0f} "
              f"| {fc / base['full'][1]:.2f}, {mc / base['merge'][1]:.2f} |")
    print(f"\nchange rows: {counts['parquet']}")


if __name__ == "__main__":
    main()
