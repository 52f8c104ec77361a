"""What the Streams pages draw, from a stream's files alone: charts over a range with restarts,
stops and validations marked, and the flow graph's rows in and out of every part."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from spark_jobs.plan import StreamPlan, compile_plan
from spark_jobs.runtime.history import History
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW
from streamops import page_data
from streamops.page_data import iso

SPEC = load_spec(default_spec_dir() / "sensors.yaml")
NOW = time.time()


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = Layout(SPEC, tmp_path / "data", default_spec_dir())
    history = History(layout.history_file)
    for i, at in enumerate((NOW - 600, NOW - 300)):
        history.fold({"event": "progress", "logged_at": at, "query": INGEST_FLOW, "input_rows": 100,
                      "input_rows_per_second": 10.0, "processed_rows_per_second": 40.0 + i,
                      "timestamp": iso(at), "watermark": iso(at - 120), "duration_ms": {"triggerExecution": 2500},
                      "state_rows": 300 + i, "sink_rows": -1, "dropped_duplicates": 5})
        history.fold({"event": "ingested", "logged_at": at - 1, "query": INGEST_FLOW, "rows": 95, "accepted": 80,
                      "quarantined": 10, "late": 5})
        history.fold({"event": "progress", "logged_at": at + 2, "query": "device_status", "input_rows": 80,
                      "processed_rows_per_second": 90.0, "timestamp": iso(at), "duration_ms": {"triggerExecution": 900},
                      "state_rows": 20, "sink_rows": -1})
    history.sample({"backlog_files": 3, "backlog_rows": 120}, at=NOW - 200)
    layout.runs_file.parent.mkdir(parents=True, exist_ok=True)
    layout.runs_file.write_text(json.dumps([
        {"started_at": NOW - 800, "ended_at": NOW - 500, "exit_code": 1, "reason": "driver lost", "forced": False,
         "requested": False},
        {"started_at": NOW - 480, "ended_at": NOW - 100, "exit_code": 0, "reason": "stop requested", "forced": False,
         "requested": True},
        {"started_at": NOW - 7200, "ended_at": None, "exit_code": None, "reason": "", "forced": False,
         "requested": False},  # out of range
    ]))
    layout.quality_dir.mkdir(parents=True, exist_ok=True)
    (layout.quality_dir / "ledger.json").write_text(json.dumps({
        "runs": [{"at": iso(NOW - 150), "ok": False, "units": 2, "failed": 1, "backfill": None,
                  "accounting": {"ok": True}}],
        "outputs": {"site_temperature_10m": {"units": {
            "u1": {"unit": "u1", "status": "passed", "validated_at": iso(NOW - 3000)},
            "u2": {"unit": "u2", "status": "failed", "validated_at": iso(NOW - 150), "docs": "x.html"}},
            "pruned": {"passed": 4, "failed": 0}}}}))
    return layout


@pytest.fixture
def plan(layout: Layout) -> StreamPlan:
    return compile_plan(SPEC, layout)


def test_the_charts_draw_the_history_of_the_range_with_its_events_marked(layout: Layout, plan: StreamPlan) -> None:
    data = page_data.charts(plan, layout, "15m", now=NOW)
    assert data["resolution"] == "per batch"
    charts = {c["id"]: {t["name"]: t["y"] for t in c["traces"]} for c in data["charts"]}
    assert charts["rates"]["input"] == [10.0, 10.0]
    assert charts["rates"]["ingestion: processed"] == [40.0, 41.0]
    assert charts["rates"]["device_status: processed"] == [90.0, 90.0]
    assert charts["durations"]["ingestion"] == [2.5, 2.5] and charts["durations"]["trigger interval (5 seconds)"] == [5, 5]
    assert charts["backlog"] == {"files waiting": [3], "rows waiting (estimated)": [120]}
    assert charts["lag"] == {"ingestion": [120.0, 120.0]}
    assert charts["state"]["ingestion"] == [300, 301]
    assert charts["quarantine"]["quarantined share"] == [pytest.approx(10.526, abs=0.01)] * 2
    assert [(m["kind"], m["text"]) for m in data["markers"]] == [
        ("start", "started"), ("failure", "driver ended: driver lost"), ("restart", "restarted after: driver lost"),
        ("validation failed", "validated 2 unit(s), 1 failed"), ("stop", "stop requested")]


def test_what_the_drivers_use_is_drawn_per_minute_at_every_range(layout: Layout, plan: StreamPlan) -> None:
    from streamops.cost import CPU, RSS

    history = History(layout.history_file)
    start = NOW - NOW % 60 - 240
    for at, cpu, rss in ((start + 5, 2.0, 800.0), (start + 10, 3.0, 950.0), (start + 125, 1.5, 700.0)):
        history.sample({CPU: cpu, RSS: rss}, at=at)
    for range_key in ("15m", "24h"):
        charts = {c["id"]: c for c in page_data.charts(plan, layout, range_key, now=NOW)["charts"]}
        traces = {t["name"]: t["y"] for t in charts["cost"]["traces"]}
        assert traces == {"driver CPU seconds per minute": [5.0, 1.5], "driver memory (MB)": [950.0, 700.0]}, traces
        assert charts["cost"]["y2"] == "MB"


def test_an_adaptive_streams_choices_of_mode_are_marked_with_their_rates(layout: Layout, plan: StreamPlan) -> None:
    from spark_jobs.runtime.progress import EventLog

    events = EventLog(layout.events_file, history=History(layout.history_file))
    for at, mode, rate in ((NOW - 500, "continuous", 5.404), (NOW - 200, "scheduled", 0.0)):
        events.write({"event": "execution_decision", "stream": "sensors", "mode": mode, "rows": 1, "rate": rate,
                      "logged_at": at})
    for range_key in ("15m", "24h"):
        marked = [(m["kind"], m["text"]) for m in page_data.charts(plan, layout, range_key, now=NOW)["markers"]
                  if m["kind"] in ("continuous", "scheduled")]
        assert marked == [("continuous", "adaptive: runs continuous (5.404 records/s)"),
                          ("scheduled", "adaptive: runs scheduled (0 records/s)")], marked


def test_a_day_is_drawn_per_minute_and_an_unknown_range_is_refused(layout: Layout, plan: StreamPlan) -> None:
    day = page_data.charts(plan, layout, "24h", now=NOW)
    assert day["resolution"] == "per minute"
    rates = next(c for c in day["charts"] if c["id"] == "rates")
    assert sum(next(t for t in rates["traces"] if t["name"] == "input")["y"]) == pytest.approx(200 / 60, abs=0.01)
    with pytest.raises(page_data.RangeError, match="range must be one of 15m, 1h, 24h"):
        page_data.charts(plan, layout, "7d")


def test_the_flow_graph_carries_the_rows_of_the_range_from_landing_to_sinks(layout: Layout, plan: StreamPlan) -> None:
    health = {"status": "healthy", "reason": "committing", "backlog_files": 3,
              "last_committed": {INGEST_FLOW: 9, "site_temperature_10m": 8, "device_status": None}}
    data = page_data.flow(plan, layout, health, "15m", now=NOW)
    nodes = {n["key"]: n for n in data["nodes"]}
    assert nodes["landing"]["rows_out"] == 200 and "3 file(s) waiting" in nodes["landing"]["detail"]
    ingestion = nodes["ingestion"]
    assert (ingestion["rows_in"], ingestion["status"], ingestion["url"]) == (200, "healthy", "#charts")
    assert f"accounting balances (validation of {iso(NOW - 150)})" in ingestion["detail"]
    assert nodes["accepted"]["rows_in"] == 160
    assert (nodes["quarantine"]["rows_in"], nodes["duplicates"]["rows_in"], nodes["late"]["rows_in"]) == (20, 10, 10)
    assert nodes["output:readings"]["rows_in"] == 160 and "written by the ingestion" in nodes["output:readings"]["detail"]
    assert nodes["output:device_status"]["rows_in"] == 160 and nodes["output:device_status"]["status"] == "starting"
    sink = nodes["sink:site_temperature_10m"]
    assert sink["status"] == "failed" and sink["url"] == "quality/"
    assert "5 unit(s) passed, 1 failed; last: u2 failed" in sink["detail"]
    assert "not validated yet" in nodes["sink:device_status"]["detail"]
    assert all(0 <= link["source"] < len(data["nodes"]) for link in data["links"])


def test_the_overview_trend_is_the_last_quarter_hour(layout: Layout, plan: StreamPlan) -> None:
    trend = page_data.trend(plan, layout, now=NOW)
    processed, backlog = trend["traces"]
    assert processed["y"] == [40.0, 41.0] and backlog["y"] == [3]


def test_a_sink_that_is_not_kept_is_drawn_but_is_no_asset(tmp_path: Path) -> None:
    from spark_jobs.quality.rules import parse_rules
    from spark_jobs.stream_spec.loading import parse_spec
    from streamops.assets import quality_schedule, sink_assets

    data = json.loads(json.dumps(SPEC.model_dump(mode="json", exclude_none=True)))
    data["outputs"].append({"name": "peek", "query": {"type": "passthrough"}, "mode": "append",
                            "sink": {"type": "console"}})
    spec = parse_spec(data)
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    plan = compile_plan(spec, layout)
    flow = page_data.flow(plan, layout, {"status": "healthy", "last_committed": {}}, "15m", now=NOW)
    assert next(n for n in flow["nodes"] if n["key"] == "sink:peek")["detail"].startswith("console sink (not kept)")
    assets = sink_assets(plan, {"spec_dir": None, "data_root": None})
    assert [a.name for a in assets] == ["stream_sensors.readings", "stream_sensors.site_temperature_10m",
                                        "stream_sensors.device_status"]
    assert quality_schedule(parse_rules({"on_new_output": False}, spec), assets) is None  # by hand only
    assert quality_schedule(parse_rules({"on_new_output": False, "schedule": "@daily"}, spec), assets) == "@daily"


def test_a_delta_table_s_files_version_compaction_and_vacuum_are_read_without_a_jvm(spark, tmp_path: Path) -> None:
    from spark_jobs import maintenance
    from spark_jobs.stream_spec.loading import parse_spec

    data = {"name": "tables", "checkpoint": "checkpoints/tables",
            "source": {"type": "rate", "rows_per_second": 1},
            "outputs": [{"name": "rows", "mode": "append", "query": {"type": "passthrough"},
                         "sink": {"type": "delta", "path": "delta/rows"}},
                        {"name": "later", "mode": "append", "query": {"type": "passthrough"},
                         "sink": {"type": "delta", "path": "delta/later"}}]}
    spec = parse_spec(data)
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    path = layout.data("delta/rows")
    for i in range(3):
        spark.range(i * 10, i * 10 + 10).toDF("value").coalesce(1).write.format("delta").mode("append").save(path)
    plan = compile_plan(spec, layout)
    first = {t["output"]: t for t in page_data.delta_tables(plan)}
    assert (first["rows"]["files"], first["rows"]["version"], first["rows"]["compacted"]) == (3, 2, None)
    assert first["rows"]["bytes"] == sum(p.stat().st_size for p in Path(path).glob("*.parquet"))
    assert first["later"] == {"output": "later", "path": layout.data("delta/later"), "note": "no table yet",
                              "files": None, "bytes": None, "version": None, "compacted": None, "vacuumed": None}
    assert first["rows"]["note"] is None and first["rows"].keys() == first["later"].keys()  # one shape: no 500

    maintenance.optimize(spark, path)
    maintenance.vacuum(spark, path, 0)
    (table,) = [t for t in page_data.delta_tables(plan) if t["output"] == "rows"]
    assert table["files"] == 1 and table["version"] == 5  # OPTIMIZE, then VACUUM START and END
    assert table["compacted"] <= table["vacuumed"] <= iso(time.time())
