"""The operator that keeps a stream's warm standby on another worker: it does what its
:class:`~streamops.supervisor.Standby` decides."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context

from spark_jobs.runtime.lease import read_holder, release_dead
from streamops import tenure
from streamops.operators.driver import StreamDriverOperator
from streamops.supervisor import Standby

#: the states in which the supervisor task runs no more: its standby task ends too
SUPERVISOR_ENDED = ("success", "failed", "upstream_failed", "skipped", "removed")


class StreamStandbyOperator(StreamDriverOperator):
    """Keep a stream's warm standby driver on another worker (``supervision.standby_queue``: this
    task runs there, beside the stream's ``supervise`` task).

    It launches a standby (``spark_jobs.runtime.standby``) for the current try of the stream's
    supervisor, and another when one ends (at most every ``STANDBY_RELAUNCH_SECONDS``). A standby
    that took the stream over is an active driver run by this task: the supervisor watches it
    through its lease, stops it as any driver, and keeps the next standby on its own worker.
    When that driver dies, this task releases its lease at once (so the supervisor's standby
    need not wait out the ttl), then launches a standby again. It ends when the supervisor task
    has ended, or an operator stopped the stream; killed, it stops an active driver as the
    supervisor's ``on_kill`` would. What to do is decided by a
    :class:`~streamops.supervisor.Standby` (``self.keeper``). Takes
    :class:`~streamops.operators.driver.StreamDriverOperator`'s arguments, and:

    :param supervisor_task_id: the stream's supervisor task in the same DAG run.
    """

    def __init__(self, *, supervisor_task_id: str = "supervise", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.supervisor_task_id = supervisor_task_id
        self.keeper = Standby(self.stream)

    def execute(self, context: Context) -> None:
        hook, keeper = self.stream_hook, self.keeper
        ti = context["ti"]
        self._driver_env(hook)
        try:
            while True:
                if (end := keeper.ends(hook.held_by(), lambda: self._supervisor_ended(ti))) is not None:
                    self._say(end)
                    return
                self._watch()
                if keeper.launch is None and keeper.relaunch(tenure.current(hook.layout.lease_dir)):
                    keeper.launch = self._launch(standby=True, tenure=keeper.tenure)
                if keeper.launch is not None:
                    keeper.launch.thread.join(self.poll_seconds)
                else:
                    time.sleep(self.poll_seconds)  # the supervisor has yet to start, or the relaunch delay
        finally:
            if keeper.launch is not None and keeper.ran_active is None:
                keeper.launch.kill()

    def _supervisor_ended(self, ti: Any) -> bool:  # Airflow's RuntimeTaskInstance
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[self.supervisor_task_id], run_ids=[ti.run_id])
        return (states.get(ti.run_id) or {}).get(self.supervisor_task_id) in SUPERVISOR_ENDED

    def _watch(self) -> None:
        """Note when this task's standby took the stream over, and release the lease of one that died."""
        launch, lease_dir = self.keeper.launch, self.stream_hook.layout.lease_dir
        if launch is None:
            return
        self._say(self.keeper.took_over(read_holder(lease_dir)))
        if launch.alive():
            return
        code, error = launch.result()
        self._say(self.keeper.ended(code, error, release_dead(lease_dir, launch.driver_id) is not None))

    def on_kill(self) -> None:
        """Kill the standby; a standby that took the stream over is stopped as the supervisor's
        ``on_kill`` stops its driver (gracefully, then hard)."""
        hook, launch, epoch = self.stream_hook, self.keeper.launch, self.keeper.ran_active
        if launch is None:
            return
        if epoch is not None and hook.holds(epoch):
            self._stop_when_killed(epoch, f"the standby task of stream {self.stream}, killed")
        launch.kill()
