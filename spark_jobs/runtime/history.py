"""A stream's recent history, for the charts of its page: bounded, downsampled, beside the checkpoint.

``<checkpoint root>/_events/history.sqlite`` holds numbers over time, folded from the events
the driver writes to its progress log (:class:`~spark_jobs.runtime.progress.EventLog` hands every event
to :meth:`History.fold`), and from the samples the supervisor takes (:meth:`History.sample`:
the backlog, which only a look at the landing directory shows). Each number is kept twice:

* as recorded (one point per batch or sample) for :data:`RAW_KEEP_SECONDS` (3 hours), which
  the 15-minute and 1-hour views draw;
* per minute (sum, count, maximum and last value of the minute) for :data:`MINUTE_KEEP_SECONDS`
  (48 hours), which the 24-hour view draws.

Older points are deleted as new ones come, so the file stays bounded (a few MB for a stream
with a handful of queries, whatever its age). Writing never fails the caller: a problem with
the file is logged once and the point is lost, not the batch.

No pyspark here: the Airflow side reads the history too.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_jobs.runtime.clock import epoch_seconds
from spark_jobs.stream_spec.models import duration_seconds

log = logging.getLogger(__name__)

RAW = 0
MINUTE = 60
RAW_KEEP_SECONDS = 3 * 3600
MINUTE_KEEP_SECONDS = 48 * 3600
#: the stream as a whole (a sample of the supervisor), not one of its queries
STREAM = ""

SCHEMA = """
CREATE TABLE IF NOT EXISTS points (
    tier INTEGER NOT NULL,   -- 0: as recorded; 60: per minute (at = the minute's start)
    at REAL NOT NULL,        -- seconds since the epoch
    query TEXT NOT NULL,     -- the query ('_ingest', an output's name), or '' for the stream
    metric TEXT NOT NULL,
    sum REAL NOT NULL, n INTEGER NOT NULL, max REAL NOT NULL, last REAL NOT NULL,
    PRIMARY KEY (tier, query, metric, at)
) WITHOUT ROWID;
"""

#: what the charts draw, and where each number comes from
METRICS = {
    "input_rows": "rows a batch read",
    "input_rps": "input rows per second (Spark: rows arrived per second since the last batch)",
    "processed_rps": "processed rows per second (Spark: rows per second of batch time)",
    "batch_ms": "a batch's duration (Spark: triggerExecution)",
    "lag_s": "event-time lag: when the batch ran minus its watermark, in seconds",
    "state_rows": "rows held in state",
    "state_bytes": "bytes the state store holds in memory (Spark: memoryUsedBytes of the batch's state operators)",
    "sink_rows": "rows the batch wrote to its sink",
    "classified": "rows the ingestion classified (after deduplication): accepted, quarantined or late",
    "accepted": "rows the ingestion accepted",
    "quarantined": "rows the ingestion quarantined",
    "late": "rows the ingestion dropped as late",
    "duplicates": "rows the ingestion dropped as duplicates",
    "backlog_files": "files landed and not yet taken (a sample of the supervisor)",
    "backlog_bytes": "bytes of those files",
    "backlog_rows": "rows waiting, estimated from the files waiting and the rows per file so far",
    "backlog_records": "a Kafka source's records behind the broker's end offsets, from the checkpoint (a sample of "
                       "the supervisor)",
    "offsets_behind": "Spark's own count of a Kafka source's records behind (maxOffsetsBehindLatest of a batch)",
}


@dataclass(frozen=True)
class Point:
    at: float
    sum: float
    n: int
    max: float
    last: float

    @property
    def mean(self) -> float:
        return self.sum / self.n if self.n else 0.0


def values_of(event: dict[str, Any]) -> tuple[str | None, dict[str, float]]:
    """The query an event of the progress log is about, and the numbers it gives the history."""
    kind, query = event.get("event"), event.get("query")
    values: dict[str, float] = {}
    if kind == "progress":
        values["input_rows"] = event.get("input_rows") or 0
        for name, key in (("input_rps", "input_rows_per_second"), ("processed_rps", "processed_rows_per_second")):
            if isinstance(event.get(key), int | float):
                values[name] = event[key]
        duration = (event.get("duration_ms") or {}).get("triggerExecution")
        if isinstance(duration, int | float):
            values["batch_ms"] = duration
        ran, watermark = epoch_seconds(event.get("timestamp")), epoch_seconds(event.get("watermark"))
        if ran is not None and watermark:  # a watermark of 0 (the epoch) is none yet
            values["lag_s"] = max(0.0, ran - watermark)
        values["state_rows"] = event.get("state_rows") or 0
        if isinstance(event.get("state_bytes"), int | float):  # events written before it was kept have none
            values["state_bytes"] = event["state_bytes"]
        if (event.get("sink_rows") or -1) >= 0:
            values["sink_rows"] = event["sink_rows"]
        if event.get("dropped_duplicates"):
            values["duplicates"] = event["dropped_duplicates"]
        behind = [s["metrics"]["maxOffsetsBehindLatest"] for s in event.get("sources") or []
                  if isinstance(s, dict) and "maxOffsetsBehindLatest" in (s.get("metrics") or {})]
        if behind:
            values["offsets_behind"] = max(float(b) for b in behind)
    elif kind == "ingested":
        for name, key in (("classified", "rows"), ("accepted", "accepted"), ("quarantined", "quarantined"),
                          ("late", "late")):
            if isinstance(event.get(key), int | float):
                values[name] = event[key]
    elif kind == "execution_decision" and isinstance(event.get("rate"), int | float):  # an adaptive stream's
        return STREAM, {"continuous": 1.0 if event.get("mode") == "continuous" else 0.0, "arrival_rate": event["rate"]}
    elif kind in ("driver_started", "rescaled") and isinstance(event.get("per_trigger"), int | float):
        every = event.get("processing_time")  # and how often (sizing by lag)
        return STREAM, {"per_trigger_applied": event["per_trigger"],  # what a micro-batch may take
                        **({"trigger_applied_s": duration_seconds(every)} if isinstance(every, str) else {})}
    elif kind == "sizing_decision" and isinstance(event.get("per_trigger"), int | float):  # execution.sizing's
        return STREAM, {"per_trigger_recommended": event["per_trigger"],
                        **{name: event[key] for name, key in (("demand_per_s", "demand_per_s"),
                                                              ("trigger_recommended_s", "trigger_seconds"))
                           if isinstance(event.get(key), int | float)}}
    return (query if isinstance(query, str) else None), values


class History:
    """The history file of one stream (``Layout.history_file``)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._failed = False
        self._pruned_at = 0.0
        self._created = False  # the table, by this instance (once, not on every event)

    @contextmanager
    def _db(self, write: bool) -> Iterator[sqlite3.Connection]:
        if write and not self._created:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        if write:
            conn = sqlite3.connect(self.path, timeout=10)
        else:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=10)
        with closing(conn):
            if write and not self._created:
                conn.executescript(SCHEMA)
                self._created = True
            with conn:  # one transaction
                yield conn

    # -- writing

    def fold(self, event: dict[str, Any]) -> None:
        """Add what an event of the progress log says (progress, ingested); others add nothing."""
        query, values = values_of(event)
        if query is not None and values:
            self.record(query, values, at=event.get("logged_at") or time.time())

    def sample(self, values: dict[str, float], at: float | None = None) -> None:
        """A sample of the stream as a whole (the supervisor's look at its backlog)."""
        self.record(STREAM, values, at=time.time() if at is None else at)

    def record(self, query: str, values: dict[str, float], at: float) -> None:
        try:
            with self._db(write=True) as db:
                minute = at - at % MINUTE
                for metric, value in values.items():
                    value = float(value)
                    db.execute("INSERT OR REPLACE INTO points VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
                               (RAW, at, query, metric, value, value, value))
                    db.execute("INSERT INTO points VALUES (?, ?, ?, ?, ?, 1, ?, ?) ON CONFLICT DO UPDATE SET "
                               "sum = sum + excluded.sum, n = n + 1, max = MAX(max, excluded.max), last = excluded.last",
                               (MINUTE, minute, query, metric, value, value, value))
                if at - self._pruned_at >= MINUTE:
                    self._pruned_at = at
                    db.execute("DELETE FROM points WHERE tier = ? AND at < ?", (RAW, at - RAW_KEEP_SECONDS))
                    db.execute("DELETE FROM points WHERE tier = ? AND at < ?", (MINUTE, at - MINUTE_KEEP_SECONDS))
        except (sqlite3.Error, OSError) as exc:
            self._created = False  # the file may have gone: the next write makes it again
            if not self._failed:
                self._failed = True
                log.warning("the stream's history (%s) cannot be written, its charts will have gaps: %s",
                            self.path, exc)

    # -- reading

    @staticmethod
    def tier_for(since: float, until: float) -> int:
        """As recorded when the range is within what that tier keeps, else per minute."""
        return RAW if until - since <= RAW_KEEP_SECONDS and since >= time.time() - RAW_KEEP_SECONDS else MINUTE

    def series(self, since: float, until: float | None = None, tier: int | None = None,
               metrics: Iterable[str] | None = None) -> dict[tuple[str, str], list[Point]]:
        """Every (query, metric)'s points from ``since`` on, oldest first, of the tier given or
        :meth:`tier_for` the range."""
        if not self.path.exists():
            return {}
        until = time.time() if until is None else until
        tier = self.tier_for(since, until) if tier is None else tier
        sql = "SELECT query, metric, at, sum, n, max, last FROM points WHERE tier = ? AND at >= ? AND at <= ?"
        args: list[Any] = [tier, since - (MINUTE if tier == MINUTE else 0), until]
        if metrics is not None:
            wanted = list(metrics)
            sql += f" AND metric IN ({', '.join('?' * len(wanted))})"
            args += wanted
        out: dict[tuple[str, str], list[Point]] = {}
        try:
            with self._db(write=False) as db:
                for query, metric, at, total, n, top, last in db.execute(sql + " ORDER BY at", args):
                    out.setdefault((query, metric), []).append(Point(at, total, n, top, last))
        except sqlite3.Error as exc:
            log.warning("cannot read the stream's history %s: %s", self.path, exc)
        return out

    def totals(self, since: float, until: float | None = None) -> dict[tuple[str, str], float]:
        """Every (query, metric)'s sum over the range (the points :meth:`series` gives): rows in and
        out of each part of the stream. Summed by SQLite: a scrape of the metrics asks every 15 s."""
        return {(query, metric): total for query, metric, total in
                self._grouped("SUM(sum)", since, until)}

    def latest(self, since: float, until: float | None = None) -> dict[tuple[str, str], Point]:
        """Every (query, metric)'s newest point within the range (of the points :meth:`series` gives)."""
        # SQLite takes a bare column's value from the row that MAX() picked
        return {(query, metric): Point(at, total, n, top, last) for query, metric, at, total, n, top, last in
                self._grouped("MAX(at), sum, n, max, last", since, until)}

    def _grouped(self, columns: str, since: float, until: float | None) -> list[tuple[Any, ...]]:
        if not self.path.exists():
            return []
        until = time.time() if until is None else until
        tier = self.tier_for(since, until)
        sql = (f"SELECT query, metric, {columns} FROM points WHERE tier = ? AND at >= ? AND at <= ? "
               "GROUP BY query, metric")
        try:
            with self._db(write=False) as db:
                return db.execute(sql, [tier, since - (MINUTE if tier == MINUTE else 0), until]).fetchall()
        except sqlite3.Error as exc:
            log.warning("cannot read the stream's history %s: %s", self.path, exc)
            return []
