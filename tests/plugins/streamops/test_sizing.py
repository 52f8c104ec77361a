"""Sizing by lag: a recommendation per window from the backlog and the ingestion's work, recorded
with its inputs when it changed enough, and charted on the stream's page."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from spark_jobs.plan import compile_plan
from spark_jobs.runtime import rate_limit
from spark_jobs.runtime.history import History
from spark_jobs.runtime.progress import EventLog
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import duration_seconds
from streamops import page_data, sizing
from streamops.sizing import Sizer, Window, recommend

T0 = 1_800_000_000.0


def test_the_recommendation_clears_the_backlog_within_the_catch_up_and_says_when_cores_are_short() -> None:
    # 60 files taken in a minute while the backlog stayed at 300: 1 file/s arrives; batches ran 30 of the 60 s
    window = Window(seconds=60, taken=60, busy_seconds=30, backlog_before=300, backlog_now=300)
    r = recommend(window, "files", current=10, trigger_seconds=5, catch_up_seconds=300, utilisation=0.7,
                  bounds=(1, 100))
    assert (r.arrival, r.capacity, r.demand) == (1.0, 2.0, 2.0)  # 300 / 300 s + 1 file/s
    assert r.per_trigger == 10  # 2 files/s over a 5 s trigger
    assert r.cores_factor == pytest.approx(2.0 / (0.7 * 2.0), abs=1e-3) and not r.enough_cores
    quiet = recommend(Window(60, 6, 3, 0, 0), "files", 10, 5, 300, 0.7, (1, 100))
    assert quiet.per_trigger == 1 and quiet.enough_cores  # 0.1 file/s: one a trigger is plenty
    huge = recommend(Window(60, 60, 30, 0, 100_000), "files", 10, 5, 300, 0.7, (1, 100))
    assert huge.per_trigger == 100  # bounded


@pytest.fixture
def stream(tmp_path: Path):
    data = yaml.safe_load((default_spec_dir() / "sensors.yaml").read_text())
    data["execution"] = {"sizing": {"catch_up": "5 minutes", "every": "1 minute"}}
    spec = parse_spec(data)
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    return compile_plan(spec, layout), layout


def progress(layout: Layout, at: float, batch_id: int, rows: int, ms: int) -> None:
    EventLog(layout.events_file).write({"event": "progress", "query": "_ingest", "batch_id": batch_id,
                                        "input_rows": rows, "duration_ms": {"triggerExecution": ms},
                                        "logged_at": at})


def test_a_window_s_recommendation_is_recorded_with_its_inputs_only_when_it_changed_enough(stream, monkeypatch) -> None:
    plan, layout = stream
    files_through = {-1: 0}  # the ingestion's checkpoint: files taken through each batch
    monkeypatch.setattr(sizing, "processed_files",
                        lambda checkpoint, through_batch: set(range(files_through[through_batch])))
    sizer = Sizer(plan, layout)
    assert sizer.current == plan.source.max_files_per_trigger and sizer.bounds == (1, 10 * sizer.current)
    backlog = lambda files: SimpleNamespace(backlog_files=files, backlog_records=None)  # noqa: E731
    assert sizer.observe(backlog(300), T0) is None  # the window begins
    for b in range(12):  # 12 batches of 5 files in the minute, 2.5 s each
        progress(layout, T0 + 5 * b + 1, b, 500, 2500)
        files_through[b] = 5 * (b + 1)
    assert sizer.observe(backlog(300), T0 + 30) is None  # not a whole window yet
    event = sizer.observe(backlog(300), T0 + 60)
    assert event is not None and event["event"] == "sizing_decision" and event["applied"] is False
    assert {k: event[k] for k in ("unit", "taken", "busy_seconds", "backlog_before", "backlog", "arrival_per_s",
                                  "capacity_per_s", "demand_per_s", "per_trigger", "current", "enough_cores")} == {
        "unit": "files", "taken": 60, "busy_seconds": 30.0, "backlog_before": 300, "backlog": 300,
        "arrival_per_s": 1.0, "capacity_per_s": 2.0, "demand_per_s": 2.0,
        "per_trigger": math.ceil(2.0 * duration_seconds(plan.trigger.processing_time)),
        "current": plan.source.max_files_per_trigger, "enough_cores": False}
    # the same load a minute later: nothing new to record
    for b in range(12, 24):
        progress(layout, T0 + 60 + 5 * (b - 12) + 1, b, 500, 2500)
        files_through[b] = 5 * (b + 1)
    assert sizer.observe(backlog(300), T0 + 120) is None
    # the backlog gone and the input quiet: a much smaller batch is recommended
    progress(layout, T0 + 150, 24, 100, 400)
    files_through[24] = 121
    quiet = sizer.observe(backlog(0), T0 + 180)
    assert quiet is not None and quiet["per_trigger"] < event["per_trigger"] and quiet["enough_cores"]

    # recorded into the stream's history, it is drawn on the backlog chart beside the source's own limit
    log = EventLog(layout.events_file, history=History(layout.history_file))
    log.write({**event, "logged_at": T0 + 60})
    log.write({**quiet, "logged_at": T0 + 180})
    traces = {t["name"]: t for t in next(c for c in page_data.charts(plan, layout, "1h", now=T0 + 240)["charts"]
                                         if c["id"] == "backlog")["traces"]}
    assert traces["per trigger: recommended (sizing by lag)"]["y"] == [event["per_trigger"], quiet["per_trigger"]]
    assert f"per trigger: the source's own ({plan.source.max_files_per_trigger})" in traces
    assert json.loads(layout.events_file.read_text().splitlines()[-1])["event"] == "sizing_decision"


def test_a_recommendation_a_quarter_away_from_the_driver_s_limit_is_applied_unless_the_spec_says_dry_run(
        stream, monkeypatch) -> None:
    plan, layout = stream
    monkeypatch.setattr(sizing, "processed_files", lambda checkpoint, through_batch: set(range(5 * (through_batch + 1))))
    backlog = lambda files: SimpleNamespace(backlog_files=files, backlog_records=None)  # noqa: E731

    def window(sizer: Sizer, start: float, files_waiting: int) -> dict | None:
        sizer.observe(backlog(files_waiting), start)
        for b in range(12):  # 5 files a batch, 2.5 s each: capacity 2 files/s
            progress(layout, start + 5 * b + 1, b, 500, 2500)
        return sizer.observe(backlog(files_waiting), start + 60)

    # a backlog of 3,000 files to clear in 5 minutes: 10 + 1 files/s, 55 a 5 s trigger (bounds 1 to 100)
    event = window(Sizer(plan, layout), T0, 3000)
    assert event is not None and event["per_trigger"] == 55 and event["current"] == 10 and event["applied"]
    # the limit set is what the driver takes next (rate_limit), and what the next recommendation is held against
    rate_limit.write(layout, 55, "files", "a test")
    assert rate_limit.applied(plan, layout).source.max_files_per_trigger == 55
    again = Sizer(plan, layout)
    assert again.current == 55
    assert window(again, T0 + 100, 3000)["applied"] is False  # recorded (its first), not applied again
    # the backlog gone: a smaller limit is recommended, but not applied while batches fit the trigger
    quiet = window(Sizer(plan, layout), T0 + 150, 0)
    assert quiet is not None and quiet["per_trigger"] < 55 and quiet["utilisation"] < 0.7 and not quiet["applied"]
    for b in range(12):  # batches that overrun (55 of the 60 s): a smaller limit keeps them short
        progress(layout, T0 + 301 + 5 * b, b, 500, 4600)
    busy = Sizer(plan, layout)
    busy.observe(backlog(0), T0 + 300)
    overrun = busy.observe(backlog(0), T0 + 360)
    assert overrun is not None and overrun["per_trigger"] < 55 and overrun["applied"]
    # within the bounds, whatever the file says; another unit (the source changed kind) is not taken
    rate_limit.write(layout, 5000, "files", "a test")
    assert rate_limit.current(plan, layout) == 100
    rate_limit.write(layout, 55, "records", "a test")
    assert rate_limit.current(plan, layout) == 10
    # dry run: recommended, never applied; the driver keeps the source's own limit
    dry = dataclasses.replace(plan, execution=plan.execution.model_copy(
        update={"sizing": plan.execution.sizing.model_copy(update={"dry_run": True})}))
    rate_limit.write(layout, 55, "files", "a test")
    assert rate_limit.applied(dry, layout) is dry
    dry_event = window(Sizer(dry, layout), T0 + 200, 3000)
    assert dry_event is not None and dry_event["per_trigger"] == 55 and not dry_event["applied"]


def test_the_interval_is_the_shortest_at_which_a_batch_of_the_demand_keeps_within_the_utilisation() -> None:
    # batches of 2, 4 and 8 files taking 1.5, 2 and 3 s: 1 s of planning and commit, 0.25 s a file
    assert sizing.batch_cost(((2, 1.5), (4, 2.0), (8, 3.0))) == pytest.approx((1.0, 0.25))
    assert sizing.batch_cost(((4, 2.0), (4, 2.2))) is None  # one size of batch: the two parts cannot be told apart
    window = Window(60, 56, 26, 0, 0, ((2, 1.5), (4, 2.0), (8, 3.0)) * 4)  # about 1 file/s arrives, no backlog
    r = recommend(window, "files", 10, 5, 300, 0.7, (1, 100), trigger_bounds=(1, 30))
    # 1 + 0.25 * 0.933 * T <= 0.7 * T: T = 1 / (0.7 - 0.233) = 2.14 s, and what arrives meanwhile
    assert r.cost == pytest.approx((1.0, 0.25)) and r.trigger_seconds == pytest.approx(1 / (0.7 - 0.25 * r.demand), abs=1e-3)
    assert r.per_trigger == 2  # 56 files in 60 s, every 15/7 s
    # a backlog the cores cannot take within the utilisation at any interval: the longest, the largest batches
    behind = recommend(Window(60, 56, 26, 0, 3000, window.batches), "files", 10, 5, 300, 0.7, (1, 5000), (1, 30))
    assert behind.trigger_seconds == 30 and behind.per_trigger == 1828 and not behind.enough_cores  # 60.93 files/s
    # within the bounds; unknown cost: the driver's interval stays
    assert recommend(window, "files", 10, 5, 300, 0.7, (1, 100), (4, 30)).trigger_seconds == 4
    same = Window(60, 56, 26, 0, 0, ((4, 2.0),) * 10)
    assert recommend(same, "files", 10, 5, 300, 0.7, (1, 100), (1, 30)).trigger_seconds == 5
    assert recommend(window, "files", 10, 5, 300, 0.7, (1, 100)).trigger_seconds == 5  # no bounds: not sized


def test_a_sized_interval_is_recorded_applied_and_what_the_next_driver_runs_at(stream, monkeypatch) -> None:
    plan, layout = stream
    plan = dataclasses.replace(plan, execution=plan.execution.model_copy(update={"sizing": plan.execution.sizing.model_copy(
        update={"min_trigger": "1 second", "max_trigger": "30 seconds"})}))
    sizes = [2, 4, 8] * 4  # files a batch, 1 s + 0.25 s a file each
    through = {b: sum(sizes[:b + 1]) for b in range(-1, len(sizes))}
    monkeypatch.setattr(sizing, "processed_files", lambda checkpoint, through_batch: set(range(through[through_batch])))
    backlog = SimpleNamespace(backlog_files=0, backlog_records=None)
    sizer = Sizer(plan, layout)
    assert (sizer.trigger_seconds, sizer.trigger_bounds) == (5, (1, 30))
    sizer.observe(backlog, T0)
    for b, n in enumerate(sizes):
        progress(layout, T0 + 5 * b + 1, b, 100 * n, int(1000 + 250 * n))
    event = sizer.observe(backlog, T0 + 60)
    assert event is not None and event["applied"] and event["current_trigger_seconds"] == 5
    assert (event["overhead_seconds"], event["seconds_per_unit"]) == pytest.approx((1.0, 0.25))
    assert 1 < event["trigger_seconds"] < 5 * 0.75  # shorter by a quarter or more: a rescale
    # the next driver's plan: its ingestion and the outputs at the stream's trigger every that often
    rate_limit.write(layout, event["per_trigger"], "files", "a test", event["trigger_seconds"])
    assert rate_limit.current_trigger(plan, layout) == event["trigger_seconds"]
    running = rate_limit.applied(plan, layout)
    every = f"{round(event['trigger_seconds'] * 1000)} milliseconds"
    assert running.ingestion.trigger.processing_time == every
    assert {o.trigger.processing_time for o in running.outputs} == {every}
    assert running.source.max_files_per_trigger == event["per_trigger"]
    assert Sizer(plan, layout).trigger_seconds == event["trigger_seconds"]
    # charted against the batches' durations: what sizing recommended, and what the driver runs at
    log = EventLog(layout.events_file, history=History(layout.history_file))
    log.write({**event, "logged_at": T0 + 60})
    log.write({"event": "driver_started", "stream": plan.stream, "per_trigger": event["per_trigger"],
               "processing_time": every, "logged_at": T0 + 70})
    traces = {t["name"]: t for t in next(c for c in page_data.charts(plan, layout, "1h", now=T0 + 240)["charts"]
                                         if c["id"] == "durations")["traces"]}
    assert traces["trigger interval: recommended (sizing by lag)"]["y"] == [event["trigger_seconds"]]
    assert traces["trigger interval: the driver's (sizing by lag)"]["y"] == [
        pytest.approx(event["trigger_seconds"], abs=1e-3)]
    # within the bounds whatever the file says; the spec's own interval when the spec sizes none
    rate_limit.write(layout, 5, "files", "a test", 600.0)
    assert rate_limit.current_trigger(plan, layout) == 30
    _, unsized = stream
    assert rate_limit.applied(stream[0], unsized).trigger == stream[0].trigger
