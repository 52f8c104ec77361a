"""Spark's own file sink (Parquet, with its ``_spark_metadata`` log), driven from a
foreachBatch function: how the ingestion writes the accepted-rows table and the quarantine."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame

from spark_jobs.runtime.checkpoint import sink_files
from spark_jobs.runtime.lease import fence

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


class FileSinkWriter:
    """Spark's file sink (Parquet) driven from foreachBatch: the batch's files and its entry
    in ``_spark_metadata`` are written exactly once; a batch the log holds is skipped."""

    def __init__(self, spark: SparkSession, path: str, partition_by: list[str]):
        jvm = spark._jvm
        self._spark = spark
        utils = jvm.org.apache.spark.api.python.PythonUtils
        self.path = path
        self._sink = jvm.org.apache.spark.sql.execution.streaming.sinks.FileStreamSink(
            spark._jsparkSession, path, jvm.org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat(),
            utils.toSeq(list(partition_by)), utils.toScalaMap({}))
        # the same log as the sink's own (the same folder; written through the same checkpoint file manager)
        sinks = jvm.org.apache.spark.sql.execution.streaming.sinks
        log_path = jvm.org.apache.hadoop.fs.Path(path, sinks.FileStreamSink.metadataDir()).toString()
        self._log = sinks.FileStreamSinkLog(sinks.FileStreamSinkLog.VERSION(), spark._jsparkSession, log_path,
                                            jvm.scala.Option.empty())
        self._no_files = spark.sparkContext._gateway.new_array(sinks.SinkFileStatus, 0)
        #: whether the sink has committed a file (which gives readers the schema), known once asked
        self._has_file: bool | None = None

    def add_batch(self, batch_id: int, frame: DataFrame) -> None:
        fence()  # only while this driver holds the stream (spark_jobs.runtime.lease)
        self._sink.addBatch(batch_id, frame._jdf)
        self._has_file = True  # Spark's sink writes at least one file a batch

    def add_empty_batch(self, batch_id: int, schema: StructType) -> None:
        """Commit a batch without rows (of ``schema``): its entry in the log, naming no file.
        Spark's sink given an empty frame runs a job that writes one empty file, for the
        schema; that is done only while the sink has no file, so that readers find it."""
        if self._has_file is None:
            self._has_file = bool(sink_files(self.path))
        if not self._has_file:
            self.add_batch(batch_id, self._empty_frame(schema))
            return
        fence()
        latest = self._log.getLatestBatchId()
        if latest.isDefined() and latest.get() >= batch_id:  # committed before: a replayed batch
            return
        self._log.add(batch_id, self._no_files)

    def _empty_frame(self, schema: StructType) -> DataFrame:
        """No rows of ``schema``, made in the JVM (PySpark's ``createDataFrame`` would
        parallelize a Python list: Python tasks to write nothing)."""
        jss = self._spark._jsparkSession
        return DataFrame(jss.createDataFrame(self._spark._jvm.java.util.ArrayList(), jss.parseDataType(schema.json())),
                         self._spark)
