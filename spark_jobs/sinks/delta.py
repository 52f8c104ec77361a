"""The Delta Lake sink: an output's micro-batches as commits of a Delta table, exactly once.

Every batch is one commit that carries Delta's transaction marker (``txnAppId``,
``txnVersion``): the application is the output's streaming query (its id, kept in its
checkpoint, so that a new checkpoint is a new application whose batch ids start again), the
version its batch id. A batch replayed after a crash whose commit is already in the table's
log is skipped by Delta itself, as Delta's own streaming sink does; this one fences every
commit with the stream's lease first (``spark_jobs.runtime.lease``).

* append: the batch's rows are appended (partitioned as the sink says). A windowed result's
  batch is empty unless the watermark passed a window's end (most batches of a short
  trigger): such a batch makes no commit, as a commit costs about a second of the
  driver's time however few its rows;
* complete: the batch, which is the whole result, replaces the table;
* update: the batch is merged on the output's key: a row whose key is in the table replaces
  it, any other is inserted. Keys compare null-safely (a group may be null).

A commit that loses to a concurrent one (a compaction rewrote the files a MERGE or an
overwrite read: Delta's optimistic concurrency) is tried again, as the same batch.

Every commit's ``userMetadata`` names its stream, output, query, batch and lease epoch
(:func:`commit_metadata`): the table's history says which batch wrote each version, and a
validation that reads a version knows the last batch it holds (:func:`last_batch`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from spark_jobs.plan import OutputPlan
from spark_jobs.runtime.checkpoint import query_id
from spark_jobs.runtime.lease import fence, held_epoch
from spark_jobs.stream_spec.models import Aggregation

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)
T = TypeVar("T")

#: session settings through which Delta's MERGE takes a transaction marker and a commit's metadata
_TXN_APP, _TXN_VERSION = "spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion"
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


#: a commit retried this often when another commit conflicts with it (a batch's, a compaction's)
ATTEMPTS = 5
_CONFLICT = re.compile(r"Concurrent\w*Exception|MetadataChangedException|ProtocolChangedException")


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is Delta's optimistic concurrency refusing a commit (worth retrying)."""
    return bool(_CONFLICT.search(f"{type(exc).__name__} {exc}"))


def retry_conflicts(what: str, action: Any, attempts: int = ATTEMPTS) -> Any:
    """``action()``, again after a conflicting commit (at most ``attempts`` times in all)."""
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except Exception as exc:
            if attempt == attempts or not is_conflict(exc):
                raise
            log.warning("%s conflicted with a concurrent commit (attempt %d of %d); retrying: %s",
                        what, attempt, attempts, str(exc).splitlines()[0][:300])
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def commit_metadata(stream: str, output: str, query_id: str, batch_id: int) -> str:
    """What a commit says of itself (its ``userMetadata``), as JSON."""
    return json.dumps({"stream": stream, "output": output, "query": query_id, "batch_id": batch_id,
                       "epoch": held_epoch()}, sort_keys=True)


def committed_batches(spark: SparkSession, path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The table's versions written by a stream's batches, oldest first: ``version``,
    ``operation`` and what the commit said of itself (:func:`commit_metadata`). ``limit``:
    among its newest ``limit`` versions only (a table's history holds every commit of its
    log's retention, 30 days by default: tens of thousands for a stream of short triggers)."""
    return _batches(_history(spark, path, limit))


def _history(spark: SparkSession, path: str, limit: int | None) -> list[Any]:
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, path)
    history = table.history(limit) if limit is not None else table.history()
    return history.select("version", "operation", "userMetadata").collect()


def _batches(rows: list[Any]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        try:
            said = json.loads(row.userMetadata) if row.userMetadata else None
        except ValueError:
            said = None
        if isinstance(said, dict) and "batch_id" in said:
            out.append({"version": row.version, "operation": row.operation, **said})
    return sorted(out, key=lambda c: c["version"])


def latest_version(spark: SparkSession, path: str) -> int | None:
    """The table's newest version, or None if there is no table yet."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return None
    return int(DeltaTable.forPath(spark, path).history(1).collect()[0].version)


def read_version(spark: SparkSession, path: str, version: int) -> DataFrame:
    """The table as of ``version``: the same rows however often it is read, whatever was written since."""
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def _search_history(spark: SparkSession, path: str, pick: Callable[[list[Any]], T | None]) -> T | None:
    """``pick`` over the table's newest commits (newest first), reading more of them only until
    it finds what it looks for (usually among the newest) or the whole history is read."""
    limit = 16
    while True:
        rows = _history(spark, path, limit)
        found = pick(rows)
        if found is not None or len(rows) < limit:
            return found
        limit *= 8


def last_batch(spark: SparkSession, path: str, query_id: str | None, version: int) -> int | None:
    """The last batch of query ``query_id`` in the table as of ``version``."""
    def pick(rows: list[Any]) -> int | None:
        ids = [c["batch_id"] for c in _batches(rows) if c["version"] <= version and c.get("query") == query_id]
        return max(ids) if ids else None

    return _search_history(spark, path, pick)


def version_of_commit(spark: SparkSession, path: str, metadata: str) -> int | None:
    """The newest version whose commit's ``userMetadata`` is ``metadata``."""
    return _search_history(spark, path, lambda rows: next(
        (int(r.version) for r in rows if r.userMetadata == metadata), None))


def commit_time(spark: SparkSession, path: str, version: int) -> float | None:
    """When ``version`` was committed (epoch seconds), from its one commit file; None if the
    log no longer holds it (its retention passed)."""
    log = f"{path.rstrip('/')}/_delta_log/{version:020d}.json"
    try:
        lines = [r.value for r in spark.read.text(log).collect()]
    except Exception as exc:
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            return None
        raise
    for line in lines:
        action = json.loads(line)
        if "commitInfo" in action:
            return action["commitInfo"]["timestamp"] / 1000
    return None


def merge_condition(key: list[str]) -> str:
    """The MERGE condition of a batch (``s``) into the table (``t``) on ``key``, null-safe."""
    return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in key)


class DeltaWriter:
    """Writes an output's batches into its Delta table (see the module)."""

    def __init__(self, stream: str, output: OutputPlan):
        sink = output.sink
        assert sink.kind == "delta" and sink.path
        if output.mode == "update" and not output.key:
            raise ValueError(f"output {output.name}: update mode into a Delta table needs a key to merge on")
        self.stream, self.output, self.path = stream, output, sink.path
        self._query_id: str | None = None
        self._last_batch: int | None = None  # the last batch this writer saw
        query = output.query
        #: an append-mode window result: an empty batch makes no commit (see the module)
        self.skips_empty = output.mode == "append" and isinstance(query, Aggregation) and query.window is not None

    def query_id(self) -> str:
        """The output's streaming query, as its checkpoint names it (known from its first batch)."""
        if self._query_id is None:
            self._query_id = query_id(self.output.checkpoint) if self.output.checkpoint else None
            if self._query_id is None:
                raise RuntimeError(f"output {self.output.name}: no query id in checkpoint {self.output.checkpoint}")
        return self._query_id

    def app_id(self) -> str:
        """The transaction's application: the output's streaming query."""
        return f"{self.stream}.{self.output.name}@{self.query_id()}"

    def write(self, batch: DataFrame, batch_id: int) -> None:
        # A batch that may be a replay (the first after a start, or one seen before) may have its
        # commit in the table already: Delta then skips the write without running the batch. Its
        # stateful operators must run all the same (Spark checks that every state store committed
        # the batch), so it is computed first; a live stream's other batches are not.
        # A window result's batch is computed first as well, to know whether it has rows at all.
        replay = self._last_batch is None or batch_id <= self._last_batch
        computed = replay or self.skips_empty
        rows = None
        if computed:
            batch = batch.persist()
            rows = batch.count()
        try:
            if self.skips_empty and rows == 0:
                log.debug("batch %d of %s: no window closed, no commit", batch_id, self.output.name)
            else:  # a commit that conflicts with another (a compaction's) is tried again, as the same batch
                retry_conflicts(f"batch {batch_id} of {self.output.name} into {self.path}",
                                lambda: self._commit(batch, batch_id))
        finally:
            if computed:
                batch.unpersist()
        self._last_batch = batch_id

    def _commit(self, batch: DataFrame, batch_id: int) -> None:
        metadata = commit_metadata(self.stream, self.output.name, self.query_id(), batch_id)
        mode = self.output.mode
        fence()  # only while this driver holds the stream (spark_jobs.runtime.lease)
        if mode == "update" and self._exists(batch.sparkSession):
            self._merge(batch, batch_id, metadata)
            return
        writer = (batch.write.format("delta").mode("overwrite" if mode == "complete" else "append")
                  .option("txnAppId", self.app_id()).option("txnVersion", batch_id).option("userMetadata", metadata))
        if self.output.sink.partition_by:
            writer = writer.partitionBy(*self.output.sink.partition_by)
        writer.save(self.path)

    def _exists(self, spark: SparkSession) -> bool:
        from delta.tables import DeltaTable

        return DeltaTable.isDeltaTable(spark, self.path)

    def _merge(self, batch: DataFrame, batch_id: int, metadata: str) -> None:
        from delta.tables import DeltaTable

        # The batch's session is its query's own (Spark clones one per query): the marker
        # set here is seen by this MERGE alone, never by another output's batch.
        spark = batch.sparkSession
        conf = {_TXN_APP: self.app_id(), _TXN_VERSION: str(batch_id), _USER_METADATA: metadata}
        for key, value in conf.items():
            spark.conf.set(key, value)
        try:
            (DeltaTable.forPath(spark, self.path).alias("t")
             .merge(batch.alias("s"), merge_condition(self.output.key))
             .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
        finally:
            for key in conf:
                spark.conf.unset(key)


def create_table(spark: SparkSession, path: str, ddl: str, partition_by: list[str]) -> None:
    """The table, empty, with its columns and partitioning, unless it exists (a streaming
    reader needs one to start). Of two processes creating it at once, one commit wins."""
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, path):
        return
    try:
        spark.createDataFrame([], ddl).write.format("delta").partitionBy(*partition_by).mode("append").save(path)
    except Exception:
        if not DeltaTable.isDeltaTable(spark, path):
            raise


class DeltaAppender:
    """A streaming query's batches appended to a Delta table, each exactly once (Delta's
    transaction marker, the query being the application), fenced by the stream's lease:
    how the ingestion writes a Delta accepted-rows table. A batch without rows makes no
    commit (a commit costs about a second); readers know it from the query's checkpoint."""

    def __init__(self, stream: str, name: str, path: str, partition_by: list[str], checkpoint: str):
        self.stream, self.name, self.path = stream, name, path
        self.partition_by, self.checkpoint = list(partition_by), checkpoint
        self._query_id: str | None = None

    def add_batch(self, batch_id: int, frame: DataFrame) -> None:
        if frame.isEmpty():
            return
        if self._query_id is None:
            self._query_id = query_id(self.checkpoint)
            if self._query_id is None:
                raise RuntimeError(f"{self.name} of {self.stream}: no query id in checkpoint {self.checkpoint}")
        metadata = commit_metadata(self.stream, self.name, self._query_id, batch_id)
        writer = (frame.write.format("delta").mode("append").partitionBy(*self.partition_by)
                  .option("txnAppId", f"{self.stream}.{self.name}@{self._query_id}").option("txnVersion", batch_id)
                  .option("userMetadata", metadata))

        def commit() -> None:
            fence()  # only while this driver holds the stream (spark_jobs.runtime.lease)
            writer.save(self.path)

        retry_conflicts(f"batch {batch_id} of {self.name} into {self.path}", commit)

    def add_empty_batch(self, batch_id: int, schema: StructType) -> None:
        """A batch without rows makes no commit."""


def foreach_delta_batch(stream: str, output: OutputPlan) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function that writes an output's batches into its Delta table."""
    return DeltaWriter(stream, output).write
