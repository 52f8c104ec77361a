"""The single-driver lease: refused while the holder lives, taken over once it is dead."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_jobs.lease import STALE_AFTER_SECONDS, DriverLease, LeaseHeld, holder_alive, read_holder

HOLDER = """
import sys
from spark_jobs.lease import DriverLease
lease = DriverLease(sys.argv[1], stream="demo").acquire()
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def holder(tmp_path: Path):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "_control")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_second_driver_is_refused_while_the_first_lives(tmp_path: Path, holder: subprocess.Popen) -> None:
    with pytest.raises(LeaseHeld, match=rf"in use by a live driver: pid {holder.pid} on {socket.gethostname()}"):
        DriverLease(tmp_path / "_control").acquire()
    assert holder_alive(tmp_path / "_control")
    assert read_holder(tmp_path / "_control").pid == holder.pid


def test_lease_of_a_killed_driver_is_taken_over(tmp_path: Path, holder: subprocess.Popen, caplog) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert not holder_alive(tmp_path / "_control")
    with caplog.at_level(logging.WARNING), DriverLease(tmp_path / "_control") as lease:
        assert read_holder(lease.dir).pid == os.getpid()
    assert f"taking over the checkpoint lease of a dead driver: pid {holder.pid}" in caplog.text
    assert read_holder(tmp_path / "_control") is None  # released cleanly


def test_live_holder_on_another_host_is_respected_until_stale(tmp_path: Path) -> None:
    control = tmp_path / "_control"
    control.mkdir()
    now = time.time()
    record = {"host": "other-host", "pid": 1, "started_at": now, "heartbeat_at": now, "stream": "s", "run_id": ""}
    (control / "driver.json").write_text(json.dumps(record))
    with pytest.raises(LeaseHeld, match="driver on another host: pid 1 on other-host"):
        DriverLease(control).acquire()
    record["heartbeat_at"] = now - STALE_AFTER_SECONDS - 1
    (control / "driver.json").write_text(json.dumps(record))
    with DriverLease(control):
        assert read_holder(control).host == socket.gethostname()


def test_heartbeat_advances(tmp_path: Path) -> None:
    with DriverLease(tmp_path / "_control", heartbeat_seconds=0.05) as lease:
        first = read_holder(lease.dir).heartbeat_at
        deadline = time.monotonic() + 10
        while read_holder(lease.dir).heartbeat_at == first:
            assert time.monotonic() < deadline, "heartbeat never advanced"
            time.sleep(0.01)
