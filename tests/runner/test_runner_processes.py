"""What the runner's processes share: private logs, loopback ports, waiting for a condition."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.processes import PRIVATE, Every, free_port, output_to, port_is_free, private_log, wait_for, wait_until


def test_wait_until_returns_the_first_true_value_or_the_last_after_the_timeout() -> None:
    values = iter([0, None, "ready"])
    assert wait_until(lambda: next(values), timeout=5, every=0.01) == "ready"
    began = time.monotonic()
    assert not wait_until(lambda: False, timeout=0.05, every=0.01)
    assert time.monotonic() - began < 2


def test_wait_until_stops_when_interrupted() -> None:
    began = time.monotonic()
    assert not wait_until(lambda: False, timeout=60, every=0.01, interrupted=lambda: True)
    assert time.monotonic() - began < 2


def test_wait_for_names_what_it_waited_for() -> None:
    assert wait_for(lambda: 3, "three") == 3
    with pytest.raises(AssertionError, match="timed out after 0s waiting for the impossible"):
        wait_for(lambda: None, "the impossible", timeout=0.05, every=0.01)


def test_every_is_due_once_per_period() -> None:
    every = Every(0.05)
    assert not every.due()
    time.sleep(0.06)
    assert every.due() and not every.due()


def test_a_private_log_is_for_this_user_alone_also_if_it_existed(tmp_path: Path) -> None:
    path = tmp_path / "service.log"
    path.write_text("before\n")
    path.chmod(0o644)
    with private_log(path) as log:
        log.write("after\n")
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.read_text() == "before\nafter\n"


def test_processes_started_with_the_private_umask_create_private_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-c", f"open({str(tmp_path / 'made')!r}, 'w').close()"], check=True, umask=PRIVATE)
    assert (tmp_path / "made").stat().st_mode & 0o077 == 0


def test_output_to_sends_what_this_process_and_a_child_print_to_the_file(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    with output_to(log):
        os.write(1, b"to standard output\n")
        subprocess.run(["sh", "-c", "echo from a child >&2"], check=True)  # as a JVM started meanwhile
    assert log.read_text().splitlines() == ["to standard output", "from a child"]
    assert log.stat().st_mode & 0o777 == 0o600


def test_free_port_and_port_is_free() -> None:
    port = free_port()
    assert port_is_free(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free(port)
