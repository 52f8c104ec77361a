"""Great Expectations validation of a real run's sinks: closed units, failures, orphans, accounting, backfills."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F

from spark_jobs import backfill
from spark_jobs.analysis import resolve_plan
from spark_jobs.quality.rules import load_rules, rules_path, targets
from spark_jobs.quality.validation import UnknownRun, Validator, from_ms, iso
from spark_jobs.runtime.checkpoint import (
    batch_watermark_ms,
    last_batch,
)
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec
from spark_jobs.stream_spec.models import SpecError


def validator(spark, include: Path, data_root: Path) -> Validator:
    spec = load_spec(include / "streams" / "sensors.yaml")
    layout = Layout(spec, data_root, include / "streams")
    return Validator(spark, resolve_plan(spark, spec, layout), layout, load_rules(spec, layout.spec_dir))


def target(v: Validator, name: str):
    return next(t for t in targets(v.plan, v.rules)[0] if t.output.name == name)


def closed_windows(spark, v: Validator) -> set[str]:
    """Window ends the sink holds at or before the committed watermark, read independently."""
    ckpt = v.plan.checkpoint("site_temperature_10m")
    wm = from_ms(batch_watermark_ms(ckpt, last_batch(ckpt, "commits")))
    rows = spark.read.parquet(v.layout.data("sinks/sensors/site_temperature_10m")).select("window_end").distinct()
    return {iso(r["window_end"]) for r in rows.collect() if iso(r["window_end"]) <= iso(wm)}


def test_clean_output_passes_once_per_closed_unit_and_a_rerun_changes_nothing(spark, include, data_root) -> None:
    v = validator(spark, include, data_root)
    result = v.run()

    assert result["ok"], result["problems"]
    by_output = {o["output"]: o for o in result["outputs"]}
    windows = closed_windows(spark, v)
    assert len(windows) >= 5
    assert {u["unit"] for u in by_output["site_temperature_10m"]["units"]} == windows
    readings_units = {u["unit"] for u in by_output["readings"]["units"]}
    assert "2026-01-01T00:00:00Z" in readings_units  # the first event-time hour has closed
    assert "2026-01-01T01:00:00Z" not in readings_units  # the watermark is inside the second
    hour = spark.read.parquet(v.layout.data("sinks/sensors/readings")).where(
        (F.col("ts") >= "2026-01-01 00:00:00") & (F.col("ts") < "2026-01-01 01:00:00")).count()
    assert next(u for u in by_output["readings"]["units"] if u["unit"] == "2026-01-01T00:00:00Z")["rows"] == hour
    assert [u["unit"] for u in by_output["device_status"]["units"]] == [f"batch {last_batch(v.plan.checkpoint('device_status'), 'commits')}"]
    assert all(u["status"] == "passed" for o in result["outputs"] for u in o["units"])

    balances = {b["output"]: b for b in result["accounting"]["balances"]}
    assert balances["ingestion"]["status"] == "balanced" and balances["ingestion"]["difference"] == 0
    assert balances["readings"]["status"] == "balanced" and balances["readings"]["difference"] == 0
    assert balances["device_status"]["status"] == "balanced"
    assert balances["site_temperature_10m"]["status"] == "not checkable"
    manifest = json.loads((data_root / "generated" / "sensors" / "manifest.json").read_text())["counts"]
    assert result["accounting"]["input"] == manifest["input_records"]
    assert result["accounting"]["quarantined"] == manifest["quarantined"]
    ingestion = balances["ingestion"]
    assert (ingestion["input"], ingestion["accepted"], ingestion["quarantined"], ingestion["duplicates"],
            ingestion["dropped_late"]) == (manifest["input_records"], manifest["accepted"], manifest["quarantined"],
                                           manifest["duplicates"], manifest["dropped_late"])
    # every output read the same accepted rows, and none dropped one again
    assert balances["readings"]["input"] == balances["readings"]["accepted"] == manifest["accepted"]
    assert balances["device_status"]["input"] == balances["device_status"]["accepted"] == manifest["accepted"]
    assert balances["site_temperature_10m"]["input"] == manifest["accepted"]
    assert all(b["dropped_late"] == 0 for name, b in balances.items() if name != "ingestion")

    docs = Path(result["docs"])
    assert docs.is_file()
    unit = by_output["site_temperature_10m"]["units"][0]
    assert (docs.parent / unit["docs"]).is_file()  # the unit's Data Docs page
    summary = (v.dir / "index.html").read_text()
    assert unit["unit"] in summary and "balanced" in summary

    ledger_before = json.loads((v.dir / "ledger.json").read_text())
    results_before = sorted((v.dir / "gx" / "uncommitted" / "validations").rglob("*.json"))
    again = validator(spark, include, data_root).run()
    assert again["ok"]
    assert all(o["units"] == [] for o in again["outputs"])  # nothing validated twice
    ledger_after = json.loads((v.dir / "ledger.json").read_text())
    assert ledger_after["outputs"] == ledger_before["outputs"]
    assert sorted((v.dir / "gx" / "uncommitted" / "validations").rglob("*.json")) == results_before

    # Parquet files and a SQLite table keep no versions: the run cannot be validated again
    repeated = validator(spark, include, data_root).run(again=result["run_id"])
    assert not repeated["ok"] and repeated["problems"] == [
        f"nothing was validated again: no output that run {result['run_id']} validated keeps versions "
        f"(only Delta tables can be read as they were)"]
    assert all(o["note"].startswith("its sink keeps no versions") for o in repeated["outputs"])


@pytest.fixture
def windows_frame(spark, include, data_root):
    v = validator(spark, include, data_root)
    t = target(v, "site_temperature_10m")
    frame = spark.read.parquet(v.layout.data("sinks/sensors/site_temperature_10m"))
    return v, t, frame


def run_suite(v: Validator, t, frame, schema=None):
    schema = schema or v.schema(t.output)
    units = {}
    for row in frame.groupBy("window_end").count().collect():
        if row["window_end"] is not None:
            key = iso(row["window_end"])
            units[key] = v._unit_record(key, None, row["window_end"], row["count"])
    problems, _ = v.validate_units(t, schema, frame, units, lambda x: iso(x) if x else None,
                                   {"fresh_after": from_ms(0).replace(tzinfo=None)})
    return units, problems


def failed(units: dict) -> dict[str, list[str]]:
    return {k: u["failed"] for k, u in units.items() if u["status"] == "failed"}


def test_injected_nulls_duplicates_and_out_of_range_values_fail_their_unit_only(windows_frame) -> None:
    v, t, frame = windows_frame
    units, _ = run_suite(v, t, frame)
    assert failed(units) == {}

    first = frame.orderBy("window_end", "site").limit(1).collect()[0]
    bad_end = iso(first["window_end"])
    null_row = frame.limit(0).unionByName(v.spark.createDataFrame([{**first.asDict(), "window_start": None}], frame.schema))
    hot = v.spark.createDataFrame([{**first.asDict(), "site": "site-hot", "max_temperature": 999.0}], frame.schema)
    duplicate = frame.where((F.col("window_end") == first["window_end"]) & (F.col("site") == first["site"]))
    units, _ = run_suite(v, t, frame.unionByName(null_row).unionByName(hot).unionByName(duplicate))

    assert set(failed(units)) == {bad_end}, "only the window holding the bad rows fails"
    messages = "\n".join(failed(units)[bad_end])
    assert "expect_column_values_to_not_be_null(window_start)" in messages
    assert "expect_compound_columns_to_be_unique(['window_start', 'window_end', 'site'])" in messages
    assert "expect_column_values_to_be_between(max_temperature): 1 of" in messages and "999.0" in messages


def test_schema_drift_fails_every_unit_naming_the_schema_checks(windows_frame) -> None:
    v, t, frame = windows_frame
    drifted = frame.withColumn("readings", F.col("readings").cast("string")).withColumn("extra", F.lit(1))
    units, _ = run_suite(v, t, drifted)
    assert set(failed(units)) == set(units)
    messages = "\n".join(next(iter(failed(units).values())))
    assert "expect_table_columns_to_match_set" in messages
    assert "expect_column_values_to_be_of_type(readings): observed 'StringType'" in messages


def test_orphan_files_in_a_sink_are_not_validated(spark, include, data_root, tmp_path) -> None:
    v = validator(spark, include, data_root)
    sink = Path(v.layout.data("sinks/sensors/site_temperature_10m"))
    bad = spark.read.parquet(str(sink)).withColumn("max_temperature", F.lit(999.0))
    bad.coalesce(1).write.parquet(str(tmp_path / "orphan"))
    orphan = next((tmp_path / "orphan").glob("part-*.parquet"))
    orphan.rename(sink / "part-99999-orphan-left-by-a-crash.snappy.parquet")  # in no _spark_metadata entry

    result = v.run()
    assert result["ok"], result["problems"]
    units = next(o for o in result["outputs"] if o["output"] == "site_temperature_10m")["units"]
    assert {u["unit"] for u in units} == closed_windows(spark, v)


def test_accounting_fails_when_rows_are_missing(spark, include, data_root) -> None:
    v = validator(spark, include, data_root)
    with sqlite3.connect(data_root / "tables.db") as db:
        assert db.execute("DELETE FROM sensors_device_status WHERE device_id = "
                          "(SELECT MIN(device_id) FROM sensors_device_status)").rowcount == 1
    result = v.run()
    assert not result["ok"]
    balance = next(b for b in result["accounting"]["balances"] if b["output"] == "device_status")
    assert balance["status"] == "unbalanced" and balance["difference"] > 0
    assert any(p.startswith("accounting of device_status: unbalanced") and "unaccounted for" in p
               for p in result["problems"])


def test_tight_freshness_and_quarantine_threshold_fail_with_reasons(spark, include, data_root) -> None:
    rules = include / "expectations" / "sensors.yaml"
    text = rules.read_text().replace("max_quarantine_rate: 0.10", "max_quarantine_rate: 0.001")
    rules.write_text(text.replace("    freshness: 1 hour", "    freshness: 1 second"))
    result = validator(spark, include, data_root).run()
    assert any("quarantine rate" in p and "above the threshold 0.10%" in p for p in result["problems"])
    assert any(p.startswith("site_temperature_10m: freshness: expect_column_max_to_be_between(window_end)")
               for p in result["problems"])


def test_a_backfilled_range_is_validated_and_revalidated_when_rewritten(spark, include, data_root) -> None:
    v = validator(spark, include, data_root)
    lo, hi = "2026-01-01T00:00:00Z", "2026-01-01T01:00:00Z"
    label = backfill.range_label(*backfill.parse_range(lo, hi))
    backfill.run(spark, v.plan, v.layout, lo, hi)
    first = v.run(backfill_label=label)
    assert first["ok"], first["problems"]
    assert {o["output"]: [u["unit"] for u in o["units"]] for o in first["outputs"]} == {
        name: [f"backfill {label}"] for name in ("readings", "site_temperature_10m", "device_status")}

    backfill.run(spark, v.plan, v.layout, lo, hi)
    second = validator(spark, include, data_root).run(backfill_label=label)
    ledger = json.loads((v.dir / "ledger.json").read_text())
    assert list(ledger["backfills"]["readings"]) == [f"backfill {label}"]
    assert ledger["backfills"]["readings"][f"backfill {label}"]["run"] == second["run_id"] != first["run_id"]


def test_an_unknown_expectation_names_the_rules_file_and_field(spark, include, data_root) -> None:
    rules = include / "expectations" / "sensors.yaml"
    rules.write_text(rules.read_text().replace("expect_column_values_to_be_in_set: {column: status",
                                               "expect_column_values_to_be_nice: {column: status", 1))
    with pytest.raises(SpecError) as err:
        validator(spark, include, data_root).run()
    assert f"{rules}: outputs.readings.expectations[2].expect_column_values_to_be_nice: " in str(err.value)
    assert "is not a Great Expectations expectation" in str(err.value)


def test_bad_arguments_name_the_rules_file_and_field(spark, include, data_root) -> None:
    rules = include / "expectations" / "sensors.yaml"
    rules.write_text(rules.read_text().replace("{column: humidity, min_value: 0, max_value: 100}",
                                               "{column: humidity, minimum: 0}", 1))
    with pytest.raises(SpecError, match=r"outputs.readings.expectations\[1\].expect_column_values_to_be_between: "
                                        r"invalid arguments"):
        validator(spark, include, data_root).run()



def test_a_sql_output_to_a_table_is_validated_whole_with_its_columns_from_spark(spark, include: Path,
                                                                                 tmp_path: Path) -> None:
    from runner.testdata import generate
    from spark_jobs.flows import queries as flows

    spec_path = include / "streams" / "sensors.yaml"
    data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    data["outputs"] = [{"name": "hottest", "mode": "complete", "query": {"type": "sql", "sql": (
        "SELECT coalesce(site, 'unknown') AS site, max(temperature) AS hottest, count(*) AS readings "
        "FROM accepted GROUP BY coalesce(site, 'unknown')")},
        "sink": {"type": "table", "table": "sensors_hottest", "key": ["site"]}}]
    spec_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    (include / "expectations" / "sensors.yaml").write_text(yaml.safe_dump({"outputs": {"hottest": {"expectations": [
        {"expect_column_values_to_be_between": {"column": "hottest", "min_value": -100, "max_value": 0}}]}}}))
    root = tmp_path / "data"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "2",
                          "--events-per-file", "20", "--seed", "3"]) == 0
    v = validator(spark, include, root)
    flows.run_available_now(spark, v.plan)

    result = v.run()
    report = next(o for o in result["outputs"] if o["output"] == "hottest")
    assert report["kind"] == "snapshot"
    (unit,) = report["units"]
    assert unit["unit"].startswith("batch ") and unit["rows"] >= 1
    # only the declared range fails: the column set and types from Spark's schema of the query
    # and the unique key pass, so they were checked against the real table
    assert unit["status"] == "failed"
    assert [m.split(":")[0] for m in unit["failed"]] == ["expect_column_values_to_be_between(hottest)"]
    checked = {}
    for path in (v.dir / "gx").rglob("*.json"):
        for e in json.loads(path.read_text()).get("expectations", []):
            checked.setdefault(e["type"], []).append(e["kwargs"])
    assert [kw["column_set"] for kw in checked["expect_table_columns_to_match_set"]] == [["site", "hottest", "readings"]]
    assert sorted((kw["column"], kw["type_"]) for kw in checked["expect_column_values_to_be_of_type"]) == [
        ("hottest", "DoubleType"), ("readings", "LongType"), ("site", "StringType")]
    assert [kw["column"] for kw in checked["expect_column_values_to_be_unique"]] == ["site"]


def test_a_transformed_stream_is_accounted_with_its_filtered_rows_and_its_rules_name_derived_columns(
        spark, include: Path, tmp_path: Path, job_run) -> None:
    from runner.testdata import generate

    spec_path = include / "streams" / "sensors.yaml"
    data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    data["transform"] = {"sql": "SELECT event_id, ts, site, round(temperature * 1.8 + 32, 1) AS fahrenheit "
                                "FROM input WHERE temperature < 25"}
    data["outputs"] = [o for o in data["outputs"] if o["name"] == "readings"]
    spec_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    (include / "expectations" / "sensors.yaml").write_text(yaml.safe_dump({"outputs": {"readings": {
        "unit": "1 hour", "expectations": [
            {"expect_column_values_to_be_between": {"column": "fahrenheit", "min_value": -100, "max_value": 77}}]}}}))
    root = tmp_path / "data"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "8", "--events-per-file",
                          "40", "--event-interval-ms", "15000", "--seed", "5"]) == 0  # 80 minutes: an hour closes
    v = validator(spark, include, root)
    job_run(v.plan, v.layout)

    result = v.run()
    (ingestion,) = [b for b in result["accounting"]["balances"] if b["output"] == "ingestion"]
    assert ingestion["status"] == "balanced" and ingestion["difference"] == 0, ingestion
    assert ingestion["filtered"] > 0 and ingestion["accepted"] + ingestion["filtered"] == ingestion["transform_in"]
    report = next(o for o in result["outputs"] if o["output"] == "readings")
    assert report["kind"] == "period" and report["units"], report
    assert all(u["status"] == "passed" for u in report["units"]), report["units"]


def test_a_windowed_sql_output_to_parquet_is_validated_window_by_window(spark, include: Path, tmp_path: Path,
                                                                         job_run) -> None:
    from runner.testdata import generate

    spec_path = include / "streams" / "sensors.yaml"
    data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    data["outputs"] = [{"name": "site_sql", "mode": "append", "sink": {"type": "parquet", "path": "sinks/site_sql"},
                        "query": {"type": "sql", "sql": (
                            "SELECT window.start AS window_start, window.end AS window_end, site, "
                            "avg(temperature) AS avg_temp FROM accepted GROUP BY window(ts, '10 minutes'), site")}}]
    spec_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    (include / "expectations" / "sensors.yaml").write_text(yaml.safe_dump({"outputs": {"site_sql": {"expectations": [
        {"expect_column_values_to_be_between": {"column": "avg_temp", "min_value": -50, "max_value": 60}}]}}}))
    root = tmp_path / "data"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "8", "--events-per-file",
                          "40", "--event-interval-ms", "15000", "--seed", "5"]) == 0  # 80 minutes: windows close
    v = validator(spark, include, root)
    job_run(v.plan, v.layout)

    result = v.run()
    report = next(o for o in result["outputs"] if o["output"] == "site_sql")
    assert report["kind"] == "window" and len(report["units"]) >= 3, report
    for unit in report["units"]:
        start, end = (datetime.fromisoformat(unit[k].replace("Z", "+00:00")) for k in ("start", "end"))
        assert end - start == timedelta(minutes=10) and unit["status"] == "passed", unit


def test_a_stream_whose_accepted_rows_are_a_delta_table_is_accounted_and_its_units_close(
        spark, include: Path, tmp_path: Path, job_run) -> None:
    from runner.testdata import generate

    spec_path = include / "streams" / "sensors.yaml"
    data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    spec_path.write_text(yaml.safe_dump({**data, "accepted": {"format": "delta"}}), encoding="utf-8")
    root = tmp_path / "data"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "8", "--events-per-file",
                          "40", "--event-interval-ms", "15000", "--seed", "5"]) == 0  # 80 minutes: an hour closes
    v = validator(spark, include, root)
    assert v.plan.ingestion.accepted_is_delta and not v.plan.output("readings").written_by_ingestion
    job_run(v.plan, v.layout)

    result = v.run()
    assert result["ok"], result["problems"]
    balances = {b["output"]: b for b in result["accounting"]["balances"]}
    assert all(b["status"] == "balanced" for name, b in balances.items() if name != "site_temperature_10m"), balances
    assert balances["ingestion"]["accepted"] > 0
    assert "_accepted" in result["delta_versions"]
    # the pass-through's hours close by the watermark it has seen through the Delta table
    readings = next(o for o in result["outputs"] if o["output"] == "readings")
    assert "2026-01-01T00:00:00Z" in {u["unit"] for u in readings["units"]}, readings
    assert all(u["status"] == "passed" for o in result["outputs"] for u in o["units"])


def delta_sensors(include: Path) -> Path:
    """The sensors stream with every output in a Delta table (its spec rewritten in ``include``)."""
    spec_path = include / "streams" / "sensors.yaml"
    data = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    for output in data["outputs"]:
        sink = output["sink"]
        output["sink"] = {"type": "delta", "path": f"delta/sensors/{output['name']}",
                          **({"partition_by": sink["partition_by"]} if sink.get("partition_by") else {})}
    spec_path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return spec_path


def test_delta_sinks_are_validated_as_of_a_version_that_a_rerun_reads_again(spark, include: Path, tmp_path: Path,
                                                                            job_run) -> None:
    from runner.testdata import generate, verify
    from spark_jobs.sinks import delta as delta_sink

    spec_path = delta_sensors(include)
    root = tmp_path / "data"
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "6",  # 80 minutes: an hour closes
                          "--events-per-file", "40", "--event-interval-ms", "20000", "--seed", "5"]) == 0
    v = validator(spark, include, root)
    job_run(v.plan, v.layout)
    manifest = json.loads((root / "generated" / "sensors" / "manifest.json").read_text())
    report = verify.compare(spark, v.plan, manifest)
    assert report.ok and all(o.actual > 0 for o in report.outputs), report.describe()

    result = v.run()
    assert result["ok"], result["problems"]
    by_output = {o["output"]: o for o in result["outputs"]}
    assert by_output["readings"]["kind"] == "period" and by_output["site_temperature_10m"]["kind"] == "window"
    for name in ("readings", "site_temperature_10m", "device_status"):
        path = v.layout.data(f"delta/sensors/{name}")
        version = delta_sink.latest_version(spark, path)
        assert by_output[name]["version"] == version, name
        assert by_output[name]["units"] and all(u["version"] == version for u in by_output[name]["units"]), name
    snapshot = by_output["device_status"]
    assert snapshot["kind"] == "snapshot"
    assert [u["unit"] for u in snapshot["units"]] == [f"batch {last_batch(v.plan.checkpoint('device_status'), 'commits')}"]
    # the validation and the accounting read each table at one version
    assert result["delta_versions"] == {name: by_output[name]["version"] for name in by_output}
    balances = {b["output"]: b for b in result["accounting"]["balances"]}
    assert balances["readings"]["status"] == balances["device_status"]["status"] == "balanced", balances
    assert balances["readings"]["accepted"] == manifest["counts"]["accepted"]

    # later batches write new versions; the validated version still reads the same rows
    status_path = v.layout.data("delta/sensors/device_status")
    validated = snapshot["version"]
    before = sorted(tuple(r) for r in delta_sink.read_version(spark, status_path, validated).collect())
    assert generate.main(["--spec", str(spec_path), "--data-root", str(root), "--files", "2",
                          "--events-per-file", "30", "--seed", "6"]) == 0
    job_run(v.plan, v.layout)
    assert delta_sink.latest_version(spark, status_path) > validated
    assert sorted(tuple(r) for r in delta_sink.read_version(spark, status_path, validated).collect()) == before
    again = validator(spark, include, root).run()
    assert again["ok"], again["problems"]
    unit = next(o for o in again["outputs"] if o["output"] == "device_status")["units"][0]
    assert unit["version"] == delta_sink.latest_version(spark, status_path) and unit["unit"] != snapshot["units"][0]["unit"]

    # the first run's units validated again, as of the versions that run read: the same answers
    def answers(outputs: list[dict]) -> dict[str, list[tuple]]:
        return {o["output"]: [(u["unit"], u["rows"], u["status"], u["version"]) for u in o["units"]]
                for o in outputs if o["units"]}

    first = result["run_id"]
    readings_path = v.layout.data("delta/sensors/readings")
    first_hour = by_output["readings"]["units"][0]
    spark.sql(f"DELETE FROM delta.`{readings_path}` WHERE ts < '{first_hour['end'][:19].replace('T', ' ')}'")
    assert delta_sink.read_version(spark, readings_path, delta_sink.latest_version(spark, readings_path)) \
        .where(F.col("ts") < first_hour["end"][:19].replace("T", " ")).count() == 0  # the newest version lacks it
    ledger = v.layout.quality_dir / "ledger.json"
    units_before = json.loads(ledger.read_text())["outputs"]
    repeated = validator(spark, include, root).run(again=first)
    assert repeated["ok"], repeated["problems"]
    assert repeated["again"] == first and repeated["accounting"] is None
    assert answers(repeated["outputs"]) == answers(result["outputs"])
    assert all(u["same"] and u["then"]["run"] == first for o in repeated["outputs"] for u in o["units"])
    assert json.loads(ledger.read_text())["outputs"] == units_before  # the ledger's units are the first runs'
    assert json.loads(ledger.read_text())["runs"][-1] | {"at": None} == {
        "run_id": repeated["run_id"], "at": None, "engine": "spark", "backfill": None, "units": sum(len(u) for u in answers(
            result["outputs"]).values()), "failed": 0, "ok": True, "accounting": None, "again": first, "same": True}

    # with a rule that every row of readings now breaks, the same rows give another answer
    rules_file = rules_path(v.layout.spec_dir, "sensors")
    rules = yaml.safe_load(rules_file.read_text())
    rules["outputs"]["readings"]["expectations"].append(
        {"expect_column_values_to_be_between": {"column": "temperature", "min_value": 1000}})
    rules_file.write_text(yaml.safe_dump(rules))
    changed = validator(spark, include, root).run(again=first)
    assert not changed["ok"]
    readings = next(o for o in changed["outputs"] if o["output"] == "readings")
    assert readings["units"] and not any(u["same"] for u in readings["units"])
    assert all(u["status"] == "failed" and u["then"]["status"] == "passed" for u in readings["units"])
    assert any(p.startswith(f"{readings['units'][0]['unit']}: as of version ") and f"where run {first} found passed"
               in p for p in readings["problems"]), readings["problems"]
    assert all(u["same"] for o in changed["outputs"] if o["output"] != "readings" for u in o["units"])

    with pytest.raises(UnknownRun, match=f"keeps no unit that run 'no-such-run' validated; .*{first}"):
        validator(spark, include, root).run(again="no-such-run")
