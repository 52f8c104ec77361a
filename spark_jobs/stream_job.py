"""The streaming job: ``spark-submit spark_jobs/stream_job.py --spec include/streams/<name>.yaml``.

It validates the spec, takes the single-driver lease on the checkpoint, checks what only
Spark can tell (``spark_jobs.analysis``, which gives the stream's plan), starts the stream's
ingestion and its output queries in one SparkSession (``spark_jobs.flows``), writes progress events
beside the checkpoint, and runs until:

* the stop marker ``<checkpoint>/_control/stop`` asks this driver to stop (or SIGTERM/SIGINT
  arrives): each query is stopped between micro-batches and the job exits 0;
* every query has finished (available-now trigger): exit 0;
* a query fails: the others are stopped and the job exits 1, the cause in its last lines.

A shared driver (``spark_jobs/shared_driver.py``) runs the same job for many streams'
available-now runs, each in a session of its own of one JVM (:func:`run` with ``spark``).

With ``--standby`` it does everything up to the queries' start, rehearses them in a scratch
folder (spark_jobs.runtime.warmup), then waits to take the stream over (spark_jobs.runtime.standby).

Before any query starts, the plan is judged against the plan of the last start and the state its
checkpoint holds, flow by flow (``spark_jobs.changes``): a change the checkpoint cannot honestly
resume (a window edited in place, a grouping key added, a sink moved, ...) is refused with exit 2
and the verdicts, and nothing is written. A start that runs keeps its plan (``_control/plans/``)
and archives the checkpoints of outputs removed from the spec. During an online upgrade
(``spark_jobs.upgrade``) the outputs it rebuilds are held, and started once it swapped them in;
after a rollback the driver runs the spec it pinned (the one the stream ran before).

Exit codes: 0 stopped or finished (or not started: the stream was stopped on purpose), 1 a query
failed, 2 invalid spec or arguments, or a change the checkpoint cannot resume,
3 another live driver holds the checkpoint, 4 the lease was lost (another driver took the
stream over: this one halts without committing), 5 (in a shared driver) the stream needs a
driver of its own, 137 stopped immediately (the marker).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING

from spark_jobs.plan import StreamPlan
from spark_jobs.runtime.driver import (
    EXIT_BAD_SPEC,
    EXIT_FAILED,
    EXIT_LEASE_HELD,
    EXIT_OK,
    GRACE_SECONDS,
    DriverRefused,
    first_line,
    lease_of,
    load,
    log_to_stderr,
    prepare_to_stop,
    report_loss,
    stop_between_batches,
    supervise_queries,
    take_lease,
)
from spark_jobs.runtime.history import History
from spark_jobs.runtime.lease import (
    DRIVER_ID_ENV,
    DriverLease,
    host_id,
)
from spark_jobs.runtime.progress import EventLog
from spark_jobs.runtime.run_queue import EXIT_NOT_SHAREABLE, not_shareable
from spark_jobs.runtime.session import NotShareable
from spark_jobs.runtime.standby import (
    StandbyRecord,
    take_over,
)
from spark_jobs.sources.kafka import KafkaUnavailable
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
    SpecError,
    StreamSpec,
    Trigger,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("stream_job")
#: the driver's own settings, before the spec's
DRIVER_CONF = {"spark.sql.streaming.stopTimeout": "60s"}
#: a standby that took the stream over starts its outputs once the ingestion's first trigger ended, or after this
TAKEOVER_FIRST_BATCH_SECONDS = 5.0

__all__ = ["EXIT_BAD_SPEC", "EXIT_FAILED", "EXIT_LEASE_HELD", "EXIT_OK", "main", "run"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="path of the stream spec (YAML)")
    p.add_argument("--data-root", default=None, help="root of relative data paths (default: $STREAMS_DATA_DIR or ./data)")
    p.add_argument("--trigger", choices=["spec", "available-now"], default="spec",
                   help="available-now: process what is waiting, then exit (catch-up; a scheduled stream's runs "
                        "always are, an adaptive stream's when its supervisor says so)")
    p.add_argument("--processing-time", default=None, metavar="DURATION",
                   help="override the spec's trigger with a processing-time interval, e.g. '1 second'")
    p.add_argument("--grace-seconds", type=float, default=GRACE_SECONDS,
                   help="how long a graceful stop waits for a running batch to finish")
    p.add_argument("--standby", action="store_true",
                   help="start warm (Spark session, analysis, plan), then wait to take the stream over when its "
                        "lease is free (spark_jobs.runtime.standby)")
    p.add_argument("--supervisor", type=int, default=0,
                   help="with --standby: the supervisor try that launched it; it leaves once that try is superseded")
    return p.parse_args(argv)


def run(args: argparse.Namespace, spark: SparkSession | None = None,
        stop_requested: threading.Event | None = None) -> int:
    """The driver, in a session of its own, or in ``spark`` (a shared driver's: the run's own
    session of its JVM, kept when the run ends; ``stop_requested`` is then its stop signal)."""
    from spark_jobs import upgrade

    try:
        spec, layout = load(args.spec, args.data_root)
        pinned = upgrade.pinned_spec(layout, args.spec)
        if pinned is not None:  # a rollback's: the spec the stream ran before the upgrade it undid
            log.warning("stream %s runs the spec a rollback pinned (%s), not %s: upgrade the stream to the file's "
                        "spec, or restore the file", spec.name, pinned, args.spec)
            spec, layout = load(pinned, args.data_root, spec_dir=layout.spec_dir)
            args.spec = str(pinned)
    except DriverRefused as exc:
        return exc.code
    if spec.application is not None:
        log.error("%s: stream %s is an application; the supervisor runs %s itself", args.spec, spec.name,
                  layout.include(spec.application.path))
        return EXIT_BAD_SPEC
    session = None
    if spark is not None:  # a shared driver's run: in a session of its own, if the stream can be
        try:
            session = _shared_session(spark, spec)
        except NotShareable as exc:
            log.error("%s", exc)
            return EXIT_NOT_SHAREABLE
    lease = lease_of(layout, spec.supervision)
    if not args.standby:  # a standby takes it once free, and never while the stream is held
        try:
            take_lease(lease, layout)
        except DriverRefused as exc:
            return exc.code
    try:
        return _run(spec, layout, args, lease, session, stop_requested)
    finally:
        lease.release()


def _trigger(args: argparse.Namespace, plan: StreamPlan) -> Trigger | None:
    """The trigger the arguments ask for; None: the spec's (a scheduled stream's runs are available-now)."""
    if args.trigger == "available-now" or (plan.execution.mode == "scheduled" and not args.processing_time):
        return Trigger(available_now=True)
    if args.processing_time:
        return Trigger(processing_time=args.processing_time)
    return None


def _run(spec: StreamSpec, layout: Layout, args: argparse.Namespace, lease: DriverLease,
         shared: SparkSession | None, stop_requested: threading.Event | None) -> int:
    """The driver's one compilation: the session its analysis needs (``shared``: a shared driver's
    session for the run, kept), then the plan (:func:`_drive` runs it)."""
    from spark_jobs.analysis import analyze
    from spark_jobs.runtime.session import build_session, fence_lease

    stop_requested = stop_requested or prepare_to_stop()
    spark = shared or build_session(f"stream:{spec.name}", spec, extra=DRIVER_CONF)
    events = EventLog(layout.events_file, history=History(layout.history_file), tags={"host": host_id()})
    report_loss(lease, events, spec.name)
    try:
        try:
            plan = analyze(spark, spec, layout, args.spec)  # the plan, once every check only Spark can make passed
        except SpecError as exc:
            log.error("%s", exc)
            # a restart would fail alike: the supervisor stops on this event instead
            events.write({"event": "driver_failed", "stream": spec.name, "error": str(exc)[:4000], "invalid_spec": True})
            return EXIT_BAD_SPEC
        except KafkaUnavailable as exc:  # the broker or a topic is not there (yet): a failure to restart from
            return _start_failed(layout, events, exc)
        return _drive(spark, plan, layout, args, lease, events, stop_requested)
    finally:
        fence_lease(spark, None, None)  # a session that outlives this driver (a test's) holds no lease
        if shared is None:
            spark.stop()


def _shared_session(shared: SparkSession, spec: StreamSpec) -> SparkSession:
    """The run's own session of a shared driver, if the stream can run there."""
    from spark_jobs.runtime.session import shared_session

    if (reason := not_shareable(spec)) is not None:
        raise NotShareable(f"stream {spec.name}: {reason}: it needs a driver of its own")
    return shared_session(shared, spec, DRIVER_CONF)


def _drive(spark: SparkSession, plan: StreamPlan, layout: Layout, args: argparse.Namespace, lease: DriverLease,
           events: EventLog, stop_requested: threading.Event) -> int:
    """Judge the plan against its checkpoint, start its flows (after a takeover, for a standby) and supervise them."""
    from spark_jobs import changes, upgrade
    from spark_jobs.flows import queries
    from spark_jobs.runtime import rate_limit
    from spark_jobs.runtime.checkpoint import previous_plan, refuse_incompatible
    from spark_jobs.runtime.progress import ProgressListener
    from spark_jobs.runtime.session import fence_lease
    from spark_jobs.runtime.warmup import rehearse

    stream = plan.stream
    standby = StandbyRecord(layout.lease_dir, os.environ.get(DRIVER_ID_ENV) or f"{host_id()}-{os.getpid()}",
                            args.supervisor) if args.standby else None
    trigger = _trigger(args, plan)
    # available-now: the ingestion takes what waits, then the outputs take what it committed;
    # otherwise every flow runs at once
    phases: list = [None]
    if (trigger or plan.trigger).available_now and plan.ingestion is not None:
        phases = [lambda name: name == INGEST_FLOW, lambda name: name != INGEST_FLOW]
    code, cause, started = EXIT_OK, "", False
    listener: ProgressListener | None = None
    try:
        unfinished = upgrade.unfinished(layout)
        held = upgrade.held_outputs(unfinished, args.spec)  # rebuilt beside their sinks while the others run
        if unfinished is not None and held is None:
            message = (f"upgrade {unfinished['number']} of the stream is unfinished ({unfinished['phase']}): run it "
                       "again to finish it, or roll it back (docs/changes.md)")
            log.error("stream %s: %s; nothing started", stream, message)
            events.write({"event": "driver_failed", "stream": stream, "invalid_spec": True, "spec_changed": True,
                          "error": message})
            code = EXIT_BAD_SPEC
            return code
        held = held or []
        previous = previous_plan(layout)
        watermark = plan.ingestion.event_time.watermark if plan.ingestion and plan.ingestion.event_time else None
        verdicts = changes.judge(plan, previous, args.spec, watermark)
        refused = [v for v in changes.blocking(verdicts) if v.flow not in held]
        if refused:  # resumed under its checkpoint, a sink would mix old and new results
            log.error("stream %s: the spec changed in ways its checkpoint cannot honestly resume; nothing started. "
                      "Restore the spec, or carry the change out as docs/changes.md says. Per flow:\n%s", stream,
                      changes.report(verdicts))
            events.write({"event": "driver_failed", "stream": stream, "invalid_spec": True, "spec_changed": True,
                          "error": "spec changed: an upgrade is needed (docs/changes.md)\n" + changes.report(refused)[:3800],
                          "verdicts": {v.flow: v.verdict for v in verdicts}})
            code = EXIT_BAD_SPEC
            return code
        judged, plan = plan, rate_limit.applied(plan, layout)  # what a micro-batch may take, as sizing by lag set it
        try:  # everything up to the flows' start, before a standby waits
            refuse_incompatible(plan, layout)
            planned = queries.plan_queries(spark, plan, trigger, on_batch=events.write,  # held ones: once released
                                           outputs=[f for f in plan.flows if f not in held] if held else None)
        except Exception as exc:  # reported, then exit non-zero
            code = _start_failed(layout, events, exc)
            return code
        if standby is not None:
            rehearse(spark, plan)  # the first batches' compiling done before a takeover, not after it
            if not take_over(lease, layout.hold_marker, args.supervisor, stop_requested, standby):
                return code
            standby.remove()  # a standby no more
        fence_lease(spark, lease.records_dir, lease.epoch)  # Spark's own checkpoint writes, from now on
        events.tags["epoch"] = lease.epoch
        events.write({"event": "driver_started", "stream": stream, "pid": os.getpid(),
                      "trigger": "available-now" if (trigger or plan.trigger).available_now else args.trigger,
                      "standby": args.standby,
                      **({"per_trigger": rate_limit.own_limit(plan), "processing_time": plan.trigger.processing_time}
                         if plan.execution.sizing is not None else {})})
        started = True
        now = time.time()
        for archived in changes.retire(verdicts, previous, layout, now):
            log.info("a removed output's checkpoint archived in %s (its sink is kept)", archived)
        changes.keep(layout, args.spec, judged, now)  # the spec's plan: the next start is judged against it
        upgrade.write_running_plan(layout, plan, previous, held)
        listener = ProgressListener(events, stream, plan.spark_query_names).add(spark)
        if held:
            log.info("upgrade %d: outputs %s are held while they are rebuilt; they start once it swapped them in",
                     unfinished["number"], ", ".join(held))
            events.write({"event": "outputs_held", "stream": stream, "outputs": held,
                          "upgrade": unfinished["number"]})
        release = upgrade.Release(layout, unfinished if held else None, spark, events, args.spec,
                                  stop=lambda q: stop_between_batches(q, plan.checkpoints, args.grace_seconds),
                                  replan=lambda names, upgraded: queries.plan_queries(
                                      spark, plan if upgraded is None else rate_limit.applied(upgraded, layout), trigger,
                                      on_batch=events.write, outputs=names))
        for only in phases:
            try:
                if standby is not None:
                    started_queries = queries.start_ingestion_first(spark, planned, TAKEOVER_FIRST_BATCH_SECONDS)
                else:
                    started_queries = queries.start_planned(spark, planned, only)
            except Exception as exc:  # reported, then exit non-zero
                code = _start_failed(layout, events, exc)
                return code
            code, cause, stopped = supervise_queries(plan, layout, started_queries, stop_requested, events, lease,
                                                     args.grace_seconds, release=release)
            if code != EXIT_OK or stopped:
                break
    finally:
        if listener is not None:  # its events so far delivered: the JVM may outlive this run (a shared driver)
            listener.remove(spark)
        if standby is not None:
            standby.remove()
        if started:
            events.write({"event": "driver_stopped", "stream": stream, "exit_code": code})
    if code != EXIT_OK:
        log.error("stream %s failed: %s", stream, cause)
    return code


def _start_failed(layout: Layout, events: EventLog, exc: Exception) -> int:
    log.error("stream %s could not start: %s", layout.stream, first_line(exc))
    if layout.checkpoint_root in str(exc):
        log.error("the checkpoint %s looks unreadable. It is not reset automatically: inspect it, or "
                  "move it aside together with the stream's file sinks to reprocess from scratch.",
                  layout.checkpoint_root)
    events.write({"event": "driver_failed", "stream": layout.stream, "error": str(exc)[:2000]})
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    log_to_stderr()
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
