"""The per-trigger limit sizing by lag set is what a driver's ingestion takes, from its next start on."""

from __future__ import annotations

import json
from pathlib import Path

from edited_streams import start
from examples import example_spec, include_with

from spark_jobs.plan import compile_plan
from spark_jobs.runtime import rate_limit
from spark_jobs.runtime.checkpoint import batch_ids, processed_files
from spark_jobs.runtime.progress import read_events
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import INGEST_FLOW


def test_a_driver_takes_the_limit_sizing_set_and_keeps_the_spec_s_own_in_its_plans(spark, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    data = example_spec("sensors")
    data["execution"] = {"sizing": {"catch_up": "1 minute", "min_per_trigger": 1, "min_trigger": "1 second"}}
    spec_file = include_with(tmp_path / "include", data) / "sensors.yaml"
    layout = Layout(load_spec(spec_file), tmp_path / "data", spec_file.parent)
    plan = compile_plan(load_spec(spec_file), layout)
    landing = Path(plan.source.landing)
    landing.mkdir(parents=True)
    for f in range(3):
        (landing / f"part-{f}.json").write_text("".join(json.dumps(
            {"event_id": f"e{f}-{i}", "device_id": "dev-001", "ts": f"2026-01-01T00:{10 * f + i:02d}:00Z",
             "temperature": 20.0 + i}) + "\n" for i in range(4)), encoding="utf-8")
    layout.lease_dir.mkdir(parents=True)
    rate_limit.write(layout, 1, "files", "a test", 2.0)  # the spec says 10 files a micro-batch, every 5 seconds

    assert start(spark, spec_file, tmp_path / "data", monkeypatch) == 0
    ingestion = plan.checkpoint(INGEST_FLOW)
    taken = [len(processed_files(ingestion, through_batch=b)) - len(processed_files(ingestion, through_batch=b - 1))
             for b in batch_ids(ingestion, "commits")]  # a batch without data may follow, moving the watermark
    assert taken[:3] == [1, 1, 1] and sum(taken) == 3  # one file a micro-batch, not all three in one
    started = [e for e in read_events(layout.events_file) if e.get("event") == "driver_started"]
    assert (started[-1]["per_trigger"], started[-1]["processing_time"]) == (1, "2000 milliseconds")
    # the plan kept for the next start's verdicts is the spec's (a limit sizing set is no change of the spec)
    kept = json.loads(sorted(layout.plans_dir.glob("*.json"))[-1].read_text())
    assert kept["plan"]["source"]["max_files_per_trigger"] == 10 and kept["plan"]["trigger"]["processing_time"] == "5 seconds"
