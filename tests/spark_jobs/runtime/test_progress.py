"""The progress listener: Spark's query events, each read as its JSON, written as the platform's events."""

from __future__ import annotations

import json
import time

from spark_jobs.runtime.progress import EventLog, ProgressListener, read_events


def _events_until(path, done, timeout: float = 60) -> list[dict]:  # a path and a predicate
    """The events written, once ``done(events)`` holds (Spark's listener bus delivers them asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        events = list(read_events(path))
        if done(events):
            return events
        assert time.monotonic() < deadline, f"events not written in {timeout} s: {events}"
        time.sleep(0.05)


def test_the_listener_writes_a_querys_start_progress_and_end_under_the_outputs_name(spark, tmp_path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(7)))
    path = tmp_path / "events.jsonl"
    listener = ProgressListener(EventLog(path), "s", {"s__out": "out"}).add(spark)
    try:
        frame = spark.readStream.schema("n long").json(str(landing))
        query = (frame.writeStream.queryName("s__out").format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(60)
        # Spark's listener bus delivers the events on a thread of its own: wait for both kinds. The
        # tests' shared session may also end another test's query meanwhile: keep this run's events
        def ours(events: list[dict]) -> list[dict]:
            return [e for e in events if e["run_id"] == str(query.runId)]

        events = ours(_events_until(path, lambda es: {"progress", "terminated"} <= {e["event"] for e in ours(es)}))
    finally:
        listener.remove(spark)

    started, progress, ended = ([e for e in events if e["event"] == kind] for kind in ("started", "progress", "terminated"))
    assert [(e["query"], e["id"], e["run_id"]) for e in started] == [("out", str(query.id), str(query.runId))]
    first = progress[0]
    assert (first["stream"], first["query"], first["id"], first["run_id"]) == ("s", "out", str(query.id), str(query.runId))
    assert (first["batch_id"], first["input_rows"]) == (0, 7)
    assert first["duration_ms"]["triggerExecution"] > 0
    assert first["sources"][0]["numInputRows"] == 7 and "landing" in first["sources"][0]["description"]
    assert [(e["id"], e["exception"], e["error_class"]) for e in ended] == [(str(query.id), None, None)]


def test_a_removed_listener_writes_nothing_more(spark, tmp_path) -> None:
    path = tmp_path / "events.jsonl"
    ProgressListener(EventLog(path), "s", {}).add(spark).remove(spark)
    marker = ProgressListener(EventLog(tmp_path / "marker.jsonl"), "s", {}).add(spark)  # tells when events came
    try:
        landing = tmp_path / "landing"
        landing.mkdir()
        (landing / "a.json").write_text('{"n": 1}\n')
        frame = spark.readStream.schema("n long").json(str(landing))
        query = (frame.writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(60)
        _events_until(tmp_path / "marker.jsonl",
                      lambda es: any(e["event"] == "terminated" and e["id"] == str(query.id) for e in es))
    finally:
        marker.remove(spark)
    assert not path.exists() or list(read_events(path)) == []
