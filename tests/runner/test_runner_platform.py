"""The platform's lifecycle around Airflow, with a stand-in for Airflow's services: running DAGs
to their end, and what it says meanwhile."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from runner.platform import Platform
from spark_jobs.stream_spec.layout import default_spec_dir
from spark_jobs.stream_spec.loading import load_specs


class FakeAirflow:
    """Runs end in the state given per DAG (None: never), after ``polls`` looks."""

    def __init__(self, ends: dict[str, str | None], polls: int = 1):
        self.ends, self.polls = ends, polls
        self.triggered: dict[str, dict[str, Any]] = {}
        self.looks: dict[str, int] = {}

    def trigger(self, dag_id: str, conf: dict[str, Any] | None = None) -> str:
        self.triggered[dag_id] = conf or {}
        return f"manual__{dag_id}"

    def runs(self, dag_id: str) -> list[dict]:
        self.looks[dag_id] = self.looks.get(dag_id, 0) + 1
        ended = self.looks[dag_id] >= self.polls and self.ends[dag_id] is not None
        return [{"run_id": "manual__older", "state": "success"},
                {"run_id": f"manual__{dag_id}", "state": self.ends[dag_id] if ended else "running"}]


@pytest.fixture
def platform(tmp_path: Path) -> tuple[Platform, list[str]]:
    specs, errors = load_specs(default_spec_dir())
    assert specs and not errors
    said: list[str] = []
    return Platform(specs, default_spec_dir(), tmp_path, port=8080, rate=0.5, events_per_file=40, master="local[2]",
                    out=said.append), said


def test_run_dags_triggers_all_and_waits_for_each_end(platform: tuple[Platform, list[str]]) -> None:
    p, said = platform
    p.airflow = FakeAirflow({"stream_a_stop": "success", "stream_b_stop": "failed"}, polls=2)
    states = p.run_dags({"stream_a_stop": {"mode": "graceful"}, "stream_b_stop": {"mode": "graceful"}}, 30,
                        interrupted=lambda: False)
    assert states == {"stream_a_stop": "success", "stream_b_stop": "failed"}
    assert p.airflow.triggered == {"stream_a_stop": {"mode": "graceful"}, "stream_b_stop": {"mode": "graceful"}}
    assert [re.sub(r"\d+ s$", "N s", line) for line in said] == [
        "    stream_a_stop: success after N s", "    stream_b_stop: failed after N s"]


def test_a_run_that_does_not_end_in_time_is_unfinished(platform: tuple[Platform, list[str]]) -> None:
    p, said = platform
    p.airflow = FakeAirflow({"stream_a_quality": "success", "stream_b_quality": None})
    states = p.run_dags({"stream_a_quality": {}, "stream_b_quality": {}}, 0, interrupted=lambda: False)
    assert states == {"stream_a_quality": "success", "stream_b_quality": "unfinished"}
    assert said[-1] == "    stream_b_quality: unfinished"


def test_the_platform_runs_airflow_in_the_data_root_with_the_spec_dir(platform: tuple[Platform, list[str]],
                                                                      tmp_path: Path) -> None:
    p, _ = platform
    assert p.airflow.home == tmp_path / "airflow" and p.airflow.url == "http://127.0.0.1:8080"
    assert p.airflow.env["STREAMS_SPEC_DIR"] == str(default_spec_dir())
    assert p.airflow.env["STREAMS_DATA_DIR"] == str(tmp_path)
    assert set(p.layouts) == set(p.specs) and not p.stopping()
