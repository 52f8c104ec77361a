"""InputWaitingTrigger: fires when input waits for a scheduled stream; the watcher of its input asset.

A stream with ``execution: {mode: scheduled, on_input: true}`` has an input asset
(``streamops.assets.input_asset``) watched by one of these triggers in the triggerer. An event
becomes an asset event of the input, and the stream's DAG, scheduled on it, runs: a run starts
when a file lands or records arrive on the topic, not only on the clock.

It fires when its stream's health says input waits (files not taken yet, records behind on
the broker, accepted rows an output has not read) while no driver runs, no run is under way
and the stream is not stopped on purpose; then not again until a run has begun since (the
run took it), or the stream's freshness passed without one. When it fired is kept in the
stream's control folder (``input_signal.json``), and each scheduled run's supervisor records
when it began and ended (``scheduled_run.json``, :func:`run_began`, :func:`run_ended`), so a
restarted triggerer neither repeats nor loses a request, and a driver restarted within a run
(after a crash) asks for no second run.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from spark_jobs.runtime.atomic import write_atomically
from streamops.triggers import file_state, read_json

#: the file, beside the lease, that says when the watcher last asked for a run
SIGNAL_FILE = "input_signal.json"
#: the file, beside the lease, that says when the newest scheduled run began and ended
RUN_FILE = "scheduled_run.json"


def run_began(control_dir: Path, now: float | None = None) -> float | None:
    """A scheduled run's supervisor begins (before it looks for input): when the run before it began."""
    previous = read_json(control_dir / RUN_FILE).get("began")
    write_atomically(control_dir / RUN_FILE, json.dumps({"began": time.time() if now is None else now}))
    return float(previous) if isinstance(previous, int | float) else None


def run_ended(control_dir: Path, now: float | None = None) -> None:
    """That run ended, whichever way."""
    run = read_json(control_dir / RUN_FILE)
    write_atomically(control_dir / RUN_FILE, json.dumps({**run, "ended": time.time() if now is None else now}))


class InputWaitingTrigger(BaseEventTrigger):
    def __init__(self, stream: str, poll_seconds: float = 10.0, spec_dir: str | None = None,
                 data_root: str | None = None) -> None:
        super().__init__()
        self.stream, self.poll_seconds = stream, poll_seconds
        self.spec_dir, self.data_root = spec_dir, data_root
        self._loaded: tuple[Any, Any] | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "stream": self.stream, "poll_seconds": self.poll_seconds, "spec_dir": self.spec_dir,
            "data_root": self.data_root,
        })

    def check(self, now: float | None = None) -> dict[str, Any] | None:
        """The payload of the input's next asset event, or None: nothing waits, a run is under way or
        already asked for, the stream is stopped on purpose, or it does not run on input (any more)."""
        from spark_jobs.stream_spec.models import duration_seconds
        from streamops.health import Status

        now = time.time() if now is None else now
        hook = self._hook()
        execution = hook.plan.execution
        if not (execution.scheduled and execution.on_input) or hook.held_by() is not None or hook.driver_alive():
            return None
        control, freshness = hook.layout.lease_dir, duration_seconds(execution.freshness)
        signal_file = control / SIGNAL_FILE
        asked, run = read_json(signal_file).get("at"), read_json(control / RUN_FILE)
        began, ended = run.get("began"), run.get("ended")
        # (a run, or an ask, older than the freshness is taken for lost: its task died unseen)
        if isinstance(began, int | float) and ended is None and now - began < freshness:
            return None  # a run is under way (between a crashed driver and its restart too)
        if isinstance(asked, int | float) and not (isinstance(began, int | float) and began >= asked) \
                and now - asked < freshness:
            return None  # asked for already: its run has not begun
        health = hook.health(now)
        if health.status in (Status.IDLE, Status.STARTING) or health.problems:
            return None  # nothing waits; a run begins; or a run would fail (its supervisor says why)
        write_atomically(signal_file, json.dumps({"at": now, "waiting": health.backlog_text}))
        return {"stream": self.stream, "waiting": health.backlog_text, "status": str(health.status),
                "reason": health.reason, "signalled_at": now}

    def _hook(self) -> Any:
        """The stream's hook, made again only when its spec file changed."""
        from streamops.hooks.stream import StreamHook

        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        state = file_state(hook.spec_dir / f"{self.stream}.yaml")
        if self._loaded is None or self._loaded[1] != state:
            self._loaded = (hook, state)
        return self._loaded[0]

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                payload = await asyncio.to_thread(self.check)
            except Exception as exc:  # a bad spec or an unreadable file: said, and tried again
                self.log.warning("stream %s: cannot tell whether input waits: %s", self.stream, exc)
                payload = None
            if payload is not None:
                self.log.info("stream %s: input waits (%s): a run is asked for", self.stream, payload["waiting"])
                yield TriggerEvent(payload)
            await asyncio.sleep(self.poll_seconds)
