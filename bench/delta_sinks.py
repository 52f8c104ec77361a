"""Delta Lake sinks against Parquet sinks, and what compaction does to a day of small files.

    python -m bench.delta_sinks [--rows N] [--files N] [--files-per-trigger N] [--repeats N]
                                [--day-files N] [--day-commits N] [--reads N] [--keep]

1. **Throughput.** The four-output stream of ``bench/throughput.py`` (a pass-through
   partitioned by event_date, a 15/5-minute sliding window in append mode, a complete-mode
   and an update-mode aggregation), run by the platform (``spark_jobs/stream_job.py``,
   available-now, ``--files-per-trigger`` files a micro-batch) twice on the same generated
   input, in one run, interleaved: with its sinks as in that benchmark (Parquet and SQLite
   tables; the pass-through is the accepted-rows table the ingestion writes) and with every
   sink a Delta table (the pass-through then has a query of its own: the accepted-rows table
   stays Parquet). Medians of ``--repeats`` runs; the ratio is Delta's rows per second over
   Parquet's. Check: every Delta table holds as many rows as the ground truth says.
2. **A day of 5-second triggers, simulated.** A day of a live stream's micro-batches leaves
   one small file per trigger in the day's partition: 17,280 files. ``--day-commits``
   appends (each ``--day-files`` / ``--day-commits`` files of a few rows) write them into a
   Delta table partitioned by day, as many small files as a day of triggers, in fewer
   commits (each commit takes about half a second here; 17,280 of them would take hours).
   Then: files in the partition, the time to read the day (a count and a grouped sum,
   medians of ``--reads``), compaction (``spark_jobs.maintenance.optimize``, timed), files
   and read time again.

Output: a table on stdout and ``bench/results/delta_sinks.json`` (``--out NAME``:
``NAME.json``). Every process started is ended by its pid; the working folder (in the temp dir)
is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    FOUR,
    MASTER,
    Stream,
    bench_specs,
    clean_up,
    kill_descendants,
    prepare_environment,
    run_generator,
    run_variant,
    working_folder,
)
from bench.report import Progress, machine, markdown_table, results_path, write_results
from spark_jobs.runtime.session import connector_jars
from spark_jobs.stream_spec.loading import load_spec

DELTA = "clicks_four_delta"
DAY_SECONDS, TRIGGER_SECONDS = 86_400, 5


def delta_spec(four: Path) -> Path:
    """The four-output stream with every sink a Delta table, beside it."""
    data = yaml.safe_load(four.read_text())
    data["name"] = DELTA
    data["checkpoint"] = f"checkpoints/{DELTA}"
    data["quarantine"] = {"path": f"quarantine/{DELTA}"}
    for output in data["outputs"]:
        partition_by = output["sink"].get("partition_by")
        output["sink"] = {"type": "delta", "path": f"delta/{DELTA}/{output['name']}",
                          **({"partition_by": partition_by} if partition_by else {})}
    path = four.with_name(f"{DELTA}.yaml")
    path.write_text("# Written by bench/delta_sinks.py: bench/throughput.py's four-output stream into Delta tables.\n"
                    + yaml.safe_dump(data, sort_keys=False))
    load_spec(path)
    return path


class DeltaStream(Stream):
    """The four-output stream into Delta tables: its drivers get Delta's jars, as the platform's do."""

    def jars(self) -> list[str]:
        return connector_jars()


def check_delta(spark, stream: Stream, root: Path) -> dict[str, Any]:
    """Rows per Delta table against the ground truth."""
    truth = stream.manifest_counts()["outputs"]
    counts = {o.name: spark.read.format("delta").load(o.sink.path).count() for o in stream.plan(root).outputs}
    problems = [f"{name} holds {n} rows, the ground truth {truth[name]}" for name, n in counts.items()
                if n != truth[name]]
    return {"ok": not problems, "counts": counts, "problems": problems}


def day_of_files(spark, path: str, files: int, commits: int, reads: int) -> dict[str, Any]:
    """Write a day's small files in ``commits`` appends, read it, compact it, read it again."""
    from pyspark.sql import functions as F

    from spark_jobs.maintenance import optimize

    per_commit = max(1, files // commits)
    rows_per_file = 10
    started = time.monotonic()
    for c in range(commits):
        frame = (spark.range(c * per_commit * rows_per_file, (c + 1) * per_commit * rows_per_file)
                 .withColumn("day", F.lit("2026-01-01").cast("date"))
                 .withColumn("page", F.concat(F.lit("/p"), (F.col("id") % 50).cast("string")))
                 .withColumn("duration_ms", F.col("id") % 1000)
                 .repartition(per_commit))  # one file per task: per_commit small files into the day's partition
        frame.write.format("delta").mode("append").partitionBy("day").save(path)
    written_s = time.monotonic() - started

    def partition_files() -> int:  # the files the day's newest version references (not those compaction removed)
        return len(spark.read.format("delta").load(path).where("day = DATE'2026-01-01'").inputFiles())

    def read_day() -> dict[str, Any]:
        times = []
        for _ in range(reads):
            t0 = time.monotonic()
            day = spark.read.format("delta").load(path).where("day = DATE'2026-01-01'")
            total = day.count()
            day.groupBy("page").agg(F.sum("duration_ms")).collect()
            times.append(time.monotonic() - t0)
        return {"rows": total, "read_s": statistics.median(times), "read_s_all": times}

    before = {"files": partition_files(), **read_day()}
    t0 = time.monotonic()
    compaction = optimize(spark, path)
    compact_s = time.monotonic() - t0
    after = {"files": partition_files(), **read_day()}
    return {"files_written": per_commit * commits, "commits": commits, "write_s": written_s,
            "before": before, "compaction": compaction | {"seconds": compact_s}, "after": after}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000, help="valid events of the stream (default 200,000)")
    p.add_argument("--files", type=int, default=20, help="files the rows are spread over (default 20)")
    p.add_argument("--files-per-trigger", type=int, default=4, help="max_files_per_trigger (default 4)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--day-files", type=int, default=DAY_SECONDS // TRIGGER_SECONDS,
                   help="small files of the simulated day (default 17,280: one per 5-second trigger)")
    p.add_argument("--day-commits", type=int, default=144, help="appends that write them (default 144)")
    p.add_argument("--reads", type=int, default=3, help="reads of the day, before and after compaction (default 3)")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default="delta_sinks",
                   help="results' name in bench/results/ (default delta_sinks; an absolute path: there instead)")
    args = p.parse_args(argv)
    prepare_environment()
    note = Progress()
    work = working_folder("bench-delta-")
    samples: dict[str, list[dict]] = {FOUR: [], DELTA: []}
    result: dict[str, Any] = {}
    try:
        written = bench_specs(work / "include", args.files_per_trigger)
        specs = {FOUR: written[FOUR], DELTA: delta_spec(written[FOUR])}
        source = work / "input"
        run_generator(written[FOUR], source, args.files, max(1, args.rows // args.files), args.seed)
        streams = {FOUR: Stream(FOUR, specs[FOUR], source, "c"), DELTA: DeltaStream(DELTA, specs[DELTA], source, "c")}
        note(f"{streams[FOUR].input_rows()} input records in {args.files + 1} files, "
             f"{args.files_per_trigger} files a micro-batch; working folder {work}")
        kept: dict[str, Path] = {}
        for i in range(args.repeats):
            for name in (list(streams) if i % 2 == 0 else list(streams)[::-1]):
                root = work / "runs" / f"{name}-{i}"
                run = run_variant(streams[name], "c", root, args.timeout)
                samples[name].append(run)
                note(f"{name} {i + 1}/{args.repeats}: {run['batch_s']:.1f}s of batches, {run['wall_s']:.1f}s wall, "
                     f"{run['rows_per_s']:.0f} rows/s")
                if i == 0:
                    kept[name] = root
                elif not args.keep:
                    shutil.rmtree(root, ignore_errors=True)

        from spark_jobs.runtime.session import build_session

        spark = build_session("bench-delta", master=MASTER, extra={
            "spark.ui.enabled": False, "spark.ui.showConsoleProgress": False, "spark.sql.shuffle.partitions": 4})
        check = check_delta(spark, streams[DELTA], kept[DELTA])
        note(f"check of the Delta tables: {'passed' if check['ok'] else 'FAILED: ' + '; '.join(check['problems'])}")
        note(f"a simulated day: {args.day_files} small files in {args.day_commits} commits")
        day = day_of_files(spark, str(work / "day"), args.day_files, args.day_commits, args.reads)
        spark.stop()
    finally:
        kill_descendants()
        clean_up(work, args.keep)

    medians = {name: {k: statistics.median(r[k] for r in runs) for k in ("batch_s", "wall_s", "rows_per_s")}
               for name, runs in samples.items()}
    ratio = medians[DELTA]["rows_per_s"] / medians[FOUR]["rows_per_s"]
    result = {"command": "python -m bench.delta_sinks " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(),
              "input_records": streams[FOUR].input_rows(), "files_per_trigger": args.files_per_trigger,
              "samples": samples, "medians": medians, "delta_over_parquet": ratio, "check": check, "day": day}
    out = write_results(results_path(args.out), result)
    print()
    print("\n".join(markdown_table(["sinks", "batches (median)", "wall", "rows/s"], [
        [label, f"{m['batch_s']:.1f} s", f"{m['wall_s']:.1f} s", f"{m['rows_per_s']:.0f}"]
        for name, label in ((FOUR, "Parquet and SQLite"), (DELTA, "Delta")) for m in [medians[name]]])))
    print(f"Delta / Parquet: {ratio:.2f} (rows per second over the batches); check "
          f"{'passed' if check['ok'] else 'FAILED'}")
    b, a = day["before"], day["after"]
    print(f"a day: {b['files']} files in the partition, read in {b['read_s']:.2f} s; compaction "
          f"{day['compaction']['seconds']:.1f} s; then {a['files']} file(s), read in {a['read_s']:.2f} s")
    print(f"written to {out}")
    return 0 if check["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
