"""Exactly-once through real spark-submit runs: graceful stop, SIGKILLs, replayed batches.

One stream is run four times on one checkpoint, fed a fixed generated input: stopped
gracefully mid-way, refused a second driver, given replayed batches by removing its
outputs' last commits, killed with SIGKILL mid-way twice, and finally caught up
with an available-now run. Its sinks: the accepted-rows table (Parquet), a SQLite table,
and Delta tables in append, update and complete modes. Every sink must then equal the
generator's ground truth: nothing lost, nothing twice; every Delta table holds each batch
in one version only, each written by a driver whose lease was current (its epoch never
goes back).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow_harness import example_spec, include_with
from stream_driver import Driver, wait_for

from runner.testdata import generate, verify
from spark_jobs.plan import checkpoint_paths, compile_plan
from spark_jobs.runtime.checkpoint import (
    batch_ids,
    last_batch,
    query_id,
)
from spark_jobs.runtime.lease import record_numbers
from spark_jobs.sinks.delta import committed_batches
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW

# a soak, by its own command (docs/testing.md): the faults and Kafka tests kill drivers of Parquet,
# SQLite and Delta sinks under Airflow in the whole run; this one adds Delta's update and complete
# modes, a graceful stop and replayed outputs, bare
pytestmark = [pytest.mark.e2e, pytest.mark.soak]

FILES = 40  # two files per micro-batch (pinned below): 20 batches, so stops and kills land mid-way
LAST_BATCH = FILES // 2 - 1
PER_DEVICE = {"type": "aggregate", "group_by": ["device_id"],
              "aggregates": [{"name": "readings", "fn": "count"}, {"name": "status", "fn": "latest", "column": "status"}]}


@pytest.fixture
def stream(tmp_path: Path):
    data_root = tmp_path / "data"
    sensors = example_spec("sensors")
    sensors["source"]["max_files_per_trigger"] = 2
    windows = next(o for o in sensors["outputs"] if o["name"] == "site_temperature_10m")
    windows["sink"] = {"type": "delta", "path": "delta/sensors/site_temperature_10m"}
    sensors["outputs"] += [
        {"name": "device_latest", "mode": "update", "query": PER_DEVICE,
         "sink": {"type": "delta", "path": "delta/sensors/device_latest"}},
        {"name": "site_readings", "mode": "complete", "sink": {"type": "delta", "path": "delta/sensors/site_readings"},
         "query": {"type": "aggregate", "group_by": ["site"], "aggregates": [{"name": "readings", "fn": "count"}]}}]
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


def test_graceful_stop_sigkills_and_replays_keep_every_sink_exact(stream, spark) -> None:
    spec_path, spec, layout, data_root, logs, drivers = stream
    plan = compile_plan(spec, layout)
    readings = plan.checkpoint(INGEST_FLOW)

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
    written = json.loads(layout.plan_file.read_text())
    assert written["ingestion"]["checkpoint"] == readings
    assert [o["name"] for o in written["outputs"]] == [o.name for o in spec.outputs]
    # readings is written by the ingestion: its sink is the accepted-rows table, with no query or checkpoint
    assert [o["name"] for o in written["outputs"] if o["written_by_ingestion"]] == ["readings"]
    assert written["ingestion"]["accepted_path"] == layout.data("sinks/sensors/readings")
    assert not Path(layout.data(checkpoint_paths(spec)["readings"])).exists()

    layout.stop_marker.touch()
    assert first.wait() == 0, first.output()[-3000:]
    assert not layout.stop_marker.exists()
    stopped_at = last_batch(readings, "commits")
    assert stopped_at is not None and stopped_at < LAST_BATCH, "the stream finished before it could be stopped mid-way"
    # stopped between batches: every planned batch is committed, but for a batch that began as its
    # query was stopped (one that falls behind its trigger starts the next at once), which the
    # driver says, and which is replayed below with the others
    for name, checkpoint in plan.checkpoints.items():
        planned, committed = last_batch(checkpoint, "offsets"), last_batch(checkpoint, "commits")
        assert planned == committed or (
            planned == committed + 1 and f"query {name}: batch {planned} began as it was stopped" in first.output()), \
            (name, planned, committed)

    # 3. the outputs' last batches replay: their rows are in their tables, their commits gone
    replayed = {}
    for output in plan.outputs_with_flows:
        checkpoint = Path(plan.checkpoint(output.name))
        replayed[output.name] = last_batch(checkpoint, "commits")
        (checkpoint / "commits" / str(replayed[output.name])).unlink()
        (checkpoint / "commits" / f".{replayed[output.name]}.crc").unlink(missing_ok=True)  # as if never written

    # 4. restart from the checkpoint, kill -9 mid-way, twice
    for kill in range(2):
        done = last_batch(readings, "commits") or 0
        driver = start("--processing-time", "2 seconds")
        wait_for(lambda d=done: (last_batch(readings, "commits") or 0) >= d + 2, "2 more batches", driver.proc)
        driver.kill()
        if kill == 0:
            assert f"table sensors_device_status batch {replayed['device_status']}: already applied, skipped" \
                in driver.output()
    killed_at = last_batch(readings, "commits")
    assert killed_at < LAST_BATCH, "the stream finished before it could be killed mid-way"

    # 5. catch up and finish
    last = start("--trigger", "available-now")
    assert last.wait() == 0, last.output()[-3000:]

    manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, plan, manifest)
    assert report.ok, report.describe()
    agreement = verify.agreement(spark, plan)
    assert all(r.ok for r in agreement), "\n".join(r.describe() for r in agreement)
    assert all(o.actual > 0 for o in report.outputs), report.describe()
    assert report.quarantined > 0

    # the driver's events tell the story: four starts, a refusal, a graceful stop, two kills (no stop event)
    from spark_jobs.runtime.progress import read_events

    events = list(read_events(layout.events_file))
    assert [e["event"] for e in events].count("driver_started") == 4  # the refused driver never got that far
    assert [e.get("exit_code") for e in events if e["event"] == "driver_stopped"] == [0, 0]
    assert {e["query"] for e in events if e["event"] == "progress"} == set(plan.flows)

    # each Delta table holds every batch once, in the order of the drivers' leases
    final_epoch = record_numbers(layout.lease_dir)[-1]
    assert final_epoch == 4  # one lease per driver that ran
    for output in plan.outputs:
        if output.sink.kind != "delta":
            continue
        commits = committed_batches(spark, output.sink.path)
        checkpoint = plan.checkpoint(output.name)
        ours = [c for c in commits if c["query"] == query_id(checkpoint)]
        assert [c["batch_id"] for c in ours] == sorted({c["batch_id"] for c in ours}), (output.name, commits)
        if output.name == "site_temperature_10m":  # a window result: a batch that closed no window made no commit
            assert ours[-1]["batch_id"] <= last_batch(checkpoint, "commits"), output.name
        else:
            assert ours[-1]["batch_id"] == last_batch(checkpoint, "commits"), output.name
        epochs = [c["epoch"] for c in commits]  # a driver whose lease ended never committed after its successor
        assert epochs == sorted(epochs) and epochs[-1] == final_epoch, (output.name, epochs, final_epoch)
