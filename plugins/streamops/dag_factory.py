"""One factory for every stream's DAGs. DAG files call :func:`stream_dags` and stay thin.

For a stream ``<name>`` (spec ``include/streams/<name>.yaml``):

* ``stream_<name>``: deploy and supervise: runs the stream with spark-submit and keeps it
  running (restarts with backoff, stall detection, corrupt checkpoints fail loudly). A
  scheduled or adaptive stream (``execution.mode``): one available-now run per DAG run, on its
  schedule and when input arrives (an adaptive one's may go on continuously); a run with
  nothing waiting starts no driver.
* ``stream_<name>_stop``: stop it from the UI, graceful or immediate; it stays stopped.
* ``stream_<name>_restart``: stop gracefully, then resume from the checkpoint; on the
  spec's ``supervision.scheduled_restart`` cron, or by hand.
* ``stream_<name>_backfill``: reprocess an event-time range in batch (UI params ``start`` and
  ``end``, or the run's data interval, so Airflow's own backfills work), idempotently, then
  validate what it wrote.
* ``stream_<name>_quality``: validate every unit of the sinks closed since the last run with
  Great Expectations, and the accounting of every input row; when units of the sinks close
  (every sink is an Airflow asset, ``streamops.assets``), and on the rules' ``schedule`` if set.
* ``stream_<name>_state``: read what the stream's state holds (open windows, deduplication
  keys) in a Spark job of its own, for its page; from the page, and after a scheduled restart.
* ``stream_<name>_maintenance``: compact and vacuum its Delta tables, if it has any.

A stream that is an application of the user's own (``application:`` in its spec) gets the
first three: it is deployed, supervised, stopped and restarted like the others.

An invalid spec (or quality rules file) raises :class:`~spark_jobs.stream_spec.SpecError` here, so the DAG file shows an
import error naming the spec file and field, and nothing is deployed from it.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, CronDataIntervalTimetable, Param, task
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from spark_jobs import submit
from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.quality.rules import load_rules, rules_path
from spark_jobs.stream_spec.layout import (
    Layout,
    default_data_root,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import DURATION_PATTERN, SpecError, StreamSpec, duration_seconds
from streamops import SHARED_DRIVER_DAG, STREAMS_URL, dag_id
from streamops.alerts import alert_on_failure
from streamops.assets import quality_schedule, run_schedule, sink_assets
from streamops.health import RUNNING
from streamops.operators.backfill import BackfillOperator
from streamops.operators.control import ResumeStreamOperator, StopStreamOperator
from streamops.operators.maintenance import MaintainTablesOperator
from streamops.operators.quality import RUN_ID_PATTERN, ValidateStreamOperator
from streamops.operators.shared_driver import SharedDriverOperator
from streamops.operators.standby import StreamStandbyOperator
from streamops.operators.state import InspectStateOperator
from streamops.operators.supervise import StreamSupervisorOperator
from streamops.operators.upgrade import UpgradeStepOperator, WatchUpgradeOperator
from streamops.sensors.stream_health import StreamHealthSensor

START = datetime(2026, 1, 1, tzinfo=timezone.utc)  # noqa: UP017 - fixed, never "now"


def _doc(spec: StreamSpec, plan: StreamPlan, what: str) -> str:
    outputs = "\n".join(f"| `{o.name}` | {o.query.type} | {o.mode} | {o.sink.kind}"
                        f"{' (the accepted rows, written by the ingestion)' if o.written_by_ingestion else ''} |"
                        for o in plan.outputs)
    app = spec.application
    sup = spec.supervision
    standby = ("" if not sup.standby else f"; warm standby: {'beside the driver' if sup.standby_queue is None else f'queue `{sup.standby_queue}`'}")
    execution = f"; execution: {spec.execution.describe()}"
    table = (f"Application `{app.path}` {' '.join(app.args)}, queries {', '.join(f'`{q}`' for q in app.queries)}"
             if app is not None else f"| output | query | mode | sink |\n|---|---|---|---|\n{outputs}")
    return (f"### Stream `{spec.name}`: {what}\n\n{spec.description}\n\n{table}\n\n"
            f"Owner: {spec.owner}. Stall window: {spec.supervision.stall_window}; restarts: at most "
            f"{spec.supervision.restart.max_attempts} failures within {spec.supervision.restart.period_minutes:g} "
            f"minutes (reset by a stable run), backoff from "
            f"{spec.supervision.restart.backoff_initial_seconds:.0f}s. Spark connection: "
            f"`{spec.spark.connection}`; worker queue: `{spec.supervision.queue}`{standby}{execution}.\n\n[Status and actions]({STREAMS_URL}/{spec.name}/) · "
            f"[data quality]({STREAMS_URL}/{spec.name}/quality/) (per-unit results, accounting) · "
            f"[Data Docs]({STREAMS_URL}/{spec.name}/quality/docs/index.html)")


def shared_driver_dags(spec_dir: str | Path | None = None, data_root: str | None = None) -> dict[str, DAG]:
    """``shared_driver``, if a spec of ``spec_dir`` sends its runs to one (``execution.shared_driver``):
    the data root's shared driver kept running, a DAG run after the other (``@continuous``)."""
    spec_dir = Path(spec_dir) if spec_dir is not None else default_spec_dir()
    users = []
    for spec_file in sorted(spec_dir.glob("*.yaml")):
        try:
            spec = load_spec(spec_file)
        except SpecError:  # its own DAG file shows what is wrong
            continue
        if spec.execution.shared_driver:
            users.append(spec)
    if not users:
        return {}
    queue = Layout(users[0], data_root or default_data_root(), spec_dir).shared_driver_queue
    doc = (f"The data root's shared driver (`spark_jobs/shared_driver.py`): the scheduled runs of "
           f"{', '.join(s.name for s in users)}, one after another in one JVM. Queue: `{queue}`.")
    with DAG(SHARED_DRIVER_DAG, doc_md=doc, schedule="@continuous", start_date=START, catchup=False,
             max_active_runs=1, tags=["shared_driver"],
             default_args={"owner": "data-platform", "retries": 3, "retry_delay": timedelta(seconds=10),
                           "retry_exponential_backoff": True, "max_retry_delay": timedelta(minutes=5),
                           "on_failure_callback": alert_on_failure}) as dag:
        SharedDriverOperator(task_id="serve", queue_dir=str(queue), conn_id=users[0].spark.connection, conf=_conf(),
                             jars=_jars(), driver_memory="1g")
    return {dag.dag_id: dag}


def _jars() -> str | None:
    """The jars for spark-submit's ``--jars`` (Spark's connectors, the platform's JVM classes), if set up
    (``spark_jobs.submit``: the one helper every driver is submitted by, by hand too)."""
    return ",".join(submit.settings().jars) or None


def _conf(spec: StreamSpec | None = None) -> dict[str, str]:
    """spark-submit's ``--conf`` settings (``spark_jobs.submit.settings``): the platform's local file system
    and fenced checkpoints if built, then (for a stream's driver) the spec's shuffle partitions and
    ``spark.conf``, which win."""
    return submit.settings(spec).conf


def _default_args(spec: StreamSpec) -> dict[str, Any]:
    return {
        "owner": spec.owner,
        # a retry only follows the death of the task process itself: the supervisor adopts
        # the driver still running, never starts a second one
        "retries": 3,
        "retry_delay": timedelta(seconds=10),
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=5),
        "on_failure_callback": alert_on_failure,
        # with the CeleryExecutor, the workers listening on this queue run the stream's tasks
        # (its driver is a child of the supervisor task); other executors ignore it
        "queue": spec.supervision.queue,
    }


def stream_dags(name: str, spec_dir: str | Path | None = None, data_root: str | None = None) -> dict[str, DAG]:
    spec_dir = Path(spec_dir) if spec_dir is not None else default_spec_dir()
    spec = load_spec(spec_dir / f"{name}.yaml")
    load_rules(spec, spec_dir)  # an invalid rules file is the DAG file's import error too
    paths = {"spec_dir": str(spec_dir), "data_root": data_root}
    plan = compile_plan(spec, Layout(spec, data_root or default_data_root(), spec_dir))
    tags = ["stream", spec.name]
    dags: dict[str, DAG] = {}

    what = ("deploy and supervise" if not spec.execution.scheduled
            else f"run {spec.execution.describe()}: each run takes what waits, then ends")
    with DAG(dag_id(spec.name), doc_md=_doc(spec, plan, what), schedule=run_schedule(spec, paths), start_date=START,
             catchup=False, max_active_runs=1, tags=tags, default_args=_default_args(spec)) as run_dag:
        submit = {"stream": spec.name, "conn_id": spec.spark.connection, "conf": _conf(spec), "jars": _jars(),
                  "driver_memory": spec.spark.driver_memory, "executor_memory": spec.spark.executor_memory}
        StreamSupervisorOperator(task_id="supervise", **submit, **paths)
        if spec.supervision.standby_queue is not None:  # its warm standby, on the workers of another queue
            StreamStandbyOperator(task_id="standby", supervisor_task_id="supervise", queue=spec.supervision.standby_queue,
                                  **submit, **paths)
        # the deploy confirmed: the stream seen running (or stopped on purpose before: skipped, so that the
        # next run of this DAG, which a restart or an upgrade triggers, does not wait behind this one). A
        # scheduled run's supervisor ends when its run did: its success is the confirmation
        if not spec.execution.scheduled:
            StreamHealthSensor(task_id="running", stream=spec.name, statuses=list(RUNNING), timeout=15 * 60,
                               retries=0, ends_when_stopped=True, **paths)
    dags[run_dag.dag_id] = run_dag

    stop_params = {"mode": Param("graceful", enum=["graceful", "immediate"],
                                 description="graceful: between micro-batches; immediate: kill the driver")}
    with DAG(dag_id(spec.name, "stop"), doc_md=_doc(spec, plan, "stop (it stays stopped)"), schedule=None,
             start_date=START, catchup=False, max_active_runs=1, tags=tags, params=stop_params,
             default_args={**_default_args(spec), "retries": 0}) as stop_dag:
        StopStreamOperator(task_id="stop", stream=spec.name, mode="{{ params.mode }}", **paths)
    dags[stop_dag.dag_id] = stop_dag

    with DAG(dag_id(spec.name, "restart"), doc_md=_doc(spec, plan, "scheduled restart"),
             schedule=spec.supervision.scheduled_restart, start_date=START, catchup=False, max_active_runs=1,
             tags=tags, default_args={**_default_args(spec), "retries": 0}) as restart_dag:
        stop = StopStreamOperator(task_id="stop", stream=spec.name, mode="graceful", **paths)
        resume = ResumeStreamOperator(task_id="resume", stream=spec.name, **paths)
        start = TriggerDagRunOperator(task_id="start", trigger_dag_id=run_dag.dag_id,
                                      logical_date=None, wait_for_completion=False)
        running = StreamHealthSensor(task_id="running", stream=spec.name, statuses=list(RUNNING), timeout=15 * 60,
                                     **paths)

        @task
        def downtime(stopped: dict[str, Any], health: dict[str, Any]) -> float:
            """Seconds the stream was down: from its driver's exit until it ran again."""
            seconds = max(0.0, health["checked_at"] - stopped["stopped_at"])
            print(f"stream {spec.name} restarted from its checkpoint: down for {seconds:.1f}s "
                  f"(stopping took {stopped['seconds']:.1f}s); now {health['status']}")
            return round(seconds, 1)

        stop >> resume >> start >> running
        downtime(stop.output, running.output)
        if spec.application is None:  # what its state holds now, for its page (stream_<name>_state)
            running >> TriggerDagRunOperator(task_id="inspect_state", trigger_dag_id=dag_id(spec.name, "state"),
                                             logical_date=None, wait_for_completion=False)
    dags[restart_dag.dag_id] = restart_dag
    if spec.application is None:  # an application's own queries: nothing of the platform's to backfill or validate
        dags |= _data_dags(spec, plan, spec_dir, paths, tags)
        dags |= _change_dags(spec, plan, paths, tags, run_dag.dag_id)
    return dags


def _change_dags(spec: StreamSpec, plan: StreamPlan, paths: dict[str, Any], tags: list[str],
                 run_dag_id: str) -> dict[str, DAG]:
    """The upgrade of a stream to its spec file's change, and the rollback of its newest upgrade
    (spark_jobs.upgrade, docs/changes.md)."""
    dags: dict[str, DAG] = {}
    spark = {"conn_id": spec.spark.connection, "jars": _jars(), "conf": _conf()}
    once = {**_default_args(spec), "retries": 0}

    def restart(prefix: str, trigger_rule: str = "all_success") -> tuple[Any, Any]:
        """Resume the stream and start its DAG, then wait until it runs: (first task, last task)."""
        resume = ResumeStreamOperator(task_id=f"{prefix}resume", stream=spec.name, trigger_rule=trigger_rule, **paths)
        start = TriggerDagRunOperator(task_id=f"{prefix}start", trigger_dag_id=run_dag_id, logical_date=None,
                                      wait_for_completion=False)
        running = StreamHealthSensor(task_id=f"{prefix}running", stream=spec.name, statuses=list(RUNNING),
                                     timeout=15 * 60, **paths)
        resume >> start >> running
        return resume, running

    upgrade_doc = (f"{_doc(spec, plan, 'upgrade to its changed spec')}\n\nCarries out the spec file's change "
                   "flow by flow (docs/changes.md): rehearses a change whose effect the plan cannot tell on a copy "
                   "of the checkpoint, then checks the verdicts (nothing runs if an upgrade cannot carry them out); "
                   "has the running driver stop the outputs to rebuild between batches and hold them while its "
                   "other flows go on committing (a scheduled stream is stopped instead); takes a savepoint; "
                   "rebuilds those beside their "
                   "live sinks from the accepted rows; swaps each in, in one step; restarts the stream between "
                   "batches if a flow's change is one a start carries out (compatible, new, retired) and its "
                   "driver started from the spec before; watches the stream. If a step "
                   "after the savepoint fails, the stream is stopped, rolled back to the savepoint and the spec it "
                   "ran before, and started again.")
    with DAG(dag_id(spec.name, "upgrade"), doc_md=upgrade_doc, schedule=None, start_date=START, catchup=False,
             max_active_runs=1, tags=[*tags, "upgrade"], default_args=once) as upgrade_dag:

        # an unknown verdict is settled on a copy of the checkpoint first (skipped when there is none)
        rehearse = UpgradeStepOperator(task_id="rehearse", stream=spec.name, step="rehearse", **spark, **paths)

        @task(trigger_rule="none_failed")
        def check() -> dict[str, Any]:
            """The verdicts of the spec file's change against the stream's last plan and state (a
            rehearsal's settled)."""
            from spark_jobs import upgrade
            from spark_jobs.runtime.checkpoint import previous_plan
            from streamops.hooks.stream import StreamHook

            hook = StreamHook(spec.name, paths["spec_dir"], paths["data_root"])
            spec_file = str(Path(paths["spec_dir"]) / f"{spec.name}.yaml")
            try:
                event_time = hook.plan.ingestion.event_time if hook.plan.ingestion is not None else None
                verdicts, rebuild = upgrade.check(hook.plan, previous_plan(hook.layout), spec_file,
                                                  event_time.watermark if event_time else None)
            except upgrade.UpgradeRefused as exc:
                raise AirflowFailException(str(exc)) from None
            for v in verdicts:
                print(v.text())
            return {"rebuild": rebuild, "verdicts": {v.flow: v.verdict for v in verdicts}}

        # a continuous stream's running driver holds the outputs to rebuild (stopped between batches) while
        # its other flows go on: no stop, no restart; a scheduled one holds no driver between runs: it is
        # stopped (no run starts) through the swap, and its next run starts them
        online = not spec.execution.scheduled
        prepare = UpgradeStepOperator(task_id="prepare", stream=spec.name, step="prepare", online=online, **spark,
                                      **paths)
        rebuild = UpgradeStepOperator(task_id="rebuild", stream=spec.name, step="rebuild", **spark, **paths)
        swap = UpgradeStepOperator(task_id="swap", stream=spec.name, step="swap", **spark, **paths)
        watch = WatchUpgradeOperator(task_id="watch", stream=spec.name, scheduled=not online,
                                     watch_seconds=duration_seconds(spec.supervision.upgrade_watch),
                                     trigger_rule="none_failed_min_one_success", **paths)
        checked = rehearse >> check()
        if online:

            @task.branch
            def carry_out() -> str:
                """Restart the stream gracefully if its running driver started from the spec before and the
                change has flows only a start carries out (compatible, new, retired); else watch it."""
                from spark_jobs import upgrade
                from streamops.hooks.stream import StreamHook

                layout = StreamHook(spec.name, paths["spec_dir"], paths["data_root"]).layout
                why = upgrade.restart_needed(layout, upgrade.latest(layout))
                print(f"{why}: restarting it between batches" if why else "the running driver carries the "
                      "upgrade out (or the stream's next start does): no restart")
                return "restart_stop" if why else "watch"

            stop_again = StopStreamOperator(task_id="restart_stop", stream=spec.name, mode="graceful", **paths)
            resume, running = restart("restart_")
            branch = carry_out()
            checked >> prepare >> rebuild >> swap >> branch >> [stop_again, watch]
            stop_again >> resume
            running >> watch
            gone_wrong = [rebuild, swap, branch, stop_again, running, watch]
        else:
            stop = StopStreamOperator(task_id="stop", stream=spec.name, mode="graceful", **paths)
            resume, running = restart("")
            checked >> stop >> prepare >> rebuild >> swap >> resume
            running >> watch
            gone_wrong = [running, rebuild, swap, watch]
        # the way back, from any failure once this run prepared an upgrade (or stopped the stream): stopped,
        # this run's upgrade rolled back, started again. A refused check changed nothing: then nothing happens

        @task(trigger_rule="one_failed")
        def changed(ti: Any = None, dag_run: Any = None) -> str:
            """Go back only if this run began an upgrade or stopped the stream: the number of the
            upgrade to roll back ('' for none). A task killed midway returns nothing, so the
            files say it too: an unfinished upgrade begun since this run started (a killed
            ``prepare``'s), or the stream held by this run's stop (a killed ``stop``'s)."""
            from spark_jobs import upgrade
            from streamops.hooks.stream import StreamHook

            hook = StreamHook(spec.name, paths["spec_dir"], paths["data_root"])
            number = (ti.xcom_pull(task_ids="prepare") or {}).get("number")
            began = dag_run.start_date.timestamp() if dag_run is not None and dag_run.start_date else None
            record = upgrade.unfinished(hook.layout)
            if number is None and record is not None and began is not None and record["started_at"] >= began:
                number = record["number"]
            stopped = ti.xcom_pull(task_ids="stop") is not None or (
                (hook.held_by() or "").startswith(f"{ti.dag_id} run {ti.run_id} "))
            if number is None and (online or not stopped):
                raise AirflowSkipException("this run changed nothing (its check or preparation refused the change): "
                                           "nothing to undo")
            return "" if number is None else str(number)

        back = StopStreamOperator(task_id="rollback_stop", stream=spec.name, mode="graceful", **paths)
        undo = UpgradeStepOperator(task_id="rollback", stream=spec.name, step="rollback",
                                   number="{{ ti.xcom_pull(task_ids='changed') or '' }}", **spark, **paths)
        back_resume, _ = restart("rollback_", trigger_rule="none_failed_min_one_success")
        gone_wrong >> changed() >> back >> undo >> back_resume
    dags[upgrade_dag.dag_id] = upgrade_dag

    rollback_doc = (f"{_doc(spec, plan, 'roll its newest upgrade back')}\n\nStops the stream between batches, "
                    "puts each output the newest upgrade rebuilt back as its savepoint had it (checkpoint, sink), "
                    "sets aside each output it added, and pins the spec the stream ran before (its drivers run "
                    "it until the spec file changes again), then starts the stream.")
    with DAG(dag_id(spec.name, "rollback"), doc_md=rollback_doc, schedule=None, start_date=START, catchup=False,
             max_active_runs=1, tags=[*tags, "upgrade"], default_args=once) as rollback_dag:
        stop = StopStreamOperator(task_id="stop", stream=spec.name, mode="graceful", **paths)
        undo = UpgradeStepOperator(task_id="rollback", stream=spec.name, step="rollback", **spark, **paths)
        resume, _ = restart("")
        stop >> undo >> resume
    dags[rollback_dag.dag_id] = rollback_dag
    return dags


def _data_dags(spec: StreamSpec, plan: StreamPlan, spec_dir: Path, paths: dict[str, Any],
               tags: list[str]) -> dict[str, DAG]:
    """The backfill and quality DAGs of a stream the platform runs from a source and outputs."""
    rules = load_rules(spec, spec_dir)
    dags: dict[str, DAG] = {}
    range_params = {
        "start": Param(None, type=["null", "string"], format="date-time",
                       description="event-time range start (inclusive); empty: the run's data interval"),
        "end": Param(None, type=["null", "string"], format="date-time",
                     description="event-time range end (exclusive); empty: the run's data interval"),
    }
    # daily data intervals: a run covers the day before it (so `airflow backfill create` reprocesses
    # each day it is given). Not schedule="@daily": Airflow 3 makes that a trigger timetable,
    # whose runs have an empty data interval (start == end), an empty range
    daily = CronDataIntervalTimetable("@daily", timezone="UTC")
    with DAG(dag_id(spec.name, "backfill"), doc_md=_doc(spec, plan, "backfill an event-time range"), schedule=daily,
             start_date=START, catchup=False, max_active_runs=1, tags=tags, params=range_params,
             default_args={**_default_args(spec), "retries": 0}) as backfill_dag:

        @task
        def check_range(params: dict[str, Any] | None = None, data_interval_start: Any = None,
                        data_interval_end: Any = None) -> dict[str, str]:
            """The range to reprocess: the params if given, else the data interval; checked."""
            from spark_jobs.backfill import parse_range

            params = params or {}
            if not (params.get("start") or params.get("end")) and data_interval_start and \
                    data_interval_start == data_interval_end:
                raise ValueError(f"the run's data interval is empty ({data_interval_start.isoformat()}): "
                                 "give start and end")
            start = params.get("start") or (data_interval_start.isoformat() if data_interval_start else None)
            end = params.get("end") or (data_interval_end.isoformat() if data_interval_end else None)
            if not start or not end:
                raise ValueError("give both start and end (or run the DAG for a data interval)")
            lo, hi = parse_range(str(start), str(end))
            return {"start": lo.isoformat(), "end": hi.isoformat()}

        bounds = check_range()
        start, end = "{{ ti.xcom_pull(task_ids='check_range')['start'] }}", "{{ ti.xcom_pull(task_ids='check_range')['end'] }}"
        backfill = BackfillOperator(task_id="backfill", stream=spec.name, conn_id=spec.spark.connection,
                                    start=start, end=end, jars=_jars(), conf=_conf(), **paths)
        validate = ValidateStreamOperator(task_id="validate", stream=spec.name, conn_id=spec.spark.connection,
                                          backfill_start=start, backfill_end=end, jars=_jars(), conf=_conf(), **paths)
        bounds >> backfill >> validate
    dags[backfill_dag.dag_id] = backfill_dag

    assets = sink_assets(plan, paths)
    when = " and ".join(filter(None, [f"when units of its sinks close (assets {', '.join(a.name for a in assets)}; "
                                      f"at most one event per sink per {rules.min_interval})" if rules.on_new_output
                                      else "", f"on `{rules.schedule}`" if rules.schedule else ""])) or "by hand"
    quality_doc = (f"{_doc(spec, plan, 'data quality')}\n\nRules: `{rules_path(spec_dir, spec.name).name}` in "
                   f"`include/expectations/` (plus the checks derived from the spec). Runs {when}.")
    again = {"again": Param(None, type=["null", "string"], pattern=RUN_ID_PATTERN.pattern,
                            description="the id of an earlier validation run (the data-quality page names it per "
                                        "unit): validate its units again, as of the Delta versions it read; "
                                        "empty: validate what closed since the last run")}
    with DAG(dag_id(spec.name, "quality"), doc_md=quality_doc, schedule=quality_schedule(rules, assets), start_date=START,
             catchup=False, max_active_runs=1, tags=[*tags, "quality"], params=again,
             default_args={**_default_args(spec), "retries": 0}) as quality_dag:
        ValidateStreamOperator(task_id="validate", stream=spec.name, conn_id=spec.spark.connection, jars=_jars(),
                               again="{{ params.again or '' }}", conf=_conf(), **paths)
    dags[quality_dag.dag_id] = quality_dag

    state_doc = (f"{_doc(spec, plan, 'what its state holds')}\n\nReads, in a Spark job of its own, what each flow's "
                 "state holds at its last committed batch (open windows, deduplication keys, groups) for the "
                 "stream's page; never touches the running driver. From the page, and after a scheduled restart.")
    with DAG(dag_id(spec.name, "state"), doc_md=state_doc, schedule=None, start_date=START, catchup=False,
             max_active_runs=1, tags=[*tags, "state"], default_args={**_default_args(spec), "retries": 0}) as state_dag:
        InspectStateOperator(task_id="inspect", stream=spec.name, conn_id=spec.spark.connection, jars=_jars(),
                             conf=_conf(), **paths)
    dags[state_dag.dag_id] = state_dag

    tables = plan.delta_tables
    if tables:
        upkeep = spec.maintenance
        what = ", ".join(filter(None, ["compaction (OPTIMIZE)" if upkeep.compact else "",
                                       f"vacuum (retention {upkeep.vacuum_retention})" if upkeep.vacuum else ""]))
        maintenance_doc = (f"{_doc(spec, plan, 'upkeep of its Delta tables')}\n\nDelta tables: "
                           f"{', '.join(f'`{name}`' for name in tables)}. Each run: {what or 'nothing (both off)'}, "
                           f"while the stream runs. Schedule: {upkeep.schedule or 'by hand'}. The `retention` param "
                           f"overrides the vacuum's; a vacuum shorter than a reader needs is refused, naming it.")
        with DAG(dag_id(spec.name, "maintenance"), doc_md=maintenance_doc, schedule=upkeep.schedule,
                 start_date=START, catchup=False, max_active_runs=1, tags=[*tags, "maintenance"],
                 params={"retention": Param(None, type=["null", "string"], pattern=DURATION_PATTERN.pattern,
                                            description="vacuum retention, e.g. '7 days'; empty: the spec's")},
                 default_args={**_default_args(spec), "retries": 0}) as maintenance_dag:
            MaintainTablesOperator(task_id="maintain", stream=spec.name, conn_id=spec.spark.connection, jars=_jars(),
                                   conf=_conf(), retention="{{ params.retention or '' }}", **paths)
        dags[maintenance_dag.dag_id] = maintenance_dag
    return dags
