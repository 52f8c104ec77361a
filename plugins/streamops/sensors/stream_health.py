"""StreamHealthSensor: wait until a stream reaches one of the given statuses."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow.sdk import BaseSensorOperator, Context, PokeReturnValue
from airflow.sdk.exceptions import AirflowException, AirflowSkipException

from streamops.health import Status
from streamops.hooks.stream import StreamHook
from streamops.triggers.stream_health import StreamHealthTrigger, stopped


class StreamHealthSensor(BaseSensorOperator):
    """Wait until a stream's status (read from its checkpoint) is one of ``statuses``.

    The hook reads; this sensor decides; with ``deferrable=True`` (the default) the
    waiting happens in the triggerer and holds no worker slot. The stream's health is
    logged at every check and returned as the task's result (XCom).

    :param stream: the stream's name. (templated)
    :param statuses: statuses that end the wait, e.g. ``["dead"]`` after a stop.
    :param fail_on: statuses that fail the task at once (default: ``corrupt``, ``blocked``).
    :param deferrable: wait in the triggerer; default True.
    """

    template_fields: Sequence[str] = ("stream",)

    def __init__(self, *, stream: str, statuses: Sequence[str], fail_on: Sequence[str] = (Status.CORRUPT, Status.BLOCKED),
                 spec_dir: str | None = None, data_root: str | None = None, deferrable: bool = True,
                 ends_when_stopped: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("poke_interval", 10)
        super().__init__(**kwargs)
        self.stream = stream
        self.statuses = [str(Status(s)) for s in statuses]
        self.fail_on = [str(Status(s)) for s in fail_on if str(s) not in self.statuses]
        self.spec_dir = spec_dir
        self.data_root = data_root
        self.deferrable = deferrable
        self.ends_when_stopped = ends_when_stopped

    def _health(self) -> dict[str, Any]:
        hook = StreamHook(self.stream, self.spec_dir, self.data_root)
        health = hook.health()
        self.log.info("%s", health.summary())
        for note in health.notes:
            self.log.info("note: %s", note)
        return health.to_dict() | {"held_by": hook.held_by()}

    def _decide(self, health: dict[str, Any]) -> bool:
        if self.ends_when_stopped and stopped(health):  # e.g. a deploy stopped before it was seen running
            raise AirflowSkipException(f"stream {self.stream} was stopped on purpose ({health['held_by']}) "
                                       "before it was seen running")
        if health["status"] in self.fail_on:
            problems = "; ".join(health.get("problems") or []) or health["reason"]
            raise AirflowException(f"stream {self.stream} is {health['status']}: {problems}")
        return health["status"] in self.statuses

    def poke(self, context: Context) -> PokeReturnValue:
        health = self._health()
        return PokeReturnValue(is_done=self._decide(health), xcom_value=health)

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        health = self._health()
        if self._decide(health):
            return health
        self.defer(
            trigger=StreamHealthTrigger(self.stream, self.statuses + self.fail_on, float(self.poke_interval),
                                        self.spec_dir, self.data_root, self.ends_when_stopped),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout) if self.timeout else None,
        )

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        if "error" in event:
            raise AirflowException(f"checking stream {self.stream} failed: {event['error']}")
        self.log.info("stream %s is %s (%s)", self.stream, event["status"], event["reason"])
        self._decide(event)
        return event
