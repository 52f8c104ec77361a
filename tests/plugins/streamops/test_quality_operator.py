"""The validation operator: a run validated in the task without Spark when its units are small,
else the spark-submit it runs; and how it reports a run's result."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from unittest import mock

import pytest
import yaml
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowFailException

from spark_jobs.stream_spec.layout import default_spec_dir
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
    """The operator's run with Spark (a run this task cannot validate itself), spark-submit faked."""
    op = ValidateStreamOperator(task_id="validate", stream="sensors", spec_dir=str(default_spec_dir()),
                                data_root=str(tmp_path), **kwargs)
    seen = {}

    def submit(self, context) -> None:  # stands in for SparkSubmitOperator.execute
        seen["command"] = self._get_hook()._build_spark_submit_command(self.application)
        out = Path(self.application_args[self.application_args.index("--result") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(outcome))

    with mock.patch.object(SparkSubmitOperator, "execute", submit), \
            mock.patch.object(ValidateStreamOperator, "validate_here", return_value=False):
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
                     "summary": "/data/quality/sensors/index.html", "engine": "spark"}


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
    with mock.patch.object(SparkSubmitOperator, "execute", lambda self, context: None), \
            mock.patch.object(ValidateStreamOperator, "validate_here", return_value=False):
        with pytest.raises(AirflowFailException, match="the validation job of sensors wrote no result"):
            op.execute({"run_id": "manual__1"})


# ---- in the task, or with Spark: a real run's units ------------------------------------------------


@pytest.fixture(scope="module")
def sensors_run(spark, tmp_path_factory) -> tuple[Path, Path]:
    """A real run of the sensors stream, and a pristine copy of it: a file sink's log holds its
    files' absolute paths, so a test works in the run's own folder, restored before each test."""
    from runner.testdata import generate
    from spark_jobs import analysis
    from spark_jobs.flows import queries as flows
    from spark_jobs.stream_spec.layout import Layout
    from spark_jobs.stream_spec.loading import load_spec

    root = tmp_path_factory.mktemp("sensors-run") / "data"
    spec_path = default_spec_dir() / "sensors.yaml"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "8", "--events-per-file",
                          "40", "--event-interval-ms", "15000", "--seed", "11"]) == 0  # windows and an hour close
    spec = load_spec(spec_path)
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, Layout(spec, root, default_spec_dir())))
    pristine = root.with_name("pristine")
    shutil.copytree(root, pristine, symlinks=True)
    return root, pristine


@pytest.fixture
def data_root(sensors_run: tuple[Path, Path]) -> Path:
    root, pristine = sensors_run
    shutil.rmtree(root)
    shutil.copytree(pristine, root, symlinks=True)
    return root


def test_small_units_are_validated_in_the_task_without_spark_submit(data_root: Path) -> None:
    op = ValidateStreamOperator(task_id="validate", stream="sensors", spec_dir=str(default_spec_dir()),
                                data_root=str(data_root), conn_id="spark_default")
    with mock.patch.object(SparkSubmitOperator, "execute") as submit, \
            mock.patch.object(SparkSubmitHook, "submit") as hook_submit, \
            mock.patch("subprocess.Popen") as popen:
        value = op.execute({"run_id": "asset_triggered__1"})
    submit.assert_not_called()
    hook_submit.assert_not_called()
    popen.assert_not_called()  # no spark-submit, no process of any kind
    assert value["engine"] == "pandas" and value["units"] >= 1 and value["failed"] == 0, value
    result = json.loads((data_root / "quality" / "sensors" / "runs" / "asset_triggered__1.json").read_text())
    assert result["engine"] == "pandas" and result["ok"]
    ledger = json.loads((data_root / "quality" / "sensors" / "ledger.json").read_text())
    assert ledger["runs"][-1]["engine"] == "pandas" and ledger["outputs"]["device_status"]["units"]


def test_units_above_pandas_max_rows_are_validated_by_spark_submit(data_root: Path, tmp_path: Path) -> None:
    include = tmp_path / "include"
    shutil.copytree(default_spec_dir().parent, include)
    rules_file = include / "expectations" / "sensors.yaml"
    rules = yaml.safe_load(rules_file.read_text())
    rules_file.write_text(yaml.safe_dump({**rules, "pandas_max_rows": 1}))
    op = ValidateStreamOperator(task_id="validate", stream="sensors", spec_dir=str(include / "streams"),
                                data_root=str(data_root), conn_id="spark_default")
    seen = {}

    def submit(self, context) -> None:  # stands in for SparkSubmitOperator.execute
        seen["command"] = self._get_hook()._build_spark_submit_command(self.application)
        seen["validated before"] = (data_root / "quality" / "sensors" / "ledger.json").exists()
        out = Path(self.application_args[self.application_args.index("--result") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result(True)))

    with mock.patch.object(SparkSubmitOperator, "execute", submit):
        value = op.execute({"run_id": "asset_triggered__2"})
    assert QUALITY_JOB in seen["command"] and "spark-submit" in seen["command"][0]
    assert seen["validated before"] is False  # the task validated nothing itself
    assert value["engine"] == "spark"


def test_a_run_that_fails_without_spark_is_validated_by_spark_submit(tmp_path: Path) -> None:
    with mock.patch("spark_jobs.quality_job.run_without_spark", side_effect=OSError("a file vanished")):
        _, value, command = run_here(tmp_path, result(True))
    assert QUALITY_JOB in command and value["engine"] == "spark"


def run_here(tmp_path: Path, outcome: dict) -> tuple[ValidateStreamOperator, dict, list[str]]:
    """The operator's run as it is: in the task if it can, else with spark-submit (faked)."""
    op = ValidateStreamOperator(task_id="validate", stream="sensors", spec_dir=str(default_spec_dir()),
                                data_root=str(tmp_path))
    seen = {}

    def submit(self, context) -> None:  # stands in for SparkSubmitOperator.execute
        seen["command"] = self._get_hook()._build_spark_submit_command(self.application)
        out = Path(self.application_args[self.application_args.index("--result") + 1])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(outcome))

    with mock.patch.object(SparkSubmitOperator, "execute", submit):
        value = op.execute({"run_id": "manual__1"})
    return op, value, seen["command"]
