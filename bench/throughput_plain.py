"""Plain PySpark jobs that ``bench/throughput.py`` compares the platform with.

    spark-submit --master 'local[2]' bench/throughput_plain.py --job job.json

Only pyspark and the standard library: nothing of the platform is imported. The job file
(written by the benchmark from a stream spec) holds the session settings, the source
(format, schema with the corrupt-record column, reader options, landing directory,
``maxFilesPerTrigger``; or a Kafka topic's options and the values' format, parsed with
``from_json``/``from_csv`` the same way), the stream's rules and outputs, and which variant
to run:

``parse`` (variant a)
    One streaming query: the landing files parsed (PERMISSIVE, corrupt-record column, the
    spec's schema and options) and written as they are into one Parquet file sink. No
    quarantine, watermark, deduplication, join or aggregation.

``per-output`` (variant b)
    The stream's outputs written the obvious way: one streaming query per output, each
    reading and parsing the landing files itself::

        parse -> valid rows (no corrupt record, every required column present; every
                   column referenced, so that the reader converts them all: see
                   every_column_read)
          -> watermark on the event time -> dropDuplicatesWithinWatermark(dedup key)
          -> broadcast left (or inner) joins with the reference files -> event_date
          -> pass-through columns, or groupBy(window(ts, duration, slide), keys).agg(...)
          -> Parquet file sink (partitionBy as the spec says), or a SQLite table through
             foreachBatch (upsert by the result key in update mode; the table's rows
             replaced in complete mode)

    plus one query writing the rejected rows (corrupt record or a required column
    missing: raw record, reason, source file, time) to the quarantine (Parquet).

``batch`` (variant d)
    The same work as ONE plain Spark batch job over the same landing files: parse once
    (same reader, no ``maxFilesPerTrigger``), write the rejected rows to the quarantine,
    keep the valid rows deduplicated on the key (all of them: a batch has no watermark,
    so it also keeps the rows a stream drops as late), the broadcast joins and
    ``event_date``, then every output computed from them into the same sinks (a window's
    every pane; an update-mode table holds its final rows, as a complete-mode one). The
    parsed input and the accepted rows are persisted, each computed once, as a batch job
    written with care would. Its one "batch" in ``result`` spans from before the first
    read to after the last write.

``staged`` (variant f)
    The same work written as the platform runs it, in plain Spark: the per-batch work of
    (c), hand-written with care, the yardstick of what a micro-batch costs. Two stages:

        ingest: parse once -> valid or not -> watermark on the event time of valid rows
          -> dropDuplicatesWithinWatermark(dedup key; a rejected row a key of its own)
          -> foreachBatch (the batch persisted, as Spark's guide does for several writes):
               rejected rows -> quarantine (Parquet, one file)
               valid rows -> broadcast joins (made once) -> event_date
                 -> the accepted rows (Parquet, partitioned by event_date, one file a date)
        then one query per output reading the accepted rows' folder as a file stream
        (a pass-through output of exactly the accepted rows is that folder: no query)

    With the available-now trigger the outputs start when the ingestion has finished, as
    the platform's do. No counts of each kind, no progress events, no lease, no
    exactly-once log of the ingestion's writes: less than the platform does.

Every streaming query runs with the available-now trigger (or ``processing_time`` if the job file
gives one: then until the process is ended); they all start at once and the job ends
when all have finished. At the end the job writes ``result`` (JSON) with every batch of
every query (``query.recentProgress``: start, trigger execution time, input rows), so that
the benchmark measures from the first batch's start to the last batch's end as it does
for the platform's progress events.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

CORRUPT = "_corrupt_record"
POSITION = "_position"
SQLITE_TYPES = {T.StringType: "TEXT", T.LongType: "INTEGER", T.IntegerType: "INTEGER", T.DoubleType: "REAL",
                T.BooleanType: "BOOLEAN", T.TimestampType: "TIMESTAMP", T.DateType: "DATE"}


def session(job: dict[str, Any]) -> SparkSession:
    builder = SparkSession.builder.appName(job["app"])
    for key, value in job["conf"].items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def parsed(spark: SparkSession, source: dict[str, Any]) -> DataFrame:
    """The source's records parsed, with ``POSITION``: a file's path, or a Kafka record's topic/partition@offset."""
    if source["format"] == "kafka":
        raw = spark.readStream.format("kafka").options(**source["options"]).load()
        options = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
        value = F.col("value").cast("string")
        parse = (F.from_json(value, source["schema"], options) if source["value_format"] == "json"
                 else F.from_csv(value, source["schema"], options))
        position = F.format_string("%s/%d@%d", F.col("topic"), F.col("partition"), F.col("offset"))
        return raw.select(parse.alias("record"), position.alias(POSITION)).select("record.*", POSITION)
    reader = (spark.readStream.format(source["format"]).schema(source["schema"]).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT).option("maxFilesPerTrigger", source["max_files_per_trigger"]))
    return _files(reader, source)


def parsed_batch(spark: SparkSession, source: dict[str, Any]) -> DataFrame:
    """The landing files parsed as one batch, by the same reader."""
    reader = (spark.read.format(source["format"]).schema(source["schema"]).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT))
    return _files(reader, source)


def _files(reader, source: dict[str, Any]) -> DataFrame:  # a stream or batch reader
    if source["format"] == "csv":
        reader = reader.option("header", True)
    for key, value in source["options"].items():
        reader = reader.option(key, value)
    return reader.load(source["landing"]).withColumn(POSITION, F.col("_metadata.file_path"))


def valid_condition(job: dict[str, Any]):  # a Column
    cond = F.col(CORRUPT).isNull()
    for name in job["required"]:
        cond = cond & F.col(name).isNotNull()
    return cond


def every_column_read(job: dict[str, Any]):  # a Column, always true
    """A condition on every declared column that is always true (a count of nulls is never
    negative) but that Spark cannot prove so: the reader must convert every column.

    Spark's CSV and JSON readers convert only the columns a query reads, and set the
    corrupt-record column only for those. Without this, an output that does not read a
    column would accept a record whose value in that column is malformed, which the
    quarantine query (reading every column) quarantines as well.
    """
    nulls = sum((F.col(name).isNull().cast("int") for name in job["columns"]), F.lit(0))
    return nulls >= 0


def accepted(spark: SparkSession, job: dict[str, Any], source: DataFrame | None = None) -> DataFrame:
    """Valid rows, watermarked, deduplicated, enriched, with event_date (of ``source``, a batch:
    deduplicated without a watermark; else the landing files as a stream)."""
    source = parsed(spark, job["source"]) if source is None else source
    df = source.where(valid_condition(job) & every_column_read(job)).drop(CORRUPT, POSITION)
    event_time = job["event_time"]
    if event_time and df.isStreaming:
        df = df.withWatermark(event_time["column"], event_time["watermark"])
    if job["deduplicate"]:
        df = df.dropDuplicatesWithinWatermark(job["deduplicate"]) if df.isStreaming else df.dropDuplicates(
            job["deduplicate"])
    for static, key, how in lookups(spark, job):
        df = df.join(static, on=key, how=how)
    if event_time:
        df = df.withColumn("event_date", F.to_date(F.col(event_time["column"])))
    return df


def lookups(spark: SparkSession, job: dict[str, Any]) -> list[tuple[DataFrame, list[str], str]]:
    """The static joins, in order: (reference rows broadcast, key, how); a column an earlier
    one (or the source) has is not taken again."""
    made, have = [], list(job["columns"])
    for ref in job["joins"]:
        reader = spark.read.format(ref["format"])
        if ref["format"] == "csv":
            reader = reader.option("header", True)
        static = reader.load(ref["path"]).select(*[F.col(n).cast(t).alias(n) for n, t in ref["columns"]])
        extra = [n for n, _ in ref["columns"] if n not in ref["key"] and n not in have]
        have += extra
        made.append((F.broadcast(static.select(*ref["key"], *extra)), ref["key"], ref["how"]))
    return made


def aggregate(fn: str, column: str | None, event_time: str | None):  # a Column
    if fn == "count":
        return F.count(F.lit(1)) if column is None else F.count(F.col(column))
    if fn == "latest":
        return F.max_by(F.col(column), F.col(event_time))
    return getattr(F, fn)(F.col(column))


def output_frame(df: DataFrame, job: dict[str, Any], out: dict[str, Any]) -> DataFrame:
    if out["query"] == "passthrough":
        return df.select(*out["columns"])
    event_time = (job["event_time"] or {}).get("column")
    keys = [F.col(k) for k in out["group_by"]]
    window = out["window"]
    if window:
        keys.insert(0, F.window(F.col(event_time), window["duration"], window["slide"]).alias("window"))
    result = df.groupBy(*keys).agg(*[aggregate(a["fn"], a["column"], event_time).alias(a["name"])
                                      for a in out["aggregates"]])
    if window:
        result = result.select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                               *out["group_by"], *[a["name"] for a in out["aggregates"]])
    return result


def _sql_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, bool):
        return int(value)
    return value


def table_batches(frame: DataFrame, sink: dict[str, Any], mode: str):  # a foreachBatch function
    """Create the table (primary key: the result key), then per batch: upsert (update mode) or
    replace every row (complete mode), in one transaction."""
    fields = frame.schema.fields
    names = [f.name for f in fields]
    table = sink["table"]
    columns = ", ".join(f'"{f.name}" {SQLITE_TYPES[type(f.dataType)]}' for f in fields)
    key = ", ".join(f'"{k}"' for k in sink["key"])
    conn = sqlite3.connect(sink["db"], timeout=60)
    try:
        with conn:
            conn.execute(f'CREATE TABLE IF NOT EXISTS "{table}" ({columns}, PRIMARY KEY ({key}))')
    finally:
        conn.close()
    insert = f'INSERT INTO "{table}" VALUES ({", ".join("?" for _ in names)})'
    updates = ", ".join(f'"{n}" = excluded."{n}"' for n in names if n not in sink["key"])
    upsert = f"{insert} ON CONFLICT ({key}) DO UPDATE SET {updates}" if updates else f"{insert} ON CONFLICT DO NOTHING"

    def write(batch: DataFrame, batch_id: int) -> None:
        rows = [tuple(_sql_value(v) for v in row) for row in batch.collect()]
        conn = sqlite3.connect(sink["db"], timeout=60)
        try:
            with conn:
                if mode == "complete":
                    conn.execute(f'DELETE FROM "{table}"')
                    conn.executemany(insert, rows)
                else:
                    conn.executemany(upsert, rows)
        finally:
            conn.close()

    return write


def start(frame: DataFrame, name: str, checkpoint: str, mode: str, sink: dict[str, Any],
          processing_time: str | None = None):
    writer = frame.writeStream.queryName(name).outputMode(mode).option("checkpointLocation", checkpoint)
    writer = writer.trigger(processingTime=processing_time) if processing_time else writer.trigger(availableNow=True)
    if sink["type"] == "parquet":
        writer = writer.format("parquet").option("path", sink["path"])
        if sink.get("partition_by"):
            writer = writer.partitionBy(*sink["partition_by"])
    else:
        writer = writer.foreachBatch(table_batches(frame, sink, mode))
    return writer.start()


def rejected_rows(job: dict[str, Any], source: DataFrame) -> DataFrame:
    columns = [F.col(c) for c in job["columns"]]
    return source.where(~valid_condition(job)).select(
        F.coalesce(F.col(CORRUPT), F.to_json(F.struct(*columns))).alias("raw"),
        F.when(F.col(CORRUPT).isNotNull(), F.lit("malformed record")).otherwise(F.lit("missing required field"))
        .alias("reason"),
        F.col(POSITION).alias("source_file"),
        F.current_timestamp().alias("quarantined_at"))


def write_batch(frame: DataFrame, sink: dict[str, Any], mode: str) -> None:
    """One output of the batch job into its sink: Parquet files, or the table's rows replaced."""
    if sink["type"] == "parquet":
        writer = frame.write.mode("append")
        if sink.get("partition_by"):
            writer = writer.partitionBy(*sink["partition_by"])
        writer.parquet(sink["path"])
    else:
        table_batches(frame, sink, "complete")(frame, 0)


def batch(spark: SparkSession, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Variant d: the stream's work as one batch job; its one "batch" (start, duration, rows read)."""
    from pyspark import StorageLevel

    started = datetime.now(UTC)
    source = parsed_batch(spark, job["source"]).persist(StorageLevel.MEMORY_AND_DISK)
    rows = source.count()
    write_batch(rejected_rows(job, source).coalesce(1), {"type": "parquet", "path": job["quarantine"]}, "append")
    kept = accepted(spark, job, source).persist(StorageLevel.MEMORY_AND_DISK)
    for out in job["outputs"]:
        write_batch(output_frame(kept, job, out), out["sink"], out["mode"])
    ended = datetime.now(UTC)
    kept.unpersist()
    source.unpersist()
    return [{"query": "batch", "batch_id": 0, "timestamp": started.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
             "trigger_ms": (ended - started).total_seconds() * 1000, "input_rows": rows}]


VALID, EVENT_TIME, ROW_KEY = "_valid", "_event_time", "_row_key"


def ingested(spark: SparkSession, job: dict[str, Any]) -> DataFrame:
    """Variant f's first stage before its batches: the landing files parsed once, every row
    marked valid or not, watermarked on the event time of the valid rows and deduplicated (a
    rejected row has a key of its own: it is never a duplicate)."""
    df = parsed(spark, job["source"]).withColumn(VALID, valid_condition(job) & every_column_read(job))
    event_time = job["event_time"]
    if event_time:
        df = df.withColumn(EVENT_TIME, F.when(F.col(VALID), F.col(event_time["column"])))
        df = df.withWatermark(EVENT_TIME, event_time["watermark"])
    if job["deduplicate"]:
        df = df.withColumn(ROW_KEY, F.when(~F.col(VALID), F.expr("uuid()")))
        df = df.dropDuplicatesWithinWatermark([*job["deduplicate"], ROW_KEY])
    return df


def enriched(spark: SparkSession, job: dict[str, Any]):  # a function of a DataFrame
    """The valid rows of a frame joined with the reference data (read once, broadcast), with
    ``event_date``, in the accepted rows' columns."""
    joins = lookups(spark, job)

    def enrich(df: DataFrame) -> DataFrame:
        df = df.where(F.col(VALID))
        for static, key, how in joins:
            df = df.join(static, on=key, how=how)
        if job["event_time"]:
            df = df.withColumn("event_date", F.to_date(F.col(job["event_time"]["column"])))
        return df.select(*job["accepted_columns"])

    return enrich


def staged(spark: SparkSession, job: dict[str, Any], trigger: str | None) -> tuple[list, Callable[[], list]]:
    """Variant f: the ingestion's query, and a function that starts the outputs' queries."""
    checkpoints, accepted_path = Path(job["checkpoints"]), job["accepted"]
    stream = ingested(spark, job)
    enrich = enriched(spark, job)
    partitioned = "event_date" in job["accepted_columns"]

    def ingest(batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            if job["quarantine"]:
                rejected_rows(job, batch).coalesce(1).write.mode("append").parquet(job["quarantine"])
            kept = enrich(batch)
            kept = kept.repartition("event_date") if partitioned else kept.repartition(1)
            writer = kept.write.mode("append")
            (writer.partitionBy("event_date") if partitioned else writer).parquet(accepted_path)
        finally:
            batch.unpersist()

    writer = stream.writeStream.queryName("ingest").option("checkpointLocation", str(checkpoints / "ingest"))
    writer = writer.trigger(processingTime=trigger) if trigger else writer.trigger(availableNow=True)
    first = writer.foreachBatch(ingest).start()
    schema = enrich(stream).schema

    def outputs() -> list:
        Path(accepted_path).mkdir(parents=True, exist_ok=True)
        rows = spark.readStream.schema(schema).parquet(accepted_path)
        if job["event_time"]:
            rows = rows.withWatermark(job["event_time"]["column"], job["event_time"]["watermark"])
        return [start(output_frame(rows, job, out), out["name"], str(checkpoints / out["name"]), out["mode"],
                      out["sink"], trigger)
                for out in job["outputs"] if out["sink"].get("path") != accepted_path]

    return [first], outputs


def plan(spark: SparkSession, job: dict[str, Any]) -> list:
    """Start the variant's queries."""
    checkpoints = Path(job["checkpoints"])
    if job["variant"] == "parse":
        return [start(parsed(spark, job["source"]).drop(POSITION), "parse", str(checkpoints / "parse"), "append",
                      {"type": "parquet", "path": job["parse_sink"]}, job.get("processing_time"))]
    queries = []
    rejected = rejected_rows(job, parsed(spark, job["source"]))
    trigger = job.get("processing_time")
    queries.append(start(rejected, "quarantine", str(checkpoints / "quarantine"), "append",
                         {"type": "parquet", "path": job["quarantine"]}, trigger))
    for out in job["outputs"]:
        frame = output_frame(accepted(spark, job), job, out)
        queries.append(start(frame, out["name"], str(checkpoints / out["name"]), out["mode"], out["sink"], trigger))
    return queries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--job", required=True, help="the job file the benchmark wrote (JSON)")
    args = p.parse_args(argv)
    job = json.loads(Path(args.job).read_text())
    spark = session(job)
    if job["variant"] == "batch":
        result = {"variant": "batch", "failed": [], "batches": batch(spark, job)}
        Path(job["result"]).write_text(json.dumps(result))
        spark.stop()
        return 0
    queries = []
    failed = []
    try:
        if job["variant"] == "staged":
            trigger = job.get("processing_time")
            queries, outputs = staged(spark, job, trigger)
            if trigger:
                queries += outputs()
            else:  # the outputs read what the ingestion has committed, as the platform's do
                queries[0].awaitTermination()
                queries += outputs()
        else:
            queries = plan(spark, job)
        for q in queries:
            q.awaitTermination()
            if q.exception() is not None:
                failed.append(f"{q.name}: {q.exception()}")
    except Exception as exc:  # reported, then exit 1
        failed.append(str(exc))
    finally:
        for q in queries:
            if q.isActive:
                q.stop()
    batches = [{"query": q.name, "batch_id": p["batchId"], "timestamp": p["timestamp"],
                "trigger_ms": p["durationMs"].get("triggerExecution", 0), "input_rows": p["numInputRows"]}
               for q in queries for p in (json.loads(x.json) for x in q.recentProgress)]
    Path(job["result"]).write_text(json.dumps({"variant": job["variant"], "failed": failed, "batches": batches}))
    spark.stop()
    for message in failed:
        print(f"query failed: {message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
