"""What a stream's state holds (spark_jobs/state.py), against Spark's own state reader at the same
batch and against the accepted rows the windows were computed from."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from runner.testdata import generate
from spark_jobs import analysis, state
from spark_jobs.flows import queries as flows
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_watermark_ms, last_batch
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import load_spec

SPEC = default_spec_dir() / "sensors.yaml"


@pytest.fixture(scope="module")
def stream(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("state") / "data"
    assert generate.main(["--spec", str(SPEC), "--data-root", str(root), "--files", "14",
                          "--events-per-file", "30", "--seed", "5"]) == 0
    spec = load_spec(SPEC)
    layout = Layout(spec, root, default_spec_dir())
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    return spec, layout


def _at(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def test_the_open_windows_are_those_spark_s_state_reader_shows_and_the_accepted_rows_imply(spark, stream) -> None:
    spec, layout = stream
    plan = compile_plan(spec, layout)
    found = state.inspect(spark, plan, layout)
    windows = found["flows"]["site_temperature_10m"]
    checkpoint = plan.checkpoint("site_temperature_10m")
    batch = last_batch(checkpoint, "commits")
    assert windows["batch"] == batch is not None
    (op,) = windows["operators"]
    assert op["kind"] == "window" and op["key"] == ["window", "site"]

    # Spark's own state reader at the same batch, by hand
    plain = (spark.read.format("statestore").option("batchId", batch).option("operatorId", 0).load(checkpoint)
             .selectExpr("key.window.start AS start", "key.window.end AS end").collect())
    by_window: dict[tuple[str, str], int] = {}
    for r in plain:
        key = (_at(r["start"]).strftime("%Y-%m-%dT%H:%M:%SZ"), _at(r["end"]).strftime("%Y-%m-%dT%H:%M:%SZ"))
        by_window[key] = by_window.get(key, 0) + 1
    listed = {(w["start"], w["end"]): w["rows"] for w in op["windows"]["listed"]}
    assert listed == by_window and op["rows"] == len(plain) > 0
    assert op["windows"]["open"] == len(by_window) and op["windows"]["oldest"]["start"] == min(by_window)[0]

    # and what the accepted rows imply: every 10-minute window sliding by 5 that holds a row and
    # ends after the watermark of that batch (the ones before it were emitted and dropped)
    watermark = datetime.fromtimestamp(batch_watermark_ms(checkpoint, batch) / 1000, UTC)
    assert windows["watermark"] == watermark.strftime("%Y-%m-%dT%H:%M:%SZ")
    implied: set[tuple[str, str]] = set()
    for r in spark.read.parquet(plan.accepted_path).select("ts", "site").collect():
        ts = _at(r["ts"])
        first = ts.replace(minute=ts.minute - ts.minute % 5, second=0, microsecond=0) - timedelta(minutes=5)
        for start in (first, first + timedelta(minutes=5)):
            if start <= ts < start + timedelta(minutes=10) and start + timedelta(minutes=10) > watermark:
                implied.add((start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                             (start + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")))
    assert set(by_window) == implied


def test_the_deduplication_s_keys_and_a_stateless_flow(spark, stream) -> None:
    spec, layout = stream
    plan = compile_plan(spec, layout)
    found = state.inspect(spark, plan, layout)
    (dedup,) = found["flows"]["_ingest"]["operators"]
    checkpoint = plan.checkpoint("_ingest")
    plain = spark.read.format("statestore").option("batchId", found["flows"]["_ingest"]["batch"]).load(checkpoint)
    expiries = sorted(r["value"]["expiresAtMicros"] for r in plain.collect())
    assert dedup["kind"] == "deduplication" and dedup["key"][0] == "event_id" and dedup["rows"] == len(expiries) > 0
    oldest = datetime.fromtimestamp(expiries[0] / 1_000_000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert dedup["expiry"]["oldest_expires"] == oldest
    (groups,) = found["flows"]["device_status"]["operators"]
    assert groups["kind"] == "aggregation" and groups["key"] == ["device_id"] and groups["rows"] > 0
    assert set(found["flows"]) == {"_ingest", "site_temperature_10m", "device_status"}  # readings keeps none


def test_the_job_writes_the_state_beside_the_checkpoint_and_leaves_the_checkpoint_as_it_was(spark, stream,
                                                                                            tmp_path) -> None:
    spec, layout = stream
    checkpoint = Path(layout.checkpoint_root)
    # the tests' own session keeps the run's state stores loaded, and Spark's maintenance would write
    # their snapshots into this checkpoint meanwhile: unloaded, only the job can touch it
    getattr(spark._jvm.org.apache.spark.sql.execution.streaming.state, "StateStore$").__getattr__("MODULE$").stop()

    def files() -> dict[str, bytes]:
        return {str(p.relative_to(checkpoint)): p.read_bytes() for p in sorted(checkpoint.rglob("*"))
                if p.is_file() and "_control" not in p.parts and "_events" not in p.parts}

    before = files()
    result = tmp_path / "state.json"
    job = subprocess.run([sys.executable, "-m", "spark_jobs.state", "--spec", str(SPEC), "--data-root",
                          str(layout.data_root), "--result", str(result)], capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    assert "site_temperature_10m at batch" in job.stderr
    assert files() == before  # read-only: no byte of the checkpoint changed
    written = json.loads(layout.state_file.read_text())
    assert written == json.loads(result.read_text()) and written["stream"] == "sensors"
