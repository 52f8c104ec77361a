"""A stream's plan: its spec compiled into everything the platform needs to know of it.

    spec (include/streams/<name>.yaml) + layout (data root, spec folder)
      -> StreamPlan
           source       what to read and how (format, schema, options, landing path)
           ingestion    the rules of the one parse (required columns, event time,
                        deduplication, joins, the stream's transform) and where its two
                        tables (accepted rows, quarantine) and checkpoint are
           outputs      per output: its query, result columns and key, mode, trigger,
                        checkpoint and sink, every path and URL resolved; the output the
                        ingestion writes itself (``written_by_ingestion``: its sink is the
                        accepted-rows table) has no query and no checkpoint
           checkpoints  each query's checkpoint; an application's queries

Every fact derived from a spec is derived here, once: the driver works from the plan
(``spark_jobs.frames``, ``spark_jobs.flows``), and so do the Airflow side (health, the
Streams page, assets, the DAGs) and the quality jobs. ``spark_jobs.analysis`` completes it
with what only Spark knows (a transform's result columns). ``stream_job`` writes it as JSON
beside the checkpoint (``_control/plan.json``): what the running job was told, for an
operator to read. No pyspark here.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.stream_spec.layout import redact
from spark_jobs.stream_spec.models import (
    ACCEPTED_TABLE,
    CODE_QUERIES,
    CORRUPT_RECORD_COLUMN,
    EVENT_DATE_COLUMN,
    INGEST_FLOW,
    SPARK_TYPES,
    WINDOW_END,
    WINDOW_START,
    Aggregation,
    Column,
    ConsoleSink,
    DeltaSink,
    Execution,
    FileSource,
    KafkaSink,
    KafkaSource,
    MemorySink,
    Output,
    ParquetSink,
    Passthrough,
    PythonQuery,
    RateSource,
    Spark,
    SparkSource,
    SqlQuery,
    StreamSpec,
    Supervision,
    TableSink,
    Transform,
    Trigger,
    duration_seconds,
)
from spark_jobs.user_code import code_hashes

if TYPE_CHECKING:
    from spark_jobs.stream_spec.layout import Layout


#: The quarantine table's columns (``spark_jobs.flows.ingestion.quarantine_columns``): the
#: record as text (valid UTF-8, invalid bytes replaced by U+FFFD), its bytes exactly as they
#: came where the source gives them (else null), why it was rejected, where it came from and
#: when. A quarantine written before ``raw_bytes`` existed lacks it in its older files: read
#: with this schema, their rows have it null.
QUARANTINE_DDL = "raw string, raw_bytes binary, reason string, source_file string, quarantined_at timestamp"


def ddl(columns: dict[str, str]) -> str:
    """``name: spec type`` pairs as a Spark DDL schema string."""
    return ", ".join(f"`{name}` {SPARK_TYPES[t]}" for name, t in columns.items())


def spark_options(options: dict[str, Any]) -> dict[str, str]:
    """A spec's options as Spark's readers and writers take them (``true``, not ``True``)."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()}


def query_name(stream: str, query: str) -> str:
    """Spark query name; also the memory sink's table name."""
    return f"{stream}__{query.lstrip('_')}"


# ---- what a spec implies, known without Spark ------------------------------------------------


def input_columns(spec: StreamSpec) -> dict[str, str]:
    """The source's declared columns: name -> spec type."""
    return {c.name: c.type for c in spec.source.columns}


def joined_columns(spec: StreamSpec) -> dict[str, str]:
    """The source's columns, then the reference data's: the rows the ingestion keeps
    (what a transform reads as ``input``)."""
    cols = input_columns(spec)
    for e in spec.enrich:
        for c in e.columns:
            cols.setdefault(c.name, c.type)
    return cols


def enriched_columns(spec: StreamSpec) -> dict[str, str]:
    """The accepted rows' columns, known from the spec alone when the stream has no
    transform (whose result only Spark's analysis knows)."""
    cols = joined_columns(spec)
    if spec.event_time is not None:
        cols[EVENT_DATE_COLUMN] = "date"
    return cols


def trigger_for(spec: StreamSpec, output: Output) -> Trigger:
    return output.trigger or spec.trigger


def has_ingestion(spec: StreamSpec) -> bool:
    """Every stream parses its input once into its accepted rows, except one whose outputs
    all run continuously (continuous processing cannot feed a file table) and an application."""
    return any(trigger_for(spec, o).kind != "continuous" for o in spec.outputs)


def written_by_ingestion(spec: StreamSpec) -> Output | None:
    """The pass-through output the ingestion writes itself, or None.

    An output whose rows are exactly the accepted rows would only copy the accepted-rows
    table: a pass-through query of every accepted column in their order (``columns``
    absent or equal to :func:`enriched_columns`), a sink of the accepted rows' format
    (``accepted.format``: Parquet, or a Delta table) partitioned like the
    accepted rows (``[event_date]`` with event_time, else none), and a trigger that is not
    continuous. Its sink path then *is* the accepted-rows table (:func:`accepted_path`):
    the ingestion writes every accepted row once, into that sink, and the output has no
    flow and no checkpoint of its own. Only the first output that qualifies is written so;
    a second one has a flow of its own.
    """
    if not has_ingestion(spec):
        return None
    accepted = None if spec.transform is not None else list(enriched_columns(spec))
    partitioning = [EVENT_DATE_COLUMN] if spec.event_time is not None else []
    kind = DeltaSink if spec.accepted.format == "delta" else ParquetSink
    for o in spec.outputs:
        q, sink = o.query, o.sink
        if (isinstance(q, Passthrough) and (q.columns is None or list(q.columns) == accepted)
                and o.mode == "append" and isinstance(sink, kind)
                and list(sink.partition_by) == partitioning and trigger_for(spec, o).kind != "continuous"):
            return o
    return None


def result_columns(spec: StreamSpec, output: Output) -> list[str] | None:
    """An output's result columns, in order; None for a SQL or Python query, or any query
    over a transform's result, whose columns only Spark's analysis knows
    (``spark_jobs.analysis``)."""
    q = output.query
    if isinstance(q, CODE_QUERIES):
        return None
    if isinstance(q, Passthrough):
        if spec.transform is not None and q.columns is None:
            return None
        return list(q.columns or enriched_columns(spec))
    cols = [WINDOW_START, WINDOW_END] if q.window else []
    return cols + list(q.group_by) + [a.name for a in q.aggregates]


def result_key(spec: StreamSpec, output: Output) -> list[str]:
    """The key of an output's result rows: a table's key, else window bounds and group keys."""
    q = output.query
    if isinstance(output.sink, TableSink | DeltaSink) and output.sink.key:
        return list(output.sink.key)
    if isinstance(q, Aggregation):
        return ([WINDOW_START, WINDOW_END] if q.window else []) + list(q.group_by)
    if isinstance(q, CODE_QUERIES):
        return []
    # a pass-through's rows are unique by the deduplication key, unless a transform made them
    return list(spec.deduplicate.key) if spec.deduplicate and spec.transform is None else []


def checkpoint_paths(spec: StreamSpec) -> dict[str, str]:
    """Checkpoint location (unresolved) of each query the spec starts, and of each output.

    The output the ingestion writes (:func:`written_by_ingestion`) has no query; its entry
    is where its own query kept its checkpoint before. Nothing is written there, and a
    stream whose checkpoint still holds it does not start (``spark_jobs.runtime.checkpoint``)."""
    root = spec.checkpoint.rstrip("/")
    paths = {o.name: o.checkpoint or f"{root}/{o.name}" for o in spec.outputs}
    if spec.application is not None:
        paths |= {q: f"{root}/{q}" for q in spec.application.queries}
    if has_ingestion(spec):
        paths[INGEST_FLOW] = f"{root}/{INGEST_FLOW}"
    return paths


def own_accepted_path(stream: str) -> str:
    """The accepted-rows table of a stream whose ingestion writes no output: ``accepted/<stream>``."""
    return f"accepted/{stream}"


def accepted_path(spec: StreamSpec) -> str:
    """Where the stream's accepted rows live (unresolved): the sink path of the output the
    ingestion writes (:func:`written_by_ingestion`), else ``accepted/<stream>``."""
    written = written_by_ingestion(spec)
    if written is not None:
        assert isinstance(written.sink, ParquetSink | DeltaSink)
        return written.sink.path
    return own_accepted_path(spec.name)


@dataclass(frozen=True)
class KafkaPlan:
    """Where a Kafka source reads (``spark_jobs.sources.kafka``): the bootstrap servers as
    the spec says them (``${VAR}`` expanded where they are used) or the Airflow connection
    that says them, the topics or pattern."""

    bootstrap_servers: str | None
    topics: list[str] | None
    pattern: str | None
    starting_offsets: str
    max_offsets_per_trigger: int | None
    fail_on_data_loss: bool
    #: the column filled from the record's timestamp, not parsed from its value
    record_timestamp: str | None
    #: the Airflow connection that says where the broker is, instead of ``bootstrap_servers``
    connection: str | None = None

    @property
    def subscription(self) -> str:
        """The topics as an operator reads them: ``a, b`` or ``pattern <regex>``."""
        return ", ".join(self.topics) if self.topics else f"pattern {self.pattern}"


@dataclass(frozen=True)
class SourcePlan:
    kind: str  # "files", "kafka", "rate" or "spark" (any spark.readStream format)
    columns: list[Column] = field(default_factory=list)
    format: str = "rate"
    options: dict[str, Any] = field(default_factory=dict)
    landing: str | None = None  # files: the landing directory; spark: the path it loads, if any
    max_files_per_trigger: int | None = None
    rows_per_second: int | None = None
    reader_schema: str | None = None  # spark: the schema handed to the reader, if the spec gives one
    kafka: KafkaPlan | None = None
    #: files: where landed files go once ingested (``spark_jobs.runtime.archive``), and how long after they landed
    archive_path: str | None = None
    archive_after: str | None = None
    #: files: the landing folder that ``landing`` replays (a reprocess reads links of its files
    #: from a folder beside it): the rows name the landing folder's files (``_source_file``)
    replay_of: str | None = None

    @property
    def reader_options(self) -> dict[str, str]:
        """The options as Spark's readers take them (``true``, not ``True``)."""
        return spark_options(self.options)

    @property
    def is_files(self) -> bool:
        return self.kind == "files"

    @property
    def parses_records(self) -> bool:
        """Whether the platform parses the source's records itself (files, Kafka values):
        malformed ones are quarantined with the parser's reason and their position."""
        return self.kind in ("files", "kafka")

    @property
    def parsed_columns(self) -> list[Column]:
        """The columns parsed from a record (a Kafka record's timestamp column is not)."""
        skip = self.kafka.record_timestamp if self.kafka else None
        return [c for c in self.columns if c.name != skip]

    @property
    def reader_ddl(self) -> str:
        """The parser's schema: the parsed columns, then the corrupt-record column."""
        return ddl({c.name: c.type for c in self.parsed_columns}) + f", `{CORRUPT_RECORD_COLUMN}` string"


@dataclass(frozen=True)
class JoinPlan:
    """A stream-static join with reference data (a left join with a match marker; inner
    joins count the rows without a match as unmatched)."""

    name: str
    path: str
    format: str
    columns: list[Column]
    key: list[str]
    how: str


@dataclass(frozen=True)
class EventTimePlan:
    column: str
    watermark: str
    max_future: str
    max_future_us: int


@dataclass(frozen=True)
class IngestionPlan:
    query_name: str
    checkpoint: str
    trigger: Trigger
    accepted_path: str  # the accepted-rows table's folder (:attr:`accepted_table` as a dataset)
    #: name -> Spark type: the source's and join columns (or the transform's result), then
    #: event_date; None for a transform not analyzed yet (``analysis.resolve_plan``)
    accepted_columns: dict[str, str] | None
    partition_by: list[str]
    quarantine: str | None
    joins: list[JoinPlan]
    event_time: EventTimePlan | None
    deduplicate: list[str] | None
    transform: Transform | None = None
    #: the columns of the rows the transform reads (view ``input``): source and join columns
    input_columns: list[str] = field(default_factory=list)
    #: whether the transform can give more rows than it reads (explode, a join): then its
    #: rows are accounted as in and out, else what it does not give back as filtered
    transform_multiplies: bool = False
    #: the accepted-rows table's format: ``parquet`` (through its _spark_metadata log) or ``delta``
    accepted_format: str = "parquet"

    @property
    def accepted_is_delta(self) -> bool:
        return self.accepted_format == "delta"

    @property
    def accepted_table(self) -> ParquetDataset | DeltaDataset:
        """The accepted-rows table as a dataset: the target of the ingestion's flow."""
        if self.accepted_is_delta:
            return DeltaDataset(self.accepted_path, list(self.partition_by))
        return ParquetDataset(self.accepted_path, list(self.partition_by))

    @property
    def accepted_ddl(self) -> str:
        if self.accepted_columns is None:
            raise ValueError("the accepted rows' columns are known once Spark has analyzed the stream's transform")
        return ", ".join(f"`{name}` {t}" for name, t in self.accepted_columns.items())


# ---- datasets: where flows write (apart from the flows, as Spark Declarative Pipelines keep them) ----


@dataclass(frozen=True)
class FilesDataset:
    """A table of files under a folder: Spark's file sink (Parquet) or a Delta table."""

    path: str
    partition_by: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return self.path


@dataclass(frozen=True)
class ParquetDataset(FilesDataset):
    """Parquet files that Spark's file sink commits through its ``_spark_metadata`` log."""

    kind: str = field(default="parquet", init=False)


@dataclass(frozen=True)
class DeltaDataset(FilesDataset):
    """A Delta Lake table: one commit per batch (``spark_jobs.sinks.delta``)."""

    kind: str = field(default="delta", init=False)


@dataclass(frozen=True)
class TableDataset:
    """A relational table (SQLite, PostgreSQL), written idempotently per batch (``spark_jobs.sinks.table``)."""

    url: str
    table: str
    kind: str = field(default="table", init=False)

    @property
    def where(self) -> str:
        return f"table {self.table}"


@dataclass(frozen=True)
class KafkaDataset:
    """A Kafka topic, written at least once (``spark_jobs.sinks.kafka``)."""

    topic: str
    bootstrap_servers: str  # as the spec says it (``${VAR}`` expanded where it is used)
    key: list[str] | None = None  # the columns of the record's key
    options: dict[str, str] = field(default_factory=dict)  # the writer's other options
    kind: str = field(default="kafka", init=False)

    @property
    def where(self) -> str:
        return f"topic {self.topic}"


@dataclass(frozen=True)
class ConsoleDataset:
    """Rows printed by the driver (nothing kept)."""

    kind: str = field(default="console", init=False)

    @property
    def where(self) -> str:
        return "the driver's console"


@dataclass(frozen=True)
class MemoryDataset:
    """Spark's in-memory table named after the query (tests)."""

    kind: str = field(default="memory", init=False)

    @property
    def where(self) -> str:
        return "memory"


#: a flow's target: each kind a class of its own, its writer one function per class
#: (``spark_jobs.flows.outputs``)
SinkPlan = ParquetDataset | DeltaDataset | TableDataset | KafkaDataset | ConsoleDataset | MemoryDataset


@dataclass(frozen=True)
class OutputPlan:
    name: str
    query_name: str
    query: Passthrough | Aggregation | SqlQuery | PythonQuery
    mode: str
    trigger: Trigger
    checkpoint: str | None  # None for the output the ingestion writes: it has no query of its own
    columns: list[str] | None  # the result's columns, in order (None for SQL or Python: Spark's analysis knows them)
    key: list[str]  # the result's key (window bounds and groups, a table's key, the dedup key)
    sink: SinkPlan
    reads_source: bool  # a continuous output reads the source itself (no table between the stages)
    #: the ingestion writes this output: its sink is the accepted-rows table (:func:`written_by_ingestion`)
    written_by_ingestion: bool = False
    #: the output the ingestion writes: where a flow of its own kept its checkpoint before (nothing is
    #: written there; a checkpoint still there is refused, ``runtime.checkpoint``)
    former_checkpoint: str | None = None

    @property
    def emits_by_watermark(self) -> bool:
        """Whether its query needs Spark's batches without data, which only move its
        watermark: an append-mode aggregation (a window is emitted when the watermark
        passes it, and that watermark closes its windows for validation), and SQL or
        Python (which may hold one). An update- or complete-mode aggregation (into a table,
        validated whole at each batch) emits nothing then: such a batch would only evict
        state, which the next batch with data does as well. A pass-through holds no state."""
        if isinstance(self.query, Aggregation):
            return self.mode == "append"
        return not isinstance(self.query, Passthrough)


@dataclass(frozen=True)
class ApplicationPlan:
    """A stream that runs the user's own application: its main file, arguments and queries."""

    file: str
    args: list[str]
    queries: list[str]


@dataclass(frozen=True)
class StreamPlan:
    stream: str
    event_time_column: str | None
    source: SourcePlan | None  # None for an application
    ingestion: IngestionPlan | None
    outputs: list[OutputPlan]
    #: the folder of the Python queries' modules (``include/transforms/``), if the stream has one
    transforms_dir: str | None = None
    #: the stream's checkpoint folder: its queries' checkpoints, lease, events and control files
    checkpoint_root: str = ""
    #: each query's checkpoint: the ingestion's, each output's but the one the ingestion writes, an application's
    checkpoints: dict[str, str] = field(default_factory=dict)
    application: ApplicationPlan | None = None
    #: the stream's own trigger (an output's may differ), how it runs (continuous, scheduled,
    #: adaptive) and how it is supervised: as the spec says them
    trigger: Trigger = field(default_factory=lambda: Trigger(processing_time="10 seconds"))
    execution: Execution = field(default_factory=Execution)
    supervision: Supervision = field(default_factory=Supervision)
    #: the session's settings (its ``spark.conf``, memory, the connection that says where Spark runs)
    spark: Spark = field(default_factory=Spark)
    #: the Python code the stream runs: each ``package.module:function`` its transform or queries name ->
    #: its module file's SHA-256 (``user_code.code_hashes``)
    code: dict[str, str] = field(default_factory=dict)

    @property
    def available_now(self) -> bool:
        """Does each run of its driver take what waits and exit (``trigger.available_now``, or scheduled runs;
        an adaptive stream's supervisor decides run by run)?"""
        return self.trigger.available_now or self.execution.mode == "scheduled"

    def output(self, name: str) -> OutputPlan:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"stream {self.stream!r} has no output {name!r}")

    def checkpoint(self, flow: str) -> str:
        """The checkpoint of one of the stream's flows (:attr:`flows`)."""
        try:
            return self.checkpoints[flow]
        except KeyError:
            raise KeyError(f"stream {self.stream!r} has no flow {flow!r}; it has {self.flows}") from None

    @property
    def reference_checks(self) -> str | None:
        """The folder recording the checks of the stream's reference data (``frames.reference_frame``)."""
        return f"{self.checkpoint_root}/_control/references" if self.checkpoint_root else None

    @property
    def accepted_path(self) -> str | None:
        """The accepted-rows table's folder, if the stream has an ingestion."""
        return self.ingestion.accepted_path if self.ingestion else None

    @property
    def delta_tables(self) -> dict[str, str]:
        """The stream's Delta tables, each once: a Delta accepted-rows table (``_accepted``,
        unless it is the sink of the output the ingestion writes), then the outputs' by name."""
        tables = {o.name: o.sink.path for o in self.outputs if isinstance(o.sink, DeltaDataset)}
        if self.ingestion is not None and self.ingestion.accepted_is_delta and self.accepted_path not in tables.values():
            tables = {ACCEPTED_TABLE: self.ingestion.accepted_path} | tables
        return tables

    @property
    def output_written_by_ingestion(self) -> OutputPlan | None:
        return next((o for o in self.outputs if o.written_by_ingestion), None)

    @property
    def outputs_with_flows(self) -> list[OutputPlan]:
        """The outputs written by a flow of their own: all but the one the ingestion writes."""
        return [o for o in self.outputs if not o.written_by_ingestion]

    @property
    def flows(self) -> list[str]:
        """The stream's flows, each one Spark query: the ingestion, then one per output it does
        not write; an application's own queries."""
        if self.application is not None:
            return list(self.application.queries)
        return ([INGEST_FLOW] if self.ingestion else []) + [o.name for o in self.outputs_with_flows]

    @property
    def spark_query_names(self) -> dict[str, str]:
        """Spark's name of each query -> the stream's (``_ingest``, the outputs' names)."""
        names = {self.ingestion.query_name: INGEST_FLOW} if self.ingestion else {}
        return names | {o.query_name: o.name for o in self.outputs_with_flows}

    def to_json(self) -> str:
        """The plan as JSON, as the stream's control files keep it: a database URL's password left
        out (those files are read by the pages; the password is the environment's or the spec's)."""
        data = asdict(self)
        for output in data["outputs"]:
            if output["sink"].get("kind") == "table" and output["sink"].get("url"):
                output["sink"]["url"] = redact(output["sink"]["url"])
        return json.dumps(data, indent=1, default=_jsonable, sort_keys=False)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the plan as JSON (atomically) to ``path``."""
        return write_atomically(path, self.to_json() + "\n")


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    raise TypeError(f"cannot write {type(value).__name__} in a plan")


def _sink(layout: Layout, sink: Any) -> SinkPlan:  # a spec's sink model
    if isinstance(sink, ParquetSink):
        return ParquetDataset(layout.data(sink.path), list(sink.partition_by))
    if isinstance(sink, DeltaSink):
        return DeltaDataset(layout.data(sink.path), list(sink.partition_by))
    if isinstance(sink, TableSink):
        return TableDataset(layout.table_url(sink), sink.table)
    if isinstance(sink, KafkaSink):
        return KafkaDataset(sink.topic, sink.bootstrap_servers, list(sink.key) if sink.key else None,
                            spark_options(sink.options))
    if isinstance(sink, ConsoleSink):
        return ConsoleDataset()
    assert isinstance(sink, MemorySink)
    return MemoryDataset()


@dataclass(frozen=True)
class Transformed:
    """What Spark's analysis tells of a stream's transform (``spark_jobs.analysis``)."""

    columns: list[tuple[str, str]]  # its result's (name, Spark type)
    multiplies: bool  # it can give more rows than it reads


def compile_source(spec: StreamSpec, layout: Layout) -> SourcePlan:
    """What the stream reads, and how."""
    src = spec.source
    if isinstance(src, FileSource):
        return SourcePlan("files", columns=list(src.columns), format=src.format, options=dict(src.options),
                          landing=layout.data(src.path), max_files_per_trigger=src.max_files_per_trigger,
                          archive_path=layout.data(src.archive_path) if src.archive_path else None,
                          archive_after=src.archive_after)
    if isinstance(src, KafkaSource):
        return SourcePlan("kafka", columns=list(src.columns), format=src.format, options=dict(src.options),
                          kafka=KafkaPlan(src.bootstrap_servers, list(src.topics) if src.topics else None, src.pattern,
                                          src.starting_offsets, src.max_offsets_per_trigger, src.fail_on_data_loss,
                                          src.record_timestamp, src.connection))
    if isinstance(src, SparkSource):
        return SourcePlan("spark", columns=list(src.columns), format=src.format, options=dict(src.options),
                          landing=layout.data(src.path) if src.path else None, reader_schema=src.reader_schema)
    assert isinstance(src, RateSource)
    return SourcePlan("rate", columns=list(src.columns), rows_per_second=src.rows_per_second)


def python_refs(spec: StreamSpec) -> list[str]:
    """The Python functions the stream runs (``package.module:function``): its transform's, its queries'."""
    refs = [spec.transform.python] if spec.transform is not None and spec.transform.python is not None else []
    return refs + [o.query.python for o in spec.outputs if isinstance(o.query, PythonQuery)]


def compile_plan(spec: StreamSpec, layout: Layout, transformed: Transformed | None = None) -> StreamPlan:
    """The spec's plan: every path, schema, key and name the job needs, resolved once.
    ``transformed``: the stream's transform as Spark analyzed it; without it, the plan of
    a stream with a transform does not know the accepted rows' columns
    (``analysis.resolve_plan`` gives it). Without Spark, the Airflow side compiles the same
    plan for the paths, checkpoints and names it needs."""
    root = layout.data(spec.checkpoint)
    paths = checkpoint_paths(spec)
    app = spec.application
    if app is not None:
        return StreamPlan(spec.name, None, None, None, [], checkpoint_root=root,
                          checkpoints={q: layout.data(paths[q]) for q in app.queries},
                          application=ApplicationPlan(layout.include(app.path), list(app.args), list(app.queries)),
                          trigger=spec.trigger, execution=spec.execution, supervision=spec.supervision,
                          spark=spec.spark)
    source = compile_source(spec, layout)
    et = spec.event_time
    event_time = None if et is None else EventTimePlan(
        et.column, et.watermark, et.max_future, round(duration_seconds(et.max_future) * 1_000_000))
    ingestion = None
    if has_ingestion(spec):
        if spec.transform is None:
            accepted: dict[str, str] | None = {name: SPARK_TYPES[t] for name, t in enriched_columns(spec).items()}
        elif transformed is not None:
            accepted = dict(transformed.columns) | ({EVENT_DATE_COLUMN: "date"} if et is not None else {})
        else:
            accepted = None
        ingestion = IngestionPlan(
            query_name=query_name(spec.name, INGEST_FLOW), checkpoint=layout.data(paths[INGEST_FLOW]),
            trigger=spec.trigger, accepted_path=layout.data(accepted_path(spec)), accepted_columns=accepted,
            transform=spec.transform, input_columns=list(joined_columns(spec)),
            transform_multiplies=transformed is not None and transformed.multiplies,
            accepted_format=spec.accepted.format,
            partition_by=[EVENT_DATE_COLUMN] if et is not None else [],
            quarantine=layout.data(spec.quarantine.path) if spec.quarantine else None,
            joins=[JoinPlan(e.name, layout.reference(e.path), e.format, list(e.columns), list(e.key), e.how)
                   for e in spec.enrich],
            event_time=event_time, deduplicate=list(spec.deduplicate.key) if spec.deduplicate else None)
    written = written_by_ingestion(spec)
    outputs = [OutputPlan(
        name=o.name, query_name=query_name(spec.name, o.name), query=o.query, mode=o.mode,
        trigger=trigger_for(spec, o), checkpoint=None if o is written else layout.data(paths[o.name]),
        columns=result_columns(spec, o), key=result_key(spec, o), sink=_sink(layout, o.sink),
        reads_source=trigger_for(spec, o).kind == "continuous", written_by_ingestion=o is written,
        former_checkpoint=layout.data(paths[o.name]) if o is written else None)
        for o in spec.outputs]
    refs = python_refs(spec)
    checkpoints = ({INGEST_FLOW: ingestion.checkpoint} if ingestion else {}) | {
        o.name: o.checkpoint for o in outputs if o.checkpoint is not None}
    return StreamPlan(spec.name, et.column if et else None, source, ingestion, outputs,
                      transforms_dir=str(layout.transforms_dir) if refs else None, checkpoint_root=root,
                      checkpoints=checkpoints, trigger=spec.trigger, execution=spec.execution,
                      supervision=spec.supervision, spark=spec.spark,
                      code=code_hashes(layout.transforms_dir, refs))
