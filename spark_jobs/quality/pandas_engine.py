"""Validation without a JVM: a sink's committed rows read with pyarrow or ``deltalake`` and
validated by Great Expectations' pandas engine, with the same suites, results, ledger and
Data Docs as Spark's (:class:`~spark_jobs.quality.validation.Validator` with :class:`PandasRows`).

What is read is what Spark reads:

* a Parquet file sink: the files its ``_spark_metadata`` log lists (never a glob), each column
  typed by the Spark schema Spark keeps in the files' footers, the partition columns typed by
  their folder names as Spark infers them;
* a Delta table: as of the one version the run pins (``deltalake``), typed by the table's schema;
* a relational table: through the platform's own table writer, typed by the output's schema.

Rows reach Great Expectations as pandas frames of the Python values Spark gives (``int``,
``float``, ``str``, naive UTC ``datetime``, ``date``, ``None``; object columns), so that checks,
counts and example values are those of the Spark engine. Where Great Expectations' two engines
answer differently by design, the pandas one answers as Spark's (:func:`as_on_spark`): the
check of a column's type (the platform names Spark's types, e.g. ``LongType``) is judged by the
column's Spark type, and failing rows are named by the unit column only (Spark cannot name
them otherwise; pandas would add their positions in the frame).

A run that cannot give Spark's answer this way raises :class:`NeedsSpark` before it validates
anything (the operator then runs the Spark job): a stream with a transform, or a SQL or Python
output (their columns are Spark's analysis); an expectation outside :data:`PORTABLE`, or a
regex that Java and Python may read differently; a session time zone other than UTC; a Delta
table with reader features ``deltalake`` does not read as Spark does; Parquet files that disagree
on their schema; and more rows to validate for an output than the rules' ``pandas_max_rows``.

No pyspark session here: only ``pyspark.sql.types`` (plain Python) for the Spark types.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import re
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from spark_jobs.plan import OutputPlan, StreamPlan
from spark_jobs.runtime.checkpoint import sink_files
from spark_jobs.runtime.clock import EPOCH, from_ms
from spark_jobs.sinks import delta_log
from spark_jobs.stream_spec.models import (
    CODE_QUERIES,
    EVENT_DATE_COLUMN,
    WINDOW_END,
    WINDOW_START,
    Aggregation,
    Passthrough,
)

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

    from spark_jobs.quality.rules import QualityRules

#: where Spark keeps a Parquet file's schema (its own types) in the file's footer
SPARK_SCHEMA_KEY = b"org.apache.spark.sql.parquet.row.metadata"
#: footer keys of files written with a legacy calendar rebase, which Spark undoes on read
LEGACY_KEYS = (b"org.apache.spark.legacyDateTime", b"org.apache.spark.legacyINT96")
#: a partition folder's name for a null value
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"

#: Expectations whose results Great Expectations' pandas and Spark engines compute alike (counts,
#: observed values and example values), over frames of Spark's Python values. Any other sends
#: the run to Spark. ``expect_column_values_to_be_of_type`` is judged by the Spark type
#: (:func:`as_on_spark`); the regex ones only with a :func:`portable_regex`.
PORTABLE = frozenset({
    "expect_table_columns_to_match_set", "expect_table_columns_to_match_ordered_list",
    "expect_table_column_count_to_equal", "expect_table_column_count_to_be_between",
    "expect_table_row_count_to_equal", "expect_table_row_count_to_be_between", "expect_column_to_exist",
    "expect_column_values_to_not_be_null", "expect_column_values_to_be_null",
    "expect_column_values_to_be_unique", "expect_compound_columns_to_be_unique",
    "expect_column_values_to_be_between", "expect_column_values_to_be_in_set",
    "expect_column_values_to_not_be_in_set", "expect_column_values_to_be_of_type",
    "expect_column_min_to_be_between", "expect_column_max_to_be_between",
    "expect_column_unique_value_count_to_be_between", "expect_column_value_lengths_to_be_between",
    "expect_column_value_lengths_to_equal", "expect_column_pair_values_to_be_equal",
    "expect_column_pair_values_a_to_be_greater_than_b",
    "expect_column_values_to_match_regex", "expect_column_values_to_not_match_regex",
})
REGEX_ARGUMENTS = {"expect_column_values_to_match_regex": "regex", "expect_column_values_to_not_match_regex": "regex"}
#: escapes Java's and Python's regexes read alike on any text: escaped punctuation only (``\d``,
#: ``\w``, ``\s`` and ``\b`` are ASCII in Java, Unicode in Python)
_PLAIN_ESCAPE = re.compile(r"\\[.\-\\/+*?()\[\]{}|^$]")
#: spellings only one of the two reads so: inline flags and groups other than ``(?:``, possessive
#: quantifiers, class intersections and nested classes
_DIALECT = re.compile(r"\(\?(?!:)|[*+?}]\+|&&|\[[^\]]*\[")

#: partition values Spark's number, date or time parsers may take (Java's ``parseDouble`` takes ``1d``)
_NUMBER_OR_TIME = re.compile(r"[\s\d+\-.eEdDfFxXpPtTzZ:/]*\d[\s\d+\-.eEdDfFxXpPtTzZ:/]*")
#: settings of a spec's ``spark.conf`` that change what Spark reads from files
READING_CONF = ("spark.sql.parquet.", "spark.sql.legacy.", "spark.sql.sources.partition", "spark.sql.caseSensitive",
                "spark.sql.files.ignore", "spark.databricks.delta.")
#: the time zones a session may have for the pandas engine to read times as Spark does
UTC_NAMES = ("UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z", "+00:00")


class NeedsSpark(Exception):  # a reason to go elsewhere, not a failure
    """This run must be validated with Spark; the message says why."""


# ---- whether a stream can be validated without Spark ---------------------------------------------


def portable_regex(pattern: Any) -> bool:  # a rules file's value
    """Whether Java (Spark's ``rlike``) and Python (pandas' ``str.contains``) find the same matches
    of ``pattern`` in any text: ASCII, with no escape but escaped punctuation and none of the
    spellings only one of them knows."""
    if not isinstance(pattern, str) or not pattern.isascii():
        return False
    if _DIALECT.search(pattern) or "\\" in _PLAIN_ESCAPE.sub("", pattern):
        return False
    try:
        re.compile(pattern)
    except re.error:
        return False
    return True


def needs_spark(plan: StreamPlan, rules: QualityRules) -> str | None:
    """Why the stream's validation needs Spark whatever its rows (its plan and rules alone), or
    None if the pandas engine gives Spark's results."""
    if rules.pandas_max_rows == 0:
        return "the rules say pandas_max_rows: 0 (always Spark)"
    if plan.ingestion is not None and plan.ingestion.transform is not None:
        return "its transform's result columns are known to Spark's analysis only"
    code = [o.name for o in plan.outputs if isinstance(o.query, CODE_QUERIES)]
    if code:
        return f"the result columns of its SQL or Python output(s) {code} are known to Spark's analysis only"
    zone = plan.spark.conf.get("spark.sql.session.timeZone", "UTC")
    if zone not in UTC_NAMES:
        return f"its Spark session's time zone is {zone!r} (the pandas engine reads times in UTC)"
    reading = [k for k in plan.spark.conf if k.startswith(READING_CONF)]
    if reading:
        return f"its spark.conf sets how Spark reads files ({', '.join(sorted(reading))})"
    for name, out_rules in rules.outputs.items():
        for i, entry in enumerate(out_rules.expectations):
            (exp, kwargs), = entry.items()
            where = f"outputs.{name}.expectations[{i}].{exp}"
            if exp not in PORTABLE:
                return f"{where}: not among the expectations the pandas engine computes as Spark does"
            if exp in REGEX_ARGUMENTS and not portable_regex(kwargs.get(REGEX_ARGUMENTS[exp])):
                return f"{where}: a regex that Java and Python may read differently (only escaped punctuation, ASCII)"
    return None


# ---- the Spark types of an output, from the spec -------------------------------------------------


def _spark_types() -> Any:  # the module
    from pyspark.sql import types

    return types


def simple_type(name: str) -> DataType:
    """A Spark type by its simple name (the accepted rows' types in the plan)."""
    T = _spark_types()
    types = {"string": T.StringType, "int": T.IntegerType, "bigint": T.LongType, "double": T.DoubleType,
             "boolean": T.BooleanType, "timestamp": T.TimestampType, "date": T.DateType}
    if name not in types:
        raise NeedsSpark(f"a column of type {name!r}")
    return types[name]()


def spec_schema(plan: StreamPlan, output: OutputPlan) -> StructType:
    """The schema an output's query gives, as Spark's analysis of it does
    (``validation.expected_schema``), from the plan alone: a pass-through's columns, or a
    windowed or grouped aggregation's bounds, keys and aggregates."""
    T = _spark_types()
    if plan.ingestion is None or plan.ingestion.accepted_columns is None:
        raise NeedsSpark("the accepted rows' columns are known to Spark's analysis only")
    accepted = plan.ingestion.accepted_columns
    q = output.query
    if isinstance(q, Passthrough):
        names = plan.output(output.name).columns or list(accepted)
        fields = [(n, simple_type(accepted[n])) for n in names]
    elif isinstance(q, Aggregation):
        fields = [(n, T.TimestampType()) for n in (WINDOW_START, WINDOW_END)] if q.window is not None else []
        fields += [(g, simple_type(accepted[g])) for g in q.group_by]
        for agg in q.aggregates:
            source = accepted.get(agg.column) if agg.column else None
            if agg.fn in ("count", "approx_count_distinct"):
                t = T.LongType()
            elif agg.fn == "avg" and source in ("int", "bigint", "double"):
                t = T.DoubleType()
            elif agg.fn == "sum" and source in ("int", "bigint"):
                t = T.LongType()
            elif agg.fn == "sum" and source == "double":
                t = T.DoubleType()
            elif agg.fn in ("min", "max", "latest") and source is not None:
                t = simple_type(source)
            else:
                raise NeedsSpark(f"the type of {agg.fn}({agg.column}) in {output.name}")
            fields.append((agg.name, t))
    else:
        raise NeedsSpark(f"the result columns of {output.name} are known to Spark's analysis only")
    return T.StructType([T.StructField(n, t, True) for n, t in fields])


# ---- expect_column_values_to_be_of_type, judged by the Spark type ----------------------------------

#: the Spark type of each column of the frame being validated (set by :func:`as_on_spark`)
_COLUMN_TYPES: contextvars.ContextVar[dict[str, DataType] | None] = contextvars.ContextVar("spark_types", default=None)


@contextlib.contextmanager
def as_on_spark(types: StructType) -> Iterator[None]:
    """While validating a pandas frame whose columns have these Spark types, Great Expectations'
    pandas engine answers as its Spark engine does where the two differ by design:

    * ``expect_column_values_to_be_of_type`` is judged by the column's Spark type (``isinstance``
      of it and the named one; the observed value is the type's class name), not by the frame's
      pandas dtypes (all ``object`` here);
    * a failing row is named only by the ``unexpected_index_column_names`` of the result format:
      without them, Spark gives no ``unexpected_index_list``, and neither does this (pandas
      would list the rows' positions in the frame)."""
    import sys

    from great_expectations.execution_engine import PandasExecutionEngine
    from great_expectations.expectations.core.expect_column_values_to_be_of_type import (
        ExpectColumnValuesToBeOfType as OfType,
    )
    from great_expectations.expectations.expectation import ColumnMapExpectation
    from great_expectations.expectations.registry import get_metric_kwargs
    from great_expectations.validator.metric_configuration import MetricConfiguration

    dependencies, validate = OfType.get_validation_dependencies, OfType._validate

    def spark_dependencies(self: Any, execution_engine: Any = None, runtime_configuration: Any = None,
                           **kwargs: Any) -> Any:
        if not isinstance(execution_engine, PandasExecutionEngine) or _COLUMN_TYPES.get() is None:
            return dependencies(self, execution_engine, runtime_configuration, **kwargs)
        # the aggregate version, as on Spark: the table's column types only
        found = super(ColumnMapExpectation, self).get_validation_dependencies(execution_engine, runtime_configuration)
        metric = get_metric_kwargs(metric_name="table.column_types", configuration=self.configuration,
                                   runtime_configuration=runtime_configuration)
        found.set_metric_configuration(metric_name="table.column_types", metric_configuration=MetricConfiguration(
            metric_name="table.column_types", metric_domain_kwargs=metric["metric_domain_kwargs"],
            metric_value_kwargs=metric["metric_value_kwargs"]))
        return found

    def spark_validate(self: Any, metrics: dict, runtime_configuration: Any = None,
                       execution_engine: Any = None) -> Any:
        columns = _COLUMN_TYPES.get()
        if not isinstance(execution_engine, PandasExecutionEngine) or columns is None:
            return validate(self, metrics, runtime_configuration, execution_engine)
        name = self.configuration.kwargs.get("column")
        # a missing column raises here as it does on Spark (GX reports the exception)
        [t for t in metrics.get("table.column_types", []) if t["name"] == name][0]
        return self._validate_spark(actual_column_type=columns[name],
                                    expected_type=self.configuration.kwargs.get("type_"))

    from great_expectations.expectations import expectation

    format_map_output = expectation._format_map_output

    def named_rows_only(**kwargs: Any) -> Any:  # Great Expectations' result dict
        result_format = kwargs.get("result_format")
        named = kwargs.get("unexpected_index_column_names") or (
            result_format.get("unexpected_index_column_names") if isinstance(result_format, dict) else None)
        if not named:
            kwargs["unexpected_index_list"] = None
        return format_map_output(**kwargs)

    # every module that imported the function (the map expectations' base, and the null checks)
    users = [m for name, m in list(sys.modules.items()) if name.startswith("great_expectations.expectations")
             and getattr(m, "_format_map_output", None) is format_map_output]
    token = _COLUMN_TYPES.set({f.name: f.dataType for f in types.fields})
    OfType.get_validation_dependencies, OfType._validate = spark_dependencies, spark_validate
    for module in users:
        module._format_map_output = named_rows_only
    try:
        yield
    finally:
        OfType.get_validation_dependencies, OfType._validate = dependencies, validate
        for module in users:
            module._format_map_output = format_map_output
        _COLUMN_TYPES.reset(token)


# ---- rows read without Spark -----------------------------------------------------------------------


class Rows:
    """Rows read without Spark: an Arrow table (times naive UTC, to the microsecond, as Spark
    has them) and the Spark type of each of its columns, in Spark's column order."""

    def __init__(self, table: pa.Table, types: StructType):
        self.table, self.types = table, types
        self._frame: pd.DataFrame | None = None

    def count(self) -> int:
        return self.table.num_rows

    def select(self, names: list[str]) -> Rows:
        T = _spark_types()
        by_name = {f.name: f for f in self.types.fields}
        return Rows(self.table.select(names), T.StructType([by_name[n] for n in names]))

    def frame(self) -> pd.DataFrame:
        """The rows as Great Expectations' pandas engine gets them: object columns of the values
        Spark's rows hold (``None`` for null)."""
        import pandas as pd

        if self._frame is None:
            self._frame = pd.DataFrame({name: pd.Series(self.table.column(name).to_pylist(), dtype=object)
                                        for name in self.table.column_names}, columns=self.table.column_names)
        return self._frame


def _naive_micros(table: pa.Table) -> pa.Table:
    """Timestamps to the microsecond without a zone (UTC), as Spark reads them: INT96 nanoseconds
    cut to microseconds, a Delta table's UTC times without their zone."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type) and (field.type.unit != "us" or field.type.tz is not None):
            column = table.column(i)
            if field.type.unit == "ns":  # Spark keeps microseconds: the nanoseconds go (towards the past)
                column = pa.chunked_array([pc.floor_temporal(c, unit="microsecond").cast(pa.timestamp("us", field.type.tz))
                                           for c in column.chunks], type=pa.timestamp("us", field.type.tz))
            table = table.set_column(i, pa.field(field.name, pa.timestamp("us")), column.cast(pa.timestamp("us")))
    return table


def _check_types(types: StructType, where: str) -> None:
    T = _spark_types()
    for f in types.fields:
        if isinstance(f.dataType, T.ArrayType | T.MapType | T.StructType | T.BinaryType | T.TimestampNTZType):
            raise NeedsSpark(f"{where}: column {f.name} is {f.dataType.simpleString()}")


def _arrow_type(t: DataType) -> pa.DataType:
    import pyarrow as pa

    T = _spark_types()
    types = {T.StringType: pa.string(), T.LongType: pa.int64(), T.IntegerType: pa.int32(), T.DoubleType: pa.float64(),
             T.BooleanType: pa.bool_(), T.TimestampType: pa.timestamp("us"), T.DateType: pa.date32()}
    if type(t) not in types:
        raise NeedsSpark(f"a column of type {t.simpleString()}")
    return types[type(t)]


def _timestamp_bound(ms: int, arrow_type: pa.DataType) -> pa.Scalar:
    import pyarrow as pa

    return pa.scalar(ms * 1000, pa.timestamp("us", getattr(arrow_type, "tz", None))).cast(arrow_type)


def _infer_partition_type(values: list[str]) -> DataType:
    """The type Spark infers for a partition column from its folders' values, where it is one of
    the plain cases (integers, decimals without exponent, ISO dates, or text); else NeedsSpark."""
    T = _spark_types()
    present = [v for v in values if v is not None]
    if not present:
        return T.StringType()  # Spark: NullType read as string
    if all(re.fullmatch(r"-?\d+", v) for v in present):
        if all(-2**31 <= int(v) < 2**31 for v in present):
            return T.IntegerType()
        if all(-2**63 <= int(v) < 2**63 for v in present):
            return T.LongType()
        raise NeedsSpark("a partition column of integers beyond 64 bits")
    if all(re.fullmatch(r"-?\d+\.\d+", v) for v in present):
        return T.DoubleType()
    if all(re.fullmatch(r"\d{4}-\d{2}-\d{2}", v) for v in present):
        try:
            [date.fromisoformat(v) for v in present]
        except ValueError:
            raise NeedsSpark("partition values that look like dates but are not") from None
        return T.DateType()
    if any(_NUMBER_OR_TIME.fullmatch(v) or v.strip("+-") in ("NaN", "Infinity") for v in present):
        raise NeedsSpark("partition values whose type Spark infers by rules not followed here")
    return T.StringType()


def _partition_value(raw: str | None, t: DataType) -> Any:
    T = _spark_types()
    if raw is None:
        return None
    if isinstance(t, T.IntegerType | T.LongType):
        return int(raw)
    if isinstance(t, T.DoubleType):
        return float(raw)
    if isinstance(t, T.DateType):
        return date.fromisoformat(raw)
    return raw


class ParquetSink:
    """A Parquet file sink's committed files (its ``_spark_metadata`` log), read lazily."""

    def __init__(self, root: str, files: list[str]):
        self.root = Path(root)
        self.files: list[tuple[str, dict[str, str | None]]] = []
        for uri in sorted(files):
            parts = urlsplit(uri)
            if parts.scheme not in ("", "file"):
                raise NeedsSpark(f"{root}: a file at {uri} (only local files are read without Spark)")
            path = Path(unquote(parts.path))
            try:
                relative = path.parent.relative_to(self.root)
            except ValueError:
                raise NeedsSpark(f"{root}: its log lists {path}, outside its folder") from None
            values: dict[str, str | None] = {}
            for segment in relative.parts:
                if "=" not in segment:
                    raise NeedsSpark(f"{root}: a folder {segment!r} that is not a partition")
                key, value = segment.split("=", 1)
                values[unquote(key)] = None if value == NULL_PARTITION else unquote(value)
            self.files.append((str(path), values))
        names = [tuple(v) for _, v in self.files]
        if len(set(names)) > 1:
            raise NeedsSpark(f"{root}: its files are partitioned differently")
        self.partition_names = list(names[0]) if names else []
        self.partition_types = {n: _infer_partition_type([v[n] for _, v in self.files]) for n in self.partition_names}
        self._footers: dict[str, tuple[StructType, pa.Schema]] = {}

    def _footer(self, path: str) -> tuple[StructType, pa.Schema]:
        """A file's Spark schema (from its footer, as Spark reads it) and its Arrow schema."""
        import pyarrow.parquet as pq

        if path not in self._footers:
            T = _spark_types()
            meta = pq.read_metadata(path)
            keys = meta.metadata or {}
            if any(key in keys for key in LEGACY_KEYS):
                raise NeedsSpark(f"{path} was written with a legacy calendar rebase, which Spark undoes on read")
            if SPARK_SCHEMA_KEY not in keys:
                raise NeedsSpark(f"{path} has no Spark schema in its footer")
            self._footers[path] = (T.StructType.fromJson(json.loads(keys[SPARK_SCHEMA_KEY])), meta.schema.to_arrow_schema())
        return self._footers[path]

    def count(self) -> int:
        import pyarrow.parquet as pq

        return sum(pq.read_metadata(path).num_rows for path, _ in self.files)

    def read(self, unit_column: str, condition: Any, keep: Any, max_rows: int | None) -> Rows:
        """The rows for which ``condition(type)`` (an Arrow expression over the unit column, of
        that column's Arrow type in a file) holds, in the files whose partition values ``keep``
        accepts; NeedsSpark above ``max_rows`` of them, counted from the unit column alone
        before the rest is read."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        T = _spark_types()
        chosen = [(path, values) for path, values in self.files if keep(values)]
        if not chosen:
            return Rows(pa.table({}), T.StructType([]))
        types = None
        for path, _ in chosen:
            found, _arrow = self._footer(path)
            if types is not None and [(f.name, f.dataType) for f in found.fields] != \
                    [(f.name, f.dataType) for f in types.fields]:
                raise NeedsSpark(f"{self.root}: its files disagree on their schema ({path})")
            types = types or found
        assert types is not None
        if set(types.names) & set(self.partition_names):
            raise NeedsSpark(f"{self.root}: a partition column is also in its files")
        _check_types(types, str(self.root))
        filters = {path: condition(self._footer(path)[1].field(unit_column).type) for path, _ in chosen}
        if max_rows is not None:
            rows = sum(pq.read_table(path, columns=[unit_column], filters=filters[path]).num_rows for path, _ in chosen)
            if rows > max_rows:
                raise NeedsSpark(f"{rows} rows of {self.root} to validate, more than pandas_max_rows ({max_rows})")
        full = T.StructType(list(types.fields) + [T.StructField(n, self.partition_types[n], True)
                                                  for n in self.partition_names])
        schema = _arrow_schema(full)
        tables = []
        for path, values in chosen:
            table = _naive_micros(pq.read_table(path, columns=types.names, filters=filters[path]))
            for name in self.partition_names:
                t = self.partition_types[name]
                table = table.append_column(name, pa.array([_partition_value(values[name], t)] * table.num_rows,
                                                           _arrow_type(t)))
            tables.append(table.cast(schema))
        return Rows(pa.concat_tables(tables), full)


class DeltaVersion:
    """A Delta table as of one version, read with ``deltalake``."""

    #: reader features whose files ``deltalake`` reads as Spark does
    READABLE = frozenset({"timestampNtz"})

    def __init__(self, path: str, version: int):
        from deltalake import DeltaTable

        if urlsplit(path).scheme not in ("", "file"):
            raise NeedsSpark(f"{path}: only local Delta tables are read without Spark")
        self.path, self.version = path, version
        self.table = DeltaTable(path, version=version)
        protocol = self.table.protocol()
        features = set(protocol.reader_features or [])
        if protocol.min_reader_version > 1 and not (protocol.min_reader_version == 3 and features <= self.READABLE):
            raise NeedsSpark(f"{path}: Delta reader version {protocol.min_reader_version} with features "
                             f"{sorted(features)}")
        T = _spark_types()
        self.types = T.StructType.fromJson(json.loads(self.table.schema().to_json()))
        _check_types(self.types, path)
        self.dataset = self.table.to_pyarrow_dataset()

    def count(self) -> int:
        return self.dataset.count_rows()

    def column_sum(self, column: str) -> int:
        import pyarrow.compute as pc

        return int(pc.sum(self.dataset.to_table(columns=[column]).column(column)).as_py() or 0)

    def read(self, unit_column: str | None, condition: Any, keep: Any, max_rows: int | None) -> Rows:
        """As :meth:`ParquetSink.read`; a Delta table's partitions are pruned by ``deltalake``."""
        if condition is not None:
            condition = condition(self.dataset.schema.field(unit_column).type)
        if max_rows is not None:
            rows = self.dataset.count_rows(filter=condition)
            if rows > max_rows:
                raise NeedsSpark(f"{rows} rows of {self.path} to validate, more than pandas_max_rows ({max_rows})")
        table = self.dataset.to_table(filter=condition, columns=self.types.names)
        return Rows(_naive_micros(table).cast(_arrow_schema(self.types)), self.types)



def _arrow_schema(types: StructType) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([pa.field(f.name, _arrow_type(f.dataType)) for f in types.fields])


class PandasRows:
    """The operations of a validation run on rows, without Spark (see the module's docstring).
    ``max_rows``: the most rows of one output it validates in a run."""

    engine = "pandas"

    def __init__(self, max_rows: int, event_time: str | None = None):
        self.max_rows = max_rows
        self.event_time = event_time  # the stream's event-time column (its event_date partitions prune)

    def schema(self, plan: StreamPlan, output: OutputPlan) -> StructType:
        return spec_schema(plan, output)

    def datasource(self, context: Any, name: str) -> Any:
        return context.data_sources.add_or_update_pandas(name=name)

    def validating(self, rows: Rows) -> contextlib.AbstractContextManager[None]:
        return as_on_spark(rows.types)

    def batch(self, rows: Rows) -> pd.DataFrame:
        return rows.frame()

    # -- reading

    def parquet(self, path: str) -> ParquetSink | None:
        """A Parquet file sink's committed files, or None if it committed none."""
        if urlsplit(path).scheme not in ("", "file"):
            raise NeedsSpark(f"{path}: only local files are read without Spark")
        if not (Path(path) / "_spark_metadata").is_dir():
            if Path(path).exists() and any(Path(path).iterdir()):
                raise NeedsSpark(f"{path} has files but no _spark_metadata log")
            return None
        files = sink_files(path)
        return ParquetSink(path, sorted(files)) if files else None

    def delta_latest_version(self, path: str) -> int | None:
        found = delta_log.versions(path)
        return found[-1] if found else None

    def delta(self, path: str, version: int) -> DeltaVersion:
        return DeltaVersion(path, version)

    def delta_last_batch(self, path: str, query_id: str | None, version: int) -> int | None:
        return delta_log.last_batch(path, query_id, through=version)

    def accepted_count(self, ingestion: Any, version: int) -> int:
        return DeltaVersion(ingestion.accepted_path, version).count()

    # -- rows

    def count(self, rows: Rows | ParquetSink | DeltaVersion) -> int:
        return rows.count()

    def column_sum(self, rows: Rows | DeltaVersion, column: str) -> int:
        if isinstance(rows, DeltaVersion):
            return rows.column_sum(column)
        return sum(int(v or 0) for v in rows.table.column(column).to_pylist())

    def select(self, rows: Rows | DeltaVersion, names: list[str]) -> Rows:
        if isinstance(rows, DeltaVersion):
            if self.max_rows is not None and rows.count() > self.max_rows:
                raise NeedsSpark(f"{rows.count()} rows of {rows.path} to validate, more than pandas_max_rows "
                                 f"({self.max_rows})")
            rows = rows.read(None, None, None, None)
        return rows.select(names)

    def from_rows(self, rows: list[dict[str, Any]], schema: StructType) -> Rows:
        import pyarrow as pa

        if self.max_rows is not None and len(rows) > self.max_rows:
            raise NeedsSpark(f"{len(rows)} rows to validate, more than pandas_max_rows ({self.max_rows})")
        arrow = _arrow_schema(schema)
        return Rows(pa.Table.from_pylist([{f.name: r[f.name] for f in schema.fields} for r in rows], schema=arrow),
                    schema)

    def closed_between(self, rows: ParquetSink | DeltaVersion, scheme: Any, lo_ms: int | None,
                       hi_ms: int) -> Rows:
        """The rows of the units that closed after ``lo_ms`` up to ``hi_ms``, and those without a
        unit (as :class:`~spark_jobs.quality.validation.SparkRows` selects them)."""
        import pyarrow.dataset as ds

        column = ds.field(scheme.name)

        def condition(arrow_type: pa.DataType) -> Any:  # an Arrow expression
            bound = lambda ms: _timestamp_bound(ms, arrow_type)  # noqa: E731
            if scheme.period_ms is None:
                found = column <= bound(hi_ms)
                if lo_ms is not None:
                    found = found & (column > bound(lo_ms))
            else:
                p = scheme.period_ms
                found = column < bound(hi_ms // p * p)
                if lo_ms is not None:
                    found = found & (column >= bound(lo_ms // p * p))
            return found | column.is_null()

        keep = lambda values: True  # noqa: E731
        if isinstance(rows, ParquetSink) and EVENT_DATE_COLUMN in rows.partition_names \
                and scheme.name == self.event_time:  # event_date is the event time's date: only its days
            first = None if lo_ms is None else (from_ms(lo_ms) - timedelta(days=1)).date()
            last = (from_ms(hi_ms) + timedelta(days=1)).date()
            keep = lambda values: (values[EVENT_DATE_COLUMN] is None or (  # noqa: E731
                (first is None or date.fromisoformat(values[EVENT_DATE_COLUMN]) >= first)
                and date.fromisoformat(values[EVENT_DATE_COLUMN]) <= last))
        return rows.read(scheme.name, condition, keep, self.max_rows)

    def count_units(self, rows: Rows, scheme: Any) -> list[tuple[datetime | None, int, datetime | None]]:
        """Per unit: its value (a window's end, the start of a period), its rows and its first
        window start; the rows without a unit under None."""
        found: dict[datetime | None, list[Any]] = {}
        if rows.count() == 0:
            return []
        values = rows.table.column(scheme.name).to_pylist()
        starts = rows.table.column(WINDOW_START).to_pylist() if scheme.kind == "window" else [None] * len(values)
        for value, start in zip(values, starts, strict=True):
            if value is not None and scheme.period_ms is not None:
                micros = (value - datetime(1970, 1, 1)) // timedelta(microseconds=1)
                value = (EPOCH + timedelta(milliseconds=micros // 1000 // scheme.period_ms * scheme.period_ms)
                         ).replace(tzinfo=None)
            entry = found.setdefault(value, [0, None])
            entry[0] += 1
            if start is not None and (entry[1] is None or start < entry[1]):
                entry[1] = start
        return [(value, n, start) for value, (n, start) in found.items()]
