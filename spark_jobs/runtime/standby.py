"""A warm standby driver: ready to run a stream the moment its active driver is gone.

A driver started with ``--standby`` (``supervision.standby: true`` makes the supervisor keep
one beside the active driver) does all a driver does before its queries start: the JVM and
the Spark session, the spec's analysis, the plan. Then it waits on the stream's lease and
takes it when the lease is free: its holder's process gone (seen within
``POLL_SECONDS`` on the same machine), its lease released or lapsed (a holder elsewhere:
its heartbeat's ``ttl``). It never takes a stream an operator stopped (the hold marker),
nor one whose supervisor is no longer the try that launched it. The lease's fencing holds
as for any driver: of two takers one gets the epoch, and a dead holder's JVM on this
machine is ended first (:func:`spark_jobs.runtime.lease.end_launcher`), so no batch of it can
commit after the takeover.

Each standby keeps a record in ``<checkpoint root>/_control/standby/<driver id>.json``
(state ``warming``, ``ready``, ``taking over``; refreshed every ``REFRESH_SECONDS``), which the
Streams page shows and a supervisor on another worker reads.

A standby runs beside the active driver, launched by its supervisor, or, with
``supervision.standby_queue``, on another worker, launched by the stream DAG's ``standby`` task
(``streamops.operators.standby.StreamStandbyOperator``). A supervisor whose driver died marks its
lease released at once (:func:`spark_jobs.runtime.lease.release_dead`), so that a standby on
another machine need not wait out the lease's ``ttl``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.lease import (
    SUPERVISORS,
    DriverLease,
    LeaseHeld,
    end_launcher,
    host_id,
    latest,
    process_start,
    record_numbers,
    record_path,
)

log = logging.getLogger(__name__)

POLL_SECONDS = 0.1
#: a standby refreshes its record this often; one elsewhere whose record is older than
#: ``STALE_SECONDS`` is presumed gone (its worker lost)
REFRESH_SECONDS, STALE_SECONDS = 1.0, 10.0
WARMING, READY, TAKING_OVER = "warming", "ready", "taking over"


@dataclass
class Standby:
    driver_id: str
    host: str
    pid: int
    pid_start: int | None
    state: str
    since: float
    #: the supervisor's try that launched it (``_control/supervisors``); 0: none
    supervisor: int = 0
    #: when it last refreshed its record
    seen_at: float = 0.0

    def alive(self) -> bool:
        """Its process still runs (elsewhere: presumed so while it refreshes its record)."""
        if self.host != host_id():
            return time.time() - max(self.seen_at, self.since) < STALE_SECONDS
        return self.pid_start is not None and process_start(self.pid) == self.pid_start


def _dir(control_dir: str | os.PathLike[str]) -> Path:
    return Path(control_dir) / "standby"


def standbys(control_dir: str | os.PathLike[str]) -> list[Standby]:
    """The stream's standby drivers whose processes still run (the record of one that died on this
    machine is removed)."""
    found = []
    for path in sorted(_dir(control_dir).glob("*.json")):
        try:
            standby = Standby(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if standby.alive():
            found.append(standby)
        else:
            path.unlink(missing_ok=True)
    return found


class StandbyRecord:
    """This standby's record, kept up to date with its state, refreshed every ``REFRESH_SECONDS``
    (on a thread of its own: while the standby warms too) and removed when it ends."""

    def __init__(self, control_dir: str | os.PathLike[str], driver_id: str, supervisor: int):
        self.path = _dir(control_dir) / f"{driver_id}.json"
        self.standby = Standby(driver_id=driver_id, host=host_id(), pid=os.getpid(),
                               pid_start=process_start(os.getpid()), state=WARMING, since=time.time(),
                               supervisor=supervisor)
        self._lock = threading.Lock()
        self._removed = threading.Event()
        self.set(WARMING)
        threading.Thread(target=self._keep_fresh, name="standby-record", daemon=True).start()

    def set(self, state: str) -> None:
        with self._lock:
            self.standby.state, self.standby.since = state, time.time()
        self.refresh()

    def refresh(self) -> None:
        with self._lock:
            if self._removed.is_set():
                return
            self.standby.seen_at = time.time()
            write_atomically(self.path, json.dumps(asdict(self.standby)))

    def _keep_fresh(self) -> None:
        while not self._removed.wait(REFRESH_SECONDS):
            try:
                self.refresh()
            except OSError as exc:
                log.warning("could not refresh the standby's record: %s", exc)

    def remove(self) -> None:
        with self._lock:
            self._removed.set()
            self.path.unlink(missing_ok=True)


def supervisor_current(control_dir: str | os.PathLike[str], supervisor: int) -> bool:
    """Is the supervisor's try that launched this standby still the stream's current one, and (on
    this machine) does its process still run? A standby nobody supervises never takes over."""
    if not supervisor:
        return True
    numbers = record_numbers(control_dir, SUPERVISORS)
    if numbers and numbers[-1] > supervisor:
        return False
    try:
        record = json.loads(record_path(control_dir, supervisor, SUPERVISORS).read_text())
    except (OSError, ValueError):
        return True
    if record.get("host") != host_id() or record.get("pid_start") is None:
        return True
    return process_start(int(record.get("pid", 0))) == record["pid_start"]


def hand_to(control_dir: str | os.PathLike[str], driver_id: str, seconds: float) -> Path:
    """Name the standby that is to take the stream over next (a rescale's, warmed at the new size), for
    ``seconds``: meanwhile any other standby leaves the free lease to it (``_control/handover.json``)."""
    return write_atomically(Path(control_dir) / "handover.json",
                            json.dumps({"to": driver_id, "until": time.time() + seconds}))


def handed_to(control_dir: str | os.PathLike[str]) -> str | None:
    """The standby named by :func:`hand_to`, until its time is up; None if none is."""
    try:
        named = json.loads((Path(control_dir) / "handover.json").read_text(encoding="utf-8"))
        return str(named["to"]) if float(named["until"]) > time.time() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def take_over(lease: DriverLease, hold_marker: Path, supervisor: int, stop: threading.Event,
              record: StandbyRecord | None = None, poll: float = POLL_SECONDS) -> bool:
    """Wait until the stream's lease is free, then take it (see the module). False, holding
    nothing, if ``stop`` is set, this process was orphaned (its spark-submit ended), or the
    supervisor that launched it is no longer current."""
    launcher = os.getppid()
    if record is not None:
        record.set(READY)
    while not stop.wait(poll):
        if os.getppid() != launcher:
            log.warning("the standby's spark-submit ended: leaving")
            return False
        if not supervisor_current(lease.dir, supervisor):
            log.warning("the supervisor that launched this standby is no longer the stream's current one: leaving")
            return False
        if hold_marker.exists():
            continue  # stopped on purpose: never taken over
        holder = latest(lease.dir)
        if holder is not None and holder.alive():
            continue
        if record is not None and handed_to(lease.dir) not in (None, record.standby.driver_id):
            continue  # a rescale hands the stream to another standby (the one at the new size)
        if record is not None:
            record.set(TAKING_OVER)
        if holder is not None and holder.released_at is None:
            end_launcher(holder)
        try:
            lease.acquire()
        except LeaseHeld as exc:
            log.info("%s", exc)
            if record is not None:
                record.set(READY)
            continue
        log.warning("standby took stream %s over (epoch %d)%s", lease.stream, lease.epoch,
                    f" from {holder.describe()}" if holder is not None else "")
        return True
    return False


def end_standby(control_dir: str | os.PathLike[str], driver_id: str) -> None:
    """Kill the Python process of the standby ``driver_id`` on this machine, if it still waits (not
    one that has taken the stream over: that one is an active driver now, stopped as such)."""
    for standby in standbys(control_dir):
        if standby.driver_id == driver_id and standby.host == host_id() and standby.state != TAKING_OVER:
            try:
                os.kill(standby.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            (_dir(control_dir) / f"{driver_id}.json").unlink(missing_ok=True)
