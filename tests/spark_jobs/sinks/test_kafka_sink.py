"""The Kafka sink on a real broker: result rows as JSON records with the headers that let a
consumer drop a replayed batch (the sink is at least once), keys from the sink's columns,
and a missing topic diagnosed before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.frames import accepted_batch
from spark_jobs.runtime.checkpoint import last_batch
from spark_jobs.sinks.kafka import BATCH_HEADER, OUTPUT_HEADER, STREAM_HEADER
from spark_jobs.sources import kafka
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import parse_spec


def spec_data(source_topic: str, sink_topic: str, bootstrap: str) -> dict:
    return {
        "name": "to_kafka",
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": [source_topic], "format": "json",
                   "max_offsets_per_trigger": 2,
                   "columns": [{"name": "id", "type": "string", "required": True},
                               {"name": "device", "type": "string", "required": True},
                               {"name": "ts", "type": "timestamp", "required": True}]},
        "quarantine": {"path": "quarantine"},
        "event_time": {"column": "ts", "watermark": "1 hour"},
        "outputs": [
            {"name": "rows", "query": {"type": "passthrough", "columns": ["id", "device", "ts"]}, "mode": "append",
             "sink": {"type": "kafka", "topic": sink_topic, "bootstrap_servers": bootstrap}},
            {"name": "per_device", "mode": "update",
             "query": {"type": "aggregate", "group_by": ["device"], "aggregates": [{"name": "n", "fn": "count"}]},
             "sink": {"type": "kafka", "topic": sink_topic, "key": ["device"], "bootstrap_servers": bootstrap}},
        ],
        "checkpoint": "checkpoints",
    }


def headers(message) -> dict[str, str]:  # a confluent-kafka Message
    return {k: v.decode() for k, v in message.headers() or []}


def test_rows_become_records_a_consumer_can_take_exactly_once(spark, tmp_path: Path, kafka_broker,
                                                               kafka_topic: str) -> None:
    sink_topic = f"{kafka_topic}-out"
    kafka_broker.create_topic(sink_topic, partitions=2)
    spec = parse_spec(spec_data(kafka_topic, sink_topic, kafka_broker.bootstrap))
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    kafka_broker.produce(kafka_topic, [json.dumps({"id": f"r{i}", "device": f"d{i % 2}",
                                                   "ts": f"2026-01-01T00:0{i}:00Z"}) for i in range(5)], partition=0)
    plan = analysis.analyze(spark, spec, layout)
    flows.run_available_now(spark, plan)
    accepted = sorted(r["id"] for r in accepted_batch(spark, plan.ingestion).collect())

    def taken() -> tuple[list, dict[str, list]]:
        messages = kafka_broker.consume(sink_topic)
        by_output: dict[str, list] = {}
        for m in messages:
            h = headers(m)
            assert h[STREAM_HEADER] == "to_kafka" and h[BATCH_HEADER].isdigit()
            by_output.setdefault(h[OUTPUT_HEADER], []).append(m)
        return messages, by_output

    _, by_output = taken()
    rows = [json.loads(m.value()) for m in by_output["rows"]]
    assert sorted(r["id"] for r in rows) == accepted == ["r0", "r1", "r2", "r3", "r4"]
    assert all(m.key() is None for m in by_output["rows"])
    # update mode: each batch sends the devices it changed, keyed by device; the newest count wins
    newest = {json.loads(m.key())["device"]: json.loads(m.value())["n"]
              for m in sorted(by_output["per_device"], key=lambda m: int(headers(m)[BATCH_HEADER]))}
    assert newest == {"d0": 3, "d1": 2}

    # the rows' last batch replayed (its commit lost after its records were sent): sent again,
    # with the same batch id, which is how a consumer tells the replay and drops it
    checkpoint = Path(plan.checkpoint("rows"))
    replayed = last_batch(checkpoint, "commits")
    (checkpoint / "commits" / str(replayed)).unlink()
    (checkpoint / "commits" / f".{replayed}.crc").unlink(missing_ok=True)
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout))
    _, by_output = taken()
    again = [m for m in by_output["rows"] if headers(m)[BATCH_HEADER] == str(replayed)]
    assert len(by_output["rows"]) > len(accepted) and len(again) >= 2, "the replayed batch was not sent again"
    seen: dict[str, set[str]] = {}
    for m in by_output["rows"]:  # what a consumer does: a batch id it has taken in full is a replay
        seen.setdefault(headers(m)[BATCH_HEADER], set()).add(json.loads(m.value())["id"])
    assert sorted(i for ids in seen.values() for i in ids) == accepted


def test_a_missing_sink_topic_is_diagnosed_before_anything_starts(spark, tmp_path: Path, kafka_broker,
                                                                   kafka_topic: str) -> None:
    spec = parse_spec(spec_data(kafka_topic, "no-such-output-topic", kafka_broker.bootstrap))
    with pytest.raises(kafka.KafkaUnavailable) as err:
        analysis.analyze(spark, spec, Layout(spec, tmp_path / "data", default_spec_dir()))
    assert err.value.field == "outputs[0].sink.topic"
    assert "topic 'no-such-output-topic' does not exist" in str(err.value)
