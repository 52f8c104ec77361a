"""Which try of a stream's supervisor task is the current one.

Airflow retries a supervisor task whose worker stopped answering (a lost or paused worker,
a network partition). If that worker comes back, its old try runs on for a few seconds
before Airflow kills it: a try Airflow no longer considers current. Such a try must not
adopt, stop or count the runs of the driver that the new try started, or it would stop a
stream that moved.

Each try that starts supervising a stream creates the next numbered record in
``<checkpoint root>/_control/supervisors/`` (exclusively, as the lease's epochs are
created: :func:`spark_jobs.runtime.lease.create_record`), on the storage every worker shares. The
newest record is the current try; every earlier one is superseded and leaves the stream
alone. A second DAG run cannot start while one runs (``max_active_runs=1``), so a newer
record always means a newer try of the stream's supervision.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from spark_jobs.runtime.lease import SUPERVISORS as KIND
from spark_jobs.runtime.lease import (
    create_record,
    host_id,
    process_start,
    prune_records,
    read_record,
    record_numbers,
    record_path,
)


@dataclass
class Tenure:
    """One try's hold on a stream's supervision."""

    number: int
    host: str
    pid: int
    started_at: float
    #: the try, as Airflow names it: ``<dag_id> run <run_id> try <n>``
    task: str = ""
    pid_start: int | None = None

    def describe(self) -> str:
        return f"{self.task or 'a supervisor'} (pid {self.pid} on {self.host})"


def current(control_dir: str | os.PathLike[str]) -> Tenure | None:
    """The newest try's record: the current supervisor of the stream."""
    numbers = record_numbers(control_dir, KIND)
    return read_record(record_path(control_dir, numbers[-1], KIND), Tenure) if numbers else None


def begin(control_dir: str | os.PathLike[str], task: str) -> Tenure:
    """Make this try the stream's current supervisor: every earlier try is superseded."""
    while True:
        latest = current(control_dir)
        tenure = Tenure(number=(latest.number if latest else 0) + 1, host=host_id(), pid=os.getpid(),
                        started_at=time.time(), task=task, pid_start=process_start(os.getpid()))
        if create_record(control_dir, tenure.number, tenure, KIND):
            prune_records(control_dir, KIND, keep=50)
            return tenure


def superseded_by(control_dir: str | os.PathLike[str], tenure: Tenure) -> Tenure | None:
    """The newer try that took the stream's supervision over from ``tenure``, or None while it is current."""
    latest = current(control_dir)
    if latest is None or latest.number <= tenure.number:
        return None
    return latest
