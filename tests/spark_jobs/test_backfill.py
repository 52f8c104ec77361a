"""Backfill: a range reprocessed in batch, twice, gives identical output; bad parameters are named."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from spark_jobs import backfill, generate, pipeline
from spark_jobs.spec import Layout, SpecError, default_spec_dir, load_spec

SPEC = default_spec_dir() / "sensors.yaml"
START, END = "2026-01-01T00:01:00Z", "2026-01-01T00:03:00Z"


@pytest.fixture(scope="module")
def stream(spark, tmp_path_factory):  # noqa: ANN001
    root = tmp_path_factory.mktemp("backfill") / "data"
    assert generate.main(["--spec", str(SPEC), "--data-root", str(root), "--files", "6",
                          "--events-per-file", "30", "--seed", "9"]) == 0
    spec = load_spec(SPEC)
    layout = Layout(spec, root, default_spec_dir())
    pipeline.run_available_now(spark, spec, layout)  # the accepted rows a backfill reads
    return spec, layout, root


def snapshot(spark, spec, layout) -> dict[str, list[str]]:  # noqa: ANN001
    lo, hi = backfill.parse_range(START, END)
    out = {}
    for o in spec.outputs:
        rows = spark.read.parquet(str(backfill.output_dir(spec, layout, o.name, lo, hi))).collect()
        out[o.name] = sorted(json.dumps(r.asDict(), default=str, sort_keys=True) for r in rows)
    return out


def test_backfill_twice_gives_identical_output(spark, stream) -> None:
    spec, layout, root = stream
    first_counts = backfill.run(spark, spec, layout, START, END)
    first = snapshot(spark, spec, layout)
    second_counts = backfill.run(spark, spec, layout, START, END)
    assert second_counts == first_counts
    assert snapshot(spark, spec, layout) == first
    # every accepted event in the range, once: not malformed, not a duplicate, not dropped as late
    ledger = [json.loads(line) for line in (root / "generated" / "sensors" / "ledger.jsonl").read_text().splitlines()]
    lo, hi = backfill.parse_range(START, END)
    in_range = {r["event"]["event_id"] for r in ledger
                if r["kind"] in ("ok", "late_within") and lo <= datetime.fromisoformat(r["event"]["ts"]) < hi}
    assert first_counts["readings"] == len(in_range) > 0
    rows = {o: [json.loads(r) for r in first[o]] for o in first}
    assert sorted(r["event_id"] for r in rows["readings"]) == sorted(in_range)
    # a 10-minute window sliding by 5 holds each row twice; the device table counts each row once
    assert sum(r["readings"] for r in rows["site_temperature_10m"]) == 2 * len(in_range)
    assert sum(r["readings"] for r in rows["device_status"]) == len(in_range)
    assert first_counts["device_status"] == len({r["device_id"] for r in rows["readings"]})
    parent = backfill.output_dir(spec, layout, "readings", *backfill.parse_range(START, END)).parent
    assert [p.name for p in parent.iterdir()] == ["range=20260101T000100Z_20260101T000300Z"]


@pytest.mark.parametrize(("start", "end", "message"), [
    ("2026-01-01T01:00:00Z", "2026-01-01T00:00:00Z", "must be after start"),
    ("yesterday", "2026-01-01T00:00:00Z", "must be ISO-8601"),
    ("2020-01-01T00:00:00Z", "2020-01-02T00:00:00Z", "has no accepted rows with ts in"),
])
def test_bad_ranges_are_named(spark, stream, start: str, end: str, message: str) -> None:
    spec, layout, _ = stream
    with pytest.raises(backfill.BackfillError, match=message):
        backfill.run(spark, spec, layout, start, end)


def test_unknown_stream_and_bad_arguments_exit_2(tmp_path: Path, capsys) -> None:
    assert backfill.main(["--spec", str(tmp_path / "nope.yaml"), "--start", START, "--end", END]) == 2
    assert backfill.main(["--spec", str(SPEC), "--start", END, "--end", START]) == 2
    with pytest.raises(SpecError, match="nope.yaml"):
        load_spec(tmp_path / "nope.yaml")
