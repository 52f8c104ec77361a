"""What the platform costs a stream, against the same job run by bare ``spark-submit``.

    python -m bench.platform_cost [--quick] [--repeats N] [--only restart]

All on the ``sensors`` stream (a copy of ``include/streams/sensors.yaml`` whose only
changes are a 1-second processing-time trigger, so that the machine, not the trigger,
bounds a micro-batch; a stall window of ``--stall-window`` seconds; the restart policy of
the fault tests; and an on-demand quality DAG), Spark ``local[2]``, one run:

1. throughput: the same generated input processed by the stream deployed through its DAG
   (``stream_sensors``: SparkSubmitOperator, supervisor polling, Airflow's four services
   running) and by bare ``spark-submit`` of the same job; input rows per second from the
   start of the first micro-batch to the commit, in every output, of the batch that read the
   rows the ingestion accepted from the last input file (JVM start excluded);
2. recovery: SIGKILL of the driver right after a commit, with input waiting, to the first
   batch committed by a new driver: restarted by the supervisor, or by this script running
   ``spark-submit`` again the moment the old one ends;
3. stall: SIGSTOP of the driver and its JVM with input waiting, to the first batch committed
   by the new driver the supervisor started, against the stall window;
4. freshness: from one file landing to its rows committed in the ``readings`` sink (the
   commit of the batch whose source log took the file), and to a triggered run of the
   quality DAG ``stream_sensors_quality`` succeeding, as multiples of the trigger interval;
5. growth: bare ``spark-submit --trigger available-now`` over 1x, 4x and 16x the input
   (more events per file, the same files and batches): time and peak resident memory of
   the driver JVM and its Python processes (sampled from /proc every 0.2 s); and the time
   from ``spark-submit`` to the first committed batch of a restart with one new file, once
   1,000 and 10,000 files have been processed, and again after the platform archived the
   10,000 committed files (``source.archive_path``).

Bare cases run first, without Airflow; then one Airflow instance (API server, scheduler
with the LocalExecutor, DAG processor, triggerer) serves every platform case, one cycle
per repeat: deploy, throughput, SIGKILL, SIGSTOP, freshness, stop through the stop DAG.
Medians of ``--repeats`` are printed with their ratios and the aims, and written to
``bench/results/platform.json`` with every sample; the chart goes to
``bench/results/platform.png``. ``--quick``: one repeat on small inputs (a smoke check);
``--replot``: summarize the samples of ``platform.json`` again and redraw, running nothing;
``--only restart``: run the restart cases alone and put them into the recorded results.
Every process started is ended by pid, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    MASTER,
    PeakRss,
    airflow,
    clean_up,
    cmdline,
    end_everything,
    epoch,
    kill_pids,
    landing_of,
    run_generator,
    start_airflow,
    working_folder,
)
from bench.report import RESULTS, Progress, machine, median_of, pyplot, save_chart, verdict, write_results
from runner.processes import wait_for, wait_until
from runner.testdata.demo import spark_submit
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import (
    batch_ids,
    file_name,
    processed_files,
    sink_files,
)
from spark_jobs.runtime.lease import (
    holder_alive,
    read_holder,
)
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import (
    Layout,
    project_root,
)
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
)
from streamops.health import Status, assess

STREAM = "sensors"
TRIGGER_SECONDS = 1.0
RESTART_POLICY = {"max_attempts": 12, "backoff_initial_seconds": 1, "backoff_max_seconds": 4,
                  "stable_after_minutes": 10}  # as in tests/e2e/test_faults.py
FEED_FILES = 6  # fed before a driver is killed or frozen (it is then mid-stream), and again after (input waits)
PART = "part-*"


# ---- the stream's files ------------------------------------------------------------------------


def spec_copy(root: Path, stall_window: float, max_files_per_trigger: int | None = None,
              archive_path: str | None = None) -> Path:
    """``include/`` with the sensors spec changed as the module docstring says; the spec's path."""
    include = project_root() / "include"
    for folder in ("expectations", "reference"):
        shutil.copytree(include / folder, root / folder)
    rules = yaml.safe_load((include / "expectations" / f"{STREAM}.yaml").read_text())
    # validated when the benchmark triggers it, not on new output or a clock mid-measurement
    rules.update(schedule="@once", on_new_output=False)
    (root / "expectations" / f"{STREAM}.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    spec = yaml.safe_load((include / "streams" / f"{STREAM}.yaml").read_text())
    spec["trigger"] = {"processing_time": f"{TRIGGER_SECONDS:g} second"}
    spec["supervision"] = {**spec["supervision"], "stall_window": f"{stall_window:g} seconds",
                           "restart": RESTART_POLICY}
    if max_files_per_trigger:
        spec["source"]["max_files_per_trigger"] = max_files_per_trigger
    if archive_path:
        spec["source"]["archive_path"] = archive_path
    (root / "streams").mkdir(parents=True)
    path = root / "streams" / f"{STREAM}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def input_rows(data_root: Path) -> int:
    return json.loads((data_root / "generated" / STREAM / "manifest.json").read_text())["counts"]["input_records"]


class Stream:
    """One data root of the stream: its layout, input and checkpoints, read from files only."""

    def __init__(self, spec_path: Path, data_root: Path):
        self.spec_path, self.data_root = spec_path, data_root
        spec = load_spec(spec_path)
        self.layout = Layout(spec, data_root, spec_path.parent)
        self.plan = compile_plan(spec, self.layout)
        self.readings = Path(self.plan.checkpoint(INGEST_FLOW))
        self.landing = landing_of(self.plan)
        self.seed = 1000

    def landing_files(self) -> set[str]:
        return {p.name for p in Path(self.landing).glob(PART)}

    def feed(self, files: int, events_per_file: int) -> list[Path]:
        before = self.landing_files()
        self.seed += 1
        run_generator(self.spec_path, self.data_root, files, events_per_file, self.seed, empty_files=0)
        return sorted(Path(self.landing) / n for n in self.landing_files() - before)

    def taken(self, query: str, through_batch: int) -> set[str]:
        paths = processed_files(self.plan.checkpoint(query), through_batch=through_batch)
        return {file_name(p) for p in paths}

    def taking_batch(self, query: str, names: set[str]) -> int | None:
        """The committed batch of ``query`` by which every file in ``names`` was taken (the first
        such batch), or None while it is not committed."""
        found = None
        for batch in reversed(batch_ids(self.plan.checkpoint(query), "commits")):
            if not names <= self.taken(query, batch):
                break
            found = batch
        return found

    def writer_of(self, output: str) -> str:
        """The query that commits an output: ``_ingest`` for the output the ingestion serves
        (its sink is the accepted-rows table), else the output's own."""
        served = self.plan.output_written_by_ingestion
        return INGEST_FLOW if served is not None and served.name == output else output

    def output_taking_batch(self, output: str, landed: set[str]) -> int | None:
        """The committed batch of an output by which it read every row the ingestion accepted
        from the ``landed`` files, or None while it has not. ``output`` is ``_ingest`` for the
        output the ingestion serves: that batch is the ingestion's own."""
        ingested = self.taking_batch(INGEST_FLOW, landed)
        if ingested is None or output == INGEST_FLOW:
            return ingested
        accepted = {file_name(p) for p in sink_files(self.plan.accepted_path, through_batch=ingested)}
        return self.taking_batch(output, accepted)

    def commit_time(self, query: str, batch: int) -> float:
        return (Path(self.plan.checkpoint(query)) / "commits" / str(batch)).stat().st_mtime

    def commits_after(self, moment: float, checkpoint: Path | None = None) -> list[float]:
        times = []
        for p in ((checkpoint or self.readings) / "commits").glob("[0-9]*"):
            with contextlib.suppress(FileNotFoundError):
                if (t := p.stat().st_mtime) > moment:
                    times.append(t)
        return sorted(times)

    def holder(self):  # the live lease holder, or None
        holder = read_holder(self.layout.lease_dir)
        return holder if holder is not None and holder_alive(self.layout.lease_dir) else None

    def first_batch_start(self) -> float:
        starts = [epoch(e["timestamp"]) for e in read_events(self.layout.events_file)
                  if e.get("event") == "progress" and e.get("batch_id") == 0]
        if not starts:
            raise RuntimeError(f"no progress event of batch 0 in {self.layout.events_file}")
        return min(starts)

    def throughput(self, rows: int, started: float, timeout: float) -> dict[str, float]:
        """Wait until every output committed the rows the ingestion accepted from all the
        landing files; rows per second from the first batch's start to the last of those commits."""
        names = self.landing_files()
        outputs = [self.writer_of(o.name) for o in self.plan.outputs]
        batches = wait_for(lambda: (b := {q: self.output_taking_batch(q, names) for q in outputs})
                           and all(v is not None for v in b.values()) and b,
                           f"every output to commit the rows of the {len(names)} input files", timeout, every=0.5)
        end = max(self.commit_time(q, b) for q, b in batches.items())
        begin = self.first_batch_start()
        return {"rows": rows, "seconds": end - begin, "rows_per_s": rows / (end - begin),
                "startup_s": begin - started, "batches": max(batches.values()) + 1}

    def new_drivers_first_commit(self, old_pid: int) -> tuple[float, float] | None:
        """(start of the new driver, its first committed readings batch), once there is one."""
        holder = read_holder(self.layout.lease_dir)
        if holder is None or holder.pid == old_pid:
            return None
        commits = self.commits_after(holder.started_at)
        return (holder.started_at, commits[0]) if commits else None

    def wait_for_commit(self, timeout: float = 300) -> None:
        count = len(batch_ids(self.readings, "commits"))
        wait_for(lambda: len(batch_ids(self.readings, "commits")) > count, "a new committed batch", timeout,
                 every=0.02)


def copy_input(source: Path, data_root: Path) -> None:
    """The generated input (landing files with their modification times, and the generator's
    state and ground truth) into a fresh data root."""
    shutil.copytree(source, data_root, dirs_exist_ok=True)


# ---- bare spark-submit ---------------------------------------------------------------------------


class BareStream:
    """``spark-submit`` of the stream job (:func:`runner.testdata.demo.spark_submit`) in a thread; with
    ``restart``, run again the moment it ends, unless it finished or was asked to stop."""

    def __init__(self, stream: Stream, *extra: str, restart: bool = False):
        self.stream, self.extra, self.restart = stream, extra, restart
        self.logs = stream.data_root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.codes: list[int] = []
        self.started_at = 0.0
        self._stopping = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            log = self.logs / f"spark-submit-{len(self.codes)}.log"
            self.codes.append(spark_submit(self.stream.spec_path, self.stream.data_root, MASTER, log, *self.extra))
            if not self.restart or self._stopping or self.codes[-1] == 0:
                return

    def start(self) -> BareStream:
        self.started_at = time.time()
        self._thread.start()
        return self

    def wait(self, timeout: float) -> int:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"spark-submit did not end within {timeout:.0f}s")
        return self.codes[-1]

    def kill(self) -> None:
        """No more restarts; SIGKILL the driver and its JVM."""
        self._stopping = True
        holder = read_holder(self.stream.layout.lease_dir)
        if holder is not None:
            kill_pids({pid: cmdline(pid) for pid in (holder.pid, holder.launcher_pid) if pid > 1})

    def stop(self, timeout: float = 180) -> None:
        """Graceful stop through the stop marker (touched again if a restarting driver removed it)."""
        self._stopping = True
        marker = self.stream.layout.stop_marker

        def stopped() -> bool:
            if not self._thread.is_alive():
                return True
            if not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.touch()
            return False

        wait_for(stopped, "the bare driver to stop", timeout)


# ---- Airflow --------------------------------------------------------------------------------------


class Platform:
    """One Airflow for every platform case; its REST API (no login: every request is an admin)."""

    DAGS = (f"stream_{STREAM}", f"stream_{STREAM}_stop", f"stream_{STREAM}_quality")

    def __init__(self, work: Path, spec_path: Path, data_root: Path):
        self.stream = Stream(spec_path, data_root)
        self.airflow, self.api = airflow(work / "airflow", data_root, spec_path.parent)
        self.deployed: str | None = None

    def start(self) -> None:
        start_airflow(self.airflow, self.api, self.DAGS)
        # the quality DAG's schedule is @once: its one scheduled run comes on unpausing; let it end first
        wait_until(lambda: (runs := self.api.runs(self.DAGS[2])) and all(r["state"] in ("success", "failed") for r in runs),
                   300, every=2)

    def wait_run(self, dag: str, run_id: str, timeout: float, every: float = 0.5) -> dict:
        def ended() -> dict | None:
            if self.airflow.dead_services():
                raise RuntimeError(f"Airflow service(s) ended: {self.airflow.dead_services()}")
            run = self.api.run(dag, run_id)
            return run if run["state"] in ("success", "failed") else None

        return wait_for(ended, f"{dag} run {run_id} to end", timeout, every)

    def deploy(self) -> float:
        triggered = time.time()
        self.deployed = self.api.trigger(self.DAGS[0])
        return triggered

    def stop_stream(self) -> None:
        stop = self.api.trigger(self.DAGS[1], {"mode": "graceful"})
        state = self.wait_run(self.DAGS[1], stop, 300, every=1)["state"]
        if state != "success":
            raise RuntimeError(f"the stop DAG ended {state}; see {self.airflow.home}/logs")
        if self.deployed:
            self.wait_run(self.DAGS[0], self.deployed, 300, every=1)
            self.deployed = None


# ---- the cases ------------------------------------------------------------------------------------


def recovery(stream: Stream, events_per_file: int, after_kill: Callable[[], None] = lambda: None) -> dict:
    """SIGKILL the driver right after a commit with input waiting; seconds to the new driver's first commit."""
    stream.feed(FEED_FILES, events_per_file)
    stream.wait_for_commit()
    holder = stream.holder()
    if holder is None:
        raise RuntimeError("no live driver to kill")
    os.kill(holder.pid, signal.SIGKILL)
    killed_at = time.time()
    stream.feed(FEED_FILES, events_per_file)  # the driver may have taken every file fed before: input waits
    after_kill()
    started, committed = wait_for(lambda: stream.new_drivers_first_commit(holder.pid),
                                  "a new driver's first committed batch after SIGKILL", 300, every=0.1)
    return {"seconds": committed - killed_at, "new_driver_after_s": started - killed_at,
            "first_commit_after_start_s": committed - started}


def stall(stream: Stream, events_per_file: int, window: float) -> dict:
    """SIGSTOP the driver and its JVM right after a commit with input waiting; seconds to the first
    batch committed by the driver the supervisor starts instead."""
    stream.feed(FEED_FILES, events_per_file)
    stream.wait_for_commit()
    holder = stream.holder()
    if holder is None:
        raise RuntimeError("no live driver to freeze")
    frozen = [holder.pid] + ([holder.launcher_pid] if holder.launcher_pid > 1 else [])
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    frozen_at = time.time()
    stream.feed(FEED_FILES, events_per_file)  # input waiting, which makes a frozen driver a stalled one
    seen: list[float] = []

    def recovered() -> tuple[float, float] | None:
        if not seen and assess(stream.plan, stream.layout).status == Status.STALLED:
            seen.append(time.time())  # what the supervisor sees at its next poll
        return stream.new_drivers_first_commit(holder.pid)

    started, committed = wait_for(recovered, "a new driver's first committed batch after SIGSTOP", window + 300,
                                  every=0.5)
    return {"seconds": committed - frozen_at, "stall_visible_after_s": seen[0] - frozen_at if seen else None,
            "new_driver_after_s": started - frozen_at, "first_commit_after_start_s": committed - started}


def freshness(p: Platform, events_per_file: int) -> dict:
    """One file lands; seconds to its rows committed in the readings sink, then to a quality run's success."""
    stream = p.stream
    wait_for(lambda: assess(stream.plan, stream.layout).status == Status.IDLE, "the stream to be idle", 600, every=1)
    (landed,) = stream.feed(1, events_per_file)
    landed_at = landed.stat().st_mtime
    readings = stream.writer_of("readings")
    batch = wait_for(lambda: (b := stream.output_taking_batch(readings, {landed.name})) is not None and (b,),
                     f"{landed.name} to be committed in the readings sink", 300, every=0.1)[0]
    in_sink = stream.commit_time(readings, batch)
    triggered = time.time()
    run = p.wait_run(p.DAGS[2], p.api.trigger(p.DAGS[2]), 900, every=0.5)
    validated = epoch(run["end_date"])
    return {"in_sink_s": in_sink - landed_at, "validated_s": validated - landed_at, "quality_state": run["state"],
            "quality_run_s": validated - epoch(run["start_date"]), "quality_queued_s": epoch(run["start_date"]) - triggered,
            "in_sink_triggers": (in_sink - landed_at) / TRIGGER_SECONDS,
            "validated_triggers": (validated - landed_at) / TRIGGER_SECONDS}


def bare_cycle(spec_path: Path, source: Path, root: Path, rows: int, events_per_file: int) -> dict:
    """Throughput, then recovery, of one bare spark-submit (restarted by this script when it dies)."""
    copy_input(source, root)
    stream = Stream(spec_path, root)
    bare = BareStream(stream, restart=True).start()
    try:
        result = {"throughput": stream.throughput(rows, bare.started_at, 1800)}
        result["recovery"] = recovery(stream, events_per_file)
        bare.stop()
    except BaseException:
        bare.kill()
        raise
    return result


def platform_cycle(p: Platform, source: Path, rows: int, events_per_file: int, window: float) -> dict:
    """Deploy through the DAG; throughput, SIGKILL, SIGSTOP, freshness; stop through the stop DAG."""
    stream = p.stream
    for child in stream.data_root.iterdir():
        if child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()
    copy_input(source, stream.data_root)
    triggered = p.deploy()
    result = {"throughput": stream.throughput(rows, triggered, 1800)}
    result["recovery"] = recovery(stream, events_per_file)
    result["stall"] = stall(stream, events_per_file, window)
    result["freshness"] = freshness(p, events_per_file)
    p.stop_stream()
    return result


def growth_run(spec_path: Path, source: Path, root: Path) -> dict:
    """One bare available-now run over the input in ``source``: wall time, processing time, peak memory."""
    copy_input(source, root)
    stream = Stream(spec_path, root)
    sampler = PeakRss(os.getpid(), include_root=False)  # every spark-submit this script starts
    sampler.start()
    started = time.time()
    try:
        code = BareStream(stream, "--trigger", "available-now").start().wait(3600)
    finally:
        memory = sampler.stop()
    wall = time.time() - started
    if code != 0:
        raise RuntimeError(f"available-now run failed (exit {code}); see {root / 'logs'}")
    rows = input_rows(root)
    done = stream.throughput(rows, started, 60)
    shutil.rmtree(root)
    return {"rows": rows, "wall_s": wall, "processing_s": done["seconds"], "rows_per_s": done["rows_per_s"],
            **memory}


def restart_time(stream: Stream) -> dict:
    """One new file, then an available-now restart: seconds from spark-submit to its first committed batch."""
    stream.feed(1, 1)
    bare = BareStream(stream, "--trigger", "available-now").start()
    code = bare.wait(1800)
    if code != 0:
        raise RuntimeError(f"restart failed (exit {code}); see {stream.data_root / 'logs'}")
    commits = stream.commits_after(bare.started_at)
    return {"seconds": commits[0] - bare.started_at, "wall_s": time.time() - bare.started_at}


def restart_cases(spec_path: Path, root: Path, sizes: list[int], repeats: int,
                  note: Callable[[str], None]) -> tuple[dict, dict]:
    """Restart times after each number of processed files with every file still in the landing
    directory, then after the largest with the committed files archived (``spark_jobs.runtime.archive``)."""
    from spark_jobs.runtime.archive import archive

    stream = Stream(spec_path, root)
    full: dict[int, list[dict]] = {}
    processed = 0
    for n in sizes:
        run_generator(spec_path, stream.data_root, n - processed, 1, seed=n, empty_files=0)
        processed = n
        code = BareStream(stream, "--trigger", "available-now").start().wait(3600)
        if code != 0:
            raise RuntimeError(f"processing {n} files failed (exit {code})")
        note(f"{n} files processed")
        full[n] = []
        for i in range(repeats):
            result = restart_time(stream)
            full[n].append(result)
            processed += 1
            note(f"restart after {n} files {i + 1}/{repeats}: first commit after {result['seconds']:.1f}s")
    moved = archive(stream.plan, now=time.time() + 86400)  # archive_after is not measured here
    note(f"{moved.describe()}; {len(stream.landing_files())} file(s) left in the landing directory")
    largest = sizes[-1]
    archived: dict[int, list[dict]] = {largest: []}
    for i in range(repeats):
        result = restart_time(stream)
        archived[largest].append(result)
        note(f"restart after {largest} files, archived, {i + 1}/{repeats}: first commit after {result['seconds']:.1f}s")
    return full, archived


def write_only_restart(raw: dict, wall: float) -> int:
    """Put new restart samples into the recorded results and summarize them again."""
    path = RESULTS / "platform.json"
    results = json.loads(path.read_text())
    results["samples"]["restart"], results["samples"]["restart_archived"] = raw["restart"], raw["restart_archived"]
    results["restart_wall_s"] = wall
    path.write_text(json.dumps(results, indent=1))
    return replot(path)


# ---- reporting -------------------------------------------------------------------------------------


def summarize(raw: dict, window: float) -> dict:
    bare, plat = raw["bare"], raw["platform"]
    tp_bare, tp_plat = median_of(bare, "throughput", "rows_per_s"), median_of(plat, "throughput", "rows_per_s")
    rec_bare, rec_plat = median_of(bare, "recovery", "seconds"), median_of(plat, "recovery", "seconds")
    stall_s = median_of(plat, "stall", "seconds")
    visible = [c["stall"]["stall_visible_after_s"] for c in plat if c["stall"]["stall_visible_after_s"] is not None]
    fresh_sink, fresh_valid = median_of(plat, "freshness", "in_sink_s"), median_of(plat, "freshness", "validated_s")
    growth = []
    for factor, runs in raw["growth"].items():
        growth.append({"factor": int(factor), "rows": runs[0]["rows"],
                       **{k: statistics.median(r[k] for r in runs)
                          for k in ("wall_s", "processing_s", "rows_per_s", "peak_rss_mb", "peak_jvm_mb",
                                    "peak_python_mb")}})
    def restart_runs(samples: dict) -> list[dict]:
        return [{"processed_files": int(n), "seconds": statistics.median(r["seconds"] for r in runs),
                 "wall_s": statistics.median(r["wall_s"] for r in runs)} for n, runs in samples.items()]

    restarts, archived = restart_runs(raw["restart"]), restart_runs(raw.get("restart_archived", {}))
    # linear: time = a + b * rows through the smallest and largest input; the middle one is checked against it
    lo, mid, hi = growth[0], growth[len(growth) // 2], growth[-1]
    slope = (hi["processing_s"] - lo["processing_s"]) / (hi["rows"] - lo["rows"])
    predicted = lo["processing_s"] + slope * (mid["rows"] - lo["rows"])
    linear_error = abs(mid["processing_s"] - predicted) / mid["processing_s"]
    restart_ratio = restarts[-1]["seconds"] / restarts[0]["seconds"]
    archived_ratio = archived[-1]["seconds"] / restarts[0]["seconds"] if archived else None
    return {
        "throughput": {"bare_rows_per_s": tp_bare, "platform_rows_per_s": tp_plat, "ratio": tp_plat / tp_bare,
                       "bare_startup_s": median_of(bare, "throughput", "startup_s"),
                       "platform_startup_s": median_of(plat, "throughput", "startup_s"),
                       "aim": ">= 0.95", "met": tp_plat / tp_bare >= 0.95},
        "recovery": {"bare_s": rec_bare, "platform_s": rec_plat, "ratio": rec_plat / rec_bare,
                     "bare_new_driver_s": median_of(bare, "recovery", "new_driver_after_s"),
                     "platform_new_driver_s": median_of(plat, "recovery", "new_driver_after_s"),
                     "aim": "<= 1.5x bare and < 30 s", "met": rec_plat / rec_bare <= 1.5 and rec_plat < 30},
        "stall": {"window_s": window, "platform_s": stall_s, "over_window_s": stall_s - window,
                  "visible_s": statistics.median(visible) if visible else None,
                  "new_driver_s": median_of(plat, "stall", "new_driver_after_s"),
                  "aim": f"<= window + 15 s = {window + 15:g} s", "met": stall_s <= window + 15},
        "freshness": {"trigger_s": TRIGGER_SECONDS, "in_sink_s": fresh_sink, "validated_s": fresh_valid,
                      "in_sink_triggers": fresh_sink / TRIGGER_SECONDS,
                      "validated_triggers": fresh_valid / TRIGGER_SECONDS,
                      "quality_run_s": median_of(plat, "freshness", "quality_run_s"),
                      "quality_runs_succeeded": sum(c["freshness"]["quality_state"] == "success" for c in plat),
                      "quality_runs": len(plat)},
        "growth": {"runs": growth, "seconds_per_1000_rows": slope * 1000, "fixed_s": lo["processing_s"] - slope * lo["rows"],
                   "middle_off_line": linear_error, "aim": "linear in the input", "met": linear_error <= 0.10,
                   "memory_ratio_largest_to_smallest": hi["peak_rss_mb"] / lo["peak_rss_mb"]},
        "restart": {"runs": restarts, "ratio_largest_to_smallest": restart_ratio, "archived_runs": archived,
                    "archived_ratio": archived_ratio, "aim": "flat (within 25%)",
                    "met": (archived_ratio if archived_ratio is not None else restart_ratio) <= 1.25},
    }


def table(s: dict) -> list[str]:
    t, r, st, f = s["throughput"], s["recovery"], s["stall"], s["freshness"]
    lines = [f"{'case':<42} {'bare':>10} {'platform':>10} {'ratio':>7}  aim",
             f"{'throughput, rows/s':<42} {t['bare_rows_per_s']:>10.0f} {t['platform_rows_per_s']:>10.0f} "
             f"{t['ratio']:>7.2f}  {t['aim']}: {verdict(t['met'])}",
             f"{'SIGKILL -> first new commit, s':<42} {r['bare_s']:>10.1f} {r['platform_s']:>10.1f} "
             f"{r['ratio']:>7.2f}  {r['aim']}: {verdict(r['met'])}",
             f"{'SIGSTOP -> first new commit, s':<42} {'window ' + format(st['window_s'], 'g'):>10} "
             f"{st['platform_s']:>10.1f} {st['platform_s'] / st['window_s']:>7.2f}  {st['aim']}: {verdict(st['met'])}",
             f"{'landing -> readings sink, s':<42} {'trigger ' + format(f['trigger_s'], 'g'):>10} "
             f"{f['in_sink_s']:>10.1f} {f['in_sink_triggers']:>6.1f}x",
             f"{'landing -> validated (quality DAG), s':<42} {'':>10} {f['validated_s']:>10.1f} "
             f"{f['validated_triggers']:>6.1f}x  (quality run itself {f['quality_run_s']:.1f} s; "
             f"{f['quality_runs_succeeded']}/{f['quality_runs']} succeeded)",
             "",
             f"{'available-now, bare':<22} {'rows':>9} {'wall s':>8} {'batches s':>10} {'rows/s':>8} "
             f"{'peak MB':>8} {'JVM MB':>8} {'Python MB':>10}"]
    for g in s["growth"]["runs"]:
        lines.append(f"{str(g['factor']) + 'x input':<22} {g['rows']:>9} {g['wall_s']:>8.1f} {g['processing_s']:>10.1f} "
                     f"{g['rows_per_s']:>8.0f} {g['peak_rss_mb']:>8.0f} {g['peak_jvm_mb']:>8.0f} "
                     f"{g['peak_python_mb']:>10.0f}")
    gr = s["growth"]
    lines.append(f"{'':<22} {gr['fixed_s']:.1f} s fixed + {gr['seconds_per_1000_rows']:.2f} s per 1,000 rows; middle size "
                 f"{gr['middle_off_line'] * 100:.0f}% off that line; {gr['aim']}: {verdict(gr['met'])}")
    lines.append("")
    lines.append(f"{'restart (available-now)':<30} {'to first commit s':>18} {'wall s':>8}")
    for x in s["restart"]["runs"]:
        lines.append(f"{format(x['processed_files'], ',') + ' files processed':<30} {x['seconds']:>18.1f} "
                     f"{x['wall_s']:>8.1f}")
    rs = s["restart"]
    for x in rs.get("archived_runs") or []:
        lines.append(f"{format(x['processed_files'], ',') + ' processed, archived':<30} {x['seconds']:>18.1f} "
                     f"{x['wall_s']:>8.1f}")
    lines.append(f"{'':<30} ratio largest to smallest {rs['ratio_largest_to_smallest']:.2f}"
                 + (f", archived largest to smallest {rs['archived_ratio']:.2f}" if rs.get("archived_ratio") else "")
                 + f"; {rs['aim']}: {verdict(rs['met'])}")
    return lines


def chart(s: dict, path: Path) -> None:
    fig, ax = pyplot().subplots(2, 3, figsize=(15, 8.5))
    t, r, st, f = s["throughput"], s["recovery"], s["stall"], s["freshness"]
    colors = ["#7a8793", "#2f6db5"]
    a = ax[0][0]
    a.bar(["bare", "platform"], [t["bare_rows_per_s"], t["platform_rows_per_s"]], color=colors)
    a.set_title(f"throughput (ratio {t['ratio']:.2f})")
    a.set_ylabel("input rows / s")
    a = ax[0][1]
    first = [r.get("bare_new_driver_s", 0), r.get("platform_new_driver_s", 0)]
    a.bar(["bare", "platform"], first, color="#c9ced3", label="to the new driver's start")
    a.bar(["bare", "platform"], [r["bare_s"] - first[0], r["platform_s"] - first[1]], bottom=first, color=colors,
          label="JVM, session, first batch")
    a.axhline(30, ls="--", c="r", lw=1, label="30 s")
    a.set_title(f"SIGKILL -> first new commit (ratio {r['ratio']:.2f})")
    a.set_ylabel("s")
    a.set_ylim(0, max(r["bare_s"], r["platform_s"], 30) * 1.4)
    a.legend(loc="upper center", fontsize=8, ncol=2)
    a = ax[0][2]
    visible, restarted = st.get("visible_s") or 0, st.get("new_driver_s") or 0
    a.bar(["platform"], [visible], color="#e8c07d", label="until seen stalled")
    a.bar(["platform"], [restarted - visible], bottom=[visible], color="#c9ced3", label="stop, kill, backoff, start")
    a.bar(["platform"], [st["platform_s"] - restarted], bottom=[restarted], color=colors[1],
          label="JVM, session, first batch")
    a.axhline(st["window_s"], ls=":", c="k", lw=1, label=f"stall window {st['window_s']:g} s")
    a.axhline(st["window_s"] + 15, ls="--", c="r", lw=1, label="window + 15 s")
    a.set_title("SIGSTOP -> first new commit")
    a.set_ylabel("s")
    a.set_ylim(0, max(st["platform_s"], st["window_s"] + 15) * 1.6)
    a.legend(loc="upper center", fontsize=8, ncol=2)
    a = ax[1][0]
    a.bar(["in readings sink", "validated"], [f["in_sink_s"], f["validated_s"]], color=colors[1])
    a.set_title(f"freshness after a file lands (trigger {f['trigger_s']:g} s)")
    a.set_ylabel("s")
    a = ax[1][1]
    g = s["growth"]["runs"]
    rows = [x["rows"] for x in g]
    a.plot(rows, [x["processing_s"] for x in g], "o-", c=colors[1], label="batches (s)")
    a.plot(rows, [x["wall_s"] for x in g], "s--", c=colors[0], label="spark-submit wall (s)")
    a.set_xticks(rows, [f"{x['factor']}x\n{x['rows']:,}" for x in g])
    a.set_xlabel("input rows")
    a.set_ylabel("s")
    a.set_ylim(0, max(x["wall_s"] for x in g) * 1.35)
    a2 = a.twinx()
    a2.plot(rows, [x["peak_rss_mb"] for x in g], "^:", c="#c0392b", label="peak RSS (MB)")
    a2.set_ylabel("MB")
    a2.set_ylim(0, max(x["peak_rss_mb"] for x in g) * 1.6)
    a.legend(loc="upper left")
    a2.legend(loc="lower right")
    a.set_title("available-now over 1x, 4x, 16x input")
    a = ax[1][2]
    rs = s["restart"]["runs"]
    archived = s["restart"].get("archived_runs") or []
    a.bar([f"{x['processed_files']:,}" for x in rs], [x["seconds"] for x in rs], color=colors[0],
          label="landing holds every file")
    if archived:
        a.bar([f"{x['processed_files']:,}\narchived" for x in archived], [x["seconds"] for x in archived],
              color=colors[1], label="committed files archived")
        a.legend(loc="lower right", fontsize=8)
    a.set_xlabel("files already processed")
    a.set_ylabel("s")
    a.set_title("restart: spark-submit -> first commit")
    fig.suptitle(f"sensors stream, Spark {MASTER}, {os.cpu_count()} cores: medians")
    save_chart(fig, path)


# ---- main ---------------------------------------------------------------------------------------


def replot(path: Path) -> int:
    results = json.loads(path.read_text())
    results["summary"] = summary = summarize(results["samples"], results["stall_window_s"])
    print("\n".join(table(summary)))
    path.write_text(json.dumps(results, indent=1))
    chart(summary, path.with_suffix(".png"))
    print(f"\nwritten: {path}, {path.with_suffix('.png')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one repeat on small inputs: a smoke check")
    p.add_argument("--repeats", type=int, help="repeats of every case (default 3; 1 with --quick)")
    p.add_argument("--stall-window", type=float, default=30.0, help="the spec copy's stall window in seconds")
    p.add_argument("--keep", action="store_true", help="keep the working folder (data, logs, Airflow home)")
    p.add_argument("--only", choices=["restart"],
                   help="run only the restart cases; the other samples are kept from bench/results/platform.json")
    p.add_argument("--replot", action="store_true",
                   help="run nothing: summarize the samples in bench/results/platform.json again, redraw the chart")
    args = p.parse_args(argv)
    if args.replot:
        return replot(RESULTS / "platform.json")
    repeats = args.repeats or (1 if args.quick else 3)
    sizes = ({"files": 10, "events_per_file": 200, "growth_files": 10, "growth_events": 100, "restart_files": [100, 500]}
             if args.quick else
             {"files": 40, "events_per_file": 500, "growth_files": 40, "growth_events": 500,
              "restart_files": [1000, 10000]})
    factors = (1, 4, 16)
    note = Progress()
    work = working_folder("bench-platform-")
    print(f"working folder {work}; {repeats} repeat(s); sizes {sizes}", flush=True)
    spec_path = spec_copy(work / "include", args.stall_window)
    growth_spec = spec_copy(work / "include-restart", args.stall_window, max_files_per_trigger=1000,
                            archive_path="archive/sensors")
    raw: dict[str, Any] = {"bare": [], "platform": [], "growth": {}, "restart": {}}
    platform: Platform | None = None

    try:
        if args.only == "restart":
            raw["restart"], raw["restart_archived"] = restart_cases(growth_spec, work / "restart",
                                                                   sizes["restart_files"], repeats, note)
            return write_only_restart(raw, wall=note.elapsed())
        source = work / "input"
        run_generator(spec_path, source, sizes["files"], sizes["events_per_file"], seed=7)
        rows = input_rows(source)
        note(f"input: {sizes['files']} files x {sizes['events_per_file']} events = {rows} input rows")

        for i in range(repeats):
            result = bare_cycle(spec_path, source, work / f"bare-{i}", rows, sizes["events_per_file"])
            raw["bare"].append(result)
            note(f"bare {i + 1}/{repeats}: {result['throughput']['rows_per_s']:.0f} rows/s; "
                 f"SIGKILL -> commit {result['recovery']['seconds']:.1f}s")

        for factor in factors:
            run_generator(spec_path, work / f"input-{factor}x", sizes["growth_files"],
                          sizes["growth_events"] * factor, seed=7)
            raw["growth"][factor] = []
        for i in range(repeats):  # sizes interleaved, so that a disturbance does not hit one size only
            for factor in factors:
                result = growth_run(spec_path, work / f"input-{factor}x", work / f"growth-{factor}x-{i}")
                raw["growth"][factor].append(result)
                note(f"available-now {factor}x ({result['rows']} rows) {i + 1}/{repeats}: "
                     f"{result['processing_s']:.1f}s of batches, {result['wall_s']:.1f}s wall, "
                     f"peak {result['peak_rss_mb']:.0f} MB")
        for factor in factors:
            shutil.rmtree(work / f"input-{factor}x")

        raw["restart"], raw["restart_archived"] = restart_cases(growth_spec, work / "restart", sizes["restart_files"],
                                                               repeats, note)

        platform = Platform(work, spec_path, work / "platform-data")
        (work / "platform-data").mkdir()
        platform.start()
        note(f"Airflow up on {platform.airflow.url}")
        for i in range(repeats):
            result = platform_cycle(platform, source, rows, sizes["events_per_file"], args.stall_window)
            raw["platform"].append(result)
            note(f"platform {i + 1}/{repeats}: {result['throughput']['rows_per_s']:.0f} rows/s; "
                 f"SIGKILL -> commit {result['recovery']['seconds']:.1f}s; "
                 f"SIGSTOP -> commit {result['stall']['seconds']:.1f}s; "
                 f"landing -> sink {result['freshness']['in_sink_s']:.1f}s, "
                 f"validated {result['freshness']['validated_s']:.1f}s ({result['freshness']['quality_state']})")
    finally:
        # every process this run started: its descendants, and a driver the platform left (reparented)
        end_everything(platform.stream.layout.lease_dir if platform is not None else None,
                       platform.airflow if platform is not None else None)
        clean_up(work, args.keep)

    wall = note.elapsed()
    summary = summarize(raw, args.stall_window)
    print()
    print("\n".join(table(summary)))
    out = write_results(RESULTS / "platform.json", {
        "machine": machine(),
        "master": MASTER, "trigger_s": TRIGGER_SECONDS, "stall_window_s": args.stall_window, "repeats": repeats,
        "quick": args.quick, "sizes": sizes, "wall_s": wall, "summary": summary, "samples": raw})
    chart(summary, RESULTS / "platform.png")
    print(f"\nwall time {wall / 60:.1f} min; written: {out}, {RESULTS / 'platform.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
