"""A stream's data-quality rules: ``include/expectations/<stream>.yaml``, beside the specs.

A readable, reviewable file per stream; every entry of ``expectations`` is one Great
Expectations expectation, written as its snake-case name and its arguments::

    on_new_output: true             # validate when units of a sink close (its Airflow asset's events)
    min_interval: 10 seconds        # at most one such event per sink in this time (units add up)
    schedule: "@daily"              # and on this clock too (optional; none by default)
    max_quarantine_rate: 0.05       # accounting fails above this share of input
    pandas_max_rows: 100000         # validate in the Airflow task, without Spark, up to this many rows
                                    # of an output in a run (0: always with Spark)
    outputs:
      readings:
        unit: 1 hour                # validation unit of a pass-through output
        freshness: 2 hours          # newest closed unit at most this far behind the watermark
        expectations:
          - expect_column_values_to_be_between: {column: temperature, min_value: -40, max_value: 60}

The platform adds the checks it can derive from the stream spec itself (see
:func:`derived_expectations`): the schema, no nulls in keys, event time and required
columns, unique result keys, and freshness. A stream without a rules file gets those.

This module imports neither pyspark nor Great Expectations (Airflow parses it with the
DAG files); whether an expectation name and its arguments are valid for Great
Expectations is checked by :mod:`spark_jobs.quality.validation` before anything runs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from spark_jobs.plan import DeltaDataset, OutputPlan, ParquetDataset, StreamPlan, TableDataset, result_columns
from spark_jobs.stream_spec.loading import (
    load_yaml,
    yaml_problem,
)
from spark_jobs.stream_spec.models import (
    CODE_QUERIES,
    WINDOW_END,
    WINDOW_START,
    Aggregation,
    Duration,
    Passthrough,
    SpecError,
    StreamSpec,
    Strict,
)
from spark_jobs.stream_spec.validation import field_problems

EXPECTATION_NAME = re.compile(r"^expect_[a-z0-9_]+$")
#: Arguments that name columns of the output, checked against its result columns.
COLUMN_ARGS = ("column", "column_A", "column_B")
COLUMN_LIST_ARGS = ("column_list", "column_set")


class OutputRules(Strict):
    unit: Duration | None = None
    freshness: Duration | None = None
    expectations: list[dict[str, dict[str, Any]]] = Field(default_factory=list)

    @field_validator("expectations")
    @classmethod
    def _entries(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, entry in enumerate(v):
            if len(entry) != 1:
                raise ValueError(f"[{i}] must be one expectation: `- expect_...: {{arguments}}`")
            (name, _kwargs), = entry.items()
            if not EXPECTATION_NAME.match(name):
                raise ValueError(f"[{i}] {name!r} is not an expectation name (expect_...)")
        return v


class QualityRules(Strict):
    on_new_output: bool = True
    #: at most one asset event per sink in this time: short, so that validation follows a unit's
    #: closing within seconds; longer, to validate more units per run (each run costs a few seconds)
    min_interval: Duration = "10 seconds"
    schedule: str | None = None
    max_quarantine_rate: float = Field(default=0.05, ge=0, le=1)
    #: the most rows of one output a run validates without Spark (in the Airflow task: pyarrow,
    #: deltalake and Great Expectations' pandas engine); more, and the run is Spark's
    #: (``spark-submit``); 0: always Spark (``spark_jobs.quality.pandas_engine``)
    pandas_max_rows: int = Field(default=100_000, ge=0)
    outputs: dict[str, OutputRules] = Field(default_factory=dict)

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: str | None) -> str | None:
        from croniter import croniter

        if v is not None and not v.startswith("@") and not croniter.is_valid(v):
            raise ValueError(f"{v!r} is not a cron expression (e.g. '*/10 * * * *') or a preset such as '@hourly'")
        return v

    @model_validator(mode="after")
    def _clock_beside_assets(self) -> QualityRules:
        if self.on_new_output and self.schedule in ("@once", "@continuous"):
            raise ValueError(f"schedule {self.schedule!r} cannot run beside on_new_output (a clock as well as the "
                             f"sinks' asset events): give a cron expression, or set on_new_output: false")
        return self

    def for_output(self, name: str) -> OutputRules:
        return self.outputs.get(name, OutputRules())


def rules_path(spec_dir: str | os.PathLike[str], stream: str) -> Path:
    """``include/expectations/<stream>.yaml`` for specs in ``include/streams/``."""
    return Path(spec_dir).parent / "expectations" / f"{stream}.yaml"


def load_rules(spec: StreamSpec, spec_dir: str | os.PathLike[str]) -> QualityRules:
    """The stream's rules, checked against its spec; defaults when it has no file."""
    path = rules_path(spec_dir, spec.name)
    if not path.exists():
        return QualityRules()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(path, [("", f"cannot read: {exc}")]) from None
    try:
        data = load_yaml(text)  # strict like the specs: a repeated key is an error, not a silent overwrite
    except yaml.YAMLError as exc:
        raise SpecError(path, [("", f"not valid YAML: {yaml_problem(exc)}")]) from None
    return parse_rules(data or {}, spec, path)


def parse_rules(data: Any, spec: StreamSpec, source: str | os.PathLike[str] = "<rules>") -> QualityRules:
    if not isinstance(data, dict):
        raise SpecError(source, [("", "quality rules must be a YAML mapping")])
    try:
        rules = QualityRules.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, field_problems(exc)) from None
    problems = []
    outputs = {o.name: o for o in spec.outputs}
    for name, out_rules in rules.outputs.items():
        where = f"outputs.{name}"
        if name not in outputs:
            problems.append((where, f"stream {spec.name!r} has no output {name!r}; it has {sorted(outputs)}"))
            continue
        output = outputs[name]
        columns = result_columns(spec, output)  # None for SQL: checked against Spark's schema (spark_jobs.analysis)
        if out_rules.unit and not isinstance(output.query, Passthrough):
            problems.append((f"{where}.unit", "only a pass-through output has a unit; a windowed output is "
                                              "validated window by window, a table as a whole"))
        if columns is not None:
            problems += unknown_columns(where, out_rules, columns)
    if problems:
        raise SpecError(source, problems)
    return rules


def unknown_columns(where: str, out_rules: OutputRules, columns: list[str]) -> list[tuple[str, str]]:
    """The columns an output's expectations name that its result does not have."""
    problems = []
    for i, entry in enumerate(out_rules.expectations):
        (exp, kwargs), = entry.items()
        named = [(arg, kwargs[arg]) for arg in COLUMN_ARGS if arg in kwargs]
        named += [(arg, c) for arg in COLUMN_LIST_ARGS for c in kwargs.get(arg) or []]
        problems += [(f"{where}.expectations[{i}].{exp}.{arg}", f"unknown column {c!r}; the output has {columns}")
                     for arg, c in named if c not in columns]
    return problems


# ---- what is validated, and how it is cut into units ------------------------------------------


@dataclass(frozen=True)
class Target:
    """One output to validate: which column cuts it into units, and its checks."""

    output: OutputPlan
    #: ``window``: one unit per window (by ``window_end``); ``period``: event-time periods of a
    #: pass-through output; ``snapshot``: a table, whole, at each newly applied batch.
    kind: str
    unit_column: str | None
    unit_seconds: float | None
    freshness_seconds: float | None
    #: derived from the spec (see :func:`derived_expectations`)
    derived: list[tuple[str, dict[str, Any]]]
    #: from the rules file, in its order (``outputs.<name>.expectations[i]``)
    declared: list[tuple[str, dict[str, Any]]]


def targets(plan: StreamPlan, rules: QualityRules, code_columns: dict[str, list[str]] | None = None,
            ) -> tuple[list[Target], list[str]]:
    """The outputs that can be validated, and a note for each that cannot. ``code_columns``:
    the result columns of SQL and Python outputs to Parquet, as Spark analyzes them: one
    with ``window_start`` and ``window_end`` is cut into windows, one with the event-time
    column into periods."""
    from spark_jobs.stream_spec.models import duration_seconds

    found, skipped = [], []
    event_time = plan.event_time_column
    for output in plan.outputs:
        r = rules.for_output(output.name)
        q = output.query
        freshness = duration_seconds(r.freshness) if r.freshness else None
        checks = (derived_expectations(plan, output), [next(iter(e.items())) for e in r.expectations])
        if isinstance(output.sink, TableDataset) or (isinstance(output.sink, DeltaDataset) and output.mode != "append"):
            found.append(Target(output, "snapshot", None, None, None, *checks))  # a table: whole, as of a batch
        elif output.sink.kind == "kafka":
            skipped.append(f"{output.name}: a Kafka topic is not validated (Parquet, Delta and table sinks are)")
        elif not isinstance(output.sink, ParquetDataset | DeltaDataset):
            skipped.append(f"{output.name}: the {output.sink.kind} sink is not persisted; not validated")
        elif isinstance(q, CODE_QUERIES):
            columns = (code_columns or {}).get(output.name, [])
            if WINDOW_START in columns and WINDOW_END in columns:
                found.append(Target(output, "window", WINDOW_END, None, freshness, *checks))
            elif event_time and event_time in columns:
                found.append(Target(output, "period", event_time, duration_seconds(r.unit or "1 hour"),
                                    freshness, *checks))
            else:
                skipped.append(f"{output.name}: a {q.label} query's result has neither {WINDOW_START} and "
                               f"{WINDOW_END} nor the event-time column to cut closed units by; not validated "
                               "(a table sink is, whole)")
        elif isinstance(q, Aggregation) and q.window is not None:
            found.append(Target(output, "window", WINDOW_END, None, freshness, *checks))
        elif (isinstance(q, Passthrough) and event_time  # every column (None) holds the event time
              and (q.columns is None or event_time in q.columns)):
            unit = duration_seconds(r.unit or "1 hour")
            found.append(Target(output, "period", event_time, unit, freshness, *checks))
        else:
            skipped.append(f"{output.name}: no event-time column to cut closed units by; not validated")
    return found, skipped


def derived_expectations(plan: StreamPlan, output: OutputPlan) -> list[tuple[str, dict[str, Any]]]:
    """Checks that follow from the spec: schema, nulls, unique keys.

    Column types are added by the validation job from the query's real Spark schema.
    """
    columns = output.columns
    q = output.query
    checks: list[tuple[str, dict[str, Any]]] = []
    if columns is not None:  # a SQL or Python query's column set and types come from Spark's schema of it
        checks.append(("expect_table_columns_to_match_set", {"column_set": columns, "exact_match": True}))
        required = {c.name for c in (plan.source.columns if plan.source else []) if c.required}
        not_null = [c for c in columns if c in required]
        if isinstance(q, Aggregation) and q.window is not None:
            not_null = [WINDOW_START, WINDOW_END] + not_null
        et = plan.event_time_column
        if et is not None and et in columns and et not in not_null:
            not_null.append(et)
        checks += [("expect_column_values_to_not_be_null", {"column": c}) for c in not_null]
    if isinstance(q, Aggregation) or columns is None:
        key = output.key
    else:
        dedup = plan.ingestion.deduplicate if plan.ingestion else None
        key = [k for k in (dedup or []) if k in columns]
    if len(key) == 1:
        checks.append(("expect_column_values_to_be_unique", {"column": key[0]}))
    elif key:
        checks.append(("expect_compound_columns_to_be_unique", {"column_list": key}))
    return checks
