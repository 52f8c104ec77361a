"""Freshness on files: from a file landing to its rows being readable in each sink, the
platform against plain Spark.

    python -m bench.freshness [--files N] [--warmup N] [--every S] [--rows-per-file N]
                              [--repeats N] [--variants plain,...] [--out NAME] [--keep]

Each variant runs alone, as ``spark-submit --master local[2]`` with a processing-time trigger
of 1 second and the same session settings, in a fresh data root:

- plain Spark: ONE streaming query, ``bench/throughput_plain.py`` variant ``parse``: the
  landing files parsed into one Parquet sink;
- hand-written: the same work in plain Spark, ``bench/throughput_plain.py`` variant
  ``per-output``: the four outputs of the stream below written the obvious way, one
  streaming query per output (each parses, checks, deduplicates and joins on its own),
  and one for the quarantine;
- two stages: the platform's work as it runs it, in plain Spark, ``bench/throughput_plain.py``
  variant ``staged``: one query parsing once, deduplicating and writing the accepted rows
  and the quarantine through ``foreachBatch``, then one query per output reading the
  accepted rows' folder (what Spark itself costs for the platform's per-batch work);
- the platform: ``spark_jobs/stream_job.py`` running the four-output stream of
  ``bench/throughput.py`` (``clicks_four_outputs``): its pass-through output, which the
  ingestion writes (the first sink), and its complete- and update-mode tables in SQLite (a
  second stage, reading the accepted rows).

The four-output variants are watched at the same sinks: the pass-through output and the
two tables. The sliding window emits a pane when the watermark passes the pane's end,
minutes after the rows: it is left out.

Once a variant has read a first file, ``--warmup`` files land at a steady rate, one every
``--every`` seconds (not a whole number of triggers, so that the files meet the trigger at
every phase), and are not measured: a JVM's compiler is busy with the code a stream runs for
its first minute or so, the more so the more code (the platform's four queries more than
plain Spark's one). Once every sink has them, ``--files`` files land at the same rate and are
measured, each of ``--rows-per-file`` valid clicks of
the moment (unique ids): written beside the landing directory, then renamed into it, so a
file appears whole. A file is readable in a Parquet sink when a file committed in the
sink's ``_spark_metadata`` log holds its last row (for a folder written through
``foreachBatch``, a data file in place: Hadoop's committer renames it in whole), and in a table when the table's views
count it. Per sink: the median, p99 and max of the files' latencies in each run; medians
of ``--repeats`` runs. Ratios: the platform's first sink against plain Spark (aim at most
1.5), and each sink's median minus plain Spark's, in triggers (aim at most 2 more); and
each sink of the platform against the same sink hand-written and in two stages (the same work).
And what each variant costs: the CPU seconds its processes (the JVM and Python) take per file
while the files land and are read, against plain Spark's.

Output: a table on stdout and ``bench/results/freshness.json`` (``--out NAME``: ``NAME.json``).
Every process started here is ended by its pid, also on failure; the working folder is removed
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    FOUR,
    MASTER,
    PLAIN_JOB,
    STREAM_JOB,
    Stream,
    Watcher,
    bench_specs,
    child_env,
    clean_up,
    cpu_seconds,
    kill_tree,
    landing_of,
    prepare_environment,
    submit_command,
    working_folder,
)
from bench.report import Progress, latencies, machine, results_path, verdict, write_results
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.session import submit_args
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec

TRIGGER_S = 1.0
#: the variants, in the order they run, and the job of ``bench/throughput_plain.py`` each plain one runs
VARIANTS = ("plain", "hand-written", "two stages", "platform")
PLAIN = {"plain": "a", "hand-written": "b", "two stages": "f"}
PARSED, PASS_THROUGH = "Parquet sink (one parse)", "pass-through (the first sink)"
#: aims: the first sink at most this times plain Spark's median; every sink at most this many triggers later
FIRST_SINK_RATIO, EXTRA_TRIGGERS = 1.5, 2


# ---- files landing --------------------------------------------------------------------------------


def write_specs(folder: Path) -> Path:
    """The four-output benchmark stream with a 1-second trigger; its path."""
    path = bench_specs(folder)[FOUR]
    spec = yaml.safe_load(path.read_text())
    spec["trigger"] = {"processing_time": f"{TRIGGER_S:g} second"}
    path.write_text("# Written by bench/freshness.py; bench/throughput.py's four-output stream, 1-second trigger.\n"
                    + yaml.safe_dump(spec, sort_keys=False))
    load_spec(path)
    return path


class Lander:
    """Lands CSV files of valid clicks: written beside the landing directory, renamed into it."""

    def __init__(self, landing: Path, rows: int):
        self.landing, self.rows = landing, rows
        self.staging = landing.parent / f".{landing.name}-staging"
        self.landing.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)

    def land(self, name: str) -> tuple[list[str], float]:
        """One file; its event ids and when it landed."""
        ids = [f"{name}-{i:03d}" for i in range(self.rows)]
        ts = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        staged = self.staging / f"{name}.csv"
        with open(staged, "w", newline="") as f:
            out = csv.writer(f)
            out.writerow(["event_id", "user_id", "page", "ts", "duration_ms"])
            out.writerows([event_id, f"user-{i % 7}", "/search", ts, 100] for i, event_id in enumerate(ids))
        os.rename(staged, self.landing / staged.name)
        return ids, time.time()

    def land_steadily(self, prefix: str, count: int, every: float) -> list[tuple[list[str], float]]:
        """``count`` files, one every ``every`` seconds from now; each one's event ids and when it landed."""
        start, landed = time.monotonic(), []
        for k in range(count):
            while time.monotonic() < start + k * every:
                time.sleep(0.005)
            landed.append(self.land(f"{prefix}{k:04d}"))
        return landed


def run(variant: str, spec_path: Path, root: Path, files: int, every: float, rows: int,
        warmup: int = 0) -> tuple[dict[str, Any], float]:
    """Start the variant, land a first file and wait until every sink has it, land ``warmup``
    files one every ``every`` seconds and wait until every sink has them (not measured), then
    land ``files`` files at that rate; each sink's latencies, and the CPU seconds the variant's
    processes (the JVM and Python) took per file while they landed and were read."""
    root.mkdir(parents=True)
    spec = load_spec(spec_path)
    plan = compile_plan(spec, Layout(spec, root, spec_path.parent))
    tables = {f"{t} table": (root / "tables.db", f"bench_{t}") for t in ("page_totals", "user_activity")}
    unlogged: frozenset[str] = frozenset()
    if variant == "platform":
        args = [*submit_args(), str(STREAM_JOB), "--spec", str(spec_path), "--data-root", str(root)]
        parquet = {PASS_THROUGH: plan.accepted_path}
    else:
        job = Stream(FOUR, spec_path, root, "a").plain_job(PLAIN[variant], root) \
            | {"processing_time": f"{TRIGGER_S:g} second"}
        (root / "job.json").write_text(json.dumps(job, indent=1))
        args = [str(PLAIN_JOB), "--job", str(root / "job.json")]
        if variant == "plain":
            parquet, tables = {PARSED: job["parse_sink"]}, {}
        elif variant == "two stages":  # the accepted rows, written through foreachBatch: no log
            parquet, unlogged = {PASS_THROUGH: job["accepted"]}, frozenset({PASS_THROUGH})
        else:
            (through,) = [o["sink"]["path"] for o in job["outputs"] if o["query"] == "passthrough"]
            parquet = {PASS_THROUGH: through}
            assert {(Path(o["sink"]["db"]), o["sink"]["table"]) for o in job["outputs"] if o["sink"]["type"] == "table"} \
                == set(tables.values()), job["outputs"]
    lander = Lander(Path(landing_of(plan)), rows)
    cmd = submit_command(args)
    watcher = Watcher(parquet, tables, unlogged)
    with open(root / "spark-submit.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())

    def wait(until: Any, what: str, timeout: float) -> None:  # a callable
        deadline = time.monotonic() + timeout
        while not until():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{variant}: {what} did not happen; see {root / 'spark-submit.log'}")
            time.sleep(0.05)

    first = next(iter(parquet))
    try:
        watcher.start()
        warm, _ = lander.land("warm")
        wait(lambda: warm[-1] in watcher.seen[first], "a first file read", 300)
        warmed = lander.land_steadily("w", warmup, every)
        if warmed:
            last = warmed[-1][0][-1]
            wait(lambda: last in watcher.seen[first], "the warm-up files read", 120)
        wait(watcher.caught_up, "every table counting the warm-up files", 120)
        base = {name: watcher.counts[name][-1][1] for name in tables}
        cpu_start = cpu_seconds(proc.pid)
        landed = lander.land_steadily("f", files, every)
        wait(lambda: all(ids[-1] in watcher.seen[n] for n in parquet for ids, _ in landed)
             and all(watcher.counted(n, base[n] + rows * files) is not None for n in tables),
             "every file readable in every sink", 180)
        cpu = cpu_seconds(proc.pid) - cpu_start
    finally:
        kill_tree(proc.pid)
        proc.wait()
        watcher.stop()
    result: dict[str, Any] = {}
    for n in parquet:
        result[n] = latencies([max(watcher.seen[n][i] for i in ids) - at for ids, at in landed])
    for n in tables:
        result[n] = latencies([watcher.counted(n, base[n] + rows * (k + 1)) - at for k, (_, at) in enumerate(landed)])
    return result, cpu / files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=30, help="files landing in each run (default 30)")
    p.add_argument("--every", type=float, default=1.37,
                   help="seconds between two files (default 1.37: no whole number of triggers, so the files "
                        "meet the trigger at every phase)")
    p.add_argument("--rows-per-file", type=int, default=50, help="clicks in each file (default 50)")
    p.add_argument("--warmup", type=int, default=40,
                   help="files landing at the same rate before the measured ones, not measured (default 40: "
                        "the JVM's compiler is still busy with a stream's code for its first minute)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each variant (default 3)")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"which variants to run, comma-separated (default all: {','.join(VARIANTS)}); "
                        "plain and platform are needed for the aims")
    p.add_argument("--out", default="freshness",
                   help="the results' name in bench/results (default freshness; an absolute path: there instead)")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    args = p.parse_args(argv)
    chosen = tuple(v for v in VARIANTS if v in args.variants.split(","))
    if not {"plain", "platform"} <= set(chosen) or len(chosen) != len(args.variants.split(",")):
        p.error(f"--variants: a comma-separated choice of {', '.join(VARIANTS)} with plain and platform")
    prepare_environment()
    work = working_folder("bench-freshness-")
    note = Progress()

    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in chosen}
    cpu: dict[str, list[float]] = {v: [] for v in chosen}
    try:
        spec_path = write_specs(work / "include")
        for i in range(args.repeats):
            for variant in (chosen if i % 2 == 0 else chosen[::-1]):
                result, cpu_s = run(variant, spec_path, work / f"{variant}-{i}", args.files, args.every,
                                    args.rows_per_file, args.warmup)
                runs[variant].append(result)
                cpu[variant].append(cpu_s)
                note(f"repeat {i + 1}, {variant}: " + "; ".join(
                    f"{n}: median {r['median_s']:.2f} s, p99 {r['p99_s']:.2f} s" for n, r in result.items())
                    + f"; {cpu_s:.2f} CPU s a file")
    finally:
        clean_up(work, args.keep, note)

    summary = {v: {n: {k: statistics.median(r[n][k] for r in rs) for k in ("median_s", "p99_s", "max_s")}
                   for n in rs[0]} for v, rs in runs.items()}
    plain = summary["plain"][PARSED]["median_s"]
    lines = [f"freshness, {args.files} files of {args.rows_per_file} rows, one every {args.every:g} s, after "
             f"{args.warmup} not measured, {TRIGGER_S:g}-second trigger; medians of {args.repeats} runs:"]
    for variant, sinks in summary.items():
        for n, s in sinks.items():
            lines.append(f"  {variant:<12} {n:<46} median {s['median_s']:5.2f} s  p99 {s['p99_s']:5.2f} s  "
                         f"max {s['max_s']:5.2f} s")
    first = next(iter(summary["platform"].values()))["median_s"]
    aims = {"first sink / plain": {"value": first / plain, "aim": f"<= {FIRST_SINK_RATIO}",
                                   "met": first / plain <= FIRST_SINK_RATIO}}
    for n, s in summary["platform"].items():
        extra = (s["median_s"] - plain) / TRIGGER_S
        aims[f"{n}: triggers after plain"] = {"value": extra, "aim": f"<= {EXTRA_TRIGGERS}",
                                              "met": extra <= EXTRA_TRIGGERS}
    lines.append("aims:")
    lines += [f"  {k} {a['aim']}: {a['value']:.2f} {verdict(a['met'])}" for k, a in aims.items()]
    cpu_per_file = {v: statistics.median(c) for v, c in cpu.items()}
    lines.append("CPU seconds a file (the JVM and Python, while the files landed and were read), median; / plain:")
    lines += [f"  {v:<12} {c:5.2f}  {c / cpu_per_file['plain']:5.2f}" for v, c in cpu_per_file.items()]
    same_work = staged = None
    if "hand-written" in summary:
        same_work = {n: s["median_s"] / summary["hand-written"][n]["median_s"] for n, s in summary["platform"].items()}
        lines.append("the same work: the platform's median / the hand-written queries' median, per sink:")
        lines += [f"  {n:<46} {r:5.2f}" for n, r in same_work.items()]
    if "two stages" in summary:
        staged = {n: s["median_s"] / summary["two stages"][n]["median_s"] for n, s in summary["platform"].items()}
        lines.append("the same work as the platform runs it: the platform's median / plain Spark's in two stages:")
        lines += [f"  {n:<46} {r:5.2f}" for n, r in staged.items()]
    print("\n".join(lines))
    write_results(results_path(args.out), {
        "machine": machine(),
        "master": MASTER, "files": args.files, "warmup_files": args.warmup, "every_s": args.every,
        "rows_per_file": args.rows_per_file,
        "trigger_s": TRIGGER_S, "repeats": args.repeats, "summary": summary, "aims": aims,
        "platform_over_hand_written": same_work, "platform_over_two_stages": staged,
        "cpu_s_per_file": cpu_per_file, "runs": runs, "cpu_runs": cpu,
        "lines": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
