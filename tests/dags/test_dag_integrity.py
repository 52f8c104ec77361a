"""DAG integrity: every DAG file imports, every spec has its DAGs, a broken spec is an import error."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from spark_jobs.stream_spec.layout import default_spec_dir
from spark_jobs.stream_spec.loading import spec_files

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"


def dagbag(folder: Path):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(folder))


@pytest.fixture(scope="module")
def bag():
    return dagbag(DAGS)


def test_every_dag_file_imports_and_every_dag_serializes(bag) -> None:
    """As the DAG processor does: a DAG that fails to serialize never reaches the scheduler."""
    from airflow.serialization.serialized_objects import DagSerialization

    assert bag.import_errors == {}
    for dag in bag.dags.values():
        DagSerialization.to_dict(dag)


def test_every_spec_has_its_dag_file_and_dags(bag) -> None:
    for spec in spec_files(default_spec_dir()):
        name = spec.stem
        assert (DAGS / f"stream_{name}.py").exists(), f"{spec} has no DAG file dags/stream_{name}.py"
        for suffix in ("", "_stop", "_restart", "_backfill", "_quality"):
            assert f"stream_{name}{suffix}" in bag.dags, f"stream_{name}{suffix} missing (from {spec})"


def test_quality_runs_when_units_of_the_sinks_close_and_after_every_backfill(bag) -> None:
    from airflow.sdk import AssetAny

    from streamops.operators.quality import ValidateStreamOperator
    from streamops.triggers.sink_units import SinkUnitsTrigger

    quality = bag.dags["stream_sensors_quality"]
    assert quality.max_active_runs == 1 and "/streams/sensors/quality/" in quality.doc_md
    schedule = quality.timetable.asset_condition  # every sink of the stream, any of them
    assert isinstance(schedule, AssetAny)
    assets = {a.name: a for a in schedule.objects}
    assert set(assets) == {"stream_sensors.readings", "stream_sensors.site_temperature_10m",
                           "stream_sensors.device_status"}
    assert assets["stream_sensors.readings"].uri.startswith("file:///") and "sinks/sensors/readings" in \
        assets["stream_sensors.readings"].uri
    assert assets["stream_sensors.device_status"].uri.endswith("/sensors_device_status")
    for asset in assets.values():
        (watcher,) = asset.watchers
        assert isinstance(watcher.trigger, SinkUnitsTrigger) and watcher.trigger.output == asset.extra["output"]
    assert "at most one event per sink per 10 seconds" in quality.doc_md  # the rules' min_interval
    assert isinstance(quality.task_dict["validate"], ValidateStreamOperator)
    assert quality.task_dict["validate"].again == "{{ params.again or '' }}"  # an earlier run, validated again
    assert quality.params["again"] is None
    backfill = bag.dags["stream_sensors_backfill"]
    assert backfill.task_dict["validate"].upstream_task_ids == {"backfill"}
    assert backfill.task_dict["validate"].backfill_start == backfill.task_dict["backfill"].start


def test_a_backfill_run_of_a_day_reprocesses_that_whole_day(bag) -> None:
    """``airflow backfill create`` hands each run its data interval as the range: a whole day, not
    the empty interval of the trigger timetable Airflow 3 makes of ``schedule="@daily"``."""
    import pendulum
    from airflow.serialization.serialized_objects import DagSerialization

    dag = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["stream_sensors_backfill"]))
    day = pendulum.datetime(2026, 1, 1, tz="UTC")
    (run,) = dag.iter_dagrun_infos_between(day, day)
    assert (run.logical_date, run.data_interval.start, run.data_interval.end) == (day, day, day.add(days=1))


def test_dags_are_documented_and_tasks_have_retries_and_alerts(bag) -> None:
    from streamops.alerts import alert_on_failure

    for dag in bag.dags.values():
        assert dag.doc_md and dag.dag_id.removeprefix("stream_").split("_")[0] in dag.doc_md
        assert dag.start_date is not None and not dag.catchup
        for t in dag.tasks:
            callbacks = t.on_failure_callback if isinstance(t.on_failure_callback, list) else [t.on_failure_callback]
            assert alert_on_failure in callbacks, f"{dag.dag_id}.{t.task_id} has no failure alert"
        supervise = bag.dags[dag.dag_id].task_dict.get("supervise")
        if supervise is not None:
            assert supervise.retries >= 1, "a killed supervisor must be retried (and adopt its driver)"


def test_stop_dag_validates_its_params(bag) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    params = bag.dags["stream_sensors_stop"].params
    params.validate()
    with pytest.raises(ParamValidationError):
        params["mode"] = "sometimes"
        params.validate()


def test_a_broken_spec_is_an_import_error_naming_its_field(tmp_path: Path, monkeypatch) -> None:
    specs, dags = tmp_path / "streams", tmp_path / "dags"
    shutil.copytree(default_spec_dir(), specs)
    shutil.copytree(DAGS, dags, ignore=shutil.ignore_patterns("__pycache__"))
    broken = yaml.safe_load((specs / "clicks.yaml").read_text())
    broken["outputs"][1]["mode"] = "append"
    (specs / "clicks.yaml").write_text(yaml.safe_dump(broken))
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    bag = dagbag(dags)
    assert list(bag.import_errors) == [str(dags / "stream_clicks.py")]
    error = bag.import_errors[str(dags / "stream_clicks.py")]
    assert "clicks.yaml: outputs[1].mode: append mode on an aggregation needs" in error
    assert not any(d.startswith("stream_clicks") for d in bag.dags)
    assert "stream_sensors" in bag.dags  # the other streams keep working


def test_broken_quality_rules_are_an_import_error_naming_the_rules_file(tmp_path: Path, monkeypatch) -> None:
    include = tmp_path / "include"
    shutil.copytree(default_spec_dir().parent, include)
    rules = include / "expectations" / "sensors.yaml"
    rules.write_text(rules.read_text().replace("column: temperature, min_value: -40", "column: temp, min_value: -40"))
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(include / "streams"))
    bag = dagbag(DAGS)
    error = bag.import_errors[str(DAGS / "stream_sensors.py")]
    assert f"{rules}: outputs.readings.expectations[0].expect_column_values_to_be_between.column: unknown column 'temp'" in error
    assert "stream_clicks_quality" in bag.dags


def test_an_application_gets_the_dags_that_run_stop_and_restart_it(tmp_path: Path, monkeypatch) -> None:
    specs, dags = tmp_path / "streams", tmp_path / "dags"
    specs.mkdir()
    dags.mkdir()
    (specs / "rate_counts.yaml").write_text(
        "name: rate_counts\napplication: {path: applications/rate_counts.py, args: [--output, sinks/r], "
        "queries: [counts]}\ncheckpoint: checkpoints/rate_counts\nspark: {shuffle_partitions: 2}\n")
    (dags / "stream_rate_counts.py").write_text((DAGS / "stream_sensors.py").read_text().replace("sensors", "rate_counts"))
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    bag = dagbag(dags)
    assert not bag.import_errors
    assert sorted(bag.dags) == ["stream_rate_counts", "stream_rate_counts_restart", "stream_rate_counts_stop"]
    supervise = bag.dags["stream_rate_counts"].get_task("supervise")
    assert supervise.conf["spark.sql.shuffle.partitions"] == "2"
    assert "Application `applications/rate_counts.py` --output sinks/r, queries `counts`" in bag.dags[
        "stream_rate_counts"].doc_md


def test_every_driver_writes_through_the_platform_s_local_file_system_beside_a_spec_s_class_path(
        tmp_path: Path, monkeypatch) -> None:
    jar = tmp_path / "local-fs.jar"
    jar.write_bytes(b"")
    monkeypatch.setenv("STREAMS_LOCAL_FS_JAR", str(jar))
    specs = tmp_path / "streams"
    shutil.copytree(default_spec_dir(), specs)
    sensors = specs / "sensors.yaml"
    sensors.write_text(sensors.read_text() + "\nspark: {conf: {spark.driver.extraClassPath: /opt/udfs.jar}}\n")
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    bag = dagbag(DAGS)
    assert not bag.import_errors
    for dag_id, task_id in (("stream_sensors", "supervise"), ("stream_sensors_backfill", "backfill"),
                            ("stream_sensors_backfill", "validate"), ("stream_sensors_quality", "validate")):
        task = bag.dags[dag_id].get_task(task_id)
        assert task.conf["spark.hadoop.fs.file.impl"] == "streams.platform.hadoop.ForklessLocalFileSystem", task_id
        assert str(jar) in task.jars.split(","), task_id
    supervise = bag.dags["stream_sensors"].get_task("supervise")
    assert supervise.conf["spark.driver.extraClassPath"] == f"/opt/udfs.jar:{jar}"
    assert bag.dags["stream_clicks"].get_task("supervise").conf["spark.driver.extraClassPath"] == str(jar)


def test_a_stream_with_delta_tables_gets_a_maintenance_dag_on_its_spec_s_schedule(tmp_path: Path, monkeypatch) -> None:
    specs = tmp_path / "streams"
    shutil.copytree(default_spec_dir(), specs)
    sensors = specs / "sensors.yaml"
    sensors.write_text(sensors.read_text().replace("sink: {type: parquet, path: sinks/sensors/site_temperature_10m}",
                                                   "sink: {type: delta, path: delta/sensors/site_temperature_10m}")
                       + "\nmaintenance: {schedule: '30 2 * * *', vacuum_retention: 3 days}\n")
    assert "stream_sensors_maintenance" not in dagbag(DAGS).dags  # no Delta table, no upkeep
    assert dagbag(DAGS).dags["stream_clicks_maintenance"].timetable.expression == "30 * * * *"  # the example's
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    bag = dagbag(DAGS)
    assert not bag.import_errors
    dag = bag.dags["stream_sensors_maintenance"]
    assert dag.timetable.expression == "30 2 * * *"
    assert "`site_temperature_10m`" in dag.doc_md and "vacuum (retention 3 days)" in dag.doc_md
    task = dag.get_task("maintain")
    assert task.application.endswith("spark_jobs/maintenance.py") and task.retries == 0
    assert dag.params["retention"] is None


def test_a_standby_queue_puts_the_standby_task_on_other_workers_beside_the_supervisor(tmp_path: Path,
                                                                                       monkeypatch) -> None:
    specs = tmp_path / "streams"
    shutil.copytree(default_spec_dir(), specs)
    sensors = specs / "sensors.yaml"
    sensors.write_text(sensors.read_text().replace("supervision:\n", "supervision:\n  standby: true\n"
                                                                      "  standby_queue: standby-b\n"))
    assert "standby" not in dagbag(DAGS).dags["stream_sensors"].task_ids  # the example: none
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    bag = dagbag(DAGS)
    assert not bag.import_errors
    dag = bag.dags["stream_sensors"]
    supervise, standby = dag.get_task("supervise"), dag.get_task("standby")
    assert (supervise.queue, standby.queue) == ("streams", "standby-b")
    assert standby.supervisor_task_id == "supervise" and not standby.upstream_task_ids
    assert (standby.conf, standby.jars, standby.application_args) == (supervise.conf, supervise.jars,
                                                                      supervise.application_args)
    assert "warm standby: queue `standby-b`" in dag.doc_md


def test_a_scheduled_stream_runs_on_its_clock_and_when_input_waits(tmp_path: Path, monkeypatch) -> None:
    """``execution.mode: scheduled``: the stream DAG runs on the schedule's clock or on its input
    asset, whose watcher fires when input waits; no deploy sensor (a run ends with its driver)."""
    from datetime import timedelta

    from airflow.sdk import AssetAny

    from streamops.triggers.input_waiting import InputWaitingTrigger

    specs = tmp_path / "streams"
    shutil.copytree(default_spec_dir(), specs)
    sensors = specs / "sensors.yaml"
    example = sensors.read_text()
    assert type(dagbag(DAGS).dags["stream_sensors"].timetable).__name__ == "NullTimetable"  # continuous: when deployed
    sensors.write_text(example + "\nexecution: {mode: scheduled, schedule: 10 minutes, on_input: true, "
                                 "freshness: 15 minutes, input_poll: 5 seconds}\n")
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    bag = dagbag(DAGS)
    assert not bag.import_errors
    dag = bag.dags["stream_sensors"]
    assert dag.task_ids == ["supervise"] and dag.max_active_runs == 1 and not dag.catchup
    assert dag.timetable.timetable.delta == timedelta(minutes=10)  # every 10 minutes, or on input
    assert "scheduled (every 10 minutes and when input arrives; freshness 15 minutes)" in dag.doc_md
    (asset,) = dag.timetable.asset_condition.objects if isinstance(dag.timetable.asset_condition, AssetAny) else [
        dag.timetable.asset_condition]
    assert asset.name == "stream_sensors.input"
    (watcher,) = asset.watchers
    assert isinstance(watcher.trigger, InputWaitingTrigger)
    assert (watcher.trigger.stream, watcher.trigger.poll_seconds) == ("sensors", 5.0)
    upgrade = bag.dags["stream_sensors_upgrade"]  # offline: no driver to hold outputs in; the next run starts them
    order = ["check", "stop", "prepare", "rebuild", "swap", "resume", "start", "running", "watch"]
    for before, after in itertools.pairwise(order):
        assert upgrade.get_task(before).downstream_task_ids >= {after}, (before, after)
    assert not upgrade.get_task("prepare").online and upgrade.get_task("watch").scheduled
    sensors.write_text(example + "\nexecution: {mode: scheduled, on_input: true, freshness: 15 minutes}\n")
    on_input = dagbag(DAGS).dags["stream_sensors"].timetable  # on input alone
    assert not hasattr(on_input, "timetable") and on_input.asset_condition.name == "stream_sensors.input"
    sensors.write_text(example + "\nexecution: {mode: scheduled, schedule: '*/5 * * * *', freshness: 15 minutes}\n")
    assert dagbag(DAGS).dags["stream_sensors"].timetable.expression == "*/5 * * * *"  # on the clock alone


def test_a_shared_driver_dag_exists_once_a_stream_sends_its_runs_to_one(tmp_path: Path, monkeypatch) -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    from streamops.operators.shared_driver import SharedDriverOperator

    assert "shared_driver" not in dagbag(DAGS).dags  # no stream of the platform's own does
    specs = tmp_path / "streams"
    shutil.copytree(default_spec_dir(), specs)
    sensors = specs / "sensors.yaml"
    sensors.write_text(sensors.read_text() + "\nexecution: {mode: scheduled, schedule: 4 minutes, freshness: 5 minutes, shared_driver: true}\n")
    (specs / "broken.yaml").write_text("name: broken\n")  # its own DAG file says what is wrong, not this one
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    monkeypatch.setenv("STREAMS_DATA_DIR", str(tmp_path / "data"))
    bag = dagbag(DAGS)
    assert "dags/shared_driver.py" not in "".join(bag.import_errors)
    dag = bag.dags["shared_driver"]
    assert dag.max_active_runs == 1 and type(dag.timetable).__name__ == "ContinuousTimetable" and "sensors" in dag.doc_md
    (serve,) = dag.tasks
    assert isinstance(serve, SharedDriverOperator) and serve.retries == 3
    assert serve.application_args == ["--queue", str(tmp_path / "data" / "_shared_driver" / "queue")]
    assert serve.application.endswith("spark_jobs/shared_driver.py")
    assert serve.queue == "default"  # the executor's queue, which the queue folder's argument must not take
    DagSerialization.to_dict(dag)  # as the DAG processor does


def test_parsing_is_cheap() -> None:
    """No heavy imports at parse time; the measured parse time is printed."""
    script = textwrap.dedent(f"""
        import json, sys, time
        from airflow.dag_processing.dagbag import DagBag
        started = time.perf_counter()
        bag = DagBag(dag_folder={str(DAGS)!r})
        print(json.dumps({{"seconds": time.perf_counter() - started, "dags": len(bag.dags),
                          "heavy": [m for m in ("pyspark", "great_expectations") if m in sys.modules]}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"parsed {result['dags']} DAGs in {result['seconds']:.2f}s")
    assert result["heavy"] == []
    assert result["dags"] >= 10


def test_every_stream_of_the_platform_s_own_gets_a_state_dag_run_after_a_scheduled_restart(bag) -> None:
    from streamops.operators.state import InspectStateOperator

    for name in ("sensors", "clicks"):
        task = bag.dags[f"stream_{name}_state"].get_task("inspect")
        assert isinstance(task, InspectStateOperator) and task.application.endswith("spark_jobs/state.py")
        assert task.retries == 0 and bag.dags[f"stream_{name}_state"].schedule is None  # the page's or a restart's
        restart = bag.dags[f"stream_{name}_restart"]
        assert restart.get_task("inspect_state").trigger_dag_id == f"stream_{name}_state"
        assert restart.get_task("inspect_state").upstream_task_ids == {"running"}


class Ti:
    """A task instance of an upgrade run, as the ``changed`` gate sees it: what ``prepare``
    returned to XCom (None if it never ran, failed, or was killed: nothing it said to undo)."""

    dag_id, run_id = "stream_sensors_upgrade", "manual__2026-11-29T05:00:00+00:00"

    def __init__(self, prepared: dict | None) -> None:
        self.prepared = prepared

    def xcom_pull(self, task_ids: str) -> dict | None:
        return {"prepare": self.prepared}.get(task_ids)


def test_a_scheduled_stream_s_upgrade_goes_back_after_its_stop_or_prepare_task_was_killed(tmp_path: Path,
                                                                                         monkeypatch) -> None:
    """A task killed midway returns nothing to XCom: the gate reads the files. Its stop held the
    stream (resumed by the way back, nothing to roll back); its prepare's step began an upgrade
    (rolled back by number). What an earlier run did is not this run's to undo."""
    from datetime import datetime, timedelta, timezone

    from airflow.sdk.exceptions import AirflowSkipException

    from spark_jobs import upgrade
    from streamops.hooks.stream import StreamHook

    specs, data = tmp_path / "streams", tmp_path / "data"
    shutil.copytree(default_spec_dir(), specs)
    (specs / "sensors.yaml").write_text((specs / "sensors.yaml").read_text()
                                        + "\nexecution: {mode: scheduled, schedule: 10 minutes, freshness: 15 minutes}\n")
    monkeypatch.setenv("STREAMS_SPEC_DIR", str(specs))
    monkeypatch.setenv("STREAMS_DATA_DIR", str(data))
    gate = dagbag(DAGS).dags["stream_sensors_upgrade"].get_task("changed")

    class Run:
        start_date = datetime.now(timezone.utc) - timedelta(minutes=1)  # noqa: UP017

    hook = StreamHook("sensors", str(specs), str(data))
    hook.hold("stream_sensors_upgrade run manual__2026-11-29T04:00:00+00:00 (graceful)")  # an earlier run's
    with pytest.raises(AirflowSkipException):
        gate.python_callable(ti=Ti(None), dag_run=Run())
    hook.hold(f"stream_sensors_upgrade run {Ti.run_id} (graceful)")  # this run's stop, killed after its hold
    assert gate.python_callable(ti=Ti(None), dag_run=Run()) == ""  # resumed; no upgrade to roll back
    hook.release_hold()
    folder = upgrade.upgrades_dir(hook.layout) / "000003"
    folder.mkdir(parents=True)
    record = {"number": 3, "phase": upgrade.PREPARED, "started_at": time.time() - 3600}
    (folder / "upgrade.json").write_text(json.dumps(record))  # begun before this run: not this run's
    with pytest.raises(AirflowSkipException):
        gate.python_callable(ti=Ti(None), dag_run=Run())
    (folder / "upgrade.json").write_text(json.dumps(record | {"started_at": time.time()}))  # its killed prepare's
    assert gate.python_callable(ti=Ti(None), dag_run=Run()) == "3"


def test_every_stream_of_the_platform_s_own_gets_an_upgrade_dag_that_rolls_back_after_its_savepoint_only(bag) -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    from streamops.operators.upgrade import UpgradeStepOperator, WatchUpgradeOperator

    for name in ("sensors", "clicks"):
        dag = bag.dags[f"stream_{name}_upgrade"]
        assert dag.schedule is None and dag.max_active_runs == 1 and "docs/changes.md" in dag.doc_md
        # the running driver holds the outputs to rebuild
        order = ["rehearse", "check", "prepare", "rebuild", "swap", "carry_out", "watch"]
        for before, after in itertools.pairwise(order):
            assert dag.get_task(before).downstream_task_ids >= {after}, (before, after)
        assert not {"stop", "resume", "start", "running"} & set(dag.task_ids)  # the other flows go on: no stop
        # a restart only if a flow's change is one a start carries out and the driver runs the spec before
        assert dag.get_task("carry_out").downstream_task_ids >= {"restart_stop", "watch"}
        restart = ["restart_stop", "restart_resume", "restart_start", "restart_running", "watch"]
        for before, after in itertools.pairwise(restart):
            assert dag.get_task(before).downstream_task_ids >= {after}, (before, after)
        assert dag.get_task("restart_stop").mode == "graceful"
        assert dag.get_task("watch").trigger_rule == "none_failed_min_one_success"  # restarted or not
        assert dag.get_task("watch").watch_seconds == 60  # supervision.upgrade_watch
        assert dag.get_task("carry_out").python_callable() == "watch"  # no upgrade done: nothing to restart for
        steps = {t.task_id: t.step for t in dag.tasks if isinstance(t, UpgradeStepOperator)}
        assert steps == {"rehearse": "rehearse", "prepare": "prepare", "rebuild": "rebuild", "swap": "swap",
                         "rollback": "rollback"}
        assert dag.get_task("check").trigger_rule == "none_failed"  # after a rehearsal, or none to do
        assert dag.get_task("prepare").online and isinstance(dag.get_task("watch"), WatchUpgradeOperator)
        gate = dag.get_task("changed")  # only a run that prepared an upgrade goes back
        assert gate.trigger_rule == "one_failed" and gate.upstream_task_ids == {
            "rebuild", "swap", "carry_out", "restart_stop", "restart_running", "watch"}
        assert dag.get_task("rollback_stop").upstream_task_ids == {"changed"}
        assert dag.get_task("rollback_stop").trigger_rule == "all_success"

        with pytest.raises(AirflowSkipException):
            gate.python_callable(ti=Ti(None))
        assert gate.python_callable(ti=Ti({"number": 1, "phase": "prepared"})) == "1"
        assert "xcom_pull(task_ids='changed')" in dag.get_task("rollback").number  # only what this run began
        assert dag.get_task("rollback_resume").trigger_rule == "none_failed_min_one_success"
        assert dag.get_task("rollback_start").trigger_dag_id == f"stream_{name}"
        assert all(t.retries == 0 for t in dag.tasks)
        rollback = bag.dags[f"stream_{name}_rollback"]
        assert [rollback.get_task(t).downstream_task_ids for t in ("stop", "rollback")] == [{"rollback"}, {"resume"}]
        assert rollback.get_task("rollback").number is None  # the newest
