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
recommendation says.

With ``min_trigger`` or ``max_trigger`` in the spec it sizes the trigger interval too. A batch's
time is a fixed part (planning, the commit: ``overhead``) and a part per unit (``per_unit``),
fitted over the window's batches (least squares; batches of one size alone cannot tell them
apart, and leave the interval as it is). The interval is the shortest at which a batch of the
demand still takes at most ``utilisation`` of it (freshest without falling behind)::

    overhead + per_unit * demand * interval <= utilisation * interval
    interval = overhead / (utilisation - per_unit * demand), within [min_trigger, max_trigger]

and the longest allowed when no interval is (the cores are short: the fixed part is spread over
the largest batches). The per-trigger size is then the demand over that interval.

A recommendation is recorded (a ``sizing_decision`` event with every input above, into the
stream's log and history) when it differs from the last recorded one by a quarter or more (its
size or its interval), or its verdict on the cores changes: hysteresis, so that noise records
nothing.

It is applied (``applied: true`` in its event) when it differs from the limit the driver runs at
by a quarter or more (a smaller one only while batches take more than ``utilisation`` of the
time), or its interval from the driver's by a quarter or more, unless the spec says ``dry_run``:
the supervisor records the new limit and interval
(``spark_jobs.runtime.rate_limit``) and hands the stream to a standby started at that size, at a
batch boundary (``streamops.supervisor.Supervisor.rescale``): a rescale costs a takeover, not a
cold restart.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
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
    batches: tuple[tuple[int, float], ...] = ()  # each batch that took input: (units, seconds)


def batch_cost(batches: tuple[tuple[int, float], ...]) -> tuple[float, float] | None:
    """``(overhead, per_unit)``: a batch's fixed seconds and its seconds per unit, fitted by least
    squares over batches of ``(units, seconds)``; None while they cannot tell the two apart (fewer
    than two sizes of batch). Neither is below zero."""
    if len({n for n, _ in batches}) < 2:
        return None
    count = len(batches)
    mean_n = sum(n for n, _ in batches) / count
    mean_t = sum(t for _, t in batches) / count
    spread = sum((n - mean_n) ** 2 for n, _ in batches)
    per_unit = max(0.0, sum((n - mean_n) * (t - mean_t) for n, t in batches) / spread)
    overhead = mean_t - per_unit * mean_n
    if overhead < 0:  # the line through the origin, then
        overhead, per_unit = 0.0, sum(n * t for n, t in batches) / sum(n * n for n, _ in batches)
    return overhead, per_unit


def interval(cost: tuple[float, float] | None, demand: float, utilisation: float, current: float,
             bounds: tuple[float, float]) -> float:
    """The trigger interval for ``demand`` (see the module): ``current`` while the cost is unknown."""
    low, high = bounds
    if cost is None:
        return min(high, max(low, current))
    overhead, per_unit = cost
    room = utilisation - per_unit * demand
    if room <= 0:
        return high
    return min(high, max(low, overhead / room))


@dataclass(frozen=True)
class Recommendation:
    unit: str  # "files" or "records"
    per_trigger: int
    current: int | None  # the source's own limit (None: none, a Kafka source without one)
    arrival: float  # units a second
    capacity: float | None  # units a second while a batch runs; None: no batch ran
    demand: float  # units a second
    cores_factor: float  # the cores it needs over those it has (<= 1: enough)
    trigger_seconds: float = 0.0  # the interval the per-trigger size is for
    cost: tuple[float, float] | None = None  # a batch's (overhead, per_unit) seconds, when known

    @property
    def enough_cores(self) -> bool:
        return self.cores_factor <= 1.0


def recommend(window: Window, unit: str, current: int | None, trigger_seconds: float, catch_up_seconds: float,
              utilisation: float, bounds: tuple[int, int],
              trigger_bounds: tuple[float, float] | None = None) -> Recommendation:
    """The per-trigger size the window's measurements ask for (see the module); with
    ``trigger_bounds``, for the interval they ask for too (``trigger_seconds``: the driver's now)."""
    arrival = max(0.0, (window.taken + window.backlog_now - window.backlog_before) / window.seconds)
    capacity = window.taken / window.busy_seconds if window.busy_seconds > 0 and window.taken > 0 else None
    demand = window.backlog_now / catch_up_seconds + arrival
    cost = batch_cost(window.batches) if trigger_bounds is not None else None
    if trigger_bounds is not None:
        trigger_seconds = interval(cost, demand, utilisation, trigger_seconds, trigger_bounds)
    low, high = bounds
    per_trigger = min(high, max(low, math.ceil(demand * trigger_seconds - 1e-9)))  # not one more for a rounding
    factor = demand / (utilisation * capacity) if capacity else 0.0
    return Recommendation(unit, per_trigger, current, round(arrival, 3), round(capacity, 3) if capacity else None,
                          round(demand, 3), round(factor, 3), round(trigger_seconds, 3),
                          (round(cost[0], 3), round(cost[1], 5)) if cost is not None else None)


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
        #: the interval the driver runs at (the one sizing set last, else the spec's), and its bounds
        #: (None: the spec sizes no interval)
        self.trigger_seconds = rate_limit.current_trigger(plan, layout)
        self.trigger_bounds = rate_limit.trigger_bounds(plan)
        self._start: tuple[float, int] | None = None  # when the window began, and the backlog then
        self.last: Recommendation | None = None  # the last one recorded

    def _backlog(self, health: Health) -> int:
        return health.backlog_files if self.files else int(health.backlog_records or 0)

    def _taken(self, batches: list[dict[str, Any]], files_through: Callable[[int], int]) -> int:
        if not self.files:
            return sum(int(b.get("input_rows") or 0) for b in batches)
        ids = [b["batch_id"] for b in batches if isinstance(b.get("batch_id"), int)]
        return files_through(max(ids)) - files_through(min(ids) - 1) if ids else 0

    def _each(self, batches: list[dict[str, Any]], files_through: Callable[[int], int]) -> tuple[tuple[int, float], ...]:
        """Each batch that took input: (units, seconds), for the fit of a batch's cost."""
        if self.trigger_bounds is None:
            return ()
        found = []
        for b in batches:
            seconds = float((b.get("duration_ms") or {}).get("triggerExecution") or 0) / 1000
            if self.files:
                if not isinstance(b.get("batch_id"), int):
                    continue
                units = files_through(b["batch_id"]) - files_through(b["batch_id"] - 1)
            else:
                units = int(b.get("input_rows") or 0)
            if units > 0 and seconds > 0:
                found.append((units, seconds))
        return tuple(found)

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
        # how many files the source had taken through a batch: its log read once per batch asked for
        files_through = cache(lambda batch: len(processed_files(self.checkpoint, through_batch=batch)))
        window = Window(now - began, self._taken(batches, files_through), busy, before, backlog,
                        self._each(batches, files_through))
        found = recommend(window, "files" if self.files else "records", self.current, self.trigger_seconds,
                          duration_seconds(self.sizing.catch_up), self.sizing.utilisation, self.bounds,
                          self.trigger_bounds)
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
                "enough_cores": found.enough_cores,
                **({"trigger_seconds": found.trigger_seconds, "current_trigger_seconds": self.trigger_seconds,
                    "overhead_seconds": found.cost[0] if found.cost else None,
                    "seconds_per_unit": found.cost[1] if found.cost else None}
                   if self.trigger_bounds is not None else {})}

    def _interval_moved(self, found: Recommendation, than: float) -> bool:
        return self.trigger_bounds is not None and abs(found.trigger_seconds - than) >= CHANGE * than

    def _worth_applying(self, found: Recommendation, utilisation: float) -> bool:
        """A quarter or more away from the driver's limit; a smaller limit only while batches take more
        than ``utilisation`` of the time (a smaller one would not make them shorter otherwise: it costs
        a rescale, and slows the next burst's catch-up)."""
        if self.current is None or self._interval_moved(found, self.trigger_seconds):
            return True
        if found.per_trigger < self.current and utilisation <= self.sizing.utilisation:
            return False
        return abs(found.per_trigger - self.current) >= max(1.0, CHANGE * self.current)

    def _worth_recording(self, found: Recommendation) -> bool:
        last = self.last
        if last is None:
            return True
        if found.enough_cores != last.enough_cores or self._interval_moved(found, last.trigger_seconds):
            return True
        return abs(found.per_trigger - last.per_trigger) >= CHANGE * last.per_trigger
