"""Restart policy: exponential backoff, a bounded number of attempts per period, reset after a stable run.

Every driver run of a stream is recorded in ``<checkpoint>/_control/runs.json`` (start,
end, exit code, why it ended), so the policy holds across task retries, DAG runs and
scheduler restarts. A run counts as a failure unless an operator stopped it (the stop DAG,
whatever its exit code: an immediate stop kills the driver), it finished (an available-now
run that took what was waiting), or it lasted at least ``stable_after_minutes``; a stable
run resets the count. A driver that exits 0 without being asked to, or that its supervisor
stopped because it stalled, failed. The backoff doubles with every failure since the last stable run; the
budget is spent when ``max_attempts`` of those failures ended within the last
``period_minutes``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from spark_jobs.runtime.atomic import write_atomically
from spark_jobs.stream_spec.models import Restart

MAX_RECORDS = 200


@dataclass
class Run:
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str = ""
    forced: bool = False  # the supervisor stopped it (it stalled): a failure, whatever its exit code
    requested: bool = False  # an operator stopped it (the stop DAG): not a failure, whatever its exit code
    finished: bool = False  # an available-now run that ended by itself, as it should


class RestartBudget:
    def __init__(self, path: str | os.PathLike[str], policy: Restart):
        self.path = Path(path)
        self.policy = policy

    def runs(self) -> list[Run]:
        try:
            return [Run(**r) for r in json.loads(self.path.read_text())]
        except FileNotFoundError:
            return []
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{self.path} is not a valid run history ({exc}); move it aside to reset it") from None

    def _save(self, runs: list[Run]) -> None:
        write_atomically(self.path, json.dumps([asdict(r) for r in runs[-MAX_RECORDS:]], indent=1))

    def record_start(self, now: float) -> None:
        runs = self.runs()
        if runs and runs[-1].ended_at is None:  # the previous supervisor died with its driver
            runs[-1].ended_at, runs[-1].reason = now, "supervisor lost the driver"
        runs.append(Run(started_at=now))
        self._save(runs)

    def record_end(self, now: float, exit_code: int | None, reason: str, forced: bool = False,
                   requested: bool = False, finished: bool = False) -> None:
        runs = self.runs() or [Run(started_at=now)]
        last = runs[-1]
        last.ended_at, last.exit_code, last.reason, last.forced = now, exit_code, reason, forced
        last.requested, last.finished = requested, finished
        self._save(runs)

    def last_run(self) -> Run | None:
        runs = self.runs()
        return runs[-1] if runs else None

    def _stable(self, run: Run) -> bool:
        if run.requested or run.finished:
            return True
        end = run.ended_at if run.ended_at is not None else run.started_at
        return end - run.started_at >= self.policy.stable_after_minutes * 60

    def _failures(self) -> list[Run]:
        """The failed runs since the last stable run, newest first."""
        failed = []
        for run in reversed(self.runs()):
            if run.ended_at is None:
                continue
            if self._stable(run):
                break
            failed.append(run)
        return failed

    def consecutive_failures(self) -> int:
        return len(self._failures())

    def failures_in_period(self, now: float) -> int:
        """Failed runs since the last stable run that ended within the last ``period_minutes``."""
        since = now - self.policy.period_minutes * 60
        return sum(1 for run in self._failures() if run.ended_at is not None and run.ended_at >= since)

    def exhausted(self, now: float) -> bool:
        return self.failures_in_period(now) >= self.policy.max_attempts

    def next_delay(self) -> float:
        """Seconds to wait before the next start: 0 after a stable run, then doubling."""
        failures = self.consecutive_failures()
        if failures == 0:
            return 0.0
        return min(self.policy.backoff_initial_seconds * 2 ** (failures - 1), self.policy.backoff_max_seconds)

    def restarts_since(self, since: float) -> int:
        return sum(1 for r in self.runs()[1:] if r.started_at >= since)
