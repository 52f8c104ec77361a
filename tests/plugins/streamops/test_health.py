"""Stream health classification on real checkpoints written by real Spark runs.

One example stream is run once (available-now, shared SparkSession); each test copies
its data folder and changes what it needs: a driver holding the lease (a real process
that can be frozen with SIGSTOP), new input, a torn offsets file, a lost commit, a
leftover temporary file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.checkpoint import (
    QueryCheckpoint,
    last_batch,
)
from spark_jobs.runtime.lease import DriverLease
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec
from streamops import tenure
from streamops.health import Snapshot, Status, assess, classify

SPEC = default_spec_dir() / "sensors.yaml"
STALL = 180  # the spec's stall window, seconds

DRIVER = """
import sys
from spark_jobs.runtime.lease import DriverLease
DriverLease(sys.argv[1], stream="sensors").acquire()
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def stream(pristine: Path, tmp_path: Path):
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    spec = load_spec(SPEC)
    layout = Layout(spec, root, default_spec_dir())
    return compile_plan(spec, layout), layout


@pytest.fixture
def driver(stream):
    """A live process holding the stream's lease, as a running driver does."""
    _, layout = stream
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(layout.lease_dir)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()


def land_files(plan: StreamPlan, n: int) -> None:
    for i in range(n):
        path = Path(plan.source.landing) / f"part-9{i:05d}.json"
        path.write_text(json.dumps({"event_id": f"x{i}"}) + "\n")


def checkpoints(plan: StreamPlan) -> dict[str, str]:
    """Each query's checkpoint, as the stream's plan says."""
    return plan.checkpoints


def newest_commit(plan: StreamPlan) -> float:
    return max(os.path.getmtime(Path(ckpt) / "commits" / str(last_batch(ckpt, "commits")))
               for ckpt in checkpoints(plan).values())


def test_no_driver_is_dead(stream) -> None:
    plan, layout = stream
    health = assess(plan, layout)
    assert health.status == Status.DEAD
    assert health.backlog_files == 0
    assert all(b is not None for b in health.last_committed.values())


def test_a_stream_whose_supervisor_is_starting_a_driver_is_starting_not_dead(stream) -> None:
    """Just deployed: the supervisor's try began (and launched a driver), no driver holds the lease
    yet. Starting for at most the stall window; dead after, and dead once a driver held the lease
    after that launch and died."""
    plan, layout = stream
    began = tenure.begin(layout.lease_dir, "stream_sensors run manual try 1")
    health = assess(plan, layout)
    assert health.status == Status.STARTING, health.reason
    assert "has not taken the lease yet" in health.reason
    assert assess(plan, layout, now=began.started_at + STALL + 1).status == Status.DEAD
    lease = DriverLease(layout.lease_dir, stream="sensors").acquire()
    lease.release()  # a driver started after the launch, and ended
    assert assess(plan, layout).status == Status.DEAD


def test_live_driver_without_input_is_idle(stream, driver) -> None:
    plan, layout = stream
    health = assess(plan, layout)
    assert health.status == Status.IDLE, health.summary()
    assert health.driver_pid == driver.pid


def test_live_driver_with_waiting_input_is_starting_then_healthy(stream, driver) -> None:
    plan, layout = stream
    land_files(plan, 1)
    assert assess(plan, layout).status == Status.STARTING  # nothing committed since this driver started
    for ckpt in checkpoints(plan).values():  # every query commits a batch now
        commits = Path(ckpt) / "commits"
        os.utime(commits / str(last_batch(ckpt, "commits")))
    health = assess(plan, layout)
    assert health.status == Status.HEALTHY, health.summary()
    assert health.backlog_files == 1


def test_a_backlog_that_grew_over_the_lag_window_is_lagging(stream, driver) -> None:
    plan, layout = stream
    now = time.time()
    for path in checkpoints(plan).values():  # every batch was planned long ago; the newest commit is fresh
        ckpt = Path(path)
        for f in (ckpt / "offsets").iterdir():
            os.utime(f, (now - 600, now - 600))
        os.utime(ckpt / "commits" / str(last_batch(ckpt, "commits")))
    for f in Path(plan.source.landing).iterdir():
        os.utime(f, (now - 900, now - 900))
    mfpt = plan.source.max_files_per_trigger
    land_files(plan, 2 * mfpt + 1)
    landed = sorted(Path(plan.source.landing).glob("part-9*.json"))
    for f in landed[:mfpt]:  # these waited already a lag window ago
        os.utime(f, (now - 120, now - 120))
    health = assess(plan, layout, now=now)
    assert health.status == Status.LAGGING, health.summary()
    assert f"backlog grew from {mfpt} to {2 * mfpt + 1} file(s) in the last 60s" in health.reason
    assert health.backlog_files == 2 * mfpt + 1 and health.backlog_bytes > 0

    # the same backlog, all of it waiting a lag window ago: not growing, so healthy (and shown)
    for f in landed:
        os.utime(f, (now - 120, now - 120))
    health = assess(plan, layout, now=now)
    assert health.status == Status.HEALTHY and health.backlog_files == 2 * mfpt + 1, health.summary()


@pytest.mark.parametrize(("then", "now", "status"), [
    (3, 4, Status.LAGGING), (4, 4, Status.HEALTHY), (5, 4, Status.HEALTHY), (0, 2, Status.HEALTHY),
    (None, 5, Status.LAGGING), (None, 4, Status.HEALTHY),  # earlier figure purged: above two triggers counts
])
def test_lagging_means_a_backlog_above_one_trigger_that_grew(then: int | None, now: int, status: Status) -> None:
    ingestion = QueryCheckpoint("ckpt/_ingest", exists=True, last_planned=7, last_committed=7, last_commit_time=998.0)
    snap = Snapshot(stream="s", taken_at=1000.0, driver_alive=True, driver_pid=1, driver_host="h",
                    driver_started_at=990.0, queries={"_ingest": ingestion}, backlog_files=now, backlog_bytes=now,
                    max_files_per_trigger=2, backlog_trend={"_ingest": (then, now)})
    assert classify(snap, stall_window_seconds=180)[0] == status


def test_a_query_that_has_taken_all_its_input_is_not_stalled() -> None:
    # an output took every accepted file long ago; readings, with accepted files waiting, commits
    totals = QueryCheckpoint("q", exists=True, last_planned=3, last_committed=3, last_commit_time=100.0)
    readings = QueryCheckpoint("r", exists=True, last_planned=9, last_committed=9, last_commit_time=995.0)
    snap = Snapshot(stream="s", taken_at=1000.0, driver_alive=True, driver_pid=1, driver_host="h",
                    driver_started_at=50.0, queries={"totals": totals, "readings": readings},
                    backlog_files=2, backlog_bytes=2, max_files_per_trigger=2,
                    backlog_trend={"totals": (None, 0), "readings": (None, 2)})
    assert classify(snap, stall_window_seconds=30)[0] == Status.HEALTHY
    readings.last_commit_time = 900.0  # now readings, with input waiting, has been quiet for 100 s
    status, reason = classify(snap, stall_window_seconds=30)
    assert status == Status.STALLED and "query readings has committed nothing for 100s" in reason


def test_a_query_this_driver_started_late_gets_its_own_stall_window() -> None:
    # a driver started 40 s ago and spent 25 s starting Spark and checking the spec; its output
    # query started 15 s ago and is still in its first batch (replaying after a crash)
    totals = QueryCheckpoint("q", exists=True, last_planned=4, last_committed=3, last_commit_time=900.0)
    snap = Snapshot(stream="s", taken_at=1000.0, driver_alive=True, driver_pid=1, driver_host="h",
                    driver_started_at=960.0, queries={"totals": totals}, backlog_files=0, backlog_bytes=0,
                    max_files_per_trigger=2, backlog_trend={"totals": (None, 3)},
                    query_started_at={"totals": 985.0})
    assert classify(snap, stall_window_seconds=30)[0] == Status.STARTING
    snap.query_started_at = {"totals": 950.0}  # a start by the driver before: the driver's own start counts
    status, reason = classify(snap, stall_window_seconds=30)
    assert status == Status.STALLED and "query totals has committed nothing for 40s" in reason
    snap.query_started_at = {}  # never started by this driver: its clock runs from the driver's start
    assert classify(snap, stall_window_seconds=30)[0] == Status.STALLED


def test_frozen_driver_with_waiting_input_is_stalled(stream, driver) -> None:
    plan, layout = stream
    for ckpt in checkpoints(plan).values():
        os.utime(Path(ckpt) / "commits" / str(last_batch(ckpt, "commits")))
    land_files(plan, 1)
    os.kill(driver.pid, signal.SIGSTOP)  # frozen: alive, holds the lease, commits nothing
    later = time.time() + STALL + 5
    health = assess(plan, layout, now=later)
    assert health.status == Status.STALLED, health.summary()
    assert "stall window 180s" in health.reason
    assert assess(plan, layout, now=time.time() + STALL - 30).status != Status.STALLED


def test_torn_offsets_file_is_corrupt(stream) -> None:
    plan, layout = stream
    ckpt = Path(checkpoints(plan)["_ingest"])
    newest = ckpt / "offsets" / str(last_batch(ckpt, "offsets"))
    newest.write_text(newest.read_text()[:12])
    health = assess(plan, layout)
    assert health.status == Status.CORRUPT
    assert str(newest) in health.reason and "truncated" in health.reason


def test_commit_missing_in_the_middle_is_noted_not_corruption(stream) -> None:
    plan, layout = stream
    ckpt = Path(checkpoints(plan)["_ingest"])
    last = last_batch(ckpt, "commits")
    assert last >= 2
    (ckpt / "commits" / str(last - 1)).unlink()
    health = assess(plan, layout)
    assert health.status == Status.DEAD  # restartable: Spark reads only the newest commit
    assert any(f"batch(es) [{last - 1}] were lost" in n for n in health.notes)


def test_offsets_lost_behind_a_commit_is_corrupt(stream) -> None:
    plan, layout = stream
    ckpt = Path(checkpoints(plan)["_ingest"])
    last = last_batch(ckpt, "offsets")
    (ckpt / "offsets" / str(last)).unlink()
    health = assess(plan, layout)
    assert health.status == Status.CORRUPT
    assert f"batch {last} is committed but has no offsets entry" in health.reason


def test_missing_newest_commit_is_a_batch_to_replay_not_corruption(stream) -> None:
    plan, layout = stream
    ckpt = Path(checkpoints(plan)["_ingest"])
    last = last_batch(ckpt, "commits")
    (ckpt / "commits" / str(last)).unlink()
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)
    health = assess(plan, layout)
    assert health.status == Status.DEAD  # restartable: Spark replays the batch
    assert health.last_committed["_ingest"] == last - 1


def test_lost_newest_commit_behind_a_planned_batch_is_replayed_not_corruption(stream) -> None:
    plan, layout = stream
    ckpt = Path(checkpoints(plan)["_ingest"])
    last = last_batch(ckpt, "commits")
    offsets = ckpt / "offsets"
    (offsets / str(last + 1)).write_text((offsets / str(last)).read_text())  # batch last+1 planned (a crash mid-batch)
    (ckpt / "commits" / str(last)).unlink()  # and the newest commit file lost
    health = assess(plan, layout)
    assert health.status == Status.DEAD  # restartable: Spark replays the newest batch
    assert any(f"the offsets log is at batch {last + 1} but the newest commit is {last - 1}" in n for n in health.notes)


def test_leftover_temp_file_is_harmless_and_noted(stream) -> None:
    plan, layout = stream
    ckpt = Path(checkpoints(plan)["_ingest"])
    (ckpt / "offsets" / f".{last_batch(ckpt, 'offsets') + 1}.0a1b2c3d.tmp").write_text("v1\n{\"batchWat")
    health = assess(plan, layout)
    assert health.status == Status.DEAD
    assert any("leftover temporary file" in n for n in health.notes)


def test_backlog_counts_only_files_no_batch_has_taken(stream) -> None:
    plan, layout = stream
    assert assess(plan, layout).backlog_files == 0
    land_files(plan, 3)
    (Path(plan.source.landing) / ".hidden.json").write_text("{}\n")
    assert assess(plan, layout).backlog_files == 3


# ---- a Kafka source: records behind, from the checkpoint against the broker ---------------


def test_a_kafka_streams_backlog_is_its_records_behind_per_partition(spark, tmp_path: Path, kafka_broker,
                                                                     kafka_topic: str) -> None:
    from spark_jobs import analysis
    from spark_jobs.flows import queries as flows
    from spark_jobs.stream_spec.loading import parse_spec

    data = {"name": "k", "source": {"type": "kafka", "bootstrap_servers": kafka_broker.bootstrap,
                                    "topics": [kafka_topic], "format": "json",
                                    "columns": [{"name": "id", "type": "string", "required": True}]},
            "quarantine": {"path": "quarantine/k"},
            "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append",
                         "sink": {"type": "parquet", "path": "sinks/k"}}],
            "checkpoint": "checkpoints/k"}
    spec = parse_spec(data)
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    plan = compile_plan(spec, layout)
    kafka_broker.produce(kafka_topic, ['{"id": "a"}', '{"id": "b"}'], partition=0)
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(layout.lease_dir)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        health = assess(plan, layout)
        assert health.backlog_records == 0 and health.status == Status.IDLE, health.summary()
        kafka_broker.produce(kafka_topic, [f'{{"id": "n{i}"}}' for i in range(5)], partition=1)
        health = assess(plan, layout, now=time.time() + 5 * 60 + 5)  # past the default stall window
        assert health.records_behind == {f"{kafka_topic}/0": 0, f"{kafka_topic}/1": 5, f"{kafka_topic}/2": 0}
        assert health.status == Status.STALLED and "input is waiting (5 record(s))" in health.reason
        assert "backlog 5 record(s)" in health.summary()

        # the broker gone while the driver runs: unhealthy at once, stalled after the stall window
        silent = compile_plan(parse_spec(data | {"source": data["source"] | {"bootstrap_servers": "127.0.0.1:9"}}),
                              layout)
        health = assess(silent, layout)
        assert health.backlog_records is None and health.status == Status.LAGGING, health.summary()
        assert "its source does not answer" in health.reason and "127.0.0.1:9" in health.reason
        later = assess(silent, layout, now=time.time() + 5 * 60 + 5)
        assert later.status == Status.STALLED and "no batch committed for" in later.reason
    finally:
        proc.kill()
        proc.wait()
    # the stream started again takes what waits: no record behind
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout))
    assert assess(plan, layout).records_behind == {f"{kafka_topic}/{p}": 0 for p in range(3)}
    # no driver and no broker: the records behind are unknown, and the health says why
    health = assess(silent, layout)
    assert health.backlog_records is None and health.status == Status.DEAD
    assert any("records behind unknown: source.bootstrap_servers: no Kafka broker answered" in n for n in health.notes)


def test_a_broker_stopped_under_a_running_driver_makes_the_stream_unhealthy_naming_it(tmp_path: Path) -> None:
    from runner.kafka import KafkaBroker
    from spark_jobs.stream_spec.loading import parse_spec

    broker = KafkaBroker(tmp_path / "broker").start()
    try:
        broker.create_topic("readings", partitions=2)
        spec = parse_spec({"name": "k", "source": {"type": "kafka", "bootstrap_servers": broker.bootstrap,
                                                   "topics": ["readings"], "format": "json",
                                                   "columns": [{"name": "id", "type": "string", "required": True}]},
                           "quarantine": {"path": "quarantine/k"},
                           "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append",
                                        "sink": {"type": "parquet", "path": "sinks/k"}}],
                           "checkpoint": "checkpoints/k"})
        layout = Layout(spec, tmp_path / "data", default_spec_dir())
        plan = compile_plan(spec, layout)
        broker.produce("readings", ['{"id": "a"}', '{"id": "b"}', '{"id": "c"}'], partition=1)
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(layout.lease_dir)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "held"
            running = assess(plan, layout)
            assert running.records_behind == {"readings/0": 0, "readings/1": 3}, running.summary()
            broker.stop()
            health = assess(plan, layout)
            assert health.status == Status.LAGGING and health.backlog_records is None, health.summary()
            assert f"its source does not answer, records behind unknown: source.bootstrap_servers: no Kafka broker " \
                   f"answered at {broker.bootstrap}" in health.reason
        finally:
            proc.kill()
            proc.wait()
    finally:
        broker.stop()


@pytest.mark.parametrize(("then", "now", "per_trigger", "status"), [
    (100, 400, 200, Status.LAGGING),   # grew, and more than a trigger takes
    (500, 400, 200, Status.HEALTHY),   # shrinking
    (100, 150, 200, Status.HEALTHY),   # grew, but a trigger takes it all
    (None, 500, 200, Status.LAGGING),  # no earlier sample: more than two triggers take
])
def test_a_kafka_stream_lags_when_its_records_behind_grow(then: int | None, now: int, per_trigger: int,
                                                          status: Status) -> None:
    ingestion = QueryCheckpoint("i", exists=True, last_planned=5, last_committed=5, last_commit_time=995.0)
    snap = Snapshot(stream="s", taken_at=1000.0, driver_alive=True, driver_pid=1, driver_host="h",
                    driver_started_at=900.0, queries={"_ingest": ingestion}, backlog_files=0, backlog_bytes=0,
                    max_files_per_trigger=1, backlog_trend={"_ingest": (then, now)}, backlog_records=now,
                    records_per_trigger=per_trigger)
    found, reason = classify(snap, stall_window_seconds=180)
    assert found == status, reason
    if status == Status.LAGGING:
        assert "record(s)" in reason


def scheduled(plan: StreamPlan, freshness: str = "5 minutes") -> StreamPlan:
    """The stream run scheduled (``execution.mode: scheduled``), on input, with ``freshness``."""
    return replace(plan, execution=type(plan.execution)(mode="scheduled", on_input=True, freshness=freshness))


def test_a_scheduled_stream_between_runs_is_idle_healthy_then_lagging_by_its_freshness(stream) -> None:
    """No driver between a scheduled stream's runs is no death: idle while nothing waits; healthy
    while the oldest waiting file has waited less than its freshness; lagging after."""
    plan, layout = stream
    plan = scheduled(plan)
    health = assess(plan, layout)
    assert health.status == Status.IDLE and "scheduled" in health.reason, health.summary()
    land_files(plan, 2)
    landed = max(p.stat().st_mtime for p in Path(plan.source.landing).glob("part-9*.json"))
    health = assess(plan, layout, now=landed + 60)
    assert health.status == Status.HEALTHY and "within its freshness" in health.reason, health.summary()
    assert health.backlog_files == 2
    oldest = min(p.stat().st_mtime for p in Path(plan.source.landing).glob("part-9*.json"))
    lagging = assess(plan, layout, now=oldest + 301)
    assert lagging.status == Status.LAGGING and "more than its freshness (300s)" in lagging.reason, lagging.summary()
    # the same stream continuous, without a driver: dead
    assert assess(stream[0], layout, now=landed + 60).status == Status.DEAD


def test_a_scheduled_outputs_unread_rows_wait_since_its_last_batch_was_planned(stream) -> None:
    """Accepted rows an output has not read (a run ended between the ingestion's commit and the
    output's): waiting since that output's last batch was planned, which took all there was then."""
    plan, layout = stream
    plan = scheduled(plan, "1 minute")
    window = checkpoints(plan)["site_temperature_10m"]
    last = last_batch(window, "commits")
    (Path(window) / "commits" / str(last)).unlink()  # its last batch in flight again
    planned = os.path.getmtime(Path(window) / "offsets" / str(last - 1))
    assert assess(plan, layout, now=planned + 30).status == Status.HEALTHY
    assert assess(plan, layout, now=planned + 61).status == Status.LAGGING
