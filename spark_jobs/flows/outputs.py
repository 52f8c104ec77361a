"""An output's flow: its query over the accepted rows (or the source itself, for a
continuous output) written to its sink. The output the ingestion writes itself has none."""

from __future__ import annotations

from typing import TYPE_CHECKING

from spark_jobs import frames
from spark_jobs.plan import OutputPlan, StreamPlan
from spark_jobs.sinks.delta import foreach_delta_batch
from spark_jobs.sinks.kafka import foreach_kafka_batch
from spark_jobs.sinks.table import foreach_table_batch
from spark_jobs.spec.models import Aggregation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter


def output_writer(spark: SparkSession, plan: StreamPlan, output: OutputPlan) -> tuple[DataFrame, DataStreamWriter]:
    """The output's query and its writer (without a trigger)."""
    if output.reads_source or plan.ingestion is None:
        source = frames.read_source(spark, plan.source)
    else:
        source = frames.accepted_stream(spark, plan.ingestion)
    frame = frames.output_frame(source, plan, output)
    sink = output.sink
    if sink.kind in ("parquet", "delta"):  # one file per partition value per micro-batch
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
    elif sink.kind == "delta":
        writer = writer.foreachBatch(foreach_delta_batch(plan.stream, output))
    elif sink.kind == "table":
        writer = writer.foreachBatch(foreach_table_batch(frame, plan.stream, output))
    elif sink.kind == "kafka":
        writer = writer.foreachBatch(foreach_kafka_batch(plan.stream, output))
    elif sink.kind == "console":
        writer = writer.format("console").option("truncate", False)
    elif sink.kind == "memory":
        writer = writer.format("memory")
    return frame, writer
