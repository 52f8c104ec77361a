"""The single-driver lease: refused while the holder lives, taken over once it is dead or
lapsed, one winner when drivers race, and a paused holder that comes back commits nothing."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from spark_jobs.runtime import lease as lease_module
from spark_jobs.runtime.driver import (
    request_stop,
    stop_asked,
)
from spark_jobs.runtime.lease import (
    DRIVER_ID_ENV,
    EXIT_LEASE_LOST,
    HOST_ENV,
    TTL_SECONDS,
    DriverLease,
    Holder,
    LeaseHeld,
    LeaseLost,
    create_record,
    fence,
    held_epoch,
    history,
    holder_alive,
    latest,
    overlaps,
    read_holder,
    read_record,
    record_path,
    release_dead,
)

HOLDER = """
import sys
from spark_jobs.runtime.lease import DriverLease
lease = DriverLease(sys.argv[1], stream="demo", ttl=float(sys.argv[2])).acquire()
print("held", lease.epoch, flush=True)
sys.stdin.read()
"""

#: a driver that "commits" (appends a line) only after fence(), and pauses itself between
#: two commits when asked: where a real driver spends its time when its worker is paused
COMMITTER = """
import os, signal, sys, time
from pathlib import Path
from spark_jobs.runtime.lease import DriverLease, fence
control, log, pause = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
lease = DriverLease(control, stream="demo", ttl=6).acquire()
print("held", lease.epoch, flush=True)
while True:
    fence()
    with log.open("a") as f:
        f.write(f"{lease.epoch} {time.time()}\\n")
    if pause.exists():
        pause.unlink()
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.05)
"""


def start(script: str, *args: str, host: str | None = None) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ, **({HOST_ENV: host} if host else {}))
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline().split()
    assert line[:1] == ["held"], proc.stderr.read()
    return proc, int(line[1])


@pytest.fixture
def holder(tmp_path: Path):
    proc, _ = start(HOLDER, str(tmp_path / "_control"), "30")
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_second_driver_is_refused_while_the_first_lives(tmp_path: Path, holder: subprocess.Popen) -> None:
    with pytest.raises(LeaseHeld, match=rf"in use by a live driver: pid {holder.pid} on {socket.gethostname()} \(epoch 1"):
        DriverLease(tmp_path / "_control").acquire()
    assert holder_alive(tmp_path / "_control")
    assert read_holder(tmp_path / "_control").pid == holder.pid


def test_lease_of_a_killed_driver_is_taken_over_at_once_on_its_host(tmp_path: Path, holder: subprocess.Popen,
                                                                      caplog) -> None:
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert not holder_alive(tmp_path / "_control")  # its heartbeat is fresh, but its process is gone
    with caplog.at_level(logging.WARNING), DriverLease(tmp_path / "_control") as lease:
        assert (read_holder(lease.dir).pid, lease.epoch) == (os.getpid(), 2)
    assert f"taking over the checkpoint lease of a dead driver: pid {holder.pid}" in caplog.text
    assert read_holder(tmp_path / "_control") is None  # released cleanly
    assert [h.epoch for h in history(tmp_path / "_control")] == [1, 2]


def test_a_holder_elsewhere_is_respected_until_its_heartbeat_lapses(tmp_path: Path) -> None:
    control = tmp_path / "_control"
    (control / "lease").mkdir(parents=True)
    now = time.time()
    record = {"host": "other-host", "pid": 1, "started_at": now, "heartbeat_at": now, "stream": "s", "epoch": 4,
              "ttl": 30}
    (control / "lease" / "00000004.json").write_text(json.dumps(record))
    with pytest.raises(LeaseHeld, match=r"live driver: pid 1 on other-host \(epoch 4"):
        DriverLease(control).acquire()
    record["heartbeat_at"] = now - 31
    (control / "lease" / "00000004.json").write_text(json.dumps(record))
    with DriverLease(control) as lease:
        assert (read_holder(control).host, lease.epoch) == (socket.gethostname(), 5)


def test_of_drivers_racing_for_a_lapsed_lease_exactly_one_wins(tmp_path: Path) -> None:
    control, go = tmp_path / "_control", tmp_path / "go"
    racer = ("import sys, time, pathlib\nfrom spark_jobs.runtime.lease import DriverLease, LeaseHeld\n"
             "print('ready', flush=True)\n"
             "while not pathlib.Path(sys.argv[2]).exists(): time.sleep(0.001)\n"
             "try:\n    DriverLease(sys.argv[1]).acquire(); print('won', flush=True); sys.stdin.read()\n"
             "except LeaseHeld as e:\n    print('refused', e, flush=True)\n")
    procs = [subprocess.Popen([sys.executable, "-c", racer, str(control), str(go)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, **{HOST_ENV: f"host-{i}"}))
             for i in range(6)]
    assert [p.stdout.readline().strip() for p in procs] == ["ready"] * 6  # all six poll for the start
    go.touch()
    said = [p.stdout.readline().split()[0] for p in procs]
    for p in procs:
        p.stdin.close()
        p.wait(10)
    assert said.count("won") == 1, said
    assert [h.epoch for h in history(control)] == [1]


def test_a_paused_holder_that_comes_back_after_a_takeover_halts_without_committing(tmp_path: Path) -> None:
    control, commits, pause = tmp_path / "_control", tmp_path / "commits.log", tmp_path / "pause"
    first, epoch = start(COMMITTER, str(control), str(commits), str(pause), host="worker-a")
    try:
        pause.touch()  # it stops itself between two commits, as a worker's SIGSTOP would find it
        deadline = time.monotonic() + 10
        while pause.exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(LeaseHeld):  # "another machine": its heartbeat is still fresh
            DriverLease(control, ttl=6).acquire()
        while holder_alive(control):  # the lease lapses 6 s after its last heartbeat
            assert time.monotonic() < deadline + 10
            time.sleep(0.1)
        second, second_epoch = start(HOLDER, str(control), "6", host="worker-b")
        try:
            taken_at = read_holder(control).started_at
            os.kill(first.pid, signal.SIGCONT)
            assert first.wait(10) == EXIT_LEASE_LOST
            assert "halting without committing" in first.stderr.read()
            lines = [line.split() for line in commits.read_text().splitlines()]
            assert lines and all(int(e) == epoch and float(t) < taken_at for e, t in lines)
            assert second_epoch == epoch + 1 and read_holder(control).host == "worker-b"
            assert overlaps(history(control)) == []
        finally:
            second.kill()
            second.wait()
    finally:
        if first.poll() is None:
            os.kill(first.pid, signal.SIGCONT)
            first.kill()
        first.wait()


def test_a_dead_drivers_release_never_overlaps_a_successor_that_began_meanwhile(
        tmp_path: Path, monkeypatch) -> None:
    """The supervisor releasing a dead driver's lease races a standby on the same machine that saw
    the death too: the standby reads the clock, then creates its record just after the supervisor
    found none. The release must not end the dead tenure after the successor's began."""
    control = tmp_path / "_control"
    monkeypatch.setenv(DRIVER_ID_ENV, "s-driver-1")
    monkeypatch.setenv(HOST_ENV, "worker-x")
    proc, _ = start(HOLDER, str(control), "30", host="worker-x")
    proc.kill()
    proc.wait()
    successor_began: list[float] = []
    real_write = lease_module.write_atomically

    def standby_reads_the_clock(holder: Holder, timeout: float = 10.0) -> None:
        successor_began.append(time.time())

    def standby_creates_its_record(path: Path, text: str) -> None:
        dead = Holder(**json.loads(text))
        create_record(control, dead.epoch + 1, Holder(host="worker-x", pid=os.getpid(), started_at=successor_began[0],
                                                     heartbeat_at=successor_began[0], epoch=dead.epoch + 1))
        real_write(path, text)

    monkeypatch.setattr(lease_module, "end_launcher", standby_reads_the_clock)
    monkeypatch.setattr(lease_module, "write_atomically", standby_creates_its_record)
    released = release_dead(control, "s-driver-1")
    assert released is not None and released.released_at is not None
    assert [h.epoch for h in history(control)] == [1, 2]
    assert overlaps(history(control)) == []


def test_overlapping_tenures_are_found() -> None:
    a = Holder(host="a", pid=1, started_at=0, heartbeat_at=50, epoch=1)
    b = Holder(host="b", pid=2, started_at=60, heartbeat_at=90, epoch=2, released_at=95)
    c = Holder(host="a", pid=3, started_at=94, heartbeat_at=120, epoch=3)
    assert overlaps([a, b]) == []
    assert overlaps([c, a, b]) == [(b, c)]


def test_a_stop_marker_is_obeyed_only_by_the_driver_it_is_for(tmp_path: Path) -> None:
    marker = tmp_path / "stop"
    assert stop_asked(marker, 3) is None
    request_stop(marker, 3, "stream_x_stop run r1 (immediate)", immediate=True)
    assert stop_asked(marker, 3) == ("immediate", "stream_x_stop run r1 (immediate)")
    assert stop_asked(marker, 4) is None  # a driver that took the stream over since
    request_stop(marker, 4, "its supervisor: stalled")
    assert stop_asked(marker, 4) == ("graceful", "its supervisor: stalled")
    # by hand (``touch``): for the driver that held the stream when it was written, not a later one
    marker.unlink()
    marker.touch()
    written = marker.stat().st_mtime
    assert stop_asked(marker, 4, since=written - 10) == ("graceful", "by hand")
    assert stop_asked(marker, 5, since=written + 10) is None


def test_heartbeat_advances(tmp_path: Path) -> None:
    with DriverLease(tmp_path / "_control", heartbeat_seconds=0.05) as lease:
        first = read_holder(lease.dir).heartbeat_at
        deadline = time.monotonic() + 10
        while read_holder(lease.dir).heartbeat_at == first:
            assert time.monotonic() < deadline, "heartbeat never advanced"
            time.sleep(0.01)


def test_process_start_keeps_the_unit_of_records_already_written() -> None:
    """A start time identifies a process in the lease's records; records written earlier hold the
    clock ticks of ``/proc/<pid>/stat`` (its 22nd field), so the value must stay that."""
    from spark_jobs.runtime.lease import is_spark_submit, process_start

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        for pid in (os.getpid(), child.pid):
            ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
            assert process_start(pid) == ticks
        assert not is_spark_submit(child.pid)
    finally:
        child.communicate(b"")
    assert process_start(child.pid) is None  # gone
    assert process_start(0) is None and process_start(-1) is None and not is_spark_submit(0)
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 10
    while process_start(zombie.pid) is not None:  # dead, not reaped yet: no longer the process it was
        assert time.monotonic() < deadline, "a zombie still counts as running"
        time.sleep(0.01)
    zombie.wait()


def test_a_dead_drivers_lease_is_released_where_it_ran_so_another_machine_takes_it_at_once(
        tmp_path: Path, monkeypatch) -> None:
    control = tmp_path / "_control"
    monkeypatch.setenv(DRIVER_ID_ENV, "s-driver-1")
    proc, _ = start(HOLDER, str(control), "30", host="worker-x")
    monkeypatch.setenv(HOST_ENV, "worker-x")
    assert release_dead(control, "s-driver-1") is None  # it runs
    proc.kill()
    proc.wait()
    assert release_dead(control, "s-driver-2") is None  # not the driver that holds it
    monkeypatch.setenv(HOST_ENV, "worker-y")
    assert release_dead(control, "s-driver-1") is None  # from another machine its process cannot be seen
    assert read_holder(control).alive()  # so there, the lease is alive until its ttl

    monkeypatch.setenv(HOST_ENV, "worker-x")
    released = release_dead(control, "s-driver-1")
    assert released is not None and released.epoch == 1 and released.released_at is not None
    monkeypatch.setenv(HOST_ENV, "worker-y")
    with DriverLease(control, stream="demo") as lease:  # at once, not after the ttl
        assert lease.epoch == 2
        monkeypatch.setenv(HOST_ENV, "worker-x")
        assert release_dead(control, "s-driver-1") is None  # a successor holds it
    assert overlaps(history(control)) == []


#: The lease's rule as a table of examples, which the JVM's fence of Spark's checkpoint files runs
#: too (include/deploy/java: LeaseCasesTest); what its fields mean is at its top.
LEASE_CASES = json.loads(Path(__file__).with_name("lease_cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", LEASE_CASES, ids=[c["case"] for c in LEASE_CASES])
def test_the_lease_s_table_of_cases(tmp_path: Path, monkeypatch, case: dict) -> None:
    """Whether the driver of an epoch may still write, and whether another driver may take the
    stream over. The JVM's fence asks for both of the Python side's judgments at once: the
    driver's own (:meth:`DriverLease.check`: renewed within half its ttl, no later epoch), and
    every other driver's (its record is the newest, and alive)."""
    monkeypatch.setenv(HOST_ENV, "worker-a")  # the records are of drivers on another machine
    control = tmp_path / "_control"
    (control / "lease").mkdir(parents=True)
    now = time.time()
    for epoch, spec in case["records"].items():
        released = now - spec["released_age"] if "released_age" in spec else None
        holder = Holder(host="worker-b", pid=41, started_at=now - 3600, heartbeat_at=now - spec["heartbeat_age"],
                        stream="sensors", epoch=int(epoch), ttl=spec["ttl"], launcher_pid=40, released_at=released)
        record_path(control, int(epoch)).write_text(json.dumps(asdict(holder)))

    epoch = case["epoch"]
    if epoch is None:  # a process that holds no lease (a backfill, a test): its commits pass the fence
        assert held_epoch() is None
        fence()
        writes = True
    else:  # the driver of that epoch, last renewed when its record's heartbeat says
        own = read_record(record_path(control, epoch), Holder)
        driver = DriverLease(control, stream="sensors", ttl=own.ttl if own else TTL_SECONDS,
                             on_lost=lambda problem: None)
        driver._holder = own or Holder(host="worker-b", pid=41, started_at=now, heartbeat_at=now, epoch=epoch)
        driver._renewed = time.monotonic() - (now - driver._holder.heartbeat_at)
        try:
            driver.check()
            checked = True
        except LeaseLost:
            checked = False
        newest = latest(control)
        writes = checked and newest is not None and newest.epoch == epoch and newest.alive(now)
    assert writes == case["writes"]

    try:
        with DriverLease(control, stream="sensors"):
            taken = True
    except LeaseHeld:
        taken = False
    assert taken == case["taken"]
    # the point of fencing at half the ttl: no driver writes on while another may take its stream
    assert epoch is None or not (case["writes"] and case["taken"])
