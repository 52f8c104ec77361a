"""What the supervisor and stop operators do, on real checkpoints and real driver processes.

A "driver" here is a real process holding the stream's lease, as the job does; it either
honours the stop marker (like the job) or ignores it (a hung driver).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs.checkpoint import last_batch
from spark_jobs.lease import holder_alive
from spark_jobs.spec import default_spec_dir
from streamops.hooks.stream import StreamHook
from streamops.operators.stream import StopStreamOperator, StreamSupervisorOperator

DRIVER = """
import sys, time
from pathlib import Path
from spark_jobs.lease import DriverLease
control = Path(sys.argv[1])
lease = DriverLease(control, stream="sensors").acquire()
print("held", flush=True)
honour = sys.argv[2] == "honour"
while not (honour and (control / "stop").exists()):
    time.sleep(0.05)
(control / "stop").unlink()
lease.release()
"""


@pytest.fixture
def data_root(pristine: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    return root


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
    ckpt = Path(hook(data_root).layout.checkpoint("readings"))
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
    (Path(stream.layout.landing) / "part-999999.json").write_text("{}\n")  # input waiting
    driver = start_driver(data_root, "ignore")  # alive, holds the lease, commits nothing, ignores the marker
    op = StreamSupervisorOperator(task_id="supervise", stream="sensors", spec_dir=str(specs),
                                  data_root=str(data_root), conn_id="spark_streams", poll_seconds=0.2,
                                  grace_seconds=1)
    try:
        reason, forced = op._supervise(None)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert (reason, forced) == ("stopped because it was stalled", True)
    assert driver.wait(10) == -9  # the stop marker was ignored, so it was killed after the grace period
    assert stream.layout.stop_marker.exists()  # the graceful request came first


def test_supervisor_archives_committed_input_while_the_stream_runs(data_root: Path) -> None:
    stream = hook(data_root)
    landing = Path(stream.layout.landing)
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
    thread = threading.Thread(target=lambda: result.update(ended=op._supervise(None)))
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not (archive_dir.exists() and any(archive_dir.iterdir())):  # condition wait: files archived
            assert thread.is_alive() and time.monotonic() < deadline, "nothing was archived"
            time.sleep(0.05)
        stream.request_stop()
        thread.join(60)
    finally:
        driver.kill()
        driver.wait()
    archived = {f.name for f in archive_dir.iterdir()}
    left = {f.name for f in landing.iterdir()}
    assert archived and left and archived | left == before and not archived & left


def test_a_stalled_driver_that_stops_when_asked_is_restarted_not_left_stopped(data_root: Path, tmp_path: Path,
                                                                              monkeypatch) -> None:  # noqa: ANN001
    specs = stalling_specs(tmp_path, max_attempts=1)  # one failed run spends the budget: the test ends there
    stream = StreamHook("sensors", str(specs), str(data_root))
    (Path(stream.layout.landing) / "part-999999.json").write_text("{}\n")  # input waiting
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
