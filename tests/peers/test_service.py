"""`cdc run` (the service) while Apache Spark keeps committing to three source tables — copy-on-write v2,
merge-on-read v2 (position deletes), merge-on-read v3 (deletion vectors), one of them adding a column mid-stream —
replicating into hadoop, sqlite and REST-catalog targets (one partitioned) with a 1 s poll, the v2 targets compacted in
the background as they go. After the writers stop, every target read
by Spark equals its source within a few polls, and /metrics shows lag 0 for every pipeline."""
import json
import os
import signal
import subprocess
import time
import urllib.request

from conftest import CDC, free_port, spark_table
from spark_workloads import CAT, rows, table_props

LIVE = [("live_cow_v2", 2, "copy-on-write", "hadoop"), ("live_mor_v2", 2, "merge-on-read", "sql"), ("live_mor_v3", 3, "merge-on-read", "rest")]


def metrics(port):
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return ""


def metric(body, name, pipeline):
    for line in body.splitlines():
        if line.startswith(name + "{") and f'pipeline="{pipeline}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def canon(df):
    return sorted(tuple(r) for r in df.collect())


def test_service_follows_spark_writers(spark, warehouse, rest_catalog, sql_target, tmp_path):
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {CAT}.db")
    for name, version, mode, _ in LIVE:
        t = f"{CAT}.db.{name}"
        spark.sql(f"DROP TABLE IF EXISTS {t}")
        # the merge-on-read v2 source is partitioned, so its target (which takes the source's spec) is too
        parts = "PARTITIONED BY (cat) " if name == "live_mor_v2" else ""
        spark.sql(f"CREATE TABLE {t} (id BIGINT NOT NULL, name STRING, amount DECIMAL(10,2), ts TIMESTAMP, cat STRING) "
                  f"USING iceberg {parts}TBLPROPERTIES ({table_props(version, mode)})")
        spark.sql(f"ALTER TABLE {t} SET IDENTIFIER FIELDS id")
        spark.sql(f"INSERT INTO {t} VALUES {rows(0, 20)}")
    port = free_port()
    replica = tmp_path / "replica"
    targets = {"hadoop": "replica", "sql": "sqlrep", "rest": "restrep"}
    cfg = tmp_path / "service.toml"
    text = (
        f'[service]\npoll_interval = "1s"\nmetrics_address = "127.0.0.1:{port}"\nshutdown_timeout = "20s"\n\n'
        f'[catalogs.lake]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n\n'
        f'[catalogs.replica]\ntype = "hadoop"\nwarehouse = "{replica}"\n\n'
        f'[catalogs.sqlrep]\ntype = "sql"\nwarehouse = "{sql_target}"\n\n'
        f'[catalogs.restrep]\ntype = "rest"\nuri = "{rest_catalog}"\n'
    )
    for name, version, _, kind in LIVE:
        text += (f'\n[[pipelines]]\nname = "{name}"\nsource = {{ catalog = "lake", table = "db.{name}" }}\n\n'
                 f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "{targets[kind]}"\ntable = "svc.{name}"\nformat_version = {version}\n'
                 # compaction in the background after every 2 delete or small files (v2 targets; v3 are not compacted)
                 'compact_delete_files = 2\ncompact_small_files = 2\ncompact_idle_after = "3s"\n')
    cfg.write_text(text)
    log = open(tmp_path / "service.log", "w")
    proc = subprocess.Popen([CDC, "run", "--config", str(cfg), "--log", "info"], stdout=subprocess.DEVNULL, stderr=log)
    try:
        # Spark keeps writing while the service runs: updates, deletes, merges, a column added mid-stream
        for step in range(6):
            for name, _, _, _ in LIVE:
                t = f"{CAT}.db.{name}"
                base = 100 + step * 10
                extra = ", CAST(NULL AS STRING)" if name == "live_mor_v2" and step > 2 else ""
                spark.sql(f"INSERT INTO {t} SELECT *{extra} FROM VALUES {rows(base, base + 3)}")
                spark.sql(f"UPDATE {t} SET amount = amount + 1, name = concat(name, '-{step}') WHERE id % 5 = {step % 5}")
                spark.sql(f"DELETE FROM {t} WHERE id = {step * 3 + 1}")
                if step == 2 and name == "live_mor_v2":
                    spark.sql(f"ALTER TABLE {t} ADD COLUMN note STRING")
                    spark.sql(f"UPDATE {t} SET note = 'added while running' WHERE id < 10")
        spark_reads = {
            "hadoop": lambda n: spark.read.format("iceberg").load(str(replica / "svc" / n)),
            "sql": lambda n: spark_table(spark, f"sqlite:{sql_target}.svc.{n}"),
            "rest": lambda n: spark_table(spark, f"rest_cat.svc.{n}"),
        }
        deadline = time.time() + 120
        pending = {name for name, _, _, _ in LIVE}
        while pending and time.time() < deadline:
            for name, _, _, kind in LIVE:
                if name not in pending:
                    continue
                src = spark.table(f"{CAT}.db.{name}")
                try:
                    got = spark_reads[kind](name)
                except Exception:  # not created yet
                    continue
                if got.columns == src.columns and canon(got) == canon(src):
                    pending.discard(name)
            time.sleep(1)
        assert not pending, f"targets not equal to their sources: {pending}\n{(tmp_path / 'service.log').read_text()[-4000:]}"
        deadline = time.time() + 30
        while time.time() < deadline:
            body = metrics(port)
            if all(metric(body, "cdc_replication_lag_snapshots", n) == 0 for n, _, _, _ in LIVE):
                break
            time.sleep(0.5)
        body = metrics(port)
        for name, _, _, _ in LIVE:
            assert metric(body, "cdc_replication_lag_snapshots", name) == 0, body
            assert metric(body, "cdc_replication_lag_seconds", name) == 0, body
            assert metric(body, "cdc_commits_total", name) >= 2, body
        # the v2 targets Spark just read equal to their sources were compacted in the background while it wrote
        for name in ("live_cow_v2", "live_mor_v2"):
            runs = [line for line in body.splitlines() if line.startswith("cdc_maintenance_runs_total{") and f'pipeline="{name}"' in line and 'task="compact"' in line]
            assert runs and float(runs[0].rsplit(" ", 1)[1]) >= 1, (name, runs)
        assert "target schema follows the source" in (tmp_path / "service.log").read_text()
        # row counts match the changes: the first commit copied the source at some snapshot, the rest applied the
        # changes after it (INSERT + UPDATE_AFTER + DELETE rows of `cdc changes` over that range)
        name = "live_cow_v2"
        target_cfg = tmp_path / "target-as-source.toml"
        target_cfg.write_text(f'[source]\ntable = "svc.{name}"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{replica}"\n')
        summaries = [json.loads(l)["summary"] for l in subprocess.run([CDC, "snapshots", "--config", str(target_cfg), "--json"], capture_output=True, text=True, check=True).stdout.splitlines() if l.strip()]
        copied_at = summaries[0]["cdc.source-snapshot-id"]
        copied = int(summaries[0]["added-records"])
        src_cfg = tmp_path / "source.toml"
        src_cfg.write_text(f'[source]\ntable = "db.{name}"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n')
        changes = [json.loads(l) for l in subprocess.run([CDC, "changes", "--config", str(src_cfg), "--from-snapshot", copied_at], capture_output=True, text=True, check=True).stdout.splitlines() if l.strip()]
        count = lambda t: sum(1 for c in changes if c["_change_type"] == t)
        assert metric(body, 'cdc_rows_total', name) is not None
        counted = {t: None for t in ("INSERT", "DELETE", "UPDATE")}
        for line in body.splitlines():
            if line.startswith("cdc_rows_total{") and f'pipeline="{name}"' in line:
                counted[line.split('change_type="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
        want = {"INSERT": copied + count("INSERT"), "DELETE": count("DELETE"), "UPDATE": count("UPDATE_AFTER")}
        assert counted == want, (counted, want)
        # the writers stopped: quiet for `compact_idle_after`, the v2 targets are compacted completely — no delete
        # file left, so readers take their fastest path — and Spark still reads them equal to their sources
        at_rest = {"live_cow_v2": ("hadoop", replica), "live_mor_v2": ("sql", sql_target)}
        def head_summary(name):
            kind, wh = at_rest[name]
            p = tmp_path / f"rest-{name}.toml"
            p.write_text(f'[source]\ntable = "svc.{name}"\n[source.catalog]\ntype = "{kind}"\nwarehouse = "{wh}"\n')
            out = subprocess.run([CDC, "snapshots", "--config", str(p), "--json"], capture_output=True, text=True, check=True).stdout
            return [json.loads(l) for l in out.splitlines() if l.strip()][-1]["summary"]
        deadline = time.time() + 90
        rested = lambda: (tmp_path / "service.log").read_text().count("the target is at rest") >= len(at_rest)
        while time.time() < deadline and (not rested() or any(head_summary(n).get("total-delete-files") != "0" for n in at_rest)):
            time.sleep(1)
        for name in at_rest:
            assert head_summary(name).get("total-delete-files") == "0", (name, head_summary(name), (tmp_path / "service.log").read_text()[-4000:])
        # every target's rest ends with this line (a pass that compacts logs `at_rest=true` too; the background
        # compaction may have left nothing for one)
        assert rested(), (tmp_path / "service.log").read_text()[-4000:]
        for name, _, _, kind in LIVE:
            if name in at_rest:
                assert canon(spark_reads[kind](name)) == canon(spark.table(f"{CAT}.db.{name}")), name
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        log.close()
    assert rc == 0, (tmp_path / "service.log").read_text()[-4000:]
