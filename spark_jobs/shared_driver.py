"""A shared driver: ``spark-submit spark_jobs/shared_driver.py --queue <folder>``.

One long-lived driver that takes scheduled streams' available-now runs from its queue
(``spark_jobs.runtime.run_queue``), one after another, each in a session of its own of this JVM
(``spark_jobs.runtime.session.shared_session``). A run started by spark-submit pays for a JVM, a
Spark session and the JIT's first compiling of Spark's code every time, most of its CPU for a
quiet stream; here it pays for its own queries only (``python -m bench.shared_driver``).

A run is the stream's driver in every other way (``spark_jobs.stream_job``): it takes the
stream's lease (the driver id its request names), judges the plan against the last start, writes
the stream's events, and ends with the exit code a driver of its own would have; that code, its
CPU and wall seconds and the lines it logged are its result in the queue. A stream whose runs
need a JVM of their own (``run_queue.not_shareable``: an application, Python code of the user's,
Spark settings read at a JVM's start) ends with ``EXIT_NOT_SHAREABLE`` and nothing written.
What ends a driver of its own ends this one, and with it the run in progress: a lost lease, an
immediate stop (both halt the JVM so that nothing more commits); the run's result is then
``EXIT_DRIVER_LOST``, and its stream resumes from its checkpoint at its next run.

SIGTERM or SIGINT (to this Python process, the one the queue names): the run in progress stops
between batches, then the driver exits 0. If spark-submit's JVM ends under it, it stops taking
runs at once (its heartbeat stops) and exits 1.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from spark_jobs.runtime.lease import DRIVER_ID_ENV, is_spark_submit
from spark_jobs.runtime.run_queue import HEARTBEAT_SECONDS, RunQueue, RunRequest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("shared_driver")
#: how often an idle driver looks for runs asked for
POLL_SECONDS = 0.2


def cpu_seconds() -> float:
    """CPU seconds of this driver so far: its Python process, the JVM (spark-submit's, this
    process's parent; or a child, in a test's session) and their children."""
    me = psutil.Process()
    processes = [me, *me.children(recursive=True)]
    if is_spark_submit(me.ppid()):
        processes.append(psutil.Process(me.ppid()))
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:  # ended meanwhile
            continue
    return total


def serve(queue: RunQueue, spark: SparkSession, stop: threading.Event, runs: int | None = None,
          jvm_alive: Callable[[], bool] = lambda: True) -> int:
    """Take the queue's runs, one after another, until ``stop`` is set (or ``runs`` were taken, or
    ``jvm_alive`` says the JVM ended: the heartbeat stops at once); the number taken."""
    for lost in queue.recover():
        log.warning("run %s was taken by a driver that ended during it: ended as failed", lost)
    started, current = time.time(), [None]

    def beat() -> None:
        while jvm_alive():
            queue.beat(started, current[0])
            if stop.wait(HEARTBEAT_SECONDS):
                return
        log.error("the driver's JVM ended: no more runs are taken")
        stop.set()

    beating = threading.Thread(target=beat, name="queue-heartbeat", daemon=True)
    queue.beat(started)
    beating.start()
    taken = 0
    try:
        while not stop.is_set() and (runs is None or taken < runs):
            request = queue.take()
            if request is None:
                stop.wait(POLL_SECONDS)
                continue
            current[0] = request.id
            queue.finish(request.id, run(queue, spark, request, stop))
            current[0] = None
            taken += 1
    finally:
        stop.set()
        beating.join()
        queue.leave()
    return taken


def run(queue: RunQueue, spark: SparkSession, request: RunRequest, stop: threading.Event) -> dict[str, Any]:
    """One run, as its stream's driver with ``--trigger available-now``: its outcome."""
    from spark_jobs import stream_job
    from spark_jobs.runtime.driver import EXIT_FAILED, LOG_FORMAT, first_line

    args = ["--spec", request.spec, "--trigger", "available-now"]
    if request.data_root:
        args += ["--data-root", request.data_root]
    env = {DRIVER_ID_ENV: request.driver_id, **request.env}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    handler = logging.FileHandler(queue.logs / f"{request.id}.log", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    cpu, began, wall = cpu_seconds(), time.time(), time.monotonic()
    outcome: dict[str, Any] = {}
    try:
        log.info("run %s: %s (driver id %s)", request.id, request.spec, request.driver_id)
        outcome["code"] = stream_job.run(stream_job.parse_args(args), spark=spark, stop_requested=stop)
    except SystemExit as exc:  # the arguments (argparse)
        outcome.update(code=exc.code if isinstance(exc.code, int) else 2, error=str(exc))
    except Exception as exc:  # reported as the run's failure; the driver takes the next
        log.exception("run %s failed", request.id)
        outcome.update(code=EXIT_FAILED, error=first_line(exc))
    finally:
        logging.getLogger().removeHandler(handler)
        handler.close()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return {**outcome, "started_at": began, "wall_s": round(time.monotonic() - wall, 3),
            "cpu_s": round(cpu_seconds() - cpu, 3)}


def main(argv: list[str] | None = None) -> int:
    from spark_jobs.runtime.driver import log_to_stderr, prepare_to_stop
    from spark_jobs.runtime.session import build_session, delta_conf
    from spark_jobs.stream_job import DRIVER_CONF

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queue", required=True, help="the queue's folder (spark_jobs.runtime.run_queue)")
    args = p.parse_args(argv)
    log_to_stderr()
    stop = prepare_to_stop()
    spark = build_session("shared-driver", extra={**DRIVER_CONF, **delta_conf()})
    jvm = os.getppid()  # spark-submit's: if it ends (a signal of its own), this process must not serve on
    try:
        taken = serve(RunQueue(args.queue), spark, stop, jvm_alive=lambda: os.getppid() == jvm)
    finally:
        if os.getppid() == jvm:
            spark.stop()
    log.info("stopped after %d runs", taken)
    return 0 if os.getppid() == jvm else 1


if __name__ == "__main__":
    sys.exit(main())
