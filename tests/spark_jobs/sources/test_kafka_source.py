"""A Kafka source on a real broker: records parsed once under the files' rules, every one
decided and placed (malformed ones quarantined with their position), resumed from the
checkpoint's offsets without a record twice, the broker and topics probed, the lag read
from the checkpoint against the broker's end offsets."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from quarantine_files import pyarrow_rows  # tests/ is on sys.path (rootdir conftest)

from runner.testdata import verify
from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.frames import accepted_batch
from spark_jobs.plan import QUARANTINE_DDL, KafkaPlan, compile_plan
from spark_jobs.sources import kafka
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import SpecError

T0 = datetime(2026, 1, 1)
_names = itertools.count()
PASSTHROUGH = {"name": "rows", "mode": "append", "query": {"type": "passthrough"},
               "sink": {"type": "parquet", "path": "sinks/rows", "partition_by": ["event_date"]}}
WINDOWS = {"name": "windows", "mode": "append", "sink": {"type": "parquet", "path": "sinks/windows"},
           "query": {"type": "aggregate", "window": {"duration": "10 minutes"}, "group_by": ["device_id"],
                     "aggregates": [{"name": "n", "fn": "count"}]}}
PER_DEVICE = {"name": "per_device", "mode": "update", "sink": {"type": "table", "table": "per_device"},
              "query": {"type": "aggregate", "group_by": ["device_id"], "aggregates": [{"name": "n", "fn": "count"}]}}


def reading(event_id: str, minute: float, device: str = "dev-001") -> str:
    ts = (T0 + timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return json.dumps({"event_id": event_id, "device_id": device, "ts": ts, "temperature": 20.0})


def kafka_spec(topic: str, bootstrap: str, outputs: list[dict], **source: object) -> dict:
    columns = [{"name": "event_id", "type": "string", "required": True},
               {"name": "device_id", "type": "string", "required": True},
               {"name": "ts", "type": "timestamp", "required": True},
               {"name": "temperature", "type": "double"}]
    return {
        "name": f"k{next(_names)}",
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": [topic], "format": "json",
                   "columns": columns, **source},
        "quarantine": {"path": "quarantine"},
        "enrich": [{"name": "devices", "path": "reference/devices.csv", "key": ["device_id"],
                    "columns": [{"name": "device_id", "type": "string"}, {"name": "site", "type": "string"}]}],
        "event_time": {"column": "ts", "watermark": "10 minutes"},
        "deduplicate": {"key": ["event_id"]},
        "outputs": outputs,
        "checkpoint": "checkpoints",
    }


def setup(tmp_path: Path, data: dict) -> tuple:
    spec = parse_spec(data)
    return spec, Layout(spec, tmp_path / "data", default_spec_dir())


def quarantine(spark, layout: Layout) -> list[tuple[str, str, str | None]]:
    return sorted((r["source_file"], r["reason"], r["raw"]) for r in spark.read.parquet(layout.data("quarantine")).collect())


def test_records_are_parsed_once_quarantined_with_their_position_and_resumed_exactly_once(
        spark, tmp_path: Path, kafka_broker, kafka_topic: str) -> None:
    topic = kafka_topic
    kafka_broker.produce(topic, [reading("e1", 1), reading("e2", 12), "not json", "", None], partition=0)
    kafka_broker.produce(topic, [reading("e3", 35), reading("e3", 35),
                                 b'{"event_id": "e9", "device_id": "dev-\xff", "ts": "2026-01-01T00:20:00Z"}'],
                         partition=1)
    kafka_broker.produce(topic, [reading("e4", 41), json.dumps({"event_id": "e8", "ts": "2026-01-01T00:21:00Z"})],
                         partition=2)
    spec, layout = setup(tmp_path, kafka_spec(topic, "${TEST_KAFKA_SERVERS}", [PASSTHROUGH, WINDOWS, PER_DEVICE]))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TEST_KAFKA_SERVERS", kafka_broker.bootstrap)
        plan = analysis.analyze(spark, spec, layout)
        events: list[dict] = []
        flows.run_available_now(spark, plan, on_batch=events.append)

        ingested = [e for e in events if e["event"] == "ingested"]
        totals = {k: sum(e[k] for e in ingested) for k in ("rows", "accepted", "quarantined", "late")}
        assert totals == {"rows": 9, "accepted": 4, "quarantined": 5, "late": 0}  # the repeated e3: a duplicate
        assert sorted(r["event_id"] for r in accepted_batch(spark, plan.ingestion).collect()) == ["e1", "e2", "e3", "e4"]
        rejected = quarantine(spark, layout)
        assert [(pos, reason) for pos, reason, _ in rejected] == [
            (f"{topic}/0@2", "malformed json record: not a JSON object (truncated, or not JSON)"),
            (f"{topic}/0@3", "malformed json record: empty record"),
            (f"{topic}/0@4", "malformed json record: empty record"),
            (f"{topic}/1@2", "malformed json record: not valid UTF-8"),
            (f"{topic}/2@1", "missing required field(s): device_id"),
        ]
        assert rejected[0][2] == "not json"
        reports = verify.agreement(spark, plan)
        assert all(r.ok for r in reports), [r.describe() for r in reports]

        # caught up: nothing behind on any partition
        assert plan.source.kafka is not None
        lag = kafka.lag(plan.source.kafka, plan.ingestion.checkpoint)
        assert lag.by_partition() == {f"{topic}/0": 0, f"{topic}/1": 0, f"{topic}/2": 0}
        assert kafka.committed_offsets(plan.ingestion.checkpoint) == {(topic, 0): 5, (topic, 1): 3, (topic, 2): 2}

        # new records: the lag counts them; a second run takes exactly them
        kafka_broker.produce(topic, [reading("e5", 50), reading("e1", 1)], partition=1)
        assert kafka.lag(plan.source.kafka, plan.ingestion.checkpoint).by_partition()[f"{topic}/1"] == 2
        flows.run_available_now(spark, analysis.analyze(spark, spec, layout))
        assert kafka.lag(plan.source.kafka, plan.ingestion.checkpoint).total == 0
    accepted = sorted(r["event_id"] for r in accepted_batch(spark, plan.ingestion).collect())
    assert accepted == ["e1", "e2", "e3", "e4", "e5"]  # e1 again: a duplicate within the watermark
    assert len(quarantine(spark, layout)) == 5
    assert all(r.ok for r in verify.agreement(spark, plan))


#: Values no parser can read, whatever the format: each is quarantined, and must reach the
#: quarantine readable by any Parquet reader with its bytes kept exactly.
UNREADABLE = {
    "lone continuation byte": b"\x80",
    "truncated multibyte": b"caf\xc3",
    "overlong encoding": b"\xc0\xaf",
    "0xff": b"\xff",
    "surrogate": b"\xed\xa0\x80",
    "beyond U+10FFFF": b"\xf4\x90\x80\x80",
    "Latin-1": "café".encode("latin-1"),
    "UTF-16": "{}".encode("utf-16"),
    "NUL byte": b"\x00",
    "empty": b"",
    "blank": b" \t ",
    "tombstone": None,
    "not JSON": b"not json",
    "huge, not UTF-8": b"\xfe" + b"x\xff" * 150_000,
}


def bad_records(fmt: str) -> dict[str, bytes]:
    """Records of ``fmt`` with one thing wrong: invalid bytes inside a value, a NUL byte in
    one, a required field missing (the parser reads it; a rule rejects it)."""
    if fmt == "csv":
        return {"in a value": b"b1,dev-\xe2\x82,2026-01-01T00:02:00.000Z,1.0",
                "NUL in a value": b"b2,dev-\x00,2026-01-01T00:02:00.000Z,nan\x00",
                "missing required": b"b3,,2026-01-01T00:02:00.000Z,1.0"}
    return {"in a value": b'{"event_id": "b1", "device_id": "dev-\xe2\x82", "ts": "2026-01-01T00:02:00.000Z"}',
            "NUL in a value": b'{"event_id": "b2", "device_id": "dev-\x00", "ts": "2026-01-01T00:02:00.000Z"}',
            "missing required": b'{"event_id": "b3", "ts": "2026-01-01T00:02:00.000Z"}'}


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_quarantined_value_is_readable_by_any_parquet_reader_and_keeps_its_bytes(
        spark, tmp_path: Path, kafka_broker, kafka_topic: str, fmt: str) -> None:
    good = (reading("g1", 1) if fmt == "json" else "g1,dev-001,2026-01-01T00:01:00.000Z,20.0").encode()
    values = {"good": good, **UNREADABLE, **bad_records(fmt)}
    names = list(values)
    kafka_broker.produce(kafka_topic, list(values.values()), partition=0)
    spec, layout = setup(tmp_path, kafka_spec(kafka_topic, kafka_broker.bootstrap, [PASSTHROUGH], format=fmt))
    events: list[dict] = []
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout), on_batch=events.append)

    ingested = [e for e in events if e["event"] == "ingested"]
    assert {k: sum(e[k] for e in ingested) for k in ("rows", "accepted", "quarantined", "late", "unmatched")} == {
        "rows": len(values), "accepted": 1, "quarantined": len(values) - 1, "late": 0, "unmatched": 0}
    rows = pyarrow_rows(layout.data("quarantine"))  # no UnicodeDecodeError
    by_name = {names[int(r["source_file"].rsplit("@", 1)[1])]: r for r in rows}
    assert sorted(by_name) == sorted(n for n in names if n != "good")
    for name, row in by_name.items():
        value = values[name]
        assert row["raw_bytes"] == value, name  # exactly as produced; null for a tombstone only
        if row["reason"].startswith(f"malformed {fmt} record: "):  # the parser's: the text as it came, made valid
            assert row["raw"] == (value or b"").decode("utf-8", "replace"), name
    not_utf8 = [n for n, v in values.items() if v is not None and not _is_utf8(v)]
    assert {n for n, r in by_name.items() if r["reason"] == f"malformed {fmt} record: not valid UTF-8"} == set(not_utf8)
    assert by_name["missing required"]["reason"] == "missing required field(s): device_id"
    assert json.loads(by_name["missing required"]["raw"])["event_id"] == "b3"  # the values the parser read
    # Spark reads the same rows
    assert sorted(seen(r) for r in spark_rows(spark, layout)) == sorted(seen(r) for r in rows)


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def spark_rows(spark, layout: Layout) -> list[dict]:
    return [r.asDict() for r in spark.read.schema(QUARANTINE_DDL).parquet(layout.data("quarantine")).collect()]


def seen(row: dict) -> tuple:
    """A quarantine row's content (Spark gives binary as a bytearray, pyarrow as bytes)."""
    raw_bytes = None if row["raw_bytes"] is None else bytes(row["raw_bytes"])
    return row["source_file"], row["reason"], row["raw"], raw_bytes


def test_csv_values_with_the_record_timestamp_as_event_time(spark, tmp_path: Path, kafka_broker,
                                                            kafka_topic: str) -> None:
    columns = [{"name": "event_id", "type": "string", "required": True},
               {"name": "device_id", "type": "string", "required": True},
               {"name": "temperature", "type": "double"},
               {"name": "arrived", "type": "timestamp"}]
    data = kafka_spec(kafka_topic, kafka_broker.bootstrap, [PASSTHROUGH], format="csv", columns=columns,
                      record_timestamp="arrived", max_offsets_per_trigger=2)
    data["event_time"] = {"column": "arrived", "watermark": "1 hour"}
    spec, layout = setup(tmp_path, data)
    kafka_broker.produce(kafka_topic, ["a1,dev-001,20.5", "a2,dev-002,x", "a3,dev-001", "a4,dev-001,1.0,extra",
                                       "a5,dev-000,"], partition=0)
    events: list[dict] = []
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout), on_batch=events.append)
    # at most two records per micro-batch; a batch without records may follow, to move the
    # watermark, when the last records' timestamps (their arrival) differ by a millisecond
    ingested = [e for e in events if e["event"] == "ingested" and e["rows"]]
    assert len(ingested) == 3
    rows = {r["event_id"]: r for r in spark.read.parquet(layout.data("sinks/rows")).collect()}
    assert sorted(rows) == ["a1", "a5"]  # an empty last field is a null, as in a CSV file
    assert rows["a1"]["temperature"] == 20.5 and rows["a5"]["temperature"] is None
    assert all(r["arrived"] is not None and r["event_date"] == r["arrived"].date() for r in rows.values())
    assert [(pos, reason) for pos, reason, _ in quarantine(spark, layout)] == [
        (f"{kafka_topic}/0@1", "malformed csv record: value does not match the column type: temperature (double)"),
        (f"{kafka_topic}/0@2", "malformed csv record: fewer fields than the 3 declared columns"),
        (f"{kafka_topic}/0@3", "malformed csv record: more fields than the 3 declared columns")]


def test_a_stream_reports_records_behind_in_its_progress(spark, tmp_path: Path, kafka_broker,
                                                         kafka_topic: str) -> None:
    spec, layout = setup(tmp_path, kafka_spec(kafka_topic, kafka_broker.bootstrap, [PASSTHROUGH],
                                              max_offsets_per_trigger=3))
    kafka_broker.produce(kafka_topic, [reading(f"e{i}", i) for i in range(9)], partition=0)
    plan = analysis.analyze(spark, spec, layout)
    queries = flows.run_available_now(spark, plan)
    metrics = [s.metrics for p in queries["_ingest"].recentProgress for s in p.sources if s.metrics]
    assert metrics and int(metrics[0]["maxOffsetsBehindLatest"]) == 6  # 3 of 9 taken by the first batch
    assert int(metrics[-1]["maxOffsetsBehindLatest"]) == 0


def test_a_missing_topic_or_broker_is_diagnosed_not_a_bad_spec(spark, tmp_path: Path, kafka_broker) -> None:
    spec, layout = setup(tmp_path, kafka_spec("no-such-topic", kafka_broker.bootstrap, [PASSTHROUGH]))
    with pytest.raises(kafka.KafkaUnavailable) as err:
        analysis.analyze(spark, spec, layout)
    assert err.value.field == "source.topics[0]"
    assert f"topic 'no-such-topic' does not exist on {kafka_broker.bootstrap}" in str(err.value)

    silent = KafkaPlan("127.0.0.1:9", ["t"], None, "earliest", None, True, None)
    with pytest.raises(kafka.KafkaUnavailable) as err:
        kafka.probe(silent, timeout=2)
    assert err.value.field == "source.bootstrap_servers"
    assert "no Kafka broker answered at 127.0.0.1:9 within 2s" in str(err.value)

    spec, layout = setup(tmp_path, kafka_spec("t", "${UNSET_KAFKA_SERVERS_FOR_TEST}", [PASSTHROUGH]))
    with pytest.raises(SpecError) as bad:
        analysis.analyze(spark, spec, layout)
    assert bad.value.problems == [("source.bootstrap_servers", "environment variable(s) "
                                   "['UNSET_KAFKA_SERVERS_FOR_TEST'] not set (the spec says "
                                   "'${UNSET_KAFKA_SERVERS_FOR_TEST}')")]


def test_lag_counts_a_partition_added_while_running_from_its_start(spark, tmp_path: Path, kafka_broker,
                                                                   kafka_topic: str) -> None:
    spec, layout = setup(tmp_path, kafka_spec(kafka_topic, kafka_broker.bootstrap, [PASSTHROUGH]))
    kafka_broker.produce(kafka_topic, [reading("e1", 1)], partition=0)
    plan = analysis.analyze(spark, spec, layout)
    flows.run_available_now(spark, plan)
    kafka_broker.add_partitions(kafka_topic, 4)
    kafka_broker.produce(kafka_topic, [reading("e2", 2), reading("e3", 3)], partition=3)
    lag = kafka.lag(plan.source.kafka, compile_plan(spec, layout).ingestion.checkpoint)
    assert lag.new_partitions == [(kafka_topic, 3)]
    assert lag.by_partition()[f"{kafka_topic}/3"] == 2 and lag.total == 2


def test_records_deleted_before_they_were_read_block_the_stream_until_an_operator_decides(
        spark, tmp_path: Path, kafka_broker, kafka_topic: str) -> None:
    from streamops.health import Status, assess

    data = kafka_spec(kafka_topic, kafka_broker.bootstrap, [PASSTHROUGH])
    spec, layout = setup(tmp_path, data)
    kafka_broker.produce(kafka_topic, [reading("e1", 1), reading("e2", 2)], partition=0)
    flows.run_available_now(spark, analysis.analyze(spark, spec, layout))
    kafka_broker.produce(kafka_topic, [reading(f"e{i}", i) for i in range(3, 8)], partition=0)  # offsets 2 to 6
    kafka_broker.delete_records(kafka_topic, 0, before=5)  # retention, while the stream was stopped: e3 to e5

    plan = compile_plan(spec, layout)
    behind = kafka.lag(plan.source.kafka, plan.ingestion.checkpoint)
    assert behind.lost == {(kafka_topic, 0): (2, 5)} and behind.total == 2
    health = assess(compile_plan(spec, layout), layout)
    assert health.status == Status.BLOCKED, health.summary()
    assert f"offsets 2 to 4 of {kafka_topic}/0" in health.reason and "fail_on_data_loss: false" in health.reason
    with pytest.raises(Exception, match="data may have been lost"):  # Spark refuses to skip them too
        flows.run_available_now(spark, analysis.analyze(spark, spec, layout))
    assert accepted_ids(spark, plan) == ["e1", "e2"]

    # the operator accepts the loss: the stream reads on from the first record still there
    lenient = parse_spec(data | {"source": data["source"] | {"fail_on_data_loss": False}})
    assert "skipped (source.fail_on_data_loss: false)" in " ".join(assess(compile_plan(lenient, layout), layout).notes)
    flows.run_available_now(spark, analysis.analyze(spark, lenient, layout))
    assert accepted_ids(spark, plan) == ["e1", "e2", "e6", "e7"]
    assert assess(compile_plan(lenient, layout), layout).status != Status.BLOCKED and kafka.lag(plan.source.kafka,
                                                                       plan.ingestion.checkpoint).lost == {}


def accepted_ids(spark, plan) -> list[str]:
    return sorted(r["event_id"] for r in accepted_batch(spark, plan.ingestion).collect())


def test_a_reprocess_reads_the_topic_again_from_its_starting_offsets_into_new_tables(
        spark, tmp_path: Path, kafka_broker, kafka_topic: str, monkeypatch, caplog) -> None:
    """The deduplication key changed under a Kafka stream (a ``reprocess``): its upgrade reads the
    topic again from the spec's starting offsets into new tables, and the stream then takes only
    the records produced since (its accepted rows a Delta table, exchanged whole, which the outputs
    then stream from where the staged one left them). Once retention deleted records, a reprocess from ``earliest`` is
    refused (it would drop them from the accepted rows), and one from offsets the spec chooses runs."""
    from edited_streams import edit, in_session, start
    from examples import include_with

    from spark_jobs import changes, upgrade
    from spark_jobs.runtime.checkpoint import previous_plan
    from spark_jobs.stream_spec.loading import load_spec
    from spark_jobs.stream_spec.models import INGEST_FLOW

    topic = kafka_topic
    kafka_broker.produce(topic, [reading("e1", 1), reading("e2", 1), reading("e3", 2, "dev-002"), "not json"],
                         partition=0)
    kafka_broker.produce(topic, [reading("e4", 3), reading("e5", 3, "dev-002")], partition=1)
    data = kafka_spec(topic, kafka_broker.bootstrap, [PASSTHROUGH, PER_DEVICE]) | {"accepted": {"format": "delta"}}
    spec_file = include_with(tmp_path / "include", data) / f"{data['name']}.yaml"
    root = tmp_path / "data"
    assert start(spark, spec_file, root, monkeypatch) == 0
    layout = Layout(load_spec(spec_file), root, spec_file.parent)

    def accepted() -> list[str]:
        plan = compile_plan(load_spec(spec_file), layout)
        return sorted(r["event_id"] for r in accepted_batch(spark, plan.ingestion).collect())

    def per_device() -> dict[str, int]:
        from spark_jobs.sinks.table import open_database

        with open_database(f"sqlite:///{root / 'tables.db'}").connect() as conn:
            return dict(conn.execute("SELECT device_id, n FROM per_device").fetchall())

    assert accepted() == ["e1", "e2", "e3", "e4", "e5"] and per_device() == {"dev-001": 3, "dev-002": 2}
    edit(spec_file, lambda d: d["deduplicate"].update(key=["device_id", "ts"]))  # e2 repeats e1's reading
    spec = load_spec(spec_file)
    verdicts = changes.judge(compile_plan(spec, layout), previous_plan(layout), str(spec_file), "10 minutes")
    assert {v.flow: v.verdict for v in verdicts}[INGEST_FLOW] == changes.REPROCESS

    in_session(spark, monkeypatch)
    assert upgrade.main(["--spec", str(spec_file), "--data-root", str(root)]) == upgrade.EXIT_OK
    record = upgrade.latest(layout)
    assert record["phase"] == upgrade.DONE and record["rebuild"] == [INGEST_FLOW, "rows", "per_device"]
    assert record["ingestion"]["replay"] is None
    ids = accepted()
    assert len(ids) == 4 and ("e1" in ids) != ("e2" in ids)  # one of the two, as Spark kept it
    assert per_device() == {"dev-001": 2, "dev-002": 2}
    assert len(quarantine(spark, layout)) == 1  # "not json", once
    assert sorted(r["event_id"] for r in spark.read.parquet(layout.data("sinks/rows")).collect()) == ids
    checkpoint = compile_plan(spec, layout).checkpoint(INGEST_FLOW)
    assert {k: v for k, v in kafka.committed_offsets(checkpoint).items() if v} == {(topic, 0): 4, (topic, 1): 2}

    kafka_broker.produce(topic, [reading("e6", 20), reading("e7", 20)], partition=2)  # e7 repeats e6's reading
    assert start(spark, spec_file, root, monkeypatch) == 0
    assert len(accepted()) == 5 and per_device() == {"dev-001": 3, "dev-002": 2}
    assert len(quarantine(spark, layout)) == 1
    assert sorted(r["event_id"] for r in spark.read.parquet(layout.data("sinks/rows")).collect()) == accepted()

    # retention took the topic's first record: read again from "earliest", it would be lost unsaid
    kafka_broker.delete_records(topic, 0, before=1)
    edit(spec_file, lambda d: d["deduplicate"].update(key=["event_id"]))
    before = accepted()
    with caplog.at_level("ERROR", logger="upgrade"):
        assert upgrade.main(["--spec", str(spec_file), "--data-root", str(root)]) == upgrade.EXIT_REFUSED
    assert f"offsets 0 to 0 of {topic}/0" in caplog.text and upgrade.latest(layout)["number"] == 1
    assert accepted() == before
    # the offsets chosen in the spec: reprocessed from there, knowingly
    edit(spec_file, lambda d: d["source"].update(starting_offsets=json.dumps({topic: {"0": 1, "1": -2, "2": -2}})))
    assert upgrade.main(["--spec", str(spec_file), "--data-root", str(root)]) == upgrade.EXIT_OK
    assert accepted() == ["e2", "e3", "e4", "e5", "e6", "e7"] and per_device() == {"dev-001": 4, "dev-002": 2}
