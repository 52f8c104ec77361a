"""Exactly once from a Kafka topic through real spark-submit runs killed with SIGKILL.

The sensors stream, reading a three-partition topic of a real broker instead of files, is
fed a fixed input (valid readings, repeated ones, malformed, empty and incomplete
records), run on a one-second trigger at most 60 records a micro-batch, killed with
SIGKILL three times at random moments, and caught up with an available-now run. The
accepted rows must then be exactly the valid distinct readings, the quarantine exactly
the bad records (each once, by its topic/partition@offset position), every output must
equal its query over the accepted rows (a Parquet sink, an append-mode window, an
update-mode and a complete-mode table), and no two drivers may have held the stream.
"""

from __future__ import annotations

import json
import random
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from airflow_harness import example_spec, include_with, one_driver_at_a_time
from test_exactly_once import Driver, wait_for

from spark_jobs.frames import accepted_batch
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import last_batch
from spark_jobs.sources import kafka
from spark_jobs.spec.layout import Layout
from spark_jobs.spec.loading import load_spec
from spark_jobs.spec.models import INGEST_QUERY
from spark_jobs.testdata import verify

pytestmark = pytest.mark.e2e

READINGS = 1200
T0 = datetime(2026, 1, 1)
DEVICES = [f"dev-{i:03d}" for i in range(6)]


def records(seed: int = 7) -> tuple[list[list[str | None]], set[str], int]:
    """Per partition, the values to produce; the event ids to accept; how many records are bad."""
    rng = random.Random(seed)
    partitions: list[list[str | None]] = [[], [], []]
    accepted: set[str] = set()
    bad = 0
    for i in range(READINGS):
        part = partitions[i % 3]
        reading = {"event_id": f"e{i}", "device_id": rng.choice(DEVICES),
                   "ts": (T0 + timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   "temperature": round(rng.uniform(-5, 35), 1), "humidity": 50.0, "status": rng.choice(["ok", "warn"])}
        part.append(json.dumps(reading))
        accepted.add(reading["event_id"])
        if i % 20 == 0:  # sent again: a duplicate within the watermark
            part.append(json.dumps(reading))
        if i % 37 == 0:
            part.append(rng.choice(["{not json", "", None, '["a list"]']))
            bad += 1
        if i % 53 == 0:  # temperature is required
            part.append(json.dumps({k: v for k, v in reading.items() if k != "temperature"} | {"event_id": f"x{i}"}))
            bad += 1
    return partitions, accepted, bad


def test_sigkills_lose_and_repeat_no_record(spark, tmp_path: Path, kafka_broker, kafka_topic: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    spec_data = example_spec("sensors")
    spec_data["source"] = {"type": "kafka", "bootstrap_servers": "${E2E_KAFKA_SERVERS}", "topics": [kafka_topic],
                           "format": "json", "columns": spec_data["source"]["columns"], "max_offsets_per_trigger": 60}
    spec_data["outputs"].append({"name": "site_totals", "mode": "complete",
                                 "query": {"type": "aggregate", "group_by": ["site"],
                                           "aggregates": [{"name": "readings", "fn": "count"}]},
                                 "sink": {"type": "table", "table": "sensors_site_totals"}})
    spec_path = include_with(tmp_path / "include", spec_data) / "sensors.yaml"
    data_root, logs = tmp_path / "data", tmp_path / "logs"
    logs.mkdir()
    spec = load_spec(spec_path)
    layout = Layout(spec, data_root, spec_path.parent)
    plan = compile_plan(spec, layout)
    ingestion = plan.checkpoint(INGEST_QUERY)
    monkeypatch.setenv("E2E_KAFKA_SERVERS", kafka_broker.bootstrap)  # the drivers read ${E2E_KAFKA_SERVERS}

    partitions, expected, bad = records()
    for p, values in enumerate(partitions):
        kafka_broker.produce(kafka_topic, values, partition=p)
    total = sum(len(v) for v in partitions)

    drivers: list[Driver] = []
    rng = random.Random(3)
    try:
        for kill in range(3):
            driver = Driver(spec_path, data_root, logs, "--processing-time", "1 second")
            drivers.append(driver)
            target = (last_batch(ingestion, "commits") or 0) + 3 + kill  # a replayed batch first, then new ones
            wait_for(lambda t=target: (last_batch(ingestion, "commits") or 0) >= t, f"batch {target}", driver.proc)
            time.sleep(rng.uniform(0.0, 1.5))  # the kill's moment itself, drawn at random: mid-batch or between
            driver.kill()
        behind = kafka.lag(plan.source.kafka, ingestion)
        assert behind.total > 0, "the stream caught up before the last kill: the test proves nothing"
        last = Driver(spec_path, data_root, logs, "--trigger", "available-now")
        drivers.append(last)
        assert last.wait() == 0, last.output()[-3000:]
    finally:
        for d in drivers:
            if d.proc.poll() is None:
                d.kill()

    assert kafka.lag(plan.source.kafka, ingestion).total == 0
    assert sum(kafka.committed_offsets(ingestion).values()) == total
    ids = [r["event_id"] for r in accepted_batch(spark, plan.ingestion).collect()]
    assert len(ids) == len(set(ids)), "a reading was accepted twice"
    assert set(ids) == expected
    quarantined = [r["source_file"] for r in spark.read.parquet(layout.data(spec.quarantine.path)).collect()]
    assert len(quarantined) == len(set(quarantined)) == bad, "a bad record was lost or quarantined twice"
    assert all(q.startswith(f"{kafka_topic}/") and "@" in q for q in quarantined)
    reports = verify.agreement(spark, spec, layout)
    assert [r.name for r in reports] == ["readings", "site_temperature_10m", "device_status", "site_totals"]
    assert all(r.ok for r in reports), "\n".join(r.describe() for r in reports)
    assert all(r.actual > 0 for r in reports)
    one_driver_at_a_time(layout)
