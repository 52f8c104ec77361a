"""StreamHealthTrigger: the deferrable path of the stream health sensor (runs in the triggerer)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class StreamHealthTrigger(BaseTrigger):
    """Fire once the stream's status is one of ``statuses``; poll every ``poll_seconds``.

    Reading a checkpoint is file I/O, done in a worker thread so the triggerer's event
    loop never blocks. The event carries the stream's health as a dict.
    """

    def __init__(self, stream: str, statuses: list[str], poll_seconds: float = 10.0,
                 spec_dir: str | None = None, data_root: str | None = None) -> None:
        super().__init__()
        self.stream = stream
        self.statuses = list(statuses)
        self.poll_seconds = poll_seconds
        self.spec_dir = spec_dir
        self.data_root = data_root

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "stream": self.stream, "statuses": self.statuses, "poll_seconds": self.poll_seconds,
            "spec_dir": self.spec_dir, "data_root": self.data_root,
        })

    def _check(self) -> dict[str, Any]:
        from streamops.hooks.stream import StreamHook

        return StreamHook(self.stream, self.spec_dir, self.data_root).health().to_dict()

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                health = await asyncio.to_thread(self._check)
            except Exception as exc:  # e.g. the spec became invalid: report, do not spin
                yield TriggerEvent({"stream": self.stream, "error": f"{type(exc).__name__}: {exc}"})
                return
            if health["status"] in self.statuses:
                yield TriggerEvent(health)
                return
            self.log.info("stream %s is %s (%s); waiting for %s", self.stream, health["status"], health["reason"],
                          "/".join(self.statuses))
            await asyncio.sleep(self.poll_seconds)
