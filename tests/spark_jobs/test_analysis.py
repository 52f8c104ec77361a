"""What only Spark can tell about a spec, and the plan it gives (spark_jobs.analysis); the dry run (spark_jobs.check).

tests/spark_jobs/bad_sql/ holds one realistic mistake per file, each starting with
``# expect: <field>: <message>``: the field and the beginning of Spark's message (or the
platform's). Every example spec passes.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from runner.kafka import ensure_topics
from spark_jobs import analysis, check
from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import KafkaSource, SpecError, StreamSpec

CORPUS = Path(__file__).resolve().parent / "bad_sql"
FILES = sorted(CORPUS.glob("*.yaml"))
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "include" / "streams").glob("*.yaml"))
HEADER = re.compile(r"^# expect: (?P<field>[^:]+): (?P<message>.+)\n")


def analyze_file(spark, path: Path, spec: StreamSpec | None = None) -> StreamPlan | None:
    """What a driver analyzes before it starts the spec at ``path``."""
    spec = spec or load_spec(path)
    return analysis.analyze(spark, spec, Layout(spec, spec_dir=path.resolve().parent), path)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_spec_passes(spark, path: Path, request: pytest.FixtureRequest,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    source = load_spec(path).source
    if isinstance(source, KafkaSource):  # clicks: the tests' broker, holding its topic, where the spec looks
        broker = request.getfixturevalue("kafka_broker")
        ensure_topics(broker.bootstrap, source.topics or [], partitions=3)
        monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", broker.bootstrap)
    analyze_file(spark, path)


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_a_bad_sql_query_is_refused_naming_the_file_the_field_and_sparks_message(spark, path: Path) -> None:
    expect = HEADER.match(path.read_text(encoding="utf-8"))
    assert expect, f"{path.name} must start with '# expect: <field>: <message>'"
    spec = load_spec(path)  # valid as far as the spec alone can tell
    with pytest.raises(SpecError) as err:
        analyze_file(spark, path, spec)
    assert err.value.source == str(path)
    assert len(err.value.problems) == 1, err.value.problems
    (field, message), = err.value.problems
    assert field == expect["field"]
    assert message.startswith(expect["message"]), message
    assert "\n" not in message and " at org.apache" not in message  # Spark's message, not its stack or plan


def sql_spec(tmp_path: Path, outputs: list[dict], rules: dict | None = None) -> Path:
    """A copy of sensors.yaml with these outputs, in an include/ folder of its own."""
    include = tmp_path / "include"
    (include / "streams").mkdir(parents=True)
    example = yaml.safe_load((EXAMPLES[0].parent / "sensors.yaml").read_text(encoding="utf-8"))
    example["outputs"] = outputs
    path = include / "streams" / "sensors.yaml"
    path.write_text(yaml.safe_dump(example), encoding="utf-8")
    if rules is not None:
        (include / "expectations").mkdir()
        (include / "expectations" / "sensors.yaml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    return path


HOURLY = {"name": "hourly", "mode": "append", "sink": {"type": "parquet", "path": "sinks/sensors/hourly"},
          "query": {"type": "sql", "sql": (
              "SELECT window.start AS window_start, window.end AS window_end, site, avg(temperature) AS avg_temp "
              "FROM accepted GROUP BY window(ts, '1 hour'), site")}}


def test_a_windowed_sql_query_in_append_mode_and_its_result_columns(spark, tmp_path: Path) -> None:
    path = sql_spec(tmp_path, [HOURLY])
    spec = load_spec(path)
    columns, problems = analysis.result_columns(spark, spec, compile_plan(spec, Layout(spec)))
    assert problems == []
    assert columns == {"hourly": [("window_start", "timestamp"), ("window_end", "timestamp"), ("site", "string"),
                                  ("avg_temp", "double")]}


def test_quality_rules_of_a_sql_output_name_columns_of_its_result(spark, tmp_path: Path) -> None:
    rules = {"outputs": {"hourly": {"expectations": [
        {"expect_column_values_to_not_be_null": {"column": "site"}},
        {"expect_column_values_to_be_between": {"column": "avg_temperature", "min_value": -50, "max_value": 60}},
    ]}}}
    path = sql_spec(tmp_path, [HOURLY], rules)
    with pytest.raises(SpecError) as err:
        analyze_file(spark, path)
    assert err.value.source.endswith("include/expectations/sensors.yaml")
    assert err.value.problems == [("outputs.hourly.expectations[1].expect_column_values_to_be_between.column",
                                   "unknown column 'avg_temperature'; the output has "
                                   "['window_start', 'window_end', 'site', 'avg_temp']")]


def test_the_command_checks_every_file_and_exits_2_if_one_fails(tmp_path: Path, capsys) -> None:
    good = sql_spec(tmp_path, [HOURLY])
    bad = tmp_path / "unknown_view.yaml"
    shutil.copy(CORPUS / "unknown_view.yaml", bad)
    assert check.main([str(good)]) == 0
    assert check.main([str(good), str(bad)]) == 2
    out, err = capsys.readouterr()
    assert f"{good}: ok" in out
    assert f"{bad}: outputs[0].query.sql: [TABLE_OR_VIEW_NOT_FOUND]" in err


def test_the_stream_job_exits_2_on_a_bad_query_before_it_starts_anything(spark, tmp_path: Path, monkeypatch,
                                                                          caplog) -> None:
    from spark_jobs import stream_job
    from spark_jobs.stream_spec.layout import Layout

    path = CORPUS / "append_aggregation_without_window.yaml"
    monkeypatch.setattr("spark_jobs.runtime.session.build_session", lambda *a, **kw: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)  # the shared session outlives the job
    with caplog.at_level("ERROR", logger="stream_job"):
        code = stream_job.main(["--spec", str(path), "--data-root", str(tmp_path), "--trigger", "available-now"])
    assert code == stream_job.EXIT_BAD_SPEC
    assert f"{path}: outputs[0].mode: Spark cannot run the query in append mode" in caplog.text
    layout = Layout(load_spec(path), tmp_path, CORPUS)
    assert not layout.plan_file.exists() and not Path(layout.checkpoint_root, "_ingest").exists()
    assert spark.streams.active == []


def test_the_stream_job_runs_a_transform_as_spark_analyzed_it(spark, tmp_path: Path, monkeypatch) -> None:
    from spark_jobs import stream_job
    from spark_jobs.frames import accepted_batch
    from spark_jobs.stream_spec.layout import Layout

    readings = {"name": "readings", "mode": "append", "query": {"type": "passthrough"},
                "sink": {"type": "parquet", "path": "sinks/sensors/readings", "partition_by": ["event_date"]}}
    hot = {"name": "hot_sites", "mode": "complete", "sink": {"type": "table", "table": "hot_sites"},
           "query": {"type": "aggregate", "group_by": ["region"], "aggregates": [{"name": "n", "fn": "count"}]}}
    path = sql_spec(tmp_path, [readings, hot])
    spec_data = yaml.safe_load(path.read_text(encoding="utf-8"))
    spec_data["transform"] = {"sql": "SELECT event_id, ts, upper(site) AS region, temperature FROM input "
                                     "WHERE temperature > 30"}
    path.write_text(yaml.safe_dump(spec_data), encoding="utf-8")
    shutil.copytree(EXAMPLES[0].parent.parent / "reference", tmp_path / "include" / "reference")
    spec = load_spec(path)
    layout = Layout(spec, tmp_path / "data", path.parent)
    landing = compile_plan(spec, layout).source.landing
    Path(landing).mkdir(parents=True)
    Path(landing, "part-0.json").write_text("".join(
        f'{{"event_id": "e{i}", "device_id": "dev-00{i % 2}", "ts": "2026-01-01T00:0{i}:00Z", "temperature": {25 + 2 * i}}}\n'
        for i in range(6)), encoding="utf-8")
    monkeypatch.setattr("spark_jobs.runtime.session.build_session", lambda *a, **kw: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)  # the shared session outlives the job
    plans = plans_built(monkeypatch)
    code = stream_job.main(["--spec", str(path), "--data-root", str(tmp_path / "data"), "--trigger", "available-now"])
    assert code == stream_job.EXIT_OK
    assert len(plans) == 1  # analysis compiles the plan once; everything after works from it
    ingestion = json.loads(layout.plan_file.read_text(encoding="utf-8"))["ingestion"]
    assert ingestion["accepted_columns"] == {"event_id": "string", "ts": "timestamp", "region": "string",
                                             "temperature": "double", "event_date": "date"}
    assert ingestion["transform_multiplies"] is False
    assert compile_plan(spec, layout).accepted_path.endswith("sinks/sensors/readings")  # the pass-through is served: every column
    rows = accepted_batch(spark, _plan_ingestion(spark, path, layout)).collect()
    assert sorted((r["event_id"], r["region"]) for r in rows) == [("e3", "SOUTH"), ("e4", "NORTH"), ("e5", "SOUTH")]


def plans_built(monkeypatch) -> list[StreamPlan]:
    """Every stream plan built from now on, by whichever module builds it."""
    import spark_jobs.plan

    built: list[StreamPlan] = []

    class Counted(StreamPlan):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(spark_jobs.plan, "StreamPlan", Counted)
    return built


def _plan_ingestion(spark, path: Path, layout):
    from spark_jobs.analysis import resolve_plan

    return resolve_plan(spark, load_spec(path), layout).ingestion


def only_problem(spark, path: Path) -> tuple[str, str] | None:
    """The one problem the check finds in the spec at ``path`` (naming that file), or None."""
    try:
        analyze_file(spark, path)
    except SpecError as err:
        assert err.source == str(path)
        (problem,) = err.problems
        return problem
    return None


def python_output(tmp_path: Path, code: str, ref: str) -> tuple[Path, str]:
    """A spec with one Python output whose module (a package of its own) holds ``code``."""
    package = f"queries_{tmp_path.name.replace('-', '_')}"
    path = sql_spec(tmp_path, [{"name": "py", "mode": "append", "sink": {"type": "parquet", "path": "sinks/py"},
                                "query": {"type": "python", "python": f"{package}.{ref}"}}])
    folder = tmp_path / "include" / "transforms" / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "mod.py").write_text(code)
    return path, package


@pytest.mark.parametrize(("code", "ref", "message"), [
    ("def f(accepted):\n    return accepted.select('device_id', 'temperature')\n", "mod:f", None),
    ("", "nothere:f", "{package}.nothere:f: no module '{package}.nothere' in {folder}"),
    ("def g(accepted):\n    return accepted\n", "mod:f", "{package}.mod:f: module {package}.mod (in {folder}) "
                                                           "has no function 'f'"),
    ("import not_installed_anywhere\n", "mod:f", "{package}.mod:f: importing {package}.mod failed: "
                                                 "ModuleNotFoundError: No module named 'not_installed_anywhere'"),
    ("def f(accepted):\n    return accepted.count\n", "mod:f", "{package}.mod:f returned method, not a DataFrame"),
    ("def f(accepted):\n    return accepted.select('site_name')\n", "mod:f",
     "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `site_name`"),
    ("def f(accepted):\n    return accepted.sparkSession.table('devices')\n", "mod:f",
     "the query does not read the stream's accepted rows (its argument); it would never change"),
], ids=["ok", "no_module", "no_function", "import_fails", "not_a_dataframe", "unknown_column", "not_streaming"])
def test_a_python_query_is_checked_like_sql(spark, tmp_path: Path, code: str, ref: str, message: str | None) -> None:
    path, package = python_output(tmp_path, code, ref)
    problem = only_problem(spark, path)
    if message is None:
        assert problem is None
        return
    field, text = problem
    assert field == "outputs[0].query.python"
    folder = (tmp_path / "include" / "transforms").resolve()
    assert text.startswith(message.format(package=package, folder=folder)), text


@pytest.mark.parametrize(("source", "field", "message"), [
    ({"format": "socket", "options": {"host": "127.0.0.1", "port": 9}, "columns": [{"name": "line", "type": "string"}]},
     "source.columns[0].name", "the socket source gives no column 'line'; it has ['value']"),
    ({"format": "rate", "columns": [{"name": "timestamp", "type": "boolean"}]},
     "source.columns[0].type", "timestamp is timestamp in the source, which does not cast to boolean"),
    ({"format": "no_such_format", "columns": [{"name": "value", "type": "string"}]},
     "source", "Spark cannot read the no_such_format source: [DATA_SOURCE_NOT_FOUND]"),
    ({"format": "rate", "options": {"rowsPerSecond": 5}, "columns": [{"name": "value", "type": "long"}]}, None, None),
], ids=["unknown_column", "no_cast", "unknown_format", "ok"])
def test_a_spark_source_must_give_its_declared_columns(spark, tmp_path: Path, source: dict, field: str | None,
                                                      message: str | None) -> None:
    path = tmp_path / "stream.yaml"
    path.write_text(yaml.safe_dump({
        "name": "stream", "checkpoint": "checkpoints/stream", "source": {"type": "spark", **source},
        "outputs": [{"name": "rows", "query": {"type": "passthrough"}, "mode": "append", "sink": {"type": "memory"}}],
    }), encoding="utf-8")
    problem = only_problem(spark, path)
    if field is None:
        assert problem is None
        return
    got_field, text = problem
    assert got_field == field
    assert text.startswith(message), text


def test_a_stream_with_delta_tables_is_refused_without_delta_s_jars_or_extension(spark) -> None:
    from types import SimpleNamespace

    from spark_jobs.analysis import _delta_problems
    from spark_jobs.stream_spec.loading import parse_spec

    spec = parse_spec({"name": "to_delta", "checkpoint": "checkpoints/to_delta", "source": {"type": "rate"},
                       "outputs": [{"name": "rows", "mode": "append", "query": {"type": "passthrough"},
                                    "sink": {"type": "delta", "path": "delta/rows"}}]})
    plan = compile_plan(spec, Layout(spec))
    assert _delta_problems(spark, plan) == []  # the tests' session has both
    no_jars = SimpleNamespace(_jvm=SimpleNamespace(io=SimpleNamespace(delta=SimpleNamespace(tables=SimpleNamespace(
        DeltaTable=object())))))  # what py4j gives for a class the JVM does not have: no JavaClass
    ((field, message),) = _delta_problems(no_jars, plan)
    assert field == "outputs[0].sink.type" and "Delta Lake's jars are not on the driver's class path" in message
