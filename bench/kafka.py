"""Kafka: the platform against plain Spark on the same topic, records per second and freshness.

    python -m bench.kafka [--records N] [--repeats N] [--fresh N] [--keep]

A broker is started here (``runner/kafka.py``: KRaft on loopback, from the jars setup fetched)
and a three-partition topic filled once by the generator with the clicks example's records:
about ``--records`` valid events over 40 files, each file one Kafka transaction, with the
generator's default shares of malformed records, duplicates and late events. Every run is a
``spark-submit --master local[2]`` with Spark's Kafka connector (``--jars``) and the same
session settings, in a fresh data root.

Throughput (available-now trigger, the whole topic from its earliest offsets, at most the
spec's ``max_offsets_per_trigger`` records a micro-batch for both):

b. plain Spark, ``bench/throughput_plain.py`` variant ``per-output``: the example's outputs
   (a one-minute window to Parquet, a complete-mode table in SQLite) hand-written, one query
   per output plus a quarantine query, each reading and parsing the topic itself
   (``from_json``, PERMISSIVE, corrupt-record column);
c. the platform, ``spark_jobs/stream_job.py``: one ingestion query reading the topic once
   (parse, quarantine, deduplicate, join, the accepted rows), then one query per output.

Records per second over the batches' span (first batch's start to last batch's end, from
the progress of every query), medians of ``--repeats`` (variants interleaved); the ratio
c/b. Checked after every run: each variant's table holds one view per accepted record of
the ground truth.

Freshness (processing-time trigger of 1 second, each variant running alone): ``--fresh``
records produced at a steady rate of two per second to a topic of their own, and the time
from a record's acknowledgement by the broker to its being readable in each sink (its
file committed in the Parquet sink's ``_spark_metadata`` log, or counted in the table),
median and p99:

- plain Spark: ONE streaming query, the topic parsed into one Parquet sink;
- the platform: the example with a pass-through Parquet output added (served by the
  ingestion: its first sink), and its complete-mode table (a second stage, reading the
  accepted rows). The one-minute window is left out: it emits when the watermark passes.

Real-time mode does not apply: Spark 4.1 runs it for stateless queries writing to Kafka,
foreach or memory sinks, and every stream of the platform deduplicates (state) and writes
files or tables through ``foreachBatch``.

Output: a table on stdout and ``bench/results/kafka.json`` (``--out NAME``: ``NAME.json``).
Every process started here is ended by its pid, also on failure; the working folder is removed
unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.harness import (
    PLAIN_JOB,
    STREAM_JOB,
    Stream,
    Watcher,
    child_env,
    clean_up,
    kill_tree,
    on_file_sinks,
    run_variant,
    submit_command,
    table_views,
    working_folder,
)
from bench.report import Progress, latencies, machine, median_of, results_path, write_results
from runner.kafka import KafkaBroker, ensure_topics
from runner.testdata import generate
from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.session import connector_jars, submit_args
from spark_jobs.stream_spec.layout import Layout, project_root
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import KafkaSource

TOPIC, FRESH_TOPIC = "clicks", "clicks-fresh"
PARTITIONS = 3


class TopicStream(Stream):
    """The clicks example reading the benchmark's topic (``Stream`` reads landing files)."""

    def __init__(self, spec_path: Path, input_root: Path, bootstrap: str):
        self.name, self.spec_path, self.input_root, self.variants = "clicks", spec_path, input_root, "bc"
        self.spec = load_spec(spec_path)
        assert isinstance(self.spec.source, KafkaSource)
        self.bootstrap = bootstrap

    def prepare(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)  # the topic is the input: nothing to copy

    def jars(self) -> list[str]:
        return connector_jars()  # Spark's Kafka connector

    def source_job(self, plan: StreamPlan) -> dict[str, Any]:
        src = plan.source
        assert src is not None and src.kafka is not None and src.kafka.topics
        kafka = src.kafka
        options = {"kafka.bootstrap.servers": self.bootstrap, "subscribe": ",".join(kafka.topics),
                   "startingOffsets": "earliest", "failOnDataLoss": "true",
                   **({"maxOffsetsPerTrigger": str(kafka.max_offsets_per_trigger)} if kafka.max_offsets_per_trigger else {}),
                   **{k: str(v) for k, v in src.options.items()}}
        return {"format": "kafka", "value_format": src.format, "options": options, "schema": src.reader_ddl}


def write_specs(folder: Path) -> dict[str, Path]:
    """The clicks example on the benchmark's topic, and on the freshness topic with a pass-through output."""
    include = project_root() / "include"
    shutil.copytree(include / "reference", folder / "reference")
    (folder / "streams").mkdir(parents=True)
    clicks = on_file_sinks(yaml.safe_load((include / "streams" / "clicks.yaml").read_text()))
    fresh = json.loads(json.dumps(clicks))
    fresh["source"]["topics"] = [FRESH_TOPIC]
    fresh["trigger"] = {"processing_time": "1 second"}
    fresh["outputs"].insert(0, {"name": "views", "mode": "append", "query": {"type": "passthrough"},
                                "sink": {"type": "parquet", "path": "sinks/clicks/views"}})
    paths = {}
    for name, data in (("throughput", clicks), ("freshness", fresh)):
        paths[name] = folder / name / "streams" / "clicks.yaml"
        paths[name].parent.mkdir(parents=True)
        shutil.copytree(include / "reference", folder / name / "reference")
        paths[name].write_text(f"# Written by bench/kafka.py ({name}); based on include/streams/clicks.yaml.\n"
                               + yaml.safe_dump(data, sort_keys=False))
        load_spec(paths[name])
    return paths


# ---- throughput -----------------------------------------------------------------------------------


def run(stream: TopicStream, variant: str, root: Path, timeout: float) -> dict[str, Any]:
    """One run of ``throughput.run_variant``, its table checked against the ground truth."""
    sample = run_variant(stream, variant, root, timeout)
    views = table_views(root / "tables.db", "clicks_page_totals")
    accepted = stream.manifest_counts()["accepted"]
    if views != accepted:
        raise RuntimeError(f"variant {variant}: the table counts {views} views, the ground truth {accepted}")
    return {**sample, "table_views": views}


# ---- freshness ------------------------------------------------------------------------------------


def produce_steadily(broker: KafkaBroker, topic: str, ids: list[str], every: float) -> dict[str, float]:
    """One record per ``every`` seconds, each acknowledged before the next; acknowledgement times."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 0})
    acked: dict[str, float] = {}
    start = time.monotonic()
    for i, event_id in enumerate(ids):
        while time.monotonic() < start + i * every:
            time.sleep(0.005)
        value = json.dumps({"event_id": event_id, "user_id": "user-0001", "page": "/home", "duration_ms": 100,
                            "ts": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"})
        producer.produce(topic, value=value, partition=i % PARTITIONS)
        producer.flush(30)
        acked[event_id] = time.time()
    return acked


def freshness(variant: str, broker: KafkaBroker, spec_path: Path, root: Path, records: int) -> dict[str, Any]:
    """Start the variant with a 1-second trigger, wait until it reads, produce ``records``, measure."""
    root.mkdir(parents=True)
    spec = load_spec(spec_path)
    layout = Layout(spec, root, spec_path.parent)
    if variant == "c":
        args = [*submit_args(), str(STREAM_JOB), "--spec", str(spec_path), "--data-root", str(root),
                "--processing-time", "1 second"]
        parquet = {"first sink (accepted rows)": compile_plan(spec, layout).accepted_path}
        tables = {"table (second stage)": (root / "tables.db", "clicks_page_totals")}
    else:
        stream = TopicStream(spec_path, root, broker.bootstrap)
        job = stream.plain_job("a", root) | {"processing_time": "1 second"}
        (root / "job.json").write_text(json.dumps(job, indent=1))
        args = [str(PLAIN_JOB), "--job", str(root / "job.json")]
        parquet, tables = {"Parquet sink": job["parse_sink"]}, {}
    cmd = submit_command(args, jars=connector_jars())
    watcher = Watcher(parquet, tables)
    with open(root / "spark-submit.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env())
    try:
        watcher.start()
        first = next(iter(parquet))
        warm = f"warm-{variant}"
        produce_steadily(broker, FRESH_TOPIC, [warm], 0)
        deadline = time.monotonic() + 300
        while warm not in watcher.seen[first]:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"variant {variant} never read a record; see {root / 'spark-submit.log'}")
            time.sleep(0.1)
        # the table has counted every record read so far (the second stage follows the first)
        while not all(watcher.counts[n] and watcher.counts[n][-1][1] >= len(watcher.seen[first]) for n in tables):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"variant {variant}: its table never caught up; see {root / 'spark-submit.log'}")
            time.sleep(0.1)
        base = {name: watcher.counts[name][-1][1] for name in tables}
        ids = [f"fresh-{variant}-{i:04d}" for i in range(records)]
        acked = produce_steadily(broker, FRESH_TOPIC, ids, 0.5)
        deadline = time.monotonic() + 120
        while not (all(i in watcher.seen[n] for n in parquet for i in ids)
                   and all(watcher.counted(n, base[n] + records) is not None for n in tables)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"variant {variant}: not every record arrived; see {root / 'spark-submit.log'}")
            time.sleep(0.1)
    finally:
        kill_tree(proc.pid)
        proc.wait()
        watcher.stop()
    measured: dict[str, list[float]] = {n: [watcher.seen[n][i] - acked[i] for i in ids] for n in parquet}
    for n in tables:
        measured[n] = [watcher.counted(n, base[n] + k + 1) - acked[i] for k, i in enumerate(ids)]
    return {name: latencies(v) for name, v in measured.items()}


# ---- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=int, default=100_000, help="valid events in the topic (default 100,000)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each variant (default 3)")
    p.add_argument("--fresh", type=int, default=40, help="records of the freshness runs (default 40)")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    p.add_argument("--out", default="kafka",
                   help="results' name in bench/results/ (default kafka; an absolute path: there instead)")
    args = p.parse_args(argv)
    work = working_folder("bench-kafka-")
    note = Progress()

    broker = KafkaBroker(work / "broker")
    samples: dict[str, list[dict]] = {"b": [], "c": []}
    fresh: dict[str, Any] = {}
    try:
        broker.start()
        os.environ["KAFKA_BOOTSTRAP_SERVERS"] = broker.bootstrap  # the specs' ${KAFKA_BOOTSTRAP_SERVERS}
        ensure_topics(broker.bootstrap, [TOPIC, FRESH_TOPIC], PARTITIONS)
        specs = write_specs(work / "include")
        note(f"broker on {broker.bootstrap}; producing about {args.records} records to {TOPIC}")
        inputs = work / "input"
        generate.generate(specs["throughput"], inputs, generate.Settings(
            files=40, events_per_file=max(1, args.records // 40), seed=7))
        stream = TopicStream(specs["throughput"], inputs, broker.bootstrap)
        note(f"{stream.input_rows()} records in the topic")
        for i in range(args.repeats):
            for variant in ("bc" if i % 2 == 0 else "cb"):
                sample = run(stream, variant, work / f"run-{variant}-{i}", args.timeout)
                samples[variant].append(sample)
                note(f"repeat {i + 1}, {variant}: {sample['rows_per_s']:.0f} records/s "
                     f"({sample['batch_s']:.1f} s of batches, {sample['wall_s']:.1f} s wall)")
        for variant in ("b", "c"):
            fresh[variant] = freshness(variant, broker, specs["freshness"], work / f"fresh-{variant}", args.fresh)
            note(f"freshness {variant}: " + "; ".join(f"{n} median {r['median_s']:.2f} s, p99 {r['p99_s']:.2f} s"
                                                     for n, r in fresh[variant].items()))
    finally:
        broker.stop()
        clean_up(work, args.keep)

    median = {v: median_of(samples[v], "rows_per_s") for v in samples}
    ratio = median["c"] / median["b"]
    lines = [f"records/s (median of {args.repeats}): plain Spark (b) {median['b']:.0f}, platform (c) {median['c']:.0f}, "
             f"c/b {ratio:.2f}"]
    for variant, label in (("b", "plain Spark, one query"), ("c", "platform")):
        for name, r in fresh[variant].items():
            lines.append(f"freshness, {label}, {name}: median {r['median_s']:.2f} s, p99 {r['p99_s']:.2f} s "
                         f"({len(r['samples'])} records, 1-second trigger)")
    print("\n".join(lines))
    write_results(results_path(args.out), {
        "machine": machine(),
        "records": stream.input_rows(), "repeats": args.repeats, "median_records_per_s": median, "c_over_b": ratio,
        "freshness": fresh, "samples": samples, "summary": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
