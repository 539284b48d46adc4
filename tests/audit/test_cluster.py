"""A real standalone Spark cluster (one master, two workers on 127.0.0.1) gives the same verdict as local mode.

The cluster runs six JVMs (master, two workers, the driver, two executors) on what is, in CI, a 2-core machine, and
all of them are cold.  On tiny data the cost is start-up, not work: the default tiered JIT spends the cores
compiling code the short-lived JVMs barely use (C1 alone, ``-XX:TieredStopAtLevel=1``, halved the audit: about
97 s to 66 s), each executor compiles the generated code of every stage again, and parallel GC threads fight for the
same two cores.  Neither the web UI nor locality waits nor Python workers (journals need none) mattered much.  So
every JVM here runs C1 only with the serial collector, tasks do not wait for locality, and the driver has no UI.
Code generation stays on, as in production, so the comparison with the local session (which interprets
expressions) is also a check of both evaluation paths.  Marked ``slow``; CI runs every test, slow ones included.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.find_spark_home import _find_spark_home
from pyspark.sql import SparkSession

from rmpd.audit.job import run_audit

from .cases import write_case

REGISTER_TIMEOUT = 90.0
JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Short-lived JVMs on two cores: quick C1 compilation only, one GC thread."""
SUBMIT_ARGS = (
    "--conf spark.sql.shuffle.partitions=2 --conf spark.sql.adaptive.enabled=false "
    "--conf spark.executor.memory=1g --conf spark.locality.wait=0 --conf spark.ui.enabled=false "
    f"--driver-java-options '{JVM_OPTS}' --conf 'spark.executor.extraJavaOptions={JVM_OPTS}' pyspark-shell"
)
"""Tiny test data: few shuffle partitions, as in the local session; see the module docstring for the rest."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workers_alive(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as r:
            return int(json.load(r).get("aliveworkers", 0))
    except OSError:
        return 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start master and workers with spark-class; yield the master URL; stop them whatever happens."""
    spark_class = str(Path(_find_spark_home()) / "bin" / "spark-class")
    logs = tmp_path_factory.mktemp("cluster")
    env = os.environ | {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
                        "SPARK_DAEMON_JAVA_OPTS": JVM_OPTS}
    port, ui = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> None:
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process below)
        procs.append(subprocess.Popen([spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=env))

    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
              "--webui-port", str(ui))
        for n in range(2):
            start(f"worker{n}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "1536m", "--webui-port", str(_free_port()), "--work-dir", str(logs / f"w{n}"), url)
        deadline = time.monotonic() + REGISTER_TIMEOUT
        while _workers_alive(ui) < 2:
            dead = [p.args[1] for p in procs if p.poll() is not None]
            assert not dead, f"cluster process exited: {dead}; logs in {logs}"
            assert time.monotonic() < deadline, f"workers did not register within {REGISTER_TIMEOUT}s; logs in {logs}"
            # Block on the process list briefly instead of sleeping: returns early if something dies.
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[0].wait(timeout=0.5)
        yield url
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.mark.slow
def test_cluster_verdict_matches_local(spark: SparkSession, cluster: str, tmp_path: Path) -> None:
    path = write_case(tmp_path, "virtual-synchrony", base=90_000)
    local = run_audit(spark, [str(path)], examples=3).to_dict()
    out = tmp_path / "cluster.json"
    cmd = [sys.executable, "-c", "from cli.audit_cmd import audit_app; audit_app()",
           str(path), "--master", cluster, "--json", str(out), "--examples", "3"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_SUBMIT_ARGS": SUBMIT_ARGS})
    assert done.returncode == 1, done.stderr[-3000:]
    remote = json.loads(out.read_text())
    assert "virtual-synchrony" in done.stdout
    assert remote["invariants"] == local["invariants"]
    assert remote["records"] == local["records"]
