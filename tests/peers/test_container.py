"""The container image, built and run (issue 54): podman (rootful, from Debian's packages) builds docker/Containerfile
on the base image scripts/base-image.sh makes from Debian packages with debootstrap (no image registry is reachable
here), around the `cdc` under test. The image is started with a service file and a warehouse mounted from the host;
it replicates a partitioned table Spark writes (an update, then a delete while it runs) into a replica Spark reads
equal to the source; its
HEALTHCHECK passes; it runs as the non-root user `cdc` (uid 999); and `podman stop` (SIGTERM) stops it cleanly, exit
code 0. The container shares the host's network (the CNI bridge plugins are not installed here)."""
import os
import resource
import shutil
import subprocess
import time
import uuid

import pytest

from conftest import CDC, ROOT, free_port, wait_until
from spark_workloads import CAT

BASE = "localhost/cdc-base:bookworm"


def podman(*args, check=True, timeout=600):
    p = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    return p


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    assert shutil.which("podman"), "podman is not installed: run scripts/setup-peers.sh (Debian packages podman, buildah, crun, debootstrap)"
    # the base image from Debian's packages (setup-peers.sh made it already; this is a no-op then)
    base = subprocess.run(["bash", os.path.join(ROOT, "scripts", "base-image.sh")], capture_output=True, text=True, timeout=1200)
    assert base.returncode == 0, base.stderr[-3000:]
    ctx = tmp_path_factory.mktemp("image")
    shutil.copy(CDC, ctx / "cdc")
    tag = f"localhost/iceberg-cdc:test-{uuid.uuid4().hex[:8]}"
    podman("build", "--format", "docker", "--isolation", "chroot", "--build-arg", f"BASE={BASE}", "-f",
           os.path.join(ROOT, "docker", "Containerfile"), "-t", tag, str(ctx), timeout=900)
    yield tag
    podman("rmi", "-f", tag, check=False)


def test_the_image_replicates_reports_healthy_runs_as_non_root_and_stops_on_sigterm(image, spark, warehouse, tmp_path):
    src = f"{CAT}.db.container_{uuid.uuid4().hex[:6]}"
    spark.sql(f"CREATE TABLE {src} (id BIGINT NOT NULL, v STRING) USING iceberg PARTITIONED BY (bucket(2, id)) "
              "TBLPROPERTIES ('format-version'='2', 'write.delete.mode'='merge-on-read', 'write.update.mode'='merge-on-read')")
    spark.sql(f"ALTER TABLE {src} SET IDENTIFIER FIELDS id")
    spark.sql(f"INSERT INTO {src} VALUES " + ", ".join(f"({i}, 'v{i}')" for i in range(20)))
    spark.sql(f"UPDATE {src} SET v = 'changed' WHERE id < 5")
    work = tmp_path / "work"
    replica = work / "replica"
    replica.mkdir(parents=True)
    port = free_port()
    svc = work / "service.toml"
    svc.write_text(
        f'[service]\npoll_interval = "500ms"\nmetrics_address = "0.0.0.0:{port}"\nshutdown_timeout = "20s"\n\n'
        f'[catalogs.lake]\ntype = "hadoop"\nwarehouse = "{warehouse}"\n\n'
        f'[catalogs.replica]\ntype = "hadoop"\nwarehouse = "{replica}"\n\n'
        f'[[pipelines]]\nname = "orders"\nsource = {{ catalog = "lake", table = "{src.split(".", 1)[1]}" }}\n'
        '[[pipelines.sinks]]\ntype = "iceberg"\ncatalog = "replica"\ntable = "demo.orders"\n'
    )
    # the container's user (uid 999) writes the replica; it reads the source, which Spark wrote world-readable into
    # a warehouse made private by mkdtemp: it may look in
    subprocess.run(["chown", "-R", "999:999", str(work)], check=True)
    os.chmod(warehouse, 0o755)
    name = f"cdc-test-{uuid.uuid4().hex[:8]}"
    # the image's HEALTHCHECK asks 9464; this test's service listens on a free port of the shared network
    # no systemd here to run the health check on a timer: it is run by hand below; the limits are this process's
    # (podman would raise open files and processes beyond what this machine lets a process have)
    nofile = ":".join(map(str, resource.getrlimit(resource.RLIMIT_NOFILE)))
    podman("run", "-d", "--name", name, "--network", "host", "--ulimit", f"nofile={nofile}", "--ulimit", "nproc=4096:4096",
           "-v", f"{work}:{work}", "-v", f"{warehouse}:{warehouse}:ro",
           "-v", f"{svc}:/etc/cdc/service.toml:ro", "--health-cmd", f"curl -fsS http://127.0.0.1:{port}/healthz || exit 1",
           "--health-interval", "disable", image)
    try:
        def rows(name):
            spark.sql(f"REFRESH TABLE {name}") if not name.startswith("/") else None
            df = spark.read.format("iceberg").load(name) if name.startswith("/") else spark.table(name)
            return sorted(tuple(r) for r in df.collect())

        def replica_rows():
            try:
                return rows(str(replica / "demo" / "orders"))
            except Exception:  # not created yet
                return None

        assert wait_until(lambda: replica_rows() == rows(src), 90), (replica_rows(), podman("logs", name, check=False).stderr[-3000:])
        spark.sql(f"DELETE FROM {src} WHERE id >= 15")
        assert wait_until(lambda: replica_rows() == rows(src), 60), (replica_rows(), podman("logs", name, check=False).stderr[-3000:])
        assert wait_until(lambda: podman("healthcheck", "run", name, check=False).returncode == 0, 30), podman("logs", name, check=False).stderr[-3000:]
        assert podman("exec", name, "id", "-u").stdout.strip() == "999", "runs as the image's non-root user"
        assert podman("exec", name, "id", "-un").stdout.strip() == "cdc"
        t0 = time.time()
        podman("stop", "-t", "30", name)
        assert time.time() - t0 < 25, "stopped by SIGTERM, not killed at the timeout"
        state = podman("inspect", name, "--format", "{{.State.ExitCode}}").stdout.strip()
        logs = podman("logs", name, check=False)
        assert state == "0", (state, logs.stderr[-3000:])
        assert "shutting down" in logs.stdout + logs.stderr
    finally:
        podman("rm", "-f", name, check=False)
