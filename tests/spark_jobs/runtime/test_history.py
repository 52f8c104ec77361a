"""The stream's history for its charts: folded from the progress log, kept per batch for hours
and per minute for days, bounded, and never in the way of the batch that writes it."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from spark_jobs.runtime.history import (
    MINUTE,
    MINUTE_KEEP_SECONDS,
    RAW,
    RAW_KEEP_SECONDS,
    STREAM,
    History,
    values_of,
)
from spark_jobs.runtime.progress import EventLog

NOW = 1_800_000_000.0 - 1_800_000_000.0 % 60  # a minute's start


def progress(at: float, query: str = "_ingest", rows: int = 100, watermark: str = "2027-01-15T07:59:00Z") -> dict:
    return {"event": "progress", "logged_at": at, "query": query, "batch_id": 1, "input_rows": rows,
            "input_rows_per_second": 20.0, "processed_rows_per_second": 50.0, "timestamp": "2027-01-15T08:00:00Z",
            "watermark": watermark, "duration_ms": {"triggerExecution": 2000}, "state_rows": 7, "sink_rows": -1,
            "dropped_duplicates": 3}


def test_a_progress_event_gives_rates_duration_lag_state_and_duplicates() -> None:
    query, values = values_of(progress(NOW))
    assert query == "_ingest"
    assert values == {"input_rows": 100, "input_rps": 20.0, "processed_rps": 50.0, "batch_ms": 2000, "lag_s": 60.0,
                      "state_rows": 7, "duplicates": 3}
    _, no_watermark = values_of(progress(NOW, watermark="1970-01-01T00:00:00.000Z"))
    assert "lag_s" not in no_watermark  # no watermark yet is not 56 years of lag
    ingested = {"event": "ingested", "query": "_ingest", "rows": 96, "accepted": 90, "quarantined": 4, "late": 2}
    assert values_of(ingested)[1] == {"classified": 96, "accepted": 90, "quarantined": 4, "late": 2}
    assert values_of({"event": "idle", "query": "_ingest"})[1] == {}


def test_points_are_kept_per_batch_and_per_minute(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite")
    for i, rows in enumerate((100, 50, 10)):
        history.fold(progress(NOW + 10 * i, rows=rows))  # three batches in one minute
    history.fold(progress(NOW + 70, rows=5))  # the next minute
    history.sample({"backlog_files": 4}, at=NOW + 75)
    raw = history.series(NOW - 1, NOW + 100, tier=RAW)
    assert [p.sum for p in raw[("_ingest", "input_rows")]] == [100, 50, 10, 5]
    assert [p.last for p in raw[(STREAM, "backlog_files")]] == [4]
    minutes = history.series(NOW - 1, NOW + 100, tier=MINUTE)[("_ingest", "input_rows")]
    assert [(p.at, p.sum, p.n, p.max, p.last) for p in minutes] == [(NOW, 160, 3, 100, 10), (NOW + 60, 5, 1, 5, 5)]
    assert history.totals(NOW - 1, NOW + 100)[("_ingest", "input_rows")] == 165


def test_the_state_bytes_of_a_batch_are_kept_and_the_newest_point_and_sums_read_in_sql(tmp_path: Path) -> None:
    """What the metrics endpoint reads at every scrape: the range's sums (as :meth:`History.series`
    adds them up) and each figure's newest point, without reading every point."""
    assert values_of({**progress(NOW), "state_bytes": 4096})[1]["state_bytes"] == 4096
    history = History(tmp_path / "h.sqlite")
    assert history.totals(NOW - 1, NOW + 100) == {} and history.latest(NOW - 1, NOW + 100) == {}
    for i, rows in enumerate((100, 50, 10)):
        history.fold({**progress(NOW + 10 * i, rows=rows), "state_bytes": 1000 + i})
    history.fold(progress(NOW + 200, rows=7))  # after the range
    series = history.series(NOW - 1, NOW + 100)  # the tier the range takes, as theirs
    assert history.totals(NOW - 1, NOW + 100) == {key: sum(p.sum for p in points) for key, points in series.items()}
    latest = history.latest(NOW - 1, NOW + 100)
    assert latest == {key: points[-1] for key, points in series.items()}
    assert (latest[("_ingest", "input_rows")].last, latest[("_ingest", "state_bytes")].last) == (10, 1002)


def test_the_range_picks_the_tier_that_keeps_it(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite")
    now = time.time()
    history.fold(progress(now - 30, rows=1))
    history.fold(progress(now - 20, rows=2))
    assert len(history.series(now - 900)[("_ingest", "input_rows")]) == 2  # 15 minutes: every batch
    day = history.series(now - 86400)[("_ingest", "input_rows")]  # 24 hours: per minute
    assert sum(p.sum for p in day) == 3 and all(p.at % 60 == 0 for p in day)


def test_old_points_are_deleted_so_the_file_stays_bounded(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite")
    start = NOW
    for i in range(0, MINUTE_KEEP_SECONDS + 2 * 3600, 600):  # 50 hours, a batch every 10 minutes
        history.fold(progress(start + i))
    end = start + MINUTE_KEEP_SECONDS + 2 * 3600 - 600
    raw = history.series(0, end + 1, tier=RAW)[("_ingest", "input_rows")]
    assert raw[0].at >= end - RAW_KEEP_SECONDS - 600
    minutes = history.series(0, end + 1, tier=MINUTE)[("_ingest", "input_rows")]
    assert minutes[0].at >= end - MINUTE_KEEP_SECONDS - 600 and len(minutes) <= MINUTE_KEEP_SECONDS // 600 + 2


def test_the_event_log_folds_what_it_writes_into_the_history(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite")
    log = EventLog(tmp_path / "progress.jsonl", history=history)
    log.write({k: v for k, v in progress(NOW).items() if k != "logged_at"})
    log.write({"event": "ingested", "query": "_ingest", "accepted": 90, "quarantined": 4, "late": 2})
    totals = history.totals(time.time() - 60)
    assert totals[("_ingest", "input_rows")] == 100 and totals[("_ingest", "quarantined")] == 4


def test_a_history_that_cannot_be_written_loses_the_point_not_the_batch(tmp_path: Path, caplog) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    history = History(blocked / "h.sqlite")
    with caplog.at_level(logging.WARNING):
        history.fold(progress(NOW))
        history.fold(progress(NOW + 1))
    assert sum("cannot be written" in r.getMessage() for r in caplog.records) == 1  # said once
    assert History(tmp_path / "missing.sqlite").series(0) == {}


def test_a_history_file_removed_under_the_writer_is_made_again(tmp_path: Path) -> None:
    history = History(tmp_path / "h.sqlite")
    history.fold(progress(NOW))
    (tmp_path / "h.sqlite").unlink()
    history.fold(progress(NOW + 10))  # lost: the table is gone
    history.fold(progress(NOW + 20))
    assert [p.at for p in history.series(0, NOW + 100, tier=RAW)[("_ingest", "input_rows")]] == [NOW + 20]
