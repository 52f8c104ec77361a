"""A single-driver lease on a stream's checkpoint that holds across machines.

Two drivers writing one checkpoint corrupt it, and Spark only notices that inside one
JVM. The stream's drivers may run on any of several workers that share the checkpoint's
storage, so the lease relies on that storage alone: no process ids, no local lock.

It is a numbered history in ``<checkpoint root>/_control/lease/``: each driver that takes
the stream creates the next epoch's record, ``00000007.json``, with an exclusive create
(of two drivers trying at once, one gets it). The newest record is the holder: its host,
pid and start, and a heartbeat its driver refreshes every few seconds. A driver is
refused while the newest record is alive (heartbeat younger than its ``ttl``, and not
released); a dead holder's epoch is followed by a new one, and the takeover is logged.
On one host the platform also knows a dead pid when it sees one, so a killed driver is
replaced at once instead of after its ``ttl``.

Fencing: the holder considers its lease valid only for half the ``ttl`` after it last
renewed it (on its own monotonic clock, which runs on while the process is paused), and
only while no later epoch exists. It checks both before every commit of its own
(:func:`fence`) and between heartbeats. A driver that finds its lease lost, typically a
worker that was paused or cut off for longer than the ``ttl`` and comes back while
another driver runs its stream, halts at once without committing anything more; what
it had in flight is replayed by the new holder from the checkpoint. Clocks of the
workers must agree within half the ``ttl`` (NTP does far better).

The records stay as the lease's history (the newest ``KEEP_RECORDS``): who held the
checkpoint when, which :func:`overlaps` checks. The same numbered, exclusively created
records (:func:`create_record`) name the current try of the stream's supervisor task, in
``<checkpoint root>/_control/supervisors/`` (``streamops.tenure``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TypeVar

import psutil

from spark_jobs.runtime.atomic import write_atomically

log = logging.getLogger(__name__)
T = TypeVar("T")
#: The unit of a process's start time in ``/proc/<pid>/stat`` (:func:`process_start`), per second.
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

HEARTBEAT_SECONDS = 5.0
#: A holder whose heartbeat is older than this is presumed dead (the default; each record keeps its own).
TTL_SECONDS = 30.0
#: The environment variable naming this machine (a worker) in the lease; default: the host name.
HOST_ENV = "STREAMS_HOST"
#: The environment variable in which a supervisor names each driver it launches (``Holder.driver_id``).
DRIVER_ID_ENV = "STREAMS_DRIVER_ID"
#: The exit code of a driver that lost its lease (it halts without committing).
EXIT_LEASE_LOST = 4
KEEP_RECORDS = 200
#: The records of the tries of a stream's supervisor task, beside the lease's (``streamops.tenure``).
SUPERVISORS = "supervisors"


class LeaseHeld(RuntimeError):
    """Another live driver holds the checkpoint."""


class LeaseLost(RuntimeError):
    """This driver's lease expired or was taken over: it must not commit."""


def host_id() -> str:
    """This machine's name in the lease: ``$STREAMS_HOST``, else the host name."""
    return os.environ.get(HOST_ENV) or socket.gethostname()


def process_start(pid: int) -> int | None:
    """The start time of a local process in clock ticks since the machine booted (tells a reused
    pid apart; the unit of ``/proc/<pid>/stat``, which records already written hold); None if it
    is gone or a zombie (dead, not yet reaped)."""
    if pid <= 0:
        return None
    for _ in range(3):
        boot = psutil.boot_time()
        try:
            process = psutil.Process(pid)
            with process.oneshot():
                if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                    return None
                started = process.create_time()  # the boot time plus the ticks, in seconds
        except psutil.Error:
            return None
        if psutil.boot_time() == boot:  # else the clock was set meanwhile, which moves the boot time
            break
    return round((started - boot) * CLOCK_TICKS)


@dataclass
class Holder:
    host: str
    pid: int
    started_at: float
    heartbeat_at: float
    stream: str = ""
    epoch: int = 0
    ttl: float = TTL_SECONDS
    #: the process that launched the driver: with spark-submit, the JVM that runs the queries
    launcher_pid: int = 0
    pid_start: int | None = None
    released_at: float | None = None
    #: the name its supervisor gave the driver it launched (``$STREAMS_DRIVER_ID``), to tell its own apart
    driver_id: str = ""
    launcher_start: int | None = None

    def describe(self) -> str:
        age = time.time() - self.heartbeat_at
        return (f"pid {self.pid} on {self.host} (epoch {self.epoch}, started "
                f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(self.started_at))} UTC, heartbeat {age:.0f}s ago)")

    @property
    def ended_at(self) -> float:
        """When it last held the lease: its release, else its last heartbeat."""
        return self.released_at if self.released_at is not None else self.heartbeat_at

    def alive(self, now: float | None = None) -> bool:
        """Does it hold the lease now? Released: no. On this host: its process decides.
        Elsewhere: a heartbeat within its ``ttl``."""
        if self.released_at is not None:
            return False
        if self.host == host_id() and self.pid_start is not None and process_start(self.pid) != self.pid_start:
            return False  # a dead (or reused) pid here: no need to wait out the ttl
        return (now or time.time()) - self.heartbeat_at < self.ttl


def _records_dir(control_dir: str | os.PathLike[str], kind: str = "lease") -> Path:
    return Path(control_dir) / kind


def record_path(control_dir: str | os.PathLike[str], epoch: int, kind: str = "lease") -> Path:
    return _records_dir(control_dir, kind) / f"{epoch:08d}.json"


def record_numbers(control_dir: str | os.PathLike[str], kind: str = "lease") -> list[int]:
    try:
        names = os.listdir(_records_dir(control_dir, kind))
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())


def read_record(path: Path, cls: type[T]) -> T | None:
    """A numbered record as ``cls`` (a dataclass); None if it is missing or damaged."""
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    known = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


def _read(path: Path) -> Holder | None:
    return read_record(path, Holder)


def create_record(control_dir: str | os.PathLike[str], epoch: int, record: object, kind: str = "lease") -> bool:
    """Create the record of ``epoch`` whole and exclusively (of two processes trying at once, one
    gets it): False if it exists already."""
    path = record_path(control_dir, epoch, kind)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.new")
    tmp.write_text(json.dumps(asdict(record)))
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def prune_records(control_dir: str | os.PathLike[str], kind: str = "lease", keep: int = 200) -> None:
    for epoch in record_numbers(control_dir, kind)[:-keep]:
        record_path(control_dir, epoch, kind).unlink(missing_ok=True)


def latest(control_dir: str | os.PathLike[str]) -> Holder | None:
    """The newest epoch's record, released or not."""
    epochs = record_numbers(control_dir)
    return _read(record_path(control_dir, epochs[-1])) if epochs else None


def read_holder(control_dir: str | os.PathLike[str]) -> Holder | None:
    """Who holds the lease (or held it last, if it died without releasing); None once released."""
    holder = latest(control_dir)
    return None if holder is None or holder.released_at is not None else holder


def holder_alive(control_dir: str | os.PathLike[str]) -> bool:
    """Does a live driver hold the lease right now (as seen from this host)?"""
    holder = latest(control_dir)
    return holder is not None and holder.alive()


def history(control_dir: str | os.PathLike[str]) -> list[Holder]:
    """Every kept record, oldest first."""
    return [h for e in record_numbers(control_dir) if (h := _read(record_path(control_dir, e))) is not None]


def overlaps(records: list[Holder]) -> list[tuple[Holder, Holder]]:
    """Pairs of consecutive holders whose tenures overlap: a later epoch that started
    before the one before it last renewed or released its lease. Empty when no two
    drivers ever held the checkpoint at once."""
    ordered = sorted(records, key=lambda h: h.epoch)
    return [(a, b) for a, b in zip(ordered, ordered[1:], strict=False) if b.started_at <= a.ended_at]


def end_launcher(holder: Holder, timeout: float = 10.0) -> None:
    """Make sure the spark-submit JVM of a dead driver on this host is gone before another driver
    takes the stream: a Python driver killed by a signal leaves its JVM running for a moment,
    which may still commit a batch of a query that needs no Python. Kills it (SIGKILL) and
    waits for it to go."""
    pid = holder.launcher_pid
    if holder.host != host_id() or pid <= 1 or holder.launcher_start is None:
        return
    if process_start(pid) != holder.launcher_start or not is_spark_submit(pid):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while process_start(pid) == holder.launcher_start and time.monotonic() < deadline:
        time.sleep(0.02)


def release_dead(control_dir: str | os.PathLike[str], driver_id: str) -> Holder | None:
    """Mark the lease of the dead driver ``driver_id`` released, on the machine where it ran (its
    process gone, its spark-submit JVM ended first): a standby on another machine then takes the
    stream over at once, instead of after the lease's ``ttl``. Does nothing unless that driver
    holds the newest epoch and is dead here; returns its record if it did."""
    holder = latest(control_dir)
    if (holder is None or not driver_id or holder.driver_id != driver_id or holder.released_at is not None
            or holder.host != host_id() or holder.pid_start is None or process_start(holder.pid) == holder.pid_start):
        return None
    end_launcher(holder)
    if record_path(control_dir, holder.epoch + 1).exists():
        return None
    # Released as of its last heartbeat: when it died is not known, only that it held the lease
    # then. Not now: a successor that saw it dead too may have begun its tenure a moment ago and
    # be creating its record only after the check above.
    holder.released_at = holder.heartbeat_at
    write_atomically(record_path(control_dir, holder.epoch), json.dumps(asdict(holder)))
    log.info("released the lease of dead driver %s (epoch %d)", driver_id, holder.epoch)
    return holder


def is_spark_submit(pid: int) -> bool:
    try:
        return any("org.apache.spark.deploy.SparkSubmit" in arg for arg in psutil.Process(pid).cmdline())
    except (psutil.Error, ValueError):
        return False


def halt(reason: str, code: int = EXIT_LEASE_LOST, last_words: Callable[[], None] | None = None) -> None:
    """What a driver that lost its lease (or is stopped immediately) does: kill the
    spark-submit JVM that runs its queries, so that no batch in flight commits, then (after
    ``last_words``, such as an event saying why) exit at once."""
    print(f"FATAL: {reason}; halting without committing anything more", file=sys.stderr, flush=True)
    parent = os.getppid()
    try:
        if is_spark_submit(parent):
            os.kill(parent, signal.SIGKILL)
    except OSError:
        pass
    if last_words is not None:
        try:
            last_words()
        except Exception:  # halting matters more
            log.exception("while halting")
    os._exit(code)


_current: DriverLease | None = None


def fence() -> None:
    """Before a commit: raise :class:`LeaseLost` (after the lease's ``on_lost``) unless this
    process's lease is still valid. A process holding no lease (a test, a backfill) passes."""
    if _current is not None:
        _current.check()


def held_epoch() -> int | None:
    """The epoch of this process's lease, or None if it holds none (a test, a backfill)."""
    return _current.epoch if _current is not None else None


class DriverLease:
    """This driver's hold on a stream's checkpoint (see the module).

    :param ttl: how long its heartbeat keeps it alive for others; it fences itself after half.
    :param on_lost: called once when the lease is found lost (default :func:`halt`).
    :param fences: the process's commits check this lease (:func:`fence`) and name its epoch;
        False for a lease on something else than the checkpoint (an upgrade's step).
    """

    def __init__(self, control_dir: str | os.PathLike[str], stream: str = "", heartbeat_seconds: float = HEARTBEAT_SECONDS,
                 ttl: float = TTL_SECONDS, on_lost: Callable[[str], None] | None = None, fences: bool = True):
        self.dir = Path(control_dir)
        self.fences = fences
        self.stream = stream
        self.ttl = ttl
        self.heartbeat_seconds = min(heartbeat_seconds, ttl / 6)
        self.on_lost = on_lost or halt
        self._holder: Holder | None = None
        self._renewed = 0.0  # monotonic: when the lease was last known to be ours
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def epoch(self) -> int:
        return self._holder.epoch if self._holder else 0

    @property
    def records_dir(self) -> Path:
        """The folder of the lease's numbered records."""
        return _records_dir(self.dir)

    @property
    def since(self) -> float:
        """When this driver took the lease (0 while it holds none)."""
        return self._holder.started_at if self._holder else 0.0

    def acquire(self) -> DriverLease:
        global _current
        _records_dir(self.dir).mkdir(parents=True, exist_ok=True)
        previous = latest(self.dir)
        if previous is not None and previous.alive():
            raise LeaseHeld(
                f"checkpoint {self.dir.parent} is in use by a live driver: {previous.describe()}. Refusing to start "
                f"a second driver on it; stop that driver first (graceful stop marker {self.dir / 'stop'}) or wait for "
                f"it to exit (its lease lapses {previous.ttl:.0f}s after its last heartbeat).")
        epoch = (previous.epoch if previous else 0) + 1
        now = time.time()
        self._renewed = time.monotonic()
        holder = Holder(host=host_id(), pid=os.getpid(), started_at=now, heartbeat_at=now, stream=self.stream,
                        epoch=epoch, ttl=self.ttl, launcher_pid=os.getppid(), pid_start=process_start(os.getpid()),
                        driver_id=os.environ.get(DRIVER_ID_ENV, ""), launcher_start=process_start(os.getppid()))
        if not create_record(self.dir, epoch, holder):  # of two drivers, one gets the epoch
            raise LeaseHeld(f"checkpoint {self.dir.parent}: another driver took epoch {epoch} of its lease at the "
                            "same moment; refusing to start a second driver on it")
        if previous is not None and previous.released_at is None:
            log.warning("taking over the checkpoint lease of a dead driver: %s", previous.describe())
        self._holder = holder
        prune_records(self.dir, keep=KEEP_RECORDS)
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()
        if self.fences:
            _current = self
        return self


    def _problem(self) -> str | None:
        """Why the lease is no longer ours, or None while it is."""
        assert self._holder is not None
        idle = time.monotonic() - self._renewed
        if idle > self.ttl / 2:
            return (f"the lease of stream {self.stream} (epoch {self.epoch}) was last renewed {idle:.0f}s ago, more "
                    f"than half its ttl of {self.ttl:.0f}s (was this process paused or cut off?)")
        if record_path(self.dir, self.epoch + 1).exists():
            newer = _read(record_path(self.dir, self.epoch + 1))
            return (f"the lease of stream {self.stream} (epoch {self.epoch}) was taken over by "
                    f"{newer.describe() if newer else 'another driver'}")
        return None

    def check(self) -> None:
        """Raise :class:`LeaseLost` (after ``on_lost``) unless the lease is still this driver's."""
        if self._holder is None:
            return
        problem = self._lost or self._problem()
        if problem:
            self._lose(problem)
            raise LeaseLost(problem)

    def _lose(self, problem: str) -> None:
        with self._lock:
            first = self._lost is None
            self._lost = problem
        if first:
            log.critical("%s", problem)
            self._stop.set()
            self.on_lost(problem)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            assert self._holder is not None
            # The clocks are read before the check: a successor that began before this moment had
            # found this lease lapsed, which the check sees, so no heartbeat outlasts a takeover.
            now, checked = time.time(), time.monotonic()
            problem = self._problem()
            if problem:
                self._lose(problem)
                return
            self._holder.heartbeat_at = now
            try:
                write_atomically(record_path(self.dir, self.epoch), json.dumps(asdict(self._holder)))
            except OSError as exc:
                log.warning("lease heartbeat failed: %s", exc)
                continue
            self._renewed = checked

    def release(self) -> None:
        global _current
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if _current is self:
            _current = None
        now = time.time()  # before the check, as for a heartbeat
        if self._holder is not None and self._lost is None and self._problem() is None:
            self._holder.released_at = now
            try:
                write_atomically(record_path(self.dir, self.epoch), json.dumps(asdict(self._holder)))
            except OSError as exc:
                log.warning("could not mark the lease released (it lapses after %.0fs): %s", self.ttl, exc)
        self._holder = None

    def __enter__(self) -> DriverLease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
