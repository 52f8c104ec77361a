"""The operator that keeps the data root's shared driver running (``spark_jobs/shared_driver.py``):
the one driver that takes the scheduled runs of every stream whose spec says
``execution.shared_driver`` (``streamops.operators.driver.QueuedLaunch`` asks it)."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from spark_jobs.runtime.lease import host_id
from spark_jobs.runtime.run_queue import RunQueue
from spark_jobs.submit import SHARED, SHARED_DRIVER

if TYPE_CHECKING:
    from airflow.sdk import Context


class SharedDriverOperator(SparkSubmitOperator):
    """Submit the shared driver of the queue folder ``queue_dir`` and run until it ends. Killed (a
    stop from the UI, the task cleared): SIGTERM to the driver's Python process, which the queue
    names, so that the run in progress stops between batches; then spark-submit.

    All other arguments go to :class:`SparkSubmitOperator` (``conn_id`` picks where Spark runs).
    """

    template_fields = (*SparkSubmitOperator.template_fields, "queue_dir")

    def __init__(self, *, queue_dir: str, **kwargs: Any) -> None:
        kwargs.setdefault("application", str(SHARED_DRIVER))
        kwargs.setdefault("application_args", ["--queue", queue_dir])
        kwargs.setdefault("name", SHARED)
        super().__init__(**kwargs)
        self.queue_dir = queue_dir  # (not ``queue``: that is the executor's queue of every operator)

    def execute(self, context: Context) -> None:
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, **(self.env_vars or {})}
        super().execute(context)

    def on_kill(self) -> None:
        """SIGTERM to the shared driver's Python process, and a wait for it to end within the time
        Airflow gives a killed task; then spark-submit itself. A run that did not stop in that time
        ends with the driver: its supervisor sees exit 137 and runs it again, from its checkpoint."""
        import psutil

        from streamops.operators.driver import KILL_MARGIN_SECONDS, killed_task_cleanup_seconds

        serving = RunQueue(self.queue_dir).serving()
        if serving is not None and serving.get("host") == host_id():
            pid = int(serving["pid"])
            self.log.info("stopping the shared driver (pid %s, on run %s)", pid, serving.get("run"))
            try:
                process = psutil.Process(pid)
                process.send_signal(signal.SIGTERM)
                process.wait(max(0.0, killed_task_cleanup_seconds() - KILL_MARGIN_SECONDS))
                self.log.info("the shared driver (pid %s) stopped", pid)
            except psutil.TimeoutExpired:
                self.log.warning("the shared driver (pid %s) did not stop in time: its spark-submit is killed", pid)
            except psutil.Error:
                pass  # gone already
        super().on_kill()
