"""Compare what a stream's sinks hold with the ground truth the generator wrote.

Parquet sinks are read through ``spark.read`` of the sink root, which honours the file
sink's ``_spark_metadata`` log: only committed files count, never orphans of a crash.
Table sinks are read from the database. Every output is compared by its result key:
rows missing, rows that should not be there, rows present more than once, and rows whose
values differ (floats within a tolerance; approximate aggregates within 15%, three times the standard error of Spark's
HyperLogLog++ at its default precision).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from spark_jobs.spec import Layout, Output, ParquetSink, StreamSpec, TableSink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

EXAMPLES = 5


def normalize(value: Any) -> Any:
    """Sink values in the manifest's representation (ISO-8601 UTC with milliseconds)."""
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    if isinstance(value, date):
        return value.isoformat()
    return value


def read_output(spark: SparkSession, spec: StreamSpec, layout: Layout, output: Output) -> list[dict[str, Any]]:
    sink = output.sink
    if isinstance(sink, ParquetSink):
        path = layout.data(sink.path)
        try:
            rows = spark.read.parquet(path).collect()
        except Exception as exc:  # noqa: BLE001 - an absent sink is an empty one
            if "PATH_NOT_FOUND" in str(exc) or "UNABLE_TO_INFER_SCHEMA" in str(exc):
                return []
            raise
        return [{k: normalize(v) for k, v in r.asDict().items()} for r in rows]
    if isinstance(sink, TableSink):
        from spark_jobs import ingest, pipeline

        frame = pipeline.output_frame(spark.createDataFrame([], ingest.accepted_ddl(spec)), spec, output)
        columns = [(f.name, pipeline.spec_type(f.dataType)) for f in frame.schema.fields]
        writer = pipeline.table_writer(columns, spec, output, layout, "reader")
        return [{k: normalize(v) for k, v in r.items()} for r in writer.read_all()]
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
