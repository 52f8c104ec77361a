"""Backfill: reprocess a stream's input for an event-time range, in batch, idempotently.

``spark-submit spark_jobs/backfill.py --spec include/streams/<name>.yaml --start ISO --end ISO``

The stream's accepted rows (the table its ingestion committed, read through its commit
log) with an event time in ``[start, end)`` are taken, and every output's query is
computed over them: the same rows every live output read, parsed, deduplicated and
judged late once, by the ingestion. Where each result goes:

* an append-mode output to a **Delta table** is rewritten in place: its rows of the range
  (the windows wholly inside it, or the rows whose event time is in it) are replaced in
  one commit (Delta's ``replaceWhere``) by the ones computed, so a rerun leaves the same
  table. Only a range the stream has finalized there can be rewritten (it ends by the
  watermark up to which the output's windows or periods are complete): the stream never
  writes rows of it again. The version written is recorded beside the other backfills
  (``<label>.json``), and the validation reads the range as of that version;
* every other output (Parquet, tables, a Delta table's update or complete result) goes to
  ``<data root>/backfill/<stream>/<output>/range=<start>_<end>/``: first into a temporary
  folder, then swapped in by a rename, so a rerun of the same range replaces its output
  whole and gives identical results. The live checkpoint and sinks are never touched.
  The output the ingestion serves is written too: its range of the accepted rows.

Every range is checked before anything is written. Exit codes: 0 written, 2 bad
parameters or spec (the message says which), 1 failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.plan import DeltaDataset, OutputPlan, StreamPlan
from spark_jobs.quality import closing
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.checkpoint import accepted_last_batch, sink_files
from spark_jobs.runtime.clock import compact, from_ms, iso, parse_iso, to_ms
from spark_jobs.runtime.driver import log_to_stderr
from spark_jobs.sinks import delta as delta_sink
from spark_jobs.sinks import delta_log
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import (
    EVENT_DATE_COLUMN,
    WINDOW_END,
    WINDOW_START,
    SpecError,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("backfill")



class BackfillError(ValueError):
    """Bad backfill parameters: the message says which and why."""


def parse_range(start: str, end: str) -> tuple[datetime, datetime]:
    try:
        lo, hi = parse_iso(start), parse_iso(end)
    except ValueError as exc:
        raise BackfillError(f"start and end must be ISO-8601 date-times (e.g. 2026-01-01T00:00:00Z): {exc}") from None
    if hi <= lo:
        raise BackfillError(f"end ({hi.isoformat()}) must be after start ({lo.isoformat()})")
    return lo.astimezone(UTC), hi.astimezone(UTC)


def held_range(plan: StreamPlan) -> tuple[datetime, datetime] | None:
    """The event-time range the stream's accepted rows hold, by the event-date partitions of their
    committed files (the accepted rows are partitioned by event date): from the first day's start to
    the end of the last; None before the first commit. Read from the table's log, without Spark."""
    ingestion = plan.ingestion
    if ingestion is None or EVENT_DATE_COLUMN not in ingestion.partition_by:
        return None
    if ingestion.accepted_is_delta:
        dates = delta_log.partition_values(ingestion.accepted_path, EVENT_DATE_COLUMN)
    else:
        found = (re.search(rf"/{EVENT_DATE_COLUMN}=(\d{{4}}-\d{{2}}-\d{{2}})/", p) for p in sink_files(ingestion.accepted_path))
        dates = {m.group(1) for m in found if m}
    if not dates:
        return None
    first, last = (datetime.fromisoformat(d).replace(tzinfo=UTC) for d in (min(dates), max(dates)))
    return first, last + timedelta(days=1)


def check_held(plan: StreamPlan, lo: datetime, hi: datetime, stream: str) -> None:
    """:class:`BackfillError` unless ``[lo, hi)`` lies within what the accepted rows hold, naming it."""
    held = held_range(plan)
    if held is None:
        raise BackfillError(f"stream {stream} has no accepted rows to backfill from yet")
    if lo < held[0] or hi > held[1]:
        raise BackfillError(f"the range [{lo.isoformat()}, {hi.isoformat()}) is not within what stream {stream}'s "
                            f"accepted rows hold: [{held[0].isoformat()}, {held[1].isoformat()})")


def range_label(lo: datetime, hi: datetime) -> str:
    return f"range={compact(lo)}_{compact(hi)}"


def output_dir(layout: Layout, output: str, lo: datetime, hi: datetime) -> Path:
    return layout.backfill_dir(output) / range_label(lo, hi)


def run(spark: SparkSession, plan: StreamPlan, layout: Layout, start: str, end: str) -> dict[str, int]:
    """Write every output for the range; rows written per output. ``plan``: the stream's, its
    transform analyzed (``analysis.resolve_plan``)."""
    from pyspark.sql import functions as F

    from spark_jobs import frames

    event_time = plan.event_time_column
    if plan.ingestion is None or event_time is None:
        raise BackfillError(f"stream {plan.stream} cannot be backfilled: it needs accepted rows and event_time")
    lo, hi = parse_range(start, end)
    if accepted_last_batch(plan.ingestion) is None:
        raise BackfillError(f"stream {plan.stream} has no accepted rows yet ({plan.accepted_path} holds no committed batch)")
    ts = F.col(event_time)
    accepted = frames.accepted_batch(spark, plan.ingestion)
    in_range = accepted.where((ts >= F.lit(lo.replace(tzinfo=None))) & (ts < F.lit(hi.replace(tzinfo=None)))).cache()
    if in_range.limit(1).count() == 0:
        raise BackfillError(f"stream {plan.stream} has no accepted rows with {event_time} in "
                            f"[{lo.isoformat()}, {hi.isoformat()})")
    results = [(output, frames.output_frame(in_range, plan, output)) for output in plan.outputs]
    in_place = {o.name: in_place_range(plan, o, frame.columns, lo, hi) for o, frame in results}  # all checked first
    written: dict[str, int] = {}
    for output, frame in results:
        condition = in_place[output.name]
        if condition is None:
            written[output.name] = _write_folder(spark, output, frame, output_dir(layout, output.name, lo, hi))
        else:
            written[output.name] = _replace_range(spark, plan.stream, layout, output, frame, condition,
                                                  range_label(lo, hi))
    in_range.unpersist()
    return written


def _sql_time(value: datetime) -> str:
    return f"TIMESTAMP '{value.astimezone(UTC).strftime('%Y-%m-%d %H:%M:%S.%f')}'"  # the session's time zone is UTC


def in_place_range(plan: StreamPlan, output: OutputPlan, columns: list[str], lo: datetime, hi: datetime) -> str | None:
    """The condition (SQL) selecting the rows of the range in the output's Delta table, if
    the output is rewritten there: windows wholly inside ``[lo, hi)``, or rows whose event
    time is in it. None for an output written to the backfill folder. Refused (with the
    reason) when the stream could still write rows of the range into the table."""
    if not isinstance(output.sink, DeltaDataset) or output.mode != "append":
        return None
    event_time = plan.event_time_column
    if WINDOW_START in columns and WINDOW_END in columns:
        kind = "window"
        condition = f"`{WINDOW_START}` >= {_sql_time(lo)} AND `{WINDOW_END}` <= {_sql_time(hi)}"
    elif event_time is not None and event_time in columns:
        kind = "period"
        condition = f"`{event_time}` >= {_sql_time(lo)} AND `{event_time}` < {_sql_time(hi)}"
    else:
        raise BackfillError(f"output {output.name}: its Delta table's rows have neither {WINDOW_START} and "
                            f"{WINDOW_END} nor the event-time column, so a range of it cannot be rewritten in place")
    through = closing.final_through(plan, output.name, kind)
    if through is None or to_ms(hi) > through:
        final = iso(from_ms(through)) if through is not None else "nothing yet"
        raise BackfillError(f"output {output.name}: the range ends at {iso(hi)}, after what the stream has "
                            f"finalized in its Delta table ({final}); the stream may still write rows of that "
                            "range there, so it is not rewritten: backfill a range that ends by then")
    return condition


def _write_folder(spark: SparkSession, output: OutputPlan, frame: DataFrame, target: Path) -> int:
    staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    writer = frame.write.mode("overwrite")
    partitions = getattr(output.sink, "partition_by", [])
    if partitions:
        writer = writer.partitionBy(*partitions)
    writer.parquet(str(staging))
    rows = spark.read.parquet(str(staging)).count()
    old = target.with_name(f".{target.name}.{uuid.uuid4().hex}.old")
    if target.exists():
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    log.info("backfill %s %s: %d rows -> %s", output.name, target.name, rows, target)
    return rows


def _replace_range(spark: SparkSession, stream: str, layout: Layout, output: OutputPlan, frame: DataFrame,
                   condition: str, label: str) -> int:
    """One commit of the table: its rows matching ``condition`` replaced by the range's result
    (a commit that loses to the stream's or a compaction's is tried again)."""
    from delta.tables import DeltaTable

    assert isinstance(output.sink, DeltaDataset)
    path = output.sink.path
    if not DeltaTable.isDeltaTable(spark, path):
        raise BackfillError(f"output {output.name}: there is no Delta table at {path} yet to rewrite a range of")
    rows = frame.where(condition).cache()
    count = rows.count()
    metadata = json.dumps({"stream": stream, "output": output.name, "backfill": label, "condition": condition,
                           "run": uuid.uuid4().hex}, sort_keys=True)  # this run's commit, found by it below

    def commit() -> None:
        (rows.write.format("delta").mode("overwrite").option("replaceWhere", condition)
         .option("userMetadata", metadata).save(path))

    try:
        delta_sink.retry_conflicts(f"backfill {output.name} {label}", commit)
    finally:
        rows.unpersist()
    version = delta_sink.version_of_commit(spark, path, metadata)
    if version is None:
        raise RuntimeError(f"output {output.name}: the backfill's commit is not in the history of {path}")
    record = {"table": path, "version": version, "condition": condition, "rows": count, "written": iso(time.time())}
    write_atomically(layout.backfill_dir(output.name) / f"{label}.json", json.dumps(record, indent=2))
    log.info("backfill %s %s: %d rows replaced %s in %s (version %d)", output.name, label, count, condition, path,
             version)
    return count


def delta_record(layout: Layout, output: str, label: str) -> dict[str, Any] | None:
    """What the backfill of range ``label`` wrote into an output's Delta table (see
    :func:`_replace_range`), or None if it wrote none."""
    try:
        return json.loads((layout.backfill_dir(output) / f"{label}.json").read_text())
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True)
    p.add_argument("--start", required=True, help="event-time range start (inclusive), ISO-8601")
    p.add_argument("--end", required=True, help="event-time range end (exclusive), ISO-8601")
    p.add_argument("--data-root", default=None)
    args = p.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        parse_range(args.start, args.end)
    except (SpecError, BackfillError) as exc:
        log.error("%s", exc)
        return 2
    from spark_jobs.runtime.session import build_session

    spark = build_session(f"backfill:{spec.name}", spec)
    try:
        from spark_jobs.analysis import resolve_plan

        layout = Layout(spec, args.data_root, Path(args.spec).resolve().parent)
        written = run(spark, resolve_plan(spark, spec, layout), layout, args.start, args.end)
    except BackfillError as exc:
        log.error("%s", exc)
        return 2
    finally:
        spark.stop()
    log.info("backfill of %s done: %s", spec.name, written)
    return 0


if __name__ == "__main__":
    log_to_stderr()
    sys.exit(main())
