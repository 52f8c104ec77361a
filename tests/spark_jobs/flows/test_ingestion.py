"""The ingestion: one parse per stream, its decisions counted, its tables written exactly once."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow.parquet as pq
import pytest
from stream_runs import land, make_spec, reading  # tests/stream_runs.py

from runner.testdata import verify
from spark_jobs import analysis, changes
from spark_jobs.flows import queries as flows
from spark_jobs.flows.ingestion import IngestBatch, at_once, computed_once
from spark_jobs.frames import accepted_batch
from spark_jobs.plan import QUARANTINE_DDL, checkpoint_paths, compile_plan, written_by_ingestion
from spark_jobs.runtime.checkpoint import (
    batch_watermark_ms,
    last_batch,
    previous_plan,
    refuse_incompatible,
    sink_files,
    sink_last_batch,
    watermark_seen_by,
)
from spark_jobs.sinks import table as table_sink
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import Trigger

PASSTHROUGH = {"name": "rows", "mode": "append", "query": {"type": "passthrough"},
               "sink": {"type": "parquet", "path": "sinks/rows", "partition_by": ["event_date"]}}
WINDOWS = {"name": "windows", "mode": "append", "sink": {"type": "parquet", "path": "sinks/windows"},
           "query": {"type": "aggregate", "window": {"duration": "10 minutes"}, "group_by": ["device_id"],
                     "aggregates": [{"name": "n", "fn": "count"}]}}
PER_DEVICE = {"name": "per_device", "mode": "update", "sink": {"type": "table", "table": "per_device"},
              "query": {"type": "aggregate", "group_by": ["device_id"], "aggregates": [{"name": "n", "fn": "count"}]}}


def setup(tmp_path: Path, spec_data: dict, files: list[list[str]]) -> tuple:
    spec = parse_spec(spec_data)
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    landing = Path(compile_plan(spec, layout).source.landing)
    landing.mkdir(parents=True)
    for lines in files:
        land(landing, spec.source.format, lines)
    return spec, layout


FILES = [
    [reading("e1", 1), reading("e2", 12), "not json", "not json"],
    [reading("e3", 35), reading("e3", 35)],
    [reading("e4", 41)],
    [reading("e5", 33), reading("e6", 5)],  # e5 late within the watermark, e6 beyond it
]


def test_a_batch_without_rejected_rows_commits_its_quarantine_entry_and_writes_no_file(spark, tmp_path: Path) -> None:
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH]), FILES)  # rejected rows in the first file only
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    quarantine = compile_plan(spec, layout).ingestion.quarantine
    assert sink_last_batch(quarantine) == 3  # every batch has its entry: readers and compaction need no gap
    (only,) = sink_files(quarantine)  # of batch 0; no empty file for batches 1 to 3
    assert sink_files(quarantine, through_batch=0) == {only}
    assert len(list(Path(quarantine).glob("*.parquet"))) == 1
    assert sorted(r["raw"] for r in spark.read.parquet(quarantine).collect()) == ["not json", "not json"]


def test_a_quarantine_that_never_had_a_row_keeps_one_empty_file_for_its_schema(spark, tmp_path: Path) -> None:
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH]), FILES[1:])  # no rejected row
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    quarantine = compile_plan(spec, layout).ingestion.quarantine
    assert sink_last_batch(quarantine) == 2 and len(sink_files(quarantine)) == 1
    empty = spark.read.parquet(quarantine)
    assert empty.count() == 0 and empty.columns == ["raw", "raw_bytes", "reason", "source_file", "quarantined_at"]
    assert empty.schema.simpleString() == spark.createDataFrame([], QUARANTINE_DDL).schema.simpleString()


def test_a_quarantine_written_before_raw_bytes_existed_is_written_on_and_read(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_jobs.flows import ingestion
    from spark_jobs.quality.validation import read_committed

    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH]), FILES[:1])  # "not json" twice
    columns = ingestion.quarantine_columns
    assert QUARANTINE_DDL.split(", ")[:2] == ["raw string", "raw_bytes binary"]
    # the quarantine's columns before raw_bytes
    monkeypatch.setattr(ingestion, "quarantine_columns", lambda plan: [columns(plan)[0], *columns(plan)[2:]])
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    quarantine = compile_plan(spec, layout).ingestion.quarantine
    assert spark.read.parquet(quarantine).columns == ["raw", "reason", "source_file", "quarantined_at"]
    before = sink_last_batch(quarantine)

    monkeypatch.undo()  # this version, resuming from the checkpoint
    bad = b'{"event_id": "e9", "device_id": "dev-\xff\x80", "ts": "2026-01-01T00:30:00.000Z"}'
    land(Path(compile_plan(spec, layout).source.landing), "json", [reading("e7", 20), bad])
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    rows = spark.read.schema(QUARANTINE_DDL).parquet(quarantine).collect()
    assert sorted((r["raw"], r["raw_bytes"]) for r in rows) == [
        ("not json", None), ("not json", None), (bad.decode("utf-8", "replace"), bytearray(bad))]
    # its readers: the quality's accounting (its count), the ground truth's comparison
    assert read_committed(spark, quarantine).count() == 3
    assert sorted(r["raw"] for r in verify.read_quarantine(spark, compile_plan(spec, layout))) == sorted(r["raw"] for r in rows)
    # the new batch's file, read by any Parquet reader
    (new,) = {unquote(urlsplit(p).path) for p in sink_files(quarantine) - sink_files(quarantine, through_batch=before)}
    assert [(r["raw"], r["raw_bytes"]) for r in pq.read_table(new).to_pylist()] == [
        (bad.decode("utf-8", "replace"), bad)]


def test_an_empty_batch_committed_again_is_skipped_and_the_log_compacts_over_empty_entries(spark, tmp_path: Path) -> None:
    from spark_jobs.sinks.files import FileSinkWriter

    path = str(tmp_path / "table")
    writer = FileSinkWriter(spark, path, [])
    rows = spark.createDataFrame([("a",)], "x string").coalesce(1)
    for batch_id in range(12):  # Spark's sink log compacts every 10 batches: batch 9 is a compaction
        if batch_id in (0, 10):
            writer.add_batch(batch_id, rows)
        else:
            writer.add_empty_batch(batch_id, rows.schema)
    writer.add_empty_batch(10, rows.schema)  # a replay of a committed batch: nothing changes
    writer.add_empty_batch(5, rows.schema)
    assert sink_last_batch(path) == 11
    assert (tmp_path / "table" / "_spark_metadata" / "9.compact").is_file()
    assert len(sink_files(path)) == 2
    assert [r["x"] for r in spark.read.parquet(path).collect()] == ["a", "a"]


def test_a_batch_that_reads_nothing_runs_the_deduplication_alone_and_commits_both_tables(
        spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH]), [])
    plan = compile_plan(spec, layout)
    checkpoint, quarantine = plan.checkpoint("_ingest"), plan.ingestion.quarantine
    without_input: list[int] = []
    run_alone = IngestBatch.without_input

    def recorded(self: IngestBatch, batch, batch_id: int) -> tuple[dict[str, int], int | None]:
        without_input.append(batch_id)
        return run_alone(self, batch, batch_id)

    monkeypatch.setattr(IngestBatch, "without_input", recorded)
    events: list[dict] = []
    queries = flows.start(spark, analysis.resolve_plan(spark, spec, layout), Trigger(processing_time="500 milliseconds"),
                          on_batch=events.append)
    ingest = queries["_ingest"]

    def committed(rows: int) -> int:
        """Wait until a batch that read ``rows`` rows (after the last one waited for) is committed; its id."""
        deadline = time.monotonic() + 120
        while True:
            after = max(waited, default=-1)
            found = [e["batch_id"] for e in events if e["event"] == "ingested" and e["batch_id"] > after
                     and e["rows"] == rows]
            done = last_batch(checkpoint, "commits")
            if found and done is not None and done >= found[0]:
                waited.append(found[0])
                return found[0]
            assert ingest.exception() is None, ingest.exception()
            assert time.monotonic() < deadline, events
            ingest.awaitTermination(0.05)

    waited: list[int] = []
    try:
        land(Path(compile_plan(spec, layout).source.landing), "json", [reading("e1", 1)])
        first = committed(1)
        committed(0)  # the watermark moved to 23:51 of the day before
        land(Path(compile_plan(spec, layout).source.landing), "json", [reading("e1", 2), reading("e2", 30), "not json"])
        committed(2)  # the repeated e1 dropped by the deduplication: its state outlived the batch that read nothing
        evicting = committed(0)  # the watermark at 00:20: e1 (00:01, kept until 00:11) leaves the state
        land(Path(compile_plan(spec, layout).source.landing), "json", [reading("e1", 25)])
        committed(1)
        progress = {p["batchId"]: p for p in (json.loads(q.json) for q in ingest.recentProgress)}
    finally:
        for q in queries.values():
            q.stop()
    ingested = {e["batch_id"]: e for e in events if e["event"] == "ingested"}
    assert without_input == [b for b, e in ingested.items() if e["rows"] == 0 and b > first] != []
    assert progress[evicting]["numInputRows"] == 0
    assert progress[evicting]["stateOperators"][0]["numRowsRemoved"] == 1
    assert sum(e["accepted"] for e in ingested.values()) == 3 and sum(e["quarantined"] for e in ingested.values()) == 1
    # every batch is in both tables' logs; one that read nothing names no file
    last = max(ingested)
    assert sink_last_batch(plan.accepted_path) == sink_last_batch(quarantine) == last
    for table in (plan.accepted_path, quarantine):
        for b in without_input:
            assert sink_files(table, through_batch=b) == sink_files(table, through_batch=b - 1), (table, b)
    assert sorted(r["event_id"] for r in accepted_batch(spark, plan.ingestion).collect()) == ["e1", "e1", "e2"]
    assert [r["raw"] for r in spark.read.parquet(quarantine).collect()] == ["not json"]


def test_every_row_is_decided_once_and_counted(spark, tmp_path: Path) -> None:
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH, WINDOWS, PER_DEVICE]), FILES)
    events: list[dict] = []
    queries = flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout), on_batch=events.append)
    ingested = [e for e in events if e["event"] == "ingested"]
    assert [e["batch_id"] for e in ingested] == [0, 1, 2, 3]
    totals = {k: sum(e[k] for e in ingested) for k in ("rows", "accepted", "quarantined", "late", "unmatched")}
    assert totals == {"rows": 7, "accepted": 5, "quarantined": 2, "late": 0, "unmatched": 0}
    progress = queries["_ingest"].recentProgress
    assert sum(p.numInputRows for p in progress) == 9
    # the deduplication dropped one repeated e3 and the late e6 (Spark's own counts)
    state = [s for p in progress for s in p.stateOperators]
    assert sum(s.numRowsDroppedByWatermark for s in state) == 1
    assert sum(s.customMetrics.get("numDroppedDuplicateRows", 0) for s in state) == 1

    accepted = sorted(r["event_id"] for r in accepted_batch(spark, compile_plan(spec, layout).ingestion).collect())
    assert accepted == ["e1", "e2", "e3", "e4", "e5"]
    sink = sorted(r["event_id"] for r in spark.read.parquet(layout.data("sinks/rows")).collect())
    assert sink == accepted
    assert spark.read.parquet(layout.data("quarantine")).count() == 2
    table = table_sink.table_writer([("device_id", "string"), ("n", "long")],
                                  compile_plan(spec, layout).output("per_device"), "reader").read_all()
    assert [(r["device_id"], r["n"]) for r in table] == [("dev-001", len(accepted))]

    # every output equals its query run as a batch over the accepted rows
    reports = verify.agreement(spark, analysis.resolve_plan(spark, spec, layout))
    assert [r.name for r in reports] == ["rows", "windows", "per_device"]
    assert all(r.ok for r in reports), [r.describe() for r in reports]
    assert next(r for r in reports if r.name == "windows").actual == 2  # 00:00, 00:10 closed (watermark 00:31)
    with sqlite3.connect(layout.table_url(spec.output("per_device").sink).removeprefix("sqlite:///")) as db:
        db.execute("UPDATE per_device SET n = n + 1")
    broken = {r.name: r for r in verify.agreement(spark, analysis.resolve_plan(spark, spec, layout))}["per_device"]
    assert not broken.ok and broken.different[0][0] == ("dev-001",)


def test_without_deduplication_late_rows_are_dropped_by_the_ingestion_and_counted(spark, tmp_path: Path) -> None:
    data = make_spec([PASSTHROUGH])
    del data["deduplicate"]
    spec, layout = setup(tmp_path, data, FILES)
    events: list[dict] = []
    queries = flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout), on_batch=events.append)
    ingested = [e for e in events if e["event"] == "ingested"]
    # batch 3 judges late rows by the watermark batch 2 ran with (00:35 - 10 minutes): e6 (00:05) is late,
    # e5 (00:33) is not
    assert [e["late"] for e in ingested] == [0, 0, 0, 1]
    assert ingested[3]["watermark_ms"] == 1767227100000  # 2026-01-01T00:25:00Z
    assert sum(e["accepted"] for e in ingested) == 6  # e3 twice: nothing deduplicates
    assert sum(p.numInputRows for p in queries["_ingest"].recentProgress) == 9
    rows = sorted(r["event_id"] for r in spark.read.parquet(layout.data("sinks/rows")).collect())
    assert rows == ["e1", "e2", "e3", "e3", "e4", "e5"]


def test_a_replayed_batch_writes_nothing_twice(spark, tmp_path: Path) -> None:
    data = make_spec([PASSTHROUGH])
    del data["deduplicate"]  # no stateful operator: no trailing no-data batch, the last batch holds rows
    spec, layout = setup(tmp_path, data, FILES[:2])
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    before = sink_files(compile_plan(spec, layout).accepted_path)
    quarantine_before = sink_files(layout.data("quarantine"))
    # the driver died after the batch wrote its tables, before Spark committed it
    last = sink_last_batch(compile_plan(spec, layout).accepted_path)
    assert last == 1
    for name in (str(last), f".{last}.crc"):
        Path(compile_plan(spec, layout).checkpoint("_ingest"), "commits", name).unlink()
    events: list[dict] = []
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout), on_batch=events.append)
    assert [e["batch_id"] for e in events if e["event"] == "ingested"] == [last]  # replayed
    assert sink_files(compile_plan(spec, layout).accepted_path) == before
    assert sink_files(layout.data("quarantine")) == quarantine_before
    assert accepted_batch(spark, compile_plan(spec, layout).ingestion).count() == 4  # e1, e2, e3, e3


def test_each_sink_gets_one_file_per_partition_value_per_batch(spark, tmp_path: Path) -> None:
    day2 = reading("n1", 60 * 24 + 1)
    copy = {**PASSTHROUGH, "name": "copy", "sink": {**PASSTHROUGH["sink"], "path": "sinks/copy"}}
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH, copy]), [[reading("a", 1), reading("b", 2), day2]])
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    assert compile_plan(spec, layout).accepted_path == layout.data("sinks/rows")  # rows is written by the ingestion; copy has its own query
    for table in (compile_plan(spec, layout).accepted_path, layout.data("sinks/copy")):
        files = sorted(Path(p).parent.name for p in sink_files(table))
        assert files == ["event_date=2026-01-01", "event_date=2026-01-02"], table


def test_reference_data_with_a_repeated_key_is_refused(spark, tmp_path: Path) -> None:
    data = make_spec([PASSTHROUGH])
    ref = tmp_path / "devices.csv"
    ref.write_text("device_id,site\ndev-001,north\ndev-001,south\n")
    data["enrich"][0]["path"] = str(ref)
    spec, layout = setup(tmp_path, data, [[reading("a", 1)]])
    with pytest.raises(ValueError, match=r"reference data 'devices' .* has key\(s\) \['device_id'\] more than once"):
        flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))


def test_a_checkpoint_of_the_per_output_layout_is_refused(spark, tmp_path: Path) -> None:
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH]), [[reading("a", 1)]])
    Path(layout.checkpoint_root, "_quarantine").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="written when every output parsed the input itself"):
        refuse_incompatible(analysis.resolve_plan(spark, spec, layout), layout)
    shutil.rmtree(Path(layout.checkpoint_root, "_quarantine"))


def test_a_spec_edit_that_moves_the_accepted_rows_or_gives_an_output_another_sink_is_judged(
        spark, tmp_path: Path) -> None:
    """The layout's guards leave such edits to the verdicts (spark_jobs.changes): the accepted rows
    moved are a reprocess, an output's sink moved a rebuild."""
    spec, layout = setup(tmp_path, make_spec([WINDOWS, PASSTHROUGH]), [[reading("a", 1)]])
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    compile_plan(spec, layout).write(layout.plan_file)  # as the stream job does at each start
    served_at = compile_plan(spec, layout).accepted_path

    def judged(outputs: list[dict]) -> dict[str, changes.Verdict]:
        edited = parse_spec(make_spec(outputs) | {"name": spec.name})
        edited_layout = Layout(edited, tmp_path / "data", default_spec_dir())
        refuse_incompatible(compile_plan(edited, edited_layout), edited_layout)  # no layout of an older platform
        return {v.flow: v for v in changes.judge(compile_plan(edited, edited_layout), previous_plan(layout),
                                                 "spec.yaml", "10 minutes")}

    # the pass-through output is no longer partitioned by date: the ingestion no longer serves it
    moved = judged([WINDOWS, {**PASSTHROUGH, "sink": {"type": "parquet", "path": "sinks/rows"}}])
    assert moved["_ingest"].verdict == changes.REPROCESS and served_at in moved["_ingest"].text()
    # the windows go to a Delta table now: with the old checkpoint it would get later batches only
    other = judged([{**WINDOWS, "sink": {"type": "delta", "path": "tables/windows"}}, PASSTHROUGH])
    assert other["windows"].verdict == changes.REBUILD and "sink.kind" in other["windows"].text()
    assert {v.verdict for v in judged([WINDOWS, PASSTHROUGH]).values()} == {changes.UNCHANGED}


def files_per_batch(table: str) -> dict[int, list[str]]:
    """The partition folder of each file a batch added to a file sink, per batch."""
    last = sink_last_batch(table)
    added, before = {}, set()
    for batch in range(last + 1):
        now = sink_files(table, through_batch=batch)
        added[batch] = sorted(Path(p).parent.name for p in now - before)
        before = now
    return added


def test_a_served_passthrough_output_is_the_accepted_rows_written_once(spark, tmp_path: Path) -> None:
    day2 = [reading("d2a", 60 * 24 + 1), reading("d2b", 60 * 24 + 2)]
    files = [[reading("a", 1), reading("b", 2), "not json"], [reading("c", 3), *day2], [reading("d", 4)]]
    spec, layout = setup(tmp_path, make_spec([WINDOWS, PASSTHROUGH]), files)
    plan = compile_plan(spec, layout)
    assert written_by_ingestion(spec).name == "rows" and plan.output("rows").written_by_ingestion
    assert plan.flows == ["_ingest", "windows"]
    events: list[dict] = []
    queries = flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout), on_batch=events.append)

    assert set(queries) == {"_ingest", "windows"}  # no query for rows ...
    assert not Path(layout.data(checkpoint_paths(spec)["rows"])).exists()  # ... and no checkpoint
    assert sorted(p.name for p in Path(layout.checkpoint_root).iterdir() if not p.name.startswith("_")) == ["windows"]
    assert not Path(layout.data(f"accepted/{spec.name}")).exists()  # no second table of the same rows
    # the sink holds exactly the accepted rows, each once
    accepted = sum(e["accepted"] for e in events if e["event"] == "ingested")
    sink = spark.read.parquet(layout.data("sinks/rows"))
    assert sorted(r["event_id"] for r in sink.collect()) == ["a", "b", "c", "d", "d2a", "d2b"]
    assert sink.count() == accepted == accepted_batch(spark, plan.ingestion).count()
    assert sorted(sink.columns) == sorted(plan.output("rows").columns)
    # at most one Parquet file per event_date per micro-batch
    added = files_per_batch(layout.data("sinks/rows"))
    assert added[1] == ["event_date=2026-01-01", "event_date=2026-01-02"]
    assert all(len(folders) == len(set(folders)) for folders in added.values()), added
    # the other output read the same rows from there; every output agrees with its query over them
    assert sum(p.numInputRows for p in queries["windows"].recentProgress) == accepted
    reports = verify.agreement(spark, analysis.resolve_plan(spark, spec, layout))
    assert [r.name for r in reports] == ["windows", "rows"] and all(r.ok for r in reports)


def test_a_checkpoint_from_before_the_output_was_served_is_refused(spark, tmp_path: Path) -> None:
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH]), [[reading("a", 1)]])
    own = Path(layout.data(checkpoint_paths(spec)["rows"]))
    (own / "commits").mkdir(parents=True)
    with pytest.raises(RuntimeError, match=r"output rows is now written by the ingestion .* its checkpoint "
                                           rf"{own} from when it had a query of its own exists"):
        refuse_incompatible(analysis.resolve_plan(spark, spec, layout), layout)
    shutil.rmtree(own)
    old = Path(layout.data(f"accepted/{spec.name}"))
    (old / "_spark_metadata").mkdir(parents=True)
    (old / "_spark_metadata" / "0").write_text("v1\n")
    with pytest.raises(RuntimeError, match=rf"the accepted-rows table {old} of the earlier layout holds data"):
        refuse_incompatible(analysis.resolve_plan(spark, spec, layout), layout)
    shutil.rmtree(old)
    old.mkdir()  # an empty folder holds nothing to mix with
    plan = analysis.resolve_plan(spark, spec, layout)
    refuse_incompatible(plan, layout)
    flows.run_available_now(spark, plan)
    assert [r["event_id"] for r in spark.read.parquet(compile_plan(spec, layout).accepted_path).collect()] == ["a"]


def test_a_landed_file_reaches_the_pass_through_sinks_within_two_triggers_plus_processing(spark, tmp_path: Path) -> None:
    """The served output is one stage (the ingestion writes it), an output with a query of its
    own two (it waits for its trigger after the ingestion's); either way a landed file's rows
    are in the sink within two triggers plus the time its batches took."""
    columns = {"type": "passthrough", "columns": ["event_id", "device_id", "ts"]}
    copy = {"name": "copy", "mode": "append", "query": columns, "sink": {"type": "parquet", "path": "sinks/copy"}}
    spec, layout = setup(tmp_path, make_spec([PASSTHROUGH, copy]), [])
    sinks = {"_ingest": compile_plan(spec, layout).accepted_path, "copy": layout.data("sinks/copy")}
    landing = Path(compile_plan(spec, layout).source.landing)
    trigger_s = 1.0
    queries = flows.start(spark, analysis.resolve_plan(spark, spec, layout), Trigger(processing_time="1 second"))

    def committed_rows(path: str) -> int:  # read through the sink's commit log
        return 0 if sink_last_batch(path) is None else spark.read.parquet(path).count()

    def wait_for(rows: int, since: float) -> dict[str, float]:
        arrived: dict[str, float] = {}
        while len(arrived) < len(sinks):
            for name, path in sinks.items():
                if name not in arrived and committed_rows(path) == rows:
                    arrived[name] = time.time() - since
            for q in queries.values():
                assert q.exception() is None, q.exception()
            assert time.time() - since < 120, f"rows did not arrive: {arrived}"
            time.sleep(0.05)
        return arrived

    try:
        land(landing, "json", [reading("a", 1)])  # every query has run once: start-up is not latency
        wait_for(1, time.time())
        landed = time.time()
        land(landing, "json", [reading("b", 2)])
        arrived = wait_for(2, landed)

        def processing(name: str) -> float:  # seconds of the batches that ran since the file landed
            return sum(p["durationMs"]["triggerExecution"] / 1000 for p in (json.loads(x.json) for x in
                       queries[name].recentProgress)
                       if datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() >= landed - trigger_s)
    finally:
        for q in queries.values():
            q.stop()
    slack = 1.0  # reading the sinks to see the rows
    assert arrived["_ingest"] <= 2 * trigger_s + processing("_ingest") + slack, (arrived, processing("_ingest"))
    assert arrived["copy"] <= 2 * trigger_s + processing("_ingest") + processing("copy") + slack, (
        arrived, processing("_ingest"), processing("copy"))


def test_a_frame_computed_once_is_not_computed_again_by_the_next_job(spark) -> None:
    from pyspark.sql import functions as F

    computed = spark.sparkContext.accumulator(0)

    @F.udf("long")
    def seen(x):  # no type hints: pyspark would read them as a pandas UDF's
        computed.add(1)
        return x

    frame = spark.range(100).select(seen("id").alias("id")).repartition(2, "id")
    once = computed_once(frame)
    assert once.count() == 100 and once.where("id < 10").count() == 10
    assert computed.value == 100  # the second job read the first one's shuffle output
    assert frame.count() == 100 and computed.value == 200  # the frame itself computes it all again


def test_jobs_at_once_return_in_order_carry_the_callers_properties_and_raise_its_errors(spark) -> None:
    context = spark.sparkContext
    context.setLocalProperty("streams.test.owner", "the batch")
    try:
        assert at_once(spark, lambda: context.getLocalProperty("streams.test.owner"),
                       lambda: spark.range(5).where("id > 1").count()) == ["the batch", 3]
        with pytest.raises(ZeroDivisionError):
            at_once(spark, lambda: spark.range(3).count(), lambda: 1 // 0)
    finally:
        context.setLocalProperty("streams.test.owner", None)


def test_a_delta_accepted_table_holds_each_batch_once_and_feeds_every_output_through_a_compaction(
        spark, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    from spark_jobs.sinks import delta_log

    data = {**make_spec([PASSTHROUGH, WINDOWS, PER_DEVICE]), "accepted": {"format": "delta"}}
    spec, layout = setup(tmp_path, data, FILES[:3])
    plan = compile_plan(spec, layout)
    assert plan.ingestion.accepted_is_delta and written_by_ingestion(spec) is None  # the Parquet copy has its flow
    assert plan.delta_tables == {"_accepted": plan.accepted_path}
    events: list[dict] = []
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout), on_batch=events.append)
    ingested = {e["batch_id"]: e["accepted"] for e in events if e["event"] == "ingested"}
    commits = delta_log.batch_commits(plan.accepted_path)
    # one version per batch that accepted rows (a batch without any makes none), each batch once
    assert [c.batch_id for c in commits] == [b for b, n in sorted(ingested.items()) if n]
    assert sorted(r["event_id"] for r in accepted_batch(spark, plan.ingestion).collect()) == ["e1", "e2", "e3", "e4"]

    # the driver died after the last batch with rows committed its version, before Spark committed the batch
    last = commits[-1].batch_id
    for name in [str(b) for b in range(last, max(ingested) + 1)] + [f".{b}.crc" for b in range(last, max(ingested) + 1)]:
        Path(plan.checkpoint("_ingest"), "commits", name).unlink(missing_ok=True)
    versions = delta_log.versions(plan.accepted_path)
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    assert delta_log.versions(plan.accepted_path) == versions  # replayed: Delta's marker skipped the write
    assert accepted_batch(spark, plan.ingestion).count() == 4

    # compacted while its readers have read it all, then a new file: the outputs read only the new rows
    spark.sql(f"OPTIMIZE delta.`{plan.accepted_path}`").collect()
    assert DeltaTable.forPath(spark, plan.accepted_path).history(1).collect()[0].operation == "OPTIMIZE"
    land(Path(compile_plan(spec, layout).source.landing), "json", FILES[3])
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    assert sorted(r["event_id"] for r in spark.read.parquet(layout.data("sinks/rows")).collect()) == [
        "e1", "e2", "e3", "e4", "e5"]
    reports = verify.agreement(spark, analysis.resolve_plan(spark, spec, layout))
    assert all(r.ok for r in reports), [r.describe() for r in reports]
    # every output has read the table whole: the watermark it has seen is the ingestion's last
    ingest = plan.checkpoint("_ingest")
    assert watermark_seen_by(ingest, plan.accepted_path, plan.checkpoint("rows"), delta=True) == batch_watermark_ms(
        ingest, last_batch(ingest, "commits"))
