"""The cost of an upgrade: a window edited in place, rebuilt from the accepted rows, against the
same output recomputed as one plain Spark batch job.

    python -m bench.upgrade [--rows N] [--files N] [--repeats N] [--keep] [--out NAME]

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
windows that the final watermark closed. The unchanged outputs' downtime is not measured here: by
hand, an upgrade runs with the stream stopped; the upgrade DAG keeps them committing during the
rebuild, and its end-to-end test measures the stop and start around it.

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
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import batch_watermark_ms, last_batch, sink_files
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec

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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="events generated (default 1,000,000)")
    p.add_argument("--files", type=int, default=40, help="files they land in (default 40)")
    p.add_argument("--repeats", type=int, default=3, help="upgrades and plain jobs, each (default 3)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one job may take")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default="upgrade", help="results' name in bench/results/ (default upgrade)")
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
        for repeat in range(1, args.repeats + 1):
            shutil.rmtree(data_root)
            shutil.copytree(pristine, data_root, symlinks=True)
            spec_path.write_text(edited)
            upgrade_s = submit("upgrade", spec_path, data_root, logs / f"upgrade-{repeat}.log", args.timeout)
            spec_path.write_text(original)
            job = work / f"plain-{repeat}.json"
            output = work / f"plain-{repeat}"
            job.write_text(json.dumps({
                "conf": {"spark.sql.shuffle.partitions": str(spec.spark.shuffle_partitions),
                         "spark.sql.session.timeZone": "UTC", "spark.ui.showConsoleProgress": "false"},
                "accepted": accepted, "event_time": spec.event_time.column, "duration": EDITED["duration"],
                "slide": EDITED["slide"], "group_by": window["query"]["group_by"],
                "aggregates": window["query"]["aggregates"], "output": str(output)}))
            plain = spark_submit([str(project_root() / "bench" / "upgrade_plain.py"), "--job", str(job)],
                                 logs / f"plain-{repeat}.log", args.timeout)
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
            samples.append({"upgrade_s": upgrade_s, "plain_s": plain["wall_s"], "ratio": upgrade_s / plain["wall_s"],
                            "windows": len(upgraded), "plain_peak_rss_mb": plain.get("peak_rss_mb")})
            say(f"repeat {repeat}: upgrade {upgrade_s:.1f}s, plain batch job {plain['wall_s']:.1f}s "
                f"({upgrade_s / plain['wall_s']:.2f}); {len(upgraded):,} windows, equal")
        summary = {"upgrade_s": spread([s["upgrade_s"] for s in samples]),
                   "plain_s": spread([s["plain_s"] for s in samples]),
                   "ratio_of_medians": statistics.median(s["upgrade_s"] for s in samples)
                   / statistics.median(s["plain_s"] for s in samples)}
        print(f"\nupgrade of a window edited in place over {accepted_rows:,} accepted rows, {args.repeats} repeat(s):")
        print(f"  upgrade (python -m spark_jobs.submit upgrade): median {summary['upgrade_s']['median']:.1f}s")
        print(f"  plain Spark batch job, the same windows:       median {summary['plain_s']['median']:.1f}s")
        print(f"  ratio of the medians: {summary['ratio_of_medians']:.2f}")
        path = write_results(results_path(args.out), {
            "benchmark": "upgrade", "machine": machine(), "rows": args.rows, "files": args.files,
            "accepted_rows": accepted_rows, "ingest_s": ingest_s, "samples": samples, "summary": summary})
        print(f"written: {path}")
        return 0
    finally:
        kill_descendants()
        clean_up(work, args.keep, say)


if __name__ == "__main__":
    sys.exit(main())
