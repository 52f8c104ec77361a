"""The queue of a shared driver: runs taken oldest first and once, withdrawn or taken but never
both, and a run whose driver ended reported as failed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time

from examples import example_spec

from spark_jobs.runtime.run_queue import EXIT_DRIVER_LOST, RunQueue, RunRequest, not_shareable
from spark_jobs.stream_spec.loading import parse_spec


def test_runs_are_taken_oldest_first_once_each_and_their_results_read_back(tmp_path) -> None:
    queue = RunQueue(tmp_path / "queue")
    ids = [queue.ask(RunRequest(spec=f"s{i}.yaml", driver_id=f"d{i}", env={"KAFKA": "b:9092"})) for i in range(3)]
    assert ids == sorted(ids) and queue.waiting() == 3
    assert stat.S_IMODE(os.stat(queue.requests / f"{ids[0]}.json").st_mode) == 0o600
    other = RunQueue(tmp_path / "queue")  # a second driver on the same folder
    first, second = queue.take(), other.take()
    assert (first.id, first.spec, first.driver_id, first.env) == (ids[0], "s0.yaml", "d0", {"KAFKA": "b:9092"})
    assert second.id == ids[1] and queue.waiting() == 1
    queue.beat(time.time(), first.id)
    assert queue.result(first.id) is None  # taken, running, its driver alive
    queue.finish(first.id, {"code": 0, "cpu_s": 1.5})
    assert queue.result(first.id)["code"] == 0 and not (queue.running / f"{first.id}.json").exists()
    queue.forget(first.id)
    assert queue.result(first.id) is None
    assert queue.withdraw(ids[2]) and queue.take() is None
    assert not queue.withdraw(ids[1])  # taken already


def test_a_run_whose_driver_ended_is_failed_by_who_waits_and_by_the_next_driver(tmp_path) -> None:
    queue = RunQueue(tmp_path / "queue")
    a, b = queue.ask(RunRequest(spec="a.yaml")), queue.ask(RunRequest(spec="b.yaml"))
    # a driver that took both, then ended: a process that no longer exists
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    queue.take(), queue.take()
    queue.beat(time.time())
    beat = json.loads(queue.driver_file.read_text())
    queue.driver_file.write_text(json.dumps({**beat, "pid": int(dead.stdout)}))
    assert queue.serving() is None
    assert queue.result(a)["code"] == EXIT_DRIVER_LOST
    assert RunQueue(tmp_path / "queue").recover() == [b]
    assert queue.result(b)["code"] == EXIT_DRIVER_LOST
    assert os.listdir(queue.running) == []


def test_a_driver_that_stopped_beating_is_not_serving(tmp_path) -> None:
    queue = RunQueue(tmp_path / "queue")
    queue.beat(time.time())
    assert queue.serving()["pid"] == os.getpid()
    beat = json.loads(queue.driver_file.read_text())
    queue.driver_file.write_text(json.dumps({**beat, "heartbeat_at": time.time() - 60}))
    assert queue.serving() is None


def test_streams_that_need_a_driver_of_their_own_are_told_apart() -> None:
    assert not_shareable(parse_spec(example_spec("sensors"))) is None
    own_conf = example_spec("sensors")
    own_conf["spark"] = {"conf": {"spark.executor.cores": 2, "spark.sql.ansi.enabled": True}}
    assert "spark.executor.cores" in not_shareable(parse_spec(own_conf))
    python = example_spec("sensors")
    python["outputs"][0]["query"] = {"type": "python", "python": "mine.module:rows"}
    assert "mine.module:rows" in not_shareable(parse_spec(python))
