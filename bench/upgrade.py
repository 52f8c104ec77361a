"""The cost of an upgrade: a window edited in place, rebuilt from the accepted rows, against the
same output recomputed as one plain Spark batch job.

    python -m bench.upgrade [--rows N] [--files N] [--repeats N] [--live] [--keep] [--out NAME]

The ``sensors`` example (``include/streams/sensors.yaml``, its data under a working folder) is fed
about ``--rows`` events over ``--files`` files (``runner.testdata.generate``) and run once,
available-now, by the platform's job (``python -m spark_jobs.submit stream``): its accepted rows
and its 10/5-minute windows. Then, ``--repeats`` times, from that same state (put back in place:
a file sink's log names absolute paths):

a. the upgrade: the window edited to 15/5 minutes in the spec, then ``python -m spark_jobs.submit
   upgrade --spec <edited>`` (verdicts, savepoint, the window output rebuilt beside its sink from
   every accepted row, swapped in, the plan recorded): its wall time;
b. the baseline: ``bench/upgrade_plain.py``, one plain Spark batch job computing the same
   15/5-minute windows over the same accepted rows into a Parquet folder: its wall time.

Both through ``spark-submit --master local[2]``, one after the other. The ratio a/b says what the
upgrade's own work (the verdicts, the savepoint, a streaming query's bookkeeping, the swap) adds
to the recomputation itself. A check per repeat: the upgraded sink holds exactly the plain job's
windows that the final watermark closed.

``--live``: the upgrade as the upgrade DAG runs it on a continuous stream, from that same state,
the stream running (its 5-second trigger) and fed a file of 200 events every 2 s: the spec edited,
then ``--step prepare --online`` (the running driver holds the window output), ``--step rebuild``,
``--step swap``, until that driver starts the window output again. Per repeat: how long that
took, and for each flow the edit leaves unchanged (the ingestion, the ``device_status`` table)
the longest gap between two of its commits during the upgrade against the longest in its last 8
commits before it; one driver throughout (checked), and the same check against the plain job
after the stream stopped. Results: ``bench/results/upgrade_live.json``.

Output: a table on stdout and ``bench/results/upgrade.json`` (``--out NAME``: ``NAME.json``). The
working folder is removed unless ``--keep``; every process started here ends with it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

from bench.harness import child_env, clean_up, kill_descendants, run_generator, spark_submit, working_folder
from bench.report import Progress, machine, results_path, spread, write_results
from runner.processes import wait_until
from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.checkpoint import batch_watermark_ms, last_batch, sink_files
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW

WINDOW = "site_temperature_10m"
EDITED = {"duration": "15 minutes", "slide": "5 minutes"}


def submit(job: str, spec: Path, data_root: Path, log: Path, timeout: float, *args: str) -> float:
    """``python -m spark_jobs.submit <job>`` (the platform's own way to submit); its wall time."""
    cmd = [sys.executable, "-m", "spark_jobs.submit", job, "--spec", str(spec), "--", "--data-root", str(data_root),
           *args]
    started = time.monotonic()
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), timeout=timeout,
                              cwd=project_root()).returncode
    if code != 0:
        raise RuntimeError(f"{job} exited {code}: see {log}")
    return time.monotonic() - started


def windows(rows: list[dict]) -> set[tuple]:
    return {(r["window_start"], r["window_end"], r["site"], r["readings"], round(r["avg_temperature"], 6),
             r["max_temperature"]) for r in rows}


def sink_rows(path: str) -> list[dict]:
    """A Parquet sink's rows as its log lists them (pyarrow: no Spark in this process)."""
    return [row for f in sorted(sink_files(path)) for row in pq.read_table(f.removeprefix("file:")).to_pylist()]


def plain_and_check(work: Path, logs: Path, repeat: int | str, plan: StreamPlan, layout: Layout, window: dict,
                    timeout: float) -> tuple[dict[str, Any], int]:
    """The plain Spark batch job computing the edited windows over the accepted rows as they are now,
    and the check: the upgraded sink holds exactly its windows that the output's last watermark
    closed. The job's figures, and the windows compared."""
    job, output = work / f"plain-{repeat}.json", work / f"plain-{repeat}"
    job.write_text(json.dumps({
        "conf": {"spark.sql.shuffle.partitions": str(plan.spark.shuffle_partitions),
                 "spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"},
        "accepted": plan.accepted_path, "event_time": plan.event_time_column, "duration": EDITED["duration"],
        "slide": EDITED["slide"], "group_by": window["query"]["group_by"],
        "aggregates": window["query"]["aggregates"], "output": str(output)}))
    plain = spark_submit([str(project_root() / "bench" / "upgrade_plain.py"), "--job", str(job)],
                         logs / f"plain-{repeat}.log", timeout)
    if plain["exit_code"] != 0:
        raise RuntimeError(f"the plain job exited {plain['exit_code']}: see {logs / f'plain-{repeat}.log'}")
    checkpoint = plan.output(WINDOW).checkpoint
    closed_ms = batch_watermark_ms(checkpoint, last_batch(checkpoint, "commits"))
    upgraded = windows(sink_rows(layout.data(f"sinks/sensors/{WINDOW}")))
    computed = pq.read_table(output)  # the windows the final watermark closed
    ends = pc.cast(pc.cast(computed.column("window_end"), pa.timestamp("us")), pa.int64())  # µs, UTC
    expected = windows(computed.filter(pc.less_equal(ends, closed_ms * 1000)).to_pylist())
    if upgraded != expected:
        raise RuntimeError(f"repeat {repeat}: the upgraded sink differs from the plain job's closed windows: "
                           f"{len(upgraded - expected)} more, {len(expected - upgraded)} missing")
    return plain, len(upgraded)


#: ``--live``: the stream's feed while it runs (a file of this many events every 2 s, the clock going on
#: from the history's), and its flows that the edit leaves unchanged
LIVE_RATE, LIVE_EVENTS = 0.5, 200
UNCHANGED = (INGEST_FLOW, "device_status")
#: ``--live``: the commits of the ingestion that make the windows before and after the upgrade
LIVE_COMMITS = 8


def live_upgrade(spec_path: Path, edited: str, data_root: Path, layout: Layout, logs: Path, repeat: int,
                 timeout: float) -> dict[str, Any]:
    """The upgrade as the upgrade DAG runs it on a running stream, fed all along: the driver
    (``spark_jobs.submit stream``, the spec's 5-second trigger) runs, then the spec is edited and
    ``--step prepare --online`` (the driver holds the window output), ``--step rebuild`` and
    ``--step swap`` run beside it, until the driver starts the window output again. The longest
    gap between two commits of each unchanged flow while the upgrade ran, against the longest in
    as many commits before it (the stream's own rhythm), and how many drivers ran."""
    since = time.time()

    def events(kind: str, query: str | None = None) -> list[dict[str, Any]]:
        return [e for e in read_events(layout.events_file) if e.get("event") == kind and e.get("logged_at", 0) > since
                and (query is None or e.get("query") == query)]

    def commits(after: float) -> int:
        return sum(e["logged_at"] > after for e in events("progress", INGEST_FLOW))

    with open(logs / f"live-driver-{repeat}.log", "w") as out, open(logs / f"live-feed-{repeat}.log", "w") as feed:
        driver = subprocess.Popen([sys.executable, "-m", "spark_jobs.submit", "stream", "--spec", str(spec_path), "--",
                                   "--data-root", str(data_root)], stdout=out, stderr=subprocess.STDOUT,
                                  env=child_env(), cwd=project_root())
        feeder = subprocess.Popen([sys.executable, "-m", "runner.testdata.generate", "--spec", str(spec_path),
                                   "--data-root", str(data_root), "--rate", str(LIVE_RATE), "--events-per-file",
                                   str(LIVE_EVENTS), "--clock", "virtual", "--seed", str(100 + repeat)],
                                  stdout=feed, stderr=subprocess.STDOUT, env=child_env(), cwd=project_root())
        try:
            if not wait_until(lambda: events("driver_started") and commits(since) >= LIVE_COMMITS, timeout):
                raise RuntimeError(f"the stream did not run {LIVE_COMMITS} batches: see {out.name}")
            began = time.time()
            spec_path.write_text(edited)
            steps = {step: submit("upgrade", spec_path, data_root, logs / f"live-{step}-{repeat}.log", timeout,
                                  "--step", step, *(["--online"] if step == "prepare" else []))
                     for step in ("prepare", "rebuild", "swap")}
            if not wait_until(lambda: events("outputs_released"), timeout, every=0.2):
                raise RuntimeError(f"the driver did not start the window output again: see {out.name}")
            released = time.time()
            if not wait_until(lambda: commits(released) >= 2, timeout):
                raise RuntimeError(f"the stream stopped committing after the upgrade: see {out.name}")
        finally:
            feeder.terminate()
            feeder.wait(60)
            layout.stop_marker.write_text('{"mode": "graceful"}')
            driver.wait(timeout)
    gaps = {}
    for flow in UNCHANGED:
        at = sorted(e["logged_at"] for e in events("progress", flow))
        before = [t for t in at if t <= began][-LIVE_COMMITS:]
        # from its last commit before the upgrade to its first after the release
        during = before[-1:] + [t for t in at if began < t <= released] + [t for t in at if t > released][:1]
        gaps[flow] = {"before_s": max((b - a for a, b in zip(before, before[1:], strict=False)), default=None),
                      "during_s": max((b - a for a, b in zip(during, during[1:], strict=False)), default=None)}
    return {"upgrade_s": released - began, "steps_s": steps, "gaps": gaps, "drivers": len(events("driver_started")),
            "held": len(events("outputs_held"))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="events generated (default 1,000,000)")
    p.add_argument("--files", type=int, default=40, help="files they land in (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="upgrades and plain jobs, each (default 3)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one job may take")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default=None, help="results' name in bench/results/ (default upgrade, upgrade_live)")
    p.add_argument("--live", action="store_true", help="the upgrade on a running, fed stream, as its DAG runs it: "
                                                       "the unchanged flows' longest gap between commits")
    args = p.parse_args(argv)
    say = Progress()
    work = working_folder("upgrade-bench-")
    try:
        include = work / "include"
        shutil.copytree(project_root() / "include" / "reference", include / "reference")
        (include / "streams").mkdir(parents=True)
        spec_path = include / "streams" / "sensors.yaml"
        original = (project_root() / "include" / "streams" / "sensors.yaml").read_text()
        spec_path.write_text(original)
        data = yaml.safe_load(original)
        (window,) = [o for o in data["outputs"] if o["name"] == WINDOW]
        window["query"]["window"] = EDITED
        edited = yaml.safe_dump(data, sort_keys=False)
        data_root, pristine, logs = work / "data", work / "pristine", work / "logs"
        logs.mkdir()
        run_generator(spec_path, data_root, args.files, max(1, args.rows // args.files), seed=7)
        say(f"generated {args.rows:,} events in {args.files} files")
        ingest_s = submit("stream", spec_path, data_root, logs / "stream.log", args.timeout, "--trigger", "available-now")
        spec = load_spec(spec_path)
        layout = Layout(spec, data_root, spec_path.parent)
        plan = compile_plan(spec, layout)
        accepted = plan.accepted_path
        accepted_rows = sum(pq.read_metadata(f.removeprefix("file:")).num_rows for f in sink_files(accepted))
        say(f"the stream ran once in {ingest_s:.1f}s: {accepted_rows:,} accepted rows")
        shutil.copytree(data_root, pristine, symlinks=True)
        samples: list[dict[str, Any]] = []
        if args.live:
            return _live(args, spec_path, original, edited, data_root, pristine, layout, logs, work, plan, window,
                         accepted_rows, say)
        for repeat in range(1, args.repeats + 1):
            shutil.rmtree(data_root)
            shutil.copytree(pristine, data_root, symlinks=True)
            spec_path.write_text(edited)
            upgrade_s = submit("upgrade", spec_path, data_root, logs / f"upgrade-{repeat}.log", args.timeout)
            spec_path.write_text(original)
            plain, upgraded = plain_and_check(work, logs, repeat, plan, layout, window, args.timeout)
            samples.append({"upgrade_s": upgrade_s, "plain_s": plain["wall_s"], "ratio": upgrade_s / plain["wall_s"],
                            "windows": upgraded, "plain_peak_rss_mb": plain.get("peak_rss_mb")})
            say(f"repeat {repeat}: upgrade {upgrade_s:.1f}s, plain batch job {plain['wall_s']:.1f}s "
                f"({upgrade_s / plain['wall_s']:.2f}); {upgraded:,} windows, equal")
        summary = {"upgrade_s": spread([s["upgrade_s"] for s in samples]),
                   "plain_s": spread([s["plain_s"] for s in samples]),
                   "ratio_of_medians": statistics.median(s["upgrade_s"] for s in samples)
                   / statistics.median(s["plain_s"] for s in samples)}
        print(f"\nupgrade of a window edited in place over {accepted_rows:,} accepted rows, {args.repeats} repeat(s):")
        print(f"  upgrade (python -m spark_jobs.submit upgrade): median {summary['upgrade_s']['median']:.1f}s")
        print(f"  plain Spark batch job, the same windows:       median {summary['plain_s']['median']:.1f}s")
        print(f"  ratio of the medians: {summary['ratio_of_medians']:.2f}")
        path = write_results(results_path(args.out or "upgrade"), {
            "benchmark": "upgrade", "machine": machine(), "rows": args.rows, "files": args.files,
            "accepted_rows": accepted_rows, "ingest_s": ingest_s, "samples": samples, "summary": summary})
        print(f"written: {path}")
        return 0
    finally:
        kill_descendants()
        clean_up(work, args.keep, say)


def _live(args: argparse.Namespace, spec_path: Path, original: str, edited: str, data_root: Path, pristine: Path,
          layout: Layout, logs: Path, work: Path, plan: StreamPlan, window: dict, accepted_rows: int,
          say: Progress) -> int:
    samples = []
    for repeat in range(1, args.repeats + 1):
        shutil.rmtree(data_root)
        shutil.copytree(pristine, data_root, symlinks=True)
        spec_path.write_text(original)  # the stream runs the spec as it was; the upgrade edits it
        sample = live_upgrade(spec_path, edited, data_root, layout, logs, repeat, args.timeout)
        if sample["drivers"] != 1 or sample["held"] != 1:
            raise RuntimeError(f"repeat {repeat}: {sample['drivers']} driver(s) ran, {sample['held']} hold(s): the "
                               "upgrade was not carried out in the running driver")
        plain, upgraded = plain_and_check(work, logs, f"live-{repeat}", plan, layout, window, args.timeout)
        samples.append(sample | {"windows": upgraded})
        say(f"repeat {repeat}: upgraded in {sample['upgrade_s']:.1f}s beside the running driver; longest gap between "
            "commits before / during: " + ", ".join(f"{f} {g['before_s']:.1f}/{g['during_s']:.1f}s"
                                                    for f, g in sample["gaps"].items()) + f"; {upgraded:,} windows, equal")
    summary = {"upgrade_s": spread([s["upgrade_s"] for s in samples])} | {
        f"{flow}_{when}": spread([s["gaps"][flow][f"{when}_s"] for s in samples]) for flow in UNCHANGED
        for when in ("before", "during")}
    print(f"\nlive upgrade of a window edited in place over {accepted_rows:,} accepted rows, {args.repeats} repeat(s):")
    print(f"  the upgrade (hold, savepoint, rebuild, swap, release): median {summary['upgrade_s']['median']:.1f}s")
    for flow in UNCHANGED:
        print(f"  {flow}: longest gap between commits, before {summary[f'{flow}_before']['median']:.1f}s, during "
              f"{summary[f'{flow}_during']['median']:.1f}s (medians); the driver never stopped")
    path = write_results(results_path(args.out or "upgrade_live"), {
        "benchmark": "upgrade_live", "machine": machine(), "rows": args.rows, "files": args.files,
        "accepted_rows": accepted_rows, "feed": {"files_per_s": LIVE_RATE, "events_per_file": LIVE_EVENTS},
        "samples": samples, "summary": summary})
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
