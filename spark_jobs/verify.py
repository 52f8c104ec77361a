"""Compare what a stream's sinks hold with the ground truth the generator wrote.

Parquet sinks (and the quarantine) are read through ``spark.read`` of the sink root,
which honours the file sink's ``_spark_metadata`` log: only committed files count, never
orphans of a crash. Table sinks are read straight from the database with the standard
drivers (``sqlite3``, ``psycopg``), ``SELECT *`` of the sink's table, not through the
writer that filled them. Every output is compared by its result key: rows missing, rows
that should not be there, rows present more than once, and rows whose values differ
(floats within a tolerance; approximate aggregates within 15%, three times the standard
error of Spark's HyperLogLog++ at its default precision).
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from spark_jobs.spec import Layout, Output, ParquetSink, StreamSpec, TableSink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXAMPLES = 5
SQLITE_BUSY_TIMEOUT_SECONDS = 60.0
PG_CONNECT_TIMEOUT_SECONDS = 15


def normalize(value: Any) -> Any:
    """Sink values in the manifest's representation (ISO-8601 UTC with milliseconds)."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    if isinstance(value, date):
        return value.isoformat()
    return value


# ---- reading sinks -----------------------------------------------------------------------------------


def _read_parquet(spark: SparkSession, path: str, columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Committed rows of a file sink; an absent sink is an empty one."""
    try:
        frame = spark.read.parquet(path)
        rows = (frame.select(*columns) if columns else frame).collect()
    except Exception as exc:  # noqa: BLE001 - an absent sink is an empty one
        if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return []
        raise
    return [r.asDict() for r in rows]


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sqlite_value(value: Any, declared: str) -> Any:
    """A value as the table sink stores it in SQLite -> the Python value it stands for.

    Timestamps are ISO text ``'YYYY-MM-DD HH:MM:SS.ffffff'`` (UTC), dates ISO text and
    booleans 0/1, under the declared types TIMESTAMP, DATE and BOOLEAN.
    """
    if value is None:
        return None
    if declared == "TIMESTAMP" and isinstance(value, str):
        return datetime.fromisoformat(value)
    if declared == "DATE" and isinstance(value, str):
        return date.fromisoformat(value)
    if declared == "BOOLEAN" and isinstance(value, int):
        return bool(value)
    return value


def _read_sqlite(path: str, table: str) -> list[dict[str, Any]]:
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=SQLITE_BUSY_TIMEOUT_SECONDS)
    with closing(conn):
        info = conn.execute(f"PRAGMA table_info({_quote(table)})").fetchall()
        if not info:
            return []
        declared = {name: str(type_).upper() for _, name, type_, *_ in info}
        cursor = conn.execute(f"SELECT * FROM {_quote(table)}")
        names = [d[0] for d in cursor.description]
        return [{n: _sqlite_value(v, declared[n]) for n, v in zip(names, row, strict=True)} for row in cursor]


def _read_postgres(url: str, table: str) -> list[dict[str, Any]]:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    extra = {} if "connect_timeout" in conninfo_to_dict(url) else {"connect_timeout": PG_CONNECT_TIMEOUT_SECONDS}
    with psycopg.connect(url, autocommit=True, **extra) as conn:
        if conn.execute("SELECT to_regclass(%s)", (_quote(table),)).fetchone()[0] is None:
            return []
        cursor = conn.execute(f"SELECT * FROM {_quote(table)}")  # timestamptz: aware datetimes
        names = [d.name for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor]


def read_table(url: str, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` in the database at ``url`` (``sqlite:///`` or ``postgresql://``),
    values normalized; a missing database or table is an empty sink."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "sqlite" and url.startswith("sqlite:///"):
        rows = _read_sqlite(url[len("sqlite:///"):].split("?", 1)[0], table)
    elif scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        rows = _read_postgres("postgresql://" + url.split("://", 1)[1], table)
    else:
        raise ValueError(f"table {table!r}: cannot read a {scheme or 'schemeless'} database URL;"
                         " use sqlite:////abs/path.db or postgresql://...")
    return [{k: normalize(v) for k, v in r.items()} for r in rows]


def read_output(spark: SparkSession, spec: StreamSpec, layout: Layout, output: Output) -> list[dict[str, Any]]:
    sink = output.sink
    if isinstance(sink, ParquetSink):
        return [{k: normalize(v) for k, v in r.items()} for r in _read_parquet(spark, layout.data(sink.path))]
    if isinstance(sink, TableSink):
        return read_table(layout.table_url(sink), sink.table)
    raise ValueError(f"output {output.name}: the {sink.type} sink cannot be read back")


def count_quarantined(spark: SparkSession, spec: StreamSpec, layout: Layout) -> int:
    if spec.quarantine is None:
        return 0
    try:
        return spark.read.parquet(layout.data(spec.quarantine.path)).count()
    except Exception as exc:  # noqa: BLE001
        if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return 0
        raise


# ---- comparing outputs ------------------------------------------------------------------------------


def _close(a: Any, b: Any, approximate: bool) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return a == b
    if approximate:
        return abs(a - b) <= max(1.0, 0.15 * abs(b))
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


@dataclass
class OutputReport:
    name: str
    expected: int
    actual: int
    missing: list[Any] = field(default_factory=list)
    unexpected: list[Any] = field(default_factory=list)
    duplicated: list[Any] = field(default_factory=list)
    different: list[tuple[Any, dict, dict]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicated or self.different)

    def describe(self) -> str:
        if self.ok:
            return f"{self.name}: {self.actual} rows, equal to the ground truth"
        parts = [f"{self.name}: {self.actual} rows, expected {self.expected}"]
        for label, items in (("missing", self.missing), ("unexpected", self.unexpected),
                             ("duplicated", self.duplicated), ("different", self.different)):
            if items:
                parts.append(f"{len(items)} {label}, e.g. {items[:EXAMPLES]}")
        return "; ".join(parts)


def compare_rows(name: str, expected: dict[str, Any], actual: list[dict[str, Any]]) -> OutputReport:
    key = expected["key"]
    approximate = set(expected.get("approximate", []))
    columns = expected.get("columns") or (list(expected["rows"][0]) if expected["rows"] else [])

    def k(row: dict[str, Any]) -> tuple:
        return tuple(row.get(c) for c in key)

    want = {k(r): r for r in expected["rows"]}
    counts = Counter(k(r) for r in actual)
    got = {k(r): r for r in actual}
    report = OutputReport(name, expected=len(expected["rows"]), actual=len(actual))
    report.duplicated = sorted((key_ for key_, n in counts.items() if n > 1), key=repr)
    report.missing = sorted((key_ for key_ in want if key_ not in got), key=repr)
    report.unexpected = sorted((key_ for key_ in got if key_ not in want), key=repr)
    for key_, w in want.items():
        g = got.get(key_)
        if g is None:
            continue
        diff = {c: (g.get(c), w.get(c)) for c in columns
                if c in w and not _close(g.get(c), w.get(c), c in approximate)}
        if diff:
            report.different.append((key_, {c: v[0] for c, v in diff.items()}, {c: v[1] for c, v in diff.items()}))
    return report


# ---- a whole stream ---------------------------------------------------------------------------------


@dataclass
class StreamReport:
    stream: str
    outputs: list[OutputReport]
    quarantined: int
    expected_quarantined: int

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs) and self.quarantined == self.expected_quarantined

    def describe(self) -> str:
        lines = [o.describe() for o in self.outputs]
        mark = "equal to" if self.quarantined == self.expected_quarantined else "DIFFERENT from"
        lines.append(f"quarantine: {self.quarantined} records, {mark} the {self.expected_quarantined} expected")
        return "\n".join(lines)


def compare(spark: SparkSession, spec: StreamSpec, layout: Layout, manifest: dict[str, Any]) -> StreamReport:
    """Every sink of the stream against the manifest's expected outputs."""
    reports = []
    for output in spec.outputs:
        if isinstance(output.sink, ParquetSink | TableSink):
            reports.append(compare_rows(output.name, manifest["outputs"][output.name],
                                        read_output(spark, spec, layout, output)))
    return StreamReport(spec.name, reports, count_quarantined(spark, spec, layout),
                        manifest["counts"]["quarantined"])
