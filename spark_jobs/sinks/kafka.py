"""The Kafka sink: an output's rows as records of a topic, at least once.

Spark's Kafka writer is not transactional: a micro-batch replayed after a crash (its
records written, its commit not) is written again. So every record says which batch it
belongs to, in its headers (``stream``, ``output``, ``batch_id``), and a consumer that
remembers the batch ids it has read of an output drops the replay. The value is the row
as JSON; the key, the sink's ``key`` columns as JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from spark_jobs.plan import OutputPlan
from spark_jobs.runtime.lease import fence
from spark_jobs.sources.kafka import servers, source_options

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

#: the headers every record carries
STREAM_HEADER, OUTPUT_HEADER, BATCH_HEADER = "stream", "output", "batch_id"


def records(batch: DataFrame, stream: str, output: str, batch_id: int, key: list[str] | None) -> DataFrame:
    """A batch of result rows as Kafka records: key, value and headers."""
    from pyspark.sql import functions as F

    headers = F.array(*[F.struct(F.lit(name).alias("key"), F.lit(value).cast("binary").alias("value"))
                        for name, value in ((STREAM_HEADER, stream), (OUTPUT_HEADER, output),
                                            (BATCH_HEADER, str(batch_id)))])
    value = F.to_json(F.struct(*[F.col(c) for c in batch.columns]))
    record_key = F.to_json(F.struct(*[F.col(c) for c in key])) if key else F.lit(None).cast("string")
    return batch.select(record_key.alias("key"), value.alias("value"), headers.alias("headers"))


def foreach_kafka_batch(stream: str, output: OutputPlan) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function that writes an output's batches to its topic."""
    sink = output.sink
    assert sink.kind == "kafka" and sink.topic and sink.bootstrap_servers

    def write(batch: DataFrame, batch_id: int) -> None:
        fence()  # only while this driver holds the stream (spark_jobs.runtime.lease)
        options = {"kafka.bootstrap.servers": servers(sink.bootstrap_servers, f"outputs.{output.name}.sink"),
                   "topic": sink.topic, **source_options(sink.options)}
        records(batch, stream, output.name, batch_id, sink.key).write.format("kafka").options(**options).save()

    return write
