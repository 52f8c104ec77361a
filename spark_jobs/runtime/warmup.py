"""A standby's rehearsal: the stream's own queries run once over a sample of its input, in a
scratch folder, while the standby waits to take the stream over.

A driver's first micro-batches cost seconds that its later ones do not: Spark compiles each
stage's generated code, the JVM loads and compiles the engine's classes on their first use.
An active driver pays that at its start; a standby that took over would pay it after the
takeover, while the stream stands still (about 3 s for the first batch of each query of a
deduplicating stream with four outputs, on two cores). So the standby pays it before: it runs
the plan it will run, with every path moved into a scratch folder, over the first lines of a file
from the landing directory, or the last records of its Kafka topics (from their offsets, with a
checkpoint of its own: the stream's offsets stay where they are), available-now (the ingestion,
then the outputs), and removes the folder. Spark's compiled code is kept by the session
(``spark.sql.codegen.cache.maxEntries``) and found again by the same stages over the stream's
own data.

Nothing of the stream is written: its checkpoints, tables, sinks, events and lease stay as
they are. An output whose sink is outside the data (a Kafka topic, the console) writes Parquet in
the scratch folder instead; a table sink a SQLite file there. A stream read from anything else is
not rehearsed (the outputs have nothing to read without its ingestion), nor one with nothing
landed or on its topics. A rehearsal that fails is logged and skipped: the takeover does not
depend on it. The scratch folder is named after the standby's process, and the folders of
standbys killed while they rehearsed are removed by the next rehearsal of the stream.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.plan import (
    DeltaDataset,
    FilesDataset,
    OutputPlan,
    ParquetDataset,
    SourcePlan,
    StreamPlan,
    TableDataset,
)
from spark_jobs.runtime.lease import process_start
from spark_jobs.sources import kafka as kafka_source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: lines of the sample (a CSV file's header among them)
SAMPLE_LINES = 2000
#: how long a rehearsal may take
TIMEOUT_SECONDS = 120.0


def sample_file(plan: StreamPlan) -> Path | None:
    """The newest file of the landing directory (not one being written: hidden or temporary)."""
    if plan.source is None or not plan.source.is_files or not plan.source.landing:
        return None
    landing = Path(plan.source.landing)
    try:
        files = [f for f in landing.iterdir() if f.is_file() and not f.name.startswith((".", "_"))]
    except OSError:
        return None
    return max(files, key=lambda f: f.stat().st_mtime, default=None)


def kafka_sample(plan: StreamPlan, records: int) -> SourcePlan | None:
    """The stream's Kafka source reading about the last ``records`` records of its topics (spread over
    their partitions) instead of where its checkpoint is; None if the topics hold none, or the
    broker does not answer."""
    source = plan.source
    if source is None or source.kafka is None:
        return None
    try:
        ends = kafka_source.end_offsets(source.kafka, kafka_source.probe(source.kafka, source.reader_options),
                                        source.reader_options)
    except kafka_source.KafkaUnavailable:
        return None
    each = max(1, records // max(1, len(ends)))
    starting: dict[str, dict[str, int]] = {}
    for (topic, partition), (low, high) in sorted(ends.items()):  # Spark asks for every partition: -1 is the end
        starting.setdefault(topic, {})[str(partition)] = max(low, high - each) if high > low else -1
    if not any(offset >= 0 for offsets in starting.values() for offset in offsets.values()):
        return None
    return replace(source, kafka=replace(source.kafka, starting_offsets=json.dumps(starting),
                                         max_offsets_per_trigger=None))


def scratch_plan(plan: StreamPlan, scratch: Path) -> StreamPlan:
    """``plan`` with every place it reads or writes moved under ``scratch`` (reference data is read
    where it is)."""
    assert plan.source is not None and plan.ingestion is not None
    root = scratch / "checkpoint"
    accepted = str(scratch / "accepted")
    ingestion = replace(plan.ingestion, checkpoint=str(root / "_ingest"), accepted_path=accepted,
                        quarantine=str(scratch / "quarantine") if plan.ingestion.quarantine else None)

    def moved(output: OutputPlan) -> OutputPlan:
        sink = output.sink
        if output.written_by_ingestion:
            sink = replace(sink, path=accepted) if isinstance(sink, FilesDataset) else sink
        elif isinstance(sink, ParquetDataset | DeltaDataset):
            sink = replace(sink, path=str(scratch / "sinks" / output.name))
        elif isinstance(sink, TableDataset):
            sink = TableDataset(f"sqlite:///{scratch / 'tables.db'}", sink.table)
        else:  # a topic, the console, memory: Parquet in the scratch folder
            sink = ParquetDataset(str(scratch / "sinks" / output.name))
        checkpoint = None if output.checkpoint is None else str(root / output.name)
        former = None if output.former_checkpoint is None else str(root / output.name)
        return replace(output, sink=sink, checkpoint=checkpoint, former_checkpoint=former)

    outputs = [moved(o) for o in plan.outputs]
    checkpoints = {name: str(root / name) for name in plan.checkpoints}
    source = replace(plan.source, landing=str(scratch / "landing"), archive_path=None)  # nothing archived
    return replace(plan, source=source, ingestion=ingestion,
                   outputs=outputs, checkpoint_root=str(root), checkpoints=checkpoints)


def _prefix(stream: str) -> str:
    return f"rehearsal-{stream}-"


def sweep(folder: Path, stream: str) -> list[Path]:
    """Remove the scratch folders in ``folder`` of ``stream``'s rehearsals whose process is gone (a
    standby killed while it rehearsed leaves its folder): each is named after its process (pid and
    start time). The folders removed."""
    removed = []
    for found in folder.glob(f"{_prefix(stream)}*"):
        pid, _, rest = found.name.removeprefix(_prefix(stream)).partition("-")
        start = rest.partition("-")[0]
        if not (pid.isdigit() and start.isdigit()):
            continue
        if process_start(int(pid)) != int(start):
            shutil.rmtree(found, ignore_errors=True)
            removed.append(found)
    return removed


def _copy_sample(source: Path, target: Path, lines: int) -> None:
    target.parent.mkdir(parents=True)
    with open(source, "rb") as read, open(target, "wb") as write:
        for _ in range(lines):
            line = read.readline()
            if not line:
                break
            write.write(line)


def rehearse(spark: SparkSession, plan: StreamPlan, lines: int = SAMPLE_LINES) -> float | None:
    """Run the stream's queries once over the first ``lines`` of a landed file, in a scratch
    folder (see the module); the seconds it took, or None if there was nothing to rehearse."""
    from spark_jobs.flows.queries import run_available_now

    if plan.ingestion is None or plan.source is None:
        return None
    sample = sample_file(plan)
    topics = kafka_sample(plan, lines) if sample is None else None
    if sample is None and topics is None:
        return None
    started = time.monotonic()
    sweep(Path(tempfile.gettempdir()), plan.stream)
    scratch = Path(tempfile.mkdtemp(prefix=f"{_prefix(plan.stream)}{os.getpid()}-{process_start(os.getpid())}-"))
    try:
        rehearsed = scratch_plan(plan, scratch)
        if sample is not None:
            _copy_sample(sample, scratch / "landing" / sample.name, lines)
        else:
            rehearsed = replace(rehearsed, source=topics)
        run_available_now(spark, rehearsed, timeout_seconds=TIMEOUT_SECONDS)
    except Exception as exc:  # a rehearsal is an optimisation: the takeover goes on without it
        log.warning("stream %s: the standby's rehearsal failed (%s); it takes over without one", plan.stream,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - started
    log.info("stream %s: the standby rehearsed its queries over %s in %.1fs", plan.stream,
             f"{lines} lines of {sample.name}" if sample is not None else f"the last {lines} records of its topics",
             seconds)
    return seconds
