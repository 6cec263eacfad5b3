"""Sync benchmark at several sizes: `cdc sync` against a raw scan and against the way a Spark user does the job.

Source per size N (default 1 M and 10 M rows): a copy-on-write Iceberg v2 table written by Spark 3.5 + Iceberg 1.10,
`PARTITIONED BY bucket(16, id)` (16 data files), then one MERGE that updates 6 %, deletes 2 % and inserts 2 % of the
rows — every data file is rewritten. Measured, side by side in one run:
  - bootstrap: `cdc sync --to-snapshot S1` into an empty target (the initial copy; CPU, peak RSS)
  - cdc:       `cdc sync` of the MERGE (release build, default config) into a merge-on-read target, from the same
               restored start for every run; CPU, wall, peak RSS by wait4; source bytes read as the sync reports them
               against the bytes of the files involved (the 16 removed + 16 added data files)
  - raw scan:  DuckDB (1 thread) decoding every column of the same 32 files and hashing every row — the fair limit
  - Spark:     create_changelog_view(compute_updates) + MERGE INTO a copy (local[2], JVM warm)
Then, per size, the sparse merge-on-read case (`sparse_mor`): a v3 merge-on-read copy of the table, a Spark UPDATE of
0.1 %, a DELETE of 0.01 % and one of ten rows (deletion vectors, no data file rewritten), `cdc sync` of the
three snapshots (also with each `--baseline` binary, alternately) against a DuckDB raw scan of the files the DVs touch.
Both targets are checked equal to the source. Prints Markdown tables for README.md.

    .peers/venv/bin/python benches/sync_vs_spark.py [--rows 1000000 10000000] [--runs 3] [--budget 256MiB]
        [--baseline OTHER_CDC ...] [--no-mor] [--spark-max-rows N] [--keep DIR]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
import spark_workloads  # noqa: E402

CAT = spark_workloads.CAT
COLS = "id, customer, amount, updated_at, quantity, status"


def jvm_stats(spark):
    """CPU seconds and peak RSS (MB) of the Spark JVM (driver = executor in local mode)."""
    pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    cpu = (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return cpu, hwm


def measured(cmd):
    """Runs `cmd` as a child measured by wait4: (wall s, CPU s, peak RSS MB, stdout text, stderr text)."""
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=out, stderr=err)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.time() - t0
    out.seek(0)
    err.seek(0)
    errors = err.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{cmd[0]} failed: {errors}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, out.read(), errors


def write_config(wh, name, budget):
    """A cdc config syncing hadoop table `db.<name>` of `wh` into `cdc_target.<name>`; returns its path."""
    cfg = os.path.join(wh, f"cdc_{name}.toml")
    with open(cfg, "w") as f:
        f.write(f'[source]\ntable = "db.{name}"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
                f'[target]\ntable = "cdc_target.{name}"\n[target.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
                f'[engine]\nmemory_budget = "{budget}"\n')
    return cfg


def raw_scan(files, runs):
    """DuckDB on one thread decoding every column of `files` and hashing every row: the measurement of least CPU."""
    sql = f"SELECT count(*), bit_xor(hash({COLS})) FROM read_parquet({sorted(files)!r})"
    code = f"import duckdb\ncon = duckdb.connect()\ncon.execute('SET threads=1')\nprint(con.execute({sql!r}).fetchall())"
    return min((measured([sys.executable, "-c", code]) for _ in range(runs)), key=lambda r: r[1])


def files_of(spark, table, snapshot):
    return {r.file_path.replace("file:", ""): r.file_size_in_bytes for r in spark.sql(f"SELECT file_path, file_size_in_bytes FROM {table}.files VERSION AS OF {snapshot}").collect()}


def differs_from(spark, a, b):
    """Rows in one table and not the other (both ways, duplicates counted)."""
    return spark.sql(f"SELECT {COLS} FROM {a} EXCEPT ALL SELECT {COLS} FROM {b}").count() + spark.sql(f"SELECT {COLS} FROM {b} EXCEPT ALL SELECT {COLS} FROM {a}").count()


def create_orders(spark, t, version, mode, buckets=16, fmt=None):
    """The benches' `orders` table (`COLS`, keyed by `id`, `bucket(buckets, id)`), written in `mode` (copy-on-write /
    merge-on-read) and file format `fmt` (default Parquet)."""
    props = {"format-version": str(version), **{f"write.{op}.mode": mode for op in ("merge", "update", "delete")}}
    if fmt:
        props["write.format.default"] = fmt
    tblprops = ", ".join(f"'{k}'='{v}'" for k, v in props.items())
    spark.sql(
        f"CREATE TABLE {t} (id BIGINT NOT NULL, customer STRING, amount DECIMAL(12,2), updated_at TIMESTAMP, quantity INT, status STRING) "
        f"USING iceberg PARTITIONED BY (bucket({buckets}, id)) TBLPROPERTIES ({tblprops})"
    )
    spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")


def orders_rows(spark, lo, hi):
    """Rows `lo..hi` of the `orders` table, as a DataFrame."""
    return spark.range(lo, hi).selectExpr(
        "id", "concat('customer-', lpad(cast(id % 100000 as string), 8, '0')) as customer",
        "cast((id * 37 % 10000000) / 100 as decimal(12,2)) as amount",
        "timestamp_micros(1700000000000000 + id * 1000) as updated_at", "cast(id % 97 as int) as quantity",
        "element_at(array('new','paid','shipped','done'), cast(id % 4 as int) + 1) as status",
    )


def syncs_from_start(cdc, cfg, meta, runs):
    """`cdc sync --json` `runs` times, each from the target metadata saved beside `meta` (`meta`.start): (wall s,
    CPU s, peak RSS MB, summary) per run, fastest first."""
    out = []
    for _ in range(runs):
        shutil.rmtree(meta)
        shutil.copytree(meta + ".start", meta)
        wall, cpu, rss, stdout, _ = measured([cdc, "sync", "--config", cfg, "--json"])
        out.append((wall, cpu, rss, json.loads(stdout)))
    return sorted(out, key=lambda r: r[0])


def one_size(spark, wh, n, args):
    src = f"{CAT}.db.orders_{n}"
    create_orders(spark, src, 2, "copy-on-write")
    rows = lambda lo, hi: orders_rows(spark, lo, hi)  # noqa: E731
    rows(0, n).writeTo(src).append()
    s1 = spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()[-1].snapshot_id
    rows(n, n + n // 50).createOrReplaceTempView("new_rows")
    spark.sql(
        f"MERGE INTO {src} t USING (SELECT id, id % 100 IN (6, 7) AS del FROM range({n}) WHERE id % 100 < 8 "
        f"UNION ALL SELECT id, false FROM new_rows) s ON t.id = s.id "
        "WHEN MATCHED AND s.del THEN DELETE WHEN MATCHED THEN UPDATE SET t.amount = t.amount + 1, t.status = 'changed' "
        "WHEN NOT MATCHED THEN INSERT (id, customer, amount, updated_at, quantity, status) VALUES (s.id, 'new', 1.00, timestamp'2026-01-01 00:00:00', 1, 'new')"
    )
    s2 = spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()[-1].snapshot_id
    before, after = files_of(spark, src, s1), files_of(spark, src, s2)
    involved = {p: b for p, b in {**before, **after}.items() if (p in before) != (p in after)}
    involved_bytes = sum(involved.values())

    # --- cdc: bootstrap at s1 (measured once), then the incremental sync of the MERGE (measured runs)
    cfg = write_config(wh, f"orders_{n}", args.budget)
    boot = measured([args.cdc, "sync", "--config", cfg, "--to-snapshot", str(s1), "--json"])
    boot_read = json.loads(boot[3])["source_bytes_read"]
    meta = os.path.join(wh, "cdc_target", f"orders_{n}", "metadata")
    shutil.copytree(meta, meta + ".start")
    time.sleep(2)  # let the JVM settle after the MERGE
    runs = syncs_from_start(args.cdc, cfg, meta, args.runs)
    cdc_wall, cdc_cpu, _, summary = runs[len(runs) // 2]
    cdc_rss = max(r[2] for r in runs)

    # --- raw scan: DuckDB, one thread, every column of the same files decoded and every row hashed; and
    # `cdc changes` of the same MERGE to a Parquet file, alternating with it so both see the same host
    changes, raws = [], []
    out = os.path.join(wh, f"changes_{n}.parquet")
    for _ in range(args.runs):
        changes.append(measured([args.cdc, "changes", "--config", cfg, "--from-snapshot", str(s1), "--to-snapshot", str(s2), "--format", "parquet", "--output", out]))
        raws.append(raw_scan(involved, 1))
    raw = min(raws, key=lambda r: r[1])
    changes = min(changes, key=lambda r: r[1])

    # --- Spark: the same job as a Spark user writes it (skipped above --spark-max-rows)
    if args.spark_max_rows is not None and n > args.spark_max_rows:
        assert differs_from(spark, src, f"{CAT}.cdc_target.orders_{n}") == 0
        return dict(n=n, s1=s1, involved_files=len(involved), involved_bytes=involved_bytes, boot=boot, boot_read=boot_read, cdc_wall=cdc_wall, cdc_p100=runs[-1][0],
                    cdc_cpu=cdc_cpu, cdc_rss=cdc_rss, summary=summary, raw=raw, changes=changes, spark_wall=None, spark_cpu=None, spark_rss=None)
    tgt = f"{CAT}.spark_target.orders_{n}"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.spark_target")
    spark.sql(f"CREATE TABLE {tgt} USING iceberg PARTITIONED BY (bucket(16, id)) TBLPROPERTIES ('format-version'='2', 'write.merge.mode'='merge-on-read') AS SELECT * FROM {src} VERSION AS OF {s1}")
    cpu0, _ = jvm_stats(spark)
    t0 = time.time()
    spark.sql(
        f"CALL {CAT}.system.create_changelog_view(table => 'db.orders_{n}', options => map('start-snapshot-id', '{s1}', 'end-snapshot-id', '{s2}'), "
        f"changelog_view => 'changes_{n}', compute_updates => true, identifier_columns => array('id'))"
    )
    spark.sql(
        f"MERGE INTO {tgt} t USING (SELECT * FROM changes_{n} WHERE _change_type IN ('DELETE', 'UPDATE_AFTER', 'INSERT')) c "
        "ON t.id = c.id WHEN MATCHED AND c._change_type = 'DELETE' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET t.customer = c.customer, t.amount = c.amount, t.updated_at = c.updated_at, t.quantity = c.quantity, t.status = c.status "
        f"WHEN NOT MATCHED AND c._change_type <> 'DELETE' THEN INSERT ({COLS}) VALUES (c.id, c.customer, c.amount, c.updated_at, c.quantity, c.status)"
    )
    spark_wall = time.time() - t0
    cpu1, spark_rss = jvm_stats(spark)
    spark_cpu = cpu1 - cpu0

    # both targets equal the source
    assert differs_from(spark, src, f"{CAT}.cdc_target.orders_{n}") == 0 and differs_from(spark, src, tgt) == 0
    return dict(n=n, s1=s1, involved_files=len(involved), involved_bytes=involved_bytes, boot=boot, boot_read=boot_read, cdc_wall=cdc_wall, cdc_p100=runs[-1][0],
                cdc_cpu=cdc_cpu, cdc_rss=cdc_rss, summary=summary, raw=raw, changes=changes, spark_wall=spark_wall, spark_cpu=spark_cpu, spark_rss=spark_rss)


def sparse_mor(spark, wh, n, src, s1, args):
    """A merge-on-read v3 copy of the table at s1, then a sparse UPDATE (0.1 % of the rows), a DELETE (0.01 %) and a
    DELETE of ten rows: data files get deletion vectors and stay. Measured: `cdc sync` of the three snapshots (each binary of --cdc and
    --baseline alternately, from the same restored start) against a raw scan of the files the DVs touch — what a
    whole-file diff has to read — and whether Spark's changelog view takes the range at all."""
    mor = f"{CAT}.db.mor_{n}"
    create_orders(spark, mor, 3, "merge-on-read")
    spark.sql(f"INSERT INTO {mor} SELECT * FROM {src} VERSION AS OF {s1}")
    snap = lambda: spark.sql(f"SELECT snapshot_id FROM {mor}.snapshots ORDER BY committed_at").collect()[-1].snapshot_id  # noqa: E731
    m1 = snap()
    spark.sql(f"UPDATE {mor} SET status = 'sparse', amount = amount + 1 WHERE id % 1000 = 3")
    m2 = snap()
    spark.sql(f"DELETE FROM {mor} WHERE id % 10000 = 5")
    m3 = snap()
    spark.sql(f"DELETE FROM {mor} WHERE id % {n // 10} = 7")  # ten rows: a streaming-sized commit
    m4 = snap()
    touched = files_of(spark, mor, m1)
    touched_bytes = sum(touched.values())
    cfg = write_config(wh, f"mor_{n}", args.budget)
    measured([args.cdc, "sync", "--config", cfg, "--to-snapshot", str(m1), "--json"])
    meta = os.path.join(wh, "cdc_target", f"mor_{n}", "metadata")
    shutil.copytree(meta, meta + ".start")
    bins = [args.cdc] + args.baseline
    runs = {b: [] for b in bins}
    for _ in range(args.runs):
        for b in bins:
            shutil.rmtree(meta)
            shutil.copytree(meta + ".start", meta)
            wall, cpu, rss, out, _ = measured([b, "sync", "--config", cfg, "--json"])
            runs[b].append((wall, cpu, rss, json.loads(out)))
    assert differs_from(spark, mor, f"{CAT}.cdc_target.mor_{n}") == 0  # the last run's target (the last binary)
    # each snapshot alone: `cdc changes`, least CPU of the runs, and the MB it reports read
    steps = []
    for label, a, b in (("UPDATE 0.1 %", m1, m2), ("DELETE 0.01 %", m2, m3), ("DELETE 10 rows", m3, m4)):
        for binary in bins:
            cmd = [binary, "changes", "--config", cfg, "--from-snapshot", str(a), "--to-snapshot", str(b)]
            best = min((measured(cmd) for _ in range(args.runs)), key=lambda r: r[1])
            mb = float(best[4].split(" MB read")[0].rsplit(" ", 1)[1])
            steps.append((label, os.path.basename(binary), best[1], mb))
    raw = raw_scan(touched, args.runs)
    try:
        spark.sql(f"CALL {CAT}.system.create_changelog_view(table => 'db.mor_{n}', options => map('start-snapshot-id', '{m1}', "
                  f"'end-snapshot-id', '{m3}'), changelog_view => 'mor_changes_{n}', compute_updates => true, identifier_columns => array('id'))")
        spark_changelog = f"{spark.sql(f'SELECT * FROM mor_changes_{n}').count()} rows"
    except Exception as e:  # noqa: BLE001 — the benchmark reports what Spark says
        spark_changelog = "fails: " + str(e).strip().splitlines()[0][:120]
    return dict(n=n, files=len(touched), touched_bytes=touched_bytes, runs=runs, raw=raw, spark_changelog=spark_changelog, steps=steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--cdc", default=os.path.join(ROOT, "target", "release", "cdc"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", default="256MiB", help="engine.memory_budget (256MiB is the default)")
    ap.add_argument("--spark-max-rows", type=int, help="measure Spark's sync only up to this size (the tables are still written and checked by Spark)")
    ap.add_argument("--baseline", nargs="*", default=[], metavar="BIN", help="other cdc binaries measured alternately on the merge-on-read case")
    ap.add_argument("--no-mor", action="store_true", help="skip the sparse merge-on-read case")
    ap.add_argument("--keep", metavar="DIR", help="build the warehouse in DIR and keep it (to rerun `cdc sync` by hand)")
    args = ap.parse_args()
    try:
        import duckdb  # noqa: F401
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "duckdb==1.4.2"], check=True)
    wh = args.keep or tempfile.mkdtemp(prefix="cdc-bench-")
    spark = spark_workloads.spark_session(wh, driver_memory="6g")
    spark.sparkContext.setLogLevel("ERROR")
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    results = [one_size(spark, wh, n, args) for n in args.rows]
    mor = [] if args.no_mor else [sparse_mor(spark, wh, r["n"], f"{CAT}.db.orders_{r['n']}", r["s1"], args) for r in results]
    spark.stop()
    if not args.keep:
        shutil.rmtree(wh, ignore_errors=True)

    print(f"\nengine.memory_budget = {args.budget}; {args.runs} runs each (cdc: median wall; raw scan: least CPU).\n")
    print("| rows | files involved | MB involved | `cdc sync` wall s | CPU s | CPU s per GB | MB read / MB involved | spilled MB | peak RSS MB "
          "| raw scan CPU s (DuckDB, 1 thread) | cdc speed / raw scan | Spark CPU s (warm) | Spark / cdc CPU |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        gb = r["involved_bytes"] / 1e9
        s = r["summary"]
        print(f"| {r['n']:,} | {r['involved_files']} | {r['involved_bytes'] / 1e6:.0f} | {r['cdc_wall']:.2f} | {r['cdc_cpu']:.2f} | {r['cdc_cpu'] / gb:.1f} "
              f"| {s['source_bytes_read'] / r['involved_bytes']:.2f} | {s['spilled_bytes'] / 1e6:.0f} | {r['cdc_rss']:.0f} | {r['raw'][1]:.2f} "
              f"| {r['raw'][1] / r['cdc_cpu']:.2f} | " + (f"{r['spark_cpu']:.1f} | {r['spark_cpu'] / r['cdc_cpu']:.1f}x |" if r["spark_cpu"] is not None else "not run | — |"))
    print("\nThe same MERGE as `cdc changes --format parquet` (least CPU of the runs, alternating with the raw scan):\n")
    print("| rows | `cdc changes` wall s | CPU s | CPU s per GB | peak RSS MB | raw scan CPU s | cdc speed / raw scan |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        w, c, rss = r["changes"][:3]
        print(f"| {r['n']:,} | {w:.2f} | {c:.2f} | {c / (r['involved_bytes'] / 1e9):.1f} | {rss:.0f} | {r['raw'][1]:.2f} | {r['raw'][1] / c:.2f} |")
    print("\n| rows | bootstrap wall s | bootstrap CPU s | bootstrap CPU s per GB read | bootstrap peak RSS MB | sync wall / CPU (2 cores) |")
    print("|---|---|---|---|---|---|")
    for r in results:
        w, c, rss = r["boot"][:3]
        print(f"| {r['n']:,} | {w:.2f} | {c:.2f} | {c / (r['boot_read'] / 1e9):.1f} | {rss:.0f} | {r['cdc_wall'] / r['cdc_cpu']:.2f} |")
    for r in results:
        s = r["summary"]
        spark_part = f"Spark wall {r['spark_wall']:.1f} s, peak RSS {r['spark_rss']:.0f} MB (JVM)" if r["spark_wall"] is not None else "Spark's sync not run"
        print(f"\n{r['n']:,} rows: {s['inserts']} insert, {s['deletes']} delete, {s['updates']} update; {spark_part}")
    if mor:
        print("\nSparse merge-on-read (v3): UPDATE 0.1 %, DELETE 0.01 %, DELETE 10 rows; deletion vectors, no file rewritten "
              "(median wall of the runs; raw scan: DuckDB over the files the DVs touch):\n")
        print("| rows | files with new DVs | MB of those files | binary | `cdc sync` wall s | CPU s | MB read | peak RSS MB | raw scan CPU s | raw scan / cdc CPU |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for m in mor:
            for b, v in m["runs"].items():
                v = sorted(v, key=lambda r: r[0])
                wall, cpu, _, s = v[len(v) // 2]
                print(f"| {m['n']:,} | {m['files']} | {m['touched_bytes'] / 1e6:.0f} | {os.path.basename(b)} | {wall:.2f} | {cpu:.2f} "
                      f"| {s['source_bytes_read'] / 1e6:.1f} | {max(r[2] for r in v):.0f} | {m['raw'][1]:.2f} | {m['raw'][1] / cpu:.1f} |")
        print("\n| rows | snapshot | binary | `cdc changes` CPU s | MB read |")
        print("|---|---|---|---|---|")
        for m in mor:
            for label, binary, cpu, mb in m["steps"]:
                print(f"| {m['n']:,} | {label} | {binary} | {cpu:.2f} | {mb:.1f} |")
        for m in mor:
            s = m["runs"][args.cdc][0][3]
            print(f"\n{m['n']:,} rows (merge-on-read): {s['inserts']} insert, {s['deletes']} delete, {s['updates']} update; "
                  f"Spark's create_changelog_view: {m['spark_changelog']}")


if __name__ == "__main__":
    main()
