"""The sensors example run once (sliding windows closed, a table, a SQL output), then edited
and started again: what the tests of changes and upgrades share."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest
import yaml
from examples import example_spec, include_with

from runner.testdata import generate
from spark_jobs import changes, stream_job
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import previous_plan
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec

#: event time between two generated events: 200 events span 40 minutes, so windows close
EVENT_INTERVAL_MS = 12_000
HOT = {"name": "hot", "mode": "append", "sink": {"type": "parquet", "path": "sinks/sensors/hot"},
       "query": {"type": "sql", "sql": "SELECT event_id, device_id, temperature FROM accepted WHERE temperature > 25"}}


def _spec() -> dict:
    data = example_spec("sensors")
    data["outputs"].append(HOT)
    return data


def in_session(spark, monkeypatch) -> None:
    """Jobs run in the tests' session, which outlives them."""
    monkeypatch.setattr("spark_jobs.runtime.session.build_session", lambda *a, **kw: spark)
    monkeypatch.setattr(spark, "stop", lambda: None)


def start(spark, spec_file: Path, data_root: Path, monkeypatch) -> int:
    """One bare start of the stream job on what waits (available now), in the tests' session."""
    in_session(spark, monkeypatch)
    return stream_job.main(["--spec", str(spec_file), "--data-root", str(data_root), "--trigger", "available-now"])


def run_beside(spark, spec_file: Path, data_root: Path, monkeypatch, operate, join_seconds: float = 30) -> int:
    """The stream job at a 1-second trigger in the tests' session, while ``operate`` runs on a thread
    of its own (it ends the job, as an operator would: the stop marker); the job's exit code."""
    operator = threading.Thread(target=operate, daemon=True)
    operator.start()
    in_session(spark, monkeypatch)
    code = stream_job.main(["--spec", str(spec_file), "--data-root", str(data_root), "--processing-time", "1 second"])
    operator.join(join_seconds)
    return code


@pytest.fixture(scope="module")
def ran(spark, tmp_path_factory) -> tuple[Path, Path, Path]:
    """The stream run once (sliding windows closed, a table, a SQL output): its include/ and data
    root, and a copy of both. The copy is put back in place (the same paths: Spark's file-sink logs
    name absolute paths) before each test (:func:`stream`)."""
    root = tmp_path_factory.mktemp("changes")
    return run_once(spark, root, include_with(root / "run" / "include", _spec()) / "sensors.yaml", files=8)


def run_once(spark, root: Path, spec_file: Path, files: int) -> tuple[Path, Path, Path]:
    """The stream of ``spec_file`` (under ``root / "run"``) fed ``files`` files and run once, its data
    root beside its include/; the run copied to ``root / "pristine"`` (:func:`as_it_ran`)."""
    data = root / "run" / "data"
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", str(files),
                          "--events-per-file", "25", "--seed", "4", "--event-interval-ms", str(EVENT_INTERVAL_MS)]) == 0
    with pytest.MonkeyPatch.context() as mp:
        assert start(spark, spec_file, data, mp) == stream_job.EXIT_OK
    _copy(root / "run", root / "pristine")
    return spec_file, data, root


def _copy(source: Path, target: Path) -> None:
    """A run's folder copied. A file gone between the listing and its copy is left out: the driver's
    progress listener stays on the tests' session after the job returned, and its last events may
    still be written (the event history's SQLite journal comes and goes meanwhile)."""

    def copy(src: str, dst: str) -> None:
        try:
            shutil.copy2(src, dst)
        except FileNotFoundError:
            pass

    shutil.copytree(source, target, copy_function=copy)


def _remove(folder: Path) -> None:
    """A run's folder removed. The lingering progress listener (see :func:`_copy`) may write an event
    into it meanwhile, which a single removal then finds in a folder it is emptying: removed again."""
    for _ in range(100):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            return
    shutil.rmtree(folder)  # still there: say why


def as_it_ran(ran: tuple[Path, Path, Path]) -> tuple[Path, Path]:
    """The run of :func:`run_once` put back as it was, for one test to edit and start again."""
    spec_file, data, root = ran
    _remove(root / "run")
    _copy(root / "pristine", root / "run")
    return spec_file, data


@pytest.fixture
def stream(ran) -> tuple[Path, Path]:
    """That run as it was, for one test to edit and start again."""
    return as_it_ran(ran)


def edit(spec_file: Path, change) -> Path:
    data = yaml.safe_load(spec_file.read_text())
    change(data)
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec_file


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but a driver's own records (its events, its lease's tenure)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and "_events" not in p.parts and "lease" not in p.parts}


def verdicts(spec_file: Path, data: Path) -> dict[str, changes.Verdict]:
    spec = load_spec(spec_file)
    layout = Layout(spec, data, spec_file.parent)
    found = changes.judge(compile_plan(spec, layout), previous_plan(layout), str(spec_file), spec.event_time.watermark)
    return {v.flow: v for v in found}


def window(data: dict, **query) -> dict:
    (out,) = [o for o in data["outputs"] if o["name"] == "site_temperature_10m"]
    out["query"] |= query
    return out


