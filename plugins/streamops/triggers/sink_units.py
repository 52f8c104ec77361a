"""SinkUnitsTrigger: fires when units of a stream's sink close; the watcher of the sink's asset.

Every sink of every stream is an Airflow asset (``streamops.assets``) watched by one of these
triggers in the triggerer. Each event it fires becomes an asset event of the sink (Airflow
stores the payload in the event's extra), and the stream's quality DAG, scheduled on its
sinks' assets, runs on it: validation follows new output instead of a clock.

An event names the units that closed (windows, event-time periods, or a table's new batch;
decided by :mod:`spark_jobs.quality.closing`, from the checkpoint alone) since the last
event, or since the last validation when there was none. At most one event per sink per
``min_interval`` of the rules (default 10 seconds): units closing meanwhile go into the next
one. What was announced is kept in ``<quality dir>/announced.json``, so a restarted
triggerer neither repeats nor loses an announcement.

The watcher polls every ``poll_seconds`` (default 2): a check reads the checkpoint's newest
files only; the spec and rules are parsed again only when their files change.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from spark_jobs.runtime.atomic import write_atomically
from streamops.triggers import file_state, read_json


class SinkUnitsTrigger(BaseEventTrigger):
    def __init__(self, stream: str, output: str, poll_seconds: float = 2.0, spec_dir: str | None = None,
                 data_root: str | None = None) -> None:
        super().__init__()
        self.stream, self.output, self.poll_seconds = stream, output, poll_seconds
        self.spec_dir, self.data_root = spec_dir, data_root
        #: the spec and rules as last read, with the state of their files then
        self._loaded: tuple[Any, tuple[Any, ...]] | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "stream": self.stream, "output": self.output, "poll_seconds": self.poll_seconds,
            "spec_dir": self.spec_dir, "data_root": self.data_root,
        })

    def check(self, now: float | None = None) -> dict[str, Any] | None:
        """The payload of the sink's next asset event, or None when nothing closed (or it is too
        soon after the last one). Records what it announces."""
        from spark_jobs.quality.closing import Closed, announcement, closed
        from spark_jobs.quality.ledger import read_ledger
        from spark_jobs.stream_spec.models import duration_seconds

        now = time.time() if now is None else now
        hook, layout, rules, target = self._sink()
        state_file = layout.quality_dir / "announced.json"
        state = read_json(state_file)
        mine = state.get(self.output)
        if mine is not None and now - mine.get("at", 0) < duration_seconds(rules.min_interval):
            return None
        if mine is not None:
            before = Closed(self.output, target.kind, mine.get("through_ms"), mine.get("batch"))
        else:  # nothing announced yet: what the last validation got to
            entry = (read_ledger(layout.quality_dir).get("outputs") or {}).get(self.output) or {}
            before = Closed(self.output, target.kind, entry.get("watermark_ms"), entry.get("snapshot_batch"))
        current = closed(hook.plan, target)
        event = announcement(target, current, before)
        if event is None:
            return None
        state[self.output] = {"through_ms": current.through_ms, "batch": current.batch, "at": now}
        write_atomically(state_file, json.dumps(state, indent=1))
        return {"stream": self.stream, **event, "announced_at": now}

    def _sink(self) -> tuple[Any, Any, Any, Any]:
        """The stream's hook, layout, rules and the sink's validation target, read again only
        when the spec or rules file changed (parsing them is most of a check's work)."""
        from spark_jobs.quality.rules import Target, load_rules, rules_path, targets
        from streamops.hooks.stream import StreamHook

        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        files = (hook.spec_dir / f"{self.stream}.yaml", rules_path(hook.spec_dir, self.stream))
        state = tuple(file_state(f) for f in files)
        if self._loaded is not None and self._loaded[1] == state:
            return self._loaded[0]
        rules = load_rules(hook.spec, hook.spec_dir)
        output = hook.plan.output(self.output)
        # an output validation cannot cut into units (a SQL or Python result, known to Spark only):
        # announced per committed batch, like a table
        target = next((t for t in targets(hook.plan, rules)[0] if t.output.name == self.output),
                      Target(output, "snapshot", None, None, None, [], []))
        loaded = (hook, hook.layout, rules, target)
        self._loaded = (loaded, state)
        return loaded

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                payload = await asyncio.to_thread(self.check)
            except Exception as exc:  # a bad spec or an unreadable file: said, and tried again
                self.log.warning("stream %s, sink of %s: cannot tell which units closed: %s",
                                 self.stream, self.output, exc)
                payload = None
            if payload is not None:
                self.log.info("stream %s: units of %s closed: %s", self.stream, self.output, payload)
                yield TriggerEvent(payload)
            await asyncio.sleep(self.poll_seconds)
