"""The streaming job: ``spark-submit spark_jobs/stream_job.py --spec include/streams/<name>.yaml``.

It validates the spec, takes the single-driver lease on the checkpoint, checks what only
Spark can tell (its SQL queries, ``spark_jobs.check``), starts the
stream's ingestion and its output queries in one SparkSession (see spark_jobs.pipeline), writes progress events beside the checkpoint,
and runs until:

* the stop marker ``<checkpoint>/_control/stop`` appears (or SIGTERM/SIGINT arrives):
  each query is stopped between micro-batches and the job exits 0;
* every query has finished (available-now trigger): exit 0;
* a query fails: the others are stopped and the job exits 1, the cause in its last lines.

Exit codes: 0 stopped or finished, 1 a query failed, 2 invalid spec or arguments,
3 another live driver holds the checkpoint, 4 the lease was lost (another driver took the
stream over: this one halts without committing), 137 stopped immediately (the marker).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from spark_jobs.driver import (
    EXIT_BAD_SPEC,
    EXIT_FAILED,
    EXIT_LEASE_HELD,
    EXIT_OK,
    GRACE_SECONDS,
    DriverRefused,
    claim,
    first_line,
    prepare_to_stop,
    supervise_queries,
)
from spark_jobs.history import History
from spark_jobs.lease import host_id
from spark_jobs.progress import EventLog
from spark_jobs.spec import INGEST_QUERY, Layout, SpecError, Trigger

log = logging.getLogger("stream_job")

__all__ = ["EXIT_BAD_SPEC", "EXIT_FAILED", "EXIT_LEASE_HELD", "EXIT_OK", "main", "run"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True, help="path of the stream spec (YAML)")
    p.add_argument("--data-root", default=None, help="root of relative data paths (default: $STREAMS_DATA_DIR or ./data)")
    p.add_argument("--trigger", choices=["spec", "available-now"], default="spec",
                   help="available-now: process what is waiting, then exit (catch-up)")
    p.add_argument("--processing-time", default=None, metavar="DURATION",
                   help="override the spec's trigger with a processing-time interval, e.g. '1 second'")
    p.add_argument("--grace-seconds", type=float, default=GRACE_SECONDS,
                   help="how long a graceful stop waits for a running batch to finish")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    try:
        spec, layout, lease = claim(args.spec, args.data_root)
    except DriverRefused as exc:
        return exc.code
    try:
        return _run_with_lease(spec, layout, args, lease.epoch)
    finally:
        lease.release()


def _run_with_lease(spec, layout: Layout, args: argparse.Namespace, epoch: int) -> int:  # noqa: ANN001
    from spark_jobs import pipeline
    from spark_jobs.check import check_spec
    from spark_jobs.progress import make_listener
    from spark_jobs.session import build_session

    if spec.application is not None:
        log.error("%s: stream %s is an application; the supervisor runs %s itself", args.spec, spec.name,
                  layout.application_file)
        return EXIT_BAD_SPEC
    stop_requested = prepare_to_stop(layout)
    spark = build_session(f"stream:{spec.name}", spec, extra={"spark.sql.streaming.stopTimeout": "60s"})
    events = EventLog(layout.events_file, history=History(layout.history_file),
                      tags={"epoch": epoch, "host": host_id()})
    trigger = None
    if args.trigger == "available-now":
        trigger = Trigger(available_now=True)
    elif args.processing_time:
        trigger = Trigger(processing_time=args.processing_time)
    events.write({"event": "driver_started", "stream": spec.name, "pid": os.getpid(), "trigger": args.trigger})

    # available-now: the ingestion takes what waits, then the outputs take what it committed;
    # otherwise every query runs at once
    phases: list = [None]
    if (trigger or spec.trigger).available_now and spec.has_ingestion:
        phases = [lambda name: name == INGEST_QUERY, lambda name: name != INGEST_QUERY]
    code, cause = EXIT_OK, ""
    try:
        try:
            transformed = check_spec(spark, spec, args.spec)  # what only Spark can tell: its SQL queries
        except SpecError as exc:
            log.error("%s", exc)
            # a restart would fail alike: the supervisor stops on this event instead
            events.write({"event": "driver_failed", "stream": spec.name, "error": str(exc)[:4000], "invalid_spec": True})
            code = EXIT_BAD_SPEC
            return code
        try:
            plan = pipeline.compile_for_start(spec, layout, transformed)
        except Exception as exc:  # noqa: BLE001 - reported, then exit non-zero
            code = _start_failed(spec, layout, events, exc)
            return code
        plan.write(layout.plan_file)
        spark.streams.addListener(make_listener(events, spec.name, plan.spark_query_names))
        for only in phases:
            try:
                queries = pipeline.start(spark, spec, layout, trigger, on_batch=events.write, only=only, plan=plan)
            except Exception as exc:  # noqa: BLE001 - reported, then exit non-zero
                code = _start_failed(spec, layout, events, exc)
                return code
            code, cause, stopped = supervise_queries(spec, layout, queries, stop_requested, events,
                                                     args.grace_seconds, epoch)
            if code != EXIT_OK or stopped:
                break
    finally:
        events.write({"event": "driver_stopped", "stream": spec.name, "exit_code": code})
        spark.stop()
    if code != EXIT_OK:
        log.error("stream %s failed: %s", spec.name, cause)
    return code


def _start_failed(spec, layout: Layout, events: EventLog, exc: Exception) -> int:  # noqa: ANN001
    log.error("stream %s could not start: %s", spec.name, first_line(exc))
    if layout.checkpoint_root in str(exc):
        log.error("the checkpoint %s looks unreadable. It is not reset automatically: inspect it, or "
                  "move it aside together with the stream's file sinks to reprocess from scratch.",
                  layout.checkpoint_root)
    events.write({"event": "driver_failed", "stream": spec.name, "error": str(exc)[:2000]})
    return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
