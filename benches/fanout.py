"""Fan-out at scale: one read of the source feeding an Iceberg target and a Kafka topic, against each sink alone.

Usage (after `benches/sync_vs_spark.py --rows N --keep WH` and `bash scripts/kafka.sh start STATE`, which prints the
bootstrap address):

    .peers/venv/bin/python benches/fanout.py WH N CDC_BINARY [RUNS] [--bootstrap HOST:PORT] [--format debezium]
        [--budget 256MiB] [--kinds both,iceberg,kafka]

Per run and kind, `cdc sync` of the kept table's MERGE (the last two snapshots, s1 -> s2) from the same start:
`iceberg` into the merge-on-read target (its metadata restored from the `.start` copy sync_vs_spark.py kept),
`kafka` to a fresh topic whose progress is first recorded at s1, `both` to the two at once. CPU and peak RSS come
from wait4 of the one process; the broker runs on the same cores and its CPU is not counted.

Recording s1 as the Kafka progress: `initial = "latest"` records the table's current snapshot, so the metadata
versions after s1 are moved aside for that one step and put back afterwards (also when it fails) — do not run
anything else on the warehouse meanwhile.
"""
import argparse
import glob
import json
import os
import shutil
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sync_vs_spark import measured  # noqa: E402  (wait4 of the one child)

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("warehouse")
ap.add_argument("rows", type=int)
ap.add_argument("binary")
ap.add_argument("runs", type=int, nargs="?", default=1)
ap.add_argument("--bootstrap", default="127.0.0.1:19092")
ap.add_argument("--format", default="debezium", choices=["json", "debezium"])
ap.add_argument("--budget", default="256MiB")
ap.add_argument("--kinds", default="both,iceberg,kafka")
args = ap.parse_args()

wh, name = args.warehouse, f"orders_{args.rows}"
src_meta = os.path.join(wh, "db", name, "metadata")
tgt_meta = os.path.join(wh, "cdc_target", name, "metadata")


def versions():
    vs = {}
    for f in glob.glob(os.path.join(src_meta, "v*.metadata.json")):
        v = int(os.path.basename(f)[1:].split(".")[0])
        vs[v] = json.load(open(f)).get("current-snapshot-id")
    return vs


vs = versions()
top = max(vs)
s2 = vs[top]
s1 = [vs[v] for v in sorted(vs) if vs[v] and vs[v] != s2][-1]
v1 = max(v for v in vs if vs[v] == s1)


def config(kind, topic, progress):
    path = os.path.join(wh, f"fan_{kind}_{name}.toml")
    s = f'[source]\ntable = "db.{name}"\n[source.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
    if kind in ("iceberg", "both"):
        s += f'[target]\ntable = "cdc_target.{name}"\n[target.catalog]\ntype = "hadoop"\nwarehouse = "{wh}"\n'
    if kind in ("kafka", "both", "mark"):
        s += (
            f'[kafka]\nbootstrap_servers = "{args.bootstrap}"\ntopic = "{topic}"\nformat = "{args.format}"\n'
            f'progress_topic = "{progress}"\ninitial = "latest"\n'
            'properties = { "compression.type" = "lz4", "linger.ms" = "20" }\n'
        )
    s += f'[engine]\nmemory_budget = "{args.budget}"\n'
    open(path, "w").write(s)
    return path


def record_kafka_progress_at_s1(topic, progress):
    aside = os.path.join(wh, "aside")
    os.makedirs(aside, exist_ok=True)
    hint = os.path.join(src_meta, "version-hint.text")
    old_hint = open(hint).read()
    moved = []
    try:
        for v in sorted(vs):
            if v > v1:
                f = os.path.join(src_meta, f"v{v}.metadata.json")
                shutil.move(f, aside)
                moved.append(f)
        open(hint, "w").write(str(v1))
        measured([args.binary, "sync", "--config", config("mark", topic, progress), "--json"])
    finally:
        for f in moved:
            shutil.move(os.path.join(aside, os.path.basename(f)), f)
        open(hint, "w").write(old_hint)


def restore_target():
    shutil.rmtree(tgt_meta)
    shutil.copytree(tgt_meta + ".start", tgt_meta)


print(f"s1={s1} (v{v1}) s2={s2} (v{top}) format={args.format} budget={args.budget}", flush=True)
print("| run | kind | wall s | CPU s | peak RSS MB | inserts / deletes / updates | source bytes read | spilled bytes |")
print("|---|---|---|---|---|---|---|---|")
for i in range(args.runs):
    for kind in args.kinds.split(","):
        tag = uuid.uuid4().hex[:8]
        topic, progress = f"fan-{tag}", f"fan-progress-{tag}"
        if kind in ("both", "kafka"):
            record_kafka_progress_at_s1(topic, progress)
        if kind in ("both", "iceberg"):
            restore_target()
        wall, cpu, rss, out, _ = measured([args.binary, "sync", "--config", config(kind, topic, progress), "--json"])
        summary = json.loads(out)
        print(
            f"| {i + 1} | {kind} | {wall:.1f} | {cpu:.1f} | {rss:.0f} "
            f"| {summary.get('inserts')} / {summary.get('deletes')} / {summary.get('updates')} "
            f"| {summary.get('source_bytes_read')} | {summary.get('spilled_bytes')} |",
            flush=True,
        )
