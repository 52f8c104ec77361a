"""What a micro-batch of the ingestion may take, as sizing by lag set it.

A stream with ``execution.sizing`` (not ``dry_run``) has its per-trigger limit set by its
supervisor (``streamops.sizing``): landing files (``maxFilesPerTrigger``) or Kafka records
(``maxOffsetsPerTrigger``), and with ``min_trigger`` or ``max_trigger`` the trigger interval of the
ingestion and of the outputs at the stream's trigger. The supervisor writes them to
``<checkpoint>/_control/per_trigger.json`` (:func:`write`) and hands the stream to a standby
started after it (a rescale); every driver reads it when it plans its flows (:func:`applied`),
so a driver started later for any reason (a restart, a takeover, the next scheduled run) runs at
the size last set, until the spec's own limit or the sizing's bounds change it. Spark allows a
rate limit and a trigger to change under a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.stream_spec.models import duration_seconds

if TYPE_CHECKING:
    from spark_jobs.plan import StreamPlan
    from spark_jobs.stream_spec.layout import Layout

log = logging.getLogger(__name__)

#: a source's own limit times this is the default upper bound of sizing (``max_per_trigger``)
DEFAULT_MAX_FACTOR = 10


def unit(plan: StreamPlan) -> str:
    """What the ingestion's limit counts: ``files`` or ``records``."""
    assert plan.source is not None
    return "files" if plan.source.is_files else "records"


def own_limit(plan: StreamPlan) -> int | None:
    """The limit the spec gives the source (None: none, a Kafka source without one)."""
    source = plan.source
    assert source is not None
    if source.is_files:
        return source.max_files_per_trigger
    return source.kafka.max_offsets_per_trigger if source.kafka is not None else None


def bounds(plan: StreamPlan) -> tuple[int, int]:
    """The limits sizing may set: ``min_per_trigger`` to ``max_per_trigger`` (default: 10 times the source's own)."""
    sizing = plan.execution.sizing
    assert sizing is not None
    high = sizing.max_per_trigger or max(sizing.min_per_trigger, DEFAULT_MAX_FACTOR * (own_limit(plan) or 1))
    return sizing.min_per_trigger, high


def trigger_bounds(plan: StreamPlan) -> tuple[float, float] | None:
    """The trigger intervals sizing may set, in seconds (``min_trigger`` to ``max_trigger``, either one
    the spec's trigger by default); None when the spec sizes no interval."""
    sizing = plan.execution.sizing
    if sizing is None or (sizing.min_trigger is None and sizing.max_trigger is None):
        return None
    assert plan.trigger.processing_time is not None
    own = duration_seconds(plan.trigger.processing_time)
    return (duration_seconds(sizing.min_trigger) if sizing.min_trigger else own,
            duration_seconds(sizing.max_trigger) if sizing.max_trigger else own)


def write(layout: Layout, per_trigger: int, unit: str, by: str, trigger_seconds: float | None = None) -> None:
    """Record the limit a micro-batch may take (and the trigger interval, if sized) from the next
    driver's start on; ``by``: who set it, and why."""
    write_atomically(layout.per_trigger_file, json.dumps({"per_trigger": per_trigger, "unit": unit, "by": by,
                                                          "at": time.time(),
                                                          **({"trigger_seconds": trigger_seconds}
                                                             if trigger_seconds is not None else {})}))


def read(layout: Layout) -> dict[str, Any] | None:
    """The limit last set, as :func:`write` recorded it; None if none was (or it cannot be read)."""
    try:
        found = json.loads(layout.per_trigger_file.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("%s cannot be read (%s): the spec's own limit applies", layout.per_trigger_file, exc)
        return None
    return found if isinstance(found, dict) and isinstance(found.get("per_trigger"), int) else None


def current(plan: StreamPlan, layout: Layout) -> int | None:
    """The limit a driver started now takes: the one sizing set (within its bounds), else the source's own."""
    sizing = plan.execution.sizing
    if sizing is None or sizing.dry_run or plan.source is None:
        return own_limit(plan) if plan.source is not None else None
    found = read(layout)
    if found is None:
        return own_limit(plan)
    if found.get("unit") != unit(plan):  # the source changed kind since: the spec's own
        log.warning("stream %s: the per-trigger limit sizing set counts %s, its source now %s: the spec's own "
                    "limit applies", plan.stream, found.get("unit"), unit(plan))
        return own_limit(plan)
    low, high = bounds(plan)
    return min(high, max(low, int(found["per_trigger"])))


def current_trigger(plan: StreamPlan, layout: Layout) -> float:
    """The trigger interval (seconds) a driver started now runs at: the one sizing set (within its
    bounds), else the spec's."""
    assert plan.trigger.processing_time is not None
    own = duration_seconds(plan.trigger.processing_time)
    bounds = trigger_bounds(plan)
    if bounds is None or plan.execution.sizing.dry_run:
        return own
    found = (read(layout) or {}).get("trigger_seconds")
    return min(bounds[1], max(bounds[0], float(found) if isinstance(found, int | float) else own))


def _with_interval(plan: StreamPlan, seconds: float) -> StreamPlan:
    """The plan with its ingestion, and its outputs at the stream's trigger, every ``seconds``."""
    own = plan.trigger
    trigger = own.model_copy(update={"processing_time": f"{max(1, round(seconds * 1000))} milliseconds"})
    ingestion = plan.ingestion and dataclasses.replace(plan.ingestion, trigger=trigger)
    outputs = [dataclasses.replace(o, trigger=trigger) if o.trigger == own else o for o in plan.outputs]
    log.info("stream %s: a micro-batch every %.3gs, as sizing by lag set it (the spec says %s)", plan.stream,
             seconds, own.processing_time)
    return dataclasses.replace(plan, trigger=trigger, ingestion=ingestion, outputs=outputs)


def applied(plan: StreamPlan, layout: Layout) -> StreamPlan:
    """The plan with its source's limit at :func:`current` and its trigger at :func:`current_trigger`
    (the plan itself when both are the spec's own)."""
    interval = plan.trigger.processing_time
    if interval is not None and (seconds := current_trigger(plan, layout)) != duration_seconds(interval):
        plan = _with_interval(plan, seconds)
    limit = current(plan, layout)
    source = plan.source
    if source is None or limit == own_limit(plan):
        return plan
    if source.is_files:
        source = dataclasses.replace(source, max_files_per_trigger=limit)
    else:
        assert source.kafka is not None
        source = dataclasses.replace(source, kafka=dataclasses.replace(source.kafka, max_offsets_per_trigger=limit))
    log.info("stream %s: its ingestion takes up to %s %s a micro-batch, as sizing by lag set it (the spec says %s)",
             plan.stream, limit, unit(plan), own_limit(plan))
    return dataclasses.replace(plan, source=source)
