"""The platform under a real Airflow: API server, scheduler (LocalExecutor), DAG processor
and triggerer on SQLite. A stream is deployed through its DAG, its driver is SIGKILLed,
the supervisor restarts it from the checkpoint, it catches up, its quality DAG validates
the closed units with Great Expectations, its scheduled restart runs, it is stopped
from its stop DAG, and every sink equals the ground truth; never two drivers at once.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from spark_jobs import generate, verify
from spark_jobs.checkpoint import last_batch
from spark_jobs.lease import read_holder
from spark_jobs.spec import Layout, default_spec_dir, load_spec
from streamops.health import Status, assess

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SPEC = default_spec_dir() / "sensors.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str, timeout: float = 300, every: float = 0.5):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Airflow:
    """Airflow's own services for one test, on loopback, in a throwaway home."""

    SERVICES = (["api-server"], ["scheduler", "--skip-serve-logs"], ["dag-processor"], ["triggerer", "--skip-serve-logs"])

    def __init__(self, home: Path, data_root: Path):
        self.home = home
        port = free_port()
        self.env = dict(
            os.environ,
            AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
            AIRFLOW__CORE__PLUGINS_FOLDER=str(ROOT / "plugins"), AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db", AIRFLOW__CORE__LOAD_EXAMPLES="False",
            AIRFLOW__CORE__UNIT_TEST_MODE="False", AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__API__HOST="127.0.0.1", AIRFLOW__API__PORT=str(port),
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
            AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL="5",
            AIRFLOW_CONN_SPARK_STREAMS=json.dumps({"conn_type": "spark", "host": "local[2]"}),
            STREAMS_DATA_DIR=str(data_root), PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", TZ="UTC",
            PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        )
        self.procs: list[subprocess.Popen] = []

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(BIN / "airflow"), *args], env=self.env, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
        return result

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.cli("db", "migrate")
        for service in self.SERVICES:
            log = open(self.home / f"{service[0]}.log", "w")  # noqa: SIM115 - closed with the process
            self.procs.append(subprocess.Popen([str(BIN / "airflow"), *service], env=self.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def dag_ids(self) -> set[str]:
        result = self.cli("dags", "list", "-o", "json", check=False)
        return {d["dag_id"] for d in json_lines(result.stdout)} if result.returncode == 0 else set()

    def runs(self, dag_id: str) -> list[dict]:
        return json_lines(self.cli("dags", "list-runs", dag_id, "-o", "json").stdout)


def json_lines(stdout: str) -> list[dict]:
    """The JSON list an airflow CLI command printed (it may print log lines too)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("["):
            return json.loads(line)
    return []


def stream_drivers() -> list[int]:
    """Python driver processes of the stream job on this machine."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and argv[1].endswith(b"stream_job.py") and b"python" in argv[0]:
            pids.append(int(entry.name))
    return pids


def test_supervised_stream_survives_a_killed_driver_and_stops_on_request(tmp_path: Path, spark) -> None:
    data_root = tmp_path / "data"
    spec = load_spec(SPEC)
    layout = Layout(spec, data_root, default_spec_dir())
    readings = layout.checkpoint("readings")
    assert generate.main(["--spec", str(SPEC), "--data-root", str(data_root), "--files", "30",
                          "--events-per-file", "40", "--seed", "5"]) == 0

    airflow = Airflow(tmp_path / "airflow", data_root)
    most_drivers, watching = [0], threading.Event()

    def watch_drivers() -> None:
        while not watching.is_set():
            most_drivers[0] = max(most_drivers[0], len(stream_drivers()))
            watching.wait(0.1)

    watcher = threading.Thread(target=watch_drivers, daemon=True)
    try:
        airflow.start()
        watcher.start()
        wait_for(lambda: {"stream_sensors", "stream_sensors_stop"} <= airflow.dag_ids(),
                 "the DAG processor to parse stream_sensors", timeout=180, every=2)
        airflow.cli("dags", "unpause", "stream_sensors")
        airflow.cli("dags", "unpause", "stream_sensors_stop")
        airflow.cli("dags", "trigger", "stream_sensors")

        # deployed: batches get committed
        wait_for(lambda: (last_batch(readings, "commits") or -1) >= 1, "2 committed batches", timeout=240)

        # SIGKILL the driver; the supervisor restarts it from the checkpoint
        first = read_holder(layout.lease_dir)
        killed_at = time.time()
        os.kill(first.pid, signal.SIGKILL)
        new_commit = wait_for(
            lambda: any(p.stat().st_mtime > killed_at for p in (Path(readings) / "commits").glob("[0-9]*")),
            "a batch committed after the kill", timeout=240, every=0.2)
        recovered = time.time() - killed_at
        print(f"kill -9 to first new committed batch: {recovered:.1f}s")
        second = read_holder(layout.lease_dir)
        assert new_commit and second is not None and second.pid != first.pid

        # it catches up with every file
        wait_for(lambda: assess(spec, layout).status == Status.IDLE, "the stream to catch up", timeout=300, every=2)

        # data quality: unpaused, the quality DAG validates the closed units of the live sinks
        airflow.cli("dags", "unpause", "stream_sensors_quality")
        wait_for(lambda: [r["state"] for r in airflow.runs("stream_sensors_quality")] == ["success"],
                 "the quality DAG to succeed", timeout=300, every=3)
        quality = json.loads((data_root / "quality" / "sensors" / "summary.json").read_text())
        assert quality["ok"] and quality["outputs"]["site_temperature_10m"]["validated"] >= 1
        assert quality["outputs"]["device_status"]["validated"] == 1
        balances = {b["output"]: b["status"] for b in quality["accounting"]["balances"]}
        assert balances["device_status"] in ("balanced", "incomplete"), balances  # incomplete: an event lost in the kill

        # the scheduled restart: unpaused, its cron's latest interval runs at once: a graceful stop,
        # a resume from the checkpoint and a new driver, with the downtime logged
        before_restart = read_holder(layout.lease_dir)
        airflow.cli("dags", "unpause", "stream_sensors_restart")
        wait_for(lambda: [r["state"] for r in airflow.runs("stream_sensors_restart")] == ["success"],
                 "the scheduled restart to succeed", timeout=300, every=3)
        third = read_holder(layout.lease_dir)
        assert third is not None and third.pid != before_restart.pid
        downtime = airflow.cli("tasks", "state", "stream_sensors_restart", "downtime",
                               airflow.runs("stream_sensors_restart")[0]["run_id"]).stdout
        assert "success" in downtime

        # stop from the stop DAG (graceful), which waits for the driver to exit
        airflow.cli("dags", "trigger", "stream_sensors_stop", "--conf", json.dumps({"mode": "graceful"}))
        wait_for(lambda: [r["state"] for r in airflow.runs("stream_sensors_stop")] == ["success"],
                 "the stop DAG to succeed", timeout=180, every=3)
        wait_for(lambda: stream_drivers() == [], "the driver process to exit", timeout=60)
        wait_for(lambda: [r["state"] for r in airflow.runs("stream_sensors")] == ["success", "success"],
                 "both supervisor runs to end", timeout=120, every=3)
    finally:
        watching.set()
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)

    assert most_drivers[0] == 1, f"{most_drivers[0]} drivers ran at once"
    manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, spec, layout, manifest)
    assert report.ok, report.describe()
    runs = json.loads((layout.lease_dir / "runs.json").read_text())
    assert [r["exit_code"] for r in runs] == [1, 0, 0]  # killed; stopped for the restart; stopped on request
