"""Changes whose effect the plan cannot tell (a Python transform, Python queries), settled by a
rehearsal of one micro-batch on a copy of the checkpoint (spark_jobs.rehearsal)."""

from __future__ import annotations

from pathlib import Path

import pytest
from edited_streams import EVENT_INTERVAL_MS, as_it_ran, edit, files_under, in_session, run_once, start
from examples import example_spec, include_with

from runner.testdata import generate
from spark_jobs import changes, check, stream_job, upgrade
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import previous_plan
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec

#: the Python code the stream runs, in each version an edit may name (every module is there from the
#: first start on: the tests' session imports a module once)
MODULES = {
    "cleaning_v1": "def transform(rows):\n    return rows\n",
    # the same columns, other values: a change of meaning Spark's checkpoint takes (like a SQL filter)
    "cleaning_v2": "from pyspark.sql import functions as F\n\n\ndef transform(rows):\n"
                   "    return rows.withColumn('temperature', F.round('temperature', 0))\n",
    "windows_10m": "from pyspark.sql import functions as F\n\n\ndef counts(accepted):\n"
                   "    return accepted.groupBy(F.window('ts', '10 minutes'), 'device_id').count()\n",
    # the state's schema stays the same, its windows do not: Spark resumes it without a word
    "windows_15m": "from pyspark.sql import functions as F\n\n\ndef counts(accepted):\n"
                   "    return accepted.groupBy(F.window('ts', '15 minutes'), 'device_id').count()\n",
    "warm_v1": "def rows(accepted):\n    return accepted.where('temperature > 20').select('event_id', 'temperature')\n",
    "warm_v2": "def rows(accepted):\n    return accepted.where('temperature > 25').select('event_id', 'temperature')\n",
}
WINDOWS = {"name": "device_windows", "mode": "append", "sink": {"type": "parquet", "path": "sinks/sensors/windows"},
           "query": {"type": "python", "python": "windows_10m:counts"}}
WARM = {"name": "warm", "mode": "append", "sink": {"type": "parquet", "path": "sinks/sensors/warm"},
        "query": {"type": "python", "python": "warm_v1:rows"}}


@pytest.fixture(scope="module")
def ran(spark, tmp_path_factory) -> tuple[Path, Path, Path]:
    """The sensors stream with a Python transform and two Python outputs, run once; a copy of it."""
    root = tmp_path_factory.mktemp("rehearsal")
    data = example_spec("sensors")
    data["transform"] = {"python": "cleaning_v1:transform"}
    data["outputs"] = [o for o in data["outputs"] if o["name"] == "readings"] + [WINDOWS, WARM]
    spec_file = include_with(root / "run" / "include", data) / "sensors.yaml"
    (root / "run" / "include" / "expectations" / "sensors.yaml").unlink()  # its rules name the outputs left out
    (root / "run" / "include" / "transforms").mkdir()
    for name, text in MODULES.items():
        (root / "run" / "include" / "transforms" / f"{name}.py").write_text(text)
    return run_once(spark, root, spec_file, files=6)


@pytest.fixture
def stream(ran) -> tuple[Path, Path]:
    return as_it_ran(ran)


def _query(name: str, python: str):
    return lambda d: next(o for o in d["outputs"] if o["name"] == name)["query"].update(python=python)


def _judged(spec_file: Path, data: Path) -> dict[str, changes.Verdict]:
    spec = load_spec(spec_file)
    layout = Layout(spec, data, spec_file.parent)
    found = changes.judge(compile_plan(spec, layout), previous_plan(layout), str(spec_file), spec.event_time.watermark)
    return {v.flow: v for v in found}


def _rehearsed(spark, spec_file: Path, data: Path, capsys) -> dict[str, str]:
    """``python -m spark_jobs.check SPEC --rehearse``: each flow's verdict as it prints them."""
    capsys.readouterr()
    check.main([str(spec_file), "--data-root", str(data), "--rehearse"])
    printed = capsys.readouterr().out
    return {line.split(": ")[0].removeprefix("output ").strip(): line.split(": ")[1].strip()
            for line in printed.splitlines() if line.startswith(("ingestion: ", "output "))}


def test_a_rehearsal_settles_a_changed_transform_and_a_resized_python_window_without_touching_the_live_stream(
        spark, stream, monkeypatch, capsys) -> None:
    spec_file, data = stream
    edit(spec_file, lambda d: (d["transform"].update(python="cleaning_v2:transform"),
                               _query("device_windows", "windows_15m:counts")(d)))
    spec = load_spec(spec_file)
    layout = Layout(spec, data, spec_file.parent)
    judged = _judged(spec_file, data)
    assert judged["_ingest"].verdict == judged["device_windows"].verdict == changes.UNKNOWN, changes.report(list(judged.values()))
    live = {p: files_under(Path(p)) for p in [*compile_plan(spec, layout).checkpoints.values(),
                                               layout.data("sinks/sensors/windows"), layout.data("sinks/sensors/readings")]}
    assert _rehearsed(spark, spec_file, data, capsys) == {
        "ingestion": "compatible", "readings": "unchanged", "device_windows": "rebuild", "warm": "unchanged"}
    # the live checkpoints and sinks byte for byte as they were; the scratch gone, the settlement kept
    assert {p: files_under(Path(p)) for p in live} == live
    assert [p.suffix for p in changes.rehearsals_dir(compile_plan(spec, layout)).iterdir()] == [".json"]
    found = _judged(spec_file, data)
    assert found["_ingest"].verdict == changes.COMPATIBLE, found["_ingest"].text()
    assert "Spark resumed the checkpoint and the state it kept equals the live state" in found["_ingest"].text()
    assert found["device_windows"].verdict == changes.REBUILD
    assert "the same input left other state" in found["device_windows"].text()
    # a driver's start judges the change as settled: the resized window is refused, not the transform
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_BAD_SPEC
    assert {p: files_under(Path(p)) for p in live} == live


def test_a_stateless_python_query_rehearsed_compatible_runs_and_an_edit_afterwards_is_unknown_again(
        spark, stream, monkeypatch) -> None:
    spec_file, data = stream
    edit(spec_file, _query("warm", "warm_v2:rows"))
    assert _judged(spec_file, data)["warm"].verdict == changes.UNKNOWN
    in_session(spark, monkeypatch)  # the upgrade DAG's first step, as it submits it
    assert upgrade.main(["--spec", str(spec_file), "--data-root", str(data), "--step", "rehearse"]) == upgrade.EXIT_OK
    rehearsed = _judged(spec_file, data)["warm"]
    assert rehearsed.verdict == changes.COMPATIBLE and "it keeps no state" in rehearsed.text(), rehearsed.text()
    layout = Layout(load_spec(spec_file), data, spec_file.parent)
    warm = layout.data("sinks/sensors/warm")
    before = set(files_under(Path(warm)))
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", "2", "--events-per-file",
                          "25", "--seed", "7", "--event-interval-ms", str(EVENT_INTERVAL_MS)]) == 0
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # settled: the driver runs it
    new = [str(Path(warm) / f) for f in set(files_under(Path(warm))) - before if f.endswith(".parquet")]
    assert new and all(r["temperature"] > 25 for r in spark.read.parquet(*new).collect())
    # the code behind an unchanged reference edited afterwards: another change, unknown until rehearsed
    module = spec_file.parent.parent / "transforms" / "warm_v2.py"
    module.write_text(module.read_text().replace("> 25", "> 26"))
    edit(spec_file, lambda d: None)
    found = _judged(spec_file, data)
    assert found["warm"].verdict == changes.UNKNOWN and "the code of warm_v2:rows changed" in found["warm"].text()
