"""The accounting of input rows: folding progress events, and each output's balance."""

from __future__ import annotations

from spark_jobs.quality.accounting import (
    BALANCED,
    INCOMPLETE,
    NOT_CHECKABLE,
    PENDING,
    UNBALANCED,
    StreamAccounting,
    Totals,
    accepted_measure,
    balance,
    fold,
)
from spark_jobs.spec import default_spec_dir, load_spec


def progress(batch: int, rows: int, late: int = 0, dup: int = 0, sink: int = 0, query_id: str = "q1") -> dict:
    return {"event": "progress", "id": query_id, "batch_id": batch, "input_rows": rows,
            "dropped_by_watermark": late, "dropped_duplicates": dup, "sink_rows": sink}


def test_fold_adds_each_committed_batch_once_and_continues_where_it_stopped() -> None:
    events = [progress(0, 10, sink=9, late=1), progress(1, 5, dup=2, sink=3), progress(2, 7, sink=7)]
    first = fold(Totals(), events[:2], "q1", 1)
    assert (first.input, first.dropped_late, first.duplicates, first.sink_rows, first.through_batch) == (15, 1, 2, 12, 1)
    # the next run sees the same events again plus a new batch: only batch 2 is added
    second = fold(Totals.from_dict(first.to_dict()), events, "q1", 2)
    assert (second.input, second.sink_rows, second.through_batch, second.missing_batches) == (22, 19, 2, [])
    # an uncommitted batch's event (it cannot exist, but a reader may race the commit) is not counted
    assert fold(second, [*events, progress(3, 100)], "q1", 2).input == 22


def test_fold_counts_a_replayed_batch_once_ignores_other_queries_and_resets_on_a_new_checkpoint() -> None:
    events = [progress(0, 10), progress(0, 10), progress(0, 99, query_id="other")]
    assert fold(Totals(), events, "q1", 0).input == 10
    reset = fold(Totals(query_id="q1", through_batch=5, input=500), [progress(0, 3, query_id="q2")], "q2", 0)
    assert (reset.query_id, reset.input, reset.through_batch) == ("q2", 3, 0)


def test_a_batch_without_its_progress_event_is_recorded_as_missing() -> None:
    totals = fold(Totals(), [progress(0, 10), progress(2, 4)], "q1", 2)
    assert totals.missing_batches == [1] and totals.input == 14
    b = balance("readings", totals, {"a"}, {"a"}, {}, 14, 2, "rows")
    assert b.status == INCOMPLETE and "batch(es) [1]" in b.message


def test_a_committed_batch_whose_event_is_not_written_yet_waits_for_the_next_fold() -> None:
    # Spark commits a batch, then posts its progress event: a reader can come in between
    early = fold(Totals(), [progress(0, 10), progress(1, 5)], "q1", 2)
    assert (early.input, early.through_batch, early.waiting_for, early.missing_batches) == (15, 1, 2, [])
    b = balance("readings", early, {"a"}, {"a"}, {}, 15, 2, "rows")
    assert b.status == PENDING and "progress event of batch 2 is not written yet" in b.message
    later = fold(Totals.from_dict(early.to_dict()), [progress(0, 10), progress(1, 5), progress(2, 7)], "q1", 2)
    assert (later.input, later.through_batch, later.waiting_for, later.missing_batches) == (22, 2, None, [])
    assert balance("readings", later, {"a"}, {"a"}, {}, 22, 2, "rows").status == BALANCED


def test_balance_checks_input_against_sink_quarantine_duplicates_and_late_rows() -> None:
    totals = fold(Totals(), [progress(0, 10, late=1, dup=1), progress(1, 10)], "q1", 1)
    quarantined = {"part-1.json": 2, "part-9.json": 5}  # part-9 is not among this query's files
    ok = balance("readings", totals, {"part-1.json", "part-2.json"}, {"part-1.json", "part-2.json", "part-9.json"},
                 quarantined, 16, 1, "rows")
    assert (ok.status, ok.quarantined, ok.difference) == (BALANCED, 2, 0)
    lost = balance("readings", totals, {"part-1.json", "part-2.json"}, {"part-1.json", "part-2.json"},
                   quarantined, 15, 1, "rows")
    assert lost.status == UNBALANCED and lost.difference == 1 and "1 row(s) unaccounted for" in lost.message


def test_balance_waits_when_the_evidence_is_not_at_the_same_point() -> None:
    totals = fold(Totals(), [progress(0, 10)], "q1", 0)
    behind = balance("readings", totals, {"a", "b"}, {"a"}, {}, 10, 0, "rows")
    assert behind.status == PENDING and "quarantine query has not yet taken 1 file(s)" in behind.message
    ahead = balance("readings", totals, {"a"}, {"a"}, {}, 12, 1, "rows")
    assert ahead.status == PENDING and "sink holds batch 1" in ahead.message
    windows = balance("site_temperature_10m", totals, {"a"}, {"a"}, {}, None, None, None)
    assert windows.status == NOT_CHECKABLE and windows.difference is None


def test_which_outputs_have_readable_accepted_rows() -> None:
    sensors = load_spec(default_spec_dir() / "sensors.yaml")
    clicks = load_spec(default_spec_dir() / "clicks.yaml")
    assert {o.name: accepted_measure(sensors, o) for o in sensors.outputs} == {
        "readings": "rows", "site_temperature_10m": None, "device_status": "sum:readings"}
    assert {o.name: accepted_measure(clicks, o) for o in clicks.outputs} == {
        "views_per_minute": None, "page_totals": "sum:views"}


def test_stream_accounting_fails_on_imbalance_and_on_a_high_quarantine_rate() -> None:
    totals = fold(Totals(), [progress(0, 100)], "q1", 0)
    good = balance("readings", totals, {"a"}, {"a"}, {"a": 4}, 96, 0, "rows")
    assert StreamAccounting(100, 4, 0.05, [good]).ok
    high = StreamAccounting(100, 6, 0.05, [good])
    assert high.problems == ["quarantine rate 6.00% (6 of 100 input rows) is above the threshold 5.00%"]
    bad = balance("readings", totals, {"a"}, {"a"}, {"a": 4}, 90, 0, "rows")
    assert StreamAccounting(100, 4, 0.05, [bad]).problems[0].startswith("accounting of readings: unbalanced")
