"""What a driver of a stream does before it runs anything (spark_jobs.runtime.driver); an
application run through it under the real supervisor is in the operators' tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.runtime import driver
from spark_jobs.runtime.lease import DriverLease
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec

APP = ("name: counts_app\napplication:\n  path: applications/rate_counts.py\n  queries: [counts]\n"
       "checkpoint: checkpoints/counts_app\n")


def app_spec(tmp_path: Path) -> Path:
    path = tmp_path / "include" / "streams" / "counts_app.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(APP)
    return path


def test_supervised_needs_an_application_spec(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.delenv(driver.APP_SPEC_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_, driver.supervised(None):
        pass
    assert exit_.value.code == driver.EXIT_BAD_SPEC and driver.APP_SPEC_ENV in caplog.text
    sensors = default_spec_dir() / "sensors.yaml"
    with pytest.raises(SystemExit) as exit_, driver.supervised(None, sensors, str(tmp_path)):
        pass
    assert exit_.value.code == driver.EXIT_BAD_SPEC and "is not an application" in caplog.text


def test_supervised_refuses_to_run_beside_a_live_driver(tmp_path: Path, caplog) -> None:
    path = app_spec(tmp_path)
    layout = Layout(load_spec(path), tmp_path / "data", path.parent)
    held = DriverLease(layout.lease_dir, stream="counts_app").acquire()  # the lock: one holder per checkpoint
    try:
        with pytest.raises(SystemExit) as exit_, driver.supervised(None, path, str(tmp_path / "data")):
            pass
    finally:
        held.release()
    assert exit_.value.code == driver.EXIT_LEASE_HELD
    assert not layout.events_file.exists()  # it wrote nothing: the stream is the other driver's



def test_a_driver_of_a_stream_stopped_on_purpose_gives_its_lease_back_and_runs_nothing(tmp_path: Path,
                                                                                         caplog) -> None:
    """A stop marks the stream held, then ends the driver holding the lease: a driver launched just
    before (a supervisor's restart) that takes the lease only after the stop looked must see the
    mark and not run, or it would run on, unsupervised by the stop."""
    import json

    from spark_jobs import stream_job
    from spark_jobs.runtime.lease import latest

    data = tmp_path / "data"
    sensors = default_spec_dir() / "sensors.yaml"
    layout = Layout(load_spec(sensors), data, sensors.parent)
    layout.hold_marker.parent.mkdir(parents=True, exist_ok=True)
    layout.hold_marker.write_text(json.dumps({"by": "stream_sensors_stop run manual__1 (immediate)"}))
    assert stream_job.main(["--spec", str(sensors), "--data-root", str(data)]) == driver.EXIT_OK
    holder = latest(layout.lease_dir)
    assert holder is not None and holder.released_at is not None and not holder.alive()  # taken, given back
    assert not layout.events_file.exists() and not Path(layout.checkpoint_root).joinpath("readings").exists()
    assert "stopped on purpose (stream_sensors_stop run manual__1 (immediate)): not started" in caplog.text
    app = app_spec(tmp_path)
    app_layout = Layout(load_spec(app), data, app.parent)
    app_layout.hold_marker.parent.mkdir(parents=True, exist_ok=True)
    app_layout.hold_marker.write_text("")  # by hand: held by "an operator"
    with pytest.raises(SystemExit) as exit_, driver.supervised(None, app, str(data)):
        raise AssertionError("an application of a held stream ran")
    assert exit_.value.code == driver.EXIT_OK and not app_layout.events_file.exists()
    assert latest(app_layout.lease_dir).released_at is not None

def test_an_undeclared_query_is_refused_with_what_to_declare(spark, tmp_path: Path) -> None:
    path = app_spec(tmp_path)
    with driver.supervised(spark, path, str(tmp_path / "data")) as app:
        assert app.checkpoint("counts").endswith("checkpoints/counts_app/counts")
        with pytest.raises(ValueError, match="query 'totals' is not declared in application.queries"):
            app.checkpoint("totals")
        with pytest.raises(ValueError, match=r"declared queries \['counts'\] were not started"):
            app.run()
    layout = Layout(load_spec(path), tmp_path / "data", path.parent)
    events = layout.events_file.read_text()
    assert '"driver_started"' in events and '"driver_stopped"' in events


def test_a_driver_that_loses_its_lease_says_why_in_its_events_then_halts(tmp_path: Path, monkeypatch) -> None:
    from spark_jobs.runtime.progress import EventLog, read_events

    halted = []

    def halt(reason: str, last_words) -> None:
        halted.append(reason)
        last_words()

    monkeypatch.setattr(driver, "halt", halt)
    events = EventLog(tmp_path / "events.jsonl")
    lease = DriverLease(tmp_path / "_control", stream="s", ttl=6)
    driver.report_loss(lease, events, "s")
    lease.on_lost("the lease of stream s (epoch 1) was taken over")

    assert halted == ["the lease of stream s (epoch 1) was taken over"]
    [event] = read_events(tmp_path / "events.jsonl")
    assert event["event"] == "driver_failed" and event["lease_lost"] is True
    assert event["error"] == "the lease of stream s (epoch 1) was taken over"


def test_a_batch_that_began_as_its_query_was_stopped_is_said_so(tmp_path: Path, caplog) -> None:
    """A query that falls behind its trigger starts its next batch the moment one ends: the stop
    can land just after that batch wrote its offsets, though the query looked idle."""
    import logging

    class Query:
        isActive = True
        status = {"isTriggerActive": False}

        def stop(self) -> None:
            (checkpoint / "offsets" / "2").write_text("v1")  # the batch that began meanwhile
            self.isActive = False

    checkpoint = tmp_path / "checkpoint"
    for log, batches in (("offsets", (0, 1)), ("commits", (0, 1))):
        (checkpoint / log).mkdir(parents=True)
        for batch in batches:
            (checkpoint / log / str(batch)).write_text("v1")
    with caplog.at_level(logging.INFO):
        driver.stop_between_batches({"views": Query()}, {"views": str(checkpoint)}, grace_seconds=5)
    assert "query views: batch 2 began as it was stopped; it will be replayed on restart" in caplog.text
    assert "stopped between batches" not in caplog.text


def test_a_query_that_fails_while_the_driver_waits_is_its_exit_1_and_its_cause(spark, tmp_path: Path) -> None:
    """Spark's wait raises the failed query's error (as pyspark converts it); the driver reads it
    from the query and exits 1 naming it, with a ``driver_failed`` event."""
    import threading

    from spark_jobs.plan import StreamPlan
    from spark_jobs.runtime.progress import EventLog, read_events

    path = app_spec(tmp_path)
    layout = Layout(load_spec(path), tmp_path / "data", path.parent)
    started = threading.Event()

    def fail_later(_frame, batch_id: int) -> None:
        started.set()
        if batch_id >= 1:
            raise ValueError("the third row was bad")

    query = (spark.readStream.format("rate").option("rowsPerSecond", 5).load().writeStream
             .trigger(processingTime="200 milliseconds").foreachBatch(fail_later)
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    events = EventLog(layout.events_file)
    lease = DriverLease(layout.lease_dir, stream="counts_app").acquire()
    try:
        code, cause, stopped = driver.supervise_queries(StreamPlan("counts_app", None, None, None, []), layout,
                                                        {"counts": query}, threading.Event(), events, lease)
    finally:
        lease.release()
    assert (code, stopped) == (driver.EXIT_FAILED, False) and started.is_set()
    assert "query counts:" in cause and "the third row was bad" in cause
    failed = [e for e in read_events(layout.events_file) if e["event"] == "driver_failed"]
    assert [e["query"] for e in failed] == ["counts"] and "the third row was bad" in failed[0]["error"]
