"""Upkeep of Delta tables on the shared SparkSession: compaction while a stream writes its
tables keeps every batch; a vacuum shorter than a reader needs is refused naming the reader;
an allowed one deletes only files no retained version references."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from spark_jobs import analysis, maintenance
from spark_jobs.flows import queries as flows
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.lease import DriverLease
from spark_jobs.sinks.delta import committed_batches, is_conflict, read_version, retry_conflicts
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import Trigger

PER_DEVICE = {"type": "aggregate", "group_by": ["device_id"], "aggregates": [{"name": "n", "fn": "count"}]}


def spec_data(name: str) -> dict:
    return {
        "name": name,
        "source": {"type": "files", "path": "landing", "format": "json", "max_files_per_trigger": 1,
                   "columns": [{"name": "event_id", "type": "string", "required": True},
                               {"name": "device_id", "type": "string", "required": True},
                               {"name": "ts", "type": "timestamp", "required": True}]},
        "quarantine": {"path": "quarantine"},
        "event_time": {"column": "ts", "watermark": "1 hour"},
        "outputs": [
            {"name": "rows", "mode": "append", "query": {"type": "passthrough", "columns": ["event_id", "device_id"]},
             "sink": {"type": "delta", "path": "out/rows", "partition_by": ["device_id"]}},
            {"name": "per_device", "mode": "update", "query": PER_DEVICE,
             "sink": {"type": "delta", "path": "out/per_device"}},
            {"name": "totals", "mode": "complete", "query": PER_DEVICE, "sink": {"type": "delta", "path": "out/totals"}},
        ],
        "checkpoint": "checkpoints",
    }


def land(landing: Path, i: int, devices: list[str]) -> None:
    path = landing / f"part-{i:04d}.json"
    path.write_text("".join(json.dumps({"event_id": f"e{i}-{j}", "device_id": d, "ts": "2026-01-01T00:00:00Z"}) + "\n"
                            for j, d in enumerate(devices)))
    ns = 1_700_000_000_000_000_000 + i * 1_000_000_000
    os.utime(path, ns=(ns, ns))


def stream(spark, tmp_path: Path, name: str):
    spec = parse_spec(spec_data(name))
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    Path(compile_plan(spec, layout).source.landing).mkdir(parents=True)
    return spec, layout, analysis.resolve_plan(spark, spec, layout)


def data_files(path: str, partition: str) -> int:
    return len(list(Path(path, partition).glob("*.parquet")))


def test_compaction_while_the_stream_writes_keeps_every_batch(spark, tmp_path: Path) -> None:
    _, layout, plan = stream(spark, tmp_path, "compacted")
    landing = Path(plan.source.landing)
    outputs = flows.start(spark, plan, Trigger(processing_time="100 milliseconds"), only=lambda n: n != "_ingest")
    try:
        for i in range(3):  # each file a batch of every output; a compaction of every table after each
            land(landing, i, ["d1", "d1", "d2"])
            flows.start(spark, plan, Trigger(available_now=True), only=lambda n: n == "_ingest")["_ingest"] \
                .awaitTermination(120)
            for path in plan.delta_tables.values():
                if Path(path, "_delta_log").exists():
                    maintenance.optimize(spark, path)  # concurrently with the outputs' next batch
            for q in outputs.values():
                q.processAllAvailable()
    finally:
        for q in outputs.values():
            q.stop()
    rows, per_device, totals = (plan.output(n).sink.path for n in ("rows", "per_device", "totals"))
    assert spark.read.format("delta").load(rows).count() == 9
    counts = {"d1": 6, "d2": 3}
    assert {r.device_id: r.n for r in spark.read.format("delta").load(per_device).collect()} == counts
    assert {r.device_id: r.n for r in spark.read.format("delta").load(totals).collect()} == counts
    for path in (rows, per_device, totals):
        ids = [c["batch_id"] for c in committed_batches(spark, path)]
        assert ids == sorted(set(ids)), path  # every batch once, none lost to a conflict

    before = data_files(rows, "device_id=d1")
    result = maintenance.run(spark, plan, layout, compact=True, vacuum_retention=None)
    entry = next(t for t in result["tables"] if t["output"] == "rows")
    assert entry["after"]["files"] == 2 < entry["before"]["files"]  # one file per partition
    assert before >= 2 and spark.read.format("delta").load(rows).count() == 9


def write_ledger(layout: Layout, output: str, version: int) -> None:
    layout.quality_dir.mkdir(parents=True, exist_ok=True)
    (layout.quality_dir / "ledger.json").write_text(json.dumps({"outputs": {output: {"units": {
        "batch 3": {"unit": "batch 3", "status": "passed", "version": version}}}}}))


def test_a_vacuum_keeps_what_a_reader_needs_or_is_refused_naming_it(spark, tmp_path: Path) -> None:
    _, layout, plan = stream(spark, tmp_path, "vacuumed")
    path = plan.output("rows").sink.path
    for i in range(3):  # versions 0-2: a small file each
        spark.createDataFrame([(f"e{i}", "d1")], "event_id string, device_id string").write.format("delta") \
            .mode("append").partitionBy("device_id").save(path)
    assert maintenance.optimize(spark, path) == {"files_removed": 3, "files_added": 1}  # version 3
    write_ledger(layout, "rows", 3)  # the last validation read version 3, the newest

    entry = next(t for t in maintenance.run(spark, plan, layout, compact=False, vacuum_retention=0)["tables"]
                 if t["output"] == "rows")
    assert entry["vacuum"] == {"files_deleted": 3, "retention_seconds": 0}  # the three small files
    assert read_version(spark, path, 3).count() == 3  # the validated version still reads
    with pytest.raises(Exception, match="FileNotFound|FILE_NOT_EXIST|DELTA_FILE_NOT_FOUND|does not exist"):
        read_version(spark, path, 1).collect()  # an older one no longer does

    spark.createDataFrame([("e9", "d1")], "event_id string, device_id string").write.format("delta") \
        .mode("append").partitionBy("device_id").save(path)  # version 4: the validated version is no longer the newest
    result = maintenance.run(spark, plan, layout, compact=False, vacuum_retention=0)
    (refused,) = [r for r in result["refused"] if "rows" in r]
    assert "the last validation of output rows (version 3), to be rerun" in refused

    lease = DriverLease(layout.lease_dir, stream="vacuumed").acquire()  # the stream runs
    try:
        with pytest.raises(maintenance.VacuumRefused, match="the stream's running driver"):
            maintenance.check_retention(spark, layout, "rows", path, 600)
        maintenance.check_retention(spark, layout, "rows", path, 7 * 24 * 3600)
    finally:
        lease.release()


def test_a_conflicting_commit_is_retried_and_any_other_error_is_not() -> None:
    calls = []

    def conflicted_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("io.delta.exceptions.ConcurrentDeleteReadException: This transaction attempted to "
                               "read one or more files that were deleted by a concurrent update")
        return "committed"

    assert retry_conflicts("a batch", conflicted_once) == "committed" and len(calls) == 2
    assert not is_conflict(ValueError("[DELTA_MERGE_MISSING_WHEN] at least one WHEN clause"))
    with pytest.raises(ValueError):
        retry_conflicts("a batch", lambda: (_ for _ in ()).throw(ValueError("bad")))


def read_up_to(checkpoint: str, version: int) -> None:
    """A reader's checkpoint whose last committed batch read a Delta table up to ``version``
    (every version before it whole)."""
    for log in ("offsets", "commits"):
        Path(checkpoint, log).mkdir(parents=True, exist_ok=True)
    offset = {"sourceVersion": 1, "reservoirId": "t", "reservoirVersion": version, "index": -1,
              "isStartingVersion": False}
    Path(checkpoint, "offsets", "0").write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(offset)}\n')
    Path(checkpoint, "commits", "0").write_text('v1\n{"nextBatchWatermarkMs":0}\n')


def test_a_vacuum_of_the_accepted_rows_is_refused_while_an_output_has_yet_to_read_older_versions(
        spark, tmp_path: Path) -> None:
    spec = parse_spec({**spec_data("accepted"), "accepted": {"format": "delta"}})
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    plan = analysis.resolve_plan(spark, spec, layout)
    path = plan.ingestion.accepted_path
    assert plan.delta_tables == {"_accepted": path, **{o.name: o.sink.path for o in plan.outputs}}
    for i in range(3):  # versions 0-2
        spark.createDataFrame([(f"e{i}", "d1", None, None)], plan.ingestion.accepted_ddl).write.format("delta") \
            .mode("append").partitionBy("event_date").save(path)
    assert maintenance.streaming_readers(plan, path) == {o.name: o.checkpoint for o in plan.outputs}
    assert maintenance.streaming_readers(plan, plan.output("rows").sink.path) == {}  # a sink has no such reader
    for o in plan.outputs:
        read_up_to(o.checkpoint, 3)  # every version read
    read_up_to(plan.output("totals").checkpoint, 2)  # version 2 not yet
    readers = maintenance.streaming_readers(plan, path)
    with pytest.raises(maintenance.VacuumRefused, match=r"output totals, which streams from the table and has yet "
                                                        r"to read versions after 1"):
        maintenance.check_retention(spark, layout, "_accepted", path, 0, readers)
    read_up_to(plan.output("totals").checkpoint, 3)
    maintenance.check_retention(spark, layout, "_accepted", path, 0, readers)


def test_a_vacuum_keeps_the_version_of_the_last_backfill_written_in_place(spark, tmp_path: Path) -> None:
    _, layout, plan = stream(spark, tmp_path, "backfilled")
    path = plan.output("rows").sink.path
    for i in range(2):  # versions 0-1
        spark.createDataFrame([(f"e{i}", "d1")], "event_id string, device_id string").write.format("delta") \
            .mode("append").partitionBy("device_id").save(path)
    records = layout.backfill_dir("rows")
    records.mkdir(parents=True)

    def backfilled(label: str, version: int, written: str) -> None:
        (records / f"{label}.json").write_text(json.dumps({"table": path, "version": version, "written": written}))

    backfilled("range=a", 1, "2026-01-01T00:00:00Z")
    backfilled("range=b", 0, "2026-01-02T00:00:00Z")  # the newest backfill read version 0; version 1 came later
    with pytest.raises(maintenance.VacuumRefused, match=r"the last backfill of output rows \(range=b, version 0\)"):
        maintenance.check_retention(spark, layout, "rows", path, 0)
    backfilled("range=c", 1, "2026-01-03T00:00:00Z")  # the newest version: nothing later removed its files
    maintenance.check_retention(spark, layout, "rows", path, 0)
