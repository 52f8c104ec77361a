"""Operators that run, supervise and stop a stream."""

from __future__ import annotations

import inspect
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from spark_jobs.runtime.lease import (
    DRIVER_ID_ENV,
    read_holder,
    release_dead,
)
from spark_jobs.spec.layout import default_spec_dir
from streamops import tenure
from streamops.health import NO_RESTART, RUNNING, Health, Status
from streamops.hooks.stream import StreamHook
from streamops.restarts import RestartBudget

STREAM_JOB = str(Path(__file__).resolve().parents[3] / "spark_jobs" / "stream_job.py")
BACKFILL_JOB = str(Path(__file__).resolve().parents[3] / "spark_jobs" / "backfill.py")

#: SparkSubmitHook's arguments that SparkSubmitOperator takes under the same name but keeps
#: private (they are not templated): the supervisor keeps its own copy, with the operator's
#: defaults, to build the hook from.
SUBMIT_ARGS = ("conn_id", "archives", "java_class", "repositories", "total_executor_cores", "executor_cores",
               "executor_memory", "driver_memory", "num_executors", "status_poll_interval", "verbose",
               "spark_binary", "yarn_queue", "deploy_mode", "use_krb5ccache", "track_driver_via_k8s_api",
               "yarn_track_via_rm_api", "yarn_rm_auth")
#: The templated ones: rendered onto the operator's public attributes of the same name.
TEMPLATED_SUBMIT_ARGS = ("conf", "files", "py_files", "driver_class_path", "jars", "packages", "exclude_packages",
                         "keytab", "principal", "proxy_user", "name", "application_args", "env_vars",
                         "properties_file", "post_submit_commands")
_SUBMIT_DEFAULTS = {name: param.default for name, param in inspect.signature(SparkSubmitOperator).parameters.items()
                    if name in SUBMIT_ARGS}
#: Left of Airflow's cleanup time when the supervisor is killed, to kill the driver and
#: spark-submit after a graceful stop that did not finish.
KILL_MARGIN_SECONDS = 2.0
#: How long a standby may take to hold the lease once the active driver ended (it takes a free
#: lease within a second; a lease still alive, held elsewhere, lapses after its ttl).
STANDBY_TAKEOVER_SECONDS = 30.0
#: A standby that ended is replaced no more often than this.
STANDBY_RELAUNCH_SECONDS = 10.0


def killed_task_cleanup_seconds() -> float:
    """How long Airflow lets a task it kills clean up: from SIGTERM (which runs ``on_kill``) to SIGKILL.

    ``[core] killed_task_cleanup_time`` (60 by default) says so. Airflow 3's task supervisor, which
    terminates a task marked failed or success, cleared, or whose heartbeats fail, sends SIGKILL
    to the task's whole process group after its own escalation delay (5 s in Airflow 3.3, not
    configurable) whatever that setting says; the shorter of the two is the time there is.
    """
    from airflow.sdk.configuration import conf

    configured = conf.getfloat("core", "killed_task_cleanup_time", fallback=60.0)
    try:
        from airflow.sdk.execution_time.supervisor import WatchedSubprocess

        escalation = float(inspect.signature(WatchedSubprocess.kill).parameters["escalation_delay"].default)
    except (ImportError, AttributeError, KeyError, TypeError, ValueError):
        return configured
    return min(configured, escalation)


def _kafka_env(hook: StreamHook) -> dict[str, str]:
    """A Kafka source's Airflow connection, resolved here for the driver (which has no Airflow of
    its own), as the environment variable it reads."""
    from spark_jobs.sources.kafka import connection_env, from_connection

    kafka = hook.plan.source.kafka if hook.plan.source is not None else None
    if kafka is None or kafka.connection is None:
        return {}
    servers = from_connection(kafka.connection)
    if servers is None:
        raise AirflowFailException(f"stream {hook.stream}: source.connection: the Airflow connection "
                                   f"{kafka.connection!r} does not exist or says no bootstrap.servers (extra) or host")
    return {connection_env(kafka.connection): servers}


class StreamSupervisorOperator(SparkSubmitOperator):
    """Run a stream with ``spark-submit`` and keep it running.

    The driver runs as a child of this task (client mode), or in the cluster (YARN or
    Kubernetes cluster mode), where the lease's heartbeat tells a retried task that it
    still runs. While it runs, the stream's health is read from
    its checkpoint every ``poll_seconds``: a stalled stream is stopped (graceful first, then
    hard) and started again; a dead driver is started again from its checkpoint. Restarts
    back off exponentially and stop after ``restart.max_attempts`` failures within
    ``restart.period_minutes`` (the count resets after a stable run); then the task fails
    and its failure callback alerts. A corrupt checkpoint is never touched, and a Kafka
    stream whose unread records were deleted is not restarted: the task fails with a
    diagnosis. A driver left running by an earlier try of this task (a killed worker) is
    adopted, never doubled. The task ends successfully only when an operator
    stopped the stream (the stop DAG's hold marker) or an available-now run finished; any
    other exit of the driver is a failed run. A try that a newer try of this task has
    replaced (``streamops.tenure``) leaves the stream alone. With ``supervision.standby``
    it keeps a warm standby driver (``spark_jobs.runtime.standby``) that takes over when the
    active driver dies, and then launches the next. A stream that is an application of the user's own (``application:``
    in its spec) is submitted as that application, with its arguments and the spec's path
    in ``STREAMS_APP_SPEC`` (see :mod:`spark_jobs.runtime.driver`), and supervised alike.

    :param stream: the stream's name. (templated)
    :param spec_dir: the specs' folder (default ``$STREAMS_SPEC_DIR``).
    :param data_root: root of relative data paths (default ``$STREAMS_DATA_DIR``).
    :param poll_seconds: how often health is checked; default 5.
    :param grace_seconds: how long a graceful stop may take before the driver is killed; default 120.
    :param kill_grace_seconds: the same when this task is killed (``on_kill``): by default, and
        never more than, the time Airflow lets a killed task clean up (see
        :func:`killed_task_cleanup_seconds`, read when the task is killed) less
        ``KILL_MARGIN_SECONDS`` to kill the driver and spark-submit, so that the hard stop still
        happens; ``grace_seconds`` bounds it too.
    :param stalled_grace_seconds: the same for a stalled driver, which has already committed
        nothing for the whole stall window (a frozen or hung driver); default 5.
    :param archive_every_seconds: how often input files every query has committed are moved
        to the spec's ``source.archive_path`` while the stream runs (see
        :mod:`spark_jobs.runtime.archive`); default 60.
    All other arguments go to :class:`SparkSubmitOperator` (``conn_id`` picks where Spark runs); each
    run of the driver goes through a :class:`SparkSubmitHook` built from them as that operator builds
    its own (:meth:`spark_submit_hook`).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream")

    def __init__(self, *, stream: str, spec_dir: str | None = None, data_root: str | None = None,
                 poll_seconds: float = 5.0, grace_seconds: float = 120.0, kill_grace_seconds: float | None = None,
                 stalled_grace_seconds: float = 5.0, archive_every_seconds: float = 60.0, **kwargs: Any) -> None:
        args = ["--spec", f"{spec_dir or default_spec_dir()}/{stream}.yaml"]
        if data_root:
            args += ["--data-root", data_root]
        kwargs.setdefault("application", STREAM_JOB)
        kwargs.setdefault("application_args", args)
        kwargs.setdefault("name", f"stream:{stream}")
        # as SparkSubmitOperator gets them: given, else from default_args (which Airflow passes
        # down with the arguments), else its own defaults
        defaults = kwargs.get("default_args") or {}
        self._submit_args = {name: kwargs.get(name, defaults.get(name, default))
                             for name, default in _SUBMIT_DEFAULTS.items()}
        super().__init__(**kwargs)
        self.stream = stream
        self.spec_dir = spec_dir
        self.data_root = data_root
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self.kill_grace_seconds = kill_grace_seconds
        self.stalled_grace_seconds = stalled_grace_seconds
        self.archive_every_seconds = archive_every_seconds
        self._stream_hook: StreamHook | None = None
        #: the driver this task runs, and its standby (``supervision.standby``)
        self.active: Launch | None = None
        self.standby: Launch | None = None
        self.adopted_pid: int | None = None
        #: the lease epoch of the driver this task runs or adopted (spark_jobs.runtime.lease)
        self.supervised_epoch: int | None = None
        #: this try's hold on the stream's supervision (streamops.tenure)
        self.tenure: tenure.Tenure | None = None
        self._left = False
        self._standby_ended = float("-inf")
        #: the last driver this task ran, once it ended; and whether a standby elsewhere took over from it
        self._ended: Launch | None = None
        self._taken_over_elsewhere = False

    @property
    def stream_hook(self) -> StreamHook:
        if self._stream_hook is None:
            self._stream_hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        return self._stream_hook

    def spark_submit_hook(self, **overrides: Any) -> SparkSubmitHook:
        """A new hook for one run of the driver, built as SparkSubmitOperator builds its own: from
        this task's arguments, the templated ones as rendered (and ``env_vars`` as execute sets
        them), then ``overrides``."""
        return SparkSubmitHook(**self._submit_args,
                               **{name: getattr(self, name) for name in TEMPLATED_SUBMIT_ARGS} | overrides)

    def _driver_env(self, hook: StreamHook) -> None:
        """The environment of the drivers this task launches."""
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, **(self.env_vars or {}), **_kafka_env(hook)}

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.stream_hook
        ti = context.get("ti")
        self.tenure = tenure.begin(hook.layout.lease_dir, f"{getattr(ti, 'dag_id', '?')} run {getattr(ti, 'run_id', '?')} "
                                                          f"try {getattr(ti, 'try_number', '?')}")
        budget = RestartBudget(hook.layout.runs_file, hook.spec.supervision.restart)
        hook.release_hold()
        self._driver_env(hook)
        app = hook.spec.application
        if app is not None:  # the application itself, told where its spec is (spark_jobs.runtime.driver)
            from spark_jobs.runtime.driver import APP_SPEC_ENV

            self.application, self.application_args = hook.layout.application_file, list(app.args)
            self.env_vars[APP_SPEC_ENV] = str(hook.layout.spec_dir / f"{self.stream}.yaml")
            if self.data_root:
                self.env_vars["STREAMS_DATA_DIR"] = str(self.data_root)
        runs = 0
        try:
            while True:
                if self._superseded():
                    return {}
                health = hook.health()
                self.log.info("%s", health.summary())
                if health.status in NO_RESTART:
                    raise AirflowFailException(_no_restart_message(health, hook))
                if (by := hook.held_by()) is not None:
                    self.log.info("stream %s was stopped on purpose (%s); not restarting it", self.stream, by)
                    return health.to_dict()
                code: int | None
                if self.active is None and hook.driver_alive():
                    holder = read_holder(hook.layout.lease_dir)
                    self.adopted_pid = holder.pid if holder else None
                    self.supervised_epoch = holder.epoch if holder else None
                    if self._taken_over_elsewhere:  # a new run, of the standby on another worker
                        self._taken_over_elsewhere = False
                        budget.record_start(time.time())
                        runs += 1
                        self.log.info("supervising stream %s through its lease: %s (run %d of this task)", self.stream,
                                      holder.describe() if holder else "unknown", runs)
                    else:
                        self.log.warning("a driver (%s) already runs stream %s, left by an earlier try: adopting it "
                                         "instead of starting a second one", holder.describe() if holder else "unknown",
                                         self.stream)
                    reason, forced = self._supervise()
                    code, reason, self._ended = None, f"adopted driver: {reason}", None
                else:
                    if self.active is None:
                        if budget.exhausted(time.time()):
                            raise AirflowFailException(_budget_spent(hook, budget))
                        delay = budget.next_delay()
                        if delay:
                            self.log.warning("restarting stream %s in %.0fs (backoff after %d failed run(s))",
                                             self.stream, delay, budget.consecutive_failures())
                            time.sleep(delay)  # the backoff itself
                        if self._superseded():
                            return {}
                        self.active = self._launch(standby=False)
                    budget.record_start(time.time())
                    runs += 1
                    self.log.info("supervising stream %s (run %d of this task)", self.stream, runs)
                    reason, forced = self._supervise()
                    if self._superseded():  # its own driver halts by itself: the lease is another's
                        return {}
                    code, error = self.active.result()
                    reason = error or reason
                    self._ended, self.active = self.active, None
                if self._superseded():  # a try Airflow no longer runs records nothing
                    return {}
                by = hook.held_by()
                invalid = None if by is not None or code in (0, None) else _invalid_spec(hook, budget)
                if invalid:
                    budget.record_end(time.time(), code, "invalid spec", forced=forced, requested=False)
                    raise AirflowFailException(
                        f"stream {self.stream}: its driver found the spec invalid and started nothing; a restart "
                        f"would fail alike, so the stream stays stopped. Fix the spec, then trigger this DAG "
                        f"again.\n{invalid}")
                finished = code == 0 and not forced and hook.spec.trigger.available_now
                if by is not None:
                    reason = f"{reason.splitlines()[0] if reason else 'driver ended'} (stopped by {by})"
                elif code == 0 and not forced and not finished:
                    reason = "the driver exited without being asked to stop"
                budget.record_end(time.time(), code, reason, forced=forced, requested=by is not None, finished=finished)
                if by is not None or finished:
                    self.log.info("stream %s stopped: %s", self.stream, reason)
                    return hook.health().to_dict()
                self.log.warning("stream %s driver ended (%s, exit %s)", self.stream, reason, code)
                if budget.exhausted(time.time()):  # nor does a standby take it over
                    self._end_standby()
                    raise AirflowFailException(_budget_spent(hook, budget))
                self.active = self._take_over(self._ended)
        finally:
            if self.standby is not None:
                self.standby.kill()

    def _superseded(self) -> bool:
        """Is a newer try of this task the stream's supervisor now (this try's worker was cut off,
        and Airflow retried the task elsewhere)? Then this one leaves the stream alone: it adopts
        nothing, stops nothing and records no run."""
        newer = tenure.superseded_by(self.stream_hook.layout.lease_dir, self.tenure) if self.tenure else None
        if newer is None:
            return False
        if not self._left:
            self._left = True
            self.log.warning("stream %s: %s supervises it now; this try (%s) leaves it alone", self.stream,
                             newer.describe(), self.tenure.describe())
            from spark_jobs.runtime.progress import EventLog

            EventLog(self.stream_hook.layout.events_file).write({
                "event": "supervisor_superseded", "stream": self.stream, "supervisor": self.tenure.task,
                "by": newer.task, "host": self.tenure.host})
        if self.standby is not None:
            self.standby.kill()
            self.standby = None
        return True

    def _launch(self, standby: bool) -> Launch:
        """Submit a driver (``standby``: a warm standby that waits to take the stream over)."""
        extra = ["--standby", "--supervisor", str(self.tenure.number if self.tenure else 0)] if standby else []
        env = {**(self.env_vars or {}), DRIVER_ID_ENV: f"{self.stream}-{uuid.uuid4().hex[:12]}"}
        launch = Launch(self.spark_submit_hook(env_vars=env, application_args=[*(self.application_args or []), *extra]),
                        self.application, env[DRIVER_ID_ENV], self.stream_hook.layout.lease_dir)
        self.log.info("stream %s: %s driver %s launched", self.stream, "standby" if standby else "active",
                      launch.driver_id)
        return launch

    def _end_standby(self) -> None:
        """End the standby, and the driver it became if it has taken the stream over already."""
        standby, self.standby = self.standby, None
        if standby is None:
            return
        holder = read_holder(self.stream_hook.layout.lease_dir)
        if holder is not None and holder.driver_id == standby.driver_id:
            self.stream_hook.kill_driver(epoch=holder.epoch, by=f"its supervisor ({self.tenure_name})")
        standby.kill()

    def _take_over(self, ended: Launch | None) -> Launch | None:
        """After the active driver ended: the standby that takes the stream over. This task's own,
        once it holds the lease (returned: this task runs it). One on another worker (the stream
        DAG's ``standby`` task, ``supervision.standby_queue``): None, and this task supervises it
        through its lease (the adopt path), keeping its own standby for the next takeover. Neither
        within ``STANDBY_TAKEOVER_SECONDS``: None (this task's standby is killed), and a driver is
        started cold. The ended driver's lease is released first, so that a standby elsewhere
        need not wait out its ttl."""
        hook = self.stream_hook
        if ended is not None:
            release_dead(hook.layout.lease_dir, ended.driver_id)
        from spark_jobs.runtime.standby import WARMING, standbys

        standby, self.standby = self.standby, None
        elsewhere = {s.driver_id for s in standbys(hook.layout.lease_dir)
                     if s.state != WARMING} - {standby.driver_id if standby else ""}
        if standby is None and not elsewhere:
            return None
        started = time.monotonic()
        deadline = started + STANDBY_TAKEOVER_SECONDS
        while ((standby is not None and standby.alive()) or elsewhere) and time.monotonic() < deadline:
            holder = read_holder(hook.layout.lease_dir)
            if holder is not None and holder.alive() and holder.driver_id in {*elsewhere, standby and standby.driver_id}:
                self.log.info("stream %s: the standby %s on %s holds epoch %d of the lease (%.1fs after this supervisor "
                              "saw the driver end)", self.stream, holder.driver_id, holder.host, holder.epoch,
                              time.monotonic() - started)
                if standby is not None and holder.driver_id == standby.driver_id:
                    return standby
                self.standby, self._taken_over_elsewhere = standby, True  # kept, for the next takeover
                return None
            time.sleep(0.1)
        self.log.warning("stream %s: no standby took over (%s); starting a driver", self.stream,
                         f"none within {STANDBY_TAKEOVER_SECONDS:.0f}s" if time.monotonic() >= deadline else "it ended")
        if standby is not None:
            standby.kill()
        return None

    def _supervise(self) -> tuple[str, bool]:
        """Watch the active driver (``self.active``, or an adopted one) until it exits; stop it if it
        stalls; keep a standby ready if the spec asks for one. Why it ended, and whether this
        supervisor stopped it."""
        hook = self.stream_hook
        active = self.active
        last_status = None
        stopping_since: float | None = None
        reason = "driver exited"
        archived_at = time.monotonic()
        self.supervised_epoch = None if active is not None else self.supervised_epoch
        while active.alive() if active is not None else hook.holds(self.supervised_epoch):
            if active is not None:
                active.thread.join(self.poll_seconds)
            else:
                hook.wait_for_exit(self.poll_seconds, epoch=self.supervised_epoch)
            if self._superseded():
                return "this try was superseded", False
            holder = read_holder(hook.layout.lease_dir)
            if active is not None and self.supervised_epoch is None and holder is not None \
                    and holder.driver_id == active.driver_id:
                self.supervised_epoch = holder.epoch  # the driver this task started took the lease
                self.log.info("stream %s: driver pid %s on %s holds epoch %d of the lease", self.stream, holder.pid,
                              holder.host, holder.epoch)
            health = hook.health()
            hook.record_backlog(health)
            # warmed once the active driver runs as it should: on a small machine, a standby starting
            # beside a driver that is starting itself slows both
            self._keep_standby(stopping_since is None and health.status in RUNNING)
            if health.status != last_status:
                self.log.info("%s", health.summary())
                last_status = health.status
            if stopping_since is None and self.supervised_epoch is not None \
                    and health.status in (Status.STALLED, *NO_RESTART):
                self.log.warning("stream %s is %s: %s; stopping it", self.stream, health.status, health.reason)
                if health.status in NO_RESTART:
                    self._end_standby()  # a corrupt checkpoint, or input deleted unread, is never taken over
                hook.request_stop(self.supervised_epoch, f"its supervisor ({self.tenure_name}): {health.status}")
                stopping_since, reason = time.monotonic(), f"stopped because it was {health.status}"
            elif (stopping_since is None and active is not None and self.supervised_epoch is not None
                  and health.status == Status.DEAD and hook.lapsed_here(self.supervised_epoch)):
                # the driver this task started still exists, but its lease lapsed: frozen, or it
                # could not renew it; it fences itself if it ever runs again, so end it now
                self.log.warning("stream %s: the lease of its driver (epoch %d) lapsed while the driver still runs; "
                                 "stopping it", self.stream, self.supervised_epoch)
                hook.request_stop(self.supervised_epoch, f"its supervisor ({self.tenure_name}): lease lapsed")
                stopping_since, reason = time.monotonic(), "stopped because its lease lapsed"
            grace = min(self.grace_seconds, self.stalled_grace_seconds)
            if stopping_since is not None and time.monotonic() - stopping_since > grace:
                pid = hook.kill_driver(epoch=self.supervised_epoch, by=f"its supervisor ({self.tenure_name})")
                if pid is not None:
                    self.log.warning("graceful stop took more than %.0fs: killed driver pid %s", grace, pid)
                stopping_since = float("inf")
            if (stopping_since is None and health.status in RUNNING
                    and time.monotonic() - archived_at >= self.archive_every_seconds):
                archived_at = time.monotonic()
                self._archive(hook)
        return reason, stopping_since is not None

    def _keep_standby(self, wanted: bool) -> None:
        """Launch a standby if the spec asks for one and none runs (one that ended is replaced, at
        most every ``STANDBY_RELAUNCH_SECONDS``). With ``supervision.standby_queue``, the stream
        DAG's ``standby`` task keeps one on another worker while this task runs the active driver;
        this task keeps its own only while the active driver runs elsewhere."""
        supervision = self.stream_hook.spec.supervision
        if not supervision.standby:
            return
        if supervision.standby_queue is not None and self.active is not None:
            wanted = False
        if self.standby is not None and not self.standby.alive():
            code, error = self.standby.result()
            self.log.warning("stream %s: standby %s ended (exit %s%s)", self.stream, self.standby.driver_id, code,
                             f": {error.splitlines()[0]}" if error else "")
            self.standby = None
        if wanted and self.standby is None and time.monotonic() - self._standby_ended >= STANDBY_RELAUNCH_SECONDS:
            self._standby_ended = time.monotonic()
            self.standby = self._launch(standby=True)

    @property
    def tenure_name(self) -> str:
        return self.tenure.task if self.tenure else "a supervisor"

    def _archive(self, hook: StreamHook) -> None:
        """Move committed input out of the landing directory; a failure is logged, never fatal."""
        from spark_jobs.runtime.archive import archive

        try:
            result = archive(hook.spec, hook.layout)
        except OSError as exc:
            self.log.warning("stream %s: archiving committed input failed (tried again later): %s", self.stream, exc)
            return
        if result.archived or result.conflicts:
            self.log.info("stream %s: %s", self.stream, result.describe())

    def kill_grace(self) -> float:
        """How long ``on_kill`` waits for a graceful stop: Airflow's cleanup time less the margin, or
        less if ``kill_grace_seconds`` or ``grace_seconds`` says so. Never more: Airflow's SIGKILL
        would cut the wait short, and the hard stop after it would never run."""
        bound = max(0.0, killed_task_cleanup_seconds() - KILL_MARGIN_SECONDS)  # read now: the setting may change
        if self.kill_grace_seconds is not None:
            bound = min(bound, self.kill_grace_seconds)
        return min(bound, self.grace_seconds)

    def on_kill(self) -> None:
        """Stop the driver this task runs gracefully, then hard if it does not stop before
        Airflow's cleanup time runs out; end its standby first, so that it takes nothing over. A
        driver that has taken the stream over since (this worker was cut off, and the stream moved
        on), or any driver at all once a newer try supervises the stream, is not this task's to stop."""
        hook = self.stream_hook
        if self.standby is not None:
            self.standby.kill()
        epoch = self.supervised_epoch
        if epoch is not None and hook.holds(epoch) and not self._superseded():
            self._stop_when_killed(epoch, f"{self.tenure_name}, killed")
        if self.active is not None:
            self.active.hook.on_kill()  # spark-submit itself, and the driver it tracks in cluster mode

    def _stop_when_killed(self, epoch: int, by: str) -> None:
        """Stop the driver of ``epoch`` gracefully, within the time Airflow lets a killed task clean
        up (:meth:`kill_grace`), then hard."""
        hook, grace = self.stream_hook, self.kill_grace()
        hook.request_stop(epoch, by)
        if not hook.wait_for_exit(grace, epoch=epoch):
            pid = hook.kill_driver(epoch=epoch, by=by)
            if pid is not None:
                self.log.warning("task killed: the graceful stop took more than %.1fs, killed driver pid %s",
                                 grace, pid)


class Launch:
    """One driver a supervisor submitted: spark-submit on a thread of its own, and how it ended."""

    def __init__(self, hook: SparkSubmitHook, application: str, driver_id: str, control_dir: Path):
        self.hook, self.driver_id, self.control_dir = hook, driver_id, control_dir
        self.launched_at = time.time()
        self.outcome: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._submit, args=(application,), name=f"spark-submit:{driver_id}",
                                       daemon=True)
        self.thread.start()

    def _submit(self, application: str) -> None:
        try:
            self.hook.submit(application)
            self.outcome["code"] = 0
        except AirflowException as exc:
            self.outcome["code"], self.outcome["error"] = 1, str(exc)
        except Exception as exc:  # noqa: BLE001 - reported as a failed run
            self.outcome["code"], self.outcome["error"] = 1, f"{type(exc).__name__}: {exc}"

    def alive(self) -> bool:
        return self.thread.is_alive()

    def result(self) -> tuple[int | None, str]:
        """Its exit code (0 or 1, as spark-submit reports it) and error, once it ended."""
        self.thread.join()
        return self.outcome.get("code"), self.outcome.get("error", "")

    def kill(self) -> None:
        """End it (a standby holds nothing: this loses nothing): spark-submit, and a standby's Python
        driver, which would otherwise notice only within a poll that its JVM is gone."""
        from spark_jobs.runtime.standby import end_standby

        self.hook.on_kill()
        end_standby(self.control_dir, self.driver_id)
        self.thread.join(30)


#: the states in which the supervisor task runs no more: its standby task ends too
SUPERVISOR_ENDED = ("success", "failed", "upstream_failed", "skipped", "removed")


class StreamStandbyOperator(StreamSupervisorOperator):
    """Keep a stream's warm standby driver on another worker (``supervision.standby_queue``: this
    task runs there, beside the stream's ``supervise`` task).

    It launches a standby (``spark_jobs.runtime.standby``) for the current try of the stream's
    supervisor, and another when one ends (at most every ``STANDBY_RELAUNCH_SECONDS``). A standby
    that took the stream over is an active driver run by this task: the supervisor watches it
    through its lease, stops it as any driver, and keeps the next standby on its own worker.
    When that driver dies, this task releases its lease at once (so the supervisor's standby
    need not wait out the ttl), then launches a standby again. It ends when the supervisor task
    has ended, or an operator stopped the stream; killed, it stops an active driver as the
    supervisor's ``on_kill`` would. Takes :class:`StreamSupervisorOperator`'s arguments.

    :param supervisor_task_id: the stream's supervisor task in the same DAG run.
    """

    def __init__(self, *, supervisor_task_id: str = "supervise", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.supervisor_task_id = supervisor_task_id
        self._ran_active: int | None = None

    def execute(self, context: Context) -> None:
        hook = self.stream_hook
        ti = context["ti"]
        self._driver_env(hook)
        try:
            while True:
                if (by := hook.held_by()) is not None:
                    self.log.info("stream %s was stopped on purpose (%s): no standby is kept", self.stream, by)
                    return
                if self._supervisor_ended(ti):
                    self.log.info("the supervisor task of stream %s has ended: so does its standby", self.stream)
                    return
                self._watch()
                if self.standby is None:
                    self._relaunch()
                if self.standby is not None:
                    self.standby.thread.join(self.poll_seconds)
                else:
                    time.sleep(self.poll_seconds)  # the supervisor has yet to start, or the relaunch delay
        finally:
            if self.standby is not None and self._ran_active is None:
                self.standby.kill()

    def _supervisor_ended(self, ti: Any) -> bool:  # noqa: ANN401 - Airflow's RuntimeTaskInstance
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[self.supervisor_task_id], run_ids=[ti.run_id])
        return (states.get(ti.run_id) or {}).get(self.supervisor_task_id) in SUPERVISOR_ENDED

    def _watch(self) -> None:
        """Note when this task's standby took the stream over, and release the lease of one that died."""
        launch = self.standby
        if launch is None:
            return
        holder = read_holder(self.stream_hook.layout.lease_dir)
        if self._ran_active is None and holder is not None and holder.driver_id == launch.driver_id:
            self._ran_active = self.supervised_epoch = holder.epoch
            self.log.warning("stream %s: the standby %s took the stream over (epoch %d): this task runs its active "
                             "driver now", self.stream, launch.driver_id, holder.epoch)
        if launch.alive():
            return
        code, error = launch.result()
        if release_dead(self.stream_hook.layout.lease_dir, launch.driver_id) is not None:
            self.log.warning("stream %s: its driver %s (epoch %s) ended (exit %s%s): lease released for the standby "
                             "elsewhere", self.stream, launch.driver_id, self._ran_active, code,
                             f": {error.splitlines()[0]}" if error else "")
        else:
            self.log.info("stream %s: standby %s ended (exit %s)", self.stream, launch.driver_id, code)
        self.standby, self._ran_active, self.supervised_epoch = None, None, None

    def _relaunch(self) -> None:
        """A standby for the supervisor's current try, once it has one."""
        current = tenure.current(self.stream_hook.layout.lease_dir)
        if current is None or time.monotonic() - self._standby_ended < STANDBY_RELAUNCH_SECONDS:
            return
        self._standby_ended = time.monotonic()
        self.tenure = current  # the try it serves (``--supervisor``): it leaves once that try is superseded
        self.standby = self._launch(standby=True)

    def on_kill(self) -> None:
        """Kill the standby; a standby that took the stream over is stopped as the supervisor's
        ``on_kill`` stops its driver (gracefully, then hard)."""
        hook, launch, epoch = self.stream_hook, self.standby, self._ran_active
        if launch is None:
            return
        if epoch is not None and hook.holds(epoch):
            self._stop_when_killed(epoch, f"the standby task of stream {self.stream}, killed")
        launch.kill()


def _budget_spent(hook: StreamHook, budget: RestartBudget) -> str:
    policy = hook.spec.supervision.restart
    return (f"stream {hook.stream}: {budget.failures_in_period(time.time())} failed runs within "
            f"{policy.period_minutes:g} minutes, the restart budget ({policy.max_attempts}) is spent; the stream stays "
            f"stopped. {_last_failure(hook, budget)}Look at the driver logs above, fix the cause, then trigger this "
            f"DAG again.")


def _last_failure(hook: StreamHook, budget: RestartBudget) -> str:
    """What ended the last run, for the message (and the alert) when the budget is spent: its
    exit code and the error its driver reported last (a progress event), else why it ended."""
    from spark_jobs.runtime.progress import read_events

    last = budget.last_run()
    if last is None:
        return ""
    error = None
    for event in read_events(hook.layout.events_file):
        if event.get("event") == "driver_failed" and float(event.get("logged_at") or 0) >= last.started_at:
            error = str(event.get("error") or "").strip()
    said = (error.splitlines()[0] if error else last.reason)[:1000]
    code = "" if last.exit_code is None else f" with exit code {last.exit_code}"
    return f"The last run ended{code}: {said.rstrip('.')}. " if said else ""


def _invalid_spec(hook: StreamHook, budget: RestartBudget) -> str | None:
    """The problems the last run's driver found in the spec (what only Spark can tell, such as
    a SQL query that does not parse), or None if it did not end on an invalid spec."""
    from spark_jobs.runtime.progress import read_events

    last = budget.last_run()
    if last is None:
        return None
    found = None
    for event in read_events(hook.layout.events_file):
        if (event.get("event") == "driver_failed" and event.get("invalid_spec")
                and float(event.get("logged_at") or 0) >= last.started_at):
            found = str(event.get("error") or "").strip()
    return found


def _no_restart_message(health: Health, hook: StreamHook) -> str:
    """Why the supervisor fails instead of restarting: input deleted unread, or a corrupt checkpoint."""
    lines = "\n  ".join(health.problems)
    if health.status == Status.BLOCKED:
        return f"stream {hook.stream}: it cannot read on from its checkpoint and is not restarted:\n  {lines}"
    return (f"stream {hook.stream}: the checkpoint is corrupt and is not reset automatically:\n  {lines}\n"
            f"What you can do: if only the newest offsets file is torn and its batch has no commit, delete that "
            f"file and trigger the stream again (the batch is planned anew). Otherwise move the checkpoint "
            f"{hook.layout.checkpoint_root} aside together with the stream's file sinks, and reprocess the input "
            f"with a backfill.")


class StopStreamOperator(BaseOperator):
    """Stop a stream and keep it stopped: graceful (between micro-batches) or immediate.

    Waits until the driver has exited. The supervisor then ends instead of restarting it.

    :param stream: the stream's name. (templated)
    :param mode: ``graceful`` or ``immediate`` (templated, e.g. from a UI param).
    :param grace_seconds: a graceful stop that takes longer becomes immediate; default 120.
    """

    template_fields: Sequence[str] = ("stream", "mode")

    def __init__(self, *, stream: str, mode: str = "graceful", spec_dir: str | None = None,
                 data_root: str | None = None, grace_seconds: float = 120.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream = stream
        self.mode = mode
        self.spec_dir = spec_dir
        self.data_root = data_root
        self.grace_seconds = grace_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        if self.mode not in ("graceful", "immediate"):
            raise AirflowFailException(f"mode must be graceful or immediate, not {self.mode!r}")
        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        ti = context.get("ti")
        by = f"{getattr(ti, 'dag_id', 'the stop DAG')} run {getattr(ti, 'run_id', '?')} ({self.mode})"
        hook.hold(by)  # first: no supervisor restarts it, no standby takes it over
        started = time.monotonic()
        pids = []
        deadline = started + self.grace_seconds
        # the driver holding the stream, and any that took it over in between (a standby that had
        # found the lease free just before the hold)
        while (holder := read_holder(hook.layout.lease_dir)) is not None and hook.holds(holder.epoch):
            pids.append(holder.pid)
            if self.mode == "graceful" and time.monotonic() < deadline:
                hook.request_stop(holder.epoch, by)
                self.log.info("asked driver pid %s (epoch %d) to stop between micro-batches", holder.pid, holder.epoch)
                if not hook.wait_for_exit(max(0.0, deadline - time.monotonic()), epoch=holder.epoch):
                    self.log.warning("driver pid %s did not stop within %.0fs: killing it", holder.pid,
                                     self.grace_seconds)
                    hook.kill_driver(epoch=holder.epoch, by=by)
            else:
                hook.kill_driver(epoch=holder.epoch, by=by)
            if not hook.wait_for_exit(60, epoch=holder.epoch):
                raise AirflowException(f"driver pid {holder.pid} of stream {self.stream} is still alive")
        if not pids:
            self.log.info("stream %s has no running driver; it is marked stopped", self.stream)
            return {"stream": self.stream, "stopped": True, "driver_pid": None, "seconds": 0.0, "stopped_at": time.time()}
        seconds = time.monotonic() - started
        self.log.info("stream %s stopped: driver pid %s exited after %.1fs (%s)", self.stream, pids[-1], seconds,
                      self.mode)
        return {"stream": self.stream, "stopped": True, "driver_pid": pids[0], "seconds": round(seconds, 1),
                "stopped_at": time.time()}


class ResumeStreamOperator(BaseOperator):
    """Clear a stream's stopped mark so that its supervisor may run it again."""

    template_fields: Sequence[str] = ("stream",)

    def __init__(self, *, stream: str, spec_dir: str | None = None, data_root: str | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.stream, self.spec_dir, self.data_root = stream, spec_dir, data_root

    def execute(self, context: Context) -> None:
        StreamHook(self.stream, self.spec_dir, self.data_root).release_hold()


class BackfillOperator(SparkSubmitOperator):
    """Reprocess a stream's input for an event-time range with ``spark-submit`` (batch).

    Output goes to ``<data root>/backfill/<stream>/<output>/range=<start>_<end>/`` and is
    replaced whole on a rerun: the same range twice gives identical output.

    :param stream: the stream's name. (templated)
    :param start: range start, ISO-8601, inclusive. (templated)
    :param end: range end, ISO-8601, exclusive. (templated)
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream", "start", "end")

    def __init__(self, *, stream: str, start: str, end: str, spec_dir: str | None = None,
                 data_root: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("application", BACKFILL_JOB)
        kwargs.setdefault("name", f"backfill:{stream}")
        super().__init__(**kwargs)
        self.stream, self.start, self.end = stream, start, end
        self.spec_dir, self.data_root = spec_dir, data_root

    def execute(self, context: Context) -> None:
        spec = f"{self.spec_dir or default_spec_dir()}/{self.stream}.yaml"
        self.application_args = ["--spec", spec, "--start", self.start, "--end", self.end]
        if self.data_root:
            self.application_args += ["--data-root", self.data_root]
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, **(self.env_vars or {})}
        super().execute(context)
