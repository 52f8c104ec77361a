"""Compare what a stream's sinks hold with the ground truth the generator wrote.

Parquet sinks (and the quarantine) are read through ``spark.read`` of the sink root,
which honours the file sink's ``_spark_metadata`` log: only committed files count, never
orphans of a crash. Table sinks are read straight from the database with the standard
drivers (``sqlite3``, ``psycopg``), ``SELECT *`` of the sink's table, not through the
writer that filled them. Every output is compared by its result key: rows missing, rows
that should not be there, rows present more than once, and rows whose values differ
(floats within a tolerance; approximate aggregates within 15%, three times the standard
error of Spark's HyperLogLog++ at its default precision, or for a few dozen values within the
values that share one of its registers: see ``_close``).

The quarantine is compared by content with the manifest's ``quarantine`` list, as a
multiset of (file name, record text): records missing, unexpected or present more
often than written, and records quarantined for another reason than the ground truth's.
Two forms of a record's text count as the same (see :func:`record_key`): invalid UTF-8
(the ledger writes ``\\xff``, the quarantine's ``raw`` holds U+FFFD), and a record Spark could
parse but rejected, which it keeps as its parsed values in JSON rather than as written.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections import Counter
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote, urlsplit

from runner.testdata import groundtruth as gt
from spark_jobs.plan import QUARANTINE_DDL, DeltaDataset, OutputPlan, ParquetDataset, StreamPlan, TableDataset
from spark_jobs.runtime.clock import iso_ms
from spark_jobs.stream_spec.models import CODE_QUERIES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

EXAMPLES = 5
SQLITE_BUSY_TIMEOUT_SECONDS = 60.0
PG_CONNECT_TIMEOUT_SECONDS = 15
#: Quarantine columns compared (``quarantined_at`` is when, not what).
QUARANTINE_COLUMNS = ("raw", "reason", "source_file")
#: where a quarantined Kafka record was: ``topic/partition@offset``
KAFKA_POSITION = re.compile(r"^[A-Za-z0-9._-]+/\d+@\d+$")


def normalize(value: Any) -> Any:
    """Sink values in the manifest's representation (ISO-8601 UTC with milliseconds)."""
    if isinstance(value, datetime):
        return iso_ms(value)
    if isinstance(value, date):
        return value.isoformat()
    return value


# ---- reading sinks -----------------------------------------------------------------------------------


def _read_parquet(spark: SparkSession, path: str, columns: tuple[str, ...] = (),
                  schema: str | None = None) -> list[dict[str, Any]]:
    """Committed rows of a file sink (read with ``schema`` if given: a column a file lacks is
    null); an absent sink is an empty one."""
    try:
        frame = (spark.read.schema(schema) if schema else spark.read).parquet(path)
        rows = (frame.select(*columns) if columns else frame).collect()
    except Exception as exc:  # an absent sink is an empty one
        if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return []
        raise
    return [r.asDict() for r in rows]


def _read_delta(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    """The latest version of a Delta table; an absent table is an empty one."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        return []
    return [r.asDict() for r in spark.read.format("delta").load(path).collect()]


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


#: the sinks whose rows can be read back and compared
READABLE_SINKS = (ParquetDataset, DeltaDataset, TableDataset)


def read_output(spark: SparkSession, output: OutputPlan) -> list[dict[str, Any]]:
    """The rows an output's sink holds (its plan: every path and URL resolved), values normalized."""
    sink = output.sink
    if isinstance(sink, ParquetDataset):
        return [{k: normalize(v) for k, v in r.items()} for r in _read_parquet(spark, sink.path)]
    if isinstance(sink, DeltaDataset):
        return [{k: normalize(v) for k, v in r.items()} for r in _read_delta(spark, sink.path)]
    if isinstance(sink, TableDataset):
        return read_table(sink.url, sink.table)
    raise ValueError(f"output {output.name}: the {sink.kind} sink cannot be read back")


def quarantine_path(plan: StreamPlan) -> str | None:
    """The stream's quarantine table, if its ingestion keeps one."""
    return plan.ingestion.quarantine if plan.ingestion is not None else None


def read_quarantine(spark: SparkSession, plan: StreamPlan) -> list[dict[str, Any]]:
    """The quarantine's rows (raw, reason, source_file); none without a quarantine. Read with
    the quarantine's schema, so that one written before ``raw_bytes`` existed reads alike."""
    path = quarantine_path(plan)
    if path is None:
        return []
    return _read_parquet(spark, path, QUARANTINE_COLUMNS, QUARANTINE_DDL)


def count_quarantined(spark: SparkSession, plan: StreamPlan) -> int:
    path = quarantine_path(plan)
    if path is None:
        return 0
    try:
        return spark.read.parquet(path).count()
    except Exception as exc:  # an absent sink is an empty one
        if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
            return 0
        raise


# ---- comparing outputs ------------------------------------------------------------------------------


def _close(a: Any, b: Any, approximate: bool) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) or not isinstance(b, int | float):
        return a == b
    if approximate:
        # HyperLogLog++ at Spark's default precision keeps 512 registers; below a few hundred values
        # it counts the registers in use, so two values of the window that share a register count
        # once. The input's values are a fixed set (200 users), so such a pair undercounts every
        # window holding both: about n * n / 1024 pairs expected, a few more in the tail
        return abs(a - b) <= max(1.0, 0.15 * abs(b), 3.0 + b * b / 1024)
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
    #: rows not compared: windows an accepted row near the watermark may have reached after
    #: the output's own watermark closed them (see groundtruth's note on ``late_edge``)
    uncompared: int = 0

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicated or self.different)

    def describe(self) -> str:
        aside = f" ({self.uncompared} uncertain window(s) not compared)" if self.uncompared else ""
        if self.ok:
            return f"{self.name}: {self.actual} rows, equal to the ground truth{aside}"
        parts = [f"{self.name}: {self.actual} rows, expected {self.expected}{aside}"]
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

    uncertain = {tuple(u) for u in expected.get("uncertain", [])}
    actual = [r for r in actual if k(r) not in uncertain]
    want = {k(r): r for r in expected["rows"] if k(r) not in uncertain}
    counts = Counter(k(r) for r in actual)
    got = {k(r): r for r in actual}
    report = OutputReport(name, expected=len(want), actual=len(actual), uncompared=len(uncertain))
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


# ---- comparing the quarantine -----------------------------------------------------------------------

#: The quarantine's reason text (spark_jobs.flows.ingestion) -> the generator's reason kind.
REASON_KINDS = (
    ("not valid UTF-8", "invalid_utf8"),
    ("not a JSON object", "truncated"),
    ("does not match the column type", "wrong_type"),
    ("fewer fields than", "too_few_fields"),
    ("more fields than", "too_many_fields"),
    ("missing required field", "missing_required"),
    ("event time too far in the future", "future"),
)
_KNOWN_KINDS = {kind for _, kind in REASON_KINDS}
# runs of bytes that were not UTF-8: escaped by the ledger (\xff), replaced in the quarantine's raw (U+FFFD)
_NOT_UTF8 = re.compile(r"(?:\\x[89a-fA-F][0-9a-fA-F]|\ufffd)+")


def reason_kind(reason: str | None) -> str | None:
    """The kind of a quarantine reason text (``wrong_type``, ``future``, ...), None if unknown."""
    for text, kind in REASON_KINDS:
        if reason and text in reason:
            return kind
    return None


def file_name(source_file: str | None) -> str | None:
    """``file:///data/landing/part-000004.json`` -> ``part-000004.json``; a Kafka record's
    position (``clicks/2@15``) as it is."""
    if source_file is None:
        return None
    if KAFKA_POSITION.match(source_file):
        return source_file
    return unquote(urlsplit(source_file).path).rstrip("/").rsplit("/", 1)[-1]


def record_key(raw: str | None, columns: Mapping[str, str]) -> str | None:
    """A quarantined record's text in a form both sides share.

    Runs of invalid UTF-8 become one U+FFFD. A JSON object whose keys are input columns
    and whose values have the columns' types (what Spark keeps of a record it parsed:
    ``to_json`` of the values, nulls left out) becomes its non-null typed values; any
    other text stays as it is.
    """
    if raw is None:
        return None
    text = _NOT_UTF8.sub("\ufffd", raw)
    try:
        obj = json.loads(text)
    except ValueError:
        return text
    if not isinstance(obj, dict) or not set(obj) <= set(columns):
        return text
    try:
        values = {c: gt.convert(v, columns[c]) for c, v in obj.items()}
    except (TypeError, ValueError):
        return text
    return json.dumps({c: v for c, v in values.items() if v is not None}, sort_keys=True)


@dataclass
class QuarantineReport:
    """The quarantine against the ground truth; records are named ``(file name, raw)``."""

    expected: int
    actual: int
    missing: list[tuple[str | None, str | None]] = field(default_factory=list)
    unexpected: list[tuple[str | None, str | None]] = field(default_factory=list)
    duplicated: list[tuple[str | None, str | None]] = field(default_factory=list)
    #: (record, reason kinds found, reason kinds expected)
    different: list[tuple[tuple[str | None, str | None], list, list]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicated or self.different)

    def describe(self) -> str:
        if self.ok:
            return f"quarantine: {self.actual} records, equal to the ground truth"
        parts = [f"quarantine: {self.actual} records, expected {self.expected}"]
        for label, items in (("missing", self.missing), ("unexpected", self.unexpected),
                             ("duplicated", self.duplicated), ("with another reason", self.different)):
            if items:
                parts.append(f"{len(items)} {label}, e.g. {items[:EXAMPLES]}")
        return "; ".join(parts)


def compare_quarantine(expected: list[dict[str, Any]], actual: list[dict[str, Any]],
                       columns: Mapping[str, str]) -> QuarantineReport:
    """The quarantine's rows (raw, reason, source_file) against the manifest's ``quarantine``
    entries (name, raw, reason), as multisets of (file name, record).

    A record is missing if the quarantine holds it fewer times than the ground truth,
    duplicated if more often, unexpected if the ground truth has no such record, and
    different if its reason is of another kind than the ground truth's. File names are
    compared only if the manifest names every record's file.
    """
    by_name = all(e.get("name") is not None for e in expected)
    shown: dict[tuple, tuple[str | None, str | None]] = {}

    def key(name: str | None, raw: str | None) -> tuple:
        k = (name if by_name else None, record_key(raw, columns))
        shown.setdefault(k, (name, raw))
        return k

    want: dict[tuple, list[str | None]] = {}
    for e in expected:
        want.setdefault(key(e.get("name"), e.get("raw")), []).append(e.get("reason"))
    got: dict[tuple, list[str | None]] = {}
    for r in actual:
        got.setdefault(key(file_name(r.get("source_file")), r.get("raw")), []).append(reason_kind(r.get("reason")))

    report = QuarantineReport(expected=len(expected), actual=len(actual))
    for k in sorted(want.keys() | got.keys(), key=repr):
        w, g = want.get(k, []), got.get(k, [])
        if len(g) < len(w):
            report.missing.extend([shown[k]] * (len(w) - len(g)))
        elif len(g) > len(w):
            (report.duplicated if w else report.unexpected).extend([shown[k]] * (len(g) - len(w)))
        # reasons are compared where the ground truth knows every one (a hand-written ledger may not)
        if w and g and all(r in _KNOWN_KINDS for r in w) and set(g) != set(w):
            report.different.append((shown[k], sorted(g, key=str), sorted(w)))
    return report


# ---- a whole stream ---------------------------------------------------------------------------------


@dataclass
class StreamReport:
    stream: str
    outputs: list[OutputReport]
    quarantined: int
    expected_quarantined: int
    #: None if the stream has no quarantine or the manifest lists no quarantined records
    quarantine: QuarantineReport | None = None
    #: per output, the keys of the windows not compared (see OutputReport.uncompared)
    uncertain: dict[str, list] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (all(o.ok for o in self.outputs) and self.quarantined == self.expected_quarantined
                and (self.quarantine is None or self.quarantine.ok))

    def describe(self) -> str:
        lines = [o.describe() for o in self.outputs]
        if self.quarantine is not None:
            lines.append(self.quarantine.describe())
        else:
            mark = "equal to" if self.quarantined == self.expected_quarantined else "DIFFERENT from"
            lines.append(f"quarantine: {self.quarantined} records, {mark} the {self.expected_quarantined} expected"
                         " (compared by count only)")
        return "\n".join(lines)


def compare(spark: SparkSession, plan: StreamPlan, manifest: dict[str, Any]) -> StreamReport:
    """Every sink of the stream (its plan: as ``analysis.resolve_plan`` gives it, for a stream
    with a transform) against the manifest's expected outputs, and the quarantine against its
    expected records. A manifest with ``late_edge`` records left undecided is first completed
    with the ingestion's decisions (:func:`decide_edges`)."""
    manifest = decide_edges(spark, plan, manifest)
    reports = []
    for output in plan.outputs:
        if isinstance(output.sink, READABLE_SINKS) and output.name in manifest["outputs"]:
            reports.append(compare_rows(output.name, manifest["outputs"][output.name], read_output(spark, output)))
    rows = read_quarantine(spark, plan)
    quarantine = None
    if quarantine_path(plan) is not None and manifest.get("quarantine") is not None:
        quarantine = compare_quarantine(manifest["quarantine"], rows, gt.input_types(plan))
    uncertain = {name: o["uncertain"] for name, o in manifest["outputs"].items() if o.get("uncertain")}
    return StreamReport(plan.stream, reports, len(rows), manifest["counts"]["quarantined"], quarantine, uncertain)


def _accepted_rows(spark: SparkSession, plan: StreamPlan) -> DataFrame:
    """The stream's committed accepted rows, in batch."""
    from spark_jobs import frames

    if plan.ingestion is None:
        raise ValueError(f"stream {plan.stream!r} keeps no accepted rows (its outputs all run continuously)")
    if plan.ingestion.accepted_columns is None:
        raise ValueError(f"stream {plan.stream!r}: its transform's columns are known once Spark has analyzed it; "
                         "pass the plan analysis.resolve_plan gives")
    return frames.accepted_batch(spark, plan.ingestion)


def decide_edges(spark: SparkSession, plan: StreamPlan, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest, recomputed from its ledger with the ingestion's decision on every
    ``late_edge`` record (accepted if its key is among the committed accepted rows), if it
    left any undecided; else the manifest itself. ``plan``: as for :func:`compare`."""
    if not manifest["counts"].get("undecided"):
        return manifest
    dedup_key = gt.deduplication_key(plan)
    assert dedup_key is not None  # the generator makes late_edge records only for such streams
    records = gt.read_ledger(manifest["generator"]["ledger"])
    types, key = gt.input_types(plan), list(dedup_key)

    def internal(values: Any) -> tuple:
        return tuple(gt.convert(normalize(v), types[c]) for c, v in zip(key, values, strict=True))

    edges = [internal([r["event"].get(c) for c in key]) for r in records if r.get("kind") == gt.LATE_EDGE]
    accepted = {internal(list(row)) for row in _accepted_rows(spark, plan).select(*key).collect()}
    result = gt.expected(plan, records, files=manifest.get("files"), settings=manifest.get("settings"),
                         decided={e: e in accepted for e in edges})
    return {**result, "generator": manifest["generator"]}


def agreement(spark: SparkSession, plan: StreamPlan, uncertain: dict[str, list] | None = None) -> list[OutputReport]:
    """Every output against its query run as a batch over the stream's committed accepted
    rows: the outputs of a stream must agree with each other (they read the same rows).

    A windowed append output holds the windows its final watermark has closed; the others
    hold their whole result. The output the ingestion serves is the accepted-rows table
    itself, so it agrees by construction; it is compared all the same (its sink read as a
    sink), which costs a read and catches a sink that is not that table. ``uncertain``: per
    output, the keys of windows not compared (:attr:`StreamReport.uncertain`). Reports
    that are not ok say which rows differ. ``plan``: as for :func:`compare`."""
    from spark_jobs import frames
    from spark_jobs.runtime.checkpoint import (
        batch_watermark_ms,
        last_batch,
    )
    from spark_jobs.stream_spec.models import (
        WINDOW_END,
        Aggregation,
    )

    accepted = _accepted_rows(spark, plan)
    reports = []
    for output in plan.outputs:
        if not isinstance(output.sink, READABLE_SINKS) or isinstance(output.query, CODE_QUERIES):
            continue  # a SQL or Python query's closed results cannot be told from its open ones here
        frame = frames.output_frame(accepted, plan, output)
        q = output.query
        approximate = []
        if isinstance(q, Aggregation):
            approximate = [a.name for a in q.aggregates if a.fn == "approx_count_distinct"]
            if q.window is not None and output.mode == "append":
                checkpoint = plan.checkpoint(output.name)
                last = last_batch(checkpoint, "commits")
                watermark = batch_watermark_ms(checkpoint, last) if last is not None else None
                frame = frame.where(frame[WINDOW_END].cast("long") * 1000 <= (watermark or 0))
        rows = [{k: normalize(v) for k, v in r.asDict().items()} for r in frame.collect()]
        key = list(output.key) or list(frame.columns)
        expected = {"key": key, "rows": rows, "columns": list(frame.columns), "approximate": approximate,
                    "uncertain": (uncertain or {}).get(output.name, [])}
        reports.append(compare_rows(output.name, expected, read_output(spark, output)))
    return reports
