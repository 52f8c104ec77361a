"""The accounting of input rows: folding progress events, the stream's balance, each output's."""

from __future__ import annotations

from spark_jobs.plan import compile_plan
from spark_jobs.quality.accounting import (
    BALANCED,
    INCOMPLETE,
    NOT_CHECKABLE,
    PENDING,
    UNBALANCED,
    StreamAccounting,
    Totals,
    accepted_measure,
    fold,
    ingestion_balance,
    output_balance,
    written_by_ingestion_balance,
)
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import load_spec


def progress(batch: int, rows: int, late: int = 0, dup: int = 0, sink: int = 0, query_id: str = "q1") -> dict:
    return {"event": "progress", "id": query_id, "batch_id": batch, "input_rows": rows,
            "dropped_by_watermark": late, "dropped_duplicates": dup, "sink_rows": sink}


def ingested(batch: int, accepted: int, quarantined: int = 0, late: int = 0, unmatched: int = 0,
             query_id: str = "q1") -> dict:
    return {"event": "ingested", "id": query_id, "batch_id": batch, "accepted": accepted, "quarantined": quarantined,
            "late": late, "unmatched": unmatched}


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
    b = output_balance("readings", totals, 14, 2, "rows")
    assert b.status == INCOMPLETE and "batch(es) [1]" in b.message


def test_the_ingestion_needs_both_events_of_a_batch() -> None:
    # the ingested event is written inside the batch, the progress event after its commit
    events = [progress(0, 10, dup=1), ingested(0, 7, 2), ingested(1, 5), progress(2, 3), ingested(2, 3)]
    totals = fold(Totals(), events, "q1", 2, ingestion=True)
    assert totals.missing_batches == [1]
    assert (totals.input, totals.accepted, totals.quarantined, totals.duplicates) == (13, 10, 2, 1)
    b = ingestion_balance(totals, 10, 2, 2, 2)
    assert b.status == INCOMPLETE and "batch(es) [1]" in b.message


def test_a_committed_batch_whose_event_is_not_written_yet_waits_for_the_next_fold() -> None:
    # Spark commits a batch, then posts its progress event: a reader can come in between
    early = fold(Totals(), [progress(0, 10), progress(1, 5)], "q1", 2)
    assert (early.input, early.through_batch, early.waiting_for, early.missing_batches) == (15, 1, 2, [])
    b = output_balance("readings", early, 15, 2, "rows")
    assert b.status == PENDING and "progress event of batch 2 is not written yet" in b.message
    later = fold(Totals.from_dict(early.to_dict()), [progress(0, 10), progress(1, 5), progress(2, 7)], "q1", 2)
    assert (later.input, later.through_batch, later.waiting_for, later.missing_batches) == (22, 2, None, [])
    assert output_balance("readings", later, 22, 2, "rows").status == BALANCED


def test_the_stream_balances_input_against_both_tables_duplicates_late_and_unmatched_rows() -> None:
    events = [progress(0, 10, late=1, dup=1), ingested(0, 5, 2, unmatched=1), progress(1, 6), ingested(1, 4, 0, late=2)]
    totals = fold(Totals(), events, "q1", 1, ingestion=True)
    ok = ingestion_balance(totals, 9, 1, 2, 1)
    assert (ok.status, ok.input, ok.accepted, ok.quarantined, ok.duplicates, ok.dropped_late, ok.unmatched,
            ok.difference) == (BALANCED, 16, 9, 2, 1, 3, 1, 0)
    assert "+ 1 unmatched" in ok.describe()
    lost = ingestion_balance(totals, 8, 1, 2, 1)  # a row went missing from the accepted-rows table
    assert lost.status == UNBALANCED and "the tables hold 8 accepted and 2 quarantined" in lost.message
    behind = ingestion_balance(totals, 9, 2, 2, 1)
    assert behind.status == PENDING and "accepted-rows table holds batch 2" in behind.message
    counted_wrong = fold(Totals(), [progress(0, 10), ingested(0, 9)], "q1", 0, ingestion=True)
    assert ingestion_balance(counted_wrong, 9, 0, 0, 0).status == UNBALANCED


def test_a_transform_is_accounted_as_filtered_rows_or_as_rows_in_and_out() -> None:
    # 10 in: 1 duplicate, 1 quarantined, 8 into the transform, which kept 6 (2 filtered)
    filtering = [progress(0, 10, dup=1), {**ingested(0, 6, 1), "transform_in": 8, "filtered": 2}]
    b = ingestion_balance(fold(Totals(), filtering, "q1", 0, ingestion=True), 6, 0, 1, 0)
    assert (b.status, b.difference, b.filtered) == (BALANCED, 0, 2)
    assert "10 in = 6 accepted + 2 filtered by the transform + 1 quarantined" in b.describe()
    # an explode: 8 rows into the transform gave 20 accepted rows; the table holds the 20
    exploding = [progress(0, 10, dup=1), {**ingested(0, 20, 1), "transform_in": 8}]
    b = ingestion_balance(fold(Totals(), exploding, "q1", 0, ingestion=True), 20, 0, 1, 0)
    assert (b.status, b.difference, b.filtered) == (BALANCED, 0, None)
    assert "10 in = 8 into the transform (which gave 20 accepted rows) + 1 quarantined" in b.describe()
    lost = ingestion_balance(fold(Totals(), exploding, "q1", 0, ingestion=True), 19, 0, 1, 0)
    assert lost.status == UNBALANCED and "the tables hold 19 accepted" in lost.message


def test_an_output_balances_the_rows_it_read_against_its_sink_and_its_late_rows() -> None:
    totals = fold(Totals(), [progress(0, 10, late=1), progress(1, 10)], "q1", 1)
    assert output_balance("readings", totals, 19, 1, "rows").status == BALANCED
    lost = output_balance("readings", totals, 18, 1, "rows")
    assert lost.status == UNBALANCED and lost.difference == 1 and "1 row(s) unaccounted for" in lost.message
    ahead = output_balance("readings", totals, 22, 2, "rows")
    assert ahead.status == PENDING and "sink holds batch 2" in ahead.message
    windows = output_balance("site_temperature_10m", totals, None, None, None)
    assert windows.status == NOT_CHECKABLE and windows.difference is None


def test_which_outputs_have_readable_accepted_rows() -> None:
    sensors = load_spec(default_spec_dir() / "sensors.yaml")
    clicks = load_spec(default_spec_dir() / "clicks.yaml")
    assert {o.name: accepted_measure(o) for o in compile_plan(sensors, Layout(sensors)).outputs} == {
        "readings": "rows", "site_temperature_10m": None, "device_status": "sum:readings"}
    assert {o.name: accepted_measure(o) for o in compile_plan(clicks, Layout(clicks)).outputs} == {
        "views_per_minute": None, "page_totals": "sum:views"}


def test_stream_accounting_fails_on_imbalance_and_on_a_high_quarantine_rate() -> None:
    totals = fold(Totals(), [progress(0, 100), ingested(0, 96, 4)], "q1", 0, ingestion=True)
    good = ingestion_balance(totals, 96, 0, 4, 0)
    assert StreamAccounting(100, 4, 0.05, [good]).ok
    high = StreamAccounting(100, 6, 0.05, [good])
    assert high.problems == ["quarantine rate 6.00% (6 of 100 input rows) is above the threshold 5.00%"]
    bad = output_balance("readings", fold(Totals(), [progress(0, 96)], "q1", 0), 90, 0, "rows")
    assert StreamAccounting(100, 4, 0.05, [bad]).problems[0].startswith("accounting of readings: unbalanced")


def test_the_output_the_ingestion_writes_reflects_exactly_the_rows_the_ingestion_accepted() -> None:
    # its sink is the accepted-rows table: the ingestion's accepted count against the rows read back there
    totals = fold(Totals(), [progress(0, 10), ingested(0, 7, 3), progress(1, 5), ingested(1, 5)], "q1", 1,
                  ingestion=True)
    ok = written_by_ingestion_balance("readings", totals, 12, 1)
    assert (ok.status, ok.input, ok.accepted, ok.difference, ok.batches) == (BALANCED, 12, 12, 0, 2)
    assert "written by the ingestion" in ok.message
    lost = written_by_ingestion_balance("readings", totals, 11, 1)
    assert lost.status == UNBALANCED and "1 row(s) unaccounted for" in lost.message
    assert written_by_ingestion_balance("readings", totals, 12, 2).status == PENDING  # the table holds a batch not yet committed
