"""The Delta Lake sink on the shared SparkSession: each output mode lands in its table through
the table's log, one version per batch that names the batch, and a replayed batch is skipped
by the log itself, while a new checkpoint (a new query) is not."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from spark_jobs import analysis
from spark_jobs.flows import queries as flows
from spark_jobs.plan import compile_plan
from spark_jobs.sinks.delta import DeltaWriter, committed_batches, merge_condition
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import SpecError, Trigger

PER_DEVICE = {"type": "aggregate", "group_by": ["device_id"], "aggregates": [{"name": "n", "fn": "count"}]}


def spec_data(name: str, outputs: list[dict]) -> dict:
    return {
        "name": name,
        "source": {"type": "files", "path": "landing", "format": "json", "max_files_per_trigger": 1,
                   "columns": [{"name": "event_id", "type": "string", "required": True},
                               {"name": "device_id", "type": "string"},
                               {"name": "ts", "type": "timestamp", "required": True}]},
        "quarantine": {"path": "quarantine"},
        "event_time": {"column": "ts", "watermark": "1 hour"},
        "deduplicate": {"key": ["event_id"]},
        "outputs": outputs,
        "checkpoint": "checkpoints",
    }


def delta_outputs() -> list[dict]:
    return [
        {"name": "rows", "mode": "append", "query": {"type": "passthrough", "columns": ["event_id", "device_id", "ts"]},
         "sink": {"type": "delta", "path": "out/rows", "partition_by": ["device_id"]}},
        {"name": "per_device", "mode": "update", "query": PER_DEVICE, "sink": {"type": "delta", "path": "out/updated"}},
        {"name": "totals", "mode": "complete", "query": PER_DEVICE, "sink": {"type": "delta", "path": "out/completed"}},
    ]


def record(event_id: str, minute: int, device: str | None) -> str:
    return json.dumps({"event_id": event_id, "device_id": device, "ts": f"2026-01-01T00:{minute:02d}:00Z"})


def land(landing: Path, lines: list[str]) -> None:
    i = len(list(landing.iterdir()))
    path = landing / f"part-{i:04d}.json"
    path.write_text("".join(line + "\n" for line in lines))
    ns = 1_700_000_000_000_000_000 + i * 1_000_000_000
    os.utime(path, ns=(ns, ns))


def table(spark, path: str) -> list[dict]:
    return [r.asDict() for r in spark.read.format("delta").load(path).collect()]


def test_every_mode_lands_in_its_delta_table_one_version_per_batch(spark, tmp_path: Path) -> None:
    spec = parse_spec(spec_data("to_delta", delta_outputs()))
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    landing = Path(compile_plan(spec, layout).source.landing)
    landing.mkdir(parents=True)
    plan = analysis.resolve_plan(spark, spec, layout)
    files = [[record("a1", 1, "d1"), record("b1", 2, None)],
             [record("a2", 3, "d1"), record("a1", 1, "d1")],  # a duplicate of a1: dropped
             [record("c1", 4, "d3")]]
    outputs = flows.start(spark, plan, Trigger(processing_time="100 milliseconds"), only=lambda n: n != "_ingest")
    try:
        for lines in files:  # each file its own batch of every output
            land(landing, lines)
            flows.start(spark, plan, Trigger(available_now=True), only=lambda n: n == "_ingest")["_ingest"] \
                .awaitTermination(120)
            for q in outputs.values():
                q.processAllAvailable()
    finally:
        for q in outputs.values():
            q.stop()

    rows, updated, completed = (plan.output(n).sink.path for n in ("rows", "per_device", "totals"))
    assert sorted(r["event_id"] for r in table(spark, rows)) == ["a1", "a2", "b1", "c1"]
    assert sorted(p.name for p in Path(rows).iterdir() if p.name.startswith("device_id=")) == [
        "device_id=__HIVE_DEFAULT_PARTITION__", "device_id=d1", "device_id=d3"]
    counts = [("d1", 2), ("d3", 1), (None, 1)]
    by_device = sorted(((r["device_id"], r["n"]) for r in table(spark, updated)), key=str)
    assert by_device == sorted(counts, key=str)  # merged on the key, the null group included
    assert sorted(((r["device_id"], r["n"]) for r in table(spark, completed)), key=str) == sorted(counts, key=str)

    for name, path in (("rows", rows), ("per_device", updated), ("totals", completed)):
        commits = committed_batches(spark, path)
        batch_ids = [c["batch_id"] for c in commits]
        assert batch_ids == sorted(set(batch_ids)) and len(batch_ids) >= 3, (name, commits)
        assert {c["stream"] for c in commits} == {"to_delta"} and {c["output"] for c in commits} == {name}
        assert [c["version"] for c in commits] == list(range(len(commits)))  # every version is a batch's
    assert {c["operation"] for c in committed_batches(spark, updated)[1:]} == {"MERGE"}
    assert {c["operation"] for c in committed_batches(spark, completed)} == {"WRITE"}


@pytest.mark.parametrize("mode", ["append", "update", "complete"])
def test_a_replayed_batch_is_skipped_and_a_new_checkpoint_is_not(spark, tmp_path: Path, mode: str) -> None:
    spec = parse_spec(spec_data("replays", [
        {"name": "out", "mode": mode, "sink": {"type": "delta", "path": "out/t"},
         "query": PER_DEVICE if mode != "append" else {"type": "passthrough", "columns": ["device_id"]}}]))
    plan = analysis.resolve_plan(spark, spec, Layout(spec, tmp_path / "data", default_spec_dir()))
    key = ["n"] if mode != "append" else []

    def writer(checkpoint: Path) -> DeltaWriter:
        checkpoint.mkdir(parents=True)
        (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
        output = replace(plan.output("out"), checkpoint=str(checkpoint))
        return DeltaWriter("replays", output)

    def batch(*devices: str):
        schema = "device_id string, n long" if mode != "append" else "device_id string"
        return spark.createDataFrame([(d, len(d)) if key else (d,) for d in devices], schema)

    first = writer(tmp_path / "ck1")
    first.write(batch("a"), 0)
    first.write(batch("bb"), 1)
    first.write(batch("zzz"), 1)  # the replay of batch 1 after a crash: its commit is in the log
    path = plan.output("out").sink.path
    expected = {"append": ["a", "bb"], "update": ["a", "bb"], "complete": ["bb"]}[mode]
    assert sorted(r["device_id"] for r in table(spark, path)) == expected
    assert [c["batch_id"] for c in committed_batches(spark, path)] == [0, 1]

    writer(tmp_path / "ck2").write(batch("cc"), 0)  # a reset checkpoint: batch 0 of a new query
    expected = {"append": ["a", "bb", "cc"], "update": ["a", "bb", "cc"], "complete": ["cc"]}[mode]
    assert sorted(r["device_id"] for r in table(spark, path)) == expected


def test_a_window_result_commits_only_the_batches_that_closed_windows(spark, tmp_path: Path) -> None:
    spec = parse_spec(spec_data("windows", [
        {"name": "w", "mode": "append", "sink": {"type": "delta", "path": "out/w"},
         "query": {"type": "aggregate", "window": {"duration": "10 minutes"}, "group_by": ["device_id"],
                   "aggregates": [{"name": "n", "fn": "count"}]}}]))
    plan = analysis.resolve_plan(spark, spec, Layout(spec, tmp_path / "data", default_spec_dir()))
    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    writer = DeltaWriter("windows", replace(plan.output("w"), checkpoint=str(checkpoint)))
    assert writer.skips_empty
    schema = "window_start timestamp, window_end timestamp, device_id string, n long"
    closed = spark.createDataFrame([(None, None, "d1", 3)], schema)
    writer.write(spark.createDataFrame([], schema), 0)  # no window closed
    path = plan.output("w").sink.path
    assert not Path(path).exists()
    writer.write(closed, 1)
    writer.write(spark.createDataFrame([], schema), 2)
    writer.write(closed, 1)  # a replay of a batch with rows: skipped by Delta
    assert [(c["batch_id"], c["version"]) for c in committed_batches(spark, path)] == [(1, 0)]
    assert [r["n"] for r in table(spark, path)] == [3]


def test_an_update_merges_on_the_key_null_safely() -> None:
    assert merge_condition(["window_start", "device_id"]) == (
        "t.`window_start` <=> s.`window_start` AND t.`device_id` <=> s.`device_id`")


def test_a_delta_sink_s_columns_and_key_are_checked_against_the_result() -> None:
    bad = delta_outputs()
    bad[0]["sink"]["partition_by"] = ["site"]
    bad[1] = {"name": "per_event", "mode": "update", "sink": {"type": "delta", "path": "out/e"},
              "query": {"type": "sql", "sql": "SELECT event_id FROM accepted"}}
    with pytest.raises(SpecError) as err:
        parse_spec(spec_data("bad_delta", bad))
    message = str(err.value)
    assert "outputs[0].sink.partition_by[0]: unknown column 'site'" in message
    assert "outputs[1].sink.key: update mode into a Delta table merges each batch on a key" in message


def test_a_version_s_last_batch_is_found_beyond_the_newest_commits_and_a_commit_s_time_read(spark, tmp_path) -> None:
    import time

    from spark_jobs.sinks.delta import commit_metadata, commit_time, last_batch

    path = str(tmp_path / "t")
    for query, batches in (("q1", 3), ("q2", 20)):  # q1's batches are older than the 16 newest commits
        for b in range(batches):
            spark.range(1).write.format("delta").mode("append") \
                .option("userMetadata", commit_metadata("s", "o", query, b)).save(path)
    assert last_batch(spark, path, "q1", 22) == 2
    assert last_batch(spark, path, "q1", 1) == 1 and last_batch(spark, path, "q2", 22) == 19
    assert last_batch(spark, path, "q3", 22) is None
    assert abs(commit_time(spark, path, 5) - time.time()) < 600
    assert commit_time(spark, path, 99) is None
