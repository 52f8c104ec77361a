"""Validation without Spark (pyarrow, deltalake, Great Expectations' pandas engine) against the
Spark job's: the same units of a real run validated both ways give the same ledger records,
the same Great Expectations results and the same Data Docs pages; a failing unit fails the
same way; a run the pandas engine cannot give Spark's answer for says so before it validates
anything.

What is normalised before comparing (and nothing else):

* a validation result's meta: ``run_id``, ``validation_time``, ``validation_id`` and
  ``checkpoint_id`` (the run's own ids and times), ``batch_markers`` (``ge_load_time``, a time;
  ``pandas_data_fingerprint``, a hash the pandas engine adds) and ``batch_spec`` (the engine's
  frame: ``SparkDataFrame`` or ``PandasDataFrame``); each expectation's ``id`` (the suite is
  stored again at every run, with new ids);
* the order of failing rows: lists of unexpected values and of their units are compared
  sorted (neither engine orders its failing rows by anything the platform sets); a ``partial_``
  list that holds only the first of more failing rows is compared by its length (each engine
  picks its own first rows);
* a ledger unit's ``run``, ``validated_at`` and ``docs`` (its run, when, and the page's path,
  which holds the run's time), and the example values at the end of its failure messages
  (``..., e.g. [...]``: the first failing rows of each engine; the full lists are compared in
  the results, above);
* in a Data Docs page: the run's times and random ids (UUIDs), the engine's frame name, and
  the pandas engine's fingerprint row.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_jobs.analysis import resolve_plan
from spark_jobs.plan import compile_plan
from spark_jobs.quality.pandas_engine import (
    NeedsSpark,
    PandasRows,
    _infer_partition_type,
    needs_spark,
    portable_regex,
    spec_schema,
)
from spark_jobs.quality.rules import load_rules, parse_rules
from spark_jobs.quality.validation import EXAMPLES_PREFIX, Validator, expected_schema
from spark_jobs.quality_job import run_without_spark
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec

EXAMPLE_LISTS = ("partial_unexpected_list", "partial_unexpected_counts", "partial_unexpected_index_list")
ROW_LISTS = ("unexpected_list", "unexpected_index_list")


def stream(include: Path, data_root: Path, name: str = "sensors") -> tuple[Any, Layout, Any]:
    spec = load_spec(include / "streams" / f"{name}.yaml")
    layout = Layout(spec, data_root, include / "streams")
    return spec, layout, load_rules(spec, layout.spec_dir)


def both_ways(spark, include: Path, data_root: Path) -> tuple[dict, Path, dict, Path]:
    """The stream validated with Spark, its quality folder moved aside, then validated again
    from nothing without Spark: each run's result and quality folder."""
    spec, layout, rules = stream(include, data_root)
    with_spark = Validator(spark, resolve_plan(spark, spec, layout), layout, rules).run()
    spark_dir = data_root.parent / f"{data_root.name}-quality-spark"
    shutil.rmtree(spark_dir, ignore_errors=True)
    shutil.move(layout.quality_dir, spark_dir)
    without = run_without_spark(compile_plan(spec, layout), layout, rules)
    assert (with_spark["engine"], without["engine"]) == ("spark", "pandas")
    return with_spark, spark_dir, without, layout.quality_dir


# ---- what is compared ----------------------------------------------------------------------------


def _sorted(values: list) -> list:
    return sorted(values, key=lambda v: json.dumps(v, sort_keys=True, default=str))


def normal_result(result: dict) -> dict:
    """A Great Expectations result of one expectation, without the order of failing rows."""
    out = dict(result)
    partial_complete = result.get("unexpected_count", 0) <= len(result.get("partial_unexpected_list") or [])
    for key in EXAMPLE_LISTS:
        if key in out:
            out[key] = _sorted(out[key]) if partial_complete else len(out[key])
    for key in ROW_LISTS:
        if key in out:
            out[key] = _sorted(out[key])
    return out


def validation_results(quality_dir: Path) -> dict[str, list[dict]]:
    """Every stored validation result, per suite in the order they ran, normalised (see the module)."""
    found: dict[str, list[tuple[str, dict]]] = {}
    for path in (quality_dir / "gx" / "uncommitted" / "validations").rglob("*.json"):
        data = json.loads(path.read_text())
        found.setdefault(data["suite_name"], []).append((data["meta"]["validation_time"], data))
    out = {}
    for suite, runs in found.items():
        out[suite] = []
        for _, data in sorted(runs, key=lambda r: r[0]):
            for key in ("run_id", "validation_time", "validation_id", "checkpoint_id", "batch_markers", "batch_spec"):
                data["meta"].pop(key)
            for r in data["results"]:
                r["expectation_config"].pop("id")
                r["result"] = normal_result(r["result"])
            out[suite].append(data)
    return out


def failure(message: str) -> str:
    """A failure message without its example values (each engine's first failing rows)."""
    return message.partition(EXAMPLES_PREFIX)[0]


def ledger_units(quality_dir: Path) -> dict[str, dict[str, dict]]:
    ledger = json.loads((quality_dir / "ledger.json").read_text())
    return {name: {key: {k: (sorted(failure(f) for f in v) if k == "failed" else v) for k, v in unit.items()
                         if k not in ("run", "validated_at", "docs")}
                   for key, unit in entry["units"].items()}
            for name, entry in ledger["outputs"].items()}


def reports(result: dict) -> dict[str, dict]:
    return {o["output"]: {k: v for k, v in o.items() if k not in ("units", "seconds", "docs")} for o in result["outputs"]}


def docs_pages(quality_dir: Path) -> dict[str, str]:
    """Each validation's Data Docs page, normalised (see the module)."""
    site = quality_dir / "gx" / "uncommitted" / "data_docs" / "local_site" / "validations"
    pages = {}
    for path in site.rglob("*.html"):
        html = path.read_text()
        stored = quality_dir / "gx" / "uncommitted" / "validations" / path.relative_to(site).with_suffix(".json")
        run_time = json.loads(stored.read_text())["meta"]["run_id"]["run_time"]
        html = html.replace(run_time[:19] + "Z", "<run time>")
        html = re.sub(r"\d{8}T\d{6}\.\d{6}Z", "<time>", html)
        html = re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>", html)
        html = re.sub(r"(Spark|Pandas)DataFrame", "<engine>DataFrame", html)
        html = re.sub(r"<tr>(?:(?!</tr>).)*pandas_data_fingerprint(?:(?!</tr>).)*</tr>", "", html, flags=re.S)
        pages[str(path.relative_to(site).parts[:2])] = html
    return pages


def assert_same(with_spark: dict, spark_dir: Path, without: dict, pandas_dir: Path) -> None:
    assert reports(without) == reports(with_spark)
    assert without["accounting"] == with_spark["accounting"] and without["accounting"]["balances"]
    assert sorted(failure(p) for p in without["problems"]) == sorted(failure(p) for p in with_spark["problems"])
    assert ledger_units(pandas_dir) == ledger_units(spark_dir)
    spark_ledger, pandas_ledger = (json.loads((d / "ledger.json").read_text()) for d in (spark_dir, pandas_dir))
    assert pandas_ledger["totals"] == spark_ledger["totals"]
    assert [{k: v for k, v in r.items() if k not in ("run_id", "at", "engine")} for r in pandas_ledger["runs"]] == \
        [{k: v for k, v in r.items() if k not in ("run_id", "at", "engine")} for r in spark_ledger["runs"]]
    spark_results, pandas_results = validation_results(spark_dir), validation_results(pandas_dir)
    assert set(pandas_results) == set(spark_results) and spark_results
    for suite, runs in spark_results.items():
        assert len(pandas_results[suite]) == len(runs), suite
        for theirs, ours in zip(runs, pandas_results[suite], strict=True):
            assert ours["success"] == theirs["success"] and ours["statistics"] == theirs["statistics"], suite
            for a, b in zip(theirs["results"], ours["results"], strict=True):  # expectation by expectation
                assert (b["expectation_config"], b["success"], b["exception_info"]) == \
                    (a["expectation_config"], a["success"], a["exception_info"]), (suite, a["expectation_config"])
                assert b["result"] == a["result"], (suite, a["expectation_config"]["type"])
            assert ours == theirs, suite


# ---- the same unit, both ways ----------------------------------------------------------------------


def test_a_real_runs_units_give_the_same_results_and_data_docs_with_spark_and_pandas(spark, include,
                                                                                      data_root) -> None:
    with_spark, spark_dir, without, pandas_dir = both_ways(spark, include, data_root)

    assert with_spark["ok"] and without["ok"], (with_spark["problems"], without["problems"])
    counted = {o["output"]: len(o["units"]) for o in without["outputs"]}
    assert counted["site_temperature_10m"] >= 5 and counted["readings"] >= 1 and counted["device_status"] == 1
    assert_same(with_spark, spark_dir, without, pandas_dir)
    spark_pages, pandas_pages = docs_pages(spark_dir), docs_pages(pandas_dir)
    assert set(pandas_pages) == set(spark_pages) and len(spark_pages) == 3
    for page, html in spark_pages.items():
        assert "<engine>DataFrame" in html and "<run time>" in html
        assert pandas_pages[page] == html, page
    # the check the pandas engine judges by Spark's type, as Spark does
    readings = next(r for r in validation_results(pandas_dir)["sensors.readings"][0]["results"]
                    if r["expectation_config"]["type"] == "expect_column_values_to_be_of_type")
    assert readings["success"] is True


def failing_rules(spark, include: Path, data_root: Path) -> None:
    """Rules that some windows break (integers), the closed hour (text, nulls, doubles) and the table
    (its type) too."""
    temperatures = sorted(r[0] for r in spark.read.parquet(str(data_root / "sinks" / "sensors" / "readings"))
                          .select("temperature").collect())
    path = include / "expectations" / "sensors.yaml"
    rules = yaml.safe_load(path.read_text())
    rules["outputs"]["site_temperature_10m"]["expectations"].append(
        {"expect_column_values_to_be_between": {"column": "readings", "min_value": 7}})
    rules["outputs"]["readings"]["expectations"] += [
        {"expect_column_values_to_be_in_set": {"column": "status", "value_set": ["ok", "warn"]}},
        {"expect_column_values_to_not_be_null": {"column": "humidity"}},
        {"expect_column_values_to_be_between": {"column": "temperature",
                                                "max_value": temperatures[len(temperatures) // 2]}}]
    rules["outputs"]["device_status"]["expectations"].append(
        {"expect_column_values_to_be_of_type": {"column": "readings", "type_": "IntegerType"}})
    path.write_text(yaml.safe_dump(rules, sort_keys=False))


def test_a_failing_unit_fails_the_same_way_with_spark_and_pandas(spark, include, data_root) -> None:
    failing_rules(spark, include, data_root)
    with_spark, spark_dir, without, pandas_dir = both_ways(spark, include, data_root)

    assert not with_spark["ok"] and not without["ok"]
    windows = next(o for o in without["outputs"] if o["output"] == "site_temperature_10m")["units"]
    assert {u["status"] for u in windows} == {"passed", "failed"}, "some windows fail, others pass"
    assert all(u["status"] == "failed" for o in without["outputs"] if o["output"] != "site_temperature_10m"
               for u in o["units"])
    (table,) = next(o for o in without["outputs"] if o["output"] == "device_status")["units"]
    assert table["failed"] == ["expect_column_values_to_be_of_type(readings): observed 'LongType'"]
    assert_same(with_spark, spark_dir, without, pandas_dir)
    by_unit = {u["unit"]: u for u in next(o for o in with_spark["outputs"] if o["output"] == "site_temperature_10m")["units"]}
    assert {u["unit"]: u["status"] for u in windows} == {k: u["status"] for k, u in by_unit.items()}
    # the detail runs (example values, the unit of each failing row) ran both ways
    results = validation_results(pandas_dir)["sensors.site_temperature_10m"]
    assert len(results) == 2 and "unexpected_index_list" in next(
        r["result"] for r in results[1]["results"] if not r["success"])
    humidity = next(r["result"] for r in validation_results(pandas_dir)["sensors.readings"][1]["results"]
                    if r["expectation_config"]["kwargs"].get("column") == "humidity" and not r["success"])
    assert humidity["unexpected_count"] >= 1 and set(humidity["unexpected_list"]) == {None}


def delta_sensors(include: Path) -> None:
    spec_path = include / "streams" / "sensors.yaml"
    data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    for output in data["outputs"]:
        sink = output["sink"]
        output["sink"] = {"type": "delta", "path": f"delta/sensors/{output['name']}",
                          **({"partition_by": sink["partition_by"]} if sink.get("partition_by") else {})}
    spec_path.write_text(yaml.safe_dump(data), encoding="utf-8")


def test_delta_tables_read_with_deltalake_give_sparks_results(spark, include: Path, tmp_path: Path,
                                                              job_run) -> None:
    from runner.testdata import generate

    delta_sensors(include)
    root = tmp_path / "data"
    assert generate.main(["--spec", str(include / "streams" / "sensors.yaml"), "--data-root", str(root), "--files", "6",
                          "--events-per-file", "40", "--event-interval-ms", "20000", "--seed", "5"]) == 0
    spec, layout, _ = stream(include, root)
    job_run(resolve_plan(spark, spec, layout), layout)

    with_spark, spark_dir, without, pandas_dir = both_ways(spark, include, root)
    assert with_spark["ok"] and without["ok"], (with_spark["problems"], without["problems"])
    assert without["delta_versions"] == with_spark["delta_versions"] and len(without["delta_versions"]) == 3
    assert all(o["units"] for o in without["outputs"])
    assert_same(with_spark, spark_dir, without, pandas_dir)


# ---- what sends a run to Spark ---------------------------------------------------------------------


def test_more_rows_than_pandas_max_rows_need_spark_before_anything_is_validated(include, data_root) -> None:
    spec, layout, rules = stream(include, data_root)
    small = rules.model_copy(update={"pandas_max_rows": 50})
    with pytest.raises(NeedsSpark, match=r"\d+ rows of .*readings to validate, more than pandas_max_rows \(50\)"):
        run_without_spark(compile_plan(spec, layout), layout, small)
    assert not (layout.quality_dir / "ledger.json").exists() and not (layout.quality_dir / "gx").exists()
    with pytest.raises(NeedsSpark, match="pandas_max_rows: 0"):
        run_without_spark(compile_plan(spec, layout), layout, rules.model_copy(update={"pandas_max_rows": 0}))
    assert run_without_spark(compile_plan(spec, layout), layout, rules)["ok"]  # the default takes the run's few hundred rows


def test_spec_and_rules_that_need_spark_are_named() -> None:
    from dataclasses import replace

    from spark_jobs.stream_spec.layout import default_spec_dir

    def plan_of(spec):
        return compile_plan(spec, Layout(spec))

    spec = load_spec(default_spec_dir() / "sensors.yaml")
    plan = plan_of(spec)
    assert needs_spark(plan, load_rules(spec, default_spec_dir())) is None
    assert needs_spark(plan_of(load_spec(default_spec_dir() / "clicks.yaml")), load_rules(
        load_spec(default_spec_dir() / "clicks.yaml"), default_spec_dir())) is None
    quantile = parse_rules({"outputs": {"readings": {"expectations": [
        {"expect_column_quantile_values_to_be_between": {"column": "temperature", "quantile_ranges": {
            "quantiles": [0.5], "value_ranges": [[0, 30]]}}}]}}}, spec)
    assert "expect_column_quantile_values_to_be_between: not among" in needs_spark(plan, quantile)
    digits = parse_rules({"outputs": {"readings": {"expectations": [
        {"expect_column_values_to_match_regex": {"column": "device_id", "regex": r"^dev-\d{3}$"}}]}}}, spec)
    assert "a regex that Java and Python may read differently" in needs_spark(plan, digits)
    transformed = replace(plan, ingestion=replace(plan.ingestion, transform=object()))
    assert "transform" in needs_spark(transformed, parse_rules({}, spec))
    zoned = replace(plan, spark=spec.spark.model_copy(update={"conf": {"spark.sql.session.timeZone": "Europe/Paris"}}))
    assert "time zone" in needs_spark(zoned, parse_rules({}, spec))


def test_portable_regexes_and_partition_types() -> None:
    from pyspark.sql import types as T

    assert portable_regex("^dev-[0-9]{3}$") and portable_regex(r"^a\.b(?:c|d)+$")
    for unsure in (r"\d", r"\w+", r"(?i)dev", "a++", "[a-z&&[^b]]", "é", "(", 3):
        assert not portable_regex(unsure), unsure
    assert _infer_partition_type(["2026-01-01", None]) == T.DateType()
    assert _infer_partition_type(["1", "-7"]) == T.IntegerType()
    assert _infer_partition_type(["1", str(2**40)]) == T.LongType()
    assert _infer_partition_type(["1.5", "2.25"]) == T.DoubleType()
    assert _infer_partition_type(["site-1", "north"]) == T.StringType()
    for unsure in (["1e5"], ["2026-01-01 00:00:00"], ["NaN"], ["1d"], ["1", "1.5"]):
        with pytest.raises(NeedsSpark):
            _infer_partition_type(unsure)


def test_the_spec_gives_the_schema_sparks_analysis_gives(spark, include: Path, tmp_path: Path) -> None:
    """Every output of the examples, and an aggregation of every function over every type."""

    spec_path = include / "streams" / "sensors.yaml"
    data = yaml.safe_load(spec_path.read_text())
    data["source"]["columns"] += [{"name": "n_int", "type": "integer"}, {"name": "n_long", "type": "long"},
                                  {"name": "flag", "type": "boolean"}, {"name": "day", "type": "date"}]
    functions = []
    for column, kinds in {"n_int": "sum avg min max latest approx_count_distinct count",
                          "n_long": "sum avg min max latest", "temperature": "sum avg min max latest",
                          "status": "min max latest approx_count_distinct", "ts": "min max latest",
                          "flag": "min max latest", "day": "min max latest"}.items():
        functions += [{"name": f"{fn}_{column}", "fn": fn, "column": column} for fn in kinds.split()]
    data["outputs"].append({"name": "every_function", "mode": "update", "sink": {"type": "table", "table": "every"},
                            "query": {"type": "aggregate", "group_by": ["device_id", "n_int", "day"],
                                      "aggregates": [{"name": "rows", "fn": "count"}, *functions]}})
    data["outputs"].append({"name": "some_columns", "mode": "append", "sink": {"type": "parquet", "path": "sinks/some"},
                            "query": {"type": "passthrough", "columns": ["ts", "flag", "device_id", "n_long"]}})
    spec_path.write_text(yaml.safe_dump(data))
    compared = 0
    for name in ("sensors", "clicks"):
        spec = load_spec(include / "streams" / f"{name}.yaml")
        plan = compile_plan(spec, Layout(spec, tmp_path, include / "streams"))
        for output in plan.outputs:
            ours = [(f.name, f.dataType) for f in spec_schema(plan, output).fields]
            assert ours == [(f.name, f.dataType) for f in expected_schema(spark, plan, output.name).fields], \
                (name, output.name)
            compared += len(ours)
    assert compared > 4 + len(functions)


def test_without_spark_the_run_says_which_engine_in_its_result_and_the_ledger(include, data_root) -> None:
    spec, layout, rules = stream(include, data_root)
    result = Validator(None, compile_plan(spec, layout), layout, rules, rows=PandasRows(rules.pandas_max_rows)).run()
    assert result["engine"] == "pandas"
    assert json.loads((layout.quality_dir / "ledger.json").read_text())["runs"][-1]["engine"] == "pandas"
    with pytest.raises(NeedsSpark, match="backfilled ranges"):
        Validator(None, compile_plan(spec, layout), layout, rules, rows=PandasRows(10)).run(backfill_label="x")
