"""Backfill: a range reprocessed in batch, twice, gives identical output; bad parameters are named."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
import yaml
from examples import clicks_on_files, include_with

from runner.testdata import generate
from spark_jobs import analysis, backfill
from spark_jobs.flows import queries as flows
from spark_jobs.plan import compile_plan
from spark_jobs.stream_spec.layout import (
    Layout,
    default_spec_dir,
)
from spark_jobs.stream_spec.loading import (
    load_spec,
    parse_spec,
)
from spark_jobs.stream_spec.models import SpecError

SPEC = default_spec_dir() / "sensors.yaml"
START, END = "2026-01-01T00:01:00Z", "2026-01-01T00:03:00Z"


@pytest.fixture(scope="module")
def stream(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("backfill") / "data"
    assert generate.main(["--spec", str(SPEC), "--data-root", str(root), "--files", "6",
                          "--events-per-file", "30", "--seed", "9"]) == 0
    spec = load_spec(SPEC)
    layout = Layout(spec, root, default_spec_dir())
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))  # the accepted rows a backfill reads
    return spec, layout, root


def snapshot(spark, spec, layout) -> dict[str, list[str]]:
    lo, hi = backfill.parse_range(START, END)
    out = {}
    for o in spec.outputs:
        rows = spark.read.parquet(str(backfill.output_dir(layout, o.name, lo, hi))).collect()
        out[o.name] = sorted(json.dumps(r.asDict(), default=str, sort_keys=True) for r in rows)
    return out


def test_backfill_twice_gives_identical_output(spark, stream) -> None:
    spec, layout, root = stream
    first_counts = backfill.run(spark, analysis.resolve_plan(spark, spec, layout), layout, START, END)
    first = snapshot(spark, spec, layout)
    second_counts = backfill.run(spark, analysis.resolve_plan(spark, spec, layout), layout, START, END)
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
    parent = backfill.output_dir(layout, "readings", *backfill.parse_range(START, END)).parent
    assert [p.name for p in parent.iterdir()] == ["range=20260101T000100Z_20260101T000300Z"]


@pytest.mark.parametrize(("start", "end", "message"), [
    ("2026-01-01T01:00:00Z", "2026-01-01T00:00:00Z", "must be after start"),
    ("yesterday", "2026-01-01T00:00:00Z", "must be ISO-8601"),
    ("2020-01-01T00:00:00Z", "2020-01-02T00:00:00Z", "has no accepted rows with ts in"),
])
def test_bad_ranges_are_named(spark, stream, start: str, end: str, message: str) -> None:
    spec, layout, _ = stream
    with pytest.raises(backfill.BackfillError, match=message):
        backfill.run(spark, analysis.resolve_plan(spark, spec, layout), layout, start, end)


def test_unknown_stream_and_bad_arguments_exit_2(tmp_path: Path, capsys) -> None:
    assert backfill.main(["--spec", str(tmp_path / "nope.yaml"), "--start", START, "--end", END]) == 2
    assert backfill.main(["--spec", str(SPEC), "--start", END, "--end", START]) == 2
    with pytest.raises(SpecError, match="nope.yaml"):
        load_spec(tmp_path / "nope.yaml")


def test_a_csv_stream_with_its_own_separator_backfills_the_rows_it_streamed(spark, tmp_path: Path) -> None:
    """The backfill reads the accepted rows, so it cannot parse the input differently from the stream."""
    data = clicks_on_files()
    data["source"]["options"] = {"sep": ";"}
    data["outputs"] = [{"name": "views", "mode": "append", "query": {"type": "passthrough"},
                        "sink": {"type": "parquet", "path": "sinks/clicks/views"}}]
    spec = parse_spec(data)
    layout = Layout(spec, tmp_path / "data", default_spec_dir())
    landing = Path(compile_plan(spec, layout).source.landing)
    landing.mkdir(parents=True)
    (landing / "part-0001.csv").write_text(
        "event_id;user_id;page;ts;duration_ms\n"
        "c1;u1;/home;2026-01-01T00:01:00Z;120\n"
        "c2;u2;/docs;2026-01-01T00:02:00Z;340\n"
        "c3;u1;/home,x;2026-01-01T00:02:30Z;7\n")  # a comma inside a field: only ';' separates
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    streamed = sorted(json.dumps(r.asDict(), default=str, sort_keys=True)
                      for r in spark.read.parquet(layout.data("sinks/clicks/views")).collect())
    assert len(streamed) == 3 and spark.read.parquet(layout.data(spec.quarantine.path)).count() == 0
    backfill.run(spark, analysis.resolve_plan(spark, spec, layout), layout, "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z")
    lo, hi = backfill.parse_range("2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z")
    backfilled = sorted(json.dumps(r.asDict(), default=str, sort_keys=True)
                        for r in spark.read.parquet(str(backfill.output_dir(layout, "views", lo, hi))).collect())
    assert backfilled == streamed


@pytest.fixture
def delta_stream(spark, tmp_path: Path):
    """The sensors stream with every output in a Delta table, run over 80 minutes of events."""
    data = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    for output in data["outputs"]:
        partitions = output["sink"].get("partition_by")
        output["sink"] = {"type": "delta", "path": f"delta/sensors/{output['name']}",
                          **({"partition_by": partitions} if partitions else {})}
    spec_dir = include_with(tmp_path / "include", data)
    root = tmp_path / "data"
    assert generate.main(["--spec", str(spec_dir / "sensors.yaml"), "--data-root", str(root), "--files", "6",
                          "--events-per-file", "40", "--event-interval-ms", "20000", "--seed", "5"]) == 0
    spec = load_spec(spec_dir / "sensors.yaml")
    layout = Layout(spec, root, spec_dir)
    flows.run_available_now(spark, analysis.resolve_plan(spark, spec, layout))
    return spec, layout


def delta_rows(spark, layout: Layout, output: str) -> list[str]:
    rows = spark.read.format("delta").load(layout.data(f"delta/sensors/{output}")).collect()
    return sorted(json.dumps(r.asDict(), default=str, sort_keys=True) for r in rows)


def test_a_delta_table_has_its_range_rewritten_in_place_and_again_identically(spark, delta_stream) -> None:
    from delta.tables import DeltaTable

    from spark_jobs.quality.rules import load_rules
    from spark_jobs.quality.validation import Validator
    from spark_jobs.sinks.delta import latest_version

    spec, layout = delta_stream
    lo, hi = "2026-01-01T00:10:00Z", "2026-01-01T00:40:00Z"
    streamed = {o: delta_rows(spark, layout, o) for o in ("readings", "site_temperature_10m")}
    # rows of the range go wrong in the tables (a bad write): the backfill puts them right
    readings = DeltaTable.forPath(spark, layout.data("delta/sensors/readings"))
    readings.delete("ts >= '2026-01-01 00:20:00' AND ts < '2026-01-01 00:30:00'")
    windows = DeltaTable.forPath(spark, layout.data("delta/sensors/site_temperature_10m"))
    windows.update("window_end <= '2026-01-01 00:40:00'", {"readings": "readings + 1000"})
    assert delta_rows(spark, layout, "readings") != streamed["readings"]

    written = backfill.run(spark, analysis.resolve_plan(spark, spec, layout), layout, lo, hi)
    label = backfill.range_label(*backfill.parse_range(lo, hi))
    assert delta_rows(spark, layout, "readings") == streamed["readings"]
    # the windows wholly inside the range are rewritten; those reaching outside it are not the
    # backfill's to rewrite (it has only part of their rows): the bad write stays in them
    rows = [json.loads(r) for r in delta_rows(spark, layout, "site_temperature_10m")]
    still_bad = [r for r in rows if r["readings"] >= 1000]
    assert still_bad and all(r["window_start"] < "2026-01-01 00:10:00" for r in still_bad)
    repaired = sorted(json.dumps({**r, "readings": r["readings"] % 1000}, sort_keys=True) for r in rows)
    assert repaired == streamed["site_temperature_10m"]
    for output in ("readings", "site_temperature_10m"):
        record = backfill.delta_record(layout, output, label)
        assert record is not None and record["rows"] == written[output] > 0
        assert record["version"] == latest_version(spark, record["table"])
    assert backfill.output_dir(layout, "device_status", *backfill.parse_range(lo, hi)).is_dir()  # update mode

    # twice: the same tables, one more version each
    versions = {o: backfill.delta_record(layout, o, label)["version"] for o in ("readings", "site_temperature_10m")}
    assert backfill.run(spark, analysis.resolve_plan(spark, spec, layout), layout, lo, hi) == written
    assert delta_rows(spark, layout, "readings") == streamed["readings"]
    for output, version in versions.items():
        assert backfill.delta_record(layout, output, label)["version"] == version + 1
        last = DeltaTable.forPath(spark, layout.data(f"delta/sensors/{output}")).history(1).collect()[0]
        assert json.loads(last.userMetadata)["backfill"] == label
        assert (last.operation, last.operationParameters["mode"], last.operationParameters["predicate"]) == (
            "WRITE", "Overwrite", backfill.delta_record(layout, output, label)["condition"])  # a replaceWhere

    # the validation reads the range as of the version the backfill wrote
    result = Validator(spark, analysis.resolve_plan(spark, spec, layout), layout,
                       load_rules(spec, layout.spec_dir)).run(backfill_label=label)
    assert result["ok"], result["problems"]
    by_output = {o["output"]: o for o in result["outputs"]}
    assert by_output["readings"]["version"] == versions["readings"] + 1
    assert by_output["readings"]["units"][0]["rows"] == written["readings"]

    # a range the stream has not finalized is refused, and nothing is written
    before = {o: latest_version(spark, layout.data(f"delta/sensors/{o}")) for o in versions}
    with pytest.raises(backfill.BackfillError, match=r"output readings: the range ends at 2026-01-01T02:00:00Z, after "
                                                     r"what the stream has finalized in its Delta table"):
        backfill.run(spark, analysis.resolve_plan(spark, spec, layout), layout, "2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z")
    assert {o: latest_version(spark, layout.data(f"delta/sensors/{o}")) for o in versions} == before
