"""Compile a stream spec into Structured Streaming queries.

Every output is its own streaming query with its own checkpoint; all of them read the
same source and share the same preparation:

    parse (PERMISSIVE, corrupt-record column)
      -> malformed rows, rows with invalid UTF-8 in a string column, rows missing a
         required column, rows whose event time is further ahead of the processing
         time than event_time.max_future                     -> quarantine query
      -> valid rows: watermark -> deduplicate within watermark -> static joins
      -> per output: pass-through or (windowed) aggregation -> sink

The quarantine's ``reason`` says which rule a row broke, e.g. ``malformed json record:
value does not match the column type: temperature (double)``, ``missing required
field(s): ts`` or ``event time too far in the future: ts is more than 1 day ahead of
the processing time``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs.spec import (
    CORRUPT_RECORD_COLUMN,
    EVENT_DATE_COLUMN,
    QUARANTINE_QUERY,
    SOURCE_FILE_COLUMN,
    SPARK_TYPES,
    WINDOW_END,
    WINDOW_START,
    Aggregate,
    Aggregation,
    Column,
    ConsoleSink,
    FileSource,
    Layout,
    MemorySink,
    Output,
    ParquetSink,
    Passthrough,
    RateSource,
    StreamSpec,
    TableSink,
    Trigger,
    duration_seconds,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)

QUARANTINE_COLUMNS = ["raw", "reason", "source_file", "quarantined_at"]

#: Session settings every stream needs. Filter pushdown into the JSON and CSV readers is
#: off so that each query's numInputRows counts every record read (the accounting of
#: input = accepted + quarantined + dropped relies on it).
SESSION_CONF: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.json.filterPushdown.enabled": "false",
    "spark.sql.csv.filterPushdown.enabled": "false",
    "spark.sql.csv.parser.columnPruning.enabled": "false",
}


def ddl(columns: list[Column], corrupt: bool = False) -> str:
    parts = [f"`{c.name}` {SPARK_TYPES[c.type]}" for c in columns]
    if corrupt:
        parts.append(f"`{CORRUPT_RECORD_COLUMN}` string")
    return ", ".join(parts)


def query_name(spec: StreamSpec, query: str) -> str:
    """Spark query name; also the memory sink's table name."""
    return f"{spec.name}__{query.lstrip('_')}"


# ---- source and preparation -------------------------------------------------------------


def read_source(spark: SparkSession, spec: StreamSpec, layout: Layout) -> DataFrame:
    """The parsed source, with ``_corrupt_record`` and ``_source_file`` for file sources."""
    src = spec.source
    if isinstance(src, RateSource):
        return spark.readStream.format("rate").option("rowsPerSecond", src.rows_per_second).load()
    assert isinstance(src, FileSource)
    reader = (
        spark.readStream.format(src.format)
        .schema(ddl(src.columns, corrupt=True))
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_RECORD_COLUMN)
        .option("maxFilesPerTrigger", src.max_files_per_trigger)
    )
    if src.format == "csv":
        reader = reader.option("header", True)
    for key, value in src.options.items():
        reader = reader.option(key, value)
    df = reader.load(layout.landing)
    return df.withColumn(SOURCE_FILE_COLUMN, F.col("_metadata.file_path"))


def _missing_required(spec: StreamSpec) -> list[Column]:
    return [c for c in spec.source.columns if c.required]


def _string_columns(spec: StreamSpec) -> list[Column]:
    return [c for c in spec.source.columns if c.type == "string"]


def _not_utf8(text, fmt: str):  # noqa: ANN001, ANN202 - pyspark Columns
    """Text that was not valid UTF-8 in the file (never true for a null).

    The JSON reader keeps a malformed record's bytes as they were and rejects invalid
    bytes in a value; the CSV reader decodes every line, replacing invalid bytes with
    U+FFFD, and would pass them on in string columns.
    """
    bad = ~F.is_valid_utf8(text)
    if fmt == "csv":
        bad = bad | (F.instr(text, "\ufffd") > 0)
    return F.coalesce(bad, F.lit(False))


def _invalid_utf8(spec: StreamSpec, column: Column):  # noqa: ANN202 - a pyspark Column
    fmt = spec.source.format if isinstance(spec.source, FileSource) else "rate"
    return _not_utf8(F.col(column.name), fmt)


def _too_far_ahead(spec: StreamSpec):  # noqa: ANN202 - a pyspark Column, or None
    """Event time beyond processing time + ``event_time.max_future`` (never true for a null)."""
    if spec.event_time is None:
        return None
    ahead_us = round(duration_seconds(spec.event_time.max_future) * 1_000_000)
    # current_timestamp() is the micro-batch's time, kept in the offset log: a replayed batch splits alike
    limit = F.unix_micros(F.current_timestamp()) + F.lit(ahead_us)
    return F.coalesce(F.unix_micros(F.col(spec.event_time.column)) > limit, F.lit(False))


def _malformed_condition(spec: StreamSpec):  # noqa: ANN202 - a pyspark Column
    cond = F.col(CORRUPT_RECORD_COLUMN).isNotNull()
    for c in _string_columns(spec):
        cond = cond | _invalid_utf8(spec, c)
    for c in _missing_required(spec):
        cond = cond | F.col(c.name).isNull()
    future = _too_far_ahead(spec)
    return cond if future is None else cond | future


def _names_where(columns: list[Column], test):  # noqa: ANN001, ANN202 - pyspark Columns
    """``'a, b'``: the names of the columns for which ``test(column)`` holds, ``''`` if none."""
    return F.concat_ws(", ", *[F.when(test(c), F.lit(c.name)) for c in columns])


def _corrupt_reason(spec: StreamSpec):  # noqa: ANN202 - a pyspark Column
    """Why the parser rejected a record: invalid UTF-8, not a record at all, a value of the
    wrong type (naming the columns), or for CSV the wrong number of fields."""
    src = spec.source
    assert isinstance(src, FileSource)
    raw = F.col(CORRUPT_RECORD_COLUMN)
    columns = list(src.columns)
    prefix = f"malformed {src.format} record: "
    if src.format == "json":
        def present(c: Column):  # noqa: ANN202
            return F.get_json_object(raw, f"$.{c.name}").isNotNull()

        shape = F.json_object_keys(raw).isNull()
        shape_reason = "not a JSON object (truncated, or not JSON)"
        fallback = "does not match the schema"
    else:
        # the record split again into string fields, one more than declared to see extra ones
        options = {k: str(v) for k, v in src.options.items()}
        fields = F.from_csv(raw, ", ".join(f"`_f{i}` string" for i in range(len(columns) + 1)), options)

        def present(c: Column):  # noqa: ANN202
            return fields.getField(f"_f{columns.index(c)}").isNotNull()

        shape = fields.getField(f"_f{len(columns)}").isNotNull()
        shape_reason = f"more fields than the {len(columns)} declared columns"
        fallback = f"fewer fields than the {len(columns)} declared columns"
    wrong = F.concat_ws(", ", *[F.when(present(c) & F.col(c.name).isNull(), F.lit(f"{c.name} ({c.type})"))
                               for c in columns])
    return F.concat(F.lit(prefix), (
        F.when(_not_utf8(raw, src.format), F.lit("not valid UTF-8"))
        .when(shape, F.lit(shape_reason))
        .when(wrong != "", F.concat(F.lit("value does not match the column type: "), wrong))
        .otherwise(F.lit(fallback))))


def quarantined(parsed: DataFrame, spec: StreamSpec) -> DataFrame:
    """Malformed rows with the raw record, a readable reason and the file they came from."""
    fmt = spec.source.format if isinstance(spec.source, FileSource) else "rate"
    bad_utf8 = _names_where(_string_columns(spec), lambda c: _invalid_utf8(spec, c))
    missing = _names_where(_missing_required(spec), lambda c: F.col(c.name).isNull())
    reason = (
        F.when(F.col(CORRUPT_RECORD_COLUMN).isNotNull(), _corrupt_reason(spec))
        .when(bad_utf8 != "", F.concat(F.lit(f"malformed {fmt} record: not valid UTF-8 in "), bad_utf8))
        .when(missing != "", F.concat(F.lit("missing required field(s): "), missing))
    )
    if spec.event_time is not None:
        et = spec.event_time
        reason = reason.otherwise(F.lit(f"event time too far in the future: {et.column} is more than "
                                        f"{et.max_future} ahead of the processing time"))
    raw = F.coalesce(F.col(CORRUPT_RECORD_COLUMN),
                     F.to_json(F.struct(*[F.col(c.name) for c in spec.source.columns])))
    return parsed.where(_malformed_condition(spec)).select(
        raw.alias("raw"), reason.alias("reason"), F.col(SOURCE_FILE_COLUMN).alias("source_file"),
        F.current_timestamp().alias("quarantined_at"),
    )


def reference_frame(spark: SparkSession, spec: StreamSpec, layout: Layout, index: int) -> DataFrame:
    """Reference data with the declared columns, picked by name and cast to their types."""
    ref = spec.enrich[index]
    path = layout.reference(ref.path)
    reader = spark.read.format(ref.format)
    if ref.format == "csv":
        reader = reader.option("header", True).option("mode", "FAILFAST")
    df = reader.load(path)
    missing = [c.name for c in ref.columns if c.name not in df.columns]
    if missing:
        raise ValueError(f"reference data {ref.name!r} ({path}) has no column(s) {missing}; it has {df.columns}")
    return df.select(*[F.col(c.name).cast(SPARK_TYPES[c.type]).alias(c.name) for c in ref.columns])


def prepared(spark: SparkSession, spec: StreamSpec, layout: Layout, parsed: DataFrame | None = None) -> DataFrame:
    """Valid rows, watermarked, deduplicated and enriched: the input of every output."""
    df = parsed if parsed is not None else read_source(spark, spec, layout)
    if isinstance(spec.source, FileSource):
        # A query that reads only some columns would let the JSON parser skip the others,
        # and a record malformed in a skipped column would pass as valid here while the
        # quarantine (which reads all) takes it too. Referencing every column keeps the
        # parse, and so the split into valid and malformed, the same in every query.
        every_column = F.length(F.to_json(F.struct(*[F.col(c.name) for c in spec.source.columns]))) > 0
        df = df.where(~_malformed_condition(spec) & every_column).drop(CORRUPT_RECORD_COLUMN, SOURCE_FILE_COLUMN)
    if spec.event_time is not None:
        df = df.withWatermark(spec.event_time.column, spec.event_time.watermark)
    if spec.deduplicate is not None:
        keys = list(spec.deduplicate.key)
        df = df.dropDuplicatesWithinWatermark(keys) if df.isStreaming else df.dropDuplicates(keys)
    for i, ref in enumerate(spec.enrich):
        extra = [c.name for c in ref.columns if c.name not in ref.key and c.name not in df.columns]
        static = reference_frame(spark, spec, layout, i).select(*ref.key, *extra)
        df = df.join(F.broadcast(static), on=list(ref.key), how=ref.how)
    if spec.event_time is not None:
        df = df.withColumn(EVENT_DATE_COLUMN, F.to_date(F.col(spec.event_time.column)))
    return df


def _aggregate(spec: StreamSpec, agg: Aggregate):  # noqa: ANN202 - a pyspark Column
    if agg.fn == "count":
        col = F.count(F.lit(1)) if agg.column is None else F.count(F.col(agg.column))
    elif agg.fn == "latest":
        assert spec.event_time is not None
        col = F.max_by(F.col(agg.column), F.col(spec.event_time.column))
    else:
        col = getattr(F, agg.fn)(F.col(agg.column))
    return col.alias(agg.name)


def output_frame(df: DataFrame, spec: StreamSpec, output: Output) -> DataFrame:
    q = output.query
    if isinstance(q, Passthrough):
        return df.select(*spec.result_columns(output))
    assert isinstance(q, Aggregation)
    keys = [F.col(k) for k in q.group_by]
    if q.window is not None:
        assert spec.event_time is not None
        keys.insert(0, F.window(F.col(spec.event_time.column), q.window.duration, q.window.slide).alias("window"))
    result = df.groupBy(*keys).agg(*[_aggregate(spec, a) for a in q.aggregates])
    if q.window is not None:
        result = result.select(
            F.col("window.start").alias(WINDOW_START), F.col("window.end").alias(WINDOW_END),
            *q.group_by, *[a.name for a in q.aggregates],
        )
    return result


# ---- sinks and queries ------------------------------------------------------------------------

_SPEC_TYPES = {
    T.StringType: "string", T.IntegerType: "integer", T.LongType: "long", T.DoubleType: "double",
    T.BooleanType: "boolean", T.TimestampType: "timestamp", T.DateType: "date",
}


def spec_type(data_type: T.DataType) -> str:
    for cls, name in _SPEC_TYPES.items():
        if isinstance(data_type, cls):
            return name
    raise ValueError(f"cannot store {data_type.simpleString()} in a table")


def table_writer(df: DataFrame, spec: StreamSpec, output: Output, layout: Layout):  # noqa: ANN201
    from spark_jobs.tables import TableWriter

    sink = output.sink
    assert isinstance(sink, TableSink)
    columns = [(f.name, spec_type(f.dataType)) for f in df.schema.fields]
    return TableWriter(
        url=layout.table_url(sink), table=sink.table, columns=columns, key=spec.result_key(output),
        mode=output.mode, sink_id=f"{spec.name}.{output.name}",
    )


def checkpoint_query_id(checkpoint: str) -> str:
    """The query id Spark keeps in ``<checkpoint>/metadata``; new for every new checkpoint."""
    with open(Path(checkpoint) / "metadata", encoding="utf-8") as f:
        return json.loads(f.readline())["id"]


def _foreach_table_batch(writer, checkpoint: str):  # noqa: ANN001, ANN202
    """The foreachBatch function of a table sink.

    Batch ids start again at 0 in a new checkpoint, so the ledger names the sink by its
    output and the checkpoint's query id: a reset checkpoint never skips real batches.
    """
    names = [c for c, _ in writer.columns]
    base = writer.sink_id

    def write(batch: DataFrame, batch_id: int) -> None:
        if writer.sink_id == base:
            writer.sink_id = f"{base}@{checkpoint_query_id(checkpoint)}"
        rows = [tuple(r[n] for n in names) for r in batch.select(*names).toLocalIterator()]
        applied = writer.write_batch(batch_id, rows)
        log.info("table %s batch %d: %s %d rows", writer.table, batch_id,
                 "applied" if applied else "already applied, skipped", len(rows))

    return write


def _with_trigger(writer: DataStreamWriter, trigger: Trigger) -> DataStreamWriter:
    if trigger.available_now:
        return writer.trigger(availableNow=True)
    if trigger.continuous:
        return writer.trigger(continuous=trigger.continuous)
    return writer.trigger(processingTime=trigger.processing_time)


@dataclass(frozen=True)
class PlannedQuery:
    name: str
    frame: DataFrame
    writer: DataStreamWriter


def plan(spark: SparkSession, spec: StreamSpec, layout: Layout, trigger: Trigger | None = None) -> list[PlannedQuery]:
    """Build (but do not start) every query of the spec."""
    planned = []
    for output in spec.outputs:
        frame = output_frame(prepared(spark, spec, layout), spec, output)
        writer = frame.writeStream.queryName(query_name(spec, output.name)).outputMode(output.mode)
        writer = writer.option("checkpointLocation", layout.checkpoint(output.name))
        sink = output.sink
        if isinstance(sink, ParquetSink):
            writer = writer.format("parquet").option("path", layout.data(sink.path))
            if sink.partition_by:
                writer = writer.partitionBy(*sink.partition_by)
        elif isinstance(sink, TableSink):
            tw = table_writer(frame, spec, output, layout)
            tw.ensure_table()
            writer = writer.foreachBatch(_foreach_table_batch(tw, layout.checkpoint(output.name)))
        elif isinstance(sink, ConsoleSink):
            writer = writer.format("console").option("truncate", False)
        elif isinstance(sink, MemorySink):
            writer = writer.format("memory")
        planned.append(PlannedQuery(output.name, frame, _with_trigger(writer, trigger or spec.trigger_for(output))))
    if spec.quarantine is not None:
        frame = quarantined(read_source(spark, spec, layout), spec)
        writer = (
            frame.writeStream.queryName(query_name(spec, QUARANTINE_QUERY)).outputMode("append")
            .format("parquet").option("path", layout.data(spec.quarantine.path))
            .option("checkpointLocation", layout.checkpoint(QUARANTINE_QUERY))
        )
        planned.append(PlannedQuery(QUARANTINE_QUERY, frame, _with_trigger(writer, trigger or spec.trigger)))
    return planned


def start(spark: SparkSession, spec: StreamSpec, layout: Layout, trigger: Trigger | None = None) -> dict[str, StreamingQuery]:
    """Start every query; if one cannot start, stop the ones already started."""
    queries: dict[str, StreamingQuery] = {}
    try:
        for p in plan(spark, spec, layout, trigger):
            queries[p.name] = p.writer.start()
            log.info("started query %s (id %s) checkpoint %s", p.name, queries[p.name].id, layout.checkpoint(p.name))
    except Exception:
        for q in queries.values():
            q.stop()
        raise
    return queries


def run_available_now(spark: SparkSession, spec: StreamSpec, layout: Layout,
                      timeout_seconds: float = 300) -> dict[str, StreamingQuery]:
    """Process what is waiting (available-now trigger) and return the finished queries;
    a query's failure is raised."""
    queries = start(spark, spec, layout, Trigger(available_now=True))
    try:
        for q in queries.values():
            q.awaitTermination(timeout_seconds)
            if q.exception() is not None:
                raise q.exception()
    finally:
        for q in queries.values():
            q.stop()
    return queries
