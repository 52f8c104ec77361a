"""Fixtures for the Airflow side: one real run of an example stream, copied per test."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.testdata import generate
from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec

SPEC = default_spec_dir() / "sensors.yaml"


@pytest.fixture(scope="session")
def pristine(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stream") / "data"
    files = 2 * load_spec(SPEC).source.max_files_per_trigger + 2  # three micro-batches
    assert generate.main(["--spec", str(SPEC), "--data-root", str(root), "--files", str(files),
                          "--events-per-file", "30", "--seed", "3"]) == 0
    spec = load_spec(SPEC)
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, Layout(spec, root, default_spec_dir())))
    return root


@pytest.fixture
def data_root(pristine: Path, tmp_path: Path) -> Path:
    """A copy of that run's data root, for one test to change."""
    root = tmp_path / "data"
    shutil.copytree(pristine, root)
    return root


@pytest.fixture(scope="module")
def metadata_db() -> None:
    """Airflow's metadata database with the project's DAGs in it (``ui_client.sync_dags``)."""
    from ui_client import sync_dags

    sync_dags()
