"""Spec validation: each rule rejects with an error naming the file and the field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from spark_jobs.plan import checkpoint_paths, compile_plan, has_ingestion, result_columns, written_by_ingestion
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import (
    load_spec,
    load_specs,
    parse_spec,
)
from spark_jobs.stream_spec.models import SpecError

SPEC_DIR = default_spec_dir()


@pytest.fixture
def sensors() -> dict:
    return yaml.safe_load((SPEC_DIR / "sensors.yaml").read_text())


@pytest.fixture
def clicks() -> dict:
    return yaml.safe_load((SPEC_DIR / "clicks.yaml").read_text())


def problems(data: dict, source: str = "streams/x.yaml") -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as err:
        parse_spec(data, source)
    assert source in str(err.value)
    return err.value.problems


def assert_problem(data: dict, field: str, fragment: str) -> None:
    found = problems(data)
    assert any(f == field and fragment in msg for f, msg in found), found


def test_example_specs_are_valid() -> None:
    specs, errors = load_specs(SPEC_DIR)
    assert errors == {}
    assert set(specs) >= {"sensors", "clicks"}
    modes = {o.mode for s in specs.values() for o in s.outputs}
    assert modes == {"append", "update", "complete"}
    kinds = {o.query.window.kind for s in specs.values() for o in s.outputs if getattr(o.query, "window", None)}
    assert kinds == {"tumbling", "sliding"}


def test_append_aggregation_without_watermark(sensors: dict) -> None:
    del sensors["event_time"]
    del sensors["deduplicate"]
    found = problems(sensors)
    assert ("outputs[1].mode", next(m for f, m in found if f == "outputs[1].mode")) in found
    assert any("append mode on an aggregation needs" in m for f, m in found if f == "outputs[1].mode")


def test_append_aggregation_without_window(sensors: dict) -> None:
    sensors["outputs"][2]["mode"] = "append"
    sensors["outputs"][2]["sink"] = {"type": "parquet", "path": "sinks/sensors/status"}
    assert_problem(sensors, "outputs[2].mode", "needs an event-time window and a watermark")


@pytest.mark.parametrize("mode", ["update", "complete"])
def test_file_sink_in_update_or_complete_mode(sensors: dict, mode: str) -> None:
    sensors["outputs"][1]["mode"] = mode
    assert_problem(sensors, "outputs[1].sink", f"supports only append mode, not {mode}")


def test_continuous_trigger_rejected_for_file_source_and_aggregation(sensors: dict) -> None:
    sensors["outputs"][1]["trigger"] = {"continuous": "1 second"}
    found = problems(sensors)
    msgs = [m for f, m in found if f == "outputs[1].trigger"]
    assert any("file source does not support continuous" in m for m in msgs), found
    assert any("only map-like queries" in m for m in msgs), found
    assert any("parquet sink does not support continuous" in m for m in msgs), found


def test_continuous_trigger_allowed_for_rate_to_memory() -> None:
    spec = parse_spec({
        "name": "load", "source": {"type": "rate", "rows_per_second": 10},
        "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append", "sink": {"type": "memory"}}],
        "trigger": {"continuous": "1 second"}, "checkpoint": "checkpoints/load",
    })
    assert spec.trigger.kind == "continuous"


def test_unknown_group_key_and_aggregate_column(sensors: dict) -> None:
    sensors["outputs"][1]["query"]["group_by"] = ["sitee"]
    sensors["outputs"][1]["query"]["aggregates"][1]["column"] = "temp"
    found = problems(sensors)
    assert any(f == "outputs[1].query.group_by[0]" and "unknown column 'sitee'" in m for f, m in found), found
    assert any(f == "outputs[1].query.aggregates[1].column" and "unknown column 'temp'" in m for f, m in found), found


def test_numeric_aggregate_on_string(sensors: dict) -> None:
    sensors["outputs"][1]["query"]["aggregates"][1]["column"] = "status"
    assert_problem(sensors, "outputs[1].query.aggregates[1].fn", "avg needs a numeric column")


@pytest.mark.parametrize("name", ["../etc", "a/b", "Sensors", "", "x" * 70])
def test_unsafe_stream_names(sensors: dict, name: str) -> None:
    sensors["name"] = name
    assert_problem(sensors, "name", "not a safe stream name")


def test_unsafe_output_name(sensors: dict) -> None:
    sensors["outputs"][0]["name"] = "a/../b"
    assert_problem(sensors, "outputs[0].name", "not a safe name")


@pytest.mark.parametrize("field", ["checkpoint", "quarantine"])
def test_dotdot_paths(sensors: dict, field: str) -> None:
    if field == "checkpoint":
        sensors["checkpoint"] = "checkpoints/../../etc"
        assert_problem(sensors, "checkpoint", "must not contain '..'")
    else:
        sensors["quarantine"]["path"] = "../outside"
        assert_problem(sensors, "quarantine.path", "must not contain '..'")


def test_duplicate_output_names(sensors: dict) -> None:
    sensors["outputs"][1]["name"] = "readings"
    assert_problem(sensors, "outputs[1].name", "duplicate output name 'readings'")


def test_checkpoint_shared_by_two_queries(sensors: dict) -> None:
    sensors["outputs"][1]["checkpoint"] = "checkpoints/shared"
    sensors["outputs"][2]["checkpoint"] = "checkpoints/shared"
    assert_problem(sensors, "outputs[2].checkpoint", "two queries must never share a checkpoint")


def test_checkpoint_shared_across_specs(tmp_path: Path, sensors: dict, clicks: dict) -> None:
    clicks["checkpoint"] = sensors["checkpoint"]
    (tmp_path / "sensors.yaml").write_text(yaml.safe_dump(sensors))
    (tmp_path / "clicks.yaml").write_text(yaml.safe_dump(clicks))
    specs, errors = load_specs(tmp_path)
    assert specs == {}
    assert set(errors) == {str(tmp_path / "sensors.yaml"), str(tmp_path / "clicks.yaml")}
    assert "each stream needs its own" in str(errors[str(tmp_path / "sensors.yaml")])
    assert "checkpoint: 'checkpoints/sensors' is also used" in str(errors[str(tmp_path / "clicks.yaml")])


def test_one_bad_spec_leaves_the_others(tmp_path: Path, sensors: dict, clicks: dict) -> None:
    clicks["outputs"][0]["mode"] = "sometimes"
    (tmp_path / "sensors.yaml").write_text(yaml.safe_dump(sensors))
    (tmp_path / "clicks.yaml").write_text(yaml.safe_dump(clicks))
    specs, errors = load_specs(tmp_path)
    assert list(specs) == ["sensors"]
    assert "clicks.yaml: outputs[0].mode:" in str(errors[str(tmp_path / "clicks.yaml")])


def test_unknown_field_is_named(sensors: dict) -> None:
    sensors["outputs"][0]["sinkk"] = {}
    assert_problem(sensors, "outputs[0].sinkk", "unknown field")


def test_unknown_sink_type(sensors: dict) -> None:
    sensors["outputs"][0]["sink"] = {"type": "kafka"}
    found = problems(sensors)
    assert any(f.startswith("outputs[0].sink") for f, _ in found), found


def test_bad_durations_and_windows(sensors: dict) -> None:
    sensors["event_time"]["watermark"] = "ten minutes"
    sensors["outputs"][1]["query"]["window"] = {"duration": "10 minutes", "slide": "3 minutes"}
    found = problems(sensors)
    assert any(f == "event_time.watermark" and "not a duration" in m for f, m in found), found
    assert any(f == "outputs[1].query.window" and "multiple of the slide" in m for f, m in found), found


def test_event_time_must_be_a_timestamp(sensors: dict) -> None:
    sensors["event_time"]["column"] = "device_id"
    assert_problem(sensors, "event_time.column", "must be a timestamp")


def test_max_future_defaults_to_a_day_and_must_be_a_positive_duration(sensors: dict) -> None:
    assert parse_spec(copy.deepcopy(sensors)).event_time.max_future == "1 day"
    sensors["event_time"]["max_future"] = "2 hours"
    assert parse_spec(copy.deepcopy(sensors)).event_time.max_future == "2 hours"
    sensors["event_time"]["max_future"] = "0 seconds"
    assert_problem(sensors, "event_time.max_future", "must be positive")


def test_event_time_column_of_a_file_source_must_be_required(sensors: dict) -> None:
    sensors["source"]["columns"][2]["required"] = False
    assert_problem(sensors, "event_time.column", "'ts' must be declared required: true")
    # the rate source's timestamp is never null
    spec = parse_spec({
        "name": "load", "source": {"type": "rate"}, "event_time": {"column": "timestamp", "watermark": "1 minute"},
        "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append", "sink": {"type": "memory"}}],
        "checkpoint": "checkpoints/load"})
    assert spec.event_time.column == "timestamp"


def test_duplicate_yaml_keys_are_an_error(tmp_path: Path, sensors: dict) -> None:
    path = tmp_path / "sensors.yaml"
    text = yaml.safe_dump(sensors, sort_keys=False)
    path.write_text(text.replace("checkpoint: checkpoints/sensors\n", "checkpoint: checkpoints/sensors\ncheckpoint: x\n"))
    with pytest.raises(SpecError, match=r"sensors.yaml: <spec>: not valid YAML: duplicate key 'checkpoint' on line"):
        load_spec(path)
    path.write_text(text)
    assert load_spec(path).checkpoint == "checkpoints/sensors"


def test_join_key_must_exist_on_both_sides(sensors: dict) -> None:
    sensors["enrich"][0]["key"] = ["site"]
    found = problems(sensors)
    assert any(f == "enrich[0].key[0]" and "unknown column 'site'" in m for f, m in found), found


def test_partition_column_must_be_in_result(sensors: dict) -> None:
    sensors["outputs"][1]["sink"]["partition_by"] = ["event_date"]
    assert_problem(sensors, "outputs[1].sink.partition_by[0]", "unknown column 'event_date'")


@pytest.mark.parametrize(("name", "why"), [
    ("event_date", "it is the date of the event time, which the platform adds to every row of a stream with event_time"),
    ("Event_Date", "it is the date of the event time"),  # Spark resolves names case-insensitively
    ("window_start", "it is the start of the window, which the platform adds to windowed results"),
    ("window_end", "it is the end of the window, which the platform adds to windowed results"),
    ("_corrupt_record", "names starting with '_' are for the platform's internal columns"),
    ("_source_file", "names starting with '_' are for the platform's internal columns"),
    ("_metadata", "names starting with '_' are for the platform's internal columns"),
    ("_site", "names starting with '_' are for the platform's internal columns"),
])
def test_platform_columns_are_reserved_in_the_source_and_the_reference(sensors: dict, name: str, why: str) -> None:
    source, reference = copy.deepcopy(sensors), copy.deepcopy(sensors)
    source["source"]["columns"][4]["name"] = name
    assert_problem(source, "source.columns[4].name", f"{name!r} is reserved by the platform: {why}")
    reference["enrich"][0]["columns"][2]["name"] = name
    assert_problem(reference, "enrich[0].columns[2].name", f"{name!r} is reserved by the platform: {why}")


def test_names_that_only_resemble_platform_columns_are_allowed(sensors: dict) -> None:
    sensors["source"]["columns"] += [{"name": "event_date_local", "type": "date"}, {"name": "window_", "type": "long"}]
    assert [c.name for c in parse_spec(sensors).source.columns][-2:] == ["event_date_local", "window_"]


def test_platform_managed_options_rejected(sensors: dict) -> None:
    sensors["source"]["options"] = {"mode": "DROPMALFORMED"}
    assert_problem(sensors, "source.options", "set by the platform")


def test_file_source_needs_quarantine(sensors: dict) -> None:
    del sensors["quarantine"]
    assert_problem(sensors, "quarantine", "needs a quarantine path")


def test_name_must_match_file(tmp_path: Path, sensors: dict) -> None:
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(sensors))
    with pytest.raises(SpecError, match=r"other.yaml: name: must match the file name 'other'"):
        load_spec(path)


def test_not_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match=r"broken.yaml: <spec>: not valid YAML"):
        load_spec(path)


def test_layout_resolves_paths(tmp_path: Path, sensors: dict) -> None:
    spec = parse_spec(copy.deepcopy(sensors))
    layout = Layout(spec, tmp_path / "data", SPEC_DIR)
    assert compile_plan(spec, layout).source.landing == str(tmp_path / "data" / "landing" / "sensors")
    assert layout.data(checkpoint_paths(spec)["readings"]) == str(tmp_path / "data" / "checkpoints" / "sensors" / "readings")
    assert layout.reference("reference/devices.csv") == str(SPEC_DIR.parent / "reference" / "devices.csv")
    assert set(checkpoint_paths(spec)) == {"readings", "site_temperature_10m", "device_status", "_ingest"}
    # readings is written by the ingestion: its sink is the accepted-rows table
    assert compile_plan(spec, layout).accepted_path == str(tmp_path / "data" / "sinks" / "sensors" / "readings")
    assert layout.table_url(spec.outputs[2].sink).startswith("sqlite:////")


def test_a_transform_is_sql_or_python_and_defers_the_outputs_columns_to_spark(sensors: dict) -> None:
    sensors["transform"] = {"sql": "SELECT *, temperature * 2 AS doubled FROM input"}
    sensors["outputs"][1]["query"]["aggregates"][0]["column"] = "doubled"  # a column only the transform makes
    spec = parse_spec(sensors)
    assert spec.transform.type == "sql" and result_columns(spec, spec.outputs[0]) is None
    for bad, fragment in [({}, "set exactly one of sql, python"), ({"sql": "x", "python": "a.b:c"}, "exactly one"),
                          ({"sql": "  "}, "the query is empty"), ({"python": "not a ref"}, "is not a function reference")]:
        sensors["transform"] = bad
        assert any(f == "transform" and fragment in m for f, m in problems(sensors)), bad
    sensors["transform"] = {"sql": "SELECT * FROM input"}
    sensors["enrich"][0]["name"] = "input"
    assert_problem(sensors, "enrich[0].name", "is the view of the rows a stream's SQL transform reads")


def test_an_application_stream_declares_its_file_and_queries_instead_of_a_source_and_outputs(sensors: dict) -> None:
    app = {"name": "x", "checkpoint": "checkpoints/x",
           "application": {"path": "applications/rate_counts.py", "args": ["--output", "sinks/x"], "queries": ["counts"]}}
    spec = parse_spec(app)
    assert compile_plan(spec, Layout(spec)).flows == ["counts"] and not has_ingestion(spec) and written_by_ingestion(spec) is None
    assert checkpoint_paths(spec) == {"counts": "checkpoints/x/counts"}
    assert compile_plan(spec, Layout(spec, "/d", "/i/streams")).application.file == "/i/applications/rate_counts.py"
    mixed = {**app, "source": sensors["source"], "outputs": sensors["outputs"]}
    assert any("remove source, outputs" in m for _, m in problems(mixed))
    neither = {"name": "x", "checkpoint": "checkpoints/x"}
    assert any("a source and outputs, or an application; source and outputs missing" in m for _, m in problems(neither))
    for bad, fragment in [({"path": "app.jar", "queries": ["q"]}, "is not a Python file"),
                          ({"path": "../app.py", "queries": ["q"]}, "must not contain '..'"),
                          ({"path": "app.py", "queries": ["q", "q"]}, "a query is named twice"),
                          ({"path": "app.py", "queries": []}, "at least 1"),
                          ({"path": "app.py", "queries": ["Bad-Name"]}, "is not a safe query name")]:
        assert any(fragment in m for _, m in problems({**app, "application": bad})), bad


def test_a_scheduled_stream_says_when_it_runs_and_how_fresh_it_stays(sensors: dict) -> None:
    sensors["execution"] = {"mode": "scheduled", "schedule": "*/10 * * * *", "freshness": "15 minutes"}
    spec = parse_spec(sensors)
    assert compile_plan(spec, Layout(spec)).available_now and spec.execution.describe() == "scheduled (on `*/10 * * * *`; freshness 15 minutes)"
    sensors["execution"] = {"mode": "scheduled", "schedule": "2 minutes", "on_input": True, "freshness": "5 minutes"}
    spec = parse_spec(sensors)
    assert spec.execution.interval and "every 2 minutes and when input arrives" in spec.execution.describe()
    sensors["execution"] = {"mode": "scheduled", "schedule": "*/10 * * *", "freshness": "15 minutes"}
    assert_problem(sensors, "execution.schedule", "is not a cron expression (five fields)")
    sensors["execution"] = {"mode": "scheduled", "schedule": "61 * * * *", "freshness": "15 minutes"}
    assert_problem(sensors, "execution.schedule", "is not a valid cron expression")
    sensors["execution"] = {"mode": "scheduled", "freshness": "15 minutes"}
    assert_problem(sensors, "execution", "runs on a schedule, on_input, or both")
    sensors["execution"] = {"mode": "scheduled", "on_input": True}
    assert_problem(sensors, "execution", "declares its freshness")
    sensors["execution"] = {"mode": "continuous", "schedule": "@hourly"}
    assert_problem(sensors, "execution", "schedule: only for mode scheduled")
    sensors["execution"] = {"mode": "scheduled", "on_input": True, "freshness": "5 minutes"}
    sensors["supervision"] = {"standby": True}
    assert_problem(sensors, "supervision.standby", "holds no driver between its runs")
    plain = parse_spec({**sensors, "execution": {}, "supervision": {}})
    assert not compile_plan(plain, Layout(plain)).available_now
    sensors["execution"] = {"mode": "adaptive", "on_input": True, "freshness": "5 minutes", "continuous_above": 50}
    adaptive = parse_spec({**sensors, "supervision": {}}).execution
    assert adaptive.scheduled and adaptive.adaptive and adaptive.down_rate == 25
    decided = parse_spec({**sensors, "supervision": {}})
    assert not compile_plan(decided, Layout(decided)).available_now  # its supervisor decides run by run
    assert adaptive.describe() == ("adaptive (scheduled when input arrives; continuous from 50 records/s until below 25 "
                                   "for 10 minutes; freshness 5 minutes)")
    sensors["supervision"] = {}
    sensors["execution"] = {"mode": "adaptive", "on_input": True, "freshness": "5 minutes"}
    assert_problem(sensors, "execution", "from which input rate it runs continuously")
    sensors["execution"] = {"mode": "adaptive", "on_input": True, "freshness": "5 minutes", "continuous_above": 50,
                            "scheduled_below": 50}
    assert_problem(sensors, "execution", "would switch back and forth")
    sensors["execution"] = {"mode": "scheduled", "on_input": True, "freshness": "5 minutes", "continuous_above": 50}
    assert_problem(sensors, "execution", "continuous_above: only for mode adaptive")
    app = {"name": "app", "application": {"path": "applications/app.py", "queries": ["q"]}, "checkpoint": "c/app",
           "execution": {"mode": "scheduled", "on_input": True, "freshness": "5 minutes"}}
    assert_problem(app, "execution.mode", "an application runs its own queries")


def test_sizing_by_lag_is_for_a_continuous_driver_of_files_or_a_topic_with_a_trigger_interval(sensors: dict) -> None:
    sensors["execution"] = {"sizing": {"catch_up": "2 minutes", "max_per_trigger": 40}}
    sizing = parse_spec(sensors).execution.sizing
    assert (sizing.catch_up, sizing.utilisation, sizing.min_per_trigger, sizing.max_per_trigger) == (
        "2 minutes", 0.7, 1, 40)
    sensors["execution"] = {"sizing": {"min_per_trigger": 5, "max_per_trigger": 4}}
    assert_problem(sensors, "execution.sizing", "max_per_trigger (4) is below min_per_trigger (5)")
    sensors["execution"] = {"sizing": {"utilisation": 1.5}}
    assert_problem(sensors, "execution.sizing.utilisation", "less than or equal to 1")
    sensors["execution"] = {"sizing": {"min_trigger": "1 second", "max_trigger": "30 seconds"}}
    assert parse_spec(sensors).execution.sizing.max_trigger == "30 seconds"
    sensors["execution"] = {"sizing": {"min_trigger": "10 seconds", "max_trigger": "2 seconds"}}
    assert_problem(sensors, "execution.sizing", "max_trigger (2 seconds) is below min_trigger (10 seconds)")
    sensors["execution"] = {"sizing": {"min_trigger": "10 minutes"}}  # the stream's trigger, 5 seconds, the upper bound
    assert_problem(sensors, "execution.sizing.min_trigger", "is above the trigger (5 seconds)")
    sensors["execution"] = {"sizing": {"max_trigger": "1 second"}}
    assert_problem(sensors, "execution.sizing.max_trigger", "is below the trigger (5 seconds)")
    sensors["execution"] = {"mode": "scheduled", "on_input": True, "freshness": "5 minutes", "sizing": {}}
    assert_problem(sensors, "execution", "sizing: only for a continuous driver")
    sensors["execution"] = {"sizing": {}}
    assert_problem({**sensors, "trigger": {"available_now": True}}, "execution.sizing", "a processing_time trigger")
    rate = {**sensors, "source": {"type": "rate", "rows_per_second": 5}}
    assert_problem(rate, "execution.sizing", "landing files or a Kafka topic; this stream has none")


def test_a_relative_data_root_gives_the_same_table_url_as_its_absolute_path(tmp_path: Path, sensors: dict,
                                                                             monkeypatch) -> None:
    """The default database lies in the data root once, whether the root is given relative or absolute."""
    spec = parse_spec(copy.deepcopy(sensors))
    monkeypatch.chdir(tmp_path)
    relative, absolute = Layout(spec, "data/demo", SPEC_DIR), Layout(spec, tmp_path / "data" / "demo", SPEC_DIR)
    sink = spec.outputs[2].sink
    assert relative.table_url(sink) == absolute.table_url(sink) == f"sqlite:///{tmp_path / 'data' / 'demo' / 'tables.db'}"
