"""StreamHealthTrigger: the deferrable path of the stream health sensor (runs in the triggerer)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class StreamHealthTrigger(BaseTrigger):
    """Fire once the stream's status is one of ``statuses``; poll every ``poll_seconds``;
    ``ends_when_stopped``: fire too once the stream is dead because it was stopped on purpose
    (the event says ``stopped``: by whom).

    Reading a checkpoint is file I/O, done in a worker thread so the triggerer's event
    loop never blocks. The event carries the stream's health as a dict.
    """

    def __init__(self, stream: str, statuses: list[str], poll_seconds: float = 10.0,
                 spec_dir: str | None = None, data_root: str | None = None, ends_when_stopped: bool = False) -> None:
        super().__init__()
        self.ends_when_stopped = ends_when_stopped
        self.stream = stream
        self.statuses = list(statuses)
        self.poll_seconds = poll_seconds
        self.spec_dir = spec_dir
        self.data_root = data_root

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "stream": self.stream, "statuses": self.statuses, "poll_seconds": self.poll_seconds,
            "spec_dir": self.spec_dir, "data_root": self.data_root, "ends_when_stopped": self.ends_when_stopped,
        })

    def _check(self) -> dict[str, Any]:
        from streamops.hooks.stream import StreamHook

        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        return hook.health().to_dict() | {"held_by": hook.held_by()}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                health = await asyncio.to_thread(self._check)
            except Exception as exc:  # e.g. the spec became invalid: report, do not spin
                yield TriggerEvent({"stream": self.stream, "error": f"{type(exc).__name__}: {exc}"})
                return
            if health["status"] in self.statuses or (self.ends_when_stopped and stopped(health)):
                yield TriggerEvent(health)
                return
            self.log.info("stream %s is %s (%s); waiting for %s", self.stream, health["status"], health["reason"],
                          "/".join(self.statuses))
            await asyncio.sleep(self.poll_seconds)


def stopped(health: dict[str, Any]) -> bool:
    """Whether a stream's health (:meth:`StreamHealthTrigger._check`'s) says it is dead because an
    operator or a DAG stopped it on purpose."""
    return health.get("status") == "dead" and bool(health.get("held_by"))
