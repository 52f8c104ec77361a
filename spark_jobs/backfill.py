"""Backfill: reprocess a stream's input for an event-time range, in batch, idempotently.

``spark-submit spark_jobs/backfill.py --spec include/streams/<name>.yaml --start ISO --end ISO``

The input files (landing directory and, with ``source.archive_path``, the archive) are
read in batch, parsed and split exactly as the live stream does, rows with an event time
in ``[start, end)`` are kept, and every output's query is computed over them. Each
output is written to ``<data root>/backfill/<stream>/<output>/range=<start>_<end>/``:
first into a temporary folder, then swapped in by a rename, so a rerun of the same range
replaces its output whole and gives identical results. The live checkpoint and sinks are
never touched.

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

from spark_jobs.spec import FileSource, Layout, SpecError, StreamSpec, load_spec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("backfill")

#: Backfill output goes to ``<data root>/backfill/<stream>/<output>/range=<start>_<end>/``.
BACKFILL_DIR = "backfill"


class BackfillError(ValueError):
    """Bad backfill parameters: the message says which and why."""


def parse_range(start: str, end: str) -> tuple[datetime, datetime]:
    try:
        lo = datetime.fromisoformat(start.replace("Z", "+00:00"))
        hi = datetime.fromisoformat(end.replace("Z", "+00:00"))
    except ValueError as exc:
        raise BackfillError(f"start and end must be ISO-8601 date-times (e.g. 2026-01-01T00:00:00Z): {exc}") from None
    lo = lo if lo.tzinfo else lo.replace(tzinfo=UTC)
    hi = hi if hi.tzinfo else hi.replace(tzinfo=UTC)
    if hi <= lo:
        raise BackfillError(f"end ({hi.isoformat()}) must be after start ({lo.isoformat()})")
    return lo.astimezone(UTC), hi.astimezone(UTC)


def range_label(lo: datetime, hi: datetime) -> str:
    return f"range={lo.strftime('%Y%m%dT%H%M%SZ')}_{hi.strftime('%Y%m%dT%H%M%SZ')}"


def output_dir(spec: StreamSpec, layout: Layout, output: str, lo: datetime, hi: datetime) -> Path:
    return Path(layout.data(f"{BACKFILL_DIR}/{spec.name}/{output}")) / range_label(lo, hi)


def input_paths(spec: StreamSpec, layout: Layout) -> list[str]:
    assert isinstance(spec.source, FileSource)
    paths = [layout.landing]
    if spec.source.archive_path:
        paths.append(layout.data(spec.source.archive_path))
    return [p for p in paths if Path(p).exists() and any(Path(p).rglob("*.*"))]


def read_batch(spark: SparkSession, spec: StreamSpec, layout: Layout) -> DataFrame:
    """The source files read in batch, parsed like the live stream."""
    from pyspark.sql import functions as F

    from spark_jobs.pipeline import ddl
    from spark_jobs.spec import CORRUPT_RECORD_COLUMN, SOURCE_FILE_COLUMN

    src = spec.source
    assert isinstance(src, FileSource)
    paths = input_paths(spec, layout)
    if not paths:
        raise BackfillError(f"stream {spec.name} has no input files in {layout.landing} (or its archive)")
    reader = (spark.read.format(src.format).schema(ddl(src.columns, corrupt=True)).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT_RECORD_COLUMN).option("recursiveFileLookup", True)
              .option("pathGlobFilter", "[!._]*"))
    if src.format == "csv":
        reader = reader.option("header", True)
    return reader.load(paths).withColumn(SOURCE_FILE_COLUMN, F.col("_metadata.file_path"))


def run(spark: SparkSession, spec: StreamSpec, layout: Layout, start: str, end: str) -> dict[str, int]:
    """Write every output for the range; rows written per output."""
    from pyspark.sql import functions as F

    from spark_jobs import pipeline

    if not isinstance(spec.source, FileSource) or spec.event_time is None:
        raise BackfillError(f"stream {spec.name} cannot be backfilled: it needs a file source and event_time")
    lo, hi = parse_range(start, end)
    ts = F.col(spec.event_time.column)
    valid = pipeline.prepared(spark, spec, layout, read_batch(spark, spec, layout))
    in_range = valid.where((ts >= F.lit(lo.replace(tzinfo=None))) & (ts < F.lit(hi.replace(tzinfo=None)))).cache()
    if in_range.limit(1).count() == 0:
        raise BackfillError(f"stream {spec.name} has no valid input with {spec.event_time.column} in "
                            f"[{lo.isoformat()}, {hi.isoformat()})")
    written: dict[str, int] = {}
    for output in spec.outputs:
        frame = pipeline.output_frame(in_range, spec, output)
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
    from pyspark.sql import SparkSession

    from spark_jobs.pipeline import SESSION_CONF

    spark = SparkSession.builder.appName(f"backfill:{spec.name}").config(map=SESSION_CONF).getOrCreate()
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
