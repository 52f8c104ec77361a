"""The DataFrames a plan describes: the source as read, the reference data, the
accepted-rows table (streamed or read in batch) and each output's query over it.

Analysis (``spark_jobs.analysis``), the flows (``spark_jobs.flows``), backfills and quality
checks all build their frames here, from the plan alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_jobs import user_code
from spark_jobs.plan import IngestionPlan, JoinPlan, OutputPlan, SourcePlan, StreamPlan
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.sinks.delta import create_table
from spark_jobs.sources import kafka as kafka_source
from spark_jobs.stream_spec.models import (
    ACCEPTED_VIEW,
    CORRUPT_RECORD_COLUMN,
    RAW_BYTES_COLUMN,
    SOURCE_FILE_COLUMN,
    SPARK_TYPES,
    WINDOW_END,
    WINDOW_START,
    Aggregate,
    Aggregation,
    Passthrough,
    PythonQuery,
    SqlQuery,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def read_source(spark: SparkSession, source: SourcePlan, streaming: bool = True) -> DataFrame:
    """The parsed source, with ``_corrupt_record`` and ``_source_file`` (a record's
    position) for the sources the platform parses (files, Kafka), and for Kafka the value's
    bytes (``_raw_bytes``); the same reader (format, schema, options) in a stream and in a
    batch. Any other Spark source gives its declared columns, picked by name and cast to
    their types."""
    if source.kind == "kafka":
        return _read_kafka(spark, source, streaming)
    if source.kind == "spark":
        reader = (spark.readStream if streaming else spark.read).format(source.format)
        reader = reader.options(**source.reader_options)
        if source.reader_schema:
            reader = reader.schema(source.reader_schema)
        df = reader.load(source.landing) if source.landing else reader.load()
        return df.select(*[F.col(c.name).cast(SPARK_TYPES[c.type]).alias(c.name) for c in source.columns])
    if not source.is_files:
        if not streaming:
            raise ValueError("the rate source cannot be read in batch")
        return spark.readStream.format("rate").option("rowsPerSecond", source.rows_per_second).load()
    reader = spark.readStream if streaming else spark.read
    reader = (reader.format(source.format).schema(source.reader_ddl).option("mode", "PERMISSIVE")
              .option("columnNameOfCorruptRecord", CORRUPT_RECORD_COLUMN))
    if streaming:
        reader = reader.option("maxFilesPerTrigger", source.max_files_per_trigger)
    if source.format == "csv":
        reader = reader.option("header", True)
    for key, value in source.options.items():
        reader = reader.option(key, value)
    df = reader.load(source.landing)
    path = F.col("_metadata.file_path")
    if source.replay_of:  # a folder beside the landing folder: its name in the file's URI becomes the landing's
        path = F.regexp_replace(path, r"/[^/]+(/[^/]+)$", "/" + quote(Path(source.replay_of).name) + "$1")
    return df.withColumn(SOURCE_FILE_COLUMN, path)


def _read_kafka(spark: SparkSession, source: SourcePlan, streaming: bool) -> DataFrame:
    """Kafka records, their values parsed like a file's records (PERMISSIVE, the
    corrupt-record column; an empty or invalid-UTF-8 value is a corrupt one), with their position
    ``topic/partition@offset`` in ``_source_file`` and the value as it came (binary, null
    for a tombstone) in ``_raw_bytes``, for the quarantine. In a batch (a backfill), every
    record the topics hold."""
    kafka = source.kafka
    assert kafka is not None
    options = {"kafka.bootstrap.servers": kafka_source.bootstrap_servers(kafka),
               "failOnDataLoss": str(kafka.fail_on_data_loss).lower(),
               **kafka_source.source_options(source.reader_options)}
    options |= {"subscribe": ",".join(kafka.topics)} if kafka.topics else {"subscribePattern": str(kafka.pattern)}
    if streaming:
        options["startingOffsets"] = kafka.starting_offsets
        if kafka.max_offsets_per_trigger:
            options["maxOffsetsPerTrigger"] = str(kafka.max_offsets_per_trigger)
    records = (spark.readStream if streaming else spark.read).format("kafka").options(**options).load()
    value = F.col("value").cast("string")
    parse = F.from_json if source.format == "json" else F.from_csv
    parsed = parse(value, source.reader_ddl, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_RECORD_COLUMN})
    # an empty value, or one that is not UTF-8 (the JSON parser would read its bad bytes as
    # U+FFFD), is a corrupt record: kept as it came
    corrupt = value.isNull() | (F.trim(value) == "") | ~F.is_valid_utf8(value)
    columns = [parsed.getField(c.name).alias(c.name) for c in source.parsed_columns]
    if kafka.record_timestamp:
        columns.append(F.col("timestamp").alias(kafka.record_timestamp))
    position = F.concat(F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit("@"),
                        F.col("offset").cast("string"))
    return records.select(
        *columns,
        F.when(corrupt, F.coalesce(value, F.lit(""))).otherwise(parsed.getField(CORRUPT_RECORD_COLUMN))
        .alias(CORRUPT_RECORD_COLUMN),
        position.alias(SOURCE_FILE_COLUMN),
        F.col("value").alias(RAW_BYTES_COLUMN))


def reference_frame(spark: SparkSession, join: JoinPlan, checks: str | None = None) -> DataFrame:
    """Reference data with the declared columns, picked by name and cast to their types.

    Keys must be unique: a key present twice would turn one input row into two. The check
    reads the data twice (the header, then every key), about 2 s of a driver's start; it is
    recorded in the folder ``checks`` (``StreamPlan.reference_checks``) with the files it read
    (path, size, modification time) and the schema the reader gave, and while the files, the
    format and the key are the same a start reads neither again: a scheduled stream pays it
    once, not at every run."""
    files = _files_of(spark, join.path)
    record = Path(checks) / f"{join.name}.json" if checks else None
    checked = _recorded_check(record, join, files)
    reader = spark.read.format(join.format)
    if join.format == "csv":
        reader = reader.option("header", True).option("mode", "FAILFAST")
    if checked is not None:  # the files the check read: their schema as the reader gave it then
        reader = reader.schema(StructType.fromJson(checked["schema"]))
    df = reader.load(join.path)
    missing = [c.name for c in join.columns if c.name not in df.columns]
    if missing:
        raise ValueError(f"reference data {join.name!r} ({join.path}) has no column(s) {missing}; it has {df.columns}")
    given = df.schema
    df = df.select(*[F.col(c.name).cast(SPARK_TYPES[c.type]).alias(c.name) for c in join.columns])
    if checked is not None:
        return df
    repeated = df.groupBy(*join.key).count().where("count > 1").limit(3).collect()
    if repeated:
        raise ValueError(f"reference data {join.name!r} ({join.path}) has key(s) {join.key} more than once, e.g. "
                         f"{[tuple(r[k] for k in join.key) for r in repeated]}; each would multiply input rows")
    if record is not None and files is not None:
        write_atomically(record, json.dumps({**_check_of(join), "files": files, "schema": given.jsonValue()}))
    return df


def _check_of(join: JoinPlan) -> dict[str, Any]:
    """What a recorded check of reference data holds for: where, how read, which key."""
    return {"path": join.path, "format": join.format, "key": list(join.key)}


def _recorded_check(record: Path | None, join: JoinPlan, files: list[list[Any]] | None) -> dict[str, Any] | None:
    """The recorded check of ``join``'s reference data if it read exactly ``files``, else None."""
    if record is None or files is None:
        return None
    try:
        checked = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(checked, dict) or "schema" not in checked:
        return None
    if {k: checked.get(k) for k in ("path", "format", "key")} != _check_of(join) or checked.get("files") != files:
        return None
    return checked


def _files_of(spark: SparkSession, path: str) -> list[list[Any]] | None:
    """Every file under ``path`` (a glob, a file or a folder, on any file system Spark reads),
    each ``[path, size, modification time]``, sorted; None if there is none to list."""
    jvm = spark._jvm
    pattern = jvm.org.apache.hadoop.fs.Path(path)
    fs = pattern.getFileSystem(spark._jsc.hadoopConfiguration())
    found = []
    for status in fs.globStatus(pattern) or []:
        if status.isDirectory():
            listing = fs.listFiles(status.getPath(), True)
            while listing.hasNext():
                f = listing.next()
                found.append([f.getPath().toString(), f.getLen(), f.getModificationTime()])
        else:
            found.append([status.getPath().toString(), status.getLen(), status.getModificationTime()])
    return sorted(found) or None


def accepted_stream(spark: SparkSession, ingestion: IngestionPlan) -> DataFrame:
    """The accepted-rows table as a streaming source: only batches in its commit log, all
    of them at each trigger (see the module's note), watermarked like the ingestion. A
    Delta table is read from its snapshot on, then version by version; its compactions
    change no data and are skipped (Delta's own limit of 1000 files per micro-batch holds).
    Reading it needs the table, so it is created here, empty, if the ingestion has not
    written it yet."""
    if ingestion.accepted_is_delta:
        create_table(spark, ingestion.accepted_path, ingestion.accepted_ddl, ingestion.partition_by)
        df = spark.readStream.format("delta").load(ingestion.accepted_path).select(*_accepted_columns(ingestion))
    else:
        Path(ingestion.accepted_path).mkdir(parents=True, exist_ok=True)
        df = spark.readStream.schema(ingestion.accepted_ddl).format("parquet").load(ingestion.accepted_path)
    if ingestion.event_time is not None:
        df = df.withWatermark(ingestion.event_time.column, ingestion.event_time.watermark)
    return df


def accepted_batch(spark: SparkSession, ingestion: IngestionPlan, version: int | None = None) -> DataFrame:
    """The committed accepted rows, read in batch through the table's commit log (a Delta
    table: as of ``version``, else its newest)."""
    if ingestion.accepted_is_delta:
        reader = spark.read.format("delta")
        if version is not None:
            reader = reader.option("versionAsOf", version)
        return reader.load(ingestion.accepted_path).select(*_accepted_columns(ingestion))
    return spark.read.schema(ingestion.accepted_ddl).parquet(ingestion.accepted_path)


def _accepted_columns(ingestion: IngestionPlan) -> list:
    """The accepted rows' columns in the plan's order (a Delta table's reader keeps its schema)."""
    if ingestion.accepted_columns is None:
        raise ValueError("the accepted rows' columns are known once Spark has analyzed the stream's transform")
    return [F.col(name) for name in ingestion.accepted_columns]


def _aggregate(agg: Aggregate, event_time_column: str | None):  # a pyspark Column
    if agg.fn == "count":
        col = F.count(F.lit(1)) if agg.column is None else F.count(F.col(agg.column))
    elif agg.fn == "latest":
        assert event_time_column is not None
        col = F.max_by(F.col(agg.column), F.col(event_time_column))
    else:
        col = getattr(F, agg.fn)(F.col(agg.column))
    return col.alias(agg.name)


def code_frame(accepted: DataFrame, query: SqlQuery | PythonQuery, references: Mapping[str, DataFrame],
               transforms_dir: str | None) -> DataFrame:
    """A query written as code over the accepted rows: SQL over the views ``accepted`` and
    the reference data by name, or a Python function of the accepted rows (the views
    registered as well).

    Spark resolves the views when the query is analyzed, which ``spark.sql`` and the
    DataFrame API do at once: views of the same names made later (another output's) do
    not change it."""
    return user_code.run(accepted, ACCEPTED_VIEW, getattr(query, "sql", None), getattr(query, "python", None),
                         references, transforms_dir)


def output_frame(df: DataFrame, plan: StreamPlan, output: OutputPlan) -> DataFrame:
    """An output's query over the accepted rows (a stream, or a batch of them)."""
    q = output.query
    event_time_column = plan.event_time_column
    if isinstance(q, SqlQuery | PythonQuery):
        joins = plan.ingestion.joins if plan.ingestion else []
        references = {j.name: reference_frame(df.sparkSession, j, plan.reference_checks) for j in joins}
        return code_frame(df, q, references, plan.transforms_dir)
    if isinstance(q, Passthrough):  # without a column list (over a transform's result): every column
        return df.select(*output.columns) if output.columns is not None else df
    assert isinstance(q, Aggregation)
    keys = [F.col(k) for k in q.group_by]
    if q.window is not None:
        assert event_time_column is not None
        keys.insert(0, F.window(F.col(event_time_column), q.window.duration, q.window.slide).alias("window"))
    result = df.groupBy(*keys).agg(*[_aggregate(a, event_time_column) for a in q.aggregates])
    if q.window is not None:
        result = result.select(
            F.col("window.start").alias(WINDOW_START), F.col("window.end").alias(WINDOW_END),
            *q.group_by, *[a.name for a in q.aggregates],
        )
    return result
