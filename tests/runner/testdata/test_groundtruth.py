"""The expected-results model on small hand-written records."""

from __future__ import annotations

import pytest

from runner.testdata import groundtruth as gt
from spark_jobs.plan import compile_plan
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import parse_spec
from spark_jobs.stream_spec.models import Window

DAY = "2026-01-01T"


def ts(clock: str) -> str:
    """``'00:07'`` or ``'00:07:30'`` -> a full ISO timestamp on the test day."""
    return f"{DAY}{clock}{':00' if clock.count(':') == 1 else ''}.000Z"


def make(tmp_path, outputs, *, watermark="10 minutes", files_per_trigger=1, dedup=True):
    ref = tmp_path / "reference"
    ref.mkdir(exist_ok=True)
    (ref / "devices.csv").write_text("device_id,site\nd1,north\nd2,south\nd3,\n")
    data = {
        "name": "t",
        "source": {"type": "files", "path": "landing/t", "format": "json", "max_files_per_trigger": files_per_trigger,
                   "columns": [{"name": "event_id", "type": "string", "required": True},
                               {"name": "device_id", "type": "string", "required": True},
                               {"name": "ts", "type": "timestamp", "required": True},
                               {"name": "temperature", "type": "double"},
                               {"name": "status", "type": "string"}]},
        "quarantine": {"path": "quarantine/t"},
        "enrich": [{"name": "devices", "path": "reference/devices.csv", "key": ["device_id"],
                    "columns": [{"name": "device_id", "type": "string"}, {"name": "site", "type": "string"}]}],
        "event_time": {"column": "ts", "watermark": watermark},
        "outputs": outputs,
        "checkpoint": "checkpoints/t",
    }
    if dedup:
        data["deduplicate"] = {"key": ["event_id"]}
    spec = parse_spec(data)
    return spec, Layout(spec, tmp_path / "data", spec_dir=tmp_path / "streams")


PASSTHROUGH = {"name": "raw", "query": {"type": "passthrough"}, "mode": "append",
               "sink": {"type": "parquet", "path": "sinks/raw"}}


def agg_output(name, aggregates, group_by, window=None, mode="append"):
    query = {"type": "aggregate", "group_by": group_by, "aggregates": aggregates}
    if window:
        query["window"] = window
    return {"name": name, "query": query, "mode": mode, "sink": {"type": "parquet", "path": f"sinks/{name}"}
            if mode == "append" else {"type": "table", "table": name}}


def rec(file, line, event_id, device, clock, temperature=20.0, status="ok", kind=None):
    r = {"file": file, "line": line, "event": {"event_id": event_id, "device_id": device, "ts": ts(clock),
                                               "temperature": temperature, "status": status}}
    if kind:
        r["kind"] = kind
    return r


def bad(file, line):
    return {"file": file, "line": line, "kind": "malformed", "reason": "truncated", "raw": '{"event_id": "x'}


def test_time_helpers_round_trip():
    assert gt.format_ts(gt.parse_ts("2026-01-01T00:00:01.123Z")) == "2026-01-01T00:00:01.123Z"
    assert gt.parse_ts("1970-01-01T00:00:01.5Z") == 1500
    assert gt.format_date(gt.parse_ts("2026-03-04T23:59:59.999Z")) == "2026-03-04"


def test_window_assignment_tumbling_and_sliding():
    at = gt.parse_ts(ts("00:07"))
    minute = 60_000
    base = gt.parse_ts(ts("00:00"))
    assert gt.windows_for(at, Window(duration="10 minutes")) == [(base, base + 10 * minute)]
    assert gt.windows_for(at, Window(duration="10 minutes", slide="5 minutes")) == [
        (base, base + 10 * minute), (base + 5 * minute, base + 15 * minute)]
    # a window is [start, end): a row exactly at 00:10 is in the next tumbling window
    edge = gt.parse_ts(ts("00:10"))
    assert gt.windows_for(edge, Window(duration="10 minutes")) == [(edge, edge + 10 * minute)]
    assert gt.windows_for(edge, Window(duration="10 minutes", slide="5 minutes")) == [
        (edge - 5 * minute, edge + 5 * minute), (edge, edge + 10 * minute)]


def test_sliding_windows_only_closed_ones_are_emitted(tmp_path):
    out = agg_output("per_site", [{"name": "n", "fn": "count"}, {"name": "hot", "fn": "max", "column": "temperature"}],
                     ["site"], window={"duration": "10 minutes", "slide": "5 minutes"})
    spec, layout = make(tmp_path, [out])
    records = [rec(1, 1, "e1", "d1", "00:07", 21.0), rec(1, 2, "e2", "d1", "00:12", 25.0),
               rec(2, 1, "e3", "d2", "00:26", 30.0)]
    result = gt.expected(compile_plan(spec, layout), records)
    # max event time 00:26, watermark delay 10 minutes: windows ending at or before 00:16 are closed
    assert result["watermark"]["final"] == ts("00:16")
    rows = result["outputs"]["per_site"]["rows"]
    assert rows == [
        {"window_start": ts("00:00"), "window_end": ts("00:10"), "site": "north", "n": 1, "hot": 21.0},
        {"window_start": ts("00:05"), "window_end": ts("00:15"), "site": "north", "n": 2, "hot": 25.0},
    ]
    assert result["outputs"]["per_site"]["key"] == ["window_start", "window_end", "site"]


def test_window_ending_exactly_at_the_watermark_is_closed(tmp_path):
    out = agg_output("per_site", [{"name": "n", "fn": "count"}], ["site"], window={"duration": "5 minutes"})
    spec, layout = make(tmp_path, [out], watermark="5 minutes")
    records = [rec(1, 1, "e1", "d1", "00:01"), rec(1, 2, "e2", "d1", "00:07"), rec(2, 1, "e3", "d1", "00:10")]
    rows = gt.expected(compile_plan(spec, layout), records)["outputs"]["per_site"]["rows"]
    # final watermark 00:05: [00:00, 00:05) closed, [00:05, 00:10) and [00:10, 00:15) still open
    assert [(r["window_start"], r["n"]) for r in rows] == [(ts("00:00"), 1)]


def test_latest_follows_event_time_not_arrival_order(tmp_path):
    out = agg_output("status", [{"name": "last", "fn": "latest", "column": "status"},
                                {"name": "seen", "fn": "max", "column": "ts"},
                                {"name": "n", "fn": "count"}], ["device_id"], mode="update")
    spec, layout = make(tmp_path, [out])
    records = [rec(1, 1, "e1", "d1", "00:10", status="warn"),
               rec(2, 1, "e2", "d1", "00:05", status="fail", kind="late_within"),  # older, arrives later
               rec(2, 2, "e3", "d2", "00:11", status="ok")]
    rows = gt.expected(compile_plan(spec, layout), records)["outputs"]["status"]["rows"]
    assert rows == [{"device_id": "d1", "last": "warn", "seen": ts("00:10"), "n": 2},
                    {"device_id": "d2", "last": "ok", "seen": ts("00:11"), "n": 1}]


def test_latest_with_a_tie_is_rejected(tmp_path):
    out = agg_output("status", [{"name": "last", "fn": "latest", "column": "status"}], ["device_id"], mode="update")
    spec, layout = make(tmp_path, [out])
    records = [rec(1, 1, "e1", "d1", "00:10", status="warn"), rec(1, 2, "e2", "d1", "00:10", status="ok")]
    with pytest.raises(gt.GroundTruthError, match="ambiguous"):
        gt.expected(compile_plan(spec, layout), records)


def test_left_join_with_unknown_key_gives_null_and_sorts_first(tmp_path):
    out = agg_output("per_site", [{"name": "n", "fn": "count"}], ["site"], mode="update")
    spec, layout = make(tmp_path, [PASSTHROUGH, out])
    records = [rec(1, 1, "e1", "d1", "00:01"), rec(1, 2, "e2", "nope", "00:02"), rec(1, 3, "e3", "d2", "00:03"),
               rec(1, 4, "e4", "d3", "00:04")]  # d3 is known, with an empty (null) site
    result = gt.expected(compile_plan(spec, layout), records)
    raw = {r["event_id"]: r for r in result["outputs"]["raw"]["rows"]}
    assert raw["e2"]["site"] is None and raw["e1"]["site"] == "north"
    assert raw["e2"]["event_date"] == "2026-01-01"
    assert result["outputs"]["per_site"]["rows"] == [{"site": None, "n": 2}, {"site": "north", "n": 1},
                                                     {"site": "south", "n": 1}]


def test_dedup_late_drop_and_quarantine_counts(tmp_path):
    out = agg_output("per_device", [{"name": "n", "fn": "count"}], ["device_id"], mode="update")
    spec, layout = make(tmp_path, [PASSTHROUGH, out], watermark="5 minutes")
    records = [
        rec(1, 1, "e1", "d1", "00:10"),
        bad(1, 2),
        {"file": 1, "line": 3, "kind": "malformed", "event": {"event_id": "e9", "device_id": None, "ts": ts("00:10")}},
        rec(2, 1, "e5", "d2", "00:11"),
        # file 3 is judged late by a watermark between maxts(1) - 5 min = 00:05 and maxts(2) - 5 min = 00:06
        rec(3, 1, "e1", "d1", "00:10", kind="duplicate"),  # exact copy, its first occurrence still in state
        rec(3, 2, "e2", "d1", "00:05", kind="late_beyond"),  # at or below 00:05: dropped
        rec(3, 3, "e3", "d2", "00:06:01"),  # above 00:06: kept
        {"file": 3, "line": 4, "event": {"event_id": "e4", "device_id": "d1", "ts": None}},  # required ts is null
    ]
    result = gt.expected(compile_plan(spec, layout), records)
    assert result["counts"] == {"input_records": 8, "quarantined": 3, "unjoined": 0, "duplicates": 1,
                                "dropped_late": 1, "accepted": 3, "undecided": 0}
    assert [r["event_id"] for r in result["outputs"]["raw"]["rows"]] == ["e1", "e3", "e5"]
    assert result["outputs"]["per_device"]["rows"] == [{"device_id": "d1", "n": 1}, {"device_id": "d2", "n": 2}]
    assert result["files"] == 3 and result["ledger_records"] == 8
    # what the quarantine holds: the text as written, or for a record written as an event its non-null values
    assert result["quarantine"] == [
        {"file": 1, "name": None, "line": 2, "reason": "truncated", "raw": '{"event_id": "x'},
        {"file": 1, "name": None, "line": 3, "reason": None,
         "raw": '{"event_id": "e9", "ts": "2026-01-01T00:10:00.000Z"}'},
        {"file": 3, "name": None, "line": 4, "reason": "missing_required", "raw": '{"event_id": "e4", "device_id": "d1"}'},
    ]


def test_nothing_in_the_first_file_is_late(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH], watermark="1 minute")
    result = gt.expected(compile_plan(spec, layout), [rec(1, 1, "e1", "d1", "00:10"), rec(1, 2, "e2", "d1", "00:01")])
    assert result["counts"]["dropped_late"] == 0 and result["counts"]["accepted"] == 2
    # file 2 may be read by batch 1 (judged by batch 0's unset watermark) or, after a
    # no-data batch, by batch 2 (judged by 00:09): its fate is not predictable
    with pytest.raises(gt.GroundTruthError, match="micro-batch"):
        gt.expected(compile_plan(spec, layout), [rec(1, 1, "e1", "d1", "00:10"), rec(2, 1, "e2", "d1", "00:01")])


def test_inner_join_drops_unmatched_rows_after_the_watermark(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH], watermark="1 minute")
    spec = spec.model_copy(update={"enrich": [spec.enrich[0].model_copy(update={"how": "inner"})]})
    result = gt.expected(compile_plan(spec, layout), [rec(1, 1, "e1", "d1", "00:01"), rec(1, 2, "e2", "nope", "00:30")])
    assert result["counts"]["unjoined"] == 1 and result["counts"]["accepted"] == 1
    # the unmatched row still moved the watermark: the join comes after it
    assert result["watermark"]["max_event_time"] == ts("00:30")


def test_without_dedup_copies_are_kept(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH], dedup=False)
    records = [rec(1, 1, "e1", "d1", "00:10"), rec(1, 2, "e1", "d1", "00:10")]
    result = gt.expected(compile_plan(spec, layout), records)
    assert result["counts"]["duplicates"] == 0 and len(result["outputs"]["raw"]["rows"]) == 2
    assert result["outputs"]["raw"]["key"] == []


def test_lateness_between_the_bounds_is_rejected(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH], watermark="1 minute", files_per_trigger=1)
    first = [rec(1, 1, "e1", "d1", "00:10"), rec(2, 1, "e2", "d1", "00:20")]
    # file 3 is judged by a watermark between maxts(1) - 1 min = 00:09 and maxts(2) - 1 min = 00:19
    dropped = gt.expected(compile_plan(spec, layout), [*first, rec(3, 1, "e3", "d1", "00:09")])
    assert dropped["counts"]["dropped_late"] == 1
    kept = gt.expected(compile_plan(spec, layout), [*first, rec(3, 1, "e3", "d1", "00:19:01")])
    assert kept["counts"]["dropped_late"] == 0
    with pytest.raises(gt.GroundTruthError, match="micro-batch"):
        gt.expected(compile_plan(spec, layout), [*first, rec(3, 1, "e3", "d1", "00:15")])
    # with 2 files per trigger, file 3 is judged by a watermark that may still be unset
    spec2, _ = make(tmp_path, [PASSTHROUGH], watermark="1 minute", files_per_trigger=2)
    with pytest.raises(gt.GroundTruthError, match="micro-batch"):
        gt.expected(compile_plan(spec2, layout), [*first, rec(3, 1, "e3", "d1", "00:09")])


def test_a_late_edge_record_follows_the_ingestion_decision_and_its_closable_windows_are_uncertain(tmp_path):
    window = agg_output("w", [{"name": "n", "fn": "count"}], ["site"], window={"duration": "5 minutes"})
    spec, layout = make(tmp_path, [PASSTHROUGH, window], watermark="1 minute", files_per_trigger=1)
    first = [rec(1, 1, "e1", "d1", "00:10"), rec(2, 1, "e2", "d1", "00:20"), rec(4, 1, "e4", "d1", "00:40")]
    # file 3 is judged by a watermark between 00:09 and 00:19: 00:14:30 is decided by the micro-batches
    records = [*first, rec(3, 1, "e3", "d1", "00:14:30", kind="late_edge")]

    undecided = gt.expected(compile_plan(spec, layout), records)
    assert undecided["counts"]["undecided"] == 1 and undecided["counts"]["accepted"] == 3
    assert "e3" not in [r["event_id"] for r in undecided["outputs"]["raw"]["rows"]]

    dropped = gt.expected(compile_plan(spec, layout), records, decided={("e3",): False})
    assert (dropped["counts"]["dropped_late"], dropped["counts"]["undecided"]) == (1, 0)
    assert dropped["outputs"]["w"]["uncertain"] == []

    kept = gt.expected(compile_plan(spec, layout), records, decided={("e3",): True})
    assert (kept["counts"]["accepted"], kept["counts"]["undecided"]) == (4, 0)
    assert "e3" in [r["event_id"] for r in kept["outputs"]["raw"]["rows"]]
    # its window [00:10, 00:15) ends below the highest watermark that judged it (00:19): the window
    # output may have closed it first, so it is not compared; every other window is
    assert kept["outputs"]["w"]["uncertain"] == [[ts("00:10"), ts("00:15"), "north"]]
    assert [r["window_start"] for r in kept["outputs"]["w"]["rows"]] == [ts("00:20")]


def test_key_repeated_after_its_state_may_have_expired_is_rejected(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH], watermark="1 minute")
    records = [rec(1, 1, "e1", "d1", "00:10"), rec(2, 1, "e2", "d1", "00:20"),
               rec(3, 1, "e1", "d2", "00:30")]  # same event_id, 20 minutes later: not an exact copy
    with pytest.raises(gt.GroundTruthError, match="left the state"):
        gt.expected(compile_plan(spec, layout), records)


def test_declared_kind_must_match(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH])
    with pytest.raises(gt.GroundTruthError, match="late_beyond"):
        gt.expected(compile_plan(spec, layout), [rec(1, 1, "e1", "d1", "00:10"), rec(2, 1, "e2", "d1", "00:09", kind="late_beyond")])
    with pytest.raises(gt.GroundTruthError, match="duplicate"):
        gt.expected(compile_plan(spec, layout), [rec(1, 1, "e1", "d1", "00:10", kind="duplicate")])


def test_aggregates_follow_sql_null_semantics(tmp_path):
    out = agg_output("stats", [{"name": "n", "fn": "count"},
                               {"name": "n_temp", "fn": "count", "column": "temperature"},
                               {"name": "total", "fn": "sum", "column": "temperature"},
                               {"name": "mean", "fn": "avg", "column": "temperature"},
                               {"name": "low", "fn": "min", "column": "temperature"},
                               {"name": "high", "fn": "max", "column": "temperature"},
                               {"name": "states", "fn": "approx_count_distinct", "column": "status"}],
                     ["device_id"], mode="complete")
    spec, layout = make(tmp_path, [out])
    records = [rec(1, 1, "e1", "d1", "00:01", 10.0, "ok"), rec(1, 2, "e2", "d1", "00:02", None, "warn"),
               rec(1, 3, "e3", "d1", "00:03", 20.0, None), rec(1, 4, "e4", "d2", "00:04", None, "ok"),
               rec(1, 5, "e5", "d1", "00:05", 30.0, "ok")]
    result = gt.expected(compile_plan(spec, layout), records)["outputs"]["stats"]
    assert result["approximate"] == ["states"]
    assert result["rows"] == [
        {"device_id": "d1", "n": 4, "n_temp": 3, "total": 60.0, "mean": 20.0, "low": 10.0, "high": 30.0, "states": 2},
        {"device_id": "d2", "n": 1, "n_temp": 0, "total": None, "mean": None, "low": None, "high": None, "states": 1},
    ]


def test_file_history_bounds_skip_empty_files():
    history = gt.FileHistory({1: 100, 2: None, 3: 300, 4: 400, 5: 500}, nonempty=[1, 3, 4, 5])
    assert history.maxts(2) == 100 and history.maxts(0) is None
    # the last 2 non-empty files up to 4 are 3 and 4 (file 2 is empty and may not count)
    assert history.floor(4, 2) == 3
    # a file about to be written counts as non-empty
    assert history.floor(6, 2) == 5
    # 1 file per trigger: file 4 is judged by a watermark from files up to 2 at least, 3 at most
    assert history.watermark_bounds(4, 1, 10) == (90, 290)
    # 2 files per trigger: up to 4 non-empty files (two batches) may be in flight
    assert history.watermark_bounds(5, 2, 10) == (None, 390)
    assert history.watermark_bounds(6, 2, 10) == (90, 490)
    assert history.watermark_bounds(1, 2, 10) == (None, None)


def future(file, line, event_id, when, kind="future"):
    r = {"file": file, "line": line, "event": {"event_id": event_id, "device_id": "d1", "ts": when,
                                               "temperature": 20.0, "status": "ok"}}
    if kind:
        r["kind"] = kind
    return r


def test_events_beyond_max_future_are_quarantined_before_the_watermark(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH], watermark="1 minute")
    now = gt.parse_ts("2026-01-01T12:00:00.000Z")
    records = [rec(1, 1, "e1", "d1", "00:10"), future(1, 2, "f1", "2100-01-01T00:00:00.000Z"),
               rec(2, 1, "e2", "d1", "00:11"), rec(3, 1, "e3", "d1", "00:12"),
               future(3, 2, "f2", "2026-01-02T12:00:01.000Z", kind=None)]  # one second beyond 1 day
    result = gt.expected(compile_plan(spec, layout), records, now_ms=now)
    assert result["counts"] == {"input_records": 5, "quarantined": 2, "unjoined": 0, "duplicates": 0,
                                "dropped_late": 0, "accepted": 3, "undecided": 0}
    assert result["watermark"]["max_event_time"] == ts("00:12")  # the year 2100 never reached it
    assert [(q["file"], q["line"], q["reason"]) for q in result["quarantine"]] == [(1, 2, "future"), (3, 2, "future")]
    assert [r["event_id"] for r in result["outputs"]["raw"]["rows"]] == ["e1", "e2", "e3"]


def test_max_future_comes_from_the_spec_and_kinds_must_agree(tmp_path):
    spec, layout = make(tmp_path, [PASSTHROUGH])
    spec = spec.model_copy(update={"event_time": spec.event_time.model_copy(update={"max_future": "1 hour"})})
    now = gt.parse_ts("2026-01-01T12:00:00.000Z")
    soon, later = "2026-01-01T12:30:00.000Z", "2026-01-01T13:00:01.000Z"
    kept = gt.expected(compile_plan(spec, layout), [future(1, 1, "a", soon, kind="ok"), future(1, 2, "b", later)], now_ms=now)
    assert kept["counts"]["accepted"] == 1 and kept["counts"]["quarantined"] == 1
    with pytest.raises(gt.GroundTruthError, match="marked 'ok' but its event time .* max_future"):
        gt.expected(compile_plan(spec, layout), [future(1, 1, "a", later, kind="ok")], now_ms=now)
    with pytest.raises(gt.GroundTruthError, match="marked 'future' but"):
        gt.expected(compile_plan(spec, layout), [future(1, 1, "a", soon)], now_ms=now)
