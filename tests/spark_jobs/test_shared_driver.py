"""A shared driver. In the tests' session: it takes the runs of two streams in turn, each in a
session of its own, exactly once; a stream that needs a driver of its own is refused whole. As
spark-submit starts it: a run, and a stop between runs on SIGTERM."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import yaml
from examples import example_spec, include_with

from runner.processes import wait_until
from runner.testdata import generate, verify
from spark_jobs import submit
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.lease import history
from spark_jobs.runtime.run_queue import EXIT_NOT_SHAREABLE, RunQueue, RunRequest
from spark_jobs.shared_driver import serve
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec


def renamed(name: str) -> dict:
    """The sensors example as another stream: its own name and paths, and settings of its own."""
    data = yaml.safe_load(yaml.safe_dump(example_spec("sensors")).replace("sensors", name))
    data["spark"] = {"shuffle_partitions": 3, "conf": {"spark.sql.adaptive.enabled": False}}
    return data


def land(spec_file: Path, data: Path, seed: int) -> None:
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", "2",
                          "--events-per-file", "20", "--seed", str(seed)]) == 0


def test_two_streams_runs_are_taken_in_turn_each_in_a_session_of_its_own_and_exactly_once(spark, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)  # as the shared driver logs
    streams = include_with(tmp_path / "include", example_spec("sensors"), renamed("meters"))
    data, queue = tmp_path / "data", RunQueue(tmp_path / "queue")
    specs = [streams / "sensors.yaml", streams / "meters.yaml"]
    before = {k: spark.conf.get(k) for k in ("spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled")}
    asked = []
    for round_ in range(2):  # the second round resumes each stream from its checkpoint
        for i, spec_file in enumerate(specs):
            land(spec_file, data, seed=10 * round_ + i)
            asked.append(queue.ask(RunRequest(spec=str(spec_file), data_root=str(data),
                                              driver_id=f"{spec_file.stem}-{round_}")))
        assert serve(queue, spark, threading.Event(), runs=2) == 2
    results = [queue.result(run_id) for run_id in asked]
    assert [r["code"] for r in results] == [0, 0, 0, 0], results
    assert all(r["cpu_s"] > 0 and r["wall_s"] > 0 for r in results)
    assert any("meters" in line for line in queue.log_lines(asked[1]))
    assert {k: spark.conf.get(k) for k in before} == before  # each run's settings were its own session's
    assert not spark.streams.active
    for spec_file in specs:
        spec = load_spec(spec_file)
        layout = Layout(spec, data, streams)
        report = verify.compare(spark, compile_plan(spec, layout),
                                json.loads((data / "generated" / spec.name / "manifest.json").read_text()))
        assert report.ok, report.describe()
        assert [h.driver_id for h in history(layout.lease_dir)] == [f"{spec.name}-0", f"{spec.name}-1"]
        assert all(h.released_at is not None for h in history(layout.lease_dir))


def test_a_stream_that_needs_a_driver_of_its_own_is_refused_before_it_takes_its_lease(spark, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO)
    own_jvm, static = renamed("meters"), renamed("gauges")
    own_jvm["spark"]["conf"]["spark.executor.cores"] = 2
    static["spark"]["conf"]["spark.sql.codegen.cache.maxEntries"] = 10  # read when a JVM starts
    streams = include_with(tmp_path / "include", own_jvm, static)
    data, queue = tmp_path / "data", RunQueue(tmp_path / "queue")
    asked = []
    for name in ("meters", "gauges"):
        land(streams / f"{name}.yaml", data, seed=1)
        asked.append(queue.ask(RunRequest(spec=str(streams / f"{name}.yaml"), data_root=str(data))))
    assert serve(queue, spark, threading.Event(), runs=2) == 2
    assert [queue.result(run_id)["code"] for run_id in asked] == [EXIT_NOT_SHAREABLE] * 2
    assert "spark.executor.cores" in "\n".join(queue.log_lines(asked[0]))
    assert "spark.sql.codegen.cache.maxEntries" in "\n".join(queue.log_lines(asked[1]))
    assert not (data / "checkpoints").exists()


def test_the_driver_started_by_spark_submit_runs_a_stream_and_stops_between_runs_on_sigterm(tmp_path) -> None:
    streams = include_with(tmp_path / "include", example_spec("sensors"))
    data, queue = tmp_path / "data", RunQueue(tmp_path / "queue")
    land(streams / "sensors.yaml", data, seed=1)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    with open(tmp_path / "driver.log", "w") as log:
        driver = subprocess.Popen(submit.shared_driver_command(queue.dir, "local[1]"), env=env, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        run_id = queue.ask(RunRequest(spec=str(streams / "sensors.yaml"), data_root=str(data), driver_id="by-queue"))
        assert wait_until(lambda: queue.result(run_id) or driver.poll() is not None, 240, every=0.2)
        assert queue.result(run_id)["code"] == 0, (tmp_path / "driver.log").read_text()[-3000:]
        serving = queue.serving()
        os.kill(serving["pid"], signal.SIGTERM)  # the Python process, which the queue names
        assert driver.wait(120) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert not queue.driver_file.exists() and not psutil.pid_exists(serving["pid"])
    assert "Received command" not in (tmp_path / "driver.log").read_text()  # py4j's chatter stays out


def test_a_driver_whose_jvm_ended_stops_serving_at_once(tmp_path) -> None:
    queue, stop = RunQueue(tmp_path / "queue"), threading.Event()
    assert serve(queue, spark=None, stop=stop, jvm_alive=lambda: False) == 0
    assert stop.is_set() and queue.serving() is None
