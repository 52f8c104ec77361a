"""A stream's Spark streaming queries, built from its plan and started: the ingestion,
then one per output the ingestion does not write itself.

    landing files -> ingestion (spark_jobs.flows.ingestion) -> accepted-rows table, quarantine
    accepted-rows table (a streaming source, read through its commit log)
      -> per output: its query (spark_jobs.flows.outputs) -> sink

An output reads every accepted batch committed so far at each trigger (no per-trigger
file limit), so its batches are whole ingestion batches and its watermark follows the
ingestion's. Near the watermark an output can still drop a row the ingestion accepted
(the two watermarks advance at different batches); Spark counts such rows in the
output's progress. A continuous trigger (rate source, map-like outputs) cannot use a
file table between the stages; such an output reads the source itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spark_jobs.flows.ingestion import ingestion_writer
from spark_jobs.flows.outputs import output_writer
from spark_jobs.plan import StreamPlan
from spark_jobs.stream_spec.models import INGEST_FLOW, Trigger

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)


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


def plan_queries(spark: SparkSession, plan: StreamPlan, trigger: Trigger | None = None,
                 on_batch: Callable[[dict[str, Any]], None] | None = None,
                 outputs: Collection[str] | None = None) -> list[PlannedQuery]:
    """Build (but do not start) the ingestion's query and every output's; ingestion first.
    ``trigger``: instead of the plan's. The output the ingestion writes itself has none.
    ``outputs``: only those outputs' queries, and the ingestion's only if named (``INGEST_FLOW``)."""
    planned = []
    if plan.ingestion is not None and (outputs is None or INGEST_FLOW in outputs):
        frame, writer = ingestion_writer(spark, plan, on_batch)
        planned.append(PlannedQuery(INGEST_FLOW, plan.ingestion.checkpoint, frame,
                                    _with_trigger(writer, trigger or plan.ingestion.trigger)))
    for output in plan.outputs_with_flows:
        if outputs is not None and output.name not in outputs:
            continue
        frame, writer = output_writer(spark, plan, output)
        planned.append(PlannedQuery(output.name, output.checkpoint, frame,
                                    _with_trigger(writer, trigger or output.trigger),
                                    no_data_batches=output.emits_by_watermark))
    return planned


#: Spark runs a batch without data after each batch that moved the watermark, to emit what
#: the watermark closed and to evict state. An output whose windows the watermark emits
#: needs it (``OutputPlan.emits_by_watermark``), and so does the ingestion: its
#: batches record the watermark that closes the periods of the output the ingestion writes for validation and
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


def start(spark: SparkSession, plan: StreamPlan, trigger: Trigger | None = None,
          on_batch: Callable[[dict[str, Any]], None] | None = None,
          only: Callable[[str], bool] | None = None) -> dict[str, StreamingQuery]:
    """Start the plan's queries (``only``: those whose name it accepts); if one cannot
    start, stop the ones already started."""
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
    queries = start_planned(spark, planned, only=lambda name: name == INGEST_FLOW)
    ingestion = queries.get(INGEST_FLOW)
    deadline = time.monotonic() + wait_seconds
    while (ingestion is not None and ingestion.isActive and ingestion.lastProgress is None
           and time.monotonic() < deadline):
        ingestion.awaitTermination(0.05)
    try:
        return queries | start_planned(spark, planned, only=lambda name: name != INGEST_FLOW)
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


def run_available_now(spark: SparkSession, plan: StreamPlan, timeout_seconds: float = 300,
                      on_batch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, StreamingQuery]:
    """Process what is waiting (available-now trigger): the ingestion first, then every
    output over what it committed. Returns the finished queries; a failure is raised."""
    once = Trigger(available_now=True)
    finished = start(spark, plan, once, on_batch, only=lambda name: name == INGEST_FLOW)
    _await_all(finished, timeout_seconds)
    outputs = start(spark, plan, once, on_batch, only=lambda name: name != INGEST_FLOW)
    _await_all(outputs, timeout_seconds)
    return {**finished, **outputs}
