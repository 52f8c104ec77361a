"""What every driver of a stream does, the platform's own job (``spark_jobs.stream_job``) and
an existing application supervised as it is (``application:`` in a spec).

The supervisor (``streamops.supervisor``, run by ``streamops.operators.supervise``) and the
health sensors watch a driver through files beside its checkpoints, so whatever runs the
queries takes part the same way:

* it holds the stream's single-driver lease (``<checkpoint>/_control/lease/``), refreshed
  by a heartbeat, while it runs, and halts if it loses it (``spark_jobs.runtime.lease``);
* it writes progress events (``<checkpoint>/_events/progress.jsonl``): its start and
  stop, each query's progress, a query's failure (``spark_jobs.runtime.progress``);
* it stops its queries between micro-batches when the stop marker
  (``<checkpoint>/_control/stop``) appears or SIGTERM arrives, and exits 0 (a marker
  asking for an immediate stop halts it at once); a failed query makes it exit 1, so that
  the supervisor restarts it.

An application adds a few lines (:func:`supervised`)::

    from spark_jobs.runtime.driver import supervised

    with supervised(spark) as app:        # the lease, the events, the stop marker
        app.start("counts", counts.writeStream.outputMode("complete").format("parquet")
                  .option("path", "/data/counts"))   # queryName and checkpointLocation set
        app.run()                         # until the queries end, one fails, or a stop

Each query is named as the spec's ``application.queries`` declares and checkpointed at
``app.checkpoint(name)`` (:meth:`SupervisedApp.start` does both). The supervisor passes
the spec's path in ``STREAMS_APP_SPEC`` (and the data root in ``STREAMS_DATA_DIR``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.checkpoint import last_batch
from spark_jobs.runtime.history import History
from spark_jobs.runtime.lease import (
    DriverLease,
    LeaseHeld,
    halt,
    host_id,
)
from spark_jobs.runtime.progress import EventLog
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import (
    SpecError,
    StreamSpec,
    Supervision,
    duration_seconds,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

    from spark_jobs.upgrade import Release

log = logging.getLogger(__name__)
#: how a job's log lines look
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

EXIT_OK, EXIT_FAILED, EXIT_BAD_SPEC, EXIT_LEASE_HELD = 0, 1, 2, 3
#: an immediate stop (the marker): as SIGKILL would end it
EXIT_KILLED = 137
POLL_SECONDS = 0.5
GRACE_SECONDS = 120.0
#: The environment variable in which the supervisor passes an application its spec's path.
APP_SPEC_ENV = "STREAMS_APP_SPEC"


def first_line(exc: BaseException) -> str:
    """The line that says what went wrong: the first of Spark's message, or, for an error that the
    stream's own Python code raised in a batch (Spark gives its traceback), that error's last line."""
    text = str(getattr(exc, "desc", None) or exc).strip()
    if not text:
        return type(exc).__name__
    lines = text.splitlines()
    if "Traceback (most recent call last):" in text:
        raised = [line.strip() for line in lines if re.match(r"^\s*[A-Za-z_][\w.]*(Error|Exception)\b.*:", line)]
        if raised:
            return raised[-1]
    return lines[0]


def stop_between_batches(queries: dict[str, StreamingQuery], checkpoints: Mapping[str, str],
                         grace_seconds: float) -> None:
    """Stop each query while no micro-batch is running; after the grace period, stop anyway.

    Spark has no graceful stop of its own: ``query.stop()`` interrupts a running batch.
    So each query is stopped in a moment between two triggers. A batch that must be
    interrupted (the grace period ran out) is not lost: its offsets are logged and it is
    replayed from the checkpoint on restart, with the same exactly-once result. A query
    that falls behind its trigger starts its next batch the moment one ends, so that moment
    can be missed: a batch whose offsets were written as it was stopped is said so (it is
    replayed alike).
    """
    started = time.monotonic()
    deadline = started + grace_seconds
    for name, q in queries.items():
        while q.isActive and q.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.02)
        interrupted = q.isActive and q.status.get("isTriggerActive")
        q.stop()
        checkpoint = checkpoints[name]
        planned, committed = last_batch(checkpoint, "offsets"), last_batch(checkpoint, "commits")
        if interrupted:
            log.warning("query %s stopped during batch %s after %.0fs of waiting; the batch will be replayed "
                        "on restart", name, planned, time.monotonic() - started)
        elif planned != committed:
            log.warning("query %s: batch %s began as it was stopped; it will be replayed on restart", name, planned)
        else:
            log.info("query %s stopped between batches (last committed batch %s)", name, committed)


def request_stop(marker: Path, epoch: int | None, by: str, immediate: bool = False) -> None:
    """Ask the stream's driver of ``epoch`` (its lease's, spark_jobs.runtime.lease) to stop (the marker it
    polls): between micro-batches, or ``immediate``: at once, without committing more (the way to
    stop a driver on another machine, where no signal reaches it). ``by`` says who asked (the stop
    DAG's run, a killed supervisor's try), for the driver's log. A driver of another epoch, one
    that took the stream over since, ignores it."""
    write_atomically(marker, json.dumps({"mode": "immediate" if immediate else "graceful", "epoch": epoch, "by": by}))


def stop_asked(marker: Path, epoch: int, since: float = 0.0) -> tuple[str, str] | None:
    """``(mode, who asked)`` if the marker asks the driver holding ``epoch`` to stop (``graceful`` or
    ``immediate``), else None. A marker without an epoch (``touch``, by hand) is for the driver that
    held the stream when it was written: one that took the lease at ``since`` obeys it only if it
    was written after that."""
    try:
        text = marker.read_text()
        written = marker.stat().st_mtime
    except FileNotFoundError:
        return None
    try:
        asked = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        asked = {}
    if not isinstance(asked, dict):
        asked = {}
    if asked.get("epoch") is None and written < since:
        return None  # left from before this driver held the stream
    if asked.get("epoch") not in (None, epoch):
        return None
    return ("immediate" if asked.get("mode") == "immediate" else "graceful"), str(asked.get("by") or "by hand")


def supervise_queries(plan: StreamPlan, layout: Layout, queries: dict[str, StreamingQuery],
                      stop_requested: threading.Event, events: EventLog, lease: DriverLease,
                      grace_seconds: float = GRACE_SECONDS,
                      release: Release | None = None) -> tuple[int, str, bool]:
    """Wait until the queries finish, one fails, or a stop is asked for (the stop marker, for this
    driver's epoch of the ``lease``, or ``stop_requested``): (exit code, cause, stopped). An
    immediate stop halts the driver. ``plan``: the one the driver started with (its checkpoints).
    ``release``: given the running queries at each look, it may take some out (an upgrade's
    outputs, held while they are rebuilt) and put others in (those outputs, once swapped in)."""
    marker, stream = layout.stop_marker, plan.stream
    code, cause, stopped = EXIT_OK, "", False
    try:
        while True:
            if release is not None:
                release(queries)
            failed = [(n, q.exception()) for n, q in queries.items() if not q.isActive and q.exception() is not None]
            if failed:
                for name, exc in failed:
                    log.error("query %s failed: %s", name, first_line(exc))
                    events.write({"event": "driver_failed", "stream": stream, "query": name, "error": str(exc)[:2000]})
                code, cause = EXIT_FAILED, "; ".join(f"query {n}: {first_line(e)}" for n, e in failed)
                break
            if all(not q.isActive for q in queries.values()) and not (release is not None and release.holding):
                log.info("queries %s of %s finished", sorted(queries), stream)
                break
            asked = stop_asked(marker, lease.epoch, lease.since)
            if asked and asked[0] == "immediate":
                marker.unlink(missing_ok=True)
                events.write({"event": "driver_stopped", "stream": stream, "exit_code": EXIT_KILLED,
                              "immediate": True, "by": asked[1]})
                halt(f"stream {stream}: an immediate stop was asked for ({asked[1]})", EXIT_KILLED)
            if stop_requested.is_set() or asked:
                log.info("stop requested for %s (%s): stopping queries between batches", stream,
                         asked[1] if asked else "a signal")
                stop_between_batches(queries, plan.checkpoints, grace_seconds)
                marker.unlink(missing_ok=True)
                stopped = True
                break
            _await_any_end(queries, POLL_SECONDS)
    finally:
        for q in queries.values():
            if q.isActive:
                q.stop()
    return code, cause, stopped


def _await_any_end(queries: dict[str, StreamingQuery], seconds: float) -> None:
    """Wait until one of the queries ends (an available-now phase's last one: the next phase or the
    exit follows at once, not at the next look) or ``seconds`` passed. Spark's own wait raises a
    failed query's error, which the caller reads from the query itself."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import CapturedException

    if not queries:
        time.sleep(seconds)
        return
    manager = next(iter(queries.values()))._jsq.sparkSession().streams()
    try:
        manager.awaitAnyTermination(int(seconds * 1000))
    except (Py4JJavaError, CapturedException):  # as py4j raises it, or as pyspark converts it
        pass
    manager.resetTerminated()  # ended ones are seen by the caller; wait for the next


def log_to_stderr() -> None:
    """A job's logging: INFO and up on stderr, each line with its time and logger; py4j's at
    warnings only (at INFO it logs a line for each call from the JVM into Python, such as each
    progress event a listener takes)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def prepare_to_stop() -> threading.Event:
    """Turn SIGTERM and SIGINT into a stop request: the event :func:`supervise_queries` waits on.
    A stop marker left from an earlier driver is not this one's (:func:`stop_asked`)."""
    stop_requested = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s: stopping gracefully", signal.Signals(signum).name)
        stop_requested.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop_requested


class SupervisedApp:
    """An application's handle on its supervision (:func:`supervised`)."""

    def __init__(self, spark: SparkSession, plan: StreamPlan, layout: Layout, events: EventLog,
                 stop_requested: threading.Event, grace_seconds: float, lease: DriverLease):
        assert plan.application is not None
        self.spark, self.plan, self.layout, self.events, self.lease = spark, plan, layout, events, lease
        self.declared = plan.application.queries
        self.stop_requested, self.grace_seconds = stop_requested, grace_seconds
        self.queries: dict[str, StreamingQuery] = {}

    def checkpoint(self, query: str) -> str:
        """The checkpoint location of a declared query (``application.queries``)."""
        if query not in self.declared:
            raise ValueError(f"stream {self.plan.stream}: query {query!r} is not declared in application.queries "
                             f"{self.declared}; declare it, so that the platform watches it")
        return self.plan.checkpoint(query)

    def data(self, path: str) -> str:
        """A data path resolved as the platform resolves the specs' (against its data root)."""
        return self.layout.data(path)

    def start(self, query: str, writer: DataStreamWriter) -> StreamingQuery:
        """Start ``writer`` as the declared query ``query``: named so, checkpointed where the platform looks."""
        started = writer.queryName(query).option("checkpointLocation", self.checkpoint(query)).start()
        self.queries[query] = started
        return started

    def run(self) -> None:
        """Run until every query has finished, one fails (raises ``SystemExit(1)``, so that the
        supervisor restarts the application), or a stop is asked for (stops them between
        micro-batches). Queries started without :meth:`start` count if named as declared."""
        queries = dict(self.queries)
        for q in self.spark.streams.active:
            if q.name in self.declared:
                queries.setdefault(q.name, q)
        missing = [q for q in self.declared if q not in queries]
        if missing:
            raise ValueError(f"stream {self.plan.stream}: declared queries {missing} were not started; start each "
                             "with app.start(name, writer), or name it so (queryName) with app.checkpoint(name)")
        code, cause, _ = supervise_queries(self.plan, self.layout, queries, self.stop_requested, self.events,
                                           self.lease, self.grace_seconds)
        if code != EXIT_OK:
            log.error("stream %s failed: %s", self.plan.stream, cause)
            raise SystemExit(code)


class DriverRefused(Exception):
    """This driver must not start; ``code`` is its exit code (the reason is logged)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def load(spec_path: str | os.PathLike[str], data_root: str | None = None,
         application: bool = False, spec_dir: str | os.PathLike[str] | None = None) -> tuple[StreamSpec, Layout]:
    """A driver's stream: its spec and layout (``spec_dir``: the specs' folder, if not the file's).
    Refused with exit code 2 for an invalid spec (or, with ``application``, one that is not an
    application's)."""
    try:
        spec = load_spec(spec_path)
    except SpecError as exc:
        log.error("%s", exc)
        raise DriverRefused(EXIT_BAD_SPEC) from None
    if application and spec.application is None:
        log.error("%s: stream %s is not an application (it has no application:)", spec_path, spec.name)
        raise DriverRefused(EXIT_BAD_SPEC)
    return spec, Layout(spec, data_root, spec_dir=Path(spec_dir or Path(spec_path).resolve().parent))


def report_loss(lease: DriverLease, events: EventLog, stream: str) -> None:
    """When the ``lease`` is found lost, halt, and say why in the stream's events once the JVM is
    killed (a ``driver_failed`` with ``lease_lost``, which the supervisor's messages read)."""
    def on_lost(problem: str) -> None:
        halt(problem, last_words=lambda: events.write(
            {"event": "driver_failed", "stream": stream, "error": problem[:2000], "lease_lost": True}))

    lease.on_lost = on_lost


def lease_of(layout: Layout, supervision: Supervision) -> DriverLease:
    """The stream's single-driver lease, not yet taken."""
    return DriverLease(layout.lease_dir, stream=layout.stream, ttl=duration_seconds(supervision.lease))


def held_by(hold_marker: Path) -> str | None:
    """Who stopped the stream on purpose (the marker the stop DAG writes, which a deploy removes),
    or None if nobody did."""
    try:
        text = hold_marker.read_text()
    except FileNotFoundError:
        return None
    try:
        return str(json.loads(text).get("by") or "an operator")
    except (ValueError, AttributeError):
        return "an operator"


def take_lease(lease: DriverLease, layout: Layout) -> None:
    """Take the stream's single-driver lease (release it when done). Refused (:class:`DriverRefused`)
    with exit code 3 while another live driver holds it, and with 0, the lease given back, when
    the stream was stopped on purpose: a stop marks the stream held first and then ends the
    driver holding the lease, so a driver launched just before the stop, which took the lease
    only after the stop looked, sees the mark here and never runs."""
    try:
        lease.acquire()
    except LeaseHeld as exc:
        log.error("%s", exc)
        raise DriverRefused(EXIT_LEASE_HELD) from None
    if (by := held_by(layout.hold_marker)) is not None:
        lease.release()
        log.warning("stream %s was stopped on purpose (%s): not started. Deploy it again to run it (or remove %s)",
                    layout.stream, by, layout.hold_marker)
        raise DriverRefused(EXIT_OK)


def claim(spec_path: str | os.PathLike[str], data_root: str | None = None,
          application: bool = False) -> tuple[StreamSpec, Layout, DriverLease]:
    """What a driver does first: load its stream's spec (:func:`load`) and take the stream's
    single-driver lease (:func:`take_lease`)."""
    spec, layout = load(spec_path, data_root, application)
    lease = lease_of(layout, spec.supervision)
    take_lease(lease, layout)
    return spec, layout, lease


@contextmanager
def supervised(spark: SparkSession, spec_path: str | os.PathLike[str] | None = None, data_root: str | None = None,
               grace_seconds: float = GRACE_SECONDS) -> Iterator[SupervisedApp]:
    """Take part in the platform's supervision for the duration of the block: hold the
    stream's lease, write its progress events, honour its stop marker.

    ``spec_path``: the stream's spec (default ``$STREAMS_APP_SPEC``, which the supervisor
    sets). Exits 2 for a spec that is not an application's, 3 if another live driver
    holds the stream."""
    from spark_jobs.runtime.progress import ProgressListener
    from spark_jobs.runtime.session import fence_lease

    path = spec_path or os.environ.get(APP_SPEC_ENV)
    if not path:
        log.error("no stream spec: pass spec_path, or set %s to the spec's path", APP_SPEC_ENV)
        raise SystemExit(EXIT_BAD_SPEC)
    try:
        spec, layout, lease = claim(path, data_root, application=True)
    except DriverRefused as exc:
        raise SystemExit(exc.code) from None
    events = EventLog(layout.events_file, history=History(layout.history_file),
                      tags={"epoch": lease.epoch, "host": host_id()})
    report_loss(lease, events, spec.name)
    fence_lease(spark, lease.records_dir, lease.epoch)
    listener = ProgressListener(events, spec.name, {q: q for q in spec.application.queries})
    code = EXIT_OK
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    listening = False
    try:
        stop_requested = prepare_to_stop()
        listener.add(spark)
        listening = True
        events.write({"event": "driver_started", "stream": spec.name, "pid": os.getpid(), "application": True})
        app = SupervisedApp(spark, compile_plan(spec, layout), layout, events, stop_requested, grace_seconds, lease)
        try:
            yield app
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else EXIT_FAILED
            raise
        except BaseException as exc:
            code = EXIT_FAILED
            events.write({"event": "driver_failed", "stream": spec.name, "error": str(exc)[:2000]})
            raise
        finally:
            for q in app.queries.values():
                if q.isActive:
                    q.stop()
    finally:
        events.write({"event": "driver_stopped", "stream": spec.name, "exit_code": code})
        if listening:
            listener.remove(spark)
        fence_lease(spark, None, None)
        lease.release()
        for sig, handler in handlers.items():  # the application's own again
            signal.signal(sig, handler)
