"""A stream on a real Spark standalone cluster, deployed through its DAG with only the Airflow
connection changed; one of the two workers is SIGKILLed mid-run and the stream carries on
with nothing lost. The master and workers are the installed Spark distribution's own
classes (``spark-class``), on loopback. One output is a Python query whose module (from
``include/transforms/``, nowhere on the workers' path) defines a Python UDF: the job ships
the module with the application, and the executors on the workers run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from airflow_harness import (
    BIN,
    Airflow,
    deploy,
    example_spec,
    free_port,
    include_with,
    one_driver_at_a_time,
    stream_drivers,
    wait_for,
)

from runner.testdata import generate, verify
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import last_batch
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.health import Status, assess

pytestmark = pytest.mark.e2e



#: The output's module. The UDF's own function travels by value (cloudpickle copies a function
#: it cannot find by its name, as a decorated one), but what it calls from another module
#: travels by reference: the executors must import ``cluster_code.rules``, from the shipped zip.
UDF_MODULE = """
from pyspark.sql import functions as F

from cluster_code.rules import classify


@F.udf("string")
def label(temperature):
    return classify(temperature)


def labelled(accepted):
    return accepted.select("event_id", label("temperature").alias("label"))
"""
RULES_MODULE = """
def classify(temperature):
    return "hot" if temperature is not None and temperature > 25 else "ok"
"""


class SparkCluster:
    """A standalone master and ``workers`` workers (one core each), each in its own process group."""

    def __init__(self, home: Path, workers: int = 2):
        self.home, self.port, self.ui = home, free_port(), free_port()
        self.env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(home / "logs"),
                        SPARK_WORKER_DIR=str(home / "work"))
        self.workers: list[subprocess.Popen] = []
        self.count = workers
        self.master: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _start(self, *args: str, log: str) -> subprocess.Popen:
        self.home.mkdir(parents=True, exist_ok=True)
        out = open(self.home / log, "w")  # closed with the process
        return subprocess.Popen([str(BIN / "spark-class"), *args], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as response:
            return json.loads(response.read())

    def alive_workers(self) -> int:
        try:
            return int(self.state().get("aliveworkers", 0))
        except OSError:
            return 0

    def master_alive(self) -> bool:
        try:
            return self.state().get("status") == "ALIVE"
        except OSError:  # not listening yet
            return False

    def start(self) -> None:
        self.master = self._start("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                                  str(self.port), "--webui-port", str(self.ui), log="master.log")
        wait_for(self.master_alive, "the master", timeout=120, every=1)
        for i in range(self.count):
            self.workers.append(self._start("org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                                            "--cores", "1", "--memory", "2g", "--webui-port", str(free_port()),
                                            "--work-dir", str(self.home / f"work-{i}"), log=f"worker-{i}.log"))
        wait_for(lambda: self.alive_workers() == self.count, f"{self.count} workers", timeout=120, every=1)

    def kill_worker(self, index: int) -> None:
        """SIGKILL a worker and the executors it launched (its process group)."""
        os.killpg(self.workers[index].pid, signal.SIGKILL)
        self.workers[index].wait()

    def stop(self) -> None:
        for p in [*self.workers, self.master]:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def test_stream_runs_on_a_standalone_cluster_and_survives_a_lost_worker(tmp_path: Path, spark) -> None:
    data_root = tmp_path / "data"
    sensors = example_spec("sensors")
    sensors["source"]["max_files_per_trigger"] = 2  # 15 batches: the lost worker lands mid-way
    sensors["outputs"].append({"name": "labels", "mode": "append", "sink": {"type": "parquet", "path": "sinks/labels"},
                               "query": {"type": "python", "python": "cluster_code.labels:labelled"}})
    spec_dir = include_with(tmp_path / "include", sensors)
    package = tmp_path / "include" / "transforms" / "cluster_code"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "labels.py").write_text(UDF_MODULE)
    (package / "rules.py").write_text(RULES_MODULE)
    spec = load_spec(spec_dir / "sensors.yaml")
    layout = Layout(spec, data_root, spec_dir)
    plan = compile_plan(spec, layout)
    readings = plan.checkpoint(INGEST_FLOW)
    assert generate.main(["--spec", str(spec_dir / "sensors.yaml"), "--data-root", str(data_root), "--files", "30",
                          "--events-per-file", "40", "--seed", "9"]) == 0

    cluster = SparkCluster(tmp_path / "spark")
    airflow = Airflow(tmp_path / "airflow", data_root, spark_master=cluster.url,
                      extra_env={"STREAMS_SPEC_DIR": str(spec_dir)})
    try:
        cluster.start()
        airflow.start()
        deploy(airflow, "sensors")

        # the application runs on the cluster, its executors on both workers
        wait_for(lambda: (last_batch(readings, "commits") or -1) >= 1, "2 committed batches", timeout=300)
        apps = cluster.state()["activeapps"]
        assert [a["name"] for a in apps] == ["stream:sensors"], apps
        wait_for(lambda: sum(w["coresused"] for w in cluster.state()["workers"]) == 2, "executors on both workers",
                 timeout=120, every=1)

        # a worker dies with its executor; the stream carries on with the other
        before = last_batch(readings, "commits")
        cluster.kill_worker(0)
        wait_for(lambda: cluster.alive_workers() == 1, "the master to notice the lost worker", timeout=180, every=2)
        wait_for(lambda: (last_batch(readings, "commits") or -1) > before + 1, "batches after the lost worker",
                 timeout=300)
        wait_for(lambda: assess(plan, layout).status == Status.IDLE, "the stream to catch up", timeout=400, every=2)

        airflow.cli("dags", "trigger", "stream_sensors_stop", "--conf", json.dumps({"mode": "graceful"}))
        wait_for(lambda: [r["state"] for r in airflow.runs("stream_sensors_stop")] == ["success"],
                 "the stop DAG to succeed", timeout=180, every=3)
        wait_for(lambda: stream_drivers() == [], "the driver process to exit", timeout=60)
    finally:
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)
        cluster.stop()

    one_driver_at_a_time(layout)
    manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, plan, manifest)
    assert report.ok, report.describe()
    # the UDF ran in the executors on the workers (tasks never run in a client-mode driver), for every accepted row
    readings = spark.read.parquet(plan.accepted_path)
    labels = spark.read.parquet(str(data_root / "sinks" / "labels"))
    assert labels.count() == readings.count() > 0
    wrong = labels.join(readings, "event_id").where(
        "label != CASE WHEN temperature > 25 THEN 'hot' ELSE 'ok' END")
    assert wrong.count() == 0, wrong.limit(5).collect()
