"""The stream health sensor: a deploy's confirmation ends when the stream was stopped on purpose
before it was seen running, so that the stream DAG's next run does not queue behind it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowSkipException
from examples import example_spec, include_with

from streamops.health import RUNNING
from streamops.hooks.stream import StreamHook
from streamops.sensors.stream_health import StreamHealthSensor
from streamops.triggers.stream_health import StreamHealthTrigger


@pytest.fixture
def stopped(tmp_path: Path) -> tuple[str, str]:
    """The sensors stream, never run (dead), then stopped on purpose by a DAG: its spec folder and data root."""
    spec_dir, data_root = include_with(tmp_path / "include", example_spec("sensors")), tmp_path / "data"
    return str(spec_dir), str(data_root)


def test_a_stream_stopped_on_purpose_ends_the_wait_of_a_sensor_that_asks_for_it(stopped) -> None:
    spec_dir, data_root = stopped
    sensor = StreamHealthSensor(task_id="running", stream="sensors", statuses=list(RUNNING), spec_dir=spec_dir,
                                data_root=data_root, ends_when_stopped=True)
    plain = StreamHealthSensor(task_id="plain", stream="sensors", statuses=list(RUNNING), spec_dir=spec_dir,
                               data_root=data_root)
    assert sensor._decide(sensor._health()) is False  # dead, nobody stopped it: a driver may still come
    StreamHook("sensors", spec_dir, data_root).hold("stream_sensors_upgrade run 1")
    with pytest.raises(AirflowSkipException, match="stopped on purpose .stream_sensors_upgrade run 1"):
        sensor._decide(sensor._health())
    assert plain._decide(plain._health()) is False  # a sensor that does not ask goes on waiting

    async def first_event(trigger: StreamHealthTrigger) -> dict:
        async for event in trigger.run():
            return event.payload
        raise AssertionError("no event")

    trigger = StreamHealthTrigger("sensors", list(RUNNING), 0.05, spec_dir, data_root, ends_when_stopped=True)
    event = asyncio.run(asyncio.wait_for(first_event(trigger), 30))
    assert event["status"] == "dead" and event["held_by"] == "stream_sensors_upgrade run 1"
    assert StreamHealthTrigger(**trigger.serialize()[1]).ends_when_stopped
