"""From a unit closing to its validation: how soon Great Expectations follows the stream.

    python -m bench.validation_delay [--files N] [--every S] [--min-interval D] [--keep]

The ``sensors`` stream (``include/streams/sensors.yaml`` with a 1-second trigger; its quality
rules as shipped, but for ``min_interval``, ``--min-interval``) deployed through its DAG on one
Airflow (API server, scheduler with the LocalExecutor, DAG processor, triggerer), Spark
``local[2]``, validated by its quality DAG on its sinks' asset events alone. ``--files`` files
land, one every ``--every`` seconds, each of 100 events 6 s of event time apart: each moves
the watermark on by 10 minutes, which closes panes of the 10/5-minute window output
(``site_temperature_10m``) and, every 6 files, an event-time hour of the ``readings`` output;
the ``device_status`` table is validated whole at each newly committed batch.

A unit closes at the commit of the output's batch whose watermark passed its end (a table's
unit: the commit of its batch); it is validated when the validation run that took it writes
its results into the quality ledger (the run's finish, to the second). Per unit, from the
checkpoints, the ledger and Airflow's records:

- the whole delay, closing -> validated;
- waiting: closing -> the start of the quality run that validated it;
- the run: its start -> the unit validated (``spark-submit`` of the validation job: a JVM,
  Great Expectations, the unit's rows, its reports).

And per asset event of a sink: its units' closing -> the event (the triggerer's watcher polls
every 5 s and announces a sink at most once per ``min_interval``), and the event -> the start of
the quality run it made (the scheduler; a run waits for the one before: one at a time).
And per quality run: its start -> its validation job's own start (the task starting,
``spark-submit``, the JVM, the Spark session, Great Expectations' context), the validation,
and the job's end -> the run's end.
Medians, p90 and max. There is no plain-Spark baseline for this path: the run's own share
says how much of the delay is the validation itself.

Output: a table on stdout and ``bench/results/validation_delay.json`` (``--out NAME``:
``NAME.json``). Every process started here is ended by its pid, also on failure; the working
folder is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from bench.harness import MASTER, airflow, clean_up, end_everything, run_generator, start_airflow, working_folder
from bench.report import Progress, machine, results_path, spread, write_results
from runner.airflow import AirflowClient, AirflowServices
from runner.processes import wait_for
from spark_jobs.plan import compile_plan
from spark_jobs.quality.closing import validated_units
from spark_jobs.quality.ledger import read_ledger
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import duration_seconds
from streamops.health import Status, assess
from streamops.operators.quality import safe_name

STREAM = "sensors"
TRIGGER = "1 second"
EVENTS_PER_FILE, EVENT_INTERVAL_MS = 100, 6000  # 10 minutes of event time a file
DAG, QUALITY_DAG = f"stream_{STREAM}", f"stream_{STREAM}_quality"
#: the watcher's poll (SinkUnitsTrigger's default), for how long to wait for a last event
WATCHER_POLL_S = 5.0


def spec_copy(root: Path, min_interval: str) -> Path:
    """``include/`` with the sensors spec on a 1-second trigger and its rules' ``min_interval``; the spec's path."""
    include = project_root() / "include"
    for folder in ("expectations", "reference"):
        shutil.copytree(include / folder, root / folder)
    rules_path = root / "expectations" / f"{STREAM}.yaml"
    rules = yaml.safe_load(rules_path.read_text())
    rules.update(min_interval=min_interval, on_new_output=True)
    rules.pop("schedule", None)  # the sinks' asset events alone
    rules_path.write_text(yaml.safe_dump(rules, sort_keys=False))
    spec = yaml.safe_load((include / "streams" / f"{STREAM}.yaml").read_text())
    spec["trigger"] = {"processing_time": TRIGGER}
    (root / "streams").mkdir(parents=True)
    path = root / "streams" / f"{STREAM}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    load_spec(path)  # valid, or fail here
    return path


def land_one(spec_path: Path, data_root: Path, seed: int) -> None:
    """One file of the generator (its clock goes on from the run before)."""
    run_generator(spec_path, data_root, 1, EVENTS_PER_FILE, seed, empty_files=0, event_interval_ms=EVENT_INTERVAL_MS)


def epoch(text: str | None) -> float | None:
    return None if not text else datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# ---- what happened, from the checkpoints, the ledger and Airflow -----------------------------------


def quality_runs(api: AirflowClient) -> list[dict]:
    return [r for r in api.runs(QUALITY_DAG) if r.get("start_date")]


def asset_events(api: AirflowClient) -> list[dict]:
    return api.get("assets/events", limit=1000, order_by="timestamp")["asset_events"]


def measure(plan: Any, quality_dir: Path, api: AirflowClient, since: float) -> dict[str, Any]:
    """Per unit validated since ``since``: closing, validation and the run that validated it; per asset event: its delays."""
    runs = sorted(quality_runs(api), key=lambda r: epoch(r["start_date"]))
    units = []
    for name, unit, validated, closed in validated_units(plan, read_ledger(quality_dir), since):
        run = next((r for r in runs if epoch(r["start_date"]) <= validated
                    and (r.get("end_date") is None or validated <= epoch(r["end_date"]) + 1)), None)
        start = epoch(run["start_date"]) if run else None
        units.append({"output": name, "unit": unit.get("unit"), "end": unit.get("end"),
                      "status": unit.get("status"), "closed": closed,
                      "validated": validated, "delay_s": validated - closed, "run": run and run["run_id"],
                      "waiting_s": None if start is None else max(0.0, start - closed),
                      "in_run_s": None if start is None else validated - start})
    started = {r["run_id"]: epoch(r["start_date"]) for r in runs}
    events = []
    for e in asset_events(api):
        extra = (e.get("extra") or {}).get("payload") or {}  # a watcher's event: what its trigger fired
        at = epoch(e["timestamp"])
        if extra.get("stream") != STREAM or at is None or at < since:
            continue
        listed = {str(u) for u in extra.get("units") or []}
        closings = [u["closed"] for u in units if u["output"] == extra.get("output")
                    and (str(u["unit"]) in listed or u["end"] in listed)]
        made = [started[r["run_id"]] for r in e.get("created_dagruns") or [] if started.get(r["run_id"])]
        events.append({"output": extra.get("output"), "at": at, "units": len(listed),
                       "closing_to_event_s": at - max(closings) if closings else None,
                       "event_to_run_s": min(made) - at if made else None})
    return {"units": units, "events": events, "runs": [_run_record(r, quality_dir) for r in runs]}


def _run_record(run: dict, quality_dir: Path) -> dict[str, Any]:
    """An Airflow run of the quality DAG, with when its validation job started and finished
    (its result file: after the JVM, the Spark session and Great Expectations' context are up)."""
    record = {k: run.get(k) for k in ("run_id", "run_type", "state", "queued_at", "start_date", "end_date")}
    try:
        result = json.loads((quality_dir / "runs" / f"{safe_name(run['run_id'])}.json").read_text())
    except (OSError, ValueError):
        return record
    return record | {"job_started": result.get("started"), "job_finished": result.get("finished")}


def summarize(measured: dict[str, Any]) -> dict[str, Any]:
    units, events = measured["units"], measured["events"]
    by_output = {}
    for name in sorted({u["output"] for u in units}):
        mine = [u for u in units if u["output"] == name]
        by_output[name] = {"delay_s": spread([u["delay_s"] for u in mine]),
                           "waiting_s": spread([u["waiting_s"] for u in mine if u["waiting_s"] is not None]),
                           "in_run_s": spread([u["in_run_s"] for u in mine if u["in_run_s"] is not None])}
    delays = [u["delay_s"] for u in units]
    in_run = [u["in_run_s"] for u in units if u["in_run_s"] is not None]
    runs = [r for r in measured["runs"] if r.get("end_date")]
    run_s = [epoch(r["end_date"]) - epoch(r["start_date"]) for r in runs]
    jobs = [r for r in runs if r.get("job_started") and r.get("job_finished")]
    return {
        "all": {"delay_s": spread(delays), "waiting_s": spread([u["waiting_s"] for u in units if u["waiting_s"] is not None]),
                "in_run_s": spread(in_run),
                "run_share_of_delay": (statistics.median(in_run) / statistics.median(delays)) if in_run and delays else None},
        "outputs": by_output,
        "events": {"closing_to_event_s": spread([e["closing_to_event_s"] for e in events
                                                if e["closing_to_event_s"] is not None]),
                   "event_to_run_s": spread([e["event_to_run_s"] for e in events if e["event_to_run_s"] is not None]),
                   "count": len(events)},
        "runs": {"count": len(runs), "succeeded": sum(r["state"] == "success" for r in runs),
                 "asset_triggered": sum(r["run_type"] == "asset_triggered" for r in runs), "run_s": spread(run_s),
                 "to_job_started_s": spread([epoch(r["job_started"]) - epoch(r["start_date"]) for r in jobs]),
                 "job_s": spread([epoch(r["job_finished"]) - epoch(r["job_started"]) for r in jobs]),
                 "after_job_s": spread([epoch(r["end_date"]) - epoch(r["job_finished"]) for r in jobs])},
    }


def table(s: dict[str, Any]) -> list[str]:
    def row(label: str, st: dict) -> str:
        if not st["n"]:
            return f"  {label:<44} -"
        return f"  {label:<44} median {st['median']:6.1f} s  p90 {st['p90']:6.1f} s  max {st['max']:6.1f} s  ({st['n']})"

    lines = ["per unit (closing = the commit of the batch that closed it):"]
    lines.append(row("closing -> validated, every unit", s["all"]["delay_s"]))
    for name, o in s["outputs"].items():
        lines.append(row(f"closing -> validated, {name}", o["delay_s"]))
    lines.append(row("waiting: closing -> its run's start", s["all"]["waiting_s"]))
    lines.append(row("in the run: its start -> validated", s["all"]["in_run_s"]))
    share = s["all"]["run_share_of_delay"]
    if share is not None:
        lines.append(f"  the run's share of the median delay: {share:.2f}")
    lines.append(f"per asset event ({s['events']['count']}):")
    lines.append(row("its units' closing -> the event (watcher)", s["events"]["closing_to_event_s"]))
    lines.append(row("the event -> its run's start (scheduler)", s["events"]["event_to_run_s"]))
    r = s["runs"]
    lines.append(f"quality runs: {r['count']} ({r['asset_triggered']} on asset events), {r['succeeded']} succeeded")
    lines.append(row("a quality run, start -> end", r["run_s"]))
    lines.append(row("  start -> its job's validation begins", r["to_job_started_s"]))
    lines.append(row("  the validation (to the second)", r["job_s"]))
    lines.append(row("  the job's end -> the run's end", r["after_job_s"]))
    return lines


# ---- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10, help="files landing (default 10)")
    p.add_argument("--every", type=float, default=30.0, help="seconds between files (default 30)")
    p.add_argument("--min-interval", default="10 seconds",
                   help="the rules' min_interval: at most one asset event per sink in this time (default 10 seconds)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default="validation_delay",
                   help="results' name in bench/results/ (default validation_delay; an absolute path: there instead)")
    args = p.parse_args(argv)

    note = Progress()
    work = working_folder("bench-validation-")
    services: AirflowServices | None = None
    layout: Layout | None = None

    try:
        spec_path = spec_copy(work / "specs", args.min_interval)
        data_root = work / "data"
        data_root.mkdir()
        spec = load_spec(spec_path)
        layout = Layout(spec, data_root, spec_path.parent)
        plan = compile_plan(spec, layout)
        services, api = airflow(work / "airflow", data_root, spec_path.parent)
        start_airflow(services, api, (DAG, QUALITY_DAG))
        note(f"Airflow up on {services.url}")

        land_one(spec_path, data_root, seed=1)  # the stream's first batch: start-up, not measured
        api.trigger(DAG)
        wait_for(lambda: assess(plan, layout).status == Status.IDLE, "the stream to take its first file", 600, every=1)
        wait_for(lambda: not [r for r in quality_runs(api) if r["state"] not in ("success", "failed")]
                 and quality_runs(api), "the first quality run to end", 600, every=1)
        since = time.time()
        note("stream deployed, its first file taken and validated; the files land now")
        for i in range(args.files):
            due = since + i * args.every
            time.sleep(max(0.0, due - time.time()))  # a steady rate of files, whatever the generator took
            land_one(spec_path, data_root, seed=2 + i)
        note(f"{args.files} files landed")
        wait_for(lambda: assess(plan, layout).status == Status.IDLE, "the stream to take every file", 600, every=1)

        def settled() -> bool:  # no run queued or running, and nothing validated lately
            active = [r for r in api.runs(QUALITY_DAG) if r["state"] not in ("success", "failed")]
            newest = max((e for e in (epoch(u.get("validated_at")) for entry in
                                      (read_ledger(layout.quality_dir).get("outputs") or {}).values()
                                      for u in (entry.get("units") or {}).values()) if e), default=since)
            quiet = max(newest, since)
            return not active and time.time() - quiet > duration_seconds(args.min_interval) + 2 * WATCHER_POLL_S + 5

        wait_for(settled, "the last units to be validated", 900, every=2)
        measured = measure(plan, layout.quality_dir, api, since)
        note(f"{len(measured['units'])} units validated, {len(measured['events'])} asset events")
    finally:
        end_everything(layout.lease_dir if layout is not None else None, services)
        clean_up(work, args.keep)

    summary = summarize(measured)
    print()
    print(f"validation after units close: sensors stream, {args.files} files one every {args.every:g} s, "
          f"trigger {TRIGGER}, min_interval {args.min_interval}")
    print("\n".join(table(summary)))
    out = results_path(args.out)
    write_results(out, {
        "machine": machine(),
        "master": MASTER, "trigger": TRIGGER, "files": args.files, "every_s": args.every,
        "min_interval": args.min_interval, "wall_s": note.elapsed(), "summary": summary,
        "samples": measured})
    print(f"\nwall time {note.elapsed() / 60:.1f} min; written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
