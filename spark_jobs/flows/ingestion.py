"""Ingestion: a stream's input parsed once, every row decided once.

One streaming query per stream (``_ingest``) reads the landing files and commits what it
decides to two tables, both written through Spark's own file sink (data files plus the
``_spark_metadata`` log, so readers see only committed batches):

    landing files -> parse (PERMISSIVE, corrupt-record column)
      -> the rule a row breaks: malformed record, invalid UTF-8, missing required field,
         event time too far ahead (null when the row is valid)
      -> event time of valid rows -> watermark -> deduplicate within the watermark
      -> per micro-batch (foreachBatch, the batch computed once: shuffled by event date,
         and every job of the batch reads that shuffle's output):
           valid rows at or behind the batch watermark -> counted as dropped late
           valid rows without a match in an inner join -> counted as unmatched
           the rest, enriched by the static joins
             -> the stream's transform, if any (SQL over the view ``input``, or a
                Python function; rows it gives nothing for are counted as filtered)
                                                       -> accepted-rows table
                                                          (partitioned by event_date)
           rejected rows, with the reason in words      -> quarantine table

Every output of the stream reads the accepted-rows table as its streaming source, so all
outputs see the same accepted rows, across kills and restarts too (a replayed batch
writes nothing twice: the file sink skips a batch its log already holds). A pass-through
output of exactly the accepted rows is not written again: the table is written into its
sink path, and that output has no flow of its own (``OutputPlan.written_by_ingestion``).

Rejected rows carry no event time into the watermark (a row dated 2100 would otherwise
move it decades ahead) and get a key of their own for the deduplication, so two equal
malformed lines are both quarantined. Rows are dropped as late by Spark's deduplication
where the spec deduplicates, and otherwise here, by the rule Spark's stateful operators
apply: event time at or before the watermark the previous batch ran with (its offsets
entry), Spark's watermark for late events.

The quarantine's ``reason`` says which rule a row broke, e.g. ``malformed json record:
value does not match the column type: temperature (double)``, ``missing required
field(s): ts`` or ``event time too far in the future: ts is more than 1 day ahead of
the processing time``. Its ``raw`` is the record as text, always valid UTF-8 (Parquet's
strings must be; invalid bytes become U+FFFD), and ``raw_bytes`` the record's bytes
exactly as they came where the source gives them (``quarantine_columns``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from spark_jobs import user_code
from spark_jobs.frames import read_source, reference_frame
from spark_jobs.plan import IngestionPlan, SourcePlan, StreamPlan
from spark_jobs.runtime.checkpoint import batch_watermark_ms, query_id, reads_nothing
from spark_jobs.sinks.delta import DeltaAppender
from spark_jobs.sinks.files import FileSinkWriter
from spark_jobs.stream_spec.models import (
    CORRUPT_RECORD_COLUMN,
    EVENT_DATE_COLUMN,
    INGEST_FLOW,
    INPUT_VIEW,
    RAW_BYTES_COLUMN,
    SOURCE_FILE_COLUMN,
    Column,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

#: Working columns of the ingestion; never written to the accepted rows.
REASON, EVENT_TIME, ROW_KEY, KIND = "_reason", "_event_time", "_row_key", "_kind"
ACCEPTED, QUARANTINED, LATE, UNMATCHED = "accepted", "quarantined", "late", "unmatched"
#: With a transform: the rows kept that went into it, and those it gave nothing back for
#: (when it gives at most one row per row; one that can multiply rows is accounted as in and out)
TRANSFORM_IN, FILTERED = "transform_in", "filtered"
#: what the ingestion decides of each row it reads
DECIDED = (ACCEPTED, QUARANTINED, LATE, UNMATCHED)


# ---- what is malformed ----------------------------------------------------------------------


def _not_utf8(text, source: SourcePlan):  # pyspark Columns
    """Text that was not valid UTF-8 in the file or record (never true for a null).

    The JSON reader keeps a malformed record's bytes as they were and rejects invalid
    bytes in a value; the CSV file reader decodes every line, replacing invalid bytes with
    U+FFFD, and would pass them on in string columns (its text is always valid UTF-8).
    A Kafka value keeps its bytes as they were.
    """
    replaced = source.is_files and source.format == "csv"
    bad = F.instr(text, "\ufffd") > 0 if replaced else ~F.is_valid_utf8(text)
    return F.coalesce(bad, F.lit(False))


def _too_far_ahead(plan: StreamPlan):  # a pyspark Column, or None
    """Event time beyond processing time + ``event_time.max_future`` (never true for a null)."""
    et = plan.ingestion.event_time if plan.ingestion else None
    if et is None or not plan.source.parses_records:
        return None
    # current_timestamp() is the micro-batch's time, kept in the offset log: a replayed batch splits alike
    limit = F.unix_micros(F.current_timestamp()) + F.lit(et.max_future_us)
    return F.coalesce(F.unix_micros(F.col(et.column)) > limit, F.lit(False))


def _names_where(columns: list[Column], test):  # pyspark Columns
    """``'a, b'``: the names of the columns for which ``test(column)`` holds, ``''`` if none."""
    return F.concat_ws(", ", *[F.when(test(c), F.lit(c.name)) for c in columns])


def _corrupt_reason(source: SourcePlan):  # a pyspark Column
    """Why the parser rejected a record: empty, invalid UTF-8, not a record at all, a value
    of the wrong type (naming the columns), or for CSV the wrong number of fields."""
    raw = F.col(CORRUPT_RECORD_COLUMN)
    columns = source.parsed_columns
    prefix = f"malformed {source.format} record: "
    if source.format == "json":
        def present(c: Column):
            return F.get_json_object(raw, f"$.{c.name}").isNotNull()

        shape = F.json_object_keys(raw).isNull()
        shape_reason = "not a JSON object (truncated, or not JSON)"
        fallback = "does not match the schema"
    else:
        # the record split again into string fields, one more than declared to see extra ones
        options = {k: str(v) for k, v in source.options.items()} if source.is_files else {}
        fields = F.from_csv(raw, ", ".join(f"`_f{i}` string" for i in range(len(columns) + 1)), options)

        def present(c: Column):
            return fields.getField(f"_f{columns.index(c)}").isNotNull()

        shape = fields.getField(f"_f{len(columns)}").isNotNull()
        shape_reason = f"more fields than the {len(columns)} declared columns"
        fallback = f"fewer fields than the {len(columns)} declared columns"
    wrong = F.concat_ws(", ", *[F.when(present(c) & F.col(c.name).isNull(), F.lit(f"{c.name} ({c.type})"))
                               for c in columns])
    return F.concat(F.lit(prefix), (
        F.when(F.trim(raw) == "", F.lit("empty record"))
        .when(_not_utf8(raw, source), F.lit("not valid UTF-8"))
        .when(shape, F.lit(shape_reason))
        .when(wrong != "", F.concat(F.lit("value does not match the column type: "), wrong))
        .otherwise(F.lit(fallback))))


def _any(tests: list) -> Any:  # a pyspark Column
    """True when any of the boolean columns is (false for none)."""
    found = F.lit(False)
    for test in tests:
        found = found | test
    return found


#: Which rule a rejected row broke (the ingestion's ``_reason``; null for a valid row).
CORRUPT, NOT_UTF8, MISSING, FUTURE = 1, 2, 3, 4


def rejection(plan: StreamPlan):  # a pyspark Column
    """Which rule a parsed row breaks (``CORRUPT`` ...), or null for a valid row.

    Decided in the stream for every row, so it is a few boolean tests; the text saying
    why (``rejection_text``) is written for the rejected rows alone. Spelling the text
    out here made the scan's generated code too large for the JVM to compile."""
    source = plan.source
    missing = _any([F.col(c.name).isNull() for c in source.columns if c.required])
    if source.kind == "spark":  # no parser of the platform's: a required value absent (or not cast)
        return F.when(missing, F.lit(MISSING))
    if not source.parses_records:
        return F.lit(None).cast("int")
    strings = [c for c in source.parsed_columns if c.type == "string"]
    rule = (F.when(F.col(CORRUPT_RECORD_COLUMN).isNotNull(), F.lit(CORRUPT))
            .when(_any([_not_utf8(F.col(c.name), source) for c in strings]), F.lit(NOT_UTF8))
            .when(missing, F.lit(MISSING)))
    future = _too_far_ahead(plan)
    return rule if future is None else rule.when(future, F.lit(FUTURE))


def rejection_text(plan: StreamPlan):  # a pyspark Column
    """Why a rejected row was rejected, in words: the rule it broke (``_reason``) and
    which columns broke it."""
    source = plan.source
    fmt = source.format
    rule = F.col(REASON)
    missing = F.concat(F.lit("missing required field(s): "),
                       _names_where([c for c in source.columns if c.required], lambda c: F.col(c.name).isNull()))
    if not source.parses_records:
        return F.when(rule == MISSING, missing)
    strings = [c for c in source.parsed_columns if c.type == "string"]
    text = (F.when(rule == CORRUPT, _corrupt_reason(source))
            .when(rule == NOT_UTF8, F.concat(F.lit(f"malformed {fmt} record: not valid UTF-8 in "),
                                             _names_where(strings, lambda c: _not_utf8(F.col(c.name), source))))
            .when(rule == MISSING, missing))
    et = plan.ingestion.event_time if plan.ingestion else None
    if et is not None:
        text = text.when(rule == FUTURE, F.lit(f"event time too far in the future: {et.column} is more than "
                                               f"{et.max_future} ahead of the processing time"))
    return text


# ---- the streaming part: split, watermark, deduplicate ------------------------------------


def _rejected_only(source: SourcePlan) -> list[str]:
    """The source's columns that only the quarantine reads: a record's position, and a
    Kafka record's value as it came."""
    if not source.parses_records:
        return []
    return [SOURCE_FILE_COLUMN, RAW_BYTES_COLUMN] if source.kind == "kafka" else [SOURCE_FILE_COLUMN]


def decided(plan: StreamPlan, parsed: DataFrame) -> DataFrame:
    """Parsed rows with the rule each broke (``_reason``, null for a valid row),
    watermarked and deduplicated.

    Works on a stream and on a batch (a batch has no watermark; it deduplicates all)."""
    df = parsed.withColumn(REASON, rejection(plan))
    # only the quarantine needs them: no position (nor a Kafka value) carried along with every valid row
    for column in _rejected_only(plan.source):
        df = df.withColumn(column, F.when(F.col(REASON).isNotNull(), F.col(column)))
    ingestion = plan.ingestion
    if ingestion is None or ingestion.event_time is None:
        return df
    valid = F.col(REASON).isNull()
    df = df.withColumn(EVENT_TIME, F.when(valid, F.col(ingestion.event_time.column)))
    if df.isStreaming:
        df = df.withWatermark(EVENT_TIME, ingestion.event_time.watermark)
    if ingestion.deduplicate is not None:
        # a rejected row is never a duplicate: a key of its own (it leaves the state at the
        # next batch, having no event time); uuid() differs on a replay, which restores the
        # state from before the batch, so that does not matter
        source_file = F.col(SOURCE_FILE_COLUMN) if plan.source.parses_records else F.lit("")
        df = df.withColumn(ROW_KEY, F.when(~valid, F.concat(source_file, F.lit(":"), F.expr("uuid()"))))
        keys = [*ingestion.deduplicate, ROW_KEY]
        df = df.dropDuplicatesWithinWatermark(keys) if df.isStreaming else df.dropDuplicates(keys)
    return df


# ---- the batch part: late rows, joins, the two tables ---------------------------------------




@dataclass(frozen=True)
class Lookup:
    """One static join, made once for every batch: the reference rows (the key and the
    columns the rows lack) with a match marker, broadcast."""

    rows: DataFrame
    key: list[str]
    marker: str
    inner: bool


def lookups(plan: StreamPlan, references: list[DataFrame]) -> list[Lookup]:
    """The stream's joins, in order; a column an earlier one (or the source) has is not taken again."""
    assert plan.ingestion is not None
    have = [c.name for c in plan.source.columns]
    made = []
    for i, (join, static) in enumerate(zip(plan.ingestion.joins, references, strict=True)):
        extra = [c.name for c in join.columns if c.name not in join.key and c.name not in have]
        have += extra
        marker = f"_matched_{i}"
        made.append(Lookup(F.broadcast(static.select(*join.key, *extra).withColumn(marker, F.lit(True))),
                           list(join.key), marker, join.how == "inner"))
    return made


def classify(ingestion: IngestionPlan, rows: DataFrame, joins: list[Lookup], watermark_ms: int | None) -> DataFrame:
    """Rows with ``_kind`` (accepted, quarantined, late, unmatched), enriched by the joins.

    Every join is a left join with a match marker, so that a row an inner join would
    drop is counted as unmatched instead of vanishing."""
    df = rows
    unmatched = F.lit(False)
    for join in joins:
        df = df.join(join.rows, on=join.key, how="left")
        if join.inner:
            unmatched = unmatched | F.col(join.marker).isNull()
    kind = F.when(F.col(REASON).isNotNull(), F.lit(QUARANTINED))
    if ingestion.event_time is not None and ingestion.deduplicate is None and watermark_ms is not None \
            and watermark_ms > 0:
        # Spark's rule: a row at or before the watermark is late. Where the stream deduplicates,
        # Spark's deduplication has dropped such rows by this same rule (and the test, its value
        # written into the generated code, would have that code compiled again at every batch)
        kind = kind.when(F.unix_micros(F.col(EVENT_TIME)) <= F.lit(watermark_ms * 1000), F.lit(LATE))
    kind = kind.when(unmatched, F.lit(UNMATCHED)).otherwise(F.lit(ACCEPTED))
    return df.withColumn(KIND, kind)


def with_event_date(ingestion: IngestionPlan, df: DataFrame) -> DataFrame:
    """``event_date``, the accepted table's partition column, from the event time (if any)."""
    if ingestion.event_time is None:
        return df
    return df.withColumn(EVENT_DATE_COLUMN, F.to_date(F.col(ingestion.event_time.column)))


def by_partition(ingestion: IngestionPlan, df: DataFrame) -> DataFrame:
    """Rows shuffled so that each value of the accepted table's partition columns is in one
    task (one file per value per batch); everything in one task if it has none."""
    return df.repartition(*ingestion.partition_by) if ingestion.partition_by else df.repartition(1)


def accepted_rows(ingestion: IngestionPlan, kept: DataFrame, partitioned: bool = False) -> DataFrame:
    """The accepted rows (the rows kept, or the transform's result of them) in the
    accepted table's columns, one partition per event date (``partitioned``: ``kept``
    already is, with its ``event_date``)."""
    assert ingestion.accepted_columns is not None
    df = kept if partitioned else with_event_date(ingestion, kept)
    df = df.select(*[F.col(name) for name in ingestion.accepted_columns])
    return df if partitioned else by_partition(ingestion, df)


def quarantine_columns(plan: StreamPlan) -> list:
    """The quarantine table's columns of a rejected row (``plan.QUARANTINE_DDL``; made once:
    many columns, each a call into the JVM):

    - ``raw``: the record as text: as it came if the parser rejected it, else its parsed
      values as JSON; always valid UTF-8, every invalid sequence replaced by U+FFFD
      (Parquet's strings must be UTF-8: readers such as pyarrow fail on other bytes);
    - ``raw_bytes``: the record's bytes exactly as they came, where the source gives them:
      a Kafka record's value, whatever the rule it broke (null for a tombstone, empty for an
      empty value); a JSON file's record the parser rejected (its line, in the file's
      encoding, without the line break). Null otherwise: Spark's CSV reader decodes a line
      before anyone sees it (invalid bytes already U+FFFD), and a file's record the parser
      read but a rule rejected is known by its parsed values only;
    - ``reason``; ``source_file``: its file, or its Kafka position ``topic/partition@offset``;
    - ``quarantined_at``.
    """
    source = plan.source
    raw = F.to_json(F.struct(*[F.col(c.name) for c in source.columns]))
    raw_bytes = F.lit(None).cast("binary")
    if source.parses_records:
        raw = F.coalesce(F.col(CORRUPT_RECORD_COLUMN), raw)
        source_file = F.col(SOURCE_FILE_COLUMN)
        if source.kind == "kafka":
            raw_bytes = F.col(RAW_BYTES_COLUMN)
        elif source.format == "json":  # the JSON reader keeps a rejected record's bytes as they were
            raw_bytes = F.col(CORRUPT_RECORD_COLUMN).cast("binary")
    else:
        source_file = F.lit(None).cast("string")
    return [F.make_valid_utf8(raw).alias("raw"), raw_bytes.alias("raw_bytes"), rejection_text(plan).alias("reason"),
            source_file.alias("source_file"), F.current_timestamp().alias("quarantined_at")]


def quarantined_rows(classified: DataFrame, columns: list) -> DataFrame:
    """The rejected rows of a batch, in the quarantine's ``columns``, into one file."""
    return classified.where(F.col(KIND) == QUARANTINED).select(*columns).coalesce(1)




def computed_once(frame: DataFrame) -> DataFrame:
    """``frame`` as a DataFrame over the RDD of its physical plan: every job that reads it
    reuses the output of the plan's last shuffle instead of computing the plan again.

    A micro-batch must not be computed twice: that would parse its files again and run
    its stateful operators (the deduplication) a second time. Unlike a cache of the
    batch, this stores nothing more: the shuffle is written anyway."""
    jdf, session = frame._jdf, frame.sparkSession
    rdd = jdf.queryExecution().toRdd()
    return DataFrame(session._jsparkSession.internalCreateDataFrame(rdd, jdf.schema(), False), session)


def at_once(session: SparkSession, *jobs: Callable[[], Any]) -> list[Any]:
    """Run the callables on threads of their own, at once, and return their results.

    The jobs of one micro-batch that read the same shuffle (``computed_once``) share its
    map stages; after them, a write of one task per event date leaves a core idle that
    the count takes. Each thread carries this thread's Spark properties (the streaming
    query's job group: stopping the query cancels them) and its active session."""
    jvm_session = session._jsparkSession

    def run(job: Callable[[], Any]) -> Any:
        # Spark's physical plans take the thread's active session, which a new thread lacks
        session._jvm.org.apache.spark.sql.SparkSession.setActiveSession(jvm_session)
        return job()

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = [pool.submit(inheritable_thread_target(session)(run), job) for job in jobs]
        return [f.result() for f in futures]


def accepted_writer(spark: SparkSession, plan: StreamPlan) -> FileSinkWriter | DeltaAppender:
    """How the ingestion commits its accepted rows: Spark's file sink, or a Delta table."""
    ingestion = plan.ingestion
    assert ingestion is not None
    if ingestion.accepted_is_delta:
        return DeltaAppender(plan.stream, "accepted", ingestion.accepted_path, ingestion.partition_by, ingestion.checkpoint)
    return FileSinkWriter(spark, ingestion.accepted_path, ingestion.partition_by)


class IngestBatch:
    """The foreachBatch function of the ingestion query.

    A batch is computed once. Its classified rows are shuffled by event date (the
    accepted table's partitioning), and the jobs that read that shuffle's output
    (``computed_once``) are the accepted write and the count of each kind, at once
    (``at_once``), then the quarantine's write if the count found rejected rows; a batch
    without any commits the quarantine's log entry alone (``FileSinkWriter.add_empty_batch``).
    (Spark's observed metrics could count in the write itself, but they aggregate without
    generated code: slower than a job of their own.) A batch that reads no input, which
    Spark runs after the watermark moved, runs its stateful operators alone
    (``without_input``)."""

    def __init__(self, spark: SparkSession, plan: StreamPlan,
                 on_batch: Callable[[dict[str, Any]], None] | None = None):
        assert plan.ingestion is not None
        self.plan, self.ingestion, self.on_batch = plan, plan.ingestion, on_batch
        self.checkpoint = plan.ingestion.checkpoint
        self.joins = lookups(plan, [reference_frame(spark, j, plan.reference_checks) for j in plan.ingestion.joins])
        #: the reference data as views of the micro-batches' session, for the transform
        self._views: tuple[Any, dict[str, DataFrame]] | None = None
        self.accepted = accepted_writer(spark, plan)
        quarantine = plan.ingestion.quarantine
        self.quarantine = FileSinkWriter(spark, quarantine, []) if quarantine else None
        self.quarantine_columns = quarantine_columns(plan)
        self._query_id: str | None = None  # the checkpoint's, known from the first batch on
        #: the accepted rows' and the quarantine's columns, known from the first batch with input
        self._schemas: tuple[StructType, StructType] | None = None
        #: what the jobs after the shuffle read: the rows kept, and how to quarantine a rejected one
        self.carried = [*plan.ingestion.input_columns, KIND, REASON]
        if plan.source.parses_records:
            self.carried += [CORRUPT_RECORD_COLUMN, *_rejected_only(plan.source)]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # Spark judges a batch's rows late by the watermark the batch before ran with (its
        # "watermark for late events"; the batch's own one only evicts state), so do the same
        watermark = batch_watermark_ms(self.checkpoint, batch_id - 1) if batch_id > 0 else 0
        if self._schemas is not None and reads_nothing(self.checkpoint, batch_id):
            counts, written = self.without_input(batch, batch_id)
        else:
            counts, written = self.decide(batch, batch_id, watermark)
        total = sum(counts[k] for k in DECIDED)  # every row read: kept, rejected, late or unmatched
        if written is not None:  # the rows kept went into the transform; what came out is accepted
            counts[TRANSFORM_IN], counts[ACCEPTED] = counts[ACCEPTED], written
        if self.quarantine is None and counts[QUARANTINED]:
            raise RuntimeError(f"stream {self.plan.stream}: {counts[QUARANTINED]} rejected row(s) and no quarantine")
        if self._query_id is None:
            self._query_id = query_id(self.checkpoint)
        event = {"event": "ingested", "stream": self.plan.stream, "query": INGEST_FLOW,
                 "id": self._query_id, "batch_id": batch_id, "watermark_ms": watermark,
                 "rows": total, **{k: counts[k] for k in DECIDED}}
        if self.ingestion.transform is not None:
            event[TRANSFORM_IN] = counts[TRANSFORM_IN]
            if not self.ingestion.transform_multiplies:  # it gives at most one row per row it reads
                event[FILTERED] = counts[TRANSFORM_IN] - counts[ACCEPTED]
        log.info("ingested batch %d of %s: %s", batch_id, self.plan.stream,
                 ", ".join(f"{k} {event[k]}" for k in (*DECIDED, TRANSFORM_IN, FILTERED) if k in event))
        if self.on_batch is not None:
            self.on_batch(event)

    def decide(self, batch: DataFrame, batch_id: int, watermark: int | None) -> tuple[dict[str, int], int | None]:
        """Decide, write and count the batch's rows: the count of each kind, and of the rows the
        transform (if any) gave for the ones kept."""
        ingestion = self.ingestion
        classified = classify(ingestion, batch, self.joins, watermark).select(*self.carried)
        rows = computed_once(by_partition(ingestion, with_event_date(ingestion, classified)))

        def count() -> dict[str, int]:
            return {k: 0 for k in DECIDED} | {r[KIND]: r["count"] for r in rows.groupBy(KIND).count().collect()}

        kept = rows.where(F.col(KIND) == ACCEPTED)
        # the user's code, cached: what is written is what is counted
        transformed = None if ingestion.transform is None else self.transform(kept).persist()
        accepted = (accepted_rows(ingestion, kept, partitioned=True) if transformed is None
                    else accepted_rows(ingestion, transformed))

        def write() -> int | None:
            self.accepted.add_batch(batch_id, accepted)
            return None if transformed is None else transformed.count()

        try:
            counts, written = at_once(batch.sparkSession, count, write)
        finally:
            if transformed is not None:
                transformed.unpersist()
        rejected = quarantined_rows(rows, self.quarantine_columns)
        if self.quarantine is not None:  # the rejected rows; a batch without any has its log entry alone
            if counts[QUARANTINED]:
                self.quarantine.add_batch(batch_id, rejected)
            else:
                self.quarantine.add_empty_batch(batch_id, rejected.schema)
        if self._schemas is None:
            self._schemas = (accepted.schema, rejected.schema)
        return counts, written

    def without_input(self, batch: DataFrame, batch_id: int) -> tuple[dict[str, int], int | None]:
        """A batch that reads no input (``reads_nothing``), which Spark runs after one that moved
        the watermark: one job runs its stateful operators (the deduplication evicts what the
        watermark passed, and commits its state), and each table commits the batch naming no
        file. Nothing to classify, write or count."""
        batch.write.format("noop").mode("overwrite").save()
        accepted, rejected = self._schemas
        self.accepted.add_empty_batch(batch_id, accepted)
        if self.quarantine is not None:
            self.quarantine.add_empty_batch(batch_id, rejected)
        return {k: 0 for k in DECIDED}, None if self.ingestion.transform is None else 0

    def transform(self, kept: DataFrame) -> DataFrame:
        """The stream's transform of the rows kept (the view ``input``: source and join
        columns). It runs in the micro-batch's session, where the reference data are
        views by their names (made once: the stream's session outlives its batches)."""
        session = kept.sparkSession
        if self._views is None or self._views[0] != session._jsparkSession:
            self._views = (session._jsparkSession, {j.name: reference_frame(session, j, self.plan.reference_checks)
                                                     for j in self.ingestion.joins})
        transform = self.ingestion.transform
        assert transform is not None
        return user_code.run(kept.select(*self.ingestion.input_columns), INPUT_VIEW, transform.sql, transform.python,
                             self._views[1], self.plan.transforms_dir)




def ingestion_writer(spark: SparkSession, plan: StreamPlan,
                     on_batch: Callable[[dict[str, Any]], None] | None) -> tuple[DataFrame, DataStreamWriter]:
    """The ingestion's query over the source and its writer (without a trigger)."""
    ingestion = plan.ingestion
    assert ingestion is not None
    frame = decided(plan, read_source(spark, plan.source))
    writer = (frame.writeStream.queryName(ingestion.query_name)
              .option("checkpointLocation", ingestion.checkpoint)
              .foreachBatch(IngestBatch(spark, plan, on_batch)))
    return frame, writer
