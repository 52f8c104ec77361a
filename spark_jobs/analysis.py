"""Analysis: a stream's spec becomes its plan, once, after every check only Spark can make.

``spark_jobs.stream_spec`` checks what a spec says on its own, without pyspark. Here, on a
SparkSession and over no rows: a Spark source (``source: {type: spark}``) must load and
give its declared columns; the stream's transform (``transform: {sql|python}``) must read
the rows it is given (view ``input``) row by row (no aggregation, sort or limit: it runs on
each micro-batch) and keep the event-time column; each output's query (``query: {type:
sql|python}``, or any query over a transform's result) must read the accepted rows, run
incrementally in its output mode, and give the columns its sink and quality rules name, in
types the sink can store. Each problem names the spec file, the field
(``outputs[2].query.sql``, ``transform.sql``) and Spark's own message.

:func:`analyze` is what a driver runs before it starts (its exit code 2 on a
:class:`SpecError`, and the supervisor fails at once instead of restarting it) and what
``python -m spark_jobs.check`` runs as a dry run; it returns the resolved plan.
:func:`resolve_plan` is the light variant for jobs that read what a stream wrote
(backfills, quality): only the transform is analyzed.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs import frames, user_code
from spark_jobs.plan import (
    DeltaDataset,
    KafkaDataset,
    SourcePlan,
    StreamPlan,
    Transformed,
    compile_plan,
    ddl,
    joined_columns,
)
from spark_jobs.quality.rules import load_rules, rules_path, unknown_columns
from spark_jobs.sinks.table import spec_type
from spark_jobs.sources import kafka as kafka_source
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import (
    CODE_QUERIES,
    EVENT_DATE_COLUMN,
    INPUT_VIEW,
    SPARK_TYPES,
    KafkaSink,
    Output,
    ParquetSink,
    SpecError,
    StreamSpec,
    TableSink,
)
from spark_jobs.user_code import UserCodeError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import DataFrame, SparkSession


def spark_message(exc: BaseException) -> str:
    """Spark's message without the plan it appends (after ``;``) or a stack trace."""
    java = getattr(exc, "java_exception", None)  # an error py4j did not convert: the JVM's message
    text = (java.getMessage() if java is not None else str(exc)).split(";\n", 1)[0]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


@contextmanager
def _quiet_sql_errors() -> Iterator[None]:
    """PySpark logs every failed SQL statement with its stack trace; a check reports it."""
    from pyspark.logger import PySparkLogger

    logger = PySparkLogger.getLogger("SQLQueryContextLogger")
    before, logger.disabled = logger.disabled, True
    try:
        yield
    finally:
        logger.disabled = before


def _check_output_mode(frame: DataFrame, mode: str) -> None:
    """Spark's check of a streaming query in an output mode, as ``writeStream.start`` makes it."""
    jvm = frame.sparkSession._jvm
    output_mode = getattr(jvm.org.apache.spark.sql.streaming.OutputMode, mode.capitalize())()
    jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker.checkForStreaming(
        frame._jdf.queryExecution().analyzed(), output_mode)


#: Logical plan nodes a transform must not hold: it runs on each micro-batch, so these
#: would see one batch's rows, not the stream's
_NOT_PER_ROW = {
    "Aggregate": "an aggregation", "Window": "a window function", "Deduplicate": "a deduplication",
    "DeduplicateWithinWatermark": "a deduplication", "Distinct": "DISTINCT", "Sort": "ORDER BY",
    "GlobalLimit": "LIMIT", "LocalLimit": "LIMIT", "Offset": "OFFSET", "Tail": "a tail", "Expand": "grouping sets",
    "Intersect": "INTERSECT", "Except": "EXCEPT", "Sample": "TABLESAMPLE",
}
#: Nodes that can give more rows than they read
_MULTIPLYING = {"Generate", "Join", "Union"}


def _plan_nodes(plan) -> Iterator:  # a JVM LogicalPlan
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))


def _empty_stream(spark: SparkSession, schema: str, folder: str) -> DataFrame:
    """A stream of no rows with ``schema``: what Spark analyzes a streaming query over."""
    return spark.readStream.schema(schema).format("parquet").load(folder)


def _references(spark: SparkSession, spec: StreamSpec) -> dict[str, DataFrame]:
    return {e.name: spark.createDataFrame([], ddl({c.name: c.type for c in e.columns})) for e in spec.enrich}


def transform_result(spark: SparkSession, spec: StreamSpec, transforms_dir: str | os.PathLike[str] | None = None,
                     ) -> tuple[Transformed | None, list[tuple[str, str]]]:
    """The stream's transform as Spark analyzes it over the rows it reads (view ``input``):
    its result's columns and whether it can multiply rows, or the problems found. None
    and no problems for a stream without a transform."""
    transform = spec.transform
    if transform is None:
        return None, []
    field = f"transform.{transform.type}"
    with tempfile.TemporaryDirectory(prefix="spec-check-") as empty, _quiet_sql_errors():
        rows = _empty_stream(spark, ddl(joined_columns(spec)), empty)
        try:
            frame = user_code.run(rows, INPUT_VIEW, transform.sql, transform.python, _references(spark, spec),
                                  str(transforms_dir) if transforms_dir is not None else None)
            nodes = [(n.nodeName(), n) for n in _plan_nodes(frame._jdf.queryExecution().analyzed())]
        except UserCodeError as exc:
            return None, [(field, str(exc))]
        except Exception as exc:  # Spark's parse and analysis errors, the function's own
            return None, [(field, spark_message(exc))]
    if not frame.isStreaming:
        return None, [(field, f"the transform does not read the stream's rows ({'FROM input' if transform.sql else 'its argument'})")]
    problems = [(field, f"the transform runs on each micro-batch, so it cannot hold {_NOT_PER_ROW[name]} (it would "
                        "see one batch's rows, not the stream's); aggregate in an output's query instead")
                for name in dict.fromkeys(name for name, _ in nodes) if name in _NOT_PER_ROW]
    if any(name == "Join" and node.left().isStreaming() and node.right().isStreaming() for name, node in nodes):
        problems.append((field, "the transform joins the stream's rows with themselves, which on each micro-batch "
                                "would pair only rows of the same batch; join reference data instead"))
    types = {f.name: f.dataType for f in frame.schema.fields}
    et = spec.event_time
    if et is not None:
        if et.column not in types:
            problems.append((field, f"the result has no column {et.column!r}: keep the event-time column "
                                    f"(event_time.column); the result has {list(types)}"))
        elif types[et.column].simpleString() != "timestamp":
            problems.append((field, f"the event-time column {et.column!r} is {types[et.column].simpleString()} in the "
                                    "result, not a timestamp"))
        if EVENT_DATE_COLUMN in types:
            problems.append((field, f"{EVENT_DATE_COLUMN!r} is the accepted rows' own partition column; "
                                    "name the result's column otherwise"))
    problems += [(field, f"result column {name!r} has no type (a bare NULL); cast it, e.g. CAST(NULL AS string)")
                 for name, t in types.items() if t.simpleString() == "void"]
    if problems:
        return None, problems
    columns = [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]
    return Transformed(columns, any(name in _MULTIPLYING for name, _ in nodes)), []


def result_columns(spark: SparkSession, spec: StreamSpec, plan: StreamPlan,
                   ) -> tuple[dict[str, list[tuple[str, str]]], list[tuple[str, str]]]:
    """The result columns (name, Spark type) of each output whose columns only Spark knows
    (SQL and Python queries; every output over a transform's result) as Spark analyzes its
    query over the plan's accepted rows, and the problems found; an output with a problem
    has no entry."""
    analyzed = [(i, o) for i, o in enumerate(spec.outputs)
                if (spec.transform is not None or plan.output(o.name).columns is None)
                and not plan.output(o.name).reads_source]
    columns: dict[str, list[tuple[str, str]]] = {}
    problems: list[tuple[str, str]] = []
    if not analyzed or plan.ingestion is None:
        return columns, problems
    with tempfile.TemporaryDirectory(prefix="spec-check-") as empty, _quiet_sql_errors():
        accepted = _empty_stream(spark, plan.ingestion.accepted_ddl, empty)
        if spec.event_time is not None:
            accepted = accepted.withWatermark(spec.event_time.column, spec.event_time.watermark)
        references = _references(spark, spec)
        for i, out in analyzed:
            where = f"outputs[{i}]"
            field = f"{where}.query.{out.query.type}" if isinstance(out.query, CODE_QUERIES) else f"{where}.query"
            try:
                if isinstance(out.query, CODE_QUERIES):
                    frame = frames.code_frame(accepted, out.query, references, plan.transforms_dir)
                else:
                    frame = frames.output_frame(accepted, plan, plan.output(out.name))
            except UserCodeError as exc:
                problems.append((field, str(exc)))
                continue
            except Exception as exc:  # Spark's parse and analysis errors, the function's own
                problems.append((field, spark_message(exc)))
                continue
            if isinstance(out.query, CODE_QUERIES) and not frame.isStreaming:
                problems.append((field, "the query does not read the stream's accepted rows "
                                        f"({'FROM accepted' if out.query.type == 'sql' else 'its argument'}); "
                                        "it would never change"))
                continue
            try:
                _check_output_mode(frame, out.mode)
            except Exception as exc:  # Spark's check, reported
                problems.append((f"{where}.mode", f"Spark cannot run the query in {out.mode} mode: "
                                                  f"{spark_message(exc)}"))
                continue
            columns[out.name] = [(f.name, f.dataType.simpleString()) for f in frame.schema.fields]
            problems += _sink_problems(where, out, frame)
    return columns, problems


def _kafka_problems(spark: SparkSession, source: SourcePlan) -> list[tuple[str, str]]:
    """Spark's Kafka connector must be on the driver's class path, and Spark must take the
    source's options. Building the reader contacts no broker (``_probe_brokers`` does)."""
    kafka = source.kafka
    assert kafka is not None
    try:
        if kafka.connection is None:
            kafka_source.bootstrap_servers(kafka)
        kafka_source.source_options(source.reader_options)
    except kafka_source.KafkaUnavailable as exc:  # a variable the deployment must set: the spec's to say
        return [(exc.field, exc.message)]
    if kafka.connection is not None:  # the supervisor resolves it for the driver; the reader needs none yet
        source = replace(source, kafka=replace(kafka, connection=None, bootstrap_servers="127.0.0.1:9"))
    try:
        with _quiet_sql_errors():
            frames.read_source(spark, source)
    except Exception as exc:  # the reader's own error, reported
        message = spark_message(exc)
        if "DATA_SOURCE_NOT_FOUND" in message or "Failed to find" in message:
            return [("source.type", "Spark's Kafka connector is not on the driver's class path: ./platform setup "
                                    "fetches it into .jars/spark-connectors and every driver gets it through "
                                    "spark-submit's --jars")]
        return [("source", f"Spark cannot read the Kafka source: {message}")]
    return []


def _kafka_sink_problems(plan: StreamPlan) -> list[tuple[str, str]]:
    """A Kafka sink's ``${VAR}`` must be set in the driver's environment."""
    problems = []
    for i, out in enumerate(plan.outputs):
        if isinstance(out.sink, KafkaDataset):
            try:
                kafka_source.servers(out.sink.bootstrap_servers, f"outputs[{i}].sink.bootstrap_servers")
                kafka_source.source_options(out.sink.options)
            except kafka_source.KafkaUnavailable as exc:
                problems.append((exc.field, exc.message))
    return problems


def _delta_problems(spark: SparkSession, plan: StreamPlan) -> list[tuple[str, str]]:
    """A stream with Delta tables needs Delta Lake's jars on the driver's class path, and a
    session with its extension (``spark_jobs.runtime.session``), before any batch runs."""
    from py4j.java_gateway import JavaClass

    from spark_jobs.runtime.session import DELTA_CONF

    fields = [f"outputs[{i}].sink.type" for i, out in enumerate(plan.outputs) if isinstance(out.sink, DeltaDataset)]
    if plan.ingestion is not None and plan.ingestion.accepted_is_delta:
        fields.insert(0, "accepted.format")
    if not fields:
        return []
    if not isinstance(spark._jvm.io.delta.tables.DeltaTable, JavaClass):
        return [(fields[0], "Delta Lake's jars are not on the driver's class path: ./platform setup fetches them "
                            "into .jars/spark-connectors and every driver gets them through spark-submit's --jars")]
    extension = DELTA_CONF["spark.sql.extensions"]
    if extension not in (spark.conf.get("spark.sql.extensions", None) or ""):
        return [(fields[0], f"the Spark session lacks Delta Lake's SQL extension ({extension}): build it with "
                            "spark_jobs.runtime.session.build_session and the stream's spec")]
    return []


def _probe_brokers(plan: StreamPlan) -> None:
    """The brokers a stream reads and writes must answer and hold its topics, else
    :class:`KafkaUnavailable` naming the field (a situation to restart from, not a bad spec)."""
    source = plan.source
    if source is not None and source.kafka is not None:
        kafka_source.probe(source.kafka, source.reader_options)
    for i, out in enumerate(plan.outputs):
        if isinstance(out.sink, KafkaDataset):
            field = f"outputs[{i}].sink"
            bootstrap = kafka_source.servers(out.sink.bootstrap_servers, f"{field}.bootstrap_servers")
            options = out.sink.options
            name = out.sink.bootstrap_servers  # as the spec says it, never expanded
            if out.sink.topic not in kafka_source.topics_on(bootstrap, options, field=f"{field}.bootstrap_servers",
                                                            name=name):
                raise kafka_source.missing_topic(out.sink.topic, name, f"{field}.topic")


def source_problems(spark: SparkSession, source: SourcePlan | None) -> list[tuple[str, str]]:
    """A Spark source (``source: {type: spark}``) must load and give every declared column
    in a type that casts to the declared one; a Kafka source needs Spark's connector."""
    if source is not None and source.kind == "kafka":
        return _kafka_problems(spark, source)
    if source is None or source.kind != "spark":
        return []
    reader = spark.readStream.format(source.format).options(**source.reader_options)
    try:
        if source.reader_schema:
            reader = reader.schema(source.reader_schema)
        with _quiet_sql_errors():
            given = reader.load(source.landing) if source.landing else reader.load()
    except Exception as exc:  # the reader's own error, reported
        return [("source", f"Spark cannot read the {source.format} source: {spark_message(exc)}")]
    types = {f.name: f.dataType for f in given.schema.fields}
    problems = []
    for i, c in enumerate(source.columns):
        if c.name not in types:
            problems.append((f"source.columns[{i}].name", f"the {source.format} source gives no column {c.name!r}; "
                                                          f"it has {list(types)}"))
            continue
        try:
            with _quiet_sql_errors():
                given.select(given[c.name].cast(SPARK_TYPES[c.type])).schema  # noqa: B018 - analysis only
        except Exception as exc:  # Spark's analysis error, reported
            problems.append((f"source.columns[{i}].type", f"{c.name} is {types[c.name].simpleString()} in the source, "
                                                          f"which does not cast to {c.type}: {spark_message(exc)}"))
    return problems


def _sink_problems(where: str, out: Output, frame: DataFrame) -> list[tuple[str, str]]:
    names = list(frame.columns)
    problems = []
    sink = out.sink
    if isinstance(sink, ParquetSink):
        problems += [(f"{where}.sink.partition_by[{j}]", f"unknown column {c!r}; the result has {names}")
                     for j, c in enumerate(sink.partition_by) if c not in names]
    if isinstance(sink, TableSink | KafkaSink):
        problems += [(f"{where}.sink.key[{j}]", f"unknown column {c!r}; the result has {names}")
                     for j, c in enumerate(sink.key or []) if c not in names]
    if isinstance(sink, TableSink):
        for f in frame.schema.fields:
            try:
                spec_type(f.dataType)
            except ValueError as exc:
                field = f"{where}.query.{out.query.type}" if isinstance(out.query, CODE_QUERIES) else f"{where}.query"
                problems.append((field, f"result column {f.name!r}: {exc}; a table sink stores "
                                        "string, integer, long, double, boolean, timestamp and date"))
    return problems


def _rules_problems(spec: StreamSpec, spec_dir: Path, columns: dict[str, list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """The quality rules of SQL outputs name columns of their results (``spark_jobs.quality.rules``
    checks the other outputs' without Spark)."""
    rules = load_rules(spec, spec_dir)
    problems = []
    for name, out_rules in rules.outputs.items():
        if name in columns:
            problems += unknown_columns(f"outputs.{name}", out_rules, [c for c, _ in columns[name]])
    return problems


def analyze(spark: SparkSession, spec: StreamSpec, layout: Layout,
            spec_path: str | os.PathLike[str] | None = None) -> StreamPlan | None:
    """The stream's plan, resolved once, after every check only Spark can make; raise
    :class:`SpecError` (naming the spec file ``spec_path``, by default the layout's, or the
    rules file) for what Spark rejects, and :class:`KafkaUnavailable` (not the spec's fault:
    a restart may find them) for a Kafka broker that does not answer or a topic that does not
    exist, read or written. None for an application, whose code is its own."""
    if spec.application is not None:
        return None
    path = spec_path if spec_path is not None else layout.spec_dir / f"{spec.name}.yaml"
    transformed, problems = transform_result(spark, spec, layout.transforms_dir)
    if problems:
        raise SpecError(path, problems)
    plan = compile_plan(spec, layout, transformed)  # once; what follows checks it
    problems = source_problems(spark, plan.source)
    if problems:
        raise SpecError(path, problems)
    problems = _kafka_sink_problems(plan) + _delta_problems(spark, plan)
    if problems:
        raise SpecError(path, problems)
    _probe_brokers(plan)
    columns, problems = result_columns(spark, spec, plan)
    if problems:
        raise SpecError(path, problems)
    rules = _rules_problems(spec, layout.spec_dir, columns)
    if rules:
        raise SpecError(rules_path(layout.spec_dir, spec.name), rules)
    return plan


def resolve_plan(spark: SparkSession, spec: StreamSpec, layout: Layout) -> StreamPlan:
    """The stream's plan with everything known, also the columns of its transform's result
    (Spark's analysis; a transform Spark rejects raises :class:`SpecError`)."""
    return compile_plan(spec, layout, _transformed(spark, spec, layout))


def _transformed(spark: SparkSession, spec: StreamSpec, layout: Layout) -> Transformed | None:
    if spec.transform is None:
        return None
    transformed, problems = transform_result(spark, spec, layout.transforms_dir)
    if problems:
        raise SpecError(layout.spec_dir / f"{spec.name}.yaml", problems)
    return transformed

