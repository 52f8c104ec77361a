"""Streams spread over Celery workers; a lost worker's streams move to another, and a worker
that was only paused comes back without committing.

A real Airflow (API server, scheduler, DAG processor) with the CeleryExecutor, a real Redis
broker and PostgreSQL metadata, all on loopback, and Celery workers as separate process
trees, each with a name of its own (``STREAMS_HOST``, as a container's hostname would be).
All of them share one data directory, as the workers of a deployment share its storage.

1. Three streams: two on worker A (queue ``streams``), one pinned to worker B (its spec's
   ``supervision.queue``; B also serves ``streams``). That one, s3, keeps a warm standby on
   worker A (its ``supervision.standby_queue``, which only A serves): its driver on B is
   SIGKILLed, and the standby on A commits its next batch within ``STANDBY_BOUND`` seconds.
   B's supervisor then watches it through its lease and keeps the next standby on B.
2. Worker A and every process it started are killed (SIGKILL): its two streams commit new
   batches on worker B within ``MOVE_BOUND`` seconds, and s3, whose active driver ran on A,
   within ``STANDBY_MOVE_BOUND`` (its standby on B takes over once the lease lapses).
3. Worker C starts, and worker B is paused (SIGSTOP) until all three streams run on C. Then
   the partition heals in the order that once stopped a stream for good: B's task processes
   (its old supervisors, with their drivers) resume first, while Airflow's side of B is still
   paused and so has not killed them yet. Each old supervisor must see that a newer try
   supervises its stream and leave it alone; its old driver halts without committing. Then
   the rest of B resumes (Airflow kills the old tries), and for ``KEEP_COMMITTING`` seconds, and
   until those tries have ended, every stream keeps committing on C, with the same driver: none
   is stopped.
4. Every sink equals the generator's ground truth, and each stream's lease history shows
   no two drivers holding its checkpoint at once, and no event written by a driver after
   the next one took over.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from airflow_harness import BIN, Airflow, example_spec, include_with, one_driver_at_a_time, stream_drivers, wait_for

from runner.processes import PRIVATE, private_log, wait_until
from runner.testdata import generate, verify
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_ids
from spark_jobs.runtime.lease import (
    HOST_ENV,
    SUPERVISORS,
    history,
    process_start,
    read_holder,
    read_record,
    record_numbers,
    record_path,
)
from spark_jobs.runtime.progress import read_events
from spark_jobs.runtime.standby import READY, standbys
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.health import Status, assess
from streamops.restarts import RestartBudget
from streamops.tenure import Tenure

pytestmark = pytest.mark.e2e

HEARTBEAT_TIMEOUT = 20  # [scheduler] task_instance_heartbeat_timeout: a lost worker's tasks fail after it
LEASE_SECONDS = 8
#: from a worker's loss to its streams' first new commit elsewhere: the heartbeat timeout and its
#: detection interval (10 s), the retry delay (10 s), the lease, a new driver's start, on 2 busy cores
MOVE_BOUND = 240
STREAMS = {"s1": "streams", "s2": "streams", "s3": "streams-b"}
#: s3's warm standby runs on the workers of this queue: worker A alone
STANDBY_QUEUE = "standby-a"
#: from a SIGKILL of s3's driver on B to the first commit of its standby on A: the supervisor sees
#: the driver end and releases its lease, the standby takes it and starts its queries
STANDBY_BOUND = 30
#: from worker A's loss to s3's first commit on B, its standby there: the lease's ttl, then as above
STANDBY_MOVE_BOUND = 60
#: after the partition healed, how long every stream must keep committing on the worker it moved to,
#: and at least until Airflow has ended worker B's old tries (for up to three times as long)
KEEP_COMMITTING = 30
#: Airflow's services but the triggerer: the quality DAGs (whose asset watchers it runs) stay paused here
SERVICES = tuple(s for s in Airflow.SERVICES if s[0] != "triggerer")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def scale_out_specs(include: Path) -> Path:
    """Three copies of the sensors stream under their own names and paths: the accepted rows
    (its pass-through sink) and the 10-minute window, a 3-second trigger, a short lease."""
    specs = []
    for name, queue in STREAMS.items():
        spec = example_spec("sensors")
        spec["outputs"] = [o for o in spec["outputs"] if o["name"] in ("readings", "site_temperature_10m")]
        text = json.dumps(spec).replace("/sensors", f"/{name}")
        spec = json.loads(text)
        spec.update(name=name, trigger={"processing_time": "3 seconds"})
        spec["source"]["max_files_per_trigger"] = 4
        spec["supervision"] = {"stall_window": "4 minutes", "queue": queue, "lease": f"{LEASE_SECONDS} seconds",
                               "restart": {"max_attempts": 10, "backoff_initial_seconds": 1, "backoff_max_seconds": 4}}
        if name == "s3":
            spec["supervision"] |= {"standby": True, "standby_queue": STANDBY_QUEUE}
        specs.append(spec)
    return include_with(include, *specs)


def dags_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for name in STREAMS:
        (folder / f"stream_{name}.py").write_text(
            f'"""Airflow DAGs of the `{name}` stream."""\n\nfrom streamops.dag_factory import stream_dags\n\n'
            f'globals().update(stream_dags("{name}"))\n')
    return folder


def process_tree(root: int) -> list[int]:
    """``root`` and every process descended from it."""
    try:
        return [root, *(p.pid for p in psutil.Process(root).children(recursive=True))]
    except psutil.NoSuchProcess:
        return [root]


def signal_tree(root: int, sig: int) -> list[int]:
    """Send ``sig`` to the whole tree, again until no new process appears in it (a fork in between)."""
    done: set[int] = set()
    while new := [p for p in process_tree(root) if p not in done]:
        for pid in new:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        done.update(new)
    return sorted(done)


class Worker:
    """``airflow celery worker`` as a machine of its own: its name in the leases, its queues."""

    def __init__(self, airflow: Airflow, name: str, queues: str):
        self.name = name
        log = private_log(airflow.home / f"worker-{name}.log")
        self.proc = subprocess.Popen(
            [str(BIN / "airflow"), "celery", "worker", "--queues", queues, "--celery-hostname", f"{name}@localhost",
             "--concurrency", "8", "--skip-serve-logs"],
            env={**airflow.env, HOST_ENV: name}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            umask=PRIVATE)

    def kill(self) -> None:
        signal_tree(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def pause(self) -> list[int]:
        return signal_tree(self.proc.pid, signal.SIGSTOP)


@dataclass
class Stream:
    name: str
    spec_path: Path
    data_root: Path
    seed: int = 100

    def __post_init__(self) -> None:
        spec = load_spec(self.spec_path)
        self.layout = Layout(spec, self.data_root, self.spec_path.parent)
        self.plan = compile_plan(spec, self.layout)
        self.ingestion = Path(self.plan.checkpoint(INGEST_FLOW))

    def feed(self, files: int) -> None:
        self.seed += 1
        assert generate.main(["--spec", str(self.spec_path), "--data-root", str(self.data_root), "--files", str(files),
                              "--events-per-file", "40", "--seed", str(self.seed)]) == 0

    def host(self) -> str | None:
        holder = read_holder(self.layout.lease_dir)
        return holder.host if holder is not None and holder.alive() else None

    def committed_on(self, host: str, since: float) -> bool:
        """Does a driver on ``host`` hold the stream, and has it committed a batch since ``since``?"""
        commits = self.ingestion / "commits"
        return self.host() == host and any(p.stat().st_mtime > since for p in commits.glob("[0-9]*"))

    def standby_ready_on(self, host: str) -> bool:
        return any(sb.host == host and sb.state == READY for sb in standbys(self.layout.lease_dir))

    def caught_up(self) -> bool:
        return assess(self.plan, self.layout).status == Status.IDLE


def tries(control_dir: Path) -> list[Tenure]:
    """The stream's supervisor tries (``streamops.tenure``), oldest first."""
    return [t for n in record_numbers(control_dir, SUPERVISORS)
            if (t := read_record(record_path(control_dir, n, SUPERVISORS), Tenure)) is not None]


def what_happened(s: Stream, since: float) -> str:
    """For a failure's message: the stream's drivers, supervisor tries, runs and driver events since ``since``."""
    lines = [f"lease: {h.describe()}{' released' if h.released_at else ''} ({h.driver_id})"
             for h in history(s.layout.lease_dir) if h.ended_at >= since]
    lines += [f"supervisor try: {t.describe()} at {t.started_at:.1f}" for t in tries(s.layout.lease_dir)
              if t.started_at >= since]
    lines += [f"run: {r}" for r in RestartBudget(s.layout.runs_file, s.plan.supervision.restart).runs()
              if (r.ended_at or r.started_at) >= since]
    lines += [f"event: {e}" for e in read_events(s.layout.events_file)
              if float(e.get("logged_at") or 0) >= since and str(e.get("event", "")).startswith(("driver", "supervisor"))]
    return "\n".join(lines)


def deploy(airflow: Airflow, name: str) -> None:
    airflow.unpause(f"stream_{name}")
    airflow.trigger(f"stream_{name}")


def test_streams_move_off_a_lost_worker_and_a_paused_worker_comes_back_without_committing(
        tmp_path: Path, redis_server, module_postgres_database, spark) -> None:
    spec_dir = scale_out_specs(tmp_path / "include")
    data_root = tmp_path / "data"
    streams = {name: Stream(name, spec_dir / f"{name}.yaml", data_root) for name in STREAMS}
    for s in streams.values():
        s.feed(8)
    metadata_url = module_postgres_database.replace("postgresql://", "postgresql+psycopg://", 1)
    airflow = Airflow(tmp_path / "airflow", data_root, metadata_url, extra_env={
        "STREAMS_SPEC_DIR": str(spec_dir), "AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder(tmp_path / "dags")),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor", "AIRFLOW__CELERY__BROKER_URL": redis_server.url,
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{metadata_url}",
        "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT)})
    airflow.SERVICES = SERVICES
    workers: list[Worker] = []
    paused: list[int] = []
    timings: dict[str, float] = {}
    try:
        airflow.start()
        wait_for(airflow.healthy, "the Airflow API server", timeout=180, every=2)
        wait_for(lambda: {f"stream_{n}" for n in STREAMS} <= airflow.dag_ids(), "the streams' DAGs", timeout=240,
                 every=2)

        # 1. two streams on worker A, the third pinned to B by its queue
        workers.append(a := Worker(airflow, "worker-a", f"streams,{STANDBY_QUEUE}"))
        for name in ("s1", "s2"):
            deploy(airflow, name)
        wait_for(lambda: all(streams[n].committed_on("worker-a", 0) for n in ("s1", "s2")),
                 "s1 and s2 to commit on worker-a", timeout=300, every=1)
        workers.append(b := Worker(airflow, "worker-b", "streams,streams-b"))
        deploy(airflow, "s3")
        s3 = streams["s3"]
        wait_for(lambda: s3.committed_on("worker-b", 0), "s3 to commit on worker-b", timeout=300, every=1)

        # 1b. s3's driver on B is killed: its standby on A takes over
        wait_for(lambda: s3.standby_ready_on("worker-a"), "s3's standby to be ready on worker-a", timeout=300, every=0.5)
        s3.feed(1)
        killed = read_holder(s3.layout.lease_dir)
        os.kill(killed.pid, signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: s3.committed_on("worker-a", killed_at), "s3's standby on worker-a to commit",
                 timeout=STANDBY_BOUND, every=0.1)
        timings["s3 taken over by its standby on worker-a"] = time.time() - killed_at
        wait_for(lambda: s3.standby_ready_on("worker-b"), "s3's next standby to be ready on worker-b", timeout=300,
                 every=0.5)
        assert read_holder(s3.layout.lease_dir).epoch == killed.epoch + 1, "s3 was restarted, not taken over"

        # 2. worker A is lost with every process it started: its streams move to B
        for s in streams.values():
            s.feed(4)
        a.kill()
        lost_at = time.time()
        wait_for(lambda: s3.committed_on("worker-b", lost_at), "s3's standby on worker-b to commit",
                 timeout=STANDBY_MOVE_BOUND, every=0.2)
        timings["s3 moved from the killed worker-a to its standby on worker-b"] = time.time() - lost_at
        for name in ("s1", "s2"):
            wait_for(lambda n=name: streams[n].committed_on("worker-b", lost_at), f"{name} to commit on worker-b",
                     timeout=MOVE_BOUND, every=1)
            timings[f"{name} moved from the killed worker-a"] = time.time() - lost_at

        # 3. worker B is paused until every stream runs on worker C, then resumes
        workers.append(Worker(airflow, "worker-c", "streams,streams-b"))
        paused = b.pause()
        paused_at = time.time()
        old = {name: read_holder(s.layout.lease_dir) for name, s in streams.items()}
        assert {h.host for h in old.values()} == {"worker-b"}
        for s in streams.values():
            s.feed(4)
        for name in STREAMS:
            wait_for(lambda n=name: streams[n].committed_on("worker-c", paused_at), f"{name} to commit on worker-c",
                     timeout=MOVE_BOUND, every=1)
            timings[f"{name} moved from the paused worker-b"] = time.time() - paused_at
        # the old tries resume before Airflow's side of worker B can kill them
        tries = {name: psutil.Process(h.launcher_pid).ppid() for name, h in old.items()}
        for task_pid in tries.values():
            signal_tree(task_pid, signal.SIGCONT)
        wait_for(lambda: all(process_start(h.pid) != h.pid_start for h in old.values()),
                 "the resumed worker's old drivers to halt", timeout=60, every=0.5)
        wait_for(lambda: all(any(e.get("event") == "supervisor_superseded" and e.get("host") == "worker-b"
                                 for e in read_events(s.layout.events_file)) for s in streams.values()),
                 "each old supervisor on worker-b to see that a newer try supervises its stream", timeout=60,
                 every=0.5)
        signal_tree(b.proc.pid, signal.SIGCONT)
        paused = []
        # healed: every stream keeps committing on worker C, with the driver it had, while Airflow ends
        # the old tries (their on_kill must leave the moved streams alone)
        moved = {name: read_holder(s.layout.lease_dir) for name, s in streams.items()}
        assert all(h.host == "worker-c" for h in moved.values()), moved
        healed_at = time.time()
        while time.time() < healed_at + KEEP_COMMITTING or (
                any(running(pid) for pid in tries.values()) and time.time() < healed_at + 3 * KEEP_COMMITTING):
            fed_at = time.time()
            for s in streams.values():
                s.feed(1)
            for name, s in streams.items():
                wait_for(lambda s=s, t=fed_at: s.committed_on("worker-c", t), f"{name} to keep committing on worker-c",
                         timeout=60, every=0.5)
                holder = read_holder(s.layout.lease_dir)
                assert (holder.epoch, holder.pid) == (moved[name].epoch, moved[name].pid), \
                    (f"{name}: its driver on worker-c was replaced after the partition healed: {holder.describe()}\n"
                     f"{what_happened(s, moved[name].started_at)}")
                # the run of worker C's supervisor is still open: no old try recorded its own driver's end onto it
                last = RestartBudget(s.layout.runs_file, s.plan.supervision.restart).last_run()
                assert last is not None and last.ended_at is None, f"{name}: an old try recorded a run: {last}"

        # 4. caught up on worker C: every sink exact; never two drivers at once
        for s in streams.values():
            s.feed(2)
        for name, s in streams.items():
            wait_for(s.caught_up, f"{name} to take all its input", timeout=300, every=2)
        for name, s in streams.items():
            one_driver_at_a_time(s.layout)
            records = history(s.layout.lease_dir)
            assert old[name].epoch in {h.epoch for h in records} and records[-1].host == "worker-c"
            manifest = json.loads((data_root / "generated" / name / "manifest.json").read_text())
            reports = []

            def exact(s: Stream = s, manifest: dict = manifest, reports: list = reports) -> bool:
                """A window closes in the output's batch after the one that moved its watermark
                past it: the sinks reach the ground truth a trigger or two after the input is taken."""
                reports.append(verify.compare(spark, s.plan, manifest))
                return reports[-1].ok

            if not wait_until(exact, timeout=120, every=3):
                raise AssertionError(f"{name}: the sinks were not the ground truth within 120 s of taking all "
                                     f"the input:\n{reports[-1].describe()}")
            assert len(batch_ids(s.ingestion, "commits")) > 0
    finally:
        for pid in paused:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for w in workers:  # with the drivers they run
            if w.proc.poll() is None:
                w.kill()
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)
    print("\n".join(f"{what}: {seconds:.1f}s" for what, seconds in timings.items()))

