"""The maintenance operator, through a real spark-submit of ``spark_jobs/maintenance.py``: it
compacts a stream's Delta table, and a vacuum that a reader forbids fails the task naming
the reader (an allowed vacuum: tests/spark_jobs/test_maintenance.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs.runtime.session import connector_jars
from spark_jobs.stream_spec.layout import default_spec_dir
from streamops.operators.maintenance import MaintainTablesOperator


@pytest.fixture
def stream(tmp_path: Path, monkeypatch) -> tuple[Path, Path, Path]:
    """The sensors stream with its windows in a Delta table of three small files."""
    specs = tmp_path / "streams"
    shutil.copytree(default_spec_dir(), specs)
    data = yaml.safe_load((specs / "sensors.yaml").read_text())
    data["outputs"][1]["sink"] = {"type": "delta", "path": "delta/sensors/windows"}
    (specs / "sensors.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STREAMS", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # spark-submit
    return specs, tmp_path / "data", tmp_path / "data" / "delta" / "sensors" / "windows"


def maintain(specs: Path, data_root: Path, retention: str) -> dict | AirflowFailException:
    op = MaintainTablesOperator(task_id="maintain", stream="sensors", spec_dir=str(specs), data_root=str(data_root),
                                conn_id="spark_streams", jars=",".join(connector_jars()), retention=retention,
                                conf={"spark.ui.enabled": "false"})
    try:
        return op.execute({"run_id": "manual__2026-01-01T00:00:00+00:00"})
    except AirflowFailException as exc:
        return exc


def test_the_operator_compacts_then_fails_naming_the_reader_a_vacuum_would_harm(spark, stream) -> None:
    specs, data_root, table = stream
    for i in range(3):
        spark.range(i, i + 1).write.format("delta").mode("append").save(str(table))
    quality = data_root / "quality" / "sensors"  # a validation read version 1; version 2 rewrote the table since
    quality.mkdir(parents=True)
    (quality / "ledger.json").write_text(json.dumps({"outputs": {"site_temperature_10m": {"units": {
        "2026-01-01T00:10:00Z": {"unit": "2026-01-01T00:10:00Z", "version": 1}}}}}))

    refused = maintain(specs, data_root, "0 seconds")
    assert isinstance(refused, AirflowFailException)
    assert "the last validation of output site_temperature_10m (version 1), to be rerun" in str(refused)
    (result,) = (data_root / "maintenance" / "sensors" / "runs").glob("*.json")
    (entry,) = json.loads(result.read_text())["tables"]
    assert (entry["before"]["files"], entry["after"]["files"]) == (3, 1)  # compacted all the same
    assert entry["optimize"] == {"files_removed": 3, "files_added": 1}
    assert "refused" in entry["vacuum"]
    assert sorted(r.id for r in spark.read.format("delta").load(str(table)).collect()) == [0, 1, 2]
    assert spark.read.format("delta").option("versionAsOf", 1).load(str(table)).count() == 2  # still readable
