"""A Delta table's log read without Spark: batches by version, how far a streaming reader has read."""

from __future__ import annotations

import json
from pathlib import Path

from spark_jobs.sinks import delta_log


def commit(table: Path, version: int, *, batch: int | None = None, query: str = "q1", files: int = 1,
           operation: str = "WRITE") -> None:
    """One version of a table's log, as a stream's batch (``batch``) or a compaction writes it."""
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    said = None if batch is None else json.dumps({"stream": "s", "output": "accepted", "query": query,
                                                  "batch_id": batch, "epoch": 1})
    actions = [{"commitInfo": {"operation": operation, **({"userMetadata": said} if said else {})}}]
    actions += [{"add": {"path": f"f{version}-{i}.parquet", "dataChange": batch is not None}} for i in range(files)]
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_versions_name_their_batches_and_a_compaction_none(tmp_path: Path) -> None:
    table = tmp_path / "t"
    assert delta_log.versions(table) == [] and delta_log.last_batch(table) is None
    commit(table, 0, files=0, operation="CREATE TABLE")  # the empty table its readers start on
    commit(table, 1, batch=0, files=2)
    commit(table, 2, batch=2)  # batch 1 accepted no row: no version
    commit(table, 3, operation="OPTIMIZE")  # no data changed
    commit(table, 4, batch=0, query="q2")  # another query (a new checkpoint)
    (table / "_delta_log" / "00000000000000000003.checkpoint.parquet").write_bytes(b"")
    assert delta_log.versions(table) == [0, 1, 2, 3, 4]
    assert [(c.version, c.batch_id, c.files) for c in delta_log.batch_commits(table, query="q1")] == [(1, 0, 2), (2, 2, 1)]
    assert [c.version for c in delta_log.batch_commits(table, after=1)] == [2, 4]
    assert delta_log.last_batch(table, query="q1") == 2 and delta_log.last_batch(table, query="q1", through=1) == 0
    assert delta_log.last_batch(table) == 0  # q2's, the newest
    assert delta_log.files_after(table, 0) == 4 and delta_log.files_after(table, 2) == 1  # the compaction's are no data
    (table / "_delta_log" / "00000000000000000002.json").write_text("{torn")
    assert delta_log.batch_commit(table, 2) is None  # unreadable: not a batch


def test_a_reader_has_read_the_versions_before_its_offset_or_its_snapshot_once_done() -> None:
    def offset(version: int, index: int, snapshot: bool = False) -> dict:
        return {"sourceVersion": 1, "reservoirId": "t", "reservoirVersion": version, "index": index,
                "isStartingVersion": snapshot}

    assert delta_log.read_through(offset(5, -1)) == 4  # nothing of version 5 yet
    assert delta_log.read_through(offset(5, 3)) == 4  # part of version 5
    assert delta_log.read_through(offset(5, delta_log.END_INDEX)) == 5
    assert delta_log.read_through(offset(2, 8, snapshot=True)) == -1  # still reading the snapshot
    assert delta_log.read_through({"logOffset": 3}) is None  # a file source's, not a Delta source's
    assert delta_log.read_through(None) is None


def test_a_partition_column_s_values_are_those_of_the_newest_version_s_files(tmp_path: Path) -> None:
    from datetime import date

    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "accepted"
    assert delta_log.partition_values(table, "event_date") == set()  # no table yet
    rows = pa.table({"x": [1, 2], "event_date": pa.array([date(2026, 1, 1), date(2026, 1, 3)])})
    write_deltalake(str(table), rows, partition_by=["event_date"])
    assert delta_log.partition_values(table, "event_date") == {"2026-01-01", "2026-01-03"}
    write_deltalake(str(table), rows.slice(1), partition_by=["event_date"], mode="overwrite")
    assert delta_log.partition_values(table, "event_date") == {"2026-01-03"}  # the first day's file removed
    assert delta_log.partition_values(table, "x") == set()  # not a partition column
