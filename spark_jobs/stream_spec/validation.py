"""The rules a spec must keep across its fields, and across specs (no two queries share a
checkpoint or a sink path), with pydantic's errors put in the spec's own terms."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from spark_jobs.plan import (
    accepted_path,
    checkpoint_paths,
    enriched_columns,
    has_ingestion,
    input_columns,
    result_columns,
    result_key,
    trigger_for,
    written_by_ingestion,
)
from spark_jobs.stream_spec.models import (
    ACCEPTED_VIEW,
    CODE_QUERIES,
    INPUT_VIEW,
    MIN_LEASE_SECONDS,
    NUMERIC_TYPES,
    WINDOW_END,
    WINDOW_START,
    ConsoleSink,
    DeltaSink,
    FileSource,
    KafkaSink,
    KafkaSource,
    MemorySink,
    ParquetSink,
    Passthrough,
    RateSource,
    SparkSource,
    StreamSpec,
    TableSink,
    duration_seconds,
)


def semantic_problems(spec: StreamSpec) -> list[tuple[str, str]]:
    """What Spark would reject later, or do wrongly."""
    problems: list[tuple[str, str]] = []
    add = problems.append
    if duration_seconds(spec.supervision.lease) < MIN_LEASE_SECONDS:
        add(("supervision.lease", f"must be at least {MIN_LEASE_SECONDS} seconds: the driver renews it every sixth "
                                  "of it and fences itself after half of it without a renewal"))
    if spec.supervision.standby and spec.application is not None:
        add(("supervision.standby", "an application of the user's own cannot be kept warm as a standby (the "
                                    "platform's standby starts the platform's own queries); remove it"))
    if spec.supervision.standby and spec.trigger.available_now:
        add(("supervision.standby", "an available-now stream ends by itself after each run; it has nothing for a "
                                    "standby to take over"))
    if spec.supervision.standby and spec.execution.scheduled:
        add(("supervision.standby", "a scheduled stream holds no driver between its runs, so no warm standby either; "
                                    "remove standby, or run it continuous"))
    if spec.execution.scheduled and spec.application is not None:
        add(("execution.mode", "an application runs its own queries at their own triggers: only continuous"))
    if spec.execution.sizing is not None:
        if spec.application is not None or not isinstance(spec.source, FileSource | KafkaSource):
            add(("execution.sizing", "sizes the micro-batches of the platform's ingestion of landing files or a "
                                     "Kafka topic; this stream has none"))
        elif spec.trigger.processing_time is None:
            add(("execution.sizing", "sizes micro-batches against the trigger's interval: give the stream a "
                                     "processing_time trigger"))
        else:
            sizing, trigger = spec.execution.sizing, duration_seconds(spec.trigger.processing_time)
            if sizing.min_trigger is not None and sizing.max_trigger is None and duration_seconds(sizing.min_trigger) > trigger:
                add(("execution.sizing.min_trigger", f"is above the trigger ({spec.trigger.processing_time}), which is "
                                                     "the upper bound without max_trigger: give max_trigger too"))
            if sizing.max_trigger is not None and sizing.min_trigger is None and duration_seconds(sizing.max_trigger) < trigger:
                add(("execution.sizing.max_trigger", f"is below the trigger ({spec.trigger.processing_time}), which is "
                                                     "the lower bound without min_trigger: give min_trigger too"))
    if spec.supervision.standby_queue is not None and not spec.supervision.standby:
        add(("supervision.standby_queue", "names where the standby runs, but supervision.standby is not true"))
    if spec.supervision.standby_queue is not None and spec.supervision.standby_queue == spec.supervision.queue:
        add(("supervision.standby_queue", f"is the supervisor's own queue ({spec.supervision.queue!r}): the standby "
                                          "could then run on the active driver's worker and go down with it; name "
                                          "a queue of other workers, or remove it to keep the standby beside the driver"))
    if spec.accepted.format != "parquet" and (spec.application is not None or not has_ingestion(spec)):
        add(("accepted.format", "this stream has no accepted-rows table (an application, or outputs that all run "
                                "continuously from the source); remove accepted"))
    if spec.application is not None:  # the application's own code decides the rest
        return problems
    inputs = input_columns(spec)
    enriched = enriched_columns(spec)

    if isinstance(spec.source, FileSource | KafkaSource) and spec.quarantine is None:
        add(("quarantine", f"a {spec.source.type} source needs a quarantine path for malformed records"))
    if isinstance(spec.source, SparkSource) and spec.quarantine is None and any(c.required for c in spec.source.columns):
        add(("quarantine", "a row missing a required column goes to the quarantine: add quarantine.path"))
    if isinstance(spec.source, RateSource) and spec.quarantine is not None:
        add(("quarantine", "the rate source produces no malformed records; remove quarantine"))

    for i, e in enumerate(spec.enrich):
        if e.name.lower() == ACCEPTED_VIEW:
            add((f"enrich[{i}].name", f"{e.name!r} is the view of the stream's accepted rows in SQL queries; "
                                      "choose another name"))
        if e.name.lower() == INPUT_VIEW:
            add((f"enrich[{i}].name", f"{e.name!r} is the view of the rows a stream's SQL transform reads; "
                                      "choose another name"))
        ref_cols = {c.name for c in e.columns}
        for j, key in enumerate(e.key):
            if key not in inputs:
                add((f"enrich[{i}].key[{j}]", f"unknown column {key!r}; the source has {sorted(inputs)}"))
            if key not in ref_cols:
                add((f"enrich[{i}].key[{j}]", f"reference {e.name!r} has no column {key!r}"))

    if spec.event_time is not None:
        col = spec.event_time.column
        if col not in inputs:
            add(("event_time.column", f"unknown column {col!r}; the source has {sorted(inputs)}"))
        elif inputs[col] != "timestamp":
            add(("event_time.column", f"{col!r} is {inputs[col]}, an event-time column must be a timestamp"))
        elif isinstance(spec.source, FileSource | SparkSource | KafkaSource) and not any(
                c.name == col and c.required for c in spec.source.columns) and not (
                isinstance(spec.source, KafkaSource) and spec.source.record_timestamp == col):
            add(("event_time.column", f"{col!r} must be declared required: true in source.columns; a row without "
                 "event time would bypass the watermark and never close a window"))

    if spec.deduplicate is not None:
        if spec.event_time is None:
            add(("deduplicate", "deduplication needs event_time with a watermark to bound its state"))
        for j, key in enumerate(spec.deduplicate.key):
            if key not in inputs:
                add((f"deduplicate.key[{j}]", f"unknown column {key!r}; the source has {sorted(inputs)}"))

    if spec.transform is not None and not has_ingestion(spec):
        add(("transform", f"a {spec.transform.label} transform runs in the ingestion, which a stream whose outputs "
                          "all run continuously does not have"))
    # the columns of the accepted rows, if the spec alone says them (a transform's only Spark knows:
    # spark_jobs.analysis then checks the outputs' columns)
    known = spec.transform is None

    seen_names: set[str] = set()
    for i, out in enumerate(spec.outputs):
        where = f"outputs[{i}]"
        if out.name in seen_names:
            add((f"{where}.name", f"duplicate output name {out.name!r}"))
        seen_names.add(out.name)
        q = out.query
        trigger = trigger_for(spec, out)

        if isinstance(q, Passthrough):
            for j, c in enumerate(q.columns or [] if known else []):
                if c not in enriched:
                    add((f"{where}.query.columns[{j}]", f"unknown column {c!r}; available: {sorted(enriched)}"))
            if out.mode != "append":
                add((f"{where}.mode", f"a pass-through query supports only append mode, not {out.mode}"))
        elif isinstance(q, CODE_QUERIES):
            if not has_ingestion(spec):
                add((f"{where}.query", f"a {q.label} query reads the accepted rows, which a stream whose outputs "
                                       "all run continuously does not keep"))
        else:
            for j, key in enumerate(q.group_by):
                if known and key not in enriched:
                    add((f"{where}.query.group_by[{j}]", f"unknown column {key!r}; available: {sorted(enriched)}"))
            agg_names: set[str] = set()
            for j, agg in enumerate(q.aggregates):
                if known and agg.column is not None and agg.column not in enriched:
                    add((f"{where}.query.aggregates[{j}].column", f"unknown column {agg.column!r}; available: {sorted(enriched)}"))
                elif known and agg.fn in ("sum", "avg") and agg.column is not None and enriched[agg.column] not in NUMERIC_TYPES:
                    add((f"{where}.query.aggregates[{j}].fn", f"{agg.fn} needs a numeric column, {agg.column!r} is {enriched[agg.column]}"))
                if agg.name in agg_names or agg.name in q.group_by or agg.name in (WINDOW_START, WINDOW_END):
                    add((f"{where}.query.aggregates[{j}].name", f"duplicate result column {agg.name!r}"))
                agg_names.add(agg.name)
                if agg.fn == "latest" and spec.event_time is None:
                    add((f"{where}.query.aggregates[{j}].fn", "latest needs event_time to order by"))
            if q.window is not None and spec.event_time is None:
                add((f"{where}.query.window", "an event-time window needs event_time"))
            if out.mode == "append" and (q.window is None or spec.event_time is None):
                add((f"{where}.mode", "append mode on an aggregation needs an event-time window and a watermark (event_time.watermark); use update or complete, or add a window"))

        sink = out.sink
        if isinstance(sink, ParquetSink):
            if out.mode != "append":
                add((f"{where}.sink", f"the file sink supports only append mode, not {out.mode}; use a table sink"))
            result = result_columns(spec, out)
            for j, c in enumerate(sink.partition_by if result is not None else []):
                if c not in result:
                    add((f"{where}.sink.partition_by[{j}]", f"unknown column {c!r}; the result has {result}"))
        if isinstance(sink, DeltaSink):
            result = result_columns(spec, out)
            for j, c in enumerate(sink.partition_by if result is not None else []):
                if c not in result:
                    add((f"{where}.sink.partition_by[{j}]", f"unknown column {c!r}; the result has {result}"))
            for j, c in enumerate(sink.key or [] if result is not None else []):
                if c not in result:
                    add((f"{where}.sink.key[{j}]", f"unknown column {c!r}; the result has {result}"))
            if out.mode == "update" and not result_key(spec, out):
                add((f"{where}.sink.key", "update mode into a Delta table merges each batch on a key: name the "
                                          "result columns that identify a row"))
        if isinstance(sink, KafkaSink):
            result = result_columns(spec, out)
            for j, c in enumerate(sink.key or [] if result is not None else []):
                if c not in result:
                    add((f"{where}.sink.key[{j}]", f"unknown column {c!r}; the result has {result}"))
        if isinstance(sink, TableSink):
            key = result_key(spec, out)
            result = result_columns(spec, out)
            if not key:
                add((f"{where}.sink.key", f"a table sink of a {q.label} query needs a key: the result columns that "
                                          "identify a row" if isinstance(q, CODE_QUERIES) else
                     "a table sink needs a key (the result has no window or group keys)"))
            for j, c in enumerate(sink.key or [] if result is not None else []):
                if c not in result:
                    add((f"{where}.sink.key[{j}]", f"unknown column {c!r}; the result has {result}"))

        if trigger.kind == "continuous":
            reasons = []
            if isinstance(spec.source, FileSource):
                reasons.append("the file source does not support continuous processing")
            elif not isinstance(spec.source, RateSource):
                reasons.append(f"the platform runs continuous processing from the rate source only, not the "
                               f"{spec.source.type} source")
            if not isinstance(q, Passthrough):
                reasons.append("continuous processing supports only map-like queries, not aggregations")
            if spec.enrich:
                reasons.append("continuous processing does not support stream-static joins")
            if spec.deduplicate:
                reasons.append("continuous processing does not support deduplication")
            if not isinstance(sink, (ConsoleSink, MemorySink)):
                reasons.append(f"the {sink.type} sink does not support continuous processing")
            field = f"{where}.trigger" if out.trigger else "trigger"
            for reason in reasons:
                add((field, f"continuous trigger: {reason}"))

    return problems


def _nested(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def shared_path_problems(specs: dict[str, StreamSpec]) -> dict[str, list[tuple[str, str]]]:
    """Checkpoints and file sinks used by two queries, within or across specs."""
    owners: list[tuple[str, str, str, str]] = []  # (source, field, kind, path)
    for source, spec in specs.items():
        owners.append((source, "checkpoint", "root", spec.checkpoint))
        for i, out in enumerate(spec.outputs):
            ckpt = checkpoint_paths(spec)[out.name]
            field = f"outputs[{i}].checkpoint" if out.checkpoint else "checkpoint"
            owners.append((source, field, "checkpoint", ckpt))
            if isinstance(out.sink, ParquetSink | DeltaSink):
                owners.append((source, f"outputs[{i}].sink.path", "sink", out.sink.path))
        if spec.quarantine:
            owners.append((source, "quarantine.path", "sink", spec.quarantine.path))
        if has_ingestion(spec) and written_by_ingestion(spec) is None:  # else the sink path of the output it writes, added above
            owners.append((source, "name", "sink", accepted_path(spec)))
    problems: dict[str, list[tuple[str, str]]] = {}
    for n, (src, field, kind, path) in enumerate(owners):
        for src2, field2, kind2, path2 in owners[:n]:
            if kind == kind2 == "root" and _nested(path, path2):
                msg = (f"checkpoint {path!r} overlaps the checkpoint of {src2} ({path2!r}); each stream needs "
                       "its own (it holds the stream's queries, lease and events)")
            elif "root" in (kind, kind2):
                continue
            elif kind == kind2 == "checkpoint" and path == path2:
                msg = f"checkpoint {path!r} is also used by {field2} in {src2}; two queries must never share a checkpoint"
            elif kind == kind2 == "sink" and _nested(path, path2):
                msg = f"sink path {path!r} overlaps {field2} ({path2!r}) in {src2}"
            elif kind != kind2 and _nested(path, path2):
                msg = f"{path!r} overlaps {field2} ({path2!r}) in {src2}; keep checkpoints and sinks apart"
            else:
                continue
            problems.setdefault(src, []).append((field, msg))
            if src2 != src:
                problems.setdefault(src2, []).append((field2, f"{path2!r} is also used by {field} in {src}"))
    return problems


def _loc(loc: Iterable[Any]) -> str:
    out = ""
    previous = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif previous in ("source", "query", "sink") and part in (
                "files", "kafka", "rate", "spark", "parquet", "delta", "table", "console", "memory", "passthrough", "aggregate", "sql", "python"):
            pass  # the discriminator tag pydantic adds to the location of a typed field
        else:
            out += f".{part}" if out else str(part)
        previous = part
    return out


def field_problems(exc: ValidationError) -> list[tuple[str, str]]:
    """Pydantic's errors as ``(field, message)`` pairs in the spec's own terms."""
    problems = []
    for err in exc.errors():
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        problems.append((_loc(err["loc"]), msg))
    return problems
