"""A warm standby takes a stream over only when it may (spark_jobs.runtime.standby), with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from spark_jobs.runtime.lease import (
    HOST_ENV,
    DriverLease,
    read_holder,
)
from spark_jobs.runtime.standby import (
    READY,
    STALE_SECONDS,
    StandbyRecord,
    end_standby,
    hand_to,
    handed_to,
    standbys,
    take_over,
)

HOLDER = """
import sys
from spark_jobs.runtime.lease import DriverLease
DriverLease(sys.argv[1], stream="s").acquire()
print("held", flush=True)
sys.stdin.read()
"""


def holder(control: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(control)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def waiting(control: Path, hold: Path, supervisor: int = 0) -> tuple[threading.Thread, dict, threading.Event]:
    """take_over on a thread of its own, as a standby driver runs it."""
    lease, stop, result = DriverLease(control, stream="s"), threading.Event(), {}
    record = StandbyRecord(control, "standby-1", supervisor)

    def run() -> None:
        try:
            result.update(took=take_over(lease, hold, supervisor, stop, record), lease=lease)
        finally:
            record.remove()  # as the driver does once it took over or leaves

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result, stop


def test_a_standby_takes_the_lease_the_moment_its_holder_dies(tmp_path: Path) -> None:
    control = tmp_path / "_control"
    active = holder(control)
    thread, result, stop = waiting(control, control / "hold")
    try:
        deadline = time.monotonic() + 10
        while not [s for s in standbys(control) if s.state == READY]:
            assert time.monotonic() < deadline, "the standby never said it is ready"
            time.sleep(0.01)
        time.sleep(0.3)  # the holder lives: a standby that took the lease now would be a second driver
        assert thread.is_alive() and read_holder(control).pid == active.pid
        active.kill()
        active.wait()
        died = time.monotonic()
        thread.join(10)
        assert result["took"] and time.monotonic() - died < 1.0
        holder_now = read_holder(control)
        assert (holder_now.pid, holder_now.epoch) == (os.getpid(), 2)
    finally:
        stop.set()
        thread.join(10)
        if "lease" in result:
            result["lease"].release()
        active.kill()
        active.wait()


def test_a_standby_never_takes_a_stream_an_operator_stopped(tmp_path: Path) -> None:
    control = tmp_path / "_control"
    hold = control / "hold"
    hold.parent.mkdir(parents=True)
    hold.write_text(json.dumps({"by": "stream_s_stop run r1"}))  # the stop DAG holds it, then stops its driver
    active = holder(control)
    active.kill()
    active.wait()
    thread, result, stop = waiting(control, hold)
    time.sleep(0.5)  # the lease is free all along: a standby that took it now would restart a stopped stream
    assert thread.is_alive()
    stop.set()
    thread.join(10)
    assert result["took"] is False and read_holder(control).pid == active.pid


def test_a_standby_leaves_once_its_supervisor_is_superseded(tmp_path: Path) -> None:
    control = tmp_path / "_control"
    from streamops import tenure

    mine = tenure.begin(control, "stream_s run r try 1")
    active = holder(control)
    thread, result, stop = waiting(control, control / "hold", supervisor=mine.number)
    try:
        tenure.begin(control, "stream_s run r try 2")  # Airflow retried the supervisor elsewhere
        thread.join(10)
        assert not thread.is_alive() and result["took"] is False
    finally:
        stop.set()
        thread.join(10)
        active.kill()
        active.wait()


def test_a_waiting_standby_is_ended_by_its_id(tmp_path: Path) -> None:
    control = tmp_path / "_control"
    script = ("import sys, time\nfrom spark_jobs.runtime.standby import StandbyRecord\n"
              "StandbyRecord(sys.argv[1], 'standby-7', 0).set('ready')\nprint('ready', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(control)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert [s.driver_id for s in standbys(control)] == ["standby-7"]
    end_standby(control, "standby-8")  # another's: untouched
    assert proc.poll() is None
    end_standby(control, "standby-7")
    assert proc.wait(10) == -signal.SIGKILL
    assert standbys(control) == []


def test_a_standby_elsewhere_counts_while_it_refreshes_its_record(tmp_path: Path, monkeypatch) -> None:
    control = tmp_path / "_control"
    script = ("import sys, time\nfrom spark_jobs.runtime.standby import StandbyRecord\n"
              "StandbyRecord(sys.argv[1], 'standby-y', 1)\nprint('warming', flush=True)\ntime.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, str(control)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, HOST_ENV: "worker-y"})
    try:
        assert proc.stdout.readline().strip() == "warming"
        monkeypatch.setenv(HOST_ENV, "worker-x")  # seen from the supervisor's worker
        [seen] = standbys(control)
        assert (seen.driver_id, seen.host, seen.state) == ("standby-y", "worker-y", "warming")
        deadline = time.monotonic() + 10
        while standbys(control)[0].seen_at <= seen.seen_at:  # refreshed while it warms, by a thread of its own
            assert time.monotonic() < deadline, "the standby never refreshed its record"
            time.sleep(0.1)
    finally:
        proc.kill()  # its worker is lost: the record stays, no longer refreshed
        proc.wait()
    path = control / "standby" / "standby-y.json"
    data = json.loads(path.read_text())
    data["seen_at"] = data["since"] = time.time() - STALE_SECONDS - 1
    path.write_text(json.dumps(data))
    assert standbys(control) == []


def test_a_standby_leaves_the_lease_to_the_one_a_rescale_names_until_its_time_is_up(tmp_path: Path) -> None:
    """A rescale hands the stream to its standby at the new size: another ready standby (one on another
    worker, warmed at the old size) does not take the free lease while that one is named."""
    control = tmp_path / "_control"
    active = holder(control)
    hand_to(control, "standby-at-the-new-size", seconds=1.0)
    assert handed_to(control) == "standby-at-the-new-size"
    active.kill()
    active.wait()
    thread, result, stop = waiting(control, control / "hold")  # standby-1: not the one named
    try:
        time.sleep(0.5)  # the lease is free all along: a standby that took it now would run the old size
        assert thread.is_alive() and read_holder(control).pid == active.pid
        thread.join(10)  # once the naming lapses, it is a standby like any
        assert result["took"] and handed_to(control) is None and read_holder(control).pid == os.getpid()
    finally:
        stop.set()
        thread.join(10)
        if "lease" in result:
            result["lease"].release()
