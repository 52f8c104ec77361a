"""Reading a checkpoint without Spark: which files the stream's batches took, and when."""

from __future__ import annotations

import json
import os
from pathlib import Path

from spark_jobs.runtime.checkpoint import (
    batch_planned_by,
    file_name,
    landing_backlog,
    processed_files,
    reads_nothing,
    source_log_offset,
)


def _checkpoint(root: Path, log_offsets: list[int], source_log: dict[int, list[str]]) -> Path:
    (root / "offsets").mkdir(parents=True)
    (root / "sources" / "0").mkdir(parents=True)
    for batch, log_offset in enumerate(log_offsets):
        (root / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{log_offset}}}\n')
    for log_id, files in source_log.items():
        lines = [json.dumps({"path": f"file:///landing/{f}", "timestamp": 0, "batchId": log_id}) for f in files]
        (root / "sources" / "0" / str(log_id)).write_text("\n".join(["v1", *lines]) + "\n")
    return root


def test_batches_map_to_the_source_log_through_their_offsets(tmp_path: Path) -> None:
    # stream batch 1 found no new files (a no-data batch): from then on the source's log ids lag behind
    ckpt = _checkpoint(tmp_path, [0, 0, 1, 2], {0: ["a.json"], 1: ["b.json"], 2: ["c.json"]})
    assert [source_log_offset(ckpt, b) for b in range(4)] == [0, 0, 1, 2]
    assert processed_files(ckpt, through_batch=1) == {"file:///landing/a.json"}
    assert processed_files(ckpt, through_batch=2) == {"file:///landing/a.json", "file:///landing/b.json"}
    assert len(processed_files(ckpt)) == 3


def test_a_batch_reads_nothing_when_every_source_offset_is_the_batch_befores(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, [0, 0, 1, 2], {0: ["a.json"], 1: ["b.json"], 2: ["c.json"]})
    (ckpt / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":5}\n{"logOffset":0}\n')  # only the watermark moved
    assert [reads_nothing(ckpt, b) for b in range(4)] == [False, True, False, False]
    assert not reads_nothing(ckpt, 4)  # not planned: unknown
    (ckpt / "offsets" / "2").write_text('v1\n{"batchWatermarkMs":5}\n')  # torn: no source line
    (ckpt / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":5}\n')
    assert not reads_nothing(ckpt, 3)


def test_a_batch_without_a_readable_offsets_entry_took_nothing_known(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, [0], {0: ["a.json"]})
    assert source_log_offset(ckpt, 7) is None
    assert processed_files(ckpt, through_batch=7) == set()


def test_files_are_known_by_name() -> None:
    assert file_name("file:///data/landing/part-000001.json") == "part-000001.json"
    assert file_name("file:/data/landing%20x/part%20one.json") == "part one.json"


def test_the_batch_planned_by_a_moment_is_read_from_the_offsets_log_times(tmp_path: Path) -> None:
    ckpt = _checkpoint(tmp_path, [0, 1, 2], {0: ["a.json"], 1: ["b.json"], 2: ["c.json"]})
    for batch, at in enumerate((100.0, 200.0, 300.0)):
        os.utime(ckpt / "offsets" / str(batch), (at, at))
    assert [batch_planned_by(ckpt, t) for t in (99, 100, 250, 1000)] == [-1, 0, 1, 2]  # -1: nothing planned yet
    (ckpt / "offsets" / "0").unlink()  # purged: what was planned at 150 is no longer known
    assert [batch_planned_by(ckpt, t) for t in (150, 250)] == [None, 1]
    assert batch_planned_by(tmp_path / "none", 1000) == -1


def test_the_backlog_at_an_earlier_moment_counts_only_files_landed_by_then(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    for name, at in (("a.json", 100.0), ("b.json", 200.0), ("c.json", 300.0), (".hidden", 1.0), ("_tmp", 1.0)):
        (landing / name).write_text("{}\n")
        os.utime(landing / name, (at, at))
    taken = {"file:///x/a.json"}
    assert landing_backlog(landing, taken) == (2, 6)
    assert landing_backlog(landing, taken, landed_by=250)[0] == 1
    assert landing_backlog(landing, set(), landed_by=50)[0] == 0


def test_rows_waiting_are_estimated_from_a_sample_of_the_waiting_files(tmp_path: Path) -> None:
    from spark_jobs.runtime.checkpoint import (
        estimate_rows,
        waiting_files,
    )

    landing = tmp_path / "landing"
    landing.mkdir()
    for i, rows in enumerate((10, 10, 10, 10)):
        (landing / f"f{i}.csv").write_text("a,b\n" + "".join(f"{j},x\n" for j in range(rows)))
        os.utime(landing / f"f{i}.csv", (1000 + i, 1000 + i))
    waiting = waiting_files(landing, {"f0.csv"})
    assert [f.name for f in waiting] == ["f1.csv", "f2.csv", "f3.csv"]  # oldest first, taken ones left out
    assert estimate_rows(landing, waiting, header=True, sample=2) == 30  # 2 files read, 3 files' bytes
    assert estimate_rows(landing, waiting, header=False) == 33
    assert estimate_rows(landing, [], header=True) is None


def test_a_query_owes_a_batch_while_its_next_watermark_is_newer_than_its_last_batch_s(tmp_path: Path) -> None:
    from spark_jobs.runtime.checkpoint import watermark_to_catch_up

    def batch(n: int, ran: int, following: int) -> None:
        for log, line in (("offsets", f'{{"batchWatermarkMs":{ran},"batchTimestampMs":1,"conf":{{}}}}\n{{}}'),
                          ("commits", f'{{"nextBatchWatermarkMs":{following}}}')):
            (tmp_path / log).mkdir(exist_ok=True)
            (tmp_path / log / str(n)).write_text(f"v1\n{line}")

    assert not watermark_to_catch_up(tmp_path)  # nothing committed
    batch(0, 0, 60_000)
    assert watermark_to_catch_up(tmp_path)  # the next batch, without data, emits what 60 s closes
    batch(1, 60_000, 60_000)
    assert not watermark_to_catch_up(tmp_path)
