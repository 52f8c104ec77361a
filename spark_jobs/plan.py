"""A stream's plan: its spec compiled once into everything the job needs.

    spec (include/streams/<name>.yaml) + layout (data root, spec folder)
      -> StreamPlan
           source     what to read and how (format, schema, options, landing path)
           ingestion  the rules of the one parse (required columns, event time,
                      deduplication, joins, the stream's transform) and where its two
                      tables and checkpoint are
           outputs    per output: its query, result columns and key, mode, trigger,
                      checkpoint and sink, every path and URL resolved; the output the
                      ingestion serves (``served_by_ingestion``: its sink is the
                      accepted-rows table) has no query and no checkpoint

The job (``spark_jobs.pipeline``, ``spark_jobs.ingest``) works from the plan alone, so a
derived fact is computed in one place. ``stream_job`` writes the plan as JSON beside the
checkpoint (``_control/plan.json``): what the running job was told, for an operator to read.
No pyspark here.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from spark_jobs.spec import (
    CORRUPT_RECORD_COLUMN,
    EVENT_DATE_COLUMN,
    INGEST_QUERY,
    SPARK_TYPES,
    Aggregation,
    Column,
    ConsoleSink,
    FileSource,
    Layout,
    MemorySink,
    ParquetSink,
    Passthrough,
    PythonQuery,
    RateSource,
    SparkSource,
    SqlQuery,
    StreamSpec,
    TableSink,
    Transform,
    Trigger,
    duration_seconds,
)


def ddl(columns: dict[str, str]) -> str:
    """``name: spec type`` pairs as a Spark DDL schema string."""
    return ", ".join(f"`{name}` {SPARK_TYPES[t]}" for name, t in columns.items())


def query_name(stream: str, query: str) -> str:
    """Spark query name; also the memory sink's table name."""
    return f"{stream}__{query.lstrip('_')}"


@dataclass(frozen=True)
class SourcePlan:
    kind: str  # "files", "rate" or "spark" (any spark.readStream format)
    columns: list[Column] = field(default_factory=list)
    format: str = "rate"
    options: dict[str, Any] = field(default_factory=dict)
    landing: str | None = None  # files: the landing directory; spark: the path it loads, if any
    max_files_per_trigger: int | None = None
    rows_per_second: int | None = None
    reader_schema: str | None = None  # spark: the schema handed to the reader, if the spec gives one

    @property
    def reader_options(self) -> dict[str, str]:
        """The options as Spark's readers take them (``true``, not ``True``)."""
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.options.items()}

    @property
    def is_files(self) -> bool:
        return self.kind == "files"

    @property
    def reader_ddl(self) -> str:
        """The file reader's schema: the declared columns, then the corrupt-record column."""
        return ddl({c.name: c.type for c in self.columns}) + f", `{CORRUPT_RECORD_COLUMN}` string"


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
    accepted: str  # the accepted-rows table (Parquet, through its _spark_metadata log)
    #: name -> Spark type: the source's and join columns (or the transform's result), then
    #: event_date; None for a transform not analyzed yet (``pipeline.resolve_plan``)
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

    @property
    def accepted_ddl(self) -> str:
        if self.accepted_columns is None:
            raise ValueError("the accepted rows' columns are known once Spark has analyzed the stream's transform")
        return ", ".join(f"`{name}` {t}" for name, t in self.accepted_columns.items())


@dataclass(frozen=True)
class SinkPlan:
    kind: str  # parquet, table, console, memory
    path: str | None = None  # parquet
    partition_by: list[str] = field(default_factory=list)  # parquet
    url: str | None = None  # table
    table: str | None = None  # table


@dataclass(frozen=True)
class OutputPlan:
    name: str
    query_name: str
    query: Passthrough | Aggregation | SqlQuery | PythonQuery
    mode: str
    trigger: Trigger
    checkpoint: str | None  # None for the served output: it has no query of its own
    columns: list[str] | None  # the result's columns, in order (None for SQL or Python: Spark's analysis knows them)
    key: list[str]  # the result's key (window bounds and groups, a table's key, the dedup key)
    sink: SinkPlan
    reads_source: bool  # a continuous output reads the source itself (no table between the stages)
    #: the ingestion writes this output: its sink is the accepted-rows table (StreamSpec.served_output)
    served_by_ingestion: bool = False

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
class StreamPlan:
    stream: str
    event_time_column: str | None
    source: SourcePlan
    ingestion: IngestionPlan | None
    outputs: list[OutputPlan]
    #: the folder of the Python queries' modules (``include/transforms/``), if the stream has one
    transforms_dir: str | None = None

    def output(self, name: str) -> OutputPlan:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"stream {self.stream!r} has no output {name!r}")

    @property
    def queried_outputs(self) -> list[OutputPlan]:
        """The outputs written by a query of their own: all but the served one."""
        return [o for o in self.outputs if not o.served_by_ingestion]

    @property
    def queries(self) -> list[str]:
        """The stream's Spark queries: the ingestion, then one per output it does not serve."""
        return ([INGEST_QUERY] if self.ingestion else []) + [o.name for o in self.queried_outputs]

    @property
    def spark_query_names(self) -> dict[str, str]:
        """Spark's name of each query -> the stream's (``_ingest``, the outputs' names)."""
        names = {self.ingestion.query_name: INGEST_QUERY} if self.ingestion else {}
        return names | {o.query_name: o.name for o in self.queried_outputs}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=_jsonable, sort_keys=False)

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the plan as JSON (atomically) to ``path``."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(self.to_json() + "\n", encoding="utf-8")
        os.replace(tmp, target)
        return target


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(exclude_none=True)
    raise TypeError(f"cannot write {type(value).__name__} in a plan")


def _sink(layout: Layout, sink: Any) -> SinkPlan:
    if isinstance(sink, ParquetSink):
        return SinkPlan("parquet", path=layout.data(sink.path), partition_by=list(sink.partition_by))
    if isinstance(sink, TableSink):
        return SinkPlan("table", url=layout.table_url(sink), table=sink.table)
    if isinstance(sink, ConsoleSink):
        return SinkPlan("console")
    assert isinstance(sink, MemorySink)
    return SinkPlan("memory")


@dataclass(frozen=True)
class Transformed:
    """What Spark's analysis tells of a stream's transform (``spark_jobs.check``)."""

    columns: list[tuple[str, str]]  # its result's (name, Spark type)
    multiplies: bool  # it can give more rows than it reads


def compile_plan(spec: StreamSpec, layout: Layout, transformed: Transformed | None = None) -> StreamPlan:
    """The spec's plan: every path, schema, key and name the job needs, resolved once.
    ``transformed``: the stream's transform as Spark analyzed it; without it, the plan of
    a stream with a transform does not know the accepted rows' columns
    (``pipeline.resolve_plan`` gives it)."""
    src = spec.source
    if isinstance(src, FileSource):
        source = SourcePlan("files", columns=list(src.columns), format=src.format, options=dict(src.options),
                            landing=layout.landing, max_files_per_trigger=src.max_files_per_trigger)
    elif isinstance(src, SparkSource):
        source = SourcePlan("spark", columns=list(src.columns), format=src.format, options=dict(src.options),
                            landing=layout.data(src.path) if src.path else None, reader_schema=src.reader_schema)
    else:
        assert isinstance(src, RateSource)
        source = SourcePlan("rate", columns=list(src.columns), rows_per_second=src.rows_per_second)
    et = spec.event_time
    event_time = None if et is None else EventTimePlan(
        et.column, et.watermark, et.max_future, round(duration_seconds(et.max_future) * 1_000_000))
    ingestion = None
    if spec.has_ingestion:
        if spec.transform is None:
            accepted: dict[str, str] | None = {name: SPARK_TYPES[t] for name, t in spec.enriched_columns().items()}
        elif transformed is not None:
            accepted = dict(transformed.columns) | ({EVENT_DATE_COLUMN: "date"} if et is not None else {})
        else:
            accepted = None
        ingestion = IngestionPlan(
            query_name=query_name(spec.name, INGEST_QUERY), checkpoint=layout.checkpoint(INGEST_QUERY),
            trigger=spec.trigger, accepted=layout.accepted, accepted_columns=accepted,
            transform=spec.transform, input_columns=list(spec.joined_columns()),
            transform_multiplies=transformed is not None and transformed.multiplies,
            partition_by=[EVENT_DATE_COLUMN] if et is not None else [],
            quarantine=layout.data(spec.quarantine.path) if spec.quarantine else None,
            joins=[JoinPlan(e.name, layout.reference(e.path), e.format, list(e.columns), list(e.key), e.how)
                   for e in spec.enrich],
            event_time=event_time, deduplicate=list(spec.deduplicate.key) if spec.deduplicate else None)
    served = spec.served_output.name if spec.served_output else None
    outputs = [OutputPlan(
        name=o.name, query_name=query_name(spec.name, o.name), query=o.query, mode=o.mode,
        trigger=spec.trigger_for(o), checkpoint=None if o.name == served else layout.checkpoint(o.name),
        columns=spec.result_columns(o), key=spec.result_key(o), sink=_sink(layout, o.sink),
        reads_source=spec.trigger_for(o).kind == "continuous", served_by_ingestion=o.name == served)
        for o in spec.outputs]
    python = (any(isinstance(o.query, PythonQuery) for o in spec.outputs)
              or (spec.transform is not None and spec.transform.python is not None))
    return StreamPlan(spec.name, et.column if et else None, source, ingestion, outputs,
                      transforms_dir=str(layout.transforms_dir) if python else None)
