"""A changed spec against the plan its stream ran and the state its checkpoint holds: one verdict
per flow (the ingestion, each output), before anything runs.

=========== ===================================================================================
unchanged   the flow is as it ran
compatible  a change Spark's guide allows under a checkpoint: a filter or a projection the sink
            takes, a rate limit, the trigger, a sink option (a password, the brokers), a new
            source column
new         an added output: it starts from the first accepted row, over the whole history (one
            whose sink holds results already is a rebuild: :func:`sink_holds`)
retired     a removed output: its checkpoint is archived (``_control/retired/``), its sink kept
rebuild     a change of an output's state or meaning (window, grouping keys, aggregates,
            watermark, output mode, the query of a stateful output) or of its sink: resumed
            under its checkpoint, its sink would mix old and new results; it must be recomputed
            from the accepted rows
reprocess   a change to the ingestion its checkpoint cannot honour (the source, its path or
            topics, a column's type, the deduplication key, the event-time column, the
            accepted rows' table): the input must be read again into new tables (an upgrade
            does it: ``spark_jobs.reprocess``)
unknown     a change whose effect the plan cannot tell (the transform, a Python query or its
            code): settled by a rehearsal (``spark_jobs.rehearsal``)
=========== ===================================================================================

The rules are Spark's ("Recovery Semantics after Changes in a Streaming Query"): any change to a
stateful operation is not allowed under a checkpoint, and is not always detected. Spark checks a
state's schema only at a restart, and a change that keeps the schema (a window's size) not at
all: so every verdict compares the new plan with the plan of the last start
(``_control/plan.json``), and a stateful flow's keys with the state schema its checkpoint holds
(``state/<operator>/0/_metadata/schema``), which also records the watermark a window was kept by.

A driver runs only a plan whose verdicts are all unchanged, compatible, new or retired
(:data:`RUNNABLE`); any other is refused before a query starts (``spark_jobs.stream_job``: exit
2, the verdicts printed). No pyspark here: the Airflow side judges a pending change too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_jobs.plan import OutputPlan, StreamPlan
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.checkpoint import last_batch, sink_last_batch
from spark_jobs.sinks import delta_log
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import INGEST_FLOW, Aggregation, Passthrough, PythonQuery, SqlQuery, duration_seconds

UNCHANGED, COMPATIBLE, NEW, RETIRED = "unchanged", "compatible", "new", "retired"
REBUILD, REPROCESS, UNKNOWN = "rebuild", "reprocess", "unknown"
#: the verdicts a driver may start with
RUNNABLE = (UNCHANGED, COMPATIBLE, NEW, RETIRED)
#: from the mildest to the gravest: a flow's verdict is the gravest of its changes (a known rebuild settles
#: an unknown)
SEVERITY = (UNCHANGED, COMPATIBLE, NEW, RETIRED, UNKNOWN, REBUILD, REPROCESS)

#: a sink's fields that say where its rows go: a change moves the sink (a rebuild); its other
#: fields (brokers, options, a record's key) may change under a checkpoint
SINK_PLACE = ("kind", "path", "partition_by", "table", "url")
#: sinks that take rows of another shape under the same checkpoint (a projection)
TAKES_NEW_COLUMNS = ("parquet", "kafka", "console", "memory")
#: what an unknown verdict's reason says to do
REHEARSE = "rehearse it (python -m spark_jobs.check SPEC --rehearse, or the upgrade DAG)"
#: what makes a SQL query stateful, roughly: a grouping, a distinct, a join, a window
_STATEFUL_SQL = re.compile(r"\b(group\s+by|distinct|join|window|session_window|dropduplicates)\b", re.I)


@dataclass
class Verdict:
    flow: str  # ``_ingest`` or an output's name
    verdict: str
    #: why, each naming the spec's file and field (or the checkpoint's file)
    reasons: list[str] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return self.verdict in RUNNABLE

    def text(self) -> str:
        name = "ingestion" if self.flow == INGEST_FLOW else f"output {self.flow}"
        return f"{name}: {self.verdict}" + ("".join(f"\n    {r}" for r in self.reasons))


def _grave(*verdicts: str) -> str:
    return max(verdicts, key=SEVERITY.index)


class _Judge:
    """The verdict of one flow, as changes are found."""

    def __init__(self, flow: str, where: str):
        self.flow, self.where, self.verdict, self.reasons = flow, where, UNCHANGED, []

    def change(self, verdict: str, field: str, what: str) -> None:
        self.verdict = _grave(self.verdict, verdict)
        self.reasons.append(f"{self.where}: {field}: {what}")

    def result(self) -> Verdict:
        return Verdict(self.flow, self.verdict, self.reasons)


def _show(value: Any) -> str:  # any JSON value
    return json.dumps(value, sort_keys=True, default=str) if not isinstance(value, str) else value


# ---- the state a checkpoint holds ----------------------------------------------------------


@dataclass(frozen=True)
class StateSchema:
    """A stateful operator's key and value columns as its checkpoint wrote them."""

    operator: int
    file: str
    key: list[str]
    value: list[str]
    #: a window key's watermark delay (Spark keeps it in the key's metadata), None without one
    watermark_ms: int | None


def state_schemas(checkpoint: str | os.PathLike[str]) -> list[StateSchema]:
    """The state schemas of a query's checkpoint (``state/<operator>/0/_metadata/schema``: a
    version line, then the key's and the value's schema as JSON); empty without state."""
    found = []
    for path in sorted(Path(checkpoint).glob("state/*/0/_metadata/schema")):
        text = path.read_bytes().decode("utf-8", "replace")
        decoder, schemas, at = json.JSONDecoder(), [], 0
        while (at := text.find('{"type":"struct"', at)) >= 0:
            schema, end = decoder.raw_decode(text, at)
            schemas.append(schema)
            at = end
        if len(schemas) < 2 or not path.parts[-4].isdigit():
            continue
        key, value = schemas[0].get("fields") or [], schemas[1].get("fields") or []
        delay = next((f.get("metadata", {}).get("spark.watermarkDelayMs") for f in key
                      if "spark.watermarkDelayMs" in (f.get("metadata") or {})), None)
        found.append(StateSchema(int(path.parts[-4]), str(path), [f["name"] for f in key], [f["name"] for f in value],
                                 None if delay is None else int(delay)))
    return found


# ---- the comparison --------------------------------------------------------------------------


def judge(plan: StreamPlan, previous: dict[str, Any], spec_file: str,
          watermark: str | None = None) -> list[Verdict]:
    """One verdict per flow of ``plan`` against ``previous`` (the last start's plan as JSON, empty
    if none) and the state of its checkpoints; ``watermark``: the spec's ``event_time.watermark``.
    Retired outputs (in ``previous``, not in ``plan``) get a verdict too."""
    verdicts = []
    if plan.ingestion is not None:
        verdicts.append(_ingestion(plan, previous, spec_file))
    before = {o.get("name"): o for o in previous.get("outputs") or [] if isinstance(o, dict)}
    for i, output in enumerate(plan.outputs):
        verdicts.append(_output(plan, output, before.get(output.name), f"{spec_file}: outputs[{i}]", watermark,
                                previous))
    for name, old in before.items():
        if name not in {o.name for o in plan.outputs}:
            kept = old.get("checkpoint")
            verdicts.append(Verdict(name, RETIRED, [f"{spec_file}: outputs: {name} was removed; its checkpoint "
                                                    f"{kept} is archived, its sink kept"] if kept else
                                    [f"{spec_file}: outputs: {name} was removed; its sink is kept"]))
    return settled(verdicts, plan, previous, spec_file)


def _resumes(checkpoint: str | None) -> bool:
    return checkpoint is not None and last_batch(checkpoint, "commits") is not None


def _fresh(checkpoint: str | None) -> bool:
    """Whether a checkpoint never planned a batch (a crash in its first batch leaves one planned,
    whose sink writes its replay skips: not fresh)."""
    return checkpoint is None or last_batch(checkpoint, "offsets") is None


def _ingestion(plan: StreamPlan, previous: dict[str, Any], spec_file: str) -> Verdict:
    ingestion, source = plan.ingestion, plan.source
    assert ingestion is not None and source is not None
    j = _Judge(INGEST_FLOW, spec_file)
    if not _resumes(ingestion.checkpoint):
        tables = ((ingestion.accepted_format, ingestion.accepted_path), ("parquet", ingestion.quarantine))
        if _fresh(ingestion.checkpoint) and (held := [h for kind, path in tables if path and (h := _holds(kind, path))]):
            j.change(REPROCESS, "accepted", f"the ingestion's checkpoint {ingestion.checkpoint} is gone or new, but its "
                                            f"tables hold results ({'; '.join(held)}): a new ingestion there would "
                                            "skip as many of its own batches, or add its rows to theirs; the upgrade "
                                            "reads the input again into new tables and swaps them in (or restore "
                                            "the checkpoint, or move the tables and the sinks aside to start over)")
        else:
            j.verdict = NEW
        return j.result()
    old, old_source = previous.get("ingestion") or {}, previous.get("source") or {}
    if old:
        old_event_time = old.get("event_time") or {}
        # field -> (before, after, what it is): a change of any is a reprocess
        places = {
            "source.type": (old_source.get("kind"), source.kind, "the source"),
            "source.format": (old_source.get("format"), source.format, "the records' format"),
            "source.path": (old_source.get("landing"), source.landing, "where the input lands"),
            "source.topics": (_kafka_place_of(old_source), _kafka_place(source), "the topics read"),
            "event_time.column": (old_event_time.get("column"),
                                  ingestion.event_time.column if ingestion.event_time else None,
                                  "the event-time column"),
            "deduplicate.key": (old.get("deduplicate"), ingestion.deduplicate,
                                "the deduplication key (its state is keyed by it)"),
            "accepted": (old.get("accepted_path", old.get("accepted")), ingestion.accepted_path, "the accepted-rows table the outputs read"),
            "accepted.format": (old.get("accepted_format") or "parquet", ingestion.accepted_format,
                                "the accepted-rows table's format"),
            "quarantine.path": (old.get("quarantine"), ingestion.quarantine, "the quarantine (the accounting counts it)"),
        }
        for name, (before, after, what) in places.items():
            if before != after:
                j.change(REPROCESS, name, f"{what} changed from {_show(before)} to {_show(after)}")
        before_transform, after_transform = old.get("transform"), _jsonable(ingestion.transform)
        if before_transform != after_transform:
            j.change(UNKNOWN, "transform", f"the transform changed from {_show(before_transform)} to "
                                           f"{_show(after_transform)}: what it makes of the rows cannot be told from "
                                           f"the plan; {REHEARSE}")
        elif ingestion.transform is not None and ingestion.transform.python is not None:
            _code(j, "transform.python", ingestion.transform.python, previous, plan)
        if ingestion.accepted_columns is not None:  # None: a transform's, before Spark's analysis
            _columns(j, old.get("accepted_columns") or {}, ingestion.accepted_columns)
        if (old.get("event_time") or {}).get("watermark") != (ingestion.event_time.watermark if ingestion.event_time
                                                             else None):
            j.change(COMPATIBLE, "event_time.watermark", "the deduplication and the late rows follow the new "
                                                         "watermark from the next batch (the outputs are judged apart)")
        for name in ("max_files_per_trigger", "options", "rows_per_second"):
            if old_source.get(name) != getattr(source, name):
                j.change(COMPATIBLE, f"source.{name}", "a rate limit or reader option; Spark allows it")
        old_kafka = old_source.get("kafka") or {}
        if source.kafka is not None and old_kafka.get("max_offsets_per_trigger") != source.kafka.max_offsets_per_trigger:
            j.change(COMPATIBLE, "source.max_offsets_per_trigger", "a rate limit; Spark allows it")
    for schema in state_schemas(ingestion.checkpoint):
        wanted = list(ingestion.deduplicate or [])
        if wanted and schema.key[:len(wanted)] != wanted:
            j.change(REPROCESS, "deduplicate.key", f"the checkpoint's state is keyed by {schema.key} "
                                                   f"({schema.file}), the spec deduplicates by {wanted}")
    if not old and j.verdict == UNCHANGED:
        j.change(COMPATIBLE, "(plan)", "no plan of an earlier start to compare with (_control/plan.json); the "
                                       "checkpoint's state agrees with the spec")
    return j.result()


def _columns(j: _Judge, before: dict[str, str], after: dict[str, str]) -> None:
    for name, kind in before.items():
        if name not in after:
            j.change(REPROCESS, f"source.columns.{name}", "a column of the accepted rows was removed; the outputs "
                                                          "and the table would mix rows with and without it")
        elif after[name] != kind:
            j.change(REPROCESS, f"source.columns.{name}", f"its type changed from {kind} to {after[name]}")
    for name in after:
        if name not in before:
            j.change(COMPATIBLE, f"source.columns.{name}", "a new column: earlier accepted rows read it as null")


def _kafka_place(source: Any) -> Any:
    kafka = source.kafka
    return None if kafka is None else {"topics": kafka.topics, "pattern": kafka.pattern}


def _kafka_place_of(source: dict[str, Any]) -> Any:
    kafka = source.get("kafka")
    return None if not kafka else {"topics": kafka.get("topics"), "pattern": kafka.get("pattern")}


def _without_credentials(url: str | None) -> str | None:
    return None if url is None else re.sub(r"//[^/@]*@", "//", url)


def _jsonable(value: Any) -> Any:
    return None if value is None else value.model_dump(exclude_none=True)


def _output(plan: StreamPlan, output: OutputPlan, old: dict[str, Any] | None, where: str, watermark: str | None,
            previous: dict[str, Any]) -> Verdict:
    j = _Judge(output.name, where)
    checkpoint = plan.checkpoint(INGEST_FLOW) if output.written_by_ingestion else output.checkpoint
    if old is None and previous:  # the last start had no such output
        if _resumes(output.checkpoint):
            j.change(REBUILD, "name", f"a new output whose checkpoint {output.checkpoint} holds batches of an "
                                      "earlier one: its sink would mix both")
        elif held := sink_holds(output):
            j.change(REBUILD, SINK_FIELD[output.sink.kind], f"a new output whose sink holds results already "
                                                             f"({held}): started there, it would mix them with its "
                                                             "own; it is computed beside and swapped in")
        else:
            j.verdict = NEW
        return j.result()
    if old is None:  # no plan of the last start: only the checkpoint's state can tell
        if not _resumes(checkpoint):
            if _fresh(checkpoint) and (held := sink_holds(output)):
                # (checkpoints removed by hand, the sinks kept; or another stream's sink)
                verdict, what = (REPROCESS, "the ingestion writes it: its sink is the accepted-rows table, read "
                                            "again with the ingestion's") if output.written_by_ingestion else (
                    REBUILD, "started there, it would mix them with its own; it is computed beside and swapped in")
                j.change(verdict, SINK_FIELD[output.sink.kind], f"no plan or checkpoint of an earlier start, but its "
                                                                 f"sink holds results ({held}): {what}")
            else:
                j.verdict = NEW
            return j.result()
        _against_state(j, output, checkpoint, watermark)
        q = output.query
        if isinstance(q, Aggregation) and q.window is not None and j.verdict == UNCHANGED:
            # a checkpoint some tool made without the plan (the platform's own starts always keep it)
            j.change(COMPATIBLE, "query.window", "no plan of the last start (_control/plan.json) to compare the "
                                                 "window's size with; the state's keys and watermark agree")
        elif j.verdict == UNCHANGED:
            j.change(COMPATIBLE, "(plan)", "no plan of the last start to compare with; the checkpoint's state agrees")
        return j.result()
    if not _resumes(checkpoint):  # nothing committed yet: whatever changed starts over
        j.change(COMPATIBLE, "(checkpoint)", "no batch committed yet")
        return j.result()
    if bool(old.get("written_by_ingestion")) != output.written_by_ingestion:
        j.change(REBUILD, "query", "the ingestion " + ("now writes" if output.written_by_ingestion else "no longer "
                                                      "writes") + " this output: another flow would write its sink")
    if old.get("checkpoint") != output.checkpoint:
        j.change(REBUILD, "checkpoint", f"its checkpoint moved from {old.get('checkpoint')} to {output.checkpoint}")
    if old.get("mode") != output.mode:
        j.change(REBUILD, "mode", f"the output mode changed from {old.get('mode')} to {output.mode}")
    _query(j, output, old.get("query") or {}, checkpoint)
    if isinstance(output.query, PythonQuery) and (old.get("query") or {}) == _jsonable(output.query):
        _code(j, "query.python", output.query.python, previous, plan)
    old_sink = old.get("sink") or {}
    for name in SINK_PLACE:
        empty = [] if name == "partition_by" else None  # what a dataset without the field has
        before, after = old_sink.get(name, empty), getattr(output.sink, name, empty)
        if name == "url":  # a password may change; the database may not
            before, after = _without_credentials(before), _without_credentials(after)
        if before != after:
            j.change(REBUILD, f"sink.{name}", f"the sink moved from {_show(before)} to {_show(after)}: it would miss "
                                              "every earlier batch")
    for name in ("topic", "bootstrap_servers", "options", "key"):
        if (old_sink.get(name) or None) != (getattr(output.sink, name, None) or None):  # {} or none: no options
            j.change(COMPATIBLE, f"sink.{name}", "a sink option; Spark allows it under the checkpoint")
    if list(old.get("key") or []) != list(output.key) and output.sink.kind in ("table", "delta"):
        j.change(REBUILD, "sink.key", f"the table's key changed from {old.get('key')} to {output.key}")
    old_trigger, new_trigger = old.get("trigger") or {}, _jsonable(output.trigger) or {}
    if old_trigger != new_trigger:
        continuous = bool(old_trigger.get("continuous")) != bool(new_trigger.get("continuous"))
        j.change(REBUILD if continuous else COMPATIBLE, "trigger",
                 "between continuous and micro-batch processing" if continuous else "the trigger; Spark allows it")
    stateful = isinstance(output.query, Aggregation) or (isinstance(output.query, SqlQuery | PythonQuery)
                                                          and bool(state_schemas(checkpoint)))
    before_watermark = (previous.get("ingestion") or {}).get("event_time", {}) or {}
    if stateful and before_watermark.get("watermark") not in (None, watermark):
        j.change(REBUILD, "event_time.watermark", f"the watermark its state was kept by changed from "
                                                  f"{before_watermark.get('watermark')} to {watermark}")
    _against_state(j, output, checkpoint, watermark)
    return j.result()


#: the spec's field that names where a sink that :func:`sink_holds` reads is
SINK_FIELD = {"parquet": "sink.path", "delta": "sink.path", "table": "sink.table"}


def sink_holds(output: OutputPlan) -> str | None:
    """What the sink of an output holds already, in words; None if nothing (or it cannot tell: a
    Kafka topic is a log that readers read by offsets, a database it cannot reach). A new output
    whose sink holds results would skip its first batches (those a Parquet sink's log records)
    or add to rows it did not write (a Delta table, a table)."""
    sink = output.sink
    if sink.kind in ("parquet", "delta"):
        return _holds(sink.kind, sink.path)
    if sink.kind == "table":
        from spark_jobs.sinks.table import open_database

        try:
            rows = open_database(sink.url).rows_in(sink.table)
        except Exception:  # unreachable: the start says so, naming the database
            return None
        return f"table {sink.table} with {rows} row(s)" if rows else None
    return None


def _holds(kind: str, path: str) -> str | None:
    """What a Parquet folder's sink log or a Delta table's log records, in words; None if nothing."""
    if kind == "delta":
        versions = delta_log.versions(path)
        return f"Delta table {path} at version {versions[-1]}" if versions else None
    last = sink_last_batch(path)
    return None if last is None else f"{path}/_spark_metadata records batches 0 to {last}"


def _query(j: _Judge, output: OutputPlan, old: dict[str, Any], checkpoint: str) -> None:
    new = _jsonable(output.query) or {}
    if old == new:
        return
    q = output.query
    if old.get("type") != new.get("type"):
        j.change(REBUILD, "query.type", f"the query changed from {old.get('type')} to {new.get('type')}")
    elif isinstance(q, Aggregation):
        for name in sorted(set(old) | set(new)):
            if old.get(name) != new.get(name):
                j.change(REBUILD, f"query.{name}", f"{_show(old.get(name))} -> {_show(new.get(name))}: the state was "
                                                   "kept for the old query; resumed, the sink would mix both")
    elif isinstance(q, Passthrough):
        j.change(COMPATIBLE if output.sink.kind in TAKES_NEW_COLUMNS else REBUILD, "query.columns",
                 "a projection the sink takes" if output.sink.kind in TAKES_NEW_COLUMNS else
                 f"the columns changed, and a {output.sink.kind} sink's columns are fixed")
    elif isinstance(q, SqlQuery):
        if state_schemas(checkpoint):
            j.change(REBUILD, "query.sql", "the query of a stateful output changed (its checkpoint holds state)")
        elif _STATEFUL_SQL.search(q.sql):
            j.change(UNKNOWN, "query.sql", f"the query changed and may keep state its checkpoint lacks; {REHEARSE}")
        else:
            j.change(COMPATIBLE, "query.sql", "a filter or projection of a query without state; Spark allows it")
    else:
        j.change(UNKNOWN, "query", f"a Python query changed: its effect on state cannot be told from the plan; {REHEARSE}")


def _code(j: _Judge, field: str, ref: str, previous: dict[str, Any], plan: StreamPlan) -> None:
    """The module behind an unchanged reference, against the one the last start ran (a plan kept
    before the plans recorded code says nothing)."""
    before, after = (previous.get("code") or {}).get(ref), plan.code.get(ref)
    if before is not None and after is not None and before != after:
        j.change(UNKNOWN, field, f"the code of {ref} changed (its module's SHA-256 {before[:12]} -> {after[:12]}): "
                                 f"its effect cannot be told from the plan; {REHEARSE}")


def _against_state(j: _Judge, output: OutputPlan, checkpoint: str, watermark: str | None) -> None:
    """A windowed or grouped output's keys, and a window's watermark, against its checkpoint's state."""
    q = output.query
    if not isinstance(q, Aggregation):
        return
    for schema in state_schemas(checkpoint):
        wanted = (["window"] if q.window else []) + list(q.group_by)
        if schema.key != wanted:
            j.change(REBUILD, "query.group_by", f"the checkpoint's state is keyed by {schema.key} ({schema.file}), "
                                                f"the query groups by {wanted}")
        if schema.watermark_ms is not None and watermark is not None:
            if round(duration_seconds(watermark) * 1000) != schema.watermark_ms:
                j.change(REBUILD, "event_time.watermark", f"the state's windows were kept by a watermark of "
                                                          f"{schema.watermark_ms / 1000:g}s ({schema.file}), the spec "
                                                          f"says {watermark}")


# ---- what a rehearsal settled ---------------------------------------------------------------


def rehearsals_dir(plan: StreamPlan) -> Path:
    """Where rehearsals keep what they settled (``_control/rehearsals/<change>.json``) and their scratch."""
    return Path(plan.checkpoint_root) / "_control" / "rehearsals"


def change_key(plan: StreamPlan, previous: dict[str, Any], spec_file: str | os.PathLike[str]) -> str:
    """The change a rehearsal settles: the spec file's text, the plan it is judged against and the
    code it runs. Anything else edited afterwards is another change, to be rehearsed again."""
    digest = hashlib.sha256()
    for part in (Path(spec_file).read_bytes(), json.dumps(previous, sort_keys=True, default=str).encode(),
                 json.dumps(plan.code, sort_keys=True).encode()):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def record_rehearsal(plan: StreamPlan, previous: dict[str, Any], spec_file: str | os.PathLike[str],
                     rehearsed: list[Verdict], at: float) -> Path:
    """Keep what a rehearsal settled, for every later judgement of the same change."""
    key = change_key(plan, previous, spec_file)
    return write_atomically(rehearsals_dir(plan) / f"{key}.json", json.dumps({
        "change": key, "rehearsed_at": at, "spec_file": str(spec_file),
        "verdicts": {v.flow: {"verdict": v.verdict, "reasons": v.reasons} for v in rehearsed}}, indent=1))


def settled(verdicts: list[Verdict], plan: StreamPlan, previous: dict[str, Any],
            spec_file: str | os.PathLike[str]) -> list[Verdict]:
    """The unknown verdicts a rehearsal of this very change settled, replaced by what it found."""
    if not any(v.verdict == UNKNOWN for v in verdicts):
        return verdicts
    try:
        path = rehearsals_dir(plan) / f"{change_key(plan, previous, spec_file)}.json"
        found = json.loads(path.read_text(encoding="utf-8"))["verdicts"]
    except (OSError, ValueError, KeyError):
        return verdicts
    return [Verdict(v.flow, found[v.flow]["verdict"], list(found[v.flow]["reasons"]))
            if v.verdict == UNKNOWN and v.flow in found else v for v in verdicts]


def blocking(verdicts: list[Verdict]) -> list[Verdict]:
    """The verdicts a driver cannot start with."""
    return [v for v in verdicts if not v.runnable]


def report(verdicts: list[Verdict]) -> str:
    return "\n".join(v.text() for v in verdicts)


# ---- what a start keeps and archives ---------------------------------------------------------

#: the plans kept per stream (the oldest go first)
PLANS_KEPT = 100


def keep(layout: Layout, spec_file: str | os.PathLike[str], plan: StreamPlan, at: float) -> Path:
    """Keep the plan a start runs (``_control/plans/<n>.json``): when, the spec's file, text and
    hash, and the plan; the stream's history of plans, which its page shows."""
    text = Path(spec_file).read_text(encoding="utf-8")
    numbers = [int(p.stem) for p in layout.plans_dir.glob("*.json") if p.stem.isdigit()]
    number = max(numbers, default=0) + 1
    path = write_atomically(layout.plans_dir / f"{number:06d}.json", json.dumps({
        "number": number, "started_at": at, "spec_file": str(spec_file), "spec_sha256": spec_hash(text),
        "spec": text, "plan": json.loads(plan.to_json())}, indent=1))
    for old in sorted(n for n in numbers if n <= number - PLANS_KEPT):
        (layout.plans_dir / f"{old:06d}.json").unlink(missing_ok=True)
    return path


def spec_hash(text: str) -> str:
    """The hash a kept plan names its spec's text by (``spec_sha256``)."""
    return hashlib.sha256(text.encode()).hexdigest()


def plans(layout: Layout) -> list[dict[str, Any]]:
    """The plans the stream started with, the newest first: number, when, the spec's hash."""
    found = []
    for path in sorted(layout.plans_dir.glob("*.json"), reverse=True):
        try:
            kept = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found.append({k: kept.get(k) for k in ("number", "started_at", "spec_file", "spec_sha256")})
    return found


#: when a retired output's checkpoint was archived, in its folder's name (``<name>-<time>``, UTC)
RETIRED_AT = "%Y%m%dT%H%M%SZ"


def retire(verdicts: list[Verdict], previous: dict[str, Any], layout: Layout, at: float) -> list[Path]:
    """Archive the checkpoints of the retired outputs (``_control/retired/<name>-<time>``); their
    sinks stay. The archived folders."""
    before = {o.get("name"): o for o in previous.get("outputs") or [] if isinstance(o, dict)}
    moved = []
    for v in verdicts:
        checkpoint = (before.get(v.flow) or {}).get("checkpoint") if v.verdict == RETIRED else None
        if checkpoint and Path(checkpoint).exists():
            target = layout.retired_dir / f"{v.flow}-{time.strftime(RETIRED_AT, time.gmtime(at))}"
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(checkpoint, target)
            moved.append(target)
    return moved


def archived_since(layout: Layout, flow: str, since: float) -> Path | None:
    """The newest checkpoint of ``flow`` that :func:`retire` archived at ``since`` or later, if any."""
    import calendar

    found = []
    for path in layout.retired_dir.glob(f"{flow}-*"):
        try:
            at = calendar.timegm(time.strptime(path.name.removeprefix(f"{flow}-"), RETIRED_AT))
        except ValueError:  # another flow's, whose name begins with this one's
            continue
        if at >= int(since):  # the name keeps whole seconds
            found.append((at, path))
    return max(found)[1] if found else None
