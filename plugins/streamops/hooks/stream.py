"""StreamHook: everything Airflow reads or writes about a stream, without Spark."""

from __future__ import annotations

import json
import os
import signal
import time
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.runtime.lease import (
    Holder,
    holder_alive,
    host_id,
    is_spark_submit,
    process_start,
    read_holder,
)
from spark_jobs.stream_spec.layout import (
    Layout,
    default_data_root,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError, StreamSpec
from streamops.health import Health, assess

if TYPE_CHECKING:
    from streamops.cost import DriverCost
    from streamops.sizing import Sizer


class StreamHook(BaseHook):
    """Reads a stream's spec, checkpoint, lease and progress events; writes its stop marker.

    :param stream: the stream's name (its spec is ``<spec_dir>/<stream>.yaml``).
    :param spec_dir: folder of the specs (default ``$STREAMS_SPEC_DIR`` or ``include/streams``).
    :param data_root: root of relative data paths (default ``$STREAMS_DATA_DIR`` or ``data``).
    """

    hook_name = "Stream"

    def __init__(self, stream: str, spec_dir: str | None = None, data_root: str | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.spec_dir = Path(spec_dir) if spec_dir else default_spec_dir()
        self.data_root = Path(data_root) if data_root else default_data_root()
        self._cost: DriverCost | None = None  # what this task's drivers used, as sampled (record_cost)
        self._sizer: Sizer | None = None  # the stream's sizing by lag, with its window of observation (record)
        self._in_file: tuple[object, bool | None] | None = None  # the spec file's state, and what it says

    @cached_property
    def spec(self) -> StreamSpec:
        return load_spec(self.spec_dir / f"{self.stream}.yaml")

    @cached_property
    def layout(self) -> Layout:
        return Layout(self.spec, self.data_root, self.spec_dir)

    @cached_property
    def plan(self) -> StreamPlan:
        """The stream's plan (``spark_jobs.plan``): its queries, checkpoints and tables."""
        return compile_plan(self.spec, self.layout)

    def scheduled_in_file(self) -> bool | None:
        """Does the spec file say now that the stream runs scheduled (``execution.mode``)? None if
        it cannot be read or is invalid now (a driver keeps running what it runs)."""
        from streamops.triggers import file_state

        path = self.spec_dir / f"{self.stream}.yaml"
        state = file_state(path)
        if self._in_file is None or self._in_file[0] != state:  # parsed again only when the file changed
            try:
                self._in_file = (state, load_spec(path).execution.scheduled)
            except SpecError:
                self._in_file = (state, None)
        return self._in_file[1]

    def health(self, now: float | None = None) -> Health:
        return assess(self.plan, self.layout, now)

    def record(self, health: Health) -> None:
        """What each look of the supervisor adds to the stream's history: the backlog and the drivers' cost."""
        self.record_backlog(health)
        self.record_cost()

    def size(self, health: Health) -> dict[str, Any] | None:
        """With ``execution.sizing``: the ``sizing_decision`` event when one is due (``streamops.sizing``;
        not yet written: :meth:`write_event`), else None."""
        if self.plan.execution.sizing is None:
            return None
        from streamops.sizing import Sizer

        if self._sizer is None:
            self._sizer = Sizer(self.plan, self.layout)
        try:
            return self._sizer.observe(health, time.time())
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a recommendation never stops the supervisor
            self.log.warning("stream %s: no sizing recommendation this window: %s", self.stream, exc)
            return None

    def resize(self, per_trigger: int, by: str, trigger_seconds: float | None = None) -> None:
        """Set what a micro-batch of the ingestion may take (and how often one runs, if sized) from the
        next driver's start on (``by``: who, why)."""
        from spark_jobs.runtime import rate_limit

        rate_limit.write(self.layout, per_trigger, rate_limit.unit(self.plan), by, trigger_seconds)
        if self._sizer is not None:
            self._sizer.current = per_trigger
            if trigger_seconds is not None:
                self._sizer.trigger_seconds = trigger_seconds

    def archive_committed(self) -> None:
        """Move input every flow has committed out of the landing directory (``spark_jobs.runtime.archive``);
        a failure is logged, never fatal (tried again later)."""
        from spark_jobs.runtime.archive import archive

        try:
            result = archive(self.plan)
        except OSError as exc:
            self.log.warning("stream %s: archiving committed input failed (tried again later): %s", self.stream, exc)
            return
        if result.archived or result.conflicts:
            self.log.info("stream %s: %s", self.stream, result.describe())

    def write_event(self, event: dict[str, Any]) -> None:
        """An event of the supervisor's, into the stream's log and history."""
        from spark_jobs.runtime.history import History
        from spark_jobs.runtime.progress import EventLog

        EventLog(self.layout.events_file, history=History(self.layout.history_file)).write(event)

    def record_backlog(self, health: Health) -> None:
        """Add the backlog the supervisor sees (files, bytes, rows estimated; a Kafka source's
        records behind) to the stream's history, which its charts draw (spark_jobs.runtime.history)."""
        from spark_jobs.runtime.checkpoint import (
            estimate_rows,
            read_query_checkpoint,
            waiting_files,
        )
        from spark_jobs.runtime.history import History
        from spark_jobs.stream_spec.models import INGEST_FLOW

        source = self.plan.source
        if health.backlog_records is not None:  # a Kafka source: records behind the broker
            History(self.layout.history_file).sample({"backlog_records": health.backlog_records}, at=health.checked_at)
            return
        if source is None or not source.is_files or source.landing is None:
            return
        values: dict[str, float] = {"backlog_files": health.backlog_files, "backlog_bytes": health.backlog_bytes,
                                    "backlog_rows": 0}
        if health.backlog_files:
            ingestion = read_query_checkpoint(self.plan.checkpoint(INGEST_FLOW))
            waiting = waiting_files(source.landing, ingestion.processed_files)
            rows = estimate_rows(source.landing, waiting, header=source.format == "csv")
            if rows is None:
                del values["backlog_rows"]
            else:
                values["backlog_rows"] = rows
        History(self.layout.history_file).sample(values, at=health.checked_at)

    def record_cost(self) -> None:
        """Add what this task's drivers used since the last call (CPU seconds, memory) to the stream's
        history (``streamops.cost``)."""
        from spark_jobs.runtime.history import History
        from streamops.cost import DriverCost

        if self._cost is None:
            self._cost = DriverCost()
        self._cost.sample(History(self.layout.history_file), time.time())

    def driver_alive(self) -> bool:
        return holder_alive(self.layout.lease_dir)

    def driver_pid(self) -> int | None:
        holder = read_holder(self.layout.lease_dir)
        return holder.pid if holder is not None and self.driver_alive() else None

    def driver_here(self) -> Holder | None:
        """The live driver's lease record if it runs on this machine (a driver this worker
        started or adopted), else None."""
        holder = read_holder(self.layout.lease_dir)
        return holder if holder is not None and holder.host == host_id() and self.driver_alive() else None

    def request_stop(self, epoch: int, by: str, immediate: bool = False, hand_to: str | None = None,
                     grace_seconds: float = 120.0) -> Path:
        """Ask the driver holding ``epoch`` of the lease to stop (it polls this marker): between
        micro-batches, or at once; ``by``: who asks (for the driver's log). ``hand_to``: the standby
        that is to take the stream over (a rescale's): others leave it the lease for the stop's
        ``grace_seconds`` and a minute more."""
        from spark_jobs.runtime.driver import request_stop
        from spark_jobs.runtime.standby import hand_to as name_standby

        if hand_to is not None:
            name_standby(self.layout.lease_dir, hand_to, grace_seconds + 60)
        request_stop(self.layout.stop_marker, epoch, by, immediate)
        return self.layout.stop_marker

    def hold(self, by: str) -> None:
        """Mark the stream stopped on purpose (the stop DAG): no supervisor restarts it and no
        standby takes it over until it is deployed again; ``by``: who asked."""
        write_atomically(self.layout.hold_marker, json.dumps({"by": by, "at": time.time()}))

    def held_by(self) -> str | None:
        """Who stopped the stream on purpose, or None if nobody did."""
        from spark_jobs.runtime.driver import held_by

        return held_by(self.layout.hold_marker)

    def release_hold(self, older_than: float | None = None) -> None:
        """Deployed again: the stream may run. ``older_than``: only a mark written before then (a
        deploy's run created before a stop, or a retry of its supervisor, leaves the stop standing)."""
        marker = self.layout.hold_marker
        try:
            if older_than is not None and marker.stat().st_mtime >= older_than:
                return
        except FileNotFoundError:
            return
        marker.unlink(missing_ok=True)

    def lapsed_here(self, epoch: int) -> bool:
        """Has the lease of the driver of ``epoch`` lapsed while that driver's process still
        exists on this machine (frozen, or unable to renew it)?"""
        holder = read_holder(self.layout.lease_dir)
        return (holder is not None and holder.epoch == epoch and holder.host == host_id() and not holder.alive()
                and holder.pid_start is not None and process_start(holder.pid) == holder.pid_start)

    def holds(self, epoch: int | None) -> bool:
        """Does a live driver hold the checkpoint (``epoch``: that epoch of the lease)?"""
        if epoch is None:
            return self.driver_alive()
        holder = read_holder(self.layout.lease_dir)
        return holder is not None and holder.epoch == epoch and self.driver_alive()

    def wait_for_exit(self, timeout: float, poll: float = 0.5, epoch: int | None = None) -> bool:
        """Wait until no driver holds the checkpoint (``epoch``: until the driver holding
        that epoch no longer does); False on timeout."""
        deadline = time.monotonic() + timeout
        while self.holds(epoch):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)
        return True

    def kill_driver(self, sig: int = signal.SIGKILL, epoch: int | None = None, by: str = "") -> int | None:
        """Signal the driver holding the lease, and the spark-submit JVM that launched it; the
        driver's pid, or None if there was none. ``epoch``: only the driver of that epoch, even
        one whose lease has lapsed while it still exists here (a frozen driver). A driver on
        another machine, where no signal reaches, is asked to stop immediately (``SIGKILL``)
        through its marker (``by``: who asks)."""
        holder = read_holder(self.layout.lease_dir)
        if holder is None or epoch not in (None, holder.epoch) or (epoch is None and not self.driver_alive()):
            return None
        if holder.host != host_id():
            if sig != signal.SIGKILL:
                return None
            self.request_stop(holder.epoch, by, immediate=True)
            return holder.pid
        if holder.pid_start is not None and process_start(holder.pid) != holder.pid_start:
            return None  # gone (the pid may be another process's by now)
        targets = [holder.pid]
        if holder.launcher_pid > 1 and is_spark_submit(holder.launcher_pid):
            targets.append(holder.launcher_pid)
        for target in targets:
            try:
                os.kill(target, sig)
            except ProcessLookupError:
                continue
        return holder.pid
