"""What the runner's processes share: the interpreter's ``bin`` directory, a private umask and
logs, loopback ports, and waiting for a condition (never a bare sleep)."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: the directory of this interpreter's executables (``airflow``, ``spark-submit``)
BIN = Path(sys.executable).parent

#: the umask of every process the platform starts: what they create is for this user alone
PRIVATE = 0o077


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def private_log(path: Path):  # a file object, closed with the process that writes it
    """``path`` opened for appending, readable by this user alone (0600, also if it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a")


@contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Standard output and error of this process, and of what it starts meanwhile (a JVM, which
    keeps them), go to ``path`` instead of the terminal: no Spark banners or progress bars there."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


def wait_until(condition: Callable[[], Any], timeout: float, every: float = 1.0,
               interrupted: Callable[[], bool] = lambda: False) -> Any:
    """The condition's first true value, or None after ``timeout`` seconds (or when interrupted)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline or interrupted():
            return value
        time.sleep(every)


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 300, every: float = 0.5) -> Any:
    """The condition's first true value; an AssertionError naming ``what`` after ``timeout`` seconds."""
    value = wait_until(condition, timeout, every=every)
    if not value:
        raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
    return value


class Every:
    """True once every ``seconds`` (first after ``seconds``)."""

    def __init__(self, seconds: float):
        self.seconds, self.last = seconds, time.monotonic()

    def due(self) -> bool:
        if time.monotonic() - self.last < self.seconds:
            return False
        self.last = time.monotonic()
        return True
