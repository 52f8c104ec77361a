"""A spec edited under a running stream's checkpoint: a verdict per flow before anything runs
(spark_jobs.changes), and bare starts of the stream job that refuse, run, add and retire."""

from __future__ import annotations

from pathlib import Path

import pytest
from edited_streams import HOT, edit, files_under, run_beside, start, verdicts, window
from edited_streams import ran as ran  # noqa: F401 - the fixtures
from edited_streams import stream as stream  # noqa: F401

from runner.testdata import generate
from spark_jobs import changes, stream_job
from spark_jobs.plan import compile_plan
from spark_jobs.runtime.checkpoint import sink_files
from spark_jobs.stream_spec.layout import Layout
from spark_jobs.stream_spec.loading import load_spec

EDITS = {
    "a window edited in place": (lambda d: window(d, window={"duration": "15 minutes", "slide": "5 minutes"}),
                                 "site_temperature_10m", "outputs[1]: query.window"),
    "a grouping key added": (lambda d: window(d, group_by=["site", "model"]), "site_temperature_10m",
                             "outputs[1]: query.group_by"),
    "an aggregate changed": (lambda d: window(d, aggregates=[
        a | {"fn": "min"} if a["name"] == "max_temperature" else a for a in window(d)["query"]["aggregates"]]),
        "site_temperature_10m", "outputs[1]: query.aggregates"),
    "an output's sink moved": (lambda d: d["outputs"][1].update(sink={"type": "parquet", "path": "sinks/moved"}),
                               "site_temperature_10m", "outputs[1]: sink.path"),
    "the watermark changed": (lambda d: d["event_time"].update(watermark="20 minutes"), "site_temperature_10m",
                              "event_time.watermark"),
    "the deduplication key changed": (lambda d: d["deduplicate"].update(key=["device_id", "ts"]), "_ingest",
                                      "deduplicate.key"),
}


def compiled(spec, layout: Layout) -> tuple:
    return compile_plan(spec, layout), layout


@pytest.mark.parametrize("what", list(EDITS))
def test_an_edit_the_checkpoint_cannot_resume_is_refused_before_any_query_starts(spark, stream, monkeypatch, caplog,
                                                                                 what: str) -> None:
    spec_file, data = stream
    change, flow, field = EDITS[what]
    before = files_under(data)
    edit(spec_file, change)
    found = verdicts(spec_file, data)
    assert found[flow].verdict in (changes.REBUILD, changes.REPROCESS), found[flow].text()
    assert any(field in r and str(spec_file) in r for r in found[flow].reasons), found[flow].reasons
    with caplog.at_level("ERROR", logger="stream_job"):
        assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_BAD_SPEC == 2
    assert field in caplog.text and "nothing started" in caplog.text
    assert files_under(data) == before  # nothing written: no sink, checkpoint, plan or table changed
    assert spark.streams.active == []


def test_the_window_edit_is_caught_by_the_state_even_without_the_last_plan(stream) -> None:
    """The keys and the watermark a window's state was kept by, read from the checkpoint's state
    schema, when no plan of the last start is there to compare with."""
    spec_file, data = stream
    Path(Layout(load_spec(spec_file), data, spec_file.parent).plan_file).unlink()
    edit(spec_file, lambda d: window(d, group_by=["site", "model"]))
    grouped = verdicts(spec_file, data)["site_temperature_10m"]
    assert grouped.verdict == changes.REBUILD and "is keyed by ['window', 'site']" in grouped.text()
    assert "_metadata/schema" in grouped.text()
    edit(spec_file, lambda d: (window(d, group_by=["site"]), d["event_time"].update(watermark="3 minutes")))
    late = verdicts(spec_file, data)["site_temperature_10m"]
    assert late.verdict == changes.REBUILD and "kept by a watermark of 600s" in late.text()


def test_the_same_spec_is_unchanged_and_a_rate_limit_or_a_sql_filter_is_compatible(spark, stream, monkeypatch) -> None:
    spec_file, data = stream
    assert {f: v.verdict for f, v in verdicts(spec_file, data).items()} == {
        "_ingest": "unchanged", "readings": "unchanged", "site_temperature_10m": "unchanged",
        "device_status": "unchanged", "hot": "unchanged"}
    edit(spec_file, lambda d: (d["source"].update(max_files_per_trigger=3),
                               d["outputs"][3]["query"].update(sql=HOT["query"]["sql"].replace("> 25", "> 30"))))
    found = verdicts(spec_file, data)
    assert found["_ingest"].verdict == found["hot"].verdict == changes.COMPATIBLE
    assert "outputs[3]: query.sql" in found["hot"].text()
    spec = load_spec(spec_file)
    layout = Layout(spec, data, spec_file.parent)
    hot, accepted = layout.data("sinks/sensors/hot"), layout.data("sinks/sensors/readings")
    before = {t: sink_files(t) for t in (hot, accepted)}
    assert generate.main(["--spec", str(spec_file), "--data-root", str(data), "--files", "3",
                          "--events-per-file", "25", "--seed", "6"]) == 0
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    kept = changes.plans(layout)
    assert [p["number"] for p in kept] == [2, 1] and kept[0]["spec_sha256"] != kept[1]["spec_sha256"]
    # the batches after the edit: the new filter over the rows they accepted (the earlier batches' rows stay as
    # they were written, Spark's semantics for a stateless query changed under its checkpoint)
    new = {t: sorted(sink_files(t) - before[t]) for t in (hot, accepted)}
    assert new[accepted] and new[hot]

    def rows(files: list[str], where: str = "true") -> list[tuple]:
        return sorted((r["event_id"], r["temperature"]) for r in spark.read.parquet(*files).where(where).collect())

    assert rows(new[hot]) == rows(new[accepted], "temperature > 30")


def test_an_added_output_runs_over_every_accepted_row_and_a_removed_one_is_archived(spark, stream, monkeypatch) -> None:
    spec_file, data = stream
    cold = {"name": "cold", "mode": "append", "sink": {"type": "parquet", "path": "sinks/sensors/cold"},
            "query": {"type": "sql", "sql": "SELECT event_id, temperature FROM accepted WHERE temperature < 20"}}
    edit(spec_file, lambda d: (d["outputs"].append(cold), d["outputs"].remove(HOT)))
    found = verdicts(spec_file, data)
    assert found["cold"].verdict == changes.NEW and found["hot"].verdict == changes.RETIRED
    layout = Layout(load_spec(spec_file), data, spec_file.parent)
    hot_checkpoint = Path(layout.checkpoint_root) / "hot"
    hot_sink = files_under(Path(layout.data("sinks/sensors/hot")))
    assert hot_checkpoint.is_dir()
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK
    accepted = spark.read.parquet(layout.data("sinks/sensors/readings"))
    expected = sorted((r["event_id"], r["temperature"]) for r in accepted.where("temperature < 20").collect())
    got = sorted((r["event_id"], r["temperature"]) for r in spark.read.parquet(layout.data("sinks/sensors/cold")).collect())
    assert got == expected and expected  # the new output: its query over every accepted row since the stream began
    assert not hot_checkpoint.exists()
    (archived,) = layout.retired_dir.iterdir()
    assert archived.name.startswith("hot-") and (archived / "commits").is_dir()
    assert files_under(Path(layout.data("sinks/sensors/hot"))) == hot_sink  # its sink kept as it was
    # added again over its kept sink, it would skip the batches that sink's log records: rebuilt
    edit(spec_file, lambda d: d["outputs"].append(HOT))
    again = verdicts(spec_file, data)["hot"]
    assert again.verdict == changes.REBUILD and "sinks/sensors/hot/_spark_metadata records batches 0 to" in again.text()


def test_what_a_new_output_s_sink_holds_already_is_read_for_every_kind_of_sink(tmp_path: Path) -> None:
    """A Delta table's versions, a database table's rows, a Parquet sink's log; an empty or missing
    sink, a table without rows or a database not there (the check makes none) hold nothing."""
    from types import SimpleNamespace

    from spark_jobs.sinks.table import open_database

    def holds(**sink) -> str | None:
        return changes.sink_holds(SimpleNamespace(sink=SimpleNamespace(**sink)))

    delta = tmp_path / "delta"
    assert holds(kind="delta", path=str(delta)) is None
    (delta / "_delta_log").mkdir(parents=True)
    for version in (0, 1):
        (delta / "_delta_log" / f"{version:020d}.json").write_text("{}\n")
    assert holds(kind="delta", path=str(delta)) == f"Delta table {delta} at version 1"
    parquet = tmp_path / "parquet"
    (parquet / "_spark_metadata").mkdir(parents=True)
    assert holds(kind="parquet", path=str(parquet)) is None
    (parquet / "_spark_metadata" / "0").write_text("v1\n")
    assert "_spark_metadata records batches 0 to 0" in holds(kind="parquet", path=str(parquet))
    url = f"sqlite:///{tmp_path / 'tables.db'}"
    assert holds(kind="table", url=url, table="t") is None and not (tmp_path / "tables.db").exists()
    db = open_database(url)
    with db.connect() as conn:
        db.run_ddl(conn, ["CREATE TABLE t (k INTEGER PRIMARY KEY)"])
    assert holds(kind="table", url=url, table="t") is None
    with db.connect() as conn:
        db.run_ddl(conn, ["INSERT INTO t VALUES (1), (2)"])
    assert holds(kind="table", url=url, table="t") == "table t with 2 row(s)"
    assert holds(kind="kafka", topic="out") is None


def test_a_refused_change_shows_the_stream_blocked_until_the_spec_is_restored(spark, stream, monkeypatch) -> None:
    from streamops.health import Status, assess

    spec_file, data = stream
    original = spec_file.read_text()
    edit(spec_file, EDITS["a window edited in place"][0])
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_BAD_SPEC
    spec = load_spec(spec_file)
    health = assess(*compiled(spec, Layout(spec, data, spec_file.parent)))
    assert health.status == Status.BLOCKED and health.reason.startswith("spec changed: an upgrade is needed"), health.reason
    assert "site_temperature_10m: rebuild" in health.reason and "query.window" in health.reason
    spec_file.write_text(original)  # the operator puts the spec back: the stream may start again
    spec = load_spec(spec_file)
    assert assess(*compiled(spec, Layout(spec, data, spec_file.parent))).status == Status.DEAD


def test_the_check_prints_the_verdicts_against_the_stream_s_data_root(spark, stream, capsys) -> None:
    from spark_jobs import check

    spec_file, data = stream
    assert check.main([str(spec_file), "--data-root", str(data)]) == 0
    out = capsys.readouterr().out
    assert "output site_temperature_10m: unchanged" in out and f"{spec_file}: ok" in out
    assert f"{spec_file}: runs continuous" in out
    # a switch to scheduled runs changes how the stream runs, no flow: every checkpoint is resumed
    edit(spec_file, lambda d: d.update(execution={"mode": "scheduled", "schedule": "10 minutes",
                                                  "freshness": "30 minutes"}))
    assert check.main([str(spec_file), "--data-root", str(data)]) == 0
    out = capsys.readouterr().out
    assert out.count(": unchanged") == 5 and "rebuild" not in out and "compatible" not in out
    assert f"{spec_file}: runs scheduled (every 10 minutes; freshness 30 minutes)" in out
    edit(spec_file, lambda d: d.pop("execution"))
    edit(spec_file, EDITS["a grouping key added"][0])
    assert check.main([str(spec_file), "--data-root", str(data)]) == 2
    said = capsys.readouterr()
    assert "output site_temperature_10m: rebuild" in said.out and "outputs[1]: query.group_by" in said.out
    assert "a driver would refuse to start" in said.err


def test_a_driver_compiles_its_plan_once_and_not_again_at_a_graceful_stop(spark, stream, monkeypatch) -> None:
    import time

    import spark_jobs.plan
    from spark_jobs.runtime.progress import read_events

    spec_file, data = stream
    layout = Layout(load_spec(spec_file), data, spec_file.parent)
    built: list[object] = []

    class Counted(spark_jobs.plan.StreamPlan):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(spark_jobs.plan, "StreamPlan", Counted)

    def stop_once_started() -> None:  # as the stop DAG does: the marker, once the driver runs
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(e.get("event") == "driver_started" and e.get("logged_at", 0) > began
                   for e in read_events(layout.events_file)):
                layout.stop_marker.write_text('{"mode": "graceful"}')
                return
            time.sleep(0.2)

    began = time.time()
    code = run_beside(spark, spec_file, data, monkeypatch, stop_once_started, join_seconds=5)
    assert code == stream_job.EXIT_OK and not layout.stop_marker.exists()  # stopped between batches, on request
    assert len(built) == 1  # the plan the analysis made served the start and the stop


def test_the_stream_s_page_lists_its_plans_and_the_pending_change_s_verdicts(spark, stream, monkeypatch) -> None:
    from streamops import page_data

    spec_file, data = stream
    spec = load_spec(spec_file)
    layout = Layout(spec, data, spec_file.parent)
    first = page_data.plans(compile_plan(spec, layout), layout)
    assert [p["number"] for p in first["started"]] == [1] and first["pending"] == []  # the run's own start
    assert start(spark, spec_file, data, monkeypatch) == stream_job.EXIT_OK  # nothing new: it starts, keeps a plan
    edit(spec_file, EDITS["a grouping key added"][0])
    spec = load_spec(spec_file)
    shown = page_data.plans(compile_plan(spec, layout), layout)
    assert [p["number"] for p in shown["started"]] == [2, 1] and shown["started"][0]["at"].endswith("Z")
    pending = {v["flow"]: v for v in shown["pending"]}
    assert pending["site_temperature_10m"]["verdict"] == "rebuild" and not pending["site_temperature_10m"]["runnable"]
    assert pending["readings"]["verdict"] == "unchanged" and pending["ingestion"]["runnable"]
