"""A single-driver lease on a stream's checkpoint.

Two drivers writing one checkpoint corrupt it, and Spark only notices that inside one
JVM. The lease has two parts in ``<checkpoint root>/_control/``:

* ``driver.lock``: an exclusive ``flock`` the driver holds for its whole life. The
  kernel releases it when the process dies, however it dies (SIGKILL included), so a
  dead holder never blocks a restart.
* ``driver.json``: who holds it (host, pid, start time) and a heartbeat refreshed by a
  background thread. It lets a driver on another host (where flock is not shared) see a
  live holder, and lets supervisors read who runs the stream.

A second driver is refused while the holder is alive; a dead holder's lease is taken
over, and the takeover is logged.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
#: A holder on another host whose heartbeat is older than this is presumed dead.
STALE_AFTER_SECONDS = 60.0


class LeaseHeld(RuntimeError):
    """Another live driver holds the checkpoint."""


@dataclass
class Holder:
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    stream: str = ""
    run_id: str = ""
    #: the process that launched the driver: with spark-submit, the JVM that runs the queries
    launcher_pid: int = 0

    def describe(self) -> str:
        age = time.time() - self.heartbeat_at
        return (f"pid {self.pid} on {self.host} (started {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.started_at))} UTC, "
                f"heartbeat {age:.0f}s ago)")


def read_holder(control_dir: str | os.PathLike[str]) -> Holder | None:
    try:
        data = json.loads((Path(control_dir) / "driver.json").read_text())
        return Holder(**data)
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder_alive(control_dir: str | os.PathLike[str]) -> bool:
    """Is some driver holding the lease right now (as seen from this host)?"""
    path = Path(control_dir) / "driver.lock"
    if not path.exists():
        return False
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    holder = read_holder(control_dir)
    if holder is None or holder.host == socket.gethostname():
        return False
    return time.time() - holder.heartbeat_at < STALE_AFTER_SECONDS


class DriverLease:
    def __init__(self, control_dir: str | os.PathLike[str], stream: str = "", heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.dir = Path(control_dir)
        self.stream = stream
        self.heartbeat_seconds = heartbeat_seconds
        self._file = None
        self._holder: Holder | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> DriverLease:
        self.dir.mkdir(parents=True, exist_ok=True)
        f = open(self.dir / "driver.lock", "a+")  # noqa: SIM115 - held for the driver's life
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            holder = read_holder(self.dir)
            who = holder.describe() if holder else "an unknown process"
            raise LeaseHeld(
                f"checkpoint {self.dir.parent} is in use by a live driver: {who}. Refusing to start a second "
                f"driver on it; stop that driver first (graceful stop marker {self.dir / 'stop'}) or wait for it to exit."
            ) from None
        previous = read_holder(self.dir)
        host = socket.gethostname()
        if previous is not None and previous.host != host and time.time() - previous.heartbeat_at < STALE_AFTER_SECONDS:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
            raise LeaseHeld(
                f"checkpoint {self.dir.parent} is in use by a driver on another host: {previous.describe()}. "
                f"Refusing to start; its lease expires {STALE_AFTER_SECONDS:.0f}s after its last heartbeat."
            )
        if previous is not None and (previous.host, previous.pid) != (host, os.getpid()):
            log.warning("taking over the checkpoint lease of a dead driver: %s", previous.describe())
        now = time.time()
        self._file = f
        self._holder = Holder(host=host, pid=os.getpid(), started_at=now, heartbeat_at=now, stream=self.stream,
                              launcher_pid=os.getppid())
        self._write()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _write(self) -> None:
        assert self._holder is not None
        tmp = self.dir / f".driver.json.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(asdict(self._holder)))
        os.replace(tmp, self.dir / "driver.json")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            assert self._holder is not None
            self._holder.heartbeat_at = time.time()
            try:
                self._write()
            except OSError as exc:
                log.warning("lease heartbeat failed: %s", exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._file is not None:
            try:
                (self.dir / "driver.json").unlink(missing_ok=True)
            finally:
                fcntl.flock(self._file, fcntl.LOCK_UN)
                self._file.close()
                self._file = None

    def __enter__(self) -> DriverLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
