"""What an idle poll costs a REST catalog: requests and bytes per poll per table, with and without conditional loads.

The Apache Iceberg REST catalog server (`scripts/rest-catalog.sh`, iceberg-open-api 1.10.1) sends no `ETag`, so every
poll of a caught-up pipeline loads the whole table metadata of its source and its target. Servers that do send one
(Polaris, Gravitino, Unity Catalog, as the REST spec allows) answer a conditional load (`If-None-Match`) of an
unchanged table with a bodiless `304`. This bench puts a counting proxy between `cdc run` and the real server, and
runs the same service twice in one sitting:
- **no ETag**: the proxy passes everything through (the server as it is);
- **ETag**: the proxy adds `ETag: "<hash of the metadata location>"` to every table load and answers a load whose
  `If-None-Match` names the current one `304 Not Modified` without a body (what those servers do; the proxy still
  asks the real server, so correctness never depends on it).

Setup: the quickstart's source is copied by `cdc sync` into the REST table `src.orders`; `--tables` pipelines
follow it into REST targets `rep.t<i>` at a `--poll` poll. Once every target is caught up, requests and response
bytes through the proxy are counted for `--seconds`, with the service's own poll count (`cdc_polls_total`). Prints
a Markdown table for README.md ("Service at scale").

    .peers/venv/bin/python benches/rest_polls.py [--cdc target/release/cdc] [--tables 20] [--poll 1] [--seconds 30]
"""
import argparse
import hashlib
import http.client
import http.server
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "peers"))
from conftest import free_port  # noqa: E402
TABLE_PATH = re.compile(r"^/v1/(?:[^/]+/)?namespaces/[^/]+/tables/[^/?]+(\?.*)?$")


class Counts:
    """Requests and response bytes through the proxy, by kind."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.by_kind = {}

    def add(self, kind, nbytes):
        with self.lock:
            n, b = self.by_kind.get(kind, (0, 0))
            self.by_kind[kind] = (n + 1, b + nbytes)

    def snapshot(self):
        with self.lock:
            return dict(self.by_kind)


def make_proxy(upstream_port, counts, mode):
    """A threading HTTP proxy to the REST server on `upstream_port`; `mode["etag"]` turns conditional loads on."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "if-none-match", "connection")}
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            status, out_headers = resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in ("transfer-encoding", "connection", "content-length")]
            kind = "other"
            if self.command == "GET" and TABLE_PATH.match(self.path):
                kind = "load table"
                if mode["etag"] and status == 200:
                    location = json.loads(data).get("metadata-location", "")
                    tag = '"' + hashlib.sha256(location.encode()).hexdigest()[:32] + '"'
                    out_headers.append(("ETag", tag))
                    if self.headers.get("If-None-Match") == tag:
                        status, data, kind = 304, b"", "load table: 304"
            elif self.path.endswith("/v1/config") or "/v1/config?" in self.path:
                kind = "config"
            elif self.command == "POST":
                kind = "commit or create"
            counts.add(kind, len(data))
            self.send_response(status)
            for k, v in out_headers:
                self.send_header(k, v)
            if status != 304:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if data and self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_POST = do_HEAD = do_DELETE = forward

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def metric_values(port, family):
    """The values of `family`'s series on the service's `/metrics` (None when it does not answer)."""
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    return [float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith(family + "{")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cdc", default=os.environ.get("CDC_BIN", os.path.join(ROOT, "target", "release", "cdc")))
    ap.add_argument("--tables", type=int, default=20)
    ap.add_argument("--poll", type=int, default=1)
    ap.add_argument("--seconds", type=int, default=30)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="rest-polls-")
    rest_dir = os.path.join(work, "rest")
    uri = subprocess.run(["bash", os.path.join(ROOT, "scripts", "rest-catalog.sh"), "start", rest_dir], capture_output=True, text=True, check=True).stdout.strip()
    upstream_port = int(uri.rsplit(":", 1)[1])
    counts, mode = Counts(), {"etag": False}
    proxy = make_proxy(upstream_port, counts, mode)
    proxied = f"http://127.0.0.1:{proxy.server_address[1]}"
    rows = []
    try:
        qs = os.path.join(work, "qs")
        subprocess.run([a.cdc, "quickstart", "--changes-only", "--dir", qs], check=True, capture_output=True)
        seed = os.path.join(work, "seed.toml")
        with open(os.path.join(qs, "cdc.toml")) as f:
            source_section = f.read().split("[target]")[0]
        with open(seed, "w") as f:
            f.write(source_section + f'\n[target]\ntable = "src.orders"\n[target.catalog]\ntype = "rest"\nuri = "{uri}"\n')
        subprocess.run([a.cdc, "sync", "--config", seed], check=True, capture_output=True)
        for label, etag in (("no ETag (the server as it is)", False), ("ETag + 304 (conditional loads)", True)):
            mode["etag"] = etag
            port = free_port()
            cfg = os.path.join(work, f"service-{int(etag)}.toml")
            text = (f'[service]\npoll_interval = "{a.poll}s"\nmetrics_address = "127.0.0.1:{port}"\n\n'
                    f'[catalogs.lake]\ntype = "rest"\nuri = "{proxied}"\n')
            for i in range(a.tables):
                text += (f'\n[[pipelines]]\nname = "t{i}"\nsource = {{ catalog = "lake", table = "src.orders" }}\n'
                         f'[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "lake"\ntable = "rep{int(etag)}.t{i}"\n')
            with open(cfg, "w") as f:
                f.write(text)
            proc = subprocess.Popen([a.cdc, "run", "--config", cfg], stdout=subprocess.DEVNULL, stderr=open(cfg + ".log", "w"))
            try:
                deadline = time.time() + 300
                while time.time() < deadline:
                    lag = metric_values(port, "cdc_replication_lag_snapshots")
                    if lag and len(lag) == a.tables and all(v == 0 for v in lag):
                        break
                    time.sleep(0.5)
                else:
                    sys.exit(f"the service did not catch up; see {cfg}.log")
                time.sleep(3 * a.poll)  # every loop has had an idle poll that remembered its marks
                counts.reset()
                p0 = sum(metric_values(port, "cdc_polls_total"))
                time.sleep(a.seconds)
                p1 = sum(metric_values(port, "cdc_polls_total"))
                got = counts.snapshot()
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
            polls = p1 - p0
            requests = sum(n for n, _ in got.values())
            nbytes = sum(b for _, b in got.values())
            detail = ", ".join(f"{k}: {n}" for k, (n, _) in sorted(got.items()))
            rows.append((label, polls, requests / polls, nbytes / polls, detail))
    finally:
        proxy.shutdown()
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "rest-catalog.sh"), "stop", rest_dir])
        shutil.rmtree(work, ignore_errors=True)
    print(f"### Idle polls on a REST catalog ({a.tables} caught-up pipelines sharing one source, poll {a.poll} s, {a.seconds} s)\n")
    print("| server | polls | requests per poll | response body bytes per poll | requests by kind |")
    print("|---|---:|---:|---:|---|")
    for label, polls, req, b, detail in rows:
        print(f"| {label} | {polls:.0f} | {req:.2f} | {b:,.0f} | {detail} |")


if __name__ == "__main__":
    main()
