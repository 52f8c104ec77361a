"""The plan: a spec compiled once into what the job needs, every path resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from spark_jobs.plan import compile_plan, ddl, query_name
from spark_jobs.spec import INGEST_QUERY, Layout, default_spec_dir, load_spec, parse_spec

SPEC_DIR = default_spec_dir()


@pytest.fixture
def clicks_plan(tmp_path: Path):  # noqa: ANN201 - a StreamPlan
    spec = load_spec(SPEC_DIR / "clicks.yaml")
    return compile_plan(spec, Layout(spec, tmp_path / "data", SPEC_DIR))


def test_every_path_is_resolved_once_under_the_data_root_or_the_spec_folder(tmp_path: Path, clicks_plan) -> None:
    data = str((tmp_path / "data").resolve())
    ingestion = clicks_plan.ingestion
    assert clicks_plan.source.landing == f"{data}/landing/clicks"
    assert ingestion.checkpoint == f"{data}/checkpoints/clicks/_ingest"
    assert ingestion.accepted == f"{data}/accepted/clicks"
    assert ingestion.quarantine == f"{data}/quarantine/clicks"
    assert [j.path for j in ingestion.joins] == [str((SPEC_DIR.parent / "reference" / "pages.csv").resolve())]
    totals = clicks_plan.output("page_totals")
    assert totals.checkpoint == f"{data}/checkpoints/clicks/page_totals"
    assert totals.sink.kind == "table" and totals.sink.url == f"sqlite:///{data}/tables.db"
    assert clicks_plan.output("views_per_minute").sink.path == f"{data}/sinks/clicks/views_per_minute"


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
    assert clicks_plan.queries == [INGEST_QUERY, "views_per_minute", "page_totals"]
    assert clicks_plan.spark_query_names == {"clicks__ingest": INGEST_QUERY, "clicks__views_per_minute":
                                             "views_per_minute", "clicks__page_totals": "page_totals"}
    with pytest.raises(KeyError, match="no output 'nope'"):
        clicks_plan.output("nope")


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
    assert plan.queries == ["out"] and plan.output("out").reads_source
    assert plan.output("out").columns == ["timestamp", "value"]


def test_the_plan_is_written_as_json_for_an_operator_to_read(tmp_path: Path, clicks_plan) -> None:
    target = clicks_plan.write(tmp_path / "ckpt" / "_control" / "plan.json")
    data = json.loads(target.read_text())
    assert data["stream"] == "clicks"
    assert data["ingestion"]["accepted"] == clicks_plan.ingestion.accepted
    assert data["outputs"][1]["query"]["group_by"] == ["page", "category"]
    assert data["ingestion"]["trigger"] == {"processing_time": "5 seconds", "available_now": False}
    assert [p.name for p in target.parent.iterdir()] == ["plan.json"]  # no temporary file left


def test_names_and_schemas(clicks_plan) -> None:
    assert query_name("clicks", INGEST_QUERY) == "clicks__ingest"
    assert clicks_plan.source.reader_ddl == ("`event_id` string, `user_id` string, `page` string, `ts` timestamp, "
                                             "`duration_ms` bigint, `_corrupt_record` string")
    assert ddl({"a": "long", "b b": "timestamp"}) == "`a` bigint, `b b` timestamp"
