"""The operator that runs a stream and keeps it running, as its :class:`~streamops.supervisor.Supervisor` decides."""

from __future__ import annotations

import time
from typing import Any

from airflow.sdk import Context
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from spark_jobs.runtime.lease import read_holder, release_dead
from spark_jobs.runtime.progress import EventLog, rows_read
from spark_jobs.runtime.standby import READY, WARMING, standbys
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops import tenure
from streamops.health import Health, Status
from streamops.operators.driver import StreamDriverOperator
from streamops.restarts import RestartBudget
from streamops.supervisor import Act, Decision, Supervisor
from streamops.triggers.input_waiting import run_began, run_ended


def _supervisor_state(name: str, doc: str) -> property:
    """One of what the supervisor remembers, as an attribute of the task."""
    return property(lambda self: getattr(self.supervisor, name),
                    lambda self, value: setattr(self.supervisor, name, value), doc=doc)


class StreamSupervisorOperator(StreamDriverOperator):
    """Run a stream with ``spark-submit`` and keep it running.

    The driver runs as a child of this task (client mode), or in the cluster (YARN or Kubernetes
    cluster mode), where the lease's heartbeat tells a retried task that it still runs. Every
    ``poll_seconds`` the stream's health is read from its checkpoint; what follows (restarts with
    backoff within the restart budget, stops of stalled drivers, adoption, the standby, switches
    of mode, rescales by sizing) is listed in :mod:`streamops.supervisor`. The task ends
    successfully when an operator stopped the stream (the hold marker), an available-now run
    finished, or the stream switched to scheduled runs (a deploy's run made after a stop undoes it);
    any other exit of the driver is a failed run. An application of the user's own (``application:``)
    is submitted as that application, its spec's path in ``STREAMS_APP_SPEC``. What its drivers use
    is sampled into the stream's history (``streamops.cost``).

    What to do is decided by a :class:`~streamops.supervisor.Supervisor` (``self.supervisor``),
    from the stream's health, lease and hold marker; this task does it and logs what it says.

    Takes :class:`~streamops.operators.driver.StreamDriverOperator`'s arguments (the stream,
    ``poll_seconds``, ``grace_seconds``, ``kill_grace_seconds``, and SparkSubmitOperator's), and:

    :param stalled_grace_seconds: how long a graceful stop of a stalled driver may take, which
        has already committed nothing for the whole stall window (a frozen or hung driver);
        default 5 (``grace_seconds`` bounds it).
    :param archive_every_seconds: how often input files every query has committed are moved
        to the spec's ``source.archive_path`` while the stream runs (see
        :mod:`spark_jobs.runtime.archive`); default 60.
    """

    def __init__(self, *, stalled_grace_seconds: float = 5.0, archive_every_seconds: float = 60.0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stalled_grace_seconds = stalled_grace_seconds
        self.archive_every_seconds = archive_every_seconds
        self.supervisor = Supervisor(self.stream, stop_grace=min(self.grace_seconds, stalled_grace_seconds),
                                     archive_every=archive_every_seconds, switch_grace=self.grace_seconds)

    active = _supervisor_state("active", "the driver this task runs (a Launch)")
    standby = _supervisor_state("standby", "its warm standby (``supervision.standby``)")
    adopted_pid = _supervisor_state("adopted_pid", "the pid of the driver this task adopted")
    supervised_epoch = _supervisor_state("epoch", "the lease epoch of the driver this task runs or adopted")

    def execute(self, context: Context) -> dict[str, Any]:
        hook = self.stream_hook
        if not hook.plan.execution.scheduled:
            return self._run(context)
        previous = run_began(hook.layout.lease_dir)  # the input's watcher asks for no other run meanwhile
        try:
            self._skip_if_nothing_to_run(context)
            return self._run(context, previous)
        finally:
            run_ended(hook.layout.lease_dir)

    def _run(self, context: Context, previous_began: float | None = None) -> dict[str, Any]:
        hook, sup = self.stream_hook, self.supervisor
        plan, ti = hook.plan, context.get("ti")
        sup.begin(tenure.begin(hook.layout.lease_dir, f"{getattr(ti, 'dag_id', '?')} run {getattr(ti, 'run_id', '?')} "
                                                      f"try {getattr(ti, 'try_number', '?')}"),
                  RestartBudget(hook.layout.runs_file, plan.supervision.restart),
                  events_file=hook.layout.events_file, checkpoint_root=hook.layout.checkpoint_root,
                  available_now=hook.plan.available_now,
                  adaptive=plan.execution if plan.execution.adaptive else None, previous_began=previous_began)
        created = getattr(context.get("dag_run"), "run_after", None)  # a deploy undoes the stops made before it
        hook.release_hold(older_than=created.timestamp() if created is not None else None)
        self._driver_env(hook)
        app = plan.application
        if app is not None:  # the application itself, told where its spec is (spark_jobs.runtime.driver)
            from spark_jobs.runtime.driver import APP_SPEC_ENV

            self.application, self.application_args = app.file, list(app.args)
            self.env_vars[APP_SPEC_ENV] = str(hook.layout.spec_dir / f"{self.stream}.yaml")
            if self.data_root:
                self.env_vars["STREAMS_DATA_DIR"] = str(self.data_root)
        try:
            while True:
                if self._superseded():
                    return {}
                health = hook.health()
                self.log.info("%s", health.summary())
                alive = hook.driver_alive()
                run = sup.next_run(health, hook.held_by(), alive, read_holder(hook.layout.lease_dir) if alive else None)
                self._say(run)
                if run.act is Act.FAIL:
                    raise AirflowFailException(run.why)
                if run.act is Act.END:
                    return health.to_dict()
                if run.act is Act.START:
                    if run.delay:
                        time.sleep(run.delay)  # the backoff itself
                        if hook.held_by() is not None:
                            continue  # stopped on purpose meanwhile: the next look ends the run
                    if self._superseded():
                        return {}
                    self._say(sup.started(self._launch(standby=False, available_now=sup.available_now)))
                elif run.act is Act.WATCH:  # its standby took over
                    self._say(sup.started())
                reason, forced = self._supervise()
                own = sup.active
                if own is not None and self._superseded():  # its own driver halts by itself: the lease is another's
                    return {}
                code, reason = sup.exited(reason, own.result() if own is not None else None)
                hook.record_cost()  # the rest of what the run used, to its exit
                if self._superseded():  # a try Airflow no longer runs records nothing
                    return {}
                ended = sup.run_ended(code, reason, forced, hook.held_by())
                self._say(ended)
                self._record(ended)
                if ended.end_standby:
                    self._end_standby()
                if ended.act is Act.FAIL:
                    raise AirflowFailException(ended.why)
                if ended.act is Act.END:
                    return hook.health().to_dict()
                self._take_over()
        finally:
            if sup.standby is not None:
                sup.standby.kill()

    def _quiet(self) -> Decision | None:
        """An adaptive stream's continuous driver whose input went quiet: the stop that says so."""
        sup = self.supervisor
        if sup.adaptive is None or sup.available_now:
            return None
        return sup.quiet(rows_read(self.stream_hook.layout.events_file, INGEST_FLOW, time.time() - sup.quiet_seconds))

    def _record(self, decision: Decision) -> None:
        """The decision's event, in the stream's log and history (an adaptive stream's choice of mode, a rescale)."""
        if decision.event is not None:
            self.stream_hook.write_event(decision.event)

    def _size(self, health: Health) -> None:
        """Sizing by lag (``streamops.sizing``): a recommendation when due; one to apply sets the new
        limit and launches a standby at it, which takes the stream over once ready (a rescale)."""
        hook, sup = self.stream_hook, self.supervisor
        every = (event := hook.size(health)) and event.get("trigger_seconds")  # the interval, if sized
        rescale = sup.rescale(event["per_trigger"], event["unit"], event["current"], every) if event and event["applied"] else None
        if event is not None:
            event["applied"] = rescale is not None
            hook.write_event(event)
        if rescale is not None:
            self._say(rescale)
            hook.resize(event["per_trigger"], f"its supervisor ({sup.tenure_name}): sizing by lag", every)
            self._end_standby()
            sup.rescaling(self._launch(standby=True, tenure=sup.tenure))
        if sup.rescale_pending:
            if (step := sup.hand_over_when_ready({s.driver_id for s in standbys(hook.layout.lease_dir)
                                                  if s.state == READY})) is not None:
                self._say(step)
                if step.act is Act.STOP:  # for the rescale's standby (not one on another worker, at the old size)
                    hook.request_stop(sup.epoch, step.why, hand_to=sup.standby and sup.standby.driver_id,
                                      grace_seconds=sup.switch_grace)
                if step.driver is not None:
                    step.driver.kill()

    def _skip_if_nothing_to_run(self, context: Context) -> None:
        """A scheduled stream's run that its schedule or its input started (not an operator's deploy)
        launches no driver while the stream is stopped on purpose, or when no input waits."""
        run = context.get("dag_run")
        if str(getattr(run, "run_type", "manual")).lower().endswith("manual"):
            return  # a deploy: it releases the hold, and runs whatever waits
        hook = self.stream_hook
        if (held_by := hook.held_by()) is not None:
            raise AirflowSkipException(f"stream {self.stream} was stopped on purpose ({held_by}); no run")
        if hook.driver_alive():
            return  # a run left by an earlier try: adopted
        health = hook.health()
        if health.status == Status.IDLE:
            raise AirflowSkipException(f"stream {self.stream}: no input waits ({health.reason}); no driver started")

    def _superseded(self) -> bool:
        """Is a newer try of this task the stream's supervisor now (this try's worker was cut off,
        and Airflow retried the task elsewhere)? Then this one leaves the stream alone: it adopts
        nothing, stops nothing and records no run."""
        sup = self.supervisor
        newer = tenure.current(self.stream_hook.layout.lease_dir) if sup.tenure is not None else None
        if (leave := sup.leaves(newer)) is None:
            return False
        if leave.say:  # the first time
            self._say(leave)
            EventLog(self.stream_hook.layout.events_file).write({
                "event": "supervisor_superseded", "stream": self.stream, "supervisor": sup.tenure.task,
                "by": newer.task, "host": sup.tenure.host})
        if (standby := sup.drop_standby()) is not None:
            standby.kill()
        return True

    def _end_standby(self) -> None:
        """End the standby, and the driver it became if it has taken the stream over already."""
        standby = self.supervisor.drop_standby()
        if standby is None:
            return
        holder = read_holder(self.stream_hook.layout.lease_dir)
        if holder is not None and holder.driver_id == standby.driver_id:
            self.stream_hook.kill_driver(epoch=holder.epoch, by=f"its supervisor ({self.supervisor.tenure_name})")
        standby.kill()

    def _take_over(self) -> None:
        """After the active driver ended: the standby that takes the stream over (see
        :meth:`Supervisor.takeover`). The ended driver's lease is released first, so that a standby
        elsewhere need not wait out its ttl."""
        hook, sup = self.stream_hook, self.supervisor
        if sup.ended is not None:
            release_dead(hook.layout.lease_dir, sup.ended.driver_id)
        sup.hand_over({s.driver_id for s in standbys(hook.layout.lease_dir) if s.state != WARMING})
        while (step := sup.takeover(read_holder(hook.layout.lease_dir))).act is Act.WAIT:
            time.sleep(0.1)
        self._say(step)
        if step.driver is not None:
            step.driver.kill()

    def _supervise(self) -> tuple[str, bool]:
        """Watch the active driver (``self.active``, or an adopted one) until it exits; stop it if it
        stalls; keep a standby ready if the spec asks for one. Why it ended, and whether this
        supervisor stopped it."""
        hook, sup = self.stream_hook, self.supervisor
        active = sup.active
        last_status = None
        sup.watch()
        while active.alive() if active is not None else hook.holds(sup.epoch):
            if active is not None:
                active.wait(self.poll_seconds)
            else:
                hook.wait_for_exit(self.poll_seconds, epoch=sup.epoch)
            if self._superseded():
                return "this try was superseded", False
            self._say(sup.lease_taken(read_holder(hook.layout.lease_dir)))
            if (switch := sup.switch(hook.scheduled_in_file()) or self._quiet()) is not None:
                self._say(switch)
                self._record(switch)
                self._end_standby()
                hook.request_stop(sup.epoch, switch.why)
            health = hook.health()
            hook.record(health)
            self._size(health)
            self._keep_standby(health)
            if health.status != last_status:
                self.log.info("%s", health.summary())
                last_status = health.status
            if (stop := sup.observe(health, hook.lapsed_here)) is not None:
                self._say(stop)
                if stop.end_standby:
                    self._end_standby()
                hook.request_stop(sup.epoch, stop.why)
            if sup.overdue():
                pid = hook.kill_driver(epoch=sup.epoch, by=f"its supervisor ({sup.tenure_name})")
                if pid is not None:
                    self.log.warning("graceful stop took more than %.0fs: killed driver pid %s", sup.stop_grace, pid)
            if sup.archive_due(health):
                hook.archive_committed()
        return sup.watched()

    def _keep_standby(self, health: Health) -> None:
        """Report a standby that ended, and launch one when the supervisor says so."""
        ended, launch = self.supervisor.keep_standby(health, self.stream_hook.plan.supervision)
        if ended is not None:
            code, error = ended.result()
            self.log.warning("stream %s: standby %s ended (exit %s%s)", self.stream, ended.driver_id, code,
                             f": {error.splitlines()[0]}" if error else "")
        if launch:
            self.supervisor.standby = self._launch(standby=True, tenure=self.supervisor.tenure)

    def on_kill(self) -> None:
        """Stop the driver this task runs gracefully, then hard if it does not stop before
        Airflow's cleanup time runs out; end its standby first, so that it takes nothing over. A
        driver that has taken the stream over since (this worker was cut off, and the stream moved
        on), or any driver at all once a newer try supervises the stream, is not this task's to stop."""
        hook, sup = self.stream_hook, self.supervisor
        if sup.standby is not None:
            sup.standby.kill()
        if (epoch := sup.killed(hook.holds, self._superseded)) is not None:
            self._stop_when_killed(epoch, f"{sup.tenure_name}, killed")
        if sup.active is not None:
            sup.active.on_kill()  # spark-submit itself (the driver it tracks in cluster mode), or a queued run
