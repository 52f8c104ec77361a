"""Quality rules files: parsing, errors naming file and field, and the checks derived from specs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from spark_jobs.plan import compile_plan
from spark_jobs.quality.rules import derived_expectations, load_rules, parse_rules, rules_path, targets
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import (
    load_spec,
    parse_spec,
)
from spark_jobs.stream_spec.models import SpecError

SENSORS = load_spec(default_spec_dir() / "sensors.yaml")
SENSORS_PLAN = compile_plan(SENSORS, Layout(SENSORS))
CLICKS = load_spec(default_spec_dir() / "clicks.yaml")


def problems(data: dict, spec=SENSORS) -> str:
    with pytest.raises(SpecError) as err:
        parse_rules(data, spec, "rules.yaml")
    return str(err.value)


def test_every_example_stream_has_valid_rules_beside_its_spec() -> None:
    for spec in (SENSORS, CLICKS):
        path = rules_path(default_spec_dir(), spec.name)
        assert path == default_spec_dir().parent / "expectations" / f"{spec.name}.yaml"
        rules = load_rules(spec, default_spec_dir())
        assert set(rules.outputs) == {o.name for o in spec.outputs}


def test_a_stream_without_a_rules_file_gets_the_defaults(tmp_path: Path) -> None:
    rules = load_rules(SENSORS, tmp_path / "streams")
    assert rules.outputs == {} and rules.max_quarantine_rate == 0.05
    found, skipped = targets(SENSORS_PLAN, rules)
    assert [(t.output.name, t.kind, t.unit_column, t.unit_seconds) for t in found] == [
        ("readings", "period", "ts", 3600.0), ("site_temperature_10m", "window", "window_end", None),
        ("device_status", "snapshot", None, None)]
    assert skipped == []


@pytest.mark.parametrize(("data", "message"), [
    ({"outputs": {"nope": {}}}, "rules.yaml: outputs.nope: stream 'sensors' has no output 'nope'"),
    ({"outputs": {"readings": {"expectations": [{"expect_column_values_to_be_between": {"column": "temp"}}]}}},
     "rules.yaml: outputs.readings.expectations[0].expect_column_values_to_be_between.column: unknown column 'temp'"),
    ({"outputs": {"device_status": {"expectations": [
        {"expect_compound_columns_to_be_unique": {"column_list": ["device_id", "site"]}}]}}},
     "outputs.device_status.expectations[0].expect_compound_columns_to_be_unique.column_list: unknown column 'site'"),
    ({"outputs": {"readings": {"expectations": [{"check_temperature": {}}]}}},
     "'check_temperature' is not an expectation name"),
    ({"outputs": {"readings": {"expectations": [{"expect_a": {}, "expect_b": {}}]}}}, "must be one expectation"),
    ({"outputs": {"readings": {"expectations": [{"expect_a": [1, 2]}]}}}, "outputs.readings.expectations[0].expect_a: Input should be a valid dictionary"),
    ({"outputs": {"site_temperature_10m": {"unit": "1 hour"}}}, "outputs.site_temperature_10m.unit: only a pass-through"),
    ({"outputs": {"readings": {"freshness": "soon"}}}, "outputs.readings.freshness: 'soon' is not a duration"),
    ({"max_quarantine_rate": 2}, "max_quarantine_rate: Input should be less than or equal to 1"),
    ({"schedul": "@daily"}, "rules.yaml: schedul: unknown field"),
    ({"schedule": "every 10 minutes"}, "rules.yaml: schedule: 'every 10 minutes' is not a cron expression"),
])
def test_bad_rules_name_the_file_and_field(data: dict, message: str) -> None:
    assert message in problems(data)


def test_an_unreadable_rules_file_names_itself(tmp_path: Path) -> None:
    (tmp_path / "streams").mkdir()
    (tmp_path / "expectations").mkdir()
    bad = tmp_path / "expectations" / "sensors.yaml"
    bad.write_text("outputs: [unclosed\n")
    with pytest.raises(SpecError, match=f"{bad}: <spec>: not valid YAML: while parsing a flow sequence"):
        load_rules(SENSORS, tmp_path / "streams")
    bad.write_bytes(b"schedule: \xff\n")
    with pytest.raises(SpecError, match=f"{bad}: <spec>: cannot read: 'utf-8' codec"):
        load_rules(SENSORS, tmp_path / "streams")


def test_a_duplicated_key_in_a_rules_file_is_an_error_naming_the_file_key_and_lines(tmp_path: Path) -> None:
    (tmp_path / "streams").mkdir()
    (tmp_path / "expectations").mkdir()
    path = tmp_path / "expectations" / "sensors.yaml"
    # a second `readings:` pasted below: plain YAML would keep it and drop the first one's expectations
    path.write_text(
        "outputs:\n"
        "  readings:\n"
        "    expectations:\n"
        "      - expect_column_values_to_be_between: {column: temperature, min_value: -40, max_value: 60}\n"
        "  readings:\n"
        "    freshness: 2 hours\n")
    with pytest.raises(SpecError) as err:
        load_rules(SENSORS, tmp_path / "streams")
    assert err.value.source == str(path)
    assert err.value.problems == [("", "not valid YAML: duplicate key 'readings' on line 5 (first on line 2); "
                                       "YAML would keep only the last")]
    assert str(err.value).endswith(f"{path}: <spec>: not valid YAML: duplicate key 'readings' on line 5 "
                                   "(first on line 2); YAML would keep only the last")
    path.write_text(path.read_text().replace("  readings:\n    freshness", "  device_status:\n    freshness"))
    assert load_rules(SENSORS, tmp_path / "streams").for_output("readings").expectations


def test_derived_checks_cover_schema_nulls_and_unique_keys() -> None:
    windows = derived_expectations(SENSORS_PLAN, SENSORS_PLAN.output("site_temperature_10m"))
    assert windows == [
        ("expect_table_columns_to_match_set", {"column_set": ["window_start", "window_end", "site", "readings",
                                                              "avg_temperature", "max_temperature"], "exact_match": True}),
        ("expect_column_values_to_not_be_null", {"column": "window_start"}),
        ("expect_column_values_to_not_be_null", {"column": "window_end"}),
        ("expect_compound_columns_to_be_unique", {"column_list": ["window_start", "window_end", "site"]}),
    ]  # site comes from a left join: it may be null for unknown devices
    readings = dict((n, kw) for n, kw in derived_expectations(SENSORS_PLAN, SENSORS_PLAN.output("readings"))[1:]
                    if n != "expect_column_values_to_not_be_null")
    nulls = [kw["column"] for n, kw in derived_expectations(SENSORS_PLAN, SENSORS_PLAN.output("readings"))
             if n == "expect_column_values_to_not_be_null"]
    assert nulls == ["event_id", "device_id", "ts", "temperature"]
    assert readings == {"expect_column_values_to_be_unique": {"column": "event_id"}}
    status = derived_expectations(SENSORS_PLAN, SENSORS_PLAN.output("device_status"))
    assert ("expect_column_values_to_be_unique", {"column": "device_id"}) in status


def test_rules_files_are_plain_yaml_people_can_review() -> None:
    data = yaml.safe_load(rules_path(default_spec_dir(), "sensors").read_text())
    assert data["outputs"]["readings"]["expectations"][0] == {
        "expect_column_values_to_be_between": {"column": "temperature", "min_value": -40, "max_value": 60}}


def test_a_sql_output_is_validated_as_a_table_or_by_the_units_its_columns_from_spark_allow() -> None:
    data = SENSORS.model_dump(exclude_none=True)
    per_site = {"type": "sql", "sql": "SELECT site, max(temperature) AS hottest FROM accepted GROUP BY site"}
    recent = {"type": "sql", "sql": "SELECT device_id, ts FROM accepted WHERE temperature > 30"}
    data["outputs"] = [
        {"name": "hottest", "query": per_site, "mode": "complete", "sink": {"type": "table", "table": "hottest",
                                                                            "key": ["site"]}},
        {"name": "hot", "query": recent, "mode": "append", "sink": {"type": "parquet", "path": "sinks/hot"}},
        {"name": "windows", "query": {"type": "sql", "sql": "SELECT window.start AS window_start, window.end AS "
                                                            "window_end, count(*) AS n FROM accepted GROUP BY "
                                                            "window(ts, '10 minutes')"},
         "mode": "append", "sink": {"type": "parquet", "path": "sinks/windows"}},
        {"name": "ids", "query": {"type": "sql", "sql": "SELECT device_id FROM accepted"},
         "mode": "append", "sink": {"type": "parquet", "path": "sinks/ids"}},
    ]
    spec = parse_spec(data)
    rules = parse_rules({"outputs": {"hottest": {"expectations": [
        {"expect_column_values_to_not_be_null": {"column": "a_column_only_spark_knows"}}]}}}, spec, "rules.yaml")
    # the result columns Spark's analysis gives the validation job
    columns = {"hot": ["device_id", "ts"], "windows": ["window_start", "window_end", "n"], "ids": ["device_id"]}
    found, skipped = targets(compile_plan(spec, Layout(spec)), rules, columns)
    assert [(t.output.name, t.kind, t.unit_column) for t in found] == [
        ("hottest", "snapshot", None), ("hot", "period", "ts"), ("windows", "window", "window_end")]
    assert skipped == ["ids: a SQL query's result has neither window_start and window_end nor the event-time column "
                       "to cut closed units by; not validated (a table sink is, whole)"]
    # the column set and types come from Spark's schema of the query (the validation job adds them)
    assert found[0].derived == [("expect_column_values_to_be_unique", {"column": "site"})]


def test_validation_follows_new_output_at_most_once_per_interval_with_an_optional_clock() -> None:
    from spark_jobs.quality.rules import parse_rules
    from spark_jobs.stream_spec.layout import default_spec_dir
    from spark_jobs.stream_spec.loading import load_spec
    from spark_jobs.stream_spec.models import SpecError

    spec = load_spec(default_spec_dir() / "sensors.yaml")
    rules = parse_rules({}, spec)
    assert (rules.on_new_output, rules.min_interval, rules.schedule) == (True, "10 seconds", None)
    assert rules.pandas_max_rows == 100_000 and parse_rules({"pandas_max_rows": 0}, spec).pandas_max_rows == 0
    assert parse_rules({"schedule": "@hourly", "min_interval": "30 seconds"}, spec).schedule == "@hourly"
    assert parse_rules({"schedule": "@once", "on_new_output": False}, spec).schedule == "@once"
    for bad, says in (({"schedule": "@once"}, "cannot run beside on_new_output"),
                      ({"min_interval": "soon"}, "min_interval"), ({"min_interval": "0 seconds"}, "min_interval"),
                      ({"pandas_max_rows": -1}, "pandas_max_rows")):
        with pytest.raises(SpecError, match=says):
            parse_rules(bad, spec)
