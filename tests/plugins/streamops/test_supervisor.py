"""What a stream's supervisor decides (streamops.supervisor), without Airflow: fed with
fabricated health, lease holders and a fake clock, the decisions are read back. The restart
budget is the real one, on a file of the test's own."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_jobs.stream_spec.models import Restart, Supervision
from streamops.health import Health, Status
from streamops.restarts import RestartBudget
from streamops.supervisor import (
    RESCALE_READY_SECONDS,
    STANDBY_RELAUNCH_SECONDS,
    STANDBY_TAKEOVER_SECONDS,
    Act,
    Decision,
    Standby,
    Supervisor,
)
from streamops.tenure import Tenure

HOLD = "stream_sensors_stop run manual__1 (graceful)"


class Clock:
    """Wall and monotonic time that move only when told."""

    def __init__(self) -> None:
        self.wall, self.mono = 1_800_000_000.0, 1000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@dataclass
class FakeDriver:
    """A driver the supervisor launched: its id, and whether it still runs."""

    driver_id: str
    running: bool = True

    def alive(self) -> bool:
        return self.running


@dataclass
class FakeHolder:
    """The lease's holder."""

    driver_id: str
    epoch: int
    pid: int = 4242
    host: str = "worker-2"
    live: bool = True

    def alive(self) -> bool:
        return self.live

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (epoch {self.epoch})"


def health(status: Status, reason: str = "as fabricated", problems: tuple[str, ...] = ()) -> Health:
    return Health(stream="sensors", status=status, reason=reason, driver_pid=None, driver_host=None, backlog_files=0,
                  backlog_bytes=0, last_committed={}, backlog_records=None, last_commit_age_seconds=None,
                  watermark=None, input_rows_per_second=None, processed_rows_per_second=None,
                  problems=list(problems), notes=[], checked_at=0.0)


def tenure(number: int, task: str | None = None) -> Tenure:
    return Tenure(number=number, host=f"worker-{number}", pid=100 + number, started_at=0.0,
                  task=task or f"stream_sensors run r try {number}")


@pytest.fixture
def clock() -> Clock:
    return Clock()


def supervisor(tmp_path: Path, clock: Clock, available_now: bool = False, **restart: float) -> Supervisor:
    """A supervisor as try 1 of the task begins it; the restart policy's defaults as in the tests'
    spec, ``restart`` changing them."""
    policy = Restart(**{"max_attempts": 5, "backoff_initial_seconds": 2, "backoff_max_seconds": 8,
                        "stable_after_minutes": 10, "period_minutes": 60, **restart})
    sup = Supervisor("sensors", stop_grace=5, archive_every=60, clock=clock.time, monotonic=clock.monotonic)
    sup.begin(tenure(1), RestartBudget(tmp_path / "runs.json", policy), events_file=tmp_path / "progress.jsonl",
              checkpoint_root=str(tmp_path / "checkpoints"), available_now=available_now)
    return sup


def fail_a_run(sup: Supervisor, clock: Clock, lasted: float = 5, error: str = "boom"):  # Decision
    """Start a driver (after the backoff), let it run ``lasted`` seconds and fail: what follows."""
    start = sup.next_run(health(Status.DEAD), None, False, None)
    assert start.act is Act.START
    clock.advance(start.delay)
    driver = FakeDriver(f"sensors-{sup.runs + 1}")
    sup.started(driver)
    sup.watch()
    clock.advance(lasted)
    driver.running = False
    code, reason = sup.exited(*sup.watched()[:1], (1, error))
    return sup.run_ended(code, reason, False, None)


def test_a_first_start_launches_a_driver_at_once_and_counts_its_run(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    start = sup.next_run(health(Status.DEAD), None, False, None)
    assert (start.act, start.delay, start.say) == (Act.START, 0.0, "")
    driver = FakeDriver("sensors-1")
    assert sup.started(driver).say == "supervising stream sensors (run 1 of this task)"
    assert sup.active is driver and sup.runs == 1
    assert [(r.started_at, r.ended_at) for r in sup.budget.runs()] == [(clock.wall, None)]
    # its lease epoch is the one its own driver takes; no other holder's
    sup.watch()
    assert sup.lease_taken(FakeHolder("someone-else", epoch=1)) is None and sup.epoch is None
    taken = sup.lease_taken(FakeHolder("sensors-1", epoch=1, pid=77, host="worker-1"))
    assert taken.say == "stream sensors: driver pid 77 on worker-1 holds epoch 1 of the lease" and sup.epoch == 1


def test_a_driver_already_running_is_adopted_never_doubled(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    adopt = sup.next_run(health(Status.HEALTHY), None, True, FakeHolder("left-behind", epoch=3, pid=4242))
    assert adopt.act is Act.ADOPT and adopt.level == "warning"
    assert adopt.say == ("a driver (pid 4242 on worker-2 (epoch 3)) already runs stream sensors, left by an earlier "
                         "try: adopting it instead of starting a second one")
    assert (sup.adopted_pid, sup.epoch, sup.active) == (4242, 3, None)
    assert sup.budget.runs() == []  # nothing started, no run of its own
    sup.watch()
    assert sup.exited("driver exited") == (None, "adopted driver: driver exited")


def test_a_failed_run_is_restarted_after_an_exponential_backoff(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock, max_attempts=10)
    ended = fail_a_run(sup, clock)
    assert (ended.act, ended.level, ended.say) == (Act.TAKE_OVER, "warning", "stream sensors driver ended (boom, exit 1)")
    sup.hand_over(set())
    assert sup.takeover(None).act is Act.START  # no standby: started anew, nothing to kill or say
    delays = []
    for _ in range(4):
        restart = sup.next_run(health(Status.DEAD), None, False, None)
        delays.append(restart.delay)
        assert restart.act is Act.START and restart.level == "warning"
        fail_a_run(sup, clock)
    assert delays == [2, 4, 8, 8]  # doubling, up to backoff_max_seconds
    assert restart.say == "restarting stream sensors in 8s (backoff after 4 failed run(s))"


def test_a_spent_budget_gives_up_and_alerts_with_what_ended_the_last_run(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock, max_attempts=2)
    assert fail_a_run(sup, clock).act is Act.TAKE_OVER
    sup.hand_over(set())
    sup.takeover(None)
    (tmp_path / "progress.jsonl").write_text(json.dumps(  # what the driver of the next run reports
        {"event": "driver_failed", "logged_at": clock.wall + 3, "error": "java.lang.OutOfMemoryError: heap\n  at x"}))
    spent = fail_a_run(sup, clock, error="spark-submit exited 1")
    assert spent.act is Act.FAIL and spent.end_standby  # nor does a standby take it over
    assert spent.say == "stream sensors driver ended (spark-submit exited 1, exit 1)"
    assert spent.why == ("stream sensors: 2 failed runs within 60 minutes, the restart budget (2) is spent; the stream "
                         "stays stopped. The last run ended with exit code 1: java.lang.OutOfMemoryError: heap. Look at "
                         "the driver logs above, fix the cause, then trigger this DAG again.")
    # a retry of the task finds it spent too: it starts nothing
    retry = supervisor(tmp_path, clock, max_attempts=2)
    assert retry.next_run(health(Status.DEAD), None, False, None).why == spent.why
    assert len(retry.budget.runs()) == 2


def test_the_failure_count_resets_after_a_stable_run(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock, max_attempts=3, stable_after_minutes=10)
    for lasted in (5, 5):
        fail_a_run(sup, clock, lasted)
        sup.hand_over(set())
        sup.takeover(None)
    assert sup.next_run(health(Status.DEAD), None, False, None).delay == 4
    fail_a_run(sup, clock, lasted=11 * 60)  # ran 11 minutes before it failed: stable
    sup.hand_over(set())
    sup.takeover(None)
    after = sup.next_run(health(Status.DEAD), None, False, None)
    assert (after.act, after.delay, after.say) == (Act.START, 0.0, "")  # no backoff, and the budget is whole again
    fail_a_run(sup, clock)
    assert sup.next_run(health(Status.DEAD), None, False, None).delay == 2


def test_a_stalled_driver_is_stopped_gracefully_then_killed_and_restarted(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    sup.next_run(health(Status.DEAD), None, False, None)
    driver = FakeDriver("sensors-1")
    sup.started(driver)
    sup.watch()
    stalled = health(Status.STALLED, "input is waiting (3 file(s)) and query ingest has committed nothing for 200s")
    assert sup.observe(stalled, lambda epoch: False) is None  # its driver has not taken the lease: nothing to stop
    sup.lease_taken(FakeHolder("sensors-1", epoch=5))
    stop = sup.observe(stalled, lambda epoch: False)
    assert (stop.act, stop.level, stop.end_standby) == (Act.STOP, "warning", False)
    assert stop.say == ("stream sensors is stalled: input is waiting (3 file(s)) and query ingest has committed nothing "
                        "for 200s; stopping it")
    assert stop.why == "its supervisor (stream_sensors run r try 1): stalled"  # the stop request says who asks
    assert sup.observe(stalled, lambda epoch: False) is None  # asked once
    assert not sup.archive_due(health(Status.HEALTHY))  # nothing is archived while it stops
    clock.advance(5)
    assert not sup.overdue()
    clock.advance(0.5)
    assert sup.overdue() and not sup.overdue()  # past the grace period: killed, once
    assert sup.watched() == ("stopped because it was stalled", True)
    driver.running = False
    code, reason = sup.exited(sup.watched()[0], (0, ""))  # it stopped when asked, exit 0
    ended = sup.run_ended(code, reason, True, None)
    assert ended.act is Act.TAKE_OVER  # stopped by its supervisor: a failure, restarted
    assert [(r.exit_code, r.forced, r.reason) for r in sup.budget.runs()] == [(0, True, "stopped because it was stalled")]
    sup.hand_over(set())
    sup.takeover(None)
    assert sup.next_run(health(Status.DEAD), None, False, None).delay == 2


def test_a_corrupt_checkpoint_stops_the_driver_ends_its_standby_and_fails_without_a_restart(tmp_path: Path,
                                                                                           clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    sup.epoch = 4  # an adopted driver
    sup.watch()
    corrupt = health(Status.CORRUPT, "offsets/7 is torn", problems=("offsets/7 is torn",))
    stop = sup.observe(corrupt, lambda epoch: False)
    assert stop.act is Act.STOP and stop.end_standby  # never taken over by its standby
    fail = sup.next_run(corrupt, None, False, None)
    assert fail.act is Act.FAIL and "the checkpoint is corrupt and is not reset automatically:\n  offsets/7 is torn" \
        in fail.why and str(tmp_path / "checkpoints") in fail.why
    blocked = sup.next_run(health(Status.BLOCKED, problems=("records 0-99 of t/0 were deleted unread",)), None, False,
                           None)
    assert blocked.why == ("stream sensors: it cannot read on from its checkpoint and is not restarted:\n  "
                           "records 0-99 of t/0 were deleted unread")


def test_a_driver_of_its_own_whose_lease_lapsed_while_it_runs_is_stopped(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    sup.next_run(health(Status.DEAD), None, False, None)
    sup.started(FakeDriver("sensors-1"))
    sup.watch()
    sup.lease_taken(FakeHolder("sensors-1", epoch=2))
    assert sup.observe(health(Status.DEAD), lambda epoch: False) is None  # gone, not frozen: nothing to stop
    stop = sup.observe(health(Status.DEAD), lambda epoch: epoch == 2)
    assert stop.act is Act.STOP and stop.why == "its supervisor (stream_sensors run r try 1): lease lapsed"
    assert sup.watched() == ("stopped because its lease lapsed", True)


def test_a_spec_only_spark_finds_invalid_fails_at_once(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    (tmp_path / "progress.jsonl").write_text(json.dumps(
        {"event": "driver_failed", "logged_at": clock.wall + 1, "invalid_spec": True, "error": "outputs[0]: bad SQL"}))
    fail = fail_a_run(sup, clock)
    assert fail.act is Act.FAIL and fail.why.endswith("Fix the spec, then trigger this DAG again.\noutputs[0]: bad SQL")
    assert [r.reason for r in sup.budget.runs()] == ["invalid spec"]


def test_a_stream_stopped_on_purpose_ends_its_supervision(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    held = sup.next_run(health(Status.DEAD), HOLD, False, None)
    assert (held.act, held.say) == (Act.END, f"stream sensors was stopped on purpose ({HOLD}); not restarting it")
    # stopped while it ran: killed (an immediate stop) or not, the run ends the task and counts as no failure
    sup.next_run(health(Status.DEAD), None, False, None)
    sup.started(FakeDriver("sensors-1"))
    sup.watch()
    code, reason = sup.exited(*sup.watched()[:1], (1, "spark-submit was killed\nJVM gone"))
    stopped = sup.run_ended(code, reason, False, HOLD)
    assert (stopped.act, stopped.say) == (Act.END, f"stream sensors stopped: spark-submit was killed (stopped by {HOLD})")
    assert [(r.requested, r.exit_code) for r in sup.budget.runs()] == [(True, 1)]
    assert sup.budget.next_delay() == 0


def test_only_an_operator_or_a_finished_available_now_run_ends_a_stream(tmp_path: Path, clock: Clock) -> None:
    for available_now, act, reason in [(False, Act.TAKE_OVER, "the driver exited without being asked to stop"),
                                       (True, Act.END, "driver exited")]:
        (tmp_path / str(available_now)).mkdir()
        sup = supervisor(tmp_path / str(available_now), clock, available_now=available_now)
        sup.next_run(health(Status.DEAD), None, False, None)
        sup.started(FakeDriver("sensors-1"))
        sup.watch()
        code, why = sup.exited(sup.watched()[0], (0, ""))
        assert sup.run_ended(code, why, False, None).act is act
        assert sup.budget.runs()[-1].reason == reason


def test_a_spec_switched_to_scheduled_runs_stops_the_continuous_driver_between_batches_and_ends(
        tmp_path: Path, clock: Clock) -> None:
    """The spec file now runs the stream scheduled: its continuous driver is asked to stop between
    batches (with the whole graceful grace, not a stalled driver's), once; the run ends the task, as
    asked for, never restarted. A run that is available-now already, or a file that says nothing
    new, changes nothing."""
    sup = supervisor(tmp_path, clock)
    sup.switch_grace = 30
    sup.next_run(health(Status.DEAD), None, False, None)
    driver = FakeDriver("sensors-1")
    sup.started(driver)
    sup.watch()
    assert sup.switch(True) is None  # no epoch of its own driver yet: nothing to stop
    sup.lease_taken(FakeHolder("sensors-1", epoch=2))
    assert sup.switch(False) is None and sup.switch(None) is None  # continuous still, or unreadable now
    switch = sup.switch(True)
    assert (switch.act, switch.end_standby) == (Act.STOP, True)
    assert switch.why == "its supervisor (stream_sensors run r try 1): switch to scheduled runs"
    assert sup.switch(True) is None and sup.observe(health(Status.STALLED), lambda epoch: False) is None  # once
    clock.advance(29)
    assert not sup.overdue()  # a stalled driver's 5 s would be over: a switch waits for the batch
    clock.advance(2)
    assert sup.overdue()
    driver.running = False
    code, reason = sup.exited(sup.watched()[0], (0, ""))
    ended = sup.run_ended(code, reason, True, None)
    assert ended.act is Act.END and "switch to scheduled runs" in ended.say, ended
    last = sup.budget.last_run()
    assert last.requested and last.reason == "stopped to switch to scheduled runs"
    assert sup.budget.consecutive_failures() == 0
    scheduled_run = supervisor(tmp_path / "scheduled", clock, available_now=True)
    scheduled_run.next_run(health(Status.DEAD), None, False, None)
    scheduled_run.started(FakeDriver("sensors-2"))
    scheduled_run.watch()
    scheduled_run.lease_taken(FakeHolder("sensors-2", epoch=3))
    assert scheduled_run.switch(True) is None  # it takes what waits and ends by itself


def test_an_adaptive_stream_goes_continuous_when_its_input_arrives_fast_and_back_when_it_goes_quiet(
        tmp_path: Path, clock: Clock) -> None:
    """Adaptive: the first run takes what waits and exits; the rate its input arrived at (the rows
    it read since the run before began) decides: at or above ``continuous_above`` a continuous
    driver follows at once, below it the task ends. A continuous driver whose input stayed below
    ``scheduled_below`` for ``quiet_for`` is stopped between batches, and the task ends; each
    choice is an event with what it was based on."""
    from spark_jobs.runtime.progress import EventLog
    from spark_jobs.stream_spec.models import INGEST_FLOW, Execution

    execution = Execution(mode="adaptive", on_input=True, freshness="5 minutes", continuous_above=10,
                          quiet_for="2 minutes")
    events = EventLog(tmp_path / "progress.jsonl")

    def scheduled_run(sup: Supervisor, rows: int, lasted: float):  # Decision
        sup.next_run(health(Status.DEAD), None, False, None)
        sup.started(FakeDriver(f"sensors-{sup.runs + 1}"))
        sup.watch()
        assert sup.available_now  # its run takes what waits and exits
        clock.advance(lasted)
        events.write({"event": "progress", "query": INGEST_FLOW, "input_rows": rows, "logged_at": clock.wall})
        code, reason = sup.exited("driver exited", (0, ""))
        return sup.run_ended(code, reason, False, None)

    quiet = supervisor(tmp_path / "a", clock)
    quiet.begin(tenure(1), quiet.budget, events_file=events.path, adaptive=execution,
                previous_began=clock.wall - 600)
    ended = scheduled_run(quiet, rows=3000, lasted=30)  # 3,000 rows over 630 s: 4.8 records/s
    assert ended.act is Act.END and "4.76 records/s, below 10" in ended.say, ended
    assert ended.event["mode"] == "scheduled" and ended.event["rate"] == 4.762 and ended.event["rows"] == 3000

    clock.advance(1)
    busy = supervisor(tmp_path / "b", clock)
    busy.begin(tenure(1), busy.budget, events_file=events.path, adaptive=execution, previous_began=clock.wall - 60)
    go_on = scheduled_run(busy, rows=3000, lasted=20)  # 3,000 rows over 80 s
    assert go_on.act is Act.TAKE_OVER and "it runs continuously now" in go_on.say, go_on
    assert go_on.event["mode"] == "continuous" and go_on.event["rate"] == 37.5
    busy.hand_over(set())
    assert busy.takeover(None).act is Act.START
    start = busy.next_run(health(Status.DEAD), None, False, None)
    assert (start.act, start.delay) == (Act.START, 0.0)  # a finished run is no failure: no backoff
    busy.started(FakeDriver("sensors-2"))
    busy.watch()
    assert not busy.available_now  # launched continuous
    busy.lease_taken(FakeHolder("sensors-2", epoch=4))
    assert busy.switch(True) is None  # its spec says adaptive: the supervisor, not a switch, decides
    clock.advance(119)
    assert busy.quiet(0) is None  # running for less than quiet_for
    clock.advance(2)
    assert busy.quiet(1200) is None  # 10 records/s: above scheduled_below (5)
    stop = busy.quiet(300)  # 2.5 records/s
    assert stop.act is Act.STOP and "its input went quiet" in stop.say and stop.event["mode"] == "scheduled"
    assert busy.quiet(0) is None  # asked once
    code, reason = busy.exited(busy.watched()[0], (0, ""))
    ended = busy.run_ended(code, reason, True, None)
    assert ended.act is Act.END and "input went quiet" in ended.say, ended
    assert busy.budget.consecutive_failures() == 0


def test_the_standby_takes_over_when_the_driver_dies(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    beside = Supervision(standby=True)
    sup.next_run(health(Status.DEAD), None, False, None)
    active = FakeDriver("sensors-1")
    sup.started(active)
    sup.watch()
    assert sup.keep_standby(health(Status.STARTING), beside) == (None, False)  # warmed once the driver runs well
    assert sup.keep_standby(health(Status.HEALTHY), Supervision()) == (None, False)  # the spec asks for none
    assert sup.keep_standby(health(Status.HEALTHY), beside) == (None, True)
    standby = sup.standby = FakeDriver("sensors-2")
    assert sup.keep_standby(health(Status.HEALTHY), Supervision(standby=True, standby_queue="other")) == (None, False)
    # the active driver dies
    active.running = False
    code, reason = sup.exited("driver exited", (1, "killed"))
    assert sup.run_ended(code, reason, False, None).act is Act.TAKE_OVER
    assert sup.ended is active
    sup.hand_over(set())
    assert sup.takeover(None).act is Act.WAIT
    assert sup.takeover(FakeHolder("sensors-1", epoch=1, live=False)).act is Act.WAIT
    clock.advance(0.5)
    took = sup.takeover(FakeHolder("sensors-2", epoch=2, host="worker-1"))
    assert took.act is Act.WATCH
    assert took.say == ("stream sensors: the standby sensors-2 on worker-1 holds epoch 2 of the lease (0.5s after this "
                        "supervisor saw the driver end)")
    assert sup.active is standby and sup.standby is None
    # a new run, of the driver this task runs now: watched as its own, not adopted
    assert sup.next_run(health(Status.HEALTHY), None, True, FakeHolder("sensors-2", epoch=2)).act is Act.WATCH
    assert sup.started().say == "supervising stream sensors (run 2 of this task)"
    sup.watch()
    assert sup.lease_taken(FakeHolder("sensors-2", epoch=2)) is not None and sup.epoch == 2
    # the next standby: not before the relaunch delay since the last one
    assert sup.keep_standby(health(Status.HEALTHY), beside) == (None, False)
    clock.advance(STANDBY_RELAUNCH_SECONDS)
    assert sup.keep_standby(health(Status.HEALTHY), beside) == (None, True)
    # one that ended is reported, and replaced
    sup.standby = ended = FakeDriver("sensors-3", running=False)
    clock.advance(STANDBY_RELAUNCH_SECONDS)
    assert sup.keep_standby(health(Status.HEALTHY), beside) == (ended, True)


def test_a_rescale_hands_the_stream_to_a_standby_at_the_new_size_once_it_is_ready(tmp_path: Path,
                                                                                     clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    sup.next_run(health(Status.DEAD), None, False, None)
    active = FakeDriver("sensors-1")
    sup.started(active)
    sup.watch()
    assert sup.rescale(20, "files", 4) is None  # not before its driver holds the lease
    sup.lease_taken(FakeHolder("sensors-1", epoch=1))
    sup.standby = FakeDriver("sensors-2")  # warmed at the old size
    decision = sup.rescale(20, "files", 4)
    assert decision is not None and decision.act is Act.RESCALE and decision.end_standby
    assert sup.rescale(30, "files", 4) is None  # one at a time
    assert sup.drop_standby().driver_id == "sensors-2"
    sup.rescaling(standby := FakeDriver("sensors-3"))
    assert sup.standby is standby and sup.rescale_pending
    assert sup.hand_over_when_ready(set()) is None  # warming
    assert sup.hand_over_when_ready({"sensors-2"}) is None  # another's readiness says nothing
    clock.advance(25)
    stop = sup.hand_over_when_ready({"sensors-3"})
    assert stop is not None and stop.act is Act.STOP and "rescale to 20 files a micro-batch" in stop.why
    assert not sup.rescale_pending and sup.observe(health(Status.STALLED), lambda epoch: False) is None
    assert not sup.overdue()  # a rescale's stop has the full graceful grace (switch_grace), not the stalled 5 s
    clock.advance(6)
    assert not sup.overdue()
    # the driver stops between batches: a handover, not a failed run, and the standby takes over
    active.running = False
    code, reason = sup.exited(*sup.watched()[:1], (0, ""))
    ended = sup.run_ended(code, reason, sup.watched()[1], None)
    assert ended.act is Act.TAKE_OVER and ended.event is not None
    assert {k: ended.event[k] for k in ("event", "per_trigger", "unit", "previous", "standby")} == {
        "event": "rescaled", "per_trigger": 20, "unit": "files", "previous": 4, "standby": "sensors-3"}
    assert ended.event["stop_seconds"] == 6.0
    assert sup.budget.consecutive_failures() == 0
    sup.hand_over(set())
    assert sup.takeover(FakeHolder("sensors-3", epoch=2)).act is Act.WATCH and sup.active is standby
    sup.started()
    sup.watch()
    sup.lease_taken(FakeHolder("sensors-3", epoch=2))
    # a rescale whose standby ends before it is ready, or is not ready in time, is given up; the driver runs on
    assert sup.rescale(40, "files", 20) is not None
    sup.rescaling(dying := FakeDriver("sensors-4"))
    dying.running = False
    gave_up = sup.hand_over_when_ready(set())
    assert gave_up is not None and gave_up.act is Act.WAIT
    assert "given up (its standby ended)" in gave_up.say and sup.standby is None and not sup.rescale_pending
    assert sup.rescale(40, "files", 20) is not None
    sup.rescaling(slow := FakeDriver("sensors-5"))
    clock.advance(RESCALE_READY_SECONDS + 1)
    late = sup.hand_over_when_ready(set())
    assert late is not None and late.driver is slow and "not ready within" in late.say
    # nor while an available-now run goes, or a stop is under way
    assert sup.observe(health(Status.STALLED), lambda epoch: False) is not None
    assert sup.rescale(40, "files", 20) is None


def test_a_standby_on_another_worker_takes_over_and_is_supervised_through_its_lease(tmp_path: Path,
                                                                                     clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    sup.next_run(health(Status.DEAD), None, False, None)
    sup.started(FakeDriver("sensors-1"))
    sup.watch()
    own = sup.standby = FakeDriver("sensors-2")
    sup.exited("driver exited", (1, "killed"))
    sup.run_ended(1, "killed", False, None)
    sup.hand_over({"elsewhere-1", "sensors-2"})
    took = sup.takeover(FakeHolder("elsewhere-1", epoch=2, host="worker-3"))
    assert took.act is Act.ADOPT and "the standby elsewhere-1 on worker-3 holds epoch 2" in took.say
    assert sup.standby is own and sup.active is None  # its own kept, for the next takeover
    adopt = sup.next_run(health(Status.HEALTHY), None, True, FakeHolder("elsewhere-1", epoch=2, host="worker-3"))
    assert (adopt.act, adopt.level) == (Act.ADOPT, "info")
    assert adopt.say == "supervising stream sensors through its lease: pid 4242 on worker-3 (epoch 2) (run 2 of this task)"
    assert sup.epoch == 2 and len(sup.budget.runs()) == 2  # a new run


def test_without_a_takeover_in_time_a_driver_is_started_and_the_standby_killed(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    standby = sup.standby = FakeDriver("sensors-2")
    sup.hand_over(set())
    clock.advance(STANDBY_TAKEOVER_SECONDS - 1)
    assert sup.takeover(None).act is Act.WAIT
    clock.advance(1)
    late = sup.takeover(FakeHolder("sensors-2", epoch=2))
    assert (late.act, late.driver, late.level) == (Act.START, standby, "warning")
    assert late.say == "stream sensors: no standby took over (none within 30s); starting a driver"
    sup.standby = dead = FakeDriver("sensors-3", running=False)
    sup.hand_over(set())
    ended = sup.takeover(None)
    assert ended.driver is dead and "no standby took over (it ended)" in ended.say


def test_a_stream_that_moved_to_another_worker_is_never_stopped(tmp_path: Path, clock: Clock) -> None:
    sup = supervisor(tmp_path, clock)
    sup.epoch = 7
    # while this try is the current one, a killed task stops its own driver, only while it holds the lease
    assert sup.leaves(tenure(1)) is None and sup.leaves(None) is None
    assert sup.killed(lambda epoch: epoch == 7, lambda: False) == 7
    assert sup.killed(lambda epoch: epoch == 8, lambda: False) is None  # the lease moved on: epoch 8 is another's
    # Airflow retried the task on another worker: this try leaves the stream alone, and says so once
    leave = sup.leaves(tenure(2))
    assert (leave.act, leave.level) == (Act.LEAVE, "warning")
    assert leave.say == ("stream sensors: stream_sensors run r try 2 (pid 102 on worker-2) supervises it now; this try "
                         "(stream_sensors run r try 1 (pid 101 on worker-1)) leaves it alone")
    assert sup.leaves(tenure(2)) == Decision(Act.LEAVE, "", "warning")
    assert sup.killed(lambda epoch: True, lambda: sup.leaves(tenure(2)) is not None) is None
    # a driver this try did not start holds the lease: never stopped, however it looks
    fresh = supervisor(tmp_path, clock)
    fresh.next_run(health(Status.DEAD), None, False, None)
    fresh.started(FakeDriver("sensors-9"))
    fresh.watch()
    fresh.lease_taken(FakeHolder("the-newer-tries", epoch=8))
    assert fresh.observe(health(Status.STALLED), lambda epoch: True) is None
    assert fresh.killed(lambda epoch: True, lambda: False) is None


def test_the_standby_task_keeps_a_standby_for_the_current_try_and_runs_the_one_that_took_over(clock: Clock) -> None:
    keeper = Standby("sensors", monotonic=clock.monotonic)
    assert keeper.ends(HOLD, lambda: False).say == f"stream sensors was stopped on purpose ({HOLD}): no standby is kept"
    assert keeper.ends(None, lambda: True).say == "the supervisor task of stream sensors has ended: so does its standby"
    assert keeper.ends(None, lambda: False) is None
    assert not keeper.relaunch(None)  # the supervisor has yet to begin
    assert keeper.relaunch(tenure(3)) and keeper.tenure == tenure(3)
    keeper.launch = FakeDriver("sensors-5")
    assert keeper.took_over(FakeHolder("sensors-1", epoch=4)) is None
    took = keeper.took_over(FakeHolder("sensors-5", epoch=5))
    assert took.level == "warning" and keeper.ran_active == 5
    assert took.say == "stream sensors: the standby sensors-5 took the stream over (epoch 5): this task runs its active driver now"
    assert keeper.took_over(FakeHolder("sensors-5", epoch=5)) is None  # said once
    ended = keeper.ended(1, "killed\nby a test", released=True)
    assert (ended.level, ended.say) == ("warning", "stream sensors: its driver sensors-5 (epoch 5) ended (exit 1: killed): "
                                                   "lease released for the standby elsewhere")
    assert (keeper.launch, keeper.ran_active) == (None, None)
    assert not keeper.relaunch(tenure(3))  # within the relaunch delay
    clock.advance(STANDBY_RELAUNCH_SECONDS)
    assert keeper.relaunch(tenure(4)) and keeper.tenure.number == 4
    keeper.launch = FakeDriver("sensors-6")
    assert keeper.ended(0, "", released=False).say == "stream sensors: standby sensors-6 ended (exit 0)"


def test_the_supervisors_decisions_import_no_airflow() -> None:
    code = ("import sys\n"
            "class NoAirflow:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'airflow':\n"
            "            raise ImportError(name)\n"
            "sys.meta_path.insert(0, NoAirflow())\n"
            "import streamops.supervisor\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'airflow']\n")
    subprocess.run([sys.executable, "-c", code], check=True)
