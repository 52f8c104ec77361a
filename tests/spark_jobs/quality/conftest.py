"""Fixtures for data-quality tests: one real run of the sensors stream with closed windows."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from runner.testdata import generate
from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.plan import StreamPlan
from spark_jobs.runtime.checkpoint import last_batch
from spark_jobs.runtime.progress import (
    EventLog,
    ProgressListener,
    read_events,
)
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec

INCLUDE = default_spec_dir().parent


def run_as_the_job(spark, plan: StreamPlan, layout: Layout) -> None:
    """Process what waits (available-now), writing progress and ingestion events as the job does.
    ``plan``: the stream's, its transform analyzed (``analysis.resolve_plan``)."""
    events = EventLog(layout.events_file)
    listener = ProgressListener(events, plan.stream, plan.spark_query_names).add(spark)
    try:
        flows.run_available_now(spark, plan, on_batch=events.write)

        def events_written() -> bool:  # the listener bus delivers events asynchronously
            seen = {(e["query"], e["batch_id"]) for e in read_events(layout.events_file) if e["event"] == "progress"}
            return all((name, last_batch(ckpt, "commits")) in seen for name, ckpt in plan.checkpoints.items())

        deadline = time.monotonic() + 60
        while not events_written():
            assert time.monotonic() < deadline, "progress events of the last batches were not written"
            time.sleep(0.1)
    finally:
        listener.remove(spark)


@pytest.fixture
def job_run(spark):
    """:func:`run_as_the_job` with the shared session."""
    return lambda plan, layout: run_as_the_job(spark, plan, layout)


@pytest.fixture(scope="session")
def closed_run(spark, tmp_path_factory) -> tuple[Path, Path]:
    """A finished run (8 files, 80 minutes of event time, so windows and an hour close): its
    data root and a pristine copy of it.

    A file sink's metadata log holds absolute paths, so a copy elsewhere is no sink: tests
    work in the run's own folder, restored from the copy before each test.
    """
    root = tmp_path_factory.mktemp("quality") / "data"
    spec_path = default_spec_dir() / "sensors.yaml"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "8",
                          "--events-per-file", "40", "--event-interval-ms", "15000", "--seed", "11"]) == 0
    spec = load_spec(spec_path)
    layout = Layout(spec, root, default_spec_dir())
    run_as_the_job(spark, analysis.resolve_plan(spark, spec, layout), layout)
    pristine = root.with_name("pristine")
    shutil.copytree(root, pristine, symlinks=True)
    return root, pristine


@pytest.fixture
def include(tmp_path: Path) -> Path:
    """A copy of include/ (specs, reference data, rules) that a test may change."""
    copy = tmp_path / "include"
    shutil.copytree(INCLUDE, copy)
    return copy


@pytest.fixture
def data_root(closed_run: tuple[Path, Path]) -> Path:
    root, pristine = closed_run
    shutil.rmtree(root)
    shutil.copytree(pristine, root, symlinks=True)
    return root
