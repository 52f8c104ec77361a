"""The summary's lines, as ``./platform up`` prints them at the end."""

from __future__ import annotations

from typing import Any

from runner.summary import describe_summary


def stream(**changes: Any) -> dict[str, Any]:
    s = {
        "expected": {"input_records": 100, "accepted": 90, "quarantined": 5, "duplicates": 3, "dropped_late": 2},
        "sinks": [{"output": "readings", "rows": 90, "expected": 90, "equal": True, "detail": "readings: 90 rows"}],
        "quarantined": 5,
        "ground_truth_equal": True,
        "outputs_agree": True,
        "disagreements": [],
        "restarts": 1,
        "validated": {"readings": {"validated": 4, "passed": 4, "failed": 0}},
        "accounting": {"balances": [{"output": "readings", "input": 100, "accepted": 90, "quarantined": 5,
                                     "duplicates": 3, "dropped_late": 2, "status": "balanced"}]},
        "quality_ok": True,
        "quality_runs": {"asset_triggered": 3, "manual": 1, "scheduled": 0},
        "validation_delay_seconds": {"units": 4, "median": 12.4, "max": 30.6},
    }
    return {**s, **changes}


def test_a_stream_that_balances() -> None:
    assert describe_summary({"streams": {"sensors": stream()}}) == [
        "sensors:",
        "  generated: 100 rows in = 90 accepted + 5 quarantined + 3 duplicates + 2 dropped late",
        "  measured readings: 100 in = 90 accepted + 5 quarantined + 3 duplicates + 2 dropped late: balanced",
        "  sink readings: 90 rows",
        "  quarantine: 5 rows",
        "  restarts: 1; units validated: readings 4 (4 passed, 0 failed)",
        "  quality DAG runs: 3 on new output (asset events), 1 triggered, 0 on the clock",
        "  from a unit closing to its validation: median 12 s, max 31 s (4 unit(s))",
        "  every sink equals the ground truth: yes; every output equals its query over the accepted rows: yes; "
        "data quality: passed",
    ]


def test_a_stream_that_ran_nothing_and_disagrees() -> None:
    lines = describe_summary({"streams": {"clicks": stream(
        expected=None, accounting=None, sinks=[], quarantined=None, validated={}, quality_runs={},
        validation_delay_seconds={"units": 0, "median": None, "max": None}, ground_truth_equal=False,
        outputs_agree=False, disagreements=["daily: 3 rows differ"], quality_ok=None)}})
    assert lines == [
        "clicks:",
        "  quarantine: None rows",
        "  restarts: 1; units validated: nothing yet",
        "  DISAGREES with the accepted rows: daily: 3 rows differ",
        "  every sink equals the ground truth: NO; every output equals its query over the accepted rows: NO; "
        "data quality: FAILED or not run",
    ]
