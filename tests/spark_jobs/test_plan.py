"""The plan: a spec compiled once into what the job needs, every path resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spark_jobs.plan import compile_plan, ddl, query_name, written_by_ingestion
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import (
    load_spec,
    parse_spec,
)
from spark_jobs.stream_spec.models import INGEST_FLOW

SPEC_DIR = default_spec_dir()


@pytest.fixture
def clicks_plan(tmp_path: Path):  # a StreamPlan
    spec = load_spec(SPEC_DIR / "clicks.yaml")
    return compile_plan(spec, Layout(spec, tmp_path / "data", SPEC_DIR))


def test_every_path_is_resolved_once_under_the_data_root_or_the_spec_folder(tmp_path: Path, clicks_plan) -> None:
    data = str((tmp_path / "data").resolve())
    ingestion = clicks_plan.ingestion
    assert clicks_plan.source.kind == "kafka" and clicks_plan.source.kafka.topics == ["clicks"]
    assert clicks_plan.source.landing is None  # a topic, no landing directory
    assert ingestion.checkpoint == f"{data}/checkpoints/clicks/_ingest"
    assert ingestion.accepted_path == f"{data}/accepted/clicks"
    assert ingestion.quarantine == f"{data}/quarantine/clicks"
    assert [j.path for j in ingestion.joins] == [str((SPEC_DIR.parent / "reference" / "pages.csv").resolve())]
    totals = clicks_plan.output("page_totals")
    assert totals.checkpoint == f"{data}/checkpoints/clicks/page_totals"
    assert totals.sink.kind == "table" and totals.sink.url == f"sqlite:///{data}/tables.db"
    per_minute = clicks_plan.output("views_per_minute").sink
    assert (per_minute.kind, per_minute.path) == ("delta", f"{data}/delta/clicks/views_per_minute")


def test_the_derived_facts_of_the_outputs_and_the_ingestion(clicks_plan) -> None:
    ingestion = clicks_plan.ingestion
    assert list(ingestion.accepted_columns) == ["event_id", "user_id", "page", "ts", "duration_ms", "category",
                                                "event_date"]
    assert ingestion.accepted_ddl.startswith("`event_id` string, `user_id` string")
    assert ingestion.partition_by == ["event_date"]
    assert ingestion.deduplicate == ["event_id"]
    assert ingestion.event_time.column == "ts" and ingestion.event_time.max_future_us == 86_400_000_000
    per_minute = clicks_plan.output("views_per_minute")
    assert per_minute.columns == ["window_start", "window_end", "category", "views", "users", "avg_duration_ms"]
    assert per_minute.key == ["window_start", "window_end", "category"]
    assert clicks_plan.output("page_totals").key == ["page"]  # the table's key
    assert clicks_plan.flows == [INGEST_FLOW, "views_per_minute", "page_totals"]
    assert clicks_plan.spark_query_names == {"clicks__ingest": INGEST_FLOW, "clicks__views_per_minute":
                                             "views_per_minute", "clicks__page_totals": "page_totals"}
    with pytest.raises(KeyError, match="no output 'nope'"):
        clicks_plan.output("nope")


def test_only_outputs_that_emit_by_the_watermark_run_batches_without_data(tmp_path: Path, clicks_plan) -> None:
    sensors = load_spec(SPEC_DIR / "sensors.yaml")
    plan = compile_plan(sensors, Layout(sensors, tmp_path / "data", SPEC_DIR))
    emits = {o.name: o.emits_by_watermark for o in [*clicks_plan.outputs, *plan.outputs]}
    assert emits == {"views_per_minute": True, "page_totals": False,  # append windows; a complete-mode table
                     "readings": False, "site_temperature_10m": True, "device_status": False}  # pass-through; update
    windows_updated = parse_spec({**yaml.safe_load((SPEC_DIR / "clicks.yaml").read_text()), "outputs": [
        {"name": "w", "mode": "update", "sink": {"type": "table", "table": "w"},
         "query": {"type": "aggregate", "window": {"duration": "1 minute"}, "group_by": ["page"],
                   "aggregates": [{"name": "n", "fn": "count"}]}}]})
    plan = compile_plan(windows_updated, Layout(windows_updated, tmp_path / "data", SPEC_DIR))
    assert not plan.output("w").emits_by_watermark  # updated rows go out with each batch; the table is validated whole


def test_a_continuous_stream_has_no_ingestion_and_its_outputs_read_the_source(tmp_path: Path) -> None:
    spec = parse_spec(yaml.safe_load("""
        name: rates
        source: {type: rate, rows_per_second: 5}
        outputs:
          - {name: out, query: {type: passthrough}, mode: append, sink: {type: console}}
        trigger: {continuous: 1 second}
        checkpoint: checkpoints/rates
    """))
    plan = compile_plan(spec, Layout(spec, tmp_path, SPEC_DIR))
    assert plan.ingestion is None
    assert plan.flows == ["out"] and plan.output("out").reads_source
    assert plan.output("out").columns == ["timestamp", "value"]


def test_the_plan_is_written_as_json_for_an_operator_to_read(tmp_path: Path, clicks_plan) -> None:
    target = clicks_plan.write(tmp_path / "ckpt" / "_control" / "plan.json")
    data = json.loads(target.read_text())
    assert data["stream"] == "clicks"
    assert data["ingestion"]["accepted_path"] == clicks_plan.ingestion.accepted_path
    assert data["outputs"][1]["query"]["group_by"] == ["page", "category"]
    assert data["ingestion"]["trigger"] == {"processing_time": "5 seconds", "available_now": False}
    assert [p.name for p in target.parent.iterdir()] == ["plan.json"]  # no temporary file left


def test_names_and_schemas(clicks_plan) -> None:
    assert query_name("clicks", INGEST_FLOW) == "clicks__ingest"
    assert clicks_plan.source.reader_ddl == ("`event_id` string, `user_id` string, `page` string, `ts` timestamp, "
                                             "`duration_ms` bigint, `_corrupt_record` string")
    assert ddl({"a": "long", "b b": "timestamp"}) == "`a` bigint, `b b` timestamp"


SERVED = """
    name: meters
    source:
      type: files
      path: landing/meters
      format: json
      columns:
        - {name: id, type: string, required: true}
        - {name: ts, type: timestamp, required: true}
        - {name: kwh, type: double}
    quarantine: {path: quarantine/meters}
    event_time: {column: ts, watermark: 1 minute}
    outputs:
      - {name: totals, query: {type: aggregate, group_by: [id], aggregates: [{name: n, fn: count}]},
         mode: complete, sink: {type: table, table: meters_totals}}
      - {name: raw, query: {type: passthrough}, mode: append,
         sink: {type: parquet, path: sinks/meters/raw, partition_by: [event_date]}}
      - {name: copy, query: {type: passthrough, columns: [id, ts, kwh, event_date]}, mode: append,
         sink: {type: parquet, path: sinks/meters/copy, partition_by: [event_date]}}
    checkpoint: checkpoints/meters
"""


def served_spec(**changes):  # a StreamSpec
    data = yaml.safe_load(SERVED)
    for path, value in changes.items():
        target = data
        *parents, last = path.split(".")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[last] = value
    return parse_spec(data)


def test_a_passthrough_of_the_accepted_rows_is_written_by_the_ingestion(tmp_path: Path) -> None:
    spec = served_spec()
    assert written_by_ingestion(spec).name == "raw"  # the first that qualifies; copy qualifies too, but only one is written so
    plan = compile_plan(spec, Layout(spec, tmp_path / "data", SPEC_DIR))
    data = str((tmp_path / "data").resolve())
    raw = plan.output("raw")
    assert raw.written_by_ingestion and raw.checkpoint is None
    assert plan.ingestion.accepted_path == raw.sink.path == f"{data}/sinks/meters/raw"  # written once, by the ingestion
    assert plan.ingestion.partition_by == raw.sink.partition_by == ["event_date"]
    assert not plan.output("copy").written_by_ingestion and not plan.output("totals").written_by_ingestion
    assert plan.output("copy").checkpoint == f"{data}/checkpoints/meters/copy"
    assert plan.flows == [INGEST_FLOW, "totals", "copy"]
    assert plan.spark_query_names == {"meters__ingest": INGEST_FLOW, "meters__totals": "totals",
                                      "meters__copy": "copy"}
    shown = json.loads(plan.to_json())
    assert [(o["name"], o["written_by_ingestion"]) for o in shown["outputs"]] == [
        ("totals", False), ("raw", True), ("copy", False)]
    assert shown["ingestion"]["accepted_path"] == shown["outputs"][1]["sink"]["path"]


@pytest.mark.parametrize("changes", [
    {"outputs.1.query": {"type": "passthrough", "columns": ["id", "ts", "event_date"]}},  # fewer columns
    {"outputs.1.query": {"type": "passthrough", "columns": ["ts", "id", "kwh", "event_date"]}},  # another order
    {"outputs.1.sink": {"type": "parquet", "path": "sinks/meters/raw"}},  # not partitioned like the accepted rows
    {"outputs.1.sink": {"type": "parquet", "path": "sinks/meters/raw", "partition_by": ["id"]}},
    {"outputs.1.sink": {"type": "console"}},
])
def test_an_output_that_is_not_exactly_the_accepted_rows_keeps_its_own_query(tmp_path: Path, changes: dict) -> None:
    spec = served_spec(**changes)
    assert written_by_ingestion(spec).name == "copy"  # raw no longer qualifies; the next one that does is written so
    plan = compile_plan(spec, Layout(spec, tmp_path / "data", SPEC_DIR))
    assert plan.flows == [INGEST_FLOW, "totals", "raw"]
    assert plan.output("raw").checkpoint == str((tmp_path / "data" / "checkpoints" / "meters" / "raw").resolve())


def test_without_an_output_the_ingestion_writes_the_accepted_rows_have_their_own_table(tmp_path: Path, clicks_plan) -> None:
    data = yaml.safe_load(SERVED)
    data["outputs"] = data["outputs"][:1]
    spec = parse_spec(data)
    plan = compile_plan(spec, Layout(spec, tmp_path))
    assert written_by_ingestion(spec) is None and plan.flows == [INGEST_FLOW, "totals"]
    assert plan.accepted_path == str(tmp_path / "accepted" / "meters")
    assert not any(o.written_by_ingestion for o in clicks_plan.outputs)


def test_without_event_time_the_output_the_ingestion_writes_is_the_unpartitioned_one(tmp_path: Path) -> None:
    data = yaml.safe_load(SERVED)
    del data["event_time"]
    data["outputs"] = [{"name": "dated", "query": {"type": "passthrough"}, "mode": "append",
                        "sink": {"type": "parquet", "path": "sinks/meters/dated", "partition_by": ["id"]}},
                       {"name": "plain", "query": {"type": "passthrough"}, "mode": "append",
                        "sink": {"type": "parquet", "path": "sinks/meters/plain"}}]
    spec = parse_spec(data)
    assert written_by_ingestion(spec).name == "plain"
    assert compile_plan(spec, Layout(spec, tmp_path, SPEC_DIR)).ingestion.partition_by == []


def test_the_sensors_readings_are_written_by_the_ingestion(tmp_path: Path) -> None:
    spec = load_spec(SPEC_DIR / "sensors.yaml")
    plan = compile_plan(spec, Layout(spec, tmp_path, SPEC_DIR))
    assert written_by_ingestion(spec).name == "readings"
    assert plan.flows == [INGEST_FLOW, "site_temperature_10m", "device_status"]
    assert plan.ingestion.accepted_path == str(tmp_path / "sinks" / "sensors" / "readings")


def test_an_application_s_plan_names_its_queries_and_their_checkpoints(tmp_path: Path) -> None:
    spec = parse_spec({"name": "counts", "checkpoint": "checkpoints/counts", "application": {
        "path": "applications/rate_counts.py", "args": ["--output", "sinks/counts"], "queries": ["counts", "totals"]}})
    plan = compile_plan(spec, Layout(spec, tmp_path, SPEC_DIR))
    assert plan.source is None and plan.ingestion is None and plan.outputs == []
    assert plan.flows == ["counts", "totals"]
    assert plan.checkpoint("totals") == str(tmp_path / "checkpoints" / "counts" / "totals")
    assert plan.checkpoint_root == str(tmp_path / "checkpoints" / "counts")
    assert plan.application.file == str((SPEC_DIR.parent / "applications" / "rate_counts.py").resolve())
    with pytest.raises(KeyError, match=r"stream 'counts' has no flow 'other'; it has \['counts', 'totals'\]"):
        plan.checkpoint("other")


def test_the_plan_s_json_keeps_no_database_password(tmp_path: Path, clicks_plan, monkeypatch) -> None:
    from dataclasses import replace

    from spark_jobs.plan import TableDataset

    secret = "postgresql://streams:hunter2-s3cret@db.example:5432/streams"
    outputs = [replace(o, sink=TableDataset(secret, o.sink.table)) if isinstance(o.sink, TableDataset) else o
               for o in clicks_plan.outputs]
    assert any(isinstance(o.sink, TableDataset) for o in outputs)
    text = replace(clicks_plan, outputs=outputs).write(tmp_path / "plan.json").read_text()
    assert "hunter2" not in text and "postgresql://streams:***@db.example:5432/streams" in text
