"""The platform under a real Airflow: API server, scheduler (LocalExecutor), DAG processor
and triggerer, on SQLite (the embedded default) and on PostgreSQL (as in production). A stream is deployed through its DAG, its driver is SIGKILLed,
the supervisor restarts it from the checkpoint, it catches up, its quality DAG validates
the closed units with Great Expectations, its scheduled restart runs, it is stopped
from its stop DAG, and every sink equals the ground truth; never two drivers at once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from airflow_harness import (  # tests/e2e/ is on sys.path (rootdir imports)
    Airflow,
    DriverWatcher,
    deploy,
    stream_drivers,
    wait_for,
)

from spark_jobs.checkpoint import last_batch
from spark_jobs.lease import read_holder
from spark_jobs.spec import INGEST_QUERY, Layout, default_spec_dir, load_spec
from spark_jobs.testdata import generate, verify
from streamops.health import Status, assess

pytestmark = pytest.mark.e2e

SPEC = default_spec_dir() / "sensors.yaml"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def metadata_url(request) -> str | None:  # noqa: ANN001
    """Airflow's metadata database: None for SQLite in the Airflow home, else a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return None
    url = request.getfixturevalue("postgres_database")
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def test_supervised_stream_survives_a_killed_driver_and_stops_on_request(tmp_path: Path, spark, metadata_url) -> None:
    data_root = tmp_path / "data"
    spec = load_spec(SPEC)
    layout = Layout(spec, data_root, default_spec_dir())
    readings = layout.checkpoint(INGEST_QUERY)
    assert generate.main(["--spec", str(SPEC), "--data-root", str(data_root), "--files", "30",
                          "--events-per-file", "40", "--seed", "5"]) == 0

    airflow = Airflow(tmp_path / "airflow", data_root, metadata_url)
    watcher = DriverWatcher()
    try:
        airflow.start()
        watcher.start()
        deploy(airflow, "sensors")

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
        # its */10 schedule may start a second run while the first one validates: every run must succeed
        wait_for(lambda: (states := [r["state"] for r in airflow.runs("stream_sensors_quality")])
                 and all(s == "success" for s in states), "the quality DAG to succeed", timeout=300, every=3)
        quality = json.loads((data_root / "quality" / "sensors" / "summary.json").read_text())
        assert quality["ok"]
        windows_validated = quality["outputs"]["site_temperature_10m"]["validated"]
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
        watcher.stop()
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)

    assert watcher.most == 1, f"{watcher.most} drivers ran at once"
    manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, spec, layout, manifest)
    assert report.ok, report.describe()
    # every window in the sink was validated, once (in append mode only closed windows reach it)
    windows = spark.read.parquet(layout.data("sinks/sensors/site_temperature_10m")).select("window_end").distinct()
    assert windows_validated == windows.count() > 0
    runs = json.loads((layout.lease_dir / "runs.json").read_text())
    assert [r["exit_code"] for r in runs] == [1, 0, 0]  # killed; stopped for the restart; stopped on request
