"""A rehearsal of a change whose effect the plan cannot tell (an *unknown* verdict: a Python or
SQL transform, a Python query, a SQL query that may keep state): the new plan runs one
micro-batch on a copy of the flow's checkpoint, and what Spark accepted and what the batch kept
and wrote settle the verdict.

    python -m spark_jobs.check include/streams/<name>.yaml --rehearse
    python -m spark_jobs.submit upgrade --spec include/streams/<name>.yaml -- --step rehearse

For each unknown flow, N its last committed batch that read input (a batch that only moved the
watermark reads none):

1. **the fork**: its checkpoint copied into a scratch folder
   (``_control/rehearsals/<change>-scratch/``); the state it holds after batch N read and kept
   there; then the copy's commits from batch N on, its offsets after N and every state version
   after batch N-1 removed, so that Spark runs batch N again, from the same offsets (the same
   input), on the state batch N-1 left;
2. **one micro-batch**: the new plan's query started on the fork (``Trigger.Once``: the batch
   N Spark owes, nothing more) against scratch sinks: the ingestion's accepted rows and
   quarantine, an output's rows (whatever its mode) into scratch folders;
3. **the verdict**: *rebuild* (*reprocess* for the ingestion) when Spark refused the state
   (its error names it), when the state the batch left has other operators or schemas, or
   other rows, than the live state after the same batch (a window resized keeps the state's
   schema but not its keys), or when the rows the batch wrote have columns the live sink
   cannot take (a column's type changed; a Delta table's columns differ); *compatible*
   otherwise. A batch that fails for another reason (the code raises) leaves the verdict
   *unknown*, with the error.

The live checkpoint is only read (copied), the live sinks only read for their schema; the
scratch folder is removed afterwards. What a rehearsal settled is kept per change
(``changes.record_rehearsal``), so a driver's start, the upgrade and the stream's page judge the
same change alike (``changes.settled``); an edit afterwards is another change.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from spark_jobs import changes
from spark_jobs.plan import DeltaDataset, MemoryDataset, OutputPlan, ParquetDataset, StreamPlan
from spark_jobs.runtime.checkpoint import file_name, last_batch, reads_nothing
from spark_jobs.stream_spec.models import INGEST_FLOW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("rehearsal")

#: how long the rehearsed batch may take
BATCH_TIMEOUT_SECONDS = 600
#: Spark's errors that refuse a checkpoint's state to the new query
_STATE_REFUSED = re.compile(r"STATE_STORE|STATEFUL_OPERATOR|STATE_SCHEMA|CANNOT_LOAD_STATE|STATE_REPARTITION")
#: a state store's file of one version: ``<version>.delta``, ``.snapshot``, ``.zip``, ``.changelog`` (and
#: ``<version>_<id>.zip`` with checkpoint format 2)
_STATE_VERSION = re.compile(r"^\.?(\d+)(_[^.]*)?\.(delta|snapshot|zip|changelog)(\.crc)?$")


def rehearse(spark: SparkSession, plan: StreamPlan, previous: dict[str, Any], verdicts: list[changes.Verdict],
             spec_file: str) -> list[changes.Verdict]:
    """Rehearse every unknown flow of ``verdicts`` (``plan``: the new plan, analyzed; ``previous``:
    the plan the stream last ran), keep what each settled, and return the verdicts settled."""
    unknown = [v for v in verdicts if v.verdict == changes.UNKNOWN]
    if not unknown:
        return verdicts
    key = changes.change_key(plan, previous, spec_file)
    scratch = changes.rehearsals_dir(plan) / f"{key}-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    spark.streams.active  # noqa: B018 - the state store's coordinator, which the state reader asks
    rehearsed = []
    try:
        for v in unknown:
            rehearsed.append(_rehearse_flow(spark, plan, v, scratch / v.flow))
            log.info("rehearsed %s", rehearsed[-1].text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    changes.record_rehearsal(plan, previous, spec_file, rehearsed, time.time())
    return changes.settled(verdicts, plan, previous, spec_file)


def _rehearse_flow(spark: SparkSession, plan: StreamPlan, unknown: changes.Verdict, scratch: Path) -> changes.Verdict:
    flow, grave = unknown.flow, changes.REPROCESS if unknown.flow == INGEST_FLOW else changes.REBUILD
    output = None if flow == INGEST_FLOW else plan.output(flow)
    if output is not None and output.written_by_ingestion:
        return changes.Verdict(flow, changes.UNKNOWN, [*unknown.reasons, "the ingestion writes this output: its "
                                                                         "rehearsal is the ingestion's"])
    live = plan.checkpoint(flow)
    batch = last_batch(live, "commits")
    if batch is None:
        return changes.Verdict(flow, changes.COMPATIBLE, [f"{live}: no batch committed yet: it starts over"])
    while reads_nothing(live, batch):  # a batch that only moved the watermark says little: the last with input
        batch -= 1
    fork = scratch / "checkpoint"
    shutil.copytree(live, fork, ignore=shutil.ignore_patterns("*.tmp", ".*.tmp"))
    where = f"rehearsed on a copy of {live}, its batch {batch} run again"
    try:
        kept_before = _keep_state(spark, str(fork), batch, scratch / "state-before")
    except Exception as exc:  # e.g. that batch's state no longer kept
        return changes.Verdict(flow, changes.UNKNOWN, [*unknown.reasons, f"{where}: the live state after that batch "
                                                                          f"cannot be read: {_first_line(exc)}"])
    _rewind(fork, batch)
    if flow == INGEST_FLOW:
        _from_archive(plan, fork)
    trial, written = _trial_plan(plan, flow, str(fork), scratch)
    try:
        rows = _run_one_batch(spark, trial, flow, written)
    except Exception as exc:  # Spark's or the user's code's error: which, its text says
        text = _first_line(exc)
        if _STATE_REFUSED.search(str(exc)):
            return changes.Verdict(flow, grave, [f"{where}: Spark refused its state: {text}"])
        return changes.Verdict(flow, changes.UNKNOWN, [*unknown.reasons, f"{where}: the batch failed: {text}"])
    problems = _state_problems(spark, str(fork), batch, kept_before)
    if problems:
        return changes.Verdict(flow, grave, [f"{where}: {p}" for p in problems])
    problems = _column_problems(spark, plan, output, written, rows)
    if problems:
        return changes.Verdict(flow, grave, [f"{where}: {p}" for p in problems])
    what = "the state it kept equals the live state after that batch" if kept_before else "it keeps no state"
    return changes.Verdict(flow, changes.COMPATIBLE, [
        *unknown.reasons, f"{where}: Spark resumed the checkpoint and {what}; the batch wrote "
                          f"{rows} row(s) the sink takes"])


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:600] if str(exc).strip() else type(exc).__name__


# ---- the fork ----------------------------------------------------------------------------------


def _rewind(fork: Path, batch: int) -> None:
    """Make Spark owe ``batch`` again on the fork: its commit gone, the state it wrote gone (state
    version ``batch + 1`` and later), every later batch's offsets gone."""
    for log_name, after in (("commits", batch - 1), ("offsets", batch)):
        for f in (fork / log_name).glob("*"):
            number = f.name.lstrip(".").split(".")[0]
            if number.isdigit() and int(number) > after:
                f.unlink()
    for f in (fork / "state").rglob("*"):
        m = _STATE_VERSION.match(f.name)
        if f.is_file() and m and int(m.group(1)) > batch:
            f.unlink()


def _from_archive(plan: StreamPlan, fork: Path) -> None:
    """Point the fork's file-source log at the archive for the input files archived since (the
    batch run again must read what it read)."""
    source = plan.source
    if source is None or not source.is_files or not source.archive_path or not (fork / "sources").is_dir():
        return
    archive = Path(source.archive_path)
    for log_file in (fork / "sources").rglob("*"):
        if not log_file.is_file() or log_file.name.startswith("."):
            continue
        lines, moved = log_file.read_text(encoding="utf-8").splitlines(), False
        for i, line in enumerate(lines):
            path = json.loads(line).get("path") if line.startswith("{") else None
            name = file_name(path) if path else None
            if name and not Path(unquote(urlsplit(path).path)).exists() and (archive / name).exists():
                lines[i], moved = line.replace(path, (archive / name).resolve().as_uri()), True
        if moved:
            log_file.write_text("\n".join(lines), encoding="utf-8")
            log_file.with_name(f".{log_file.name}.crc").unlink(missing_ok=True)


def _trial_plan(plan: StreamPlan, flow: str, fork: str, scratch: Path) -> tuple[StreamPlan, str]:
    """The new plan with ``flow`` on the fork and writing to scratch; the folder its rows go to."""
    trial = replace(plan, checkpoint_root=str(scratch / "root"), checkpoints=plan.checkpoints | {flow: fork})
    rows = str(scratch / "rows")
    if flow == INGEST_FLOW:
        ingestion = plan.ingestion
        assert ingestion is not None
        return replace(trial, ingestion=replace(ingestion, checkpoint=fork, accepted_path=rows, quarantine=(
            str(scratch / "quarantine") if ingestion.quarantine else None))), rows
    # the sink: none of its own (the rehearsal writes the rows itself, :func:`_run_one_batch`)
    outputs = [replace(o, checkpoint=fork, sink=MemoryDataset()) if o.name == flow else o for o in plan.outputs]
    return replace(trial, outputs=outputs), rows


def _run_one_batch(spark: SparkSession, trial: StreamPlan, flow: str, rows: str) -> int:
    """The batch Spark owes on the fork, run by the trial plan's query (an output's rows written
    to ``rows`` batch by batch, whatever its mode); the rows it wrote."""
    from spark_jobs.flows.ingestion import ingestion_writer
    from spark_jobs.flows.outputs import output_writer

    if flow == INGEST_FLOW:
        _, writer = ingestion_writer(spark, trial, None)
    else:
        output = trial.output(flow)
        frame, _ = output_writer(spark, trial, output)
        writer = (frame.writeStream.queryName(output.query_name).outputMode(output.mode)
                  .option("checkpointLocation", output.checkpoint)
                  .foreachBatch(lambda batch, _id: batch.write.mode("append").parquet(rows)))
    query = writer.trigger(once=True).start()
    try:
        if not query.awaitTermination(BATCH_TIMEOUT_SECONDS):
            raise TimeoutError(f"the rehearsed batch did not end in {BATCH_TIMEOUT_SECONDS}s")
    finally:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    delta = flow == INGEST_FLOW and trial.ingestion is not None and trial.ingestion.accepted_is_delta
    try:
        return (spark.read.format("delta").load(rows) if delta else spark.read.parquet(rows)).count()
    except Exception:  # nothing written: no table
        return 0


# ---- what the batch kept and wrote -----------------------------------------------------------


def _operators(spark: SparkSession, checkpoint: str) -> list[Any]:
    if not (Path(checkpoint) / "state").exists():
        return []
    return [o for o in spark.read.format("state-metadata").load(checkpoint).collect()]


def _state(spark: SparkSession, checkpoint: str, batch: int, operator: Any) -> DataFrame:
    return (spark.read.format("statestore").option("batchId", batch).option("operatorId", operator["operatorId"])
            .option("storeName", operator["stateStoreName"]).load(checkpoint))


def _keep_state(spark: SparkSession, fork: str, batch: int, into: Path) -> dict[str, str]:
    """The state each operator holds after ``batch``, written beside the fork before it is rewound:
    ``<operator>/<store>`` -> the folder."""
    kept = {}
    for operator in _operators(spark, fork):
        name = f"{operator['operatorId']}/{operator['stateStoreName']}"
        _state(spark, fork, batch, operator).write.parquet(str(into / name))
        kept[name] = str(into / name)
    return kept


def _state_problems(spark: SparkSession, fork: str, batch: int, before: dict[str, str]) -> list[str]:
    """How the state the rehearsed batch left differs from the live state after the same batch."""
    from spark_jobs.flows.ingestion import ROW_KEY

    after = {f"{o['operatorId']}/{o['stateStoreName']}": o for o in _operators(spark, fork)}
    if set(after) != set(before):
        return [f"the new query keeps state in operators {sorted(after) or 'none'}, the checkpoint in "
                f"{sorted(before) or 'none'}"]
    problems = []
    for name, operator in after.items():
        now, was = _state(spark, fork, batch, operator), spark.read.parquet(before[name])
        if _columns(now.schema) != _columns(was.schema):
            problems.append(f"operator {name}: its state's schema changed from {_columns(was.schema)} to "
                            f"{_columns(now.schema)}")
            continue
        now = now.select(*was.columns)
        if ROW_KEY in now.schema["key"].dataType.fieldNames():  # a rejected row's key is random, run by run
            now, was = now.where(f"key.{ROW_KEY} IS NULL"), was.where(f"key.{ROW_KEY} IS NULL")
        extra, missing = now.exceptAll(was).count(), was.exceptAll(now).count()
        if extra or missing:
            problems.append(f"operator {name}: the same input left other state ({extra} row(s) the live state "
                            f"lacks, {missing} it has that the new query's lacks): resumed, the sink would mix "
                            "old and new results")
    return problems


def _columns(schema: StructType) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in schema.fields}


def _schema_of(spark: SparkSession, path: str, delta: bool) -> dict[str, str] | None:
    """A table's columns, or None if it holds nothing yet (or cannot be read)."""
    try:
        frame = spark.read.format("delta").load(path) if delta else spark.read.parquet(path)
        return _columns(frame.schema)
    except Exception:  # no rows written yet: nothing to compare
        return None


def _column_problems(spark: SparkSession, plan: StreamPlan, output: OutputPlan | None, written: str,
                     rows: int) -> list[str]:
    """The columns of what the batch wrote against the live table's: a type changed (any), a column
    gone from the accepted rows (the outputs read it), any difference for a Delta table."""
    if output is None:
        ingestion = plan.ingestion
        assert ingestion is not None
        delta = ingestion.accepted_format == "delta"
        live, new = _schema_of(spark, ingestion.accepted_path, delta), _schema_of(spark, written, delta)
        where, missing_ok, added_ok = f"the accepted rows ({ingestion.accepted_path})", False, not delta
    else:
        if not isinstance(output.sink, ParquetDataset | DeltaDataset) or not rows:
            return []  # a table's columns are checked at the driver's start; a topic takes any record
        delta = isinstance(output.sink, DeltaDataset)
        live, new = _schema_of(spark, output.sink.path, delta), _schema_of(spark, str(written), False)
        where, missing_ok, added_ok = f"the sink {output.sink.path}", not delta, not delta
    if live is None or new is None:
        return []
    problems = [f"{where}: column {c} is {live[c]}, the new query's is {new[c]}" for c in live if c in new
                and new[c] != live[c]]
    problems += [] if missing_ok else [f"{where}: column {c} is missing from the new rows" for c in live if c not in new]
    problems += [] if added_ok else [f"{where}: the new rows add column {c}" for c in new if c not in live]
    return problems
