"""The operators of a stream's upgrade DAG: one step of the upgrade (a Spark job of its own), and
the watch of the stream once its rebuilt outputs run again."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseOperator, Context
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from spark_jobs import changes, upgrade
from spark_jobs.quality.ledger import problems_since, read_ledger
from spark_jobs.runtime.checkpoint import previous_plan
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import default_spec_dir
from streamops.health import RUNNING
from streamops.hooks.stream import StreamHook
from streamops.operators import job_path

UPGRADE_JOB = job_path("upgrade.py")


class UpgradeStepOperator(SparkSubmitOperator):
    """Run one step of a stream's upgrade to its spec as the file says it now
    (``spark_jobs/upgrade.py``, with ``spark-submit``; where: the Spark connection).

    ``prepare`` (the stream stopped: verdicts and savepoint; ``online``: the stream may run again
    with its outputs to rebuild held), ``rebuild`` (beside the live sinks), ``swap`` (each rebuilt
    output in its live sink's place, the plan recorded), ``all`` (the three, the stream stopped) or
    ``rollback`` (the newest upgrade undone, the stream stopped). A refusal (nothing to upgrade, a
    change an upgrade cannot carry out, a driver running) or a failure fails the task without a
    retry; the job's log says why. Returns the upgrade's record, without the spec's text (XCom).

    :param stream: the stream's name. (templated)
    ``rehearse`` settles the change's unknown verdicts on a copy of the checkpoint
    (``spark_jobs.rehearsal``); with none to settle, it submits nothing and is skipped.

    :param step: ``rehearse``, ``prepare``, ``rebuild``, ``swap``, ``all`` or ``rollback``.
    :param online: with ``prepare``: the stream runs during the rebuild and the swap.
    :param number: with ``rollback``: only this upgrade, if it is the newest (templated; empty:
        none was prepared, and there is nothing to roll back; None: the newest).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "stream", "number")

    def __init__(self, *, stream: str, step: str, online: bool = False, number: str | None = None,
                 spec_dir: str | None = None, data_root: str | None = None, **kwargs: Any) -> None:
        if step not in (*upgrade.STEPS, "rollback"):
            raise ValueError(f"step must be one of {(*upgrade.STEPS, 'rollback')}, not {step!r}")
        kwargs.setdefault("application", UPGRADE_JOB)
        kwargs.setdefault("name", f"upgrade:{stream}")
        super().__init__(**kwargs)
        self.stream, self.step, self.online, self.spec_dir, self.data_root = stream, step, online, spec_dir, data_root
        self.number = number

    def execute(self, context: Context) -> dict[str, Any]:
        spec_file = f"{self.spec_dir or default_spec_dir()}/{self.stream}.yaml"
        if self.step == "rehearse":
            return self._rehearse(context, spec_file)
        args = ["--spec", spec_file]
        if self.step == "rollback" and self.number is not None:
            if not str(self.number).strip():
                self.log.info("stream %s: no upgrade was prepared: nothing to roll back", self.stream)
                return {}
            args += ["--number", str(int(self.number))]
        args += ["--rollback"] if self.step == "rollback" else ["--step", self.step]
        args += ["--online"] if self.online and self.step == "prepare" else []
        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        try:  # an upgrade that rebuilds nothing takes its rebuild and swap without a Spark job
            taken = upgrade.step_without_spark(hook.plan, hook.layout, spec_file, self.step) if self.step in (
                "rebuild", "swap") else None
        except upgrade.UpgradeRefused as exc:
            raise AirflowFailException(f"the upgrade's {self.step} of stream {self.stream} was refused: {exc}") from None
        if taken is None:
            self._submit(context, args, f"the upgrade's {self.step} of stream {self.stream} was refused or failed")
        else:
            self.log.info("upgrade %s of %s rebuilds no output: its %s needed no Spark job", taken["number"],
                          self.stream, self.step)
        record = upgrade.latest(hook.layout) or {}
        for verdict in record.get("verdicts", []):
            self.log.info("%s: %s %s", verdict["flow"], verdict["verdict"], "; ".join(verdict["reasons"]))
        self.log.info("upgrade %s of %s: %s", record.get("number"), self.stream, record.get("phase"))
        return {k: v for k, v in record.items() if k != "spec"}

    def _submit(self, context: Context, args: list[str], failed: str) -> None:
        """``spark-submit`` the upgrade job with ``args`` (and the data root); a refusal or failure fails
        the task without a retry, saying ``failed``."""
        self.application_args = args + (["--data-root", self.data_root] if self.data_root else [])
        # the step halts if this task dies (its spark-submit would run on beside the rollback)
        self.env_vars = {"PYSPARK_PYTHON": sys.executable, **upgrade.task_env(), **(self.env_vars or {})}
        try:
            super().execute(context)
        except AirflowException as exc:
            raise AirflowFailException(f"{failed} (its log above says why): {exc}") from None

    def _rehearse(self, context: Context, spec_file: str) -> dict[str, Any]:
        def unknown() -> list[changes.Verdict]:
            hook = StreamHook(self.stream, self.spec_dir, self.data_root)
            event_time = hook.plan.ingestion.event_time if hook.plan.ingestion is not None else None
            return [v for v in changes.judge(hook.plan, previous_plan(hook.layout), spec_file,
                                             event_time.watermark if event_time else None)
                    if v.verdict == changes.UNKNOWN]

        if not unknown():
            raise AirflowSkipException(f"stream {self.stream}: no unknown verdict to rehearse")
        self._submit(context, ["--spec", spec_file, "--step", "rehearse"],
                     f"the rehearsal of stream {self.stream}'s change failed")
        left = unknown()  # what the rehearsal could not settle: the check refuses it
        for v in left:
            self.log.warning("%s", v.text())
        return {"unsettled": [v.flow for v in left]}


class WatchUpgradeOperator(BaseOperator):
    """Watch a stream after its upgrade swapped the rebuilt outputs in: the driver must start each
    of them (its ``outputs_released`` event, or a driver's start after the swap, then each query's
    start; with none rebuilt, a driver started from the upgraded spec; a scheduled stream's next run:
    each query's start, then the run's clean end) and the stream must stay running, with no driver
    or query failing, for ``watch_seconds``, and every validation that ends meanwhile (the
    stream's quality DAG, on its sinks' asset events) must find the rebuilt outputs' units passing
    and the accounting of the stream and of those outputs balanced. Fails otherwise, which sends
    the DAG to its rollback.

    :param stream: the stream's name. (templated)
    :param watch_seconds: how long the stream must run well after the release; default 60.
    :param timeout_seconds: how long to wait for the release; default 600.
    :param scheduled: the stream runs scheduled (``execution.mode``): no driver holds the rebuilt
        outputs back, the run after the upgrade starts them.
    """

    template_fields: Sequence[str] = ("stream",)

    def __init__(self, *, stream: str, spec_dir: str | None = None, data_root: str | None = None,
                 watch_seconds: float = 60.0, timeout_seconds: float = 600.0, poll_seconds: float = 2.0,
                 scheduled: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream, self.spec_dir, self.data_root, self.scheduled = stream, spec_dir, data_root, scheduled
        self.watch_seconds, self.timeout_seconds, self.poll_seconds = watch_seconds, timeout_seconds, poll_seconds

    def execute(self, context: Context) -> dict[str, Any]:
        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        record = upgrade.latest(hook.layout)
        if record is None or record.get("phase") != upgrade.DONE:
            raise AirflowFailException(f"stream {self.stream} has no finished upgrade to watch: {record and record.get('phase')}")
        rebuilt = set(record["rebuild"])
        if not self.scheduled and not record.get("live") and hook.held_by() is not None and not hook.driver_alive():
            raise AirflowSkipException(f"stream {self.stream} is stopped on purpose ({hook.held_by()}): its next "
                                       f"start runs the rebuilt outputs {sorted(rebuilt)}; nothing to watch now")
        # a scheduled stream's: what its runs did after the swap (no driver ran during the upgrade)
        since = record.get("finished_at") or record["started_at"] if self.scheduled else record["started_at"]
        deadline = time.monotonic() + self.timeout_seconds
        released_at = None
        while released_at is None:
            events = [e for e in read_events(hook.layout.events_file) if e.get("logged_at", 0) >= since]
            started = {e.get("query") for e in events if e.get("event") == "started"}
            if self.scheduled:  # the run after the upgrade started them all, and ended well
                after = max((e["logged_at"] for e in events if e.get("event") == "started"), default=None)
                released = [e for e in events if e.get("event") == "driver_stopped" and e.get("exit_code") == 0
                            and after is not None and e["logged_at"] >= after]
            else:  # the driver that held them released them; or a driver started after the swap runs them
                released = [e for e in events if e.get("event") == "outputs_released"
                            and e.get("upgrade") == record["number"]] or [
                    e for e in events if e.get("event") == "driver_started"
                    and e["logged_at"] >= record.get("finished_at", float("inf"))]
            if released and rebuilt <= started:
                released_at = released[-1]["logged_at"]
                break
            if (not self.scheduled and not rebuilt and hook.driver_alive()
                    and upgrade.restart_needed(hook.layout, record) is None):
                released_at = time.time()  # nothing held, and the driver that runs started from the upgraded spec
                break
            self._check(events, record)
            if time.monotonic() > deadline:
                raise AirflowFailException(f"stream {self.stream}: the rebuilt outputs {sorted(rebuilt)} did not start "
                                           f"within {self.timeout_seconds:.0f}s of the swap")
            time.sleep(self.poll_seconds)
        self.log.info("stream %s: the rebuilt outputs %s run again; watching it for %.0fs", self.stream,
                      ", ".join(sorted(rebuilt)), self.watch_seconds)
        until = time.monotonic() + self.watch_seconds
        while True:
            events = [e for e in read_events(hook.layout.events_file) if e.get("logged_at", 0) >= since]
            self._check(events, record)
            quality, validations = problems_since(read_ledger(hook.layout.quality_dir), released_at, sorted(rebuilt))
            if quality:  # a validation after the release: a rebuilt output's unit failed, or rows went missing
                raise AirflowFailException(f"stream {self.stream}: its validation after upgrade {record['number']} "
                                           f"found: {'; '.join(quality)[:1500]}")
            health = hook.health()
            if health.status not in RUNNING:
                raise AirflowFailException(f"stream {self.stream} is {health.status} after its upgrade: {health.reason}")
            if time.monotonic() >= until:
                break
            time.sleep(self.poll_seconds)
        commits = {e.get("query"): e.get("batch_id") for e in events
                   if e.get("event") == "progress" and e.get("query") in rebuilt and e.get("logged_at", 0) >= released_at}
        self.log.info("stream %s ran well for %.0fs after its upgrade (%s); last batches of the rebuilt outputs: %s; "
                      "validation runs since, all clean: %d", self.stream, self.watch_seconds, health.status,
                      commits or "none yet (no new input)", validations)
        return {"stream": self.stream, "upgrade": record["number"], "status": str(health.status), "batches": commits,
                "validations": validations}

    def _check(self, events: list[dict[str, Any]], record: dict[str, Any]) -> None:
        failed = [e for e in events if e.get("event") == "driver_failed"
                  or (e.get("event") == "terminated" and e.get("exception"))]
        if failed:
            raise AirflowFailException(f"stream {self.stream} failed after upgrade {record['number']}: "
                                       f"{str(failed[-1].get('error') or failed[-1].get('exception'))[:500]}")
