"""Throughput of the platform's job against plain Spark on the same input.

    python -m bench.throughput [--quick] [--rows N] [--files N] [--repeats N] [--streams NAME ...] [--keep]

For each stream, one input is generated (``runner.testdata.generate``: about ``--rows`` valid
events over ``--files`` files, with its default shares of malformed records, duplicates,
late events and one empty file), and the variants below process exactly those landing files
with ``spark-submit --master local[2]``, the available-now trigger and the same session
settings (``spark_jobs.runtime.session.SESSION_CONF``, the spec's shuffle partitions and
``spark.conf``; the plain scripts also keep every query's progress in memory):

a. ``bench/throughput_plain.py`` variant ``parse``: ONE plain Spark query parsing the
   landing files (PERMISSIVE, corrupt-record column, the spec's schema, CSV/JSON options
   and ``max_files_per_trigger``) into one Parquet sink, nothing else: the floor, what
   reading the input costs;
b. ``bench/throughput_plain.py`` variant ``per-output``: the spec's outputs hand-written the
   obvious way, one query per output, each parsing the landing files itself (same reader),
   keeping valid rows, with the spec's watermark, ``dropDuplicatesWithinWatermark`` on its
   key, its broadcast joins, its windows, aggregations and output modes, into the same
   sinks (Parquet with the same partitioning; SQLite tables through ``foreachBatch``:
   upsert in update mode, rows replaced in complete mode); plus a quarantine query.
   Each query's filter references every column: Spark's CSV and JSON readers convert
   (and flag as corrupt) only the columns a query reads, so an output not reading a
   column would otherwise accept records malformed in it, which the platform's single
   parse quarantines (the check below caught exactly that);
c. the platform: ``spark-submit spark_jobs/stream_job.py --spec <spec> --data-root <root>
   --trigger available-now`` (one ingestion query writing the accepted rows and the
   quarantine, ``max_files_per_trigger`` files a batch like (a) and (b), then one query
   per output reading every accepted batch at once, as the platform does);
d. ``bench/throughput_plain.py`` variant ``batch``: the same work as ONE plain Spark batch
   job over the same files (parse once with the corrupt-record column, quarantine,
   deduplicate, join, every output into the same sinks), what streaming is measured
   against: its incremental run should cost little more than the batch query it is
   written as.

e. the platform as (c) with its accepted rows in a Delta table (``accepted: {format: delta}``;
   the pass-through output the ingestion writes becomes that Delta table, so it does c's
   work): e/c says what the Delta accepted-rows table costs (``--variants ce``; not run by
   default).
f. ``bench/throughput_plain.py`` variant ``staged``: the per-batch work of (c) hand-written
   with care in plain Spark, in the platform's two stages (one query parsing once,
   deduplicating and writing the accepted rows and the quarantine through ``foreachBatch``;
   then one query per output reading the accepted rows' folder): c/f is what the
   platform's own machinery costs over the plain Spark it runs (``--variants cf``; not run
   by default). (f) counts no kinds, keeps no events and holds no lease.

``--files-per-trigger N`` sets ``max_files_per_trigger`` of every spec (default 10, as in
the example specs; 4 is a live stream's small batches, ``--files`` one micro-batch).
The platform's drivers get its local file system (``include/deploy/java``), as every driver
the platform starts does; plain Spark runs on Hadoop's own unless ``--plain-local-fs``.

Streams: ``sensors`` (``include/streams/``), ``clicks`` (``include/streams/clicks.yaml``
reading CSV files instead of its Kafka topic, its Delta table written as Parquet), input of the same size, and two specs this
script writes, based on ``clicks.yaml``'s columns, enrichment, event time and deduplication,
reading the same CSV files: ``clicks_four_outputs`` (a pass-through Parquet sink partitioned by
event_date; a 15-minute window sliding every 5 minutes in append mode to Parquet; a
complete-mode table sink keyed by page, as in clicks.yaml, and an update-mode one, both in
SQLite under the run's data root; the quarantine) and ``clicks_one_output`` (the
pass-through output alone, over the same landing files), where the platform (c) is
compared with the same output hand-written as one query plus the quarantine (b): what
the extra stage, the accepted-rows table between the two, costs. Every variant of a
stream reads the same landing files (hard links of the generated ones, modification
times kept), each run in a fresh data root.

Measured per run: wall time from spark-submit's start to its exit; the time of the
batches, from the start of the first batch of any query to the end of the last (the
platform's progress events in ``<checkpoint root>/_events/progress.jsonl``; the plain
scripts' ``query.recentProgress``); input rows per second over that time (the generator's
count of input records; the rows each variant's reading queries saw are recorded too) and
over the wall time; peak resident memory of the spark-submit JVM plus its Python
processes (from /proc every 0.2 s); data files each Parquet sink's ``_spark_metadata`` log
committed. Variants are interleaved (their order rotates with each repeat); medians of
``--repeats``; the ratios c/a, c/b, c/d and c/f are rows per second of c over a, b, d, resp. f
(batches; d's one batch spans its whole job). Aims: ``clicks_four_outputs`` c/b >= 1.5, and
c/d >= 0.8 with micro-batches of 4 files or fewer, >= 0.9 when one micro-batch takes every
file, c/f >= 0.67 with one file a micro-batch (at most 1.5 times plain Spark's time for
the same work); ``clicks_one_output`` c/b >= 0.87. c/a is reported without an aim: (a)
does less work.

Fairness check, after the runs: the sinks of the first repeat are read back (one local
SparkSession): (a) holds one row per input record; (b), (c) and (f) hold as many rows per output
and quarantined records as the generator's ground truth says, (d) as many quarantined
records and, in a pass-through output, the accepted rows and the rows dropped as late; and every output of (b) is
equal to the same output of (c) (pass-through rows exactly, quarantined records by file
name and text, aggregates by result key with floats to 1e-9), so (b) computes what the
spec asks for.

Output: a table on stdout, ``bench/results/throughput.json`` (every sample, medians,
ratios, checks, machine) and ``bench/results/throughput.png`` (``--out NAME``: ``NAME.json``
and ``NAME.png``). ``--quick``: 50,000 rows, one repeat (a smoke check). Every process started is ended by its pid, also on failure;
the working folder (in the temp dir) is removed at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.harness import (
    FOUR,
    MASTER,
    ONE,
    Stream,
    bench_specs,
    clean_up,
    kill_descendants,
    prepare_environment,
    run_generator,
    run_variant,
    working_folder,
)
from bench.report import Progress, machine, pyplot, results_path, save_chart, verdict, write_results
from spark_jobs.plan import DeltaDataset, ParquetDataset, TableDataset
from spark_jobs.runtime.session import local_fs_conf
from spark_jobs.stream_spec.models import Passthrough

VARIANTS = {"a": "one parse query", "b": "one query per output", "c": "platform", "d": "one batch job",
            "e": "platform, Delta accepted", "f": "same work, two stages"}


def aims(files_per_trigger: int, files: int) -> list[tuple[str, str, float]]:
    """(stream, ratio, aim): printed beside the results; against the batch job, by the micro-batches' size."""
    batch_aim = 0.9 if files_per_trigger >= files + 1 else 0.8 if files_per_trigger <= 4 else None
    # one small file a micro-batch: at most 1.5 times what plain Spark takes for the same work
    staged_aim = [(FOUR, "c/f", round(1 / 1.5, 2))] if files_per_trigger == 1 else []
    return [(FOUR, "c/b", 1.5), (ONE, "c/b", 0.87), *([(FOUR, "c/d", batch_aim)] if batch_aim else []), *staged_aim]


# ---- the fairness check -----------------------------------------------------------------------------


def _close(x: Any, y: Any) -> bool:
    if isinstance(x, float) or isinstance(y, float):
        return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
    return x == y


def same_rows(left: list[dict], right: list[dict], key: list[str]) -> str | None:
    """None if both hold the same rows by ``key`` (floats within 1e-9); else what differs."""
    def by_key(rows: list[dict]) -> dict[tuple, dict]:
        return {tuple(r[k] for k in key): r for r in rows}

    a, b = by_key(left), by_key(right)
    if len(a) != len(left) or len(b) != len(right):
        return "a result key repeats"
    if a.keys() != b.keys():
        return f"{len(a.keys() - b.keys())} row(s) only in b, {len(b.keys() - a.keys())} only in c"
    for k, row in a.items():
        diff = [c for c in row if not _close(row[c], b[k].get(c))]
        if diff:
            return f"row {k}: {diff} differ ({[row[c] for c in diff]} in b, {[b[k].get(c) for c in diff]} in c)"
    return None


def check(spark, stream: Stream, roots: dict[str, Path]) -> dict[str, Any]:
    """Read back the sinks of one repeat: counts against the ground truth, (b) against (c)."""
    from pyspark.sql import functions as F

    from runner.testdata.verify import normalize, read_table

    truth = stream.manifest_counts()
    problems: list[str] = []
    counts: dict[str, Any] = {}

    def parquet(path: str):  # a DataFrame, or None for an absent sink
        try:
            return spark.read.parquet(path)
        except Exception as exc:
            if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
                return None
            raise

    def count(frame) -> int:
        return 0 if frame is None else frame.count()

    if "a" in roots:
        counts["a"] = {"parse": count(parquet(str(roots["a"] / "sinks" / "parse")))}
        if counts["a"]["parse"] != truth["input_records"]:
            problems.append(f"a: {counts['a']['parse']} rows parsed, {truth['input_records']} input records")
    outputs: dict[str, dict[str, Any]] = {}
    for v in ("b", "c", "e", "f"):
        if v not in roots:
            continue
        plan = stream.plan(roots[v], v)
        assert plan.ingestion is not None and plan.ingestion.quarantine is not None
        counts[v] = {}
        outputs[v] = {}
        for o in plan.outputs:
            if isinstance(o.sink, DeltaDataset):
                frame = spark.read.format("delta").load(o.sink.path)
                outputs[v][o.name] = frame
                counts[v][o.name] = count(frame)
            elif isinstance(o.sink, ParquetDataset):
                frame = parquet(o.sink.path)
                outputs[v][o.name] = frame
                counts[v][o.name] = count(frame)
            else:
                assert isinstance(o.sink, TableDataset)
                rows = read_table(o.sink.url, o.sink.table)
                outputs[v][o.name] = rows
                counts[v][o.name] = len(rows)
            if counts[v][o.name] != truth["outputs"][o.name]:
                problems.append(f"{v}: {o.name} holds {counts[v][o.name]} rows, the ground truth "
                                f"{truth['outputs'][o.name]}")
        frame = parquet(plan.ingestion.quarantine)
        outputs[v]["quarantine"] = frame
        counts[v]["quarantine"] = count(frame)
        if counts[v]["quarantine"] != truth["quarantined"]:
            problems.append(f"{v}: {counts[v]['quarantine']} quarantined, the ground truth {truth['quarantined']}")
    if "d" in roots:  # a batch keeps what a stream drops as late
        plan = stream.plan(roots["d"])
        assert plan.ingestion is not None and plan.ingestion.quarantine is not None
        counts["d"] = {"quarantine": count(parquet(plan.ingestion.quarantine))}
        if counts["d"]["quarantine"] != truth["quarantined"]:
            problems.append(f"d: {counts['d']['quarantine']} quarantined, the ground truth {truth['quarantined']}")
        for o in plan.outputs:
            if isinstance(o.query, Passthrough) and isinstance(o.sink, ParquetDataset):
                counts["d"][o.name] = count(parquet(o.sink.path))
                expected = truth["outputs"][o.name] + truth["dropped_late"]
                if counts["d"][o.name] != expected:
                    problems.append(f"d: {o.name} holds {counts['d'][o.name]} rows, the ground truth's accepted and "
                                    f"late rows {expected}")
    if "b" in outputs and "c" in outputs:
        b, c = outputs["b"], outputs["c"]
        for o in stream.plan(roots["c"], "c").outputs:
            if isinstance(o.query, Passthrough):
                cols = sorted(c[o.name].columns) if c[o.name] is not None else []
                if b[o.name] is not None and c[o.name] is not None:
                    left, right = b[o.name].select(*cols), c[o.name].select(*cols)
                    if left.exceptAll(right).count() or right.exceptAll(left).count():
                        problems.append(f"b and c: {o.name} differs")
                elif (b[o.name] is None) != (c[o.name] is None):
                    problems.append(f"b and c: {o.name} is empty in one only")
                continue
            key = list(o.key)

            def rows(value: Any) -> list[dict]:
                if value is None:
                    return []
                if isinstance(value, list):
                    return value
                return [{k: normalize(x) for k, x in r.asDict().items()} for r in value.collect()]

            differs = same_rows(rows(b[o.name]), rows(c[o.name]), key)
            if differs:
                problems.append(f"b and c: {o.name}: {differs}")

        def records(frame):
            return frame.select(F.element_at(F.split("source_file", "/"), -1).alias("file"), "raw")

        if b["quarantine"] is not None and c["quarantine"] is not None:
            qb, qc = records(b["quarantine"]), records(c["quarantine"])
            if qb.exceptAll(qc).count() or qc.exceptAll(qb).count():
                problems.append("b and c: the quarantined records differ")
    return {"ok": not problems, "problems": problems, "counts": counts,
            "ground_truth": {"input_records": truth["input_records"], "quarantined": truth["quarantined"],
                             "outputs": {o.name: truth["outputs"][o.name] for o in stream.spec.outputs}},
            "b_equals_c": None if not {"b", "c"} <= set(roots) else not any(p.startswith("b and c") for p in problems)}


# ---- summary, table, chart --------------------------------------------------------------------------

MEDIANS = ("wall_s", "batch_s", "rows_per_s", "rows_per_s_wall", "peak_rss_mb", "peak_jvm_mb", "peak_python_mb",
           "batches", "files_total")


def summarize(samples: dict[str, dict[str, list[dict]]], aims: list[tuple[str, str, float]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for stream, by_variant in samples.items():
        medians = {v: {k: statistics.median(r[k] for r in runs) for k in MEDIANS} | {"files": runs[0]["files"]}
                   for v, runs in by_variant.items() if runs}
        for v, runs in by_variant.items():
            if runs and runs[0]["per_batch"]["batch_ms"] is not None:
                medians[v]["batch_ms"] = statistics.median(r["per_batch"]["batch_ms"] for r in runs)
            if runs and "parts_ms" in runs[0]["per_batch"]:
                medians[v]["parts_ms"] = {k: statistics.median(r["per_batch"]["parts_ms"].get(k, 0) for r in runs)
                                          for k in runs[0]["per_batch"]["parts_ms"]}
        ratios = {}
        for top, other in (("c", "a"), ("c", "b"), ("c", "d"), ("e", "c"), ("c", "f")):
            if top in medians and other in medians:
                ratios[f"{top}/{other}"] = medians[top]["rows_per_s"] / medians[other]["rows_per_s"]
                ratios[f"{top}/{other} wall"] = medians[top]["rows_per_s_wall"] / medians[other]["rows_per_s_wall"]
        aims = [{"ratio": r, "aim": f">= {aim}", "value": ratios.get(r),
                 "met": ratios[r] >= aim if r in ratios else None} for s, r, aim in aims if s == stream]
        summary[stream] = {"medians": medians, "ratios": ratios, "aims": aims}
    return summary


def table(summary: dict[str, Any], checks: dict[str, Any], streams: dict[str, Stream]) -> list[str]:
    lines = [f"{'stream':<22} {'variant':<24} {'rows':>9} {'wall s':>8} {'batches s':>10} {'rows/s':>8} "
             f"{'rows/s wall':>12} {'peak MB':>8} {'files':>6}"]
    for name, s in summary.items():
        first = True
        for v, m in s["medians"].items():
            label = f"{v} {VARIANTS[v]}"
            lines.append(f"{name if first else '':<22} {label:<24} {streams[name].input_rows():>9} {m['wall_s']:>8.1f} "
                         f"{m['batch_s']:>10.1f} {m['rows_per_s']:>8.0f} {m['rows_per_s_wall']:>12.0f} "
                         f"{m['peak_rss_mb']:>8.0f} {m['files_total']:>6.0f}")
            first = False
        ratios = "   ".join(f"{r} {s['ratios'][r]:.2f} (wall {s['ratios'][r + ' wall']:.2f})"
                            for r in ("c/a", "c/b", "c/d", "e/c", "c/f") if r in s["ratios"])
        lines.append(f"{'':<22} {ratios}")
    lines.append("")
    lines.append("one micro-batch of the queries reading the input (median ms; c: the ingestion, and where it went):")
    for name, s in summary.items():
        for v, m in s["medians"].items():
            if "batch_ms" in m:
                parts = ", ".join(f"{k} {ms:.0f}" for k, ms in m.get("parts_ms", {}).items() if k != "triggerExecution")
                lines.append(f"  {name} {v}: {m['batch_ms']:.0f}" + (f" ({parts})" if parts else ""))
    lines.append("")
    lines.append("files per sink (committed in _spark_metadata):")
    for name, s in summary.items():
        for v, m in s["medians"].items():
            lines.append(f"  {name} {v}: " + ", ".join(f"{k} {n}" for k, n in m["files"].items()))
    lines.append("")
    lines.append("aims:")
    for name, s in summary.items():
        for a in s["aims"]:
            value = "-" if a["value"] is None else f"{a['value']:.2f}"
            lines.append(f"  {name} {a['ratio']} {a['aim']}: {value} {verdict(a['met'])}")
    lines.append("")
    lines.append("checks (first repeat's sinks read back):")
    for name, c in checks.items():
        if c.get("ok"):
            parts = ["counts equal to the ground truth"]
            if c.get("b_equals_c"):
                parts.append("every output of b equal to c's")
            lines.append(f"  {name}: " + "; ".join(parts))
        else:
            lines.append(f"  {name}: FAILED: " + "; ".join(c.get("problems") or [c.get("error", "?")]))
    return lines


def chart(summary: dict[str, Any], path: Path, title: str) -> None:
    plt = pyplot()
    names = list(summary)
    colors = {"a": "#7a8793", "b": "#e8a33d", "c": "#2f6db5", "d": "#5a9e5a", "e": "#8e5ab5", "f": "#c0504d"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2))
    width = 0.8 / len(VARIANTS)
    for ax, key, label in ((axes[0], "rows_per_s", "input rows / s (batches)"),
                           (axes[1], "wall_s", "spark-submit wall time (s)"),
                           (axes[2], "peak_rss_mb", "peak RSS, JVM + Python (MB)")):
        for i, v in enumerate(VARIANTS):
            xs = [j + (i - (len(VARIANTS) - 1) / 2) * width for j, n in enumerate(names) if v in summary[n]["medians"]]
            ys = [summary[n]["medians"][v][key] for n in names if v in summary[n]["medians"]]
            bars = ax.bar(xs, ys, width, color=colors[v], label=f"{v}: {VARIANTS[v]}")
            if key == "rows_per_s":
                ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax.set_xticks(range(len(names)), [n.replace("_", "\n", 1) for n in names], fontsize=8)
        ax.set_ylabel(label)
        ax.set_title(label)
    axes[0].legend(fontsize=8)
    ratios = ["\n".join([n.replace("_", "\n", 1), *(f"{k} {summary[n]['ratios'][k]:.2f}" for k in ("c/a", "c/b", "c/d", "e/c", "c/f")
                                                   if k in summary[n]["ratios"])]) for n in names]
    axes[0].set_xticks(range(len(names)), ratios, fontsize=8)
    fig.suptitle(title)
    save_chart(fig, path)


# ---- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, help="valid events per stream (default 1,000,000; 50,000 with --quick)")
    p.add_argument("--files", type=int, default=40, help="files the rows are spread over (default 40)")
    p.add_argument("--repeats", type=int, help="runs of every variant (default 3; 1 with --quick)")
    p.add_argument("--plain-local-fs", action="store_true",
                   help="run plain Spark (a, b, d) on the platform's local file system too (default: Hadoop's)")
    p.add_argument("--files-per-trigger", type=int, default=10,
                   help="max_files_per_trigger of every spec (default 10; --files + 1: one micro-batch)")
    p.add_argument("--quick", action="store_true", help="50,000 rows, one repeat: a smoke check")
    p.add_argument("--streams", nargs="+", choices=["sensors", "clicks", FOUR, ONE],
                   default=["sensors", "clicks", FOUR, ONE], help="streams to run (default all)")
    p.add_argument("--timeout", type=float, default=7200, help="seconds one spark-submit may take (default 7200)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--keep", action="store_true", help="keep the working folder (inputs, data roots, logs)")
    p.add_argument("--variants", default="abcd", help="which variants run (default abcd)")
    p.add_argument("--out", default="throughput",
                   help="results' name in bench/results/ (default throughput; an absolute path: there instead)")
    args = p.parse_args(argv)
    rows = args.rows or (50_000 if args.quick else 1_000_000)
    repeats = args.repeats or (1 if args.quick else 3)
    events_per_file = max(1, rows // args.files)
    prepare_environment()

    note = Progress()
    work = working_folder("bench-throughput-")
    print(f"working folder {work}; {args.files} files x {events_per_file} events per stream; {repeats} repeat(s)",
          flush=True)
    samples: dict[str, dict[str, list[dict]]] = {}
    checks: dict[str, Any] = {}
    streams: dict[str, Stream] = {}
    try:
        written = bench_specs(work / "include", args.files_per_trigger)
        variants = "".join(v for v in VARIANTS if v in args.variants)
        specs = {"sensors": (written["sensors"], "sensors"), "clicks": (written["clicks"], "clicks"),
                 FOUR: (written[FOUR], "clicks_bench"), ONE: (written[ONE], "clicks_bench")}
        inputs: dict[str, Path] = {}
        for name in args.streams:
            spec_path, group = specs[name]
            if group not in inputs:  # the two CSV specs share one input, generated with the four-output spec
                inputs[group] = work / f"input-{group}"
                run_generator(written[FOUR] if group == "clicks_bench" else spec_path, inputs[group], args.files,
                              events_per_file, args.seed)
            streams[name] = Stream(name, spec_path, inputs[group], variants)
            samples[name] = {v: [] for v in variants}
            note(f"{name}: {streams[name].input_rows()} input records in {args.files + 1} files, variants "
                 f"{', '.join(variants)}")

        kept: dict[str, dict[str, Path]] = {name: {} for name in streams}
        for i in range(repeats):
            for name, stream in streams.items():
                order = stream.variants[i % len(stream.variants):] + stream.variants[:i % len(stream.variants)]
                for v in order:
                    root = work / "runs" / f"{name}-{v}-{i}"
                    result = run_variant(stream, v, root, args.timeout, args.plain_local_fs)
                    samples[name][v].append(result)
                    note(f"{name} {v} ({VARIANTS[v]}) {i + 1}/{repeats}: {result['batch_s']:.1f}s of batches, "
                         f"{result['wall_s']:.1f}s wall, {result['rows_per_s']:.0f} rows/s, "
                         f"peak {result['peak_rss_mb']:.0f} MB, {result['files_total']} files")
                    if not result["progress_complete"]:
                        note(f"  some committed batches of {name} {v} have no progress record: its batch time "
                             "may be short")
                    if i == 0:
                        kept[name][v] = root
                    elif not args.keep:
                        shutil.rmtree(root, ignore_errors=True)

        from spark_jobs.runtime.session import build_session

        spark = build_session("bench-check", master=MASTER, extra={"spark.ui.enabled": False,
                                                                   "spark.ui.showConsoleProgress": False})
        for name, stream in streams.items():
            try:
                checks[name] = check(spark, stream, kept[name])
            except Exception as exc:  # reported beside the results
                checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            note(f"{name}: check {'passed' if checks[name]['ok'] else 'FAILED'}")
        spark.stop()
    finally:
        kill_descendants()  # a spark-submit interrupted, the check's JVM
        clean_up(work, args.keep)

    wall = note.elapsed()
    aimed = aims(args.files_per_trigger, args.files)
    summary = summarize(samples, aimed)
    print()
    print("\n".join(table(summary, checks, streams)))
    out, png = results_path(args.out), results_path(args.out, ".png")
    write_results(out, {
        "machine": machine(),
        "master": MASTER, "rows": rows, "files": args.files, "events_per_file": events_per_file, "repeats": repeats,
        "files_per_trigger": args.files_per_trigger, "plain_local_fs": args.plain_local_fs,
        "platform_local_fs": bool(local_fs_conf()),
        "quick": args.quick, "seed": args.seed, "wall_s": wall, "variants": VARIANTS,
        "aims": [{"stream": s, "ratio": r, "aim": a} for s, r, a in aimed],
        "summary": summary, "checks": checks, "samples": samples})
    chart(summary, png,
          f"available-now throughput, Spark {MASTER}, {os.cpu_count()} cores, ~{rows:,} rows per stream: "
          f"medians of {repeats}")
    print(f"\nwall time {wall / 60:.1f} min; written: {out}, {png}")
    return 0 if all(c.get("ok") for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
