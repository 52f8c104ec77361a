"""Query progress as JSON events beside the checkpoint, for supervisors and reports.

One JSON object per line in ``<checkpoint root>/_events/progress.jsonl``. The file is
bounded: past ``max_bytes`` it is rotated to ``progress.jsonl.1`` (one generation kept),
so a stream that runs for months never fills the disk. Readers read both files. Every
event is also folded into the stream's history (:mod:`spark_jobs.runtime.history`), which keeps
its numbers for the charts far longer, downsampled.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.runtime.history import History

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 4 * 1024 * 1024


class EventLog:
    """Append-only JSON-lines file with size-bounded rotation; safe across threads."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES,
                 history: History | None = None, tags: dict[str, Any] | None = None):
        """``tags``: added to every event (a driver's lease epoch and host: who wrote it)."""
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.history = history
        self.tags = dict(tags or {})
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: dict[str, Any]) -> None:
        event = {"logged_at": time.time(), **self.tags, **event}
        line = json.dumps(event, default=str, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                size = 0
            if size and size + len(line) > self.max_bytes:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
        if self.history is not None:
            self.history.fold(event)


def read_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Events in order, the rotated generation first. A torn last line is skipped."""
    path = Path(path)
    for p in (path.with_name(path.name + ".1"), path):
        try:
            with open(p, encoding="utf-8") as f:
                for line in f:
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        continue
        except FileNotFoundError:
            continue


def batches_logged(path: str | os.PathLike[str], query: str, since: float, until: float | None = None) -> list[dict[str, Any]]:
    """The progress events of ``query``'s batches logged from ``since`` (to ``until``), in order."""
    return [e for e in read_events(path)
            if e.get("event") == "progress" and e.get("query") == query
            and isinstance(t := e.get("logged_at"), int | float) and since <= t and (until is None or t <= until)]


def rows_read(path: str | os.PathLike[str], query: str, since: float, until: float | None = None) -> int:
    """The rows ``query``'s batches read, by its progress events logged from ``since`` (to ``until``)."""
    return sum(int(e.get("input_rows") or 0) for e in batches_logged(path, query, since, until))


def summarize(progress: dict[str, Any]) -> dict[str, Any]:
    """The fields of a StreamingQueryProgress that the platform uses."""
    state = progress.get("stateOperators") or []
    sink = progress.get("sink") or {}
    return {
        "batch_id": progress.get("batchId"),
        "timestamp": progress.get("timestamp"),
        "input_rows": progress.get("numInputRows", 0),
        "input_rows_per_second": progress.get("inputRowsPerSecond"),
        "processed_rows_per_second": progress.get("processedRowsPerSecond"),
        "duration_ms": progress.get("durationMs", {}),
        "event_time": progress.get("eventTime", {}),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "state_rows": sum(s.get("numRowsTotal", 0) for s in state),
        "state_bytes": sum(s.get("memoryUsedBytes", 0) for s in state),
        "dropped_by_watermark": sum(s.get("numRowsDroppedByWatermark", 0) for s in state),
        "dropped_duplicates": sum((s.get("customMetrics") or {}).get("numDroppedDuplicateRows", 0) for s in state),
        "sink_rows": sink.get("numOutputRows", -1),
        "sources": [
            {k: s.get(k) for k in ("description", "startOffset", "endOffset", "latestOffset", "numInputRows",
                                    "metrics")}
            for s in progress.get("sources") or []
        ],
    }


class ProgressListener:
    """Spark's streaming query listener, writing start, progress, idle and termination events
    (``names`` maps Spark query names to the spec's output names).

    It implements Spark's Java interface for Python listeners itself and takes each event as
    its JSON, one call into the JVM. PySpark's ``StreamingQueryListener`` first converts every
    field of an event through Py4J, dozens of calls for a progress event, some of which fail in
    the JVM and have their error looked up class by class on the class path (a flight
    recording of a driver at a 1-second trigger found that thread in a sixth of its samples)."""

    def __init__(self, log: EventLog, stream: str, names: dict[str, str]):
        self.log, self.stream, self.names = log, stream, names
        self._wrapper: Any = None

    def add(self, spark: SparkSession) -> ProgressListener:
        """Listen to the session's queries; returns itself."""
        from pyspark import SparkContext
        from pyspark.java_gateway import ensure_callback_server_started

        ensure_callback_server_started(SparkContext._gateway)
        self._wrapper = SparkContext._jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(self)
        spark._jsparkSession.streams().addListener(self._wrapper)
        return self

    def remove(self, spark: SparkSession, drain_seconds: float = 10.0) -> None:
        """Stop listening, once the events posted so far reached it (up to ``drain_seconds``): the
        last batch's progress comes after its query ended."""
        if self._wrapper is None:
            return
        try:
            spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(int(drain_seconds * 1000))
        except Exception as exc:  # a timeout: what came later is not recorded
            log.warning("progress events still queued after %.0fs: %s", drain_seconds, str(exc).splitlines()[0])
        spark._jsparkSession.streams().removeListener(self._wrapper)
        self._wrapper = None

    def _output(self, name: str | None) -> str | None:
        return self.names.get(name or "", name)

    # Spark's interface: each method gets the event as a Java object
    def onQueryStarted(self, jevent: Any) -> None:
        event = json.loads(jevent.json())
        self.log.write({"event": "started", "stream": self.stream, "query": self._output(event.get("name")),
                        "id": event.get("id"), "run_id": event.get("runId"), "timestamp": event.get("timestamp")})

    def onQueryProgress(self, jevent: Any) -> None:
        progress = json.loads(jevent.json())["progress"]
        self.log.write({"event": "progress", "stream": self.stream, "query": self._output(progress.get("name")),
                        "id": progress.get("id"), "run_id": progress.get("runId"), **summarize(progress)})

    def onQueryIdle(self, jevent: Any) -> None:
        event = json.loads(jevent.json())
        self.log.write({"event": "idle", "stream": self.stream, "id": event.get("id"), "run_id": event.get("runId"),
                        "timestamp": event.get("timestamp")})

    def onQueryTerminated(self, jevent: Any) -> None:
        event = json.loads(jevent.json())
        self.log.write({"event": "terminated", "stream": self.stream, "id": event.get("id"),
                        "run_id": event.get("runId"), "exception": event.get("exception"),
                        "error_class": event.get("errorClassOnException")})

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]  # Py4J's
