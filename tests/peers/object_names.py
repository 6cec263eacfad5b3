"""Object names on object stores: a table whose partition values hold every character that path and URL encodings
treat specially, and the check that every object of a table is stored under exactly the path its metadata holds.

Spark writes the source (Iceberg Java names partition directories `field=value` with both sides URL-encoded, so a
value `a=b` is the directory `cat=a%3Db`); `cdc` must store its target's files under the same kind of names, and
address them (read, delete) by exactly those names. A name encoded once too often on upload (`cat%3Da%253Db`) is a
file no other engine can find.
"""
# identity partition values: reserved and unreserved URL characters, percent, plus, space, unicode, a slash, empty
SPECIALS = ["a=b", "100%", "sp ace", "plus+sign", "hash#tag", "q?mark", "ünï€", "sl/ash", "amp&er", "c:o;l,on", "~t'(i)!", ""]


def workload(t, version):
    """A merge-on-read table partitioned by every transform kind (identity on strings, bucket, truncate, day, hour),
    with a null partition value, position deletes (v2) or deletion vectors (v3), and a row moved between partitions."""
    props = f"'format-version'='{version}', 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read', " \
            "'write.merge.mode'='merge-on-read'"
    values = []
    for i, cat in enumerate(SPECIALS + [None] * 2):
        c = "NULL" if cat is None else "'" + cat.replace("'", "''") + "'"
        note = "'" + (SPECIALS[(i + 3) % len(SPECIALS)] + "-note").replace("'", "''") + "'"
        values.append(f"({i}, {c}, {note}, TIMESTAMP '2024-01-{i % 3 + 1:02d} 0{i % 4}:00:00', TIMESTAMP '2024-02-01 {i % 5:02d}:30:00')")
    n = len(values)
    return [
        f"CREATE TABLE {t} (id BIGINT NOT NULL, cat STRING, note STRING, ts TIMESTAMP, ts2 TIMESTAMP) USING iceberg "
        f"PARTITIONED BY (cat, bucket(4, id), truncate(2, note), days(ts), hours(ts2)) TBLPROPERTIES ({props})",
        f"ALTER TABLE {t} SET IDENTIFIER FIELDS id",
        f"INSERT INTO {t} VALUES {', '.join(values[: n // 2])}",
        f"INSERT INTO {t} VALUES {', '.join(values[n // 2:])}",
        f"UPDATE {t} SET note = concat(note, '=u') WHERE id % 3 = 0",
        f"UPDATE {t} SET cat = 'sl/ash' WHERE id IN (1, 2)",
        f"DELETE FROM {t} WHERE id IN (4, 5)",
        f"INSERT INTO {t} VALUES (100, '50%+=/?#', 'x y', TIMESTAMP '2024-01-09 09:00:00', TIMESTAMP '2024-02-02 02:30:00')",
    ]


def referenced(spark, table, bucket_url):
    """Every object `table`'s metadata references, as names inside the bucket: data and delete files (Puffin too),
    manifests, manifest lists, metadata files (current and logged)."""
    spark.sql(f"REFRESH TABLE {table}")
    paths = {r[0] for r in spark.sql(f"SELECT file_path FROM {table}.all_files").collect()}
    paths |= {r[0] for r in spark.sql(f"SELECT path FROM {table}.all_manifests").collect()}
    paths |= {r[0] for r in spark.sql(f"SELECT manifest_list FROM {table}.snapshots").collect()}
    paths |= {r[0] for r in spark.sql(f"SELECT file FROM {table}.metadata_log_entries").collect()}
    prefix = bucket_url.rstrip("/") + "/"
    outside = [p for p in paths if not p.startswith(prefix)]
    assert not outside, f"{table} references files outside {prefix}: {outside[:3]}"
    return {p[len(prefix):] for p in paths}


def assert_names_match(objects, referenced_names, what):
    """The objects under a table's folder are exactly the files its metadata references, by name."""
    missing, extra = sorted(referenced_names - objects), sorted(objects - referenced_names)
    assert not missing and not extra, (
        f"{what}: objects and metadata paths differ\n  referenced but not stored under that name: {missing[:5]}\n"
        f"  stored but not referenced: {extra[:5]}"
    )


def assert_partition_dirs(names, what):
    """The partition directories of the special values are there, escaped as Iceberg Java escapes them."""
    dirs = {seg for n in names for seg in n.split("/") if seg.startswith("cat=")}
    for want in ["cat=a%3Db", "cat=100%25", "cat=sp+ace", "cat=plus%2Bsign", "cat=hash%23tag", "cat=q%3Fmark",
                 "cat=%C3%BCn%C3%AF%E2%82%AC", "cat=sl%2Fash", "cat=null", "cat="]:
        assert want in dirs, f"{what}: no partition directory {want} among {sorted(dirs)}"


def partition_dir_names(spark, table, field):
    """The `field=` directory names of every file `table` ever referenced (as escaped in their paths)."""
    spark.sql(f"REFRESH TABLE {table}")
    paths = [r[0] for r in spark.sql(f"SELECT file_path FROM {table}.all_files").collect()]
    return {seg for p in paths for seg in p.split("/") if seg.startswith(field + "=")}


def assert_named_like_spark(spark, source, target):
    """Every partition directory of the target (identity, truncate, day, hour) is named exactly as Spark named the
    source's directory of the same value: the target holds the source's values, so a name Spark never wrote is a
    value escaped or printed differently."""
    for field in ("cat", "note_trunc", "ts_day", "ts2_hour"):
        want, got = partition_dir_names(spark, source, field), partition_dir_names(spark, target, field)
        assert got and got <= want, f"{target}: {field} directories Spark never wrote: {sorted(got - want)} (Spark's: {sorted(want)[:8]})"
