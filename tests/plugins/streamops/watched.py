"""What the tests of the triggerer's watchers and of scheduled runs share: the sensors stream
run scheduled, and a trigger's first event as the triggerer's loop would get it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import yaml

from spark_jobs.stream_spec.layout import default_spec_dir


def scheduled_specs(tmp_path: Path, **execution: Any) -> Path:
    """include/streams with the sensors stream scheduled on its input (freshness 5 minutes),
    ``execution`` changing that."""
    specs = tmp_path / "include" / "streams"
    shutil.copytree(default_spec_dir(), specs)
    sensors = specs / "sensors.yaml"
    spec = yaml.safe_load(sensors.read_text())
    spec["execution"] = {"mode": "scheduled", "on_input": True, "freshness": "5 minutes", **execution}
    sensors.write_text(yaml.safe_dump(spec))
    return specs


def first_event(trigger: Any, timeout: float = 30) -> Any:
    """The first event the trigger's ``run`` yields (a TriggerEvent), within ``timeout`` seconds."""
    async def first() -> Any:
        events = trigger.run()
        try:
            return await asyncio.wait_for(anext(events), timeout=timeout)
        finally:
            await events.aclose()

    return asyncio.run(first())
