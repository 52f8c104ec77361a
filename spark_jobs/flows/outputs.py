"""An output's flow: its query over the accepted rows (or the source itself, for a
continuous output) written to its sink. The output the ingestion writes itself has none."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_jobs import frames
from spark_jobs.plan import (
    ConsoleDataset,
    DeltaDataset,
    FilesDataset,
    KafkaDataset,
    MemoryDataset,
    OutputPlan,
    ParquetDataset,
    StreamPlan,
    TableDataset,
)
from spark_jobs.sinks.delta import foreach_delta_batch
from spark_jobs.sinks.kafka import foreach_kafka_batch
from spark_jobs.sinks.table import foreach_table_batch
from spark_jobs.stream_spec.models import Aggregation

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
    if isinstance(sink, FilesDataset):  # one file per partition value per micro-batch
        if sink.partition_by:
            frame = frame.repartition(*sink.partition_by)
        else:  # an aggregation's few rows: its stateful tasks stay parallel, one task writes
            frame = frame.repartition(1) if isinstance(output.query, Aggregation) else frame.coalesce(1)
    writer = frame.writeStream.queryName(output.query_name).outputMode(output.mode)
    writer = writer.option("checkpointLocation", output.checkpoint)
    return frame, WRITERS[type(sink)](writer, frame, plan, output)


def _parquet(writer: DataStreamWriter, _frame: DataFrame, _plan: StreamPlan, output: OutputPlan) -> DataStreamWriter:
    writer = writer.format("parquet").option("path", output.sink.path)
    return writer.partitionBy(*output.sink.partition_by) if output.sink.partition_by else writer


def _delta(writer: DataStreamWriter, _frame: DataFrame, plan: StreamPlan, output: OutputPlan) -> DataStreamWriter:
    return writer.foreachBatch(foreach_delta_batch(plan.stream, output))


def _table(writer: DataStreamWriter, frame: DataFrame, plan: StreamPlan, output: OutputPlan) -> DataStreamWriter:
    return writer.foreachBatch(foreach_table_batch(frame, plan.stream, output))


def _kafka(writer: DataStreamWriter, _frame: DataFrame, plan: StreamPlan, output: OutputPlan) -> DataStreamWriter:
    return writer.foreachBatch(foreach_kafka_batch(plan.stream, output))


def _console(writer: DataStreamWriter, *_: object) -> DataStreamWriter:
    return writer.format("console").option("truncate", False)


def _memory(writer: DataStreamWriter, *_: object) -> DataStreamWriter:
    return writer.format("memory")


#: how a flow writes each kind of dataset: one function per dataset class
WRITERS: dict[type, Callable[..., DataStreamWriter]] = {
    ParquetDataset: _parquet, DeltaDataset: _delta, TableDataset: _table, KafkaDataset: _kafka,
    ConsoleDataset: _console, MemoryDataset: _memory,
}
