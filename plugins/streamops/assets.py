"""Every sink of every stream is an Airflow asset, and its stream's quality DAG is scheduled on them;
a scheduled stream's input is one too, and its DAG runs on it (:func:`run_schedule`).

An asset's URI says where the sink is: ``file://`` and the folder of a Parquet sink, the
database and table of a table sink (never its credentials). Each asset is watched by a
:class:`~streamops.triggers.sink_units.SinkUnitsTrigger`, which fires when units of the sink
close; Airflow records each as an asset event of the sink, with the units in its extra, and
runs the quality DAG. A rules file with a ``schedule`` adds that clock (either one runs it);
with ``on_new_output: false`` the clock alone does.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from airflow.sdk import Asset, AssetAny, AssetOrTimeSchedule, AssetWatcher, CronTriggerTimetable, DeltaTriggerTimetable

from spark_jobs.plan import FilesDataset, StreamPlan, TableDataset
from spark_jobs.quality.rules import QualityRules
from spark_jobs.stream_spec.models import StreamSpec, duration_seconds
from streamops import dag_id
from streamops.triggers.input_waiting import InputWaitingTrigger
from streamops.triggers.sink_units import SinkUnitsTrigger


def asset_name(stream: str, output: str) -> str:
    return f"{dag_id(stream)}.{output}"


def sink_uri(sink: FilesDataset | TableDataset) -> str:
    if isinstance(sink, FilesDataset):
        return sink.path if "://" in sink.path else Path(sink.path).resolve().as_uri()
    url = urlsplit(sink.url)
    if url.scheme.startswith("sqlite"):
        return f"sqlite://{url.path}/{sink.table}"
    host = url.hostname or "localhost"
    return f"postgres://{host}:{url.port or 5432}/{url.path.strip('/') or 'postgres'}/public/{sink.table}"


def sink_assets(plan: StreamPlan, paths: dict[str, Any]) -> list[Asset]:
    """The stream's persisted sinks (Parquet, Delta, tables; not console or memory) as assets, each with
    the watcher that fires when its units close."""
    stream = plan.stream
    return [Asset(name=asset_name(stream, o.name), uri=sink_uri(o.sink), group="stream sinks",
                  extra={"stream": stream, "output": o.name, "sink": o.sink.kind},
                  watchers=[AssetWatcher(name=f"{asset_name(stream, o.name)}.units",
                                         trigger=SinkUnitsTrigger(stream=stream, output=o.name, **paths))])
            for o in plan.outputs if isinstance(o.sink, FilesDataset | TableDataset)]


def quality_schedule(rules: QualityRules, assets: list[Asset]) -> Any:
    """When the quality DAG runs: on its sinks' asset events, on the rules' clock, or both."""
    on_assets = AssetAny(*assets) if rules.on_new_output and assets else None
    if rules.schedule is None:
        return on_assets
    if on_assets is None:
        return rules.schedule
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(rules.schedule, timezone="UTC"), assets=on_assets)


def input_asset(spec: StreamSpec, paths: dict[str, Any]) -> Asset:
    """A scheduled stream's input, watched by the trigger that fires when input waits for a run."""
    name = f"{dag_id(spec.name)}.input"
    poll = duration_seconds(spec.execution.input_poll)
    return Asset(name=name, group="stream inputs", extra={"stream": spec.name},
                 watchers=[AssetWatcher(name=f"{name}.waiting",
                                        trigger=InputWaitingTrigger(stream=spec.name, poll_seconds=poll, **paths))])


def run_schedule(spec: StreamSpec, paths: dict[str, Any]) -> Any:
    """When the stream DAG runs: a continuous stream when deployed (None); a scheduled one on its
    ``execution.schedule`` (cron, preset or interval), on its input asset (``on_input``), or both."""
    execution = spec.execution
    if not execution.scheduled:
        return None
    clock = None
    if execution.schedule is not None:
        clock = (DeltaTriggerTimetable(timedelta(seconds=duration_seconds(execution.schedule))) if execution.interval
                 else CronTriggerTimetable(execution.schedule, timezone="UTC"))
    if not execution.on_input:
        return clock
    on_input = input_asset(spec, paths)
    return on_input if clock is None else AssetOrTimeSchedule(timetable=clock, assets=AssetAny(on_input))
