"""`delete_mode = "equality"` against `delete_mode = "position"`: what each costs to replicate, and to read after.

Source per size N (default 1 M and 10 M rows): a merge-on-read Iceberg v2 table written by Spark, `PARTITIONED BY
bucket(16, id)`, then one MERGE that updates 0.5 % and deletes 0.5 % of the rows (position deletes in the source).
Per mode, one target bootstrapped at the first snapshot; then, measured side by side in one run (release build):
  - `cdc sync` of the MERGE from the same restored start (median wall of `--runs`; CPU and peak RSS by wait4); the
    position mode also reports the target files and rows it read to find the rows it deletes;
  - reading the target after it: Spark `SELECT count(*), sum(amount)` (JVM CPU, least of `--runs`), and pyiceberg
    0.12 `scan().to_arrow()` (which refuses equality deletes);
  - the break-even: after how many full reads position mode's cheaper reads have paid for its dearer sync.
Both targets are checked equal to the source by Spark. Prints Markdown tables for README.md.

    .peers/venv/bin/python benches/delete_modes.py [--rows 1000000 10000000] [--runs 3] [--budget 256MiB]
"""
import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
sys.path.insert(0, HERE)
import spark_workloads  # noqa: E402
from sync_vs_spark import create_orders, differs_from, jvm_stats, measured, orders_rows, syncs_from_start  # noqa: E402

CAT = spark_workloads.CAT
MODES = ("equality", "position")


def write_config(wh, n, mode, budget):
    cfg = os.path.join(wh, f"cdc_{mode}_{n}.toml")
    with open(cfg, "w") as f:
        f.write(f'[source]\ntable = "db.dm_{n}"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
                f'[target]\ntable = "{mode}.dm_{n}"\ndelete_mode = "{mode}"\n[target.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
                f'[engine]\nmemory_budget = "{budget}"\n')
    return cfg


def spark_read(spark, table, runs):
    """Least JVM CPU s and wall s of `SELECT count(*), sum(amount)` over `table`."""
    best = None
    for _ in range(runs):
        spark.sql(f"REFRESH TABLE {table}")
        cpu0, _ = jvm_stats(spark)
        t0 = time.time()
        spark.sql(f"SELECT count(*), sum(amount) FROM {table}").collect()
        r = (jvm_stats(spark)[0] - cpu0, time.time() - t0)
        best = r if best is None or r[0] < best[0] else best
    return best


def pyiceberg_read(wh, mode, n, runs):
    """Least CPU s and wall s of pyiceberg reading the whole target, in a child process; or the error it gives."""
    meta = os.path.join(wh, mode, f"dm_{n}", "metadata")
    latest = max((f for f in os.listdir(meta) if f.endswith(".metadata.json")), key=lambda f: int(f.split(".")[0].lstrip("v")))
    code = ("from pyiceberg.table import StaticTable\n"
            f"t = StaticTable.from_metadata({os.path.join(meta, latest)!r})\n"
            "print(t.scan().to_arrow().num_rows)")
    best = None
    for _ in range(runs):
        t0 = time.time()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            return p.stderr.strip().splitlines()[-1]
        r = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, time.time() - t0)
        best = r if best is None or r[0] < best[0] else best
    return best


def one_size(spark, wh, n, args):
    src = f"{CAT}.db.dm_{n}"
    create_orders(spark, src, 2, "merge-on-read")
    orders_rows(spark, 0, n).writeTo(src).append()
    s1 = spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()[-1].snapshot_id
    spark.sql(
        f"MERGE INTO {src} t USING (SELECT id, id % 200 = 1 AS del FROM range({n}) WHERE id % 200 IN (0, 1)) s ON t.id = s.id "
        "WHEN MATCHED AND s.del THEN DELETE WHEN MATCHED THEN UPDATE SET t.amount = t.amount + 1, t.status = 'changed'"
    )
    out = dict(n=n, modes={})
    for mode in MODES:
        cfg = write_config(wh, n, mode, args.budget)
        boot = measured([args.cdc, "sync", "--config", cfg, "--to-snapshot", str(s1), "--json"])
        meta = os.path.join(wh, mode, f"dm_{n}", "metadata")
        shutil.copytree(meta, meta + ".start")
        runs = syncs_from_start(args.cdc, cfg, meta, args.runs)
        wall, cpu, _, summary = runs[len(runs) // 2]
        tgt = f"{CAT}.{mode}.dm_{n}"
        assert differs_from(spark, src, tgt) == 0, f"{mode} target differs from the source"
        deletes = spark.sql(f"SELECT content, count(*) AS files, sum(record_count) AS rows FROM {tgt}.delete_files GROUP BY content").collect()
        out["modes"][mode] = dict(
            boot=boot[:3], wall=wall, cpu=cpu, rss=max(r[2] for r in runs), summary=summary,
            deletes={r.content: (r.files, r.rows) for r in deletes},
            spark=spark_read(spark, tgt, args.runs), pyiceberg=pyiceberg_read(wh, mode, n, args.runs),
        )
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--cdc", default=os.path.join(ROOT, "target", "release", "cdc"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", default="256MiB")
    ap.add_argument("--keep", metavar="DIR")
    args = ap.parse_args()
    wh = args.keep or tempfile.mkdtemp(prefix="cdc-bench-modes-")
    spark = spark_workloads.spark_session(wh, driver_memory="6g")
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    results = [one_size(spark, wh, n, args) for n in args.rows]
    spark.stop()
    if not args.keep:
        shutil.rmtree(wh, ignore_errors=True)

    print(f"\nengine.memory_budget = {args.budget}; {args.runs} runs each (sync: median wall; reads: least CPU). "
          "MERGE: 0.5 % of the rows updated, 0.5 % deleted.\n")
    print("| target rows | delete_mode | `cdc sync` wall s | CPU s | CPU / equality | peak RSS MB | target files read to locate | "
          "delete files written (rows) | Spark read CPU s (wall s) | pyiceberg read CPU s (wall s) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        eq = r["modes"]["equality"]
        for mode, m in r["modes"].items():
            dels = ", ".join(f"{'equality' if c == 2 else 'position'} {f} ({rows:,})" for c, (f, rows) in sorted(m["deletes"].items()))
            py = m["pyiceberg"]
            py = f"{py[0]:.2f} ({py[1]:.2f})" if isinstance(py, tuple) else f"refused: `{py[:60]}`"
            print(f"| {r['n']:,} | {mode} | {m['wall']:.2f} | {m['cpu']:.2f} | {m['cpu'] / eq['cpu']:.2f} | {m['rss']:.0f} "
                  f"| {m['summary'].get('lookup_files_read', 0)} | {dels} | {m['spark'][0]:.2f} ({m['spark'][1]:.2f}) | {py} |")
    print()
    for r in results:
        eq, pos = r["modes"]["equality"], r["modes"]["position"]
        extra = pos["cpu"] - eq["cpu"]
        saved = eq["spark"][0] - pos["spark"][0]
        when = f"after {extra / saved:.1f} full Spark reads" if saved > 0 and extra > 0 else ("at once" if extra <= 0 else "never (reads cost the same)")
        print(f"{r['n']:,} rows: position mode costs {extra:+.2f} CPU s more to sync and saves {saved:.2f} CPU s per Spark read: it wins {when}.")


if __name__ == "__main__":
    main()
