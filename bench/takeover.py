"""How soon a stream runs again after its driver is killed: a warm standby against a cold restart.

    python -m bench.takeover [--kills N] [--every S] [--events-per-file N] [--variants standby,cold,rescale,restart]
                             [--keep]

The stream: ``clicks_four_outputs`` (``bench.harness.bench_specs``: a deduplicating ingestion
joined with reference data, writing the pass-through output; a 15-minute window sliding every
5 minutes, a complete-mode and an update-mode table), with a 2-second trigger and 4 files a
micro-batch. Its input, generated once (``runner.testdata.generate``), lands one file of
``--events-per-file`` events every ``--every`` seconds while the stream runs, so input waits
when a driver dies.

Every driver is submitted as the stream DAG submits it (``spark_jobs.submit.command``: the
platform's jar, the connectors). Each round SIGKILLs the active driver (its Python and its JVM at
once) once it has committed batches of every query, and measures the seconds from the kill to the
first commit of each query (its commit file's time) by the next driver:

* ``standby``: a warm standby (``--standby``, as ``supervision.standby: true`` keeps one) takes the
  stream over. The next standby is launched as the supervisor launches it (once the new driver's
  queries have committed and ``STANDBY_RELAUNCH_SECONDS`` passed since the last launch); the next
  kill waits until it is ready.
* ``cold``: a new driver is started at the kill, as a supervisor without a standby restarts one.

A rescale (sizing by lag set a new per-trigger limit, ``spark_jobs.runtime.rate_limit``; each
round flips it between 2 and 4 files a micro-batch: at most the spec's own 4, the grouping the
ground truth's late records are made for) is measured the same way, without a kill: the
seconds each query goes without a commit, from its last commit by the old driver to its first by
the new one (the new driver's lease divides them), and that the new driver runs at the new size:

* ``rescale``: as the supervisor rescales: a standby launched at the new size, and once it is
  ready the active driver asked to stop between batches, for the standby to take over;
* ``restart``: the driver asked to stop between batches, and a new one started once it exited.

Afterwards every sink is read back against the generator's ground truth (exactly once across
every kill). Output: a table of medians and maxima per query, ``bench/results/takeover.json``.
Every process started is ended by its pid, also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    FOUR,
    MASTER,
    bench_specs,
    child_env,
    clean_up,
    cmdline,
    descendants,
    kill_descendants,
    kill_pids,
    prepare_environment,
    run_generator,
    working_folder,
)
from bench.report import finish
from runner.processes import wait_for
from spark_jobs.plan import compile_plan
from spark_jobs.runtime import rate_limit
from spark_jobs.runtime.checkpoint import (
    batch_ids,
    file_name,
    processed_files,
    sink_files,
    watermark_to_catch_up,
)
from spark_jobs.runtime.driver import request_stop
from spark_jobs.runtime.lease import read_holder
from spark_jobs.runtime.progress import read_events
from spark_jobs.runtime.standby import READY, standbys
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from spark_jobs.submit import command

#: the supervisor's pause between two standby launches (streamops.supervisor)
STANDBY_RELAUNCH_SECONDS = 10.0


class Run:
    """One data root: the stream's spec, its drivers, its landing files fed on a clock."""

    def __init__(self, work: Path, spec_path: Path, staged: Path, every: float):
        self.root = work / "run"
        self.spec_path, self.spec = spec_path, load_spec(spec_path)
        self.layout = Layout(self.spec, str(self.root))
        self.plan = compile_plan(self.spec, self.layout)
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True)
        shutil.copytree(staged / "generated", self.root / "generated")
        assert self.plan.source is not None and self.plan.source.landing is not None
        self.landing = Path(self.plan.source.landing)
        self.pending = sorted(Path(staged, "landing", self.landing.name).iterdir())
        self.landing.mkdir(parents=True)
        self.every = every
        self.drivers: list[subprocess.Popen] = []
        self._halt, self._landing = threading.Event(), threading.Lock()
        self._feeder = threading.Thread(target=self._feed, daemon=True)

    def land(self, n: int) -> None:
        with self._landing:
            for _ in range(min(n, len(self.pending))):
                f = self.pending.pop(0)
                os.link(f, self.landing / f.name)

    def _feed(self) -> None:
        while self.pending and not self._halt.wait(self.every):
            self.land(1)

    def start_feeding(self) -> None:
        self._feeder.start()

    def launch(self, *extra: str) -> subprocess.Popen:
        n = len(self.drivers)
        cmd = command("stream", self.spec_path, MASTER, ["--data-root", str(self.root), *extra], spec=self.spec)
        proc = subprocess.Popen(cmd, stdout=open(self.logs / f"driver-{n}.log", "w"), stderr=subprocess.STDOUT,
                                env=child_env(), start_new_session=True)
        self.drivers.append(proc)
        return proc

    def commits_after(self, moment: float) -> dict[str, float | None]:
        """Per query, the time of its first commit after ``moment``."""
        found: dict[str, float | None] = {}
        for query, checkpoint in self.plan.checkpoints.items():
            times = [p.stat().st_mtime for p in (Path(checkpoint) / "commits").glob("[0-9]*")]
            later = [t for t in times if t > moment]
            found[query] = min(later) if later else None
        return found

    def last_commit_before(self, query: str, moment: float) -> float:
        times = [p.stat().st_mtime for p in (Path(self.plan.checkpoints[query]) / "commits").glob("[0-9]*")]
        return max(t for t in times if t <= moment)

    def every_query_committed_after(self, moment: float) -> dict[str, float] | None:
        found = self.commits_after(moment)
        return found if all(v is not None for v in found.values()) else None  # type: ignore[return-value]

    def kill_active(self) -> float:
        """SIGKILL the lease holder's Python and JVM at once; the moment."""
        holder = read_holder(self.layout.lease_dir)
        assert holder is not None, "no driver holds the stream"
        pids = {pid: cmdline(pid) for pid in (holder.pid, holder.launcher_pid) if pid > 1}
        killed_at = time.time()
        kill_pids(pids)
        return killed_at

    def ready_standby(self) -> bool:
        return any(s.state == READY for s in standbys(self.layout.lease_dir))

    def stop(self) -> None:
        """End the standbys, then stop the active driver between batches (the stop marker)."""
        self._halt.set()
        holder = read_holder(self.layout.lease_dir)
        active = holder.launcher_pid if holder is not None else None
        for proc in self.drivers:
            if proc.poll() is None and proc.pid != active:
                kill_pids({pid: cmdline(pid) for pid in [*descendants(proc.pid), proc.pid]})
                proc.wait()
        marker = self.layout.stop_marker
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps({"mode": "graceful", "by": "bench"}))
        for proc in self.drivers:
            try:
                proc.wait(180)
            except subprocess.TimeoutExpired:
                kill_pids({pid: cmdline(pid) for pid in [*descendants(proc.pid), proc.pid]})
                proc.wait()


def wait_caught_up(run: Run, timeout: float = 600) -> None:
    """Every landed file taken by the ingestion, every accepted file by each output, every planned
    batch committed, and no batch owed that only moves a watermark (it emits an append-mode
    window output's last windows)."""
    landed = {f.name for f in run.landing.iterdir()}
    emitting = [INGEST_FLOW, *(o.name for o in run.plan.outputs_with_flows if o.emits_by_watermark)]

    def caught_up() -> bool:
        if run.pending:
            return False
        checkpoints = run.plan.checkpoints
        if not all(batch_ids(c, "offsets")[-1:] == batch_ids(c, "commits")[-1:] for c in checkpoints.values()):
            return False
        if any(watermark_to_catch_up(checkpoints[q]) for q in emitting):
            return False
        if {file_name(p) for p in processed_files(checkpoints[INGEST_FLOW])} != landed:
            return False
        accepted = {file_name(p) for p in sink_files(run.plan.accepted_path)}
        return all(accepted <= {file_name(p) for p in processed_files(c)}
                   for q, c in checkpoints.items() if q != INGEST_FLOW)

    wait_for(caught_up, "the stream to take every file", timeout, every=1)


def first_driver(variant: str, work: Path, spec_path: Path, staged: Path,
                 args: argparse.Namespace) -> tuple[Run, subprocess.Popen]:
    """The variant's data root with 4 files landed, its first driver once every query committed, and
    the feed of landing files started."""
    run = Run(work / variant, spec_path, staged, args.every)
    run.land(4)
    started = time.time()
    active = run.launch()
    wait_for(lambda: run.every_query_committed_after(started), "the first driver's first commits", 300)
    run.start_feeding()
    return run, active


def one_variant(variant: str, work: Path, spec_path: Path, staged: Path, args: argparse.Namespace,
                say: Any) -> dict[str, Any]:
    run, _ = first_driver(variant, work, spec_path, staged, args)
    standby_launched = float("-inf")
    if variant == "standby":
        run.launch("--standby")
        standby_launched = time.monotonic()
    rounds = []
    try:
        for n in range(args.kills):
            if variant == "standby":
                wait_for(run.ready_standby, "a ready standby", 300, every=0.2)
            time.sleep(args.settle)
            killed_at = run.kill_active()
            if variant == "cold":
                run.launch()
            first = wait_for(lambda at=killed_at: run.every_query_committed_after(at), "every query's first commit", 300,
                             every=0.05)
            seconds = {q: round(t - killed_at, 2) for q, t in first.items()}
            if variant == "standby":  # the supervisor launches the next one once the new driver runs
                wait = STANDBY_RELAUNCH_SECONDS - (time.monotonic() - standby_launched)
                time.sleep(max(0.0, wait))
                run.launch("--standby")
                standby_launched = time.monotonic()
            say(f"{variant} kill {n + 1}/{args.kills}: first commits after "
                + ", ".join(f"{q} {s:.1f}s" for q, s in seconds.items()))
            rounds.append(seconds)
        run.land(len(run.pending))
        wait_caught_up(run)
    finally:
        run.stop()
    return {"rounds": rounds, "root": str(run.root), "spec": run.spec}


def one_rescale_variant(variant: str, work: Path, spec_path: Path, staged: Path, args: argparse.Namespace,
                        say: Any) -> dict[str, Any]:
    """Rounds of rescales: through a standby at the new size, or a graceful stop and a cold start."""
    run, active = first_driver(variant, work, spec_path, staged, args)
    rounds = []
    try:
        for n in range(args.kills):
            size = 2 if n % 2 == 0 else 4
            rate_limit.write(run.layout, size, "files", "bench")
            if variant == "rescale":
                standby = run.launch("--standby")
                wait_for(run.ready_standby, "a ready standby", 300, every=0.2)
            time.sleep(args.settle)
            old = read_holder(run.layout.lease_dir)
            assert old is not None
            request_stop(run.layout.stop_marker, old.epoch, "bench: rescale")
            if variant == "restart":
                wait_for(lambda proc=active: proc.poll() is not None, "the driver to stop", 300, every=0.05)
                standby = run.launch()
            active = standby
            new = wait_for(lambda was=old.epoch: (h := read_holder(run.layout.lease_dir)) is not None and h.epoch > was and h,
                           "the new driver's lease", 300, every=0.05)
            first = wait_for(lambda at=new.started_at: run.every_query_committed_after(at), "every query's first commit",
                             300, every=0.05)
            seconds = {q: round(t - run.last_commit_before(q, new.started_at), 2) for q, t in first.items()}
            taken = [e.get("per_trigger") for e in read_events(run.layout.events_file)
                     if e.get("event") == "driver_started" and e.get("epoch") == new.epoch]
            assert taken == [size], f"the new driver runs at {taken}, not {size}"
            say(f"{variant} {n + 1}/{args.kills} to {size} files a micro-batch: without a commit "
                + ", ".join(f"{q} {s:.1f}s" for q, s in seconds.items()))
            rounds.append(seconds)
        run.land(len(run.pending))
        wait_caught_up(run)
    finally:
        run.stop()
    return {"rounds": rounds, "root": str(run.root), "spec": run.spec}


def check(result: dict[str, Any]) -> dict[str, Any]:
    """The sinks against the ground truth (one local SparkSession)."""
    from pyspark.sql import SparkSession

    from runner.testdata import verify
    from spark_jobs.analysis import resolve_plan

    spec = result["spec"]
    manifest = json.loads((Path(result["root"]) / "generated" / spec.name / "manifest.json").read_text())
    spark = SparkSession.getActiveSession() or SparkSession.builder.master("local[2]").config(
        "spark.sql.session.timeZone", "UTC").getOrCreate()
    report = verify.compare(spark, resolve_plan(spark, spec, Layout(spec, result["root"])), manifest)
    return {"ok": report.ok, "report": report.describe()}


def summary(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    queries = list(rounds[0])
    out = {q: {"median_s": statistics.median(r[q] for r in rounds), "max_s": max(r[q] for r in rounds)}
           for q in queries}
    last = [max(r.values()) for r in rounds]
    out["every query"] = {"median_s": statistics.median(last), "max_s": max(last)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kills", type=int, default=5)
    p.add_argument("--every", type=float, default=2.0, help="seconds between two landing files")
    p.add_argument("--events-per-file", type=int, default=1000)
    p.add_argument("--settle", type=float, default=5.0, help="seconds the stream runs before a kill")
    p.add_argument("--variants", default="standby,cold")
    p.add_argument("--out", default="takeover")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    prepare_environment()
    work = working_folder("bench-takeover-")
    start = time.time()

    def say(text: str) -> None:
        print(f"[{time.time() - start:6.0f}s] {text}", flush=True)

    results: dict[str, Any] = {}
    try:
        specs = bench_specs(work / "include", files_per_trigger=4)
        spec_path = specs[FOUR]
        spec = yaml.safe_load(spec_path.read_text())
        spec["trigger"] = {"processing_time": "2 seconds"}
        spec["execution"] = {"sizing": {"max_per_trigger": 20}}  # a limit a rescale sets applies
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
        variants = args.variants.split(",")
        files = 4 + int((args.kills * 40 + 60) / args.every)
        staged = work / "staged"
        run_generator(spec_path, staged, files, args.events_per_file, seed=7)
        say(f"{files} files of {args.events_per_file} events generated; one lands every {args.every}s")
        for variant in variants:
            measure = one_rescale_variant if variant in ("rescale", "restart") else one_variant
            result = measure(variant, work, spec_path, staged, args, say)
            checked = check(result)
            say(f"{variant}: sinks {'equal to' if checked['ok'] else 'DIFFERENT from'} the ground truth")
            if not checked["ok"]:
                print(checked["report"])
            results[variant] = {"rounds": result["rounds"], "summary": summary(result["rounds"]),
                                "sinks_exact": checked["ok"], "sinks": checked["report"]}
    finally:
        kill_descendants()
        clean_up(work, args.keep, say)
    lines = [f"{'variant':<9} {'query':<14} {'median s':>9} {'max s':>7}"]
    for variant, r in results.items():
        for q, s in r["summary"].items():
            lines.append(f"{variant:<9} {q:<14} {s['median_s']:>9.1f} {s['max_s']:>7.1f}")
    if {"standby", "cold"} <= set(results):
        ratio = (results["standby"]["summary"]["every query"]["median_s"]
                 / results["cold"]["summary"]["every query"]["median_s"])
        lines.append(f"standby/cold, every query's first commit (medians): {ratio:.2f}")
    if {"rescale", "restart"} <= set(results):
        ratio = (results["rescale"]["summary"]["every query"]["median_s"]
                 / results["restart"]["summary"]["every query"]["median_s"])
        lines.append(f"rescale/restart, the longest time without a commit (medians): {ratio:.2f}")
    return finish(lines, args.out, args, results)


if __name__ == "__main__":
    sys.exit(main())
