"""Exactly-once through real spark-submit runs: graceful stop, SIGKILL, replayed batch.

One stream is run four times on one checkpoint, fed a fixed generated input: stopped
gracefully mid-way, refused a second driver, killed with SIGKILL mid-way, given a
replayed batch by removing a commit, and finally caught up with an available-now run.
Every sink must then equal the generator's ground truth: nothing lost, nothing twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_harness import example_spec, include_with
from stream_driver import Driver, wait_for

from spark_jobs.plan import checkpoint_paths, compile_plan
from spark_jobs.runtime.checkpoint import (
    batch_ids,
    last_batch,
)
from spark_jobs.spec.layout import Layout
from spark_jobs.spec.loading import load_spec
from spark_jobs.spec.models import INGEST_QUERY
from spark_jobs.testdata import generate, verify

pytestmark = pytest.mark.e2e

FILES = 40  # two files per micro-batch (pinned below): 20 batches, so stops and kills land mid-way
LAST_BATCH = FILES // 2 - 1


@pytest.fixture
def stream(tmp_path: Path):
    data_root = tmp_path / "data"
    sensors = example_spec("sensors")
    sensors["source"]["max_files_per_trigger"] = 2
    spec_dir = include_with(tmp_path / "include", sensors)
    spec_path = spec_dir / "sensors.yaml"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(data_root), "--files", str(FILES),
                          "--events-per-file", "40", "--seed", "11"]) == 0
    logs = tmp_path / "logs"
    logs.mkdir()
    drivers: list[Driver] = []
    spec = load_spec(spec_path)
    yield spec_path, spec, Layout(spec, data_root, spec_dir), data_root, logs, drivers
    for d in drivers:
        if d.proc.poll() is None:
            d.kill()


def test_graceful_stop_sigkill_and_replay_keep_every_sink_exact(stream, spark) -> None:
    spec_path, spec, layout, data_root, logs, drivers = stream
    readings = compile_plan(layout.spec, layout).checkpoint(INGEST_QUERY)

    def start(*extra: str) -> Driver:
        drivers.append(Driver(spec_path, data_root, logs, *extra))
        return drivers[-1]

    # 1. run on the spec's trigger (every 5 s), then stop gracefully between batches
    first = start()
    wait_for(lambda: len(batch_ids(readings, "commits")) >= 3, "3 committed batches", first.proc)

    # 2. a second driver on the live checkpoint is refused
    second = start()
    assert second.wait() == 3, second.output()
    assert "in use by a live driver" in second.output()

    # the running job's plan is beside its checkpoint
    plan = json.loads(layout.plan_file.read_text())
    assert plan["ingestion"]["checkpoint"] == readings
    assert [o["name"] for o in plan["outputs"]] == [o.name for o in spec.outputs]
    # readings is written by the ingestion: its sink is the accepted-rows table, with no query or checkpoint
    assert [o["name"] for o in plan["outputs"] if o["written_by_ingestion"]] == ["readings"]
    assert plan["ingestion"]["accepted"] == layout.data("sinks/sensors/readings")
    assert not Path(layout.data(checkpoint_paths(spec)["readings"])).exists()

    layout.stop_marker.touch()
    assert first.wait() == 0, first.output()[-3000:]
    assert not layout.stop_marker.exists()
    stopped_at = last_batch(readings, "commits")
    assert stopped_at is not None and stopped_at < LAST_BATCH, "the stream finished before it could be stopped mid-way"
    for checkpoint in compile_plan(spec, layout).checkpoints.values():  # stopped between batches: every planned batch is committed
        assert last_batch(checkpoint, "offsets") == last_batch(checkpoint, "commits")

    # 3. make the table sink's last batch replay: its rows are in the table, its commit is gone
    status = Path(compile_plan(layout.spec, layout).checkpoint("device_status"))
    replayed = last_batch(status, "commits")
    (status / "commits" / str(replayed)).unlink()
    (status / "commits" / f".{replayed}.crc").unlink(missing_ok=True)  # as if the commit was never written

    # 4. restart from the checkpoint, kill -9 mid-way
    third = start("--processing-time", "2 seconds")
    wait_for(lambda: (last_batch(readings, "commits") or 0) >= stopped_at + 3, "3 more batches", third.proc)
    third.kill()
    assert f"table sensors_device_status batch {replayed}: already applied, skipped" in third.output()
    killed_at = last_batch(readings, "commits")
    assert killed_at < LAST_BATCH, "the stream finished before it could be killed mid-way"

    # 5. catch up and finish
    last = start("--trigger", "available-now")
    assert last.wait() == 0, last.output()[-3000:]

    manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, spec, layout, manifest)
    assert report.ok, report.describe()
    agreement = verify.agreement(spark, spec, layout)
    assert all(r.ok for r in agreement), "\n".join(r.describe() for r in agreement)
    assert all(o.actual > 0 for o in report.outputs), report.describe()
    assert report.quarantined > 0

    # the driver's events tell the story: four starts, a refusal, a graceful stop, a kill (no stop event)
    from spark_jobs.runtime.progress import read_events

    events = list(read_events(layout.events_file))
    assert [e["event"] for e in events].count("driver_started") == 3  # the refused driver never got that far
    assert [e.get("exit_code") for e in events if e["event"] == "driver_stopped"] == [0, 0]
    assert {e["query"] for e in events if e["event"] == "progress"} == set(compile_plan(spec, layout).queries)
