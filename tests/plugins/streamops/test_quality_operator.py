"""The validation operator: the spark-submit it runs, and how it reports a run's result."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from unittest import mock

import pytest
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs.spec.layout import default_spec_dir
from streamops.operators.quality import QUALITY_JOB, ValidateStreamOperator

UNIT = {"unit": "2026-01-01T00:10:00Z", "rows": 3, "status": "passed", "failed": []}


def result(ok: bool, problems: list[str] | None = None) -> dict:
    failed = {**UNIT, "unit": "2026-01-01T00:15:00Z", "status": "failed", "failed": problems or []}
    return {"stream": "sensors", "outputs": [{"output": "site_temperature_10m", "units": [UNIT] + ([] if ok else [failed])}],
            "skipped": [], "accounting": {"input": 10, "quarantined": 1, "quarantine_rate": 0.1,
                                          "max_quarantine_rate": 0.2, "ok": True, "balances": []},
            "problems": problems or [], "ok": ok, "summary": "/data/quality/sensors/index.html",
            "docs": "/data/quality/sensors/gx/uncommitted/data_docs/local_site/index.html"}


def run(tmp_path: Path, outcome: dict, **kwargs) -> tuple[ValidateStreamOperator, dict | Exception, list[str]]:
    op = ValidateStreamOperator(task_id="validate", stream="sensors", spec_dir=str(default_spec_dir()),
                                data_root=str(tmp_path), **kwargs)
    seen = {}

    def submit(self, context) -> None:  # noqa: ANN001 - stands in for SparkSubmitOperator.execute
        seen["command"] = self._get_hook()._build_spark_submit_command(self.application)
        out = Path(self.application_args[self.application_args.index("--result") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(outcome))

    with mock.patch.object(SparkSubmitOperator, "execute", submit):
        try:
            value = op.execute({"run_id": "scheduled__2026-01-01T00:00:00+00:00"})
        except AirflowFailException as exc:
            value = exc
    return op, value, seen["command"]


def test_runs_the_quality_job_with_the_spec_and_a_result_file(tmp_path: Path) -> None:
    op, value, command = run(tmp_path, result(True), conn_id="spark_default")
    result_file = tmp_path / "quality" / "sensors" / "runs" / "scheduled__2026-01-01T00_00_00_00_00.json"
    assert command[-7:] == [QUALITY_JOB, "--spec", f"{default_spec_dir()}/sensors.yaml", "--result", str(result_file),
                            "--data-root", str(tmp_path)]
    assert "spark-submit" in command[0] and "--name" in command and "quality:sensors" in command
    assert op.env_vars["PYSPARK_PYTHON"] == sys.executable
    assert value == {"stream": "sensors", "units": 1, "failed": 0, "rows": 3, "accounting": True,
                     "summary": "/data/quality/sensors/index.html"}


def test_a_backfill_validation_passes_its_range(tmp_path: Path) -> None:
    _, _, command = run(tmp_path, result(True), backfill_start="2026-01-01T00:00:00+00:00",
                        backfill_end="2026-01-02T00:00:00+00:00")
    assert command[-3:] == ["--backfill", "2026-01-01T00:00:00+00:00", "2026-01-02T00:00:00+00:00"]


def test_an_earlier_run_validated_again_passes_its_id_and_a_bad_id_is_refused_before_spark(tmp_path: Path) -> None:
    _, _, command = run(tmp_path, result(True), again="20260101T000000Z-1a2b3c")
    assert command[-2:] == ["--again", "20260101T000000Z-1a2b3c"]
    for empty in ("", "None"):  # the DAG's param left empty
        _, _, command = run(tmp_path, result(True), again=empty)
        assert "--again" not in command

    op = ValidateStreamOperator(task_id="validate", stream="sensors", spec_dir=str(default_spec_dir()),
                                data_root=str(tmp_path), again="x; rm -rf /")
    with mock.patch.object(SparkSubmitOperator, "execute") as submit, \
            pytest.raises(AirflowFailException, match="is not a validation run's id"):
        op.execute({"run_id": "manual__1"})
    submit.assert_not_called()


def test_a_failed_validation_fails_the_task_with_a_readable_summary(tmp_path: Path) -> None:
    problem = ("site_temperature_10m 2026-01-01T00:15:00Z (3 rows): expect_column_values_to_be_between"
               "(max_temperature): 1 of 3 rows unexpected, e.g. [999.0]")
    _, error, _ = run(tmp_path, result(False, [problem]))
    assert isinstance(error, AirflowFailException)
    message = str(error)
    assert message.startswith("data quality of stream sensors FAILED: 1 of 2 unit(s) failed; 1 problem(s):")
    assert problem in message and "/streams/sensors/quality/" in message


def test_only_the_newest_run_results_are_kept(tmp_path: Path) -> None:
    import os

    runs = tmp_path / "quality" / "sensors" / "runs"
    runs.mkdir(parents=True)
    for i in range(205):
        (runs / f"old-{i:03d}.json").write_text("{}")
        os.utime(runs / f"old-{i:03d}.json", (1000 + i, 1000 + i))
    run(tmp_path, result(True))
    kept = sorted(p.name for p in runs.glob("*.json"))
    assert len(kept) == 200 and "old-000.json" not in kept and "scheduled__2026-01-01T00_00_00_00_00.json" in kept


def test_a_job_that_wrote_no_result_fails_the_task(tmp_path: Path) -> None:
    op = ValidateStreamOperator(task_id="validate", stream="sensors", data_root=str(tmp_path))
    with mock.patch.object(SparkSubmitOperator, "execute", lambda self, context: None):
        with pytest.raises(AirflowFailException, match="the validation job of sensors wrote no result"):
            op.execute({"run_id": "manual__1"})
