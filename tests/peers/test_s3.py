"""Tables on S3: the S3 emulator (moto's server), the Iceberg REST catalog server with its warehouse on it (Iceberg's S3
FileIO), Apache Spark writing the sources and reading the targets back. `cdc` reaches S3 with static keys given as
catalog properties, and uploads large files in 5 MiB parts (multipart upload)."""
import json
import subprocess
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from collections import Counter

import object_names
from conftest import BUCKET, CDC, KEYS, S3CAT
from spark_workloads import TABLES, create

# the `s3` fixture (moto + the REST catalog server on S3) lives in conftest: test_glue shares it


def catalog(s3):
    lines = ['type = "rest"', f'uri = "{s3["rest"]}"', f'"s3.endpoint" = "{s3["endpoint"]}"', '"s3.path-style-access" = "true"',
             f'"io.upload-chunk-size" = "{5 * 1024 * 1024}"']
    lines += [f'"{k}" = "{v}"' for k, v in KEYS.items()]
    return "\n".join(lines) + "\n"


def rows(spark, table):
    spark.sql(f"REFRESH TABLE {table}")
    return Counter(tuple(r) for r in spark.table(table).collect())


def sync(tmp_path, s3, source, target, *args):
    cfg = tmp_path / "cdc.toml"
    cfg.write_text(f'[source]\ntable = "{source}"\n[source.catalog]\n{catalog(s3)}\n[target]\ntable = "{target}"\n[target.catalog]\n{catalog(s3)}')
    return subprocess.run([CDC, "sync", "--config", str(cfg), *args], capture_output=True, text=True)


def test_sync_s3_to_s3(spark, s3, tmp_path):
    version, mode, keyed, partitioned = TABLES["part_v2"]
    src = f"{S3CAT}.db.s_part_v2"
    create(spark, src, version, mode, keyed, partitioned)
    first = [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()][1]
    p = sync(tmp_path, s3, "db.s_part_v2", "repl.s_part_v2", "--to-snapshot", str(first))
    assert p.returncode == 0, p.stderr
    p = sync(tmp_path, s3, "db.s_part_v2", "repl.s_part_v2")
    assert p.returncode == 0, p.stderr
    want, got = rows(spark, src), rows(spark, f"{S3CAT}.repl.s_part_v2")
    assert got == want, f"missing {want - got}, extra {got - want}"


def test_large_files_upload_in_parts(spark, s3, tmp_path):
    src = f"{S3CAT}.db.s_big"
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    spark.sql(f"CREATE TABLE {src} (id BIGINT NOT NULL, a STRING, b STRING) USING iceberg TBLPROPERTIES ('format-version'='2')")
    spark.sql(f"ALTER TABLE {src} SET IDENTIFIER FIELDS id")
    # incompressible strings: ~25 MB of Parquet in one file
    spark.range(0, 200000, 1, 1).selectExpr("id", "sha2(cast(id as string), 256) a", "sha2(cast(id * 7 as string), 512) b") \
        .writeTo(src).append()
    p = sync(tmp_path, s3, "db.s_big", "repl.s_big")
    assert p.returncode == 0, p.stderr
    tgt = f"{S3CAT}.repl.s_big"
    assert rows(spark, tgt) == rows(spark, src)
    biggest = spark.sql(f"SELECT max(file_size_in_bytes) m FROM {tgt}.files").collect()[0].m
    assert biggest > 2 * 5 * 1024 * 1024, f"the largest target file ({biggest} B) is too small to have needed a multipart upload"


def objects(s3, prefix):
    """Keys under `prefix`, listed through the S3 API (ListObjectsV2, every page)."""
    ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
    keys, token = set(), None
    while True:
        q = {"list-type": "2", "prefix": prefix}
        if token:
            q["continuation-token"] = token
        with urllib.request.urlopen(f"{s3['endpoint']}/{BUCKET}?{urllib.parse.urlencode(q)}") as r:
            root = ET.fromstring(r.read())
        keys |= {k.text for k in root.findall("s3:Contents/s3:Key", ns)}
        token = root.findtext("s3:NextContinuationToken", namespaces=ns)
        if root.findtext("s3:IsTruncated", namespaces=ns) != "true" or not token:
            return keys


def test_partitioned_object_names_are_the_metadata_paths(spark, s3, tmp_path):
    """As on GCS: partition values with every special character, under every transform, into a v3 target (deletion
    vectors in Puffin files): the keys in the bucket are exactly the paths in the target's metadata."""
    src = f"{S3CAT}.db.s_names"
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    for s in object_names.workload(src, 3):
        spark.sql(s)
    bucket = f"s3://{BUCKET}"
    object_names.assert_names_match(objects(s3, "wh/db/s_names/"), object_names.referenced(spark, src, bucket), "Spark's source")
    first = [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()][2]
    p = sync(tmp_path, s3, "db.s_names", "repl.s_names", "--to-snapshot", str(first))
    assert p.returncode == 0, p.stderr
    p = sync(tmp_path, s3, "db.s_names", "repl.s_names")
    assert p.returncode == 0, p.stderr
    tgt = f"{S3CAT}.repl.s_names"
    want, got = rows(spark, src), rows(spark, tgt)
    assert got == want, f"missing {want - got}, extra {got - want}"
    names = object_names.referenced(spark, tgt, bucket)
    object_names.assert_names_match(objects(s3, "wh/repl/s_names/"), names, "cdc sync's target")
    object_names.assert_partition_dirs(names, "cdc sync's target")
    object_names.assert_named_like_spark(spark, src, tgt)


def test_maintain_on_s3(spark, s3, tmp_path):
    """`cdc maintain` on an s3:// target: manifests a sync without in-commit merging left are rewritten, snapshots
    beyond the retention expire, and an object no snapshot references — found by listing the bucket through the S3
    API with the table's credentials — is deleted once older than `orphan_grace`; Spark reads the target equal."""
    version, mode, keyed, partitioned = TABLES["part_v2"]
    src = f"{S3CAT}.db.s_maint"
    create(spark, src, version, mode, keyed, partitioned)
    extra = ('snapshots_per_commit = 1\nmerge_manifests = false\nexpire_snapshots = false\nsnapshot_retention = "0s"\n'
             'retain_snapshots = 2\norphan_grace = "1s"\n')
    cfg = tmp_path / "cdc.toml"
    cfg.write_text(f'[source]\ntable = "db.s_maint"\n[source.catalog]\n{catalog(s3)}\n'
                   f'[target]\ntable = "repl.s_maint"\n{extra}[target.catalog]\n{catalog(s3)}')
    first = [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()][0]
    for args in (["--to-snapshot", str(first)], []):
        p = subprocess.run([CDC, "sync", "--config", str(cfg), *args], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    tgt = f"{S3CAT}.repl.s_maint"
    orphan = "wh/repl/s_maint/data/orphan.parquet"
    urllib.request.urlopen(urllib.request.Request(f"{s3['endpoint']}/{BUCKET}/{orphan}", data=b"junk", method="PUT")).read()
    assert orphan in objects(s3, "wh/repl/s_maint/data/")
    time.sleep(2)
    p = subprocess.run([CDC, "maintain", "--config", str(cfg), "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    m = json.loads(p.stdout)
    assert m["orphans_deleted"] == 1 and m["snapshots_expired"] >= 1, m
    assert orphan not in objects(s3, "wh/repl/s_maint/data/")
    assert m["manifests_after"] < m["manifests_before"], m
    assert rows(spark, tgt) == rows(spark, src)
    referenced = {r.file_path for r in spark.sql(f"SELECT file_path FROM {tgt}.all_files").collect()}
    on_store = {f"s3://{BUCKET}/{k}" for k in objects(s3, "wh/repl/s_maint/data/")}
    assert on_store - referenced == set(), sorted(on_store - referenced)[:3]
