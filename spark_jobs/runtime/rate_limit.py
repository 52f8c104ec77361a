"""What a micro-batch of the ingestion may take, as sizing by lag set it.

A stream with ``execution.sizing`` (not ``dry_run``) has its per-trigger limit set by its
supervisor (``streamops.sizing``): landing files (``maxFilesPerTrigger``) or Kafka records
(``maxOffsetsPerTrigger``). The supervisor writes the limit to ``<checkpoint>/_control/per_trigger.json``
(:func:`write`) and hands the stream to a standby started after it (a rescale); every driver
reads it when it plans its flows (:func:`applied`), so a driver started later for any reason
(a restart, a takeover, the next scheduled run) runs at the size last set, until the spec's own
limit or the sizing's bounds change it. Spark allows a rate limit to change under a checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from spark_jobs.runtime.atomic import write_atomically

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


def write(layout: Layout, per_trigger: int, unit: str, by: str) -> None:
    """Record the limit a micro-batch may take from the next driver's start on; ``by``: who set it, and why."""
    write_atomically(layout.per_trigger_file, json.dumps({"per_trigger": per_trigger, "unit": unit, "by": by,
                                                          "at": time.time()}))


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


def applied(plan: StreamPlan, layout: Layout) -> StreamPlan:
    """The plan with its source's limit at :func:`current` (the plan itself when that is the spec's own)."""
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
