"""Which units of a sink closed, from the checkpoint alone: what validation finds and what the
sink's asset events announce."""

from __future__ import annotations

import os
from pathlib import Path

from spark_jobs.plan import compile_plan
from spark_jobs.quality.closing import Closed, announcement, unit_ends, validated_units, validation_delays
from spark_jobs.quality.rules import Target
from spark_jobs.runtime.clock import iso
from spark_jobs.stream_spec.layout import Layout, default_spec_dir
from spark_jobs.stream_spec.loading import load_spec

SPEC = load_spec(default_spec_dir() / "sensors.yaml")
MIN = 60_000
WINDOW = Target(SPEC.output("site_temperature_10m"), "window", "window_end", None, None, [], [])  # 10 min, slide 5
PERIOD = Target(SPEC.output("readings"), "period", "ts", 3600.0, None, [], [])
TABLE = Target(SPEC.output("device_status"), "snapshot", None, None, None, [], [])


def test_windows_and_periods_close_at_their_ends() -> None:
    assert SPEC.output("site_temperature_10m").query.window.slide == "5 minutes"
    assert unit_ends(WINDOW, 10 * MIN, 27 * MIN) == [15 * MIN, 20 * MIN, 25 * MIN]  # every slide, a window ends
    assert unit_ends(WINDOW, 25 * MIN, 29 * MIN) == []  # the watermark moved on inside a window
    assert unit_ends(PERIOD, 0, 3 * 60 * MIN) == [60 * MIN, 120 * MIN, 180 * MIN]
    assert unit_ends(PERIOD, None, 150 * MIN) == [120 * MIN]  # nothing known before: the last one closed


def test_an_announcement_names_what_closed_since_the_last_one() -> None:
    before = Closed("site_temperature_10m", "window", 10 * MIN, 3)
    event = announcement(WINDOW, Closed("site_temperature_10m", "window", 21 * MIN, 5), before)
    assert event == {"output": "site_temperature_10m", "kind": "window", "closed_through": "1970-01-01T00:21:00Z",
                     "batch": 5, "since": "1970-01-01T00:10:00Z",
                     "units": ["1970-01-01T00:15:00Z", "1970-01-01T00:20:00Z"], "more_units": 0}
    assert announcement(WINDOW, Closed("site_temperature_10m", "window", 12 * MIN, 6), before) is None
    assert announcement(WINDOW, Closed("site_temperature_10m", "window", None, None), None) is None
    assert announcement(TABLE, Closed("device_status", "snapshot", None, 7), Closed("device_status", "snapshot", None, 7)) is None
    assert announcement(TABLE, Closed("device_status", "snapshot", None, 8), None)["units"] == ["batch 8"]


def test_a_long_outage_lists_the_last_units_and_counts_the_rest() -> None:
    event = announcement(PERIOD, Closed("readings", "period", 500 * 60 * MIN, 9), Closed("readings", "period", 0, 1))
    assert len(event["units"]) == 100 and event["more_units"] == 400
    assert event["units"][-1] == "1970-01-21T20:00:00Z"


def test_a_unit_is_validated_when_its_run_wrote_its_results(tmp_path: Path) -> None:
    plan = compile_plan(SPEC, Layout(SPEC, tmp_path, default_spec_dir()))
    checkpoint = Path(plan.checkpoint("site_temperature_10m"))
    for log in ("offsets", "commits"):
        (checkpoint / log).mkdir(parents=True)
    t0 = 1_800_000_000.0
    for batch, watermark in enumerate((0, 12 * MIN, 21 * MIN)):  # batch 2's watermark passes 00:20
        (checkpoint / "offsets" / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":{watermark}}}\n{{"logOffset":{batch}}}\n')
        (checkpoint / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        os.utime(checkpoint / "commits" / str(batch), (t0 + batch, t0 + batch))
    window = {"unit": "1970-01-01T00:10:00Z/1970-01-01T00:20:00Z", "end": "1970-01-01T00:20:00Z", "run": "r1",
              "validated_at": iso(t0 + 5)}
    ledger = {"outputs": {"site_temperature_10m": {"units": {"a": window}}}, "runs": [{"run_id": "r1", "at": iso(t0 + 9)}]}
    assert list(validated_units(plan, ledger)) == [("site_temperature_10m", window, t0 + 9, t0 + 2)]
    assert validation_delays(plan, ledger) == [7.0]  # closed by batch 2's commit (t0 + 2), results written at t0 + 9
    assert validation_delays(plan, {**ledger, "runs": []}) == [3.0]  # a ledger without its run: the unit's own time
    assert validation_delays(plan, ledger, since=t0 + 10) == []
    other = {"outputs": {"no_such_output": {"units": {"a": window}}}, "runs": ledger["runs"]}
    assert list(validated_units(plan, other)) == []  # a ledger's output the plan no longer has
