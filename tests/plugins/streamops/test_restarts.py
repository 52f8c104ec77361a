"""Restart policy: exponential backoff, bounded attempts per period, reset after a stable run."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.stream_spec.models import Restart
from streamops.restarts import RestartBudget

POLICY = Restart(max_attempts=3, backoff_initial_seconds=10, backoff_max_seconds=25, stable_after_minutes=30,
                 period_minutes=60)


def fail(budget: RestartBudget, at: float, lasted: float = 5) -> None:
    budget.record_start(at)
    budget.record_end(at + lasted, 1, "driver died")


def test_backoff_doubles_up_to_the_cap_and_the_budget_runs_out(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    assert budget.next_delay() == 0 and not budget.exhausted(0)
    delays = []
    for i in range(3):
        fail(budget, 100.0 * i)
        delays.append(budget.next_delay())
    assert delays == [10, 20, 25]
    assert budget.exhausted(300) and budget.failures_in_period(300) == 3


def test_the_budget_counts_failures_within_the_period(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    for at in (0, 1800, 3000):  # three short runs, the first ended more than an hour before the check
        fail(budget, at)
    assert budget.consecutive_failures() == 3 and budget.failures_in_period(3700) == 2
    assert not budget.exhausted(3700)
    assert budget.exhausted(3000 + 5)  # all three within the hour


def test_a_stable_run_resets_the_count(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    fail(budget, 0)
    fail(budget, 100)
    fail(budget, 200, lasted=31 * 60)  # ran 31 minutes before dying: stable
    assert budget.consecutive_failures() == 0 and budget.next_delay() == 0
    fail(budget, 5000)
    assert budget.consecutive_failures() == 1


def test_a_requested_stop_and_a_finished_run_are_not_failures(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    fail(budget, 0)
    budget.record_start(100)
    budget.record_end(110, 0, "stopped on request", requested=True)
    assert budget.consecutive_failures() == 0
    fail(budget, 200)
    budget.record_start(300)
    budget.record_end(310, 0, "took what was waiting", finished=True)
    assert budget.consecutive_failures() == 0


def test_a_clean_exit_nobody_asked_for_is_a_failure(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    for at in (0, 100, 200):
        budget.record_start(at)
        budget.record_end(at + 5, 0, "the driver exited without being asked to stop")
    assert budget.consecutive_failures() == 3 and budget.next_delay() == 25 and budget.exhausted(205)


def test_a_run_an_operator_stopped_is_not_a_failure_whatever_its_exit_code(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    fail(budget, 0)
    budget.record_start(100)
    budget.record_end(110, 1, "killed (stopped on request)", requested=True)  # an immediate stop kills the driver
    assert budget.consecutive_failures() == 0 and budget.next_delay() == 0 and not budget.exhausted(110)
    assert budget.last_run().requested and budget.last_run().exit_code == 1


def test_a_lost_supervisor_counts_its_run_as_ended(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    budget.record_start(0)  # the task process died: no end recorded
    budget.record_start(60)
    runs = budget.runs()
    assert runs[0].reason == "supervisor lost the driver" and runs[0].ended_at == 60
    assert budget.restarts_since(30) == 1


def test_a_damaged_history_is_reported(tmp_path: Path) -> None:
    (tmp_path / "runs.json").write_text("{not json")
    with pytest.raises(ValueError, match="runs.json is not a valid run history"):
        RestartBudget(tmp_path / "runs.json", POLICY).runs()


def test_a_stalled_run_the_supervisor_stopped_is_a_failure_even_with_exit_0(tmp_path: Path) -> None:
    budget = RestartBudget(tmp_path / "runs.json", POLICY)
    budget.record_start(0)
    budget.record_end(40, 0, "stopped because it was stalled", forced=True)
    assert budget.consecutive_failures() == 1 and budget.next_delay() == 10
