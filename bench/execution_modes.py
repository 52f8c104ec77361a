"""What a quiet stream costs run continuously, against the same stream run scheduled.

    python -m bench.execution_modes [--minutes 10] [--rate 0.0167] [--every 240] [--events-per-file 40]

One copy of the ``sensors`` example stream, fed by the generator at ``--rate`` files per second
(default: one file a minute) for ``--minutes``, run two ways from an empty data root each:

* ``continuous``: one long-running driver (``spark-submit spark_jobs/stream_job.py``, the
  spec's 5-second trigger, submitted as the stream DAG submits it: ``spark_jobs.submit``), as
  ``execution.mode: continuous`` runs it; stopped gracefully at the end (SIGTERM: between batches);
* ``scheduled``: an available-now run (``--trigger available-now``, as the supervisor of a
  ``scheduled`` stream launches it) every ``--every`` seconds when files wait (default 240: a
  4-minute schedule, which keeps a 5-minute freshness), as ``execution.schedule: 4 minutes``
  runs it and a run with nothing waiting skips; with ``--every 0``, whenever files wait and no
  run is going, looked for every ``--poll`` seconds, as the input's watcher asks for runs
  (``execution.on_input``). Airflow's own delay in starting a task is not in it.

Per mode: the drivers' CPU seconds (exact, whole processes: the ``RUSAGE_CHILDREN`` of this
process around each driver's exit) and their memory over time (the proportional set size of
each driver's processes, sampled every 2 s, as MB-hours), both per stream-hour; how fresh
every sink was (from a file's landing to the commit of the ingestion batch that read it and of
each output's first batch planned after that commit: every sink had its rows); and for the
scheduled runs, where a run's time goes (from spark-submit to the driver's start, to the
ingestion's first commit, to its exit). The ratio of each figure, scheduled over continuous.
Writes ``bench/results/execution_modes.json`` (``--out``); the working folder (in the temp dir)
is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.harness import (
    MASTER,
    Memory,
    child_env,
    clean_up,
    descendants,
    freshness,
    kill_tree,
    landing_of,
    working_folder,
)
from bench.report import RESULTS, Progress, machine, spread, write_results
from runner.processes import wait_until
from spark_jobs import submit
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import processed_files, waiting_files
from spark_jobs.runtime.lease import read_holder
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops.cost import reaped_cpu

SPEC = project_root() / "include" / "streams" / "sensors.yaml"
MODES = ("continuous", "scheduled")


def launch(root: Path, logs: Path, name: str, available_now: bool) -> subprocess.Popen:
    """A driver submitted as the stream DAG submits it (``spark_jobs.submit``: the platform's jar and settings)."""
    cmd = submit.command("stream", SPEC, MASTER, ["--data-root", str(root),
                                                  *(["--trigger", "available-now"] if available_now else [])])
    return subprocess.Popen(cmd, stdout=open(logs / f"{name}.log", "w"), stderr=subprocess.STDOUT, env=child_env(),
                            start_new_session=True)


def run_mode(mode: str, args: argparse.Namespace, work: Path, say: Progress) -> dict[str, Any]:
    root, logs = work / mode / "data", work / mode / "logs"
    logs.mkdir(parents=True)
    spec = load_spec(SPEC)
    layout = Layout(spec, root, SPEC.parent)
    plan = compile_plan(spec, layout)
    landing = landing_of(plan)
    memory = Memory()
    memory.start()
    feeder = subprocess.Popen([sys.executable, "-m", "runner.testdata.generate", "--spec", str(SPEC),
                               "--data-root", str(root), "--rate", str(args.rate), "--events-per-file",
                               str(args.events_per_file), "--seed", "7"],
                              stdout=open(logs / "generate.log", "w"), stderr=subprocess.STDOUT, env=child_env())
    cpu, runs = 0.0, []
    started = time.time()
    end = started + args.minutes * 60
    try:
        if mode == "continuous":
            before = reaped_cpu()
            driver = launch(root, logs, "driver", available_now=False)
            memory.driver = driver.pid
            wait_until(lambda: time.time() >= end or driver.poll() is not None, args.minutes * 60 + 5, every=1)
            holder = read_holder(layout.lease_dir)
            if holder is not None:
                os.kill(holder.pid, signal.SIGTERM)  # a graceful stop, between batches
            driver.wait(180)
            memory.driver = None
            cpu = reaped_cpu() - before
            runs.append({"exit_code": driver.returncode})
        else:
            ingestion = plan.checkpoint(INGEST_FLOW)
            due = started + args.every
            while time.time() < end:
                if args.every:  # the schedule's run: none started when nothing waits
                    if time.time() < due:
                        time.sleep(min(1.0, due - time.time()))
                        continue
                    due += args.every
                    if not waiting_files(landing, processed_files(ingestion)):
                        continue
                elif not waiting_files(landing, processed_files(ingestion)):
                    time.sleep(args.poll)
                    continue
                before, launched = reaped_cpu(), time.time()
                driver = launch(root, logs, f"run-{len(runs)}", available_now=True)
                memory.driver = driver.pid
                code = driver.wait(600)
                memory.driver = None
                used = reaped_cpu() - before
                cpu += used
                runs.append({"launched_at": launched, "exit_code": code, "cpu_s": round(used, 1),
                             **phases(layout, launched, time.time())})
                say(f"scheduled run {len(runs)}: exit {code}, {runs[-1]['wall_s']:.1f}s, {used:.1f} CPU s")
    finally:
        feeder.terminate()
        feeder.wait()
        memory.stop()
        for pid in descendants(os.getpid()):
            kill_tree(pid)
    hours = (time.time() - started) / 3600
    fresh, unread = freshness(plan)
    fresh = [round(f, 1) for f in fresh]
    return {"mode": mode, "hours": round(hours, 3), "runs": len(runs), "cpu_s": round(cpu, 1),
            "cpu_s_per_stream_hour": round(cpu / hours, 1), "mb_hours_per_stream_hour": round(memory.mb_seconds / 3600 / hours, 1),
            "peak_memory_mb": round(memory.peak_mb), "freshness_s": spread(fresh), "files_not_in_every_sink": unread,
            "exit_codes": [r["exit_code"] for r in runs], "scheduled_runs": runs if mode == "scheduled" else None}


def phases(layout: Layout, launched: float, ended: float) -> dict[str, float | None]:
    """Where a run's time went: to the driver's start, to the ingestion's first commit, to its exit."""
    events = [e for e in read_events(layout.events_file) if launched <= (e.get("logged_at") or 0) <= ended]
    start = next((e["logged_at"] for e in events if e.get("event") == "driver_started"), None)
    first = next((e["logged_at"] for e in events if e.get("event") == "progress" and e.get("query") == INGEST_FLOW),
                 None)
    return {"wall_s": round(ended - launched, 1), "to_driver_started_s": None if start is None else round(start - launched, 1),
            "to_first_ingestion_commit_s": None if first is None else round(first - launched, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="minutes per mode")
    p.add_argument("--rate", type=float, default=1 / 60, help="files per second (default: one a minute)")
    p.add_argument("--events-per-file", type=int, default=40)
    p.add_argument("--every", type=float, default=240.0,
                   help="seconds between scheduled runs (0: whenever files wait, as on_input)")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between looks for waiting files (scheduled)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--keep", action="store_true", help="keep the working folder (in the temp dir)")
    p.add_argument("--out", default=str(RESULTS / "execution_modes.json"), help="where the JSON results go")
    args = p.parse_args(argv)
    say = Progress()
    work = working_folder("execution-modes-")
    results: dict[str, Any] = {}
    try:
        for mode in args.modes.split(","):
            say(f"{mode}: {args.minutes:g} minutes")
            results[mode] = run_mode(mode, args, work, say)
            say(json.dumps({k: v for k, v in results[mode].items() if k != "scheduled_runs"}))
    finally:
        clean_up(work, args.keep, say)
    out: dict[str, Any] = {"machine": machine(), "date": datetime.now().isoformat(timespec="seconds"),
                           "settings": vars(args), "modes": results}
    if set(MODES) <= set(results):
        c, s = results["continuous"], results["scheduled"]
        out["scheduled_over_continuous"] = {
            "cpu_s_per_stream_hour": round(s["cpu_s_per_stream_hour"] / c["cpu_s_per_stream_hour"], 3),
            "mb_hours_per_stream_hour": round(s["mb_hours_per_stream_hour"] / c["mb_hours_per_stream_hour"], 3),
            "freshness_median": (round(s["freshness_s"]["median"] / c["freshness_s"]["median"], 2)
                                 if s["freshness_s"]["median"] and c["freshness_s"]["median"] else None)}
        runs = s["scheduled_runs"] or []
        if runs:
            out["scheduled_run_medians_s"] = {k: statistics.median(r[k] for r in runs if r.get(k) is not None)
                                              for k in ("wall_s", "to_driver_started_s", "to_first_ingestion_commit_s")
                                              if any(r.get(k) is not None for r in runs)}
    write_results(Path(args.out), out, indent=2)
    for mode, r in results.items():
        print(f"{mode:<10} {r['cpu_s_per_stream_hour']:>8.1f} CPU s/stream-hour  {r['mb_hours_per_stream_hour']:>8.1f} "
              f"MB-h/stream-hour  freshness median {r['freshness_s']['median']} s, max {r['freshness_s']['max']} s "
              f"({r['runs']} run(s), {r['files_not_in_every_sink']} file(s) not in every sink yet)")
    if "scheduled_over_continuous" in out:
        print(f"scheduled / continuous: {json.dumps(out['scheduled_over_continuous'])}; a scheduled run's medians: "
              f"{json.dumps(out.get('scheduled_run_medians_s'))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
