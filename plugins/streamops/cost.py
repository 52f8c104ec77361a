"""What a stream costs: the CPU seconds and memory of its drivers, as its supervisor samples them.

A supervisor task runs its stream's drivers as its own child processes (spark-submit, the
driver's JVM and Python, their Python workers; client mode). :class:`DriverCost` counts their
CPU whole, to each process's exit: the processes alive now (their own CPU and that of the
children they reaped) plus those that ended and were reaped (the task's ``RUSAGE_CHILDREN``).
Each sample adds the CPU seconds used since the last one and the resident memory now to the
stream's history (``driver_cpu_s``, ``driver_rss_mb``), which the Streams page charts and sums
(:func:`summary`): per hour, and per 1,000 rows read, so that what a mode saves is seen.

Not counted: a driver in the cluster (YARN or Kubernetes cluster mode), and one this task
adopted (started by an earlier try): neither is a child of the task.
"""

from __future__ import annotations

import resource
from typing import Any

import psutil

from spark_jobs.runtime.history import MINUTE, STREAM, History
from spark_jobs.stream_spec.models import INGEST_FLOW

#: the history's metrics of a stream's cost
CPU, RSS = "driver_cpu_s", "driver_rss_mb"


def reaped_cpu() -> float:
    """CPU seconds of this process's children that ended and were reaped (with their own reaped children)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


class DriverCost:
    """Samples the CPU and memory of this process's children (the drivers a supervisor task runs)."""

    def __init__(self) -> None:
        self._counted = reaped_cpu()  # this task's children so far: none of its drivers yet

    def measure(self) -> tuple[float, float]:
        """CPU seconds its drivers used since the last measure (or since this began), and their
        resident memory now (MB)."""
        cpu, rss = reaped_cpu(), 0
        for process in psutil.Process().children(recursive=True):
            try:
                with process.oneshot():
                    t = process.cpu_times()
                    cpu += t.user + t.system + t.children_user + t.children_system
                    rss += process.memory_info().rss
            except psutil.Error:  # ended meanwhile: counted once it is reaped
                continue
        # a process that ended is counted again only once reaped: until then the total may dip
        used, self._counted = max(0.0, cpu - self._counted), max(self._counted, cpu)
        return used, rss / 1e6

    def sample(self, history: History, at: float) -> None:
        """Measure, and add it to the stream's history."""
        used, rss = self.measure()
        history.sample({CPU: used, RSS: rss}, at=at)


def summary(history: History, since: float, until: float) -> dict[str, Any]:
    """The stream's cost over a range: its drivers' CPU seconds (and per hour of the range), their
    peak memory, the rows its ingestion read, and CPU seconds per 1,000 of them."""
    data = history.series(since, until, tier=MINUTE, metrics=[CPU, RSS, "input_rows"])
    cpu = sum(p.sum for p in data.get((STREAM, CPU), []))
    peak = max((p.max for p in data.get((STREAM, RSS), [])), default=None)
    rows = sum(p.sum for p in data.get((INGEST_FLOW, "input_rows"), []))
    hours = max(until - since, 1.0) / 3600
    return {"cpu_seconds": round(cpu, 1), "cpu_seconds_per_hour": round(cpu / hours, 1),
            "peak_memory_mb": None if peak is None else round(peak), "rows": int(rows),
            "cpu_seconds_per_1000_rows": round(1000 * cpu / rows, 3) if rows else None}
