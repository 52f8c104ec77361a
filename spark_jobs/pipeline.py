"""A stream's queries: one ingestion, and one query per output fed from its accepted rows.

    landing files -> ingestion (spark_jobs.ingest) -> accepted-rows table, quarantine
    accepted-rows table (a streaming source, read through its commit log)
      -> per output: pass-through or (windowed) aggregation -> sink

The job works from the stream's plan (spark_jobs.plan), compiled once from the spec.

A pass-through output whose rows are exactly the accepted rows (Parquet, partitioned
like them; see ``StreamSpec.served_output``) gets no query: its sink path is the
accepted-rows table, written once by the ingestion, and it has no checkpoint of its
own. Every row of such a stream is then written once, not twice.

An output reads every accepted batch committed so far at each trigger (no per-trigger
file limit), so its batches are whole ingestion batches and its watermark follows the
ingestion's. Near the watermark an output can still drop a row the ingestion accepted
(the two watermarks advance at different batches); Spark counts such rows in the
output's progress. A continuous trigger (rate source, map-like outputs) cannot use a
file table between the stages; such an output reads the source itself.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark_jobs import ingest, user_code
from spark_jobs.checkpoint import last_batch, query_id, sink_last_batch
from spark_jobs.lease import fence
from spark_jobs.plan import IngestionPlan, OutputPlan, StreamPlan, Transformed, compile_plan
from spark_jobs.spec import (
    ACCEPTED_VIEW,
    INGEST_QUERY,
    WINDOW_END,
    WINDOW_START,
    Aggregate,
    Aggregation,
    Layout,
    Passthrough,
    PythonQuery,
    SpecError,
    SqlQuery,
    StreamSpec,
    Trigger,
    own_accepted_path,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)


# ---- outputs -------------------------------------------------------------------------------


def _aggregate(agg: Aggregate, event_time_column: str | None):  # noqa: ANN202 - a pyspark Column
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
        references = {j.name: ingest.reference_frame(df.sparkSession, j) for j in joins}
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


_SPEC_TYPES = {
    T.StringType: "string", T.IntegerType: "integer", T.LongType: "long", T.DoubleType: "double",
    T.BooleanType: "boolean", T.TimestampType: "timestamp", T.DateType: "date",
}


def spec_type(data_type: T.DataType) -> str:
    for cls, name in _SPEC_TYPES.items():
        if isinstance(data_type, cls):
            return name
    raise ValueError(f"cannot store {data_type.simpleString()} in a table")


def table_writer(columns: list[tuple[str, str]], output: OutputPlan, sink_id: str):  # noqa: ANN201 - a TableWriter
    from spark_jobs.tables import TableWriter

    sink = output.sink
    assert sink.kind == "table"
    return TableWriter(url=sink.url, table=sink.table, columns=columns, key=output.key, mode=output.mode,
                       sink_id=sink_id)


def table_sink_id(stream: str, output: str, checkpoint_query_id: str | None) -> str:
    """Batch ids start again at 0 in a new checkpoint, so the ledger names the sink by its
    output and the checkpoint's query id: a reset checkpoint never skips real batches."""
    return f"{stream}.{output}@{checkpoint_query_id}"


def _foreach_table_batch(frame: DataFrame, stream: str, output: OutputPlan) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function of a table sink; its writer is made at the first batch,
    when the checkpoint (and so its query id) exists."""
    columns = [(f.name, spec_type(f.dataType)) for f in frame.schema.fields]
    table_writer(columns, output, "unstarted").ensure_table()
    writers: list[Any] = []

    def write(batch: DataFrame, batch_id: int) -> None:
        if not writers:
            writers.append(table_writer(columns, output, table_sink_id(stream, output.name,
                                                                       query_id(output.checkpoint))))
        writer = writers[0]
        names = [c for c, _ in columns]
        rows = [tuple(r[n] for n in names) for r in batch.select(*names).collect()]  # one job, every task at once
        fence()  # only while this driver holds the stream (spark_jobs.lease)
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
    checkpoint: str
    frame: DataFrame
    writer: DataStreamWriter
    #: runs Spark's batches without data, which only move the watermark (``_start``)
    no_data_batches: bool = True


def accepted_stream(spark: SparkSession, ingestion: IngestionPlan) -> DataFrame:
    """The accepted-rows table as a streaming source: only batches in its commit log, all
    of them at each trigger (see the module's note), watermarked like the ingestion."""
    Path(ingestion.accepted).mkdir(parents=True, exist_ok=True)
    df = spark.readStream.schema(ingestion.accepted_ddl).format("parquet").load(ingestion.accepted)
    if ingestion.event_time is not None:
        df = df.withWatermark(ingestion.event_time.column, ingestion.event_time.watermark)
    return df


def _ingest_query(spark: SparkSession, plan: StreamPlan, trigger: Trigger,
                  on_batch: Callable[[dict[str, Any]], None] | None) -> PlannedQuery:
    ingestion = plan.ingestion
    assert ingestion is not None
    frame = ingest.decided(plan, ingest.read_source(spark, plan.source))
    writer = (frame.writeStream.queryName(ingestion.query_name)
              .option("checkpointLocation", ingestion.checkpoint)
              .foreachBatch(ingest.IngestBatch(spark, plan, on_batch)))
    return PlannedQuery(INGEST_QUERY, ingestion.checkpoint, frame, _with_trigger(writer, trigger))


def _output_query(spark: SparkSession, plan: StreamPlan, output: OutputPlan, trigger: Trigger) -> PlannedQuery:
    if output.reads_source or plan.ingestion is None:
        source = ingest.read_source(spark, plan.source)
    else:
        source = accepted_stream(spark, plan.ingestion)
    frame = output_frame(source, plan, output)
    sink = output.sink
    if sink.kind == "parquet":  # one file per partition value per micro-batch
        if sink.partition_by:
            frame = frame.repartition(*sink.partition_by)
        else:  # an aggregation's few rows: its stateful tasks stay parallel, one task writes
            frame = frame.repartition(1) if isinstance(output.query, Aggregation) else frame.coalesce(1)
    writer = frame.writeStream.queryName(output.query_name).outputMode(output.mode)
    writer = writer.option("checkpointLocation", output.checkpoint)
    if sink.kind == "parquet":
        writer = writer.format("parquet").option("path", sink.path)
        if sink.partition_by:
            writer = writer.partitionBy(*sink.partition_by)
    elif sink.kind == "table":
        writer = writer.foreachBatch(_foreach_table_batch(frame, plan.stream, output))
    elif sink.kind == "console":
        writer = writer.format("console").option("truncate", False)
    elif sink.kind == "memory":
        writer = writer.format("memory")
    return PlannedQuery(output.name, output.checkpoint, frame, _with_trigger(writer, trigger),
                        no_data_batches=output.emits_by_watermark)


def plan_queries(spark: SparkSession, plan: StreamPlan, trigger: Trigger | None = None,
                 on_batch: Callable[[dict[str, Any]], None] | None = None) -> list[PlannedQuery]:
    """Build (but do not start) the ingestion and every output query; ingestion first. The
    output the ingestion serves has none: the ingestion's accepted rows are its sink."""
    planned = []
    if plan.ingestion is not None:
        planned.append(_ingest_query(spark, plan, trigger or plan.ingestion.trigger, on_batch))
    for output in plan.queried_outputs:
        planned.append(_output_query(spark, plan, output, trigger or output.trigger))
    return planned


def _refuse_old_layout(spec: StreamSpec, layout: Layout) -> None:
    old = Path(layout.checkpoint_root) / "_quarantine"
    if old.exists():
        raise RuntimeError(
            f"stream {spec.name}: the checkpoint {layout.checkpoint_root} was written when every output parsed the "
            f"input itself ({old} exists); its outputs cannot resume from the accepted-rows table. Move the "
            "checkpoint aside together with the stream's sinks and quarantine to reprocess from the input.")


def _refuse_unserved_layout(spec: StreamSpec, layout: Layout) -> None:
    """A served output's sink must not mix with what its own query wrote before.

    Before the ingestion served an output, that output had its own query (and
    checkpoint) writing its sink, with batch ids of its own in the sink's commit log, and
    the accepted rows lived in ``accepted/<stream>``, where the other outputs' checkpoints
    point. Resuming would have the ingestion skip or interleave batches in that log and
    the other outputs read a table they have never seen, so such a checkpoint is refused.
    """
    served = spec.served_output
    if served is None:
        return
    sink = layout.accepted
    move = (f"Move aside the checkpoint {layout.checkpoint_root} together with the stream's sinks (including {sink}) "
            "and quarantine to reprocess from the input, or keep the output written by its own query by making it "
            "differ from the accepted rows (e.g. its columns or partitioning).")
    own = Path(layout.checkpoint(served.name))
    if own.exists():
        raise RuntimeError(
            f"stream {spec.name}: output {served.name} is now written by the ingestion (its sink {sink} is the "
            f"accepted-rows table), but its checkpoint {own} from when it had a query of its own exists. {move}")
    old = Path(layout.data(own_accepted_path(spec)))
    if str(old) != sink and old.exists() and (sink_last_batch(old) is not None or any(old.iterdir())):
        raise RuntimeError(
            f"stream {spec.name}: its accepted rows now live in the sink of output {served.name} ({sink}), but the "
            f"accepted-rows table {old} of the earlier layout holds data. {move} Move {old} aside as well.")


def _refuse_moved_accepted_rows(plan: StreamPlan, layout: Layout) -> None:
    """The accepted-rows table must stay where the ingestion's checkpoint wrote it.

    A spec edit can move it: an output the ingestion served stops qualifying (or starts
    to), so the accepted rows would go to another folder while the ingestion resumes
    from its checkpoint, and the outputs would read a table missing every batch before.
    The plan the last start wrote (``_control/plan.json``) says where they went."""
    if plan.ingestion is None or not layout.plan_file.exists():
        return
    try:
        before = (json.loads(layout.plan_file.read_text(encoding="utf-8")).get("ingestion") or {}).get("accepted")
    except (OSError, ValueError):
        return  # an unreadable plan says nothing; the start writes a new one
    if before and before != plan.ingestion.accepted and last_batch(plan.ingestion.checkpoint, "commits") is not None:
        raise RuntimeError(
            f"stream {plan.stream}: its accepted rows were written to {before} (see {layout.plan_file}), but with "
            f"this spec they would go to {plan.ingestion.accepted}, while the ingestion resumes from its checkpoint "
            f"{plan.ingestion.checkpoint}; the outputs would miss every earlier batch. Restore the spec's pass-through "
            f"output, or move aside the checkpoint {layout.checkpoint_root} together with the stream's sinks "
            f"(including {before}) and quarantine to reprocess from the input.")


def resolve_plan(spark: SparkSession, spec: StreamSpec, layout: Layout) -> StreamPlan:
    """The stream's plan with everything known, also the columns of its transform's result
    (Spark's analysis; a transform Spark rejects raises :class:`SpecError`)."""
    return compile_plan(spec, layout, _transformed(spark, spec, layout))


def _transformed(spark: SparkSession, spec: StreamSpec, layout: Layout) -> Transformed | None:
    if spec.transform is None:
        return None
    from spark_jobs.check import transform_result

    transformed, problems = transform_result(spark, spec, layout.transforms_dir)
    if problems:
        raise SpecError(layout.spec_dir / f"{spec.name}.yaml", problems)
    return transformed


def compile_for_start(spec: StreamSpec, layout: Layout, transformed: Transformed | None = None) -> StreamPlan:
    """The stream's plan, once its checkpoint is known to be of this layout (``transformed``:
    the stream's transform as Spark analyzed it)."""
    _refuse_old_layout(spec, layout)
    _refuse_unserved_layout(spec, layout)
    plan = compile_plan(spec, layout, transformed)
    _refuse_moved_accepted_rows(plan, layout)
    return plan


#: Spark runs a batch without data after each batch that moved the watermark, to emit what
#: the watermark closed and to evict state. An output whose windows the watermark emits
#: needs it (``OutputPlan.emits_by_watermark``), and so does the ingestion: its
#: batches record the watermark that closes the served output's periods for validation and
#: lets the landing files be archived. The other outputs run none, which saves half the
#: batches of a processing-time stream, each with every per-batch cost (planning, commits,
#: the sinks' logs).
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def _start(spark: SparkSession, planned: PlannedQuery) -> StreamingQuery:
    """Start one query, with or without batches without data (a query runs in a copy of
    the session made at its start, so the setting stays with it)."""
    if planned.no_data_batches:
        return planned.writer.start()
    before = spark.conf.get(NO_DATA_BATCHES)
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        return planned.writer.start()
    finally:
        spark.conf.set(NO_DATA_BATCHES, before)


def start(spark: SparkSession, spec: StreamSpec, layout: Layout, trigger: Trigger | None = None,
          on_batch: Callable[[dict[str, Any]], None] | None = None,
          only: Callable[[str], bool] | None = None, plan: StreamPlan | None = None) -> dict[str, StreamingQuery]:
    """Start the queries (``only``: those whose name it accepts); if one cannot start, stop
    the ones already started. ``plan``: the spec's plan, if already compiled."""
    plan = plan or compile_for_start(spec, layout, _transformed(spark, spec, layout))
    return start_planned(spark, plan_queries(spark, plan, trigger, on_batch), only)


def start_planned(spark: SparkSession, planned: list[PlannedQuery],
                  only: Callable[[str], bool] | None = None) -> dict[str, StreamingQuery]:
    """Start queries built by :func:`plan_queries` (``only``: those whose name it accepts); if one
    cannot start, stop the ones already started."""
    queries: dict[str, StreamingQuery] = {}
    try:
        for p in planned:
            if only is not None and not only(p.name):
                continue
            queries[p.name] = _start(spark, p)
            log.info("started query %s (id %s) checkpoint %s", p.name, queries[p.name].id, p.checkpoint)
    except Exception:
        for q in queries.values():
            q.stop()
        raise
    return queries


def start_ingestion_first(spark: SparkSession, planned: list[PlannedQuery],
                          wait_seconds: float) -> dict[str, StreamingQuery]:
    """Start the ingestion, then the outputs once it has finished its first trigger (or after
    ``wait_seconds``): a standby taking a stream over reaches its first commit sooner when the
    outputs, which replay their own batch and follow the ingestion's commits anyway, do not
    compete with it for the first seconds."""
    queries = start_planned(spark, planned, only=lambda name: name == INGEST_QUERY)
    ingestion = queries.get(INGEST_QUERY)
    deadline = time.monotonic() + wait_seconds
    while (ingestion is not None and ingestion.isActive and ingestion.lastProgress is None
           and time.monotonic() < deadline):
        ingestion.awaitTermination(0.05)
    try:
        return queries | start_planned(spark, planned, only=lambda name: name != INGEST_QUERY)
    except Exception:
        for q in queries.values():
            q.stop()
        raise


def _await_all(queries: dict[str, StreamingQuery], timeout_seconds: float) -> None:
    try:
        for q in queries.values():
            q.awaitTermination(timeout_seconds)
            if q.exception() is not None:
                raise q.exception()
    finally:
        for q in queries.values():
            q.stop()


def run_available_now(spark: SparkSession, spec: StreamSpec, layout: Layout, timeout_seconds: float = 300,
                      on_batch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, StreamingQuery]:
    """Process what is waiting (available-now trigger): the ingestion first, then every
    output over what it committed. Returns the finished queries; a failure is raised."""
    once = Trigger(available_now=True)
    plan = compile_for_start(spec, layout, _transformed(spark, spec, layout))
    finished = start(spark, spec, layout, once, on_batch, only=lambda name: name == INGEST_QUERY, plan=plan)
    _await_all(finished, timeout_seconds)
    outputs = start(spark, spec, layout, once, on_batch, only=lambda name: name != INGEST_QUERY, plan=plan)
    _await_all(outputs, timeout_seconds)
    return {**finished, **outputs}
