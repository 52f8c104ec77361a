"""Faults under the real platform (Airflow's scheduler, DAG processor, triggerer and API
server; the stream deployed through its DAG), one after another on one live stream:

1. SIGKILL of the active driver at three kinds of moment (mid-batch, right after a commit, at
   a random time), then more as ``STREAMS_FAULT_KILLS`` asks (the soak); with the stream's
   warm standby (``STREAMS_FAULT_STANDBY=0``: without one) each takeover reaches its first
   commit within ``STANDBY_RECOVERY_SECONDS``, and a SIGKILL of the standby costs the active
   driver nothing;
2. SIGSTOP of the driver (and its JVM) past the stall window: detected as stalled,
   stopped (graceful first, then hard) and restarted;
3. SIGKILL of the Airflow task process that supervises the driver: the retried task
   adopts the driver still running instead of starting a second one;
4. a crash followed by the loss of the newest commit file (its checksum file left, as by
   ``rm``): the batch is replayed, and the sinks skip what they already hold (a lost commit
   file below a later batch is harmless too: the health tests cover it);
5. a crash that leaves half-written temporary files in the checkpoint: harmless;

after which every sink equals the ground truth exactly, every output agrees with its query
over the accepted rows, and no driver failed on the way, with late events generated at the
watermark's edge throughout (the ingestion decides them once; every output follows that
decision), and

6. a torn newest offsets file, then a crash: the supervisor neither restarts the stream nor
   lets the standby take it over; its task fails saying what is wrong and what to do.

Never two drivers at once, throughout, judged by the lease's history
(``one_driver_at_a_time``). The times from each fault to the first new committed batch are
printed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import psutil
import pytest
from airflow_harness import Airflow, deploy, example_spec, include_with, one_driver_at_a_time, stream_drivers, wait_for

from runner.testdata import generate, verify
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_ids
from spark_jobs.runtime.lease import read_holder
from spark_jobs.runtime.progress import read_events
from spark_jobs.runtime.standby import standbys
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.health import Status, assess

pytestmark = pytest.mark.e2e

KILLS = max(3, int(os.environ.get("STREAMS_FAULT_KILLS", "3")))
SEED = int(os.environ.get("STREAMS_FAULT_SEED", "11"))
#: the stream keeps a warm standby driver (``supervision.standby``); STREAMS_FAULT_STANDBY=0: without
STANDBY = os.environ.get("STREAMS_FAULT_STANDBY", "1") != "0"
#: with a ready standby, from a SIGKILL of the active driver to the first new committed batch
STANDBY_RECOVERY_SECONDS = 5.0
STALL_WINDOW_SECONDS = 30
#: Share of late events between the watermark's bounds, whose fate the micro-batch boundaries
#: decide: after a restart, where the watermark lags, each output would decide differently.
LATE_EDGE = 0.05


def fault_specs(root: Path) -> Path:
    """The sensors stream with a short trigger, two files per batch (so faults land mid-way), a
    short stall window and restart backoff, in its own include/."""
    spec = example_spec("sensors")
    spec["trigger"] = {"processing_time": "2 seconds"}
    spec["source"]["max_files_per_trigger"] = 2
    # every fault below is a failed run within the hour: the budget covers them all, with room to spare
    # a lease longer than the stall window: the frozen driver below is found stalled before its lease
    # lapses (which would end it too, as "its lease lapsed")
    spec["supervision"] = {"stall_window": f"{STALL_WINDOW_SECONDS} seconds", "lease": "2 minutes", "standby": STANDBY,
                           "restart": {"max_attempts": KILLS + 9, "backoff_initial_seconds": 1,
                                       "backoff_max_seconds": 4, "stable_after_minutes": 10}}
    return include_with(root, spec)


class Stream:
    """The live stream as the test sees it: its files, its driver, its input."""

    def __init__(self, spec_dir: Path, data_root: Path):
        self.spec_path = spec_dir / "sensors.yaml"
        spec = load_spec(self.spec_path)
        self.layout = Layout(spec, data_root, spec_dir)
        self.plan = compile_plan(spec, self.layout)
        self.data_root = data_root
        self.readings = Path(self.plan.checkpoint(INGEST_FLOW))
        self.seed = SEED

    def feed(self, files: int) -> None:
        self.seed += 1
        assert generate.main(["--spec", str(self.spec_path), "--data-root", str(self.data_root), "--files", str(files),
                              "--events-per-file", "40", "--late-edge", str(LATE_EDGE), "--seed", str(self.seed)]) == 0

    def driver(self):  # the lease holder
        holder = read_holder(self.layout.lease_dir)
        assert holder is not None and holder.pid in stream_drivers(), "no live driver holds the lease"
        return holder

    def standby_ready(self) -> bool:
        return any(s.state == "ready" for s in standbys(self.layout.lease_dir))

    def committed_after(self, moment: float) -> bool:
        return any(p.stat().st_mtime > moment for p in (self.readings / "commits").glob("[0-9]*"))

    def in_flight(self) -> bool:
        offsets, commits = batch_ids(self.readings, "offsets"), batch_ids(self.readings, "commits")
        return bool(offsets) and (not commits or offsets[-1] > commits[-1])

    def recovered(self, since: float, old_pid: int, what: str, timeout: float = 240) -> float:
        """Wait for a new driver's first committed batch; seconds since the fault."""
        def new_driver_committed() -> bool:
            holder = read_holder(self.layout.lease_dir)
            return holder is not None and holder.pid != old_pid and self.committed_after(since)

        wait_for(new_driver_committed, f"a new driver to commit a batch after {what}", timeout=timeout, every=0.2)
        seconds = time.time() - since
        print(f"{what}: first new committed batch after {seconds:.1f}s")
        return seconds

    def failures(self) -> list[str]:
        """What failed in a driver: a query that ended with an error, a driver that failed."""
        return [f"epoch {e.get('epoch')} {e['event']}: {str(e.get('exception') or e.get('error'))[:300]}"
                for e in read_events(self.layout.events_file)
                if e.get("event") == "driver_failed" or (e.get("event") == "terminated" and e.get("exception"))]

    def catch_up(self, patience: float = 180) -> None:
        """Wait until the stream is idle, for as long as its backlog keeps shrinking: a soak's
        faults leave a backlog that takes longer than any fixed timeout; a stuck stream fails."""
        while (health := assess(self.plan, self.layout)).status != Status.IDLE:
            backlog = health.backlog_files
            wait_for(lambda b=backlog: (h := assess(self.plan, self.layout)).status == Status.IDLE or h.backlog_files < b,
                     f"the stream to catch up (its backlog of {backlog} file(s) did not shrink)", timeout=patience,
                     every=2)


def kill_driver(stream: Stream) -> tuple[int, float]:
    holder = stream.driver()
    os.kill(holder.pid, signal.SIGKILL)
    return holder.pid, time.time()


def supervise_log(airflow: Airflow) -> str:
    return "\n".join(p.read_text(errors="replace") for p in
                     sorted((airflow.home / "logs").glob("dag_id=stream_sensors/run_id=*/task_id=supervise/attempt=*.log")))


def supervisor_said(airflow: Airflow, last: int = 40) -> str:
    """The supervisor's own last lines (not the driver's output it relays): why a fault's
    recovery went another way than the test expects."""
    lines = []
    for line in supervise_log(airflow).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if str(entry.get("logger", "")).endswith("StreamSupervisorOperator"):
            lines.append(f"{entry.get('timestamp', '')} {entry.get('level', '')} {str(entry.get('event'))[:300]}")
    return "the supervisor said, last:\n" + "\n".join(lines[-last:])


def test_the_stream_recovers_from_every_fault_and_stops_on_a_torn_checkpoint(tmp_path: Path, spark) -> None:
    rng = random.Random(SEED)
    spec_dir = fault_specs(tmp_path / "include")
    data_root = tmp_path / "data"
    stream = Stream(spec_dir, data_root)
    stream.feed(10)
    airflow = Airflow(tmp_path / "airflow", data_root, extra_env={"STREAMS_SPEC_DIR": str(spec_dir)})
    timings: dict[str, float] = {}
    try:
        airflow.start()
        deploy(airflow, "sensors")
        wait_for(lambda: len(batch_ids(stream.readings, "commits")) >= 2, "2 committed batches", timeout=300)

        # 1. SIGKILL at three kinds of moment, in a seeded random order, and more for a soak
        moments = ["mid-batch", "after a commit", "at a random time"]
        rng.shuffle(moments)
        moments += [rng.choice(moments) for _ in range(KILLS - 3)]
        for n, moment in enumerate(moments, start=1):
            if STANDBY:  # the test measures a takeover by a standby that is ready, not one still warming
                wait_for(stream.standby_ready, "a ready standby", timeout=180, every=0.2)
            stream.feed(6)
            if moment == "mid-batch":
                wait_for(stream.in_flight, "a batch in flight", timeout=120, every=0.02)
            elif moment == "after a commit":
                commits = len(batch_ids(stream.readings, "commits"))
                wait_for(lambda c=commits: len(batch_ids(stream.readings, "commits")) > c, "a new commit",
                         timeout=120, every=0.02)
            else:
                time.sleep(rng.uniform(0.0, 4.0))  # the fault's moment itself, drawn at random
            pid, killed_at = kill_driver(stream)
            timings[f"kill {n} ({moment})"] = stream.recovered(killed_at, pid, f"SIGKILL {n} {moment}")
        if STANDBY:
            kills = [t for what, t in timings.items() if what.startswith("kill ")]
            assert max(kills) <= STANDBY_RECOVERY_SECONDS, f"a takeover by the standby took longer: {timings}"

            # a SIGKILL of the standby costs the active driver nothing: it keeps its epoch and commits
            wait_for(stream.standby_ready, "a ready standby", timeout=180, every=0.2)
            active = stream.driver()
            (standby,) = [s for s in standbys(stream.layout.lease_dir) if s.state == "ready"]
            os.kill(standby.pid, signal.SIGKILL)
            fed_at = time.time()
            stream.feed(4)
            wait_for(lambda: stream.committed_after(fed_at), "the active driver to take new input", timeout=60,
                     every=0.2)
            assert stream.driver().epoch == active.epoch and stream.driver().pid == active.pid
            wait_for(lambda: any(s.pid != standby.pid for s in standbys(stream.layout.lease_dir)),
                     "a new standby", timeout=120, every=0.5)

        # 2. a frozen driver (Python and JVM) with input waiting: stalled, stopped, restarted
        holder = stream.driver()
        frozen = [holder.pid] + ([holder.launcher_pid] if holder.launcher_pid > 1 else [])
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        frozen_at = time.time()
        stream.feed(4)
        try:
            wait_for(lambda: assess(stream.plan, stream.layout).status == Status.STALLED, "the stall to be seen",
                     timeout=STALL_WINDOW_SECONDS + 60, every=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc} (pids {frozen} frozen)\n{supervisor_said(airflow)}") from None
        timings["freeze (stall window 30s)"] = stream.recovered(frozen_at, holder.pid, "SIGSTOP")
        assert "is stalled" in supervise_log(airflow)

        # 3. the Airflow task process supervising the driver dies: the retry adopts the driver
        holder = stream.driver()
        task_pid = psutil.Process(holder.launcher_pid).ppid()
        assert " ".join(psutil.Process(task_pid).cmdline()).startswith("airflow worker --"), "not the task process"
        os.kill(task_pid, signal.SIGKILL)
        killed_at = time.time()
        wait_for(lambda: "adopting it instead of starting a second one" in supervise_log(airflow),
                 "the retried task to adopt the running driver", timeout=180, every=1)
        fed_at = time.time()
        stream.feed(4)
        wait_for(lambda: stream.committed_after(fed_at), "the adopted driver to take new input", timeout=120, every=0.5)
        assert stream.driver().pid == holder.pid, supervisor_said(airflow)
        timings["task process killed (driver adopted)"] = time.time() - killed_at

        # 4. a crash between batches, then the newest commit file is lost (as by `rm`, its checksum
        # file stays): the batch is replayed, and the sinks skip what they already hold
        stream.feed(4)
        commits = len(batch_ids(stream.readings, "commits"))
        wait_for(lambda: len(batch_ids(stream.readings, "commits")) > commits and not stream.in_flight(),
                 "a commit with no batch in flight", timeout=120, every=0.02)
        pid, killed_at = kill_driver(stream)
        newest = stream.readings / "commits" / str(batch_ids(stream.readings, "commits")[-1])
        newest.unlink()
        timings["kill + lost commit file"] = stream.recovered(killed_at, pid, f"SIGKILL, {newest} deleted")

        # 5. a crash that leaves half-written temporary files in the checkpoint
        stream.feed(4)
        pid, killed_at = kill_driver(stream)
        next_batch = batch_ids(stream.readings, "offsets")[-1] + 1
        (stream.readings / "offsets" / f".{next_batch}.6f1c2e0a.tmp").write_text('v1\n{"batchWatermarkMs":17')
        (stream.readings / "commits" / f".{next_batch}.0b9d4c11.tmp").write_text("v")
        timings["kill + half-written temp files"] = stream.recovered(killed_at, pid, "SIGKILL with temp files left")

        # caught up: every sink equals the ground truth, nothing lost, nothing duplicated; the
        # late events at the watermark's edge count as the ingestion decided them
        stream.catch_up()
        manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())
        assert manifest["counts"]["undecided"] > 0, manifest["counts"]
        decided = verify.decide_edges(spark, stream.plan, manifest)
        assert decided["counts"]["undecided"] == 0
        edges_dropped = decided["counts"]["dropped_late"] - manifest["counts"]["dropped_late"]
        print(f"late events at the watermark's edge: {manifest['counts']['undecided']}, "
              f"{edges_dropped} dropped by the ingestion")
        report = verify.compare(spark, stream.plan, manifest)
        print(report.describe())
        assert report.ok, report.describe()
        # and with each other: every output equals its query over the same accepted rows
        agreement = verify.agreement(spark, stream.plan, report.uncertain)
        assert all(r.ok for r in agreement), "\n".join(r.describe() for r in agreement)
        # each fault cost a takeover or a restart, never a failed driver (a replay tripping on what a
        # lost file left, say)
        assert stream.failures() == [], stream.failures()

        # 6. a torn newest offsets file, then a crash: diagnosed, not restarted, nor taken over
        torn = stream.readings / "offsets" / str(batch_ids(stream.readings, "offsets")[-1])
        torn.write_bytes(torn.read_bytes()[: len(torn.read_bytes()) // 2])
        kill_driver(stream)
        wait_for(lambda: [r["state"] for r in airflow.runs("stream_sensors")] == ["failed"],
                 "the supervisor to fail on the torn checkpoint", timeout=240, every=2)
        log = supervise_log(airflow)
        assert "the checkpoint is corrupt and is not reset automatically" in log
        assert str(torn) in log and "What you can do" in log
        assert stream_drivers() == []
    finally:
        airflow.stop()
        for pid in stream_drivers():
            os.kill(pid, signal.SIGKILL)
    print("\n".join(f"{what}: {seconds:.1f}s" for what, seconds in timings.items()))
    one_driver_at_a_time(stream.layout)
