"""When the units of a sink close, from its checkpoint alone (no Spark).

What validation finds closed (:mod:`spark_jobs.quality.validation`) and what a sink's Airflow
asset events announce (``streamops.triggers.sink_units``) are the same thing, decided here:

* a window (``window``) is final in its sink once the output's batch whose watermark passed
  the window's end is committed; so is an event-time period of the output the ingestion
  writes itself (its sink is the accepted-rows table);
* a period of any other pass-through output (``period``) once the stream's watermark passed
  it and the output took every row the ingestion accepted before
  (:func:`~spark_jobs.runtime.checkpoint.watermark_seen_by`);
* a table (``snapshot``) is validated whole, at each newly committed batch.

:func:`validation_delays` measures how soon validation followed: from a unit's closing (the
commit of the batch that closed it) to its validation (its run writing its results into the
ledger; :func:`validated_units`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.plan import StreamPlan
from spark_jobs.quality.rules import Target
from spark_jobs.runtime.checkpoint import (
    batch_ids,
    batch_watermark_ms,
    last_batch,
    watermark_seen_by,
)
from spark_jobs.runtime.clock import epoch_ms, iso
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
    Aggregation,
    duration_seconds,
)

#: units listed in one announcement at most (a long outage closes many: the rest are counted)
MAX_LISTED = 100


@dataclass(frozen=True)
class Closed:
    """How far an output's sink is closed now."""

    output: str
    kind: str
    #: every unit ending at or before this watermark is closed (window, period); None: none yet
    through_ms: int | None
    #: the newest batch the output committed (a table's unit); None: none yet
    batch: int | None


def checkpoint_of(plan: StreamPlan, output: str) -> str:
    """The checkpoint of the query that writes the output: the ingestion's for the output it
    writes itself (that output has no query of its own)."""
    return plan.checkpoint(INGEST_FLOW if plan.output(output).written_by_ingestion else output)


def closed(plan: StreamPlan, target: Target) -> Closed:
    output = target.output
    checkpoint = checkpoint_of(plan, output.name)
    batch = last_batch(checkpoint, "commits")
    through = _through(plan, output.name, target.kind, checkpoint, batch) if target.kind != "snapshot" else None
    return Closed(output.name, target.kind, through, batch)


def final_through(plan: StreamPlan, output: str, kind: str) -> int | None:
    """The watermark (ms) up to which the output's sink is final: every window (``window``) or
    event-time period (``period``) ending by then is in it whole, and the stream writes no
    more rows of it. None if the output has committed nothing yet."""
    checkpoint = checkpoint_of(plan, output)
    return _through(plan, output, kind, checkpoint, last_batch(checkpoint, "commits"))


def _through(plan: StreamPlan, output: str, kind: str, checkpoint: str, batch: int | None) -> int | None:
    if batch is None:
        return None
    if kind == "window" or plan.output(output).written_by_ingestion:
        through = batch_watermark_ms(checkpoint, batch)
    else:
        assert plan.ingestion is not None
        through = watermark_seen_by(plan.checkpoint(INGEST_FLOW), plan.ingestion.accepted_path, checkpoint,
                                    delta=plan.ingestion.accepted_is_delta)
    return through or None


def unit_ends(target: Target, after_ms: int | None, through_ms: int) -> list[int] | None:
    """The ends (ms) of the units that closed in (after, through]: windows of a windowed
    aggregate, periods of a pass-through output. None where the spec does not say the unit's
    size (a SQL or Python output's windows): then only the watermark is known."""
    if target.kind == "period" and target.unit_seconds:
        step = int(target.unit_seconds * 1000)
        offset = 0
    elif target.kind == "window" and isinstance(target.output.query, Aggregation) and target.output.query.window:
        window = target.output.query.window
        step = int(duration_seconds(window.slide or window.duration) * 1000)
        offset = int(duration_seconds(window.duration) * 1000) % step
    else:
        return None
    if after_ms is None:  # nothing announced or validated before: the last unit closed (earlier ones unknown)
        after_ms = through_ms - step
    first = (after_ms - offset) // step + 1
    return [k * step + offset for k in range(first, (through_ms - offset) // step + 1)]


def announcement(target: Target, now: Closed, before: Closed | None) -> dict | None:
    """What an asset event of the output's sink says when units closed since ``before`` (None:
    since nothing was announced or validated), or None when nothing closed."""
    if now.kind == "snapshot":
        if now.batch is None or (before is not None and before.batch is not None and now.batch <= before.batch):
            return None
        return {"output": now.output, "kind": now.kind, "units": [f"batch {now.batch}"], "batch": now.batch}
    after = before.through_ms if before is not None else None
    if now.through_ms is None or (after is not None and now.through_ms <= after):
        return None
    ends = unit_ends(target, after, now.through_ms)
    if ends is not None and not ends:
        return None  # the watermark moved on inside a unit: nothing closed
    event = {"output": now.output, "kind": now.kind, "closed_through": iso(now.through_ms / 1000), "batch": now.batch,
             "since": None if after is None else iso(after / 1000)}
    if ends is not None:
        event["units"] = [iso(e / 1000) for e in ends[-MAX_LISTED:]]
        event["more_units"] = max(0, len(ends) - MAX_LISTED)
    return event


def closed_at(plan: StreamPlan, output: str, unit: dict) -> float | None:
    """When a validated unit (a ledger record) closed: the commit of the output's first batch
    whose watermark passed its end (a window or period), or of the batch it names (a table's
    ``batch N``). None when the checkpoint no longer keeps that batch (Spark keeps the last 100)."""
    checkpoint = Path(checkpoint_of(plan, output))
    end = epoch_ms(unit.get("end"))
    name = str(unit.get("unit", ""))
    for batch in batch_ids(checkpoint, "commits"):
        if end is None:
            if name != f"batch {batch}":
                continue
        else:
            watermark = batch_watermark_ms(checkpoint, batch)
            if watermark is None or watermark < end:
                continue
        try:
            return (checkpoint / "commits" / str(batch)).stat().st_mtime
        except OSError:
            return None
    return None


def validated_units(plan: StreamPlan, ledger: dict, since: float = 0.0) -> Iterator[tuple[str, dict, float, float]]:
    """The units of the plan's outputs validated since ``since`` whose closing is known: each
    one's output, ledger record, when it was validated and when it closed (epoch seconds). A unit
    is validated when its run wrote its results (the run's ``at`` in the ledger; a unit's own
    ``validated_at`` is when its rows were read, kept for a run the ledger no longer lists)."""
    finished = {r.get("run_id"): epoch_ms(r.get("at")) for r in ledger.get("runs") or []}
    for name, entry in (ledger.get("outputs") or {}).items():
        try:
            plan.output(name)
        except KeyError:
            continue
        for unit in (entry.get("units") or {}).values():
            validated = finished.get(unit.get("run")) or epoch_ms(unit.get("validated_at"))
            if validated is None or validated / 1000 < since:
                continue
            closed_time = closed_at(plan, name, unit)
            if closed_time is not None:
                yield name, unit, validated / 1000, closed_time


def validation_delays(plan: StreamPlan, ledger: dict, since: float = 0.0) -> list[float]:
    """Seconds from each unit's closing to its validation, for the units validated since ``since``
    (:func:`validated_units`): how fresh validation follows new output."""
    return [max(0.0, validated - closed) for _, _, validated, closed in validated_units(plan, ledger, since)]
