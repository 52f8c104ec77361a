"""Validate a stream's sinks with Great Expectations, closed unit by closed unit.

Units (see :class:`~spark_jobs.quality.rules.Target`):

* a windowed output: each window, once its batch is committed (in append mode a window
  reaches the sink only when the watermark has passed its end, so it is final);
* a pass-through output: each event-time period (``unit`` in the rules, default one
  hour) once the stream's watermark has passed its end and the output has taken every
  row the ingestion accepted before (:func:`~spark_jobs.runtime.checkpoint.watermark_seen_by`);
  the output the ingestion serves (its sink is the accepted-rows table) once the
  watermark of the ingestion's last committed batch has passed it;
* a table: its whole content, once per newly applied batch.

Only committed output is read: a Parquet sink through ``spark.read`` of its root, which
honours the file sink's ``_spark_metadata`` log (orphan files of a crash are ignored);
only units ending at or before the watermark of the last *committed* batch. The ledger
keeps the watermark validated up to, so a rerun neither repeats nor skips a unit.

Two engines read and validate the rows (``rows``): Spark (:class:`SparkRows`, the
``spark-submit`` job), or, without a JVM, pyarrow, ``deltalake`` and Great Expectations'
pandas engine (:class:`~spark_jobs.quality.pandas_engine.PandasRows`, in the Airflow task
itself), which gives the same results from the same rows with the same suites, or raises
:class:`~spark_jobs.quality.pandas_engine.NeedsSpark` before it validates anything.

All new units of an output are validated together (one data source per stream,
a batch definition, a suite, validation definitions and checkpoints with a Data Docs
action). A screening run only counts (``BOOLEAN_ONLY``, which Great Expectations bundles
into a few aggregations); only when a check fails does a detail run collect example
values and the unit of every failing row (``COMPLETE`` with unexpected index lists).
A failed table-level check fails every unit of the run. Data Docs go to ``<data root>/quality/<stream>/gx/uncommitted/data_docs/local_site/``.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_jobs import backfill, frames
from spark_jobs.plan import DeltaDataset, OutputPlan, ParquetDataset, StreamPlan
from spark_jobs.quality import accounting as acc
from spark_jobs.quality import closing
from spark_jobs.quality.ledger import Ledger
from spark_jobs.quality.pandas_engine import NeedsSpark
from spark_jobs.quality.rules import QualityRules, Target, rules_path, targets
from spark_jobs.runtime.checkpoint import (
    read_query_checkpoint,
    sink_last_batch,
)
from spark_jobs.runtime.clock import compact, epoch_ms, from_ms, iso, parse_iso, to_ms
from spark_jobs.runtime.progress import read_events
from spark_jobs.sinks import delta as delta_sink
from spark_jobs.sinks import delta_log
from spark_jobs.sinks import table as table_sink
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.models import (
    ACCEPTED_TABLE,
    CODE_QUERIES,
    INGEST_FLOW,
    WINDOW_START,
    SpecError,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_jobs.quality.pandas_engine import PandasRows

log = logging.getLogger(__name__)

EXAMPLES = 5
#: what precedes a failed check's example values in its description
EXAMPLES_PREFIX = ", e.g. "
#: Result format of every run: counts, a few example values, and the unit of each failing row.
RESULT_FORMAT = {"result_format": "COMPLETE", "partial_unexpected_count": EXAMPLES, "return_unexpected_index_query": False}


def docs_index(layout: Layout) -> Path:
    return layout.quality_dir / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"


def read_committed(spark: SparkSession, path: str) -> DataFrame | None:
    """A Parquet sink's committed rows, or None if nothing was committed yet."""
    try:
        return spark.read.parquet(path)
    except Exception as exc:  # an absent sink has nothing to validate
        text = f"{getattr(exc, 'getCondition', lambda: '')()} {exc}"
        if "PATH_NOT_FOUND" in text or "UNABLE_TO_INFER_SCHEMA" in text:
            return None
        raise


def expected_schema(spark: SparkSession, plan: StreamPlan, output: str) -> StructType:
    """The schema the output's query produces, from the stream's resolved plan
    (``analysis.resolve_plan``) over no rows."""
    from pyspark.sql import types as T

    assert plan.ingestion is not None
    empty = spark.createDataFrame([], plan.ingestion.accepted_ddl)
    frame = frames.output_frame(empty, plan, plan.output(output))
    return T.StructType(frame.schema.fields)


class UnknownRun(ValueError):
    """A validation run to repeat that the ledger keeps no unit of."""


class UnitScheme:
    """How the rows of a window or period output fall into units: a row's unit is its window's
    end (``window``), or the start of its event-time period (``period_ms`` long); ``key`` names
    a unit. The engines select and count the rows by it (:class:`SparkRows`)."""

    def __init__(self, target: Target):
        self.kind = target.kind
        self.name = target.unit_column
        self.period_ms = None if target.kind == "window" else int(target.unit_seconds * 1000)

    def key(self, value: Any) -> str | None:
        if not isinstance(value, datetime):
            return None
        if self.period_ms is None:
            return iso(value)
        return iso(from_ms(to_ms(value) // self.period_ms * self.period_ms))

    def bounds(self, value: datetime, start: datetime | None = None) -> tuple[datetime, datetime]:
        """A unit's start and end: a window's from its earliest ``window_start``."""
        if self.period_ms is None:
            return start or value, value
        return value, value + timedelta(milliseconds=self.period_ms)


class SparkRows:
    """The operations of a validation run on rows, with Spark (the ``spark-submit`` job)."""

    engine = "spark"

    def __init__(self, spark: SparkSession):
        self.spark = spark

    def schema(self, plan: StreamPlan, output: OutputPlan) -> StructType:
        return expected_schema(self.spark, plan, output.name)

    def datasource(self, context: Any, name: str) -> Any:
        return context.data_sources.add_or_update_spark(name=name)

    def validating(self, frame: DataFrame) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def batch(self, frame: DataFrame) -> DataFrame:
        return frame

    # -- reading

    def parquet(self, path: str) -> DataFrame | None:
        return read_committed(self.spark, path)

    def delta_latest_version(self, path: str) -> int | None:
        return delta_sink.latest_version(self.spark, path)

    def delta(self, path: str, version: int) -> DataFrame:
        return delta_sink.read_version(self.spark, path, version)

    def delta_last_batch(self, path: str, query_id: str | None, version: int) -> int | None:
        return delta_sink.last_batch(self.spark, path, query_id, version)

    def accepted_count(self, ingestion: Any, version: int) -> int:
        return frames.accepted_batch(self.spark, ingestion, version).count()

    # -- rows

    def count(self, frame: DataFrame) -> int:
        return frame.count()

    def column_sum(self, frame: DataFrame, column: str) -> int:
        return int(frame.agg({column: "sum"}).collect()[0][0] or 0)

    def select(self, frame: DataFrame, names: list[str]) -> DataFrame:
        return frame.select(*names)

    def from_rows(self, rows: list[dict[str, Any]], schema: StructType) -> DataFrame:
        return self.spark.createDataFrame([tuple(r[f.name] for f in schema.fields) for r in rows], schema)

    def _value(self, scheme: UnitScheme) -> Column:
        from pyspark.sql import functions as F

        column = F.col(scheme.name)
        if scheme.period_ms is None:
            return column
        return F.timestamp_millis(F.floor(F.unix_millis(column) / scheme.period_ms) * scheme.period_ms)

    def closed_between(self, frame: DataFrame, scheme: UnitScheme, lo_ms: int | None, hi_ms: int) -> DataFrame:
        """The rows of the units that closed after ``lo_ms`` (None: from the first) up to
        ``hi_ms`` (a window by its end, a period once it has ended), and the rows without a unit."""
        from pyspark.sql import functions as F

        column = F.col(scheme.name)
        if scheme.period_ms is None:
            closed = column <= F.timestamp_millis(F.lit(hi_ms))
            if lo_ms is not None:
                closed = closed & (column > F.timestamp_millis(F.lit(lo_ms)))
        else:
            p = scheme.period_ms
            closed = column < F.timestamp_millis(F.lit(hi_ms // p * p))
            if lo_ms is not None:
                closed = closed & (column >= F.timestamp_millis(F.lit(lo_ms // p * p)))
        return frame.where(closed | column.isNull())

    def named(self, frame: DataFrame, scheme: UnitScheme, keys: list[str]) -> DataFrame:
        """The rows of the units named ``keys``, and the rows without a unit."""
        from pyspark.sql import functions as F

        named = F.unix_millis(self._value(scheme)).isin([epoch_ms(k) for k in keys])
        return frame.where(named | F.col(scheme.name).isNull())

    def count_units(self, frame: DataFrame, scheme: UnitScheme) -> list[tuple[datetime | None, int, datetime | None]]:
        """Per unit: its value (a window's end, the start of a period), its rows and its first
        window start; the rows without a unit under None."""
        from pyspark.sql import functions as F

        window = scheme.kind == "window"
        starts = [F.min(WINDOW_START).alias("start")] if window else []
        counts = frame.groupBy(self._value(scheme).alias("unit")).agg(F.count(F.lit(1)).alias("count"), *starts).collect()
        return [(row["unit"], row["count"], row["start"] if window else None) for row in counts]


class Validator:
    """One validation run of one stream."""

    def __init__(self, spark: SparkSession | None, plan: StreamPlan, layout: Layout, rules: QualityRules,
                 run_id: str | None = None, rows: SparkRows | PandasRows | None = None):
        """``plan``: the stream's, its transform analyzed (``analysis.resolve_plan``; without Spark,
        ``compile_plan`` for a stream without one). ``spark``: the session of the Spark engine; None
        with ``rows``, the engine (e.g. :class:`~spark_jobs.quality.pandas_engine.PandasRows`)."""
        if rows is None:
            if spark is None:
                raise ValueError("a Validator needs a Spark session or the engine that reads its rows")
            rows = SparkRows(spark)
        self.rows = rows
        self.plan, self.layout, self.rules = plan, layout, rules
        self.run_id = run_id or f"{compact(datetime.now(UTC))}-{uuid.uuid4().hex[:6]}"
        self.dir = layout.quality_dir
        self.ledger = Ledger(self.dir / "ledger.json")
        self.rules_file = str(rules_path(layout.spec_dir, plan.stream))
        self._suites: dict[str, Any] = {}  # stored once per run, shared by the screening and detail runs
        self._checkpoints: dict[str, Any] = {}
        self._schemas: dict[str, StructType] = {}
        #: the version of each Delta table this run reads: the first read's, so that its
        #: validation and its accounting see the same rows
        self._versions: dict[str, int] = {}

    @property
    def spark(self) -> SparkSession:
        """The Spark engine's session (backfills and runs again are validated with Spark only)."""
        if not isinstance(self.rows, SparkRows):
            raise NeedsSpark("backfilled ranges and earlier runs are validated with Spark")
        return self.rows.spark

    @property
    def spark_rows(self) -> SparkRows:
        self.spark  # noqa: B018 - NeedsSpark with another engine
        assert isinstance(self.rows, SparkRows)
        return self.rows

    @property
    def engine(self) -> str:
        return self.rows.engine

    @cached_property
    def context(self) -> Any:  # a Great Expectations FileDataContext
        """The stream's Great Expectations project, opened when the first check runs."""
        import great_expectations as gx

        context = gx.get_context(mode="file", project_root_dir=str(self.dir))
        context.variables.progress_bars = {"globally": False}
        return context

    @cached_property
    def source(self) -> Any:  # a data source of the engine's kind, named for the stream
        return self.rows.datasource(self.context, self.plan.stream)

    def schema(self, output: OutputPlan) -> StructType:
        if output.name not in self._schemas:
            self._schemas[output.name] = self.rows.schema(self.plan, output)
        return self._schemas[output.name]

    # ---- Great Expectations objects ----------------------------------------------------

    def _expectations(self, target: Target, schema: StructType) -> list[Any]:
        from great_expectations.expectations.registry import get_expectation_impl

        name = target.output.name
        made = []
        platform = {"source": "platform (from the stream spec)"}
        checks = [(n, kw, platform, None) for n, kw in target.derived]
        if target.output.columns is None:  # its columns are those of Spark's schema of the query
            checks.append(("expect_table_columns_to_match_set",
                           {"column_set": [f.name for f in schema.fields], "exact_match": True}, platform, None))
        checks += [("expect_column_values_to_be_of_type", {"column": f.name, "type_": type(f.dataType).__name__},
                    platform, None) for f in schema.fields]
        checks += [(n, kw, {"source": self.rules_file}, f"outputs.{name}.expectations[{i}].{n}")
                   for i, (n, kw) in enumerate(target.declared)]
        for exp, kwargs, meta, where in checks:
            try:
                cls = get_expectation_impl(exp)
            except Exception:  # GE raises its own error types
                raise SpecError(self.rules_file, [(where or exp, f"{exp!r} is not a Great Expectations expectation")]) from None
            try:
                made.append(cls(**kwargs, meta=meta))
            except Exception as exc:
                raise SpecError(self.rules_file, [(where or exp, f"invalid arguments for {exp}: {exc}")]) from None
        if target.freshness_seconds and target.unit_column:
            made.append(get_expectation_impl("expect_column_max_to_be_between")(
                column=target.unit_column, min_value={"$PARAMETER": "fresh_after"},
                meta={"source": self.rules_file, "scope": "output", "check": "freshness"}))
        return made

    def checkpoint(self, target: Target, schema: StructType, label: str = "", detail: bool = False) -> Any:
        """The output's suite, validation definition and checkpoint, (re)stored in the context.

        ``detail``: the checkpoint that reports example values and the unit of every failing
        row (``COMPLETE``); else the screening one, which only counts (``BOOLEAN_ONLY``: Great
        Expectations bundles every check into a few aggregations). ``label`` names a separate
        asset, e.g. ``backfill``.
        """
        import great_expectations as gx

        base = f"{self.plan.stream}.{target.output.name}" + (f".{label}" if label else "")
        name = base + (".details" if detail else "")
        if name in self._checkpoints:
            return self._checkpoints[name]
        asset_name = target.output.name + (f".{label}" if label else "")
        try:
            asset = self.source.get_asset(asset_name)
        except LookupError:
            asset = self.source.add_dataframe_asset(asset_name)
        try:
            batch = asset.get_batch_definition("rows")
        except KeyError:
            batch = asset.add_batch_definition_whole_dataframe("rows")
        suite_name = f"{self.plan.stream}.{target.output.name}"
        if suite_name not in self._suites:
            self._suites[suite_name] = self.context.suites.add_or_update(
                gx.ExpectationSuite(name=suite_name, expectations=self._expectations(target, schema)))
        suite = self._suites[suite_name]
        vd = self.context.validation_definitions.add_or_update(gx.ValidationDefinition(name=name, data=batch, suite=suite))
        result_format: dict[str, Any] = dict(RESULT_FORMAT) if detail else {"result_format": "BOOLEAN_ONLY"}
        if detail and target.unit_column:
            result_format["unexpected_index_column_names"] = [target.unit_column]
        self._checkpoints[name] = self.context.checkpoints.add_or_update(gx.Checkpoint(
            name=name, validation_definitions=[vd], result_format=result_format,
            actions=[gx.checkpoint.UpdateDataDocsAction(name="data_docs")]))
        return self._checkpoints[name]

    # ---- one validation of a batch of units, its results attributed to units -------------------

    def validate_units(self, target: Target, schema: StructType, frame: DataFrame, units: dict[str, dict[str, Any]],
                       unit_of: Any, parameters: dict[str, Any], label: str = "") -> tuple[list[str], str | None]:
        """Validate ``frame`` (the rows of ``units``); mark each unit passed or failed.

        A screening run counts; only if a check fails does a second run collect the detail
        (example values, the unit of each failing row). Both results go to Data Docs.
        Returns output-level problems (freshness) and the Data Docs page of the result.
        """
        with self.rows.validating(frame):
            screen = self.checkpoint(target, schema, label).run(batch_parameters={"dataframe": self.rows.batch(frame)},
                                                                expectation_parameters=parameters)
        if screen.success:
            docs = next((self._docs_path(i) for i in screen.run_results), None)
            for u in units.values():
                u["status"], u["docs"] = "passed", docs
            return [], docs
        detail = self.checkpoint(target, schema, label, detail=True)
        with self.rows.validating(frame):
            result = detail.run(batch_parameters={"dataframe": self.rows.batch(frame)}, expectation_parameters=parameters)
        return self._attribute(result, units, unit_of, target.unit_column)

    def _attribute(self, result: Any, units: dict[str, dict[str, Any]], unit_of: Any,
                   unit_column: str | None) -> tuple[list[str], str | None]:
        output_problems: list[str] = []
        docs = None
        for identifier, vr in result.run_results.items():
            docs = self._docs_path(identifier)
            for r in vr.results:
                if r.success:
                    continue
                cfg = r.expectation_config
                label = _label(cfg.type, cfg.kwargs)
                res = r.result or {}
                error = _exception(r.exception_info)
                detail = f"{label}: {error}" if error else _describe(label, res)
                if (cfg.meta or {}).get("scope") == "output":
                    output_problems.append(detail)
                    continue
                index = res.get("unexpected_index_list")
                if error or not index or unit_column is None:
                    for u in units.values():
                        u["failed"].append(detail)
                    continue
                hits: dict[str | None, int] = {}
                for row in index:
                    key = unit_of(row.get(unit_column)) if isinstance(row, dict) else None
                    hits[key] = hits.get(key, 0) + 1
                for key, n in hits.items():
                    for u in ([units[key]] if key in units else units.values()):
                        u["failed"].append(f"{label}: {n} of {u['rows']} rows unexpected"
                                           + _examples(res))
        for u in units.values():
            u["status"] = "failed" if u["failed"] else "passed"
            u["docs"] = docs
        return output_problems, docs

    def _docs_path(self, identifier: Any) -> str | None:
        try:
            url = self.context.get_docs_sites_urls(resource_identifier=identifier)[0]["site_url"]
        except Exception:  # a missing link must not fail the validation
            return None
        root = str(docs_index(self.layout).parent)
        path = url.removeprefix("file://")
        return path[len(root) + 1:] if path.startswith(root) else None

    def _unit_record(self, unit: str, start: datetime | None, end: datetime | None, rows: int,
                     version: int | None = None) -> dict[str, Any]:
        """A unit's record in the ledger; ``version``: the Delta table's version its rows were read at."""
        record = {"unit": unit, "start": iso(start) if start else None, "end": iso(end) if end else None,
                  "rows": rows, "status": "pending", "failed": [], "run": self.run_id,
                  "validated_at": iso(datetime.now(UTC))}
        return record | ({"version": version} if version is not None else {})

    def _sink_rows(self, output: OutputPlan, version: int | None = None) -> tuple[DataFrame | None, int | None]:
        """An output's committed rows: a Parquet sink's through its log; a Delta table's as of
        ``version`` (default: the version this run read it at first, its newest then), which
        is returned with them: a unit validated again at that version sees the same rows,
        whatever was written since."""
        assert isinstance(output.sink, ParquetDataset | DeltaDataset)
        path = output.sink.path
        if not isinstance(output.sink, DeltaDataset):
            return self.rows.parquet(path), None
        if version is None:
            version = self._versions.get(output.name)
        if version is None:
            version = self.rows.delta_latest_version(path)
            if version is None:
                return None, None
            self._versions[output.name] = version
        return self.rows.delta(path, version), version

    # ---- closed units of the live sinks -------------------------------------------------------

    def validate_output(self, target: Target) -> dict[str, Any]:
        return self.prepare_output(target)()

    def prepare_output(self, target: Target) -> Callable[[], dict[str, Any]]:
        """Read what closed in the output since the last run; the validation of it, to run.

        Nothing is validated or recorded until it runs: an engine that cannot validate the rows
        (:class:`~spark_jobs.quality.pandas_engine.NeedsSpark`) says so here, before any output's
        validation has begun."""
        output = target.output
        ckpt = read_query_checkpoint(self._checkpoint_of(output), with_files=False)
        entry = self.ledger.output(output.name, ckpt.query_id)
        report: dict[str, Any] = {"output": output.name, "kind": target.kind, "units": [], "problems": []}
        done = lambda: report  # noqa: E731
        if ckpt.last_committed is None:
            report["note"] = "no batch committed yet"
            return done
        schema = self.schema(output)
        if target.kind == "snapshot":
            return self._prepare_snapshot(target, schema, ckpt.query_id, entry, report)

        wm_ms = closing.closed(self.plan, target).through_ms or 0  # how far its units are final
        prev_ms = entry.get("watermark_ms")
        frame, version = self._sink_rows(output)
        report["watermark"] = iso(from_ms(wm_ms)) if wm_ms else None
        if version is not None:
            report["version"] = version
        if frame is None or wm_ms <= 0 or (prev_ms is not None and wm_ms <= prev_ms):
            report["note"] = "no unit closed since the last run"
            self._check_stale(target, entry, wm_ms, report)
            return done

        units_of = UnitScheme(target)
        batch = self.rows.closed_between(frame, units_of, prev_ms, wm_ms)
        units, unplaced = self._count_units(units_of, batch, version)
        if not units and not unplaced:
            entry["watermark_ms"] = wm_ms
            report["note"] = "no rows in the units closed since the last run"
            self._check_stale(target, entry, wm_ms, report)
            return done
        if unplaced:
            report["problems"].append(_unplaced(target, unplaced))
        fresh_after = from_ms(wm_ms) - timedelta(seconds=target.freshness_seconds or 0)

        def validate() -> dict[str, Any]:
            started = time.monotonic()
            problems, docs = self.validate_units(target, schema, batch, units, units_of.key,
                                                 {"fresh_after": fresh_after.replace(tzinfo=None)})
            report["seconds"] = round(time.monotonic() - started, 2)
            report["problems"] += [f"freshness: {p}" for p in problems]
            report["units"] = sorted(units.values(), key=lambda u: u["unit"])
            report["docs"] = docs
            self.ledger.record_units(output.name, report["units"])
            entry["watermark_ms"] = wm_ms
            return report

        return validate

    def _count_units(self, units_of: UnitScheme, batch: Any, version: int | None,
                     ) -> tuple[dict[str, dict[str, Any]], int]:
        """The units ``batch`` holds rows of, each with its bounds and rows; and how many of its
        rows belong to no unit (no value in the unit column)."""
        units: dict[str, dict[str, Any]] = {}
        unplaced = 0
        for value, count, first_start in self.rows.count_units(batch, units_of):
            if value is None:
                unplaced += count
                continue
            start, end = units_of.bounds(value, first_start)
            key = units_of.key(value)
            units[key] = self._unit_record(key, start, end, count, version)
        return units, unplaced

    def _check_stale(self, target: Target, entry: dict[str, Any], wm_ms: int, report: dict[str, Any]) -> None:
        """Freshness when no unit closed: the newest validated unit against the watermark."""
        if not target.freshness_seconds or not wm_ms or not entry["units"]:
            return
        newest = max(u["end"] for u in entry["units"].values() if u.get("end"))
        behind = from_ms(wm_ms) - parse_iso(newest)
        if behind.total_seconds() > target.freshness_seconds:
            report["problems"].append(f"freshness: the newest closed unit ends {newest}, {behind} before the "
                                      f"watermark (allowed: {timedelta(seconds=target.freshness_seconds)})")

    def _prepare_snapshot(self, target: Target, schema: StructType, query_id: str | None,
                          entry: dict[str, Any], report: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        if isinstance(target.output.sink, DeltaDataset):
            return self._prepare_delta_snapshot(target, schema, query_id, entry, report)
        writer = self._table_writer(target.output, schema, query_id)
        for _ in range(5):  # a batch applied while reading: read again
            applied = writer.applied_batches()
            rows = writer.read_all()
            if writer.applied_batches() == applied:
                break
        last = applied[-1] if applied else None
        if last is None or last == entry.get("snapshot_batch"):
            report["note"] = "no batch applied since the last run"
            return lambda: report
        unit = f"batch {last}"
        units = {unit: self._unit_record(unit, None, None, len(rows))}
        frame = self.rows.from_rows(rows, schema)
        return self._snapshot_validation(target, schema, frame, units, unit, last, entry, report)

    def _prepare_delta_snapshot(self, target: Target, schema: StructType, query_id: str | None,
                                entry: dict[str, Any], report: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        """A Delta table whole, as of its newest version: the unit is the last batch it holds."""
        output = target.output
        frame, version = self._sink_rows(output)
        last = None if version is None else self.rows.delta_last_batch(output.sink.path, query_id, version)
        if frame is None or last is None or last == entry.get("snapshot_batch"):
            report["note"] = "no batch applied since the last run"
            return lambda: report
        unit = f"batch {last}"
        report["version"] = version
        batch = self.rows.select(frame, list(schema.names))
        units = {unit: self._unit_record(unit, None, None, self.rows.count(batch), version)}
        return self._snapshot_validation(target, schema, batch, units, unit, last, entry, report)

    def _snapshot_validation(self, target: Target, schema: StructType, frame: Any,
                             units: dict[str, dict[str, Any]], unit: str, last: int, entry: dict[str, Any],
                             report: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        def validate() -> dict[str, Any]:
            started = time.monotonic()
            _, docs = self.validate_units(target, schema, frame, units, lambda _v: unit, {})
            report["seconds"] = round(time.monotonic() - started, 2)
            report["units"], report["docs"] = list(units.values()), docs
            self.ledger.record_units(target.output.name, report["units"])
            entry["snapshot_batch"] = last
            return report

        return validate

    def _table_writer(self, output: OutputPlan, schema: StructType, query_id: str | None) -> Any:

        columns = [(f.name, table_sink.spec_type(f.dataType)) for f in schema.fields]
        return table_sink.table_writer(columns, output, table_sink.table_sink_id(self.plan.stream, output.name, query_id))

    # ---- backfilled ranges ------------------------------------------------------------------

    def validate_backfill(self, target: Target, label: str) -> dict[str, Any]:
        """Validate one backfilled range of an output as a whole (it is replaced whole on a rerun)."""
        output = target.output
        report: dict[str, Any] = {"output": output.name, "kind": "backfill", "units": [], "problems": []}
        in_table = backfill.delta_record(self.layout, output.name, label)
        if in_table is not None:  # rewritten in its Delta table: the range as of the version it wrote
            path = f"{in_table['table']} version {in_table['version']} where {in_table['condition']}"
            frame = delta_sink.read_version(self.spark, in_table["table"], in_table["version"]) \
                .where(in_table["condition"])
            report["version"] = in_table["version"]
        else:
            path = str(self.layout.backfill_dir(output.name) / label)
            frame = read_committed(self.spark, path)
        if frame is None:
            report["note"] = f"no backfill output at {path}"
            return report
        schema = self.schema(output)
        unit = f"backfill {label}"
        units = {unit: self._unit_record(unit, None, None, frame.count())}
        plain = Target(output, "backfill", None, None, None, target.derived, target.declared)
        started = time.monotonic()
        _, docs = self.validate_units(plain, schema, frame, units, lambda _v: unit, {}, label="backfill")
        report["seconds"] = round(time.monotonic() - started, 2)
        report["units"], report["docs"] = list(units.values()), docs
        self.ledger.record_backfill(output.name, units[unit])
        return report

    def _checkpoint_of(self, output: OutputPlan) -> str:
        return closing.checkpoint_of(self.plan, output.name)

    def _check_readable(self) -> None:
        """Before anything is validated: every Delta table the run reads (the accepted rows', the
        outputs') opens with the engine, at its newest version (which the run then reads)."""
        if isinstance(self.rows, SparkRows) or self.plan.ingestion is None:
            return
        for path in self.plan.delta_tables.values():
            version = self.rows.delta_latest_version(path)
            if version is not None:
                self.rows.delta(path, version)

    # ---- accounting ---------------------------------------------------------------------------

    def account(self) -> acc.StreamAccounting | None:
        """The stream's balance from its ingestion, then each output's (see accounting)."""
        if self.plan.ingestion is None:
            return None
        events = list(read_events(self.layout.events_file))
        totals = self.ledger.data["totals"]

        def committed(query: str) -> tuple[acc.Totals, Any]:
            ck = read_query_checkpoint(self.plan.checkpoint(query), with_files=False)
            t = acc.fold(acc.Totals.from_dict(totals.get(query)), events, ck.query_id, ck.last_committed,
                         ingestion=query == INGEST_FLOW)
            totals[query] = t.to_dict()
            return t, ck

        ingested, ingestion_checkpoint = committed(INGEST_FLOW)
        accepted_rows, accepted_batch = self._accepted_table(ingested.through_batch, ingestion_checkpoint.query_id)
        quarantine_path = self.plan.ingestion.quarantine if self.plan.ingestion else None
        quarantine = self.rows.parquet(quarantine_path) if quarantine_path else None
        quarantined = 0 if quarantine is None else self.rows.count(quarantine)
        balances = [acc.ingestion_balance(
            ingested, accepted_rows, accepted_batch,
            quarantined, sink_last_batch(quarantine_path) if quarantine_path else ingested.through_batch)]
        for output in self.plan.outputs:
            if output.written_by_ingestion:
                balances.append(acc.written_by_ingestion_balance(output.name, ingested, accepted_rows, accepted_batch))
                continue
            t, ck = committed(output.name)
            measure = acc.accepted_measure(output)
            measured, measured_batch = self._accepted(output, measure, ck.query_id)
            balances.append(acc.output_balance(output.name, t, measured, measured_batch, measure))
        return acc.StreamAccounting(ingested.input, quarantined, self.rules.max_quarantine_rate, balances)

    def _accepted_table(self, ingested_through: int, query_id: str | None) -> tuple[int, int | None]:
        """The rows the accepted-rows table holds, and the last ingestion batch they are of
        (called after the ingestion's checkpoint was read: ``ingested_through`` is its last
        committed batch). A Delta table is read at its newest version, pinned now: a batch
        that accepted no row made no version, so a version whose last batch is at or before
        the checkpoint's holds every batch through the checkpoint's."""
        ingestion = self.plan.ingestion
        assert ingestion is not None
        if not ingestion.accepted_is_delta:
            frame = self.rows.parquet(ingestion.accepted_path)
            return (0 if frame is None else self.rows.count(frame)), sink_last_batch(ingestion.accepted_path)
        version = self.rows.delta_latest_version(ingestion.accepted_path)
        if version is None:
            return 0, None
        self._versions[ACCEPTED_TABLE] = version
        rows = self.rows.accepted_count(ingestion, version)
        last = delta_log.last_batch(ingestion.accepted_path, query=query_id, through=version)
        return rows, (ingested_through if last is None or last <= ingested_through else last)

    def _accepted(self, output: OutputPlan, measure: str | None, query_id: str | None) -> tuple[int | None, int | None]:
        if measure is None:
            return None, None
        column = measure.removeprefix("sum:")
        if isinstance(output.sink, DeltaDataset):  # rows and last batch as of one version
            path = output.sink.path
            frame, version = self._sink_rows(output)
            if frame is None or version is None:
                return 0, None
            last = self.rows.delta_last_batch(path, query_id, version)
            if measure == "rows":
                return self.rows.count(frame), last
            return self.rows.column_sum(frame, column), last
        if measure == "rows":
            assert isinstance(output.sink, ParquetDataset)
            path = output.sink.path
            frame = self.rows.parquet(path)
            return (0 if frame is None else self.rows.count(frame)), sink_last_batch(path)
        writer = self._table_writer(output, self.schema(output), query_id)
        for _ in range(5):
            applied = writer.applied_batches()
            total = sum(int(r[column] or 0) for r in writer.read_all())
            if writer.applied_batches() == applied:
                break
        return total, (applied[-1] if applied else None)

    def _code_result_columns(self) -> dict[str, list[str]]:
        """The result columns of the SQL and Python outputs to Parquet (what cuts them into units)."""
        return {o.name: list(self.schema(o).names) for o in self.plan.outputs
                if isinstance(o.query, CODE_QUERIES) and isinstance(o.sink, ParquetDataset | DeltaDataset)}

    # ---- an earlier run, again ---------------------------------------------------------------

    def units_of_run(self, run_id: str) -> dict[str, list[dict[str, Any]]]:
        """The units that run ``run_id`` validated, by output, as the ledger keeps them."""
        found = {name: [u for u in entry["units"].values() if u.get("run") == run_id]
                 for name, entry in self.ledger.data["outputs"].items()}
        found = {name: units for name, units in found.items() if units}
        if not found:
            kept = {u.get("run") for entry in self.ledger.data["outputs"].values() for u in entry["units"].values()}
            recent = [r["run_id"] for r in self.ledger.data["runs"] if r.get("run_id") in kept][-5:]
            raise UnknownRun(f"the quality ledger {self.ledger.path} keeps no unit that run {run_id!r} validated; "
                             f"the newest runs whose units it keeps: {', '.join(recent) or 'none'}")
        return found

    def validate_again(self, target: Target, run_id: str, then: list[dict[str, Any]]) -> dict[str, Any]:
        """The units of one output that run ``run_id`` validated, validated again as of the
        version of its Delta table that run read, with the rules as they are now. Each unit
        carries the answer that run gave (``then``) and whether this one is the same; a
        different answer is a problem. Freshness is not judged again: it compares a unit with
        the watermark of that run's moment. A sink that keeps no versions is not read."""
        output = target.output
        report: dict[str, Any] = {"output": output.name, "kind": target.kind, "again": run_id, "units": [],
                                  "problems": []}
        if any(u.get("version") is None for u in then):
            report["note"] = f"its sink keeps no versions: the rows run {run_id} read cannot be read again"
            return report
        schema, path = self.schema(output), getattr(output.sink, "path", output.sink.where)
        units: dict[str, dict[str, Any]] = {}
        unread: set[int] = set()
        for version in sorted({u["version"] for u in then}):
            keys = [u["unit"] for u in then if u["version"] == version]
            try:
                frame, _ = self._sink_rows(output, version)
                assert frame is not None
                if target.kind == "snapshot":  # one unit: the whole table
                    batch, key = self.rows.select(frame, list(schema.names)), keys[0]
                    found, unplaced = {key: self._unit_record(key, None, None, self.rows.count(batch), version)}, 0

                    def key_of(_value: Any, key: str = key) -> str:
                        return key
                else:
                    units_of = UnitScheme(target)
                    batch = self.spark_rows.named(frame, units_of, keys)
                    found, unplaced = self._count_units(units_of, batch, version)
                    key_of = units_of.key
            except Exception as exc:  # Delta's and Spark's own errors: a vacuumed version
                first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
                report["problems"].append(f"version {version} of {path} cannot be read again "
                                          f"(a vacuum may have deleted its files): {first}")
                unread.add(version)
                continue
            if unplaced:
                report["problems"].append(_unplaced(target, unplaced))
            started = time.monotonic()
            _, report["docs"] = self.validate_units(target, schema, batch, found, key_of,
                                                    {"fresh_after": datetime(1970, 1, 1)}, label="again")
            report["seconds"] = round(report.get("seconds", 0) + time.monotonic() - started, 2)
            units |= found
        for earlier in then:
            if earlier["version"] in unread:
                continue  # said above
            now = units.setdefault(earlier["unit"], self._unit_record(earlier["unit"], None, None, 0,
                                                                       earlier["version"]) | {"status": "missing"})
            now["then"] = {k: earlier.get(k) for k in ("run", "rows", "status", "failed", "validated_at")}
            now["same"] = _verdict(now) == _verdict(earlier)
            if not now["same"]:
                report["problems"].append(
                    f"{earlier['unit']}: as of version {earlier['version']} now {_answer(now)}, where run {run_id} "
                    f"found {_answer(earlier)} (were the rules or the table's history changed since?)")
        report["units"] = sorted(units.values(), key=lambda u: u["unit"])
        return report

    # ---- the whole run ------------------------------------------------------------------------

    def run(self, backfill_label: str | None = None, again: str | None = None) -> dict[str, Any]:
        """Validate what closed since the last run; or a backfilled range (``backfill_label``);
        or, ``again``, the units that earlier run validated, as of the versions it read."""
        started = datetime.now(UTC)
        if (backfill_label or again) and not isinstance(self.rows, SparkRows):
            raise NeedsSpark("backfilled ranges and earlier runs are validated with Spark")
        found, skipped = targets(self.plan, self.rules, self._code_result_columns())
        outputs = []
        if again is not None:
            then = self.units_of_run(again)
            for target in found:
                if target.output.name in then:
                    outputs.append(self.validate_again(target, again, then.pop(target.output.name)))
            skipped += [f"{name}: validated by run {again}, but not an output validated now" for name in then]
        elif backfill_label:
            for target in found:
                outputs.append(self.validate_backfill(target, backfill_label))
        else:  # every output read first: an engine that cannot validate them says so before any is validated
            self._check_readable()
            prepared = [self.prepare_output(target) for target in found]
            outputs = [validate() for validate in prepared]
        accounting = None if backfill_label or again else self.account()
        problems = [f"{o['output']}: {p}" for o in outputs for p in o["problems"]]
        for o in outputs:
            for u in o["units"]:
                for f in u["failed"]:
                    problems.append(f"{o['output']} {u['unit']} ({u['rows']} rows): {f}")
        if accounting is not None:
            problems += accounting.problems
        if again is not None and not any(o["units"] for o in outputs) and not problems:
            problems.append(f"nothing was validated again: no output that run {again} validated keeps versions "
                            f"(only Delta tables can be read as they were)")
        result = {
            "stream": self.plan.stream, "run_id": self.run_id, "engine": self.engine,
            "started": iso(started), "finished": iso(datetime.now(UTC)),
            "backfill": backfill_label, "again": again, "outputs": outputs, "skipped": skipped,
            "accounting": accounting.to_dict() if accounting else None, "problems": problems, "ok": not problems,
            "delta_versions": dict(self._versions),  # the one version of each Delta table this run read
            "docs": str(docs_index(self.layout)), "summary": str(self.dir / "index.html"),
        }
        units = [u for o in outputs for u in o["units"]]
        self.ledger.record_run({"run_id": self.run_id, "at": result["finished"], "engine": self.engine,
                                "backfill": backfill_label,
                                "units": len(units), "failed": sum(u["status"] == "failed" for u in units),
                                "ok": result["ok"], "accounting": result["accounting"]}
                               | ({"again": again, "same": all(u.get("same") for u in units)} if again else {}))
        self.ledger.save()
        from spark_jobs.quality.report import write_summary

        write_summary(self.plan.stream, self.ledger, self.dir, docs_index(self.layout))
        return result


def _unplaced(target: Target, rows: int) -> str:
    return (f"{rows} row(s) have no {target.unit_column}: they belong to no unit and fail every unit "
            f"validated with them")


def _failed_checks(unit: dict[str, Any]) -> list[str]:
    """A unit's failed checks with their counts, without the example values (:func:`_examples`),
    which Spark may pick differently from run to run."""
    return sorted(f.split(EXAMPLES_PREFIX)[0] for f in unit["failed"])


def _verdict(unit: dict[str, Any]) -> tuple[Any, ...]:
    """What a unit's validation answered: its rows, its status and its failed checks."""
    return unit["rows"], unit["status"], _failed_checks(unit)


def _answer(unit: dict[str, Any]) -> str:
    failed = "; ".join(_failed_checks(unit))
    return f"{unit['status']} with {unit['rows']} rows" + (f" ({failed})" if failed else "")


def _label(name: str, kwargs: dict[str, Any]) -> str:
    target = kwargs.get("column") or kwargs.get("column_list") or kwargs.get("column_set")
    return f"{name}({target})" if target else name


def _examples(res: dict[str, Any]) -> str:
    values = res.get("partial_unexpected_list") or []
    return f"{EXAMPLES_PREFIX}{values[:EXAMPLES]}" if values else ""


def _describe(label: str, res: dict[str, Any]) -> str:
    if "unexpected_count" in res:
        return f"{label}: {res['unexpected_count']} of {res.get('element_count')} rows unexpected" + _examples(res)
    if "observed_value" in res:
        return f"{label}: observed {res['observed_value']!r}"
    return f"{label}: failed"


def _exception(info: Any) -> str | None:
    """The message of an exception Great Expectations caught while computing a check."""
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message") or "raised an exception").splitlines()[0][:300]
    for value in info.values():
        if isinstance(value, dict) and value.get("raised_exception"):
            return str(value.get("exception_message") or "raised an exception").splitlines()[0][:300]
    return None
