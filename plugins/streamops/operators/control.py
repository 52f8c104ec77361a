"""The operators that stop a stream on purpose (it stays stopped) and let it run again."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from spark_jobs.runtime.lease import read_holder
from streamops.hooks.stream import StreamHook


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
