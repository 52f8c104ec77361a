"""What the benchmarks share to run: the processes they start, measure and end, the generator's
runs, the stream under test and its variants, the sinks they watch, Airflow, the working folder.

Every script of ``bench/`` takes these from here (and its tables, charts and results from
:mod:`bench.report`). Run them from the project's root: ``python -m bench.<name>``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import yaml

from runner.airflow import AirflowClient, AirflowServices
from runner.processes import wait_for
from runner.testdata import generate
from spark_jobs.plan import ParquetDataset, StreamPlan, TableDataset, compile_plan
from spark_jobs.runtime.checkpoint import batch_ids, file_name, landed_files, processed_files, sink_files
from spark_jobs.runtime.clock import parse_iso
from spark_jobs.runtime.lease import holder_alive, read_holder
from spark_jobs.runtime.progress import read_events
from spark_jobs.runtime.session import (
    SESSION_CONF,
    available_now_conf,
    class_archive_conf,
    connector_jars,
    fenced_checkpoints_conf,
    local_fs_conf,
)
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import (
    INGEST_FLOW,
    SPARK_TYPES,
    Aggregation,
    FileSource,
    Passthrough,
    StreamSpec,
)
from streamops.cost import reaped_cpu

MASTER = "local[2]"
BENCH = Path(__file__).resolve().parent
#: the plain Spark jobs the platform is compared with (run by spark-submit as a file)
PLAIN_JOB = BENCH / "throughput_plain.py"
STREAM_JOB = project_root() / "spark_jobs" / "stream_job.py"
#: the two streams bench_specs writes, on the clicks example's CSV input
FOUR, ONE = "clicks_four_outputs", "clicks_one_output"
#: the variants that run the platform's own job (e: its accepted rows in a Delta table)
PLATFORM = ("c", "e")
#: the plain variants: the job of ``bench/throughput_plain.py`` each runs
PLAIN_VARIANTS = {"a": "parse", "b": "per-output", "d": "batch", "f": "staged"}


# ---- processes: the trees spark-submit starts, their memory, their end -------------------------------


def descendants(root: int) -> list[int]:
    """The pids of every process descended from ``root``; none if it is gone."""
    try:
        return [p.pid for p in psutil.Process(root).children(recursive=True)]
    except (psutil.Error, ValueError):
        return []


def cmdline(pid: int) -> bytes:
    """The process's arguments, separated by NUL bytes; empty if it is gone (or a zombie)."""
    try:
        return b"\0".join(map(os.fsencode, psutil.Process(pid).cmdline()))
    except (psutil.Error, ValueError):
        return b""


def rss_bytes(pid: int) -> int:
    """The process's resident memory, 0 if it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss
    except (psutil.Error, ValueError):
        return 0


def pss_bytes(pid: int) -> int:
    """The process's proportional share of the memory it maps: pages shared with other processes
    (forked Python workers, a JVM's shared libraries) count once across them, so sums hold.
    0 if it is gone."""
    try:
        return psutil.Process(pid).memory_full_info().pss
    except (psutil.Error, ValueError):
        return 0


def cpu_seconds(root: int) -> float:
    """User and system CPU time of ``root`` and its live descendants (a JVM and its Python
    workers), and of the children they have waited for."""
    total = 0.0
    for pid in [root, *descendants(root)]:
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.Error, ValueError):
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def kill_pids(pids: dict[int, bytes]) -> None:
    """SIGKILL each pid still running the command line it had when it was recorded."""
    for pid, cmd in pids.items():
        if cmd and cmdline(pid) == cmd:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and its descendants (recorded first, so that none escapes by being reparented)."""
    kill_pids({pid: cmdline(pid) for pid in [*descendants(root), root]})


def kill_descendants() -> None:
    """SIGKILL every process tree this process started (a spark-submit interrupted, a check's JVM)."""
    for pid in descendants(os.getpid()):
        kill_tree(pid)


def end_everything(lease_dir: Path | str | None = None, airflow: AirflowServices | None = None) -> None:
    """End every process this one started, and the driver the platform left holding the lease
    in ``lease_dir`` (reparented, it is no descendant): recorded first, then Airflow's services
    stopped, then each recorded pid still running its command line killed, and what is left."""
    me = os.getpid()
    recorded = {pid: cmdline(pid) for pid in descendants(me)}
    if lease_dir is not None:
        holder = read_holder(lease_dir)
        if holder is not None and holder_alive(lease_dir):
            recorded.update({pid: cmdline(pid) for pid in (holder.pid, holder.launcher_pid) if pid > 1})
    if airflow is not None:
        airflow.stop()
    kill_pids(recorded)
    kill_pids({pid: cmdline(pid) for pid in descendants(me)})


class PeakRss(threading.Thread):
    """Peak resident memory of one spark-submit: its JVM and every Python process under it.
    ``measure``: of one process, :func:`rss_bytes` (default) or :func:`pss_bytes`;
    ``include_root``: False to measure only the root's descendants (every spark-submit this
    process started)."""

    def __init__(self, root: int, every: float = 0.2, measure: Callable[[int], int] = rss_bytes,
                 include_root: bool = True):
        super().__init__(daemon=True)
        self.root, self.every, self.measure, self.include_root = root, every, measure, include_root
        self.jvm = self.python = self.total = 0
        self.seen: dict[int, bytes] = {}  # every process of the tree seen, with its command line
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            jvm = python = 0
            for pid in [self.root, *descendants(self.root)] if self.include_root else descendants(self.root):
                cmd = cmdline(pid)
                self.seen.setdefault(pid, cmd)
                argv = cmd.split(b"\0")
                if b"org.apache.spark.deploy.SparkSubmit" in argv:
                    jvm += self.measure(pid)
                elif os.path.basename(argv[0]).startswith(b"python"):
                    python += self.measure(pid)
            self.jvm, self.python = max(self.jvm, jvm), max(self.python, python)
            self.total = max(self.total, jvm + python)
            self._done.wait(self.every)

    def stop(self) -> dict[str, float]:
        self._done.set()
        self.join()
        return {"peak_rss_mb": self.total / 2**20, "peak_jvm_mb": self.jvm / 2**20,
                "peak_python_mb": self.python / 2**20}


def child_env() -> dict[str, str]:
    root = str(project_root())
    path = os.pathsep.join([root, str(project_root() / "plugins"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, TZ="UTC", SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=path,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("STREAMS_DB_URL", None)  # tables of specs without a url go to <data root>/tables.db
    return env


def prepare_environment() -> None:
    """This process's own environment as its children's: UTC, Spark on loopback, this Python for
    Spark's workers, tables of specs without a url under the data root."""
    os.environ.update(TZ="UTC", SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    os.environ.pop("STREAMS_DB_URL", None)
    time.tzset()


def submit_command(args: list[str], jars: list[str] | None = None, conf: dict[str, str] | None = None) -> list[str]:
    """``spark-submit --master local[2] [--jars ...] --conf spark.ui.showConsoleProgress=false [--conf ...] <args>``."""
    confs = [arg for k, v in (conf or {}).items() for arg in ("--conf", f"{k}={v}")]
    return [str(Path(sys.executable).parent / "spark-submit"), "--master", MASTER,
            *(["--jars", ",".join(jars)] if jars else []), "--conf", "spark.ui.showConsoleProgress=false", *confs,
            *args]


def spark_submit(args: list[str], log: Path, timeout: float, jars: list[str] | None = None,
                 conf: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``spark-submit --master local[2] [--jars ...] [--conf ...] <args>``; exit code, wall time, peak memory."""
    cmd = submit_command(args, jars, conf)
    with open(log, "w") as out:
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env())
        code, memory = wait_measured(proc, timeout)
        wall = time.time() - started
    return {"exit_code": code, "wall_s": wall, "started_at": started, **memory}


def run_measured(cmd: list[str], log: Path) -> dict[str, float]:
    """Run ``cmd`` to its exit, its output appended to ``log``: its wall time and CPU seconds, whole
    process (exact: this process's reaped children's CPU around it). Raises if it exits non-zero."""
    before, started = reaped_cpu(), time.monotonic()
    with log.open("a") as out:
        code = subprocess.run(cmd, env=child_env(), stdout=out, stderr=subprocess.STDOUT).returncode
    wall, used = time.monotonic() - started, reaped_cpu() - before
    if code != 0:
        raise RuntimeError(f"exited {code} (its output: {log}): {' '.join(cmd)}")
    return {"wall_s": round(wall, 2), "cpu_s": round(used, 2)}


def wait_measured(proc: subprocess.Popen, timeout: float, every: float = 0.2) -> tuple[int, dict[str, float]]:
    """Wait for a spark-submit this process started, sampling its peak memory every ``every`` s:
    its exit code and :class:`PeakRss`'s figures. Its whole tree is killed if the wait fails, and
    nothing of it outlives it (a Python worker left behind)."""
    sampler = PeakRss(proc.pid, every=every)
    sampler.start()
    try:
        code = proc.wait(timeout)
    except BaseException:
        kill_tree(proc.pid)
        proc.wait()
        raise
    finally:
        memory = sampler.stop()
        kill_pids(sampler.seen)
    return code, memory


# ---- the working folder -------------------------------------------------------------------------------


def working_folder(prefix: str) -> Path:
    """A new folder in the temp dir for one run's inputs, data roots and logs."""
    return Path(tempfile.mkdtemp(prefix=prefix))


def clean_up(work: Path, keep: bool, say: Callable[[str], None] = print) -> None:
    """Remove the working folder, or say where it is kept."""
    if keep:
        say(f"kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


# ---- the generator ------------------------------------------------------------------------------------


def run_generator(spec_path: Path, data_root: Path, files: int, events_per_file: int, seed: int, *,
                  empty_files: int | None = None, event_interval_ms: int | None = None) -> None:
    """``runner.testdata.generate`` in batch mode, quietly: ``files`` files of the spec's stream
    into ``data_root`` (the generator's defaults where an argument is None)."""
    args = ["--spec", str(spec_path), "--data-root", str(data_root), "--files", str(files),
            "--events-per-file", str(events_per_file), "--seed", str(seed)]
    if event_interval_ms is not None:
        args += ["--event-interval-ms", str(event_interval_ms)]
    if empty_files is not None:
        args += ["--empty-files", str(empty_files)]
    with contextlib.redirect_stdout(io.StringIO()):
        code = generate.main(args)
    if code != 0:
        raise RuntimeError(f"the generator failed (exit {code}) for {spec_path} into {data_root}")


# ---- the streams under test ---------------------------------------------------------------------------


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


def landing_of(plan: StreamPlan) -> str:
    """The folder a stream reading files takes its input from."""
    assert plan.source is not None and plan.source.landing is not None, f"stream {plan.stream} reads no files"
    return plan.source.landing


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
        served = compile_plan(self.spec, Layout(self.spec)).output_written_by_ingestion
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

    def plan(self, root: Path, variant: str | None = None) -> StreamPlan:
        """The plan of the stream (of the variant's spec, if given: :meth:`spec_of`) over the data
        root ``root``, compiled once per call: pass it down."""
        spec = self.spec if variant is None else self.spec_of(variant)
        return compile_plan(spec, Layout(spec, root, self.spec_path.parent))

    def jars(self) -> list[str]:
        """Jars its drivers need beside Spark's own (none for files)."""
        return []

    def prepare(self, root: Path) -> None:
        """A fresh data root holding hard links of the generated landing files (same mtimes)."""
        src, dst = Path(landing_of(self.plan(self.input_root))), Path(landing_of(self.plan(root)))
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, copy_function=os.link)

    def session_conf(self) -> dict[str, Any]:
        """What ``build_session`` sets for this spec (log level, SESSION_CONF, shuffle partitions, spark.conf)."""
        return {"spark.log.level": os.environ.get("STREAMS_SPARK_LOG_LEVEL", "WARN"), **SESSION_CONF,
                "spark.sql.shuffle.partitions": self.spec.spark.shuffle_partitions, **self.spec.spark.conf}

    def source_job(self, plan: StreamPlan) -> dict[str, Any]:
        """The job file's ``source``: how ``bench/throughput_plain.py`` reads the input."""
        src = plan.source
        assert src is not None and src.is_files
        return {"format": src.format, "schema": src.reader_ddl, "options": src.options, "landing": src.landing,
                "max_files_per_trigger": src.max_files_per_trigger}

    def plain_job(self, variant: str, root: Path) -> dict[str, Any]:
        """The job file of ``bench/throughput_plain.py`` for this stream's spec."""
        plan = self.plan(root)
        src, ingestion = plan.source, plan.ingestion
        assert src is not None and ingestion is not None and ingestion.accepted_columns is not None
        outputs = []
        for o in plan.outputs:
            q, sink = o.query, o.sink
            out: dict[str, Any] = {"name": o.name, "mode": o.mode}
            if isinstance(q, Passthrough):
                out.update(query="passthrough", columns=o.columns)
            else:
                assert isinstance(q, Aggregation)
                out.update(query="aggregate", group_by=q.group_by,
                           window=q.window and {"duration": q.window.duration, "slide": q.window.slide},
                           aggregates=[{"name": a.name, "fn": a.fn, "column": a.column} for a in q.aggregates])
            if isinstance(sink, ParquetDataset):
                out["sink"] = {"type": "parquet", "path": sink.path, "partition_by": sink.partition_by}
            else:
                assert isinstance(sink, TableDataset)
                url = sink.url
                if not url.startswith("sqlite:///"):
                    raise ValueError(f"{self.name}.{o.name}: the benchmark writes tables to SQLite only, not {url}")
                out["sink"] = {"type": "table", "db": url.removeprefix("sqlite:///"), "table": sink.table,
                               "key": o.key}
            outputs.append(out)
        et = ingestion.event_time
        served = plan.output_written_by_ingestion
        conf = {**self.session_conf(), "spark.sql.streaming.numRecentProgressUpdates": 100_000}
        return {
            "app": f"bench-{variant}:{self.name}", "variant": PLAIN_VARIANTS[variant],
            "conf": conf,
            "source": self.source_job(plan),
            "columns": [c.name for c in src.columns], "required": [c.name for c in src.columns if c.required],
            "event_time": et and {"column": et.column, "watermark": et.watermark},
            "deduplicate": ingestion.deduplicate,
            "joins": [{"path": j.path, "format": j.format, "key": j.key, "how": j.how,
                       "columns": [(c.name, SPARK_TYPES[c.type]) for c in j.columns]}
                      for j in ingestion.joins],
            "outputs": outputs,
            "quarantine": ingestion.quarantine,
            # (f): where its first stage writes the accepted rows (a pass-through output's sink, as the platform)
            "accepted": (served.sink.path if served is not None and isinstance(served.sink, ParquetDataset)
                         else str(root / "sinks" / "accepted")),
            "accepted_columns": list(ingestion.accepted_columns),
            "parse_sink": str(root / "sinks" / "parse"),
            "checkpoints": str(root / "bench-checkpoints"),
            "result": str(root / "result.json"),
        }

    def file_sinks(self, variant: str, root: Path) -> dict[str, str]:
        """The Parquet sinks a variant writes: name -> path."""
        if variant == "a":
            return {"parse": str(root / "sinks" / "parse")}
        plan = self.plan(root)
        sinks = {"accepted": plan.accepted_path} if variant == "c" else {}  # e: a Delta table
        if variant == "f":
            sinks["accepted"] = self.plain_job(variant, root)["accepted"]
        if plan.ingestion is not None and plan.ingestion.quarantine:
            sinks["quarantine"] = plan.ingestion.quarantine
        served = self.plan(root, variant).output_written_by_ingestion
        for o in plan.outputs:
            if variant in (*PLATFORM, "f") and served is not None and o.name == served.name:
                continue  # its sink is the accepted-rows table, counted once as "accepted"
            if isinstance(o.sink, ParquetDataset):
                sinks[o.name] = o.sink.path
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


# ---- one run of a variant -----------------------------------------------------------------------------


def epoch(iso: str) -> float:
    return parse_iso(iso).timestamp()


def batches_of(stream: Stream, variant: str, root: Path) -> tuple[list[dict], bool]:
    """Every batch of every query (query, start, end, input rows), and whether every committed
    batch has its progress record."""
    if variant in PLATFORM:
        layout = stream.layout(root)
        found = [{"query": e["query"], "batch_id": e["batch_id"], "start": epoch(e["timestamp"]),
                  "end": epoch(e["timestamp"]) + (e.get("duration_ms") or {}).get("triggerExecution", 0) / 1000,
                  "input_rows": e.get("input_rows", 0), "parts": e.get("duration_ms") or {}}
                 for e in read_events(layout.events_file) if e.get("event") == "progress"]
        checkpoints = stream.plan(root).checkpoints
    else:
        result = json.loads((root / "result.json").read_text())
        found = [{"query": b["query"], "batch_id": b["batch_id"], "start": epoch(b["timestamp"]),
                  "end": epoch(b["timestamp"]) + b["trigger_ms"] / 1000, "input_rows": b["input_rows"]}
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
    """One available-now run of a variant over the stream's input in a fresh data root: its
    batches' span, rows per second, peak memory, files per sink and median micro-batch."""
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
    # lease, Spark's classes mapped from the drivers' class archive, an available-now run's JVM
    # with the JIT's first tier only; plain Spark through Hadoop's, unless asked, unfenced, its
    # classes loaded as spark-submit loads them, the JVM's default JIT
    conf = local_fs_conf() if variant in PLATFORM or plain_local_fs else None
    if variant in PLATFORM:
        conf = available_now_conf({**(conf or {}), **fenced_checkpoints_conf(), **class_archive_conf()})
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
    reading = {"a": ["parse"], "b": sorted(set(read) - {"quarantine"}) or ["quarantine"], "c": [INGEST_FLOW],
               "d": ["batch"], "e": [INGEST_FLOW], "f": ["ingest"]}[variant]
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


# ---- the sinks, watched -------------------------------------------------------------------------------


class Watcher(threading.Thread):
    """When each record became readable in each sink: new files of Parquet sinks (their
    ``_spark_metadata`` log, or the data files in place of a folder in ``unlogged``), the
    growing count of views in a table."""

    def __init__(self, parquet: dict[str, str], tables: dict[str, tuple[Path, str]], unlogged: frozenset[str] = frozenset()):
        super().__init__(daemon=True)
        self.parquet, self.tables, self.unlogged = parquet, tables, unlogged
        self.seen: dict[str, dict[str, float]] = {name: {} for name in parquet}
        self.counts: dict[str, list[tuple[float, int]]] = {name: [] for name in tables}
        self._files: dict[str, set[str]] = {name: set() for name in parquet}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            now = time.time()
            for name, path in self.parquet.items():
                for f in sorted(self.committed(name, path) - self._files[name]):
                    self._files[name].add(f)
                    local = f.removeprefix("file://")
                    for event_id in pq.read_table(local, columns=["event_id"]).column("event_id").to_pylist():
                        self.seen[name].setdefault(event_id, now)
            for name, (db, table) in self.tables.items():
                views = table_views(db, table)
                if views is not None and (not self.counts[name] or views > self.counts[name][-1][1]):
                    self.counts[name].append((now, views))
            time.sleep(0.02)

    def committed(self, name: str, path: str) -> set[str]:
        if name not in self.unlogged:
            return sink_files(path)
        return {str(f) for f in Path(path).rglob("*.parquet") if "_temporary" not in f.parts}

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def counted(self, name: str, views: int) -> float | None:
        """When the table first counted ``views`` views."""
        return next((t for t, n in self.counts[name] if n >= views), None)

    def caught_up(self) -> bool:
        """Every table counts every record the first Parquet sink holds."""
        read = len(next(iter(self.seen.values())))
        return all(self.counts[n] and self.counts[n][-1][1] >= read for n in self.tables)


def table_views(db: Path, table: str) -> int | None:
    """The views a SQLite table counts (the sum of its ``views``), None while it cannot be read."""
    try:
        with sqlite3.connect(db) as conn:
            return int(conn.execute(f'SELECT coalesce(sum(views), 0) FROM "{table}"').fetchone()[0])
    except sqlite3.Error:
        return None


# ---- Airflow ------------------------------------------------------------------------------------------


def airflow(home: Path, data_root: Path, spec_dir: Path) -> tuple[AirflowServices, AirflowClient]:
    """Airflow's services for the specs in ``spec_dir`` (Spark ``local[2]``, not started yet), and
    a client of its REST API (no login: every request is an admin)."""
    services = AirflowServices(home, data_root, spark_master=MASTER, all_admins=True,
                               extra_env={"STREAMS_SPEC_DIR": str(spec_dir)})
    return services, AirflowClient(services.url, timeout=60)


def start_airflow(services: AirflowServices, api: AirflowClient, dags: Iterable[str]) -> None:
    """Start the services, wait until the API answers and ``dags`` are parsed, unpause them."""
    services.start()
    wait_for(services.healthy, "the Airflow API server", 240, every=1)
    wait_for(lambda: set(dags) <= services.dag_ids(), "the DAG processor to parse the DAGs", 300, every=3)
    for dag in dags:
        api.unpause(dag)


class Memory(threading.Thread):
    """The memory of the driver running now (its processes' PSS), integrated over time: MB-seconds."""

    def __init__(self, every: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.every, self.driver, self.mb_seconds, self.peak_mb = every, None, 0.0, 0.0
        self._done = threading.Event()

    def run(self) -> None:
        last = time.monotonic()
        while not self._done.wait(self.every):
            now = time.monotonic()
            driver = self.driver
            mb = 0.0 if driver is None else sum(pss_bytes(p) for p in [driver, *descendants(driver)]) / 1e6
            self.mb_seconds += mb * (now - last)
            self.peak_mb, last = max(self.peak_mb, mb), now

    def stop(self) -> None:
        self._done.set()
        self.join()


def freshness(plan: StreamPlan) -> tuple[list[float], int]:
    """Per landed file the ingestion has read: seconds from its landing until every sink had its rows
    (the ingestion batch's commit, and each output's first batch planned after it, committed); and
    how many files no sink had yet."""
    ingestion = plan.checkpoint(INGEST_FLOW)
    commits = Path(ingestion) / "commits"
    batch_of: dict[str, int] = {}
    seen: set[str] = set()
    for b in batch_ids(ingestion, "commits"):
        now = {file_name(p) for p in processed_files(ingestion, through_batch=b)}
        for f in now - seen:
            batch_of[f] = b
        seen = now
    outputs = []
    for name in plan.flows:
        if name == INGEST_FLOW:
            continue
        cp = Path(plan.checkpoint(name))
        outputs.append([(os.path.getmtime(cp / "offsets" / str(k)), os.path.getmtime(cp / "commits" / str(k)))
                        for k in batch_ids(cp, "commits")])
    fresh, missing = [], 0
    landed = {f.name: f.mtime for f in landed_files(landing_of(plan))}
    for f, b in batch_of.items():
        ingested = os.path.getmtime(commits / str(b))
        done = [ingested]
        for batches in outputs:
            after = [c for planned, c in batches if planned >= ingested]
            if not after:
                break
            done.append(min(after))
        else:
            fresh.append(max(done) - landed[f])
            continue
        missing += 1
    return fresh, missing + len(landed) - len(batch_of)


def accepted_rows(root: Path) -> tuple[int, int]:
    """The rows the accepted-rows table of the ``sensors`` example under the data root ``root`` holds
    (through its log), and those the generator's ground truth accepted."""
    table = root / "sinks" / "sensors" / "readings"
    held = sum(pq.read_metadata(f.removeprefix("file:")).num_rows for f in sink_files(table))
    manifest = json.loads((root / "generated" / "sensors" / "manifest.json").read_text())
    return held, manifest["counts"]["accepted"]
