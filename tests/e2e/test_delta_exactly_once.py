"""Delta tables exactly once through real spark-submit runs killed with SIGKILL.

The sensors stream with every output in a Delta table (append: its readings and its
windows; update: each device's status; complete: readings per site) is killed three times
mid-way, once after its outputs' last commits were taken away so that they replay their
last batch into tables that already hold it, and then caught up with an available-now
run. Every table must equal the generator's ground truth, hold each batch in one version
only, and every version must come from a driver whose lease was current: its epoch never
goes back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_harness import example_spec, include_with
from stream_driver import Driver, wait_for

from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_ids, last_batch, query_id
from spark_jobs.runtime.lease import record_numbers
from spark_jobs.sinks.delta import committed_batches
from spark_jobs.spec.layout import Layout
from spark_jobs.spec.loading import load_spec
from spark_jobs.spec.models import INGEST_QUERY
from spark_jobs.testdata import generate, verify

pytestmark = pytest.mark.e2e

FILES = 30  # two files per micro-batch: 15 batches, so that three kills land mid-way


def delta_spec() -> dict:
    sensors = example_spec("sensors")
    sensors["source"]["max_files_per_trigger"] = 2
    for output in sensors["outputs"]:
        partition_by = output["sink"].get("partition_by")
        output["sink"] = {"type": "delta", "path": f"delta/sensors/{output['name']}",
                          **({"partition_by": partition_by} if partition_by else {})}
    sensors["outputs"].append({
        "name": "site_readings", "mode": "complete", "sink": {"type": "delta", "path": "delta/sensors/site_readings"},
        "query": {"type": "aggregate", "group_by": ["site"], "aggregates": [{"name": "readings", "fn": "count"}]}})
    return sensors


def test_delta_tables_survive_three_kills_and_a_replay_exactly_once(tmp_path: Path, spark) -> None:  # noqa: ANN001
    data_root = tmp_path / "data"
    spec_dir = include_with(tmp_path / "include", delta_spec())
    spec_path = spec_dir / "sensors.yaml"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(data_root), "--files", str(FILES),
                          "--events-per-file", "40", "--seed", "13"]) == 0
    spec = load_spec(spec_path)
    layout = Layout(spec, data_root, spec_dir)
    plan = compile_plan(spec, layout)
    ingestion = plan.checkpoint(INGEST_QUERY)
    logs = tmp_path / "logs"
    logs.mkdir()
    drivers: list[Driver] = []
    try:
        for kill in range(3):
            driver = Driver(spec_path, data_root, logs, "--processing-time", "1 second")
            drivers.append(driver)
            done = len(batch_ids(ingestion, "commits"))
            wait_for(lambda d=done: len(batch_ids(ingestion, "commits")) >= d + 2, "2 more batches", driver.proc)
            driver.kill()
            assert len(batch_ids(ingestion, "commits")) < FILES // 2, "the stream finished before it was killed"
            if kill == 0:  # the outputs' last batches replay: their rows are in the tables, their commits gone
                for output in plan.queried_outputs:
                    checkpoint = Path(plan.checkpoint(output.name))
                    last = last_batch(checkpoint, "commits")
                    if last is not None:
                        (checkpoint / "commits" / str(last)).unlink()
                        (checkpoint / "commits" / f".{last}.crc").unlink(missing_ok=True)
        final = Driver(spec_path, data_root, logs, "--trigger", "available-now")
        drivers.append(final)
        assert final.wait() == 0, final.output()[-3000:]
    finally:
        for d in drivers:
            if d.proc.poll() is None:
                d.kill()

    final_epoch = record_numbers(layout.lease_dir)[-1]
    assert final_epoch == 4  # one lease per driver
    manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, spec, layout, manifest)
    assert report.ok, report.describe()
    assert all(o.actual > 0 for o in report.outputs), report.describe()

    for output in plan.outputs:
        commits = committed_batches(spark, output.sink.path)
        checkpoint = plan.checkpoint(output.name)
        ours = [c for c in commits if c["query"] == query_id(checkpoint)]
        assert [c["batch_id"] for c in ours] == sorted({c["batch_id"] for c in ours}), (output.name, commits)
        assert ours[-1]["batch_id"] == last_batch(checkpoint, "commits"), output.name
        epochs = [c["epoch"] for c in commits]  # a driver whose lease ended never committed after its successor
        assert epochs == sorted(epochs) and epochs[-1] == final_epoch, (output.name, epochs, final_epoch)
