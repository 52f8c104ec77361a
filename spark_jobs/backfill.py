"""Backfill: reprocess a stream's input for an event-time range, in batch, idempotently.

``spark-submit spark_jobs/backfill.py --spec include/streams/<name>.yaml --start ISO --end ISO``

The stream's accepted rows (the table its ingestion committed, read through its commit
log) with an event time in ``[start, end)`` are taken, and every output's query is
computed over them: the same rows every live output read, parsed, deduplicated and
judged late once, by the ingestion. Each
output is written to ``<data root>/backfill/<stream>/<output>/range=<start>_<end>/``:
first into a temporary folder, then swapped in by a rename, so a rerun of the same range
replaces its output whole and gives identical results. The live checkpoint and sinks are
never touched. The output the ingestion serves is written too: its range of the accepted
rows, copied to its backfill folder like any other output's result.

Exit codes: 0 written, 2 bad parameters or spec (the message says which), 1 failure.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.plan import has_ingestion
from spark_jobs.runtime.checkpoint import sink_last_batch
from spark_jobs.runtime.clock import compact, parse_iso
from spark_jobs.spec.layout import Layout
from spark_jobs.spec.loading import load_spec
from spark_jobs.spec.models import (
    SpecError,
    StreamSpec,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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


def range_label(lo: datetime, hi: datetime) -> str:
    return f"range={compact(lo)}_{compact(hi)}"


def output_dir(spec: StreamSpec, layout: Layout, output: str, lo: datetime, hi: datetime) -> Path:
    return layout.backfill_dir(output) / range_label(lo, hi)


def run(spark: SparkSession, spec: StreamSpec, layout: Layout, start: str, end: str) -> dict[str, int]:
    """Write every output for the range; rows written per output."""
    from pyspark.sql import functions as F

    from spark_jobs import analysis, frames

    if not has_ingestion(spec) or spec.event_time is None:
        raise BackfillError(f"stream {spec.name} cannot be backfilled: it needs accepted rows and event_time")
    lo, hi = parse_range(start, end)
    plan = analysis.resolve_plan(spark, spec, layout)
    assert plan.ingestion is not None
    if sink_last_batch(plan.accepted) is None:
        raise BackfillError(f"stream {spec.name} has no accepted rows yet ({plan.accepted} holds no committed batch)")
    ts = F.col(spec.event_time.column)
    accepted = frames.accepted_batch(spark, plan.ingestion)
    in_range = accepted.where((ts >= F.lit(lo.replace(tzinfo=None))) & (ts < F.lit(hi.replace(tzinfo=None)))).cache()
    if in_range.limit(1).count() == 0:
        raise BackfillError(f"stream {spec.name} has no accepted rows with {spec.event_time.column} in "
                            f"[{lo.isoformat()}, {hi.isoformat()})")
    written: dict[str, int] = {}
    for output in spec.outputs:
        frame = frames.output_frame(in_range, plan, plan.output(output.name))
        target = output_dir(spec, layout, output.name, lo, hi)
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        writer = frame.write.mode("overwrite")
        partitions = getattr(output.sink, "partition_by", [])
        if partitions:
            writer = writer.partitionBy(*partitions)
        writer.parquet(str(staging))
        written[output.name] = spark.read.parquet(str(staging)).count()
        old = target.with_name(f".{target.name}.{uuid.uuid4().hex}.old")
        if target.exists():
            target.rename(old)
        staging.rename(target)
        shutil.rmtree(old, ignore_errors=True)
        log.info("backfill %s.%s %s: %d rows -> %s", spec.name, output.name, range_label(lo, hi),
                 written[output.name], target)
    in_range.unpersist()
    return written


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
        written = run(spark, spec, Layout(spec, args.data_root, Path(args.spec).resolve().parent), args.start, args.end)
    except BackfillError as exc:
        log.error("%s", exc)
        return 2
    finally:
        spark.stop()
    log.info("backfill of %s done: %s", spec.name, written)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main())
