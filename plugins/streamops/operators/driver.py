"""What the operators that submit a stream's driver share: the driver's arguments, environment
and spark-submit hook, the :class:`Launch` of one driver, and the stop of a killed task."""

from __future__ import annotations

import inspect
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from spark_jobs.runtime.lease import DRIVER_ID_ENV
from spark_jobs.runtime.run_queue import EXIT_NOT_SHAREABLE, RunQueue, RunRequest, not_shareable
from spark_jobs.runtime.session import available_now_conf
from spark_jobs.stream_spec.layout import default_spec_dir
from streamops.hooks.stream import StreamHook
from streamops.operators import job_path

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    from streamops.supervisor import Decision
    from streamops.tenure import Tenure

log = logging.getLogger(__name__)
STREAM_JOB = job_path("stream_job.py")
#: Left of Airflow's cleanup time when the supervisor is killed, to kill the driver and
#: spark-submit after a graceful stop that did not finish.
KILL_MARGIN_SECONDS = 2.0


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


class StreamDriverOperator(SparkSubmitOperator):
    """Base of the operators that submit a stream's driver (``spark_jobs/stream_job.py``) and
    watch it: :class:`~streamops.operators.supervise.StreamSupervisorOperator` and
    :class:`~streamops.operators.standby.StreamStandbyOperator`.

    :param stream: the stream's name. (templated)
    :param spec_dir: the specs' folder (default ``$STREAMS_SPEC_DIR``).
    :param data_root: root of relative data paths (default ``$STREAMS_DATA_DIR``).
    :param poll_seconds: how often the driver is looked at; default 5.
    :param grace_seconds: how long a graceful stop may take before the driver is killed; default 120.
    :param kill_grace_seconds: the same when this task is killed (``on_kill``): by default, and
        never more than, the time Airflow lets a killed task clean up (see
        :func:`killed_task_cleanup_seconds`, read when the task is killed) less
        ``KILL_MARGIN_SECONDS`` to kill the driver and spark-submit, so that the hard stop still
        happens; ``grace_seconds`` bounds it too.
    All other arguments go to :class:`SparkSubmitOperator` (``conn_id`` picks where Spark runs); each
    driver goes through a :class:`SparkSubmitHook` that operator builds (:meth:`spark_submit_hook`).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream")

    def __init__(self, *, stream: str, spec_dir: str | None = None, data_root: str | None = None,
                 poll_seconds: float = 5.0, grace_seconds: float = 120.0, kill_grace_seconds: float | None = None,
                 **kwargs: Any) -> None:
        self.spec_file = f"{spec_dir or default_spec_dir()}/{stream}.yaml"
        args = ["--spec", self.spec_file]
        if data_root:
            args += ["--data-root", data_root]
        kwargs.setdefault("application", STREAM_JOB)
        kwargs.setdefault("application_args", args)
        kwargs.setdefault("name", f"stream:{stream}")
        super().__init__(**kwargs)
        self.stream = stream
        self.spec_dir = spec_dir
        self.data_root = data_root
        self.poll_seconds = poll_seconds
        self.grace_seconds = grace_seconds
        self.kill_grace_seconds = kill_grace_seconds
        self._stream_hook: StreamHook | None = None
        self._own_jvm = False  # set once the shared driver refused the stream: its runs get JVMs of their own

    @property
    def stream_hook(self) -> StreamHook:
        if self._stream_hook is None:
            self._stream_hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        return self._stream_hook

    def spark_submit_hook(self, **overrides: Any) -> SparkSubmitHook:
        """A new hook for one run of the driver, built by SparkSubmitOperator itself (its
        ``_get_hook``) from this task's arguments, the templated ones as rendered (and
        ``env_vars`` as execute sets them), with ``overrides`` of templated ones."""
        if unknown := set(overrides) - set(SparkSubmitOperator.template_fields):
            raise TypeError(f"only SparkSubmitOperator's templated arguments can be overridden, not {sorted(unknown)}")
        run = self.prepare_for_execution()  # a copy, locked as a running task is: this task's own stay as they are
        for name, value in overrides.items():
            setattr(run, name, value)
        return run._get_hook()

    def _driver_env(self, hook: StreamHook) -> None:
        """The environment of the drivers this task launches."""
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, **(self.env_vars or {}), **_kafka_env(hook)}

    def _launch(self, standby: bool, tenure: Tenure | None = None, available_now: bool = False) -> Launch | QueuedLaunch:
        """Submit a driver (``standby``: a warm standby that waits to take the stream over, for the
        supervisor's try ``tenure``; ``available_now``: one that takes what waits and exits, a
        scheduled run, asked of the data root's shared driver if the spec says so and one serves)."""
        driver_id = f"{self.stream}-{uuid.uuid4().hex[:12]}"
        if available_now and (queued := self._queue_run(driver_id)) is not None:
            return queued
        return self._submit(driver_id, standby, tenure, available_now)

    def _submit(self, driver_id: str, standby: bool, tenure: Tenure | None, available_now: bool) -> Launch:
        """A driver in a JVM of its own, through spark-submit."""
        extra = ["--standby", "--supervisor", str(tenure.number if tenure else 0)] if standby else []
        overrides: dict[str, Any] = {}
        if available_now:  # its JVM started at every run: compiled with the JIT's first tier only
            extra, overrides = ["--trigger", "available-now"], {"conf": available_now_conf(self.conf or {})}
        env = {**(self.env_vars or {}), DRIVER_ID_ENV: driver_id}
        launch = Launch(self.spark_submit_hook(env_vars=env, application_args=[*(self.application_args or []), *extra],
                                               **overrides),
                        self.application, driver_id, self.stream_hook.layout.lease_dir)
        self.log.info("stream %s: %s driver %s launched", self.stream, "standby" if standby else "active",
                      launch.driver_id)
        return launch

    def _queue_run(self, driver_id: str) -> QueuedLaunch | None:
        """The available-now run asked of the data root's shared driver, if the spec says so, one
        serves and the stream can run there; else None (a JVM of its own)."""
        hook = self.stream_hook
        if not hook.plan.execution.shared_driver or self._own_jvm:
            return None
        queue = RunQueue(hook.layout.shared_driver_queue)
        if (serving := queue.serving()) is None:
            self.log.info("stream %s: no shared driver serves %s: the run gets a JVM of its own", self.stream,
                          queue.dir)
            return None
        if (reason := not_shareable(hook.spec)) is not None:
            self.log.warning("stream %s: its runs get JVMs of their own: %s", self.stream, reason)
            self._own_jvm = True
            return None
        launch = QueuedLaunch(queue, RunRequest(spec=self.spec_file, data_root=self.data_root, driver_id=driver_id,
                                                env=_kafka_env(hook)),
                              hook.layout.history_file, own_jvm=self._own_jvm_instead)
        self.log.info("stream %s: run %s (driver id %s) asked of the shared driver (pid %s on %s)", self.stream,
                      launch.run_id, driver_id, serving.get("pid"), serving.get("host"))
        return launch

    def _own_jvm_instead(self, driver_id: str, why: str, refused: bool) -> Launch:
        """The run a shared driver did not take (it ``refused`` the stream, or none serves any
        more), in a JVM of its own; after a refusal, every later run of this task too."""
        self.log.warning("stream %s: %s: the run gets a JVM of its own", self.stream, why)
        self._own_jvm = self._own_jvm or refused
        return self._submit(driver_id, standby=False, tenure=None, available_now=True)

    def _say(self, decision: Decision | None) -> None:
        """Log what a decision says."""
        if decision is not None and decision.say:
            getattr(self.log, decision.level)("%s", decision.say)

    def kill_grace(self) -> float:
        """How long ``on_kill`` waits for a graceful stop: Airflow's cleanup time less the margin, or
        less if ``kill_grace_seconds`` or ``grace_seconds`` says so. Never more: Airflow's SIGKILL
        would cut the wait short, and the hard stop after it would never run."""
        bound = max(0.0, killed_task_cleanup_seconds() - KILL_MARGIN_SECONDS)  # read now: the setting may change
        if self.kill_grace_seconds is not None:
            bound = min(bound, self.kill_grace_seconds)
        return min(bound, self.grace_seconds)

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


class QueuedLaunch:
    """One available-now run asked of the data root's shared driver (``spark_jobs/shared_driver.py``),
    watched as a :class:`Launch` is: alive until its result is in the queue. If no driver took it
    and none serves any more, or the driver refused the stream (exit 5: settings that need a JVM of
    its own), the run goes on in a JVM of its own (``own_jvm``), as the same driver id: nothing was
    written meanwhile, and the supervisor sees one run."""

    def __init__(self, queue: RunQueue, request: RunRequest, history_file: Path,
                 own_jvm: Callable[[str, str, bool], Launch]):
        self.queue, self.driver_id, self.history_file, self._own_jvm = queue, request.driver_id, history_file, own_jvm
        self.launched_at = time.time()
        self.run_id = queue.ask(request)
        self.outcome: dict[str, Any] | None = None
        self.instead: Launch | None = None  # the JVM of its own it went to

    def alive(self) -> bool:
        if self.instead is not None:
            return self.instead.alive()
        if self.outcome is None:
            if (found := self.queue.result(self.run_id)) is not None:
                self._ended(found)
            elif self.queue.serving() is None and self.queue.withdraw(self.run_id):
                self.instead = self._own_jvm(self.driver_id, "no shared driver serves its queue any more", False)
        if self.instead is None and (self.outcome or {}).get("code") == EXIT_NOT_SHAREABLE:
            self.instead = self._own_jvm(self.driver_id, f"the shared driver refused it: {self.outcome.get('error', '')}",
                                         True)
        return self.instead.alive() if self.instead is not None else self.outcome is None

    def _ended(self, found: dict[str, Any]) -> None:
        """Its lines into the task's log, its CPU seconds into the stream's cost (``streamops.cost``)."""
        from spark_jobs.runtime.history import History
        from streamops.cost import CPU

        for line in self.queue.log_lines(self.run_id):
            log.info("shared driver: %s", line)
        took = f" after {found['wall_s']:.1f}s ({found.get('cpu_s') or 0:.1f} CPU s)" if found.get("wall_s") else ""
        log.info("shared driver: run %s ended with exit %s%s%s", self.run_id, found.get("code"), took,
                 f": {found['error']}" if found.get("error") else "")
        if found.get("cpu_s"):
            History(self.history_file).sample({CPU: float(found["cpu_s"])}, at=time.time())
        self.queue.forget(self.run_id)
        self.outcome = found

    def wait(self, seconds: float) -> None:
        """Until it ended, or ``seconds`` passed."""
        deadline = time.monotonic() + seconds
        while self.alive() and time.monotonic() < deadline:
            if self.instead is not None:
                self.instead.wait(max(0.0, deadline - time.monotonic()))
                return
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def result(self) -> tuple[int | None, str]:
        """Its exit code (the stream driver's own: 0, 1, 2, ...; 137 if the shared driver ended
        during it) and error, once it ended."""
        while self.alive():
            self.wait(5.0)
        if self.instead is not None:
            return self.instead.result()
        assert self.outcome is not None
        return self.outcome.get("code"), self.outcome.get("error", "")

    def kill(self) -> None:
        """Take it back if no shared driver took it yet (one that did stops it as the stream's stop
        marker asks, as any driver)."""
        if self.instead is not None:
            self.instead.kill()
        elif self.outcome is None and self.queue.withdraw(self.run_id):
            self.outcome = {"code": 0, "error": "withdrawn before a shared driver took it"}

    def on_kill(self) -> None:
        if self.instead is not None:
            self.instead.on_kill()
        else:
            self.kill()


class Launch:
    """One driver an operator submitted: spark-submit on a thread of its own, and how it ended."""

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
        except Exception as exc:  # reported as a failed run
            self.outcome["code"], self.outcome["error"] = 1, f"{type(exc).__name__}: {exc}"

    def alive(self) -> bool:
        return self.thread.is_alive()

    def result(self) -> tuple[int | None, str]:
        """Its exit code (0 or 1, as spark-submit reports it) and error, once it ended."""
        self.thread.join()
        return self.outcome.get("code"), self.outcome.get("error", "")

    def wait(self, seconds: float) -> None:
        """Until it ended, or ``seconds`` passed."""
        self.thread.join(seconds)

    def on_kill(self) -> None:
        """Its task is killed: spark-submit itself, and the driver it tracks in cluster mode."""
        self.hook.on_kill()

    def kill(self) -> None:
        """End it (a standby holds nothing: this loses nothing): spark-submit, and a standby's Python
        driver, which would otherwise notice only within a poll that its JVM is gone."""
        from spark_jobs.runtime.standby import end_standby

        self.hook.on_kill()
        end_standby(self.control_dir, self.driver_id)
        self.thread.join(30)
