"""Stream specs: one YAML file per stream, parsed into typed, validated objects.

A spec is validated completely before anything starts. Every error names the spec
file and the field (``outputs[1].query.group_by[0]``) so that an operator can fix it
without reading Spark's stack traces. This module must stay importable without
pyspark: Airflow parses specs while it parses DAG files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
COLUMN_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
DURATION_PATTERN = re.compile(r"^\s*(\d+)\s+(millisecond|second|minute|hour|day)s?\s*$")
DURATION_SECONDS = {"millisecond": 0.001, "second": 1, "minute": 60, "hour": 3600, "day": 86400}

#: Column types a spec may declare, with their Spark SQL names.
SPARK_TYPES = {
    "string": "string",
    "integer": "int",
    "long": "bigint",
    "double": "double",
    "boolean": "boolean",
    "timestamp": "timestamp",
    "date": "date",
}
NUMERIC_TYPES = {"integer", "long", "double"}

#: Columns the platform adds itself; a spec may not declare them.
CORRUPT_RECORD_COLUMN = "_corrupt_record"
SOURCE_FILE_COLUMN = "_source_file"
EVENT_DATE_COLUMN = "event_date"
WINDOW_START, WINDOW_END = "window_start", "window_end"
#: The query that parses a stream's input and commits its accepted rows (spark_jobs.ingest).
INGEST_QUERY = "_ingest"
#: The columns the platform adds to a stream's rows and results, and what they hold. A
#: declared one would be overwritten by the platform's (event_date) or make a result
#: column ambiguous (window bounds), so a spec may not declare them.
RESERVED_COLUMNS = {
    EVENT_DATE_COLUMN: "it is the date of the event time, which the platform adds to every row of a stream with event_time",
    WINDOW_START: "it is the start of the window, which the platform adds to windowed results",
    WINDOW_END: "it is the end of the window, which the platform adds to windowed results",
}
#: Every name starting with this is reserved as well: the platform's internal columns
#: (_corrupt_record, _source_file, ...) and Spark's own (_metadata) all start with it.
RESERVED_PREFIX = "_"


def reserved(name: str) -> str | None:
    """Why the platform reserves a column name, or None if a spec may declare it.

    Compared without case: Spark resolves column names case-insensitively, so
    ``Event_Date`` would collide with the platform's ``event_date``.
    """
    if name.startswith(RESERVED_PREFIX):
        return (f"names starting with {RESERVED_PREFIX!r} are for the platform's internal columns "
                f"(such as {CORRUPT_RECORD_COLUMN!r} and {SOURCE_FILE_COLUMN!r})")
    return RESERVED_COLUMNS.get(name.lower())


class SpecError(ValueError):
    """A spec is invalid. The message names the file and the field."""

    def __init__(self, source: str | os.PathLike[str], problems: Sequence[tuple[str, str]]):
        self.source = str(source)
        self.problems = list(problems)
        lines = [f"{self.source}: {field or '<spec>'}: {msg}" for field, msg in self.problems]
        super().__init__("invalid stream spec\n  " + "\n  ".join(lines))


def duration_seconds(text: str) -> float:
    """``'10 minutes'`` -> 600.0."""
    match = DURATION_PATTERN.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration like '10 seconds' or '5 minutes'")
    return int(match.group(1)) * DURATION_SECONDS[match.group(2)]


def _check_duration(value: str) -> str:
    if duration_seconds(value) <= 0:
        raise ValueError("must be positive")
    return value.strip()


def _check_relative_or_uri(value: str) -> str:
    """Paths are URIs (``s3a://...``), absolute, or relative without ``..``."""
    if not value or not value.strip():
        raise ValueError("must not be empty")
    if "\x00" in value:
        raise ValueError("must not contain NUL bytes")
    if re.match(r"^[a-z][a-z0-9+.-]*://", value):
        return value
    parts = Path(value).parts
    if ".." in parts:
        raise ValueError(f"{value!r} must not contain '..'")
    return value


def _optional(check):  # noqa: ANN001, ANN202 - builds a pydantic field validator
    def validate(cls, value):  # noqa: ANN001, ANN202
        return value if value is None else check(value)

    return classmethod(validate)


Duration = Annotated[str, Field(description="e.g. '10 seconds'")]
MIN_LEASE_SECONDS = 6


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Column(Strict):
    name: str
    type: Literal["string", "integer", "long", "double", "boolean", "timestamp", "date"]
    required: bool = False

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not COLUMN_PATTERN.match(v):
            raise ValueError(f"{v!r} is not a plain column name (letters, digits, '_')")
        why = reserved(v)
        if why:
            raise ValueError(f"{v!r} is reserved by the platform: {why}")
        return v


class FileSource(Strict):
    type: Literal["files"] = "files"
    path: str
    format: Literal["json", "csv"]
    columns: list[Column] = Field(min_length=1)
    max_files_per_trigger: int = Field(default=10, ge=1)
    #: Further options for Spark's file source, e.g. maxFileAge.
    options: dict[str, str | int | bool] = Field(default_factory=dict)
    #: Where the platform moves files that every query has committed (local paths), so
    #: the landing directory stays small; backfills read both.
    archive_path: str | None = None
    #: How long a committed file stays in the landing directory before it is archived.
    archive_after: Duration = "10 minutes"

    check_paths = field_validator("path", "archive_path")(_optional(_check_relative_or_uri))
    check_aa = field_validator("archive_after")(_optional(_check_duration))

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any]) -> dict[str, Any]:
        managed = {"maxfilespertrigger", "mode", "columnnameofcorruptrecord", "header", "sourcearchivedir"}
        for key in v:
            if key.lower() in managed:
                raise ValueError(f"option {key!r} is set by the platform; use the spec field instead")
            if key.lower() == "cleansource" and str(v[key]).lower() != "off":
                raise ValueError(
                    f"cleanSource: {v[key]} would move or delete a file as soon as the batch that took it is "
                    "committed; if that commit file is lost, Spark replays the batch and no longer finds its "
                    "files. Set archive_path instead: the platform archives files the ingestion committed before "
                    "its newest batch")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> FileSource:
        if self.archive_path:
            if "://" in self.archive_path:
                raise ValueError(f"archive_path {self.archive_path!r}: files are archived by a rename, so it must be "
                                 "a local (or mounted) path, not a URI")
            a, p = (os.path.normpath(x) + os.sep for x in (self.archive_path, self.path))
            if a.startswith(p) or p.startswith(a):
                raise ValueError(f"archive_path {self.archive_path!r} and path {self.path!r} must not contain "
                                 "each other")
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate column names: {dupes}")
        return self


class RateSource(Strict):
    """Spark's rate source, for load tests: columns ``timestamp`` and ``value``."""

    type: Literal["rate"]
    rows_per_second: int = Field(default=100, ge=1)

    @property
    def columns(self) -> list[Column]:
        return [Column(name="timestamp", type="timestamp"), Column(name="value", type="long")]


class SparkSource(Strict):
    """Any source ``spark.readStream`` knows (socket, Kafka with its connector, a table's
    files, ...): ``format`` and ``options`` passed through, ``path`` (resolved like every
    data path) for formats that read one, ``schema`` (a DDL string) for formats that take
    a schema. ``columns`` are the columns the stream keeps, picked by name from what the
    source gives and cast to their types; a row missing a ``required`` one (or whose value
    does not cast) goes to the quarantine. Whether the source gives them is checked with
    Spark (``spark_jobs.check``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["spark"]
    format: str
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    path: str | None = None
    reader_schema: str | None = Field(default=None, alias="schema")
    columns: list[Column] = Field(min_length=1)
    check_path = field_validator("path")(_optional(_check_relative_or_uri))

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_.-]*$", v):
            raise ValueError(f"{v!r} is not a Spark data source name like 'socket' or 'kafka'")
        return v


class Quarantine(Strict):
    """Where malformed records go: raw text, reason, source file, time quarantined."""

    path: str
    check_path = field_validator("path")(_optional(_check_relative_or_uri))


class Enrichment(Strict):
    """A stream-static join with reference data shipped beside the specs."""

    name: str
    path: str
    format: Literal["csv", "json", "parquet"] = "csv"
    columns: list[Column] = Field(min_length=1)
    key: list[str] = Field(min_length=1)
    how: Literal["left", "inner"] = "left"

    check_path = field_validator("path")(_optional(_check_relative_or_uri))


class EventTime(Strict):
    """The event-time column, its watermark, and how far ahead of now an event may be.

    ``column`` must be a timestamp column declared ``required: true`` (a row without
    event time cannot be watermarked or windowed, so it is quarantined).
    ``watermark``: how long to wait for late rows (``10 minutes``); state older than the
    newest event time minus this is dropped, and so are rows that arrive behind it.
    ``max_future`` (default ``1 day``): a row of a file source whose event time lies
    further ahead of the processing time (the micro-batch's time) is quarantined with
    the reason "event time too far in the future" before it reaches the watermark. One
    such row (a clock set to 2100) would otherwise move the watermark decades ahead and
    every later normal row would be dropped as late. Each query of a stream has its own
    micro-batch time, so keep the bound well above the skew of normal clocks: a row
    within seconds of it could be judged differently by two queries.
    """

    column: str
    watermark: Duration
    max_future: Duration = "1 day"
    check_wm = field_validator("watermark", "max_future")(_optional(_check_duration))


class Deduplicate(Strict):
    """Drop repeated events with the same key while they are within the watermark."""

    key: list[str] = Field(min_length=1)


class Window(Strict):
    duration: Duration
    slide: Duration | None = None
    check_d = field_validator("duration", "slide")(_optional(_check_duration))

    @model_validator(mode="after")
    def _slide(self) -> Window:
        if self.slide is not None:
            duration, slide = duration_seconds(self.duration), duration_seconds(self.slide)
            if slide > duration:
                raise ValueError("slide must not be longer than the window duration")
            if duration % slide:
                raise ValueError("the window duration must be a multiple of the slide")
        return self

    @property
    def kind(self) -> str:
        return "tumbling" if self.slide in (None, self.duration) else "sliding"


class Aggregate(Strict):
    name: str
    fn: Literal["count", "sum", "avg", "min", "max", "latest", "approx_count_distinct"]
    column: str | None = None

    @model_validator(mode="after")
    def _column(self) -> Aggregate:
        if not COLUMN_PATTERN.match(self.name):
            raise ValueError(f"name {self.name!r} is not a plain column name")
        if self.fn != "count" and self.column is None:
            raise ValueError(f"{self.fn} needs a column")
        return self


class Passthrough(Strict):
    type: Literal["passthrough"]
    columns: list[str] | None = None


class Aggregation(Strict):
    type: Literal["aggregate"]
    window: Window | None = None
    group_by: list[str] = Field(default_factory=list)
    aggregates: list[Aggregate] = Field(min_length=1)


class SqlQuery(Strict):
    """Any query Structured Streaming can run incrementally, in Spark SQL, over the stream's
    accepted rows (view ``accepted``, watermarked on the event time) and its reference data
    (one view per ``enrich`` entry, by its name). Its result columns are Spark's: they are
    known from Spark's analysis (``spark_jobs.check``), not from the spec alone."""

    type: Literal["sql"]
    sql: str
    label: ClassVar[str] = "SQL"

    @field_validator("sql")
    @classmethod
    def _sql(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the query is empty")
        return v


class PythonQuery(Strict):
    """A function from the stream's accepted rows (a streaming DataFrame) to the output's
    rows, ``package.module:function``, in a module under ``include/transforms/`` (shipped
    with the job to Spark). The reference data are views by their ``enrich`` names
    (``accepted.sparkSession.table("devices")``). Like SQL, its result is Spark's to know."""

    type: Literal["python"]
    python: str
    label: ClassVar[str] = "Python"

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not FUNCTION_PATTERN.match(v):
            raise ValueError(f"{v!r} is not a function reference like 'package.module:function'")
        return v


class Transform(Strict):
    """The stream's own computation, between its parse and its accepted rows: one Spark SQL
    query over the view ``input`` (the rows the ingestion keeps: valid, on time, not
    duplicates, enriched by the joins; the reference data are views by their ``enrich``
    names), or a Python function of them (``package.module:function`` under
    ``include/transforms/``). Its result, row by row, is what the stream accepts: it may
    filter, derive columns, explode, join reference data; it keeps the event-time column.
    It runs on each micro-batch, so it must be per-row: no aggregation, deduplication,
    sort or limit (``spark_jobs.check`` says so before anything starts)."""

    sql: str | None = None
    python: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Transform:
        if (self.sql is None) == (self.python is None):
            raise ValueError("set exactly one of sql, python")
        if self.sql is not None and not self.sql.strip():
            raise ValueError("the query is empty")
        if self.python is not None and not FUNCTION_PATTERN.match(self.python):
            raise ValueError(f"{self.python!r} is not a function reference like 'package.module:function'")
        return self

    @property
    def type(self) -> str:
        return "sql" if self.sql is not None else "python"

    @property
    def label(self) -> str:
        return "SQL" if self.sql is not None else "Python"


FUNCTION_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
#: Queries the user writes as code: their result columns are known from Spark's analysis only.
CODE_QUERIES = (SqlQuery, PythonQuery)
#: The view a SQL output reads the stream's accepted rows from.
ACCEPTED_VIEW = "accepted"
#: The view a stream's SQL transform reads the rows it decides from.
INPUT_VIEW = "input"
#: Where a Python query's modules live, beside the specs' folder (``include/transforms/``).
TRANSFORMS_DIR = "transforms"


class ParquetSink(Strict):
    type: Literal["parquet"]
    path: str
    partition_by: list[str] = Field(default_factory=list)
    check_path = field_validator("path")(_optional(_check_relative_or_uri))


class TableSink(Strict):
    """A relational table written by an idempotent upsert per micro-batch.

    ``url`` is ``sqlite:///relative/or/absolute.db`` or ``postgresql://...``; ``${VAR}``
    is expanded from the environment so that credentials stay out of specs. Without a
    url the platform's default database is used (``STREAMS_DB_URL``, else SQLite).
    """

    type: Literal["table"]
    table: str
    key: list[str] | None = None
    url: str | None = None

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        if not NAME_PATTERN.match(v):
            raise ValueError(f"{v!r} is not a safe table name (lower case letters, digits, '_')")
        return v


class ConsoleSink(Strict):
    type: Literal["console"]


class MemorySink(Strict):
    type: Literal["memory"]


Sink = Annotated[ParquetSink | TableSink | ConsoleSink | MemorySink, Field(discriminator="type")]
Query = Annotated[Passthrough | Aggregation | SqlQuery | PythonQuery, Field(discriminator="type")]


class Trigger(Strict):
    """Exactly one of: processing_time (micro-batch), available_now, continuous."""

    processing_time: Duration | None = None
    available_now: bool = False
    continuous: Duration | None = None

    @model_validator(mode="after")
    def _one(self) -> Trigger:
        chosen = [self.processing_time is not None, self.available_now, self.continuous is not None]
        if sum(chosen) != 1:
            raise ValueError("set exactly one of processing_time, available_now, continuous")
        for v in (self.processing_time, self.continuous):
            if v is not None:
                _check_duration(v)
        return self

    @property
    def kind(self) -> str:
        if self.available_now:
            return "available_now"
        return "continuous" if self.continuous else "processing_time"


class Output(Strict):
    name: str
    query: Query
    mode: Literal["append", "update", "complete"]
    sink: Sink
    trigger: Trigger | None = None
    checkpoint: str | None = None
    check_ckpt = field_validator("checkpoint")(_optional(_check_relative_or_uri))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.match(v):
            raise ValueError(f"{v!r} is not a safe name (lower case letters, digits, '_'; no path separators)")
        return v


class Application(Strict):
    """An existing Structured Streaming application, deployed and supervised as it is:
    ``spark-submit <path> <args>``, restarted, stopped and watched through its queries'
    checkpoints like the platform's own streams. It takes part through
    ``spark_jobs.driver.supervised`` (the lease, progress events, the stop marker), and names
    each query it starts as declared in ``queries``, checkpointed under the spec's
    ``checkpoint`` root (``app.checkpoint(name)`` gives the location)."""

    path: str  # the application's main file, relative to include/ (or absolute, or a URI spark-submit reads)
    args: list[str] = Field(default_factory=list)
    queries: list[str] = Field(min_length=1)
    check_path = field_validator("path")(_optional(_check_relative_or_uri))

    @field_validator("path")
    @classmethod
    def _python_file(cls, v: str) -> str:
        if not v.endswith(".py"):
            raise ValueError(f"{v!r} is not a Python file (.py)")
        return v

    @field_validator("queries")
    @classmethod
    def _queries(cls, v: list[str]) -> list[str]:
        for name in v:
            if not NAME_PATTERN.match(name):
                raise ValueError(f"{name!r} is not a safe query name (lower case letters, digits, '_')")
        if len(set(v)) != len(v):
            raise ValueError("a query is named twice")
        return v


class Restart(Strict):
    max_attempts: int = Field(default=5, ge=0)
    backoff_initial_seconds: float = Field(default=10, gt=0)
    backoff_max_seconds: float = Field(default=600, gt=0)
    stable_after_minutes: float = Field(default=30, gt=0)
    period_minutes: float = Field(default=60, gt=0)  # max_attempts failures within this period spend the budget


class Supervision(Strict):
    stall_window: Duration = "5 minutes"
    lag_window: Duration = "1 minute"  # "lagging": the backlog grew over this window
    restart: Restart = Field(default_factory=Restart)
    scheduled_restart: str | None = None
    #: the Airflow (Celery) queue of the stream's supervisor, stop and restart tasks: the
    #: workers that listen on it are where its driver runs
    queue: str = Field(default="streams", pattern=r"^[A-Za-z0-9_.-]+$")
    #: the single-driver lease lapses this long after the driver's last heartbeat (spark_jobs.lease)
    lease: Duration = "30 seconds"
    #: keep a warm standby driver beside the active one, to take the stream over in seconds (spark_jobs.standby)
    standby: bool = False
    check_sw = field_validator("stall_window", "lag_window", "lease")(_optional(_check_duration))


class Spark(Strict):
    """Settings passed to spark-submit for this stream.

    ``connection`` is the Airflow connection that says where Spark runs (local mode by
    default; a cluster by changing only that connection).
    """

    connection: str = "spark_streams"
    conf: dict[str, str | int | float | bool] = Field(default_factory=dict)
    driver_memory: str = "1g"
    executor_memory: str = "1g"
    shuffle_partitions: int = Field(default=4, ge=1)


class StreamSpec(Strict):
    name: str
    description: str = ""
    owner: str = "data-platform"
    #: what the platform runs: a source and outputs, or an application of the user's own
    source: Annotated[FileSource | RateSource | SparkSource, Field(discriminator="type")] | None = None
    quarantine: Quarantine | None = None
    enrich: list[Enrichment] = Field(default_factory=list)
    event_time: EventTime | None = None
    deduplicate: Deduplicate | None = None
    transform: Transform | None = None
    outputs: list[Output] = Field(default_factory=list)
    application: Application | None = None
    trigger: Trigger = Field(default_factory=lambda: Trigger(processing_time="10 seconds"))
    checkpoint: str
    supervision: Supervision = Field(default_factory=Supervision)
    spark: Spark = Field(default_factory=Spark)

    check_ckpt = field_validator("checkpoint")(_optional(_check_relative_or_uri))

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_PATTERN.match(v):
            raise ValueError(f"{v!r} is not a safe stream name (lower case letters, digits, '_'; no path separators)")
        return v

    @model_validator(mode="after")
    def _source_and_outputs_or_an_application(self) -> StreamSpec:
        if self.application is None:
            missing = [f for f, v in (("source", self.source), ("outputs", self.outputs)) if not v]
            if missing:
                raise ValueError(f"a stream declares a source and outputs, or an application; {' and '.join(missing)} "
                                 "missing")
            return self
        given = [f for f in ("source", "quarantine", "enrich", "event_time", "deduplicate", "transform", "outputs")
                 if getattr(self, f)]
        if given:
            raise ValueError(f"an application stream runs the application's own queries: remove {', '.join(given)}")
        return self

    # ---- derived facts -------------------------------------------------------------

    def input_columns(self) -> dict[str, str]:
        return {c.name: c.type for c in self.source.columns}

    def joined_columns(self) -> dict[str, str]:
        """The source's columns, then the reference data's: the rows the ingestion keeps
        (what a transform reads as ``input``)."""
        cols = self.input_columns()
        for e in self.enrich:
            for c in e.columns:
                cols.setdefault(c.name, c.type)
        return cols

    def enriched_columns(self) -> dict[str, str]:
        """The accepted rows' columns, known from the spec alone when the stream has no
        transform (whose result only Spark's analysis knows)."""
        cols = self.joined_columns()
        if self.event_time is not None:
            cols[EVENT_DATE_COLUMN] = "date"
        return cols

    def result_columns(self, output: Output) -> list[str] | None:
        """An output's result columns, in order; None for a SQL or Python query, or any
        query over a transform's result, whose columns only Spark's analysis knows
        (``spark_jobs.check``)."""
        q = output.query
        if isinstance(q, CODE_QUERIES):
            return None
        if isinstance(q, Passthrough):
            if self.transform is not None and q.columns is None:
                return None
            return list(q.columns or self.enriched_columns())
        cols = [WINDOW_START, WINDOW_END] if q.window else []
        return cols + list(q.group_by) + [a.name for a in q.aggregates]

    def result_key(self, output: Output) -> list[str]:
        """The key of an output's result rows: window bounds and group keys."""
        q = output.query
        if isinstance(output.sink, TableSink) and output.sink.key:
            return list(output.sink.key)
        if isinstance(q, Aggregation):
            return ([WINDOW_START, WINDOW_END] if q.window else []) + list(q.group_by)
        if isinstance(q, CODE_QUERIES):
            return []
        # a pass-through's rows are unique by the deduplication key, unless a transform made them
        return list(self.deduplicate.key) if self.deduplicate and self.transform is None else []

    def trigger_for(self, output: Output) -> Trigger:
        return output.trigger or self.trigger

    def output(self, name: str) -> Output:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"stream {self.name!r} has no output {name!r}")

    @property
    def has_ingestion(self) -> bool:
        """Every stream parses its input once into its accepted rows, except one whose
        outputs all run continuously (continuous processing cannot feed a file table)."""
        return any(self.trigger_for(o).kind != "continuous" for o in self.outputs)

    @property
    def served_output(self) -> Output | None:
        """The pass-through output the ingestion writes itself, or None.

        An output whose rows are exactly the accepted rows would only copy the
        accepted-rows table: a pass-through query of every accepted column in their order
        (``columns`` absent or equal to :meth:`enriched_columns`), a Parquet sink
        partitioned like the accepted rows (``[event_date]`` with event_time, else none),
        and a trigger that is not continuous. Its sink path then *is* the accepted-rows
        table (:func:`accepted_path`): the ingestion writes every accepted row once,
        into that sink, and the output has no query and no checkpoint of its own. Every
        other output reads the accepted rows from there. Only the first output that
        qualifies is served; a second one is written by its own query as before.
        """
        if not self.has_ingestion:
            return None
        accepted = None if self.transform is not None else list(self.enriched_columns())
        partitioning = [EVENT_DATE_COLUMN] if self.event_time is not None else []
        for o in self.outputs:
            q, sink = o.query, o.sink
            if (isinstance(q, Passthrough) and (q.columns is None or list(q.columns) == accepted)
                    and o.mode == "append" and isinstance(sink, ParquetSink)
                    and list(sink.partition_by) == partitioning and self.trigger_for(o).kind != "continuous"):
                return o
        return None

    def query_names(self) -> list[str]:
        """The stream's Spark queries: the ingestion, then one per output (except the
        output the ingestion serves, see :attr:`served_output`); an application's own."""
        if self.application is not None:
            return list(self.application.queries)
        served = self.served_output
        return ([INGEST_QUERY] if self.has_ingestion else []) + [
            o.name for o in self.outputs if served is None or o.name != served.name]


# ---- semantic rules (what Spark would reject later, or do wrongly) -----------------------


def _semantic_problems(spec: StreamSpec) -> list[tuple[str, str]]:
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
    if spec.application is not None:  # the application's own code decides the rest
        return problems
    inputs = spec.input_columns()
    enriched = spec.enriched_columns()

    if isinstance(spec.source, FileSource) and spec.quarantine is None:
        add(("quarantine", "a file source needs a quarantine path for malformed records"))
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
        elif isinstance(spec.source, FileSource | SparkSource) and not any(
                c.name == col and c.required for c in spec.source.columns):
            add(("event_time.column", f"{col!r} must be declared required: true in source.columns; a row without "
                 "event time would bypass the watermark and never close a window"))

    if spec.deduplicate is not None:
        if spec.event_time is None:
            add(("deduplicate", "deduplication needs event_time with a watermark to bound its state"))
        for j, key in enumerate(spec.deduplicate.key):
            if key not in inputs:
                add((f"deduplicate.key[{j}]", f"unknown column {key!r}; the source has {sorted(inputs)}"))

    if spec.transform is not None and not spec.has_ingestion:
        add(("transform", f"a {spec.transform.label} transform runs in the ingestion, which a stream whose outputs "
                          "all run continuously does not have"))
    # the columns of the accepted rows, if the spec alone says them (a transform's only Spark knows:
    # spark_jobs.check then checks the outputs' columns)
    known = spec.transform is None

    seen_names: set[str] = set()
    for i, out in enumerate(spec.outputs):
        where = f"outputs[{i}]"
        if out.name in seen_names:
            add((f"{where}.name", f"duplicate output name {out.name!r}"))
        seen_names.add(out.name)
        q = out.query
        trigger = spec.trigger_for(out)

        if isinstance(q, Passthrough):
            for j, c in enumerate(q.columns or [] if known else []):
                if c not in enriched:
                    add((f"{where}.query.columns[{j}]", f"unknown column {c!r}; available: {sorted(enriched)}"))
            if out.mode != "append":
                add((f"{where}.mode", f"a pass-through query supports only append mode, not {out.mode}"))
        elif isinstance(q, CODE_QUERIES):
            if not spec.has_ingestion:
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
            result = spec.result_columns(out)
            for j, c in enumerate(sink.partition_by if result is not None else []):
                if c not in result:
                    add((f"{where}.sink.partition_by[{j}]", f"unknown column {c!r}; the result has {result}"))
        if isinstance(sink, TableSink):
            key = spec.result_key(out)
            result = spec.result_columns(out)
            if not key:
                add((f"{where}.sink.key", f"a table sink of a {q.label} query needs a key: the result columns that "
                                          "identify a row" if isinstance(q, CODE_QUERIES) else
                     "a table sink needs a key (the result has no window or group keys)"))
            for j, c in enumerate(sink.key or [] if result is not None else []):
                if c not in result:
                    add((f"{where}.sink.key[{j}]", f"unknown column {c!r}; the result has {result}"))

        if trigger.kind == "continuous":
            reasons = []
            if not isinstance(spec.source, RateSource):
                reasons.append("the file source does not support continuous processing")
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


def checkpoint_paths(spec: StreamSpec) -> dict[str, str]:
    """Checkpoint location (unresolved) of each query the spec starts, and of each output.

    The output the ingestion serves (:attr:`StreamSpec.served_output`) has no query;
    its entry is where its own query kept its checkpoint before it was served. Nothing
    is written there, and a stream whose checkpoint still holds it does not start
    (``spark_jobs.pipeline``)."""
    paths = {o.name: o.checkpoint or f"{spec.checkpoint.rstrip('/')}/{o.name}" for o in spec.outputs}
    if spec.application is not None:
        paths |= {q: f"{spec.checkpoint.rstrip('/')}/{q}" for q in spec.application.queries}
    if spec.has_ingestion:
        paths[INGEST_QUERY] = f"{spec.checkpoint.rstrip('/')}/{INGEST_QUERY}"
    return paths


def own_accepted_path(spec: StreamSpec) -> str:
    """The accepted-rows table of a stream without a served output: ``accepted/<stream>``."""
    return f"accepted/{spec.name}"


def accepted_path(spec: StreamSpec) -> str:
    """Where the stream's accepted rows live (unresolved): the sink path of the output the
    ingestion serves (:attr:`StreamSpec.served_output`), else ``accepted/<stream>``."""
    served = spec.served_output
    if served is not None:
        assert isinstance(served.sink, ParquetSink)
        return served.sink.path
    return own_accepted_path(spec)


def _nested(a: str, b: str) -> bool:
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)


def _shared_path_problems(specs: dict[str, StreamSpec]) -> dict[str, list[tuple[str, str]]]:
    """Checkpoints and file sinks used by two queries, within or across specs."""
    owners: list[tuple[str, str, str, str]] = []  # (source, field, kind, path)
    for source, spec in specs.items():
        owners.append((source, "checkpoint", "root", spec.checkpoint))
        for i, out in enumerate(spec.outputs):
            ckpt = checkpoint_paths(spec)[out.name]
            field = f"outputs[{i}].checkpoint" if out.checkpoint else "checkpoint"
            owners.append((source, field, "checkpoint", ckpt))
            if isinstance(out.sink, ParquetSink):
                owners.append((source, f"outputs[{i}].sink.path", "sink", out.sink.path))
        if spec.quarantine:
            owners.append((source, "quarantine.path", "sink", spec.quarantine.path))
        if spec.has_ingestion and spec.served_output is None:  # else the served output's sink path, added above
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
                "files", "rate", "spark", "parquet", "table", "console", "memory", "passthrough", "aggregate", "sql", "python"):
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


def parse_spec(data: Any, source: str | os.PathLike[str] = "<spec>") -> StreamSpec:
    """Validate already-loaded YAML data; raise :class:`SpecError` naming each field."""
    if not isinstance(data, dict):
        raise SpecError(source, [("", "a spec must be a YAML mapping")])
    try:
        spec = StreamSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, field_problems(exc)) from None
    problems = _semantic_problems(spec) + _shared_path_problems({str(source): spec}).get(str(source), [])
    if problems:
        raise SpecError(source, problems)
    return spec


class _DuplicateKey(yaml.YAMLError):
    pass


class _SpecLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key repeated in one mapping is an error.

    Plain YAML keeps the last of two equal keys and drops the first without a word: a
    second ``watermark:`` or ``outputs:`` pasted into a spec would silently win.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                seen = key in first
            except TypeError:  # an unhashable key: the base class says so
                continue
            if seen:
                raise _DuplicateKey(f"duplicate key {key!r} on line {key_node.start_mark.line + 1} "
                                    f"(first on line {first[key] + 1}); YAML would keep only the last")
            first[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: what is wrong and where (PyYAML's own text quotes the line and a caret)."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or problem is None:
        return str(exc)
    context = f"{exc.context}: " if getattr(exc, "context", None) else ""
    return f"{context}{problem} (line {mark.line + 1}, column {mark.column + 1})"


def load_spec(path: str | os.PathLike[str]) -> StreamSpec:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, [("", f"cannot read: {exc}")]) from None
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # a SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError(path, [("", f"not valid YAML: {_yaml_problem(exc)}")]) from None
    spec = parse_spec(data, path)
    if spec.name != path.stem:
        raise SpecError(path, [("name", f"must match the file name {path.stem!r}")])
    return spec


def spec_files(directory: str | os.PathLike[str]) -> list[Path]:
    return sorted(p for p in Path(directory).glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


def load_specs(directory: str | os.PathLike[str]) -> tuple[dict[str, StreamSpec], dict[str, SpecError]]:
    """Load every spec in a directory: the valid ones, and an error per invalid file.

    A spec that shares a checkpoint or sink path with another is invalid too (both
    are reported), so that nothing is deployed from it while the rest keep working.
    """
    specs: dict[str, StreamSpec] = {}
    errors: dict[str, SpecError] = {}
    for path in spec_files(directory):
        try:
            specs[str(path)] = load_spec(path)
        except SpecError as exc:
            errors[str(path)] = exc
    for source, problems in _shared_path_problems(specs).items():
        errors[source] = SpecError(source, problems)
    for source in list(specs):
        if source in errors:
            del specs[source]
    return {s.name: s for s in specs.values()}, errors


# ---- where things live --------------------------------------------------------------------


def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_spec_dir() -> Path:
    return Path(os.environ.get("STREAMS_SPEC_DIR", project_root() / "include" / "streams"))


def default_data_root() -> Path:
    return Path(os.environ.get("STREAMS_DATA_DIR", project_root() / "data"))


class Layout:
    """Resolves a spec's relative paths: data paths against the data root, reference
    data against the spec's directory, and the control files beside the checkpoint."""

    def __init__(self, spec: StreamSpec, data_root: str | os.PathLike[str] | None = None,
                 spec_dir: str | os.PathLike[str] | None = None):
        self.spec = spec
        self.data_root = Path(data_root) if data_root is not None else default_data_root()
        self.spec_dir = Path(spec_dir) if spec_dir is not None else default_spec_dir()

    def data(self, path: str) -> str:
        if "://" in path or os.path.isabs(path):
            return path
        return str((self.data_root / path).resolve())

    @property
    def transforms_dir(self) -> Path:
        """The Python queries' modules: ``include/transforms/`` beside ``include/streams/``."""
        return (self.spec_dir.parent / TRANSFORMS_DIR).resolve()

    def reference(self, path: str) -> str:
        """Reference data paths are relative to the folder holding the specs' folder."""
        if "://" in path or os.path.isabs(path):
            return path
        return str((self.spec_dir.parent / path).resolve())

    @property
    def checkpoint_root(self) -> str:
        return self.data(self.spec.checkpoint)

    def checkpoint(self, query: str) -> str:
        return self.data(checkpoint_paths(self.spec)[query])

    @property
    def application_file(self) -> str:
        """An application stream's main file, resolved against ``include/``."""
        assert self.spec.application is not None
        path = self.spec.application.path
        if re.match(r"^[a-z][a-z0-9+.-]*://", path):  # spark-submit fetches it
            return path
        return str((self.spec_dir.parent / path).resolve())

    @property
    def accepted(self) -> str:
        """The accepted-rows table every output reads (see spark_jobs.ingest); the sink of the
        served output, if the stream has one (:attr:`StreamSpec.served_output`)."""
        return self.data(accepted_path(self.spec))

    @property
    def landing(self) -> str:
        assert isinstance(self.spec.source, FileSource)
        return self.data(self.spec.source.path)

    @property
    def stop_marker(self) -> Path:
        return Path(self.checkpoint_root) / "_control" / "stop"

    @property
    def lease_dir(self) -> Path:
        return Path(self.checkpoint_root) / "_control"

    @property
    def runs_file(self) -> Path:
        """The supervisor's history of runs (restart budget)."""
        return self.lease_dir / "runs.json"

    @property
    def hold_marker(self) -> Path:
        """Present while the stream is stopped on purpose: the supervisor does not restart it."""
        return self.lease_dir / "hold"

    @property
    def quality_dir(self) -> Path:
        """Rules' results, ledger, reports and Data Docs of the stream's validations."""
        return Path(self.data(f"quality/{self.spec.name}"))

    def backfill_dir(self, output: str) -> Path:
        """Where the backfills of an output go, one ``range=...`` folder per range."""
        return Path(self.data(f"backfill/{self.spec.name}/{output}"))

    @property
    def plan_file(self) -> Path:
        """The plan the running job works from (spark_jobs.plan), written when it starts."""
        return self.lease_dir / "plan.json"

    @property
    def events_file(self) -> Path:
        return Path(self.checkpoint_root) / "_events" / "progress.jsonl"

    @property
    def history_file(self) -> Path:
        """The numbers the stream's charts draw (spark_jobs.history), kept for days at bounded size."""
        return Path(self.checkpoint_root) / "_events" / "history.sqlite"

    def table_url(self, sink: TableSink) -> str:
        url = os.path.expandvars(sink.url) if sink.url else os.environ.get("STREAMS_DB_URL", "")
        if not url:
            url = f"sqlite:///{self.data_root / 'tables.db'}"
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
            rel = url.removeprefix("sqlite:///")
            if not os.path.isabs(rel):
                url = f"sqlite:///{(self.data_root / rel).resolve()}"
        return url
