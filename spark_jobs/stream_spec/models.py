"""What a stream spec says: the typed, validated model of one YAML file (``include/streams/<name>.yaml``).

Every field is checked where it is declared; rules across fields live in
``spark_jobs.stream_spec.validation``. No pyspark here: Airflow reads specs while it parses DAG files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

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
#: A Kafka record's value as it came (binary), carried to the quarantine's ``raw_bytes``.
RAW_BYTES_COLUMN = "_raw_bytes"
EVENT_DATE_COLUMN = "event_date"
WINDOW_START, WINDOW_END = "window_start", "window_end"
#: The query that parses a stream's input and commits its accepted rows (spark_jobs.flows.ingestion).
INGEST_FLOW = "_ingest"
#: The accepted-rows table among a stream's tables (its Delta tables' upkeep, a run's versions read).
ACCEPTED_TABLE = "_accepted"
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


def check_duration(value: str) -> str:
    if duration_seconds(value) <= 0:
        raise ValueError("must be positive")
    return value.strip()


def check_relative_or_uri(value: str) -> str:
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


#: A positive duration such as ``10 seconds`` or ``5 minutes``
Duration = Annotated[str, AfterValidator(check_duration), Field(description="e.g. '10 seconds'")]
#: A data path: a URI (``s3a://...``), absolute, or relative (to the data root) without ``..``
DataPath = Annotated[str, AfterValidator(check_relative_or_uri)]
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
    path: DataPath
    format: Literal["json", "csv"]
    columns: list[Column] = Field(min_length=1)
    max_files_per_trigger: int = Field(default=10, ge=1)
    #: Further options for Spark's file source, e.g. maxFileAge.
    options: dict[str, str | int | bool] = Field(default_factory=dict)
    #: Where the platform moves files that every query has committed (local paths), so
    #: the landing directory stays small; backfills read both.
    archive_path: DataPath | None = None
    #: How long a committed file stays in the landing directory before it is archived.
    archive_after: Duration = "10 minutes"


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
    Spark (``spark_jobs.analysis``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: Literal["spark"]
    format: str
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    path: DataPath | None = None
    reader_schema: str | None = Field(default=None, alias="schema")
    columns: list[Column] = Field(min_length=1)

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z][A-Za-z0-9_.-]*$", v):
            raise ValueError(f"{v!r} is not a Spark data source name like 'socket' or 'kafka'")
        return v


#: Spark's Kafka source options the spec's own fields set (lower case)
KAFKA_MANAGED_OPTIONS = {
    "subscribe": "topics", "subscribepattern": "pattern", "assign": "topics",
    "kafka.bootstrap.servers": "bootstrap_servers", "startingoffsets": "starting_offsets",
    "maxoffsetspertrigger": "max_offsets_per_trigger", "failondataloss": "fail_on_data_loss",
}
#: Kafka consumer settings Spark sets itself and refuses (its Kafka integration guide)
KAFKA_REFUSED_OPTIONS = ("kafka.group.id", "kafka.auto.offset.reset", "kafka.key.deserializer",
                         "kafka.value.deserializer", "kafka.enable.auto.commit", "kafka.interceptor.classes")
TOPIC_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class KafkaSource(Strict):
    """Records of Kafka topics, their values parsed as JSON or CSV with the stream's
    ``columns`` under the same rules as files: a malformed, empty or invalid-UTF-8 value
    is quarantined with its position (``topic/partition@offset``). ``record_timestamp``
    names a declared timestamp column filled from the record's own timestamp instead of
    the value (an event time when the value carries none). Exactly once into the sinks
    through the checkpoint's offsets: ``starting_offsets`` applies to a first start only."""

    type: Literal["kafka"]
    bootstrap_servers: str | None = Field(default=None, min_length=1, description="host:port[,host:port]; ${VAR} is "
                                          "read from the environment of the driver and of the sensors (or connection)")
    connection: str | None = Field(default=None, description="an Airflow connection (type kafka) whose extra's "
                                                             "bootstrap.servers, or host:port, the broker is at")
    topics: list[str] | None = Field(default=None, description="the topics to read (or pattern)")
    pattern: str | None = Field(default=None, description="a Java regular expression of topic names, instead of topics")
    format: Literal["json", "csv"] = Field(description="how each record's value is parsed")
    columns: list[Column] = Field(min_length=1)
    record_timestamp: str | None = Field(default=None, description="a declared timestamp column filled from the "
                                                                   "record's timestamp instead of its value")
    starting_offsets: str = Field(default="earliest", description="earliest, latest, or Spark's JSON of offsets per "
                                                                  "partition; a first start only")
    max_offsets_per_trigger: int | None = Field(default=None, ge=1, description="records per micro-batch at most")
    fail_on_data_loss: bool = Field(default=True, description="fail when offsets the checkpoint holds were deleted "
                                                              "(retention, a recreated topic) instead of skipping them")
    options: dict[str, str | int | bool] = Field(default_factory=dict, description="Spark's other Kafka source "
                                                 "options, passed through (e.g. minPartitions, kafka.security.protocol)")

    @field_validator("topics")
    @classmethod
    def _topics(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            if not v:
                raise ValueError("name at least one topic")
            for t in v:
                if not TOPIC_PATTERN.match(t):
                    raise ValueError(f"{t!r} is not a Kafka topic name (letters, digits, '.', '_', '-')")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key.lower() in KAFKA_MANAGED_OPTIONS:
                raise ValueError(f"option {key!r} is set by the platform; use the spec field "
                                 f"{KAFKA_MANAGED_OPTIONS[key.lower()]!r} instead")
            if key.lower() in KAFKA_REFUSED_OPTIONS:
                raise ValueError(f"option {key!r}: Spark manages the consumer's group, offsets and "
                                 "deserializers itself and refuses it (offsets live in the checkpoint)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSource:
        if (self.topics is None) == (self.pattern is None):
            raise ValueError("set exactly one of topics, pattern")
        if (self.bootstrap_servers is None) == (self.connection is None):
            raise ValueError("set exactly one of bootstrap_servers, connection")
        names = [c.name for c in self.columns]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate column names: {dupes}")
        if self.record_timestamp is not None:
            declared = {c.name: c for c in self.columns}
            if self.record_timestamp not in declared:
                raise ValueError(f"record_timestamp {self.record_timestamp!r} is not one of the columns {names}")
            if declared[self.record_timestamp].type != "timestamp":
                raise ValueError(f"record_timestamp {self.record_timestamp!r} is "
                                 f"{declared[self.record_timestamp].type}, not a timestamp column")
        if self.record_timestamp is not None and len(self.columns) == 1:
            raise ValueError("the value must carry at least one column besides record_timestamp")
        return self


class Quarantine(Strict):
    """Where malformed records go, as Parquet: ``raw`` (the record as text, always valid
    UTF-8: invalid bytes replaced by U+FFFD), ``raw_bytes`` (the record's bytes exactly as
    they came, where the source gives them: a Kafka value, a JSON file's malformed line;
    else null), ``reason``, ``source_file`` (the file, or ``topic/partition@offset``) and
    ``quarantined_at``."""

    path: DataPath


class Accepted(Strict):
    """The accepted-rows table that the ingestion writes and every output reads.

    ``parquet`` (the default): Spark's file sink, with its ``_spark_metadata`` log. ``delta``:
    a Delta table, written exactly once per batch (Delta's transaction marker), which the
    outputs stream from and which the stream's maintenance DAG compacts and vacuums while
    they read (a compaction changes no data, so readers skip it). A Delta commit costs about a
    second of the driver's time on a small machine, so Parquet stays the default."""

    format: Literal["parquet", "delta"] = "parquet"


class Enrichment(Strict):
    """A stream-static join with reference data shipped beside the specs."""

    name: str
    path: DataPath
    format: Literal["csv", "json", "parquet"] = "csv"
    columns: list[Column] = Field(min_length=1)
    key: list[str] = Field(min_length=1)
    how: Literal["left", "inner"] = "left"



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


class Deduplicate(Strict):
    """Drop repeated events with the same key while they are within the watermark."""

    key: list[str] = Field(min_length=1)


class Window(Strict):
    duration: Duration
    slide: Duration | None = None

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
    known from Spark's analysis (``spark_jobs.analysis``), not from the spec alone."""

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
    sort or limit (``spark_jobs.analysis`` says so before anything starts)."""

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
    path: DataPath
    partition_by: list[str] = Field(default_factory=list)


class DeltaSink(Strict):
    """A Delta Lake table at ``path``, written exactly once per micro-batch through its
    transaction log: append mode appends the batch, complete mode replaces the table with it,
    update mode merges it on ``key`` (an aggregation's window bounds and groups by default).
    A batch replayed after a crash is recognized by the log and skipped."""

    type: Literal["delta"]
    path: DataPath
    partition_by: list[str] = Field(default_factory=list)
    key: list[str] | None = Field(default=None, description="update mode: the result columns a batch's rows "
                                                            "are merged on; an aggregation's window and groups "
                                                            "by default")


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


class KafkaSink(Strict):
    """Result rows as records of a Kafka topic: the value is the row as JSON, the key the
    ``key`` columns as JSON (no key without them). **At least once**: Spark's Kafka writer
    is not transactional, so a micro-batch replayed after a crash is written again. Each
    record carries the headers ``stream``, ``output`` and ``batch_id``: a consumer that
    remembers the batch ids it has read of an output drops a replayed batch's records."""

    type: Literal["kafka"]
    topic: str = Field(description="the topic written to; it must exist")
    key: list[str] | None = Field(default=None, description="result columns that make the record's key (JSON)")
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port]; ${VAR} is read from the "
                                                             "environment of the driver")
    options: dict[str, str | int | bool] = Field(default_factory=dict, description="Spark's other Kafka writer "
                                                 "options, e.g. kafka.security.protocol; ${VAR} expanded")

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        if not TOPIC_PATTERN.match(v):
            raise ValueError(f"{v!r} is not a Kafka topic name (letters, digits, '.', '_', '-')")
        return v

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any]) -> dict[str, Any]:
        for key in v:
            if key.lower() in ("topic", "kafka.bootstrap.servers"):
                raise ValueError(f"option {key!r} is set by the platform; use the sink's own field instead")
        return v


class ConsoleSink(Strict):
    type: Literal["console"]


class MemorySink(Strict):
    type: Literal["memory"]


Sink = Annotated[ParquetSink | DeltaSink | TableSink | KafkaSink | ConsoleSink | MemorySink, Field(discriminator="type")]
Query = Annotated[Passthrough | Aggregation | SqlQuery | PythonQuery, Field(discriminator="type")]


class Trigger(Strict):
    """Exactly one of: processing_time (micro-batch), available_now, continuous."""

    processing_time: Annotated[str, Field(description="e.g. '10 seconds'")] | None = None
    available_now: bool = False
    continuous: Annotated[str, Field(description="e.g. '1 second'")] | None = None

    @model_validator(mode="after")
    def _one(self) -> Trigger:
        chosen = [self.processing_time is not None, self.available_now, self.continuous is not None]
        if sum(chosen) != 1:
            raise ValueError("set exactly one of processing_time, available_now, continuous")
        for v in (self.processing_time, self.continuous):
            if v is not None:
                check_duration(v)
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
    checkpoint: DataPath | None = None

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
    ``spark_jobs.runtime.driver.supervised`` (the lease, progress events, the stop marker), and names
    each query it starts as declared in ``queries``, checkpointed under the spec's
    ``checkpoint`` root (``app.checkpoint(name)`` gives the location)."""

    path: DataPath  # the application's main file, relative to include/ (or absolute, or a URI spark-submit reads)
    args: list[str] = Field(default_factory=list)
    queries: list[str] = Field(min_length=1)

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
    #: the single-driver lease lapses this long after the driver's last heartbeat (spark_jobs.runtime.lease)
    lease: Duration = "30 seconds"
    #: keep a warm standby driver beside the active one, to take the stream over in seconds (spark_jobs.runtime.standby)
    standby: bool = False
    #: with ``standby``: the Airflow (Celery) queue of other workers, where the standby runs (the
    #: stream DAG's ``standby`` task), so that it survives the loss of the active driver's worker;
    #: none: beside the active driver, on its worker
    standby_queue: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    #: how long the upgrade DAG watches the stream run well after its change is carried out before
    #: it calls the upgrade done (and rolls it back otherwise; docs/changes.md)
    upgrade_watch: Duration = "1 minute"


#: Airflow's schedule presets an execution schedule may name
SCHEDULE_PRESETS = ("@hourly", "@daily", "@weekly", "@monthly", "@yearly")


class Sizing(Strict):
    """Sizing by lag (docs/operating.md, "Sizing by lag"): from the input waiting and arriving,
    the supervisor recommends what a micro-batch of the ingestion should take (landing files, or
    Kafka records) so that a backlog clears within ``catch_up`` while each batch takes at most
    ``utilisation`` of the trigger interval, within ``min_per_trigger`` and ``max_per_trigger``
    (default: 10 times the source's own limit), and with ``min_trigger`` or ``max_trigger`` the
    trigger interval too (the other bound is the stream's ``trigger``). Each recommendation is a
    ``sizing_decision`` event with its inputs, charted on the stream's page. The supervisor applies it by handing the
    stream to a standby started at the new size (a rescale, ``spark_jobs.runtime.rate_limit``);
    with ``dry_run`` it only recommends, and the driver keeps the source's own limit."""

    catch_up: Duration = "5 minutes"
    utilisation: float = Field(default=0.7, gt=0, le=1)
    min_per_trigger: int = Field(default=1, ge=1)
    max_per_trigger: int | None = Field(default=None, ge=1)
    #: the trigger interval sized too, within these (either one set; the other defaults to the
    #: spec's ``trigger``): the shortest at which batches keep within ``utilisation``
    min_trigger: Duration | None = None
    max_trigger: Duration | None = None
    #: how often the supervisor reconsiders (its window of observation)
    every: Duration = "1 minute"
    #: recommend only: the driver keeps the source's own limit
    dry_run: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> Sizing:
        if self.max_per_trigger is not None and self.max_per_trigger < self.min_per_trigger:
            raise ValueError(f"max_per_trigger ({self.max_per_trigger}) is below min_per_trigger "
                             f"({self.min_per_trigger})")
        if (self.min_trigger is not None and self.max_trigger is not None
                and duration_seconds(self.max_trigger) < duration_seconds(self.min_trigger)):
            raise ValueError(f"max_trigger ({self.max_trigger}) is below min_trigger ({self.min_trigger})")
        return self


class Execution(Strict):
    """How the stream's driver runs (docs/operating.md, "Execution modes").

    * ``continuous`` (the default): one long-running driver, at the spec's ``trigger``.
    * ``scheduled``: available-now runs from the same checkpoint, each taking what waits and
      exiting, on ``schedule`` (a cron expression, an Airflow preset, or an interval such as
      ``10 minutes``) and, with ``on_input``, as soon as input waits (a landed file, records on
      the topic). Between runs no driver is held; the stream is ``lagging`` once input waited
      longer than ``freshness``.
    * ``adaptive``: scheduled runs while input is quiet; a run that found input arriving at
      ``continuous_above`` records a second or more goes on as a continuous driver, which stops
      between batches once its input stayed below ``scheduled_below`` for ``quiet_for``.
    """

    mode: Literal["continuous", "scheduled", "adaptive"] = "continuous"
    schedule: str | None = Field(default=None, description="cron, an Airflow preset, or an interval ('10 minutes')")
    on_input: bool = False
    freshness: Duration | None = None
    #: how often ``on_input`` looks for waiting input
    input_poll: Duration = "10 seconds"
    #: adaptive: from this input rate (records a second, over the time since the run before) on, a
    #: run goes on as a continuous driver
    continuous_above: float | None = Field(default=None, gt=0)
    #: adaptive: a continuous driver whose input rate stayed below this for ``quiet_for`` stops, and
    #: scheduled runs take the stream on (default: half of ``continuous_above``)
    scheduled_below: float | None = Field(default=None, gt=0)
    quiet_for: Duration = "10 minutes"
    #: a continuous driver's micro-batches sized by the input's lag (continuous and adaptive)
    sizing: Sizing | None = None
    shared_driver: bool = Field(default=False, description=(
        "scheduled and adaptive: each available-now run goes to the data root's shared driver while one serves "
        "(DAG shared_driver), else to a JVM of its own"))

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str | None) -> str | None:
        if v is None or v in SCHEDULE_PRESETS or DURATION_PATTERN.match(v):
            return v
        if len(v.split()) != 5:
            raise ValueError(f"{v!r} is not a cron expression (five fields), one of {', '.join(SCHEDULE_PRESETS)}, "
                             "or an interval such as '10 minutes'")
        try:
            from croniter import croniter  # Airflow's own cron parser, where Airflow reads the spec
        except ImportError:
            return v
        if not croniter.is_valid(v):
            raise ValueError(f"{v!r} is not a valid cron expression")
        return v

    @model_validator(mode="after")
    def _fits_mode(self) -> Execution:
        if self.mode == "scheduled" and self.sizing is not None:
            raise ValueError("sizing: only for a continuous driver (mode continuous or adaptive); a scheduled run "
                             "takes what waits")
        if self.mode == "continuous":
            given = [f for f in ("schedule", "freshness") if getattr(self, f) is not None] + (["on_input"] if self.on_input else [])
            if given:
                raise ValueError(f"{', '.join(given)}: only for mode scheduled (a continuous driver runs all the time)")
            return self
        if self.schedule is None and not self.on_input:
            raise ValueError(f"a {self.mode} stream runs on a schedule, on_input, or both: set at least one")
        if self.freshness is None:
            raise ValueError(f"a {self.mode} stream declares its freshness: how long input may wait for a run (e.g. "
                             "'15 minutes')")
        if self.mode == "adaptive":
            if self.continuous_above is None:
                raise ValueError("an adaptive stream says from which input rate it runs continuously: "
                                 "continuous_above (records a second)")
            if self.scheduled_below is not None and self.scheduled_below >= self.continuous_above:
                raise ValueError(f"scheduled_below ({self.scheduled_below:g}) must be below continuous_above "
                                 f"({self.continuous_above:g}), or the stream would switch back and forth")
        else:
            given = [f for f in ("continuous_above", "scheduled_below") if getattr(self, f) is not None]
            if given:
                raise ValueError(f"{', '.join(given)}: only for mode adaptive")
        return self

    @property
    def scheduled(self) -> bool:
        """Does it run scheduled, at least while its input is quiet (holding no driver between runs)?"""
        return self.mode in ("scheduled", "adaptive")

    @property
    def adaptive(self) -> bool:
        return self.mode == "adaptive"

    @property
    def down_rate(self) -> float:
        """Adaptive: the input rate below which a continuous driver is quiet."""
        assert self.continuous_above is not None
        return self.scheduled_below if self.scheduled_below is not None else self.continuous_above / 2

    @property
    def interval(self) -> bool:
        """Is ``schedule`` an interval (rather than a cron expression or a preset)?"""
        return self.schedule is not None and DURATION_PATTERN.match(self.schedule) is not None

    def describe(self) -> str:
        if not self.scheduled:
            return "continuous"
        when = " and ".join(filter(None, [
            (f"every {self.schedule.strip()}" if self.interval else f"on `{self.schedule}`") if self.schedule else "",
            "when input arrives" if self.on_input else ""]))
        shared = "; runs in the shared driver" if self.shared_driver else ""
        if self.adaptive:
            return (f"adaptive (scheduled {when}; continuous from {self.continuous_above:g} records/s until below "
                    f"{self.down_rate:g} for {self.quiet_for}; freshness {self.freshness}{shared})")
        return f"scheduled ({when}; freshness {self.freshness}{shared})"


class Maintenance(Strict):
    """Upkeep of the stream's Delta tables by its ``stream_<name>_maintenance`` DAG, while the
    stream runs: compaction (OPTIMIZE), then VACUUM of the files that no version within
    ``vacuum_retention`` references. A vacuum is refused, naming the reader, when a reader
    of a table needs more (``spark_jobs.maintenance``)."""

    schedule: str | None = Field(default="0 * * * *", description="cron; empty: by hand only")
    compact: bool = True
    vacuum: bool = True
    vacuum_retention: Duration = "7 days"


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
    source: Annotated[FileSource | KafkaSource | RateSource | SparkSource, Field(discriminator="type")] | None = None
    quarantine: Quarantine | None = None
    accepted: Accepted = Field(default_factory=Accepted)
    enrich: list[Enrichment] = Field(default_factory=list)
    event_time: EventTime | None = None
    deduplicate: Deduplicate | None = None
    transform: Transform | None = None
    outputs: list[Output] = Field(default_factory=list)
    application: Application | None = None
    trigger: Trigger = Field(default_factory=lambda: Trigger(processing_time="10 seconds"))
    checkpoint: DataPath
    supervision: Supervision = Field(default_factory=Supervision)
    execution: Execution = Field(default_factory=Execution)
    maintenance: Maintenance = Field(default_factory=Maintenance)
    spark: Spark = Field(default_factory=Spark)


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

    def output(self, name: str) -> Output:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(f"stream {self.name!r} has no output {name!r}")
