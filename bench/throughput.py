"""Throughput of the platform's job against plain Spark on the same input.

    python bench/throughput.py [--quick] [--rows N] [--files N] [--repeats N] [--streams NAME ...] [--keep]

For each stream, one input is generated (``spark_jobs.testdata.generate``: about ``--rows`` valid
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
import contextlib
import io
import json
import math
import os
import platform as host
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from processes import MASTER, descendants, kill_tree, spark_submit

from spark_jobs.plan import compile_plan, result_columns, result_key, written_by_ingestion
from spark_jobs.runtime.checkpoint import (
    batch_ids,
    sink_files,
)
from spark_jobs.runtime.clock import parse_iso
from spark_jobs.runtime.progress import read_events
from spark_jobs.runtime.session import SESSION_CONF, connector_jars, fenced_checkpoints_conf, local_fs_conf
from spark_jobs.spec.layout import (
    Layout,
    project_root,
)
from spark_jobs.spec.loading import load_spec
from spark_jobs.spec.models import (
    INGEST_QUERY,
    SPARK_TYPES,
    Aggregation,
    DeltaSink,
    FileSource,
    ParquetSink,
    Passthrough,
    StreamSpec,
    TableSink,
)
from spark_jobs.testdata import generate

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
PLAIN_JOB = BENCH / "throughput_plain.py"
STREAM_JOB = project_root() / "spark_jobs" / "stream_job.py"
FOUR, ONE = "clicks_four_outputs", "clicks_one_output"
VARIANTS = {"a": "one parse query", "b": "one query per output", "c": "platform", "d": "one batch job",
            "e": "platform, Delta accepted", "f": "same work, two stages"}
#: the variants that run the platform's own job (e: its accepted rows in a Delta table)
PLATFORM = ("c", "e")
PLAIN_VARIANTS = {"a": "parse", "b": "per-output", "d": "batch", "f": "staged"}


def aims(files_per_trigger: int, files: int) -> list[tuple[str, str, float]]:
    """(stream, ratio, aim): printed beside the results; against the batch job, by the micro-batches' size."""
    batch_aim = 0.9 if files_per_trigger >= files + 1 else 0.8 if files_per_trigger <= 4 else None
    # one small file a micro-batch: at most 1.5 times what plain Spark takes for the same work
    staged_aim = [(FOUR, "c/f", round(1 / 1.5, 2))] if files_per_trigger == 1 else []
    return [(FOUR, "c/b", 1.5), (ONE, "c/b", 0.87), *([(FOUR, "c/d", batch_aim)] if batch_aim else []), *staged_aim]


# ---- the streams ------------------------------------------------------------------------------------


def bench_specs(folder: Path, files_per_trigger: int = 10) -> dict[str, Path]:
    """Write the CSV specs based on clicks.yaml (the example itself reads a Kafka topic): the
    example on files, and the two benchmark streams; their paths."""
    include = project_root() / "include"
    shutil.copytree(include / "reference", folder / "reference")
    (folder / "streams").mkdir(parents=True)
    clicks = on_file_sinks(yaml.safe_load((include / "streams" / "clicks.yaml").read_text()))
    on_files = {"type": "files", "path": "landing/clicks", "format": "csv", "columns": clicks["source"]["columns"],
                "max_files_per_trigger": files_per_trigger}
    source = dict(on_files, path="landing/clicks_bench")  # one landing directory for both specs: the same input

    def table(name: str, **extra: Any) -> dict:
        return {"type": "table", "table": name, "url": "sqlite:///tables.db", **extra}  # under the data root

    def parquet(stream: str, output: str, **extra: Any) -> dict:
        return {"type": "parquet", "path": f"sinks/{stream}/{output}", **extra}

    def spec(name: str, outputs: list[dict]) -> dict:
        return {"name": name, "description": "Benchmark stream (bench/throughput.py), based on clicks.",
                "owner": clicks["owner"], "source": source, "quarantine": {"path": f"quarantine/{name}"},
                "enrich": clicks["enrich"], "event_time": clicks["event_time"], "deduplicate": clicks["deduplicate"],
                "outputs": outputs, "trigger": clicks["trigger"], "checkpoint": f"checkpoints/{name}"}

    def views(stream: str) -> dict:
        return {"name": "views", "query": {"type": "passthrough"}, "mode": "append",
                "sink": parquet(stream, "views", partition_by=["event_date"])}

    four = [
        views(FOUR),
        {"name": "views_15m", "mode": "append", "sink": parquet(FOUR, "views_15m"),
         "query": {"type": "aggregate", "window": {"duration": "15 minutes", "slide": "5 minutes"},
                   "group_by": ["category"],
                   "aggregates": [{"name": "views", "fn": "count"},
                                  {"name": "users", "fn": "approx_count_distinct", "column": "user_id"},
                                  {"name": "avg_duration_ms", "fn": "avg", "column": "duration_ms"}]}},
        {"name": "page_totals", "mode": "complete", "sink": table("bench_page_totals", key=["page"]),
         "query": {"type": "aggregate", "group_by": ["page", "category"],
                   "aggregates": [{"name": "views", "fn": "count"},
                                  {"name": "total_duration_ms", "fn": "sum", "column": "duration_ms"}]}},
        {"name": "user_activity", "mode": "update", "sink": table("bench_user_activity"),
         "query": {"type": "aggregate", "group_by": ["user_id"],
                   "aggregates": [{"name": "views", "fn": "count"},
                                  {"name": "last_seen", "fn": "max", "column": "ts"},
                                  {"name": "last_page", "fn": "latest", "column": "page"}]}},
    ]
    paths = {"clicks": folder / "streams" / "clicks.yaml", "sensors": folder / "streams" / "sensors.yaml"}
    paths["clicks"].write_text("# Written by bench/throughput.py: include/streams/clicks.yaml on CSV files.\n"
                               + yaml.safe_dump(clicks | {"source": on_files}, sort_keys=False))
    sensors = yaml.safe_load((include / "streams" / "sensors.yaml").read_text())
    sensors["source"]["max_files_per_trigger"] = files_per_trigger
    paths["sensors"].write_text("# Written by bench/throughput.py: include/streams/sensors.yaml.\n"
                                + yaml.safe_dump(sensors, sort_keys=False))
    for path in (paths["clicks"], paths["sensors"]):
        load_spec(path)
    for name, outputs in ((FOUR, four), (ONE, [views(ONE)])):
        paths[name] = folder / "streams" / f"{name}.yaml"
        paths[name].write_text("# Written by bench/throughput.py; based on include/streams/clicks.yaml.\n"
                               + yaml.safe_dump(spec(name, outputs), sort_keys=False))
        load_spec(paths[name])  # valid, or fail here
    return paths


def on_file_sinks(spec: dict) -> dict:
    """An example spec with its Delta tables written as Parquet instead: the plain Spark jobs
    here write Parquet and SQLite (Delta against Parquet is bench/delta_sinks.py's measure)."""
    spec = json.loads(json.dumps(spec))
    for output in spec["outputs"]:
        if output["sink"]["type"] == "delta":
            output["sink"] = {**output["sink"], "type": "parquet", "path": f"sinks/{spec['name']}/{output['name']}"}
    spec.pop("maintenance", None)
    return spec


class Stream:
    """One benchmarked stream: its spec, its generated input and the variants it runs."""

    def __init__(self, name: str, spec_path: Path, input_root: Path, variants: str):
        self.name, self.spec_path, self.input_root, self.variants = name, spec_path, input_root, variants
        self.spec: StreamSpec = load_spec(spec_path)
        assert isinstance(self.spec.source, FileSource)
        self.delta_spec_path = spec_path.parent.with_name("streams_delta_accepted") / spec_path.name
        self.delta_spec: StreamSpec | None = self._write_delta_spec() if "e" in variants else None

    def _write_delta_spec(self) -> StreamSpec:
        """(e): the same spec with its accepted rows in a Delta table, beside the others (same
        reference data); the pass-through output the ingestion writes becomes that Delta table,
        so e does c's work. Written only for e: a caller may pass a spec of the project's own."""
        path = self.delta_spec_path
        path.parent.mkdir(exist_ok=True)
        data = yaml.safe_load(self.spec_path.read_text()) | {"accepted": {"format": "delta"}}
        served = written_by_ingestion(self.spec)
        for output in data["outputs"]:
            if served is not None and output["name"] == served.name:
                output["sink"] = {**output["sink"], "type": "delta"}
        path.write_text("# Written by bench/throughput.py: accepted rows in a Delta table.\n"
                        + yaml.safe_dump(data, sort_keys=False))
        return load_spec(path)

    def spec_of(self, variant: str) -> StreamSpec:
        if variant == "e":
            assert self.delta_spec is not None, "variant e was not asked for"
            return self.delta_spec
        return self.spec

    def layout(self, root: Path) -> Layout:
        return Layout(self.spec, root, self.spec_path.parent)

    def jars(self) -> list[str]:
        """Jars its drivers need beside Spark's own (none for files)."""
        return []

    def prepare(self, root: Path) -> None:
        """A fresh data root holding hard links of the generated landing files (same mtimes)."""
        src, dst = Path(self.layout(self.input_root).landing), Path(self.layout(root).landing)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, copy_function=os.link)

    def session_conf(self) -> dict[str, Any]:
        """What ``build_session`` sets for this spec (log level, SESSION_CONF, shuffle partitions, spark.conf)."""
        return {"spark.log.level": os.environ.get("STREAMS_SPARK_LOG_LEVEL", "WARN"), **SESSION_CONF,
                "spark.sql.shuffle.partitions": self.spec.spark.shuffle_partitions, **self.spec.spark.conf}

    def source_job(self, layout: Layout) -> dict[str, Any]:
        """The job file's ``source``: how ``bench/throughput_plain.py`` reads the input."""
        src = self.spec.source
        assert isinstance(src, FileSource)
        return {"format": src.format, "schema": compile_plan(self.spec, layout).source.reader_ddl,
                "options": src.options, "landing": layout.landing, "max_files_per_trigger": src.max_files_per_trigger}

    def plain_job(self, variant: str, root: Path) -> dict[str, Any]:
        """The job file of ``bench/throughput_plain.py`` for this stream's spec."""
        spec, layout, src = self.spec, self.layout(root), self.spec.source
        outputs = []
        for o in spec.outputs:
            q, sink = o.query, o.sink
            out: dict[str, Any] = {"name": o.name, "mode": o.mode}
            if isinstance(q, Passthrough):
                out.update(query="passthrough", columns=result_columns(spec, o))
            else:
                assert isinstance(q, Aggregation)
                out.update(query="aggregate", group_by=q.group_by,
                           window=q.window and {"duration": q.window.duration, "slide": q.window.slide},
                           aggregates=[{"name": a.name, "fn": a.fn, "column": a.column} for a in q.aggregates])
            if isinstance(sink, ParquetSink):
                out["sink"] = {"type": "parquet", "path": layout.data(sink.path), "partition_by": sink.partition_by}
            else:
                assert isinstance(sink, TableSink)
                url = layout.table_url(sink)
                if not url.startswith("sqlite:///"):
                    raise ValueError(f"{self.name}.{o.name}: the benchmark writes tables to SQLite only, not {url}")
                out["sink"] = {"type": "table", "db": url.removeprefix("sqlite:///"), "table": sink.table,
                               "key": result_key(spec, o)}
            outputs.append(out)
        et = spec.event_time
        plan = compile_plan(spec, layout)
        assert plan.ingestion is not None and plan.ingestion.accepted_columns is not None
        served = written_by_ingestion(spec)
        conf = {**self.session_conf(), "spark.sql.streaming.numRecentProgressUpdates": 100_000}
        return {
            "app": f"bench-{variant}:{self.name}", "variant": PLAIN_VARIANTS[variant],
            "conf": conf,
            "source": self.source_job(layout),
            "columns": [c.name for c in src.columns], "required": [c.name for c in src.columns if c.required],
            "event_time": et and {"column": et.column, "watermark": et.watermark},
            "deduplicate": spec.deduplicate.key if spec.deduplicate else None,
            "joins": [{"path": layout.reference(e.path), "format": e.format, "key": e.key, "how": e.how,
                       "columns": [(c.name, SPARK_TYPES[c.type]) for c in e.columns]}
                      for e in spec.enrich],
            "outputs": outputs,
            "quarantine": layout.data(spec.quarantine.path) if spec.quarantine else None,
            # (f): where its first stage writes the accepted rows (a pass-through output's sink, as the platform)
            "accepted": (layout.data(served.sink.path) if served is not None and isinstance(served.sink, ParquetSink)
                         else str(root / "sinks" / "accepted")),
            "accepted_columns": list(plan.ingestion.accepted_columns),
            "parse_sink": str(root / "sinks" / "parse"),
            "checkpoints": str(root / "bench-checkpoints"),
            "result": str(root / "result.json"),
        }

    def file_sinks(self, variant: str, root: Path) -> dict[str, str]:
        """The Parquet sinks a variant writes: name -> path."""
        layout = self.layout(root)
        if variant == "a":
            return {"parse": str(root / "sinks" / "parse")}
        sinks = {"accepted": compile_plan(self.spec, layout).accepted} if variant == "c" else {}  # e: a Delta table
        if variant == "f":
            sinks["accepted"] = self.plain_job(variant, root)["accepted"]
        if self.spec.quarantine:
            sinks["quarantine"] = layout.data(self.spec.quarantine.path)
        served = written_by_ingestion(self.spec_of(variant))
        for o in self.spec.outputs:
            if variant in (*PLATFORM, "f") and served is not None and o.name == served.name:
                continue  # its sink is the accepted-rows table, counted once as "accepted"
            if isinstance(o.sink, ParquetSink):
                sinks[o.name] = layout.data(o.sink.path)
        return sinks

    def input_rows(self) -> int:
        return self.manifest_counts()["input_records"]

    def manifest_counts(self) -> dict[str, Any]:
        """The generator's counts, and the rows every output holds in the end (ground truth)."""
        if not hasattr(self, "_counts"):
            generated = self.input_root / "generated"
            (manifest,) = generated.glob("*/manifest.json")
            data = json.loads(manifest.read_text())
            self._counts = {**data["counts"], "outputs": {n: len(o["rows"]) for n, o in data["outputs"].items()}}
        return self._counts


# ---- one run ----------------------------------------------------------------------------------------


def _epoch(iso: str) -> float:
    return parse_iso(iso).timestamp()


def batches_of(stream: Stream, variant: str, root: Path) -> tuple[list[dict], bool]:
    """Every batch of every query (query, start, end, input rows), and whether every committed
    batch has its progress record."""
    if variant in PLATFORM:
        layout = stream.layout(root)
        found = [{"query": e["query"], "batch_id": e["batch_id"], "start": _epoch(e["timestamp"]),
                  "end": _epoch(e["timestamp"]) + (e.get("duration_ms") or {}).get("triggerExecution", 0) / 1000,
                  "input_rows": e.get("input_rows", 0), "parts": e.get("duration_ms") or {}}
                 for e in read_events(layout.events_file) if e.get("event") == "progress"]
        checkpoints = compile_plan(stream.spec, layout).checkpoints
    else:
        result = json.loads((root / "result.json").read_text())
        found = [{"query": b["query"], "batch_id": b["batch_id"], "start": _epoch(b["timestamp"]),
                  "end": _epoch(b["timestamp"]) + b["trigger_ms"] / 1000, "input_rows": b["input_rows"]}
                 for b in result["batches"]]
        checkpoints = {q: str(root / "bench-checkpoints" / q) for q in {b["query"] for b in found}}
    complete = all(set(batch_ids(path, "commits")) <= {b["batch_id"] for b in found if b["query"] == q}
                   for q, path in checkpoints.items())
    return found, complete


def data_files(path: str) -> int:
    """The data files of a Parquet sink: those its ``_spark_metadata`` log committed, or all (a
    folder a batch job or ``foreachBatch`` wrote has no log)."""
    if (Path(path) / "_spark_metadata").is_dir():
        return len(sink_files(path))
    return len(list(Path(path).rglob("*.parquet")))


def run_variant(stream: Stream, variant: str, root: Path, timeout: float, plain_local_fs: bool = False) -> dict[str, Any]:
    stream.prepare(root)
    log = root / "spark-submit.log"
    jars = stream.jars()
    if variant in PLATFORM:
        spec_path = stream.delta_spec_path if variant == "e" else stream.spec_path
        args = [str(STREAM_JOB), "--spec", str(spec_path), "--data-root", str(root), "--trigger", "available-now"]
        if variant == "e":
            jars = sorted({*jars, *connector_jars()})
    else:
        job = root / "job.json"
        job.write_text(json.dumps(stream.plain_job(variant, root), indent=1))
        args = [str(PLAIN_JOB), "--job", str(job)]
    load = os.getloadavg()[0]
    # the platform's drivers write through its local file system, their checkpoints fenced by the
    # lease; plain Spark through Hadoop's, unless asked, and unfenced
    conf = local_fs_conf() if variant in PLATFORM or plain_local_fs else None
    if variant in PLATFORM:
        conf = {**(conf or {}), **fenced_checkpoints_conf()}
    run = spark_submit(args, log, timeout, jars=jars, conf=conf)
    if run["exit_code"] != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{stream.name} variant {variant} exited {run['exit_code']}; {log}:\n{tail}")
    batches, complete = batches_of(stream, variant, root)
    if not batches:
        raise RuntimeError(f"{stream.name} variant {variant}: no batch recorded; see {log}")
    begin, end = min(b["start"] for b in batches), max(b["end"] for b in batches)
    rows = stream.input_rows()
    read = {}
    for b in batches:
        read[b["query"]] = read.get(b["query"], 0) + b["input_rows"]
    reading = {"a": ["parse"], "b": sorted(set(read) - {"quarantine"}) or ["quarantine"], "c": [INGEST_QUERY],
               "d": ["batch"], "e": [INGEST_QUERY], "f": ["ingest"]}[variant]
    files = {name: data_files(path) for name, path in stream.file_sinks(variant, root).items()}
    # one micro-batch of the queries reading the input: how long, and (platform) where it went
    reading_batches = [b for b in batches if b["query"] in reading and b["input_rows"]]
    per_batch = {"batch_ms": statistics.median((b["end"] - b["start"]) * 1000 for b in reading_batches)
                 if reading_batches and variant != "d" else None}
    if variant in PLATFORM and reading_batches:
        per_batch["parts_ms"] = {k: statistics.median(b["parts"].get(k, 0) for b in reading_batches)
                                 for k in sorted({k for b in reading_batches for k in b["parts"]})}
    return {"rows": rows, "batch_s": end - begin, "rows_per_s": rows / (end - begin),
            "rows_per_s_wall": rows / run["wall_s"], "startup_s": begin - run["started_at"],
            "batches": len(batches), "progress_complete": complete,
            "rows_read": {q: read.get(q, 0) for q in reading}, "files": files, "files_total": sum(files.values()),
            "per_batch": per_batch,
            "load_average_before": load, **run}


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


def check(spark, stream: Stream, roots: dict[str, Path]) -> dict[str, Any]:  # noqa: ANN001
    """Read back the sinks of one repeat: counts against the ground truth, (b) against (c)."""
    from pyspark.sql import functions as F

    from spark_jobs.testdata.verify import normalize, read_table

    truth = stream.manifest_counts()
    problems: list[str] = []
    counts: dict[str, Any] = {}

    def parquet(path: str):  # noqa: ANN202 - a DataFrame, or None for an absent sink
        try:
            return spark.read.parquet(path)
        except Exception as exc:  # noqa: BLE001
            if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
                return None
            raise

    def count(frame) -> int:  # noqa: ANN001
        return 0 if frame is None else frame.count()

    if "a" in roots:
        counts["a"] = {"parse": count(parquet(str(roots["a"] / "sinks" / "parse")))}
        if counts["a"]["parse"] != truth["input_records"]:
            problems.append(f"a: {counts['a']['parse']} rows parsed, {truth['input_records']} input records")
    outputs: dict[str, dict[str, Any]] = {}
    for v in ("b", "c", "e", "f"):
        if v not in roots:
            continue
        layout = stream.layout(roots[v])
        counts[v] = {}
        outputs[v] = {}
        for o in stream.spec_of(v).outputs:
            if isinstance(o.sink, DeltaSink):
                frame = spark.read.format("delta").load(layout.data(o.sink.path))
                outputs[v][o.name] = frame
                counts[v][o.name] = count(frame)
            elif isinstance(o.sink, ParquetSink):
                frame = parquet(layout.data(o.sink.path))
                outputs[v][o.name] = frame
                counts[v][o.name] = count(frame)
            else:
                rows = read_table(layout.table_url(o.sink), o.sink.table)
                outputs[v][o.name] = rows
                counts[v][o.name] = len(rows)
            if counts[v][o.name] != truth["outputs"][o.name]:
                problems.append(f"{v}: {o.name} holds {counts[v][o.name]} rows, the ground truth "
                                f"{truth['outputs'][o.name]}")
        frame = parquet(layout.data(stream.spec.quarantine.path))
        outputs[v]["quarantine"] = frame
        counts[v]["quarantine"] = count(frame)
        if counts[v]["quarantine"] != truth["quarantined"]:
            problems.append(f"{v}: {counts[v]['quarantine']} quarantined, the ground truth {truth['quarantined']}")
    if "d" in roots:  # a batch keeps what a stream drops as late
        layout = stream.layout(roots["d"])
        counts["d"] = {"quarantine": count(parquet(layout.data(stream.spec.quarantine.path)))}
        if counts["d"]["quarantine"] != truth["quarantined"]:
            problems.append(f"d: {counts['d']['quarantine']} quarantined, the ground truth {truth['quarantined']}")
        for o in stream.spec.outputs:
            if isinstance(o.query, Passthrough) and isinstance(o.sink, ParquetSink):
                counts["d"][o.name] = count(parquet(layout.data(o.sink.path)))
                expected = truth["outputs"][o.name] + truth["dropped_late"]
                if counts["d"][o.name] != expected:
                    problems.append(f"d: {o.name} holds {counts['d'][o.name]} rows, the ground truth's accepted and "
                                    f"late rows {expected}")
    if "b" in outputs and "c" in outputs:
        b, c = outputs["b"], outputs["c"]
        for o in stream.spec.outputs:
            if isinstance(o.query, Passthrough):
                cols = sorted(c[o.name].columns) if c[o.name] is not None else []
                if b[o.name] is not None and c[o.name] is not None:
                    left, right = b[o.name].select(*cols), c[o.name].select(*cols)
                    if left.exceptAll(right).count() or right.exceptAll(left).count():
                        problems.append(f"b and c: {o.name} differs")
                elif (b[o.name] is None) != (c[o.name] is None):
                    problems.append(f"b and c: {o.name} is empty in one only")
                continue
            key = result_key(stream.spec, o)

            def rows(value: Any) -> list[dict]:
                if value is None:
                    return []
                if isinstance(value, list):
                    return value
                return [{k: normalize(x) for k, x in r.asDict().items()} for r in value.collect()]

            differs = same_rows(rows(b[o.name]), rows(c[o.name]), key)
            if differs:
                problems.append(f"b and c: {o.name}: {differs}")

        def records(frame):  # noqa: ANN001, ANN202
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
    ok = {True: "met", False: "MISSED", None: "not measured"}
    for name, s in summary.items():
        for a in s["aims"]:
            value = "-" if a["value"] is None else f"{a['value']:.2f}"
            lines.append(f"  {name} {a['ratio']} {a['aim']}: {value} {ok[a['met']]}")
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- main -------------------------------------------------------------------------------------------


def run_generator(spec_path: Path, data_root: Path, files: int, events_per_file: int, seed: int) -> None:
    with contextlib.redirect_stdout(io.StringIO()):
        code = generate.main(["--spec", str(spec_path), "--data-root", str(data_root), "--files", str(files),
                              "--events-per-file", str(events_per_file), "--seed", str(seed)])
    if code != 0:
        raise RuntimeError(f"the generator failed (exit {code}) for {spec_path}")


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
    p.add_argument("--out", default="throughput", help="results' name in bench/results/ (default throughput)")
    args = p.parse_args(argv)
    rows = args.rows or (50_000 if args.quick else 1_000_000)
    repeats = args.repeats or (1 if args.quick else 3)
    events_per_file = max(1, rows // args.files)
    os.environ.update(TZ="UTC", SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    os.environ.pop("STREAMS_DB_URL", None)
    time.tzset()

    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    print(f"working folder {work}; {args.files} files x {events_per_file} events per stream; {repeats} repeat(s)",
          flush=True)

    def note(what: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {what}", flush=True)

    me = os.getpid()
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
            except Exception as exc:  # noqa: BLE001 - reported beside the results
                checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            note(f"{name}: check {'passed' if checks[name]['ok'] else 'FAILED'}")
        spark.stop()
    finally:
        for pid in descendants(me):  # a spark-submit interrupted, the check's JVM
            kill_tree(pid)
        if args.keep:
            print(f"kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    wall = time.monotonic() - started
    aimed = aims(args.files_per_trigger, args.files)
    summary = summarize(samples, aimed)
    print()
    print("\n".join(table(summary, checks, streams)))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{args.out}.json"
    import pyspark

    out.write_text(json.dumps({
        "machine": {"cpus": os.cpu_count(), "platform": host.platform(), "machine": host.machine(),
                    "python": sys.version.split()[0], "pyspark": pyspark.__version__},
        "master": MASTER, "rows": rows, "files": args.files, "events_per_file": events_per_file, "repeats": repeats,
        "files_per_trigger": args.files_per_trigger, "plain_local_fs": args.plain_local_fs,
        "platform_local_fs": bool(local_fs_conf()),
        "quick": args.quick, "seed": args.seed, "wall_s": wall, "variants": VARIANTS,
        "aims": [{"stream": s, "ratio": r, "aim": a} for s, r, a in aimed],
        "summary": summary, "checks": checks, "samples": samples}, indent=1, default=str))
    chart(summary, RESULTS / f"{args.out}.png",
          f"available-now throughput, Spark {MASTER}, {os.cpu_count()} cores, ~{rows:,} rows per stream: "
          f"medians of {repeats}")
    print(f"\nwall time {wall / 60:.1f} min; written: {out}, {RESULTS / f'{args.out}.png'}")
    return 0 if all(c.get("ok") for c in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
