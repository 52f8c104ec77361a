"""The streams' figures for Prometheus: ``GET /streams/metrics`` (the route is in ``streamops.ui``).

Every scrape builds a registry of its own whose one collector turns what the Streams page
shows into Prometheus' text format (``prometheus_client``): each stream's status as
``ui.stream_status`` gives it (the checkpoint, the lease, the restart history, the standby
records, the last validation; a Kafka source's records behind as its supervisor last
measured them: no broker is asked, no Spark runs) and each flow's figures from the stream's
history (``spark_jobs.runtime.history``), over the last hour as the flow graph counts them
(``page_data.flow`` with ``range=1h``). So a scrape's figures are the page's at the same moment.

A flow is the ingestion (label ``flow="ingestion"``) or an output with a query of its own
(its name), as on the stream's page. :data:`METRICS` names and explains every metric; a
series whose figure is unknown (no batch committed yet, nothing validated yet, a file
source's records behind) is left out rather than given a made-up value.

Who may read them: a logged-in user, the streams whose DAG they may read (as the pages);
or a scraper that sends ``Authorization: Bearer <token>`` with the token configured in
``STREAMS_METRICS_TOKEN`` (or in the file ``STREAMS_METRICS_TOKEN_FILE`` names), which reads
every stream's metrics and nothing else. Without a configured token only the login works.
"""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from spark_jobs.plan import StreamPlan
from spark_jobs.runtime.clock import epoch_seconds
from spark_jobs.runtime.history import STREAM, History, Point
from spark_jobs.runtime.standby import READY, TAKING_OVER, WARMING
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.health import Status
from streamops.ui_guard import current_user

log = logging.getLogger(__name__)

#: where the app of ``streamops.ui`` serves the metrics (``/streams/metrics`` in Airflow's API server)
PATH = "/metrics"
#: the scrapers' token, or the file that holds it (the file wins if both are set)
TOKEN_ENV, TOKEN_FILE_ENV = "STREAMS_METRICS_TOKEN", "STREAMS_METRICS_TOKEN_FILE"
#: a shorter token is not used (a scraper's token that is easy to guess would open every stream's figures)
MIN_TOKEN_LENGTH = 16
#: the window of the row counts: the flow graph's 1-hour range
WINDOW_SECONDS = 3600.0
#: every status ``streams_status`` has a series for; ``unknown``: the checkpoint could not be read
STATUSES = (*(str(s) for s in Status), "unknown")
#: the states of a warm standby (``spark_jobs.runtime.standby``)
STANDBY_STATES = (WARMING, READY, TAKING_OVER)


@dataclass(frozen=True)
class Spec:
    """One metric: its name, what it says, its labels."""

    name: str
    help: str
    labels: tuple[str, ...] = ("stream",)


PER_FLOW = ("stream", "flow")
#: every metric the endpoint exports, all gauges (the figures are the page's: windows and latest
#: values, not counters since some start)
METRICS = (
    Spec("streams_status", "1 for the stream's current status, 0 for the others (streamops.health: starting, "
         "healthy, idle, lagging, stalled, dead, corrupt, blocked; unknown: its checkpoint cannot be read)",
         ("stream", "status")),
    Spec("streams_stopped_on_purpose", "1 while an operator's stop holds the stream (it stays stopped), else 0"),
    Spec("streams_driver_running", "1 while a live driver holds the stream's lease, else 0"),
    Spec("streams_last_committed_batch", "the id of the flow's last committed micro-batch", PER_FLOW),
    Spec("streams_last_commit_age_seconds", "seconds since the stream's newest committed batch (of any flow)"),
    Spec("streams_input_rows_per_second", "rows arrived per second, as the newest batch reported it"),
    Spec("streams_processed_rows_per_second", "rows processed per second of batch time, as the newest batch "
         "reported it"),
    Spec("streams_backlog_files", "a file source: files landed that the ingestion has not taken"),
    Spec("streams_backlog_bytes", "a file source: the bytes of those files"),
    Spec("streams_backlog_records", "a Kafka source: records behind the broker's end offsets, as its supervisor "
         "last measured them"),
    Spec("streams_backlog_measurement_age_seconds", "a Kafka source: seconds since its supervisor measured the "
         "records behind"),
    Spec("streams_watermark_timestamp_seconds", "the newest batch's watermark, in seconds since the epoch"),
    Spec("streams_batch_duration_seconds", "the flow's newest batch's duration (Spark's triggerExecution), within "
         "the last hour", PER_FLOW),
    Spec("streams_watermark_delay_seconds", "the flow's newest batch: when it ran minus its watermark, within the "
         "last hour", PER_FLOW),
    Spec("streams_state_rows", "rows the flow's state holds after its newest batch, within the last hour", PER_FLOW),
    Spec("streams_state_bytes", "bytes the flow's state store holds in memory after its newest batch (Spark's "
         "memoryUsedBytes), within the last hour", PER_FLOW),
    Spec("streams_read_rows_last_hour", "rows the flow read in the last hour", PER_FLOW),
    Spec("streams_accepted_rows_last_hour", "rows the ingestion accepted in the last hour", PER_FLOW),
    Spec("streams_quarantined_rows_last_hour", "rows the ingestion quarantined (malformed or invalid) in the last "
         "hour", PER_FLOW),
    Spec("streams_duplicate_rows_last_hour", "rows the ingestion dropped as duplicates in the last hour", PER_FLOW),
    Spec("streams_late_rows_last_hour", "rows the ingestion dropped as late (behind the watermark) in the last hour",
         PER_FLOW),
    Spec("streams_written_rows_last_hour", "rows the flow wrote to its sink in the last hour", PER_FLOW),
    Spec("streams_restarts_last_day", "driver starts in the last 24 hours, the stream's very first start not "
         "counted (the page's restarts)"),
    Spec("streams_failures_in_a_row", "failed driver runs since the last stable one (what the restart backoff "
         "counts)"),
    Spec("streams_standby", "the stream's warm standby drivers in each state (warming, ready, taking over); only "
         "for a stream whose spec asks for one", ("stream", "state")),
    Spec("streams_validation_ok", "1 if the stream's last validation passed, 0 if it failed"),
    Spec("streams_validation_age_seconds", "seconds since the stream's last validation"),
    Spec("streams_validation_units", "units the stream's last validation validated"),
    Spec("streams_validation_failed_units", "units that failed the stream's last validation"),
    Spec("streams_accounting_ok", "1 if the last validation found every input row accounted for, 0 if not"),
)
NAMES = frozenset(m.name for m in METRICS)

#: the history's row totals a flow's metrics take: (history metric, exported metric)
ROWS = (("input_rows", "streams_read_rows_last_hour"), ("accepted", "streams_accepted_rows_last_hour"),
        ("quarantined", "streams_quarantined_rows_last_hour"), ("duplicates", "streams_duplicate_rows_last_hour"),
        ("late", "streams_late_rows_last_hour"), ("sink_rows", "streams_written_rows_last_hour"))
#: what the ingestion made of the rows it read
OUTCOMES = frozenset({"accepted", "quarantined", "duplicates", "late"})
#: the history's newest values a flow's metrics take: (history metric, exported metric, scale)
LATEST = (("batch_ms", "streams_batch_duration_seconds", 0.001), ("lag_s", "streams_watermark_delay_seconds", 1.0),
          ("state_rows", "streams_state_rows", 1.0), ("state_bytes", "streams_state_bytes", 1.0))


def flow_label(query: str) -> str:
    """A flow's label: ``ingestion`` for the ingestion's query, else the output's name (as the page's)."""
    return "ingestion" if query == INGEST_FLOW else query


@dataclass
class StreamFigures:
    """What one stream's series are made of: its status (``ui.stream_status``) and its history's
    figures over the window."""

    plan: StreamPlan
    status: dict[str, Any]
    totals: dict[tuple[str, str], float]
    latest: dict[tuple[str, str], Point]


def figures(plan: StreamPlan, layout: Layout, status: dict[str, Any], now: float) -> StreamFigures:
    """A stream's figures at ``now``: ``status`` as ``ui.stream_status(plan, layout, now)`` gave it,
    and its history over the last hour (``layout.history_file``): totals as the flow graph sums
    them, and each (flow, metric)'s newest point."""
    history = History(layout.history_file)
    since = now - WINDOW_SECONDS
    return StreamFigures(plan, status, history.totals(since, now), history.latest(since, now))


class StreamsCollector(Collector):
    """The metrics of :data:`METRICS` for the streams given, at ``now``."""

    def __init__(self, streams: list[StreamFigures], now: float):
        self.streams, self.now = streams, now

    def collect(self) -> Iterator[Metric]:
        families = {m.name: GaugeMetricFamily(m.name, m.help, labels=list(m.labels)) for m in METRICS}
        for stream in self.streams:
            for name, labels, value in self._samples(stream):
                families[name].add_metric(labels, value)
        yield from families.values()

    def _samples(self, f: StreamFigures) -> Iterator[tuple[str, list[str], float]]:
        s, name, now, source = f.status, f.plan.stream, self.now, f.plan.source

        def number(value: object) -> float | None:
            return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

        def one(metric: str, value: object) -> Iterator[tuple[str, list[str], float]]:
            if (v := number(value)) is not None:
                yield metric, [name], v

        current = str(s.get("status", "unknown"))
        for status in STATUSES if current in STATUSES else (*STATUSES, current):
            yield "streams_status", [name, status], float(status == current)
        yield "streams_stopped_on_purpose", [name], float(bool(s.get("stopped_on_purpose")))
        yield "streams_driver_running", [name], float(s.get("driver_pid") is not None)
        committed = s.get("last_committed") or {}
        for query, batch in committed.items():
            if (v := number(batch)) is not None:
                yield "streams_last_committed_batch", [name, flow_label(query)], v
        yield from one("streams_last_commit_age_seconds", s.get("last_commit_age_seconds"))
        yield from one("streams_input_rows_per_second", s.get("input_rows_per_second"))
        yield from one("streams_processed_rows_per_second", s.get("processed_rows_per_second"))
        if source is not None and source.is_files:
            yield from one("streams_backlog_files", s.get("backlog_files"))
            yield from one("streams_backlog_bytes", s.get("backlog_bytes"))
        if source is not None and source.kafka is not None:
            yield from one("streams_backlog_records", s.get("backlog_records"))
            if (measured := number(s.get("backlog_measured_at"))) is not None:
                yield "streams_backlog_measurement_age_seconds", [name], max(0.0, now - measured)
        watermark = epoch_seconds(s.get("watermark")) if s.get("watermark") else None
        if watermark:  # the epoch itself is no watermark yet
            yield "streams_watermark_timestamp_seconds", [name], watermark

        queries = sorted({q for q, _ in (*f.totals, *f.latest) if q != STREAM} | set(committed),
                         key=lambda q: (q != INGEST_FLOW, q))
        for query in queries:
            flow = [name, flow_label(query)]
            for history_metric, metric, scale in LATEST:
                if (point := f.latest.get((query, history_metric))) is not None:
                    yield metric, flow, point.last * scale
            # rows read: every flow's; what became of them: the ingestion's; rows written: a flow's
            # whose batches report them (else the flow graph counts an absent figure as 0 rows)
            for history_metric, metric in ROWS:
                if history_metric in OUTCOMES:
                    wanted = query == INGEST_FLOW
                else:
                    wanted = history_metric == "input_rows" or (query, history_metric) in f.totals
                if wanted:
                    yield metric, flow, float(int(f.totals.get((query, history_metric), 0)))

        restarts = s.get("restarts_last_day")
        yield from one("streams_restarts_last_day", restarts)
        if restarts is not None:
            yield from one("streams_failures_in_a_row", s.get("failures_in_a_row"))
        if s.get("standby") is not None:
            states = [b.get("state") for b in s["standby"]]
            for state in (*STANDBY_STATES, *sorted({x for x in states if x not in STANDBY_STATES})):
                yield "streams_standby", [name, state], float(states.count(state))
        validation = s.get("validation")
        if validation:
            if validation.get("ok") is not None:
                yield "streams_validation_ok", [name], float(bool(validation["ok"]))
            if (at := epoch_seconds(validation.get("at"))) is not None:
                yield "streams_validation_age_seconds", [name], max(0.0, now - at)
            yield from one("streams_validation_units", validation.get("units"))
            yield from one("streams_validation_failed_units", validation.get("failed_units"))
            if validation.get("accounting_ok") is not None:
                yield "streams_accounting_ok", [name], float(bool(validation["accounting_ok"]))


def exposition(streams: list[StreamFigures], now: float) -> bytes:
    """The streams' metrics in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StreamsCollector(streams, now))
    return generate_latest(registry)


def response(streams: list[StreamFigures], now: float) -> Response:
    return Response(exposition(streams, now), media_type=CONTENT_TYPE_LATEST, headers={"Cache-Control": "no-store"})


# -- who may read them


class Scraper:
    """A caller that sent the metrics token: reads every stream's metrics, and nothing else."""

    def __repr__(self) -> str:
        return "metrics scraper (token)"


SCRAPER = Scraper()
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def configured_token() -> str | None:
    """The scrapers' token: the content of the file ``STREAMS_METRICS_TOKEN_FILE`` names, else
    ``STREAMS_METRICS_TOKEN`` (read at every request: a new token needs no restart). None if
    neither is set, the file cannot be read, or the token is shorter than ``MIN_TOKEN_LENGTH``."""
    path = os.environ.get(TOKEN_FILE_ENV, "").strip()
    if path:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            _warn_once(f"{TOKEN_FILE_ENV}: cannot read {path} ({exc}); no scraper token is accepted")
            return None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if token and len(token) < MIN_TOKEN_LENGTH:
        _warn_once(f"the metrics token is shorter than {MIN_TOKEN_LENGTH} characters; it is not accepted")
        return None
    return token or None


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    return header[7:].strip() if header.lower().startswith("bearer ") else None


async def reader(request: Request) -> object:
    """Who reads the metrics: :data:`SCRAPER` for the metrics token, else the caller Airflow
    authenticates (``ui_guard.current_user``: 401 logged out, 403 for a token that is neither)."""
    token, sent = configured_token(), _bearer(request)
    if token is not None and sent is not None and hmac.compare_digest(sent.encode(), token.encode()):
        return SCRAPER
    return await current_user(request)
