"""The queue of a shared driver (``spark_jobs/shared_driver.py``): scheduled runs of many streams,
taken one after another by one long-lived driver instead of a JVM started for each.

A folder, shared by who asks for runs (a stream's supervisor) and the driver that takes them::

    requests/<id>.json   asked for, not taken yet (``<id>``: time first, so names sort oldest first)
    running/<id>.json    taken: renamed here by the driver that runs it (of two, one wins the rename)
    results/<id>.json    how it ended: the exit code the stream's own driver would have had, its
                         CPU and wall seconds, the lines it logged (``logs/<id>.log``)
    driver.json          the serving driver: pid, host, heartbeat (every HEARTBEAT_SECONDS)

A run asked for is withdrawn by renaming it back out of ``requests/``: whoever renames first
decides whether it runs. A driver that ended with a run taken left it in ``running/``; the next
driver to serve the folder, and anyone who finds the driver dead, ends it as failed
(:data:`EXIT_DRIVER_LOST`). The run's stream is safe either way: its lease and checkpoint are
the same as those of a driver of its own (``spark_jobs.runtime.lease``).

No Spark here: the supervisors' side imports it.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.lease import host_id, process_start

if TYPE_CHECKING:
    from spark_jobs.stream_spec.models import StreamSpec

#: how often the serving driver says it is alive; it is taken for dead after DEAD_AFTER_SECONDS without
HEARTBEAT_SECONDS, DEAD_AFTER_SECONDS = 2.0, 15.0
#: a run's exit code when its shared driver ended during it (as a driver of its own killed would)
EXIT_DRIVER_LOST = 137
#: a run's exit code when its spec needs a JVM of its own (:func:`not_shareable`)
EXIT_NOT_SHAREABLE = 5


@dataclass(frozen=True)
class RunRequest:
    """One available-now run of a stream: its spec file, data root, the driver id its lease
    record names, and the environment it needs (a Kafka connection's servers)."""

    spec: str
    data_root: str | None = None
    driver_id: str = ""
    env: dict[str, str] = field(default_factory=dict)
    id: str = ""


def not_shareable(spec: StreamSpec) -> str | None:
    """Why the stream's runs need a driver of their own, or None if a shared driver can take them:
    an application (its own program), Python code of the user's (a module imported once stays in a
    long-lived driver as it was), or Spark settings of the spec's own that only a JVM of its own
    takes (the shared driver finds those, :func:`spark_jobs.runtime.session.shared_session`)."""
    from spark_jobs.plan import python_refs

    if spec.application is not None:
        return "an application runs in a driver of its own"
    if refs := python_refs(spec):
        return f"Python code of its own ({', '.join(refs)}) is imported once per driver"
    static = sorted(k for k in spec.spark.conf if not k.startswith("spark.sql."))
    if static:
        return f"spark.conf sets {', '.join(static)}, which only a driver of its own takes"
    return None


class RunQueue:
    """A shared driver's queue folder (see the module)."""

    def __init__(self, folder: str | os.PathLike[str]):
        self.dir = Path(folder)
        self.requests, self.running = self.dir / "requests", self.dir / "running"
        self.results, self.logs = self.dir / "results", self.dir / "logs"
        self.driver_file = self.dir / "driver.json"

    def _ready(self) -> None:
        for d in (self.requests, self.running, self.results, self.logs):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)

    # ---- who asks for runs ----------------------------------------------------------------------

    def ask(self, request: RunRequest) -> str:
        """Queue a run; its id."""
        self._ready()
        run_id = f"{time.time_ns():020d}-{secrets.token_hex(4)}"
        # 0600: the environment may name a broker's servers
        write_atomically(self.requests / f"{run_id}.json", json.dumps({**asdict(request), "id": run_id}), mode=0o600)
        return run_id

    def withdraw(self, run_id: str) -> bool:
        """Take back a run not taken yet: True if withdrawn, False if a driver took it first."""
        try:
            os.rename(self.requests / f"{run_id}.json", self.dir / f"withdrawn-{run_id}.json")
        except FileNotFoundError:
            return False
        (self.dir / f"withdrawn-{run_id}.json").unlink(missing_ok=True)
        return True

    def result(self, run_id: str) -> dict[str, Any] | None:
        """How the run ended, or None while it has not. A run taken by a driver that is dead ends
        here as :data:`EXIT_DRIVER_LOST`."""
        found = self._read(self.results / f"{run_id}.json")
        if found is None and (self.running / f"{run_id}.json").exists() and not self.serving():
            self._end_lost(run_id)
            found = self._read(self.results / f"{run_id}.json")
        return found

    def log_lines(self, run_id: str) -> list[str]:
        """What the run logged."""
        try:
            return (self.logs / f"{run_id}.log").read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def forget(self, run_id: str) -> None:
        """Remove the run's result and log, once read."""
        (self.results / f"{run_id}.json").unlink(missing_ok=True)
        (self.logs / f"{run_id}.log").unlink(missing_ok=True)

    def _asked(self) -> list[str]:
        """The requests' file names, oldest first."""
        try:
            return sorted(name for name in os.listdir(self.requests) if name.endswith(".json"))
        except FileNotFoundError:
            return []

    def waiting(self) -> int:
        """How many runs were asked for and not taken yet."""
        return len(self._asked())

    def serving(self) -> dict[str, Any] | None:
        """The driver that serves the queue, if one is alive: its heartbeat is recent and, on this
        host, its process is there."""
        driver = self._read(self.driver_file)
        if driver is None or time.time() - float(driver.get("heartbeat_at", 0)) > DEAD_AFTER_SECONDS:
            return None
        if driver.get("host") == host_id() and process_start(int(driver.get("pid", 0))) != driver.get("pid_start"):
            return None  # its process is gone (or the pid reused)
        return driver

    # ---- the driver that takes them -------------------------------------------------------------

    def beat(self, started_at: float, serving: str | None = None) -> None:
        """Say this process serves the queue (and which run it is on)."""
        self._ready()
        write_atomically(self.driver_file, json.dumps({"pid": os.getpid(), "pid_start": process_start(os.getpid()),
                                                        "host": host_id(), "started_at": started_at,
                                                        "heartbeat_at": time.time(), "run": serving}))

    def leave(self) -> None:
        """Say this process serves the queue no more."""
        if (self._read(self.driver_file) or {}).get("pid") == os.getpid():
            self.driver_file.unlink(missing_ok=True)

    def take(self) -> RunRequest | None:
        """The oldest run asked for, now taken by this driver; None if none waits."""
        self._ready()
        for name in self._asked():
            try:
                os.rename(self.requests / name, self.running / name)
            except FileNotFoundError:  # withdrawn, or another driver took it
                continue
            data = self._read(self.running / name) or {}
            try:
                return RunRequest(spec=str(data["spec"]), data_root=data.get("data_root"),
                                  driver_id=str(data.get("driver_id", "")), env=dict(data.get("env") or {}),
                                  id=name.removesuffix(".json"))
            except (KeyError, TypeError, ValueError) as exc:
                self.finish(name.removesuffix(".json"), {"code": 2, "error": f"unreadable request: {exc!r}"})
        return None

    def finish(self, run_id: str, outcome: dict[str, Any]) -> None:
        """Record how a taken run ended."""
        write_atomically(self.results / f"{run_id}.json", json.dumps({"id": run_id, "ended_at": time.time(), **outcome}))
        (self.running / f"{run_id}.json").unlink(missing_ok=True)

    def recover(self) -> list[str]:
        """End, as failed, the runs an earlier driver left taken (it ended during them); their ids."""
        self._ready()
        lost = sorted(n.removesuffix(".json") for n in os.listdir(self.running) if n.endswith(".json"))
        for run_id in lost:
            self._end_lost(run_id)
        return lost

    def _end_lost(self, run_id: str) -> None:
        if not (self.results / f"{run_id}.json").exists():
            self.finish(run_id, {"code": EXIT_DRIVER_LOST, "error": "the shared driver ended during the run"})
        (self.running / f"{run_id}.json").unlink(missing_ok=True)

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None

