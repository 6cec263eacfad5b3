"""Shared fixtures of the peer tests: one Spark session (Apache Spark 3.5 + Iceberg 1.10, local[2]) and the tables
it writes, plus a helper that runs the real `cdc` binary."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import spark_workloads  # noqa: E402

CDC = os.environ.get("CDC_BIN", os.path.join(ROOT, "target", "debug", "cdc"))


@pytest.fixture(scope="session")
def warehouse():
    d = os.environ.get("CDC_TEST_WAREHOUSE") or tempfile.mkdtemp(prefix="cdc-peer-wh-")
    return d


@pytest.fixture(scope="session")
def spark(warehouse):
    s = spark_workloads.spark_session(warehouse)
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def spark_tables(spark):
    spark_workloads.build(spark, list(spark_workloads.TABLES))
    return list(spark_workloads.TABLES)


def write_config(path, table, warehouse, extra=""):
    with open(path, "w") as f:
        f.write(f'[source]\ntable = "{table}"\n{extra}\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n')
    return path


def run_cdc(*args, check=True):
    p = subprocess.run([CDC, *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"cdc {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


def cdc_changes(config, *args):
    out = run_cdc("changes", "--config", config, *args).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]
