"""The flows of compiled specs (spark_jobs/flows: the ingestion and each output's query, started
together): query semantics on the shared SparkSession, with available-now runs.

Each file written is its own micro-batch of the ingestion (max_files_per_trigger: 1), so
the watermark moves at known points: the ingestion drops a row in batch N when its event
time is older than the watermark of batch N-1, i.e. ``max event time through batch N-2 -
delay``. The outputs then read everything the ingestion committed.
"""

from __future__ import annotations

import shutil
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest
from stream_runs import Run, at, land, make_spec, reading, run, stream_name, window_output  # tests/stream_runs.py

from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.plan import compile_plan, query_name
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import Trigger

# file 3 holds one late row within the watermark (00:33) and one beyond it (00:05)
LATE_FILES = [
    [reading("e1", 1), reading("e2", 12)],
    [reading("e3", 35)],
    [reading("e4", 41)],
    [reading("e5", 33), reading("e6", 5)],
    [reading("e7", 58)],
]


def windows(rows: list[dict]) -> dict[tuple[str, str], int]:
    return {(r["window_start"].strftime("%H:%M"), r["window_end"].strftime("%H:%M")): r["n"] for r in rows}


def test_tumbling_windows_late_within_updates_beyond_is_dropped_and_counted(spark, tmp_path: Path) -> None:
    result = run(spark, tmp_path, make_spec([window_output("w", "10 minutes")]), LATE_FILES)
    # final watermark 00:48: windows ending by then are final; e5 joined its old window, e6 was dropped
    assert windows(result.rows("w")) == {("00:00", "00:10"): 1, ("00:10", "00:20"): 1, ("00:30", "00:40"): 2}
    assert result.total("_ingest", "dropped_by_watermark") == 1
    assert result.total("_ingest", "input_rows") == 7
    assert result.total("w", "input_rows") == 6  # the accepted rows, none dropped again
    assert result.total("w", "dropped_by_watermark") == 0


def test_sliding_windows_assign_each_row_to_every_window_containing_it(spark, tmp_path: Path) -> None:
    result = run(spark, tmp_path, make_spec([window_output("w", "10 minutes", "5 minutes")]), LATE_FILES)
    assert windows(result.rows("w")) == {
        ("23:55", "00:05"): 1,  # e1
        ("00:00", "00:10"): 1,  # e1
        ("00:05", "00:15"): 1,  # e2
        ("00:10", "00:20"): 1,  # e2
        ("00:25", "00:35"): 1,  # e5 (late, within the watermark)
        ("00:30", "00:40"): 2,  # e3, e5
        ("00:35", "00:45"): 2,  # e3, e4
    }
    assert result.total("_ingest", "dropped_by_watermark") == 1


def sql_output(name: str, sql: str, mode: str = "append") -> dict:
    return {"name": name, "mode": mode, "sink": {"type": "memory"}, "query": {"type": "sql", "sql": sql}}


def test_a_sql_window_query_gives_what_the_aggregate_shorthand_gives(spark, tmp_path: Path) -> None:
    sql = ("SELECT window.start AS window_start, window.end AS window_end, device_id, count(*) AS n, "
           "max(event_id) AS ids FROM accepted GROUP BY window(ts, '10 minutes'), device_id")
    result = run(spark, tmp_path, make_spec([window_output("w", "10 minutes"), sql_output("s", sql)]), LATE_FILES)
    assert windows(result.rows("s")) == {("00:00", "00:10"): 1, ("00:10", "00:20"): 1, ("00:30", "00:40"): 2}
    assert sorted(map(str, result.rows("s"))) == sorted(map(str, result.rows("w")))


def test_sql_queries_explode_rows_and_join_reference_data_by_name(spark, tmp_path: Path) -> None:
    words = ("SELECT part, count(*) AS n FROM accepted LATERAL VIEW explode(split(device_id, '-')) t AS part "
             "GROUP BY part")
    joined = ("SELECT a.event_id, upper(d.site) AS site FROM accepted a JOIN devices d USING (device_id) "
              "WHERE a.temperature > 20")
    files = [[reading("a1", 1), reading("a2", 2, temperature=25.5)], [reading("b1", 3, "dev-002", 30.0)]]
    result = run(spark, tmp_path, make_spec([sql_output("words", words, "complete"), sql_output("hot", joined)]),
                 files)
    assert sorted((r["part"], r["n"]) for r in result.rows("words")) == [("001", 2), ("002", 1), ("dev", 3)]
    assert sorted(r["event_id"] for r in result.rows("hot")) == ["a2", "b1"]
    assert {r["event_id"]: r["site"] for r in result.rows("hot")}["a2"] == "SOUTH"  # dev-001 is in the south


def include_with_package(tmp_path: Path, prefix: str) -> tuple[Path, Path]:
    """An include/ folder with the reference data and an empty package of Python code under
    transforms/, named apart from every other test's (modules are imported once per process)."""
    include = tmp_path / "include"
    shutil.copytree(default_spec_dir().parent / "reference", include / "reference")
    package = include / "transforms" / f"{prefix}_{tmp_path.name.replace('-', '_')}"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    return include, package


def test_a_python_query_runs_its_function_with_a_python_udf_and_the_reference_views(spark, tmp_path: Path) -> None:
    include, package = include_with_package(tmp_path, "labels")
    # a Python UDF runs in Spark's Python workers
    (package / "hot.py").write_text(textwrap.dedent("""
        from pyspark.sql import functions as F

        @F.udf("string")
        def label(temperature):
            return "hot" if temperature is not None and temperature > 25 else "ok"

        def labelled(accepted):
            devices = accepted.sparkSession.table("devices")
            return accepted.join(devices.withColumnRenamed("site", "device_site"), "device_id").select(
                "event_id", "device_site", label("temperature").alias("label"))
        """))
    query = {"type": "python", "python": f"{package.name}.hot:labelled"}
    spec = make_spec([{"name": "labels", "mode": "append", "sink": {"type": "memory"}, "query": query}])
    files = [[reading("a1", 1), reading("a2", 2, temperature=25.5)], [reading("b1", 3, "dev-002", 30.0)]]
    result = run(spark, tmp_path, spec, files, spec_dir=include / "streams")
    assert sorted((r["event_id"], r["device_site"], r["label"]) for r in result.rows("labels")) == [
        ("a1", "south", "ok"), ("a2", "south", "hot"), ("b1", "east", "hot")]


def ingested(spark, tmp_path: Path, spec_data: dict, files: list[list[str]], spec_dir: Path | None = None,
             ) -> tuple[Run, list[dict]]:
    """Process the files (available-now): the run and the ingestion's ``ingested`` events."""
    spec = parse_spec(spec_data)
    layout = Layout(spec, tmp_path / "data", spec_dir or default_spec_dir())
    Path(compile_plan(spec, layout).source.landing).mkdir(parents=True)
    for lines in files:
        land(Path(compile_plan(spec, layout).source.landing), spec.source.format, lines)
    events: list[dict] = []
    plan = analysis.resolve_plan(spark, spec, layout)
    queries = flows.run_available_now(spark, plan, on_batch=events.append)
    return Run(spark, spec, plan, {n: q.recentProgress for n, q in queries.items()}), events


def test_a_sql_transform_filters_and_derives_what_the_stream_accepts_and_counts_the_rest(spark, tmp_path: Path) -> None:
    spec = make_spec([
        {"name": "rows", "mode": "append", "sink": {"type": "memory"}, "query": {"type": "passthrough"}},
        {"name": "per_site", "mode": "complete", "sink": {"type": "memory"}, "query": {
            "type": "aggregate", "group_by": ["site"], "aggregates": [{"name": "hottest", "fn": "max", "column": "fahrenheit"}]}},
    ])
    spec["transform"] = {"sql": "SELECT event_id, ts, upper(site) AS site, round(temperature * 9 / 5 + 32, 1) AS fahrenheit "
                                "FROM input WHERE temperature < 30"}
    files = [[reading("a1", 1), reading("a2", 2, temperature=25.5), reading("a2", 2, temperature=25.5)],
             [reading("b1", 3, "dev-002", 30.0), '{"broken']]
    result, events = ingested(spark, tmp_path, spec, files)
    assert sorted((r["event_id"], r["site"], r["fahrenheit"]) for r in result.rows("rows")) == [
        ("a1", "SOUTH", 68.0), ("a2", "SOUTH", 77.9)]
    assert {r["site"]: r["hottest"] for r in result.rows("per_site")} == {"SOUTH": 77.9}
    # input = accepted + filtered + quarantined + duplicates: 5 = 2 + 1 + 1 + 1
    totals = {k: sum(e.get(k, 0) for e in events) for k in ("rows", "transform_in", "accepted", "filtered", "quarantined")}
    assert totals == {"rows": 4, "transform_in": 3, "accepted": 2, "filtered": 1, "quarantined": 1}
    assert result.total("_ingest", "input_rows") == 5


def test_a_python_transform_that_explodes_rows_is_accounted_as_rows_in_and_out(spark, tmp_path: Path) -> None:
    include, package = include_with_package(tmp_path, "split")
    (package / "parts.py").write_text(textwrap.dedent("""
        from pyspark.sql import functions as F

        def device_parts(rows):
            return rows.select("event_id", "ts", F.explode(F.split("device_id", "-")).alias("part"))
        """))
    spec = make_spec([{"name": "parts", "mode": "append", "sink": {"type": "memory"}, "query": {"type": "passthrough"}}])
    spec["transform"] = {"python": f"{package.name}.parts:device_parts"}
    result, events = ingested(spark, tmp_path, spec, [[reading("a1", 1), reading("b1", 3, "dev-002")]],
                              spec_dir=include / "streams")
    assert sorted((r["event_id"], r["part"]) for r in result.rows("parts")) == [
        ("a1", "001"), ("a1", "dev"), ("b1", "002"), ("b1", "dev")]
    assert [(e["transform_in"], e["accepted"]) for e in events if e["rows"]] == [(2, 4)]
    assert all("filtered" not in e for e in events)  # rows in and out, not a filter


def test_the_structured_streaming_guides_word_count_over_a_local_socket(spark, tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.sendall(b"apache spark\nspark streaming\n")
            done.wait(120)  # the socket source reads while the connection is open

    threading.Thread(target=serve, daemon=True).start()
    spec = parse_spec({
        "name": stream_name(), "checkpoint": "checkpoints", "quarantine": {"path": "quarantine"},
        "source": {"type": "spark", "format": "socket", "options": {"host": "127.0.0.1",
                                                                     "port": server.getsockname()[1]},
                   "columns": [{"name": "value", "type": "string", "required": True}]},
        "outputs": [sql_output("counts", "SELECT word, count(*) AS n FROM accepted "
                                         "LATERAL VIEW explode(split(value, ' ')) t AS word GROUP BY word", "complete")],
    })
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    queries = flows.start(spark, analysis.resolve_plan(spark, spec, layout), Trigger(processing_time="200 milliseconds"))
    expected = [("apache", 1), ("spark", 2), ("streaming", 1)]
    try:
        deadline = time.monotonic() + 120
        while True:
            for q in queries.values():
                assert q.exception() is None, q.exception()
            rows = sorted((r["word"], r["n"]) for r in spark.table(query_name(spec.name, "counts")).collect())
            if rows == expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rows == expected
    finally:
        for q in queries.values():
            q.stop()
        done.set()
        server.close()


def test_output_modes_emit_what_the_model_says(spark, tmp_path: Path) -> None:
    per_device = {"type": "aggregate", "group_by": ["device_id"], "aggregates": [{"name": "n", "fn": "count"}]}
    files = [
        [reading("a1", 1, "dev-001"), reading("b1", 2, "dev-002")],
        [reading("a2", 3, "dev-001")],
        [reading("c1", 4, "dev-003")],
    ]
    spec = make_spec([
        window_output("appended", "10 minutes"),
        {"name": "updated", "mode": "update", "sink": {"type": "memory"}, "query": per_device},
        {"name": "completed", "mode": "complete", "sink": {"type": "memory"}, "query": per_device},
    ])
    result = run(spark, tmp_path, spec, files, rounds=True)
    # append: nothing final yet (watermark 23:54 < 00:10)
    assert result.rows("appended") == []
    # update: only the keys a batch changed, with their new value
    assert sorted((r["device_id"], r["n"]) for r in result.rows("updated")) == [
        ("dev-001", 1), ("dev-001", 2), ("dev-002", 1), ("dev-003", 1)]
    assert [p["sink_rows"] for p in result.progress("updated") if p["input_rows"]] == [2, 1, 1]
    # complete: the whole result table at every trigger
    assert [p["sink_rows"] for p in result.progress("completed") if p["input_rows"]] == [2, 2, 3]


def test_append_mode_emits_each_window_once(spark, tmp_path: Path) -> None:
    files = [[reading("a", 1)], [reading("b", 25)], [reading("c", 50)], [reading("d", 80)]]
    result = run(spark, tmp_path, make_spec([window_output("w", "10 minutes")]), files)
    assert sorted(windows(result.rows("w")).items()) == [
        (("00:00", "00:10"), 1), (("00:20", "00:30"), 1), (("00:50", "01:00"), 1)]
    assert len(result.rows("w")) == 3


def test_stream_static_join_enriches_and_keeps_unknown_keys(spark, tmp_path: Path) -> None:
    passthrough = {"name": "rows", "mode": "append", "sink": {"type": "memory"}, "query": {"type": "passthrough"}}
    result = run(spark, tmp_path, make_spec([passthrough]), [[reading("a", 1, "dev-000"), reading("b", 2, "dev-404")]])
    rows = {r["event_id"]: r for r in result.rows("rows")}
    assert rows["a"]["site"] == "north"
    assert rows["b"]["site"] is None
    assert rows["a"]["event_date"].isoformat() == "2026-01-01"


def test_malformed_rows_are_quarantined_and_every_row_is_accounted_for(spark, tmp_path: Path) -> None:
    passthrough = {"name": "rows", "mode": "append", "sink": {"type": "memory"}, "query": {"type": "passthrough"}}
    files = [
        [reading("e1", 1), reading("e2", 12), '{"event_id": "t1", "device_id": ',  # truncated
         '{"event_id":"w1","device_id":"dev-001","ts":"' + at(2) + '","temperature":"hot"}',  # wrong type
         '{"event_id":"m1","device_id":"dev-001","temperature":1.0}',  # missing event time
         b'{"event_id": "u1", \xff\xfe "device_id": "dev-001"}',  # not UTF-8
         reading("e1", 1)],  # duplicate
        [reading("e3", 35)],
        [reading("e4", 41)],
        [reading("e6", 5), '{"event_id":"n1","device_id":null,"ts":"' + at(42) + '"}'],  # late beyond; null key
    ]
    result = run(spark, tmp_path, make_spec([passthrough]), files)
    layout = Layout(result.spec, tmp_path / "data", default_spec_dir())
    quarantine = spark.read.parquet(layout.data("quarantine")).collect()
    reasons = sorted(r["reason"] for r in quarantine)
    assert len(quarantine) == 5
    assert "malformed json record: not a JSON object (truncated, or not JSON)" in reasons
    assert "malformed json record: value does not match the column type: temperature (double)" in reasons
    assert "malformed json record: not valid UTF-8" in reasons
    assert "missing required field(s): ts" in reasons
    assert "missing required field(s): device_id" in reasons
    assert all(r["source_file"].endswith(".json") and r["raw"] for r in quarantine)

    accepted = {r["event_id"] for r in result.rows("rows")}
    assert accepted == {"e1", "e2", "e3", "e4"}
    input_rows = result.total("_ingest", "input_rows")
    assert input_rows == 11
    assert input_rows == (len(accepted) + len(quarantine) + result.total("_ingest", "dropped_by_watermark")
                          + result.total("_ingest", "dropped_duplicates"))
    assert result.total("_ingest", "dropped_by_watermark") == 1
    assert result.total("_ingest", "dropped_duplicates") == 1
    assert result.total("rows", "input_rows") == len(accepted)


def test_a_record_malformed_in_a_column_the_query_does_not_use_is_still_quarantined(spark, tmp_path: Path) -> None:
    per_device = {"type": "aggregate", "group_by": ["device_id"], "aggregates": [{"name": "n", "fn": "count"}]}
    spec = make_spec([{"name": "counts", "mode": "update", "sink": {"type": "memory"}, "query": per_device}])
    bad = '{"event_id":"b1","device_id":"dev-001","ts":"' + at(2) + '","temperature":"hot"}'
    result = run(spark, tmp_path, spec, [[reading("a1", 1), bad]])
    assert [(r["device_id"], r["n"]) for r in result.rows("counts")] == [("dev-001", 1)]
    layout = Layout(result.spec, tmp_path / "data", default_spec_dir())
    assert spark.read.parquet(layout.data("quarantine")).count() == 1


@pytest.mark.parametrize("bad", ["'not json at all", "{}"])
def test_all_malformed_file_loses_nothing(spark, tmp_path: Path, bad: str) -> None:
    passthrough = {"name": "rows", "mode": "append", "sink": {"type": "memory"}, "query": {"type": "passthrough"}}
    result = run(spark, tmp_path, make_spec([passthrough]), [[bad, bad]])
    layout = Layout(result.spec, tmp_path / "data", default_spec_dir())
    assert spark.read.parquet(layout.data("quarantine")).count() == 2
    assert result.rows("rows") == []
