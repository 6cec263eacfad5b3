"""Tables in the AWS Glue Data Catalog, on S3 — both emulated by moto's server (conftest's `s3` fixture, shared with test_s3.py) —
written by Spark 3.5 through Iceberg's GlueCatalog (AWS SDK v2, S3FileIO):
- `cdc changes` on a Glue source equals Spark's time-travel difference at every snapshot (partitioned and not);
- `cdc sync` replicates glue -> glue step by step in both delete modes, read back by Spark through Glue;
- a Spark commit between cdc's plan and commit is seen and retried, its row kept;
- credentials from the environment instead of the catalog section; no credentials at all (exit 12); a missing
  table (exit 4).
moto does not enforce `UpdateTable`'s `VersionId`, so the compare-and-set half of concurrent commits is real Glue's
to prove; the pointer check before it is exercised here."""
import os
import subprocess

import pytest

from conftest import BUCKET, CDC, KEYS, cdc_changes, run_cdc, spark_table
from spark_workloads import create
from test_spark_changelog import actual_changes, expected_changes, lineage as changelog_lineage, spark_rows
from test_spark_sync import assert_replica, assert_sync_survives_a_concurrent_commit, cols_at, lineage, source_cols

GLUE = "glue_cat"
NS = "gdb"
# name: (format version, write mode, partitioned)
GLUE_TABLES = {"mor_v2": (2, "merge-on-read", False), "part_v3": (3, "merge-on-read", True)}
REGION = "us-east-1"


@pytest.fixture(scope="module")
def glue(spark, s3):
    jvm = spark.sparkContext._jvm
    # the Glue client's credentials: system properties (the JVM is already running, its environment is fixed)
    jvm.java.lang.System.setProperty("aws.accessKeyId", KEYS["s3.access-key-id"])
    jvm.java.lang.System.setProperty("aws.secretAccessKey", KEYS["s3.secret-access-key"])
    conf = {"": "org.apache.iceberg.spark.SparkCatalog", ".catalog-impl": "org.apache.iceberg.aws.glue.GlueCatalog",
            ".warehouse": f"s3://{BUCKET}/glue-wh", ".io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
            ".glue.endpoint": s3["endpoint"], ".client.region": REGION, ".cache-enabled": "false",
            ".client.credentials-provider": "software.amazon.awssdk.auth.credentials.SystemPropertyCredentialsProvider",
            ".s3.endpoint": s3["endpoint"], ".s3.path-style-access": "true"}
    conf.update({f".{k}": v for k, v in KEYS.items()})
    for k, v in conf.items():
        spark.conf.set(f"spark.sql.catalog.{GLUE}{k}", v)
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {GLUE}.{NS}")
    for name, (version, mode, partitioned) in GLUE_TABLES.items():
        create(spark, f"{GLUE}.{NS}.{name}", version, mode, True, partitioned)
    return s3


def catalog(glue, keys=True):
    lines = ['type = "glue"', f'region = "{REGION}"', f'endpoint = "{glue["endpoint"]}"', f'warehouse = "s3://{BUCKET}/glue-wh"',
             f'"s3.endpoint" = "{glue["endpoint"]}"', '"s3.path-style-access" = "true"']
    if keys:
        lines += [f'"access-key-id" = "{KEYS["s3.access-key-id"]}"', f'"secret-access-key" = "{KEYS["s3.secret-access-key"]}"']
    return "\n".join(lines) + "\n"


def config(path, glue, source, target=None, extra="", keys=True):
    text = f'[source]\ntable = "{source}"\n[source.catalog]\n{catalog(glue, keys)}'
    if target:
        text += f'\n[target]\ntable = "{target}"\n{extra}\n[target.catalog]\n{catalog(glue, keys)}'
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("name", list(GLUE_TABLES))
def test_changes_of_every_snapshot_match_spark(spark, glue, tmp_path, name):
    t = f"{GLUE}.{NS}.{name}"
    cfg = config(tmp_path / "cdc.toml", glue, f"{NS}.{name}")
    cols = source_cols(spark, t)
    history = changelog_lineage(spark, t)
    assert len(history) >= 8
    for sid, parent, op in history:
        expected = expected_changes(spark_rows(spark, t, parent, cols), spark_rows(spark, t, sid, cols), True)
        args = ["--to-snapshot", str(sid)] + (["--from-snapshot", str(parent)] if parent else [])
        got = actual_changes(cdc_changes(cfg, *args), cols)
        assert got == expected, f"{name} snapshot {sid} ({op}): missing {expected - got}, unexpected {got - expected}"


@pytest.mark.parametrize("name,mode", [("mor_v2", "equality"), ("part_v3", "position")])
def test_sync_glue_to_glue_step_by_step(spark, glue, tmp_path, name, mode):
    src, tgt = f"{GLUE}.{NS}.{name}", f"{GLUE}.grep_{mode}.{name}"
    cfg = config(tmp_path / "cdc.toml", glue, f"{NS}.{name}", f"grep_{mode}.{name}", f'delete_mode = "{mode}"')
    for sid in lineage(spark, src):
        run_cdc("sync", "--config", cfg, "--to-snapshot", str(sid))
        assert_replica(spark, src, tgt, cols_at(spark, src, sid), sid)
    assert [r for r in spark.sql(f"SELECT file_path FROM {tgt}.files").collect() if not r.file_path.startswith(f"s3://{BUCKET}/glue-wh/grep_{mode}.db/")] == [], \
        "a new table goes under <warehouse>/<db>.db/, Glue's layout"


def test_spark_commits_between_plan_and_commit(spark, glue, tmp_path):
    name = "mor_v2"
    src, tgt = f"{GLUE}.{NS}.{name}", f"{GLUE}.gconflict.{name}"
    cfg = config(tmp_path / "cdc.toml", glue, f"{NS}.{name}", f"gconflict.{name}")
    assert_sync_survives_a_concurrent_commit(spark, cfg, src, tgt, tmp_path)


def test_credentials_from_the_environment_and_clear_errors(spark, glue, tmp_path):
    cfg = config(tmp_path / "env.toml", glue, f"{NS}.mor_v2", "genv.mor_v2", keys=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ACCESS_KEY_ID=KEYS["s3.access-key-id"], AWS_SECRET_ACCESS_KEY=KEYS["s3.secret-access-key"])
    p = subprocess.run([CDC, "sync", "--config", cfg], env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert spark_table(spark, f"{GLUE}.genv.mor_v2").count() == spark.table(f"{GLUE}.{NS}.mor_v2").count()
    # no credentials anywhere: exit 12, naming where they may come from
    bare = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    bare["HOME"] = str(tmp_path)
    p = subprocess.run([CDC, "changes", "--config", cfg], env=bare, capture_output=True, text=True)
    assert p.returncode == 12 and "AWS_ACCESS_KEY_ID" in p.stderr, p.stderr
    missing = config(tmp_path / "missing.toml", glue, f"{NS}.no_such_table")
    p = run_cdc("changes", "--config", missing, check=False)
    assert p.returncode == 4 and "no_such_table" in p.stderr, p.stderr


def test_a_sync_of_patterns_lists_glue_and_copies_each_match(spark, glue, tmp_path):
    """Issue 53: `cdc sync` with `tables` patterns on a Glue source lists the catalog (GetDatabases, GetTables with
    NextToken) and copies every matching Iceberg table from S3 into a local replica; Spark reads each copy equal to
    its source."""
    replica = tmp_path / "dr"
    cfg = tmp_path / "lake.toml"
    cfg.write_text(f'[source]\ntables = ["{NS}.*"]\n[source.catalog]\n{catalog(glue)}\n'
                   f'[target]\ntable = "dr_{{namespace}}.{{table}}"\n[target.catalog]\ntype = "hadoop"\nwarehouse = "{replica}"\n')
    p = run_cdc("sync", "--config", str(cfg), check=False)
    assert p.returncode == 0, p.stderr
    names = sorted(GLUE_TABLES)
    assert f"{len(names)} table(s) match: " + ", ".join(f"{NS}.{n}" for n in names) in p.stderr, p.stderr
    for name in names:
        got = sorted(tuple(r) for r in spark.read.format("iceberg").load(str(replica / f"dr_{NS}" / name)).collect())
        assert got == sorted(tuple(r) for r in spark.table(f"{GLUE}.{NS}.{name}").collect()), name
