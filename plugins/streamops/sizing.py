"""Sizing by lag: what a continuous driver's micro-batch should take, from what waits and what arrives.

A stream with ``execution.sizing`` (``spark_jobs.stream_spec.models.Sizing``) is observed by its
supervisor over windows of ``every``: the units its ingestion took (landing files, from its
checkpoint's source log; or Kafka records, from its progress), the seconds its batches ran, and
the backlog (files waiting, records behind) at both ends of the window. From them, as the Flink
Kubernetes operator's autoscaler sizes a job::

    arrival     = (taken + backlog now - backlog before) / window     units a second arriving
    capacity    = taken / busy seconds                                units a second while a batch runs
    demand      = backlog now / catch_up + arrival                     units a second to take
    per trigger = ceil(demand * trigger interval), within [min_per_trigger, max_per_trigger]

A batch of that size takes about ``per trigger / capacity`` seconds; the demand fits the trigger
interval while ``demand <= utilisation * capacity``, else the stream needs ``demand /
(utilisation * capacity)`` times the cores it has (on a cluster: executors), which the
recommendation says. A recommendation is recorded (a ``sizing_decision`` event with every input
above, into the stream's log and history) when it differs from the last recorded one by a quarter
or more, or its verdict on the cores changes: hysteresis, so that noise records nothing.

It is applied (``applied: true`` in its event) when it differs from the limit the driver runs at
by a quarter or more (a smaller one only while batches take more than ``utilisation`` of the
time), unless the spec says ``dry_run``: the supervisor records the new limit
(``spark_jobs.runtime.rate_limit``) and hands the stream to a standby started at that size, at a
batch boundary (``streamops.supervisor.Supervisor.rescale``): a rescale costs a takeover, not a
cold restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.runtime import rate_limit
from spark_jobs.runtime.checkpoint import processed_files
from spark_jobs.runtime.progress import batches_logged
from spark_jobs.stream_spec.models import INGEST_FLOW, duration_seconds

if TYPE_CHECKING:
    from spark_jobs.plan import StreamPlan
    from spark_jobs.stream_spec.layout import Layout
    from streamops.health import Health

#: a recommendation is recorded again once it differs from the last by this share, and applied
#: once it differs from the limit the driver runs at by this share
CHANGE = 0.25


@dataclass(frozen=True)
class Window:
    """What the ingestion did over one window of observation."""

    seconds: float
    taken: int  # units taken into batches
    busy_seconds: float  # seconds its batches ran
    backlog_before: int
    backlog_now: int


@dataclass(frozen=True)
class Recommendation:
    unit: str  # "files" or "records"
    per_trigger: int
    current: int | None  # the source's own limit (None: none, a Kafka source without one)
    arrival: float  # units a second
    capacity: float | None  # units a second while a batch runs; None: no batch ran
    demand: float  # units a second
    cores_factor: float  # the cores it needs over those it has (<= 1: enough)

    @property
    def enough_cores(self) -> bool:
        return self.cores_factor <= 1.0


def recommend(window: Window, unit: str, current: int | None, trigger_seconds: float, catch_up_seconds: float,
              utilisation: float, bounds: tuple[int, int]) -> Recommendation:
    """The per-trigger size the window's measurements ask for (see the module)."""
    arrival = max(0.0, (window.taken + window.backlog_now - window.backlog_before) / window.seconds)
    capacity = window.taken / window.busy_seconds if window.busy_seconds > 0 and window.taken > 0 else None
    demand = window.backlog_now / catch_up_seconds + arrival
    low, high = bounds
    per_trigger = min(high, max(low, math.ceil(demand * trigger_seconds)))
    factor = demand / (utilisation * capacity) if capacity else 0.0
    return Recommendation(unit, per_trigger, current, round(arrival, 3), round(capacity, 3) if capacity else None,
                          round(demand, 3), round(factor, 3))


class Sizer:
    """A supervisor's sizing of one stream: observes it each ``every`` and says when a recommendation
    is worth recording (:meth:`observe`)."""

    def __init__(self, plan: StreamPlan, layout: Layout):
        """``plan``: the stream's (its sizing, trigger, source and ingestion's checkpoint); ``layout``:
        where its progress events are."""
        sizing, source = plan.execution.sizing, plan.source
        assert sizing is not None and plan.trigger.processing_time is not None and source is not None
        self.stream, self.sizing, self.layout = plan.stream, sizing, layout
        self.checkpoint = plan.checkpoint(INGEST_FLOW)
        self.files = source.is_files
        #: the limit the driver runs at: the one sizing set last, else the source's own
        self.current: int | None = rate_limit.current(plan, layout)
        self.bounds = rate_limit.bounds(plan)
        self.every = duration_seconds(sizing.every)
        self.trigger_seconds = duration_seconds(plan.trigger.processing_time)
        self._start: tuple[float, int] | None = None  # when the window began, and the backlog then
        self.last: Recommendation | None = None  # the last one recorded

    def _backlog(self, health: Health) -> int:
        return health.backlog_files if self.files else int(health.backlog_records or 0)

    def _taken(self, batches: list[dict[str, Any]]) -> int:
        if not self.files:
            return sum(int(b.get("input_rows") or 0) for b in batches)
        ids = [b["batch_id"] for b in batches if isinstance(b.get("batch_id"), int)]
        if not ids:
            return 0
        return (len(processed_files(self.checkpoint, through_batch=max(ids)))
                - len(processed_files(self.checkpoint, through_batch=min(ids) - 1)))

    def observe(self, health: Health, now: float) -> dict[str, Any] | None:
        """Call at each look: at the end of each window, the ``sizing_decision`` event to record, if
        the recommendation changed enough (see the module); else None."""
        if self._start is None:
            self._start = (now, self._backlog(health))
            return None
        began, before = self._start
        if now - began < self.every:
            return None
        backlog = self._backlog(health)
        self._start = (now, backlog)
        batches = batches_logged(self.layout.events_file, INGEST_FLOW, began, now)
        busy = sum(float((b.get("duration_ms") or {}).get("triggerExecution") or 0) for b in batches) / 1000
        window = Window(now - began, self._taken(batches), busy, before, backlog)
        found = recommend(window, "files" if self.files else "records", self.current, self.trigger_seconds,
                          duration_seconds(self.sizing.catch_up), self.sizing.utilisation, self.bounds)
        apply = not self.sizing.dry_run and self._worth_applying(found, busy / window.seconds)
        if not apply and not self._worth_recording(found):
            return None
        self.last = found
        return {"event": "sizing_decision", "stream": self.stream, "unit": found.unit,
                "per_trigger": found.per_trigger, "current": found.current, "applied": apply,
                "window_seconds": round(window.seconds, 1), "taken": window.taken,
                "busy_seconds": round(busy, 2), "backlog_before": before, "backlog": window.backlog_now,
                "arrival_per_s": found.arrival, "capacity_per_s": found.capacity, "demand_per_s": found.demand,
                "utilisation": round(busy / window.seconds, 3), "cores_factor": found.cores_factor,
                "enough_cores": found.enough_cores}

    def _worth_applying(self, found: Recommendation, utilisation: float) -> bool:
        """A quarter or more away from the driver's limit; a smaller limit only while batches take more
        than ``utilisation`` of the time (a smaller one would not make them shorter otherwise: it costs
        a rescale, and slows the next burst's catch-up)."""
        if self.current is None:
            return True
        if found.per_trigger < self.current and utilisation <= self.sizing.utilisation:
            return False
        return abs(found.per_trigger - self.current) >= max(1.0, CHANGE * self.current)

    def _worth_recording(self, found: Recommendation) -> bool:
        last = self.last
        if last is None:
            return True
        if found.enough_cores != last.enough_cores:
            return True
        return abs(found.per_trigger - last.per_trigger) >= CHANGE * last.per_trigger
