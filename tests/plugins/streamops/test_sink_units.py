"""The watcher of a sink's asset, over a real stream's checkpoint: it fires when units close,
once, with the units in its payload, no more than once per min_interval, and remembers across
triggerer restarts what it announced."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from watched import first_event

from streamops.triggers.sink_units import SinkUnitsTrigger


def test_each_sink_announces_what_closed_once(data_root: Path) -> None:
    now = 1_900_000_000.0
    events = {o: SinkUnitsTrigger("sensors", o, data_root=str(data_root)).check(now=now)
              for o in ("readings", "site_temperature_10m", "device_status")}
    table = events["device_status"]
    assert table["kind"] == "snapshot" and table["units"] == [f"batch {table['batch']}"] and table["stream"] == "sensors"
    window = events["site_temperature_10m"]
    assert window["kind"] == "window" and window["units"] and window["since"] is None
    assert window["units"][-1] <= window["closed_through"]
    assert events["readings"]["kind"] == "period"  # the output the ingestion writes: periods of the accepted rows
    announced = json.loads((data_root / "quality" / "sensors" / "announced.json").read_text())
    assert announced["device_status"]["batch"] == table["batch"]
    # nothing closed since: nothing to say, also once the interval has passed (a restarted triggerer reads the file)
    for when in (now + 1, now + 3600):
        assert SinkUnitsTrigger("sensors", "device_status", data_root=str(data_root)).check(now=when) is None


def test_units_closing_within_the_interval_wait_for_the_next_event(data_root: Path) -> None:
    state = data_root / "quality" / "sensors" / "announced.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    # announced just now, before the table's first batch
    state.write_text(json.dumps({"device_status": {"through_ms": None, "batch": None, "at": 1_900_000_000.0}}))
    trigger = SinkUnitsTrigger("sensors", "device_status", data_root=str(data_root))
    assert trigger.check(now=1_900_000_000.0 + 9) is None  # min_interval of the rules: 10 seconds
    later = trigger.check(now=1_900_000_000.0 + 11)
    assert later is not None and later["units"] == [f"batch {later['batch']}"]


def test_an_edited_rules_file_counts_at_the_next_poll(data_root: Path, tmp_path: Path) -> None:
    """The spec and rules are parsed once, and again when their files change."""
    import shutil

    import yaml

    from spark_jobs.stream_spec.layout import default_spec_dir

    include = tmp_path / "include"
    shutil.copytree(default_spec_dir().parent, include)
    state = data_root / "quality" / "sensors" / "announced.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"device_status": {"through_ms": None, "batch": None, "at": 1_900_000_000.0}}))
    trigger = SinkUnitsTrigger("sensors", "device_status", spec_dir=str(include / "streams"), data_root=str(data_root))
    assert trigger.check(now=1_900_000_000.0 + 5) is None
    rules_file = include / "expectations" / "sensors.yaml"
    rules_file.write_text(yaml.safe_dump({**yaml.safe_load(rules_file.read_text()), "min_interval": "1 hour"}))
    assert trigger.check(now=1_900_000_000.0 + 60) is None  # the hour counts now, without a new trigger
    assert trigger.poll_seconds == 2.0


def test_without_an_announcement_the_last_validation_is_the_baseline(data_root: Path) -> None:
    ledger = data_root / "quality" / "sensors" / "ledger.json"
    ledger.parent.mkdir(parents=True, exist_ok=True)
    first = SinkUnitsTrigger("sensors", "device_status", data_root=str(data_root)).check(now=1_900_000_000.0)
    (data_root / "quality" / "sensors" / "announced.json").unlink()
    ledger.write_text(json.dumps({"outputs": {"device_status": {"snapshot_batch": first["batch"]}}}))
    assert SinkUnitsTrigger("sensors", "device_status", data_root=str(data_root)).check(now=1_900_000_000.0) is None


def test_the_trigger_runs_in_the_triggerers_loop_and_serializes(data_root: Path) -> None:
    trigger = SinkUnitsTrigger("sensors", "device_status", poll_seconds=0.1, data_root=str(data_root))
    classpath, kwargs = trigger.serialize()
    assert classpath == "streamops.triggers.sink_units.SinkUnitsTrigger"
    assert SinkUnitsTrigger(**kwargs).output == "device_status"

    event = first_event(trigger)
    assert event.payload["output"] == "device_status" and event.payload["units"]


def test_a_sink_it_cannot_read_does_not_stop_the_trigger(tmp_path: Path) -> None:
    trigger = SinkUnitsTrigger("nope", "x", poll_seconds=0.05, data_root=str(tmp_path))
    with pytest.raises(Exception, match="nope"):
        trigger.check()  # no such spec: said in the triggerer's log, polled again

    async def a_few_polls() -> None:
        events = trigger.run()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(events), timeout=0.3)

    asyncio.run(a_few_polls())  # the loop polls on instead of failing
