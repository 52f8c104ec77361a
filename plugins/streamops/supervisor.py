"""What a stream's supervisor decides, apart from what it does.

:mod:`streamops.health` gathers a stream's facts (``snapshot``) and decides what they mean
(``classify``). This module takes it from there. Fed with the stream's health, its lease's
holder, its hold marker and the clock, a :class:`Supervisor` decides what the supervisor task
does next, as a :class:`Decision` that says what to log:

* start a driver, after the restart budget's backoff (:mod:`streamops.restarts`), or give up
  once the budget is spent (the task fails, and its failure callback alerts);
* adopt a driver that already holds the lease (one an earlier try left running, or a standby
  on another worker that took the stream over), never start a second one;
* stop a driver that stalled, or whose lease lapsed while it still runs (gracefully, then
  hard after a grace period), and fail on what no restart mends (a corrupt checkpoint, input
  deleted unread, a spec only Spark finds invalid);
* keep a warm standby, and let it take the stream over when the driver dies;
* end when an operator stopped the stream (the hold marker) or an available-now run finished;
* rescale: when sizing by lag set a new per-trigger limit, launch a standby at that size and,
  once it is ready, stop the driver between batches so that the standby takes the stream over;
* stop a continuous driver between batches and end when its spec switched the stream to
  scheduled runs; for an adaptive stream, after a scheduled run, go on with a continuous driver
  when its input arrived fast enough, and stop that driver once its input went quiet;
* leave the stream alone once a newer try of the task supervises it (:mod:`streamops.tenure`),
  and, when killed, stop only a driver this task still runs.

It keeps what it must remember between decisions (the drivers it runs, the lease epoch it
watches, its tenure, the restart budget) and imports no Airflow: it starts, stops, kills and
waits for nothing. :mod:`streamops.operators.supervise` does what it decides.
:class:`Standby` decides for the ``standby`` task that keeps a stream's warm standby on another
worker (:mod:`streamops.operators.standby`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from spark_jobs.runtime.progress import read_events, rows_read
from spark_jobs.stream_spec.models import INGEST_FLOW, duration_seconds
from streamops.health import NO_RESTART, RUNNING, Health, Status

if TYPE_CHECKING:
    from spark_jobs.runtime.lease import Holder
    from spark_jobs.stream_spec.models import Execution, Supervision
    from streamops.restarts import RestartBudget, Run
    from streamops.tenure import Tenure

#: How long a standby may take to hold the lease once the active driver ended (it takes a free
#: lease within a second; a lease still alive, held elsewhere, lapses after its ttl).
STANDBY_TAKEOVER_SECONDS = 30.0
#: A standby that ended is replaced no more often than this.
STANDBY_RELAUNCH_SECONDS = 10.0
#: How long a rescale's standby may take to be ready (its JVM, session, plan and rehearsal) before
#: the rescale is given up (the limit stays set for the driver's next start).
RESCALE_READY_SECONDS = 300.0


class Driver(Protocol):
    """A driver a supervisor launched, as its decisions see it (``streamops.operators.driver.Launch``)."""

    driver_id: str

    def alive(self) -> bool: ...


class Act(StrEnum):
    """What the supervisor does next."""

    #: a newer try supervises the stream: this one leaves it alone (adopts, stops, records nothing)
    LEAVE = "leave"
    #: the task fails (its failure callback alerts): ``Decision.why`` says why
    FAIL = "fail"
    #: the task ends: the stream was stopped on purpose, or an available-now run finished
    END = "end"
    #: watch the driver that holds the lease, which this task did not start
    ADOPT = "adopt"
    #: launch a driver, after ``Decision.delay`` seconds
    START = "start"
    #: watch the driver this task runs
    WATCH = "watch"
    #: ask the driver to stop between micro-batches (``Decision.why``: who asks, and why)
    STOP = "stop"
    #: launch a standby at a new size (``Decision.event``: the sizing decision), to take the stream over once ready
    RESCALE = "rescale"
    #: the driver ended and is to be replaced: by a standby that takes the stream over, else started anew
    TAKE_OVER = "take over"
    #: nothing yet: look again shortly
    WAIT = "wait"


@dataclass(frozen=True)
class Decision:
    act: Act
    #: what the supervisor logs about it ("": nothing), at ``level`` (``info`` or ``warning``)
    say: str = ""
    level: str = "info"
    #: START: the backoff to wait first
    delay: float = 0.0
    #: FAIL: the task's failure message (and so the alert's); STOP: the stop request's ``by``
    why: str = ""
    #: end the standby first (one that took over would run what must not run)
    end_standby: bool = False
    #: START after a takeover that did not happen: the standby to kill
    driver: Driver | None = None
    #: an event for the stream's log (an adaptive stream's choice of mode, with what it was based on)
    event: dict | None = None


class StandbyStep(NamedTuple):
    """What keeping a standby asks for: the standby that ended (to report), and whether to launch one."""

    ended: Driver | None
    launch: bool


@dataclass
class _Watch:
    """One run's watch: since when the supervisor is stopping the driver, and why it ended."""

    archived_at: float
    stopping_since: float | None = None
    reason: str = "driver exited"
    #: stopping to switch the stream to scheduled runs (its spec's ``execution.mode``, or an adaptive
    #: stream's quiet input)
    switching: bool = False
    #: stopping to hand the stream to a rescale's standby
    rescaling: bool = False


@dataclass
class _Rescale:
    """A rescale under way: the limit it sets, the standby launched at it, since when, and when the
    driver was asked to hand over."""

    per_trigger: int
    unit: str
    previous: int | None
    since: float
    standby: Driver | None = None
    handing_over_at: float | None = None


@dataclass
class _Takeover:
    """Waiting for a standby to take the stream over: this task's own, and the ready ones elsewhere."""

    standby: Driver | None
    elsewhere: set[str]
    since: float


class Supervisor:
    """The decisions of a stream's supervisor task, and what it remembers between them.

    :param stream: the stream's name.
    :param stop_grace: how long a driver this supervisor asked to stop (it stalled, or its lease
        lapsed) has before it is killed.
    :param archive_every: how often committed input is archived while the stream runs.
    :param switch_grace: how long a driver stopped to switch the stream to scheduled runs has to
        finish its batch before it is killed.
    :param clock: the wall clock (the restart budget's times); ``monotonic``: the clock of waits.
    """

    def __init__(self, stream: str, *, stop_grace: float = 5.0, archive_every: float = 60.0, switch_grace: float = 120.0,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.stop_grace, self.archive_every, self.switch_grace = stop_grace, archive_every, switch_grace
        self.clock, self.monotonic = clock, monotonic
        #: the driver this task runs, and its standby (``supervision.standby``)
        self.active: Driver | None = None
        self.standby: Driver | None = None
        #: the pid of a driver this task adopted
        self.adopted_pid: int | None = None
        #: the lease epoch of the driver this task runs or adopted (spark_jobs.runtime.lease)
        self.epoch: int | None = None
        #: this try's hold on the stream's supervision (streamops.tenure), and its restart budget
        self.tenure: Tenure | None = None
        self.budget: RestartBudget | None = None
        #: the runs of drivers this task started or watched
        self.runs = 0
        #: the last driver this task ran, once it ended
        self.ended: Driver | None = None
        self.available_now = False
        #: an adaptive stream's execution (spark_jobs.stream_spec.models.Execution), and when its last run before
        #: this task's began; None: not adaptive
        self.adaptive: Execution | None = None
        self.previous_began: float | None = None
        self._continuous_since: float | None = None
        self._events_file: Path | None = None
        self._checkpoint_root = ""
        self._left = False
        self._taken_over_elsewhere = False
        self._standby_launched = float("-inf")
        self._watch = _Watch(archived_at=monotonic())
        self._takeover = _Takeover(None, set(), since=monotonic())
        self._rescale: _Rescale | None = None

    def begin(self, tenure: Tenure, budget: RestartBudget, *, events_file: Path | None = None,
              checkpoint_root: str = "", available_now: bool = False, adaptive: Execution | None = None,
              previous_began: float | None = None) -> None:
        """This try begins to supervise the stream: its tenure, the stream's restart budget, its
        progress events and checkpoint (for the failure messages), and whether it runs available-now.
        ``adaptive``: the stream's execution, if adaptive (its first run is available-now, and
        :meth:`run_ended` decides whether a continuous driver follows); ``previous_began``: when its
        run before this one began."""
        self.tenure, self.budget = tenure, budget
        self._events_file, self._checkpoint_root, self.available_now = events_file, checkpoint_root, available_now
        self.adaptive, self.previous_began = adaptive, previous_began
        if adaptive is not None:
            self.available_now = True

    @property
    def tenure_name(self) -> str:
        return self.tenure.task if self.tenure else "a supervisor"

    # ---- tenure -------------------------------------------------------------------------------

    def leaves(self, current: Tenure | None) -> Decision | None:
        """Is a newer try the stream's supervisor now (``current``: the newest try's record)? Then
        LEAVE (said once), and this try leaves the stream alone; None while this try is current."""
        if self.tenure is None or current is None or current.number <= self.tenure.number:
            return None
        say = ""
        if not self._left:
            self._left = True
            say = (f"stream {self.stream}: {current.describe()} supervises it now; this try "
                   f"({self.tenure.describe()}) leaves it alone")
        return Decision(Act.LEAVE, say, "warning")

    def killed(self, holds: Callable[[int], bool], superseded: Callable[[], bool]) -> int | None:
        """This task is killed: the epoch of the driver to stop, or None. A driver that took the
        stream over since (the lease moved on: ``holds`` says no), or any driver once a newer try
        supervises the stream, is not this task's to stop."""
        if self.epoch is None or not holds(self.epoch) or superseded():
            return None
        return self.epoch

    # ---- runs ---------------------------------------------------------------------------------

    def next_run(self, health: Health, held_by: str | None, driver_alive: bool, holder: Holder | None) -> Decision:
        """Before a run: fail on what no restart mends, end if the stream was stopped on purpose,
        adopt a driver that holds the lease, watch this task's standby that took over, else start
        a driver (after the backoff) unless the budget is spent."""
        if health.status in NO_RESTART:
            return Decision(Act.FAIL, why=no_restart_message(health, self.stream, self._checkpoint_root))
        if held_by is not None:
            return Decision(Act.END, f"stream {self.stream} was stopped on purpose ({held_by}); not restarting it")
        if self.active is None and driver_alive:
            return self._adopt(holder)
        if self.active is not None:  # its own standby took the stream over: a new run, of the driver it runs
            return Decision(Act.WATCH)
        assert self.budget is not None, "begin() first"
        if self.budget.exhausted(self.clock()):
            return Decision(Act.FAIL, why=self.budget_spent())
        delay = self.budget.next_delay()
        say = (f"restarting stream {self.stream} in {delay:.0f}s (backoff after "
               f"{self.budget.consecutive_failures()} failed run(s))") if delay else ""
        return Decision(Act.START, say, "warning", delay=delay)

    def _adopt(self, holder: Holder | None) -> Decision:
        self.adopted_pid = holder.pid if holder else None
        self.epoch = holder.epoch if holder else None
        who = holder.describe() if holder else "unknown"
        if self._taken_over_elsewhere:  # a new run, of the standby on another worker
            self._taken_over_elsewhere = False
            self._record_start()
            return Decision(Act.ADOPT, f"supervising stream {self.stream} through its lease: {who} "
                                       f"(run {self.runs} of this task)")
        return Decision(Act.ADOPT, f"a driver ({who}) already runs stream {self.stream}, left by an earlier try: "
                                   "adopting it instead of starting a second one", "warning")

    def started(self, launched: Driver | None = None) -> Decision:
        """A run of this task's own driver begins: ``launched``, or the standby that took over."""
        if launched is not None:
            self.active = launched
        self._record_start()
        return Decision(Act.WATCH, f"supervising stream {self.stream} (run {self.runs} of this task)")

    def _record_start(self) -> None:
        assert self.budget is not None, "begin() first"
        self.budget.record_start(self.clock())
        self.runs += 1

    def exited(self, reason: str, outcome: tuple[int | None, str] | None = None) -> tuple[int | None, str]:
        """The watched driver is gone: its exit code and why it ended. ``outcome``: the exit code
        and error of this task's own driver (``active``); an adopted driver's is unknown."""
        if self.active is None:
            self.ended = None
            return None, f"adopted driver: {reason}"
        code, error = outcome if outcome is not None else (None, "")
        self.ended, self.active = self.active, None
        return code, error or reason

    def run_ended(self, code: int | None, reason: str, forced: bool, held_by: str | None) -> Decision:
        """Record the run's end, and what follows: the end (stopped on purpose, or an available-now
        run finished), a failure (a spec only Spark finds invalid; the budget spent), or a
        replacement (TAKE_OVER). Only an operator stops a stream for good: a driver that exits 0
        by itself failed; one this supervisor stopped (``forced``) failed too."""
        assert self.budget is not None, "begin() first"
        invalid = None if held_by is not None or code in (0, None) else self._invalid_spec()
        if invalid:
            self.budget.record_end(self.clock(), code, "invalid spec", forced=forced, requested=False)
            return Decision(Act.FAIL, why=(
                f"stream {self.stream}: its driver found the spec invalid and started nothing; a restart would "
                f"fail alike, so the stream stays stopped. Fix the spec, then trigger this DAG again.\n{invalid}"))
        finished = code == 0 and not forced and self.available_now
        if self._watch.switching and held_by is None:
            self.budget.record_end(self.clock(), code, self._watch.reason, forced=forced, requested=True)
            return Decision(Act.END, f"stream {self.stream} {self._watch.reason} (exit {code}); its "
                                     "DAG's scheduled runs take it on from its checkpoint", end_standby=True)
        if self._watch.rescaling and held_by is None and self._rescale is not None:
            self.budget.record_end(self.clock(), code, self._watch.reason, forced=forced, requested=True)
            r = self._rescale
            waited = self.monotonic() - (r.handing_over_at or r.since)
            return Decision(Act.TAKE_OVER, f"stream {self.stream}: its driver stopped between batches (exit {code}, "
                                           f"{waited:.1f}s after it was asked) for its standby at {r.per_trigger} "
                                           f"{r.unit} a micro-batch", event={
                                "event": "rescaled", "stream": self.stream, "per_trigger": r.per_trigger,
                                "unit": r.unit, "previous": r.previous, "stop_seconds": round(waited, 2),
                                "standby": r.standby.driver_id if r.standby else None})
        if finished and held_by is None and self.adaptive is not None:
            run = self.budget.last_run()
            self.budget.record_end(self.clock(), code, reason, finished=True)
            return self._after_scheduled_run(run.started_at if run else self.clock())
        if held_by is not None:
            reason = f"{reason.splitlines()[0] if reason else 'driver ended'} (stopped by {held_by})"
        elif code == 0 and not forced and not finished:
            reason = "the driver exited without being asked to stop"
        self.budget.record_end(self.clock(), code, reason, forced=forced, requested=held_by is not None,
                               finished=finished)
        if held_by is not None or finished:
            return Decision(Act.END, f"stream {self.stream} stopped: {reason}")
        say = f"stream {self.stream} driver ended ({reason}, exit {code})"
        if self.budget.exhausted(self.clock()):  # nor does a standby take it over
            return Decision(Act.FAIL, say, "warning", why=self.budget_spent(), end_standby=True)
        return Decision(Act.TAKE_OVER, say, "warning")

    # ---- watching a run -----------------------------------------------------------------------

    def watch(self) -> None:
        """A run's watch begins: of this task's own driver (its lease epoch is learnt when it takes
        the lease), or of the adopted one (its epoch known)."""
        if self.active is not None:
            self.epoch = None
        self._watch = _Watch(archived_at=self.monotonic())

    def lease_taken(self, holder: Holder | None) -> Decision | None:
        """The driver this task started took the lease (``holder``): its epoch is the one to watch.
        Any other holder is not this task's."""
        if self.active is None or self.epoch is not None or holder is None or holder.driver_id != self.active.driver_id:
            return None
        self.epoch = holder.epoch
        return Decision(Act.WATCH, f"stream {self.stream}: driver pid {holder.pid} on {holder.host} holds epoch "
                                   f"{holder.epoch} of the lease")

    def observe(self, health: Health, lapsed_here: Callable[[int], bool]) -> Decision | None:
        """STOP a driver this task watches that stalled, that no restart mends (its standby is
        ended first: a corrupt checkpoint, or input deleted unread, is never taken over), or that
        this task started and still runs although its lease lapsed (``lapsed_here``: frozen, or
        unable to renew it; it fences itself if it ever runs again). Nothing while a stop is under
        way, and nothing without the lease epoch of a driver of its own."""
        w = self._watch
        if w.stopping_since is not None or self.epoch is None:
            return None
        by = f"its supervisor ({self.tenure_name})"
        if health.status in (Status.STALLED, *NO_RESTART):
            w.stopping_since, w.reason = self.monotonic(), f"stopped because it was {health.status}"
            return Decision(Act.STOP, f"stream {self.stream} is {health.status}: {health.reason}; stopping it",
                            "warning", why=f"{by}: {health.status}", end_standby=health.status in NO_RESTART)
        if self.active is not None and health.status == Status.DEAD and lapsed_here(self.epoch):
            w.stopping_since, w.reason = self.monotonic(), "stopped because its lease lapsed"
            return Decision(Act.STOP, f"stream {self.stream}: the lease of its driver (epoch {self.epoch}) lapsed "
                                      "while the driver still runs; stopping it", "warning", why=f"{by}: lease lapsed")
        return None

    def switch(self, scheduled: bool | None) -> Decision | None:
        """The spec file now says the stream runs scheduled (``scheduled``; None: the file cannot be
        read now) while this task runs its driver continuously: STOP the driver between batches
        (its standby first), and the task ends once it stopped (:meth:`run_ended`). Said once."""
        w = self._watch
        if (not scheduled or self.available_now or self.adaptive is not None or w.stopping_since is not None
                or self.epoch is None):
            return None
        w.stopping_since, w.reason, w.switching = self.monotonic(), "stopped to switch to scheduled runs", True
        return Decision(Act.STOP, f"stream {self.stream}: its spec now runs it scheduled (execution.mode); stopping "
                                  "its driver between batches, then this task ends", "warning",
                        why=f"its supervisor ({self.tenure_name}): switch to scheduled runs", end_standby=True)

    # ---- an adaptive stream ------------------------------------------------------------------

    def _after_scheduled_run(self, started_at: float) -> Decision:
        """An adaptive stream's available-now run finished: the rate its input arrived at (the rows it
        read, over the time since the run before it began, or since it began itself) decides whether
        a continuous driver follows (TAKE_OVER: launched at once) or the task ends."""
        assert self.adaptive is not None and self.adaptive.continuous_above is not None
        now = self.clock()
        since = self.previous_began if self.previous_began is not None and self.previous_began < started_at else started_at
        rows = rows_read(self._events_file, INGEST_FLOW, started_at, now) if self._events_file else 0
        window = max(1.0, now - since)
        rate = rows / window
        event = {"event": "execution_decision", "stream": self.stream, "rows": rows, "window_seconds": round(window, 1),
                 "rate": round(rate, 3), "continuous_above": self.adaptive.continuous_above,
                 "scheduled_below": self.adaptive.down_rate}
        if rate < self.adaptive.continuous_above:
            return Decision(Act.END, f"stream {self.stream}: its run read {rows} row(s) that arrived over {window:.0f}s "
                                     f"({rate:.2f} records/s, below {self.adaptive.continuous_above:g}): scheduled runs "
                                     "go on", event={**event, "mode": "scheduled"})
        self.available_now, self._continuous_since = False, self.monotonic()
        return Decision(Act.TAKE_OVER, f"stream {self.stream}: its run read {rows} row(s) that arrived over "
                                       f"{window:.0f}s ({rate:.2f} records/s, from {self.adaptive.continuous_above:g} on): "
                                       "it runs continuously now", "warning", event={**event, "mode": "continuous"})

    @property
    def quiet_seconds(self) -> float:
        """Adaptive: the window over which a continuous driver's input must stay quiet (``quiet_for``)."""
        assert self.adaptive is not None
        return duration_seconds(self.adaptive.quiet_for)

    def quiet(self, rows: int) -> Decision | None:
        """An adaptive stream's continuous driver, whose ingestion read ``rows`` over the last
        ``quiet_for``: below ``scheduled_below`` records a second (and running that long), STOP it
        between batches, and the task ends (:meth:`run_ended`): scheduled runs take the stream on."""
        w = self._watch
        if (self.adaptive is None or self.available_now or w.stopping_since is not None or self.epoch is None
                or self._continuous_since is None):
            return None
        window = self.quiet_seconds
        if self.monotonic() - self._continuous_since < window:
            return None
        rate = rows / window
        if rate >= self.adaptive.down_rate:
            return None
        w.stopping_since, w.reason, w.switching = self.monotonic(), "stopped: its input went quiet", True
        return Decision(Act.STOP, f"stream {self.stream}: its input went quiet ({rows} row(s) in {window:.0f}s, "
                                  f"{rate:.2f} records/s, below {self.adaptive.down_rate:g}); stopping its driver "
                                  "between batches: scheduled runs take it on", "warning",
                        why=f"its supervisor ({self.tenure_name}): input quiet, back to scheduled runs",
                        event={"event": "execution_decision", "stream": self.stream, "mode": "scheduled", "rows": rows,
                               "window_seconds": window, "rate": round(rate, 3),
                               "continuous_above": self.adaptive.continuous_above,
                               "scheduled_below": self.adaptive.down_rate})

    def overdue(self) -> bool:
        """Has the driver asked to stop had its grace period? Then it is killed (once)."""
        w = self._watch
        grace = self.switch_grace if w.switching or w.rescaling else self.stop_grace
        if w.stopping_since is None or self.monotonic() - w.stopping_since <= grace:
            return False
        w.stopping_since = float("inf")
        return True

    def archive_due(self, health: Health) -> bool:
        """Is it time to archive committed input (the stream runs as it should, nothing is stopping)?"""
        w = self._watch
        if w.stopping_since is None and health.status in RUNNING and self.monotonic() - w.archived_at >= self.archive_every:
            w.archived_at = self.monotonic()
            return True
        return False

    def watched(self) -> tuple[str, bool]:
        """Why the watched driver ended, and whether this supervisor stopped it."""
        return self._watch.reason, self._watch.stopping_since is not None

    # ---- rescaling (sizing by lag) ----------------------------------------------------------

    def rescale(self, per_trigger: int, unit: str, previous: int | None, every: float | None = None) -> Decision | None:
        """Sizing by lag set a new per-trigger limit (``previous``: the one the driver runs at; ``every``:
        the interval, if sized): RESCALE, a standby launched at the new size (the standby warmed at
        the old size ended first), unless this task runs no continuous driver of its own, is
        stopping it, or a rescale is under way."""
        if (self.active is None or self.epoch is None or self.available_now or self._watch.stopping_since is not None
                or self._rescale is not None):
            return None
        self._rescale = _Rescale(per_trigger, unit, previous, since=self.monotonic())
        return Decision(Act.RESCALE, f"stream {self.stream}: sizing by lag sets {per_trigger} {unit} a micro-batch"
                                     f"{f' every {every:g}s' if every is not None else ''} "
                                     f"(the driver takes {previous if previous is not None else 'no limit'}): launching "
                                     "a standby at that size to take the stream over", end_standby=True)

    @property
    def rescale_pending(self) -> bool:
        """Is a rescale's standby warming, not yet asked to take over?"""
        return self._rescale is not None and self._rescale.handing_over_at is None

    def rescaling(self, standby: Driver) -> None:
        """The rescale's standby was launched: this task's standby now."""
        assert self._rescale is not None
        self._rescale.standby = self.standby = standby

    def hand_over_when_ready(self, ready: set[str]) -> Decision | None:
        """Once the rescale's standby is ready (``ready``: the driver ids of the ready standbys): STOP the
        driver between batches, for the standby to take the stream over (:meth:`run_ended`, then
        :meth:`takeover`). A standby that ended, or was not ready within ``RESCALE_READY_SECONDS``:
        the rescale is given up (WAIT, ``driver``: the standby to end), and the limit is the next start's."""
        r, w = self._rescale, self._watch
        if r is None or r.standby is None or r.handing_over_at is not None or w.stopping_since is not None:
            return None
        waited = self.monotonic() - r.since
        if r.standby.driver_id in ready and r.standby.alive():
            r.handing_over_at = w.stopping_since = self.monotonic()
            w.reason, w.rescaling = f"stopped for its standby at {r.per_trigger} {r.unit} a micro-batch", True
            return Decision(Act.STOP, f"stream {self.stream}: the standby at {r.per_trigger} {r.unit} a micro-batch is "
                                      f"ready ({waited:.0f}s); stopping the driver between batches for it to take over",
                            why=f"its supervisor ({self.tenure_name}): rescale to {r.per_trigger} {r.unit} a micro-batch")
        if r.standby.alive() and waited <= RESCALE_READY_SECONDS:
            return None
        self._rescale, self.standby = None, None
        why = f"was not ready within {RESCALE_READY_SECONDS:.0f}s" if r.standby.alive() else "ended"
        return Decision(Act.WAIT, f"stream {self.stream}: rescale to {r.per_trigger} {r.unit} a micro-batch given up "
                                  f"(its standby {why}); the driver's next start takes that size", "warning",
                        driver=r.standby)

    # ---- the standby ------------------------------------------------------------------------

    def keep_standby(self, health: Health, supervision: Supervision) -> StandbyStep:
        """A standby if the spec asks for one, once the active driver runs as it should (on a small
        machine, a standby starting beside a driver that is starting itself slows both) and
        nothing is stopping; one that ended is reported and replaced, at most every
        ``STANDBY_RELAUNCH_SECONDS``. With ``supervision.standby_queue``, the stream DAG's
        ``standby`` task keeps one on another worker while this task runs the active driver: this
        task keeps its own only while the active driver runs elsewhere."""
        if not supervision.standby:
            return StandbyStep(None, False)
        wanted = self._watch.stopping_since is None and health.status in RUNNING
        if supervision.standby_queue is not None and self.active is not None:
            wanted = False
        ended = None
        if self.standby is not None and not self.standby.alive():
            ended, self.standby = self.standby, None
        launch = wanted and self.standby is None and self.monotonic() - self._standby_launched >= STANDBY_RELAUNCH_SECONDS
        if launch:
            self._standby_launched = self.monotonic()
        return StandbyStep(ended, launch)

    def drop_standby(self) -> Driver | None:
        """The standby, which this task no longer keeps (to end it)."""
        standby, self.standby = self.standby, None
        return standby

    def hand_over(self, ready_elsewhere: set[str]) -> None:
        """The active driver ended: wait for a standby to take the stream over, this task's own or
        one of those ready on other workers (their driver ids)."""
        standby, self.standby, self._rescale = self.standby, None, None
        self._takeover = _Takeover(standby, ready_elsewhere - {standby.driver_id if standby else ""}, self.monotonic())

    def takeover(self, holder: Holder | None) -> Decision:
        """Has a standby taken the stream over (``holder``: the lease's)? This task's own: WATCH (it
        is the active driver now). One on another worker: ADOPT (watched through its lease, and
        this task keeps its own standby for the next takeover). Neither within
        ``STANDBY_TAKEOVER_SECONDS``, or none left: START a driver (``driver``: the standby to kill)."""
        t = self._takeover
        if t.standby is None and not t.elsewhere:
            return Decision(Act.START)
        waited = self.monotonic() - t.since
        if ((t.standby is not None and t.standby.alive()) or t.elsewhere) and waited < STANDBY_TAKEOVER_SECONDS:
            if holder is None or not holder.alive() or holder.driver_id not in {*t.elsewhere, t.standby and t.standby.driver_id}:
                return Decision(Act.WAIT)
            say = (f"stream {self.stream}: the standby {holder.driver_id} on {holder.host} holds epoch {holder.epoch} "
                   f"of the lease ({waited:.1f}s after this supervisor saw the driver end)")
            if t.standby is not None and holder.driver_id == t.standby.driver_id:
                self.active = t.standby
                return Decision(Act.WATCH, say)
            self.standby, self._taken_over_elsewhere = t.standby, True  # kept, for the next takeover
            return Decision(Act.ADOPT, say)
        why = f"none within {STANDBY_TAKEOVER_SECONDS:.0f}s" if waited >= STANDBY_TAKEOVER_SECONDS else "it ended"
        return Decision(Act.START, f"stream {self.stream}: no standby took over ({why}); starting a driver", "warning",
                        driver=t.standby)

    # ---- what a failure says ----------------------------------------------------------------

    def budget_spent(self) -> str:
        assert self.budget is not None, "begin() first"
        policy = self.budget.policy
        return (f"stream {self.stream}: {self.budget.failures_in_period(self.clock())} failed runs within "
                f"{policy.period_minutes:g} minutes, the restart budget ({policy.max_attempts}) is spent; the stream "
                f"stays stopped. {self._last_failure()}Look at the driver logs above, fix the cause, then trigger "
                f"this DAG again.")

    def _failures_reported(self, last: Run) -> list[dict]:
        """The ``driver_failed`` events the driver of the last run wrote."""
        if self._events_file is None:
            return []
        return [e for e in read_events(self._events_file)
                if e.get("event") == "driver_failed" and float(e.get("logged_at") or 0) >= last.started_at]

    def _last_failure(self) -> str:
        """What ended the last run, for the message (and the alert) when the budget is spent: its
        exit code and the error its driver reported last (a progress event), else why it ended."""
        last = self.budget.last_run() if self.budget else None
        if last is None:
            return ""
        error = None
        for event in self._failures_reported(last):
            error = str(event.get("error") or "").strip()
        said = (error.splitlines()[0] if error else last.reason)[:1000]
        code = "" if last.exit_code is None else f" with exit code {last.exit_code}"
        return f"The last run ended{code}: {said.rstrip('.')}. " if said else ""

    def _invalid_spec(self) -> str | None:
        """The problems the last run's driver found in the spec (what only Spark can tell, such as
        a SQL query that does not parse), or None if it did not end on an invalid spec."""
        last = self.budget.last_run() if self.budget else None
        if last is None:
            return None
        found = None
        for event in self._failures_reported(last):
            if event.get("invalid_spec"):
                found = str(event.get("error") or "").strip()
        return found


def no_restart_message(health: Health, stream: str, checkpoint_root: str) -> str:
    """Why the supervisor fails instead of restarting: input deleted unread, or a corrupt checkpoint."""
    lines = "\n  ".join(health.problems)
    if health.status == Status.BLOCKED:
        return f"stream {stream}: it cannot read on from its checkpoint and is not restarted:\n  {lines}"
    return (f"stream {stream}: the checkpoint is corrupt and is not reset automatically:\n  {lines}\n"
            f"What you can do: if only the newest offsets file is torn and its batch has no commit, delete that "
            f"file and trigger the stream again (the batch is planned anew). Otherwise move the checkpoint "
            f"{checkpoint_root} aside together with the stream's file sinks, and reprocess the input "
            f"with a backfill.")


class Standby:
    """The decisions of a stream's ``standby`` task, which keeps its warm standby on another worker.

    It launches a standby for the supervisor's current try, and another when one ends (at most
    every ``STANDBY_RELAUNCH_SECONDS``); a standby that took the stream over is the active driver,
    run by this task until it ends. It ends when the stream was stopped on purpose or the
    supervisor task ended.
    """

    def __init__(self, stream: str, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.stream, self.monotonic = stream, monotonic
        #: the standby this task runs, and the try of the supervisor it serves
        self.launch: Driver | None = None
        self.tenure: Tenure | None = None
        #: the lease epoch of the standby once it took the stream over: this task runs the active driver
        self.ran_active: int | None = None
        self._launched = float("-inf")

    def ends(self, held_by: str | None, supervisor_ended: Callable[[], bool]) -> Decision | None:
        if held_by is not None:
            return Decision(Act.END, f"stream {self.stream} was stopped on purpose ({held_by}): no standby is kept")
        if supervisor_ended():
            return Decision(Act.END, f"the supervisor task of stream {self.stream} has ended: so does its standby")
        return None

    def took_over(self, holder: Holder | None) -> Decision | None:
        """Has this task's standby taken the stream over (it holds the lease)?"""
        if self.launch is None or self.ran_active is not None or holder is None \
                or holder.driver_id != self.launch.driver_id:
            return None
        self.ran_active = holder.epoch
        return Decision(Act.WATCH, f"stream {self.stream}: the standby {self.launch.driver_id} took the stream over "
                                   f"(epoch {holder.epoch}): this task runs its active driver now", "warning")

    def ended(self, code: int | None, error: str, released: bool) -> Decision:
        """This task's standby ended (exit ``code``, ``error``): ``released``, the lease of the active
        driver it had become, for the standby elsewhere. A new one is launched next."""
        launch = self.launch
        assert launch is not None
        if released:
            say, level = (f"stream {self.stream}: its driver {launch.driver_id} (epoch {self.ran_active}) ended (exit "
                          f"{code}{f': {error.splitlines()[0]}' if error else ''}): lease released for the standby "
                          f"elsewhere"), "warning"
        else:
            say, level = f"stream {self.stream}: standby {launch.driver_id} ended (exit {code})", "info"
        self.launch, self.ran_active = None, None
        return Decision(Act.START, say, level)

    def relaunch(self, current: Tenure | None) -> bool:
        """Launch a standby now, for the supervisor's current try (``current``), once it has one?"""
        if current is None or self.monotonic() - self._launched < STANDBY_RELAUNCH_SECONDS:
            return False
        self._launched = self.monotonic()
        self.tenure = current  # the try it serves (``--supervisor``): it leaves once that try is superseded
        return True
