"""What the supervisor and stop operators do, on real checkpoints and real driver processes.

A "driver" here is a real process holding the stream's lease, as the job does; it either
honours the stop marker (like the job) or ignores it (a hung driver).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from examples import example_spec, include_with
from watched import scheduled_specs

from spark_jobs.runtime.checkpoint import file_name, last_batch, processed_files
from spark_jobs.runtime.clock import iso
from spark_jobs.runtime.lease import (
    DRIVER_ID_ENV,
    holder_alive,
    read_holder,
)
from spark_jobs.runtime.progress import read_events
from spark_jobs.runtime.session import DRIVER_JAVA_OPTIONS, FIRST_TIER_JIT
from spark_jobs.stream_spec.layout import default_spec_dir
from streamops.health import Status
from streamops.hooks.stream import StreamHook
from streamops.operators.control import StopStreamOperator
from streamops.operators.driver import killed_task_cleanup_seconds
from streamops.operators.supervise import StreamSupervisorOperator

DRIVER = """
import sys, time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from spark_jobs.runtime.lease import DriverLease
control = Path(sys.argv[1])
lease = DriverLease(control, stream="sensors").acquire()
print("held", flush=True)
honour = sys.argv[2] == "honour"
while not (honour and (control / "stop").exists()):
    time.sleep(0.05)
(control / "stop").unlink()
lease.release()
"""


def hook(data_root: Path) -> StreamHook:
    return StreamHook("sensors", str(default_spec_dir()), str(data_root))


def start_driver(data_root: Path, behaviour: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(hook(data_root).layout.lease_dir), behaviour],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def supervisor(data_root: Path) -> StreamSupervisorOperator:
    return StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(default_spec_dir()),
                                    data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2,
                                    grace_seconds=5)


def test_supervisor_fails_on_a_corrupt_checkpoint_and_says_what_to_do(data_root: Path) -> None:
    ckpt = Path(hook(data_root).plan.checkpoint("site_temperature_10m"))
    newest = ckpt / "offsets" / str(last_batch(ckpt, "offsets"))
    newest.write_text("v1\n{\"batchWaterm")
    with pytest.raises(AirflowFailException) as err:
        supervisor(data_root).execute({})
    message = str(err.value)
    assert "checkpoint is corrupt and is not reset automatically" in message
    assert str(newest) in message and "What you can do" in message


def test_supervisor_leaves_the_stream_stopped_when_the_budget_is_spent(data_root: Path) -> None:
    recent = time.time() - 600  # five short runs in the last ten minutes, within the spec's 60-minute period
    runs = [{"started_at": recent + 100 * i, "ended_at": recent + 100 * i + 5, "exit_code": 1, "reason": "died"}
            for i in range(5)]
    control = hook(data_root).layout.lease_dir
    control.mkdir(parents=True, exist_ok=True)
    (control / "runs.json").write_text(json.dumps(runs))
    with pytest.raises(AirflowFailException, match=r"5 failed runs within 60 minutes, the restart budget \(5\) is spent"):
        supervisor(data_root).execute({})


def test_supervisor_adopts_a_live_driver_instead_of_starting_a_second(data_root: Path) -> None:
    driver = start_driver(data_root, "honour")
    op = supervisor(data_root)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(op.execute({})))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while op.adopted_pid != driver.pid:  # condition wait: the supervisor took the driver over
            assert thread.is_alive() and time.monotonic() < deadline, "the supervisor did not adopt the driver"
            time.sleep(0.05)
        # while it watches the adopted driver, stop the stream on purpose
        StopStreamOperator(task_id="stop", stream="sensors", spec_dir=str(default_spec_dir()),
                           data_root=str(data_root)).execute({})
        thread.join(60)
        assert not thread.is_alive()
    finally:
        driver.kill()
        driver.wait()
    assert result["status"] == "dead"
    runs = json.loads((hook(data_root).layout.lease_dir / "runs.json").read_text())
    assert runs == [] or all(r["reason"].startswith("adopted driver") for r in runs)  # no spark-submit started


def test_a_frozen_drivers_lapsed_lease_is_told_apart_from_a_dead_driver(data_root: Path) -> None:
    """What the supervisor ends as "its lease lapsed": a driver of its own still there, frozen."""
    script = ("import sys\nfrom spark_jobs.runtime.lease import DriverLease\n"
              "lease = DriverLease(sys.argv[1], stream='sensors', ttl=6).acquire()\nprint(lease.epoch, flush=True)\n"
              "sys.stdin.read()\n")
    h = hook(data_root)
    driver = subprocess.Popen([sys.executable, "-c", script, str(h.layout.lease_dir)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        epoch = int(driver.stdout.readline())
        os.kill(driver.pid, signal.SIGSTOP)
        assert not h.lapsed_here(epoch)  # its heartbeat is fresh
        deadline = time.monotonic() + 20
        while h.driver_alive():  # the 6-second lease lapses
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert h.lapsed_here(epoch) and not h.lapsed_here(epoch + 1)
        assert h.kill_driver(epoch=epoch) == driver.pid  # a lapsed lease, a process still here: killed
        driver.wait(10)
        assert not h.lapsed_here(epoch)  # dead: nothing left to end
    finally:
        if driver.poll() is None:
            driver.kill()
        driver.wait()


def test_graceful_stop_waits_for_the_driver_to_exit(data_root: Path) -> None:
    driver = start_driver(data_root, "honour")
    result = StopStreamOperator(task_id="stop", stream="sensors", spec_dir=str(default_spec_dir()),
                                data_root=str(data_root)).execute({})
    assert result["stopped"] and result["driver_pid"] == driver.pid
    assert driver.wait(10) == 0
    assert not holder_alive(hook(data_root).layout.lease_dir)


def test_graceful_stop_of_a_hung_driver_ends_in_a_kill(data_root: Path) -> None:
    driver = start_driver(data_root, "ignore")
    started = time.monotonic()
    result = StopStreamOperator(task_id="stop", stream="sensors", spec_dir=str(default_spec_dir()),
                                data_root=str(data_root), grace_seconds=1).execute({})
    assert result["stopped"] and driver.wait(10) == -9
    assert time.monotonic() - started < 30


def test_stop_rejects_an_unknown_mode(data_root: Path) -> None:
    with pytest.raises(AirflowFailException, match="mode must be graceful or immediate, not 'sometimes'"):
        StopStreamOperator(task_id="stop", stream="sensors", mode="sometimes", spec_dir=str(default_spec_dir()),
                           data_root=str(data_root)).execute({})


def stalling_specs(tmp_path: Path, max_attempts: int = 5) -> Path:
    """The specs' folder with sensors' stall window cut to 2 seconds."""
    specs = tmp_path / "include" / "streams"
    specs.mkdir(parents=True)
    shutil.copytree(default_spec_dir().parent / "reference", tmp_path / "include" / "reference")
    text = (default_spec_dir() / "sensors.yaml").read_text().replace("stall_window: 3 minutes", "stall_window: 2 seconds")
    (specs / "sensors.yaml").write_text(text.replace("max_attempts: 5,", f"max_attempts: {max_attempts},"))
    return specs


def test_supervisor_stops_a_stalled_driver_graceful_first_then_hard(data_root: Path, tmp_path: Path) -> None:
    specs = stalling_specs(tmp_path)
    stream = StreamHook("sensors", str(specs), str(data_root))
    (Path(stream.plan.source.landing) / "part-999999.json").write_text("{}\n")  # input waiting
    driver = start_driver(data_root, "ignore")  # alive, holds the lease, commits nothing, ignores the marker
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2,
                                  grace_seconds=1)
    op.supervised_epoch = read_holder(stream.layout.lease_dir).epoch  # as when it adopts the driver
    try:
        reason, forced = op._supervise()
    finally:
        if driver.poll() is None:
            driver.kill()
    assert (reason, forced) == ("stopped because it was stalled", True)
    assert driver.wait(10) == -9  # the stop marker was ignored, so it was killed after the grace period
    assert stream.layout.stop_marker.exists()  # the graceful request came first


def test_supervisor_archives_committed_input_while_the_stream_runs(data_root: Path) -> None:
    stream = hook(data_root)
    landing = Path(stream.plan.source.landing)
    old = time.time() - 3600  # landed an hour ago: past the spec's archive_after
    for f in landing.iterdir():
        os.utime(f, (old, old))
    before = {f.name for f in landing.iterdir()}
    archive_dir = Path(stream.layout.data(stream.spec.source.archive_path))
    driver = start_driver(data_root, "honour")
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(default_spec_dir()),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2,
                                  archive_every_seconds=0)
    result: dict = {}
    op.supervised_epoch = read_holder(stream.layout.lease_dir).epoch
    thread = threading.Thread(target=lambda: result.update(ended=op._supervise()))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (archive_dir.exists() and any(archive_dir.iterdir())):  # condition wait: files archived
            assert thread.is_alive() and time.monotonic() < deadline, "nothing was archived"
            time.sleep(0.05)
        stream.request_stop(op.supervised_epoch, "the test")
        thread.join(60)
    finally:
        driver.kill()
        driver.wait()
    archived = {f.name for f in archive_dir.iterdir()}
    left = {f.name for f in landing.iterdir()}
    # (the run's last batch is a no-data batch that moved the watermark: every file is in an older one)
    assert archived and archived | left == before and not archived & left


def test_a_stalled_driver_that_stops_when_asked_is_restarted_not_left_stopped(data_root: Path, tmp_path: Path,
                                                                              monkeypatch) -> None:
    specs = stalling_specs(tmp_path, max_attempts=1)  # one failed run spends the budget: the test ends there
    stream = StreamHook("sensors", str(specs), str(data_root))
    (Path(stream.plan.source.landing) / "part-999999.json").write_text("{}\n")  # input waiting
    # "spark-submit" here starts a driver that holds the lease, commits nothing and exits 0 when asked to stop
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "spark-submit").write_text(f"#!/bin/sh\nexec {sys.executable} {driver} {stream.layout.lease_dir} honour\n")
    (bin_dir / "spark-submit").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2, grace_seconds=5)
    # before, the driver's exit 0 after the supervisor's own stop request ended the task as if stopped on purpose
    with pytest.raises(AirflowFailException, match="1 failed runs within 60 minutes"):
        op.execute({})
    runs = json.loads((stream.layout.lease_dir / "runs.json").read_text())
    assert [(r["exit_code"], r["forced"], r["reason"]) for r in runs] == [(0, True, "stopped because it was stalled")]


class RecordingSubmitHook:
    """Stands in for SparkSubmitHook where the supervisor uses it: records how it is built and used."""

    built: list[RecordingSubmitHook] = []

    def __init__(self, **kwargs) -> None:
        self.kwargs, self.calls = kwargs, []
        RecordingSubmitHook.built.append(self)

    def submit(self, application: str = "") -> None:
        self.calls.append(("submit", application))

    def on_kill(self) -> None:
        self.calls.append(("on_kill",))


SUBMIT_ARGUMENTS = dict(conn_id="spark_streams", conf={"spark.sql.shuffle.partitions": "4"}, driver_memory="2g",
                        executor_memory="1g", verbose=True, status_poll_interval=3, py_files="deps.zip",
                        application_args=["--spec", "x.yaml"], name="stream:sensors",
                        env_vars={"PYSPARK_PYTHON": sys.executable})


def test_each_driver_run_goes_through_a_spark_submit_hook_built_like_the_operators_own(tmp_path: Path,
                                                                                        monkeypatch) -> None:
    from airflow.providers.apache.spark.operators import spark_submit

    # the provider's own: SparkSubmitOperator builds the supervisor's hooks too, and the reference's below
    monkeypatch.setattr(spark_submit, "SparkSubmitHook", RecordingSubmitHook)
    RecordingSubmitHook.built = []
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(default_spec_dir()),
                                  data_root=str(tmp_path), poll_seconds=0, default_args={"deploy_mode": "client",
                                                                                         "conn_id": "overridden"},
                                  **SUBMIT_ARGUMENTS)
    launch = op._launch(standby=False)
    assert launch.result() == (0, "")
    (ours,) = RecordingSubmitHook.built
    assert launch.hook is ours
    assert ours.calls == [("submit", op.application)] and op.application.endswith("spark_jobs/stream_job.py")
    # each driver is named, so that the supervisor knows its own in the lease
    assert ours.kwargs["env_vars"] == {**SUBMIT_ARGUMENTS["env_vars"], DRIVER_ID_ENV: launch.driver_id}
    ours.kwargs["env_vars"] = SUBMIT_ARGUMENTS["env_vars"]
    assert {k: ours.kwargs[k] for k in (*SUBMIT_ARGUMENTS, "deploy_mode", "archives", "spark_binary")} == {
        **SUBMIT_ARGUMENTS, "deploy_mode": "client", "archives": None, "spark_binary": None}
    # every argument SparkSubmitHook takes, with the value SparkSubmitOperator itself would give it
    reference = spark_submit.SparkSubmitOperator(task_id="reference", default_args={"deploy_mode": "client"},
                                                 application=op.application, **SUBMIT_ARGUMENTS)
    reference._get_hook()
    assert ours.kwargs == RecordingSubmitHook.built[-1].kwargs
    assert set(ours.kwargs) == set(inspect.signature(SparkSubmitHook).parameters)

    # a scheduled run's JVM compiles with the JIT's first tier only; the task's own conf stays
    run = op._launch(standby=False, available_now=True)
    assert run.result() == (0, "") and run.hook.kwargs["application_args"][-2:] == ["--trigger", "available-now"]
    assert run.hook.kwargs["conf"] == {**SUBMIT_ARGUMENTS["conf"], DRIVER_JAVA_OPTIONS: FIRST_TIER_JIT}
    assert op.conf == SUBMIT_ARGUMENTS["conf"] and DRIVER_JAVA_OPTIONS not in ours.kwargs["conf"]

    # templated arguments are taken as rendered, when the driver starts
    op.env_vars = {"PYSPARK_PYTHON": "/opt/python", "EXTRA": "1"}
    assert op.spark_submit_hook().kwargs["env_vars"] == {"PYSPARK_PYTHON": "/opt/python", "EXTRA": "1"}


def test_a_scheduled_run_goes_to_the_shared_driver_while_one_serves_and_to_a_jvm_of_its_own_otherwise(
        tmp_path: Path, monkeypatch) -> None:
    from airflow.providers.apache.spark.operators import spark_submit

    from spark_jobs.runtime.history import History
    from spark_jobs.runtime.run_queue import EXIT_NOT_SHAREABLE, RunQueue
    from streamops.cost import CPU
    from streamops.operators.driver import QueuedLaunch

    monkeypatch.setattr(spark_submit, "SparkSubmitHook", RecordingSubmitHook)
    specs = scheduled_specs(tmp_path, shared_driver=True)
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs),
                                  data_root=str(tmp_path / "data"), poll_seconds=0, **SUBMIT_ARGUMENTS)
    queue = RunQueue(op.stream_hook.layout.shared_driver_queue)
    assert not isinstance(op._launch(standby=False, available_now=True), QueuedLaunch)  # none serves
    queue.beat(time.time())  # this process serves it
    run = op._launch(standby=False, available_now=True)
    assert isinstance(run, QueuedLaunch) and run.alive()
    taken = queue.take()
    assert (taken.spec, taken.data_root, taken.driver_id) == (str(specs / "sensors.yaml"), str(tmp_path / "data"),
                                                             run.driver_id)
    (queue.logs / f"{taken.id}.log").write_text("stream sensors: queries finished\n")
    queue.finish(taken.id, {"code": 0, "cpu_s": 2.5})
    run.wait(5)
    assert run.result() == (0, "") and not (queue.results / f"{taken.id}.json").exists()
    cost = History(op.stream_hook.layout.history_file).series(0, time.time() + 60, metrics=[CPU])
    assert sum(p.sum for points in cost.values() for p in points) == 2.5
    untaken = op._launch(standby=False, available_now=True)
    untaken.kill()  # taken back before a driver took it
    assert untaken.result() == (0, "withdrawn before a shared driver took it") and queue.take() is None
    # asked while one served, which ended before it took the run: the run gets a JVM of its own,
    # under the same driver id, as one run
    orphan = op._launch(standby=False, available_now=True)
    queue.driver_file.unlink()
    assert orphan.result() == (0, "") and orphan.instead.hook.kwargs["env_vars"][DRIVER_ID_ENV] == orphan.driver_id
    assert orphan.instead.hook.kwargs["application_args"][-2:] == ["--trigger", "available-now"]
    assert not list(queue.requests.iterdir())
    # refused by the shared driver (settings that need a JVM of its own): that run, and every later one
    queue.beat(time.time())
    refused = op._launch(standby=False, available_now=True)
    queue.finish(queue.take().id, {"code": EXIT_NOT_SHAREABLE, "error": "spark.sql.x differs"})
    assert refused.result() == (0, "") and refused.instead is not None
    assert not isinstance(op._launch(standby=False, available_now=True), QueuedLaunch)


class Launched:
    """A driver the supervisor launched, as on_kill sees it."""

    def __init__(self, hook: RecordingSubmitHook) -> None:
        self.hook = hook

    def on_kill(self) -> None:
        self.hook.on_kill()


class FakeDriver:
    """The StreamHook calls on_kill makes, recorded: a driver that never stops by itself."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def driver_alive(self) -> bool:
        return True

    def holds(self, epoch: int | None) -> bool:
        return epoch == 7  # the driver of epoch 7 holds the stream

    def request_stop(self, epoch: int, by: str, immediate: bool = False) -> None:
        self.calls.append(("request_stop", epoch))

    def wait_for_exit(self, timeout: float, poll: float = 0.5, epoch: int | None = None) -> bool:
        self.calls.append(("wait_for_exit", timeout, epoch))  # returns at once: the wait's length is what is checked
        return False

    def kill_driver(self, epoch: int | None = None, by: str = "") -> int:
        self.calls.append(("kill_driver", epoch))
        return 4242


@pytest.mark.parametrize(("cleanup_time", "grace_seconds", "kill_grace_seconds", "waited"), [
    ("60", 120, None, 3.0),  # Airflow 3.3's task supervisor sends SIGKILL 5 s after SIGTERM, whatever the setting
    ("4", 120, None, 2.0),  # the setting, when it is shorter
    ("1", 120, None, 0.0),  # never negative: straight to the hard stop
    ("60", 120, 1.5, 1.5),  # shorter when asked
    ("60", 120, 30, 3.0),  # never longer than Airflow allows
    ("60", 0.5, None, 0.5),  # grace_seconds bounds it as before
])
def test_on_kill_waits_for_the_graceful_stop_no_longer_than_airflow_lets_a_killed_task_clean_up(
        tmp_path: Path, monkeypatch, cleanup_time: str, grace_seconds: float, kill_grace_seconds: float | None,
        waited: float) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME", cleanup_time)  # read when the task is killed
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(default_spec_dir()),
                                  data_root=str(tmp_path), conn_id="spark_streams", grace_seconds=grace_seconds,
                                  kill_grace_seconds=kill_grace_seconds)
    calls: list = []
    op._stream_hook = FakeDriver(calls)
    op.active = Launched(RecordingSubmitHook())
    op.supervised_epoch = 7
    op.on_kill()
    assert calls == [("request_stop", 7), ("wait_for_exit", waited, 7), ("kill_driver", 7)]
    assert op.active.hook.calls == [("on_kill",)]  # then spark-submit, through the hook's public on_kill


def test_on_kill_leaves_alone_a_driver_that_took_the_stream_over_since(tmp_path: Path) -> None:
    """This worker was cut off and the stream moved on: the driver now running (epoch 7) is another
    task's; a killed task stops only its own spark-submit."""
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(default_spec_dir()),
                                  data_root=str(tmp_path), conn_id="spark_streams")
    calls: list = []
    op._stream_hook = FakeDriver(calls)
    op.active = Launched(RecordingSubmitHook())
    op.supervised_epoch = 6
    op.on_kill()
    assert calls == []
    assert op.active.hook.calls == [("on_kill",)]


def test_airflows_cleanup_time_is_the_shorter_of_the_setting_and_the_task_supervisors_sigkill_delay(
        monkeypatch) -> None:
    from airflow.sdk.execution_time.supervisor import WatchedSubprocess

    monkeypatch.setenv("AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME", "60")
    assert killed_task_cleanup_seconds() == 5.0  # Airflow 3.3: WatchedSubprocess.kill(escalation_delay=5.0)
    monkeypatch.setenv("AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME", "2")
    assert killed_task_cleanup_seconds() == 2.0
    monkeypatch.setattr(WatchedSubprocess, "kill", lambda self, signal_to_send=None: None)  # no such delay any more
    monkeypatch.setenv("AIRFLOW__CORE__KILLED_TASK_CLEANUP_TIME", "60")
    assert killed_task_cleanup_seconds() == 60.0


def test_a_spec_only_spark_finds_invalid_fails_the_supervisor_at_once_instead_of_restarting(
        data_root: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STREAMS", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # spark-submit
    specs = tmp_path / "include" / "streams"  # the example, with its stall window of minutes
    specs.mkdir(parents=True)
    shutil.copytree(default_spec_dir().parent / "reference", tmp_path / "include" / "reference")
    text = (default_spec_dir() / "sensors.yaml").read_text()
    bad = ("  - name: hot\n    query: {type: sql, sql: 'SELECT device_id, tempreature FROM accepted'}\n"
           "    mode: append\n    sink: {type: parquet, path: sinks/sensors/hot}\n")
    (specs / "sensors.yaml").write_text(text.replace("outputs:\n", "outputs:\n" + bad, 1))
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2,
                                  grace_seconds=5)
    with pytest.raises(AirflowFailException) as err:
        op.execute({})
    message = str(err.value)
    assert "found the spec invalid and started nothing" in message
    assert f"{specs / 'sensors.yaml'}: outputs[0].query.sql: [UNRESOLVED_COLUMN.WITH_SUGGESTION]" in message
    runs = json.loads((hook(data_root).layout.lease_dir / "runs.json").read_text())
    assert [(r["exit_code"], r["reason"]) for r in runs] == [(1, "invalid spec")]  # one run, no restart


def test_an_application_of_the_users_own_is_deployed_restarted_after_a_kill_and_stopped_between_batches(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STREAMS", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # spark-submit
    specs = tmp_path / "include" / "streams"
    specs.mkdir(parents=True)
    shutil.copytree(default_spec_dir().parent / "applications", tmp_path / "include" / "applications")
    (specs / "rate_counts.yaml").write_text(
        "name: rate_counts\n"
        "application:\n  path: applications/rate_counts.py\n"
        "  args: [--output, sinks/rate_counts, --rows-per-second, '20']\n  queries: [counts]\n"
        "checkpoint: checkpoints/rate_counts\n"
        "supervision: {restart: {backoff_initial_seconds: 1, backoff_max_seconds: 2}}\n")
    data_root = tmp_path / "data"
    app = StreamHook("rate_counts", str(specs), str(data_root))
    op = StreamSupervisorOperator(task_id="supervise", stream="rate_counts", spec_dir=str(specs),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2,
                                  grace_seconds=30, conf={"spark.sql.shuffle.partitions": "2"})  # as its DAG passes
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(op.execute({})))
    thread.start()
    counts = Path(app.plan.checkpoint("counts"))

    def commits() -> int:
        return len(list((counts / "commits").glob("[0-9]*")))

    def wait(condition, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert thread.is_alive() and time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    try:
        wait(lambda: commits() >= 2 and app.driver_pid() is not None, "the application's query to commit")
        first = app.driver_pid()
        assert app.health().status in (Status.HEALTHY, Status.IDLE)
        os.kill(first, 9)  # a crash: the supervisor starts it again, from its checkpoint
        before = commits()
        wait(lambda: app.driver_pid() not in (None, first) and commits() > before, "a restarted application")
        StopStreamOperator(task_id="stop", stream="rate_counts", spec_dir=str(specs), data_root=str(data_root)).execute({})
        thread.join(60)
        assert not thread.is_alive()
    finally:
        if thread.is_alive():
            app.kill_driver()
            thread.join(60)
    events = [json.loads(line) for line in app.layout.events_file.read_text().splitlines()]
    assert any(e["event"] == "progress" and e["query"] == "counts" for e in events)
    assert [e["exit_code"] for e in events if e["event"] == "driver_stopped"][-1] == 0  # stopped between batches
    runs = json.loads(app.layout.runs_file.read_text())
    assert len(runs) == 2 and runs[0]["exit_code"] not in (0, None)  # the crash, then the run stopped on request
    assert list((data_root / "sinks" / "rate_counts").glob("*.parquet"))


def fake_spark_submit(tmp_path: Path, monkeypatch, script: str, *args: str) -> None:
    """"spark-submit" on PATH runs ``script`` (a driver of the test's) with ``args``, under the
    environment the supervisor gives the driver it launches."""
    driver = tmp_path / "fake_driver.py"
    driver.write_text(script)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "spark-submit").write_text(f"#!/bin/sh\nexec {sys.executable} {driver} {' '.join(args)}\n")
    (bin_dir / "spark-submit").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_a_clean_exit_nobody_asked_for_is_a_failure_to_restart_from(data_root: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    """Only an operator stops a stream for good: a driver that exits 0 by itself is restarted."""
    specs = stalling_specs(tmp_path, max_attempts=2)
    stream = StreamHook("sensors", str(specs), str(data_root))
    quits = ("import sys\nfrom spark_jobs.runtime.lease import DriverLease\n"
             "DriverLease(sys.argv[1], stream='sensors').acquire().release()\n")
    fake_spark_submit(tmp_path, monkeypatch, quits, str(stream.layout.lease_dir))
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.1)
    with pytest.raises(AirflowFailException, match="2 failed runs within 60 minutes"):
        op.execute({})
    runs = json.loads(stream.layout.runs_file.read_text())
    assert [(r["exit_code"], r["requested"], r["reason"]) for r in runs] == \
        [(0, False, "the driver exited without being asked to stop")] * 2


def test_a_superseded_try_never_adopts_stops_or_counts_the_driver_that_moved_on(data_root: Path, tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """A worker cut off and back: its try's driver lost the lease, and a newer try on another worker
    runs the stream with a driver of a newer epoch. The old try leaves that driver alone, in its
    loop and when Airflow kills it, and records no run."""
    from streamops import tenure

    stream = hook(data_root)
    fake_spark_submit(tmp_path, monkeypatch, DRIVER, str(stream.layout.lease_dir), "honour")
    op = supervisor(data_root)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(op.execute({"ti": None})))
    thread.start()
    newer = None
    try:
        deadline = time.monotonic() + 60
        while op.supervised_epoch is None:  # condition wait: its own driver holds the lease
            assert thread.is_alive() and time.monotonic() < deadline, "the supervisor's driver never held the lease"
            time.sleep(0.05)
        old = read_holder(stream.layout.lease_dir)
        tenure.begin(stream.layout.lease_dir, "stream_sensors run r try 2")  # Airflow retried the task elsewhere
        os.kill(old.pid, signal.SIGKILL)  # the old driver halts: its lease is lost
        newer = start_driver(data_root, "honour")  # the newer try's driver, epoch 2
        thread.join(60)
        assert not thread.is_alive() and result == {}
        op.on_kill()  # Airflow kills the old try
        holder = read_holder(stream.layout.lease_dir)
        assert holder.pid == newer.pid and holder.epoch == old.epoch + 1 and newer.poll() is None
        assert not stream.layout.stop_marker.exists()
        runs = json.loads(stream.layout.runs_file.read_text())
        assert [r["ended_at"] for r in runs] == [None]  # its run is left to the current try to close
        events = [json.loads(line) for line in stream.layout.events_file.read_text().splitlines()]
        assert [e["by"] for e in events if e["event"] == "supervisor_superseded"] == ["stream_sensors run r try 2"]
    finally:
        if newer is not None:
            newer.kill()
            newer.wait()


def test_a_kafka_sources_airflow_connection_reaches_the_driver_as_its_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from spark_jobs.sources.kafka import connection_env
    from streamops.operators.driver import _kafka_env

    spec = {"name": "from_conn", "source": {"type": "kafka", "connection": "plant_kafka", "topics": ["t"],
                                            "format": "json", "columns": [{"name": "id", "type": "string"}]},
            "quarantine": {"path": "quarantine/from_conn"},
            "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append",
                         "sink": {"type": "parquet", "path": "sinks/from_conn"}}],
            "checkpoint": "checkpoints/from_conn"}
    (tmp_path / "from_conn.yaml").write_text(yaml.safe_dump(spec))
    stream_hook = StreamHook("from_conn", str(tmp_path), str(tmp_path / "data"))
    with pytest.raises(AirflowFailException, match="source.connection: the Airflow connection 'plant_kafka' does "
                                                   "not exist"):
        _kafka_env(stream_hook)
    monkeypatch.setenv("AIRFLOW_CONN_PLANT_KAFKA", json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": "10.1.0.5:9092,10.1.0.6:9092"}}))
    assert _kafka_env(stream_hook) == {"STREAMS_KAFKA_BOOTSTRAP_PLANT_KAFKA": "10.1.0.5:9092,10.1.0.6:9092"}
    assert connection_env("plant-kafka.eu") == "STREAMS_KAFKA_BOOTSTRAP_PLANT_KAFKA_EU"


class Run:
    """What a task's context says of its DAG run."""

    def __init__(self, run_type: str, run_after: datetime | None = None) -> None:
        self.run_type, self.run_after = run_type, run_after


def test_a_deploy_made_before_a_stop_leaves_it_standing_when_its_supervisor_runs_again(data_root: Path,
                                                                                         monkeypatch) -> None:
    """A retry of a deploy's supervisor (its worker died), or a deploy's run that waited behind the
    one a stop just ended, starts nothing: only a deploy made after the stop undoes it."""
    from airflow.providers.apache.spark.operators import spark_submit

    monkeypatch.setattr(spark_submit, "SparkSubmitHook", RecordingSubmitHook)
    RecordingSubmitHook.built = []
    stream = hook(data_root)
    deployed = datetime.now(UTC) - timedelta(minutes=5)
    stream.hold("stream_sensors_stop run manual__2 (immediate)")
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(default_spec_dir()),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2)
    op.execute({"dag_run": Run("manual", run_after=deployed)})
    assert RecordingSubmitHook.built == []  # no driver submitted
    assert stream.held_by() == "stream_sensors_stop run manual__2 (immediate)"
    stream.release_hold(older_than=deployed.timestamp())
    assert stream.held_by() is not None
    stream.release_hold(older_than=time.time() + 1)  # a deploy after the stop
    assert stream.held_by() is None


def test_a_scheduled_run_starts_no_driver_when_nothing_waits_or_the_stream_was_stopped(data_root: Path,
                                                                                        tmp_path: Path) -> None:

    from streamops.triggers import read_json
    from streamops.triggers.input_waiting import RUN_FILE

    specs = scheduled_specs(tmp_path)
    task = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs),
                                    data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2)
    control = task.stream_hook.layout.lease_dir
    with pytest.raises(AirflowSkipException, match="no input waits"):
        task.execute({"dag_run": Run("asset_triggered")})
    run = read_json(control / RUN_FILE)
    assert run["ended"] >= run["began"]  # the watcher may ask for the next run
    (Path(task.stream_hook.plan.source.landing) / "part-90001.json").write_text('{"event_id": "x"}\n')
    task.stream_hook.hold("stream_sensors_stop run manual__1 (graceful)")
    with pytest.raises(AirflowSkipException, match="stopped on purpose"):
        task.execute({"dag_run": Run("scheduled")})
    assert task.stream_hook.held_by() is not None  # a scheduled run does not undo an operator's stop
    assert not task.stream_hook.driver_alive()


def test_an_upgrade_s_rehearsal_submits_nothing_without_an_unknown_verdict(data_root: Path, tmp_path: Path) -> None:
    from streamops.operators.upgrade import UpgradeStepOperator

    specs = include_with(tmp_path / "include", example_spec("sensors"))
    task = UpgradeStepOperator(task_id="rehearse", stream="sensors", step="rehearse", spec_dir=str(specs),
                               data_root=str(data_root))
    task.submit_job = None  # it must not get as far as spark-submit
    with pytest.raises(AirflowSkipException, match="no unknown verdict to rehearse"):
        task.execute({})


def test_the_watch_of_a_scheduled_streams_upgrade_waits_for_the_run_after_it(data_root: Path, tmp_path: Path) -> None:
    """A scheduled stream's upgrade is watched through its next run: each rebuilt output started by
    it, and the run ended well; a run that failed sends the upgrade back."""
    from spark_jobs import upgrade
    from spark_jobs.runtime.progress import EventLog
    from streamops.operators.upgrade import WatchUpgradeOperator

    specs = scheduled_specs(tmp_path)
    layout = StreamHook("sensors", str(specs), str(data_root)).layout
    folder = upgrade.upgrades_dir(layout) / "000001"
    folder.mkdir(parents=True)
    now = time.time()
    (folder / "upgrade.json").write_text(json.dumps({
        "number": 1, "folder": str(folder), "phase": upgrade.DONE, "rebuild": ["site_temperature_10m"],
        "started_at": now - 60, "finished_at": now - 30, "online": False}))
    events = EventLog(layout.events_file)

    def watch() -> dict:
        return WatchUpgradeOperator(task_id="watch", stream="sensors", spec_dir=str(specs), data_root=str(data_root),
                                    scheduled=True, watch_seconds=0.2, timeout_seconds=1.0,
                                    poll_seconds=0.05).execute({})

    events.write({"event": "started", "query": "site_temperature_10m", "logged_at": now - 45})  # the rebuild's own
    with pytest.raises(AirflowFailException, match="did not start within"):
        watch()
    for event in ({"event": "driver_started"}, {"event": "started", "query": "_ingest"},
                  {"event": "started", "query": "site_temperature_10m"}, {"event": "driver_stopped", "exit_code": 0}):
        events.write(event)
    assert watch()["upgrade"] == 1
    # the stream's validations meanwhile: an unchanged output's failed unit is not the upgrade's doing, a
    # rebuilt output's is, and so is rows gone missing from the stream's accounting
    ledger = layout.quality_dir / "ledger.json"
    ledger.parent.mkdir(parents=True, exist_ok=True)

    def validated(output: str, status: str, at: float, balance: str = "balanced") -> None:
        unit = {"unit": "2026-01-01T00:00", "rows": 7, "status": status, "failed": ["expect_column_values_to_be_"
                                                                                     "between(temperature)"],
                "validated_at": iso(at)}
        ledger.write_text(json.dumps({"outputs": {output: {"units": {unit["unit"]: unit}}}, "runs": [
            {"run_id": "r1", "at": iso(at), "accounting": {"balances": [
                {"output": "ingestion", "status": balance, "message": "2 rows missing"}]}}]}))

    later = time.time() + 1  # after the run's end the watch saw (the ledger's times are whole seconds)
    validated("readings", "failed", later)
    assert watch()["validations"] == 1
    validated("site_temperature_10m", "failed", now - 600)  # before the upgrade: not its doing
    assert watch()["validations"] == 0
    validated("site_temperature_10m", "failed", later)
    with pytest.raises(AirflowFailException, match=r"site_temperature_10m 2026-01-01T00:00 \(7 rows\): failed expect"):
        watch()
    validated("readings", "passed", later, balance="unbalanced")
    with pytest.raises(AirflowFailException, match="the accounting of ingestion is unbalanced: 2 rows missing"):
        watch()
    ledger.unlink()
    events.write({"event": "driver_failed", "error": "boom"})
    with pytest.raises(AirflowFailException, match="failed after upgrade 1: boom"):
        watch()


def test_a_rescale_hands_the_stream_to_a_standby_started_at_the_new_size(data_root: Path, tmp_path: Path,
                                                                          monkeypatch) -> None:
    """Real drivers (spark-submit of the stream job): sizing by lag sets 2 files a micro-batch (the spec
    says 10); the supervisor launches a standby at that size, stops the driver between batches once
    the standby is ready, and the standby runs the stream on at 2 files a micro-batch. No failed run."""
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_STREAMS", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # spark-submit
    data = example_spec("sensors")
    data["trigger"] = {"processing_time": "1 second"}
    data["execution"] = {"sizing": {"max_per_trigger": 20}}
    specs = include_with(tmp_path / "include", data)
    stream = StreamHook("sensors", str(specs), str(data_root))
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs), data_root=str(data_root),
                                  conn_id="spark_streams", poll_seconds=0.2, grace_seconds=30,
                                  conf={"spark.sql.shuffle.partitions": "2"})
    decided: list[float] = []

    def size(health) -> dict | None:  # the sizer's own arithmetic is tested in test_sizing: here, one decision
        if decided or len(started()) == first:  # once the first driver runs its flows
            return None
        decided.append(time.time())
        return {"event": "sizing_decision", "stream": "sensors", "unit": "files", "per_trigger": 2, "current": 10,
                "applied": True}

    op.stream_hook.size = size
    events = lambda: read_events(stream.layout.events_file)  # noqa: E731
    started = lambda: [e for e in events() if e["event"] == "driver_started"]  # noqa: E731
    first = len(started())
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(op.execute({})), daemon=True)
    thread.start()

    def wait(condition, what: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert thread.is_alive() and time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    landing = Path(stream.plan.source.landing)
    ingestion = stream.plan.checkpoint("_ingest")
    try:
        wait(lambda: len(started()) > first + 1, "the standby to take the stream over")
        old, new = started()[first:first + 2]
        assert (old["standby"], old["per_trigger"]) == (False, 10)
        assert (new["standby"], new["per_trigger"]) == (True, 2) and new["epoch"] > old["epoch"]
        for f in range(6):  # input after the rescale: taken two files a micro-batch
            (landing / f"part-9{f:05d}.json").write_text(json.dumps(
                {"event_id": f"r{f}", "device_id": "dev-001", "ts": "2026-01-01T00:00:00Z", "temperature": 21.0}) + "\n")
        after = last_batch(ingestion, "commits")
        wait(lambda: {file_name(f) for f in processed_files(ingestion)} >= {f.name for f in landing.glob("part-9*")},
             "the new files' commits")
        StopStreamOperator(task_id="stop", stream="sensors", spec_dir=str(specs), data_root=str(data_root)).execute({})
        thread.join(60)
        assert not thread.is_alive()
    finally:
        if thread.is_alive():  # the supervisor ends once the stream is stopped on purpose
            stream.hold("the test, failing")
            stream.kill_driver()
            thread.join(60)
    batches = range(after + 1, last_batch(ingestion, "commits") + 1)
    sizes = [len(processed_files(ingestion, through_batch=b)) - len(processed_files(ingestion, through_batch=b - 1))
             for b in batches]
    assert sum(sizes) == 6 and max(sizes) <= 2, sizes
    rescaled = [e for e in events() if e["event"] == "rescaled"]
    assert [(e["per_trigger"], e["previous"], e["unit"]) for e in rescaled] == [(2, 10, "files")]
    stopped = {e["epoch"]: e["exit_code"] for e in events() if e["event"] == "driver_stopped"}
    assert stopped[old["epoch"]] == 0  # stopped between batches
    assert json.loads(stream.layout.per_trigger_file.read_text())["per_trigger"] == 2
    runs = json.loads(stream.layout.runs_file.read_text())
    assert [(r["exit_code"], r["requested"]) for r in runs] == [(0, True), (0, True)]  # a handover, then the stop
