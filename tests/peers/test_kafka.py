"""The Kafka republisher against a real broker: Apache Kafka 4.1 in KRaft mode (scripts/kafka.sh, from Maven Central
jars), read back by a consumer that is not ours (confluent-kafka, `read_committed`) and by a Kafka Connect worker
(JsonConverter with schemas, FileStreamSink). Sources are the Spark-written tables of the other peer tests."""
import contextlib
import json
import os
import random
import signal
import subprocess
import time
import uuid
from collections import Counter, defaultdict

from confluent_kafka import Consumer, TopicPartition

from conftest import CDC, KAFKA_SCRIPT, ROOT, cdc_changes, free_port, run_cdc, wait_until, write_config
from spark_workloads import CAT

def consume(bootstrap, topic, expect=None, idle=8.0, limit=180.0):
    """Every committed message of `topic` (read_committed), in partition order: (partition, key, value, headers)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}", "auto.offset.reset": "earliest",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    c.subscribe([topic])
    out, last, start = [], time.time(), time.time()
    try:
        while time.time() - start < limit:
            m = c.poll(0.5)
            if m is None:
                if (expect is not None and len(out) >= expect and time.time() - last > 1.0) or time.time() - last > idle:
                    break
                continue
            if m.error():
                continue
            last = time.time()
            out.append((m.partition(), m.key().decode() if m.key() else None, m.value().decode() if m.value() is not None else None,
                        dict((k, v.decode()) for k, v in (m.headers() or []))))
    finally:
        c.close()
    return out


def kafka_section(bootstrap, topic, **extra):
    lines = [f'bootstrap_servers = "{bootstrap}"', f'topic = "{topic}"', f'progress_topic = "{topic}-progress"']
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "[kafka]\n" + "\n".join(lines) + "\n"


def keyed_table(spark, name, rows=None, props=""):
    """A fresh two-column table `db.<name>` keyed by `id` (Spark), with `rows` inserted; returns its Spark name."""
    src = f"{CAT}.db.{name}"
    spark.sql(f"DROP TABLE IF EXISTS {src}")
    spark.sql(f"CREATE TABLE {src} (id BIGINT NOT NULL, v STRING) USING iceberg TBLPROPERTIES ('format-version'='2'{props})")
    spark.sql(f"ALTER TABLE {src} SET IDENTIFIER FIELDS id")
    if rows:
        spark.sql(f"INSERT INTO {src} VALUES {rows}")
    return src


def service_config(tmp_path, warehouse, pipeline, table, sinks):
    """A `cdc run` file: one pipeline reading `db.<table>` of the hadoop warehouse into `sinks` ([[pipelines.sinks]] text)."""
    svc = tmp_path / "service.toml"
    svc.write_text(
        f'[service]\npoll_interval = "500ms"\nmetrics_address = "off"\n\n[catalogs.lake]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n\n'
        f'[[pipelines]]\nname = "{pipeline}"\nsource = {{ catalog = "lake", table = "db.{table}" }}\n\n{sinks}'
    )
    return svc


@contextlib.contextmanager
def running_service(svc, tmp_path):
    """`cdc run --config svc` for the body of the `with`, then SIGTERM: it must exit 0; yields a dict that holds its
    log (`log`) once it stopped."""
    ended = {}
    with open(tmp_path / "svc.log", "w") as log:
        p = subprocess.Popen([CDC, "run", "--config", str(svc)], stdout=log, stderr=subprocess.STDOUT)
        try:
            yield ended
        finally:
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
    ended["log"] = open(tmp_path / "svc.log").read()
    assert rc == 0, ended["log"][-2000:]


def kafka_sink(kafka, topic, **extra):
    lines = ['[[pipelines.sinks]]', 'type = "kafka"', f'bootstrap_servers = "{kafka["bootstrap"]}"', f'topic = "{topic}"',
             f'progress_topic = "{topic}-progress"'] + [f"{k} = {json.dumps(v)}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def config(tmp_path, warehouse, table, section, name="cdc.toml"):
    return write_config(str(tmp_path / name), table, warehouse, target=section)


def key_of(row):
    return json.dumps({"id": row["id"]}, separators=(",", ":"))


def test_json_stream_equals_the_changes_exactly_once(spark_tables, warehouse, kafka, tmp_path):
    topic = f"json-{uuid.uuid4().hex[:8]}"
    cfg = config(tmp_path, warehouse, "db.mor_v2", kafka_section(kafka["bootstrap"], topic, initial="earliest", max_transaction_rows=5))
    run_cdc("sync", "--config", cfg)
    run_cdc("sync", "--config", cfg)  # nothing new: publishes nothing
    want = cdc_changes(config(tmp_path, warehouse, "db.mor_v2", "", "changes.toml"))
    got = consume(kafka["bootstrap"], topic, expect=len(want))
    values = [json.loads(v) for _, _, v, _ in got]
    assert len(values) == len(want), f"{len(values)} messages for {len(want)} changes"
    strip = lambda r: {k: v for k, v in r.items() if k != "_change_ordinal"}  # noqa: E731 - per-chunk ordinals
    assert Counter(json.dumps(strip(r), sort_keys=True) for r in values) == Counter(json.dumps(strip(r), sort_keys=True) for r in want)
    # in order per key, each key on one partition, key = the key columns
    by_key, parts = defaultdict(list), defaultdict(set)
    for (p, k, v, h) in got:
        r = json.loads(v)
        assert k == key_of(r)
        parts[k].add(p)
        by_key[k].append((r["_commit_snapshot_sequence_number"], r["_change_type"]))
        assert h["cdc.change_type"] == r["_change_type"] and int(h["cdc.snapshot_id"]) == r["_commit_snapshot_id"]
        assert "cdc.sequence_number" in h and "cdc.ordinal" in h
    assert all(len(s) == 1 for s in parts.values())
    wanted_by_key = defaultdict(list)
    for r in want:
        wanted_by_key[key_of(r)].append((r["_commit_snapshot_sequence_number"], r["_change_type"]))
    assert dict(by_key) == dict(wanted_by_key)


def fold(messages):
    """The table a Debezium consumer ends up with."""
    state = {}
    for _, k, v, _ in messages:
        if v is None:
            continue
        e = json.loads(v)
        e = e.get("payload", e)
        if e["op"] in ("c", "r", "u"):
            state[k] = e["after"]
        elif e["op"] == "d":
            state.pop(k, None)
    return state


def spark_rows(spark, table):
    return {key_of(r.asDict()): r.asDict() for r in spark.table(table).collect()}


def test_debezium_snapshot_then_changes(spark, spark_tables, warehouse, kafka, tmp_path):
    topic = f"dbz-{uuid.uuid4().hex[:8]}"
    src = f"{CAT}.db.cow_v2"
    snaps = [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()]
    cfg = config(tmp_path, warehouse, "db.cow_v2", kafka_section(kafka["bootstrap"], topic, format="debezium"))
    run_cdc("sync", "--config", cfg, "--to-snapshot", str(snaps[3]))
    run_cdc("sync", "--config", cfg)
    got = consume(kafka["bootstrap"], topic)
    ops = Counter(json.loads(v)["op"] if v else "tombstone" for _, _, v, _ in got)
    assert ops["r"] > 0 and ops["u"] > 0 and ops["d"] > 0 and ops["c"] > 0, ops
    assert ops["tombstone"] == ops["d"], "a tombstone follows each delete"
    first = json.loads(got[0][2])
    assert first["source"]["connector"] == "iceberg" and first["source"]["db"] == "db" and first["source"]["table"] == "cow_v2"
    state = fold(got)
    want = spark_rows(spark, src)
    assert set(state) == set(want)
    for k, row in want.items():
        assert state[k]["name"] == row["name"], k
        assert state[k]["cat"] == row["cat"], k


def test_sigkills_mid_stream_still_exactly_once(spark_tables, warehouse, kafka, tmp_path):
    topic = f"kill-{uuid.uuid4().hex[:8]}"
    cfg = config(tmp_path, warehouse, "db.part_v2", kafka_section(kafka["bootstrap"], topic, initial="earliest", max_transaction_rows=3, snapshots_per_commit=2))
    rng = random.Random(7)
    killed = 0
    for _ in range(20):
        p = subprocess.Popen([CDC, "sync", "--config", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(rng.uniform(0.05, 1.5))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
    run_cdc("sync", "--config", cfg)
    want = cdc_changes(config(tmp_path, warehouse, "db.part_v2", "", "changes.toml"))
    got = consume(kafka["bootstrap"], topic, expect=len(want))
    # each message has the columns of its snapshot's schema (`note` appears mid-history); `cdc changes` over the
    # whole range prints the end schema with nulls: compare without ordinals and null columns
    strip = lambda r: {k: v for k, v in r.items() if k != "_change_ordinal" and v is not None}  # noqa: E731
    got_rows = Counter(json.dumps(strip(json.loads(v)), sort_keys=True) for _, _, v, _ in got)
    want_rows = Counter(json.dumps(strip(r), sort_keys=True) for r in want)
    assert got_rows == want_rows, f"{killed} kills: missing {sum((want_rows - got_rows).values())}, duplicated {sum((got_rows - want_rows).values())}"
    assert killed >= 5, f"only {killed} runs were killed mid-stream"


def test_second_instance_fences_the_first(spark, warehouse, kafka, tmp_path):
    topic = f"fence-{uuid.uuid4().hex[:8]}"
    src = keyed_table(spark, "fence_src", "(1, 'a'), (2, 'b')")
    svc = service_config(tmp_path, warehouse, "fence-me", "fence_src", kafka_sink(kafka, topic))
    logs = [open(tmp_path / f"svc{i}.log", "w") for i in range(2)]
    first = subprocess.Popen([CDC, "run", "--config", str(svc)], stdout=logs[0], stderr=subprocess.STDOUT)
    second = None
    text = ""
    try:
        assert len(consume(kafka["bootstrap"], topic, expect=2, idle=30)) == 2
        second = subprocess.Popen([CDC, "run", "--config", str(svc)], stdout=logs[1], stderr=subprocess.STDOUT)
        time.sleep(8)  # the second instance connects (fencing the first) and catches up
        spark.sql(f"INSERT INTO {src} VALUES (3, 'c')")
        deadline = time.time() + 60
        while time.time() < deadline:
            text = open(tmp_path / "svc0.log").read()
            if "took over this pipeline (fenced)" in text:
                break
            time.sleep(0.5)
        # the change is published once, by the second instance
        msgs = consume(kafka["bootstrap"], topic, expect=3, idle=5)
        assert [json.loads(v)["id"] for _, _, v, _ in msgs].count(3) == 1, msgs
    finally:
        for p in (second, first):
            if p is not None:
                p.send_signal(signal.SIGTERM)
                p.wait(60)
        for f in logs:
            f.close()
    assert "took over this pipeline (fenced)" in text and "`cdc-fence-me`" in text, text[-2000:]


def test_kafka_connect_reads_the_debezium_topic(spark_tables, warehouse, kafka, tmp_path):
    """A real Kafka Connect worker (standalone) with JsonConverter (schemas.enable=true) and the file sink connector
    consumes the topic without a conversion error."""
    topic = f"connect-{uuid.uuid4().hex[:8]}"
    cfg = config(tmp_path, warehouse, "db.mor_v3", kafka_section(kafka["bootstrap"], topic, format="debezium", schemas_enable=True, initial="earliest"))
    run_cdc("sync", "--config", cfg)
    n = len(consume(kafka["bootstrap"], topic))
    assert n > 0
    peers = os.environ.get("PEERS_DIR", os.path.join(ROOT, ".peers"))
    out = tmp_path / "connect-out.txt"
    port = free_port()
    (tmp_path / "worker.properties").write_text("\n".join([
        f"bootstrap.servers={kafka['bootstrap']}",
        "key.converter=org.apache.kafka.connect.storage.StringConverter",
        "value.converter=org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable=true",
        f"offset.storage.file.filename={tmp_path / 'offsets'}",
        "consumer.isolation.level=read_committed",
        "consumer.auto.offset.reset=earliest",
        f"listeners=http://127.0.0.1:{port}",
        "plugin.discovery=only_scan",
    ]) + "\n")
    (tmp_path / "sink.properties").write_text("\n".join([
        "name=file-sink", "connector.class=org.apache.kafka.connect.file.FileStreamSinkConnector", "tasks.max=1",
        f"file={out}", f"topics={topic}", "errors.tolerance=none",
    ]) + "\n")
    log = open(tmp_path / "connect.log", "w")
    worker = subprocess.Popen(["java", "-Xmx512m", "-cp", os.path.join(peers, "kafka", "lib", "*"), "org.apache.kafka.connect.cli.ConnectStandalone",
                               str(tmp_path / "worker.properties"), str(tmp_path / "sink.properties")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        lines = []
        while time.time() < deadline:
            if out.exists():
                lines = out.read_text().splitlines()
                if len(lines) >= n:
                    break
            assert worker.poll() is None, open(tmp_path / "connect.log").read()[-3000:]
            time.sleep(1)
        import urllib.request
        status = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/connectors/file-sink/status"))
    finally:
        worker.terminate()
        worker.wait(60)
        log.close()
    text = open(tmp_path / "connect.log").read()
    assert len(lines) == n, f"{len(lines)} of {n} records reached the file sink\n{text[-3000:]}"
    assert status["tasks"][0]["state"] == "RUNNING", status
    assert "DataException" not in text and "Converting byte[] to Kafka Connect data failed" not in text, text[-3000:]
    records = [line for line in lines if line != "null"]
    assert records and all("op=" in line and "source=Struct{" in line for line in records), records[:3]


def test_broker_restart_mid_stream(spark, warehouse, kafka, tmp_path):
    """The service keeps publishing while the broker is killed and restarted: nothing lost, nothing twice."""
    topic = f"restart-{uuid.uuid4().hex[:8]}"
    src = keyed_table(spark, "restart_src")
    svc = service_config(tmp_path, warehouse, "restart", "restart_src", kafka_sink(kafka, topic, initial="earliest", format="json"))
    log = open(tmp_path / "svc.log", "w")
    svc_p = subprocess.Popen([CDC, "run", "--config", str(svc)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for i in range(12):
            spark.sql(f"INSERT INTO {src} VALUES ({i}, 'v{i}')")
            if i == 4:
                subprocess.run(["bash", KAFKA_SCRIPT, "kill", kafka["state"]], check=True)
            if i == 8:
                p = subprocess.run(["bash", KAFKA_SCRIPT, "start", kafka["state"]], capture_output=True, text=True)
                assert p.returncode == 0, p.stderr
            time.sleep(1)
        got = consume(kafka["bootstrap"], topic, expect=12, idle=30, limit=240)
        assert svc_p.poll() is None, "the service died"
    finally:
        svc_p.send_signal(signal.SIGTERM)
        svc_p.wait(90)
        log.close()
    ids = Counter(json.loads(v)["id"] for _, _, v, _ in got)
    assert ids == Counter(range(12)), f"missing {set(range(12)) - set(ids)}, twice {[k for k, c in ids.items() if c > 1]}"


def spark_table_rows(spark, name):
    spark.sql(f"REFRESH TABLE {name}")
    return Counter(tuple(r) for r in spark.table(name).collect())


def test_fan_out_iceberg_and_kafka_from_one_read(spark, spark_tables, warehouse, kafka, tmp_path):
    """`cdc sync` with [target] and [kafka]: one read of the source feeds both; Spark reads the target equal to the
    source, and the Debezium stream folds to the same table. A sink that is behind catches up alone first."""
    topic = f"fan-{uuid.uuid4().hex[:8]}"
    src = f"{CAT}.db.mor_v3"
    snaps = [r.snapshot_id for r in spark.sql(f"SELECT snapshot_id FROM {src}.snapshots ORDER BY committed_at").collect()]
    kafka_only = config(tmp_path, warehouse, "db.mor_v3", kafka_section(kafka["bootstrap"], topic, format="debezium"), "kafka-only.toml")
    run_cdc("sync", "--config", kafka_only, "--to-snapshot", str(snaps[2]))
    both = config(tmp_path, warehouse, "db.mor_v3",
                  kafka_section(kafka["bootstrap"], topic, format="debezium")
                  + f'[target]\ntable = "fan.mor_v3"\nformat_version = 3\n[target.catalog]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n',
                  "both.toml")
    # the Iceberg target has nothing: it copies the source at the Kafka sink's progress alone, then both share
    p = run_cdc("sync", "--config", both, "--to-snapshot", str(snaps[5]), "--log", "iceberg_cdc=info")
    assert "catching up alone" in p.stderr, p.stderr[-2000:]
    p = run_cdc("sync", "--config", both, "--log", "iceberg_cdc=info")
    assert "catching up alone" not in p.stderr, "in step, the sinks share one read"
    assert spark_table_rows(spark, f"{CAT}.fan.mor_v3") == spark_table_rows(spark, src)
    state = fold(consume(kafka["bootstrap"], topic))
    want = spark_rows(spark, src)
    assert set(state) == set(want)
    assert all(state[k]["name"] == r["name"] for k, r in want.items())


def test_service_fan_out(spark, warehouse, kafka, tmp_path):
    topic = f"svcfan-{uuid.uuid4().hex[:8]}"
    src = keyed_table(spark, "fan_src", "(1, 'a'), (2, 'b'), (3, 'c')", ", 'write.update.mode'='merge-on-read', 'write.delete.mode'='merge-on-read'")
    # the Iceberg sink deletes by position (no equality deletes) beside the Kafka sink
    iceberg = '[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "lake"\ntable = "fan.svc_replica"\ndelete_mode = "position"\n\n'
    svc = service_config(tmp_path, warehouse, "svcfan", "fan_src", iceberg + kafka_sink(kafka, topic, format="debezium"))
    with running_service(svc, tmp_path) as ended:
        time.sleep(3)
        spark.sql(f"UPDATE {src} SET v = 'a2' WHERE id = 1")
        spark.sql(f"DELETE FROM {src} WHERE id = 2")
        spark.sql(f"INSERT INTO {src} VALUES (4, 'd')")
        wait_until(lambda: spark_table_rows(spark, f"{CAT}.fan.svc_replica") == spark_table_rows(spark, src))
        state = fold(consume(kafka["bootstrap"], topic, idle=5))
    text = ended["log"]
    assert "sink=iceberg:fan.svc_replica+kafka:" in text, "one loop for both sinks"
    assert spark_table_rows(spark, f"{CAT}.fan.svc_replica") == spark_table_rows(spark, src)
    contents = {r.content for r in spark.sql(f"SELECT content FROM {CAT}.fan.svc_replica.all_delete_files").collect()}
    assert contents == {1}, f"position deletes only, and some: {contents}"
    assert {k: v["v"] for k, v in state.items()} == {key_of({"id": 1}): "a2", key_of({"id": 3}): "c", key_of({"id": 4}): "d"}


def test_initial_latest_publishes_only_what_comes_after(spark, warehouse, kafka, tmp_path):
    topic = f"latest-{uuid.uuid4().hex[:8]}"
    src = keyed_table(spark, "latest_src", "(1, 'old'), (2, 'old')")
    cfg = config(tmp_path, warehouse, "db.latest_src", kafka_section(kafka["bootstrap"], topic, initial="latest"))
    run_cdc("sync", "--config", cfg)  # records the current snapshot, publishes nothing
    spark.sql(f"INSERT INTO {src} VALUES (3, 'new')")
    run_cdc("sync", "--config", cfg)
    got = consume(kafka["bootstrap"], topic, idle=4)
    assert [(json.loads(v)["id"], json.loads(v)["_change_type"]) for _, _, v, _ in got] == [(3, "INSERT")]


def test_two_pipelines_of_one_source_never_share_a_progress_record(spark, warehouse, kafka, tmp_path):
    """`cdc sync` names its pipeline after the source table, so two configurations publishing one table to two topics
    through one progress topic would share a progress record: the second would find the first's progress and
    publish nothing to its own, empty topic, exiting 0. The record names its topic; the second run stops with exit 5
    and says what to do, and with its own progress topic it publishes everything."""
    topic = f"shared-{uuid.uuid4().hex[:8]}"
    keyed_table(spark, "shared_src", "(1, 'a'), (2, 'b')")
    first = config(tmp_path, warehouse, "db.shared_src", kafka_section(kafka["bootstrap"], topic), name="first.toml")
    run_cdc("sync", "--config", first)
    shared = f'progress_topic = "{topic}-progress"'
    second_section = kafka_section(kafka["bootstrap"], f"{topic}-other").replace(f'progress_topic = "{topic}-other-progress"', shared)
    second = config(tmp_path, warehouse, "db.shared_src", second_section, name="second.toml")
    p = run_cdc("sync", "--config", second, check=False)
    assert p.returncode == 5, (p.returncode, p.stderr)
    assert "another destination" in p.stderr and f"topic `{topic}`" in p.stderr and "progress_topic" in p.stderr, p.stderr
    assert consume(kafka["bootstrap"], f"{topic}-other", idle=3) == []
    own = config(tmp_path, warehouse, "db.shared_src", kafka_section(kafka["bootstrap"], f"{topic}-other"), name="own.toml")
    run_cdc("sync", "--config", own)
    got = consume(kafka["bootstrap"], f"{topic}-other", idle=4)
    assert sorted(json.loads(v)["id"] for _, _, v, _ in got) == [1, 2]
    # the first pipeline still resumes from its own record: nothing new, nothing again
    run_cdc("sync", "--config", first)
    assert len(consume(kafka["bootstrap"], topic, idle=4)) == 2


def test_the_service_follows_a_rollback_into_iceberg_and_kafka(spark, warehouse, kafka, tmp_path):
    """`cdc run` with an Iceberg and a Kafka sink while the owner rolls the source back, commits on the rolled-back
    line and cherry-picks (issue 49): no pipeline stops; Spark reads the target equal to the source after each, the
    Debezium stream folds to the same table, and the messages of each resync carry the `cdc.resync` header."""
    topic = f"rewrite-{uuid.uuid4().hex[:8]}"
    mor = ", 'write.update.mode'='merge-on-read', 'write.delete.mode'='merge-on-read'"
    src = keyed_table(spark, "rw_svc", ", ".join(f"({i}, 'v{i}')" for i in range(50)), mor)
    iceberg = '[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "lake"\ntable = "rw.svc_replica"\n\n'
    svc = service_config(tmp_path, warehouse, "rwsvc", "rw_svc", iceberg + kafka_sink(kafka, topic, format="debezium"))
    tgt = f"{CAT}.rw.svc_replica"

    def current():
        spark.sql(f"REFRESH TABLE {src}")
        return spark.sql(f"SELECT snapshot_id FROM {src}.history WHERE is_current_ancestor ORDER BY made_current_at DESC LIMIT 1").collect()[0][0]

    def in_step():
        return wait_until(lambda: spark_table_rows(spark, tgt) == spark_table_rows(spark, src), 90)

    with running_service(svc, tmp_path) as ended:
        assert in_step()
        base = current()
        spark.sql(f"DELETE FROM {src} WHERE id < 10")
        spark.sql(f"UPDATE {src} SET v = 'bad' WHERE id >= 40")
        assert in_step()
        spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.rw_svc', {base})")
        assert in_step(), "the rollback is followed"
        spark.sql(f"INSERT INTO {src} VALUES (100, 'new')")
        orphan = current()
        spark.sql(f"UPDATE {src} SET v = 'x' WHERE id = 1")
        assert in_step()
        spark.sql(f"CALL {CAT}.system.rollback_to_snapshot('db.rw_svc', {base})")
        spark.sql(f"CALL {CAT}.system.cherrypick_snapshot('db.rw_svc', {orphan})")
        assert in_step(), "the cherry-pick onto the older line is followed"
        got = consume(kafka["bootstrap"], topic, idle=6)
    text = ended["log"]
    assert "permanent" not in text, "no pipeline stopped"
    assert text.count("the source's history was rewritten") >= 2, text[-3000:]
    state = fold(got)
    want = spark_rows(spark, src)
    assert set(state) == set(want)
    assert all(state[k]["v"] == r["v"] for k, r in want.items())
    kinds = Counter(h.get("cdc.resync") for _, _, _, h in got)
    # the second rollback and the cherry-pick land as one rewrite, or as a rollback and an append, by poll timing
    assert kinds["rollback"] > 0 and kinds["rollback"] + kinds["rewrite"] >= 2, kinds
