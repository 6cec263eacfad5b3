"""Operating the service with the tools people already use (issue 54):
- the Prometheus alerting rules shipped in docker/prometheus load in Prometheus's own `promtool` and pass their rule
  unit tests (each alert fires on the series that should trip it and stays quiet on a healthy or idle pipeline);
- the status page at `/` of the telemetry address, rendered by a real headless Chromium (its JavaScript run against
  the live `/status`), lists every pipeline with its state, a failing one shown as failing, and loads no external
  asset.
Both tools come from Debian's packages (scripts/setup-peers.sh); a missing one fails these tests, never skips them."""
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request

from conftest import CDC, ROOT, free_port, run_cdc, wait_until

RULES = os.path.join(ROOT, "docker", "prometheus")


def tool(name):
    path = shutil.which(name)
    assert path, f"{name} is not installed: run scripts/setup-peers.sh (Debian package {'prometheus' if name == 'promtool' else name})"
    return path


def test_the_alert_rules_load_in_promtool_and_pass_their_unit_tests():
    check = subprocess.run([tool("promtool"), "check", "rules", "cdc-rules.yml"], cwd=RULES, capture_output=True, text=True)
    assert check.returncode == 0 and "SUCCESS: 8 rules found" in check.stdout, check.stdout + check.stderr
    test = subprocess.run([tool("promtool"), "test", "rules", "cdc-rules.test.yml"], cwd=RULES, capture_output=True, text=True)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


def test_the_status_page_shows_each_pipeline_and_a_failing_one_as_failing(tmp_path):
    qs = tmp_path / "qs"
    run_cdc("quickstart", "--changes-only", "--dir", str(qs))
    port = free_port()
    svc = tmp_path / "service.toml"
    svc.write_text(
        f'[service]\npoll_interval = "500ms"\nmetrics_address = "127.0.0.1:{port}"\n\n'
        f'[catalogs.lake]\ntype = "sql"\nwarehouse = "{qs / "warehouse"}"\n\n'
        '[[pipelines]]\nname = "good"\nsource = { catalog = "lake", table = "demo.orders" }\n'
        f'[[pipelines.sinks]]\ntype = "jsonl"\npath = "{tmp_path / "good.jsonl"}"\n\n'
        '[[pipelines]]\nname = "bad"\nsource = { catalog = "lake", table = "demo.missing" }\n'
        f'[[pipelines.sinks]]\ntype = "jsonl"\npath = "{tmp_path / "bad.jsonl"}"\n'
    )
    log_path = tmp_path / "svc.log"
    with open(log_path, "w") as log:
        p = subprocess.Popen([CDC, "run", "--config", str(svc)], stdout=log, stderr=subprocess.STDOUT)
        try:
            def states():
                try:
                    st = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2))
                    return {x["pipeline"]: x["state"] for x in st["pipelines"]}
                except OSError:
                    return {}
            assert wait_until(lambda: states() == {"good": "ok", "bad": "failing"}, 30), (states(), log_path.read_text()[-2000:])
            page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5)
            assert page.headers["Content-Type"].startswith("text/html")
            html = page.read().decode()
            assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', html), "the page loads no external asset"
            # a real browser runs the page's script against the live /status
            dom = subprocess.run([tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                  "--virtual-time-budget=8000", "--dump-dom", f"http://127.0.0.1:{port}/"],
                                 capture_output=True, text=True, timeout=120)
            assert dom.returncode == 0, dom.stderr[-2000:]
            rows = {pipeline: state for state, pipeline in re.findall(r'<tr data-state="([^"]+)" data-pipeline="([^"]+)"', dom.stdout)}
            assert rows == {"good": "ok", "bad": "failing"}, dom.stdout[-3000:]
            bad = dom.stdout[dom.stdout.index('data-pipeline="bad"'):]
            bad = bad[:bad.index("</tr>")]
            assert "demo.missing" in bad and "not found" in bad, f"the failing row shows its error: {bad}"
            assert "1 not ok" in dom.stdout and '<span id="problem"></span>' in dom.stdout, dom.stdout[-3000:]
        finally:
            p.send_signal(signal.SIGTERM)
            rc = p.wait(60)
    assert rc == 0, log_path.read_text()[-2000:]


KUBE = os.path.join(ROOT, "docker", "kubernetes")
MODELS = {("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Service"): "V1Service", ("apps/v1", "StatefulSet"): "V1StatefulSet",
          ("apps/v1", "Deployment"): "V1Deployment"}


def test_the_kubernetes_examples_are_valid_objects_and_their_config_passes_validation(tmp_path):
    """Offline: every document of docker/kubernetes/*.yaml deserializes into its Kubernetes API model (the official
    Python client's, with client-side validation) and serializes back unchanged — a misspelt or misplaced key is
    dropped by the model and shows as a difference; the probes hit /healthz and /readyz on the metrics port the
    embedded service file listens on; the StatefulSet's shard count is its replica count; the containers run as the
    image's non-root user; and each embedded service file passes `cdc`'s own validation (it gets as far as the
    catalogs, which do not exist here: exit 9, never 3)."""
    import yaml
    from kubernetes import client
    api = client.ApiClient()
    files = sorted(f for f in os.listdir(KUBE) if f.endswith(".yaml"))
    assert files == ["deployment-cluster.yaml", "statefulset.yaml"], files
    for f in files:
        docs = [d for d in yaml.safe_load_all(open(os.path.join(KUBE, f))) if d]
        kinds = [d["kind"] for d in docs]
        for doc in docs:
            model = MODELS[(doc["apiVersion"], doc["kind"])]
            obj = api._ApiClient__deserialize(doc, model)
            assert api.sanitize_for_serialization(obj) == doc, f"{f} {doc['kind']}: keys the API does not know (or of the wrong type)"
            if doc["kind"] in ("StatefulSet", "Deployment"):
                pod = doc["spec"]["template"]["spec"]
                c = pod["containers"][0]
                assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
                assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
                assert c["ports"][0]["containerPort"] == 9464
                assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 999
                assert pod["terminationGracePeriodSeconds"] > 30, "longer than the service's shutdown_timeout"
                if doc["kind"] == "StatefulSet":
                    assert f'/{doc["spec"]["replicas"]}"' in c["command"][-1], "the shard count is the replica count"
            if doc["kind"] == "ConfigMap":
                toml = doc["data"]["service.toml"]
                assert 'metrics_address = "0.0.0.0:9464"' in toml
                cfg = tmp_path / f"{f}.toml"
                cfg.write_text(toml)
                p = subprocess.run([CDC, "check", "--matches-only", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
                assert p.returncode == 9 and "FAIL  catalog lake" in p.stdout, (f, p.returncode, p.stdout, p.stderr)
        assert "ConfigMap" in kinds
